//! What each Redis durability setting costs the hot path (docs/DURABILITY.md).
//!
//! `cargo run --release -p flashsale-redis --example durability [seconds] [batch]`
//!
//! For each setting it starts a throwaway `redis-server`, warms one sale with more stock
//! than can sell, and runs 16 concurrent callers of `purchase_batch` (each batch `batch`
//! requests from distinct users) for `seconds`; it prints accepted purchases per second and
//! the p50/p99 latency of one script call. "WAIT 1" adds a replica and a `WAIT 1 1000` after
//! every batch on the same connection (what a caller must do to know a replica has it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_core::{HotPurchases, PurchaseOutcome, SaleMode};
use flashsale_redis::RedisLedger;
use flashsale_testkit::conformance::{live_sale, req, warm};
use flashsale_testkit::redis_cluster;
use flashsale_testkit::redis_server::RedisServer;

const CALLERS: u64 = 16;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let batch: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let aof = |fsync| vec!["--save", "", "--appendonly", "yes", "--appendfsync", fsync];
    let settings: [(&str, Vec<&str>); 4] = [
        ("no persistence", vec!["--save", "", "--appendonly", "no"]),
        ("AOF everysec", aof("everysec")),
        ("AOF always", aof("always")),
        (
            "AOF everysec + WAIT 1",
            [aof("everysec"), vec!["--repl-diskless-sync-delay", "0"]].concat(),
        ),
    ];
    println!("| setting | batch | accepted/s | p50 call ms | p99 call ms |");
    println!("|---|---|---|---|---|");
    for (name, args) in settings {
        let server = RedisServer::spawn_with(&args).await;
        let replica = if name.contains("WAIT") {
            Some(RedisServer::spawn_replica_of(&server).await)
        } else {
            None
        };
        if let Some(replica) = &replica {
            let url = replica.url();
            let synced = || async { redis_cluster::link_up(&url).await.then_some(()) };
            flashsale_testkit::wait::until("the replica to sync", Duration::from_secs(30), synced)
                .await;
        }
        let (rate, p50, p99) = run(&server.url(), seconds, batch, replica.is_some()).await;
        println!("| {name} | {batch} | {rate:.0} | {p50:.2} | {p99:.2} |");
        drop(replica);
    }
}

async fn run(url: &str, seconds: u64, batch: usize, wait_replica: bool) -> (f64, f64, f64) {
    let ledger = Arc::new(RedisLedger::connect(url, "bench").await.expect("connect"));
    let sale = live_sale(SaleMode::Direct, 1_000_000_000, 1);
    let sku = warm(ledger.as_ref(), &sale).await;
    let accepted = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let (ledger, accepted) = (ledger.clone(), accepted.clone());
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let client = redis::Client::open(url).unwrap();
            let mut wait_conn = client.get_multiplexed_async_connection().await.unwrap();
            let mut lat = Vec::new();
            let mut n = 0u64;
            while Instant::now() < stop_at {
                let reqs: Vec<_> = (0..batch)
                    .map(|i| {
                        n += 1;
                        let user = caller * 1_000_000_000 + n;
                        let _ = i;
                        req(sku, user, &format!("r{n}"), 1)
                    })
                    .collect();
                let started = Instant::now();
                let out = ledger.purchase_batch(sku, &reqs).await.expect("purchase");
                if wait_replica {
                    // WAIT counts the replicas that have every write of *this* connection: a
                    // write of our own on it first, then WAIT (what a real caller would do
                    // on the connection that ran the script).
                    let _: () = redis::cmd("SET")
                        .arg("bench:w")
                        .arg(n)
                        .query_async(&mut wait_conn)
                        .await
                        .unwrap();
                    let _: i64 = redis::cmd("WAIT")
                        .arg(1)
                        .arg(1000)
                        .query_async(&mut wait_conn)
                        .await
                        .unwrap();
                }
                lat.push(started.elapsed().as_secs_f64() * 1e3);
                let ok = out
                    .iter()
                    .filter(|o| matches!(o, PurchaseOutcome::Accepted { .. }))
                    .count();
                accepted.fetch_add(ok as u64, Ordering::Relaxed);
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (
        accepted.load(Ordering::Relaxed) as f64 / seconds as f64,
        pct(0.5),
        pct(0.99),
    )
}
