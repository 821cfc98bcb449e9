//! The order-event relay's side of every backend (MariaDB, PostgreSQL, SQLite): the ordered
//! log by stream, heads from the guarded counters, positions moved only by compare and set,
//! the sink lease (taken, renewed, refused while held, taken over once lapsed), failures and
//! pause; a sale's notices (sold out, orders reported lost) as one more stream, each stored
//! once per transition.

use flashsale_core::events::{CloudEvent, EventLog, NoticeKind, StreamKey};
use flashsale_core::{Event, OrderStore, ReconcileRun, SaleBook, SaleMode, SkuId, UserId};

use crate::common::{live_sale, request, NOW};

const SKU: SkuId = SkuId(77);

backends!(
    the_log_reads_a_stream_in_seq_order_after_a_position,
    positions_move_only_from_what_was_read,
    one_holder_has_a_sink_lease_until_it_lapses,
    failures_count_until_a_success_and_pause_holds,
    the_batch_that_sells_the_last_unit_stores_one_sold_out_notice,
    a_loss_reported_twice_is_one_notice_with_its_own_position,
);

/// A live reserve sale with `n` orders bought and the first paid, applied.
async fn stored<S: OrderStore + EventLog>(store: &S, n: u64) {
    let mut book = live_book(store, 100, SaleMode::Reserve).await;
    let mut events = Vec::new();
    for u in 1..=n {
        events.extend(book.purchase(&request(SKU, u, &format!("r{u}"), 1), NOW).1);
    }
    let first = events[0].order_no;
    events.extend(book.pay(&first, UserId(1), NOW).unwrap().1);
    store.apply_events(SKU, &events).await.unwrap();
}

const STREAM: StreamKey = StreamKey {
    sku: SKU,
    bucket: 0,
};

/// Moves the nats sink's position on `stream` from `from` to `to` (compare and set): whether it
/// moved.
async fn advance<S: EventLog>(store: &S, stream: StreamKey, from: u64, to: u64) -> bool {
    store
        .advance_position("nats", stream, from, to, NOW)
        .await
        .unwrap()
}

/// `holder` takes (or renews) `sink`'s lease for a second at `now_ms`: whether it holds it.
async fn lease<S: EventLog>(store: &S, sink: &str, holder: &str, now_ms: i64) -> bool {
    store
        .take_sink_lease(sink, holder, now_ms, 1_000)
        .await
        .unwrap()
}

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
    assert!(advance(store, STREAM, 0, 3).await);
    // A relay that read 0 too (a lapsed lease) cannot move it back.
    assert!(!advance(store, STREAM, 0, 2).await);
    assert!(advance(store, STREAM, 3, 6).await);
    assert_eq!(store.positions("nats").await.unwrap(), vec![(STREAM, 6)]);
    // Per sink: the webhook's position is its own.
    assert!(store.positions("webhook").await.unwrap().is_empty());
    // An operator sets it back: the next compare and set starts from there.
    store.set_position("nats", STREAM, 2, NOW).await.unwrap();
    assert!(!advance(store, STREAM, 6, 6).await);
    assert_eq!(store.positions("nats").await.unwrap(), vec![(STREAM, 2)]);
}

async fn one_holder_has_a_sink_lease_until_it_lapses<S: OrderStore + EventLog>(store: &S) {
    assert!(lease(store, "nats", "a", NOW).await);
    assert!(!lease(store, "nats", "b", NOW + 500).await);
    assert!(lease(store, "nats", "a", NOW + 900).await, "renewed");
    assert!(!lease(store, "nats", "b", NOW + 1_500).await);
    assert!(lease(store, "nats", "b", NOW + 2_000).await, "lapsed");
    // Per sink: another sink's lease is free.
    assert!(lease(store, "webhook", "a", NOW).await);
    store.release_sink_lease("nats", "a").await.unwrap();
    assert!(
        !lease(store, "nats", "a", NOW + 2_100).await,
        "not a's to give up"
    );
    store.release_sink_lease("nats", "b").await.unwrap();
    assert!(lease(store, "nats", "a", NOW + 2_100).await, "given up");
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

/// A live sale of `total` units in `mode`, its epoch taken, and its book.
async fn live_book<S: OrderStore>(store: &S, total: u64, mode: SaleMode) -> SaleBook {
    let sale = live_sale(SKU, total, 1, mode);
    store.create_sale(&sale).await.unwrap();
    assert_eq!(store.take_epoch(SKU, 0).await.unwrap(), Some(1));
    SaleBook::new(sale.clone(), sale.fresh_counters(), 1)
}

fn buy(book: &mut SaleBook, user: u64) -> Vec<Event> {
    let r = request(SKU, user, &format!("r{user}"), 1);
    book.purchase(&r, NOW + user as i64).1.into_iter().collect()
}

async fn notices_of<S: EventLog>(store: &S) -> Vec<CloudEvent> {
    let notices = store.logged_notices(SKU, 0, 100).await.unwrap();
    notices.iter().map(CloudEvent::of_notice).collect()
}

async fn the_batch_that_sells_the_last_unit_stores_one_sold_out_notice<S: OrderStore + EventLog>(
    store: &S,
) {
    let mut book = live_book(store, 3, SaleMode::Reserve).await;
    let mut holds = Vec::new();
    for u in 1..=3 {
        holds.extend(buy(&mut book, u));
    }
    store.apply_events(SKU, &holds).await.unwrap();
    // Nothing available, but held units may come back: not sold out.
    assert!(notices_of(store).await.is_empty());
    let mut paid = Vec::new();
    for (u, e) in (1..=2).zip(&holds) {
        paid.extend(book.pay(&e.order_no, UserId(u), NOW + 10).unwrap().1);
    }
    store.apply_events(SKU, &paid).await.unwrap();
    assert!(notices_of(store).await.is_empty());
    let last: Vec<Event> = book
        .pay(&holds[2].order_no, UserId(3), NOW + 20)
        .unwrap()
        .1
        .into_iter()
        .collect();
    store.apply_events(SKU, &last).await.unwrap();
    // A redelivery of the batch changes nothing.
    store.apply_events(SKU, &last).await.unwrap();
    let notices = notices_of(store).await;
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].id, format!("sale-{}.sold_out.3", SKU.0));
    assert_eq!(notices[0].suffix(), "sale.sold_out");
    assert_eq!(notices[0].data.at_ms(), NOW + 20);
    let heads = store.event_streams().await.unwrap();
    let notice_head = heads.iter().find(|h| h.stream.is_notices()).unwrap();
    assert_eq!(
        (notice_head.stream, notice_head.head),
        (StreamKey::notices(SKU), 1)
    );
}

fn run(id_hint: &str, lost: &[&str]) -> ReconcileRun {
    ReconcileRun {
        id: 0,
        sku_id: SKU,
        at_ms: NOW,
        trigger: id_hint.into(),
        repair: false,
        ok: false,
        violations: 0,
        repairs: Vec::new(),
        lost_orders: lost.iter().map(|s| s.to_string()).collect(),
        lost_resolutions: Vec::new(),
        report: "{}".into(),
    }
}

async fn a_loss_reported_twice_is_one_notice_with_its_own_position<S: OrderStore + EventLog>(
    store: &S,
) {
    let mut book = live_book(store, 10, SaleMode::Direct).await;
    store.apply_events(SKU, &buy(&mut book, 1)).await.unwrap();
    let a = format!("{}-1-90", SKU.0);
    let b = format!("{}-1-91", SKU.0);
    let first = store
        .record_reconcile_run(&run("worker", &[&a]))
        .await
        .unwrap();
    store
        .record_reconcile_run(&run("worker", &[&a, &b]))
        .await
        .unwrap();
    let notices = store.logged_notices(SKU, 0, 100).await.unwrap();
    let seen: Vec<(u64, NoticeKind, &str)> = notices
        .iter()
        .map(|n| (n.seq, n.kind, n.order_no.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, NoticeKind::Lost, a.as_str()),
            (2, NoticeKind::Lost, b.as_str())
        ]
    );
    assert_eq!(notices[0].run_id, first, "the run that first reported it");
    let lost = CloudEvent::of_notice(&notices[0]);
    assert_eq!(
        (lost.id.as_str(), lost.suffix()),
        (format!("{a}.lost").as_str(), "order.lost")
    );
    assert_eq!(store.logged_notices(SKU, 1, 100).await.unwrap().len(), 1);
    // The notice stream's position is per sink, beside the order stream's.
    let notices_stream = StreamKey::notices(SKU);
    assert!(advance(store, notices_stream, 0, 1).await);
    assert!(!advance(store, notices_stream, 0, 2).await);
    assert!(advance(store, STREAM, 0, 1).await);
    let mut positions = store.positions("nats").await.unwrap();
    positions.sort();
    assert_eq!(positions, vec![(STREAM, 1), (notices_stream, 1)]);
    store
        .set_position("nats", notices_stream, 0, NOW)
        .await
        .unwrap();
    assert!(store.positions("webhook").await.unwrap().is_empty());
    let heads = store.event_streams().await.unwrap();
    assert!(heads
        .iter()
        .any(|h| h.stream == notices_stream && h.head == 2));
}
