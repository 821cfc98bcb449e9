//! `SoldOutSupport` on Redis: the accepted requests a sold-out flag keeps, and restocks.

use async_trait::async_trait;
use flashsale_core::ledger::{RestockFeed, RestockListener};
use flashsale_core::{LedgerError, RequestKey, SkuId, SoldOutSupport, UserId};

use super::layout::epochs_version;
use super::setup::RedisLedger;
use crate::codec::parse_record;
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
        // Either layout: the key in layout 1's requests hash, or the request id among the
        // buyer's record's orders in layout 2 (a copy holds one of the two).
        let copy = self.layout(sku).await?.home(key.user);
        let mut conn = self.conn(sku);
        let mut pipe = redis::pipe();
        pipe.cmd("HEXISTS")
            .arg(self.keys.requests(copy))
            .arg(key.to_string())
            .cmd("HGET")
            .arg(self.keys.records(copy))
            .arg(key.user.0);
        let (hashed, record): (bool, Option<String>) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        let in_record = match record {
            Some(r) => parse_record(&r)
                .map_err(LedgerError::Internal)?
                .iter()
                .any(|o| o.request_id == key.request_id),
            None => false,
        };
        Ok(hashed || in_record)
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
    /// The accepted request keys of one copy, `None` when more than `max` or not warm. A
    /// copy holds them in layout 1's requests hash or in layout 2's buyer records.
    async fn accepted_keys_copy(
        &self,
        copy: CopyTag,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError> {
        let Some((_, len)) = self.accepted_count_copy(copy).await? else {
            return Ok(None);
        };
        if len > max {
            return Ok(None);
        }
        let mut conn = self.conn(copy.sku);
        let mut pipe = redis::pipe();
        pipe.cmd("HKEYS")
            .arg(self.keys.requests(copy))
            .cmd("HGETALL")
            .arg(self.keys.records(copy));
        let (hashed, records): (Vec<String>, Vec<(u64, String)>) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        let sku = copy.sku;
        let bad = |what: String| LedgerError::Internal(format!("sale {sku}: {what}"));
        let mut keys = (hashed.iter())
            .map(|k| RequestKey::parse(k).ok_or_else(|| bad(format!("bad request key {k:?}"))))
            .collect::<Result<Vec<_>, _>>()?;
        for (user, record) in &records {
            for order in parse_record(record).map_err(bad)? {
                keys.push(RequestKey {
                    user: UserId(*user),
                    request_id: order.request_id,
                });
            }
        }
        if keys.len() > max {
            return Ok(None);
        }
        Ok(Some(keys))
    }

    /// The copy's epoch and how many requests it accepted: layout 1's requests hash's length,
    /// or layout 2's count in the sale's hash (a copy holds one of the two).
    async fn accepted_count_copy(
        &self,
        copy: CopyTag,
    ) -> Result<Option<(u64, usize)>, LedgerError> {
        let mut conn = self.conn(copy.sku);
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.keys.sale(copy))
            .arg(&["epoch", "accepted"])
            .cmd("HLEN")
            .arg(self.keys.requests(copy));
        let ((epoch, counted), len): ((Option<u64>, Option<usize>), usize) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        Ok(epoch.map(|e| (e, len + counted.unwrap_or(0))))
    }
}
