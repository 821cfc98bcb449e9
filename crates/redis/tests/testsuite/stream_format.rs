//! The stream's two entry formats, as readers see them: one purchase call's deductions in one
//! batch entry, expanded into one event per change, and one-event entries (resolutions, and
//! every deduction written before batch entries) read as before, in one stream.

use crate::common::{raw, TestLedger};
use flashsale_core::{EventKind, HotCopies, HotLedger, OrderNo, PurchaseOutcome, SaleMode};
use flashsale_redis::StreamReader;
use flashsale_testkit::conformance::{live_sale, req, warm};
use flashsale_testkit::redis_server::shared_url;

#[tokio::test]
async fn a_purchase_call_is_one_entry_and_old_entries_still_read() {
    let t = TestLedger::new().await;
    let sku = warm(t.ledger.as_ref(), &live_sale(SaleMode::Reserve, 100, 1)).await;
    // Three accepted and one refused (the same user again, over its limit) in one call.
    let reqs = [
        req(sku, 7, "a", 1),
        req(sku, 8, "b-1", 1),
        req(sku, 7, "again", 1),
        req(sku, 9, "c_2", 1),
    ];
    let out = t.ledger.purchase_batch(sku, &reqs).await.unwrap();
    let accepted: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            PurchaseOutcome::Accepted { order, .. } => Some(order.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(accepted.len(), 3);

    // What the purchase script wrote before batch entries: one entry per event.
    let key = t.ledger.keys().events(sku);
    let mut conn = raw().await;
    let s = sku.0.to_string();
    let old_no = OrderNo::new(sku, 1, 4).to_string();
    let old = [
        ("sku_id", s.as_str()),
        ("epoch", "1"),
        ("seq", "4"),
        ("kind", "deducted"),
        ("order_no", old_no.as_str()),
        ("request_id", "old"),
        ("user_id", "10"),
        ("quantity", "1"),
        ("at_ms", "5"),
        ("deadline_ms", "6"),
    ];
    let mut cmd = redis::cmd("XADD");
    cmd.arg(&key).arg("*");
    for (k, v) in old {
        cmd.arg(k).arg(v);
    }
    let _: String = cmd.query_async(&mut conn).await.unwrap();
    let len: u64 = redis::cmd("XLEN")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 2, "one entry for the call, one old entry");

    let r = StreamReader::connect(&shared_url(), &t.prefix, "p")
        .await
        .unwrap();
    r.ensure_group(sku).await.unwrap();
    let entries = r.read_new(sku, 10, 0).await.unwrap();
    assert_eq!(entries.len(), 4);
    assert!(entries[..3].iter().all(|(id, _)| *id == entries[0].0));
    assert_ne!(entries[3].0, entries[0].0);
    let events: Vec<_> = entries
        .iter()
        .filter_map(|(_, e)| e.clone().unwrap().event().cloned())
        .collect();
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    for (e, order) in events.iter().zip(&accepted) {
        assert_eq!(e.order_no, order.order_no);
        assert_eq!((e.user_id, e.quantity), (order.user_id, order.quantity));
        assert_eq!(e.request_id, order.request_id);
        assert_eq!(
            (e.at_ms, e.deadline_ms),
            (order.created_at_ms, order.deadline_ms)
        );
        assert_eq!((e.kind, e.epoch, e.sku_id), (EventKind::Deducted, 1, sku));
    }
    assert_eq!(events[3].order_no.to_string(), old_no);
    assert_eq!((events[3].at_ms, events[3].deadline_ms), (5, 6));
    // Acknowledging an entry once settles all its events.
    let ids = [entries[0].0.clone(), entries[3].0.clone()];
    assert_eq!(r.ack(sku, &ids).await.unwrap(), 2);
    assert_eq!(r.pending_summary(sku).await.unwrap().count, 0);

    // The reconciler's snapshot reads the same events.
    let snap = t.ledger.hot_snapshot(sku).await.unwrap().unwrap();
    assert_eq!(snap.events.len(), 4);
    assert!(snap.bad_entries.is_empty());
    assert_eq!(t.ledger.counters(sku).await.unwrap().unwrap().seq, 3);
    t.cleanup().await;
}
