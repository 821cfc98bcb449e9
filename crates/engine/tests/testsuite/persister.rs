//! The persister on each system of record: purchases through the Redis ledger write the
//! sale's stream, the persister applies it, and the database's rows say every accepted
//! purchase is stored exactly once, with the hot copy's counters; a stream batch delivered
//! again changes nothing; a restart midway (entries applied and never acknowledged, entries
//! read and never applied) loses nothing and duplicates nothing.

use flashsale_core::SaleMode;
use flashsale_redis::codec::parse_entries;
use flashsale_testkit::conformance::live_sale;
use flashsale_testkit::wait;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::AsyncCommands;

use crate::common::{backends, rig, Rig, Sor, LIMIT};

backends!(
    every_accepted_purchase_is_stored_exactly_once,
    a_stream_batch_delivered_again_changes_nothing,
    a_restart_midway_loses_nothing_and_duplicates_nothing,
);

/// Buyers race the persister: 80 users for 60 units, in calls of 1 to 7 requests.
async fn every_accepted_purchase_is_stored_exactly_once(sor: Sor) {
    let rig = rig(sor, live_sale(SaleMode::Direct, 60, 1)).await;
    let persister = rig.start("p1");
    let mut accepted = rig.buy(1..=20, 1).await;
    accepted.extend(rig.buy(21..=80, 7).await);
    assert_eq!(accepted.len(), 60, "every unit sold, none twice");
    rig.drain().await;
    persister.stop().await;
    rig.assert_stored(&accepted).await;
    let events = rig.store.events(rig.sku).await.unwrap();
    assert_eq!(events.len(), 60, "one event per accepted purchase");
    rig.cleanup().await;
}

/// The sale's stream as it is now: each entry's fields.
async fn stream_entries(rig: &mut Rig) -> Vec<Vec<(String, String)>> {
    let key = rig.ledger.keys().events(rig.sku);
    let reply: StreamRangeReply = rig.conn.xrange_all(&key).await.unwrap();
    reply
        .ids
        .iter()
        .map(|entry| {
            let mut fields: Vec<(String, String)> = entry
                .map
                .iter()
                .map(|(k, v)| (k.clone(), redis::from_redis_value(v).unwrap()))
                .collect();
            fields.sort();
            fields
        })
        .collect()
}

/// Some(()) once the group has been handed every entry up to `id` and has acknowledged them
/// all.
async fn acknowledged_up_to(rig: &Rig, id: &str) -> Option<()> {
    let key = rig.ledger.keys().events(rig.sku);
    let mut conn = rig.conn.clone();
    let reply: StreamInfoGroupsReply = conn.xinfo_groups(&key).await.unwrap();
    let group = reply
        .groups
        .iter()
        .find(|g| g.name == flashsale_redis::GROUP)?;
    (group.last_delivered_id == id && group.pending == 0).then_some(())
}

/// The same entries again: written into the stream a second time (a writer's retry), and
/// handed to the store once more (a redelivery after a lost acknowledgement).
async fn a_stream_batch_delivered_again_changes_nothing(sor: Sor) {
    let mut rig = rig(sor, live_sale(SaleMode::Direct, 100, 1)).await;
    let mut accepted = rig.buy(1..=30, 4).await;
    let batch = stream_entries(&mut rig).await;
    assert!(batch.len() > 1);
    let key = rig.ledger.keys().events(rig.sku);
    let raw: redis::Value = rig.conn.xrange_all(&key).await.unwrap();
    let events: Vec<_> = parse_entries(rig.sku.into(), &raw)
        .unwrap()
        .into_iter()
        .filter_map(|(_, e)| e.unwrap().event().cloned())
        .collect();
    assert_eq!(events.len(), 30);
    let persister = rig.start("p1");
    rig.drain().await;
    let before = (
        rig.store.orders(rig.sku).await.unwrap(),
        rig.store.events(rig.sku).await.unwrap(),
        rig.stored().await.counters,
    );

    let report = rig.store.apply_events(rig.sku, &events).await.unwrap();
    assert_eq!((report.applied, report.duplicates), (0, 30));
    let mut last = String::new();
    for fields in &batch {
        last = rig.xadd(fields).await;
    }
    wait::until("the batch read again and acknowledged", LIMIT, || {
        acknowledged_up_to(&rig, &last)
    })
    .await;
    let after = (
        rig.store.orders(rig.sku).await.unwrap(),
        rig.store.events(rig.sku).await.unwrap(),
        rig.stored().await.counters,
    );
    assert_eq!(before, after, "a batch applied twice changed the database");
    rig.assert_not_parked().await;

    // The sale goes on from there.
    accepted.extend(rig.buy(31..=40, 4).await);
    rig.drain().await;
    persister.stop().await;
    rig.assert_stored(&accepted).await;
    rig.cleanup().await;
}

/// A persister stops midway; another instance's read of the next entries was applied but
/// never acknowledged (a crash between commit and XACK), the entries after them were read and
/// never applied (a crash before commit); more purchases come; a new instance takes over.
async fn a_restart_midway_loses_nothing_and_duplicates_nothing(sor: Sor) {
    let rig = rig(sor, live_sale(SaleMode::Direct, 100, 1)).await;
    let first = rig.start("p1");
    let mut accepted = rig.buy(1..=40, 3).await;
    rig.drain().await;
    first.stop().await;

    accepted.extend(rig.buy(41..=80, 3).await);
    let crashed = rig.reader("crashed").await;
    let read = crashed.read_new(rig.sku, 6, 0).await.unwrap();
    let events: Vec<_> = (read.into_iter())
        .filter_map(|(_, e)| e.unwrap().event().cloned())
        .collect();
    assert!(events.len() >= 6, "six entries of up to three events");
    let half = events.len() / 2;
    let report = rig
        .store
        .apply_events(rig.sku, &events[..half])
        .await
        .unwrap();
    assert_eq!(report.applied, half);
    assert_eq!(crashed.pending_summary(rig.sku).await.unwrap().count, 6);

    accepted.extend(rig.buy(81..=130, 3).await);
    assert_eq!(accepted.len(), 100);
    let second = rig.start("p2");
    rig.drain().await;
    let probe = rig.reader("probe").await;
    wait::until("every entry acknowledged", LIMIT, || async {
        (probe.pending_summary(rig.sku).await.unwrap().count == 0).then_some(())
    })
    .await;
    second.stop().await;
    rig.assert_stored(&accepted).await;
    let events = rig.store.events(rig.sku).await.unwrap();
    assert_eq!(events.len(), 100, "each event stored exactly once");
    assert_eq!(rig.stored().await.counters.seq, 100);
    assert_eq!(rig.hot_seq().await, 100);
    rig.cleanup().await;
}
