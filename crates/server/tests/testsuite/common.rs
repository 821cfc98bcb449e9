//! A whole service on loopback for black-box tests: real Redis, real MariaDB or PostgreSQL (or
//! the embedded ledger over SQLite), real HTTP.

use std::net::SocketAddr;
use std::time::Duration;

use flashsale_core::{OrderStore, SkuId, UserId};
use flashsale_server::auth::Auth;
use flashsale_server::{Config, Server, Tunables};
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::{postgres, redis_server, wait};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Runs one test body (`async fn name(&Stack)`) on each of the named systems, as one test
/// `name::system` each (a system is named by its `Stack` constructor).
macro_rules! on_systems {
    ($name:ident: $($system:ident),+) => {
        mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $system() {
                    let stack = super::Stack::$system().await;
                    super::$name(&stack).await;
                }
            )+
        }
    };
}

/// Runs one test body on the production path and on the embedded default, as two tests
/// `name::redis_mysql` and `name::embedded`.
macro_rules! both_ledgers {
    ($name:ident) => {
        on_systems!($name: redis_mysql, embedded);
    };
}

/// Runs one test body on every system of record, as three tests `name::redis_mysql`,
/// `name::redis_postgres` and `name::embedded`. For the few slow tests whose point is what
/// the database ends up holding.
macro_rules! all_systems {
    ($name:ident) => {
        on_systems!($name: redis_mysql, redis_postgres, embedded);
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
    /// The MariaDB database of a stack on the production path.
    pub db: Option<TestDatabase>,
    /// The PostgreSQL database of a stack on Redis+PostgreSQL, dropped with the stack.
    _pg: Option<postgres::TestDatabase>,
    /// The SQLite file's directory of an embedded stack, removed with the stack.
    _dir: Option<tempfile::TempDir>,
}

/// The `code` of an error body ("" when there is none).
pub fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("")
}

/// The order number of an accepted purchase's body.
pub fn order_no(body: &Value) -> String {
    body["order_no"]
        .as_str()
        .expect("an order number")
        .to_owned()
}

/// The URL of a SQLite database file in `dir`.
pub fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/flashsale.db", dir.path().display())
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
        Stack::redis_mysql_with(|_| {}).await
    }

    /// [`Stack::redis_mysql`] with its configuration changed by `change` first.
    pub async fn redis_mysql_with(change: impl FnOnce(&mut Config)) -> Stack {
        let db = TestDatabase::create().await;
        Stack::on_redis(&redis_server::shared_url(), db, change).await
    }

    /// Shared Redis (own prefix) and a database of its own on PostgreSQL as the system of
    /// record.
    pub async fn redis_postgres() -> Stack {
        Stack::redis_postgres_with(|_| {}).await
    }

    /// [`Stack::redis_postgres`] with its configuration changed by `change` first.
    pub async fn redis_postgres_with(change: impl FnOnce(&mut Config)) -> Stack {
        let pg = postgres::TestDatabase::create().await;
        let mut cfg = config(Some(redis_server::shared_url()), pg.url.clone());
        change(&mut cfg);
        let mut stack = Stack::start(cfg, None, None).await;
        stack._pg = Some(pg);
        stack
    }

    /// Redis at `redis_url` (e.g. a throwaway server) and MariaDB at `db`.
    pub async fn with(redis_url: &str, db: TestDatabase) -> Stack {
        Stack::on_redis(redis_url, db, |_| {}).await
    }

    /// Redis at `redis_url` and MariaDB at `db`, the configuration changed by `change` first.
    pub async fn on_redis(
        redis_url: &str,
        db: TestDatabase,
        change: impl FnOnce(&mut Config),
    ) -> Stack {
        let mut cfg = config(Some(redis_url.to_owned()), db.url.clone());
        change(&mut cfg);
        Stack::start(cfg, Some(db), None).await
    }

    /// The embedded default over SQLite in a temp dir.
    pub async fn embedded() -> Stack {
        Stack::embedded_with(|_| {}).await
    }

    /// [`Stack::embedded`] with its configuration changed by `change` first.
    pub async fn embedded_with(change: impl FnOnce(&mut Config)) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(None, sqlite_url(&dir));
        change(&mut cfg);
        Stack::start(cfg, None, Some(dir)).await
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
            _pg: None,
            _dir: dir,
        }
    }

    /// The URL of the stack's system of record.
    pub fn database_url(&self) -> &str {
        &self.config.engine.database_url
    }

    pub fn store(&self) -> std::sync::Arc<dyn OrderStore> {
        self.server.as_ref().unwrap().state.shop.store().clone()
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
        let (s, b) = self.create_sale(body).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let (s, b) = self.sale_action(sku, "warm").await;
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

    /// A purchase request of `user` for sale `sku` with this JSON body, to add headers to or
    /// send as it is.
    pub fn purchase_request(&self, user: u64, sku: u64, body: &Value) -> reqwest::RequestBuilder {
        let url = format!("{}/api/v1/sales/{sku}/purchases", self.base);
        self.http.post(url).bearer_auth(self.token(user)).json(body)
    }

    /// A purchase of `quantity` that must be accepted (202); its body.
    pub async fn buy_ok(&self, user: u64, sku: u64, request_id: &str, quantity: u64) -> Value {
        let (s, b) = self.buy(user, sku, request_id, json!(quantity)).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{b}");
        b
    }

    /// A purchase of `quantity` that must be refused 409 with `code`.
    pub async fn buy_refused(
        &self,
        user: u64,
        sku: u64,
        request_id: &str,
        quantity: u64,
        code: &str,
    ) {
        let (s, b) = self.buy(user, sku, request_id, json!(quantity)).await;
        assert_eq!((s, self::code(&b)), (StatusCode::CONFLICT, code), "{b}");
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        self.raw_get("/metrics").await.text().await.unwrap()
    }

    /// Polls `/readyz` until it answers 200 (both the ledger and the database answer).
    pub async fn until_ready(&self) {
        let ready = || async {
            let (s, _) = self.call("GET", "/readyz", None, None).await;
            (s == StatusCode::OK).then_some(())
        };
        wait::until("/readyz to say ready", Duration::from_secs(20), ready).await;
    }

    /// The value of one sample of `/metrics` (name and labels as exported), 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        let text = self.metrics_text().await;
        flashsale_testkit::prometheus::value(&text, sample).unwrap_or(0.0)
    }

    /// The answer to a GET of `path`, as it came.
    pub async fn raw_get(&self, path: &str) -> reqwest::Response {
        let url = format!("{}{}", self.base, path);
        self.http.get(url).send().await.expect("request sent")
    }

    /// The JSON of a GET of `path` without a token, which must answer 200.
    pub async fn get_ok(&self, path: &str) -> Value {
        let (s, b) = self.call("GET", path, None, None).await;
        assert_eq!(s, StatusCode::OK, "GET {path}: {b}");
        b
    }

    /// Order `no` as `user` sees it.
    pub async fn order(&self, user: u64, no: &str) -> (StatusCode, Value) {
        let path = format!("/api/v1/orders/{no}");
        self.call("GET", &path, Some(&self.token(user)), None).await
    }

    /// An admin POST to `/api/v1/sales/{sku}/{action}` (warm, pause, resume, end, …).
    pub async fn sale_action(&self, sku: u64, action: &str) -> (StatusCode, Value) {
        let path = format!("/api/v1/sales/{sku}/{action}");
        self.admin("POST", &path, None).await
    }

    /// An admin repair of sale `sku` (`POST /api/v1/admin/reconcile/{sku}/repair`), which must
    /// answer 200; the report.
    pub async fn repair(&self, sku: u64) -> Value {
        let path = format!("/api/v1/admin/reconcile/{sku}/repair");
        let (s, b) = self.admin("POST", &path, None).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b
    }

    /// An admin POST of `body` to `/api/v1/sales` (no warm).
    pub async fn create_sale(&self, body: Value) -> (StatusCode, Value) {
        self.admin("POST", "/api/v1/sales", Some(body)).await
    }

    /// Waits until the database has applied every event the hot ledger has.
    pub async fn drain(&self, sku: u64) {
        let state = self.server.as_ref().unwrap().state.clone();
        flashsale_testkit::wait::until("the persister to drain", Duration::from_secs(60), || {
            let state = state.clone();
            async move {
                let rows = state.shop.store().buckets(SkuId(sku)).await.ok()?;
                if !rows.is_empty() {
                    // Each bucket at its own copy's counters, transfers included.
                    let hot = state.shop.ledger().hot_buckets(SkuId(sku)).await.ok()??;
                    let db: Vec<_> = rows.iter().map(|r| (r.bucket, r.counters)).collect();
                    return (db == hot.buckets).then_some(());
                }
                let hot = state.shop.ledger().counters(SkuId(sku)).await.ok()??;
                let stored = state.shop.store().sale(SkuId(sku)).await.ok()??;
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

/// A sale as the database's own tables hold it, counted by SQL (not by any code's counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlCounts {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub per_user_limit: i64,
    pub applied_seq: i64,
    /// Orders in a live status (CREATED, RESERVED, PAID) and their units.
    pub live_orders: i64,
    pub live_units: i64,
    /// Orders the persister has not finished (PENDING).
    pub pending: i64,
    /// The most units one user holds in live orders.
    pub user_units_max: i64,
    /// Rows that repeat another's order number, or another's (user, request id).
    pub order_nos_repeated: i64,
    pub requests_repeated: i64,
    /// Rows of the event log and its highest seq.
    pub events: i64,
    pub last_seq: i64,
}

impl SqlCounts {
    /// Live orders, their units, and the sale's sold counter.
    pub fn live(&self) -> (i64, i64, i64) {
        (self.live_orders, self.live_units, self.sold)
    }

    /// I1–I5 and I8 as the tables show them once the persister has drained: no oversell, the
    /// counters conserved, the per-user limit kept, one order per request, nothing left
    /// pending, the event log gap-free up to the applied seq (per bucket, summed), no order
    /// number twice.
    pub fn assert_invariants(&self) {
        assert!(self.live_units <= self.total, "I1: {self:?}");
        assert_eq!(
            self.available + self.reserved + self.sold,
            self.total,
            "I2: {self:?}"
        );
        assert!(self.user_units_max <= self.per_user_limit, "I3: {self:?}");
        assert_eq!(self.requests_repeated, 0, "I4: {self:?}");
        assert_eq!(self.pending, 0, "I5: {self:?}");
        assert_eq!(
            (self.events, self.last_seq),
            (self.applied_seq, self.applied_seq),
            "one event per change, gap-free, all applied: {self:?}"
        );
        assert_eq!(self.order_nos_repeated, 0, "I8: {self:?}");
    }
}

/// The query of [`sql_counts`], in the dialect whose 64-bit integer type is `int`.
fn counts_query(int: &str, sku: u64) -> String {
    let live = format!("sku_id = {sku} AND status IN ('CREATED','RESERVED','PAID')");
    let sale = |col: &str| format!("(SELECT CAST({col} AS {int}) FROM sales WHERE sku_id = {sku})");
    // A sale kept in buckets applies on its bucket rows, each with its own seq from 1: the
    // sums over buckets stand for the sale's (the sale row's applied_seq stays 0 then).
    let applied = format!(
        "(SELECT CAST(applied_seq + (SELECT COALESCE(SUM(applied_seq), 0) FROM sale_buckets \
         WHERE sku_id = {sku}) AS {int}) FROM sales WHERE sku_id = {sku})"
    );
    format!(
        "SELECT {}, {}, {}, {}, {}, {}, \
         (SELECT COUNT(*) FROM orders WHERE {live}), \
         (SELECT CAST(COALESCE(SUM(quantity), 0) AS {int}) FROM orders WHERE {live}), \
         (SELECT COUNT(*) FROM orders WHERE sku_id = {sku} AND status = 'PENDING'), \
         (SELECT CAST(COALESCE(MAX(units), 0) AS {int}) FROM \
            (SELECT SUM(quantity) AS units FROM orders WHERE {live} GROUP BY user_id) per_user), \
         (SELECT COUNT(*) - COUNT(DISTINCT order_no) FROM orders WHERE sku_id = {sku}), \
         (SELECT COUNT(*) FROM \
            (SELECT 1 AS one FROM orders WHERE sku_id = {sku} \
             GROUP BY user_id, request_id HAVING COUNT(*) > 1) repeats), \
         (SELECT COUNT(*) FROM stock_events WHERE sku_id = {sku}), \
         (SELECT CAST(COALESCE(SUM(last), 0) AS {int}) FROM \
            (SELECT MAX(seq) AS last FROM stock_events WHERE sku_id = {sku} GROUP BY bucket) b)",
        sale("total_stock"),
        sale("available"),
        sale("reserved"),
        sale("sold"),
        sale("per_user_limit"),
        applied,
    )
}

/// One row of 64-bit integers that `query` gives over a new connection of type `C`.
async fn integer_row<C>(db_url: &str, query: &str) -> Vec<i64>
where
    C: sqlx::Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
    for<'q> <C::Database as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, C::Database>,
    i64: for<'r> sqlx::Decode<'r, C::Database> + sqlx::Type<C::Database>,
    usize: sqlx::ColumnIndex<<C::Database as sqlx::Database>::Row>,
{
    use sqlx::Row;
    let mut conn = C::connect(db_url).await.unwrap();
    let row = sqlx::query(query).fetch_one(&mut conn).await.unwrap();
    (0..row.len()).map(|i| row.get(i)).collect()
}

/// Counted by SQL in the database at `db_url`: the invariants hold and sale `sku` sold all its
/// `units`, each in one live order of one unit (nothing left available).
pub async fn assert_sold_out_in_units_of_one(db_url: &str, sku: u64, units: u64) {
    let counts = sql_counts(db_url, sku).await;
    counts.assert_invariants();
    let units = units as i64;
    assert_eq!(
        (counts.live(), counts.available),
        ((units, units, units), 0),
        "counted by SQL in {db_url}"
    );
}

/// [`SqlCounts`] of `sku` from the database at `db_url` (MariaDB, PostgreSQL or SQLite).
pub async fn sql_counts(db_url: &str, sku: u64) -> SqlCounts {
    let values = if db_url.starts_with("postgres") {
        integer_row::<sqlx::PgConnection>(db_url, &counts_query("BIGINT", sku)).await
    } else if db_url.starts_with("sqlite") {
        integer_row::<sqlx::SqliteConnection>(db_url, &counts_query("INTEGER", sku)).await
    } else {
        integer_row::<sqlx::MySqlConnection>(db_url, &counts_query("SIGNED", sku)).await
    };
    let [total, available, reserved, sold, per_user_limit, applied_seq, live_orders, live_units, pending, user_units_max, order_nos_repeated, requests_repeated, events, last_seq] =
        values[..]
    else {
        panic!("one row of 14 counts: {values:?}")
    };
    SqlCounts {
        total,
        available,
        reserved,
        sold,
        per_user_limit,
        applied_seq,
        live_orders,
        live_units,
        pending,
        user_units_max,
        order_nos_repeated,
        requests_repeated,
        events,
        last_seq,
    }
}

/// I1–I5, I7 from the database's own rows (for a sale kept in buckets: I5 per bucket and I2
/// over the buckets too).
pub async fn assert_invariants(store: &dyn OrderStore, sku: u64) {
    let a = store
        .audit(SkuId(sku))
        .await
        .unwrap()
        .expect("sale in the database");
    let (sale, c) = (&a.sale.sale, &a.sale.counters);
    let report = match a.buckets.is_empty() {
        true => flashsale_core::invariants::check_sale(sale, c, &a.orders, &a.events, true),
        false => flashsale_core::invariants::check_bucketed_sale(
            sale,
            c,
            &a.buckets,
            &a.transfers,
            &a.orders,
            &a.events,
            true,
        ),
    };
    assert!(
        report.is_ok(),
        "invariants broken: {:#?}",
        report.violations
    );
}
