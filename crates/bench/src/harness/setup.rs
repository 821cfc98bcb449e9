//! What the benches share: secrets and tokens, sales made and warmed over HTTP, fresh
//! databases and Redis prefixes made and dropped, the processes to meter.

use std::path::PathBuf;
use std::sync::Arc;

use crate::closed::MakeRequest;
use crate::procs::{self};
use flashsale_core::{Ledger, SkuId};
use rand::distr::{Alphanumeric, SampleString};
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use serde_json::json;

pub(crate) fn secret() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 32)
}

/// Users whose tokens the success path cycles through; each may buy `USER_LIMIT` units.
pub(crate) const BENCH_USERS: u64 = 2_000;
pub(crate) const USER_LIMIT: u32 = 1_000;

/// The port of a `redis://` / `mysql://` URL, to tell the machine's server from others.
pub(crate) fn port_of(url: Option<&str>) -> Option<u16> {
    let rest = url?.split("://").nth(1)?;
    let host = rest.split(['/', ',']).next()?;
    host.rsplit(':').next()?.parse().ok()
}

/// Builds purchase requests from prepared parts (header values, a formatted body): the
/// driver's own cost per request stays close to a GET's, so the ratio measures the server.
pub(crate) fn purchase_req(
    base: &str,
    sku: u64,
    tokens: Arc<Vec<String>>,
    tag: &'static str,
) -> MakeRequest {
    let url = format!("{base}/api/v1/sales/{sku}/purchases");
    let bearers: Vec<HeaderValue> = tokens
        .iter()
        .map(|t| HeaderValue::try_from(format!("Bearer {t}")).expect("a JWT is a header value"))
        .collect();
    Arc::new(move |cl, i| {
        cl.post(&url)
            .header(AUTHORIZATION, bearers[(i % BENCH_USERS) as usize].clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(format!("{{\"request_id\":\"{tag}{i}\",\"quantity\":1}}"))
    })
}

pub(crate) async fn open(base: &str, admin: &str, sku: u64, stock: u64) -> anyhow::Result<()> {
    let body =
        json!({"sku_id": sku, "name": "bench", "total_stock": stock, "per_user_limit": USER_LIMIT});
    create_and_warm(base, admin, &body).await
}

/// Creates a sale (`body` is the create request) and warms it, over HTTP as an admin.
pub async fn create_and_warm(
    base: &str,
    admin: &str,
    body: &serde_json::Value,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let sku = body["sku_id"].as_u64().unwrap_or(0);
    let r = http
        .post(format!("{base}/api/v1/sales"))
        .bearer_auth(admin)
        .json(body)
        .send()
        .await?;
    anyhow::ensure!(
        r.status().as_u16() == 201,
        "create sale: {}",
        r.text().await?
    );
    let r = http
        .post(format!("{base}/api/v1/sales/{sku}/warm"))
        .bearer_auth(admin)
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "warm sale: {}", r.text().await?);
    Ok(())
}

pub(crate) async fn sell_out(base: &str, sku: u64, tokens: &[String]) -> anyhow::Result<()> {
    let r = reqwest::Client::new()
        .post(format!("{base}/api/v1/sales/{sku}/purchases"))
        .bearer_auth(&tokens[0])
        .json(&json!({"request_id": "only", "quantity": 1}))
        .send()
        .await?;
    anyhow::ensure!(
        r.status().as_u16() == 202,
        "the one unit: {}",
        r.text().await?
    );
    Ok(())
}

pub(crate) fn tempfile_dir(data_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let dir = data_dir.join(format!("bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Every key under `prefix` (KEYS: a bench's own Redis, never a shared one in production).
pub(crate) async fn keys_under(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> anyhow::Result<Vec<String>> {
    Ok(redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(conn)
        .await?)
}

pub(crate) async fn cleanup_redis(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> anyhow::Result<()> {
    let keys = keys_under(conn, prefix).await?;
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
    }
    Ok(())
}

pub(crate) fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// With a PostgreSQL database as the system of record: its backends (`postgres`: the
/// processes serving that database, the path's own work) and every `postgres` process on the
/// machine (`postgres-all`: the WAL writer, checkpointer and other clients' backends too).
pub(crate) fn postgres_processes(database_url: &str) -> Vec<procs::Watched> {
    let name = database_url
        .rsplit('/')
        .next()
        .filter(|_| is_postgres(database_url));
    let Some(name) = name.map(|n| n.split('?').next().unwrap_or(n)) else {
        return Vec::new();
    };
    vec![
        procs::Watched::postgres_backends(name),
        procs::Watched::group("postgres-all", "postgres", ""),
    ]
}

/// A fresh database `name` on the server at `server_url` (MySQL/MariaDB or PostgreSQL),
/// opened as the system of record.
pub(crate) async fn fresh_store(
    server_url: &str,
    name: &str,
) -> anyhow::Result<Arc<dyn flashsale_core::OrderStore>> {
    let url = fresh_database(server_url, name).await?;
    flashsale_engine::backends::open_store(&url).await
}

/// Set (to anything): the benches' fresh databases keep the expand shape of schema 16 (a
/// purchase's event row beside its order row, as while an older binary may still run)
/// instead of being contracted to one row per purchase.
pub const EXPAND_ENV: &str = "FLASHSALE_BENCH_EXPAND";

/// Contracts the fresh database at `url` to one row per purchase (`flashsale migrate
/// --contract`: no older binary ever runs against a bench's database), unless
/// [`EXPAND_ENV`] is set.
pub(crate) async fn one_row(url: &str) -> anyhow::Result<()> {
    if std::env::var_os(EXPAND_ENV).is_none() {
        flashsale_engine::backends::contract_one_row(url).await?;
    }
    Ok(())
}

/// A fresh database `name` on the server at `server_url` (MySQL/MariaDB or PostgreSQL),
/// migrated and contracted as [`one_row`] says; its URL.
pub(crate) async fn fresh_database(server_url: &str, name: &str) -> anyhow::Result<String> {
    let url = empty_database(server_url, name).await?;
    one_row(&url).await?;
    Ok(url)
}

/// A fresh, empty database `name` on the server at `server_url` (MySQL/MariaDB or
/// PostgreSQL); its URL.
async fn empty_database(server_url: &str, name: &str) -> anyhow::Result<String> {
    use sqlx::{Connection, Executor};
    if !is_postgres(server_url) {
        return fresh_mysql(server_url, name).await;
    }
    let server = server_url.trim_end_matches('/');
    let mut conn = sqlx::PgConnection::connect(&format!("{server}/postgres")).await?;
    conn.execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
        .await?;
    conn.execute(format!("CREATE DATABASE \"{name}\"").as_str())
        .await?;
    Ok(format!("{server}/{name}"))
}

/// Drops a database [`fresh_database`] made.
pub(crate) async fn drop_database(server_url: &str, name: &str) -> anyhow::Result<()> {
    use sqlx::{Connection, Executor};
    if !is_postgres(server_url) {
        return drop_mysql(server_url, &[name.to_owned()]).await;
    }
    let server = server_url.trim_end_matches('/');
    let mut conn = sqlx::PgConnection::connect(&format!("{server}/postgres")).await?;
    conn.execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
        .await?;
    Ok(())
}

/// Loads a stored sale into the hot ledger the one way the service does: a rebuild that takes
/// its first epoch in the database (the database refuses events of an epoch it never gave).
pub(crate) async fn load_sale(
    ledger: &dyn Ledger,
    store: &dyn flashsale_core::OrderStore,
    sku: SkuId,
) -> anyhow::Result<()> {
    flashsale_engine::reconcile::rebuild(ledger, store, sku).await?;
    Ok(())
}

/// A fresh database on the MySQL server of `url` (its path is replaced).
pub async fn fresh_mysql(server_url: &str, name: &str) -> anyhow::Result<String> {
    use sqlx::{Connection, Executor};
    let mut conn = sqlx::MySqlConnection::connect(server_url).await?;
    conn.execute(format!("DROP DATABASE IF EXISTS `{name}`").as_str())
        .await?;
    conn.execute(format!("CREATE DATABASE `{name}`").as_str())
        .await?;
    Ok(format!("{}/{name}", server_url.trim_end_matches('/')))
}

/// Drops the databases a bench made with [`fresh_mysql`] (absent ones are fine).
pub async fn drop_mysql(server_url: &str, names: &[String]) -> anyhow::Result<()> {
    use sqlx::{Connection, Executor};
    let mut conn = sqlx::MySqlConnection::connect(server_url).await?;
    for name in names {
        conn.execute(format!("DROP DATABASE IF EXISTS `{name}`").as_str())
            .await?;
    }
    Ok(())
}
