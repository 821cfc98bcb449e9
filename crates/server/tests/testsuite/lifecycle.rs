//! The life of a sale's hot copy (fenced epochs: no order number twice, a rebuild resumes
//! itself, promises lost with Redis are reported) and the faults found around it, each with a
//! test that fails without its fix. Real Redis, real MariaDB, real HTTP.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::{code, order_no, Stack};
use flashsale_core::{SaleState, SkuId};
use flashsale_engine::reconcile::{Journal, ReconcileConfig, Reconciler, Trigger};
use flashsale_server::Config;
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::redis_server::{self, RedisServer};
use flashsale_testkit::wait;
use reqwest::StatusCode;
use serde_json::json;

/// Redis at `redis_url`, a database of its own, no persister and no reconcile worker: the
/// test decides when events move.
async fn quiet_stack(redis_url: &str, edit: impl FnOnce(&mut Config)) -> Stack {
    Stack::on_redis(redis_url, TestDatabase::create().await, |cfg| {
        cfg.engine.persister.run = false;
        cfg.engine.reconcile.interval = Duration::ZERO;
        edit(cfg);
    })
    .await
}

fn key(text: &str) -> flashsale_core::RequestKey {
    flashsale_core::RequestKey::parse(text).unwrap()
}

/// One unit bought by `user`; its order number.
async fn buy_ok(stack: &Stack, user: u64, sku: u64, rid: &str) -> String {
    order_no(&stack.buy_ok(user, sku, rid, 1).await)
}

/// Runs the persister of `stack`'s config until the database holds every hot event.
async fn persist(stack: &Stack, sku: u64) {
    let mut cfg = stack.config.clone();
    cfg.engine.persister.run = true;
    let workers = flashsale_server::serve::Workers::start(&cfg).await.unwrap();
    stack.drain(sku).await;
    workers.shutdown().await.unwrap();
}

fn state(stack: &Stack) -> flashsale_server::AppState {
    stack.server.as_ref().unwrap().state.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_warm_never_hands_an_order_number_out_twice() {
    let stack = quiet_stack(&redis_server::shared_url(), |_| {}).await;
    stack.live_sale(42, 100, 1).await;
    let mut nos = Vec::new();
    for user in 1..=3 {
        nos.push(buy_ok(&stack, user, 42, "r").await);
    }
    assert_eq!(nos, ["42-1-1", "42-1-2", "42-1-3"]);
    let (s, b) = stack.sale_action(42, "warm").await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "SALE_EXISTS"), "{b}");
    let (s, b) = stack
        .admin("POST", "/api/v1/sales/42/warm?force=true", None)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    for user in 4..=6 {
        nos.push(buy_ok(&stack, user, 42, "r").await);
    }
    let distinct: std::collections::HashSet<&String> = nos.iter().collect();
    assert_eq!(distinct.len(), 6, "{nos:?}");
    assert_eq!(
        buy_ok(&stack, 1, 42, "r").await,
        "42-1-1",
        "a retry, first outcome"
    );
    stack.buy_refused(1, 42, "again", 1, "LIMIT_EXCEEDED").await;

    persist(&stack, 42).await;
    let orders = stack.store().orders(SkuId(42)).await.unwrap();
    let mut held: Vec<(String, u64)> = orders
        .iter()
        .map(|o| (o.order_no.to_string(), o.user_id.0))
        .collect();
    held.sort();
    let mut answered: Vec<(String, u64)> = nos.iter().cloned().zip(1..=6).collect();
    answered.sort();
    assert_eq!(held, answered, "every number once, with its own buyer");
    common::assert_invariants(stack.store().as_ref(), 42).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_that_died_midway_is_resumed_by_the_reconciler() {
    let stack = quiet_stack(&redis_server::shared_url(), |_| {}).await;
    stack.live_sale(43, 10, 1).await;
    let first = buy_ok(&stack, 1, 43, "a").await;
    persist(&stack, 43).await;
    // A rebuild that took the epoch and loaded the new copy, then died: never opened, its
    // orders never restored.
    let st = state(&stack);
    let stored = st.shop.store().sale(SkuId(43)).await.unwrap().unwrap();
    let epoch = st
        .shop
        .store()
        .take_epoch(SkuId(43), stored.epoch)
        .await
        .unwrap();
    let epoch = epoch.expect("the epoch");
    st.shop.ledger().fence(SkuId(43)).await.unwrap();
    st.shop
        .ledger()
        .load(&stored.sale, &stored.counters, epoch)
        .await
        .unwrap();
    let (s, b) = stack.buy(2, 43, "b", json!(1)).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
    );

    let mut reconciler = st.reconciler();
    reconciler.config = ReconcileConfig {
        rebuild_stall: Duration::ZERO,
        ..ReconcileConfig::default()
    };
    let report = reconciler
        .run_sale(SkuId(43), true, Trigger::Cli)
        .await
        .unwrap();
    assert!(report.hot_behind, "{report:?}");
    assert!(
        report.repairs.iter().any(|r| r.starts_with("rebuild")),
        "{report:?}"
    );
    assert!(report.after.as_ref().unwrap().ok, "{report:#?}");
    assert_eq!(
        buy_ok(&stack, 1, 43, "a").await,
        first,
        "restored: first outcome"
    );
    assert_eq!(buy_ok(&stack, 2, 43, "b").await, "43-3-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_lost_with_redis_is_reported() {
    let mut redis = RedisServer::spawn().await;
    let stack = quiet_stack(&redis.url(), |_| {}).await;
    stack
        .live_sale_with(json!({"sku_id": 44, "name": "t", "total_stock": 10,
            "per_user_limit": 1, "mode": "reserve", "payment_timeout_ms": 600_000}))
        .await;
    let paid = buy_ok(&stack, 1, 44, "a").await;
    let kept = buy_ok(&stack, 2, 44, "b").await;
    // The deductions reach the database; the payment never does.
    stack.repair(44).await;
    let pay = format!("/api/v1/orders/{paid}/pay");
    let (s, b) = stack.call("POST", &pay, Some(&stack.token(1)), None).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("PAID")),
        "{b}"
    );
    redis.kill();
    redis.start().await;
    // Before the repair the live sale has no hot copy: buyers are told to retry, not that
    // the sale has not started.
    let st = &stack;
    wait::until(
        "a purchase told the copy is being restored",
        Duration::from_secs(20),
        || async move {
            let (s, b) = st.buy(3, 44, "c", json!(1)).await;
            assert_ne!(code(&b), "NOT_STARTED", "{b}");
            let restoring = b["message"]
                .as_str()
                .is_some_and(|m| m.contains("being restored"));
            (s == StatusCode::SERVICE_UNAVAILABLE && restoring).then_some(())
        },
    )
    .await;

    let report = wait::until(
        "a repair once Redis is back",
        Duration::from_secs(20),
        || async move {
            let (s, report) = st
                .admin("POST", "/api/v1/admin/reconcile/44/repair", None)
                .await;
            (s == StatusCode::OK).then_some(report)
        },
    )
    .await;
    assert_eq!(report["lost_resolutions"], json!([format!("{paid} paid")]));
    assert_eq!(report["lost_orders"], json!([]));
    let runs = stack
        .store()
        .reconcile_runs(Some(SkuId(44)), 10)
        .await
        .unwrap();
    assert!(runs
        .iter()
        .any(|r| r.lost_resolutions == [format!("{paid} paid")]));
    // The order the database holds is back, with its hold.
    let (s, b) = stack.order(2, &kept).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("RESERVED"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sold_out_for_two_units_does_not_flag_a_sale_with_one_left() {
    let stack = Stack::embedded().await;
    stack.live_sale(45, 3, 2).await;
    let (s, _) = stack.buy(1, 45, "a", json!(2)).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    stack.buy_refused(2, 45, "b", 2, "SOLD_OUT").await;
    // Had the flag been set, it would be within this bound (a local load).
    let flags = state(&stack).shop.clone();
    let set = wait::within(Duration::from_millis(300), || {
        let flags = flags.clone();
        async move { flags.sold_out_answers(SkuId(45), &key("3:c")).then_some(()) }
    })
    .await;
    assert!(
        set.is_none(),
        "the sold-out flag was set with one unit left"
    );
    let (s, b) = stack.buy(3, 45, "c", json!(1)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_sale_reads_its_accepted_keys_once() {
    let redis = RedisServer::spawn().await;
    let stack = quiet_stack(&redis.url(), |c| {
        c.tunables.cache_ttl = Duration::from_millis(100);
    })
    .await;
    stack.live_sale(46, 1, 1).await;
    buy_ok(&stack, 1, 46, "a").await;
    let flags = state(&stack).shop.clone();
    for round in 0..2 {
        let (s, b) = stack.buy(2 + round, 46, "b", json!(1)).await;
        assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "SOLD_OUT"), "{b}");
        let flags = flags.clone();
        wait::until("the flag to be set", Duration::from_secs(10), || {
            let flags = flags.clone();
            async move { flags.sold_out_answers(SkuId(46), &key("9:z")).then_some(()) }
        })
        .await;
        wait::until("the flag to lapse", Duration::from_secs(10), || {
            let flags = flags.clone();
            async move { (!flags.sold_out_answers(SkuId(46), &key("9:z"))).then_some(()) }
        })
        .await;
    }
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let hkeys = info
        .lines()
        .find(|l| l.starts_with("cmdstat_hkeys:"))
        .unwrap_or_default();
    assert!(hkeys.starts_with("cmdstat_hkeys:calls=1,"), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_starts_while_redis_is_down_and_serves_once_it_is_up() {
    let mut redis = RedisServer::spawn().await;
    redis.kill();
    let stack = quiet_stack(&redis.url(), |_| {}).await;
    let (s, _) = stack.call("GET", "/readyz", None, None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let body = json!({"sku_id": 47, "name": "t", "total_stock": 5, "per_user_limit": 1});
    let (s, b) = stack.create_sale(body).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = stack.sale_action(47, "warm").await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
    );
    redis.start().await;
    stack.until_ready().await;
    let st = &stack;
    let (s, b) = stack.sale_action(47, "warm").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    wait::until("a purchase to go through", Duration::from_secs(20), || async move {
        (st.buy(1, 47, "a", json!(1)).await.0 == StatusCode::ACCEPTED).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_skus_and_times_that_validate_also_warm() {
    let stack = quiet_stack(&redis_server::shared_url(), |_| {}).await;
    let sku: u64 = 1_000_000_000_000_000 + 7;
    let now = flashsale_engine::now_ms();
    stack
        .live_sale_with(json!({"sku_id": sku, "name": "big", "total_stock": 5,
            "per_user_limit": 1, "starts_at_ms": now, "ends_at_ms": 4_000_000_000_000_000i64}))
        .await;
    assert_eq!(buy_ok(&stack, 1, sku, "a").await, format!("{sku}-1-1"));
    let body = json!({"sku_id": 1u64 << 53, "name": "too big", "total_stock": 5});
    let (s, b) = stack.create_sale(body).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        "{b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_and_the_reconciler_find_hot_sales_where_they_live() {
    let hot = RedisServer::spawn().await;
    let stack = quiet_stack(&redis_server::shared_url(), |c| {
        c.engine.ledger.hot_sales.redis_url = Some(hot.url());
        c.engine.ledger.hot_sales.skus = vec![48];
    })
    .await;
    stack.live_sale(48, 5, 1).await;
    buy_ok(&stack, 1, 48, "a").await;
    // What `flashsale worker` and `flashsale reconcile` build from the same settings.
    let (ledger, store) = flashsale_engine::backends::open(&stack.config.engine)
        .await
        .unwrap();
    assert!(ledger.hot_snapshot(SkuId(48)).await.unwrap().is_some());
    let reconciler = Reconciler::new(ledger, store, Arc::new(Journal::default()));
    let report = reconciler
        .run_sale(SkuId(48), false, Trigger::Cli)
        .await
        .unwrap();
    assert!(!report.hot_behind, "{report:?}");
    assert_eq!(report.hot_epoch, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broken_sale_does_not_stop_expiry_or_reconciliation_of_the_others() {
    let redis = RedisServer::spawn().await;
    let stack = Stack::on_redis(&redis.url(), TestDatabase::create().await, |cfg| {
        cfg.engine.reconcile.interval = Duration::ZERO;
    })
    .await;
    for sku in [49, 50] {
        stack
            .live_sale_with(json!({"sku_id": sku, "name": "t", "total_stock": 5,
                "per_user_limit": 1, "mode": "reserve", "payment_timeout_ms": 200}))
            .await;
    }
    // Sale 49 (listed first) has a broken hash: every script on it fails.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{}:{{49}}:sale", stack.config.engine.ledger.redis_prefix);
    let _: i64 = redis::cmd("HSET")
        .arg(&key)
        .arg("reserved")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let held = buy_ok(&stack, 1, 50, "a").await;
    let path = format!("/api/v1/orders/{held}");
    let st = &stack;
    let token = stack.token(1);
    let token = &token;
    wait::until("sale 50's hold to expire", Duration::from_secs(20), || {
        let path = path.clone();
        async move {
            let (_, b) = st.call("GET", &path, Some(token), None).await;
            (b["status"] == "EXPIRED").then_some(())
        }
    })
    .await;
    let reports = state(&stack)
        .reconciler()
        .run(None, false, Trigger::Cli)
        .await
        .expect("a pass over every sale");
    let skus: Vec<u64> = reports.iter().map(|r| r.sku_id).collect();
    assert_eq!(skus, vec![49, 50]);
    assert!(!reports[0].ok, "{:?}", reports[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_pause_never_reopens_a_sale_an_operator_ended() {
    let stack = quiet_stack(&redis_server::shared_url(), |c| {
        c.tunables.gateway.backpressure_lag = 3;
        c.tunables.gateway.backpressure_interval = Duration::from_millis(50);
        c.tunables.gateway.backpressure_auto_pause = true;
    })
    .await;
    stack.live_sale(51, 100, 1).await;
    // Past the bound of 3 the 50 ms ticker may engage back-pressure before the last buy
    // (429 BUSY): that is the state this test wants, not a failure.
    for user in 1..=5 {
        let (s, b) = stack.buy(user, 51, "a", json!(1)).await;
        if s == StatusCode::TOO_MANY_REQUESTS && code(&b) == "BUSY" && user > 3 {
            break;
        }
        assert_eq!(s, StatusCode::ACCEPTED, "{b}");
    }
    let conn = redis::Client::open(redis_server::shared_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = format!("{}:{{51}}:sale", stack.config.engine.ledger.redis_prefix);
    let hot_state = || {
        let (mut conn, key) = (conn.clone(), key.clone());
        async move {
            let state: String = redis::cmd("HGET")
                .arg(&key)
                .arg("state")
                .query_async(&mut conn)
                .await
                .unwrap();
            state
        }
    };
    wait::until(
        "back-pressure to pause the sale",
        Duration::from_secs(10),
        || async { (hot_state().await == "paused").then_some(()) },
    )
    .await;
    let (s, b) = stack.sale_action(51, "end").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    persist(&stack, 51).await;
    let st = &stack;
    wait::until(
        "back-pressure to let go",
        Duration::from_secs(10),
        || async move {
            let m = st.metrics_text().await;
            m.contains("flashsale_backpressure_engaged{sku=\"51\"} 0")
                .then_some(())
        },
    )
    .await;
    // The hot copy's state is what the auto-pause moves: it must stay ended.
    let reopened = wait::within(Duration::from_secs(1), || async {
        let state = hot_state().await;
        (state != "ended").then_some(state)
    })
    .await;
    assert_eq!(reopened, None, "the auto-pause reopened an ended sale");
    let stored = stack.store().sale(SkuId(51)).await.unwrap().unwrap();
    assert_eq!(stored.sale.state, SaleState::Ended);
}

/// An ended sale stops costing: once a run finds it settled (ended in the database and its
/// copy, no hold left, nothing in flight, all in order), the worker's passes skip it; a sale
/// still live, or ended with a hold left, is still audited; an explicit run still runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_sale_is_no_longer_audited_by_every_pass() {
    let stack = quiet_stack(&redis_server::shared_url(), |_| {}).await;
    stack.live_sale(51, 5, 1).await;
    stack
        .live_sale_with(json!({"sku_id": 52, "name": "t", "total_stock": 5,
            "per_user_limit": 1, "mode": "reserve", "payment_timeout_ms": 600_000}))
        .await;
    stack.live_sale(53, 5, 1).await;
    for sku in [51, 52, 53] {
        buy_ok(&stack, 1, sku, "a").await;
        persist(&stack, sku).await;
    }
    for sku in [51, 52] {
        let (s, b) = stack.sale_action(sku, "end").await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let reconciler = state(&stack).reconciler();
    let audited = || async {
        let reports = reconciler.run(None, false, Trigger::Worker).await.unwrap();
        let mut skus: Vec<u64> = reports.iter().map(|r| r.sku_id).collect();
        skus.sort();
        skus
    };
    assert_eq!(audited().await, vec![51, 52, 53]);
    assert_eq!(
        audited().await,
        vec![52, 53],
        "51 is settled; 52 holds a unit"
    );
    let report = reconciler
        .run_sale(SkuId(51), false, Trigger::Cli)
        .await
        .unwrap();
    assert!(report.ok && report.settled(), "{report:?}");
}
