//! The workers of no other module, each a [`Worker`] stepped by the one runner
//! ([`crate::runner`]): hold expiry, the persister and the restock subscriptions. The
//! reconciler's (`reconcile::worker`) lives beside its code.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_core::{Ledger, LedgerError, OrderStore, SaleMode, SaleState};

use crate::runner::Pace;

pub use crate::runner::{Worker, WorkerState};

/// Whether a sale is settled (ended, no hold left, all applied): nothing to expire.
pub type Settled = Arc<dyn Fn(flashsale_core::SkuId) -> bool + Send + Sync>;

/// Expires due holds of every live reserve-mode sale, in bounded batches; a sale the
/// reconciler found settled is skipped.
pub struct ExpiryWorker {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub settled: Settled,
    /// Holds expired per ledger call.
    pub batch_max: usize,
    /// One pass per interval.
    pub pace: Pace,
}

impl ExpiryWorker {
    pub fn new(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        settled: Settled,
        interval: Duration,
        batch_max: usize,
    ) -> ExpiryWorker {
        ExpiryWorker {
            ledger,
            store,
            settled,
            batch_max,
            pace: Pace::new(interval),
        }
    }
}

#[async_trait]
impl Worker for ExpiryWorker {
    fn name(&self) -> &'static str {
        "expiry"
    }

    /// One pass: every reserve-mode sale.
    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        self.expire_all().await?;
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        self.pace.tick().await;
        WorkerState::Busy
    }
}

/// Ledger calls per sale per expiry pass (a pass is bounded whatever the backlog).
pub const EXPIRY_CALLS_PER_SALE_MAX: usize = 64;

impl ExpiryWorker {
    /// One pass over every reserve-mode sale. A sale that fails (a copy being rebuilt, a
    /// broken hash) is logged and skipped: the holds of every other sale still expire.
    async fn expire_all(&self) -> anyhow::Result<()> {
        let sales = self.store.sales().await?;
        let reserve = sales.iter().filter(|s| {
            s.sale.mode == SaleMode::Reserve
                && s.sale.state != SaleState::Scheduled
                && !(self.settled)(s.sale.sku_id)
        });
        for stored in reserve {
            let sku = stored.sale.sku_id;
            let mut result = self.expire_sale(sku).await;
            if result.is_err() && self.ledger.kept_in_buckets(&stored.sale) {
                // An instance that never read the layout reads it from bucket 0's copy; with
                // that copy gone, the database says where the other buckets are.
                let (ledger, store) = (self.ledger.as_ref(), self.store.as_ref());
                match crate::reconcile::rebuild::adopt_salts(ledger, store, sku).await {
                    Ok(()) => result = self.expire_sale(sku).await,
                    Err(e) => {
                        tracing::warn!(%sku, error = %e, "could not read where the buckets are")
                    }
                }
            }
            if let Err(e) = result {
                metrics::counter!(flashsale_core::metric_names::EXPIRY_FAILURES, "sku" => sku.to_string())
                    .increment(1);
                tracing::warn!(%sku, error = %e, "hold expiry of one sale failed; others go on");
            }
        }
        Ok(())
    }

    async fn expire_sale(&self, sku: flashsale_core::SkuId) -> Result<(), LedgerError> {
        for _ in 0..EXPIRY_CALLS_PER_SALE_MAX {
            let expired = self.ledger.expire_due(sku, self.batch_max).await?;
            if expired < self.batch_max {
                break;
            }
        }
        Ok(())
    }
}

/// Hears the restocks of other instances (one of the ledger's
/// [`flashsale_core::SoldOutSupport::restock_feeds`]) until shutdown.
pub struct RestockWorker {
    feed: Option<flashsale_core::ledger::RestockFeed>,
}

impl RestockWorker {
    pub fn new(feed: flashsale_core::ledger::RestockFeed) -> RestockWorker {
        RestockWorker { feed: Some(feed) }
    }
}

#[async_trait]
impl Worker for RestockWorker {
    fn name(&self) -> &'static str {
        "restock"
    }

    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        Ok(WorkerState::Idle)
    }

    /// The feed runs until its subscription ends.
    async fn wait_for_work(&mut self) -> WorkerState {
        if let Some(feed) = self.feed.as_mut() {
            feed.await;
        }
        self.feed = None;
        WorkerState::Done
    }
}
