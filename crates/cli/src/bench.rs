//! `flashsale bench`: the project's measurements (release mode). Each prints ratios measured in
//! one run and writes JSON under `<data dir>/reports/`.
//!
//! - `bench http`: /healthz vs the purchase success path vs the sold-out path, same driver, same
//!   concurrency, same server; `--risk` puts a risk service of its own in the purchase path
//!   (`bench_risk`).
//! - `bench ledger`: the embedded ledger in-process (no HTTP): purchases committed per second.
//! - `bench script` (`bench_script`): the purchase script's cost to Redis, part by part.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use flashsale_bench::closed::{self, MakeRequest, Rate};
use flashsale_bench::procs::{self, Meter, PhaseCpu};
use flashsale_core::{
    HotLedger, Ledger, PurchaseOutcome, PurchaseRequest, RequestId, Sale, SaleState, SkuId, UserId,
};
use flashsale_embedded::EmbeddedLedger;
use flashsale_server::auth::Auth;
use flashsale_server::{Config, Server, Tunables};
use flashsale_store::SqliteStore;
use rand::distr::{Alphanumeric, SampleString};
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// /healthz vs purchase success path vs sold-out path over HTTP.
    Http(HttpArgs),
    /// The embedded ledger in-process: purchases committed per second.
    Ledger(LedgerArgs),
    /// One hot SKU, one strategy after another: the seeds' designs against ours.
    Strategies(StrategiesArgs),
    /// Persister drain rate: batched transactions vs one transaction per event.
    Persister(PersisterArgs),
    /// A spike of buyers at running instances, with a report.
    Spike(Box<crate::spike::SpikeArgs>),
    /// The purchase script's cost to Redis per purchase, part by part.
    Script(crate::bench_script::ScriptArgs),
    /// One hot sale on a Redis Cluster with one bucket and with several: Redis CPU per
    /// purchase on the busiest primary and on all nodes, and no false sold-out.
    Buckets(crate::bench_buckets::BucketsArgs),
}

#[derive(Debug, Clone, Args)]
pub struct PersisterArgs {
    /// Events to drain per run.
    #[arg(long, default_value_t = 20_000)]
    pub events: u64,
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    pub mysql_url: String,
    /// A PostgreSQL server (no database: the bench makes its own), measured beside MariaDB;
    /// empty: MariaDB only.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub postgres_url: String,
}

#[derive(Debug, Clone, Args)]
pub struct StrategiesArgs {
    #[arg(long, default_value_t = 10_000)]
    pub units: u64,
    #[arg(long, default_value_t = 100_000)]
    pub users: u64,
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// A MySQL/MariaDB server (no database: the bench makes its own).
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    pub mysql_url: String,
    /// Run only these strategies (comma list).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Every buyer can be accepted: units = users (the success path's cost per purchase).
    #[arg(long)]
    pub success_only: bool,
}

#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Seconds per measured endpoint.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Redis ledger at this URL (needs --database-url); default the embedded ledger.
    #[arg(long)]
    pub redis_url: Option<String>,
    #[arg(long)]
    pub database_url: Option<String>,
    #[arg(long, default_value = "./flashsale-data")]
    pub data_dir: PathBuf,
    /// With the Redis ledger: WAIT for this many replicas after each write (0 = off).
    #[arg(long, default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// Timeout of that WAIT, ms.
    #[arg(long, default_value_t = 100)]
    pub redis_wait_timeout_ms: u64,
    /// A risk service in the purchase path: off, instant, <N>ms (answers after N ms) or down
    /// (nothing listens). The bench starts it; the server uses the risk defaults.
    #[arg(long, default_value = "off")]
    pub risk: String,
    /// The server alone: run this `flashsale` binary's `serve` as its own process (repeat to
    /// compare builds in one run); this process only drives the load (`bench_alone`).
    #[arg(long)]
    pub server_bin: Vec<PathBuf>,
    /// With --server-bin: the ledgers to run, Redis (+ MariaDB, + PostgreSQL) and/or embedded.
    #[arg(long, value_delimiter = ',', default_value = "redis,embedded")]
    pub ledgers: Vec<String>,
    /// With --server-bin: the MariaDB server each Redis-ledger run makes its database on.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    pub mysql_url: String,
    /// With --server-bin: a PostgreSQL server (no database: the bench makes its own) on which
    /// each Redis-ledger run is repeated, beside MariaDB; empty: MariaDB only.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub postgres_url: String,
    /// With --server-bin: run each server under callgrind, N requests per path, and report
    /// instructions per answer.
    #[arg(long)]
    pub callgrind: Option<u64>,
}

impl HttpArgs {
    /// The Redis of the server-alone runs (the machine's unless --redis-url).
    pub fn redis_url_alone(&self) -> String {
        let default = "redis://127.0.0.1:6379";
        self.redis_url.clone().unwrap_or_else(|| default.into())
    }
}

#[derive(Debug, Clone, Args)]
pub struct LedgerArgs {
    /// Purchases to commit.
    #[arg(long, default_value_t = 1_000_000)]
    pub purchases: u64,
    /// Requests per `purchase_batch` call.
    #[arg(long, default_value_t = 1_024)]
    pub batch: usize,
    /// Concurrent callers.
    #[arg(long, default_value_t = 4)]
    pub callers: usize,
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Http(args) => http(args).await,
        BenchCommand::Ledger(args) => ledger(args).await,
        BenchCommand::Strategies(args) => strategies(args).await,
        BenchCommand::Persister(args) => persister(args).await,
        BenchCommand::Spike(args) => crate::spike::run(*args).await,
        BenchCommand::Script(args) => crate::bench_script::run(args).await,
        BenchCommand::Buckets(args) => crate::bench_buckets::run(args).await,
    }
}

pub(crate) fn secret() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 32)
}

/// Users whose tokens the success path cycles through; each may buy `USER_LIMIT` units.
pub(crate) const BENCH_USERS: u64 = 2_000;
const USER_LIMIT: u32 = 1_000;

async fn http(args: HttpArgs) -> anyhow::Result<()> {
    if !args.server_bin.is_empty() {
        return crate::bench_alone::run(&args).await;
    }
    let risk =
        crate::bench_risk::RiskServer::start(crate::bench_risk::RiskMode::parse(&args.risk)?)
            .await?;
    let tmp = tempfile_dir(&args.data_dir)?;
    let database_url = match (&args.database_url, &args.redis_url) {
        (Some(u), _) => u.clone(),
        (None, Some(_)) => anyhow::bail!("--redis-url needs --database-url"),
        (None, None) => format!("sqlite://{}/bench.db", tmp.display()),
    };
    let mut engine = flashsale_engine::settings::Settings::new(
        args.redis_url.clone(),
        &format!("fsbench{}", std::process::id()),
        &database_url,
        &format!("bench-{}", std::process::id()),
    );
    engine.ledger.replication =
        (args.redis_wait_replicas > 0).then(|| flashsale_redis::Replication {
            replicas: args.redis_wait_replicas,
            timeout: std::time::Duration::from_millis(args.redis_wait_timeout_ms),
        });
    let config = Config {
        engine,
        listen: "127.0.0.1:0".parse()?,
        jwt_secret: secret(),
        admin_token: secret(),
        tunables: Tunables {
            queue_cap: 65_536,
            risk: flashsale_server::risk::RiskConfig {
                url: risk.as_ref().map(|r| r.url.clone()),
                ..Default::default()
            },
            ..Tunables::default()
        },
        identity: None,
    };
    let server = Server::start(config.clone()).await?;
    let base = format!("http://{}", server.addr);
    let auth = Auth::new(&config.jwt_secret, &config.admin_token);
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64 % 1_000_000_000;
    let (big, tiny) = (stamp * 2 + 1, stamp * 2 + 2);
    open(&base, &config.admin_token, big, 1_000_000_000).await?;
    open(&base, &config.admin_token, tiny, 1).await?;
    let tokens: Arc<Vec<String>> = Arc::new(
        (1..=BENCH_USERS)
            .map(|u| auth.sign(UserId(u), 3_600))
            .collect(),
    );
    let d = Duration::from_secs(args.seconds);
    let c = args.concurrency;
    println!(
        "bench http: {} ledger, {c} clients, {} s per endpoint, risk service {}",
        server.state.ledger.kind(),
        args.seconds,
        args.risk
    );

    let mut watched = procs::path_processes(
        port_of(args.redis_url.as_deref()),
        port_of(args.database_url.as_deref()),
    );
    watched.extend(postgres_processes(&database_url));
    let meter = Meter::new(watched);
    let load = procs::load_average();
    let health_url = format!("{base}/healthz");
    let health: MakeRequest = Arc::new(move |cl, _| cl.get(&health_url));
    let before = meter.sample();
    let healthz = closed::run("healthz", health, 200, c, d).await?;
    let healthz_cpu = meter.phase(&before, &meter.sample(), healthz.ok, healthz.seconds);
    let before = meter.sample();
    let success = closed::run(
        "purchase accepted",
        purchase_req(&base, big, tokens.clone(), "s"),
        202,
        c,
        d,
    )
    .await?;
    // The Redis ledger's persister writes behind the answers: its MariaDB work for this
    // phase is counted once the stream is drained.
    let drained = drain_wait(&server, SkuId(big)).await?;
    let success_cpu = meter.phase(&before, &meter.sample(), success.ok, success.seconds);
    sell_out(&base, tiny, &tokens).await?;
    let before = meter.sample();
    let sold_out = closed::run(
        "purchase sold out",
        purchase_req(&base, tiny, tokens.clone(), "x"),
        409,
        c,
        d,
    )
    .await?;
    let sold_out_cpu = meter.phase(&before, &meter.sample(), sold_out.ok, sold_out.seconds);
    if let Some(risk) = &risk {
        let metrics = server.state.metrics.render();
        println!(
            "risk service answered {} calls; fallbacks {}; breaker open at the end: {}",
            risk.calls(),
            metric_sum(&metrics, flashsale_core::metric_names::RISK_FALLBACKS),
            server.state.risk.breaker_open()
        );
    }
    server.shutdown().await?;
    let _ = std::fs::remove_dir_all(&tmp);
    println!(
        "load average before: {}; persister drained {:.2} s after the accepted phase",
        load.map_or("-".into(), |l| format!("{l:.2}")),
        drained.as_secs_f64()
    );
    report_http(
        &args,
        &[healthz, success, sold_out],
        &[healthz_cpu, success_cpu, sold_out_cpu],
    )
}

/// The sum of a counter's series in Prometheus text.
fn metric_sum(text: &str, name: &str) -> f64 {
    let series = text.lines().filter(|l| l.starts_with(name));
    let values = series.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    // + 0.0: the empty sum is -0.0, which prints as "-0".
    values.sum::<f64>() + 0.0
}

/// The port of a `redis://` / `mysql://` URL, to tell the machine's server from others.
pub(crate) fn port_of(url: Option<&str>) -> Option<u16> {
    let rest = url?.split("://").nth(1)?;
    let host = rest.split(['/', ',']).next()?;
    host.rsplit(':').next()?.parse().ok()
}

/// Waits (at most 30 s) until the database has applied every change of the hot copy; how
/// long it took.
async fn drain_wait(server: &Server, sku: SkuId) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let hot = server.state.ledger.counters(sku).await?.map(|c| c.seq);
        let db = server.state.store.sale(sku).await?.map(|s| s.counters.seq);
        if hot.is_none() || hot == db {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
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

fn report_http(args: &HttpArgs, rates: &[Rate], cpu: &[PhaseCpu]) -> anyhow::Result<()> {
    println!(
        "{:<20} {:>10} {:>10} {:>9} {:>9}  CPU µs per answer",
        "endpoint", "answers/s", "expected", "p50 ms", "p99 ms"
    );
    for (r, c) in rates.iter().zip(cpu) {
        println!(
            "{:<20} {:>10.0} {:>10} {:>9.2} {:>9.2}  {}",
            r.name,
            r.per_s,
            r.ok,
            r.p50_ms,
            r.p99_ms,
            c.line()
        );
    }
    let base = rates[0].per_s.max(1e-9);
    println!(
        "purchase success / healthz = {:.2} (target >= 0.5)",
        rates[1].per_s / base
    );
    println!(
        "sold-out / healthz         = {:.2} (target >= 0.90)",
        rates[2].per_s / base
    );
    let dir = args.data_dir.join("reports");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!(
        "bench-http-{}.json",
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs()
    ));
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(
            &json!({"concurrency": args.concurrency, "seconds": args.seconds, "risk": args.risk, "rates": rates, "cpu_us_per_answer": cpu}),
        )?,
    )?;
    println!("json: {}", path.display());
    Ok(())
}

fn tempfile_dir(data_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let dir = data_dir.join(format!("bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn ledger(args: LedgerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.batch >= 1 && args.batch <= flashsale_core::limits::BATCH_LEN_MAX,
        "--batch must be 1..=1024"
    );
    let dir = tempfile_dir(std::path::Path::new("./flashsale-data"))?;
    let store =
        Arc::new(SqliteStore::open(&format!("sqlite://{}/ledger.db", dir.display())).await?);
    let ledger = Arc::new(EmbeddedLedger::open(store.clone()).await?);
    let sale = Sale::always_open(SkuId(1), args.purchases);
    flashsale_core::OrderStore::create_sale(store.as_ref(), &sale).await?;
    flashsale_core::OrderStore::set_state(store.as_ref(), sale.sku_id, SaleState::Live).await?;
    load_sale(ledger.as_ref(), store.as_ref(), sale.sku_id).await?;
    let per_caller = args.purchases / args.callers as u64;
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.callers as u64)
        .map(|c| {
            tokio::spawn(caller(
                ledger.clone(),
                c * per_caller,
                per_caller,
                args.batch,
            ))
        })
        .collect();
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    let stored = flashsale_core::OrderStore::sale(store.as_ref(), SkuId(1))
        .await?
        .expect("sale");
    println!(
        "embedded ledger: {accepted} purchases committed in {secs:.2} s = {:.0} purchases/s",
        accepted as f64 / secs
    );
    println!(
        "batch {} × {} callers; database sold = {} (target >= 300000/s)",
        args.batch, args.callers, stored.counters.sold
    );
    anyhow::ensure!(
        stored.counters.sold == accepted,
        "the database disagrees with the answers"
    );
    anyhow::ensure!(
        accepted > 0,
        "no purchase was accepted: the sale never opened"
    );
    drop(ledger);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn caller(
    ledger: Arc<EmbeddedLedger>,
    first: u64,
    count: u64,
    batch: usize,
) -> anyhow::Result<u64> {
    let mut accepted = 0;
    let mut next = first;
    while next < first + count {
        let n = (first + count - next).min(batch as u64);
        let reqs: Vec<PurchaseRequest> = (next..next + n)
            .map(|i| PurchaseRequest {
                sku_id: SkuId(1),
                user_id: UserId(i + 1),
                request_id: RequestId::parse(&format!("r{i}")).expect("valid"),
                quantity: 1,
            })
            .collect();
        let outcomes = ledger.purchase_batch(SkuId(1), &reqs).await?;
        accepted += outcomes
            .iter()
            .filter(|o| matches!(o, PurchaseOutcome::Accepted { .. }))
            .count() as u64;
        next += n;
    }
    Ok(accepted)
}

async fn strategies(args: StrategiesArgs) -> anyhow::Result<()> {
    use crate::strategies::*;
    let w = Workload {
        units: if args.success_only {
            args.units.max(args.users)
        } else {
            args.units
        },
        users: args.users,
        concurrency: args.concurrency,
    };
    let client = redis::Client::open(args.redis_url.as_str())?;
    let mut admin = client.get_multiplexed_async_connection().await?;
    let prefix = format!("fsstrat{}", std::process::id());
    let names = [
        "db-row-lock",
        "redis-naive",
        "redis-lock",
        "redis-lua",
        "flashsale-redis",
        "flashsale-embedded",
    ];
    let wanted = |n: &str| args.only.is_empty() || args.only.iter().any(|o| o == n);
    println!(
        "bench strategies: {} units, {} users, {} clients; load average {}",
        w.units,
        w.users,
        w.concurrency,
        procs::load_average().map_or("-".into(), |l| format!("{l:.2}"))
    );
    let meter = Meter::new(procs::path_processes(
        port_of(Some(&args.redis_url)),
        port_of(Some(&args.mysql_url)),
    ));
    let mut rows = Vec::new();
    for name in names.into_iter().filter(|n| wanted(n)) {
        let p = format!("{prefix}{}", rows.len());
        let strategy = build_strategy(name, &args, &client, &p).await?;
        let row = measure(strategy.clone(), &w, &mut admin, &meter).await?;
        println!(
            "  {:<20} {:>9.0}/s  p99 {:>8.2} ms  sold {}",
            row.strategy, row.per_s, row.p99_ms, row.audit.units_sold
        );
        rows.push(row);
        drop(strategy);
        cleanup_redis(&mut admin, &p).await?;
        let dbs = [format!("{p}_rowlock"), format!("{p}_ours")];
        crate::strategies::drop_mysql(&args.mysql_url, &dbs).await?;
    }
    // A persister stopping behind its strategy may have written its stream again after that
    // strategy's cleanup: sweep every key of this run once more.
    cleanup_redis(&mut admin, &format!("{prefix}*")).await?;
    print_strategies(&rows);
    let dir = std::path::Path::new("./flashsale-data/reports");
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!(
        "bench-strategies-{}.json",
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs()
    ));
    std::fs::write(&path, serde_json::to_vec_pretty(&rows)?)?;
    println!("json: {}", path.display());
    Ok(())
}

async fn build_strategy(
    name: &str,
    a: &StrategiesArgs,
    client: &redis::Client,
    p: &str,
) -> anyhow::Result<Arc<dyn crate::strategies::Strategy>> {
    use crate::strategies::*;
    let conn = client.get_multiplexed_async_connection().await?;
    let mut c = conn.clone();
    let sku = "{1001}";
    Ok(match name {
        "db-row-lock" => {
            let url = fresh_mysql(&a.mysql_url, &format!("{p}_rowlock")).await?;
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(64)
                .connect(&url)
                .await?;
            Arc::new(DbRowLock::new(pool, a.units).await?)
        }
        "redis-naive" => {
            let _: () = redis::cmd("SET")
                .arg(format!("{p}:stock:{sku}"))
                .arg(a.units)
                .query_async(&mut c)
                .await?;
            Arc::new(RedisNaive {
                conn,
                prefix: p.into(),
            })
        }
        "redis-lock" => {
            let _: () = redis::cmd("HSET")
                .arg(format!("{p}:item:{sku}"))
                .arg("total")
                .arg(a.units)
                .arg("ordered")
                .arg(0)
                .query_async(&mut c)
                .await?;
            Arc::new(RedisLock {
                conn,
                prefix: p.into(),
            })
        }
        "redis-lua" => {
            let _: () = redis::cmd("SET")
                .arg(format!("{p}:stock:{sku}"))
                .arg(a.units)
                .query_async(&mut c)
                .await?;
            Arc::new(RedisLua {
                conn,
                prefix: p.into(),
                script: redis::Script::new(SEED_LUA),
            })
        }
        "flashsale-redis" => {
            let url = fresh_mysql(&a.mysql_url, &format!("{p}_ours")).await?;
            let store: Arc<dyn flashsale_core::OrderStore> =
                Arc::new(flashsale_store::MySqlStore::connect(&url).await?);
            let ledger: Arc<dyn Ledger> =
                Arc::new(flashsale_redis::RedisLedger::connect(&a.redis_url, p).await?);
            ours(
                "flashsale-redis",
                ledger,
                store,
                a.units,
                Some((&a.redis_url, p)),
            )
            .await?
        }
        "flashsale-embedded" => {
            let dir = tempfile_dir(std::path::Path::new("./flashsale-data"))?;
            let sqlite =
                Arc::new(SqliteStore::open(&format!("sqlite://{}/{p}.db", dir.display())).await?);
            let ledger: Arc<dyn Ledger> = Arc::new(EmbeddedLedger::open(sqlite.clone()).await?);
            ours("flashsale-embedded", ledger, sqlite, a.units, None).await?
        }
        other => anyhow::bail!("unknown strategy {other}"),
    })
}

async fn ours(
    name: &'static str,
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn flashsale_core::OrderStore>,
    units: u64,
    persist: Option<(&str, &str)>,
) -> anyhow::Result<Arc<dyn crate::strategies::Strategy>> {
    let sale = crate::strategies::bench_sale(units);
    store.create_sale(&sale).await?;
    store.set_state(sale.sku_id, SaleState::Live).await?;
    load_sale(ledger.as_ref(), store.as_ref(), sale.sku_id).await?;
    if let Some((url, prefix)) = persist {
        let config = flashsale_engine::persister::PersisterConfig::new(url, prefix, "bench");
        let persister = flashsale_engine::persister::Persister::new(config, store.clone());
        let (tx, rx) = tokio::sync::broadcast::channel(1);
        tokio::spawn(async move {
            let _keep = tx;
            let _ = persister.run(rx).await;
        });
    }
    let batcher = flashsale_engine::batcher::Batcher::new(ledger.clone(), 256, 65_536);
    Ok(Arc::new(crate::strategies::Ours {
        name,
        ledger,
        store,
        batcher,
    }))
}

pub(crate) async fn cleanup_redis(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> anyhow::Result<()> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(conn)
        .await?;
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
    }
    Ok(())
}

/// Where Redis spends per buyer, by command (the costliest six of each strategy).
fn print_redis_commands(rows: &[crate::strategies::StrategyRow]) {
    println!("\nRedis commands per buyer (INFO commandstats): command calls µs");
    for r in rows.iter().filter(|r| !r.redis_by_command.is_empty()) {
        let top: Vec<String> = r
            .redis_by_command
            .iter()
            .take(6)
            .map(|c| {
                format!(
                    "{} {:.3} {:.2}",
                    c.command, c.calls_per_buyer, c.usec_per_buyer
                )
            })
            .collect();
        println!("{:<20} {}", r.strategy, top.join(", "));
    }
}

fn print_strategies(rows: &[crate::strategies::StrategyRow]) {
    println!(
        "\n{:<20} {:>10} {:>9} {:>9} {:>8} {:>9} {:>10} {:>10} {:>12} {:>12}",
        "strategy",
        "buyers/s",
        "p50 ms",
        "p99 ms",
        "sold",
        "oversold",
        "dup buyers",
        "db orders",
        "redis cpu us",
        "redis cmd us"
    );
    for r in rows {
        let db = r
            .audit
            .orders_in_db
            .map_or("-".to_string(), |n| n.to_string());
        let us = |v: Option<f64>| v.map_or("-".to_string(), |u| format!("{u:.2}"));
        println!(
            "{:<20} {:>10.0} {:>9.2} {:>9.2} {:>8} {:>9} {:>10} {:>10} {:>12} {:>12}",
            r.strategy,
            r.per_s,
            r.p50_ms,
            r.p99_ms,
            r.audit.units_sold,
            r.audit.oversold,
            r.audit.duplicate_buyers,
            db,
            us(r.redis_usec_per_request),
            us(r.redis_cmd_usec_per_request)
        );
    }
    println!(
        "\nCPU per process (/proc/<pid>/stat, run and drain), µs per buyer | per accepted purchase"
    );
    for r in rows {
        println!(
            "{:<20} {} | {}",
            r.strategy,
            r.cpu_per_buyer.line(),
            r.cpu_per_accepted.line()
        );
    }
    print_redis_commands(rows);
    let find = |n: &str| rows.iter().find(|r| r.strategy == n);
    if let (Some(ours), Some(lua)) = (find("flashsale-redis"), find("redis-lua")) {
        // Per accepted purchase: what the success path costs Redis, whatever share of the
        // buyers met a sold-out sale.
        let per_sold = |r: &crate::strategies::StrategyRow, v: Option<f64>| {
            v.map(|u| u * r.buyers as f64 / r.audit.units_sold.max(1) as f64)
        };
        if let (Some(a), Some(b)) = (
            per_sold(ours, ours.redis_usec_per_request),
            per_sold(lua, lua.redis_usec_per_request),
        ) {
            println!(
                "Redis main-thread µs per accepted purchase: flashsale-redis {a:.2}, redis-lua {b:.2}, ratio {:.2} (target <= 0.33)",
                a / b
            );
        }
    }
    if let (Some(ours), Some(lua)) = (find("flashsale-redis"), find("redis-lua")) {
        println!(
            "flashsale-redis / redis-lua throughput = {:.2} (target >= 2)",
            ours.per_s / lua.per_s
        );
        type Measure = fn(&crate::strategies::StrategyRow) -> Option<f64>;
        let measures: [(&str, Measure); 2] = [
            ("Redis CPU per request (INFO cpu)", |r| {
                r.redis_usec_per_request
            }),
            ("command µs per request (INFO commandstats)", |r| {
                r.redis_cmd_usec_per_request
            }),
        ];
        for (what, of) in measures {
            if let (Some(a), Some(b)) = (of(ours), of(lua)) {
                println!(
                    "flashsale-redis / redis-lua {what} = {:.2} (target <= 0.33)",
                    a / b
                );
            }
        }
    }
    if let (Some(ours), Some(db)) = (find("flashsale-redis"), find("db-row-lock")) {
        println!("flashsale-redis / db-row-lock throughput = {:.1} (target >= 30), p99 ratio = {:.3} (target <= 0.1)",
            ours.per_s / db.per_s, ours.p99_ms / db.p99_ms);
    }
}

async fn persister(args: PersisterArgs) -> anyhow::Result<()> {
    println!(
        "bench persister: {} events per run, Redis stream → MariaDB, PostgreSQL",
        args.events
    );
    let servers = [
        ("MariaDB", &args.mysql_url),
        ("PostgreSQL", &args.postgres_url),
    ];
    for (name, server) in servers.into_iter().filter(|(_, url)| !url.is_empty()) {
        let batched = drain_rate(&args, server, 1_024).await?;
        let single = drain_rate(&args, server, 1).await?;
        println!("{name} batched (1,024 entries of 256 events per read, one transaction each): {batched:>9.0} events/s");
        println!("{name} one transaction per event:       {single:>9.0} events/s");
        println!(
            "{name} batched / per-event = {:.1} (target >= 5)",
            batched / single
        );
    }
    Ok(())
}

fn is_postgres(url: &str) -> bool {
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
async fn fresh_store(
    server_url: &str,
    name: &str,
) -> anyhow::Result<Arc<dyn flashsale_core::OrderStore>> {
    let url = fresh_database(server_url, name).await?;
    flashsale_engine::backends::open_store(&url).await
}

/// A fresh, empty database `name` on the server at `server_url` (MySQL/MariaDB or
/// PostgreSQL); its URL.
pub(crate) async fn fresh_database(server_url: &str, name: &str) -> anyhow::Result<String> {
    use sqlx::{Connection, Executor};
    if !is_postgres(server_url) {
        return crate::strategies::fresh_mysql(server_url, name).await;
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
        return crate::strategies::drop_mysql(server_url, &[name.to_owned()]).await;
    }
    let server = server_url.trim_end_matches('/');
    let mut conn = sqlx::PgConnection::connect(&format!("{server}/postgres")).await?;
    conn.execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
        .await?;
    Ok(())
}

/// Loads a stored sale into the hot ledger the one way the service does: a rebuild that takes
/// its first epoch in the database (the database refuses events of an epoch it never gave).
async fn load_sale(
    ledger: &dyn Ledger,
    store: &dyn flashsale_core::OrderStore,
    sku: SkuId,
) -> anyhow::Result<()> {
    flashsale_engine::reconcile::rebuild(ledger, store, sku).await?;
    Ok(())
}

/// Fills a sale's stream with `events` accepted purchases (calls of 256, or of one when the
/// persister reads one entry at a time), then times a persister draining it into a fresh
/// database on `server`.
async fn drain_rate(args: &PersisterArgs, server: &str, batch_max: usize) -> anyhow::Result<f64> {
    let prefix = format!("fspers{}b{batch_max}", std::process::id());
    let store = fresh_store(server, &prefix).await?;
    let ledger = flashsale_redis::RedisLedger::connect(&args.redis_url, &prefix).await?;
    let sale = crate::strategies::bench_sale(args.events);
    store.create_sale(&sale).await?;
    store.set_state(sale.sku_id, SaleState::Live).await?;
    load_sale(&ledger, store.as_ref(), sale.sku_id).await?;
    // A purchase call is one stream entry (all its events): the one-transaction-per-event
    // baseline reads one entry per transaction, so its stream is filled one purchase per call.
    let per_call = if batch_max == 1 { 1 } else { 256 };
    for start in (0..args.events).step_by(per_call as usize) {
        let reqs: Vec<PurchaseRequest> = (start..(start + per_call).min(args.events))
            .map(|i| PurchaseRequest {
                sku_id: sale.sku_id,
                user_id: UserId(i + 1),
                request_id: RequestId::parse(&format!("p{i}")).expect("id"),
                quantity: 1,
            })
            .collect();
        ledger.purchase_batch(sale.sku_id, &reqs).await?;
    }
    let mut config =
        flashsale_engine::persister::PersisterConfig::new(&args.redis_url, &prefix, "bench");
    config.bounds.batch_max = batch_max;
    let (stop, rx) = tokio::sync::broadcast::channel(1);
    let started = Instant::now();
    let task =
        tokio::spawn(flashsale_engine::persister::Persister::new(config, store.clone()).run(rx));
    loop {
        let applied = store
            .sale(sale.sku_id)
            .await?
            .map(|s| s.counters.seq)
            .unwrap_or(0);
        if applied == args.events {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "drain took over 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = args.events as f64 / started.elapsed().as_secs_f64();
    let _ = stop.send(());
    task.await??;
    let mut conn = redis::Client::open(args.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    cleanup_redis(&mut conn, &prefix).await?;
    drop(store);
    drop_database(server, &prefix).await?;
    Ok(rate)
}
