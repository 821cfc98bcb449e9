//! `SoldOutSupport` on Redis: the accepted requests a sold-out flag keeps, and restocks.

use async_trait::async_trait;
use flashsale_core::ledger::{RestockFeed, RestockListener};
use flashsale_core::{LedgerError, RequestKey, SkuId, SoldOutSupport};

use super::layout::epochs_version;
use super::setup::RedisLedger;
use crate::conn::{bounded, Timeouts};
use crate::keys::CopyTag;
use crate::restock::RestockHub;

#[async_trait]
impl SoldOutSupport for RedisLedger {
    async fn accepted_keys(
        &self,
        sku: SkuId,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError> {
        let mut all = Vec::new();
        for copy in self.layout(sku).await?.copies() {
            let Some(keys) = self.accepted_keys_copy(copy, max - all.len()).await? else {
                return Ok(None);
            };
            all.extend(keys);
        }
        Ok(Some(all))
    }

    async fn is_accepted(&self, sku: SkuId, key: &RequestKey) -> Result<bool, LedgerError> {
        let copy = self.layout(sku).await?.home(key.user);
        let mut conn = self.conn(sku);
        let cmd = redis::cmd("HEXISTS")
            .arg(self.keys.requests(copy))
            .arg(key.to_string())
            .clone();
        bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await
    }

    /// The copy's epoch and its accepted requests; for a sale of several buckets, a version
    /// of every bucket's epoch and the accepted requests of all. Every bucket's epoch is in
    /// it, not bucket 0's only: a rebuild of another bucket that lost a purchase, then one
    /// new purchase, leaves the count as it was, and keys read before would miss the new one.
    async fn accepted_count(&self, sku: SkuId) -> Result<Option<(u64, usize)>, LedgerError> {
        let layout = self.layout(sku).await?;
        let mut epochs = Vec::with_capacity(usize::from(layout.n()));
        let mut count = 0;
        for copy in layout.copies() {
            let Some((epoch, len)) = self.accepted_count_copy(copy).await? else {
                return Ok(None);
            };
            epochs.push(epoch);
            count += len;
        }
        let version = match epochs[..] {
            [epoch] => epoch,
            _ => epochs_version(&epochs),
        };
        Ok(Some((version, count)))
    }

    /// Every Redis this ledger's sales live on tells the one listener.
    fn on_restock(&self, listener: RestockListener) {
        for server in self.servers() {
            server.restock.set_listener(listener.clone());
        }
    }

    /// A subscription per Redis this ledger's sales live on.
    fn restock_feeds(&self) -> Vec<RestockFeed> {
        (self.servers())
            .map(|server| RestockHub::feed(&server.restock))
            .collect()
    }
}

impl RedisLedger {
    /// The accepted request keys of one copy, `None` when more than `max` or not warm.
    async fn accepted_keys_copy(
        &self,
        copy: CopyTag,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError> {
        let sku = copy.sku;
        let mut conn = self.conn(sku);
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS")
            .arg(self.keys.sale(copy))
            .cmd("HLEN")
            .arg(self.keys.requests(copy));
        let (warm, len): (bool, usize) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        if !warm || len > max {
            return Ok(None);
        }
        let cmd = redis::cmd("HKEYS").arg(self.keys.requests(copy)).clone();
        let keys: Vec<String> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        if keys.len() > max {
            return Ok(None);
        }
        let parse = |k: &String| {
            RequestKey::parse(k)
                .ok_or_else(|| LedgerError::Internal(format!("sale {sku}: bad request key {k:?}")))
        };
        keys.iter().map(parse).collect::<Result<_, _>>().map(Some)
    }

    async fn accepted_count_copy(
        &self,
        copy: CopyTag,
    ) -> Result<Option<(u64, usize)>, LedgerError> {
        let mut conn = self.conn(copy.sku);
        let mut pipe = redis::pipe();
        pipe.cmd("HGET")
            .arg(self.keys.sale(copy))
            .arg("epoch")
            .cmd("HLEN")
            .arg(self.keys.requests(copy));
        let (epoch, len): (Option<u64>, usize) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        Ok(epoch.map(|e| (e, len)))
    }
}
