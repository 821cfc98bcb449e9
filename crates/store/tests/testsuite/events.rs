//! The order-event relay's side of every backend (MariaDB, PostgreSQL, SQLite): the ordered
//! log by stream, heads from the guarded counters, positions moved only by compare and set,
//! the sink lease (taken, renewed, refused while held, taken over once lapsed), failures and
//! pause.

use flashsale_core::events::{EventLog, StreamKey};
use flashsale_core::{
    OrderStore, PurchaseRequest, RequestId, Sale, SaleBook, SaleMode, SaleState, SkuId, UserId,
};

const SKU: SkuId = SkuId(77);
const NOW: i64 = 1_700_000_000_000;

backends!(
    the_log_reads_a_stream_in_seq_order_after_a_position,
    positions_move_only_from_what_was_read,
    one_holder_has_a_sink_lease_until_it_lapses,
    failures_count_until_a_success_and_pause_holds,
);

/// A live reserve sale with `n` orders bought and the first paid, applied.
async fn stored<S: OrderStore + EventLog>(store: &S, n: u64) {
    let sale = Sale {
        sku_id: SKU,
        name: "events".into(),
        total_stock: 100,
        per_user_limit: 1,
        mode: SaleMode::Reserve,
        payment_timeout_ms: 60_000,
        starts_at_ms: 0,
        ends_at_ms: NOW * 2,
        state: SaleState::Live,
        buckets: 1,
        admission: Default::default(),
    };
    store.create_sale(&sale).await.unwrap();
    assert_eq!(store.take_epoch(SKU, 0).await.unwrap(), Some(1));
    let mut book = SaleBook::new(sale.clone(), sale.fresh_counters(), 1);
    let mut events = Vec::new();
    for u in 1..=n {
        let r = PurchaseRequest {
            sku_id: SKU,
            user_id: UserId(u),
            request_id: RequestId::parse(&format!("r{u}")).unwrap(),
            quantity: 1,
        };
        events.extend(book.purchase(&r, NOW).1);
    }
    let first = events[0].order_no;
    events.extend(book.pay(&first, UserId(1), NOW).unwrap().1);
    store.apply_events(SKU, &events).await.unwrap();
}

const STREAM: StreamKey = StreamKey {
    sku: SKU,
    bucket: 0,
};

async fn the_log_reads_a_stream_in_seq_order_after_a_position<S: OrderStore + EventLog>(store: &S) {
    assert!(store.event_streams().await.unwrap().is_empty());
    stored(store, 5).await;
    let heads = store.event_streams().await.unwrap();
    assert_eq!(heads.len(), 1);
    assert_eq!((heads[0].stream, heads[0].head), (STREAM, 6));
    let all = store.logged_events(STREAM, 0, 100).await.unwrap();
    let seqs: Vec<u64> = all.iter().map(|l| l.event.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6]);
    assert!(all.iter().all(|l| !l.rejected && l.bucket == 0));
    let after = store.logged_events(STREAM, 4, 1).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].event.seq, 5);
    assert!(store.logged_events(STREAM, 6, 10).await.unwrap().is_empty());
}

async fn positions_move_only_from_what_was_read<S: OrderStore + EventLog>(store: &S) {
    stored(store, 5).await;
    assert!(store.positions("nats").await.unwrap().is_empty());
    assert!(store
        .advance_position("nats", STREAM, 0, 3, NOW)
        .await
        .unwrap());
    // A relay that read 0 too (a lapsed lease) cannot move it back.
    assert!(!store
        .advance_position("nats", STREAM, 0, 2, NOW)
        .await
        .unwrap());
    assert!(store
        .advance_position("nats", STREAM, 3, 6, NOW)
        .await
        .unwrap());
    assert_eq!(store.positions("nats").await.unwrap(), vec![(STREAM, 6)]);
    // Per sink: the webhook's position is its own.
    assert!(store.positions("webhook").await.unwrap().is_empty());
    // An operator sets it back: the next compare and set starts from there.
    store.set_position("nats", STREAM, 2, NOW).await.unwrap();
    assert!(!store
        .advance_position("nats", STREAM, 6, 6, NOW)
        .await
        .unwrap());
    assert_eq!(store.positions("nats").await.unwrap(), vec![(STREAM, 2)]);
}

async fn one_holder_has_a_sink_lease_until_it_lapses<S: OrderStore + EventLog>(store: &S) {
    assert!(store
        .take_sink_lease("nats", "a", NOW, 1_000)
        .await
        .unwrap());
    assert!(!store
        .take_sink_lease("nats", "b", NOW + 500, 1_000)
        .await
        .unwrap());
    assert!(
        store
            .take_sink_lease("nats", "a", NOW + 900, 1_000)
            .await
            .unwrap(),
        "renewed"
    );
    assert!(!store
        .take_sink_lease("nats", "b", NOW + 1_500, 1_000)
        .await
        .unwrap());
    assert!(
        store
            .take_sink_lease("nats", "b", NOW + 2_000, 1_000)
            .await
            .unwrap(),
        "lapsed"
    );
    // Per sink: another sink's lease is free.
    assert!(store
        .take_sink_lease("webhook", "a", NOW, 1_000)
        .await
        .unwrap());
    store.release_sink_lease("nats", "a").await.unwrap();
    assert!(
        !store
            .take_sink_lease("nats", "a", NOW + 2_100, 1_000)
            .await
            .unwrap(),
        "not a's to give up"
    );
    store.release_sink_lease("nats", "b").await.unwrap();
    assert!(
        store
            .take_sink_lease("nats", "a", NOW + 2_100, 1_000)
            .await
            .unwrap(),
        "given up"
    );
    let rows = store.sinks().await.unwrap();
    let nats = rows.iter().find(|r| r.sink == "nats").unwrap();
    assert_eq!(
        (nats.holder.as_str(), nats.lease_until_ms),
        ("a", NOW + 3_100)
    );
}

async fn failures_count_until_a_success_and_pause_holds<S: OrderStore + EventLog>(store: &S) {
    assert_eq!(
        store
            .record_sink_outcome("webhook", Some("500"), NOW)
            .await
            .unwrap(),
        1
    );
    let long = "é".repeat(2_000);
    assert_eq!(
        store
            .record_sink_outcome("webhook", Some(&long), NOW + 1)
            .await
            .unwrap(),
        2
    );
    let row = store.sinks().await.unwrap().remove(0);
    assert_eq!(row.failures, 2);
    assert!(
        row.last_error.unwrap().len() <= 1_000,
        "clipped on a char boundary"
    );
    assert_eq!(
        store
            .record_sink_outcome("webhook", None, NOW + 2)
            .await
            .unwrap(),
        0
    );
    let row = store.sinks().await.unwrap().remove(0);
    assert_eq!(row.failures, 0);
    assert!(row.last_error.is_some(), "kept for the operator");
    store.set_sink_paused("webhook", true).await.unwrap();
    assert!(store.sinks().await.unwrap()[0].paused);
    store.set_sink_paused("webhook", false).await.unwrap();
    assert!(!store.sinks().await.unwrap()[0].paused);
}
