//! The stream's entry formats, as readers see them: one purchase call's deductions in one
//! batch entry, expanded into one event per change, and one-event entries (resolutions, and
//! every deduction written before batch entries) read as before, in one stream. A bucketed
//! sale's entries are of the bucketed format version, which a reader from before buckets
//! (emulated: a reader of version 1) waits on, while it still reads a sale of one bucket's.

use std::collections::BTreeSet;

use crate::common::{raw, TestLedger};
use flashsale_core::buckets::home_bucket;
use flashsale_core::{
    EventKind, HotCopies, HotLedger, HotPurchases, OrderNo, PurchaseOutcome, SaleMode, SkuId,
    UserId,
};
use flashsale_redis::codec::{parse_entries, parse_entries_as};
use flashsale_redis::{CopyTag, EntryError, Item, StreamReader, FORMAT_BUCKETED, FORMAT_ONE_COPY};
use flashsale_testkit::bucketed::{bucketed_sale, buyers, Spread};
use flashsale_testkit::conformance::{buy_ok, expire_until, live_sale, req, warm};
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
    let events = crate::common::events_in_seq(&entries, &[1, 2, 3, 4]);
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

/// The whole stream of `copy`, as XRANGE answers it.
async fn whole_stream(t: &TestLedger, copy: CopyTag) -> redis::Value {
    redis::cmd("XRANGE")
        .arg(t.ledger.keys().events(copy))
        .arg("-")
        .arg("+")
        .query_async(&mut raw().await)
        .await
        .unwrap()
}

/// Every kind of entry a sale writes in reserve mode: four holds, one paid, one cancelled,
/// two expired, and three more purchases homed at `others` (for a bucketed sale, stock moved
/// by transfers, since the four holds are all homed at the last bucket).
async fn every_kind_of_entry(t: &TestLedger, sku: SkuId, homed: &[u64], others: &[u64]) {
    let ledger = t.ledger.as_ref();
    let mut holds = Vec::new();
    for &user in homed {
        holds.push(buy_ok(ledger, sku, user, "a", 1).await);
    }
    let paid = ledger.pay(&holds[0].order_no, UserId(homed[0])).await;
    assert!(matches!(paid, Ok(Ok(_))), "{paid:?}");
    let cancelled = ledger.cancel(&holds[1].order_no, UserId(homed[1])).await;
    assert!(matches!(cancelled, Ok(Ok(_))), "{cancelled:?}");
    expire_until(ledger, sku, 2).await;
    for &user in others {
        buy_ok(ledger, sku, user, "b", 1).await;
    }
}

/// What a reader makes of `stream` of `copy`: the kinds this binary reads, and how many of its
/// entries a reader of version 1 reads, waits on (newer) or takes for corrupt.
fn read_both_ways(copy: CopyTag, stream: &redis::Value) -> (BTreeSet<String>, [usize; 3]) {
    let mut kinds = BTreeSet::new();
    for (id, item) in parse_entries(copy, stream).unwrap() {
        match item {
            Ok(Item::Event(e)) => kinds.insert(e.kind.as_str().to_owned()),
            Ok(Item::Transfer(t)) => kinds.insert(format!("transfer_{}", t.side.as_str())),
            Err(why) => panic!("entry {id} of {copy}: {why}"),
        };
    }
    let mut old = [0; 3];
    for (_, item) in parse_entries_as(copy, stream, FORMAT_ONE_COPY).unwrap() {
        match item {
            Ok(_) => old[0] += 1,
            Err(EntryError::NewerFormat(v)) if v == FORMAT_BUCKETED => old[1] += 1,
            Err(_) => old[2] += 1,
        }
    }
    (kinds, old)
}

/// Every entry of every bucket of a bucketed sale (purchases, payments, cancellations,
/// expiries and both sides of transfers) is of the bucketed version: this binary reads them
/// all, and a reader of version 1 waits on each one instead of misreading it (before buckets,
/// it fenced bucket 0's events, whose epoch is E·n, and dead-lettered transfer sides). A sale
/// of one bucket still writes version 1, which that reader reads, so such a sale rolls back.
#[tokio::test]
async fn a_bucketed_sales_entries_are_ones_an_older_reader_waits_on() {
    let t = TestLedger::with_buckets().await;
    let sku = warm(
        t.ledger.as_ref(),
        &bucketed_sale(SaleMode::Reserve, 6, 1, 3),
    )
    .await;
    let homed = buyers(3, 4, Spread::OneHome);
    let others: Vec<u64> = (buyers(3, 60, Spread::Uniform).into_iter())
        .filter(|&u| home_bucket(UserId(u), 3) != 2)
        .take(3)
        .collect();
    every_kind_of_entry(&t, sku, &homed, &others).await;
    let layout = t.ledger.layout(sku).await.unwrap();
    let mut kinds = BTreeSet::new();
    for bucket in 0..3 {
        let copy = layout.copy(bucket);
        let stream = whole_stream(&t, copy).await;
        let (read, [old_read, old_waits, old_corrupt]) = read_both_ways(copy, &stream);
        assert!(old_waits > 0, "bucket {bucket} wrote entries");
        assert_eq!(
            (old_read, old_corrupt),
            (0, 0),
            "bucket {bucket}: an old reader"
        );
        kinds.extend(read);
    }
    let all = [
        "cancelled",
        "deducted",
        "expired",
        "paid",
        "transfer_in",
        "transfer_out",
    ];
    assert_eq!(kinds, all.iter().map(|k| k.to_string()).collect());

    let one = t.ledger.as_ref();
    let sku = warm(one, &live_sale(SaleMode::Reserve, 6, 1)).await;
    let users: Vec<u64> = (1..=7).map(|u| u + sku.0 * 10).collect();
    every_kind_of_entry(&t, sku, &users[..4], &users[4..]).await;
    let stream = whole_stream(&t, CopyTag::from(sku)).await;
    let (read, [old_read, old_waits, old_corrupt]) = read_both_ways(sku.into(), &stream);
    assert_eq!(read.len(), 4, "{read:?}");
    assert_eq!(
        (old_waits, old_corrupt),
        (0, 0),
        "a sale of one bucket reads"
    );
    assert!(old_read >= 9, "{old_read} events");
    t.cleanup().await;
}
