//! Gateway protections over real HTTP: rate limits, blacklist, back-pressure, per-sale
//! isolation, purchase tokens, limits on everything.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::{code, Stack};
use flashsale_server::gateway::{GatewayConfig, TokenRate};
use flashsale_server::Config;
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::redis_server;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn embedded_config(dir: &tempfile::TempDir) -> Config {
    common::config(None, common::sqlite_url(dir))
}

async fn embedded_with(edit: impl FnOnce(&mut Config)) -> Stack {
    Stack::embedded_with(edit).await
}

async fn buy_with_token(
    stack: &Stack,
    user: u64,
    sku: u64,
    rid: &str,
    token: &str,
) -> (StatusCode, Value) {
    stack
        .call(
            "POST",
            &format!("/api/v1/sales/{sku}/purchases"),
            Some(&stack.token(user)),
            Some(json!({"request_id": rid, "quantity": 1, "purchase_token": token})),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_and_per_sale_rates_answer_429_with_retry_after() {
    let stack = embedded_with(|c| {
        c.tunables.gateway.rate_user = TokenRate::new(1, 2);
        c.tunables.gateway.rate_sale = TokenRate::new(1, 4);
    })
    .await;
    stack.live_sale(51, 100, 10).await;
    for rid in ["a", "b"] {
        stack.buy_ok(1, 51, rid, 1).await;
    }
    let body = json!({"request_id": "c", "quantity": 1});
    let resp = stack.purchase_request(1, 51, &body).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let b: Value = resp.json().await.unwrap();
    assert_eq!(code(&b), "RATE_LIMITED", "{b}");
    // Another user is not limited by user 1, but the sale's own bucket (4, refilled at 1/s)
    // runs out: within a few more buyers (more than 4 only on a very slow machine).
    stack.buy_ok(2, 51, "a", 1).await;
    let mut sold = 3;
    let mut refused = false;
    for user in 3..=12 {
        let (s, b) = stack.buy(user, 51, "a", json!(1)).await;
        if s == StatusCode::ACCEPTED {
            sold += 1;
            continue;
        }
        assert_eq!(
            (s, code(&b)),
            (StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED"),
            "{b}"
        );
        refused = true;
        break;
    }
    assert!(refused, "the per-sale limit never engaged");
    // Public reads are not limited.
    for _ in 0..10 {
        assert_eq!(
            stack.call("GET", "/api/v1/sales/51", None, None).await.0,
            StatusCode::OK
        );
    }
    let (_, view) = stack.call("GET", "/api/v1/sales/51", None, None).await;
    assert_eq!(
        view["sold"].as_u64(),
        Some(sold),
        "refused requests changed nothing"
    );
}

both_ledgers!(blacklist_blocks_users_and_ips);
async fn blacklist_blocks_users_and_ips(stack: &Stack) {
    stack.live_sale(52, 100, 1).await;
    let (s, b) = stack
        .admin("PUT", "/api/v1/admin/blacklist/users/5", None)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = stack.buy(5, 52, "a", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "BLACKLISTED"), "{b}");
    let (s, b) = stack
        .call("GET", "/api/v1/orders/52-1-1", Some(&stack.token(5)), None)
        .await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "BLACKLISTED"));
    let (_, list) = stack.admin("GET", "/api/v1/admin/blacklist", None).await;
    assert_eq!(list["users"], json!([5]));
    stack.buy_ok(6, 52, "a", 1).await;
    // Kept where the deployment keeps it.
    if let Some(url) = &stack.config.engine.ledger.redis_url {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let members: Vec<String> = redis::cmd("SMEMBERS")
            .arg(format!(
                "{}:blacklist",
                stack.config.engine.ledger.redis_prefix
            ))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(members, vec!["5".to_string()]);
    }
    assert_eq!(
        stack
            .admin("DELETE", "/api/v1/admin/blacklist/users/5", None)
            .await
            .0,
        StatusCode::OK
    );
    stack.buy_ok(5, 52, "a", 1).await;

    assert_eq!(
        stack
            .admin("PUT", "/api/v1/admin/blacklist/ips/127.0.0.1", None)
            .await
            .0,
        StatusCode::OK
    );
    let (s, b) = stack.buy(7, 52, "a", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "BLACKLISTED"));
    assert_eq!(
        stack
            .admin("DELETE", "/api/v1/admin/blacklist/ips/127.0.0.1", None)
            .await
            .0,
        StatusCode::OK
    );
    stack.buy_ok(7, 52, "a", 1).await;

    for bad in [
        "/api/v1/admin/blacklist/users/0",
        "/api/v1/admin/blacklist/users/x",
        "/api/v1/admin/blacklist/ips/999.1.1.1",
        "/api/v1/admin/blacklist/ips/localhost",
    ] {
        let (s, b) = stack.admin("PUT", bad, None).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{bad}"
        );
    }
    let (_, list) = stack.admin("GET", "/api/v1/admin/blacklist", None).await;
    assert_eq!(list, json!({"users": [], "ips": []}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blacklist_reaches_other_instances_within_a_second() {
    let a = Stack::redis_mysql().await;
    let mut config = a.config.clone();
    config.engine.instance_id = flashsale_testkit::unique_name("inst-b");
    config.engine.persister.run = false;
    let b = Stack::start(config, None, None).await;
    a.live_sale(53, 100, 1).await;
    b.buy_ok(8, 53, "a", 1).await;
    assert_eq!(
        a.admin("PUT", "/api/v1/admin/blacklist/users/9", None)
            .await
            .0,
        StatusCode::OK
    );
    let set_at = Instant::now();
    loop {
        let (s, body) = b.buy(9, 53, "a", json!(1)).await;
        if s == StatusCode::FORBIDDEN {
            assert_eq!(code(&body), "BLACKLISTED");
            break;
        }
        // b reloads every 500 ms; the bound leaves room for a loaded CI machine.
        assert!(
            set_at.elapsed() < Duration::from_millis(2_000),
            "instance b still sells to a blocked user"
        );
        // The purchase went through before b refreshed: it is a real order, retried as a replay.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_blacklist_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = embedded_config(&dir);
    let mut first = Stack::start(config.clone(), None, None).await;
    assert_eq!(
        first
            .admin("PUT", "/api/v1/admin/blacklist/users/11", None)
            .await
            .0,
        StatusCode::OK
    );
    first.stop().await;
    let second = Stack::start(config, None, Some(dir)).await;
    let (_, list) = second.admin("GET", "/api/v1/admin/blacklist", None).await;
    assert_eq!(list["users"], json!([11]));
    second.live_sale(54, 10, 1).await;
    let (s, b) = second.buy(11, 54, "a", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "BLACKLISTED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_engages_on_stream_lag_and_lets_go_when_persisted() {
    let db = TestDatabase::create().await;
    let mut config = common::config(Some(redis_server::shared_url()), db.url.clone());
    config.engine.persister.run = false;
    config.tunables.gateway.backpressure_lag = 3;
    config.tunables.gateway.backpressure_interval = Duration::from_millis(50);
    config.tunables.gateway.backpressure_auto_pause = true;
    let stack = Stack::start(config.clone(), Some(db), None).await;
    stack.live_sale(61, 100, 1).await;
    for user in 1..=5 {
        stack.buy_ok(user, 61, "a", 1).await;
    }
    let started = Instant::now();
    let mut user = 100;
    loop {
        user += 1;
        let (s, b) = stack.buy(user, 61, "a", json!(1)).await;
        if s == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(code(&b), "BUSY", "{b}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "no back-pressure: {s} {b}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = stack.metrics_text().await;
    assert!(
        metrics.contains("flashsale_backpressure_engaged{sku=\"61\"} 1"),
        "{metrics}"
    );
    // A persister catches up; the lag falls, the sale is resumed and sells again.
    let mut workers_config = config.clone();
    workers_config.engine.persister.run = true;
    let workers = flashsale_server::serve::Workers::start(&workers_config)
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        user += 1;
        let (s, b) = stack.buy(user, 61, "a", json!(1)).await;
        if s == StatusCode::ACCEPTED {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "back-pressure never let go: {s} {b}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack.drain(61).await;
    workers.shutdown().await.unwrap();
    common::assert_invariants(stack.store().as_ref(), 61).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_sale_cannot_starve_the_others() {
    let stack = embedded_with(|c| {
        c.tunables.gateway = GatewayConfig {
            sale_inflight_max: 2,
            ..GatewayConfig::unlimited()
        };
    })
    .await;
    stack.live_sale(71, 10_000, 1).await;
    stack.live_sale(72, 10, 1).await;
    let stack = &stack;
    let spike = futures::stream::iter(1..=120u64)
        .map(|u| async move { stack.buy(u, 71, "a", json!(1)).await })
        .buffer_unordered(60)
        .collect::<Vec<_>>();
    let other = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        stack.buy(1, 72, "a", json!(1)).await
    };
    let (results, (s, b)) = tokio::join!(spike, other);
    assert_eq!(s, StatusCode::ACCEPTED, "the other sale still sells: {b}");
    let busy = results
        .iter()
        .filter(|(s, b)| *s == StatusCode::TOO_MANY_REQUESTS && code(b) == "BUSY")
        .count();
    let ok = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::ACCEPTED)
        .count();
    assert!(busy > 0, "the in-flight limit never engaged");
    assert_eq!(busy + ok, results.len(), "only 202 or 429 BUSY");
    let (_, view) = stack.call("GET", "/api/v1/sales/71", None, None).await;
    assert_eq!(view["sold"].as_u64(), Some(ok as u64));
}

both_ledgers!(purchase_tokens_guard_a_sale);
async fn purchase_tokens_guard_a_sale(stack: &Stack) {
    stack.live_sale(81, 100, 1).await;
    stack.live_sale(83, 100, 1).await;
    let (s, _) = stack
        .create_sale(json!({"sku_id": 82, "name": "cold", "total_stock": 5}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    for sku in [81, 83] {
        let path = format!("/api/v1/admin/sales/{sku}/purchase-token");
        let (s, b) = stack.admin("PUT", &path, None).await;
        assert_eq!(
            (s, &b["purchase_token"]),
            (StatusCode::OK, &json!(true)),
            "{b}"
        );
    }
    let (s, b) = stack
        .admin("PUT", "/api/v1/admin/sales/8888/purchase-token", None)
        .await;
    assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "SALE_NOT_FOUND"));

    let (s, b) = stack.buy(1, 81, "a", json!(1)).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::FORBIDDEN, "FORBIDDEN"),
        "no token: {b}"
    );
    let (s, b) = stack
        .call(
            "POST",
            "/api/v1/sales/82/purchase-token",
            Some(&stack.token(1)),
            None,
        )
        .await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::CONFLICT, "NOT_STARTED"),
        "not live: {b}"
    );
    let (s, b) = stack
        .call("POST", "/api/v1/sales/81/purchase-token", None, None)
        .await;
    assert_eq!((s, code(&b)), (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"));
    let (s, t) = stack
        .call(
            "POST",
            "/api/v1/sales/81/purchase-token",
            Some(&stack.token(1)),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{t}");
    let token = t["token"].as_str().unwrap().to_owned();
    assert!(t["expires_at_ms"].as_i64().unwrap() > flashsale_engine::now_ms());

    let (s, b) = buy_with_token(stack, 2, 81, "a", &token).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::FORBIDDEN, "FORBIDDEN"),
        "another user's token: {b}"
    );
    let (s, b) = buy_with_token(stack, 1, 83, "a", &token).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::FORBIDDEN, "FORBIDDEN"),
        "another sale's token: {b}"
    );
    let (s, b) = buy_with_token(stack, 1, 81, "a", "x.y.z").await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::FORBIDDEN, "FORBIDDEN"),
        "forged: {b}"
    );
    let (s, first) = buy_with_token(stack, 1, 81, "a", &token).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{first}");
    let (s, again) = buy_with_token(stack, 1, 81, "a", &token).await;
    assert_eq!(
        (s, &again["order_no"]),
        (StatusCode::ACCEPTED, &first["order_no"]),
        "a retry is a replay"
    );
    let (s, b) = buy_with_token(stack, 1, 81, "b", &token).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::FORBIDDEN, "FORBIDDEN"),
        "single use: {b}"
    );

    assert_eq!(
        stack
            .admin("DELETE", "/api/v1/admin/sales/81/purchase-token", None)
            .await
            .0,
        StatusCode::OK
    );
    stack.buy_ok(3, 81, "a", 1).await;
    let (_, view) = stack.call("GET", "/api/v1/sales/81", None, None).await;
    assert_eq!(
        view["seq"].as_u64(),
        Some(2),
        "refused purchases changed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_answer_in_our_error_shape() {
    let mut stack = embedded_with(|c| c.tunables.gateway.connections_max = 3).await;
    let mut req = stack.http.get(format!("{}/api/v1/sales/1", stack.base));
    for i in 0..80 {
        req = req.header(format!("x-h{i}"), "v");
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        code(&resp.json::<Value>().await.unwrap()),
        "INVALID_REQUEST"
    );
    let resp = stack
        .http
        .get(format!("{}/api/v1/sales/1", stack.base))
        .header("x-big", "v".repeat(20_000))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        code(&resp.json::<Value>().await.unwrap()),
        "INVALID_REQUEST"
    );
    let (s, b) = stack.buy(1, 1, &"x".repeat(65), json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::BAD_REQUEST, "INVALID_REQUEST"));
    let (s, b) = stack.buy(1, 1, "a", json!(1_001)).await;
    assert_eq!((s, code(&b)), (StatusCode::BAD_REQUEST, "INVALID_REQUEST"));

    // Open connections: the cap holds the next connection in the backlog until one closes.
    let idle: Vec<_> = futures::future::join_all(
        (0..3).map(|_| tokio::net::TcpStream::connect(stack.server.as_ref().unwrap().addr)),
    )
    .await;
    let fresh = reqwest::Client::builder()
        .timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        fresh
            .get(format!("{}/healthz", stack.base))
            .send()
            .await
            .is_err(),
        "a 4th connection was served"
    );
    drop(idle);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fresh = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert_eq!(
        fresh
            .get(format!("{}/healthz", stack.base))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    // Request timeout: a JSON 503 with Retry-After, not an empty body. The same data dir with
    // a zero timeout: a purchase always waits for its batch, so it always times out.
    stack.live_sale(56, 10, 1).await;
    let mut config = stack.config.clone();
    config.tunables.request_timeout = Duration::ZERO;
    stack.stop().await;
    let slow = Stack::start(config, None, None).await;
    let body = json!({"request_id": "a", "quantity": 1});
    let resp = slow.purchase_request(1, 56, &body).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key("retry-after"));
    assert_eq!(code(&resp.json::<Value>().await.unwrap()), "UNAVAILABLE");
}

/// A purchase by `user` whose request carries these `X-Forwarded-For` lines.
async fn buy_forwarded(stack: &Stack, user: u64, sku: u64, lines: &[&str]) -> (StatusCode, String) {
    let body = json!({"request_id": format!("xff-{user}"), "quantity": 1});
    let mut req = stack.purchase_request(user, sku, &body);
    for line in lines {
        req = req.header("x-forwarded-for", *line);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.text().await.unwrap())
}

/// The client controls the left of `X-Forwarded-For`; only the hops the trusted proxies
/// appended (counted from the right) name the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_is_read_from_the_right() {
    let stack = embedded_with(|c| c.tunables.gateway.forwarded_for_hops = 1).await;
    stack.live_sale(57, 100, 1).await;
    let (s, b) = stack
        .admin("PUT", "/api/v1/admin/blacklist/ips/10.0.0.5", None)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let blocked: [&[&str]; 4] = [
        &["10.0.0.5"],
        &["1.2.3.4, 10.0.0.5"],
        // A proxy that adds a header line of its own after the client's (HAProxy does).
        &["1.2.3.4", "10.0.0.5"],
        &["garbage, 1.2.3.4 ,10.0.0.5"],
    ];
    for (user, lines) in (1..).zip(blocked) {
        let (s, b) = buy_forwarded(&stack, user, 57, lines).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{lines:?}: {b}");
    }
    let served: [&[&str]; 4] = [
        &["10.0.0.5, 1.2.3.4"],
        &["10.0.0.5", "1.2.3.4"],
        &["nonsense"],
        &[""],
    ];
    for (user, lines) in (11..).zip(served) {
        let (s, b) = buy_forwarded(&stack, user, 57, lines).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{lines:?}: {b}");
    }
}

/// One header's value as text ("" when absent).
fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// `r` of a `RateLimit` value such as `"user";r=3;t=1`.
fn remaining(value: &str) -> u64 {
    let r = value.split(';').find_map(|p| p.strip_prefix("r=")).unwrap();
    r.parse().unwrap()
}

/// Rate-limited routes answer `RateLimit-Policy` (the route's policies) and `RateLimit` (the
/// tightest one's remaining quota and reset), 429 included; public and admin routes do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_answers_carry_ratelimit_headers() {
    let stack = embedded_with(|c| {
        c.tunables.gateway.rate_user = TokenRate::new(1, 4);
        c.tunables.gateway.rate_sale = TokenRate::new(1_000, 1_000);
        c.tunables.gateway.rate_instance = TokenRate::OFF;
        c.tunables.gateway.rate_ip = TokenRate::OFF;
    })
    .await;
    stack.live_sale(59, 100, 10).await;
    let user = stack.token(1);
    let order = stack
        .http
        .get(format!("{}/api/v1/orders/59-1-1", stack.base))
        .bearer_auth(&user);
    let resp = order.try_clone().unwrap().send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(&resp, "ratelimit-policy"), "\"user\";q=4;w=4");
    assert_eq!(header(&resp, "ratelimit"), "\"user\";r=3;t=1");
    let buy = |rid: &str| {
        stack
            .http
            .post(format!("{}/api/v1/sales/59/purchases", stack.base))
            .bearer_auth(&user)
            .json(&json!({"request_id": rid, "quantity": 1}))
    };
    let resp = buy("a").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        "\"user\";q=4;w=4, \"sale\";q=1000;w=1"
    );
    let left = remaining(&header(&resp, "ratelimit"));
    assert!(left <= 2, "{left}");
    // Spend the rest: the refusal says 0 left and when to come back, as Retry-After does.
    let refused = loop {
        let resp = order.try_clone().unwrap().send().await.unwrap();
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            break resp;
        }
    };
    let retry = header(&refused, "retry-after");
    assert_eq!(
        header(&refused, "ratelimit"),
        format!("\"user\";r=0;t={retry}")
    );
    assert_eq!(header(&refused, "ratelimit-policy"), "\"user\";q=4;w=4");
    // Public reads and admin calls are not rate limited, and say nothing of it.
    let public = stack.raw_get("/api/v1/sales/59").await;
    let admin = stack
        .http
        .get(format!("{}/api/v1/admin/blacklist", stack.base))
        .bearer_auth(common::ADMIN)
        .send()
        .await
        .unwrap();
    for resp in [public, admin] {
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get("ratelimit").is_none());
        assert!(resp.headers().get("ratelimit-policy").is_none());
    }
}

/// `Idempotency-Key`s bound per user are capped: past the cap a new key is 429
/// `RATE_LIMITED` and changes nothing, a retry of a bound key still gets its first outcome,
/// and another user still binds. On Redis the user's keys are a bounded set with a TTL.
async fn idempotency_keys_are_capped_per_user(stack: &Stack) {
    const CAP: usize = 3;
    stack.live_sale(81, 100, 10).await;
    let keyed = |user: u64, key: &str| {
        stack
            .purchase_request(user, 81, &json!({"quantity": 1}))
            .header("idempotency-key", key.to_owned())
            .send()
    };
    let mut first = Value::Null;
    for i in 0..CAP {
        let resp = keyed(1, &format!("k{i}")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        if i == 0 {
            first = resp.json().await.unwrap();
        }
    }
    let resp = keyed(1, "k-over").await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(code(&body), "RATE_LIMITED", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("Idempotency-Key"),
        "{body}"
    );
    let again: Value = keyed(1, "k0").await.unwrap().json().await.unwrap();
    assert_eq!(again["order_no"], first["order_no"], "a retry: {again}");
    let resp = keyed(2, "k-over").await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED, "another user binds");
    stack.drain(81).await;
    let view = stack.get_ok("/api/v1/sales/81").await;
    assert_eq!(
        view["available"],
        json!(100 - CAP - 1),
        "the refusal took nothing: {view}"
    );
    common::assert_invariants(stack.store().as_ref(), 81).await;
}

fn keys_capped(c: &mut Config) {
    c.tunables.gateway.idempotency_keys_per_user = 3;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_capped_per_user_on_redis() {
    let stack = Stack::redis_mysql_with(keys_capped).await;
    idempotency_keys_are_capped_per_user(&stack).await;
    let prefix = &stack.config.engine.ledger.redis_prefix;
    let set = format!("{prefix}:ptok:idemkeys:1");
    let mut conn = redis::Client::open(redis_server::shared_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (held, ttl_ms): (usize, i64) = redis::pipe()
        .cmd("ZCARD")
        .arg(&set)
        .cmd("PTTL")
        .arg(&set)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(held, 3, "the user's keys, bounded");
    assert!(ttl_ms > 0, "and forgotten after a day: {ttl_ms}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_capped_per_user_embedded() {
    let stack = embedded_with(keys_capped).await;
    idempotency_keys_are_capped_per_user(&stack).await;
}

/// A request the sale's sold-out flag answers never reaches the ledger, so it spends nothing
/// that guards it: after the sell-out, a burst past the sale's rate hears SOLD_OUT, not 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_sale_spends_no_sale_rate() {
    let stack = embedded_with(|c| {
        c.tunables.gateway.rate_sale = TokenRate::new(1, 3);
        // The flag lives as long as the cache's entries: long enough for the burst below.
        c.tunables.cache_ttl = Duration::from_secs(60);
    })
    .await;
    stack.live_sale(58, 1, 1).await;
    stack.buy_ok(1, 58, "a", 1).await;
    let (s, b) = stack.buy(2, 58, "a", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "SOLD_OUT"), "{b}");
    let shop = stack.server.as_ref().unwrap().state.shop.clone();
    let other = flashsale_core::RequestKey::parse("99:z").unwrap();
    flashsale_testkit::wait::until("the flag to be set", Duration::from_secs(10), || {
        let (shop, other) = (shop.clone(), other.clone());
        async move {
            let sku = flashsale_core::SkuId(58);
            shop.sold_out_answers(sku, &other).then_some(())
        }
    })
    .await;
    for user in 3..=22 {
        let (s, b) = stack.buy(user, 58, "a", json!(1)).await;
        assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "SOLD_OUT"), "{b}");
    }
    let (s, b) = stack.buy(1, 58, "a", json!(1)).await;
    assert_eq!(
        s,
        StatusCode::ACCEPTED,
        "a retry still gets its first outcome: {b}"
    );
}
