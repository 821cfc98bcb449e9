//! The stream API of the persister: group, reads, pending, claim, ack, trim, lease.

use std::time::{Duration, Instant};

use crate::common::{raw, TestLedger};
use flashsale_core::{EventKind, HotLedger, SaleMode, SkuId, UserId};
use flashsale_redis::StreamReader;
use flashsale_testkit::conformance::{buy_ok, live_sale, warm};
use flashsale_testkit::redis_server::shared_url;
use flashsale_testkit::wait;

async fn reader(t: &TestLedger, name: &str) -> StreamReader {
    StreamReader::connect(&shared_url(), &t.prefix, name)
        .await
        .expect("reader")
}

/// A sale with `n` accepted purchases (reserve mode, so pay and cancel add events).
async fn sale_with_orders(t: &TestLedger, n: u64) -> SkuId {
    let l = t.ledger.as_ref();
    let sku = warm(l, &live_sale(SaleMode::Reserve, 100, 1)).await;
    for user in 1..=n {
        buy_ok(l, sku, user, "r", 1).await;
    }
    sku
}

#[tokio::test]
async fn events_are_read_in_seq_order_and_acknowledged() {
    let t = TestLedger::new().await;
    let sku = sale_with_orders(&t, 3).await;
    let order = t
        .ledger
        .order(&flashsale_core::OrderNo::new(sku, 1, 1))
        .await;
    let order = order.unwrap().unwrap();
    t.ledger
        .pay(&order.order_no, UserId(1))
        .await
        .unwrap()
        .unwrap();
    let r = reader(&t, "p1").await;
    r.ensure_group(sku).await.unwrap();
    r.ensure_group(sku).await.unwrap();
    let entries = r.read_new(sku, 10, 0).await.unwrap();
    let events = crate::common::events_in_seq(&entries, &[1, 2, 3, 4]);
    assert_eq!(events[0].order_no, order.order_no);
    assert_eq!(events[0].deadline_ms, order.deadline_ms);
    assert_eq!(events[3].kind, EventKind::Paid);
    assert_eq!(r.backlog(sku).await.unwrap(), 4);

    // Not acknowledged: still ours after a "restart".
    let again = reader(&t, "p1")
        .await
        .read_own_pending(sku, 10)
        .await
        .unwrap();
    assert_eq!(again.len(), 4);
    assert_eq!(r.pending_summary(sku).await.unwrap().count, 4);
    let ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(r.delivery_count(sku, &ids[0]).await.unwrap(), Some(2));
    assert_eq!(r.ack(sku, &ids).await.unwrap(), 4);
    let summary = r.pending_summary(sku).await.unwrap();
    assert_eq!((summary.count, summary.min_id), (0, None));
    assert_eq!(r.delivery_count(sku, &ids[0]).await.unwrap(), None);
    assert!(r.read_own_pending(sku, 10).await.unwrap().is_empty());

    assert_eq!(r.trim_below(sku, &ids[3]).await.unwrap(), 3);
    assert_eq!(r.backlog(sku).await.unwrap(), 1);
    assert!(r.trim_below(sku, "nonsense").await.is_err());
    t.cleanup().await;
}

#[tokio::test]
async fn a_dead_consumers_entries_are_claimed() {
    let t = TestLedger::new().await;
    let sku = sale_with_orders(&t, 2).await;
    let (dead, alive) = (reader(&t, "dead").await, reader(&t, "alive").await);
    assert_eq!(dead.read_new(sku, 10, 0).await.unwrap().len(), 2);
    let none = alive.autoclaim(sku, 60_000, 10).await.unwrap();
    assert!(none.entries.is_empty(), "not idle long enough");
    let claimed = alive.autoclaim(sku, 0, 10).await.unwrap();
    assert_eq!(claimed.entries.len(), 2);
    assert_eq!(claimed.next, "0-0");
    let id = &claimed.entries[0].0;
    assert_eq!(alive.delivery_count(sku, id).await.unwrap(), Some(2));
    let summary = alive.pending_summary(sku).await.unwrap();
    assert_eq!(summary.consumers, vec![("alive".to_string(), 2)]);
    t.cleanup().await;
}

#[tokio::test]
async fn malformed_and_deleted_entries_are_errors_not_panics() {
    let t = TestLedger::new().await;
    let sku = sale_with_orders(&t, 1).await;
    let mut conn = raw().await;
    let key = t.ledger.keys().events(sku);
    let _: String = redis::cmd("XADD")
        .arg(&key)
        .arg(&["*", "sku_id", &sku.0.to_string(), "seq", "x"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let r = reader(&t, "p").await;
    let entries = r.read_new(sku, 10, 0).await.unwrap();
    assert!(entries[0].1.is_ok());
    let err = entries[1].1.as_ref().unwrap_err().to_string();
    assert!(err.contains("seq"), "{err}");
    let _: i64 = redis::cmd("XDEL")
        .arg(&key)
        .arg(&entries[0].0)
        .query_async(&mut conn)
        .await
        .unwrap();
    let pending = r.read_own_pending(sku, 10).await.unwrap();
    assert_eq!(pending.len(), 2);
    assert!(pending[0]
        .1
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("deleted"));
    t.cleanup().await;
}

#[tokio::test]
async fn a_blocking_read_waits_for_new_events_without_stalling_purchases() {
    let t = TestLedger::new().await;
    let sku = sale_with_orders(&t, 0).await;
    let r = reader(&t, "p").await;
    r.ensure_group(sku).await.unwrap();
    let started = Instant::now();
    assert!(r.read_new(sku, 10, 100).await.unwrap().is_empty());
    assert!(started.elapsed() >= Duration::from_millis(90));

    let blocked = tokio::spawn(async move { r.read_new(sku, 10, 3_000).await.map(|e| e.len()) });
    let started = Instant::now();
    buy_ok(t.ledger.as_ref(), sku, 1, "r", 1).await;
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "purchases are not blocked"
    );
    assert_eq!(blocked.await.unwrap().unwrap(), 1);
    t.cleanup().await;
}

#[tokio::test]
async fn the_lease_has_one_owner_at_a_time() {
    let t = TestLedger::new().await;
    let sku = SkuId(5);
    let r = reader(&t, "p").await;
    assert!(r.acquire_lease(sku.into(), "a", 60_000).await.unwrap());
    assert!(!r.acquire_lease(sku.into(), "b", 60_000).await.unwrap());
    assert!(
        r.acquire_lease(sku.into(), "a", 60_000).await.unwrap(),
        "renewal"
    );
    assert!(!r.release_lease(sku.into(), "b").await.unwrap());
    assert!(r.release_lease(sku.into(), "a").await.unwrap());
    assert!(r.acquire_lease(sku.into(), "b", 100).await.unwrap());
    wait::until("the lease to lapse", Duration::from_secs(5), || async {
        r.acquire_lease(sku.into(), "a", 60_000)
            .await
            .unwrap()
            .then_some(())
    })
    .await;
    assert!(!r.acquire_lease(sku.into(), "b", 100).await.unwrap());
    t.cleanup().await;
}
