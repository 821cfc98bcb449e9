//! The purchase hot path of one instance: a local sold-out flag per sale, then natural
//! batching of what gets past it into one ledger call. The HTTP route and `flashsale bench
//! strategies` both go through it, so the bench measures what production runs.
//!
//! - Sold-out flag: once the ledger answers SOLD_OUT, the batch task loads the sale's accepted
//!   request keys in the background and sets the flag ([`SoldOutFlags`]); from then on
//!   [`Batcher::sold_out_here`] answers new requests without the ledger (90% of a spike's
//!   requests), while retries of accepted requests still reach it for their first outcome.
//!   Restocks and a short TTL clear the flag.
//! - Batching: each sale has a bounded queue and one task. The task takes whatever is queued
//!   (at most `batch_max`) as soon as the previous call returns, so at low load a request goes
//!   alone with no timer wait, and under a spike the batches grow by themselves. A full queue
//!   answers BUSY.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use flashsale_core::{ErrorCode, HotLedger, LedgerError, PurchaseOutcome, PurchaseRequest, SkuId};
use tokio::sync::{mpsc, oneshot};

use crate::cache::{request_key, SoldOutFlags};
use crate::state::Limits;

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

pub struct Batcher {
    queues: Mutex<HashMap<SkuId, mpsc::Sender<Job>>>,
    batch_max: usize,
    queue_cap: usize,
    flagger: Arc<Flagger>,
}

/// Sets a sale's sold-out flag after a SOLD_OUT answer of the ledger.
struct Flagger {
    ledger: Arc<dyn HotLedger>,
    flags: Arc<SoldOutFlags>,
    /// A flag remembers at most this many accepted request keys (else it is not set).
    keys_max: usize,
}

impl Batcher {
    /// With its own sold-out flags, lifetime and key bound as the server's default [`Limits`].
    pub fn new(ledger: Arc<dyn HotLedger>, batch_max: usize, queue_cap: usize) -> Batcher {
        let limits = Limits::default();
        let flags = Arc::new(SoldOutFlags::new(limits.cache_ttl));
        Batcher::with_flags(
            ledger,
            batch_max,
            queue_cap,
            flags,
            limits.accepted_keys_max,
        )
    }

    /// With `flags` shared with whoever clears them (restock notices, state changes).
    pub fn with_flags(
        ledger: Arc<dyn HotLedger>,
        batch_max: usize,
        queue_cap: usize,
        flags: Arc<SoldOutFlags>,
        keys_max: usize,
    ) -> Batcher {
        assert!((1..=flashsale_core::limits::BATCH_LEN_MAX).contains(&batch_max));
        assert!(queue_cap >= batch_max);
        Batcher {
            queues: Mutex::new(HashMap::new()),
            batch_max,
            queue_cap,
            flagger: Arc::new(Flagger {
                ledger,
                flags,
                keys_max,
            }),
        }
    }

    /// True when `req` can be answered SOLD_OUT here without the ledger: its sale is flagged
    /// and it is not a retry of an accepted request.
    pub fn sold_out_here(&self, req: &PurchaseRequest) -> bool {
        let key = request_key(req.user_id, req.request_id.as_str());
        self.flagger.flags.answers(req.sku_id, &key)
    }

    /// Queues one purchase for the ledger and waits for its outcome.
    pub async fn purchase(&self, req: PurchaseRequest) -> Result<PurchaseOutcome, LedgerError> {
        let (reply, answer) = oneshot::channel();
        let queue = self.queue(req.sku_id);
        queue.try_send(Job { req, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => LedgerError::Busy,
            mpsc::error::TrySendError::Closed(_) => LedgerError::Internal("batch task gone".into()),
        })?;
        answer
            .await
            .map_err(|_| LedgerError::Internal("batch task dropped a request".into()))?
    }

    /// Requests queued for a sale right now (back-pressure, metrics).
    pub fn queue_depth(&self, sku: SkuId) -> usize {
        let queues = self.queues.lock().expect("queues lock");
        queues
            .get(&sku)
            .map(|q| self.queue_cap - q.capacity())
            .unwrap_or(0)
    }

    fn queue(&self, sku: SkuId) -> mpsc::Sender<Job> {
        let mut queues = self.queues.lock().expect("queues lock");
        queues
            .entry(sku)
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel(self.queue_cap);
                let rx = Arc::new(tokio::sync::Mutex::new(rx));
                for _ in 0..IN_FLIGHT {
                    tokio::spawn(run(self.flagger.clone(), sku, rx.clone(), self.batch_max));
                }
                tx
            })
            .clone()
    }
}

/// One of a sale's `IN_FLIGHT` batch tasks: takes what is queued (holding the queue only while
/// taking), calls the ledger, answers, repeats.
async fn run(
    flagger: Arc<Flagger>,
    sku: SkuId,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    batch_max: usize,
) {
    let ledger = flagger.ledger.clone();
    let mut jobs = Vec::with_capacity(batch_max);
    loop {
        // The queue's lock is released at the end of this statement, before the ledger call.
        let taken = rx.lock().await.recv_many(&mut jobs, batch_max).await;
        if taken == 0 {
            return; // every sender is gone
        }
        metrics::histogram!(crate::metrics::BATCH_SIZE, "ledger" => ledger.kind())
            .record(jobs.len() as f64);
        let reqs: Vec<PurchaseRequest> = jobs.iter().map(|j| j.req.clone()).collect();
        match ledger.purchase_batch(sku, &reqs).await {
            Ok(outcomes) => {
                assert_eq!(outcomes.len(), jobs.len(), "one outcome per request");
                if outcomes.iter().any(is_sold_out) {
                    flagger.flag(sku);
                }
                for (job, outcome) in jobs.drain(..).zip(outcomes) {
                    let _ = job.reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                let message = e.to_string();
                for job in jobs.drain(..) {
                    let _ = job.reply.send(Err(same_error(&e, &message)));
                }
            }
        }
    }
}

fn is_sold_out(outcome: &PurchaseOutcome) -> bool {
    matches!(outcome, PurchaseOutcome::Rejected(ErrorCode::SoldOut))
}

impl Flagger {
    /// Loads the accepted request keys in the background and sets the flag; one load at a
    /// time per sale, and none while a fresh flag stands.
    fn flag(self: &Arc<Self>, sku: SkuId) {
        if !self.flags.begin_load(sku) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let loaded_at = Instant::now();
            match this.ledger.accepted_keys(sku, this.keys_max).await {
                Ok(Some(keys)) => {
                    this.flags
                        .set(sku, keys.into_iter().collect::<HashSet<_>>(), loaded_at)
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(%sku, error = %e, "could not load accepted keys for the sold-out flag")
                }
            }
        });
    }
}

fn same_error(e: &LedgerError, message: &str) -> LedgerError {
    match e {
        LedgerError::Unavailable(_) => LedgerError::Unavailable(message.to_owned()),
        LedgerError::Busy => LedgerError::Busy,
        LedgerError::NotWarmed => LedgerError::NotWarmed,
        LedgerError::AlreadyWarm => LedgerError::AlreadyWarm,
        LedgerError::Internal(_) => LedgerError::Internal(message.to_owned()),
    }
}
