//! `bench http`: /healthz vs the purchase success path vs the sold-out path, same driver, same
//! concurrency, same server in this process; `--risk` puts a risk service of its own in the
//! purchase path ([`super::risk`]). With `--server-bin` the server runs alone ([`super::alone`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::setup::*;
use crate::closed::{self, MakeRequest, Rate};
use crate::procs::{self, Meter, PhaseCpu};
use clap::Args;
use flashsale_core::{SkuId, UserId};
use flashsale_server::auth::Auth;
use flashsale_server::{Config, Server, Tunables};
use serde_json::json;

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
    /// compare builds in one run); this process only drives the load (`harness::alone`).
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

pub async fn run(args: HttpArgs) -> anyhow::Result<()> {
    let risk = super::risk::RiskServer::start(super::risk::RiskMode::parse(&args.risk)?).await?;
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
        server.state.shop.ledger().kind(),
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

/// Waits (at most 30 s) until the database has applied every change of the hot copy; how
/// long it took.
async fn drain_wait(server: &Server, sku: SkuId) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let hot = server
            .state
            .shop
            .ledger()
            .counters(sku)
            .await?
            .map(|c| c.seq);
        let db = server
            .state
            .shop
            .store()
            .sale(sku)
            .await?
            .map(|s| s.counters.seq);
        if hot.is_none() || hot == db {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
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
