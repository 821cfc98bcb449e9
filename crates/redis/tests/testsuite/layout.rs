//! The key layouts of a copy: layout 2 keeps one record per buyer (and one batch member per
//! purchase call) instead of layout 1's requests, orders and buyers hashes; a ledger serves a
//! copy of either layout, and its next load gives the copy the ledger's own.

use crate::common::{raw, TestLedger};
use flashsale_core::{
    CopyAt, Counters, HotCopies, HotLedger, HotPurchases, OrderNo, OrderStatus, PurchaseOutcome,
    SaleMode, SaleState, SoldOutSupport, UserId,
};
use flashsale_redis::{Keys, RedisLedger};
use flashsale_testkit::conformance::{buy, buy_ok, live_sale, req, stock, warm};
use flashsale_testkit::redis_server::shared_url;

/// How many fields (or members) each key of a copy holds: requests, orders, buyers, records,
/// batches.
async fn sizes(keys: &Keys, sku: flashsale_core::SkuId) -> [i64; 5] {
    let mut conn = raw().await;
    let mut pipe = redis::pipe();
    let sized = [
        ("HLEN", keys.requests(sku)),
        ("HLEN", keys.orders(sku)),
        ("HLEN", keys.buyers(sku)),
        ("HLEN", keys.records(sku)),
        ("ZCARD", keys.batches(sku)),
    ];
    for (size, key) in sized {
        pipe.cmd(size).arg(key);
    }
    let got: (i64, i64, i64, i64, i64) = pipe.query_async(&mut conn).await.unwrap();
    [got.0, got.1, got.2, got.3, got.4]
}

/// A buyer's raw record.
async fn record_of(keys: &Keys, sku: flashsale_core::SkuId, user: u64) -> String {
    redis::cmd("HGET")
        .arg(keys.records(sku))
        .arg(user)
        .query_async(&mut raw().await)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_purchase_writes_one_record_per_buyer_and_one_batch_per_call() {
    let t = TestLedger::with_records().await;
    let l = t.ledger.as_ref();
    let keys = t.ledger.keys().clone();
    let sku = warm(l, &live_sale(SaleMode::Reserve, 100, 3)).await;
    let batch: Vec<_> = (1..=40)
        .map(|u| req(sku, u, &format!("r{u}"), 1))
        .chain([req(sku, 1, "again", 2), req(sku, 1, "r1", 1)])
        .collect();
    let out = l.purchase_batch(sku, &batch).await.unwrap();
    assert!(out[..41].iter().all(|o| matches!(
        o,
        PurchaseOutcome::Accepted {
            replayed: false,
            ..
        }
    )));
    assert!(matches!(
        &out[41],
        PurchaseOutcome::Accepted { replayed: true, order } if order.request_id.as_str() == "r1"
    ));
    assert_eq!(sizes(&keys, sku).await, [0, 0, 0, 40, 1]);
    assert_eq!(record_of(&keys, sku, 1).await, "r1,1,1,1,R;again,1,41,2,R");

    // The order's fields that follow from the request and the batch come back whole.
    let PurchaseOutcome::Accepted { order, .. } = &out[40] else {
        unreachable!()
    };
    assert_eq!(
        l.order(&order.order_no).await.unwrap().as_ref(),
        Some(order)
    );
    assert_eq!(
        order.deadline_ms - order.created_at_ms,
        live_sale(SaleMode::Reserve, 1, 1).payment_timeout_ms as i64
    );
    let seqless = OrderNo::parse(&format!("{sku}-1-99")).unwrap();
    assert_eq!(l.order(&seqless).await.unwrap(), None);
    let other_epoch = OrderNo::parse(&format!("{sku}-2-1")).unwrap();
    assert_eq!(l.order(&other_epoch).await.unwrap(), None);

    // A cancel gives the units back through the record: the buyer may buy them again.
    l.cancel(&order.order_no, UserId(1)).await.unwrap().unwrap();
    buy_ok(l, sku, 1, "third", 2).await;
    assert_eq!(l.accepted_count(sku).await.unwrap(), Some((1, 42)));
    t.cleanup().await;
}

/// A record is read as it is stored: a request id is found where an order starts (not inside
/// another id: `b` is not `ab`), whichever order of the record it names, and the units held
/// count the live orders only, wherever they sit.
#[tokio::test]
async fn a_record_answers_each_request_id_by_its_own_order() {
    let t = TestLedger::with_records().await;
    let l = t.ledger.as_ref();
    let sku = warm(l, &live_sale(SaleMode::Reserve, 100, 3)).await;
    let ab = buy_ok(l, sku, 7, "ab", 1).await;
    let b = buy_ok(l, sku, 7, "b", 1).await;
    buy_ok(l, sku, 7, "a", 1).await;
    assert_ne!(ab.order_no, b.order_no);
    assert!(matches!(
        buy(l, sku, 7, "c", 1).await,
        PurchaseOutcome::Rejected(flashsale_core::ErrorCode::LimitExceeded)
    ));
    // The first order cancelled: its unit comes back, the orders around it still count.
    l.cancel(&ab.order_no, UserId(7)).await.unwrap().unwrap();
    buy_ok(l, sku, 7, "c", 1).await;
    assert!(matches!(
        buy(l, sku, 7, "d", 1).await,
        PurchaseOutcome::Rejected(flashsale_core::ErrorCode::LimitExceeded)
    ));
    // Replays of an order in the middle of the record and of the cancelled first one.
    let replay = |rid: &'static str| async move { buy(l, sku, 7, rid, 1).await };
    assert!(matches!(
        replay("b").await,
        PurchaseOutcome::Accepted { replayed: true, order } if order.order_no == b.order_no
    ));
    assert!(matches!(
        replay("ab").await,
        PurchaseOutcome::Accepted { replayed: true, order }
            if order.order_no == ab.order_no && order.status == OrderStatus::Cancelled
    ));
    t.cleanup().await;
}

/// The live units a record's last order is marked with (`None`: it has no mark).
fn mark(record: &str) -> Option<u64> {
    let (_, tail) = record.rsplit_once('#')?;
    tail.parse().ok()
}

/// How many marks a record holds.
fn marks(record: &str) -> usize {
    record.matches('#').count()
}

/// A buyer of many orders: past a length the record ends with its live units, which every
/// write keeps (a purchase appends its orders and the units after them; a cancel, an expiry,
/// a restore rewrite it with one mark), and the per-user limit is judged by them.
#[tokio::test]
async fn a_long_record_carries_its_live_units() {
    let t = TestLedger::with_records().await;
    let l = t.ledger.as_ref();
    let keys = t.ledger.keys().clone();
    let sale = live_sale(SaleMode::Reserve, 100, 30);
    let sku = warm(l, &sale).await;
    let first = buy_ok(l, sku, 5, "order-00", 2).await;
    let record = record_of(&keys, sku, 5).await;
    assert_eq!((mark(&record), marks(&record)), (None, 0), "short: no mark");
    let batch: Vec<_> = (1..=27)
        .map(|i| req(sku, 5, &format!("order-{i:02}"), 1))
        .collect();
    let out = l.purchase_batch(sku, &batch).await.unwrap();
    let mut numbers: Vec<OrderNo> = (out.iter())
        .map(|o| match o {
            PurchaseOutcome::Accepted { order, .. } => order.order_no,
            other => panic!("{other:?}"),
        })
        .collect();
    numbers.push(first.order_no);
    let record = record_of(&keys, sku, 5).await;
    assert_eq!((mark(&record), marks(&record)), (Some(29), 1));
    assert!(matches!(
        buy(l, sku, 5, "order-00", 2).await,
        PurchaseOutcome::Accepted { replayed: true, order } if order.order_no == first.order_no
    ));
    buy_ok(l, sku, 5, "order-28", 1).await;
    let record = record_of(&keys, sku, 5).await;
    assert_eq!((mark(&record), marks(&record)), (Some(30), 2), "appended");
    assert!(matches!(
        buy(l, sku, 5, "order-29", 1).await,
        PurchaseOutcome::Rejected(flashsale_core::ErrorCode::LimitExceeded)
    ));
    l.cancel(&first.order_no, UserId(5)).await.unwrap().unwrap();
    let record = record_of(&keys, sku, 5).await;
    assert_eq!((mark(&record), marks(&record)), (Some(28), 1), "rewritten");
    flashsale_testkit::conformance::expire_until(l, sku, 28).await;
    assert_eq!(mark(&record_of(&keys, sku, 5).await), Some(0));
    numbers.push(buy_ok(l, sku, 5, "order-29", 30).await.order_no);
    let record = record_of(&keys, sku, 5).await;
    assert_eq!(mark(&record), Some(30));
    assert_eq!(flashsale_redis::codec::record_held(&record), Ok(30));

    // Rebuilt from the orders as the database has them: the same units in the mark.
    let mut orders = Vec::new();
    for no in &numbers {
        orders.push(l.order(no).await.unwrap().unwrap());
    }
    let counters: Counters = l.counters(sku).await.unwrap().unwrap();
    l.load(&sale, &counters, 2).await.unwrap();
    let at = CopyAt { sku, epoch: 2 };
    assert_eq!(t.ledger.restore_orders(at, &orders).await.unwrap(), 29);
    let record = record_of(&keys, sku, 5).await;
    assert_eq!((mark(&record), marks(&record)), (Some(30), 1));
    t.cleanup().await;
}

/// A copy loaded by a ledger of layout 1 (as a release before layout 2 loads it) is served by
/// a ledger that loads layout 2 as it is; the next load (a rebuild) gives it layout 2, with
/// the orders restored from the database.
#[tokio::test]
async fn a_copy_of_layout_1_is_served_as_it_is_until_its_next_load() {
    let old = TestLedger::new().await;
    let new = RedisLedger::connect(&shared_url(), &old.prefix)
        .await
        .unwrap()
        .with_records();
    let sale = live_sale(SaleMode::Direct, 10, 2);
    let sku = warm(old.ledger.as_ref(), &sale).await;
    let a = buy_ok(old.ledger.as_ref(), sku, 1, "a", 1).await;
    match buy(&new, sku, 1, "a", 1).await {
        PurchaseOutcome::Accepted { order, replayed } => assert!(replayed && order == a),
        other => panic!("{other:?}"),
    }
    let b = buy_ok(&new, sku, 1, "b", 1).await;
    assert_eq!(sizes(old.ledger.keys(), sku).await, [2, 2, 1, 0, 0]);
    assert_eq!(new.order(&b.order_no).await.unwrap(), Some(b.clone()));
    assert_eq!(new.accepted_count(sku).await.unwrap(), Some((1, 2)));

    // The rebuild: a new epoch, the database's orders restored into layout 2.
    let counters: Counters = new.counters(sku).await.unwrap().unwrap();
    new.load(&sale, &counters, 2).await.unwrap();
    assert_eq!(
        new.restore_orders(CopyAt { sku, epoch: 2 }, &[a.clone(), b.clone()])
            .await
            .unwrap(),
        2
    );
    new.open(sku, 2, SaleState::Live).await.unwrap();
    assert_eq!(sizes(old.ledger.keys(), sku).await, [0, 0, 0, 1, 2]);
    for o in [&a, &b] {
        assert_eq!(new.order(&o.order_no).await.unwrap().as_ref(), Some(o));
    }
    match buy(&new, sku, 1, "b", 1).await {
        PurchaseOutcome::Accepted { order, replayed } => assert!(replayed && order == b),
        other => panic!("{other:?}"),
    }
    let c = buy(&new, sku, 1, "c", 1).await;
    assert!(
        matches!(
            c,
            PurchaseOutcome::Rejected(flashsale_core::ErrorCode::LimitExceeded)
        ),
        "{c:?}"
    );
    assert_eq!(stock(&new, sku).await, (8, 0, 2, 2));
    assert_eq!(new.accepted_count(sku).await.unwrap(), Some((2, 2)));
    let mut keys = new.accepted_keys(sku, 10).await.unwrap().unwrap();
    keys.sort_by(|x, y| x.request_id.as_str().cmp(y.request_id.as_str()));
    let rids: Vec<&str> = keys.iter().map(|k| k.request_id.as_str()).collect();
    assert_eq!(rids, ["a", "b"]);
    assert_eq!(b.status, OrderStatus::Created);
    old.cleanup().await;
}
