//! Rebuilds that meet a trap set in a real store:
//! - a drain that meets a gap (the database answers that the run does not continue the row:
//!   it moved meanwhile) still stores the bucket's outs before the epoch moves. An out left
//!   unstored is lost with the fenced copy: the new copy holds its units again, and an in
//!   that a carrier still brings to the destination creates them twice.
//! - a rebuild overtaken by another one (which loads and opens a copy that sells) between its
//!   drain and its epoch: it must not take the epoch over that copy, whose sale it never
//!   drained.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use flashsale_core::buckets::home_bucket;
use flashsale_core::{
    ApplyReport, BucketRow, DeadLetter, Event, HotOrder, HotPurchases, OrderNo, OrderStore,
    PurchaseOutcome, ReconcileRun, Sale, SaleAudit, SaleMode, SaleState, SkuId, StoreError,
    StoredSale, TransferApplied, TransferEvent, TransferSide, UserId,
};
use flashsale_engine::reconcile::rebuild::{rebuild, rebuild_bucket};
use flashsale_redis::keys::Keys;
use flashsale_redis::scripts::transfer_out_alone;
use flashsale_redis::RedisLedger;
use flashsale_testkit::bucketed::bucketed_sale;
use flashsale_testkit::conformance::req;
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::redis_server::{shared_url, unique_prefix};

type Hook = Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>;

/// A real store with traps: once `gap` is armed, the next `apply_events` answers a gap; a
/// hook set in `before_audit` runs (once) before the next `audit` reads.
struct Trapped {
    inner: Arc<dyn OrderStore>,
    gap: AtomicBool,
    before_audit: Mutex<Option<Hook>>,
}

impl Trapped {
    fn new(inner: Arc<dyn OrderStore>) -> Trapped {
        Trapped {
            inner,
            gap: AtomicBool::new(false),
            before_audit: Mutex::new(None),
        }
    }
}

/// Two buckets of 10 on the shared Redis and a MariaDB database behind a trapped store,
/// loaded and live, and a buyer whose home is bucket 0.
struct Rig {
    _db: TestDatabase,
    store: Trapped,
    prefix: String,
    ledger: RedisLedger,
    sku: SkuId,
    buyer: u64,
}

impl Rig {
    async fn loaded() -> Rig {
        let db = TestDatabase::create().await;
        let inner = flashsale_store::MySqlStore::connect(&db.url).await.unwrap();
        let store = Trapped::new(Arc::new(inner));
        let prefix = unique_prefix();
        let ledger = RedisLedger::connect(&shared_url(), &prefix).await.unwrap();
        let ledger = ledger.with_buckets();
        let sale = bucketed_sale(SaleMode::Direct, 20, 5, 2);
        let sku = sale.sku_id;
        store.create_sale(&sale).await.unwrap();
        store.set_state(sku, SaleState::Live).await.unwrap();
        rebuild(&ledger, &store, sku).await.unwrap();
        let buyer = (1..).find(|u| home_bucket(UserId(*u), 2) == 0).unwrap();
        Rig {
            _db: db,
            store,
            prefix,
            ledger,
            sku,
            buyer,
        }
    }
}

#[async_trait]
impl OrderStore for Trapped {
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
        seqs: RangeInclusive<u64>,
    ) -> Result<Vec<Event>, StoreError> {
        self.inner.events_between(sku, seqs).await
    }
    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        self.inner.record_dead_letter(letter).await
    }
    async fn dead_letters(&self, sku: SkuId) -> Result<Vec<DeadLetter>, StoreError> {
        self.inner.dead_letters(sku).await
    }
    async fn apply_events(&self, sku: SkuId, events: &[Event]) -> Result<ApplyReport, StoreError> {
        if self.gap.swap(false, Ordering::SeqCst) {
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
        row: &BucketRow,
    ) -> Result<Option<u64>, StoreError> {
        self.inner.take_bucket_epoch(sku, row).await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
    async fn audit(&self, sku: SkuId) -> Result<Option<SaleAudit>, StoreError> {
        let hook = self.before_audit.lock().unwrap().take();
        if let Some(hook) = hook {
            hook().await;
        }
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
    let rig = Rig::loaded().await;
    let (store, ledger, sku, buyer) = (&rig.store, &rig.ledger, rig.sku, rig.buyer);
    let outcome = ledger.purchase_batch(sku, &[req(sku, buyer, "a", 1)]).await;
    let outcome = outcome.unwrap();
    assert!(
        matches!(outcome[..], [PurchaseOutcome::Accepted { .. }]),
        "bucket 0 sells one: {outcome:?}"
    );
    let mut conn = redis::Client::open(shared_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = Keys::new(&rig.prefix).unwrap();
    let reply = transfer_out_alone(&mut conn, &keys, sku, 1, 1)
        .await
        .unwrap();
    assert_eq!(reply[0], "OK", "{reply:?}");

    store.gap.store(true, Ordering::SeqCst);
    rebuild_bucket(ledger, store, sku, 0).await.unwrap();
    assert!(!store.gap.load(Ordering::SeqCst), "the drain met the gap");
    let audit = store.audit(sku).await.unwrap().unwrap();
    let outs: Vec<&str> = (audit.transfers.iter())
        .filter(|t| t.side == TransferSide::Out)
        .map(|t| t.id.as_str())
        .collect();
    assert_eq!(outs, vec![reply[1].as_str()], "{:?}", audit.transfers);
    let row = &audit.buckets[0];
    assert_eq!((row.counters.total, row.counters.sold), (9, 1), "{row:?}");
}

/// Two buckets of 10, loaded. Bucket 0's rebuild A fences and drains its copy; before it
/// takes the next epoch, rebuild B of the same bucket runs whole (fence, drain, epoch, load,
/// open) and its new copy sells one unit. A must then give up (raced): taking the epoch from
/// B's copy would load a copy over one whose sale nobody drained, and the sale would be lost
/// (reported as fenced, though no Redis lost anything). A proper rebuild after it stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_overtaken_by_another_does_not_replace_the_copy_that_one_opened() {
    let rig = Rig::loaded().await;
    let (store, ledger, sku, buyer) = (&rig.store, &rig.ledger, rig.sku, rig.buyer);
    let inner = store.inner.clone();
    let sold = Arc::new(Mutex::new(None));
    let (sold_by_b, b_prefix) = (sold.clone(), rig.prefix.clone());
    let hook: Hook = Box::new(move || {
        Box::pin(async move {
            let b = RedisLedger::connect(&shared_url(), &b_prefix)
                .await
                .unwrap();
            let b = b.with_buckets();
            rebuild_bucket(&b, inner.as_ref(), sku, 0).await.unwrap();
            let outcome = b.purchase_batch(sku, &[req(sku, buyer, "a", 1)]).await;
            *sold_by_b.lock().unwrap() = Some(outcome.unwrap());
        })
    });
    *store.before_audit.lock().unwrap() = Some(hook);
    let a = rebuild_bucket(ledger, store, sku, 0).await;
    let outcome = sold.lock().unwrap().take().expect("B ran inside A");
    let [PurchaseOutcome::Accepted { ref order, .. }] = outcome[..] else {
        panic!("B's copy sells one: {outcome:?}");
    };
    let order_no = order.order_no;
    // A rebuild that nobody overtakes drains what B's copy sold.
    rebuild_bucket(ledger, store, sku, 0).await.unwrap();
    let stored = store.order(&order_no).await.unwrap();
    assert!(
        stored.is_some(),
        "{order_no}, sold by the copy B opened, is stored (A ended {a:?})"
    );
}
