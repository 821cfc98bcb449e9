//! A copy on a replica that is promoted (a failover) fences itself on its first write: the
//! replica may lack purchases the old primary acknowledged, and their order numbers must never
//! be handed to another buyer. The rebuild that follows (the server's reconciler) is what opens
//! it again, in a new epoch. And the option that narrows the window in which a failover
//! loses acknowledged purchases: WAIT for replicas before answering.

use std::time::Duration;

use flashsale_core::{
    CopyAt, ErrorCode, HotCopies, HotLedger, HotPurchases, LedgerError, PurchaseOutcome, SaleMode,
};
use flashsale_redis::{RedisLedger, Replication};
use flashsale_testkit::conformance::{buy, buy_ok, live_sale, req, warm};
use flashsale_testkit::redis_server::RedisServer;
use flashsale_testkit::wait;

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// A primary and a replica of it, in sync.
async fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::spawn().await;
    let replica = RedisServer::spawn_replica_of(&primary).await;
    (primary, replica)
}

/// [`primary_and_replica`] and a ledger on the primary.
async fn ledger_on_primary() -> (RedisServer, RedisServer, RedisLedger) {
    let (primary, replica) = primary_and_replica().await;
    let on_primary = RedisLedger::connect(&primary.url(), "fs").await.unwrap();
    (primary, replica, on_primary)
}

async fn in_sync(primary: &RedisServer) {
    let mut conn = raw(primary).await;
    wait::until(
        "the replica to acknowledge",
        Duration::from_secs(10),
        || {
            let mut conn = conn.clone();
            async move {
                let acked: i64 = redis::cmd("WAIT")
                    .arg(1)
                    .arg(100)
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                (acked == 1).then_some(())
            }
        },
    )
    .await;
    let _ = &mut conn;
}

/// `REPLICAOF NO ONE`: the replica becomes a primary (a new replication id), as in a failover.
async fn promote(replica: &RedisServer) {
    let mut conn = raw(replica).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_fences_the_copy_instead_of_selling_from_it() {
    let (primary, replica, on_primary) = ledger_on_primary().await;
    let sale = live_sale(SaleMode::Reserve, 10, 1);
    let sku = warm(&on_primary, &sale).await;
    let order = buy_ok(&on_primary, sku, 1, "a", 1).await;
    in_sync(&primary).await;

    promote(&replica).await;
    let promoted = RedisLedger::connect(&replica.url(), "fs").await.unwrap();
    let snap = promoted
        .hot_snapshot(sku)
        .await
        .unwrap()
        .expect("the copy was replicated");
    assert!(
        snap.fenced_ms.is_some_and(|ms| ms > 1_000_000),
        "a moved copy reads as fenced long ago: {:?}",
        snap.fenced_ms
    );
    let outcome = buy(&promoted, sku, 2, "b", 1).await;
    assert_eq!(outcome, PurchaseOutcome::Rejected(ErrorCode::Unavailable));
    let paid = promoted.pay(&order.order_no, order.user_id).await.unwrap();
    assert_eq!(paid, Err(ErrorCode::Unavailable));
    assert_eq!(promoted.expire_due(sku, 10).await.unwrap(), 0);
    let c = promoted.counters(sku).await.unwrap().unwrap();
    assert_eq!(c.seq, 1, "nothing was written on the moved copy");

    // The same copy on the node it was opened on still sells.
    buy_ok(&on_primary, sku, 3, "c", 1).await;
}

/// `REPLICAOF <primary>`: `node` takes `primary`'s data (a full sync: what it wrote alone is gone).
async fn follow(node: &RedisServer, primary: &RedisServer) {
    let _: () = redis::cmd("REPLICAOF")
        .arg(&primary.bind)
        .arg(primary.port)
        .query_async(&mut raw(node).await)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_promoted_back_with_a_replicas_data_fences_the_copy() {
    // A primary cut off with a minority keeps selling (its persister may store what it
    // sold), its replica is promoted, the old primary rejoins as that replica's replica and
    // takes its data, then is promoted back: the same process (run_id) as the one the copy
    // was opened on, with a copy that lacks what it sold alone.
    let (primary, replica, on_primary) = ledger_on_primary().await;
    let sale = live_sale(SaleMode::Direct, 10, 2);
    let sku = warm(&on_primary, &sale).await;
    buy_ok(&on_primary, sku, 1, "a", 1).await;
    in_sync(&primary).await;
    promote(&replica).await;
    let alone = buy_ok(&on_primary, sku, 2, "b", 1).await;

    follow(&primary, &replica).await;
    wait::until(
        "the old primary to hold its replica's data",
        Duration::from_secs(10),
        || {
            let on_primary = &on_primary;
            async move {
                let c = on_primary.counters(sku).await.ok()??;
                (c.seq == 1).then_some(())
            }
        },
    )
    .await;
    promote(&primary).await;

    let outcome = buy(&on_primary, sku, 3, "c", 1).await;
    assert_eq!(
        outcome,
        PurchaseOutcome::Rejected(ErrorCode::Unavailable),
        "order {} was sold alone on this node; its number must not be handed out again",
        alone.order_no
    );
    let c = on_primary.counters(sku).await.unwrap().unwrap();
    assert_eq!(c.seq, 1, "nothing was written on the copy that lost a sale");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_opened_on_the_promoted_node_sells_again() {
    let (primary, replica, on_primary) = ledger_on_primary().await;
    let sale = live_sale(SaleMode::Direct, 10, 1);
    let sku = warm(&on_primary, &sale).await;
    buy_ok(&on_primary, sku, 1, "a", 1).await;
    in_sync(&primary).await;
    promote(&replica).await;
    let promoted = RedisLedger::connect(&replica.url(), "fs").await.unwrap();
    assert_eq!(
        buy(&promoted, sku, 2, "b", 1).await,
        PurchaseOutcome::Rejected(ErrorCode::Unavailable)
    );
    // What a rebuild does last: load a newer epoch and open it here.
    let counters = promoted.counters(sku).await.unwrap().unwrap();
    promoted.load(&sale, &counters, 2).await.unwrap();
    promoted.open(sku, 2, sale.state).await.unwrap();
    let order = buy_ok(&promoted, sku, 2, "b", 1).await;
    assert_eq!(order.order_no.epoch(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_an_accepted_purchase_is_answered_once_a_replica_has_it() {
    let (primary, replica) = primary_and_replica().await;
    in_sync(&primary).await;
    let wait = Replication {
        replicas: 1,
        timeout: Duration::from_millis(200),
    };
    let ledger = RedisLedger::connect(&primary.url(), "fs")
        .await
        .unwrap()
        .with_replication(wait)
        .unwrap();
    let mut sale = live_sale(SaleMode::Reserve, 10, 1);
    sale.payment_timeout_ms = 60_000;
    let sku = warm(&ledger, &sale).await;
    // A script the primary forgot (restart, SCRIPT FLUSH) is loaded again, WAIT and all.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw(&primary).await)
        .await
        .unwrap();
    let order = buy_ok(&ledger, sku, 1, "a", 1).await;

    // The replica stops: the purchase is written on the primary but not answered "accepted".
    drop(replica);
    let r = ledger.purchase_batch(sku, &[req(sku, 2, "b", 1)]).await;
    assert_eq!(unconfirmed(r).len(), 1);
    let r = ledger.pay(&order.order_no, order.user_id).await;
    assert_eq!(unconfirmed(r), vec![order.order_no]);
    // A refusal writes nothing and needs no replica.
    let r = buy(&ledger, sku, 1, "again", 1).await;
    assert_eq!(r, PurchaseOutcome::Rejected(ErrorCode::LimitExceeded));
}

#[test]
fn a_wait_option_is_bounded() {
    let ledger = || RedisLedger::connect_lazy("redis://127.0.0.1:1", "fs").unwrap();
    let zero = Replication {
        replicas: 0,
        timeout: Duration::from_millis(100),
    };
    assert!(ledger().with_replication(zero).is_err());
    let long = Replication {
        replicas: 1,
        timeout: Duration::from_secs(5),
    };
    assert!(ledger().with_replication(long).is_err());
}

/// A ledger with `WAIT 1` on its own, fresh connection to `primary`.
async fn waiting_ledger(primary: &RedisServer) -> RedisLedger {
    let wait = Replication {
        replicas: 1,
        timeout: Duration::from_millis(200),
    };
    RedisLedger::connect(&primary.url(), "fs")
        .await
        .unwrap()
        .with_replication(wait)
        .unwrap()
}

fn unconfirmed<T: std::fmt::Debug>(r: Result<T, LedgerError>) -> Vec<flashsale_core::OrderNo> {
    match r {
        Err(LedgerError::Unconfirmed { written, .. }) => written,
        other => panic!("expected a write the replicas did not confirm, got {other:?}"),
    }
}

/// A purchase (or payment) the script applied but the replicas did not confirm answers
/// `Unconfirmed` naming it; its retry is confirmed only once the replica has it, also on a
/// fresh connection (whose WAIT would otherwise have no write of its own to wait for and
/// answer at once); a retried payment answers the paid order, not a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_retry_is_confirmed_only_once_the_replica_has_the_first_write() {
    let (primary, replica) = primary_and_replica().await;
    in_sync(&primary).await;
    let first = waiting_ledger(&primary).await;
    let mut sale = live_sale(SaleMode::Reserve, 10, 1);
    sale.payment_timeout_ms = 60_000;
    let sku = warm(&first, &sale).await;
    let paid = buy_ok(&first, sku, 1, "p", 1).await;

    replica.pause();
    let written = unconfirmed(first.purchase_batch(sku, &[req(sku, 2, "b", 1)]).await);
    assert_eq!(written.len(), 1);
    let retry = waiting_ledger(&primary).await;
    let again = unconfirmed(retry.purchase_batch(sku, &[req(sku, 2, "b", 1)]).await);
    assert_eq!(again, written, "the replay names the first order");
    let resolved = unconfirmed(first.pay(&paid.order_no, paid.user_id).await);
    assert_eq!(resolved, vec![paid.order_no]);
    let fresh = waiting_ledger(&primary).await;
    let resolved = unconfirmed(fresh.pay(&paid.order_no, paid.user_id).await);
    assert_eq!(
        resolved,
        vec![paid.order_no],
        "a retried pay is not a conflict"
    );

    replica.resume();
    match buy(&retry, sku, 2, "b", 1).await {
        PurchaseOutcome::Accepted { order, replayed } => {
            assert!(replayed);
            assert_eq!(vec![order.order_no], written);
        }
        other => panic!("{other:?}"),
    }
    let order = fresh.pay(&paid.order_no, paid.user_id).await.unwrap();
    assert_eq!(order.unwrap().status, flashsale_core::OrderStatus::Paid);
}

/// A replica attached after the sale opened changes the primary's replication id (the
/// primary creates its backlog then): no move, so the copy goes on selling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_attached_after_warm_up_is_no_failover() {
    let primary = RedisServer::spawn().await;
    let ledger = RedisLedger::connect(&primary.url(), "fs").await.unwrap();
    let sku = warm(&ledger, &live_sale(SaleMode::Direct, 10, 1)).await;
    buy_ok(&ledger, sku, 1, "a", 1).await;
    let _replica = RedisServer::spawn_replica_of(&primary).await;
    in_sync(&primary).await;
    buy_ok(&ledger, sku, 2, "b", 1).await;
}

/// A failover between a rebuild's load and its last chunk of restored orders: the promoted
/// node's copy may lack the chunks before, so restoring into it or opening it is refused
/// (and the copy is marked for an immediate rebuild); the rebuild starting over there opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_midway_through_a_rebuild_makes_it_start_over() {
    let (primary, replica, on_primary) = ledger_on_primary().await;
    let sale = live_sale(SaleMode::Direct, 10, 1);
    let sku = sale.sku_id;
    let counters = sale.fresh_counters();
    on_primary.load(&sale, &counters, 1).await.unwrap();
    in_sync(&primary).await;
    promote(&replica).await;
    let promoted = RedisLedger::connect(&replica.url(), "fs").await.unwrap();
    let order = flashsale_core::HotOrder {
        order_no: flashsale_core::OrderNo::new(sku, 1, 1),
        sku_id: sku,
        user_id: flashsale_core::UserId(1),
        request_id: flashsale_core::RequestId::parse("r").unwrap(),
        quantity: 1,
        status: flashsale_core::OrderStatus::Created,
        deadline_ms: 0,
        created_at_ms: 1,
    };
    let restored = promoted
        .restore_orders(CopyAt { sku, epoch: 1 }, &[order])
        .await;
    assert!(restored.is_err(), "{restored:?}");
    let opened = promoted.open(sku, 1, sale.state).await;
    assert!(opened.is_err(), "{opened:?}");
    let snap = promoted.snapshot(sku).await.unwrap().unwrap();
    assert_eq!(
        snap.fenced_ms.map(|_| snap.fields["fenced_at_ms"].as_str()),
        Some("0")
    );

    promoted.load(&sale, &counters, 2).await.unwrap();
    promoted.open(sku, 2, sale.state).await.unwrap();
    assert_eq!(buy_ok(&promoted, sku, 1, "a", 1).await.order_no.epoch(), 2);
}
