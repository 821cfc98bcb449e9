//! The shop as a process runs it: its background workers (the same for `serve` and
//! `worker`), its readiness, and what back-pressure reads and changes.

use std::time::Duration;

use flashsale_core::{Durability, SaleState, SkuId};

use super::{Shop, ShopError};
use crate::admission::walker::DrawWalker;
use crate::reconcile::ReconcileWorker;
use crate::runner::Worker;
use crate::settings::Settings;
use crate::workers::RestockWorker;

/// How long readiness waits for each backend.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether each backend answers, and the ledger's kind.
#[derive(Debug, Clone, Copy)]
pub struct Readiness {
    pub ledger: bool,
    pub store: bool,
    pub ledger_kind: &'static str,
}

impl Shop {
    /// The workers over this shop that `settings` asks for: the draw walker (with
    /// admission), hold expiry, the order-event relays, the persisters when they run here,
    /// and the reconcile worker (which settles sales in this shop's loss journal, and
    /// rebuilds at once the sales purchases nudge).
    pub fn workers(&self, settings: &Settings) -> Vec<Box<dyn Worker>> {
        let (ledger, store) = (self.ledger.clone(), self.store.clone());
        let mut workers: Vec<Box<dyn Worker>> = Vec::new();
        if let Some(admission) = &self.admission {
            let every = settings.admission.walk_every;
            let (a, l, s) = (admission.clone(), ledger.clone(), store.clone());
            workers.push(Box::new(DrawWalker::new(a, l, s, every)));
        }
        let journal = self.journal.clone();
        workers.extend(crate::backends::workers(settings, ledger, store, journal));
        let nudges = self.nudges.take();
        if let Some(w) = ReconcileWorker::boxed(self.reconciler(), settings.reconcile, nudges) {
            workers.push(w);
        }
        workers
    }

    /// The tasks that hear other instances' restocks (they clear this shop's sold-out
    /// flags): a process that answers purchases runs them.
    pub fn restock_workers(&self) -> Vec<Box<dyn Worker>> {
        let feeds = self.ledger.restock_feeds().into_iter();
        feeds
            .map(|feed| Box::new(RestockWorker::new(feed)) as Box<dyn Worker>)
            .collect()
    }

    /// Whether the hot ledger and the database answer, each within a second.
    pub async fn readiness(&self) -> Readiness {
        let ledger = tokio::time::timeout(PING_TIMEOUT, self.ledger.ping()).await;
        let store = tokio::time::timeout(PING_TIMEOUT, self.store.ping()).await;
        Readiness {
            ledger: matches!(ledger, Ok(Ok(()))),
            store: matches!(store, Ok(Ok(()))),
            ledger_kind: self.ledger.kind(),
        }
    }

    /// Purchases of a sale waiting for the ledger here, over its lanes.
    pub fn queue_depth(&self, sku: SkuId) -> usize {
        self.batcher.queue_depth(sku)
    }

    /// Whether accepted purchases reach the database through a stream (so it can lag).
    pub fn streams(&self) -> bool {
        self.ledger.durability() == Durability::Streamed
    }

    /// Hot `seq` minus the database's `applied_seq`: events accepted but not yet persisted
    /// (`None` when either does not answer).
    pub async fn stream_lag(&self, sku: SkuId) -> Option<u64> {
        let hot = self.ledger.counters(sku).await.ok()??;
        let stored = self.store.sale(sku).await.ok()??;
        Some(hot.seq.saturating_sub(stored.counters.seq))
    }

    /// Sets the hot copy's state to `to` only when it is `from` (back-pressure's pause must
    /// never reopen a sale an operator paused or ended meanwhile). True when it did.
    pub async fn set_hot_state_if(
        &self,
        sku: SkuId,
        from: SaleState,
        to: SaleState,
    ) -> Result<bool, ShopError> {
        let changed = self.ledger.set_state_if(sku, from, to).await?;
        self.sales.forget(sku);
        Ok(changed)
    }

    /// The operator's state of the sale in the database (`None` when it does not answer).
    pub async fn stored_state(&self, sku: SkuId) -> Option<SaleState> {
        let stored = self.store.sale(sku).await.ok()??;
        Some(stored.sale.state)
    }
}
