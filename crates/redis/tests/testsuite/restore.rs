//! Rebuild after a loss of hot state: load (next epoch, fenced), restore the orders read back
//! from the system of record, open. Replays, limits and holds survive; a copy that is not
//! the fenced one of the epoch takes no restore.

use crate::common::TestLedger;
use flashsale_core::{
    CopyAt, Counters, ErrorCode, HotCopies, HotLedger, OrderStatus, PurchaseOutcome, SaleMode,
    SaleState, UserId,
};
use flashsale_testkit::conformance::{
    buy, buy_ok, buy_refused, expire_until, live_sale, stock, warm,
};

#[tokio::test]
async fn restored_orders_keep_replays_limits_and_holds() {
    restore_keeps_replays_limits_and_holds(TestLedger::new().await).await;
}

#[tokio::test]
async fn restored_orders_keep_replays_limits_and_holds_in_buyer_records() {
    restore_keeps_replays_limits_and_holds(TestLedger::with_records().await).await;
}

async fn restore_keeps_replays_limits_and_holds(t: TestLedger) {
    let l = t.ledger.as_ref();
    let sale = live_sale(SaleMode::Reserve, 10, 2);
    let sku = warm(l, &sale).await;
    let a = buy_ok(l, sku, 1, "a", 2).await;
    let b = buy_ok(l, sku, 2, "b", 1).await;
    let c = buy_ok(l, sku, 3, "c", 1).await;
    l.pay(&a.order_no, UserId(1)).await.unwrap().unwrap();
    l.cancel(&c.order_no, UserId(3)).await.unwrap().unwrap();
    let mut orders = Vec::new();
    for no in [&a.order_no, &b.order_no, &c.order_no] {
        orders.push(l.order(no).await.unwrap().unwrap());
    }
    let counters: Counters = l.counters(sku).await.unwrap().unwrap();

    // Hot state lost and rebuilt from the "database" in a new epoch.
    l.load(&sale, &counters, 2).await.unwrap();
    buy_refused(l, sku, 9, "fenced", 1, ErrorCode::Unavailable).await;
    assert!(matches!(
        t.ledger
            .restore_orders(CopyAt { sku, epoch: 1 }, &orders)
            .await,
        Err(flashsale_core::LedgerError::AlreadyWarm)
    ));
    assert_eq!(
        t.ledger
            .restore_orders(CopyAt { sku, epoch: 2 }, &orders)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        t.ledger
            .restore_orders(CopyAt { sku, epoch: 2 }, &orders)
            .await
            .unwrap(),
        0,
        "idempotent"
    );
    l.open(sku, 2, SaleState::Live).await.unwrap();
    for o in &orders {
        let now = l.order(&o.order_no).await.unwrap();
        assert_eq!(now.as_ref(), Some(o), "restored as it was");
    }

    match buy(l, sku, 1, "a", 2).await {
        PurchaseOutcome::Accepted { order, replayed } => {
            assert!(replayed);
            assert_eq!(
                (order.order_no, order.status),
                (a.order_no, OrderStatus::Paid)
            );
        }
        other => panic!("{other:?}"),
    }
    buy_refused(l, sku, 1, "z", 1, ErrorCode::LimitExceeded).await;
    let next = buy_ok(l, sku, 3, "c2", 2).await;
    assert_eq!(next.order_no.to_string(), format!("{sku}-2-6"));
    expire_until(l, sku, 2).await;
    assert_eq!(stock(l, sku).await, (8, 0, 2, 8));
    t.cleanup().await;
}

/// Another rebuild fences a copy between its load and its open (it read the copy's epoch
/// before its fence, drains nothing and will replace it): the loader's open answers stale and
/// the copy stays fenced, selling nothing that rebuild would load over. An open that came
/// first is fenced as any open copy is.
#[tokio::test]
async fn a_copy_fenced_between_its_load_and_its_open_is_not_opened() {
    let t = TestLedger::new().await;
    let l = t.ledger.as_ref();
    let sale = live_sale(SaleMode::Direct, 10, 2);
    let sku = warm(l, &sale).await;
    let counters: Counters = l.counters(sku).await.unwrap().unwrap();
    l.load(&sale, &counters, 2).await.unwrap();
    assert!(t.ledger.fence(sku).await.unwrap(), "the loaded copy exists");
    assert!(matches!(
        l.open(sku, 2, SaleState::Live).await,
        Err(flashsale_core::LedgerError::AlreadyWarm)
    ));
    buy_refused(l, sku, 9, "fenced", 1, ErrorCode::Unavailable).await;

    l.load(&sale, &counters, 3).await.unwrap();
    l.open(sku, 3, SaleState::Live).await.unwrap();
    buy_ok(l, sku, 9, "open", 1).await;
    assert!(t.ledger.fence(sku).await.unwrap());
    buy_refused(l, sku, 8, "fenced-again", 1, ErrorCode::Unavailable).await;
    t.cleanup().await;
}
