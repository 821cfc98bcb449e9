//! The persister: moves each sale's Redis Stream into the system of record.
//!
//! One writer per sale at a time: a per-sale task holds the sale's lease in Redis (renewed
//! every loop; another instance takes over when it lapses), so events apply in `seq` order.
//! Each read is one `OrderStore::apply_events` transaction (multi-row inserts and one
//! conditional counter update that is both contiguity check and oversell guard), then XACK,
//! then XTRIM below what was acknowledged. Effects are exactly once because the store skips
//! events at or below its `applied_seq` and refuses gaps.
//!
//! Recovery: after a restart or any failure the task reads its own pending entries first;
//! a gap means earlier entries are pending with a dead consumer, so it claims entries idle
//! longer than `claim_idle_ms` (XAUTOCLAIM) before it reads its own again. The database down →
//! back off and retry, the entries stay pending. An entry that keeps failing is parked in
//! `dead_letters` and the sale's stream stops (never skipped), also across restarts
//! (`stream_paused`): an operator decides. A pending entry that was trimmed meanwhile was
//! applied (the stream is trimmed only below acknowledged entries, which the store applies
//! in order): it is acknowledged and dropped, not taken for poison.
//!
//! Rolling upgrades: an entry of a format version newer than this binary reads (written by a
//! newer instance's scripts) is not poison. The task applies what comes before it, then stops
//! the sale with an alarm (`flashsale_stream_unknown_format{sku}` = that version, an error
//! line): no ack, no dead letter, no `stream_paused`. It gives the lease up, so a newer
//! instance, which can read the entry, takes the sale over (claiming the entry once it is
//! idle) instead of waiting for this instance to stop; keeping the lease would hold the sale
//! until then. It tries again after a backoff that doubles from the lease TTL up to
//! `format_wait_ms_max`, and goes on by itself once the entry is handled (a rollback hands the
//! sale back) or gone.
//!
//! Files, each using only those listed before it: `config` (where it reads, bounds, errors);
//! `sale` (one copy's task: a step is lease, read, apply, acknowledge); this file (the
//! discovery that starts a task per live copy and reaps those that retired).

mod config;
mod sale;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use flashsale_core::{OrderStore, SaleState, SkuId};
use flashsale_redis::{CopyTag, StreamReader};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

pub use config::{PersistError, PersisterConfig, EVENTS_PER_APPLY_MAX};

use crate::runner::{Pace, Worker, WorkerState};
use sale::SaleWorker;

pub struct Persister {
    config: PersisterConfig,
    store: Arc<dyn OrderStore>,
    /// One task per hot copy being persisted (a sale's own, or each bucket of a bucketed
    /// sale).
    tasks: HashMap<CopyTag, JoinHandle<bool>>,
    /// Copies whose task retired (settled): not started again.
    retired: HashSet<CopyTag>,
    /// Reads where a bucketed sale's buckets live; connected on first need.
    layouts: Option<StreamReader>,
    /// Bucketed sales' copies once read (placement never changes): read once, not at every
    /// discovery.
    placed: HashMap<SkuId, Vec<CopyTag>>,
    /// Tells every sale's task to stop.
    stop: watch::Sender<bool>,
    /// Tells every sale's runner to stop (between steps; `stop` ends its pauses).
    shutdown: broadcast::Sender<()>,
    /// One discovery per `discover_every`.
    pace: Pace,
}

impl Persister {
    pub fn new(config: PersisterConfig, store: Arc<dyn OrderStore>) -> Persister {
        assert!(
            config.bounds.batch_max > 0
                && config.bounds.lease_ttl_ms > config.bounds.block_ms * 2
                && config.bounds.fill_wait_ms <= config.bounds.block_ms
        );
        let pace = Pace::with_missed(config.bounds.discover_every, MissedTickBehavior::Burst);
        Persister {
            config,
            store,
            tasks: HashMap::new(),
            retired: HashSet::new(),
            layouts: None,
            placed: HashMap::new(),
            stop: watch::channel(false).0,
            shutdown: broadcast::channel(1).0,
            pace,
        }
    }

    /// Runs one task per live sale until `shutdown` fires; new sales are picked up as they
    /// are warmed. A sale's task retires once the sale is settled (see
    /// [`SaleWorker::settled`]) and is not started again: an ended sale stops costing a
    /// connection, a blocking read and lease renewals.
    pub async fn run(self, shutdown: broadcast::Receiver<()>) -> Result<(), PersistError> {
        // Its steps do not fail: a failing sale is retried inside its own task.
        let _ = crate::runner::run(Box::new(self), shutdown).await;
        Ok(())
    }

    async fn discover(&mut self) {
        let sales = match self.store.sales().await {
            Ok(sales) => sales,
            Err(e) => {
                return tracing::warn!(error = %e, "persister cannot list sales; keeps running ones")
            }
        };
        for stored in sales
            .iter()
            .filter(|s| s.sale.state != SaleState::Scheduled)
        {
            let copies = self.copies(&stored.sale).await;
            for &copy in &copies {
                // A finished task is reaped first (and started again unless it retired).
                if self.tasks.contains_key(&copy) || self.retired.contains(&copy) {
                    continue;
                }
                let stop = self.stop.subscribe();
                let (config, store) = (self.config.clone(), self.store.clone());
                let worker = SaleWorker::new(config, store, copy, copies.clone(), stop);
                let shutdown = self.shutdown.subscribe();
                self.tasks.insert(copy, tokio::spawn(worker.run(shutdown)));
            }
        }
    }

    /// The hot copies of `sale` whose streams are persisted: its own, or each bucket's (read
    /// from Redis; none while the sale is not warm there, so the next discovery asks again).
    async fn copies(&mut self, sale: &flashsale_core::Sale) -> Vec<CopyTag> {
        let sku = sale.sku_id;
        if sale.buckets <= 1 {
            return vec![sku.into()];
        }
        if let Some(copies) = self.placed.get(&sku) {
            return copies.clone();
        }
        if self.layouts.is_none() {
            let c = &self.config;
            match StreamReader::connect(&c.redis_url, &c.prefix, &c.consumer).await {
                Ok(reader) => self.layouts = Some(reader),
                Err(e) => tracing::warn!(error = %e, "persister cannot reach Redis for layouts"),
            }
        }
        let Some(reader) = &self.layouts else {
            return Vec::new();
        };
        match reader.layout(sku).await {
            Ok(Some(layout)) if layout.n() == sale.buckets => {
                self.placed.insert(sku, layout.copies());
                layout.copies()
            }
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::warn!(%sku, error = %e, "persister cannot read the sale's buckets");
                Vec::new()
            }
        }
    }
}

#[async_trait::async_trait]
impl Worker for Persister {
    fn name(&self) -> &'static str {
        "persister"
    }

    /// Reaps the sales' finished tasks and starts one for each new sale.
    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        reap(&mut self.tasks, &mut self.retired).await;
        self.discover().await;
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        self.pace.tick().await;
        WorkerState::Busy
    }

    /// Stops every sale's task after its current batch, and joins them.
    async fn stop(&mut self) {
        let _ = self.shutdown.send(());
        let _ = self.stop.send(true);
        for (_, task) in self.tasks.drain() {
            let _ = task.await;
        }
    }
}

/// Takes the finished tasks out of `tasks`; those that retired their sale go to `retired`.
async fn reap(tasks: &mut HashMap<CopyTag, JoinHandle<bool>>, retired: &mut HashSet<CopyTag>) {
    let done: Vec<CopyTag> = tasks
        .iter()
        .filter(|(_, t)| t.is_finished())
        .map(|(copy, _)| *copy)
        .collect();
    for copy in done {
        if let Some(task) = tasks.remove(&copy) {
            if task.await.unwrap_or(false) {
                retired.insert(copy);
            }
        }
    }
}
