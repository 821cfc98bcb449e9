//! Hot-sale isolation across Redis servers: `RoutedLedger` keeps named hot sales on a
//! dedicated Redis and every other sale on the main one. Each sale's keys live wholly on one
//! server (the route is a pure function of the sku, which every order number carries), so
//! scripts stay atomic and every instance routes alike. Both servers' streams are persisted
//! (one persister per server).

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use flashsale_core::ledger::{Changed, HotSnapshot, RestockFeed, RestockListener};
use flashsale_core::{
    BucketTransfers, Counters, HotBuckets, HotCopies, HotLedger, HotOrder, HotPurchases, Ledger,
    LedgerError, OrderNo, PurchaseOutcome, PurchaseRequest, Resolution, Sale, SaleState, SkuId,
    SoldOutSupport, UserId,
};

/// Two hot ledgers behind one: `hot_skus` on `hot`, every other sale on `main`.
pub struct RoutedLedger {
    main: Arc<dyn Ledger>,
    hot: Arc<dyn Ledger>,
    hot_skus: HashSet<u64>,
}

impl RoutedLedger {
    pub fn new(
        main: Arc<dyn Ledger>,
        hot: Arc<dyn Ledger>,
        hot_skus: impl IntoIterator<Item = u64>,
    ) -> RoutedLedger {
        RoutedLedger {
            main,
            hot,
            hot_skus: hot_skus.into_iter().collect(),
        }
    }

    /// The ledger that holds `sku`.
    pub fn route(&self, sku: SkuId) -> &Arc<dyn Ledger> {
        if self.hot_skus.contains(&sku.0) {
            &self.hot
        } else {
            &self.main
        }
    }
}

#[async_trait]
impl HotPurchases for RoutedLedger {
    async fn purchase_batch(
        &self,
        sku: SkuId,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        self.route(sku).purchase_batch(sku, reqs).await
    }

    fn lane(&self, sku: SkuId, user: UserId) -> u16 {
        self.route(sku).lane(sku, user)
    }
}

#[async_trait]
impl HotLedger for RoutedLedger {
    fn kind(&self) -> &'static str {
        self.main.kind()
    }

    fn durability(&self) -> flashsale_core::Durability {
        self.main.durability()
    }

    /// What both ledgers hold: the service asks before it knows where the sale will live.
    fn buckets_max(&self) -> u16 {
        self.main.buckets_max().min(self.hot.buckets_max())
    }

    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), LedgerError> {
        self.route(sku).set_state(sku, state).await
    }

    async fn set_state_if(&self, sku: SkuId, from: SaleState, to: SaleState) -> Changed {
        self.route(sku).set_state_if(sku, from, to).await
    }

    async fn pay(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.route(order_no.sku()).pay(order_no, user).await
    }

    async fn cancel(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.route(order_no.sku()).cancel(order_no, user).await
    }

    async fn expire_due(&self, sku: SkuId, max: usize) -> Result<usize, LedgerError> {
        self.route(sku).expire_due(sku, max).await
    }

    async fn counters(&self, sku: SkuId) -> Result<Option<Counters>, LedgerError> {
        self.route(sku).counters(sku).await
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, LedgerError> {
        self.route(order_no.sku()).order(order_no).await
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.main.ping().await?;
        self.hot.ping().await
    }

    fn keeps_buckets(&self, sku: SkuId) -> bool {
        self.route(sku).keeps_buckets(sku)
    }

    async fn hot_buckets(&self, sku: SkuId) -> Result<Option<HotBuckets>, LedgerError> {
        self.route(sku).hot_buckets(sku).await
    }
}

#[async_trait]
impl HotCopies for RoutedLedger {
    async fn load(&self, sale: &Sale, counters: &Counters, epoch: u64) -> Result<(), LedgerError> {
        self.route(sale.sku_id).load(sale, counters, epoch).await
    }

    async fn fence(&self, sku: SkuId) -> Result<bool, LedgerError> {
        self.route(sku).fence(sku).await
    }

    async fn open(&self, sku: SkuId, epoch: u64, state: SaleState) -> Result<(), LedgerError> {
        self.route(sku).open(sku, epoch, state).await
    }

    async fn hot_snapshot(&self, sku: SkuId) -> Result<Option<HotSnapshot>, LedgerError> {
        self.route(sku).hot_snapshot(sku).await
    }

    async fn bucket_salts(&self, sku: SkuId) -> Result<Option<Vec<u32>>, LedgerError> {
        self.route(sku).bucket_salts(sku).await
    }

    async fn place_buckets(&self, sale: &Sale) -> Result<Option<Vec<u32>>, LedgerError> {
        self.route(sale.sku_id).place_buckets(sale).await
    }

    fn adopt_salts(&self, sku: SkuId, salts: &[u32]) {
        self.route(sku).adopt_salts(sku, salts)
    }

    async fn fence_bucket(&self, sku: SkuId, bucket: u16) -> Result<bool, LedgerError> {
        self.route(sku).fence_bucket(sku, bucket).await
    }

    async fn load_bucket(
        &self,
        sale: &Sale,
        bucket: u16,
        counters: &Counters,
        epoch: u64,
        transfers: &BucketTransfers,
    ) -> Result<(), LedgerError> {
        (self.route(sale.sku_id))
            .load_bucket(sale, bucket, counters, epoch, transfers)
            .await
    }

    async fn open_bucket(
        &self,
        sku: SkuId,
        bucket: u16,
        epoch: u64,
        state: SaleState,
    ) -> Result<(), LedgerError> {
        self.route(sku).open_bucket(sku, bucket, epoch, state).await
    }

    async fn bucket_snapshot(
        &self,
        sku: SkuId,
        bucket: u16,
    ) -> Result<Option<HotSnapshot>, LedgerError> {
        self.route(sku).bucket_snapshot(sku, bucket).await
    }

    async fn restore_orders(
        &self,
        sku: SkuId,
        epoch: u64,
        orders: &[HotOrder],
    ) -> Result<usize, LedgerError> {
        self.route(sku).restore_orders(sku, epoch, orders).await
    }
}

#[async_trait]
impl SoldOutSupport for RoutedLedger {
    async fn accepted_keys(
        &self,
        sku: SkuId,
        max: usize,
    ) -> Result<Option<Vec<flashsale_core::RequestKey>>, LedgerError> {
        self.route(sku).accepted_keys(sku, max).await
    }

    async fn is_accepted(
        &self,
        sku: SkuId,
        key: &flashsale_core::RequestKey,
    ) -> Result<bool, LedgerError> {
        self.route(sku).is_accepted(sku, key).await
    }

    async fn accepted_count(&self, sku: SkuId) -> Result<Option<(u64, usize)>, LedgerError> {
        self.route(sku).accepted_count(sku).await
    }

    fn on_restock(&self, listener: RestockListener) {
        self.main.on_restock(listener.clone());
        self.hot.on_restock(listener);
    }

    fn restock_feeds(&self) -> Vec<RestockFeed> {
        let mut feeds = self.main.restock_feeds();
        feeds.extend(self.hot.restock_feeds());
        feeds
    }
}
