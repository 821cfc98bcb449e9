//! Admission: who may buy a queue or draw sale. The rules are the domain's
//! (`flashsale_core::admission`); the state is an [`AdmissionBook`] (Redis in the sale's slot,
//! or the embedded ledger's database); this module runs them:
//!
//! - a queue: joins ([`Admission::join`]), the pre-queue sealed and shuffled at the start,
//!   waves sized by what is still sellable ([`Admission::tick`], run by whoever asks, at most
//!   every `tick`, safe across instances: the cursor moves by compare and set), a buyer's place
//!   and state with a signed pass once admitted ([`Admission::status`]), and the purchase
//!   check ([`Admission::check_pass`]);
//! - a draw ([`draw`]): entries in the window, the published draw, and the walk down the
//!   waitlist that gives each winner a reservation, run in the background by the
//!   [`walker::DrawWalker`] (and by readers of a result);
//! - [`grouped`]: a book whose queue joins are written in groups (one commit, one script
//!   call per group).

pub mod draw;
pub mod grouped;
pub mod walker;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashsale_core::admission::{
    self, commitment, next_cursor, pass, place_after_start, shuffle, wave_window, AdmissionBook,
    GroupJoin, QueueCounts, Seed, Ticket,
};
use flashsale_core::{AdmissionMode, Counters, ErrorCode, Sale, SkuId, StoreError, UserId};
use serde::Serialize;

/// How admission runs (`FLASHSALE_ADMISSION_*`; every sale of the process takes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// How long an admission (and its pass) lasts from its wave.
    pub pass_ttl_ms: i64,
    /// Most places one wave admits (how fast a queue may move).
    pub wave_max: u64,
    /// Most buyers one queue holds.
    pub queue_max: u64,
    /// Most entries one draw takes.
    pub entries_max: u64,
    /// Least time between two waves of one sale on one instance.
    pub tick: Duration,
    /// Between two walks of the drawn sales' waitlists by the background walker.
    pub walk_every: Duration,
}

impl AdmissionConfig {
    /// Every default, in one place: the CLI's flags take theirs from here.
    pub const DEFAULT: AdmissionConfig = AdmissionConfig {
        pass_ttl_ms: 120_000,
        wave_max: 5_000,
        queue_max: admission::QUEUE_LEN_MAX,
        entries_max: admission::QUEUE_LEN_MAX,
        tick: Duration::from_millis(200),
        walk_every: walker::WALK_EVERY,
    };

    /// Checks each setting against its bounds; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let max = admission::QUEUE_LEN_MAX;
        let checks: [(&str, u64, u64, u64); 6] = [
            (
                "PASS_TTL_MS",
                self.pass_ttl_ms.max(0) as u64,
                1_000,
                3_600_000,
            ),
            ("WAVE_MAX", self.wave_max, 1, max),
            ("QUEUE_MAX", self.queue_max, 1, max),
            ("ENTRIES_MAX", self.entries_max, 1, max),
            ("TICK_MS", ms(self.tick), 10, 10_000),
            ("WALK_MS", ms(self.walk_every), 10, 60_000),
        ];
        for (name, value, lo, hi) in checks {
            if !(lo..=hi).contains(&value) {
                return Err(format!(
                    "FLASHSALE_ADMISSION_{name} must be {lo}..={hi}, not {value}"
                ));
            }
        }
        Ok(())
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig::DEFAULT
    }
}

/// Why a queue sale's purchase without a pass is refused (the server answers this refusal
/// from bytes written once: a spike of pass-less purchases costs no serialisation).
pub const PASS_MISSING: &str =
    "this sale admits buyers through its queue: join it and send the admission pass";
/// Why a draw sale's purchase is refused.
pub const DRAW_NEEDS_NO_PASS: &str = "a draw sale is bought through a won reservation";

/// Why an admission call was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("{1}")]
    Refused(ErrorCode, Cow<'static, str>),
    #[error("admission state unavailable: {0}")]
    Store(#[from] StoreError),
}

impl AdmissionError {
    fn refused(code: ErrorCode, why: impl Into<Cow<'static, str>>) -> AdmissionError {
        AdmissionError::Refused(code, why.into())
    }

    /// The API's code of the refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            AdmissionError::Refused(code, _) => *code,
            AdmissionError::Store(_) => ErrorCode::Unavailable,
        }
    }
}

/// A buyer's state in a queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Joined before the start: the place is drawn at the start.
    PreQueue,
    Waiting,
    /// May buy with `pass` until `admitted_until_ms`.
    Admitted,
    /// The admission lapsed unused.
    Lapsed,
    /// Nothing is left to sell, and no hold can bring units back.
    SoldOut,
}

impl QueueState {
    /// The state's name, as serialised.
    pub fn as_str(&self) -> &'static str {
        match self {
            QueueState::PreQueue => "pre_queue",
            QueueState::Waiting => "waiting",
            QueueState::Admitted => "admitted",
            QueueState::Lapsed => "lapsed",
            QueueState::SoldOut => "sold_out",
        }
    }
}

/// A buyer's view of its queue.
#[derive(Debug, Clone, Serialize)]
pub struct QueueStatus {
    pub state: QueueState,
    /// 1-based; absent in the pre-queue before the start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub place: Option<u64>,
    /// Places admitted so far (the cursor).
    pub admitted_through: u64,
    pub queue_length: u64,
    /// Estimated time until admission (waiting only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admitted_until_ms: Option<i64>,
    /// The admission pass: send it with a purchase of this sale (`admission_pass`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass: Option<String>,
    /// SHA-256 of the pre-queue's seed, published when the queue opened.
    pub seed_sha256: String,
    /// The seed (hex), once the pre-queue is sealed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<String>,
}

/// A sealed pre-queue's order: user → place.
struct Order {
    places: HashMap<UserId, u64>,
    len: u64,
}

/// The admission service of one process.
pub struct Admission {
    book: Arc<dyn AdmissionBook>,
    key: [u8; 32],
    config: AdmissionConfig,
    /// Each sale's committed seed and its published hash (computed once: every buyer's
    /// status carries it).
    seeds: Mutex<HashMap<SkuId, (Seed, Arc<str>)>>,
    orders: Mutex<HashMap<SkuId, Arc<Order>>>,
    ticks: Mutex<HashMap<SkuId, Instant>>,
    counts: Mutex<HashMap<SkuId, (Instant, QueueCounts)>>,
    /// When the book last answered that a sale's pre-queue is not sealed yet.
    unsealed: Mutex<HashMap<SkuId, Instant>>,
    draws: Mutex<HashMap<SkuId, Arc<draw::Drawn>>>,
}

fn random_seed() -> Seed {
    use rand::RngCore;
    let mut seed = [0u8; 32];
    rand::rng().fill_bytes(&mut seed);
    seed
}

/// Units that may still be sold: available, plus the reserved units that may come back.
pub fn sellable(c: &Counters) -> u64 {
    admission::sellable_units(c)
}

impl Admission {
    /// `secret`: the service's user-token secret; the pass key is derived from it.
    pub fn new(book: Arc<dyn AdmissionBook>, secret: &[u8], config: AdmissionConfig) -> Self {
        Admission {
            book,
            key: pass::key(secret),
            config,
            seeds: Mutex::default(),
            orders: Mutex::default(),
            ticks: Mutex::default(),
            counts: Mutex::default(),
            unsealed: Mutex::default(),
            draws: Mutex::default(),
        }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    pub fn book(&self) -> &Arc<dyn AdmissionBook> {
        &self.book
    }

    /// The sale's committed seed, committing a fresh one if none is.
    pub async fn seed(&self, sku: SkuId) -> Result<Seed, StoreError> {
        Ok(self.committed(sku).await?.0)
    }

    /// The sale's committed seed and its hash ([`commitment`]), committing a fresh seed if
    /// none is.
    async fn committed(&self, sku: SkuId) -> Result<(Seed, Arc<str>), StoreError> {
        if let Some(kept) = self.seeds.lock().unwrap().get(&sku) {
            return Ok(kept.clone());
        }
        let seed = match self.book.seed(sku).await? {
            Some(seed) => seed,
            None => self.book.commit_seed(sku, &random_seed()).await?,
        };
        let kept = (seed, Arc::from(commitment(&seed)));
        self.seeds.lock().unwrap().insert(sku, kept.clone());
        Ok(kept)
    }

    fn mode(sale: &Sale, mode: AdmissionMode) -> Result<(), AdmissionError> {
        if sale.admission.mode == mode {
            return Ok(());
        }
        let why = format!(
            "sale {} has admission {}",
            sale.sku_id.0,
            sale.admission.mode.as_str()
        );
        Err(AdmissionError::refused(ErrorCode::InvalidRequest, why))
    }

    /// Joins the queue (once: a second join answers the same ticket).
    pub async fn join(
        &self,
        sale: &Sale,
        user: UserId,
        now: i64,
    ) -> Result<Ticket, AdmissionError> {
        Self::mode(sale, AdmissionMode::Queue)?;
        if now < sale.admission.admission_opens_at_ms {
            return Err(AdmissionError::refused(
                ErrorCode::NotStarted,
                "the queue is not open yet",
            ));
        }
        if now >= sale.ends_at_ms {
            return Err(AdmissionError::refused(
                ErrorCode::Ended,
                "the sale has ended",
            ));
        }
        self.seed(sale.sku_id).await?;
        let join = GroupJoin {
            user,
            starts_at_ms: sale.starts_at_ms,
            len_max: self.config.queue_max,
        };
        let joined = self.book.join(sale.sku_id, join).await?;
        joined.ok_or_else(|| AdmissionError::refused(ErrorCode::Busy, "the queue is full"))
    }

    /// The sealed pre-queue's order, once the start passed (by the book's clock).
    async fn order(&self, sale: &Sale) -> Result<Option<Arc<Order>>, StoreError> {
        let sku = sale.sku_id;
        if let Some(order) = self.orders.lock().unwrap().get(&sku) {
            return Ok(Some(order.clone()));
        }
        // Before the start the book is asked at most once per tick (the book's clock decides;
        // a buyer reading its pre-queue place meanwhile costs it nothing).
        let asked = self.unsealed.lock().unwrap().get(&sku).copied();
        if asked.is_some_and(|at| at.elapsed() < self.config.tick) {
            return Ok(None);
        }
        let Some(len) = self.book.seal(sku, sale.starts_at_ms).await? else {
            self.unsealed.lock().unwrap().insert(sku, Instant::now());
            return Ok(None);
        };
        let seed = self.seed(sku).await?;
        let users = self.book.prequeue(sku).await?;
        if users.len() as u64 != len {
            return Err(StoreError::Internal(format!(
                "sale {}: pre-queue of {} users, sealed at {len}",
                sku.0,
                users.len()
            )));
        }
        let places = shuffle(&seed, &users)
            .into_iter()
            .zip(1..)
            .collect::<HashMap<_, _>>();
        let order = Arc::new(Order { places, len });
        self.orders.lock().unwrap().insert(sku, order.clone());
        Ok(Some(order))
    }

    /// A ticket's place, `None` while the pre-queue is not sealed.
    async fn place(&self, sale: &Sale, user: UserId, t: Ticket) -> Result<Option<u64>, StoreError> {
        let Some(order) = self.order(sale).await? else {
            return Ok(None);
        };
        Ok(match t.pre {
            true => order.places.get(&user).copied(),
            false => Some(place_after_start(order.len, t.n)),
        })
    }

    /// One wave, at most every `tick` per sale on this instance: seals the pre-queue at the
    /// start, then moves the cursor so that the admitted buyers holding an unused admission
    /// reach the window of what is still sellable. Answers the counts after it. Between waves
    /// the counts are read from the book at most once per `tick` too: a spike of buyers
    /// reading their place costs the book one read each, not one per count.
    pub async fn tick(&self, sale: &Sale, c: &Counters) -> Result<QueueCounts, StoreError> {
        let sku = sale.sku_id;
        let due = {
            let mut ticks = self.ticks.lock().unwrap();
            let last = ticks.get(&sku).copied();
            let due = last.is_none_or(|t| t.elapsed() >= self.config.tick);
            if due {
                ticks.insert(sku, Instant::now());
            }
            due
        };
        if !due {
            if let Some(counts) = self.recent_counts(sku) {
                return Ok(counts);
            }
        }
        let now = flashsale_core::clock::now_ms();
        let mut counts = self.book.counts(sku, now - self.config.pass_ttl_ms).await?;
        if due && self.order(sale).await?.is_some() {
            counts = self.wave(sale, c, counts).await?;
        }
        let mut cache = self.counts.lock().unwrap();
        cache.insert(sku, (Instant::now(), counts));
        Ok(counts)
    }

    /// The counts read less than `tick` ago.
    fn recent_counts(&self, sku: SkuId) -> Option<QueueCounts> {
        let cache = self.counts.lock().unwrap();
        let (at, counts) = cache.get(&sku)?;
        (at.elapsed() < self.config.tick).then_some(*counts)
    }

    /// Moves the cursor once (compare and set: a racing instance's wave wins, this one is
    /// skipped).
    async fn wave(
        &self,
        sale: &Sale,
        c: &Counters,
        counts: QueueCounts,
    ) -> Result<QueueCounts, StoreError> {
        let counts = QueueCounts {
            sealed: true,
            ..counts
        };
        let to = next_cursor(
            counts.cursor,
            counts.done(),
            sellable(c),
            counts.queued(),
            self.config.wave_max,
        );
        if to > counts.cursor && self.book.advance(sale.sku_id, counts.cursor, to).await? {
            return Ok(QueueCounts {
                cursor: to,
                ..counts
            });
        }
        Ok(counts)
    }

    /// A buyer's place and state; an admitted buyer's pass. Runs a wave when one is due. Once
    /// nothing is left to sell and no hold can bring units back, every reader hears SOLD_OUT
    /// without a read of its ticket: a spike of buyers polling a sold-out queue costs the book
    /// nothing (a reader who never joined hears it too: it is true for everyone).
    pub async fn status(
        &self,
        sale: &Sale,
        user: UserId,
        c: &Counters,
    ) -> Result<Option<QueueStatus>, AdmissionError> {
        Self::mode(sale, AdmissionMode::Queue)?;
        if sellable(c) == 0 {
            return self.describe(sale, user, None, c).await.map(Some);
        }
        match self.book.ticket(sale.sku_id, user).await? {
            Some(t) => self.describe(sale, user, Some(t), c).await.map(Some),
            None => Ok(None),
        }
    }

    /// A buyer's status from the ticket its join just answered (no second read of it).
    pub async fn status_of(
        &self,
        sale: &Sale,
        user: UserId,
        ticket: Ticket,
        c: &Counters,
    ) -> Result<QueueStatus, AdmissionError> {
        Self::mode(sale, AdmissionMode::Queue)?;
        let ticket = (sellable(c) > 0).then_some(ticket);
        self.describe(sale, user, ticket, c).await
    }

    /// The status of a buyer holding `ticket` (`None`: the sale is sold out, told to all).
    async fn describe(
        &self,
        sale: &Sale,
        user: UserId,
        ticket: Option<Ticket>,
        c: &Counters,
    ) -> Result<QueueStatus, AdmissionError> {
        let sku = sale.sku_id;
        let sold_out = sellable(c) == 0;
        let counts = self.tick(sale, c).await?;
        let (seed, seed_sha256) = self.committed(sku).await?;
        let place = match ticket {
            Some(t) => self.place(sale, user, t).await?,
            None => None,
        };
        let mut status = QueueStatus {
            state: QueueState::PreQueue,
            place,
            admitted_through: counts.cursor,
            queue_length: counts.queued(),
            eta_ms: None,
            admitted_until_ms: None,
            pass: None,
            seed_sha256: seed_sha256.to_string(),
            seed: (counts.sealed || place.is_some()).then(|| admission::hex(&seed)),
        };
        if sold_out {
            status.state = QueueState::SoldOut;
            return Ok(status);
        }
        let Some(place) = place else {
            return Ok(status);
        };
        if place <= counts.cursor {
            self.admitted(sale, user, place, &mut status).await?;
        } else {
            status.state = QueueState::Waiting;
            status.eta_ms = Some(self.eta_ms(place - counts.cursor, c));
        }
        Ok(status)
    }

    /// An admitted place: its pass while the admission lasts.
    async fn admitted(
        &self,
        sale: &Sale,
        user: UserId,
        place: u64,
        status: &mut QueueStatus,
    ) -> Result<(), StoreError> {
        let (at, now) = self.book.admitted_at(sale.sku_id, place).await?;
        let until = at.unwrap_or(now) + self.config.pass_ttl_ms;
        if now >= until {
            status.state = QueueState::Lapsed;
            return Ok(());
        }
        status.state = QueueState::Admitted;
        status.admitted_until_ms = Some(until);
        status.pass = Some(pass::sign(&self.key, sale.sku_id, user, until));
        Ok(())
    }

    /// Places ahead over one window per admission period: each period at most the window is
    /// admitted (a lower bound on the wait when buyers use their turns at once).
    fn eta_ms(&self, ahead: u64, c: &Counters) -> u64 {
        let window = wave_window(sellable(c)).max(1);
        ahead.div_ceil(window).saturating_sub(1) * self.config.pass_ttl_ms as u64
    }

    /// Whether a purchase of a queue or draw sale carries a valid pass for this user: an open
    /// sale needs none; a draw's winners buy through their reservation, so none of its
    /// purchases does. Costs no call to the ledger or the book.
    pub fn check_pass(
        &self,
        sale: &Sale,
        user: UserId,
        text: Option<&str>,
        now: i64,
    ) -> Result<(), AdmissionError> {
        let refuse =
            |why: Cow<'static, str>| AdmissionError::refused(ErrorCode::AdmissionRequired, why);
        match sale.admission.mode {
            AdmissionMode::Open => Ok(()),
            AdmissionMode::Draw => Err(refuse(DRAW_NEEDS_NO_PASS.into())),
            AdmissionMode::Queue => {
                let text = text.ok_or_else(|| refuse(PASS_MISSING.into()))?;
                pass::verify(&self.key, text, sale.sku_id, user, now)
                    .map(drop)
                    .map_err(|e| refuse(format!("admission pass refused: {e:?}").into()))
            }
        }
    }

    /// Records that an admitted buyer bought (counts its admission as used).
    pub async fn bought(&self, sale: &Sale, user: UserId) -> Result<(), StoreError> {
        let Some(ticket) = self.book.ticket(sale.sku_id, user).await? else {
            return Ok(());
        };
        match self.place(sale, user, ticket).await? {
            Some(place) => self.book.mark_bought(sale.sku_id, user, place).await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the API writes are serde's.
    #[test]
    fn queue_state_names_are_the_serialised_ones() {
        use QueueState::*;
        for state in [PreQueue, Waiting, Admitted, Lapsed, SoldOut] {
            let json = serde_json::to_value(&state).unwrap();
            assert_eq!(json.as_str(), Some(state.as_str()));
        }
    }
}
