//! A bucketed sale's per-bucket counters through the whole router, with the hot ledger's
//! answer chosen by the test: the embedded ledger (which has no buckets of its own) wrapped so
//! that `hot_buckets` answers a given split, or fails. The view shows the hot split with its
//! source; a failed read never fails the GET (the database has no bucket rows yet, so the sale
//! is shown without them); a sale of one bucket never asks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use flashsale_core::ledger::{
    Changed, HotSnapshot, PurchaseRequest, Resolution, RestockFeed, RestockListener,
};
use flashsale_core::{
    CopyAt, Counters, Durability, HotBuckets, HotCopies, HotLedger, HotOrder, HotPurchases, Ledger,
    LedgerError, OrderNo, PurchaseOutcome, RequestKey, Sale, SaleState, SkuId, SoldOutSupport,
    UserId,
};
use flashsale_server::auth::Auth;
use flashsale_server::{AppState, Tunables};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common;

/// What the wrapped ledger's `hot_buckets` answers.
#[derive(Clone)]
enum HotAnswer {
    Split(HotBuckets),
    Fails,
}

/// The embedded ledger with `hot_buckets` answered by the test, and its calls counted.
struct Bucketed {
    inner: Arc<dyn Ledger>,
    answer: HotAnswer,
    asked: AtomicUsize,
}

#[async_trait]
impl HotPurchases for Bucketed {
    async fn purchase_batch(
        &self,
        sku: SkuId,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        self.inner.purchase_batch(sku, reqs).await
    }
}

#[async_trait]
impl HotLedger for Bucketed {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn durability(&self) -> Durability {
        self.inner.durability()
    }
    fn buckets_max(&self) -> u16 {
        self.inner.buckets_max()
    }
    /// Says it keeps buckets apart, as the Redis ledger does, so that the view asks it.
    fn keeps_buckets(&self, _sku: SkuId) -> bool {
        true
    }
    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), LedgerError> {
        self.inner.set_state(sku, state).await
    }
    async fn set_state_if(&self, sku: SkuId, from: SaleState, to: SaleState) -> Changed {
        self.inner.set_state_if(sku, from, to).await
    }
    async fn pay(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.inner.pay(order_no, user).await
    }
    async fn cancel(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.inner.cancel(order_no, user).await
    }
    async fn expire_due(&self, sku: SkuId, max: usize) -> Result<usize, LedgerError> {
        self.inner.expire_due(sku, max).await
    }
    async fn counters(&self, sku: SkuId) -> Result<Option<Counters>, LedgerError> {
        self.inner.counters(sku).await
    }
    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, LedgerError> {
        self.inner.order(order_no).await
    }
    async fn ping(&self) -> Result<(), LedgerError> {
        self.inner.ping().await
    }
    async fn hot_buckets(&self, _sku: SkuId) -> Result<Option<HotBuckets>, LedgerError> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        match &self.answer {
            HotAnswer::Split(split) => Ok(Some(split.clone())),
            HotAnswer::Fails => Err(LedgerError::Unavailable("hot buckets down".into())),
        }
    }
}

#[async_trait]
impl HotCopies for Bucketed {
    async fn load(&self, sale: &Sale, counters: &Counters, epoch: u64) -> Result<(), LedgerError> {
        self.inner.load(sale, counters, epoch).await
    }
    async fn fence(&self, sku: SkuId) -> Result<bool, LedgerError> {
        self.inner.fence(sku).await
    }
    async fn open(&self, sku: SkuId, epoch: u64, state: SaleState) -> Result<(), LedgerError> {
        self.inner.open(sku, epoch, state).await
    }
    async fn hot_snapshot(&self, sku: SkuId) -> Result<Option<HotSnapshot>, LedgerError> {
        self.inner.hot_snapshot(sku).await
    }
    async fn restore_orders(&self, at: CopyAt, orders: &[HotOrder]) -> Result<usize, LedgerError> {
        self.inner.restore_orders(at, orders).await
    }
}

#[async_trait]
impl SoldOutSupport for Bucketed {
    async fn accepted_keys(
        &self,
        sku: SkuId,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError> {
        self.inner.accepted_keys(sku, max).await
    }
    async fn is_accepted(&self, sku: SkuId, key: &RequestKey) -> Result<bool, LedgerError> {
        self.inner.is_accepted(sku, key).await
    }
    async fn accepted_count(&self, sku: SkuId) -> Result<Option<(u64, usize)>, LedgerError> {
        self.inner.accepted_count(sku).await
    }
    fn on_restock(&self, listener: RestockListener) {
        self.inner.on_restock(listener)
    }
    fn restock_feeds(&self) -> Vec<RestockFeed> {
        self.inner.restock_feeds()
    }
}

/// An in-process service on the wrapped embedded ledger.
struct App {
    router: axum::Router,
    ledger: Arc<Bucketed>,
    _dir: tempfile::TempDir,
}

impl App {
    async fn new(answer: HotAnswer) -> App {
        let dir = tempfile::tempdir().unwrap();
        let config = common::config(None, common::sqlite_url(&dir));
        let (inner, store) = flashsale_engine::backends::open(&config.engine)
            .await
            .unwrap();
        let ledger = Arc::new(Bucketed {
            inner,
            answer,
            asked: AtomicUsize::new(0),
        });
        let auth = Auth::new(common::JWT_SECRET, common::ADMIN);
        let state = AppState::new(ledger.clone(), store, auth, Tunables::default());
        App {
            router: flashsale_server::app(state),
            ledger,
            _dir: dir,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {}", common::ADMIN));
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        let resp = self.router.clone().oneshot(req.body(body).unwrap()).await;
        let resp = resp.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// A live sale of `total` units over `buckets` buckets.
    async fn live_sale(&self, sku: u64, total: u64, buckets: u16) {
        let body = json!({"sku_id": sku, "name": "bucketed", "total_stock": total,
                          "buckets": buckets});
        let (s, b) = self.call("POST", "/api/v1/sales", Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let (s, b) = self
            .call("POST", &format!("/api/v1/sales/{sku}/warm"), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }

    async fn sale(&self, sku: u64) -> Value {
        let (s, b) = self
            .call("GET", &format!("/api/v1/sales/{sku}"), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b
    }

    fn asked(&self) -> usize {
        self.ledger.asked.load(Ordering::Relaxed)
    }
}

fn counters(total: u64, available: u64) -> Counters {
    Counters {
        total,
        available,
        reserved: 0,
        sold: total - available,
        seq: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_split_is_shown_with_its_source_on_the_sale_and_the_dashboard() {
    let split = HotBuckets {
        buckets: vec![
            (0, counters(12, 10)),
            (1, counters(10, 10)),
            (2, counters(6, 6)),
        ],
        in_flight_units: 2,
    };
    let app = App::new(HotAnswer::Split(split)).await;
    app.live_sale(501, 30, 3).await;
    let v = app.sale(501).await;
    assert_eq!(v["buckets"], 3, "{v}");
    assert_eq!(v["bucket_source"], "hot", "{v}");
    assert_eq!(v["in_flight_units"], 2, "{v}");
    let list = v["bucket_counters"].as_array().expect("bucket_counters");
    assert_eq!(list.len(), 3, "{v}");
    assert_eq!(
        list[0],
        json!({"bucket": 0, "total": 12, "available": 10, "reserved": 0, "sold": 2})
    );
    // The sale's own counters are read as before (here, the embedded ledger's one book).
    assert_eq!(v["available"], 30, "{v}");

    let (s, board) = app.call("GET", "/api/v1/dashboard", None).await;
    assert_eq!(s, StatusCode::OK, "{board}");
    let card = &board["sales"][0];
    assert_eq!(card["bucket_source"], "hot", "{card}");
    assert_eq!(card["bucket_counters"].as_array().map(Vec::len), Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hot_read_falls_back_and_never_fails_the_sale() {
    let app = App::new(HotAnswer::Fails).await;
    app.live_sale(502, 30, 3).await;
    let v = app.sale(502).await;
    assert!(app.asked() > 0, "the hot ledger was asked");
    assert_eq!(
        (v["buckets"].as_u64(), v["available"].as_u64()),
        (Some(3), Some(30))
    );
    // The database has no bucket rows yet: nothing per bucket, and no error.
    for field in ["bucket_counters", "in_flight_units", "bucket_source"] {
        assert!(v.get(field).is_none(), "{field}: {v}");
    }
    let (s, board) = app.call("GET", "/api/v1/dashboard", None).await;
    assert_eq!(s, StatusCode::OK, "{board}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_of_one_bucket_never_asks_for_buckets() {
    let split = HotBuckets {
        buckets: vec![(0, counters(30, 30))],
        in_flight_units: 0,
    };
    let app = App::new(HotAnswer::Split(split)).await;
    app.live_sale(503, 30, 1).await;
    let v = app.sale(503).await;
    assert!(v.get("bucket_counters").is_none(), "{v}");
    assert_eq!(app.asked(), 0);
}
