//! The reconciler on each system of record: after a sale it reports diff 0 and I1–I8 hold in
//! the database's rows; each divergence it repairs (events the database lacks, a hot copy
//! behind the database, holds past their deadline) is found and repaired the same way on
//! MariaDB and on PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use flashsale_core::{
    HotLedger, HotPurchases, Ledger, OrderNo, OrderStatus, PurchaseOutcome, SaleMode,
};
use flashsale_engine::reconcile::{Journal, Reconciler, SaleReport, Trigger};
use flashsale_testkit::conformance::{live_sale, req};
use flashsale_testkit::wait;

use crate::common::{assert_invariants, backends, rig, Rig, Sor, LIMIT};

backends!(
    a_sale_reconciles_with_diff_zero,
    events_the_database_lacks_are_replayed,
    a_hot_copy_behind_the_database_is_rebuilt,
    holds_past_their_deadline_are_expired,
);

fn reconciler(rig: &Rig) -> Reconciler {
    let ledger: Arc<dyn Ledger> = rig.ledger.clone();
    Reconciler::new(ledger, rig.store.clone(), Arc::new(Journal::default()))
}

/// Everything holds: no violation, no finding, diff 0 on every field.
fn assert_reconciled(r: &SaleReport) {
    assert!(r.ok, "{r:#?}");
    assert!(r.violations.is_empty() && r.findings.is_empty(), "{r:#?}");
    assert!(r.diff.as_ref().is_some_and(|d| d.is_zero()), "{r:#?}");
}

/// A run without repairs, on a quiet sale: everything reconciled; the report.
async fn run_reconciled(reconciler: &Reconciler, rig: &Rig) -> SaleReport {
    let run = reconciler.run_sale(rig.sku, false, Trigger::Cli).await;
    let run = run.unwrap();
    assert_reconciled(&run);
    run
}

/// A live reserve-mode sale whose holds last `timeout_ms`, one unit per buyer.
async fn reserve_rig(sor: Sor, total: u64, timeout_ms: u64) -> Rig {
    let mut sale = live_sale(SaleMode::Reserve, total, 1);
    sale.payment_timeout_ms = timeout_ms;
    rig(sor, sale).await
}

/// A run with repairs that repaired one thing, of `kind`, and left the sale reconciled.
async fn repair(reconciler: &Reconciler, rig: &Rig, kind: &str) -> SaleReport {
    let run = reconciler
        .run_sale(rig.sku, true, Trigger::Cli)
        .await
        .unwrap();
    assert!(!run.ok, "the divergence was found: {run:#?}");
    assert_eq!(run.repairs.len(), 1, "{run:#?}");
    assert!(run.repairs[0].starts_with(kind), "{run:#?}");
    let stored = rig.store.reconcile_runs(Some(rig.sku), 1).await.unwrap();
    assert_eq!(stored[0].repairs, run.repairs);
    run
}

/// Reserve mode: holds, payments and cancellations, persisted as they come.
async fn a_sale_reconciles_with_diff_zero(sor: Sor) {
    let rig = reserve_rig(sor, 30, 600_000).await;
    let persister = rig.start("p1");
    let accepted = rig.buy(1..=20, 4).await;
    for (i, no) in accepted.iter().enumerate() {
        let no = OrderNo::parse(no).unwrap();
        let user = rig.ledger.order(&no).await.unwrap().unwrap().user_id;
        match i % 4 {
            0 => assert!(rig.ledger.pay(&no, user).await.is_ok()),
            1 => assert!(rig.ledger.cancel(&no, user).await.is_ok()),
            _ => {}
        }
    }
    rig.drain().await;
    persister.stop().await;
    let run = run_reconciled(&reconciler(&rig), &rig).await;
    assert!(run.repairs.is_empty());
    let stored = rig.store.reconcile_runs(Some(rig.sku), 1).await.unwrap();
    assert!(stored[0].ok && stored[0].trigger == "cli", "{stored:?}");
    let orders = rig.store.orders(rig.sku).await.unwrap();
    let count = |s: OrderStatus| orders.iter().filter(|o| o.status == s).count() as u64;
    let c = rig.stored().await.counters;
    assert_eq!((count(OrderStatus::Paid), c.sold), (5, 5));
    assert_eq!((count(OrderStatus::Reserved), c.reserved), (10, 10));
    assert_eq!((count(OrderStatus::Cancelled), c.available), (5, 15));
    assert_eq!(c, rig.ledger.counters(rig.sku).await.unwrap().unwrap());
    assert_invariants(rig.store.as_ref(), rig.sku).await;
    rig.cleanup().await;
}

/// No persister runs: the purchases wait in the stream past the lag bound. The run names them
/// stale and replays them into the database; a persister started afterwards skips them.
async fn events_the_database_lacks_are_replayed(sor: Sor) {
    let rig = rig(sor, live_sale(SaleMode::Direct, 50, 1)).await;
    let mut accepted = rig.buy(1..=20, 3).await;
    let mut reconciler = reconciler(&rig);
    reconciler.config.lag_bound = Duration::ZERO;
    let found = wait::until("the purchases stale", LIMIT, || async {
        let r = reconciler.inspect(rig.sku).await.unwrap();
        (r.stale_pending == 20).then_some(r)
    })
    .await;
    assert_eq!((found.in_flight, found.db.seq), (20, 0), "{found:#?}");
    assert!(
        found.diff.as_ref().is_some_and(|d| d.is_zero()),
        "{found:#?}"
    );
    let run = repair(&reconciler, &rig, "replay").await;
    assert_reconciled(run.after.as_deref().unwrap());
    rig.assert_stored(&accepted).await;

    let persister = rig.start("p1");
    accepted.extend(rig.buy(21..=21, 1).await);
    rig.drain().await;
    persister.stop().await;
    rig.assert_stored(&accepted).await;
    assert_eq!(rig.store.events(rig.sku).await.unwrap().len(), 21);
    rig.cleanup().await;
}

/// A Redis counter changed: the hot copy's `seq` falls below what the database applied (as
/// after a restart from an older snapshot). The run finds the copy behind and rebuilds it
/// from the database in the next epoch; the sale goes on from there.
async fn a_hot_copy_behind_the_database_is_rebuilt(sor: Sor) {
    let mut rig = rig(sor, live_sale(SaleMode::Direct, 40, 1)).await;
    let persister = rig.start("p1");
    let mut accepted = rig.buy(1..=25, 5).await;
    rig.drain().await;
    let key = rig.ledger.keys().sale(rig.sku);
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("seq")
        .arg(10)
        .query_async(&mut rig.conn)
        .await
        .unwrap();
    let reconciler = reconciler(&rig);
    let found = reconciler.inspect(rig.sku).await.unwrap();
    assert!(found.hot_behind && !found.ok, "{found:#?}");
    let run = repair(&reconciler, &rig, "rebuild").await;
    assert_reconciled(run.after.as_deref().unwrap());
    let stored = rig.stored().await;
    assert_eq!((stored.epoch, stored.counters.seq), (2, 25));
    assert_eq!(
        rig.ledger.counters(rig.sku).await.unwrap().unwrap(),
        stored.counters
    );

    // A buyer's retry gets its first answer back; new buyers get the next epoch's numbers.
    let retry = rig
        .ledger
        .purchase_batch(rig.sku, &[req(rig.sku, 1, "r1", 1)])
        .await
        .unwrap();
    match &retry[0] {
        PurchaseOutcome::Accepted { order, replayed } => {
            assert!(*replayed && accepted.contains(&order.order_no.to_string()))
        }
        other => panic!("a retry after the rebuild: {other:?}"),
    }
    let after = rig.buy(26..=60, 5).await;
    assert_eq!(after.len(), 15, "the units left, no more");
    assert!(after
        .iter()
        .all(|no| no.starts_with(&format!("{}-2-", rig.sku.0))));
    accepted.extend(after);
    rig.drain().await;
    persister.stop().await;
    rig.assert_stored(&accepted).await;
    run_reconciled(&reconciler, &rig).await;
    rig.cleanup().await;
}

/// No expiry worker runs: holds stay RESERVED past their deadline until the run expires them.
async fn holds_past_their_deadline_are_expired(sor: Sor) {
    let rig = reserve_rig(sor, 10, 200).await;
    let persister = rig.start("p1");
    let accepted = rig.buy(1..=6, 2).await;
    assert_eq!(accepted.len(), 6);
    rig.drain().await;
    let mut reconciler = reconciler(&rig);
    reconciler.config.hold_grace = Duration::ZERO;
    wait::until("six holds overdue", LIMIT, || async {
        (reconciler.inspect(rig.sku).await.unwrap().overdue_holds == 6).then_some(())
    })
    .await;
    repair(&reconciler, &rig, "expire").await;
    rig.drain().await;
    persister.stop().await;
    let orders = rig.store.orders(rig.sku).await.unwrap();
    assert_eq!(orders.len(), 6);
    assert!(orders.iter().all(|o| o.status == OrderStatus::Expired));
    let c = rig.stored().await.counters;
    assert_eq!((c.available, c.reserved, c.sold, c.seq), (10, 0, 0, 12));
    assert_invariants(rig.store.as_ref(), rig.sku).await;
    run_reconciled(&reconciler, &rig).await;
    rig.cleanup().await;
}
