//! Faults on the production path, with throwaway servers where a server must die.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::Stack;
use flashsale_core::{OrderStore, SkuId};
use flashsale_engine::persister::{Persister, PersisterConfig};
use flashsale_redis::StreamReader;
use flashsale_testkit::mariadb::{MariaDbServer, TestDatabase};
use flashsale_testkit::redis_server::{self, RedisServer};
use flashsale_testkit::wait;
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::broadcast;

async fn buy_range(stack: &Stack, sku: u64, users: std::ops::RangeInclusive<u64>) -> usize {
    let mut accepted = 0;
    for u in users {
        let (s, b) = stack.buy(u, sku, &format!("r{u}"), json!(1)).await;
        assert!(
            s == StatusCode::ACCEPTED || s == StatusCode::CONFLICT,
            "{s} {b}"
        );
        accepted += usize::from(s == StatusCode::ACCEPTED);
    }
    accepted
}

async fn stored_orders(store: &dyn OrderStore, sku: u64) -> usize {
    store.orders(SkuId(sku)).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_fast_writes_nothing_and_recovers() {
    let mut redis =
        RedisServer::spawn_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    let stack = Stack::with(&redis.url(), TestDatabase::create().await).await;
    stack.live_sale(41, 100, 1).await;
    assert_eq!(buy_range(&stack, 41, 1..=10).await, 10);
    stack.drain(41).await;
    let before = stored_orders(stack.store().as_ref(), 41).await;

    redis.kill();
    for u in 11..=30 {
        let started = Instant::now();
        let (s, b) = stack.buy(u, 41, &format!("r{u}"), json!(1)).await;
        assert_eq!(
            (s, b["code"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("UNAVAILABLE"))
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a bound, not a hang: {:?}",
            started.elapsed()
        );
    }
    let (s, _) = stack.call("GET", "/readyz", None, None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        stored_orders(stack.store().as_ref(), 41).await,
        before,
        "no database fallback"
    );

    redis.start().await;
    wait::until(
        "purchases to succeed again",
        Duration::from_secs(30),
        || async {
            (stack.buy(11, 41, "r11", json!(1)).await.0 == StatusCode::ACCEPTED).then_some(())
        },
    )
    .await;
    assert_eq!(buy_range(&stack, 41, 12..=20).await, 9);
    stack.drain(41).await;
    assert_eq!(stored_orders(stack.store().as_ref(), 41).await, 20);
    common::assert_invariants(stack.store().as_ref(), 41).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_down_mid_sale_then_the_persister_catches_up() {
    let mut maria = MariaDbServer::spawn().await;
    let db = TestDatabase::create_on(&maria.url()).await;
    let stack = Stack::with(&redis_server::shared_url(), db).await;
    stack.live_sale(42, 200, 1).await;
    assert_eq!(buy_range(&stack, 42, 1..=30).await, 30);

    maria.kill();
    // Purchases go on while the database is down.
    assert_eq!(buy_range(&stack, 42, 31..=80).await, 50);
    maria.start().await;
    assert_eq!(buy_range(&stack, 42, 81..=100).await, 20);

    stack.drain(42).await;
    assert_eq!(
        stored_orders(stack.store().as_ref(), 42).await,
        100,
        "nothing lost"
    );
    common::assert_invariants(stack.store().as_ref(), 42).await;
}

/// A persister that dies after its commit (before XACK) and one that dies before its commit:
/// the next persister claims their entries and every effect lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_persisters_entries_are_claimed_and_applied_exactly_once() {
    let db = TestDatabase::create().await;
    let mut cfg = common::config(Some(redis_server::shared_url()), db.url.clone());
    cfg.engine.persister.run = false;
    let stack = Stack::start(cfg.clone(), Some(db), None).await;
    let sku = SkuId(43);
    stack.live_sale(43, 100, 1).await;
    assert_eq!(buy_range(&stack, 43, 1..=40).await, 40);
    let store = stack.store();
    let url = redis_server::shared_url();

    let committed =
        StreamReader::connect(&url, &cfg.engine.ledger.redis_prefix, "died-after-commit")
            .await
            .unwrap();
    committed.ensure_group(sku).await.unwrap();
    let first = committed.read_new(sku, 20, 0).await.unwrap();
    let events: Vec<_> = (first.iter())
        .filter_map(|(_, e)| e.clone().unwrap().event().cloned())
        .collect();
    store.apply_events(sku, &events).await.unwrap();
    let uncommitted =
        StreamReader::connect(&url, &cfg.engine.ledger.redis_prefix, "died-before-commit")
            .await
            .unwrap();
    assert_eq!(uncommitted.read_new(sku, 20, 0).await.unwrap().len(), 20);
    assert_eq!(stored_orders(store.as_ref(), 43).await, 20);

    let mut config = PersisterConfig::new(&url, &cfg.engine.ledger.redis_prefix, "next-owner");
    config.bounds.claim_idle_ms = 200;
    let (stop, rx) = broadcast::channel(1);
    let task = tokio::spawn(Persister::new(config, store.clone()).run(rx));
    stack.drain(43).await;
    wait::until("no entry left pending", Duration::from_secs(30), || async {
        (committed.pending_summary(sku).await.unwrap().count == 0).then_some(())
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();

    assert_eq!(stored_orders(store.as_ref(), 43).await, 40);
    let events = store.events(sku).await.unwrap();
    assert_eq!(events.len(), 40, "each event stored once");
    common::assert_invariants(store.as_ref(), 43).await;
    let (n, units, sold) = common::sql_counts(stack.database_url(), 43).await.live();
    assert_eq!((n, units, sold), (40, 40, 40));
    let _: Arc<dyn OrderStore> = store;
}

/// With WAIT 1, a purchase the script accepted while the replica was stopped answers 503;
/// its retry, once the replica is back, answers 202 (a replay). Redis then loses everything
/// before any persister saved it: the order answered 202 is reported lost by its number (the
/// journal keeps replays and unconfirmed writes), never silently dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_answered_after_a_503_is_reported_when_redis_loses_it() {
    let mut primary = RedisServer::spawn().await;
    let replica = RedisServer::spawn_replica_of(&primary).await;
    let db = TestDatabase::create().await;
    let mut cfg = common::config(Some(primary.url()), db.url.clone());
    cfg.engine.persister.run = false;
    cfg.engine.reconcile.interval = Duration::ZERO;
    cfg.engine.ledger.replication = Some(flashsale_redis::Replication {
        replicas: 1,
        timeout: Duration::from_millis(100),
    });
    let stack = Stack::start(cfg, Some(db), None).await;
    let st = &stack;
    stack.live_sale(71, 10, 1).await;
    wait::until(
        "the replica to confirm",
        Duration::from_secs(10),
        || async move {
            (st.buy(9, 71, "warm", json!(1)).await.0 == StatusCode::ACCEPTED).then_some(())
        },
    )
    .await;

    replica.pause();
    let (s, b) = stack.buy(1, 71, "r1", json!(1)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    replica.resume();
    let order = wait::until(
        "the retry to be confirmed",
        Duration::from_secs(10),
        || async move {
            let (s, b) = st.buy(1, 71, "r1", json!(1)).await;
            (s == StatusCode::ACCEPTED).then(|| (b["order_no"].as_str().unwrap().to_owned(), b))
        },
    )
    .await;
    assert_eq!(order.1["replayed"], json!(true), "{}", order.1);

    primary.kill();
    primary.start().await;
    let reconciler = stack.server.as_ref().unwrap().state.reconciler();
    let reconciler = &reconciler;
    // The first runs may meet the connection the restart broke: run until one goes through.
    let report = wait::until("a reconcile run", Duration::from_secs(20), || async move {
        let trigger = flashsale_engine::reconcile::Trigger::Cli;
        reconciler.run_sale(SkuId(71), true, trigger).await.ok()
    })
    .await;
    assert!(
        report.lost_orders.contains(&order.0),
        "{} is reported lost: {report:?}",
        order.0
    );
}

/// Redis loses an order the persister never saved; the reconcile run that rebuilds the copy
/// and finds the loss cannot store its report (the runs' table is gone for a moment): the
/// next run still reports the order lost. A failed run must not take the journal's losses
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_found_by_a_run_that_could_not_be_stored_is_reported_by_the_next() {
    let mut redis = RedisServer::spawn().await;
    let db = TestDatabase::create().await;
    let mut cfg = common::config(Some(redis.url()), db.url.clone());
    cfg.engine.persister.run = false;
    cfg.engine.reconcile.interval = Duration::ZERO;
    let db_url = db.url.clone();
    let stack = Stack::start(cfg, Some(db), None).await;
    stack.live_sale(72, 10, 1).await;
    let (s, b) = stack.buy(1, 72, "r1", json!(1)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{b}");
    let order_no = b["order_no"].as_str().unwrap().to_owned();

    redis.kill();
    redis.start().await;
    let rename = |from: &'static str, to: &'static str| {
        let url = db_url.clone();
        async move {
            let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
            let sql = format!("RENAME TABLE {from} TO {to}");
            sqlx::query(&sql).execute(&pool).await.unwrap();
        }
    };
    rename("reconcile_runs", "reconcile_runs_away").await;
    let reconciler = stack.server.as_ref().unwrap().state.reconciler();
    let reconciler = &reconciler;
    let trigger = flashsale_engine::reconcile::Trigger::Cli;
    // Runs until one gets as far as storing its report (the first may meet the connection
    // the restart broke): that run rebuilt the copy and found the loss.
    wait::until(
        "a run to fail at its record",
        Duration::from_secs(20),
        || async move {
            let e = reconciler.run_sale(SkuId(72), true, trigger).await.err()?;
            format!("{e:#}").contains("reconcile_runs").then_some(())
        },
    )
    .await;
    rename("reconcile_runs_away", "reconcile_runs").await;
    let report = reconciler.run_sale(SkuId(72), true, trigger).await.unwrap();
    assert!(
        report.lost_orders.contains(&order_no),
        "{order_no} is reported lost by the next run: {report:?}"
    );
}
