//! Natural batching: concurrent purchases of one sale are gathered into one ledger call.
//!
//! Each sale has a bounded queue and one task. The task takes whatever is queued (at most
//! `batch_max`) as soon as the previous call returns, so at low load a request goes alone with
//! no timer wait, and under a spike the batches grow by themselves. A full queue answers BUSY.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flashsale_core::{HotLedger, LedgerError, PurchaseOutcome, PurchaseRequest, SkuId};
use tokio::sync::{mpsc, oneshot};

type Reply = oneshot::Sender<Result<PurchaseOutcome, LedgerError>>;

struct Job {
    req: PurchaseRequest,
    reply: Reply,
}

pub struct Batcher {
    ledger: Arc<dyn HotLedger>,
    queues: Mutex<HashMap<SkuId, mpsc::Sender<Job>>>,
    batch_max: usize,
    queue_cap: usize,
}

impl Batcher {
    pub fn new(ledger: Arc<dyn HotLedger>, batch_max: usize, queue_cap: usize) -> Batcher {
        assert!((1..=flashsale_core::limits::BATCH_LEN_MAX).contains(&batch_max));
        assert!(queue_cap >= batch_max);
        Batcher {
            ledger,
            queues: Mutex::new(HashMap::new()),
            batch_max,
            queue_cap,
        }
    }

    /// Queues one purchase and waits for its outcome.
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
                tokio::spawn(run(self.ledger.clone(), sku, rx, self.batch_max));
                tx
            })
            .clone()
    }
}

async fn run(
    ledger: Arc<dyn HotLedger>,
    sku: SkuId,
    mut rx: mpsc::Receiver<Job>,
    batch_max: usize,
) {
    let mut jobs = Vec::with_capacity(batch_max);
    while rx.recv_many(&mut jobs, batch_max).await > 0 {
        metrics::histogram!(crate::metrics::BATCH_SIZE, "ledger" => ledger.kind())
            .record(jobs.len() as f64);
        let reqs: Vec<PurchaseRequest> = jobs.iter().map(|j| j.req.clone()).collect();
        match ledger.purchase_batch(sku, &reqs).await {
            Ok(outcomes) => {
                assert_eq!(outcomes.len(), jobs.len(), "one outcome per request");
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

fn same_error(e: &LedgerError, message: &str) -> LedgerError {
    match e {
        LedgerError::Unavailable(_) => LedgerError::Unavailable(message.to_owned()),
        LedgerError::Busy => LedgerError::Busy,
        LedgerError::NotWarmed => LedgerError::NotWarmed,
        LedgerError::AlreadyWarm => LedgerError::AlreadyWarm,
        LedgerError::Internal(_) => LedgerError::Internal(message.to_owned()),
    }
}
