//! One set of test bodies (async fns over `&dyn OrderStore`) run on every backend: a MariaDB
//! database and a PostgreSQL database of the test's own on the shared servers, and a SQLite
//! file in a temp dir. Events come from core's `SaleBook`, so they are what a ledger really
//! produces.

use flashsale_core::invariants::check_sale;
use flashsale_core::{
    DeadLetter, Event, HotOrder, OrderNo, OrderStatus, OrderStore, PurchaseOutcome,
    PurchaseRequest, Sale, SaleBook, SaleMode, SaleState, SkuId, StoreError, StoredSale, UserId,
};
use flashsale_store::{MySqlStore, PgStore, SqliteStore, Store};
use flashsale_testkit::mariadb::TestDatabase;

use crate::common::{request, NOW};

const SKU: SkuId = SkuId(42);

backends!(
    sale_lifecycle,
    batch_applies_orders_events_and_counters,
    redelivery_is_a_no_op,
    overlapping_batch_applies_only_the_new_part,
    gap_is_refused_and_changes_nothing,
    oversell_guard_rejects_and_keeps_counters,
    resolution_of_a_non_reserved_order_is_rejected,
    reserve_mode_pay_cancel_expire,
    large_batch_is_chunked,
    request_ids_are_case_sensitive,
    dead_letters_are_recorded_once_per_entry,
    the_epoch_fence_keeps_refused_events_apart,
);

/// One bucket: these bodies run one book over the sale's row (a bucketed sale's events are
/// its buckets', see the buckets module).
fn sale(total: u64, limit: u32, mode: SaleMode) -> Sale {
    Sale {
        name: "Flash ✓".into(),
        ..crate::common::sale(SKU, total, limit, mode)
    }
}

/// A live book over `sale` (what the hot ledger would run).
/// Creates a sale and takes its first epoch, as the first load of a hot copy does.
async fn create(store: &dyn OrderStore, sale: &Sale) {
    store.create_sale(sale).await.unwrap();
    assert_eq!(store.take_epoch(sale.sku_id, 0).await.unwrap(), Some(1));
}

fn book(sale: &Sale) -> SaleBook {
    let live = Sale {
        state: SaleState::Live,
        ..sale.clone()
    };
    let c = live.fresh_counters();
    SaleBook::new(live, c, 1)
}

fn req(user: u64, rid: &str, q: u32) -> PurchaseRequest {
    request(SKU, user, rid, q)
}

/// Runs purchases through the book; returns the events of the accepted ones.
/// The status of each order of the sale, in the store's order.
async fn statuses<C: FromIterator<OrderStatus>>(store: &dyn OrderStore) -> C {
    let orders = store.orders(SKU).await.unwrap();
    orders.into_iter().map(|o| o.status).collect()
}

/// Everything the store holds of the sale, to compare before and after a refused change.
async fn snapshot(store: &dyn OrderStore) -> (Option<StoredSale>, Vec<HotOrder>, Vec<Event>) {
    (
        store.sale(SKU).await.unwrap(),
        store.orders(SKU).await.unwrap(),
        store.events(SKU).await.unwrap(),
    )
}

/// A direct sale of 10 (per-user `limit`) created in `store`, and the events of `reqs` in its
/// book (not applied yet).
async fn bought(
    store: &dyn OrderStore,
    limit: u32,
    reqs: &[PurchaseRequest],
) -> (SaleBook, Vec<Event>) {
    let s = sale(10, limit, SaleMode::Direct);
    create(store, &s).await;
    let mut b = book(&s);
    let events = buy(&mut b, reqs);
    (b, events)
}

/// [`bought`] by three buyers, one unit each.
async fn three_buyers(store: &dyn OrderStore) -> (SaleBook, Vec<Event>) {
    bought(store, 1, &[req(1, "a", 1), req(2, "b", 1), req(3, "c", 1)]).await
}

/// [`bought`] by six buyers, one unit each.
async fn six_buyers(store: &dyn OrderStore) -> (SaleBook, Vec<Event>) {
    let reqs: Vec<PurchaseRequest> = (1..=6).map(|u| req(u, "r", 1)).collect();
    bought(store, 1, &reqs).await
}

fn buy(book: &mut SaleBook, reqs: &[PurchaseRequest]) -> Vec<Event> {
    reqs.iter()
        .filter_map(|r| book.purchase(r, NOW).1)
        .collect()
}

fn accepted_no(book: &mut SaleBook, r: &PurchaseRequest) -> OrderNo {
    match book.purchase(r, NOW).0 {
        PurchaseOutcome::Accepted { order, .. } => order.order_no,
        other => panic!("expected a replay of an accepted order, got {other:?}"),
    }
}

/// The stored sale, orders and events pass every invariant, and the counters are the book's.
async fn assert_matches_book(store: &dyn OrderStore, book: &SaleBook) {
    let stored = store.sale(SKU).await.unwrap().expect("sale");
    assert_eq!(stored.counters, book.counters, "counters");
    let orders = store.orders(SKU).await.unwrap();
    let events = store.events(SKU).await.unwrap();
    assert_eq!(events.len() as u64, book.counters.seq);
    for o in &orders {
        assert_eq!(Some(o), book.order(&o.order_no), "order {}", o.order_no);
    }
    let report = check_sale(&stored.sale, &stored.counters, &orders, &events, true);
    assert!(report.is_ok(), "{:?}", report.violations);
}

async fn sale_lifecycle(store: &dyn OrderStore) {
    store.ping().await.unwrap();
    assert_eq!(store.sale(SKU).await.unwrap(), None);
    let s = sale(100, 2, SaleMode::Reserve);
    let created = store.create_sale(&s).await.unwrap();
    assert_eq!(created.sale, s);
    assert_eq!(created.counters, s.fresh_counters());
    assert_eq!(created.epoch, 0, "no hot copy loaded yet");
    assert_eq!(store.sale(SKU).await.unwrap(), Some(created.clone()));
    assert!(matches!(
        store.create_sale(&s).await,
        Err(StoreError::SaleExists)
    ));

    let other = Sale {
        sku_id: SkuId(7),
        state: SaleState::Live, // stored as scheduled whatever it says
        ..sale(5, 1, SaleMode::Direct)
    };
    let created_other = store.create_sale(&other).await.unwrap();
    assert_eq!(created_other.sale.state, SaleState::Scheduled);
    let all = store.sales().await.unwrap();
    assert_eq!(
        all.iter().map(|s| s.sale.sku_id).collect::<Vec<_>>(),
        vec![SkuId(7), SKU]
    );

    store.set_state(SKU, SaleState::Live).await.unwrap();
    store.set_state(SKU, SaleState::Live).await.unwrap(); // unchanged is not "not found"
    assert_eq!(
        store.sale(SKU).await.unwrap().unwrap().sale.state,
        SaleState::Live
    );
    assert!(matches!(
        store.set_state(SkuId(999), SaleState::Paused).await,
        Err(StoreError::SaleNotFound)
    ));
    // Epochs are taken by compare and set: of two racing rebuilds one wins.
    assert_eq!(store.sale(SKU).await.unwrap().unwrap().epoch, 0);
    assert_eq!(store.take_epoch(SKU, 0).await.unwrap(), Some(1));
    assert_eq!(
        store.take_epoch(SKU, 0).await.unwrap(),
        None,
        "lost the race"
    );
    assert_eq!(store.take_epoch(SKU, 1).await.unwrap(), Some(2));
    let taken = store.sale(SKU).await.unwrap().unwrap();
    assert_eq!(taken.epoch, 2);
    assert!(taken.epoch_at_ms > 0);
    assert_eq!(store.take_epoch(SkuId(999), 0).await.unwrap(), None);
    assert!(matches!(
        store
            .apply_events(SkuId(999), &buy(&mut book(&s), &[req(1, "a", 1)]))
            .await,
        Err(StoreError::SaleNotFound) | Err(StoreError::Internal(_))
    ));
    let bad = Sale {
        total_stock: 0,
        sku_id: SkuId(8),
        ..s
    };
    assert!(store.create_sale(&bad).await.is_err());
    assert_eq!(store.sale(SkuId(8)).await.unwrap(), None);
}

async fn batch_applies_orders_events_and_counters(store: &dyn OrderStore) {
    let (b, events) = bought(
        store,
        2,
        &[
            req(1, "a", 2),
            req(2, "a", 1),
            req(1, "b", 1), // over the limit: no event
            req(3, "c", 2),
            req(4, "d", 1),
        ],
    )
    .await;
    assert_eq!(events.len(), 4);
    let report = store.apply_events(SKU, &events).await.unwrap();
    assert_eq!((report.applied, report.duplicates), (4, 0));
    assert!(report.rejected.is_empty());
    let stored = store.sale(SKU).await.unwrap().unwrap();
    assert_eq!(
        (
            stored.counters.available,
            stored.counters.sold,
            stored.counters.seq
        ),
        (4, 6, 4)
    );
    assert_eq!(store.events(SKU).await.unwrap(), events);
    assert_eq!(
        store.events_between(SKU, 2..=3).await.unwrap(),
        events[1..3].to_vec()
    );
    let no = &events[0].order_no;
    let order = store.order(no).await.unwrap().expect("order");
    assert_eq!(order.status, OrderStatus::Created);
    assert_eq!(order.quantity, 2);
    assert_eq!(store.orders(SKU).await.unwrap().len(), 4);
    assert_eq!(store.order(&OrderNo::new(SKU, 1, 999)).await.unwrap(), None);
    assert!(store.apply_events(SKU, &[]).await.unwrap() == Default::default());
    assert_matches_book(store, &b).await;
}

async fn redelivery_is_a_no_op(store: &dyn OrderStore) {
    let (b, events) = three_buyers(store).await;
    store.apply_events(SKU, &events).await.unwrap();
    let before = snapshot(store).await;
    for _ in 0..2 {
        let again = store.apply_events(SKU, &events).await.unwrap();
        assert_eq!((again.applied, again.duplicates), (0, 3));
        assert!(again.rejected.is_empty());
    }
    let after = snapshot(store).await;
    assert_eq!(before, after);
    assert_matches_book(store, &b).await;
}

/// Events of a replaced copy (an older epoch) and a different event at an applied seq are
/// never applied, never taken for redeliveries: they are kept in `fenced_events` and reported
/// once.
async fn the_epoch_fence_keeps_refused_events_apart(store: &dyn OrderStore) {
    let (old, events) = three_buyers(store).await;
    store.apply_events(SKU, &events[..2]).await.unwrap();
    // A rebuild takes epoch 2 at applied_seq 2: the old copy's third event is fenced.
    assert_eq!(store.take_epoch(SKU, 1).await.unwrap(), Some(2));
    let stored = store.sale(SKU).await.unwrap().unwrap();
    let mut new = SaleBook::new(old.sale.clone(), stored.counters, 2);
    let fresh = buy(&mut new, &[req(4, "d", 1)]);
    assert_eq!(fresh[0].order_no.to_string(), format!("{}-2-3", SKU.0));
    // Same seq 2 as an applied event, another order: refused, not a redelivery.
    let mut collides = fresh[0].clone();
    collides.seq = 2;
    collides.order_no = OrderNo::new(SKU, 2, 2);
    let batch = [
        events[2].clone(),
        collides.clone(),
        events[1].clone(),
        fresh[0].clone(),
    ];
    let report = store.apply_events(SKU, &batch).await.unwrap();
    assert_eq!((report.applied, report.duplicates), (1, 1));
    assert_eq!(report.fenced, vec![events[2].clone(), collides.clone()]);
    let again = store.apply_events(SKU, &batch).await.unwrap();
    assert_eq!(
        (again.applied, again.duplicates, again.fenced.len()),
        (0, 2, 2)
    );
    let fenced = store.unreported_fenced(SKU, 10).await.unwrap();
    assert_eq!(fenced, vec![events[2].clone(), collides], "kept once each");
    store
        .mark_fenced_reported(SKU, &[(1, 3), (2, 2)])
        .await
        .unwrap();
    assert!(store.unreported_fenced(SKU, 10).await.unwrap().is_empty());
    let orders = store.orders(SKU).await.unwrap();
    let users: Vec<u64> = orders.iter().map(|o| o.user_id.0).collect();
    assert_eq!(users, vec![1, 2, 4]);
    assert_eq!(store.sale(SKU).await.unwrap().unwrap().counters.seq, 3);
}

async fn overlapping_batch_applies_only_the_new_part(store: &dyn OrderStore) {
    let (b, events) = six_buyers(store).await;
    store.apply_events(SKU, &events[..4]).await.unwrap();
    let report = store.apply_events(SKU, &events[2..]).await.unwrap();
    assert_eq!((report.applied, report.duplicates), (2, 2));
    assert_eq!(store.sale(SKU).await.unwrap().unwrap().counters.seq, 6);
    assert_eq!(store.events(SKU).await.unwrap(), events);
    assert_matches_book(store, &b).await;
}

async fn gap_is_refused_and_changes_nothing(store: &dyn OrderStore) {
    let (b, events) = six_buyers(store).await;
    store.apply_events(SKU, &events[..2]).await.unwrap();
    let before = snapshot(store).await;
    // Starts past applied_seq + 1.
    match store.apply_events(SKU, &events[3..]).await {
        Err(StoreError::Gap {
            applied_seq: 2,
            first_seq: 4,
        }) => {}
        other => panic!("expected a gap, got {other:?}"),
    }
    // Starts right but has a hole inside.
    let holed = vec![events[2].clone(), events[4].clone()];
    assert!(matches!(
        store.apply_events(SKU, &holed).await,
        Err(StoreError::Gap { .. })
    ));
    let after = snapshot(store).await;
    assert_eq!(before, after);
    // The missing part still applies afterwards.
    let report = store.apply_events(SKU, &events[2..]).await.unwrap();
    assert_eq!(report.applied, 4);
    assert_matches_book(store, &b).await;
}

async fn oversell_guard_rejects_and_keeps_counters(store: &dyn OrderStore) {
    // The database holds 2 units; a (broken) hot ledger believes in 4.
    let stored_sale = sale(2, 1, SaleMode::Direct);
    create(store, &stored_sale).await;
    let mut b = book(&sale(4, 1, SaleMode::Direct));
    let events = buy(
        &mut b,
        &[
            req(1, "a", 1),
            req(2, "b", 1),
            req(3, "c", 1),
            req(4, "d", 1),
        ],
    );
    assert_eq!(events.len(), 4);
    let first = store.apply_events(SKU, &events[..3]).await.unwrap();
    assert_eq!(first.applied, 3);
    assert_eq!(first.rejected, vec![events[2].order_no]);
    let second = store.apply_events(SKU, &events[3..]).await.unwrap();
    assert_eq!(second.rejected, vec![events[3].order_no]);
    // Redelivery of a rejected event is a duplicate, not a second rejection.
    let again = store.apply_events(SKU, &events).await.unwrap();
    assert_eq!((again.applied, again.duplicates), (0, 4));
    assert!(again.rejected.is_empty());

    let stored = store.sale(SKU).await.unwrap().unwrap();
    let c = stored.counters;
    assert_eq!((c.available, c.reserved, c.sold, c.seq), (0, 0, 2, 4));
    let statuses: Vec<OrderStatus> = statuses(store).await;
    assert_eq!(
        statuses,
        vec![
            OrderStatus::Created,
            OrderStatus::Created,
            OrderStatus::Rejected,
            OrderStatus::Rejected
        ]
    );
    assert_eq!(store.events(SKU).await.unwrap().len(), 4);
    // The invariants name the loss (I5) but hold I1 and I2.
    let orders = store.orders(SKU).await.unwrap();
    let events = store.events(SKU).await.unwrap();
    let report = check_sale(&stored.sale, &c, &orders, &events, true);
    assert!(report.held("I1") && report.held("I2"), "{report:?}");
    assert!(!report.held("I5"));
}

async fn resolution_of_a_non_reserved_order_is_rejected(store: &dyn OrderStore) {
    let s = sale(5, 1, SaleMode::Reserve);
    create(store, &s).await;
    let mut b = book(&s);
    let mut events = buy(&mut b, &[req(1, "a", 1)]);
    let no = events[0].order_no;
    let paid = b
        .pay(&no, UserId(1), NOW + 1)
        .unwrap()
        .1
        .expect("a first pay writes an event");
    events.push(paid.clone());
    store.apply_events(SKU, &events).await.unwrap();
    // A second resolution of the same order (a broken ledger), in its own batch.
    let mut cancel = paid.clone();
    cancel.seq = 3;
    cancel.kind = flashsale_core::EventKind::Cancelled;
    // And an expiry of an order the database never saw.
    let mut ghost = paid;
    ghost.seq = 4;
    ghost.kind = flashsale_core::EventKind::Expired;
    ghost.order_no = OrderNo::new(SKU, 1, 77);
    let report = store
        .apply_events(SKU, &[cancel, ghost.clone()])
        .await
        .unwrap();
    assert_eq!(report.applied, 2);
    assert_eq!(report.rejected, vec![no, ghost.order_no]);
    let stored = store.sale(SKU).await.unwrap().unwrap();
    let c = stored.counters;
    assert_eq!((c.available, c.reserved, c.sold, c.seq), (4, 0, 1, 4));
    assert_eq!(
        store.order(&no).await.unwrap().unwrap().status,
        OrderStatus::Paid
    );
    assert_eq!(store.order(&ghost.order_no).await.unwrap(), None);
}

async fn reserve_mode_pay_cancel_expire(store: &dyn OrderStore) {
    let s = sale(10, 2, SaleMode::Reserve);
    create(store, &s).await;
    let mut b = book(&s);
    let reqs: Vec<PurchaseRequest> = (1..=6).map(|u| req(u, "r", (u % 2 + 1) as u32)).collect();
    let mut events = buy(&mut b, &reqs);
    assert_eq!(events.len(), 6);
    let no = |b: &mut SaleBook, u: u64| accepted_no(b, &req(u, "r", (u % 2 + 1) as u32));
    let (n1, n2) = (no(&mut b, 1), no(&mut b, 2));
    events.push(b.pay(&n1, UserId(1), NOW + 10).unwrap().1.unwrap());
    events.push(b.cancel(&n2, UserId(2), NOW + 20).unwrap().1.unwrap());
    // A cancelled user buys again; then the rest of the holds expire.
    events.extend(buy(&mut b, &[req(2, "again", 1)]));
    events.extend(b.expire_due(NOW + 60_000 + 1, 2));
    // Pay one hold that did not expire (the oldest two did).
    let holds: Vec<OrderNo> = (3..=6).map(|u| no(&mut b, u)).collect();
    let live = holds
        .into_iter()
        .find(|n| b.order(n).unwrap().status == OrderStatus::Reserved)
        .expect("a live hold");
    let user = b.order(&live).unwrap().user_id;
    events.push(b.pay(&live, user, NOW + 30).unwrap().1.unwrap());
    assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1));

    // Small batches so resolutions meet orders both in the same batch and already stored.
    for chunk in events.chunks(3) {
        let report = store.apply_events(SKU, chunk).await.unwrap();
        assert!(report.rejected.is_empty(), "{report:?}");
    }
    assert_matches_book(store, &b).await;
    let c = store.sale(SKU).await.unwrap().unwrap().counters;
    assert!(c.reserved > 0 && c.sold > 0 && c.available > 0, "{c:?}");
    let statuses: std::collections::HashSet<OrderStatus> = statuses(store).await;
    for st in [
        OrderStatus::Paid,
        OrderStatus::Cancelled,
        OrderStatus::Expired,
        OrderStatus::Reserved,
    ] {
        assert!(statuses.contains(&st), "{st:?} in {statuses:?}");
    }
    let deducted = store.events_between(SKU, 1..=1).await.unwrap();
    assert_eq!(deducted[0].deadline_ms, NOW + 60_000);
}

async fn large_batch_is_chunked(store: &dyn OrderStore) {
    let s = sale(1_300, 1, SaleMode::Reserve);
    create(store, &s).await;
    let mut b = book(&s);
    let reqs: Vec<PurchaseRequest> = (1..=1_200).map(|u| req(u, "r", 1)).collect();
    let mut events = buy(&mut b, &reqs);
    events.extend(b.expire_due(NOW + 60_000, 1_100));
    assert_eq!(events.len(), 2_300);
    let report = store.apply_events(SKU, &events).await.unwrap();
    assert_eq!(report.applied, 2_300);
    assert!(report.rejected.is_empty());
    assert_matches_book(store, &b).await;
    // And resolutions of stored orders, in one batch over 500.
    let more = b.expire_due(NOW + 60_000, 1_000);
    assert_eq!(more.len(), 100);
    let report = store.apply_events(SKU, &more).await.unwrap();
    assert_eq!(report.applied, 100);
    assert_matches_book(store, &b).await;
}

async fn request_ids_are_case_sensitive(store: &dyn OrderStore) {
    let (b, events) = bought(
        store,
        3,
        &[req(1, "abc", 1), req(1, "ABC", 1), req(1, "aBc", 1)],
    )
    .await;
    assert_eq!(events.len(), 3);
    let report = store.apply_events(SKU, &events).await.unwrap();
    assert!(report.rejected.is_empty(), "{report:?}");
    assert_eq!(store.orders(SKU).await.unwrap().len(), 3);
    assert_matches_book(store, &b).await;
}

async fn dead_letters_are_recorded_once_per_entry(store: &dyn OrderStore) {
    let s = sale(10, 1, SaleMode::Direct);
    create(store, &s).await;
    let mut letter = DeadLetter {
        sku_id: SKU,
        entry_id: "1700000000000-0".into(),
        seq: Some(5),
        payload: "kind=deducted seq=5".into(),
        error: "gap".into(),
        attempts: 3,
    };
    store.record_dead_letter(&letter).await.unwrap();
    letter.attempts = 4;
    letter.error = "still a gap".into();
    store.record_dead_letter(&letter).await.unwrap();
    let other = DeadLetter {
        entry_id: "1700000000001-0".into(),
        seq: None,
        ..letter.clone()
    };
    store.record_dead_letter(&other).await.unwrap();
    assert_eq!(store.dead_letters(SKU).await.unwrap(), vec![letter, other]);
    assert!(store.dead_letters(SkuId(1)).await.unwrap().is_empty());
}

#[tokio::test]
async fn mysql_stream_pause_flag() {
    let db = TestDatabase::create().await;
    stream_pause_flag(&MySqlStore::connect(&db.url).await.unwrap()).await;
}

#[tokio::test]
async fn postgres_stream_pause_flag() {
    let db = flashsale_testkit::postgres::TestDatabase::create().await;
    let store = PgStore::connect(&db.url).await.unwrap();
    stream_pause_flag(&store).await;
    store.close().await;
}

/// A dead letter of an entry that does not parse (so it names no seq).
fn unparseable() -> DeadLetter {
    DeadLetter {
        sku_id: SKU,
        entry_id: "1-0".into(),
        seq: None,
        payload: String::new(),
        error: "unparseable".into(),
        attempts: 1,
    }
}

async fn stream_pause_flag<B: flashsale_store::Backend>(store: &Store<B>) {
    create(store, &sale(10, 1, SaleMode::Direct)).await;
    assert!(!store.stream_paused(SKU).await.unwrap());
    store.record_dead_letter(&unparseable()).await.unwrap();
    assert!(store.stream_paused(SKU).await.unwrap());
    store.set_stream_paused(SKU, false).await.unwrap();
    assert!(!store.stream_paused(SKU).await.unwrap());
    assert!(matches!(
        store.set_stream_paused(SkuId(9), true).await,
        Err(StoreError::SaleNotFound)
    ));
}

#[tokio::test]
async fn sqlite_stream_pause_flag_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fs.db");
    let url = format!("sqlite://{}", path.display());
    {
        let store = SqliteStore::open(&url).await.unwrap();
        create(&store, &sale(10, 1, SaleMode::Direct)).await;
        let mut b = book(&sale(10, 1, SaleMode::Direct));
        let events = buy(&mut b, &[req(1, "a", 1)]);
        store.apply_events(SKU, &events).await.unwrap();
        store.record_dead_letter(&unparseable()).await.unwrap();
        assert!(store.stream_paused(SKU).await.unwrap());
        store.close().await;
    }
    // Reopen the same file (migrations are idempotent): everything is still there.
    let store = SqliteStore::open(&url).await.unwrap();
    assert!(store.stream_paused(SKU).await.unwrap());
    store.set_stream_paused(SKU, false).await.unwrap();
    assert!(!store.stream_paused(SKU).await.unwrap());
    assert_eq!(store.sale(SKU).await.unwrap().unwrap().counters.seq, 1);
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    for pool in [store.pool(), store.writer()] {
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(sync, 2, "synchronous=FULL");
        let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(pool)
            .await
            .unwrap();
        assert!(busy >= 1_000, "busy_timeout {busy}");
    }
}

/// A group of queue joins commits unsynced on the store's one writer connection, and leaves it
/// synced again (`synchronous = FULL`) for every other write; a second group keeps the first
/// group's tickets and counts on from them.
#[tokio::test]
async fn sqlite_joins_leave_the_writer_synced() {
    use flashsale_core::admission::{AdmissionBook, GroupJoin, Ticket};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("fs.db").display());
    let store = SqliteStore::open(&url).await.unwrap();
    store.commit_seed(SKU, &[7; 32]).await.unwrap();
    let join = |user| GroupJoin {
        user: UserId(user),
        starts_at_ms: i64::MAX,
        len_max: 100,
    };
    let pre = |n| Some(Ticket { pre: true, n });
    let first = store.join_group(SKU, &[join(1), join(2)]).await.unwrap();
    assert_eq!(first, vec![pre(1), pre(2)]);
    let second = store.join_group(SKU, &[join(2), join(3)]).await.unwrap();
    assert_eq!(second, vec![pre(2), pre(3)]);
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(store.writer())
        .await
        .unwrap();
    assert_eq!(sync, 2, "synchronous=FULL after the joins");
}

#[tokio::test]
async fn unreachable_servers_are_unavailable() {
    let port = flashsale_testkit::free_port();
    let mysql = MySqlStore::connect(&format!("mysql://root@127.0.0.1:{port}/x"))
        .await
        .unwrap_err();
    let postgres = PgStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/x"))
        .await
        .unwrap_err();
    for err in [mysql, postgres] {
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    }
}

#[tokio::test]
async fn sqlite_in_memory_works() {
    let store = SqliteStore::open("sqlite::memory:").await.unwrap();
    batch_applies_orders_events_and_counters(&store).await;
}

/// Concurrent writers of one sale on every backend: every batch applies exactly once.
async fn concurrent_redeliveries(store: std::sync::Arc<dyn OrderStore>) {
    let s = sale(200, 1, SaleMode::Direct);
    create(store.as_ref(), &s).await;
    let mut b = book(&s);
    let reqs: Vec<PurchaseRequest> = (1..=200).map(|u| req(u, "r", 1)).collect();
    let events = std::sync::Arc::new(buy(&mut b, &reqs));
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (store, events) = (store.clone(), events.clone());
        tasks.push(tokio::spawn(async move {
            let mut applied = 0;
            // Each writer walks the stream in batches of 25, retrying gaps (another writer
            // is ahead or behind): effects must still apply exactly once.
            let mut at = 0;
            while at < events.len() {
                let end = (at + 25 + w).min(events.len());
                match store.apply_events(SKU, &events[at..end]).await {
                    Ok(r) => {
                        applied += r.applied;
                        assert!(r.rejected.is_empty());
                        at = end;
                    }
                    Err(StoreError::Gap { applied_seq, .. }) => at = applied_seq as usize,
                    Err(e) => panic!("{e}"),
                }
            }
            applied
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 200);
    assert_matches_book(store.as_ref(), &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_concurrent_writers_apply_once() {
    let db = TestDatabase::create().await;
    let store = MySqlStore::connect(&db.url).await.unwrap();
    concurrent_redeliveries(std::sync::Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_writers_apply_once() {
    let db = flashsale_testkit::postgres::TestDatabase::create().await;
    let store = PgStore::connect(&db.url).await.unwrap();
    concurrent_redeliveries(std::sync::Arc::new(store.clone())).await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_concurrent_writers_apply_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("c.db").to_str().unwrap())
        .await
        .unwrap();
    concurrent_redeliveries(std::sync::Arc::new(store)).await;
}

/// A random life of a reserve-mode sale (purchases, retries, pays, cancels, expiries),
/// delivered in random chunks with random redeliveries of what came before, as a stream
/// consumer that crashes before acking would: the store ends equal to the book.
async fn random_redeliveries_end_equal_to_the_book(store: &dyn OrderStore) {
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::rng().random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let s = sale(60, 3, SaleMode::Reserve);
    create(store, &s).await;
    let mut b = book(&s);
    let mut events: Vec<Event> = Vec::new();
    let mut live: Vec<(OrderNo, UserId)> = Vec::new();
    let mut now = NOW;
    for step in 0..400 {
        now += rng.random_range(0..500);
        match rng.random_range(0..10) {
            0..=5 => {
                let user = rng.random_range(1..=40);
                let rid = format!("r{}", rng.random_range(0..4));
                let r = req(user, &rid, rng.random_range(1..=3));
                if let (PurchaseOutcome::Accepted { order, .. }, Some(e)) = b.purchase(&r, now) {
                    live.push((order.order_no, order.user_id));
                    events.push(e);
                }
            }
            6 | 7 if !live.is_empty() => {
                let (no, user) = live.swap_remove(rng.random_range(0..live.len()));
                let r = if step % 2 == 0 {
                    b.pay(&no, user, now)
                } else {
                    b.cancel(&no, user, now)
                };
                events.extend(r.ok().and_then(|(_, e)| e));
            }
            _ => events.extend(b.expire_due(now, rng.random_range(1..5))),
        }
    }
    let mut next = 0;
    while next < events.len() {
        let back = rng.random_range(0..=next.min(10));
        let len = rng.random_range(1..=20);
        let end = (next + len).min(events.len());
        let report = store
            .apply_events(SKU, &events[next - back..end])
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(
            (report.applied, report.duplicates),
            (end - next, back),
            "seed {seed}"
        );
        assert!(report.rejected.is_empty(), "seed {seed}: {report:?}");
        next = end;
    }
    assert_matches_book(store, &b).await;
}

backends!(random_redeliveries_end_equal_to_the_book);

/// The database dies and comes back: calls fail with `Unavailable` (retry later), never
/// half-apply, and the same batch applies once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_outage_is_unavailable_and_recoverable() {
    use flashsale_testkit::mariadb::MariaDbServer;
    let mut server = MariaDbServer::spawn().await;
    let db = TestDatabase::create_on(&server.url()).await;
    let store = MySqlStore::connect(&db.url).await.unwrap();
    let s = sale(10, 1, SaleMode::Direct);
    create(&store, &s).await;
    let mut b = book(&s);
    let events = buy(&mut b, &[req(1, "a", 1), req(2, "b", 1)]);
    store.apply_events(SKU, &events[..1]).await.unwrap();

    server.kill();
    let err = store.apply_events(SKU, &events).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(matches!(
        store.ping().await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.sale(SKU).await,
        Err(StoreError::Unavailable(_))
    ));

    server.start().await;
    flashsale_testkit::wait::until(
        "the store to reconnect",
        std::time::Duration::from_secs(30),
        || async { store.ping().await.ok() },
    )
    .await;
    let report = store.apply_events(SKU, &events).await.unwrap();
    assert_eq!((report.applied, report.duplicates), (1, 1));
    assert_matches_book(&store, &b).await;
    drop(store);
    drop(db);
}

/// Instances that start together on a fresh database migrate it once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_starting_together_migrate_once() {
    let db = TestDatabase::create().await;
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            tokio::spawn(async move { MySqlStore::connect_with(&url, 2).await.map(|_| ()) })
        })
        .collect();
    let pg = flashsale_testkit::postgres::TestDatabase::create().await;
    let pg_starts: Vec<_> = (0..4)
        .map(|_| {
            let url = pg.url.clone();
            tokio::spawn(async move {
                let store = PgStore::connect_with(&url, 2).await?;
                store.close().await;
                Ok::<(), StoreError>(())
            })
        })
        .collect();
    for start in starts.into_iter().chain(pg_starts) {
        start.await.unwrap().expect("every instance starts");
    }
}
