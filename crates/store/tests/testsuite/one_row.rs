//! One row per purchase on every backend: the contract step gives orders written before
//! migration 16 (as an older binary writes them, no seq) their event's seq and removes the
//! event rows that order rows carry; the event log, the audit and the relay's stream read the
//! same before and after; afterwards a purchase writes its order row only, a redelivered batch
//! is still a duplicate, and an order is found by its number.

use flashsale_core::events::{EventLog, StreamKey};
use flashsale_core::{Event, OrderStore, SaleBook, SaleMode, SkuId};

use crate::common::{live_sale, request, NOW};

const SKU: SkuId = SkuId(16);

/// `exec` (runs a statement) and `count` (reads one integer) over a backend's pool.
macro_rules! raw_statements {
    ($pool:expr) => {{
        let pool = $pool;
        let exec_pool = pool.clone();
        let exec = move |sql: &'static str| {
            let pool = exec_pool.clone();
            async move {
                sqlx::query(sql).execute(&pool).await.expect(sql);
            }
        };
        let count = move |sql: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query(sql)
                    .fetch_one(&pool)
                    .await
                    .expect(sql)
                    .get::<i64, _>(0)
            }
        };
        (exec, count)
    }};
}

/// Runs the body against each backend, with its raw statements (`exec`, `count`).
macro_rules! one_row_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use sqlx::Row as _;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                let (_db, store) = crate::common::mysql().await;
                let (exec, count) = raw_statements!(store.writer().clone());
                super::$name(&store, exec, count, || store.contract_one_row()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let (_db, store) = crate::common::postgres().await;
                let (exec, count) = raw_statements!(store.writer().clone());
                super::$name(&store, exec, count, || store.contract_one_row()).await;
                store.close().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let (_dir, store) = crate::common::sqlite("flashsale.db").await;
                let (exec, count) = raw_statements!(store.writer().clone());
                super::$name(&store, exec, count, || store.contract_one_row()).await;
            }
        }
    )*};
}

one_row_backends!(the_contract_keeps_the_log_and_a_purchase_writes_one_row);

/// Purchases of users `users` on the book (and the first one paid when `pay`).
fn purchases(book: &mut SaleBook, users: std::ops::Range<u64>, pay: bool) -> Vec<Event> {
    let mut events = Vec::new();
    for u in users {
        let r = request(SKU, u, &format!("r{u}"), 1);
        events.extend(book.purchase(&r, NOW + u as i64).1);
    }
    if pay {
        let first = events[0].order_no;
        events.extend(book.pay(&first, events[0].user_id, NOW + 100).unwrap().1);
    }
    events
}

const DEDUCTED_ROWS: &str = "SELECT COUNT(*) FROM stock_events WHERE kind = 'deducted'";
const EVENT_ROWS: &str = "SELECT COUNT(*) FROM stock_events";
const ORDER_ROWS: &str = "SELECT COUNT(*) FROM orders";

async fn the_contract_keeps_the_log_and_a_purchase_writes_one_row<S, E, EF, C, CF, K, KF>(
    store: &S,
    exec: E,
    count: C,
    contract: K,
) where
    S: OrderStore + EventLog,
    E: Fn(&'static str) -> EF,
    EF: std::future::Future<Output = ()>,
    C: Fn(&'static str) -> CF,
    CF: std::future::Future<Output = i64>,
    K: FnOnce() -> KF,
    KF: std::future::Future<
        Output = Result<flashsale_store::ContractReport, flashsale_core::StoreError>,
    >,
{
    let sale = live_sale(SKU, 100, 1, SaleMode::Reserve);
    store.create_sale(&sale).await.unwrap();
    assert_eq!(store.take_epoch(SKU, 0).await.unwrap(), Some(1));
    let mut book = SaleBook::new(sale.clone(), sale.fresh_counters(), 1);
    let before = purchases(&mut book, 1..6, true);
    store.apply_events(SKU, &before).await.unwrap();
    // As a binary before migration 16 wrote them: orders without their event's seq.
    exec("UPDATE orders SET seq = NULL, epoch = NULL").await;
    let log = store.events(SKU).await.unwrap();
    assert_eq!(log, before);
    assert_eq!(count(DEDUCTED_ROWS).await, 5);

    let report = contract().await.expect("contract");
    assert_eq!((report.backfilled, report.events_removed), (5, 5));
    assert_eq!(
        count(DEDUCTED_ROWS).await,
        0,
        "the order rows carry the deductions"
    );
    assert_eq!(
        store.events(SKU).await.unwrap(),
        log,
        "the log reads the same"
    );
    let stream = StreamKey {
        sku: SKU,
        bucket: 0,
    };
    let logged = store.logged_events(stream, 2, 3).await.unwrap();
    let seqs: Vec<u64> = logged.iter().map(|l| l.event.seq).collect();
    assert_eq!(seqs, vec![3, 4, 5]);

    // A purchase writes its order row only; a payment is an event row.
    let after = purchases(&mut book, 6..9, false);
    let (orders, events) = (count(ORDER_ROWS).await, count(EVENT_ROWS).await);
    store.apply_events(SKU, &after).await.unwrap();
    assert_eq!(count(ORDER_ROWS).await, orders + 3);
    assert_eq!(
        count(EVENT_ROWS).await,
        events,
        "no event row for a purchase"
    );
    let paid = book
        .pay(&after[0].order_no, after[0].user_id, NOW + 200)
        .unwrap()
        .1;
    store
        .apply_events(SKU, &paid.into_iter().collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(count(EVENT_ROWS).await, events + 1);

    // Redelivered, the whole log is duplicates; an order is found by its number.
    let all = store.events(SKU).await.unwrap();
    assert_eq!(all.len(), 10);
    let again = store.apply_events(SKU, &all).await.unwrap();
    assert_eq!((again.applied, again.duplicates), (0, 10));
    let paid_order = store
        .order(&after[0].order_no)
        .await
        .unwrap()
        .expect("found");
    assert_eq!(paid_order.status, flashsale_core::OrderStatus::Paid);
    let old = store
        .order(&before[1].order_no)
        .await
        .unwrap()
        .expect("found");
    assert_eq!(old.user_id, before[1].user_id);
    let audit = store.audit(SKU).await.unwrap().expect("audit");
    assert_eq!((audit.orders.len(), audit.events.len()), (8, 10));
    assert_eq!(audit.sale.counters.reserved + audit.sale.counters.sold, 8);
}
