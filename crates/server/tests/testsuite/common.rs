//! A whole service on loopback for black-box tests: real Redis, real MariaDB (or the embedded
//! ledger over SQLite), real HTTP.

use std::net::SocketAddr;
use std::time::Duration;

use flashsale_core::{OrderStore, SkuId, UserId};
use flashsale_server::auth::Auth;
use flashsale_server::{Config, Server, Tunables};
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::redis_server;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Runs one test body (`async fn name(&Stack)`) on the production path and on the embedded
/// default, as two tests `name::redis_mysql` and `name::embedded`.
macro_rules! both_ledgers {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_mysql() {
                let stack = super::Stack::redis_mysql().await;
                super::$name(&stack).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                let stack = super::Stack::embedded().await;
                super::$name(&stack).await;
            }
        }
    };
}

pub const JWT_SECRET: &str = "test-secret";
pub const ADMIN: &str = "test-admin-token";

pub struct Stack {
    pub server: Option<Server>,
    pub base: String,
    pub http: reqwest::Client,
    pub auth: Auth,
    pub config: Config,
    pub db: Option<TestDatabase>,
    pub dir: Option<tempfile::TempDir>,
}

pub fn config(redis_url: Option<String>, database_url: String) -> Config {
    Config {
        engine: flashsale_engine::settings::Settings::new(
            redis_url,
            &redis_server::unique_prefix(),
            &database_url,
            &flashsale_testkit::unique_name("inst"),
        ),
        listen: "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
        jwt_secret: JWT_SECRET.into(),
        admin_token: ADMIN.into(),
        tunables: Tunables::default(),
        identity: None,
    }
}

impl Stack {
    /// The production path: shared Redis (own prefix) and a database of its own on MariaDB.
    pub async fn redis_mysql() -> Stack {
        let db = TestDatabase::create().await;
        let cfg = config(Some(redis_server::shared_url()), db.url.clone());
        Stack::start(cfg, Some(db), None).await
    }

    /// Redis at `redis_url` (e.g. a throwaway server) and MariaDB at `db`.
    pub async fn with(redis_url: &str, db: TestDatabase) -> Stack {
        let cfg = config(Some(redis_url.to_owned()), db.url.clone());
        Stack::start(cfg, Some(db), None).await
    }

    /// The embedded default over SQLite in a temp dir.
    pub async fn embedded() -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/flashsale.db", dir.path().display());
        Stack::start(config(None, url), None, Some(dir)).await
    }

    pub async fn start(
        config: Config,
        db: Option<TestDatabase>,
        dir: Option<tempfile::TempDir>,
    ) -> Stack {
        let server = Server::start(config.clone()).await.expect("server starts");
        let base = format!("http://{}", server.addr);
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()
            .unwrap();
        let auth = Auth::new(JWT_SECRET, ADMIN);
        Stack {
            server: Some(server),
            base,
            http,
            auth,
            config,
            db,
            dir,
        }
    }

    pub fn store(&self) -> std::sync::Arc<dyn OrderStore> {
        self.server.as_ref().unwrap().state.store.clone()
    }

    pub fn token(&self, user: u64) -> String {
        self.auth.sign(UserId(user), 3_600)
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let url = format!("{}{}", self.base, path);
        let mut req = self.http.request(method.parse().unwrap(), url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call(method, path, Some(ADMIN), body).await
    }

    /// Creates and warms a live direct sale.
    pub async fn live_sale(&self, sku: u64, total: u64, limit: u32) {
        self.live_sale_with(
            json!({"sku_id": sku, "name": "test", "total_stock": total, "per_user_limit": limit}),
        )
        .await;
    }

    pub async fn live_sale_with(&self, body: Value) {
        let sku = body["sku_id"].as_u64().unwrap();
        let (s, b) = self.admin("POST", "/api/v1/sales", Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let (s, b) = self
            .admin("POST", &format!("/api/v1/sales/{sku}/warm"), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }

    pub async fn buy(
        &self,
        user: u64,
        sku: u64,
        request_id: &str,
        quantity: Value,
    ) -> (StatusCode, Value) {
        let body = json!({"request_id": request_id, "quantity": quantity});
        self.call(
            "POST",
            &format!("/api/v1/sales/{sku}/purchases"),
            Some(&self.token(user)),
            Some(body),
        )
        .await
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        let url = format!("{}/metrics", self.base);
        self.http
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Waits until the database has applied every event the hot ledger has.
    pub async fn drain(&self, sku: u64) {
        let state = self.server.as_ref().unwrap().state.clone();
        flashsale_testkit::wait::until("the persister to drain", Duration::from_secs(60), || {
            let state = state.clone();
            async move {
                let hot = state.ledger.counters(SkuId(sku)).await.ok()??;
                let stored = state.store.sale(SkuId(sku)).await.ok()??;
                (stored.counters.seq == hot.seq).then_some(())
            }
        })
        .await;
    }

    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await.expect("clean shutdown");
        }
    }
}

/// Units and orders of a sale counted by SQL from MariaDB, not from any code's counters.
pub async fn mysql_counts(db_url: &str, sku: u64) -> (i64, i64, i64) {
    use sqlx::{Connection, Row};
    let mut conn = sqlx::MySqlConnection::connect(db_url).await.unwrap();
    let row = sqlx::query(
        "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(quantity),0) AS SIGNED) AS units, \
         (SELECT CAST(sold AS SIGNED) FROM sales WHERE sku_id = ?) AS sold \
         FROM orders WHERE sku_id = ? AND status IN ('CREATED','RESERVED','PAID')",
    )
    .bind(sku)
    .bind(sku)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    (row.get("n"), row.get("units"), row.get("sold"))
}

/// I1–I5, I7 from the database's own rows.
pub async fn assert_invariants(store: &dyn OrderStore, sku: u64) {
    let stored = store
        .sale(SkuId(sku))
        .await
        .unwrap()
        .expect("sale in the database");
    let orders = store.orders(SkuId(sku)).await.unwrap();
    let events = store.events(SkuId(sku)).await.unwrap();
    let report = flashsale_core::invariants::check_sale(
        &stored.sale,
        &stored.counters,
        &orders,
        &events,
        true,
    );
    assert!(
        report.is_ok(),
        "invariants broken: {:#?}",
        report.violations
    );
}
