//! A draw: entries in the window, the draw fixed once the window closed (the seed revealed,
//! the waitlist by `flashsale_core::admission::draw`), and the walk down the waitlist that
//! gives each entry a reservation while its quantity fits in the available stock. A
//! reservation that expires or is cancelled returns its units to the available stock, and the
//! next walk hands them to the next entries.

use std::collections::HashMap;
use std::sync::Arc;

use flashsale_core::admission::{self, commitment, Entered, Entry, EntryWindow, Seed};
use flashsale_core::limits::BATCH_LEN_MAX;
use flashsale_core::{
    AdmissionMode, ErrorCode, HotOrder, Ledger, LedgerError, OrderStatus, PurchaseOutcome,
    PurchaseRequest, RequestId, RequestKey, Sale, SkuId, StoreError, UserId,
};
use serde::Serialize;

use super::{Admission, AdmissionError};

/// The request id of a winner's reservation (one per user and sale: replays are safe).
pub const DRAW_REQUEST_ID: &str = "draw";

/// A draw fixed after its window: the revealed seed and the waitlist in draw order, each
/// entry with whether it won the first round (its quantity fit in the stock).
pub struct Drawn {
    pub seed: Seed,
    pub waitlist: Vec<(Entry, bool)>,
    rank: HashMap<UserId, usize>,
}

impl Drawn {
    /// A user's 1-based rank on the waitlist.
    pub fn rank(&self, user: UserId) -> Option<usize> {
        self.rank.get(&user).map(|r| r + 1)
    }
}

/// The published draw: the commitment, then (after the window) the seed, the entries in
/// entry order and the winners of the first round in waitlist order.
#[derive(Debug, Clone, Serialize)]
pub struct DrawView {
    pub sku_id: u64,
    pub entries_open_at_ms: i64,
    pub draw_at_ms: i64,
    /// The stock the first round draws for.
    pub total_stock: u64,
    pub seed_sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<String>,
    pub entry_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries: Option<Vec<Entry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winners: Option<Vec<Entry>>,
    /// How far down the waitlist the reservations have gone.
    pub waitlist_position: u64,
}

/// A user's result.
#[derive(Debug, Clone, Serialize)]
pub struct EntryResult {
    pub user_id: u64,
    pub quantity: u32,
    /// `entered` (before the draw), `won` (a reservation, held or paid: `order_no`),
    /// `cancelled` / `expired` (won, then the reservation was cancelled or lapsed unpaid: its
    /// units passed down the waitlist), `waitlisted` (not reached yet: units may come back),
    /// `not_won`.
    pub result: &'static str,
    /// The reservation's status now (`RESERVED`, `PAID`, `CANCELLED`, `EXPIRED`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_no: Option<String>,
}

fn draw_key(user: UserId) -> RequestKey {
    let id = RequestId::parse(DRAW_REQUEST_ID).expect("a valid request id");
    RequestKey::new(user, id)
}

impl Admission {
    /// Takes a user's entry (once; a second answers the first). Answers it and whether new.
    pub async fn enter(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: u32,
    ) -> Result<(Entry, bool), AdmissionError> {
        Self::mode(sale, AdmissionMode::Draw)?;
        if quantity == 0 || quantity > sale.per_user_limit {
            let why = format!("quantity must be 1..={}", sale.per_user_limit);
            return Err(AdmissionError::refused(ErrorCode::InvalidRequest, why));
        }
        self.seed(sale.sku_id).await?;
        let entry = Entry {
            user_id: user,
            quantity,
        };
        let window = EntryWindow {
            opens_at_ms: sale.admission.admission_opens_at_ms,
            closes_at_ms: sale.admission.draw_at_ms,
            len_max: self.config.entries_max,
        };
        let refuse = |code, why: &'static str| Err(AdmissionError::refused(code, why));
        match self.book.enter(sale.sku_id, entry, window).await? {
            Entered::New(_) => Ok((entry, true)),
            Entered::Already(first) => Ok((first, false)),
            Entered::NotOpen => refuse(ErrorCode::NotStarted, "entries are not open yet"),
            Entered::Closed => refuse(ErrorCode::Ended, "entries are closed"),
            Entered::Full => refuse(ErrorCode::Busy, "the draw takes no more entries"),
        }
    }

    /// The draw, once the window closed by the book's clock (then fixed: cached). A sale of
    /// another admission mode has none: its book is not sealed (a reader's question about a
    /// draw changes nothing of a sale that has none), and it has no seed to draw with.
    pub async fn drawn(&self, sale: &Sale) -> Result<Option<Arc<Drawn>>, StoreError> {
        if sale.admission.mode != AdmissionMode::Draw {
            return Ok(None);
        }
        let sku = sale.sku_id;
        if let Some(d) = self.draws.lock().unwrap().get(&sku) {
            return Ok(Some(d.clone()));
        }
        if self
            .book
            .seal(sku, sale.admission.draw_at_ms)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let seed = self.seed(sku).await?;
        let entries = self.book.entries(sku).await?;
        let waitlist = admission::draw(&seed, &entries, sale.total_stock);
        let rank = waitlist
            .iter()
            .enumerate()
            .map(|(i, (e, _))| (e.user_id, i))
            .collect();
        let d = Arc::new(Drawn {
            seed,
            waitlist,
            rank,
        });
        self.draws.lock().unwrap().insert(sku, d.clone());
        Ok(Some(d))
    }

    /// The published draw.
    pub async fn draw_view(&self, sale: &Sale) -> Result<DrawView, AdmissionError> {
        Self::mode(sale, AdmissionMode::Draw)?;
        let sku = sale.sku_id;
        let seed = self.seed(sku).await?;
        let drawn = self.drawn(sale).await?;
        let entries = match drawn {
            Some(_) => Some(self.book.entries(sku).await?),
            None => None,
        };
        let entry_count = match &entries {
            Some(e) => e.len() as u64,
            None => self.book.entries(sku).await?.len() as u64,
        };
        Ok(DrawView {
            sku_id: sku.0,
            entries_open_at_ms: sale.admission.admission_opens_at_ms,
            draw_at_ms: sale.admission.draw_at_ms,
            total_stock: sale.total_stock,
            seed_sha256: commitment(&seed),
            seed: drawn.as_ref().map(|d| admission::hex(&d.seed)),
            entry_count,
            entries,
            winners: drawn.map(|d| {
                let won = d.waitlist.iter().filter(|(_, w)| *w);
                won.map(|(e, _)| *e).collect()
            }),
            waitlist_position: self.book.draw_pos(sku).await?,
        })
    }

    /// Walks the waitlist from the book's position: each entry whose quantity fits in the
    /// available stock gets a reservation (request id [`DRAW_REQUEST_ID`]: a walk repeated by
    /// a crash or a racing instance replays, never doubles); an entry that does not fit is
    /// passed over; the walk stops when nothing is available. Answers reservations made.
    pub async fn walk(&self, sale: &Sale, ledger: &dyn Ledger) -> Result<u64, AdmissionError> {
        let Some(drawn) = self.drawn(sale).await? else {
            return Ok(0);
        };
        let sku = sale.sku_id;
        let mut made = 0;
        loop {
            let pos = self.book.draw_pos(sku).await?;
            let available = match ledger.counters(sku).await.map_err(unavailable)? {
                Some(c) => c.available,
                None => return Ok(made),
            };
            let batch = next_batch(&drawn.waitlist, pos as usize, available);
            if batch.is_empty() {
                return Ok(made);
            }
            made += self.reserve(sku, ledger, &batch).await?;
            let to = pos + batch.len() as u64;
            // Compare and set: a racing walker moved it already (its purchases replay ours).
            self.book.advance_draw(sku, pos, to).await?;
        }
    }

    async fn reserve(
        &self,
        sku: SkuId,
        ledger: &dyn Ledger,
        batch: &[Option<Entry>],
    ) -> Result<u64, AdmissionError> {
        let reqs: Vec<PurchaseRequest> = batch
            .iter()
            .flatten()
            .map(|e| PurchaseRequest {
                sku_id: sku,
                user_id: e.user_id,
                request_id: draw_key(e.user_id).request_id,
                quantity: e.quantity,
            })
            .collect();
        if reqs.is_empty() {
            return Ok(0);
        }
        let outcomes = ledger
            .purchase_batch(sku, &reqs)
            .await
            .map_err(unavailable)?;
        let won = outcomes
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    PurchaseOutcome::Accepted {
                        replayed: false,
                        ..
                    }
                )
            })
            .count();
        Ok(won as u64)
    }

    /// A user's entry and result.
    pub async fn my_entry(
        &self,
        sale: &Sale,
        user: UserId,
        ledger: &dyn Ledger,
    ) -> Result<Option<EntryResult>, AdmissionError> {
        Self::mode(sale, AdmissionMode::Draw)?;
        let Some(entry) = self.book.entry(sale.sku_id, user).await? else {
            return Ok(None);
        };
        let mut result = EntryResult {
            user_id: user.0,
            quantity: entry.quantity,
            result: "entered",
            order_status: None,
            rank: None,
            order_no: None,
        };
        let Some(drawn) = self.drawn(sale).await? else {
            return Ok(Some(result));
        };
        let rank = drawn.rank(user);
        result.rank = rank;
        let pos = self.book.draw_pos(sale.sku_id).await? as usize;
        if let Some(order) = reservation(sale.sku_id, user, entry, ledger).await? {
            result.result = outcome(order.status);
            result.order_status = Some(order.status.as_str());
            result.order_no = Some(order.order_no.to_string());
        } else if rank.is_some_and(|r| r > pos) {
            result.result = "waitlisted";
        } else {
            result.result = "not_won";
        }
        Ok(Some(result))
    }
}

/// The next entries of the walk from `pos`: `Some` for each that fits in what is left of
/// `available`, `None` for one passed over; empty when nothing is available or the list ends.
fn next_batch(waitlist: &[(Entry, bool)], pos: usize, available: u64) -> Vec<Option<Entry>> {
    let mut left = available;
    let mut batch = Vec::new();
    for (e, _) in waitlist.iter().skip(pos).take(BATCH_LEN_MAX) {
        if left == 0 {
            break;
        }
        let q = u64::from(e.quantity);
        batch.push((q <= left).then_some(*e));
        left = left.saturating_sub(if q <= left { q } else { 0 });
    }
    batch
}

/// A winner's result by its reservation's status now.
fn outcome(status: OrderStatus) -> &'static str {
    match status {
        OrderStatus::Cancelled => "cancelled",
        OrderStatus::Expired => "expired",
        OrderStatus::Rejected => "not_won",
        OrderStatus::Pending | OrderStatus::Created | OrderStatus::Reserved | OrderStatus::Paid => {
            "won"
        }
    }
}

/// The user's reservation as the ledger knows it now, when the walk made one (found by a
/// replay of its accepted request; the replay answers the order as accepted, so its status
/// is read again).
async fn reservation(
    sku: SkuId,
    user: UserId,
    entry: Entry,
    ledger: &dyn Ledger,
) -> Result<Option<HotOrder>, AdmissionError> {
    let key = draw_key(user);
    if !ledger.is_accepted(sku, &key).await.map_err(unavailable)? {
        return Ok(None);
    }
    let req = PurchaseRequest {
        sku_id: sku,
        user_id: user,
        request_id: key.request_id,
        quantity: entry.quantity,
    };
    let outcome = ledger
        .purchase_batch(sku, &[req])
        .await
        .map_err(unavailable)?;
    let Some(PurchaseOutcome::Accepted { order, .. }) = outcome.into_iter().next() else {
        return Ok(None);
    };
    let now = ledger.order(&order.order_no).await.map_err(unavailable)?;
    Ok(Some(now.unwrap_or(order)))
}

fn unavailable(e: LedgerError) -> AdmissionError {
    AdmissionError::Store(StoreError::Unavailable(e.to_string()))
}
