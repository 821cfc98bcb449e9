//! `flashsale bench spike`: a spike of buyers over HTTP at running instances (round-robin over
//! `--target`s), with what the seeds ask a load test to report: request volume, success rate,
//! latency per outcome (corrected for coordinated omission), the script's p99 and Redis CPU,
//! the stream backlog over time, orders persisted, and the reconciliation diff.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::load::{self, Arrival, Buyer, Plan};
use crate::report::{Check, Report};
use crate::summary;
use clap::Args;
use flashsale_core::UserId;
use flashsale_server::auth::Auth;
use indicatif::ProgressBar;
use serde_json::json;

#[derive(Debug, Clone, Args)]
pub struct SpikeArgs {
    /// Base URL of an instance; repeat for several (used round-robin).
    #[arg(long = "target", required = true)]
    pub targets: Vec<String>,
    #[arg(long)]
    pub sku: u64,
    /// Create and warm the sale with this stock first (needs the admin token).
    #[arg(long)]
    pub create_stock: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub limit: u32,
    #[arg(long, default_value_t = 100_000)]
    pub users: u64,
    /// Open loop: ramp to this many arrivals per second ...
    #[arg(long, default_value_t = 50_000)]
    pub rate: u64,
    /// ... within this many milliseconds, then hold.
    #[arg(long, default_value_t = 200)]
    pub ramp_ms: u64,
    /// Closed loop instead: each client sends as soon as it has its answer.
    #[arg(long)]
    pub closed: bool,
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 2_000)]
    pub timeout_ms: u64,
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Redis to sample (INFO commandstats, stream length) during the run.
    #[arg(long = "sample-redis")]
    pub sample_redis: Option<String>,
    #[arg(long, default_value = "fs")]
    pub prefix: String,
}

/// What the spike needs of the service's settings: its secrets and where reports go.
#[derive(Debug, Clone)]
pub struct SpikeSecrets {
    pub jwt_secret: String,
    pub admin_token: String,
    pub reports_dir: std::path::PathBuf,
}

pub async fn run(args: SpikeArgs, secrets: SpikeSecrets) -> anyhow::Result<()> {
    let (jwt, admin) = (secrets.jwt_secret, secrets.admin_token);
    let auth = Auth::new(&jwt, &admin);
    if let Some(stock) = args.create_stock {
        create(&args.targets[0], &admin, args.sku, stock, args.limit).await?;
    }
    let buyers: Vec<Buyer> = (1..=args.users)
        .map(|u| Buyer {
            user_id: u,
            token: auth.sign(UserId(u), 3_600),
        })
        .collect();
    let plan = Plan {
        targets: args.targets.clone(),
        sku_id: args.sku,
        buyers,
        quantity: 1,
        concurrency: args.concurrency,
        arrival: if args.closed {
            Arrival::Closed
        } else {
            Arrival::Ramp {
                rate_per_s: args.rate,
                ramp_ms: args.ramp_ms,
            }
        },
        timeout: Duration::from_millis(args.timeout_ms),
        retries_max: args.retries,
    };
    let sampler = Sampler::start(
        args.sample_redis.clone(),
        format!("{}:{{{}}}:events", args.prefix, args.sku),
    )
    .await?;
    let before = sampler.usec().await;
    let bar = ProgressBar::new(args.users);
    let tick = bar.clone();
    let records = load::run(plan, move |_| tick.inc(1)).await?;
    bar.finish();
    let after = sampler.usec().await;
    let backlog = sampler.stop();
    let drained_in_ms = drain_time(&sampler, &args).await;
    let report = build(
        &args,
        &records,
        before,
        after,
        backlog,
        drained_in_ms,
        &admin,
    )
    .await?;
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let html = report.write(&secrets.reports_dir, &format!("spike-{stamp}"))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({"summary": {"outcomes": report.summary.outcomes,
        "buyers_per_s": report.summary.buyers_per_s, "latency": report.summary.latency}, "setup": report.setup}))?
    );
    println!("report: {}", html.display());
    Ok(())
}

async fn create(base: &str, admin: &str, sku: u64, stock: u64, limit: u32) -> anyhow::Result<()> {
    let body =
        json!({"sku_id": sku, "name": "spike", "total_stock": stock, "per_user_limit": limit});
    super::setup::create_and_warm(base, admin, &body).await
}

/// Samples Redis every 100 ms while the spike runs.
struct Sampler {
    conn: Option<redis::aio::MultiplexedConnection>,
    stream: String,
    samples: Arc<Mutex<Vec<(u64, i64)>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sampler {
    async fn start(url: Option<String>, stream: String) -> anyhow::Result<Sampler> {
        let conn = match url {
            Some(u) => Some(
                redis::Client::open(u.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            None => None,
        };
        let samples = Arc::new(Mutex::new(Vec::new()));
        let task = conn.clone().map(|mut c| {
            let (samples, stream) = (samples.clone(), stream.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                loop {
                    let len: i64 = redis::cmd("XLEN")
                        .arg(&stream)
                        .query_async(&mut c)
                        .await
                        .unwrap_or(-1);
                    samples
                        .lock()
                        .expect("samples")
                        .push((started.elapsed().as_millis() as u64, len));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        });
        Ok(Sampler {
            conn,
            stream,
            samples,
            task,
        })
    }

    /// Redis CPU microseconds spent in commands so far (INFO commandstats).
    async fn usec(&self) -> Option<f64> {
        let mut c = self.conn.clone()?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .ok()?;
        Some(
            info.lines()
                .filter_map(|l| {
                    l.split(",usec=")
                        .nth(1)?
                        .split(',')
                        .next()?
                        .parse::<f64>()
                        .ok()
                })
                .sum(),
        )
    }

    fn stop(&self) -> Vec<(u64, i64)> {
        if let Some(t) = &self.task {
            t.abort();
        }
        self.samples.lock().expect("samples").clone()
    }
}

/// Milliseconds after the spike until the stream holds at most the one acknowledged entry the
/// persister keeps (its lag back to 0); `None` without Redis or past 30 s.
async fn drain_time(s: &Sampler, _args: &SpikeArgs) -> Option<u64> {
    let mut c = s.conn.clone()?;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let len: i64 = redis::cmd("XLEN")
            .arg(&s.stream)
            .query_async(&mut c)
            .await
            .ok()?;
        if len <= 1 {
            return Some(started.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

async fn build(
    args: &SpikeArgs,
    records: &[load::Record],
    before: Option<f64>,
    after: Option<f64>,
    backlog: Vec<(u64, i64)>,
    drained_in_ms: Option<u64>,
    admin: &str,
) -> anyhow::Result<Report> {
    let stock = args.create_stock.unwrap_or(0);
    let summary = summary::summarize(records, stock, 1);
    let mut setup = BTreeMap::new();
    setup.insert("targets".into(), args.targets.join(", "));
    setup.insert("sku".into(), args.sku.to_string());
    setup.insert(
        "buyers / clients".into(),
        format!("{} / {}", args.users, args.concurrency),
    );
    let arrivals = if args.closed {
        "closed loop".to_string()
    } else {
        format!("ramp to {}/s in {} ms, hold", args.rate, args.ramp_ms)
    };
    setup.insert("arrivals".into(), arrivals);
    let mut database = BTreeMap::new();
    if let (Some(b), Some(a)) = (before, after) {
        database.insert(
            "redis CPU µs per request".into(),
            ((a - b) / summary.requests.max(1) as f64) as i64,
        );
    }
    database.insert(
        "stream backlog max".into(),
        backlog.iter().map(|(_, l)| *l).max().unwrap_or(0),
    );
    database.insert(
        "ms to drain after the spike (-1: unknown)".into(),
        drained_in_ms.map_or(-1, |m| m as i64),
    );
    let sale = fetch(
        &args.targets[0],
        &format!("/api/v1/sales/{}", args.sku),
        None,
    )
    .await;
    if let Some(sold) = sale.as_ref().and_then(|s| s["sold"].as_i64()) {
        database.insert("sold (sale view)".into(), sold);
    }
    if let Some(p99) = script_p99_ms(&args.targets[0]).await {
        database.insert("purchase script p99 µs".into(), (p99 * 1_000.0) as i64);
    }
    let reconcile = fetch(&args.targets[0], "/api/v1/admin/reconcile", Some(admin)).await;
    let checks = vec![Check {
        name: "reconciliation".into(),
        held: reconcile.is_some(),
        detail: reconcile.map_or("admin reconcile not reachable".into(), |r| {
            r.to_string().chars().take(500).collect()
        }),
    }];
    Ok(Report {
        title: "flashsale bench spike".into(),
        setup,
        summary,
        database,
        checks,
        reconciliation_diff: BTreeMap::new(),
        lifecycle: None,
    })
}

async fn fetch(base: &str, path: &str, token: Option<&str>) -> Option<serde_json::Value> {
    let mut req = reqwest::Client::new().get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.ok()?.json().await.ok()
}

/// p99 of `flashsale_script_latency_seconds{script="purchase"}` from a target's /metrics buckets.
async fn script_p99_ms(base: &str) -> Option<f64> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| {
            l.starts_with("flashsale_script_latency_seconds_bucket")
                && l.contains("script=\"purchase\"")
        })
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    let total = buckets.iter().map(|(_, c)| *c).fold(0.0, f64::max);
    buckets
        .iter()
        .find(|(_, c)| *c >= 0.99 * total)
        .map(|(le, _)| le * 1_000.0)
}
