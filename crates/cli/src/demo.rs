//! `flashsale demo`: a whole flash sale in one command.
//!
//! Starts the server in-process on a free loopback port (embedded ledger over a fresh SQLite
//! file unless `--redis-url` is given), creates and warms a sale over HTTP, signs a token per
//! buyer, fires every buyer at it within `--ramp-ms` over real HTTP (timeouts retried with the
//! same request id), then counts from the database, checks I1–I7 and the reconciliation, and
//! writes a JSON and an HTML report. In reserve mode the holds are then paid, cancelled or
//! left to expire, and the units that come back are sold to later buyers (`demo_reserve`).
//! With `--webhook` the demo also runs a webhook receiver of its own and reports the order
//! events delivered against what the database stored (`demo_events`).

use std::collections::{BTreeMap, HashSet};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;
use flashsale_bench::load::{self, Arrival, Buyer, Plan};
use flashsale_bench::report::{Check, Report};
use flashsale_bench::summary;
use flashsale_core::{Counters, OrderStatus, SaleMode, SkuId, UserId};
use flashsale_engine::reconcile::diff::Diff;
use flashsale_engine::settings::{LedgerSettings, Settings};
use flashsale_server::auth::Auth;
use flashsale_server::{Config, Server, Tunables};
use indicatif::{ProgressBar, ProgressStyle};
use rand::distr::{Alphanumeric, SampleString};
use serde_json::json;

use crate::demo_reserve::Resolver;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Units on sale.
    #[arg(long, default_value_t = 10_000)]
    pub stock: u64,
    /// Buyers, each with a token of their own.
    #[arg(long, default_value_t = 100_000)]
    pub users: u64,
    /// HTTP clients (keep-alive connections) firing at once.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Units one buyer may hold.
    #[arg(long, default_value_t = 1)]
    pub limit: u32,
    #[arg(long, value_enum, default_value_t = DemoMode::Direct)]
    pub mode: DemoMode,
    /// Reserve mode: a hold's payment time, ms (short, so the expiries happen in the demo).
    #[arg(long, default_value_t = 3_000,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub hold_ms: u64,
    /// Reserve mode: percent of the holds the demo pays.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub pay_percent: u8,
    /// Reserve mode: percent of the holds the demo cancels (the rest expire).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub cancel_percent: u8,
    /// Every buyer arrives within this many milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub ramp_ms: u64,
    /// Run on the production path: Redis ledger (needs --database-url too).
    #[arg(long, env = "FLASHSALE_REDIS_URL")]
    pub redis_url: Option<String>,
    /// The system of record; default a fresh `<data dir>/demo.db`.
    #[arg(long)]
    pub database_url: Option<String>,
    #[arg(long, env = "FLASHSALE_DATA_DIR", default_value = "./flashsale-data")]
    pub data_dir: PathBuf,
    /// Run a webhook receiver, relay the order events to it, and report them delivered
    /// against the orders stored.
    #[arg(long)]
    pub webhook: bool,
    /// Who may buy: everyone at once (`open`), through a queue with a shuffled pre-queue
    /// (`queue`), or by a draw with a waitlist (`draw`, a reserve-mode sale).
    #[arg(long, value_enum, default_value_t = DemoAdmission::Open)]
    pub admission: DemoAdmission,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoAdmission {
    Open,
    Queue,
    Draw,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DemoMode {
    Direct,
    Reserve,
}

/// Everything the demo measured, for the report.
struct Outcome {
    records: Vec<load::Record>,
    /// Reserve mode: what became of the holds.
    resolutions: Option<crate::demo_reserve::Resolutions>,
    counters_hot: Option<Counters>,
    database_url: String,
    sku: u64,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.stock > 0 && args.users > 0 && args.concurrency > 0,
        "--stock, --users and --concurrency must be positive"
    );
    anyhow::ensure!(
        args.pay_percent + args.cancel_percent <= 100,
        "--pay-percent and --cancel-percent add up to more than 100"
    );
    let mut config = demo_config(&args)?;
    let receiver = match args.webhook {
        true => Some(crate::demo_events::DemoReceiver::start().await?),
        false => None,
    };
    if let Some(r) = &receiver {
        let settings = flashsale_engine::relay::webhook::WebhookSettings::new(&r.url, &r.secret);
        config.engine.events.webhook = Some(settings);
    }
    let server = Server::start(config.clone()).await?;
    let base = format!("http://{}", server.addr);
    let auth = Arc::new(Auth::new(&config.jwt_secret, &config.admin_token));
    let sku = pick_sku(&args);
    println!(
        "flashsale demo: {} ledger at {base}, sale {sku}: {} units, {} buyers, {} clients",
        server.state.shop.ledger().kind(),
        args.stock,
        args.users,
        args.concurrency
    );
    if args.admission != DemoAdmission::Open {
        let admin = &config.admin_token;
        let run = crate::demo_admission::run(&base, admin, &auth, sku, &args).await;
        server.shutdown().await?;
        return run;
    }
    open_sale(&base, &config.admin_token, sku, &args).await?;
    let (records, resolutions) = match args.mode {
        DemoMode::Direct => (spike(&base, &auth, sku, &args, |_| {}).await?, None),
        DemoMode::Reserve => {
            // Each buyer acts on its hold as soon as it is answered, as a real buyer would.
            let resolver = Resolver::start(&base, auth.clone(), &args);
            let records = spike(&base, &auth, sku, &args, resolver.on_answer()).await?;
            let done = resolver.finish().await?;
            let done = crate::demo_reserve::after_spike(&server, &base, &auth, sku, &args, done);
            (records, Some(done.await?))
        }
    };
    if config.engine.ledger.redis_url.is_some() {
        wait_for_drain(&server, sku).await?;
    }
    let counters_hot = server.state.shop.ledger().counters(SkuId(sku)).await?;
    let outcome = Outcome {
        records,
        resolutions,
        counters_hot,
        database_url: config.engine.database_url.clone(),
        sku,
    };
    let mut report = build_report(&server, &args, outcome).await?;
    if let Some(r) = &receiver {
        let check = r.report(&server, sku, &mut report.database).await?;
        report.checks.push(check);
    }
    server.shutdown().await?;
    print_report(&report);
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let html = report.write(&args.data_dir.join("reports"), &format!("demo-{stamp}"))?;
    println!("\nreport: {}", html.display());
    anyhow::ensure!(report.all_held(), "an invariant was broken: see the report");
    Ok(())
}

fn demo_config(args: &DemoArgs) -> anyhow::Result<Config> {
    let database_url = match (&args.database_url, &args.redis_url) {
        (Some(url), _) => url.clone(),
        (None, Some(_)) => anyhow::bail!("--redis-url needs --database-url (mysql://…)"),
        (None, None) => fresh_sqlite(&args.data_dir)?,
    };
    let secret = || Alphanumeric.sample_string(&mut rand::rng(), 32);
    let mut tunables = Tunables::default();
    tunables.queue_cap = tunables.queue_cap.max(args.concurrency * 4);
    Ok(Config {
        engine: Settings {
            ledger: LedgerSettings {
                redis_url: args.redis_url.clone(),
                redis_prefix: "fsdemo".into(),
                ..Default::default()
            },
            database_url,
            instance_id: format!("demo-{}", std::process::id()),
            persister: Default::default(),
            reconcile: Default::default(),
            events: Default::default(),
            admission: Default::default(),
        },
        listen: "127.0.0.1:0".parse()?,
        jwt_secret: secret(),
        admin_token: secret(),
        tunables,
        identity: None,
    })
}

/// A new, empty `<data dir>/demo.db` (the previous demo's is replaced).
fn fresh_sqlite(dir: &std::path::Path) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("demo.db{suffix}")));
    }
    Ok(format!("sqlite://{}/demo.db", dir.display()))
}

/// Sku 1 in a fresh SQLite file; on a shared database, a new sku each run.
fn pick_sku(args: &DemoArgs) -> u64 {
    match args.database_url {
        None => 1,
        Some(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1),
    }
}

async fn open_sale(base: &str, admin: &str, sku: u64, args: &DemoArgs) -> anyhow::Result<()> {
    let mode = match args.mode {
        DemoMode::Direct => SaleMode::Direct,
        DemoMode::Reserve => SaleMode::Reserve,
    };
    let mut body = json!({"sku_id": sku, "name": "demo phone", "total_stock": args.stock,
        "per_user_limit": args.limit, "mode": mode});
    if mode == SaleMode::Reserve {
        body["payment_timeout_ms"] = json!(args.hold_ms);
    }
    flashsale_bench::harness::setup::create_and_warm(base, admin, &body).await
}

/// Users `users`, each with a token valid `ttl_s` seconds.
pub(crate) fn buyers(auth: &Auth, users: RangeInclusive<u64>, ttl_s: u64) -> Vec<Buyer> {
    users
        .map(|u| Buyer {
            user_id: u,
            token: auth.sign(UserId(u), ttl_s),
        })
        .collect()
}

/// One unit each for `buyers`, arriving over `ramp_ms` on the server at `base`.
pub(crate) fn spike_plan(
    base: &str,
    sku: u64,
    buyers: Vec<Buyer>,
    concurrency: usize,
    ramp_ms: u64,
) -> Plan {
    Plan {
        targets: vec![base.to_owned()],
        sku_id: sku,
        buyers,
        quantity: 1,
        concurrency,
        arrival: Arrival::Spike { ramp_ms },
        timeout: Duration::from_secs(5),
        retries_max: 3,
    }
}

async fn spike(
    base: &str,
    auth: &Auth,
    sku: u64,
    args: &DemoArgs,
    on_answer: impl Fn(&load::Record) + Send + Sync + 'static,
) -> anyhow::Result<Vec<load::Record>> {
    let bar = ProgressBar::new(args.users);
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} buyers answered ({per_sec}) {elapsed}",
    )?);
    let buyers = buyers(auth, 1..=args.users, 3_600);
    let plan = spike_plan(base, sku, buyers, args.concurrency, args.ramp_ms);
    let tick = bar.clone();
    let records = load::run(plan, move |r| {
        tick.inc(1);
        on_answer(r);
    })
    .await?;
    bar.finish();
    Ok(records)
}

async fn wait_for_drain(server: &Server, sku: u64) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let hot = server
            .state
            .shop
            .ledger()
            .counters(SkuId(sku))
            .await?
            .map(|c| c.seq);
        let stored = server
            .state
            .shop
            .store()
            .sale(SkuId(sku))
            .await?
            .map(|s| s.counters.seq);
        if hot == stored {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the persister did not drain in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn build_report(server: &Server, args: &DemoArgs, run: Outcome) -> anyhow::Result<Report> {
    let store = server.state.shop.store().clone();
    let sku = SkuId(run.sku);
    let stored = store
        .sale(sku)
        .await?
        .context("sale vanished from the database")?;
    let orders = store.orders(sku).await?;
    let events = store.events(sku).await?;
    let invariants = flashsale_core::invariants::check_sale(
        &stored.sale,
        &stored.counters,
        &orders,
        &events,
        true,
    );
    let summary = summary::summarize(&run.records, args.stock, 1);

    let mut database = BTreeMap::new();
    for status in [
        OrderStatus::Created,
        OrderStatus::Reserved,
        OrderStatus::Paid,
        OrderStatus::Cancelled,
        OrderStatus::Expired,
        OrderStatus::Pending,
        OrderStatus::Rejected,
    ] {
        let n = orders.iter().filter(|o| o.status == status).count();
        database.insert(format!("orders {}", status.as_str()), n as i64);
    }
    let live_units: u64 = orders
        .iter()
        .filter(|o| o.status.is_live())
        .map(|o| u64::from(o.quantity))
        .sum();
    database.insert("units in live orders".into(), live_units as i64);
    database.insert("stock_events".into(), events.len() as i64);
    database.insert("sales.available".into(), stored.counters.available as i64);
    database.insert("sales.sold".into(), stored.counters.sold as i64);
    database.insert("sales.reserved".into(), stored.counters.reserved as i64);

    let answered: HashSet<String> = run
        .records
        .iter()
        .filter(|r| r.status == 202)
        .filter_map(|r| r.order_no.clone())
        .collect();
    let in_db: HashSet<String> = orders.iter().map(|o| o.order_no.to_string()).collect();
    let diff = reconciliation_diff(run.counters_hot, &stored.counters);
    let mut checks = Vec::new();
    let named = |name: &str, held: bool, detail: String| Check {
        name: name.into(),
        held,
        detail,
    };
    let detail = |inv: &str| {
        let v: Vec<String> = invariants
            .violations
            .iter()
            .filter(|v| v.invariant == inv)
            .map(|v| v.detail.clone())
            .collect();
        if v.is_empty() {
            "held".to_string()
        } else {
            v.join("; ")
        }
    };
    checks.push(named(
        "I1 no oversell",
        invariants.held("I1") && live_units <= args.stock,
        format!(
            "{live_units} units in live orders of {} ({})",
            args.stock,
            detail("I1")
        ),
    ));
    checks.push(named(
        "I2 conservation",
        invariants.held("I2"),
        detail("I2"),
    ));
    checks.push(named(
        "I3 per-user limit",
        invariants.held("I3"),
        detail("I3"),
    ));
    checks.push(named("I4 idempotency", invariants.held("I4"), detail("I4")));
    let lost: Vec<&String> = answered.difference(&in_db).take(5).collect();
    checks.push(named(
        "I5 no lost sale",
        invariants.held("I5") && lost.is_empty(),
        format!(
            "{} orders answered accepted, {} in the database, missing: {:?}; {}",
            answered.len(),
            in_db.len(),
            lost,
            detail("I5")
        ),
    ));
    checks.push(named(
        "I6 exact reconciliation",
        diff.values().all(|d| *d == 0),
        format!("{diff:?}"),
    ));
    checks.push(named(
        "I7 one resolution",
        invariants.held("I7"),
        detail("I7"),
    ));
    let lifecycle = run.resolutions.as_ref().map(|done| {
        checks.extend(crate::demo_reserve::checks(done, &orders));
        crate::demo_reserve::lifecycle(&events, args.stock)
    });

    let mut setup = BTreeMap::new();
    setup.insert(
        "ledger".into(),
        server.state.shop.ledger().kind().to_owned(),
    );
    setup.insert("database".into(), run.database_url.clone());
    setup.insert("sku".into(), run.sku.to_string());
    setup.insert(
        "stock / buyers / clients / limit".into(),
        format!(
            "{} / {} / {} / {}",
            args.stock, args.users, args.concurrency, args.limit
        ),
    );
    setup.insert("mode".into(), format!("{:?}", args.mode).to_lowercase());
    setup.insert(
        "arrivals".into(),
        format!("every buyer within {} ms", args.ramp_ms),
    );
    Ok(Report {
        title: "flashsale demo".into(),
        setup,
        summary,
        database,
        checks,
        reconciliation_diff: diff,
        lifecycle,
    })
}

/// The reconciler's diff (hot minus database, per counter), by name for the report.
fn reconciliation_diff(hot: Option<Counters>, db: &Counters) -> BTreeMap<String, i64> {
    let diff = Diff::between(&hot.unwrap_or_default(), db);
    diff.fields()
        .into_iter()
        .map(|(name, d)| (name.to_owned(), d))
        .collect()
}

fn print_report(r: &Report) {
    let s = &r.summary;
    println!(
        "\n{} buyers, {} requests in {:.2} s: {:.0} buyers/s, {:.0} requests/s",
        s.buyers, s.requests, s.elapsed_s, s.buyers_per_s, s.requests_per_s
    );
    println!(
        "latency p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms (from each buyer's arrival)",
        s.latency.p50_ms, s.latency.p99_ms, s.latency.p999_ms
    );
    for (outcome, n) in &s.outcomes {
        println!("  {outcome:<22} {n}");
    }
    match r.setup.get("database") {
        // Where to count for yourself (`sqlite3 <file> "SELECT status, COUNT(*) FROM orders GROUP BY status"`).
        Some(url) => println!("database ({url}), counted:"),
        None => println!("database, counted:"),
    }
    for (k, v) in &r.database {
        println!("  {k:<22} {v}");
    }
    if let Some(l) = &r.lifecycle {
        println!("holds (units, from the database's events):");
        for (k, v) in &l.totals {
            println!("  {k:<22} {v}");
        }
    }
    println!("checks:");
    for c in &r.checks {
        println!(
            "  {:<26} {}  {}",
            c.name,
            if c.held { "held" } else { "BROKEN" },
            c.detail
        );
    }
}
