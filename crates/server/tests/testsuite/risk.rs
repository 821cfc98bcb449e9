//! The shop's risk service in the purchase path, against a real risk service over HTTP that
//! each test starts (a small axum app on 127.0.0.1:0, on a runtime of its own so that it can
//! be killed like a process): denied users never hold stock, a slow or dead service does not
//! stop the sale (the fallback rule decides within the timeout), the breaker opens and closes,
//! the sold-out path never calls it, a retry gets its first outcome without a new call, and a
//! spike with the check on sells exactly the stock (invariants from the database); the
//! allowlist and the sales' own rules are kept where the blacklist is.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{code, Stack};
use axum::extract::State;
use axum::http::StatusCode as AxumStatus;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use flashsale_core::{PurchaseRequest, RequestId, SkuId, UserId};
use flashsale_server::risk::{Fallback, RiskConfig};
use flashsale_testkit::wait;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// How long the test's service sleeps when slow: far past any risk timeout here.
const SLOW: Duration = Duration::from_secs(5);
/// The risk timeout of the tests where the service must not answer in time (the default).
const TIMEOUT: Duration = Duration::from_millis(50);
/// The risk timeout of the tests where an answering service must always be heard, however
/// loaded the test machine.
const PATIENT: Duration = Duration::from_secs(2);
/// A purchase answered by the fallback must be answered well before the slow service would.
const ANSWER_BOUND: Duration = Duration::from_secs(1);

/// What the test's risk service does: denies users whose id is a multiple of `deny_every`
/// (0: nobody) and the users in `denied`, sleeps past the timeout while `slow`, answers 500
/// while `failing`. Counts every call and keeps the last query.
#[derive(Default)]
struct Shop {
    calls: AtomicU64,
    deny_every: AtomicU64,
    denied: Mutex<HashSet<u64>>,
    slow: AtomicBool,
    failing: AtomicBool,
    last: Mutex<Option<Value>>,
}

impl Shop {
    fn denies(&self, user: u64) -> bool {
        let every = self.deny_every.load(Ordering::Relaxed);
        (every > 0 && user.is_multiple_of(every)) || self.denied.lock().unwrap().contains(&user)
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn check(State(shop): State<Arc<Shop>>, Json(q): Json<Value>) -> Response {
    shop.calls.fetch_add(1, Ordering::SeqCst);
    *shop.last.lock().unwrap() = Some(q.clone());
    if shop.failing.load(Ordering::Relaxed) {
        return (AxumStatus::INTERNAL_SERVER_ERROR, "risk engine down").into_response();
    }
    if shop.slow.load(Ordering::Relaxed) {
        // The service's own slowness (what is tested), not a wait for anything.
        tokio::time::sleep(SLOW).await;
    }
    let user = q["user_id"].as_u64().unwrap_or(0);
    let allow = !shop.denies(user);
    let reason = if allow { "" } else { "velocity check" };
    Json(json!({"allow": allow, "reason": reason})).into_response()
}

/// The risk service, on a thread and runtime of its own: `kill` drops the runtime, which
/// closes its listener and every open connection at once, as a killed process would.
struct RiskService {
    url: String,
    shop: Arc<Shop>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RiskService {
    fn start() -> RiskService {
        let shop = Arc::new(Shop::default());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}/check", listener.local_addr().unwrap());
        let app = Router::new()
            .route("/check", post(check))
            .with_state(shop.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = stopped => {}
                }
            });
        });
        RiskService {
            url,
            shop,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }

    fn config(&self, fallback: Fallback, timeout: Duration) -> RiskConfig {
        RiskConfig {
            url: Some(self.url.clone()),
            timeout,
            fallback,
            ..RiskConfig::default()
        }
    }
}

impl Drop for RiskService {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn embedded(risk: RiskConfig) -> Stack {
    Stack::embedded_with(|cfg| cfg.tunables.risk = risk).await
}

async fn redis_mysql(risk: RiskConfig) -> Stack {
    Stack::redis_mysql_with(|cfg| cfg.tunables.risk = risk).await
}

/// Buyers `users` each try once (request id `r`), `concurrency` at a time: every answer.
async fn spike(
    stack: &Stack,
    sku: u64,
    users: impl Iterator<Item = u64>,
    concurrency: usize,
) -> Vec<(u64, StatusCode, Value, Duration)> {
    futures::stream::iter(users)
        .map(|u| async move {
            let started = Instant::now();
            let (s, b) = stack.buy(u, sku, "r", json!(1)).await;
            (u, s, b, started.elapsed())
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// The users holding live orders of a sale, from the database's rows.
async fn buyers(stack: &Stack, sku: u64) -> Vec<u64> {
    let orders = stack.store().orders(SkuId(sku)).await.unwrap();
    let live = orders.iter().filter(|o| o.status.is_live());
    live.map(|o| o.user_id.0).collect()
}

async fn breaker_open(stack: &Stack) -> bool {
    let (s, view) = stack.admin("GET", "/api/v1/admin/risk", None).await;
    assert_eq!(s, StatusCode::OK, "{view}");
    view["breaker_open"].as_bool().unwrap()
}

/// Runs one test body (`async fn name(&Stack, &RiskService)`) on both ledgers, each with a
/// risk service of its own that the service calls with `fallback` and `timeout`: tests
/// `name::embedded` and `name::redis_mysql`.
macro_rules! with_risk_service {
    ($name:ident, $fallback:expr, $timeout:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                let service = RiskService::start();
                let stack = super::embedded(service.config($fallback, $timeout)).await;
                super::$name(&stack, &service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_mysql() {
                let service = RiskService::start();
                let stack = super::redis_mysql(service.config($fallback, $timeout)).await;
                super::$name(&stack, &service).await;
            }
        }
    };
}

async fn denied_users_never_hold_stock(stack: &Stack, service: &RiskService) {
    stack.live_sale(301, 10, 1).await;
    service.shop.denied.lock().unwrap().insert(7);
    let (s, b) = stack.buy(7, 301, "a", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "RISK_DENIED"), "{b}");
    assert!(b["message"].as_str().unwrap().contains("velocity check"));
    let q = service.shop.last.lock().unwrap().clone().unwrap();
    assert_eq!(
        q,
        json!({"sku_id": 301, "user_id": 7, "quantity": 1, "request_id": "a", "client_ip": "127.0.0.1"})
    );
    // A denial is not remembered: the retry asks again (and is refused again).
    let before = service.shop.calls();
    assert_eq!(
        stack.buy(7, 301, "a", json!(1)).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(service.shop.calls(), before + 1);

    // An accepted purchase's retry gets its first outcome without a call.
    let first = stack.buy_ok(8, 301, "a", 1).await;
    let before = service.shop.calls();
    let (s, again) = stack.buy(8, 301, "a", json!(1)).await;
    assert_eq!(
        (s, &again["order_no"]),
        (StatusCode::ACCEPTED, &first["order_no"])
    );
    assert_eq!(again["replayed"], json!(true));
    assert_eq!(
        service.shop.calls(),
        before,
        "the retry did not call the service"
    );

    let (s, stock) = stack.call("GET", "/api/v1/sales/301", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        stock["available"],
        json!(9),
        "the denied user took nothing: {stock}"
    );
    stack.drain(301).await;
    assert_eq!(buyers(stack, 301).await, vec![8]);
}

with_risk_service!(denied_users_never_hold_stock, Fallback::Allow, PATIENT);

/// A retry that lands on another instance (no memory of it there) while the service now
/// refuses the buyer still gets its first outcome: the ledger's request key overrules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_elsewhere_gets_its_first_outcome_whatever_the_service_says_now() {
    let service = RiskService::start();
    let stack = redis_mysql(service.config(Fallback::Allow, PATIENT)).await;
    stack.live_sale(302, 5, 1).await;
    let first = stack.buy_ok(4, 302, "once", 1).await;
    service.shop.denied.lock().unwrap().insert(4);
    let mut other_cfg = stack.config.clone();
    other_cfg.engine.persister.run = false;
    other_cfg.engine.instance_id = flashsale_testkit::unique_name("inst-b");
    let mut other = Stack::start(other_cfg, None, None).await;
    let before = service.shop.calls();
    let (s, again) = other.buy(4, 302, "once", json!(1)).await;
    assert_eq!(
        (s, &again["order_no"]),
        (StatusCode::ACCEPTED, &first["order_no"]),
        "{again}"
    );
    assert_eq!(
        service.shop.calls(),
        before + 1,
        "asked there, refused, overruled"
    );
    let (s, b) = other.buy(4, 302, "twice", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "RISK_DENIED"), "{b}");
    other.stop().await;
}

/// The service sleeps past the timeout: the instance's rule allows, a sale's own rule (set
/// through the admin API) denies or admits only the allowlist, each answer within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_risk_service_leaves_the_fallback_rule_to_decide_in_time() {
    let service = RiskService::start();
    service.shop.slow.store(true, Ordering::Relaxed);
    let config = RiskConfig {
        breaker_failures: 1_000,
        ..service.config(Fallback::Allow, TIMEOUT)
    };
    let stack = embedded(config).await;
    for sku in [311, 312, 313] {
        stack.live_sale(sku, 100, 1).await;
    }
    let path = |sku: u64| format!("/api/v1/admin/sales/{sku}/risk-fallback");
    let (s, b) = stack
        .admin("PUT", &path(312), Some(json!({"fallback": "deny"})))
        .await;
    assert_eq!(
        (s, &b["fallback"], &b["own"]),
        (StatusCode::OK, &json!("deny"), &json!(true)),
        "{b}"
    );
    let body = json!({"fallback": "allowlist"});
    assert_eq!(
        stack.admin("PUT", &path(313), Some(body)).await.0,
        StatusCode::OK
    );
    for user in [2, 4] {
        let path = format!("/api/v1/admin/risk/allowlist/users/{user}");
        assert_eq!(stack.admin("PUT", &path, None).await.0, StatusCode::OK);
    }

    let expect = |sku: u64, user: u64| match sku {
        311 => StatusCode::ACCEPTED,
        313 if user == 2 || user == 4 => StatusCode::ACCEPTED,
        _ => StatusCode::FORBIDDEN,
    };
    for sku in [311, 312, 313] {
        for (user, s, b, took) in spike(&stack, sku, 1..=6, 6).await {
            assert_eq!(s, expect(sku, user), "sale {sku} user {user}: {b}");
            if s == StatusCode::FORBIDDEN {
                assert_eq!(code(&b), "RISK_DENIED", "{b}");
                assert!(b["message"].as_str().unwrap().contains("(timeout)"), "{b}");
            }
            assert!(
                took < ANSWER_BOUND,
                "sale {sku} user {user} waited {took:?}"
            );
        }
    }
    let (_, view) = stack.admin("GET", "/api/v1/admin/risk", None).await;
    assert_eq!(view["allowlist"], json!([2, 4]), "{view}");
    assert_eq!(view["fallback"], json!("allow"));
    assert_eq!(view["sales"].as_array().unwrap().len(), 2, "{view}");

    // Dropping a sale's rule returns it to the instance's; a removed user is refused.
    assert_eq!(
        stack.admin("DELETE", &path(312), None).await.0,
        StatusCode::OK
    );
    stack.buy_ok(9, 312, "r", 1).await;
    let off = stack.admin("DELETE", "/api/v1/admin/risk/allowlist/users/4", None);
    assert_eq!(off.await.0, StatusCode::OK);
    assert_eq!(
        stack.buy(4, 313, "again", json!(1)).await.0,
        StatusCode::FORBIDDEN
    );
    stack.drain(313).await;
    assert_eq!(
        buyers(&stack, 313).await.len(),
        2,
        "only the allowlisted bought"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_risk_admin_input_is_4xx() {
    let service = RiskService::start();
    let stack = embedded(service.config(Fallback::Allow, PATIENT)).await;
    stack.live_sale(321, 1, 1).await;
    let cases = [
        (
            "PUT",
            "/api/v1/admin/sales/321/risk-fallback",
            Some(json!({"fallback": "maybe"})),
            400,
        ),
        (
            "PUT",
            "/api/v1/admin/sales/321/risk-fallback",
            Some(json!({"x": 1})),
            400,
        ),
        ("PUT", "/api/v1/admin/sales/321/risk-fallback", None, 400),
        (
            "PUT",
            "/api/v1/admin/sales/999321/risk-fallback",
            Some(json!({"fallback": "deny"})),
            404,
        ),
        ("DELETE", "/api/v1/admin/sales/x/risk-fallback", None, 400),
        ("PUT", "/api/v1/admin/risk/allowlist/users/0", None, 400),
        ("PUT", "/api/v1/admin/risk/allowlist/users/-1", None, 400),
    ];
    for (method, path, body, want) in cases {
        let (s, b) = stack.admin(method, path, body).await;
        assert_eq!(s.as_u16(), want, "{method} {path}: {b}");
    }
    let user = stack.token(1);
    let (s, _) = stack
        .call("GET", "/api/v1/admin/risk", Some(&user), None)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "admin only");
    let (_, view) = stack.admin("GET", "/api/v1/admin/risk", None).await;
    assert_eq!(view["sales"], json!([]), "bad input changed nothing");
}

/// The service dies mid-spike (its process gone: connections refused): the rest of the spike
/// is decided by the fallback rule within the bound, and the sale sells exactly its stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_risk_service_that_dies_mid_spike_does_not_stop_the_sale() {
    let mut service = RiskService::start();
    let stack = redis_mysql(service.config(Fallback::Allow, TIMEOUT)).await;
    stack.live_sale(331, 120, 1).await;
    let first = spike(&stack, 331, 1..=60, 16).await;
    assert!(first.iter().all(|a| a.1 == StatusCode::ACCEPTED));
    assert!(service.shop.calls() > 0, "the service was asked");
    service.kill();
    let rest = spike(&stack, 331, 61..=200, 16).await;
    let accepted = rest.iter().filter(|a| a.1 == StatusCode::ACCEPTED).count();
    assert_eq!(
        accepted, 60,
        "the rest of the stock sold without the service"
    );
    for (user, s, b, took) in &rest {
        assert!(
            *s == StatusCode::ACCEPTED || code(b) == "SOLD_OUT",
            "user {user}: {s} {b}"
        );
        assert!(*took < ANSWER_BOUND, "user {user} waited {took:?}");
    }
    assert!(breaker_open(&stack).await, "failures opened the breaker");
    let (_, dash) = stack.admin("GET", "/api/v1/admin/dashboard", None).await;
    assert_eq!(
        dash["risk_breaker_open"],
        json!(true),
        "the dashboard shows it"
    );
    stack.drain(331).await;
    assert_eq!(buyers(&stack, 331).await.len(), 120);
    common::assert_invariants(stack.store().as_ref(), 331).await;
    let db = stack.db.as_ref().unwrap();
    assert_eq!(
        common::sql_counts(&db.url, 331).await.live(),
        (120, 120, 120)
    );
}

/// 500s open the breaker: purchases skip the service (the fallback decides) until a probe
/// succeeds, then it is asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_on_errors_and_a_probe_closes_it() {
    let service = RiskService::start();
    service.shop.failing.store(true, Ordering::Relaxed);
    service.shop.deny_every.store(1, Ordering::Relaxed);
    let config = RiskConfig {
        breaker_failures: 3,
        breaker_open: Duration::from_secs(1),
        ..service.config(Fallback::Allow, PATIENT)
    };
    let stack = embedded(config).await;
    stack.live_sale(341, 1_000, 1).await;
    for user in 1..=3 {
        stack.buy_ok(user, 341, "r", 1).await;
    }
    assert_eq!(service.shop.calls(), 3);
    assert!(breaker_open(&stack).await);
    let before = service.shop.calls();
    let answers = spike(&stack, 341, 4..=43, 8).await;
    assert!(answers.iter().all(|a| a.1 == StatusCode::ACCEPTED));
    let probes = service.shop.calls() - before;
    assert!(
        probes < 10,
        "40 purchases, {probes} calls: the open breaker skipped the service"
    );

    // The service recovers (and now denies everyone): a probe closes the breaker.
    service.shop.failing.store(false, Ordering::Relaxed);
    let mut user = 100;
    wait::until(
        "a probe to close the breaker",
        Duration::from_secs(10),
        || {
            user += 1;
            let stack = &stack;
            async move {
                let (s, _) = stack.buy(user, 341, "r", json!(1)).await;
                (s == StatusCode::FORBIDDEN && !breaker_open(stack).await).then_some(())
            }
        },
    )
    .await;
    let (s, b) = stack.buy(999, 341, "r", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "RISK_DENIED"), "{b}");
}

/// A sale known sold out answers from the local flag: the service is never asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sold_out_path_never_calls_the_risk_service() {
    let service = RiskService::start();
    let stack = embedded(service.config(Fallback::Allow, PATIENT)).await;
    stack.live_sale(351, 1, 1).await;
    let first = stack.buy_ok(1, 351, "r", 1).await;
    stack.buy_refused(2, 351, "r", 1, "SOLD_OUT").await;
    let state = stack.server.as_ref().unwrap().state.clone();
    let probe = PurchaseRequest {
        sku_id: SkuId(351),
        user_id: UserId(3),
        request_id: RequestId::parse("probe").unwrap(),
        quantity: 1,
    };
    wait::until("the local sold-out flag", Duration::from_secs(10), || {
        let set = state.shop.sold_out_answers(probe.sku_id, &probe.key());
        async move { set.then_some(()) }
    })
    .await;
    let before = service.shop.calls();
    for (user, s, b, _) in spike(&stack, 351, 3..=102, 16).await {
        assert_eq!(
            (s, code(&b)),
            (StatusCode::CONFLICT, "SOLD_OUT"),
            "user {user}"
        );
    }
    let (s, again) = stack.buy(1, 351, "r", json!(1)).await;
    assert_eq!(
        (s, &again["order_no"]),
        (StatusCode::ACCEPTED, &first["order_no"])
    );
    assert_eq!(
        service.shop.calls(),
        before,
        "no call on the sold-out path or the replay"
    );
}

/// A spike with the check on: every fifth buyer is denied, the rest buy until the stock is
/// gone; exactly the stock is sold, to allowed buyers only, invariants from the database.
async fn a_spike_with_the_risk_check_sells_exactly_the_stock(stack: &Stack, service: &RiskService) {
    let shop = &service.shop;
    shop.deny_every.store(5, Ordering::Relaxed);
    stack.live_sale(361, 150, 1).await;
    let answers = spike(stack, 361, 1..=400, 64).await;
    let count = |want: StatusCode| answers.iter().filter(|a| a.1 == want).count();
    assert_eq!(count(StatusCode::ACCEPTED), 150);
    for (user, s, b, _) in &answers {
        match *s {
            StatusCode::ACCEPTED => assert!(!user.is_multiple_of(5), "denied user {user} bought"),
            StatusCode::FORBIDDEN => {
                assert!(
                    user % 5 == 0 && code(b) == "RISK_DENIED",
                    "user {user}: {b}"
                )
            }
            _ => assert_eq!(code(b), "SOLD_OUT", "user {user}: {b}"),
        }
    }
    stack.drain(361).await;
    let sold = buyers(stack, 361).await;
    assert_eq!(sold.len(), 150);
    assert!(
        sold.iter().all(|u| !u.is_multiple_of(5)),
        "a denied user holds stock"
    );
    common::assert_invariants(stack.store().as_ref(), 361).await;
    if let Some(db) = &stack.db {
        assert_eq!(
            common::sql_counts(&db.url, 361).await.live(),
            (150, 150, 150)
        );
    }
}

with_risk_service!(
    a_spike_with_the_risk_check_sells_exactly_the_stock,
    Fallback::Deny,
    PATIENT
);

/// The allowlist and a sale's own rule are kept where the deployment keeps the blacklist
/// (Redis sets and hash, or SQLite), read back by the admin view, and decide while the
/// service is slow.
async fn the_fallback_lists_are_stored_with_the_blacklist(stack: &Stack, service: &RiskService) {
    let shop = &service.shop;
    shop.slow.store(true, Ordering::Relaxed);
    stack.live_sale(371, 10, 1).await;
    let rule = json!({"fallback": "allowlist"});
    let put = stack.admin("PUT", "/api/v1/admin/sales/371/risk-fallback", Some(rule));
    assert_eq!(put.await.0, StatusCode::OK);
    let allow = stack.admin("PUT", "/api/v1/admin/risk/allowlist/users/5", None);
    assert_eq!(allow.await.0, StatusCode::OK);
    let (_, view) = stack.admin("GET", "/api/v1/admin/risk", None).await;
    assert_eq!(view["allowlist"], json!([5]), "{view}");
    let own = json!([{"sku_id": 371, "fallback": "allowlist", "own": true}]);
    assert_eq!(view["sales"], own, "{view}");
    stack.buy_ok(5, 371, "r", 1).await;
    let (s, b) = stack.buy(6, 371, "r", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "RISK_DENIED"), "{b}");
    if let Some(url) = &stack.config.engine.ledger.redis_url {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let prefix = &stack.config.engine.ledger.redis_prefix;
        let users: Vec<String> = redis::cmd("SMEMBERS")
            .arg(format!("{prefix}:risk_allow"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(users, ["5"]);
        let rule: Option<String> = redis::cmd("HGET")
            .arg(format!("{prefix}:risk_fallback"))
            .arg(371)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(rule.as_deref(), Some("allowlist"));
    }
}

with_risk_service!(
    the_fallback_lists_are_stored_with_the_blacklist,
    Fallback::Allow,
    TIMEOUT
);
