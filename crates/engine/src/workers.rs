//! Background workers behind one trait, stopped together by a broadcast and joined at
//! shutdown: hold expiry, the persister and the restock subscriptions (here); the gateway's
//! tickers (`gateway::worker`) and the reconciler (`reconcile::worker`) live beside their code.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_core::{Ledger, LedgerError, OrderStore, SaleMode, SaleState};
use tokio::sync::broadcast;

/// A long-running task of the service.
#[async_trait]
pub trait Worker: Send + 'static {
    fn name(&self) -> &'static str;

    /// Runs until `shutdown` fires (or the sender is dropped).
    async fn run(self: Box<Self>, shutdown: broadcast::Receiver<()>) -> anyhow::Result<()>;
}

/// Whether a sale is settled (ended, no hold left, all applied): nothing to expire.
pub type Settled = Arc<dyn Fn(flashsale_core::SkuId) -> bool + Send + Sync>;

/// Expires due holds of every live reserve-mode sale, in bounded batches; a sale the
/// reconciler found settled is skipped.
pub struct ExpiryWorker {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub settled: Settled,
    pub interval: Duration,
    /// Holds expired per ledger call.
    pub batch_max: usize,
}

#[async_trait]
impl Worker for ExpiryWorker {
    fn name(&self) -> &'static str {
        "expiry"
    }

    async fn run(self: Box<Self>, mut shutdown: broadcast::Receiver<()>) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.recv() => return Ok(()),
                _ = tick.tick() => {
                    if let Err(e) = self.expire_all().await {
                        tracing::warn!(error = %e, "hold expiry pass failed; will retry");
                    }
                }
            }
        }
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
            if let Err(e) = self.expire_sale(sku).await {
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

/// Moves every warm sale's Redis Stream into the system of record.
pub struct PersisterWorker {
    persister: crate::persister::Persister,
}

impl PersisterWorker {
    pub fn new(
        redis_url: &str,
        prefix: &str,
        consumer: &str,
        store: Arc<dyn OrderStore>,
    ) -> PersisterWorker {
        let config = crate::persister::PersisterConfig::new(redis_url, prefix, consumer);
        PersisterWorker {
            persister: crate::persister::Persister::new(config, store),
        }
    }
}

#[async_trait]
impl Worker for PersisterWorker {
    fn name(&self) -> &'static str {
        "persister"
    }

    async fn run(self: Box<Self>, shutdown: broadcast::Receiver<()>) -> anyhow::Result<()> {
        self.persister.run(shutdown).await?;
        Ok(())
    }
}

/// Hears the restocks of other instances (one of the ledger's
/// [`flashsale_core::SoldOutSupport::restock_feeds`]) until shutdown.
pub struct RestockWorker {
    feed: flashsale_core::ledger::RestockFeed,
}

impl RestockWorker {
    pub fn new(feed: flashsale_core::ledger::RestockFeed) -> RestockWorker {
        RestockWorker { feed }
    }
}

#[async_trait]
impl Worker for RestockWorker {
    fn name(&self) -> &'static str {
        "restock"
    }

    async fn run(self: Box<Self>, mut shutdown: broadcast::Receiver<()>) -> anyhow::Result<()> {
        tokio::select! {
            _ = shutdown.recv() => {}
            () = self.feed => {}
        }
        Ok(())
    }
}
