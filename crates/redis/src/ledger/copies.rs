//! `HotCopies` on Redis: loading, fencing, opening and reading a sale's copies, or one
//! bucket's, for the reconciler's rebuild.

use async_trait::async_trait;
use flashsale_core::buckets;
use flashsale_core::ledger::HotSnapshot;
use flashsale_core::{
    BucketLoad, CopyAt, Counters, HotCopies, HotLedger, HotOrder, LedgerError, Sale, SaleState,
    SkuId,
};

use super::layout::Layout;
use super::setup::RedisLedger;
use crate::keys::CopyTag;

#[async_trait]
impl HotCopies for RedisLedger {
    async fn load(&self, sale: &Sale, counters: &Counters, epoch: u64) -> Result<(), LedgerError> {
        sale.validate().map_err(LedgerError::Internal)?;
        self.check_buckets(sale).map_err(LedgerError::Internal)?;
        if !counters.conserved() || counters.total != sale.total_stock {
            return Err(LedgerError::Internal(format!(
                "counters do not fit the sale: {counters:?}"
            )));
        }
        if sale.buckets > 1 {
            return self.load_bucketed(sale, counters, epoch).await;
        }
        self.load_copy(sale.sku_id.into(), sale, counters, epoch, None)
            .await
    }

    async fn fence(&self, sku: SkuId) -> Result<bool, LedgerError> {
        let mut present = false;
        for copy in self.layout(sku).await?.copies() {
            let mut inv = self.scripts.fence.prepare_invoke();
            inv.key(self.keys.sale(copy));
            present |= self.run::<i64>("fence", copy, &inv).await? == 1;
        }
        Ok(present)
    }

    async fn open(&self, sku: SkuId, epoch: u64, state: SaleState) -> Result<(), LedgerError> {
        let layout = self.layout(sku).await?;
        for copy in layout.copies() {
            let mut inv = self.scripts.open.prepare_invoke();
            inv.key(self.keys.sale(copy))
                .arg(layout.epoch_of(copy.bucket, epoch))
                .arg(state.as_str());
            if self.run::<String>("open", copy, &inv).await? != "OK" {
                return Err(LedgerError::AlreadyWarm);
            }
        }
        Ok(())
    }

    async fn bucket_salts(&self, sku: SkuId) -> Result<Option<Vec<u32>>, LedgerError> {
        let layout = self.layout(sku).await?;
        Ok((!layout.is_single()).then(|| layout.copies().iter().map(|c| c.salt).collect()))
    }

    async fn place_buckets(&self, sale: &Sale) -> Result<Option<Vec<u32>>, LedgerError> {
        if !self.kept_in_buckets(sale) {
            return Ok(None);
        }
        Ok(Some(self.place(sale.sku_id, sale.buckets).await?))
    }

    fn adopt_salts(&self, sku: SkuId, salts: &[u32]) {
        if let Some(table) = &self.buckets {
            if table.known(sku).is_none() && salts.len() > 1 && salts[0] == 0 {
                table.keep(&Layout::many(sku, salts.to_vec()));
            }
        }
    }

    async fn fence_bucket(&self, sku: SkuId, bucket: u16) -> Result<bool, LedgerError> {
        let (_, copy) = self.bucket_copy(sku, bucket).await?;
        let mut inv = self.scripts.fence.prepare_invoke();
        inv.key(self.keys.sale(copy));
        Ok(self.run::<i64>("fence", copy, &inv).await? == 1)
    }

    async fn load_bucket(&self, load: BucketLoad<'_>) -> Result<(), LedgerError> {
        let (layout, copy) = self.bucket_copy(load.sale.sku_id, load.bucket).await?;
        let text = layout.salts_text();
        let buckets = Some((layout.n(), text.as_str()));
        (self.load_copy(copy, load.sale, load.counters, load.epoch, buckets)).await?;
        self.restore_transfers(copy, load.transfers).await
    }

    async fn open_bucket(&self, load: BucketLoad<'_>, state: SaleState) -> Result<(), LedgerError> {
        let (_, copy) = self.bucket_copy(load.sale.sku_id, load.bucket).await?;
        let mut inv = self.scripts.open.prepare_invoke();
        inv.key(self.keys.sale(copy))
            .arg(load.epoch)
            .arg(state.as_str());
        match self.run::<String>("open", copy, &inv).await?.as_str() {
            "OK" => Ok(()),
            _ => Err(LedgerError::AlreadyWarm),
        }
    }

    async fn hot_snapshot(&self, sku: SkuId) -> Result<Option<HotSnapshot>, LedgerError> {
        self.layout(sku).await?.single_only("a snapshot")?;
        self.copy_snapshot(sku.into()).await
    }

    async fn bucket_snapshot(
        &self,
        sku: SkuId,
        bucket: u16,
    ) -> Result<Option<HotSnapshot>, LedgerError> {
        match self.layout(sku).await?.bucket(bucket) {
            Some(copy) => self.copy_snapshot(copy).await,
            None => Ok(None),
        }
    }

    async fn restore_orders(&self, at: CopyAt, orders: &[HotOrder]) -> Result<usize, LedgerError> {
        self.restore_copy_orders(at, orders).await
    }
}

impl RedisLedger {
    /// Bucket `bucket` of a sale of several, with the sale's layout.
    async fn bucket_copy(&self, sku: SkuId, bucket: u16) -> Result<(Layout, CopyTag), LedgerError> {
        let layout = self.layout(sku).await?;
        let copy = layout.bucket(bucket).ok_or_else(|| {
            LedgerError::Internal(format!("sale {sku} has no bucket {bucket} in Redis"))
        })?;
        Ok((layout, copy))
    }

    /// Loads a fresh sale of several buckets: its stock split evenly
    /// (`buckets::split_stock`), each bucket on the primary `placement::place` picks, bucket 0
    /// last (its hash names the others). A sale that has sold is rebuilt bucket by bucket
    /// from its per-bucket rows in the database, which are not kept yet: refused.
    pub(crate) async fn load_bucketed(
        &self,
        sale: &Sale,
        counters: &Counters,
        epoch: u64,
    ) -> Result<(), LedgerError> {
        let sku = sale.sku_id;
        if *counters != sale.fresh_counters() {
            return Err(LedgerError::Internal(format!(
                "sale {sku} of {} buckets has sold: a bucketed copy is loaded fresh only",
                sale.buckets
            )));
        }
        let salts = match self.layout(sku).await? {
            known if known.n() == sale.buckets => {
                (0..sale.buckets).map(|b| known.copy(b).salt).collect()
            }
            _ => self.place(sku, sale.buckets).await?,
        };
        let layout = Layout::many(sku, salts);
        let text = layout.salts_text();
        let shares = buckets::split_stock(sale.total_stock, sale.buckets);
        for bucket in (0..sale.buckets).rev() {
            let units = shares[usize::from(bucket)];
            let share = Counters {
                total: units,
                available: units,
                ..Counters::default()
            };
            let epoch = layout.epoch_of(bucket, epoch);
            let at = Some((sale.buckets, text.as_str()));
            self.load_copy(layout.copy(bucket), sale, &share, epoch, at)
                .await?;
        }
        if let Some(table) = &self.buckets {
            table.keep(&layout);
        }
        Ok(())
    }
}
