//! Where each sale's hot copy lives: the configured ledger, or a `flashsale_redis::RoutedLedger`
//! that sends the named hot sales to a dedicated Redis.

use std::sync::Arc;

use flashsale_core::Ledger;
use flashsale_redis::RoutedLedger;

/// The sales whose hot copy lives on a dedicated Redis, and that Redis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HotSales {
    /// The dedicated Redis (`None`: every sale on the configured ledger).
    pub redis_url: Option<String>,
    pub skus: Vec<u64>,
}

/// The configured ledger, wrapped to send `hot_skus` to `hot_redis_url` when both are set
/// (Redis ledger only: `redis_url` is the main ledger's). The hot-sale Redis waits for
/// `replication` as the main one does (a sale's durability must not depend on where it
/// lives), and loads copies in the main one's layout (`records`).
pub fn hot_routed(
    g: &HotSales,
    redis_url: Option<&str>,
    redis_prefix: &str,
    (replication, records): (Option<flashsale_redis::Replication>, bool),
    ledger: Arc<dyn Ledger>,
) -> anyhow::Result<Arc<dyn Ledger>> {
    match (&g.redis_url, redis_url) {
        (Some(hot_url), Some(_)) if !g.skus.is_empty() => {
            let mut hot = flashsale_redis::RedisLedger::connect_lazy(hot_url, redis_prefix)
                .map_err(|e| anyhow::anyhow!("the hot-sale Redis: {e}"))?
                .with_buckets();
            if records {
                hot = hot.with_records();
            }
            if let Some(replication) = replication {
                hot = hot
                    .with_replication(replication)
                    .map_err(|e| anyhow::anyhow!("the hot-sale Redis: {e}"))?;
            }
            tracing::info!(skus = ?g.skus, "hot sales routed to a dedicated Redis");
            Ok(Arc::new(RoutedLedger::new(
                ledger,
                Arc::new(hot),
                g.skus.iter().copied(),
            )))
        }
        (Some(_), None) => {
            anyhow::bail!("a hot-sale Redis needs the Redis ledger (FLASHSALE_REDIS_URL)")
        }
        _ => Ok(ledger),
    }
}
