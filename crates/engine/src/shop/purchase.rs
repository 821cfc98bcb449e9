//! The purchase use case, top-down in this one file: the sale a purchase names (with its
//! admission), then one admitted request's decision in one function ([`Shop::purchase`]):
//! the sale's sold-out flag, its breaker, the caller's risk gate, the hot ledger through the
//! shop's [`Batcher`], then the outcome's rules (a reused request id, the status the ledger's
//! durability answers). Below it, the batcher: the queue a purchase enters and the batch
//! task that sends it to the ledger and keeps the books.
//!
//! - Sold-out flag: once the ledger answers SOLD_OUT to a request for one unit (so nothing is
//!   left: SOLD_OUT for two units with one left says nothing about the next buyer of one), the
//!   batch task loads the sale's accepted request keys in the background (only when the copy's
//!   `(epoch, count)` changed since the last load) and sets the flag ([`SoldOutFlags`]); from
//!   then on [`Batcher::sold_out_here`] answers new requests without the ledger (90% of a
//!   spike's requests), while retries of accepted requests still reach it for their first
//!   outcome. Restocks and a short TTL clear the flag.
//! - Batching: each sale has a bounded queue and `IN_FLIGHT` tasks per lane. The tasks take
//!   whatever is queued (at most `batch_max`) as soon as the previous call returns, so at low
//!   load a request goes alone with no timer wait, and under a spike the batches grow by
//!   themselves. A full queue answers BUSY. A sale has one lane, or with buckets kept apart
//!   by the ledger one per home bucket, so that each batch goes whole to one bucket's copy
//!   (the ledger would otherwise split it into a smaller script call per bucket). The HTTP
//!   route and `flashsale bench strategies` both go through it, so the bench measures what
//!   production runs.
//! - Loss journal: every accepted purchase (new or a replay, answered 202 or written but not
//!   confirmed by the replicas and answered 503) is written into the reconciler's
//!   [`Journal`] here, where every outcome is seen: whatever this instance may have promised,
//!   a later loss of it is reported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use flashsale_core::ledger::StoredSale;
use flashsale_core::metric_names::RISK_REPLAYS;
use flashsale_core::{
    AdmissionMode, ErrorCode, HotOrder, Ledger, LedgerError, OrderStatus, PurchaseOutcome,
    PurchaseRequest, Sale, SaleState, SkuId, UserId,
};
use tokio::sync::{mpsc, oneshot};

use super::{Shop, ShopError};
use crate::cache::{AcceptedKeys, SoldOutFlags};
use crate::reconcile::Journal;

/// The shop's risk check of one purchase, asked after the local refusals and before the
/// ledger. The server's risk client implements it.
#[async_trait::async_trait]
pub trait RiskGate: Send + Sync {
    /// Whether `req` may go on to the ledger.
    async fn screen(&self, req: &PurchaseRequest) -> Screen;
    /// The ledger accepted `req` (first time or replay): a retry of it may skip the check.
    fn accepted(&self, req: &PurchaseRequest);
}

/// A risk gate's word on one purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screen {
    Pass,
    Refuse(RiskDenial),
}

/// Why a risk gate refused a purchase: who refused (`service`, `fallback`) and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RiskDenial {
    pub by: &'static str,
    pub message: String,
}

/// An accepted purchase (or the replay of the first one).
#[derive(Debug, Clone)]
pub struct Purchased {
    pub order: HotOrder,
    /// The status to answer: the ledger's, as its durability lets it be promised.
    pub status: OrderStatus,
    /// True when this repeats the request's first outcome.
    pub replayed: bool,
}

/// Why a purchase was not accepted.
#[derive(Debug)]
pub enum PurchaseRefusal {
    /// The sale's local flag: sold out, and this is not a retry of an accepted request (no
    /// one was asked).
    SoldOutHere,
    /// The risk gate refused, and the ledger had not accepted this request before.
    Risk(RiskDenial),
    /// Any other refusal or failure.
    Shop(ShopError),
}

impl From<ShopError> for PurchaseRefusal {
    fn from(e: ShopError) -> PurchaseRefusal {
        PurchaseRefusal::Shop(e)
    }
}

impl From<LedgerError> for PurchaseRefusal {
    fn from(e: LedgerError) -> PurchaseRefusal {
        PurchaseRefusal::Shop(e.into())
    }
}

impl Shop {
    /// True when `req` is answered SOLD_OUT by this instance's flag, without the ledger (a
    /// retry of an accepted request never is): what a caller may ask before it spends anything
    /// that guards the ledger (a sale's rate, its in-flight permits) on a request that will
    /// not reach it. [`Shop::purchase`] asks it again.
    pub fn sold_out_here(&self, req: &PurchaseRequest) -> bool {
        self.batcher.sold_out_here(req)
    }

    /// The sale `user` asks to buy from: a queue or draw sale's purchase needs a valid
    /// admission pass for this user and sale (403 ADMISSION_REQUIRED without one), checked
    /// before anything else is spent on the request.
    pub async fn sale_to_buy(
        &self,
        sku: SkuId,
        user: UserId,
        pass: Option<&str>,
    ) -> Result<Arc<StoredSale>, ShopError> {
        let stored = self.sale(sku).await?;
        if stored.sale.admission.mode == AdmissionMode::Open {
            return Ok(stored);
        }
        let refused = || {
            ShopError::refused(
                ErrorCode::AdmissionRequired,
                "this sale admits buyers through its queue or draw",
            )
        };
        let admission = self.admission.as_ref().ok_or_else(refused)?;
        let now = crate::now_ms();
        admission.check_pass(&stored.sale, user, pass, now)?;
        Ok(stored)
    }

    /// One purchase of `sale` (from [`Shop::sale_to_buy`]): the sold-out flag, the breaker,
    /// `gate`, the ledger, and the rules of its outcome.
    pub async fn purchase(
        &self,
        req: PurchaseRequest,
        sale: &Sale,
        gate: &dyn RiskGate,
    ) -> Result<Purchased, PurchaseRefusal> {
        if self.batcher.sold_out_here(&req) {
            return Err(PurchaseRefusal::SoldOutHere);
        }
        if !self.breaker.allows(req.sku_id) {
            let why = "hot ledger unavailable; retry shortly";
            return Err(ShopError::refused(ErrorCode::Unavailable, why).into());
        }
        // After the sold-out flag and the ledger's breaker: a sale known sold out, or a
        // ledger known down, answers without asking the risk service.
        self.screen(&req, gate).await?;
        let quantity = req.quantity;
        let outcome = self.ask_ledger(req.clone(), sale.state).await;
        if matches!(outcome, Ok(PurchaseOutcome::Accepted { .. })) {
            gate.accepted(&req);
        }
        let purchased = match outcome? {
            PurchaseOutcome::Accepted { order, replayed } => {
                self.accepted(order, replayed, quantity)?
            }
            PurchaseOutcome::Rejected(code) => return Err(ShopError::Code(code).into()),
        };
        if !purchased.replayed {
            self.record_bought(sale, req.user_id);
        }
        Ok(purchased)
    }

    /// The gate's word; a refusal of a purchase the ledger already accepted yields to the
    /// ledger, so a retry always gets its first outcome. A refusal is not remembered: the
    /// next attempt is asked again.
    async fn screen(
        &self,
        req: &PurchaseRequest,
        gate: &dyn RiskGate,
    ) -> Result<(), PurchaseRefusal> {
        let Screen::Refuse(denial) = gate.screen(req).await else {
            return Ok(());
        };
        if self.ledger.is_accepted(req.sku_id, &req.key()).await? {
            metrics::counter!(RISK_REPLAYS).increment(1);
            return Ok(());
        }
        Err(PurchaseRefusal::Risk(denial))
    }

    /// An accepted outcome's rules: a retry must ask for what the first request asked for
    /// (the replayed order is the first request's, quantity included: both ledgers keep it
    /// with the replay), and the status is what the ledger's durability lets it promise.
    fn accepted(
        &self,
        order: HotOrder,
        replayed: bool,
        quantity: u32,
    ) -> Result<Purchased, ShopError> {
        if replayed && order.quantity != quantity {
            let why = format!(
                "this request id was first sent with quantity {}; a new attempt needs a new id",
                order.quantity
            );
            return Err(ShopError::refused(ErrorCode::IdempotencyKeyReused, why));
        }
        let status = self.ledger.durability().as_answered(order.status);
        Ok(Purchased {
            order,
            status,
            replayed,
        })
    }

    /// The hot ledger's outcome of `req`, on a sale in `state`, through the batcher. The
    /// breaker counts the ledger's own faults; a copy that is fenced (a failover moved it)
    /// or missing is nudged to be rebuilt now, not at the next pass, and a missing one
    /// answers "retry" unless the sale has not started.
    async fn ask_ledger(
        &self,
        req: PurchaseRequest,
        state: SaleState,
    ) -> Result<PurchaseOutcome, LedgerError> {
        let sku = req.sku_id;
        let outcome = self.batcher.purchase(req).await;
        self.count(sku, &outcome);
        match outcome {
            Err(LedgerError::NotWarmed) => {
                if state != SaleState::Scheduled {
                    self.nudges.nudge(sku);
                }
                Err(copy_missing(state))
            }
            Ok(PurchaseOutcome::Rejected(ErrorCode::Unavailable)) => {
                self.nudges.nudge(sku);
                outcome
            }
            other => other,
        }
    }

    /// The breaker's accounting of one ledger answer. A missing copy is not a fault of the
    /// ledger's: Redis answered.
    pub(super) fn count<T>(&self, sku: SkuId, outcome: &Result<T, LedgerError>) {
        match outcome {
            Err(e) if e.is_unavailable() => self.breaker.failure(sku),
            Ok(_) => self.breaker.success(sku),
            Err(_) => {}
        }
    }

    /// Counts an admitted buyer's purchase against its admission (the next wave may admit
    /// one more buyer), off the answer's path.
    fn record_bought(&self, sale: &Sale, user: UserId) {
        if sale.admission.mode != AdmissionMode::Queue {
            return;
        }
        let Some(admission) = self.admission.clone() else {
            return;
        };
        let sale = sale.clone();
        tokio::spawn(async move {
            if let Err(e) = admission.bought(&sale, user).await {
                tracing::warn!(sku = sale.sku_id.0, error = %e, "could not record an admitted purchase");
            }
        });
    }
}

/// A sale past `scheduled` whose hot copy is missing lost it (Redis restarted empty, a
/// failover): a rebuild puts it back, so the client retries (503); it is not "not started".
fn copy_missing(state: SaleState) -> LedgerError {
    match state {
        SaleState::Scheduled => LedgerError::NotWarmed,
        _ => LedgerError::Unavailable(
            "the sale's hot copy is being restored; retry with the same request_id".into(),
        ),
    }
}

/// Ledger calls in flight per sale: while Redis runs one batch, the next one is already on the
/// wire and queued behind it, so Redis never idles for a round trip and the batch task's
/// bookkeeping overlaps the script. Redis runs each script atomically, so batches never
/// interleave; each request's answer comes from its own batch.
const IN_FLIGHT: usize = 2;

type Reply = oneshot::Sender<Result<PurchaseOutcome, LedgerError>>;

struct Job {
    req: PurchaseRequest,
    reply: Reply,
}

/// A sale and one of its batch lanes (`Ledger::lane`: the home bucket of a bucketed sale on
/// a ledger that keeps buckets apart, else 0).
type Lane = (SkuId, u16);

pub struct Batcher {
    queues: Mutex<HashMap<Lane, mpsc::Sender<Job>>>,
    batch_max: usize,
    queue_cap: usize,
    books: Arc<Bookkeeper>,
}

/// Keeps the books of what the ledger answered: sets a sale's sold-out flag after a SOLD_OUT
/// answer, and journals what the ledger accepted.
struct Bookkeeper {
    ledger: Arc<dyn Ledger>,
    flags: Arc<SoldOutFlags>,
    journal: Arc<Journal>,
    /// A flag remembers at most this many accepted request keys (else it is not set).
    keys_max: usize,
}

/// Accepted request keys a sold-out flag remembers at most, by default.
pub const ACCEPTED_KEYS_MAX_DEFAULT: usize = 1_000_000;

impl Batcher {
    /// With its own sold-out flags, of the default lifetime and key bound.
    pub fn new(ledger: Arc<dyn Ledger>, batch_max: usize, queue_cap: usize) -> Batcher {
        let flags = Arc::new(SoldOutFlags::new(crate::cache::CACHE_TTL_DEFAULT));
        Batcher::with_flags(
            ledger,
            batch_max,
            queue_cap,
            flags,
            ACCEPTED_KEYS_MAX_DEFAULT,
            Arc::default(),
        )
    }

    /// With `flags` shared with whoever clears them (restock notices, state changes), and
    /// the `journal` the reconciler reads.
    pub fn with_flags(
        ledger: Arc<dyn Ledger>,
        batch_max: usize,
        queue_cap: usize,
        flags: Arc<SoldOutFlags>,
        keys_max: usize,
        journal: Arc<Journal>,
    ) -> Batcher {
        assert!((1..=flashsale_core::limits::BATCH_LEN_MAX).contains(&batch_max));
        assert!(queue_cap >= batch_max);
        Batcher {
            queues: Mutex::new(HashMap::new()),
            batch_max,
            queue_cap,
            books: Arc::new(Bookkeeper {
                ledger,
                flags,
                journal,
                keys_max,
            }),
        }
    }

    /// True when `req` can be answered SOLD_OUT here without the ledger: its sale is flagged
    /// and it is not a retry of an accepted request.
    pub fn sold_out_here(&self, req: &PurchaseRequest) -> bool {
        self.books.flags.answers(req.sku_id, &req.key())
    }

    /// Queues one purchase for the ledger and waits for its outcome.
    pub async fn purchase(&self, req: PurchaseRequest) -> Result<PurchaseOutcome, LedgerError> {
        let (reply, answer) = oneshot::channel();
        let lane = (req.sku_id, self.books.ledger.lane(req.sku_id, req.user_id));
        let queue = self.queue(lane);
        queue.try_send(Job { req, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => LedgerError::Busy,
            mpsc::error::TrySendError::Closed(_) => LedgerError::Internal("batch task gone".into()),
        })?;
        answer
            .await
            .map_err(|_| LedgerError::Internal("batch task dropped a request".into()))?
    }

    /// Requests queued for a sale right now, over its lanes (back-pressure, metrics).
    pub fn queue_depth(&self, sku: SkuId) -> usize {
        let queues = self.queues.lock().expect("queues lock");
        queues
            .iter()
            .filter(|((s, _), _)| *s == sku)
            .map(|(_, q)| self.queue_cap - q.capacity())
            .sum()
    }

    /// The queue of a sale's lane; each lane has its own `queue_cap` and batch tasks.
    fn queue(&self, lane: Lane) -> mpsc::Sender<Job> {
        let sku = lane.0;
        let mut queues = self.queues.lock().expect("queues lock");
        queues
            .entry(lane)
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel(self.queue_cap);
                let rx = Arc::new(tokio::sync::Mutex::new(rx));
                for _ in 0..IN_FLIGHT {
                    tokio::spawn(run(self.books.clone(), sku, rx.clone(), self.batch_max));
                }
                tx
            })
            .clone()
    }
}

/// One of a sale's `IN_FLIGHT` batch tasks: takes what is queued (holding the queue only while
/// taking), calls the ledger, answers, repeats.
async fn run(
    books: Arc<Bookkeeper>,
    sku: SkuId,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    batch_max: usize,
) {
    let ledger = books.ledger.clone();
    let mut jobs = Vec::with_capacity(batch_max);
    loop {
        // The queue's lock is released at the end of this statement, before the ledger call.
        let taken = rx.lock().await.recv_many(&mut jobs, batch_max).await;
        if taken == 0 {
            return; // every sender is gone
        }
        metrics::histogram!(flashsale_core::metric_names::BATCH_SIZE, "ledger" => ledger.kind())
            .record(jobs.len() as f64);
        let reqs: Vec<PurchaseRequest> = jobs.iter().map(|j| j.req.clone()).collect();
        match ledger.purchase_batch(sku, &reqs).await {
            Ok(outcomes) => {
                assert_eq!(outcomes.len(), jobs.len(), "one outcome per request");
                books.journal.record_purchases(sku, accepted(&outcomes));
                if reqs.iter().zip(&outcomes).any(nothing_left) {
                    books.flag(sku);
                }
                for (job, outcome) in jobs.drain(..).zip(outcomes) {
                    let _ = job.reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                if let LedgerError::Unconfirmed { written, .. } = &e {
                    books.journal.record_purchases(sku, written.iter().copied());
                }
                let message = e.to_string();
                for job in jobs.drain(..) {
                    let _ = job.reply.send(Err(same_error(&e, &message)));
                }
            }
        }
    }
}

/// SOLD_OUT to a request for one unit: nothing is left for anyone.
fn nothing_left((req, outcome): (&PurchaseRequest, &PurchaseOutcome)) -> bool {
    req.quantity == 1 && matches!(outcome, PurchaseOutcome::Rejected(ErrorCode::SoldOut))
}

/// Accepted purchases, replays included: a replay's first answer may have been a 503 (its
/// call failed after the script ran), so this may be the first time it is promised.
fn accepted(outcomes: &[PurchaseOutcome]) -> impl Iterator<Item = flashsale_core::OrderNo> + '_ {
    outcomes.iter().filter_map(|o| match o {
        PurchaseOutcome::Accepted { order, .. } => Some(order.order_no),
        _ => None,
    })
}

impl Bookkeeper {
    /// Loads the accepted request keys in the background and sets the flag; one load at a
    /// time per sale, and none while a fresh flag stands.
    fn flag(self: &Arc<Self>, sku: SkuId) {
        if !self.flags.begin_load(sku) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.load(sku).await {
                tracing::warn!(%sku, error = %e, "could not load accepted keys for the sold-out flag");
            }
        });
    }

    /// Sets the flag from the keys loaded before when the copy's `(epoch, count)` is the
    /// same (a sold-out sale accepts nothing new), else from a fresh load.
    async fn load(&self, sku: SkuId) -> Result<(), LedgerError> {
        let loaded_at = Instant::now();
        let Some(version) = self.ledger.accepted_count(sku).await? else {
            return Ok(());
        };
        if let Some(keys) = self.flags.loaded(sku, version) {
            self.flags.set(sku, keys, version, loaded_at);
            return Ok(());
        }
        if let Some(keys) = self.ledger.accepted_keys(sku, self.keys_max).await? {
            let keys: AcceptedKeys = keys.into_iter().collect();
            // Keys read after the count: a count that moved meanwhile only costs a reload.
            self.flags.set(sku, Arc::new(keys), version, loaded_at);
        }
        Ok(())
    }
}

fn same_error(e: &LedgerError, message: &str) -> LedgerError {
    match e {
        LedgerError::Unavailable(_) | LedgerError::Unconfirmed { .. } => {
            LedgerError::Unavailable(message.to_owned())
        }
        LedgerError::Busy => LedgerError::Busy,
        LedgerError::NotWarmed => LedgerError::NotWarmed,
        LedgerError::AlreadyWarm => LedgerError::AlreadyWarm,
        LedgerError::Internal(_) => LedgerError::Internal(message.to_owned()),
    }
}
