//! A bucket's rebuild whose drain meets a gap (the database answers that the run does not
//! continue the row: it moved meanwhile) still stores the bucket's outs before the epoch
//! moves. An out left unstored is lost with the fenced copy: the new copy holds its units
//! again, and an in that a carrier still brings to the destination creates them twice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use flashsale_core::buckets::home_bucket;
use flashsale_core::{
    ApplyReport, BucketRow, DeadLetter, Event, HotOrder, HotPurchases, OrderNo, OrderStore,
    PurchaseOutcome, ReconcileRun, Sale, SaleAudit, SaleMode, SaleState, SkuId, StoreError,
    StoredSale, TransferApplied, TransferEvent, TransferSide, UserId,
};
use flashsale_engine::reconcile::rebuild::{rebuild, rebuild_bucket};
use flashsale_redis::keys::Keys;
use flashsale_redis::RedisLedger;
use flashsale_testkit::bucketed::bucketed_sale;
use flashsale_testkit::conformance::req;
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::redis_server::{shared_url, unique_prefix};

/// A real store whose next `apply_events` answers a gap once armed.
struct GapOnce {
    inner: Arc<dyn OrderStore>,
    armed: AtomicBool,
}

#[async_trait]
impl OrderStore for GapOnce {
    async fn create_sale(&self, sale: &Sale) -> Result<StoredSale, StoreError> {
        self.inner.create_sale(sale).await
    }
    async fn sale(&self, sku: SkuId) -> Result<Option<StoredSale>, StoreError> {
        self.inner.sale(sku).await
    }
    async fn sales(&self) -> Result<Vec<StoredSale>, StoreError> {
        self.inner.sales().await
    }
    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), StoreError> {
        self.inner.set_state(sku, state).await
    }
    async fn take_epoch(&self, sku: SkuId, current: u64) -> Result<Option<u64>, StoreError> {
        self.inner.take_epoch(sku, current).await
    }
    async fn unreported_fenced(&self, sku: SkuId, max: usize) -> Result<Vec<Event>, StoreError> {
        self.inner.unreported_fenced(sku, max).await
    }
    async fn mark_fenced_reported(
        &self,
        sku: SkuId,
        keys: &[(u64, u64)],
    ) -> Result<(), StoreError> {
        self.inner.mark_fenced_reported(sku, keys).await
    }
    async fn stream_paused(&self, sku: SkuId) -> Result<bool, StoreError> {
        self.inner.stream_paused(sku).await
    }
    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, StoreError> {
        self.inner.order(order_no).await
    }
    async fn orders(&self, sku: SkuId) -> Result<Vec<HotOrder>, StoreError> {
        self.inner.orders(sku).await
    }
    async fn events(&self, sku: SkuId) -> Result<Vec<Event>, StoreError> {
        self.inner.events(sku).await
    }
    async fn events_between(
        &self,
        sku: SkuId,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.inner.events_between(sku, from_seq, to_seq).await
    }
    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        self.inner.record_dead_letter(letter).await
    }
    async fn dead_letters(&self, sku: SkuId) -> Result<Vec<DeadLetter>, StoreError> {
        self.inner.dead_letters(sku).await
    }
    async fn apply_events(&self, sku: SkuId, events: &[Event]) -> Result<ApplyReport, StoreError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            let first_seq = events.first().map_or(0, |e| e.seq);
            return Err(StoreError::Gap {
                applied_seq: first_seq.saturating_sub(2),
                first_seq,
            });
        }
        self.inner.apply_events(sku, events).await
    }
    async fn apply_transfer(
        &self,
        transfer: &TransferEvent,
    ) -> Result<TransferApplied, StoreError> {
        self.inner.apply_transfer(transfer).await
    }
    async fn buckets(&self, sku: SkuId) -> Result<Vec<BucketRow>, StoreError> {
        self.inner.buckets(sku).await
    }
    async fn split_buckets(&self, sku: SkuId) -> Result<(), StoreError> {
        self.inner.split_buckets(sku).await
    }
    async fn bucket_salts(&self, sku: SkuId) -> Result<Option<Vec<u32>>, StoreError> {
        self.inner.bucket_salts(sku).await
    }
    async fn keep_bucket_salts(&self, sku: SkuId, salts: &[u32]) -> Result<(), StoreError> {
        self.inner.keep_bucket_salts(sku, salts).await
    }
    async fn take_bucket_epoch(
        &self,
        sku: SkuId,
        bucket: u16,
        current: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.inner.take_bucket_epoch(sku, bucket, current).await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
    async fn audit(&self, sku: SkuId) -> Result<Option<SaleAudit>, StoreError> {
        self.inner.audit(sku).await
    }
    async fn record_reconcile_run(&self, run: &ReconcileRun) -> Result<u64, StoreError> {
        self.inner.record_reconcile_run(run).await
    }
    async fn reconcile_runs(
        &self,
        sku: Option<SkuId>,
        limit: usize,
    ) -> Result<Vec<ReconcileRun>, StoreError> {
        self.inner.reconcile_runs(sku, limit).await
    }
}

/// Two buckets of 10 on the shared Redis and a MariaDB database, loaded; bucket 0 sells one
/// unit and sends one to bucket 1 (an out whose in is in no copy yet), none of it stored.
/// Its rebuild's drain meets a gap once: the out is stored all the same, and bucket 0's row
/// holds 9 units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_meets_a_gap_still_stores_the_buckets_outs() {
    let db = TestDatabase::create().await;
    let inner = flashsale_store::MySqlStore::connect(&db.url).await.unwrap();
    let store = GapOnce {
        inner: Arc::new(inner),
        armed: AtomicBool::new(false),
    };
    let prefix = unique_prefix();
    let ledger = RedisLedger::connect(&shared_url(), &prefix).await.unwrap();
    let ledger = ledger.with_buckets();
    let sale = bucketed_sale(SaleMode::Direct, 20, 5, 2);
    let sku = sale.sku_id;
    store.create_sale(&sale).await.unwrap();
    store.set_state(sku, SaleState::Live).await.unwrap();
    rebuild(&ledger, &store, sku).await.unwrap();

    let buyer = (1..).find(|u| home_bucket(UserId(*u), 2) == 0).unwrap();
    let outcome = ledger.purchase_batch(sku, &[req(sku, buyer, "a", 1)]).await;
    let outcome = outcome.unwrap();
    assert!(
        matches!(outcome[..], [PurchaseOutcome::Accepted { .. }]),
        "bucket 0 sells one: {outcome:?}"
    );
    let keys = Keys::new(&prefix).unwrap();
    let mut conn = redis::Client::open(shared_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let reply: Vec<String> = redis::Script::new(flashsale_redis::scripts::TRANSFER_OUT)
        .key(keys.sale(sku))
        .key(keys.events(sku))
        .key(keys.transfers_out(sku))
        .arg(1)
        .arg(1)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(reply[0], "OK", "{reply:?}");

    store.armed.store(true, Ordering::SeqCst);
    rebuild_bucket(&ledger, &store, sku, 0).await.unwrap();
    assert!(!store.armed.load(Ordering::SeqCst), "the drain met the gap");
    let audit = store.audit(sku).await.unwrap().unwrap();
    let outs: Vec<&str> = (audit.transfers.iter())
        .filter(|t| t.side == TransferSide::Out)
        .map(|t| t.id.as_str())
        .collect();
    assert_eq!(outs, vec![reply[1].as_str()], "{:?}", audit.transfers);
    let row = &audit.buckets[0];
    assert_eq!((row.counters.total, row.counters.sold), (9, 1), "{row:?}");
}
