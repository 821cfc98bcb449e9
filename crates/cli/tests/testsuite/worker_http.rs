//! `flashsale worker` answers `/healthz`, `/readyz` and `/metrics` on its own address, as
//! `flashsale serve` does: on Redis and MariaDB, its persister's metrics in Prometheus text.

use std::time::Duration;

use flashsale_server::auth::Auth;
use flashsale_server::{Config, Server, Tunables};
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::process::Proc;
use flashsale_testkit::{free_port, redis_server, wait};
use reqwest::StatusCode;
use serde_json::{json, Value};

const ADMIN: &str = "worker-http-admin-token";
const SECRET: &str = "worker-http-jwt-secret";
const LIMIT: Duration = Duration::from_secs(30);

/// An API instance in this process, without a persister: the worker persists its sales.
async fn api(redis_url: &str, prefix: &str, db: &TestDatabase) -> Server {
    let mut engine = flashsale_engine::settings::Settings::new(
        Some(redis_url.into()),
        prefix,
        &db.url,
        &flashsale_testkit::unique_name("api"),
    );
    engine.persister.run = false;
    let config = Config {
        engine,
        listen: "127.0.0.1:0".parse().unwrap(),
        jwt_secret: SECRET.into(),
        admin_token: ADMIN.into(),
        tunables: Tunables::default(),
        identity: None,
    };
    Server::start(config).await.expect("api starts")
}

/// `flashsale worker` on `redis_url` and `db`, its HTTP on `port`; killed (then its data dir
/// removed) on drop.
fn worker(
    name: &str,
    redis_url: &str,
    prefix: &str,
    db: &TestDatabase,
    port: u16,
) -> (Proc, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("FLASHSALE_WORKER_LISTEN", format!("127.0.0.1:{port}")),
        ("FLASHSALE_REDIS_URL", redis_url.into()),
        ("FLASHSALE_REDIS_PREFIX", prefix.into()),
        ("FLASHSALE_DATABASE_URL", db.url.clone()),
        ("FLASHSALE_DATA_DIR", dir.path().display().to_string()),
        ("FLASHSALE_JWT_SECRET", SECRET.into()),
        ("FLASHSALE_ADMIN_TOKEN", ADMIN.into()),
        ("FLASHSALE_RECONCILE_INTERVAL_MS", "0".into()),
    ];
    let env = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let bin = env!("CARGO_BIN_EXE_flashsale");
    let mut p = Proc::new(name, bin, &["worker"], env, dir.path());
    p.start();
    (p, dir)
}

/// The answer of `GET url` once it comes (the worker may still be starting).
async fn get(http: &reqwest::Client, url: &str) -> (StatusCode, String, String) {
    let answer = wait::within(LIMIT, || async {
        let resp = http.get(url).send().await.ok()?;
        let status = resp.status();
        let kind = resp
            .headers()
            .get("content-type")?
            .to_str()
            .ok()?
            .to_owned();
        Some((status, kind, resp.text().await.ok()?))
    })
    .await;
    answer.unwrap_or_else(|| panic!("no answer from {url}"))
}

async fn call(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    token: &str,
    body: Value,
) -> StatusCode {
    let resp = http
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await;
    resp.expect("api answers").status()
}

/// A live sale on the API with three purchases, persisted by nobody but the worker.
async fn sell(http: &reqwest::Client, base: &str) {
    let sale = json!({"sku_id": 31, "name": "w", "total_stock": 10, "per_user_limit": 1});
    assert_eq!(
        call(http, base, "/api/v1/sales", ADMIN, sale).await,
        StatusCode::CREATED
    );
    assert_eq!(
        call(http, base, "/api/v1/sales/31/warm", ADMIN, json!({})).await,
        StatusCode::OK
    );
    let auth = Auth::new(SECRET, ADMIN);
    for user in 1..=3 {
        let token = auth.sign(flashsale_core::UserId(user), 600);
        let body = json!({"request_id": "w", "quantity": 1});
        let status = call(http, base, "/api/v1/sales/31/purchases", &token, body).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_serves_health_readiness_and_metrics() {
    let db = TestDatabase::create().await;
    let (redis, prefix) = (redis_server::shared_url(), redis_server::unique_prefix());
    let api = api(&redis, &prefix, &db).await;
    let port = free_port();
    let (mut w, _dir) = worker("worker", &redis, &prefix, &db, port);
    let (http, base) = (reqwest::Client::new(), format!("http://127.0.0.1:{port}"));

    let (status, _, body) = get(&http, &format!("{base}/healthz")).await;
    assert_eq!(status, StatusCode::OK, "{}", w.log_tail(20));
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"status": "ok"})
    );
    let (status, ready) = readiness(&http, &base).await;
    assert_eq!(status, StatusCode::OK, "{ready:?}");
    assert_eq!(ready, [json!("ok"), json!("ok")]);

    sell(&http, &format!("http://{}", api.addr)).await;
    let persisted = "flashsale_persisted_events_total{sku=\"31\"} 3";
    let metrics = wait::within(LIMIT, || async {
        let (_, kind, text) = get(&http, &format!("{base}/metrics")).await;
        text.contains(persisted).then_some((kind, text))
    })
    .await;
    let (kind, text) = metrics.unwrap_or_else(|| panic!("no {persisted}: {}", w.log_tail(20)));
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    assert!(
        text.contains("# TYPE flashsale_persisted_events_total counter"),
        "{text}"
    );
    let (status, _, _) = get(&http, &format!("{base}/api/v1/sales/31")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the worker serves no API");
    w.kill();
    api.shutdown().await.unwrap();
}

/// Not ready while its hot ledger does not answer (nothing listens on its Redis port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_is_not_ready_without_redis() {
    let db = TestDatabase::create().await;
    let dead_redis = format!("redis://127.0.0.1:{}", free_port());
    let port = free_port();
    let prefix = redis_server::unique_prefix();
    let (mut w, _dir) = worker("worker-no-redis", &dead_redis, &prefix, &db, port);
    let http = reqwest::Client::new();
    let (status, ready) = readiness(&http, &format!("http://127.0.0.1:{port}")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready:?}");
    assert_eq!(ready, [json!("unreachable"), json!("ok")]);
    w.kill();
}

/// `GET /readyz` of the worker at `base`: its status and what it says of its ledger and its
/// database.
async fn readiness(http: &reqwest::Client, base: &str) -> (StatusCode, [Value; 2]) {
    let (status, _, body) = get(http, &format!("{base}/readyz")).await;
    let ready: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{body}"));
    (status, [ready["ledger"].clone(), ready["database"].clone()])
}
