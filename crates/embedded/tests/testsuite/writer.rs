//! The group writer thread writes exactly the rows `SqliteStore::apply_events` writes: the
//! same operations through a ledger of each kind leave the same orders, events and counters
//! (times compared as differences, since each run reads its own clock).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flashsale_core::{
    HotCopies, HotLedger, HotPurchases, OrderStore, PurchaseOutcome, Sale, SaleMode, SkuId,
    SoldOutSupport,
};
use flashsale_embedded::{EmbeddedLedger, GroupWriter};
use flashsale_store::SqliteStore;
use flashsale_testkit::conformance::{buy_ok, live_sale, pay_and_cancel, req, warm};
use sqlx::Row;

/// Every row a run leaves, as text.
async fn rows(store: &SqliteStore, skus: &[SkuId]) -> Vec<String> {
    let mut out = lines(
        store,
        "order",
        "SELECT order_no, sku_id, user_id, request_id, quantity, status, \
         MAX(deadline_ms - created_at_ms, -1) AS hold, updated_at_ms >= created_at_ms AS later \
         FROM orders ORDER BY id",
    )
    .await;
    out.extend(
        lines(
            store,
            "event",
            "SELECT sku_id, epoch, seq, kind, order_no, request_id, user_id, quantity, \
             CASE deadline_ms WHEN 0 THEN 0 ELSE deadline_ms - at_ms END, rejected \
             FROM stock_events ORDER BY sku_id, seq",
        )
        .await,
    );
    for sku in skus {
        let s = store.sale(*sku).await.unwrap().expect("sale");
        out.push(format!("sale {sku} {:?} epoch {}", s.counters, s.epoch));
    }
    let n: i64 = sqlx::query("SELECT COUNT(*) FROM fenced_events")
        .fetch_one(store.pool())
        .await
        .unwrap()
        .get(0);
    out.push(format!("fenced {n}"));
    out
}

/// Each row of `sql` as `<what> <column> <column> …`: integers and text as they are.
async fn lines(store: &SqliteStore, what: &str, sql: &str) -> Vec<String> {
    let rows = sqlx::query(sql).fetch_all(store.pool()).await.unwrap();
    let text = |r: &sqlx::sqlite::SqliteRow, c: usize| match r.try_get::<i64, _>(c) {
        Ok(n) => n.to_string(),
        Err(_) => r.get::<String, _>(c),
    };
    let line = |r| {
        let columns = (0..Row::len(r)).map(|c| text(r, c));
        std::iter::once(what.to_owned())
            .chain(columns)
            .collect::<Vec<_>>()
    };
    rows.iter().map(|r| line(r).join(" ")).collect()
}

/// One run of the same operations: a direct sale bought in one group of 300 (every chunk
/// size of the multi-row inserts), refused purchases, a reserve sale whose holds are paid,
/// cancelled and expired.
async fn run(path: &Path, writer: GroupWriter, direct: &Sale, reserve: &Sale) -> Vec<String> {
    let store = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    let ledger = EmbeddedLedger::open_with(store.clone(), writer)
        .await
        .unwrap();
    let (d, r) = (direct.sku_id, reserve.sku_id);
    warm(&ledger, direct).await;
    warm(&ledger, reserve).await;

    let batch: Vec<_> = (0..300u64)
        .map(|u| req(d, 1_000 + u, &format!("g{u}"), 1))
        .collect();
    let outcomes = ledger.purchase_batch(d, &batch).await.unwrap();
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, PurchaseOutcome::Accepted { .. })));
    // A replay and a second unit over the limit change nothing.
    let again = ledger.purchase_batch(d, &batch[..2]).await.unwrap();
    assert_eq!(again.len(), 2);
    let over = vec![req(d, 1_000, "over", 1)];
    assert!(matches!(
        ledger.purchase_batch(d, &over).await.unwrap()[0],
        PurchaseOutcome::Rejected(_)
    ));

    let paid = buy_ok(&ledger, r, 1, "p", 2).await;
    let cancelled = buy_ok(&ledger, r, 2, "c", 1).await;
    let _expiring = buy_ok(&ledger, r, 3, "e", 1).await;
    pay_and_cancel(&ledger, &paid, &cancelled).await;
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert_eq!(ledger.expire_due(r, 10).await.unwrap(), 1);
    let keys = ledger.accepted_keys(d, 1_000).await.unwrap().unwrap();
    assert_eq!(keys.len(), 300);
    // The book and the store agree after every group.
    for sku in [d, r] {
        let stored = store.sale(sku).await.unwrap().unwrap();
        assert_eq!(ledger.counters(sku).await.unwrap(), Some(stored.counters));
        assert!(ledger
            .hot_snapshot(sku)
            .await
            .unwrap()
            .unwrap()
            .events
            .is_empty());
    }
    assert_eq!(ledger.refused_groups(), 0);
    rows(&store, &[d, r]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_thread_writes_the_rows_the_store_writes() {
    let dir = tempfile::tempdir().unwrap();
    let direct = live_sale(SaleMode::Direct, 1_000, 1);
    let mut reserve = live_sale(SaleMode::Reserve, 10, 2);
    reserve.payment_timeout_ms = 1_500;
    let mut runs = Vec::new();
    for (file, writer) in [
        ("store.db", GroupWriter::Store),
        ("thread.db", GroupWriter::Thread),
    ] {
        runs.push(run(&dir.path().join(file), writer, &direct, &reserve).await);
    }
    let (by_store, by_thread) = (&runs[0], &runs[1]);
    assert!(by_store.len() > 300);
    assert_eq!(by_thread, by_store);
}

/// A group whose start the database does not hold (another writer moved the counters) is
/// rolled back by the writer and goes to the store's apply, whose guard keeps the deduction
/// that no longer fits as REJECTED: the group is answered with an error, never as accepted,
/// and the book is reloaded from the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_the_database_disagrees_with_is_never_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let store = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    let ledger = EmbeddedLedger::open_with(store.clone(), GroupWriter::Thread)
        .await
        .unwrap();
    let sku = crate::recovery::one_sold(&ledger, 5).await;
    // Behind the ledger's back: the stored stock drops to 1 (conserved: 1 + 4 sold).
    crate::recovery::set_stock_behind_the_ledger(&store, sku, 1, 4).await;
    let refused = ledger
        .purchase_batch(sku, &[req(sku, 2, "b", 1), req(sku, 3, "c", 1)])
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(ledger.refused_groups(), 1);
    let stored = store.sale(sku).await.unwrap().unwrap();
    assert_eq!((stored.counters.sold, stored.counters.seq), (5, 3));
    // Reloaded: the book now holds what the database holds.
    assert_eq!(ledger.counters(sku).await.unwrap(), Some(stored.counters));
    let rejected: i64 =
        sqlx::query("SELECT COUNT(*) FROM orders WHERE sku_id = ? AND status = 'REJECTED'")
            .bind(sku.0 as i64)
            .fetch_one(store.pool())
            .await
            .unwrap()
            .get(0);
    assert_eq!(rejected, 1);
}
