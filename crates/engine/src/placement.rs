//! Where each sale's hot copy lives: on the configured Redis, or, for the named hot sales, on
//! a dedicated Redis of the same ledger (`RedisLedger::with_hot_sales`).

use flashsale_redis::RedisLedger;

/// The sales whose hot copy lives on a dedicated Redis, and that Redis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HotSales {
    /// The dedicated Redis (`None`: every sale on the configured ledger).
    pub redis_url: Option<String>,
    pub skus: Vec<u64>,
}

impl HotSales {
    /// `ledger`, keeping the hot sales on their Redis when both are set. That Redis takes
    /// the ledger's prefix, buckets and replication: a sale's durability must not depend
    /// on where it lives.
    pub fn place(&self, ledger: RedisLedger) -> RedisLedger {
        match &self.redis_url {
            Some(hot_url) if !self.skus.is_empty() => {
                tracing::info!(skus = ?self.skus, "hot sales routed to a dedicated Redis");
                ledger.with_hot_sales(hot_url, self.skus.iter().copied())
            }
            _ => ledger,
        }
    }

    /// Refuses a hot-sale Redis without the Redis ledger (the embedded one lives in one
    /// process).
    pub fn check_embedded(&self) -> anyhow::Result<()> {
        match self.redis_url {
            Some(_) => {
                anyhow::bail!("a hot-sale Redis needs the Redis ledger (FLASHSALE_REDIS_URL)")
            }
            None => Ok(()),
        }
    }
}
