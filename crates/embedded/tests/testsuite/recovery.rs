//! Durability and recovery of the embedded ledger: what it answered is in SQLite, a reopened
//! ledger picks up exactly where the old one stopped, and a failed commit leaves the book
//! equal to SQLite.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flashsale_core::invariants::check_sale;
use flashsale_core::{
    Counters, ErrorCode, HotCopies, HotLedger, HotPurchases, LedgerError, OrderStatus, OrderStore,
    PurchaseOutcome, Sale, SaleMode, SaleState, SkuId, SoldOutSupport, UserId,
};
use flashsale_embedded::EmbeddedLedger;
use flashsale_store::SqliteStore;
use flashsale_testkit::conformance::{
    accepted, buy, buy_ok, buy_refused, live_sale, pay_and_cancel, req, warm,
};

const HOLD_MS: u64 = 1_500;

/// A new store in a temp dir of its own (removed when the first value drops) and its ledger.
async fn open_fresh() -> (tempfile::TempDir, Arc<SqliteStore>, EmbeddedLedger) {
    let dir = tempfile::tempdir().unwrap();
    let (store, ledger) = open(&dir.path().join("fs.db")).await;
    (dir, store, ledger)
}

/// A direct sale of `stock` units (limit 1) warmed on `ledger`, one unit sold to user 1.
pub async fn one_sold(ledger: &EmbeddedLedger, stock: u64) -> SkuId {
    let sku = warm(ledger, &live_sale(SaleMode::Direct, stock, 1)).await;
    buy_ok(ledger, sku, 1, "a", 1).await;
    sku
}

/// Sets the stored sale's `available` and `sold` behind the ledger's back.
pub async fn set_stock_behind_the_ledger(
    store: &SqliteStore,
    sku: SkuId,
    available: i64,
    sold: i64,
) {
    sqlx::query("UPDATE sales SET available = ?, sold = ? WHERE sku_id = ?")
        .bind(available)
        .bind(sold)
        .bind(sku.0 as i64)
        .execute(store.writer())
        .await
        .unwrap();
}

async fn open(path: &Path) -> (Arc<SqliteStore>, EmbeddedLedger) {
    let store = Arc::new(
        SqliteStore::open(path.to_str().unwrap())
            .await
            .expect("open"),
    );
    let ledger = EmbeddedLedger::open(store.clone()).await.expect("ledger");
    (store, ledger)
}

/// I1–I7 from SQLite, and the hot counters equal the stored ones.
async fn check(store: &SqliteStore, ledger: &EmbeddedLedger, sku: SkuId) -> Counters {
    let s = store.sale(sku).await.unwrap().expect("stored sale");
    let orders = store.orders(sku).await.unwrap();
    let events = store.events(sku).await.unwrap();
    let report = check_sale(&s.sale, &s.counters, &orders, &events, true);
    assert!(report.is_ok(), "{:?}", report.violations);
    assert_eq!(ledger.counters(sku).await.unwrap(), Some(s.counters));
    s.counters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_ledger_remembers_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data/flashsale.db");

    let direct = live_sale(SaleMode::Direct, 5, 2);
    let mut reserve = live_sale(SaleMode::Reserve, 10, 2);
    // Long enough that a loaded machine does not expire holds before the test pays them.
    reserve.payment_timeout_ms = HOLD_MS;
    let (d, r) = (direct.sku_id, reserve.sku_id);
    let (first, held, paid, cancelled, before_d, before_r);
    {
        let (store, ledger) = open(&path).await;
        warm(&ledger, &direct).await;
        warm(&ledger, &reserve).await;
        first = buy_ok(&ledger, d, 1, "a", 2).await;
        buy_ok(&ledger, d, 2, "a", 1).await;
        held = buy_ok(&ledger, r, 1, "h", 1).await;
        paid = buy_ok(&ledger, r, 2, "p", 2).await;
        cancelled = buy_ok(&ledger, r, 3, "c", 1).await;
        pay_and_cancel(&ledger, &paid, &cancelled).await;
        ledger.set_state(d, SaleState::Paused).await.unwrap();
        before_d = check(&store, &ledger, d).await;
        before_r = check(&store, &ledger, r).await;
        // No close: the process "dies" with the ledger and pools dropped.
    }

    let (store, ledger) = open(&path).await;
    let mut skus = ledger.warm_skus();
    skus.sort();
    let mut expected = vec![d, r];
    expected.sort();
    assert_eq!(skus, expected);
    assert_eq!(check(&store, &ledger, d).await, before_d);
    assert_eq!(check(&store, &ledger, r).await, before_r);

    // The operator state came back too.
    buy_refused(&ledger, d, 3, "x", 1, ErrorCode::Paused).await;
    ledger.set_state(d, SaleState::Live).await.unwrap();
    // Replays answer the first order, same number.
    match buy(&ledger, d, 1, "a", 1).await {
        PurchaseOutcome::Accepted { order, replayed } => {
            assert!(replayed);
            assert_eq!(order.order_no, first.order_no);
        }
        other => panic!("{other:?}"),
    }
    // Per-user limits: user 1 holds 2 of 2; user 2 holds 1.
    buy_refused(&ledger, d, 1, "b", 1, ErrorCode::LimitExceeded).await;
    buy_ok(&ledger, d, 2, "b", 1).await;
    buy_refused(&ledger, d, 3, "c", 2, ErrorCode::SoldOut).await;
    // Reserve: statuses, quota given back by the cancel, the hold still there.
    let o = |no| {
        let ledger = ledger.clone();
        async move { ledger.order(&no).await.unwrap().unwrap().status }
    };
    assert_eq!(o(paid.order_no).await, OrderStatus::Paid);
    assert_eq!(o(cancelled.order_no).await, OrderStatus::Cancelled);
    assert_eq!(o(held.order_no).await, OrderStatus::Reserved);
    buy_ok(&ledger, r, 3, "c2", 2).await;
    // A retried pay answers the paid order again (its first outcome); a cancel conflicts.
    let again = ledger.pay(&paid.order_no, UserId(2)).await.unwrap();
    assert_eq!(again.map(|o| o.status), Ok(OrderStatus::Paid));
    assert_eq!(
        ledger.cancel(&paid.order_no, UserId(2)).await.unwrap(),
        Err(ErrorCode::AlreadyResolved)
    );
    // The recovered hold (and the new one) expire when due.
    tokio::time::sleep(Duration::from_millis(HOLD_MS + 50)).await;
    assert_eq!(ledger.expire_due(r, 10).await.unwrap(), 2);
    assert_eq!(o(held.order_no).await, OrderStatus::Expired);
    let c = check(&store, &ledger, r).await;
    assert_eq!((c.available, c.reserved, c.sold), (8, 0, 2));
    check(&store, &ledger, d).await;
    // Order numbers keep counting from the stored seq: no reuse after restart.
    let next = buy_ok(&ledger, r, 4, "n", 1).await;
    assert_eq!(next.order_no.to_string(), format!("{r}-1-{}", c.seq + 1));
    // A sale that sold refuses a plain warm; it is warm already.
    let again = ledger.warm(&reserve, &reserve.fresh_counters(), 1).await;
    assert!(matches!(again, Err(LedgerError::AlreadyWarm)), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_takes_a_sale_created_in_the_store() {
    let (_dir, store, ledger) = open_fresh().await;
    let sale = live_sale(SaleMode::Direct, 3, 1);
    let sku = sale.sku_id;
    let stored = store.create_sale(&sale).await.unwrap();
    assert_eq!(stored.sale.state, SaleState::Scheduled);
    let r = ledger.purchase_batch(sku, &[req(sku, 1, "a", 1)]).await;
    assert!(matches!(r, Err(LedgerError::NotWarmed)), "{r:?}");
    // As the server does: take the next epoch in the database, then load and open the copy.
    let to_warm = Sale {
        state: SaleState::Live,
        ..stored.sale.clone()
    };
    let epoch = store.take_epoch(sku, stored.epoch).await.unwrap().unwrap();
    ledger
        .warm(&to_warm, &stored.counters, epoch)
        .await
        .unwrap();
    assert_eq!(
        store.sale(sku).await.unwrap().unwrap().sale.state,
        SaleState::Live
    );
    buy_ok(&ledger, sku, 1, "a", 1).await;
    assert_eq!(ledger.queue_depth(sku), 0);
    assert_eq!(
        ledger.accepted_keys(sku, 10).await.unwrap(),
        Some(vec![flashsale_core::RequestKey::parse("1:a").unwrap()])
    );
    assert_eq!(ledger.accepted_keys(sku, 0).await.unwrap(), None);
    assert_eq!(ledger.accepted_keys(SkuId(1), 10).await.unwrap(), None);
    // A scheduled sale that sold nothing is not loaded at open; one that is live is.
    let other = live_sale(SaleMode::Direct, 3, 1);
    store.create_sale(&other).await.unwrap();
    drop(ledger);
    let ledger = EmbeddedLedger::open(store.clone()).await.unwrap();
    assert_eq!(ledger.warm_skus(), vec![sku]);
    assert_eq!(ledger.counters(other.sku_id).await.unwrap(), None);
    check(&store, &ledger, sku).await;
}

/// On: SQLite refuses any event of user 666 (the whole transaction rolls back). Off: no more.
async fn fault_for_user_666(store: &SqliteStore, on: bool) {
    let sql = match on {
        true => {
            "CREATE TRIGGER inject_fault BEFORE INSERT ON stock_events WHEN NEW.user_id = 666 \
             BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
        }
        false => "DROP TRIGGER inject_fault",
    };
    sqlx::query(sql).execute(store.writer()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_answers_unavailable_and_keeps_the_book_equal_to_sqlite() {
    let (_dir, store, ledger) = open_fresh().await;
    let sku = one_sold(&ledger, 10).await;

    fault_for_user_666(&store, true).await;
    let batch = [
        req(sku, 2, "a", 1),
        req(sku, 666, "a", 1),
        req(sku, 3, "a", 1),
    ];
    let r = ledger.purchase_batch(sku, &batch).await;
    assert!(matches!(r, Err(LedgerError::Unavailable(_))), "{r:?}");
    // Nothing of the failed group is in the book or in SQLite.
    let c = check(&store, &ledger, sku).await;
    assert_eq!((c.available, c.sold, c.seq), (9, 1, 1));
    assert_eq!(
        ledger.accepted_keys(sku, 10).await.unwrap().unwrap().len(),
        1
    );
    // Others go on, with the next seq (no gap in SQLite).
    let o = buy_ok(&ledger, sku, 2, "a", 1).await;
    assert_eq!(o.order_no.to_string(), format!("{sku}-1-2"));

    fault_for_user_666(&store, false).await;
    // The refused buyer retries with the same request id: a fresh, accepted purchase.
    buy_ok(&ledger, sku, 666, "a", 1).await;
    let c = check(&store, &ledger, sku).await;
    assert_eq!((c.available, c.sold, c.seq), (7, 3, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_are_group_committed_and_all_answered_after_commit() {
    let (_dir, store, ledger) = open_fresh().await;
    let ledger = Arc::new(ledger);
    let mut sale = live_sale(SaleMode::Reserve, 300, 1);
    sale.payment_timeout_ms = 600_000; // no hold comes due during the test
    let sku = warm(ledger.as_ref(), &sale).await;
    let mut tasks = Vec::new();
    for t in 0..40u64 {
        let ledger = ledger.clone();
        tasks.push(tokio::spawn(async move {
            let reqs: Vec<_> = (0..10).map(|i| req(sku, t * 10 + i + 1, "r", 1)).collect();
            let out = ledger.purchase_batch(sku, &reqs).await.unwrap();
            let mut nos = Vec::new();
            for o in &out {
                if o.code().is_none() {
                    let order = accepted(o);
                    // Answered after commit: SQLite has it, with its final status.
                    nos.push(order.order_no);
                } else {
                    assert_eq!(o.code(), Some(ErrorCode::SoldOut));
                }
            }
            nos
        }));
    }
    let mut all = HashSet::new();
    for t in tasks {
        for no in t.await.unwrap() {
            let stored = store
                .order(&no)
                .await
                .unwrap()
                .expect("committed before answered");
            assert_eq!(stored.status, OrderStatus::Reserved);
            assert!(all.insert(no));
        }
    }
    assert_eq!(all.len(), 300);
    let c = check(&store, ledger.as_ref(), sku).await;
    assert_eq!((c.available, c.reserved, c.seq), (0, 300, 300));
    // Expiry goes through the same writer; deadlines are in the future: nothing to do yet.
    assert_eq!(ledger.expire_due(sku, 1000).await.unwrap(), 0);
}

/// If SQLite's guard ever refuses what the book accepted (here: counters changed behind the
/// ledger's back), the caller gets `Unavailable`, the book is rebuilt from SQLite, and the
/// refused order is kept as REJECTED (a retry sees it), never silently dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_rejection_rebuilds_the_book_from_sqlite() {
    let (_dir, store, ledger) = open_fresh().await;
    let sku = one_sold(&ledger, 2).await;
    set_stock_behind_the_ledger(&store, sku, 0, 2).await;
    let r = ledger.purchase_batch(sku, &[req(sku, 2, "b", 1)]).await;
    assert!(matches!(r, Err(LedgerError::Unavailable(_))), "{r:?}");
    assert_eq!(
        ledger
            .counters(sku)
            .await
            .unwrap()
            .map(|c| (c.available, c.seq)),
        Some((0, 2))
    );
    match buy(&ledger, sku, 2, "b", 1).await {
        PurchaseOutcome::Accepted { order, replayed } => {
            assert!(replayed);
            assert_eq!(order.status, OrderStatus::Rejected);
        }
        other => panic!("{other:?}"),
    }
    buy_refused(&ledger, sku, 3, "c", 1, ErrorCode::SoldOut).await;
}

/// While the writer commits a group, the next groups run through the book (eight callers of
/// 1,000 requests are more than one group takes), so when a group fails (SQLite refuses user
/// 666) the groups sent after it rest on a book ahead of SQLite. None of them is answered as
/// accepted unless SQLite holds it; the book ends equal to SQLite (I1–I7 from SQLite); and
/// every refused request, retried, is sold exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_sent_behind_a_failed_group_answer_only_what_sqlite_holds() {
    const CALLERS: u64 = 8;
    const ROUNDS: u64 = 3;
    const BATCH: u64 = 1_000;
    let (_dir, store, ledger) = open_fresh().await;
    let ledger = Arc::new(ledger);
    let sku = warm(ledger.as_ref(), &live_sale(SaleMode::Direct, 100_000, 1)).await;
    fault_for_user_666(&store, true).await;
    let mut tasks = Vec::new();
    for t in 0..CALLERS {
        let ledger = ledger.clone();
        tasks.push(tokio::spawn(async move {
            let (mut sold, mut refused) = (Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                let first = 10_000 + (t * ROUNDS + round) * BATCH;
                let mut reqs: Vec<_> = (first..first + BATCH)
                    .map(|u| req(sku, u, "r", 1))
                    .collect();
                if (t, round) == (5, 1) {
                    reqs[0] = req(sku, 666, "r", 1);
                }
                match ledger.purchase_batch(sku, &reqs).await {
                    Ok(out) => sold.extend(out.iter().map(|o| accepted(o).order_no)),
                    Err(LedgerError::Unavailable(_)) => refused.push(reqs),
                    Err(e) => panic!("{e}"),
                }
            }
            (sold, refused)
        }));
    }
    let (mut sold, mut refused) = (Vec::new(), Vec::new());
    for t in tasks {
        let (s, r) = t.await.unwrap();
        sold.extend(s);
        refused.extend(r);
    }
    for no in &sold {
        let stored = store.order(no).await.unwrap();
        assert!(stored.is_some(), "{no} answered as accepted, not in SQLite");
    }
    assert!(refused.iter().flatten().any(|r| r.user_id == UserId(666)));
    let c = check(&store, ledger.as_ref(), sku).await;
    assert_eq!(
        c.sold,
        sold.len() as u64,
        "SQLite holds a purchase answered as refused"
    );
    fault_for_user_666(&store, false).await;
    for reqs in &refused {
        let out = ledger.purchase_batch(sku, reqs).await.unwrap();
        out.iter().for_each(|o| drop(accepted(o)));
    }
    let c = check(&store, ledger.as_ref(), sku).await;
    assert_eq!(c.sold, CALLERS * ROUNDS * BATCH);
}
