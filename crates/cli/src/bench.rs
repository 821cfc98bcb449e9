//! `flashsale bench`: the project's measurements (release mode). Each prints ratios measured in
//! one run and writes JSON under `<data dir>/reports/`.
//!
//! - `bench http`: /healthz vs the purchase success path vs the sold-out path, same driver, same
//!   concurrency, same server.
//! - `bench ledger`: the embedded ledger in-process (no HTTP): purchases committed per second.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use flashsale_bench::closed::{self, MakeRequest, Rate};
use flashsale_core::{HotLedger, PurchaseOutcome, PurchaseRequest, RequestId, Sale, SaleMode, SaleState, SkuId, UserId};
use flashsale_embedded::EmbeddedLedger;
use flashsale_server::auth::Auth;
use flashsale_server::{Config, Limits, Server};
use flashsale_store::SqliteStore;
use rand::distr::{Alphanumeric, SampleString};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// /healthz vs purchase success path vs sold-out path over HTTP.
    Http(HttpArgs),
    /// The embedded ledger in-process: purchases committed per second.
    Ledger(LedgerArgs),
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
    }
}

fn secret() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 32)
}

/// Users whose tokens the success path cycles through; each may buy `USER_LIMIT` units.
const BENCH_USERS: u64 = 2_000;
const USER_LIMIT: u32 = 1_000;

async fn http(args: HttpArgs) -> anyhow::Result<()> {
    let tmp = tempfile_dir(&args.data_dir)?;
    let database_url = match (&args.database_url, &args.redis_url) {
        (Some(u), _) => u.clone(),
        (None, Some(_)) => anyhow::bail!("--redis-url needs --database-url"),
        (None, None) => format!("sqlite://{}/bench.db", tmp.display()),
    };
    let config = Config {
        listen: "127.0.0.1:0".parse()?,
        redis_url: args.redis_url.clone(),
        redis_prefix: format!("fsbench{}", std::process::id()),
        database_url,
        jwt_secret: secret(),
        admin_token: secret(),
        limits: Limits { queue_cap: 65_536, ..Limits::default() },
        run_persister: true,
        instance_id: format!("bench-{}", std::process::id()),
    };
    let server = Server::start(config.clone()).await?;
    let base = format!("http://{}", server.addr);
    let auth = Auth::new(&config.jwt_secret, &config.admin_token);
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64 % 1_000_000_000;
    let (big, tiny) = (stamp * 2 + 1, stamp * 2 + 2);
    open(&base, &config.admin_token, big, 1_000_000_000).await?;
    open(&base, &config.admin_token, tiny, 1).await?;
    let tokens: Arc<Vec<String>> = Arc::new((1..=BENCH_USERS).map(|u| auth.sign(UserId(u), 3_600)).collect());
    let d = Duration::from_secs(args.seconds);
    let c = args.concurrency;
    println!("bench http: {} ledger, {c} clients, {} s per endpoint", server.state.ledger.kind(), args.seconds);

    let health_url = format!("{base}/healthz");
    let health: MakeRequest = Arc::new(move |cl, _| cl.get(&health_url));
    let healthz = closed::run("healthz", health, 200, c, d).await?;
    let success = closed::run("purchase accepted", purchase_req(&base, big, tokens.clone(), "s"), 202, c, d).await?;
    sell_out(&base, tiny, &tokens).await?;
    let sold_out = closed::run("purchase sold out", purchase_req(&base, tiny, tokens.clone(), "x"), 409, c, d).await?;
    server.shutdown().await?;
    let _ = std::fs::remove_dir_all(&tmp);
    report_http(&args, &[healthz, success, sold_out])
}

fn purchase_req(base: &str, sku: u64, tokens: Arc<Vec<String>>, tag: &'static str) -> MakeRequest {
    let url = format!("{base}/api/v1/sales/{sku}/purchases");
    Arc::new(move |cl, i| {
        let token = &tokens[(i % BENCH_USERS) as usize];
        cl.post(&url).bearer_auth(token).json(&json!({"request_id": format!("{tag}{i}"), "quantity": 1}))
    })
}

async fn open(base: &str, admin: &str, sku: u64, stock: u64) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let body = json!({"sku_id": sku, "name": "bench", "total_stock": stock, "per_user_limit": USER_LIMIT});
    let r = http.post(format!("{base}/api/v1/sales")).bearer_auth(admin).json(&body).send().await?;
    anyhow::ensure!(r.status().as_u16() == 201, "create: {}", r.text().await?);
    let r = http.post(format!("{base}/api/v1/sales/{sku}/warm")).bearer_auth(admin).send().await?;
    anyhow::ensure!(r.status().is_success(), "warm: {}", r.text().await?);
    Ok(())
}

async fn sell_out(base: &str, sku: u64, tokens: &[String]) -> anyhow::Result<()> {
    let r = reqwest::Client::new()
        .post(format!("{base}/api/v1/sales/{sku}/purchases"))
        .bearer_auth(&tokens[0])
        .json(&json!({"request_id": "only", "quantity": 1}))
        .send()
        .await?;
    anyhow::ensure!(r.status().as_u16() == 202, "the one unit: {}", r.text().await?);
    Ok(())
}

fn report_http(args: &HttpArgs, rates: &[Rate]) -> anyhow::Result<()> {
    println!("{:<20} {:>10} {:>10} {:>9} {:>9}", "endpoint", "answers/s", "expected", "p50 ms", "p99 ms");
    for r in rates {
        println!("{:<20} {:>10.0} {:>10} {:>9.2} {:>9.2}", r.name, r.per_s, r.ok, r.p50_ms, r.p99_ms);
    }
    let base = rates[0].per_s.max(1e-9);
    println!("purchase success / healthz = {:.2} (target >= 0.80)", rates[1].per_s / base);
    println!("sold-out / healthz         = {:.2} (target >= 0.90)", rates[2].per_s / base);
    let dir = args.data_dir.join("reports");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("bench-http-{}.json", SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs()));
    std::fs::write(&path, serde_json::to_vec_pretty(&json!({"concurrency": args.concurrency, "seconds": args.seconds, "rates": rates}))?)?;
    println!("json: {}", path.display());
    Ok(())
}

fn tempfile_dir(data_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let dir = data_dir.join(format!("bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn ledger(args: LedgerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.batch >= 1 && args.batch <= flashsale_core::limits::BATCH_LEN_MAX, "--batch must be 1..=1024");
    let dir = tempfile_dir(std::path::Path::new("./flashsale-data"))?;
    let store = Arc::new(SqliteStore::open(&format!("sqlite://{}/ledger.db", dir.display())).await?);
    let ledger = Arc::new(EmbeddedLedger::open(store.clone()).await?);
    let sale = Sale {
        sku_id: SkuId(1),
        name: "bench".into(),
        total_stock: args.purchases,
        per_user_limit: 1,
        mode: SaleMode::Direct,
        payment_timeout_ms: 0,
        starts_at_ms: 0,
        ends_at_ms: i64::MAX / 2,
        state: SaleState::Live,
    };
    flashsale_core::OrderStore::create_sale(store.as_ref(), &sale).await?;
    ledger.warm(&sale, &sale.fresh_counters(), 1, false).await?;
    let per_caller = args.purchases / args.callers as u64;
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.callers as u64)
        .map(|c| tokio::spawn(caller(ledger.clone(), c * per_caller, per_caller, args.batch)))
        .collect();
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    let stored = flashsale_core::OrderStore::sale(store.as_ref(), SkuId(1)).await?.expect("sale");
    println!("embedded ledger: {accepted} purchases committed in {secs:.2} s = {:.0} purchases/s", accepted as f64 / secs);
    println!("batch {} × {} callers; database sold = {} (target >= 300000/s)", args.batch, args.callers, stored.counters.sold);
    anyhow::ensure!(stored.counters.sold == accepted, "the database disagrees with the answers");
    drop(ledger);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn caller(ledger: Arc<EmbeddedLedger>, first: u64, count: u64, batch: usize) -> anyhow::Result<u64> {
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
        accepted += outcomes.iter().filter(|o| matches!(o, PurchaseOutcome::Accepted { .. })).count() as u64;
        next += n;
    }
    Ok(accepted)
}
