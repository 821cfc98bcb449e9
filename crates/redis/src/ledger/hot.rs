//! `HotLedger` on Redis: each call goes to the sale's one copy, or to its buckets (the
//! purchase is `purchase`).

use async_trait::async_trait;
use flashsale_core::ledger::Changed;
use flashsale_core::{
    Counters, Durability, HotBuckets, HotLedger, HotOrder, LedgerError, OrderNo, Resolution,
    SaleState, SkuId, UserId,
};

use super::setup::RedisLedger;
use crate::codec::decode_order;
use crate::conn::{bounded, Timeouts};

#[async_trait]
impl HotLedger for RedisLedger {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn durability(&self) -> Durability {
        Durability::Streamed
    }

    /// One by default: every key of a sale carries one hash tag, so its stock lives on one
    /// shard. [`BUCKETS_MAX`](flashsale_core::buckets::BUCKETS_MAX) with
    /// [`RedisLedger::with_buckets`].
    fn buckets_max(&self) -> u16 {
        match self.buckets {
            Some(_) => flashsale_core::buckets::BUCKETS_MAX,
            None => 1,
        }
    }

    /// Every bucket in turn (bucket 0 first): a purchase racing the change may be judged by a
    /// bucket changed and another not yet, as it may be on one copy just before or after.
    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), LedgerError> {
        for copy in self.layout(sku).await?.copies() {
            let mut inv = self.scripts.set_state.prepare_invoke();
            inv.key(self.keys.sale(copy)).arg(state.as_str());
            self.state_answer(&inv).await?;
        }
        Ok(())
    }

    /// Every bucket that is in `from`, bucket 0 last; answered by bucket 0. A call that
    /// fails midway leaves bucket 0 in `from`, so its retry changes the rest.
    async fn set_state_if(&self, sku: SkuId, from: SaleState, to: SaleState) -> Changed {
        let mut changed = false;
        for copy in self.layout(sku).await?.copies().into_iter().rev() {
            let mut inv = self.scripts.set_state.prepare_invoke();
            inv.key(self.keys.sale(copy))
                .arg(to.as_str())
                .arg(from.as_str());
            changed = self.state_answer(&inv).await?;
        }
        Ok(changed)
    }

    async fn pay(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.resolve("pay", "paid", order_no, user).await
    }

    async fn cancel(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.resolve("cancel", "cancelled", order_no, user).await
    }

    async fn expire_due(&self, sku: SkuId, max: usize) -> Result<usize, LedgerError> {
        if max == 0 {
            return Ok(0);
        }
        let layout = self.layout(sku).await?;
        if !layout.is_single() {
            // The worker that expires holds also finishes transfers left in flight; one it
            // cannot finish now must not stop the holds from expiring.
            if let Err(e) = self.finish_transfers(sku).await {
                tracing::warn!(%sku, error = %e, "could not finish transfers in flight");
            }
        }
        let mut expired = 0;
        let mut restocked = false;
        let (mut failed, mut failures) = (None, 0u64);
        let mut answered = false;
        for copy in layout.copies() {
            // A bucket missing, fenced or down keeps only its own holds: the others' still
            // expire. The call fails only when no bucket answered (its caller counts that).
            let (n, back) = match self.expire_copy(copy, max - expired).await {
                Ok(done) => done,
                Err(e) if layout.is_single() => return Err(e),
                Err(e) => {
                    tracing::warn!(%sku, bucket = copy.bucket, error = %e, "hold expiry of one bucket failed; the others go on");
                    failures += 1;
                    failed.get_or_insert(e);
                    continue;
                }
            };
            answered = true;
            expired += n;
            restocked |= back;
            if expired >= max {
                break;
            }
        }
        if restocked {
            self.announce_restock(sku).await;
        }
        match failed {
            Some(e) if !answered => Err(e),
            _ => {
                if failures > 0 {
                    metrics::counter!(flashsale_core::metric_names::EXPIRY_FAILURES, "sku" => sku.to_string())
                        .increment(failures);
                }
                Ok(expired)
            }
        }
    }

    async fn counters(&self, sku: SkuId) -> Result<Option<Counters>, LedgerError> {
        let layout = self.layout(sku).await?;
        let mut sum: Option<Counters> = None;
        for copy in layout.copies() {
            let Some(c) = self.counters_copy(copy).await? else {
                return Ok(None);
            };
            sum = Some(sum.unwrap_or_default().plus(&c));
        }
        Ok(sum)
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, LedgerError> {
        let copy = self.layout(order_no.sku()).await?.copy_of_order(order_no);
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("HGET")
            .arg(self.keys.orders(copy))
            .arg(order_no.to_string())
            .clone();
        let v: Option<String> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        v.map(|encoded| decode_order(&order_no.to_string(), &encoded))
            .transpose()
            .map_err(LedgerError::Internal)
    }

    fn keeps_buckets(&self, _sku: SkuId) -> bool {
        self.buckets.is_some()
    }

    async fn hot_buckets(&self, sku: SkuId) -> Result<Option<HotBuckets>, LedgerError> {
        if self.layout(sku).await?.is_single() {
            return Ok(None);
        }
        Ok(self.bucket_view(sku).await?.map(|view| HotBuckets {
            buckets: view
                .buckets
                .iter()
                .map(|b| (b.bucket, b.counters))
                .collect(),
            in_flight_units: view.in_flight_units,
        }))
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.ready().await
    }
}
