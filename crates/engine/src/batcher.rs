//! The purchase hot path of one instance: a local sold-out flag per sale, then natural
//! batching of what gets past it into one ledger call. The HTTP route and `flashsale bench
//! strategies` both go through it, so the bench measures what production runs.
//!
//! - Sold-out flag: once the ledger answers SOLD_OUT to a request for one unit (so nothing is
//!   left: SOLD_OUT for two units with one left says nothing about the next buyer of one), the
//!   batch task loads the sale's accepted request keys in the background (only when the copy's
//!   `(epoch, count)` changed since the last load) and sets the flag ([`SoldOutFlags`]); from then on
//!   [`Batcher::sold_out_here`] answers new requests without the ledger (90% of a spike's
//!   requests), while retries of accepted requests still reach it for their first outcome.
//!   Restocks and a short TTL clear the flag.
//! - Batching: each sale has a bounded queue and `IN_FLIGHT` tasks per lane. The tasks take
//!   whatever is queued (at most `batch_max`) as soon as the previous call returns, so at low
//!   load a request goes alone with no timer wait, and under a spike the batches grow by
//!   themselves. A full queue answers BUSY. A sale has one lane, or with buckets kept apart
//!   by the ledger one per home bucket, so that each batch goes whole to one bucket's copy
//!   (the ledger would otherwise split it into a smaller script call per bucket).
//! - Loss journal: every accepted purchase (new or a replay, answered 202 or written but not
//!   confirmed by the replicas and answered 503) is written into the reconciler's
//!   [`Journal`] here, where every outcome is seen: whatever this instance may have promised,
//!   a later loss of it is reported.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use flashsale_core::{ErrorCode, Ledger, LedgerError, PurchaseOutcome, PurchaseRequest, SkuId};
use tokio::sync::{mpsc, oneshot};

use crate::cache::SoldOutFlags;
use crate::reconcile::Journal;

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
            let keys: HashSet<_> = keys.into_iter().collect();
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
