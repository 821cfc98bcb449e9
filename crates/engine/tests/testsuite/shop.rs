//! The shop's purchase use case on the embedded ledger (real SQLite): the order sold-out flag
//! → breaker → risk gate → ledger, a gate's refusal yielding to a request the ledger already
//! accepted, and the outcome's rules, all in the engine.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flashsale_core::{ErrorCode, OrderStatus, PurchaseRequest, Sale, SaleMode, SkuId};
use flashsale_embedded::EmbeddedLedger;
use flashsale_engine::shop::{
    PurchaseRefusal, RiskDenial, RiskGate, Screen, Shop, ShopConfig, ShopError,
};
use flashsale_store::SqliteStore;
use flashsale_testkit::conformance::req;
use flashsale_testkit::wait;

/// A gate that passes or refuses as told, and counts what it is asked.
#[derive(Default)]
struct Gate {
    refuse: AtomicBool,
    screened: AtomicUsize,
    accepted: AtomicUsize,
}

#[async_trait::async_trait]
impl RiskGate for Gate {
    async fn screen(&self, _: &PurchaseRequest) -> Screen {
        self.screened.fetch_add(1, Ordering::SeqCst);
        if !self.refuse.load(Ordering::SeqCst) {
            return Screen::Pass;
        }
        Screen::Refuse(RiskDenial {
            by: "service",
            message: "no".into(),
        })
    }

    fn accepted(&self, _: &PurchaseRequest) {
        self.accepted.fetch_add(1, Ordering::SeqCst);
    }
}

/// A shop on a fresh embedded ledger with `sale` warm.
async fn shop_with(sale: Sale) -> (Arc<Shop>, Sale, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flashsale.db");
    let store = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    let ledger = Arc::new(EmbeddedLedger::open(store.clone()).await.unwrap());
    let shop = Shop::new(ledger, store, ShopConfig::default(), None);
    let sku = sale.sku_id;
    shop.create_sale(sale).await.unwrap();
    let warm = shop.warm(sku, false).await.unwrap();
    (shop, warm.sale, dir)
}

fn refused_code(r: Result<impl std::fmt::Debug, PurchaseRefusal>) -> ErrorCode {
    match r {
        Err(PurchaseRefusal::Shop(ShopError::Code(code))) => code,
        Err(PurchaseRefusal::Shop(ShopError::Refused(code, _))) => code,
        other => panic!("not a refusal with a code: {other:?}"),
    }
}

#[tokio::test]
async fn a_purchase_asks_the_gate_after_the_local_refusals_and_yields_to_the_ledger() {
    let (shop, sale, _dir) = shop_with(Sale::always_open(SkuId(71), 1)).await;
    let gate = Gate::default();
    let first = req(sale.sku_id, 1, "a", 1);
    let bought = shop.purchase(first.clone(), &sale, &gate).await.unwrap();
    assert!(!bought.replayed);
    assert_eq!(gate.accepted.load(Ordering::SeqCst), 1);

    // The gate refuses now: a retry of the accepted request still gets its first outcome,
    // a new buyer is refused by the gate.
    gate.refuse.store(true, Ordering::SeqCst);
    let again = shop.purchase(first.clone(), &sale, &gate).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.order.order_no, bought.order.order_no);
    let denied = shop
        .purchase(req(sale.sku_id, 2, "b", 1), &sale, &gate)
        .await;
    assert!(matches!(denied, Err(PurchaseRefusal::Risk(ref d)) if d.by == "service"));

    // A retry asking for another quantity is refused after the ledger's replay.
    gate.refuse.store(false, Ordering::SeqCst);
    let other = req(sale.sku_id, 1, "a", 2);
    let reused = shop.purchase(other, &sale, &gate).await;
    assert_eq!(refused_code(reused), ErrorCode::IdempotencyKeyReused);

    // Sold out: the ledger says so once, then the sale's flag answers and the gate is not
    // asked.
    let sold_out = shop
        .purchase(req(sale.sku_id, 3, "c", 1), &sale, &gate)
        .await;
    assert_eq!(refused_code(sold_out), ErrorCode::SoldOut);
    let probe = req(sale.sku_id, 4, "d", 1);
    wait::until("the sold-out flag", Duration::from_secs(10), || {
        let set = shop.sold_out_answers(probe.sku_id, &probe.key());
        async move { set.then_some(()) }
    })
    .await;
    let asked = gate.screened.load(Ordering::SeqCst);
    let here = shop.purchase(probe, &sale, &gate).await;
    assert!(
        matches!(here, Err(PurchaseRefusal::SoldOutHere)),
        "{here:?}"
    );
    assert_eq!(
        gate.screened.load(Ordering::SeqCst),
        asked,
        "the gate was asked"
    );
}

#[tokio::test]
async fn a_cancellation_clears_the_sold_out_flag_and_pay_answers_the_order() {
    let reserve = Sale {
        mode: SaleMode::Reserve,
        payment_timeout_ms: 60_000,
        ..Sale::always_open(SkuId(72), 1)
    };
    let (shop, sale, _dir) = shop_with(reserve).await;
    let gate = Gate::default();
    let bought = shop
        .purchase(req(sale.sku_id, 1, "a", 1), &sale, &gate)
        .await
        .unwrap();
    let sold_out = shop
        .purchase(req(sale.sku_id, 2, "b", 1), &sale, &gate)
        .await;
    assert_eq!(refused_code(sold_out), ErrorCode::SoldOut);
    let probe = req(sale.sku_id, 3, "c", 1);
    wait::until("the sold-out flag", Duration::from_secs(10), || {
        let set = shop.sold_out_answers(probe.sku_id, &probe.key());
        async move { set.then_some(()) }
    })
    .await;
    let no = bought.order.order_no;
    let someone_else = shop.cancel(&no, flashsale_core::UserId(2)).await;
    assert!(someone_else.is_err(), "{someone_else:?}");
    shop.cancel(&no, flashsale_core::UserId(1)).await.unwrap();
    assert!(!shop.sold_out_answers(probe.sku_id, &probe.key()));
    let now = shop.order(&no, flashsale_core::UserId(1)).await.unwrap();
    assert_eq!(now.order.order_no, no);
    let again = shop.purchase(probe, &sale, &gate).await.unwrap();
    assert!(!again.replayed);
    let paid = shop
        .pay(&again.order.order_no, flashsale_core::UserId(3))
        .await;
    assert_eq!(paid.unwrap().status, OrderStatus::Paid);
}
