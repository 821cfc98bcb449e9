//! Issue 4: reserve mode end to end over HTTP, the reconciler (diff 0 during a live spike,
//! rebuild after Redis lost its data, loss reported by order_no), and the fault suite with
//! throwaway servers and real processes. Every test ends with I1–I7 from the database.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{code, Stack};
use flashsale_core::{OrderNo, OrderStatus, OrderStore, SkuId};
use flashsale_engine::persister::{Persister, PersisterConfig};
use flashsale_server::gateway::GatewayConfig;
use flashsale_testkit::mariadb::{MariaDbServer, TestDatabase};
use flashsale_testkit::redis_server::{self, RedisServer};
use flashsale_testkit::wait;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::broadcast;

async fn stack_on(redis_url: &str, db: TestDatabase, run_persister: bool) -> Stack {
    Stack::on_redis(redis_url, db, |cfg| {
        cfg.tunables.gateway = GatewayConfig::unlimited();
        cfg.engine.persister.run = run_persister;
    })
    .await
}

async fn embedded_stack() -> Stack {
    Stack::embedded_with(|cfg| cfg.tunables.gateway = GatewayConfig::unlimited()).await
}

async fn reserve_sale(stack: &Stack, sku: u64, total: u64, timeout_ms: u64) {
    stack
        .live_sale_with(
            json!({"sku_id": sku, "name": "reserve", "total_stock": total,
            "per_user_limit": 1, "mode": "reserve", "payment_timeout_ms": timeout_ms}),
        )
        .await;
}

async fn order_call(stack: &Stack, user: u64, no: &str, action: &str) -> (StatusCode, Value) {
    stack
        .call(
            "POST",
            &format!("/api/v1/orders/{no}/{action}"),
            Some(&stack.token(user)),
            None,
        )
        .await
}

/// Waits until the database has applied everything and no hold is left RESERVED.
async fn settle(stack: &Stack, sku: u64) {
    stack.drain(sku).await;
    let store = stack.store();
    wait::until("no hold left RESERVED", Duration::from_secs(30), || {
        let store = store.clone();
        async move {
            let orders = store.orders(SkuId(sku)).await.ok()?;
            (!orders.iter().any(|o| o.status == OrderStatus::Reserved)).then_some(())
        }
    })
    .await;
    stack.drain(sku).await;
}

/// The reconciler's verdict on a quiet sale: everything holds, diff 0.
async fn assert_reconciled(stack: &Stack, sku: u64) {
    let (s, b) = stack
        .admin("GET", &format!("/api/v1/admin/reconcile?sku={sku}"), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let report = &b[0];
    assert_eq!(report["ok"], json!(true), "{report:#}");
    for field in ["total", "available", "reserved", "sold", "seq"] {
        assert_eq!(report["diff"][field], json!(0), "{field}: {report:#}");
    }
}

// ---------------------------------------------------------------- reserve mode over HTTP

/// `action` (pay, cancel) on order `no` as `user`, which must answer 200 with `status`.
async fn resolved(stack: &Stack, user: u64, no: &str, action: &str, status: &str) {
    let (s, b) = order_call(stack, user, no, action).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some(status)),
        "{b}"
    );
}

async fn reserve_pay_cancel_expire(stack: &Stack) {
    let sku = 71;
    reserve_sale(stack, sku, 3, 2_000).await;
    let mut orders = HashMap::new();
    for u in 1..=3u64 {
        let (s, b) = stack.buy(u, sku, &format!("r{u}"), json!(1)).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{b}");
        assert!(b["deadline_ms"].as_i64().unwrap() > 0, "{b}");
        orders.insert(u, b["order_no"].as_str().unwrap().to_owned());
    }
    stack.buy_refused(4, sku, "r4", 1, "SOLD_OUT").await;

    // Pay once; a second pay answers PAID again (a retry's first outcome), a cancel is
    // ALREADY_RESOLVED; a stranger sees nothing.
    for _ in 0..2 {
        resolved(stack, 1, &orders[&1], "pay", "PAID").await;
    }
    let (s, b) = order_call(stack, 1, &orders[&1], "cancel").await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "ALREADY_RESOLVED"));
    let (s, b) = order_call(stack, 9, &orders[&3], "pay").await;
    assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "ORDER_NOT_FOUND"));

    // Cancel gives the unit back and clears the sold-out flag: user 4 buys it.
    resolved(stack, 2, &orders[&2], "cancel", "CANCELLED").await;
    let (s, b) = order_call(stack, 2, &orders[&2], "pay").await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "ALREADY_RESOLVED"));
    let (s, b) = stack.buy(4, sku, "r4", json!(1)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "stock came back: {b}");
    let o4 = b["order_no"].as_str().unwrap().to_owned();

    // User 3 lets the hold expire: the worker expires it, a late pay is HOLD_EXPIRED.
    let store = stack.store();
    let no3 = OrderNo::parse(&orders[&3]).unwrap();
    wait::until("hold 3 to expire", Duration::from_secs(20), || {
        let (store, no3) = (store.clone(), no3);
        async move {
            let o = store.order(&no3).await.ok()??;
            (o.status == OrderStatus::Expired).then_some(())
        }
    })
    .await;
    let (s, b) = order_call(stack, 3, &orders[&3], "pay").await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "HOLD_EXPIRED"));
    let (s, b) = order_call(stack, 3, &orders[&3], "cancel").await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");

    settle(stack, sku).await;
    let status = |no: &str| {
        let store = store.clone();
        let no = OrderNo::parse(no).unwrap();
        async move { store.order(&no).await.unwrap().unwrap().status }
    };
    assert_eq!(status(&orders[&1]).await, OrderStatus::Paid);
    assert_eq!(status(&orders[&2]).await, OrderStatus::Cancelled);
    assert_eq!(status(&orders[&3]).await, OrderStatus::Expired);
    assert_eq!(status(&o4).await, OrderStatus::Expired);
    let stored = store.sale(SkuId(sku)).await.unwrap().unwrap();
    let c = stored.counters;
    assert_eq!((c.available, c.reserved, c.sold), (2, 0, 1), "{c:?}");
    // 4 deductions + pay + cancel + 2 expiries.
    assert_eq!(c.seq, 8);
    common::assert_invariants(store.as_ref(), sku).await;
    assert_reconciled(stack, sku).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_mode_over_http_redis_mysql() {
    let db = TestDatabase::create().await;
    let stack = stack_on(&redis_server::shared_url(), db, true).await;
    reserve_pay_cancel_expire(&stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_mode_over_http_embedded() {
    let stack = embedded_stack().await;
    reserve_pay_cancel_expire(&stack).await;
}

// ---------------------------------------------------------------- spikes

/// Buys once per user, retrying the same request_id on 503/429 like a real client, until an
/// answer that is final (202 or a 409). Returns (user, status, order_no).
async fn buyer(stack: &Stack, sku: u64, user: u64, deadline: Instant) -> (u64, u16, String) {
    loop {
        let (s, b) = stack.buy(user, sku, &format!("r{user}"), json!(1)).await;
        if s == StatusCode::ACCEPTED || s == StatusCode::CONFLICT || Instant::now() > deadline {
            let no = b["order_no"].as_str().unwrap_or("").to_owned();
            return (user, s.as_u16(), no);
        }
        // Client back-off between retries (not synchronisation).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `users` buyers, 32 at a time; `progress` counts final answers.
async fn spike(
    stack: &Stack,
    sku: u64,
    users: std::ops::RangeInclusive<u64>,
    progress: &AtomicUsize,
) -> Vec<(u64, u16, String)> {
    let deadline = Instant::now() + Duration::from_secs(25);
    futures::stream::iter(users)
        .map(|u| async move {
            let r = buyer(stack, sku, u, deadline).await;
            progress.fetch_add(1, Ordering::Relaxed);
            r
        })
        .buffer_unordered(32)
        .collect()
        .await
}

fn accepted(results: &[(u64, u16, String)]) -> BTreeSet<String> {
    results
        .iter()
        .filter(|r| r.1 == 202)
        .map(|r| r.2.clone())
        .collect()
}

async fn stored_order_nos(store: &dyn OrderStore, sku: u64) -> BTreeSet<String> {
    store
        .orders(SkuId(sku))
        .await
        .unwrap()
        .into_iter()
        .filter(|o| o.status.is_live())
        .map(|o| o.order_no.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_diff_is_zero_during_a_live_spike() {
    let db = TestDatabase::create().await;
    let stack = stack_on(&redis_server::shared_url(), db, true).await;
    let sku = 72;
    stack.live_sale(sku, 600, 1).await;
    let state = stack.server.as_ref().unwrap().state.clone();
    let reconciler = state.reconciler();
    let progress = AtomicUsize::new(0);
    let buying = spike(&stack, sku, 1..=800, &progress);
    let checking = async {
        let (mut runs, mut folded) = (0, 0);
        while progress.load(Ordering::Relaxed) < 800 {
            let r = reconciler.inspect(SkuId(sku)).await.unwrap();
            assert!(r.violations.is_empty(), "{r:#?}");
            assert!(r.findings.is_empty() && !r.hot_behind, "{r:#?}");
            let diff = r.diff.as_ref().expect("a diff");
            assert_eq!(
                (
                    diff.total,
                    diff.available,
                    diff.reserved,
                    diff.sold,
                    diff.seq
                ),
                (0, 0, 0, 0, 0),
                "{r:#?}"
            );
            runs += 1;
            folded += usize::from(r.in_flight > 0);
        }
        (runs, folded)
    };
    let (results, (runs, folded)) = tokio::join!(buying, checking);
    eprintln!("{runs} reconciler reads during the spike, {folded} with events in flight");
    assert!(runs > 0);
    let accepted = accepted(&results);
    assert_eq!(accepted.len(), 600);
    stack.drain(sku).await;
    let store = stack.store();
    assert_eq!(stored_order_nos(store.as_ref(), sku).await, accepted);
    common::assert_invariants(store.as_ref(), sku).await;
    assert_reconciled(&stack, sku).await;
    let runs = store.reconcile_runs(Some(SkuId(sku)), 10).await.unwrap();
    assert!(
        runs.iter().any(|r| r.trigger == "admin" && r.ok),
        "{runs:?}"
    );

    // On demand from the command line, with repairs: nothing to repair, all reconciled.
    let dir = tempfile::tempdir().unwrap();
    let out = flashsale_command(&stack, dir.path())
        .args(["reconcile", "--sku", &sku.to_string(), "--repair"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reports[0]["ok"], json!(true), "{reports:#}");
    assert_eq!(reports[0]["repairs"], json!([]), "{reports:#}");
    let runs = store.reconcile_runs(Some(SkuId(sku)), 1).await.unwrap();
    assert_eq!(runs[0].trigger, "cli");
}

/// Waits until `progress` counts `answered` answers of a spike.
async fn until_answered(progress: &AtomicUsize, answered: usize, what: &str) {
    wait::until(what, Duration::from_secs(20), || async {
        (progress.load(Ordering::Relaxed) >= answered).then_some(())
    })
    .await;
}

/// Sale `sku` (300 units) bought by 400 buyers while `fault` runs (`progress` counts the
/// answers): every unit is sold once the retries got through, every accepted purchase
/// reaches the database, the invariants hold and a reconciliation finds nothing to repair.
async fn spike_through(
    stack: &Stack,
    sku: u64,
    progress: &AtomicUsize,
    fault: impl std::future::Future<Output = ()>,
) {
    stack.live_sale(sku, 300, 1).await;
    let buying = spike(stack, sku, 1..=400, progress);
    let (results, ()) = tokio::join!(buying, fault);
    let accepted = accepted(&results);
    assert_eq!(
        accepted.len(),
        300,
        "every unit sold once the retries got through"
    );
    stack.drain(sku).await;
    let store = stack.store();
    assert_eq!(
        stored_order_nos(store.as_ref(), sku).await,
        accepted,
        "every accepted purchase reached the database"
    );
    common::assert_invariants(store.as_ref(), sku).await;
    assert_reconciled(stack, sku).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_with_aof_always_mid_spike_loses_nothing() {
    let mut redis =
        RedisServer::spawn_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    let stack = stack_on(&redis.url(), TestDatabase::create().await, true).await;
    let progress = AtomicUsize::new(0);
    let fault = async {
        until_answered(&progress, 60, "the spike to be under way").await;
        redis.kill();
        redis.start().await;
    };
    spike_through(&stack, 73, &progress, fault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_killed_mid_spike_then_everything_lands() {
    let mut maria = MariaDbServer::spawn().await;
    let db = TestDatabase::create_on(&maria.url()).await;
    let stack = stack_on(&redis_server::shared_url(), db, true).await;
    let progress = AtomicUsize::new(0);
    let fault = async {
        until_answered(&progress, 60, "the spike to be under way").await;
        maria.kill();
        let what = "more buyers answered while the database is down";
        until_answered(&progress, 200, what).await;
        maria.start().await;
    };
    spike_through(&stack, 74, &progress, fault).await;
}

// ---------------------------------------------------------------- Redis loses its data

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_without_persistence_is_rebuilt_and_the_loss_reported() {
    let mut redis = RedisServer::spawn().await;
    let db = TestDatabase::create().await;
    let stack = stack_on(&redis.url(), db, false).await;
    let sku = 75;
    stack.live_sale(sku, 100, 1).await;
    let store = stack.store();

    // A persister we can stop: it moves the first 30 purchases, then stops.
    let redis_url = redis.url();
    let persister = |consumer: &str| {
        let mut config = PersisterConfig::new(
            &redis_url,
            &stack.config.engine.ledger.redis_prefix,
            consumer,
        );
        config.bounds.claim_idle_ms = 200;
        let (stop, rx) = broadcast::channel(1);
        let task = tokio::spawn(Persister::new(config, store.clone()).run(rx));
        (stop, task)
    };
    let (stop, task) = persister("p1");
    let progress = AtomicUsize::new(0);
    let first = accepted(&spike(&stack, sku, 1..=30, &progress).await);
    stack.drain(sku).await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();

    // 20 more are accepted but only reach the stream: Redis then dies with them.
    let lost = accepted(&spike(&stack, sku, 31..=50, &progress).await);
    assert_eq!((first.len(), lost.len()), (30, 20));
    redis.kill();
    redis.start().await;

    // The reconciler sees the hot sale gone, rebuilds it from the database in a new epoch
    // and names every accepted-but-lost purchase (its worker may get there first: the loss
    // is then in its stored run).
    // 503 while the ledger's connection finds the new server; then 200.
    let b = wait::until("a repair run", Duration::from_secs(20), || async {
        let path = format!("/api/v1/admin/reconcile/{sku}/repair");
        let (s, b) = stack.admin("POST", &path, None).await;
        assert!(
            s == StatusCode::OK || s == StatusCode::SERVICE_UNAVAILABLE,
            "{s} {b}"
        );
        (s == StatusCode::OK).then_some(b)
    })
    .await;
    let runs = store.reconcile_runs(Some(SkuId(sku)), 100).await.unwrap();
    let reported: BTreeSet<String> = runs
        .iter()
        .flat_map(|r| r.lost_orders.iter().cloned())
        .collect();
    assert_eq!(
        reported, lost,
        "every lost purchase named, nothing else: {b:#}"
    );
    assert!(
        runs.iter()
            .any(|r| r.repairs.iter().any(|l| l.starts_with("rebuild"))),
        "{runs:?}"
    );
    let stored = store.sale(SkuId(sku)).await.unwrap().unwrap();
    assert_eq!(stored.epoch, 2);
    assert_eq!(stored.counters.sold, 30);

    // The sale goes on: the first 30 buyers are still remembered (replay, limit), the
    // stock the lost ones held is sold again, never more than the total.
    let (s, b) = stack.buy(1, sku, "r1", json!(1)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{b}");
    assert_eq!(b["replayed"], json!(true));
    assert!(first.contains(b["order_no"].as_str().unwrap()));
    stack
        .buy_refused(1, sku, "another", 1, "LIMIT_EXCEEDED")
        .await;
    let (stop, task) = persister("p2");
    let after = spike(&stack, sku, 31..=140, &progress).await;
    let again = accepted(&after);
    assert_eq!(again.len(), 70, "the 70 units left, no more");
    assert!(again.iter().all(|no| no.starts_with(&format!("{sku}-2-"))));
    assert!(
        again.is_disjoint(&lost),
        "lost numbers are never handed out again"
    );
    stack.drain(sku).await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    let held = stored_order_nos(store.as_ref(), sku).await;
    assert_eq!(held, first.union(&again).cloned().collect());
    common::assert_invariants(store.as_ref(), sku).await;
    assert_reconciled(&stack, sku).await;
}

// ---------------------------------------------------------------- reserve mode under load

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_under_load_pay_cancel_expire_with_pays_racing_expiries() {
    let db = TestDatabase::create().await;
    let stack = stack_on(&redis_server::shared_url(), db, true).await;
    let sku = 76;
    let total = 80u64;
    reserve_sale(&stack, sku, total, 3_000).await;
    let progress = AtomicUsize::new(0);
    let results = spike(&stack, sku, 1..=120, &progress).await;
    let holds: Vec<(u64, String)> = results
        .iter()
        .filter(|r| r.1 == 202)
        .map(|r| (r.0, r.2.clone()))
        .collect();
    assert_eq!(holds.len() as u64, total);
    let hot = stack.server.as_ref().unwrap().state.shop.ledger().clone();
    let mut deadlines: HashMap<String, i64> = HashMap::new();
    for (user, no) in &holds {
        let o = hot
            .order(&OrderNo::parse(no).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(o.user_id.0, *user);
        deadlines.insert(no.clone(), o.deadline_ms);
    }

    // Half pay now, a quarter cancel, a quarter race their pay against the expiry.
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let answers: Vec<(usize, u16, String)> = futures::stream::iter(holds.iter().enumerate())
        .map(|(i, (user, no))| {
            let stack = &stack;
            let deadline = deadlines[no];
            async move {
                let action = match i % 4 {
                    0 | 1 => "pay",
                    2 => "cancel",
                    _ => {
                        // Pay around the deadline (from 100 ms before to 20 ms after), when
                        // the expiry worker is due too: some pays win, some lose.
                        let at = deadline - 100 + ((i / 4) % 20) as i64 * 6;
                        wait::until("the hold's deadline", Duration::from_secs(10), || async {
                            (now_ms() >= at).then_some(())
                        })
                        .await;
                        "pay"
                    }
                };
                let (s, b) = order_call(stack, *user, no, action).await;
                (i, s.as_u16(), code(&b).to_owned())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut paid = 0u64;
    for (i, status, code) in &answers {
        match i % 4 {
            0..=2 => assert_eq!(*status, 200, "hold {i}: {code}"),
            _ => assert!(
                *status == 200 || (*status == 409 && code == "HOLD_EXPIRED"),
                "hold {i}: {status} {code}"
            ),
        }
        if i % 4 != 2 && *status == 200 {
            paid += 1;
        }
    }
    let raced = answers.iter().filter(|a| a.0 % 4 == 3).count();
    let raced_paid = answers
        .iter()
        .filter(|a| a.0 % 4 == 3 && a.1 == 200)
        .count();
    eprintln!("racing pays: {raced_paid} of {raced} beat the expiry");

    settle(&stack, sku).await;
    let store = stack.store();
    let orders = store.orders(SkuId(sku)).await.unwrap();
    let count = |st: OrderStatus| orders.iter().filter(|o| o.status == st).count() as u64;
    assert_eq!(count(OrderStatus::Paid), paid);
    assert_eq!(count(OrderStatus::Cancelled), total / 4);
    assert_eq!(count(OrderStatus::Expired), total / 4 - raced_paid as u64);
    assert_eq!(count(OrderStatus::Reserved), 0);
    let c = store.sale(SkuId(sku)).await.unwrap().unwrap().counters;
    assert_eq!((c.sold, c.reserved, c.available), (paid, 0, total - paid));
    common::assert_invariants(store.as_ref(), sku).await;
    assert_reconciled(&stack, sku).await;
}

// ---------------------------------------------------------------- the persister process

/// The `flashsale` binary (built by `cargo test --workspace`; built here when missing).
fn flashsale_bin() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let bin = target.join("debug").join("flashsale");
    if !bin.exists() {
        let ok = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "flashsale", "--bin", "flashsale"])
            .status()
            .expect("run cargo build")
            .success();
        assert!(ok, "cargo build of the flashsale binary failed");
    }
    bin
}

/// The `flashsale` binary configured like `stack` (its Redis, prefix, database, secrets),
/// with `data_dir` as its data directory.
fn flashsale_command(stack: &Stack, data_dir: &std::path::Path) -> std::process::Command {
    let ledger = &stack.config.engine.ledger;
    let mut command = std::process::Command::new(flashsale_bin());
    command
        .env("FLASHSALE_REDIS_URL", ledger.redis_url.as_ref().unwrap())
        .env("FLASHSALE_REDIS_PREFIX", &ledger.redis_prefix)
        .env("FLASHSALE_DATABASE_URL", stack.database_url())
        .env("FLASHSALE_DATA_DIR", data_dir)
        .env("FLASHSALE_JWT_SECRET", common::JWT_SECRET)
        .env("FLASHSALE_ADMIN_TOKEN", common::ADMIN);
    command
}

fn spawn_worker(stack: &Stack, data_dir: &std::path::Path) -> std::process::Child {
    flashsale_command(stack, data_dir)
        .arg("worker")
        .env("FLASHSALE_RECONCILE_INTERVAL_MS", "0")
        .env(
            "FLASHSALE_WORKER_LISTEN",
            format!("127.0.0.1:{}", flashsale_testkit::free_port()),
        )
        .env("FLASHSALE_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn flashsale worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persister_process_sigkilled_mid_spike_effects_exactly_once() {
    let bin = flashsale_bin();
    assert!(bin.exists());
    let db = TestDatabase::create().await;
    let stack = stack_on(&redis_server::shared_url(), db, false).await;
    let sku = 77;
    stack.live_sale(sku, 400, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let store = stack.store();
    let mut child = spawn_worker(&stack, dir.path());
    let progress = AtomicUsize::new(0);
    let buying = spike(&stack, sku, 1..=500, &progress);
    let fault = async {
        wait::until(
            "the worker process to persist",
            Duration::from_secs(20),
            || {
                let store = store.clone();
                async move {
                    let s = store.sale(SkuId(sku)).await.ok()??;
                    (s.counters.seq >= 50).then_some(())
                }
            },
        )
        .await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        spawn_worker(&stack, dir.path())
    };
    let (results, mut second) = tokio::join!(buying, fault);
    let accepted = accepted(&results);
    assert_eq!(accepted.len(), 400);
    stack.drain(sku).await;
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(stored_order_nos(store.as_ref(), sku).await, accepted);
    let events = store.events(SkuId(sku)).await.unwrap();
    assert_eq!(events.len(), 400, "each event stored exactly once");
    let stored = store.sale(SkuId(sku)).await.unwrap().unwrap();
    assert_eq!((stored.counters.sold, stored.counters.seq), (400, 400));
    common::assert_invariants(store.as_ref(), sku).await;
    assert_reconciled(&stack, sku).await;
    let _: Arc<dyn OrderStore> = store;
}
