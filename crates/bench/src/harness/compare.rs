//! `bench strategies`: one hot SKU, one strategy after another ([`super::strategies`]): the
//! seeds' designs against ours, with CPU per process and Redis commands per buyer.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::setup::*;
use crate::procs::{self, Meter};
use clap::Args;
use flashsale_core::{Ledger, SaleState};
use flashsale_embedded::EmbeddedLedger;
use flashsale_store::SqliteStore;

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
    /// flashsale-redis: the key layout of the sale's copy (2: one record per buyer; 1: the
    /// requests, orders and buyers hashes). See `FLASHSALE_REDIS_LAYOUT`.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub redis_layout: u8,
}

pub async fn run(args: StrategiesArgs) -> anyhow::Result<()> {
    use super::strategies::*;
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
        let memory_before = used_memory(&mut admin).await?;
        let strategy = build_strategy(name, &args, &client, &p).await?;
        let mut row = measure(strategy.clone(), &w, &mut admin, &meter).await?;
        if strategy.uses_redis() {
            trim_streams(&mut admin, &p).await?;
            let added = used_memory(&mut admin).await? - memory_before;
            row.redis_bytes_per_accepted = Some(added / row.audit.units_sold.max(1) as f64);
        }
        println!(
            "  {:<20} {:>9.0}/s  p99 {:>8.2} ms  sold {}",
            row.strategy, row.per_s, row.p99_ms, row.audit.units_sold
        );
        rows.push(row);
        drop(strategy);
        cleanup_redis(&mut admin, &p).await?;
        let dbs = [format!("{p}_rowlock"), format!("{p}_ours")];
        super::setup::drop_mysql(&args.mysql_url, &dbs).await?;
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
) -> anyhow::Result<Arc<dyn super::strategies::Strategy>> {
    use super::strategies::*;
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
            super::setup::one_row(&url).await?;
            let store: Arc<dyn flashsale_core::OrderStore> =
                Arc::new(flashsale_store::MySqlStore::connect(&url).await?);
            let mut ledger = flashsale_redis::RedisLedger::connect(&a.redis_url, p).await?;
            if a.redis_layout == 2 {
                ledger = ledger.with_records();
            }
            let ledger: Arc<dyn Ledger> = Arc::new(ledger);
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
            let url = format!("sqlite://{}/{p}.db", dir.display());
            super::setup::one_row(&url).await?;
            let sqlite = Arc::new(SqliteStore::open(&url).await?);
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
) -> anyhow::Result<Arc<dyn super::strategies::Strategy>> {
    let sale = super::strategies::bench_sale(units);
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
    let batcher = flashsale_engine::shop::Batcher::new(ledger.clone(), 256, 65_536);
    Ok(Arc::new(super::strategies::Ours {
        name,
        ledger,
        store,
        batcher,
    }))
}

/// Redis's `used_memory` (INFO memory), bytes.
async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("INFO memory has no used_memory"))
}

/// Empties the streams of a strategy's keys (`prefix`), as a persister trims what it has
/// acknowledged: what is left is what the sale keeps per buyer.
async fn trim_streams(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> anyhow::Result<()> {
    for key in super::setup::keys_under(conn, prefix).await? {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(conn).await?;
        if kind == "stream" {
            let _: i64 = redis::cmd("XTRIM")
                .arg(&key)
                .arg("MAXLEN")
                .arg(0)
                .query_async(conn)
                .await?;
        }
    }
    Ok(())
}

/// Where Redis spends per buyer, by command (the costliest six of each strategy).
fn print_redis_commands(rows: &[super::strategies::StrategyRow]) {
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

fn print_strategies(rows: &[super::strategies::StrategyRow]) {
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
    println!("\nRedis memory per accepted purchase (INFO used_memory added by the run, streams trimmed):");
    for r in rows {
        if let Some(b) = r.redis_bytes_per_accepted {
            println!("{:<20} {b:.0} B", r.strategy);
        }
    }
    let find = |n: &str| rows.iter().find(|r| r.strategy == n);
    if let (Some(ours), Some(lua)) = (find("flashsale-redis"), find("redis-lua")) {
        // Per accepted purchase: what the success path costs Redis, whatever share of the
        // buyers met a sold-out sale.
        let per_sold = |r: &super::strategies::StrategyRow, v: Option<f64>| {
            v.map(|u| u * r.buyers as f64 / r.audit.units_sold.max(1) as f64)
        };
        if let (Some(a), Some(b)) = (
            per_sold(ours, ours.redis_usec_per_request),
            per_sold(lua, lua.redis_usec_per_request),
        ) {
            println!(
                "Redis main-thread µs per accepted purchase: flashsale-redis {a:.2}, redis-lua {b:.2}, ratio {:.2} (target <= 0.4)",
                a / b
            );
        }
    }
    if let (Some(ours), Some(lua)) = (find("flashsale-redis"), find("redis-lua")) {
        println!(
            "flashsale-redis / redis-lua throughput = {:.2} (target >= 2)",
            ours.per_s / lua.per_s
        );
        type Measure = fn(&super::strategies::StrategyRow) -> Option<f64>;
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
                    "flashsale-redis / redis-lua {what} = {:.2} (target <= 0.4)",
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
