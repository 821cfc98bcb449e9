//! `flashsale bench buckets`: one hot sale on a Redis Cluster with one bucket and with
//! several, alternated in one run. For each: what the busiest primary's main thread and all
//! nodes together spend per accepted purchase (INFO cpu of every node, before and after);
//! then an oversubscribed sale over the buckets: the stock sold exactly, and the SOLD_OUT
//! answers given while the buckets together still held stock (must be 0).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use flashsale_core::{
    HotCopies, HotLedger, HotPurchases, PurchaseOutcome, PurchaseRequest, RequestId, Sale,
    SaleMode, SaleState, SkuId, UserId,
};
use flashsale_engine::shop::Batcher;
use flashsale_redis::RedisLedger;
use rand::Rng;
use redis::aio::MultiplexedConnection;

#[derive(Debug, Clone, Args)]
pub struct BucketsArgs {
    /// Every node of the cluster, comma-separated, as `scripts/cluster.sh up` prints them.
    #[arg(long, env = "FLASHSALE_REDIS_URL")]
    pub redis_url: String,
    /// Buckets of the bucketed sale (compared with one bucket).
    #[arg(long, default_value_t = 3)]
    pub buckets: u16,
    /// Buyers per sale, each buying one unit.
    #[arg(long, default_value_t = 60_000)]
    pub buyers: u64,
    /// Requests per ledger call (the service's batcher makes such batches under load).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Times the pair (one bucket, several) is run, alternated.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Each call's requests all of one home bucket (what a batcher keyed by bucket sends),
    /// instead of buyers in arrival order (a batcher keyed by sale: the ledger splits each
    /// call into one script call per bucket, so each carries a part of the batch).
    #[arg(long)]
    pub by_home: bool,
    /// Each buyer's request alone through the service's batcher (`Batcher`, batches of at
    /// most `--batch`, `--concurrency` × `--batch` requests in flight), which forms a
    /// bucketed sale's batches per home bucket: what `serve` sends the ledger.
    #[arg(long, conflicts_with = "by_home")]
    pub batcher: bool,
    /// The key layout of the sale's copies (2: one record per buyer; 1: the requests,
    /// orders and buyers hashes). See `FLASHSALE_REDIS_LAYOUT`.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub redis_layout: u8,
}

/// One node of the cluster: its connection and whether it is a primary.
struct Node {
    url: String,
    conn: MultiplexedConnection,
    primary: bool,
}

/// One sale's run.
struct Run {
    buckets: u16,
    units: u64,
    accepted: u64,
    sold_out: u64,
    wall_s: f64,
    /// Main-thread CPU µs per node, in the order of the nodes.
    cpu_us: Vec<f64>,
    /// Script calls the primaries ran (purchases and transfers alike).
    script_calls: u64,
    transfers: u64,
    false_sold_outs: u64,
}

pub async fn run(args: BucketsArgs) -> anyhow::Result<()> {
    anyhow::ensure!((2..=64).contains(&args.buckets), "--buckets must be 2..=64");
    anyhow::ensure!((1..=1024).contains(&args.batch), "--batch must be 1..=1024");
    anyhow::ensure!(args.buyers >= 100, "--buyers must be at least 100");
    let mut nodes = connect_nodes(&args.redis_url).await?;
    let prefix = format!("benchb{}", rand::rng().random_range(0..1_000_000u32));
    let mut ledger = RedisLedger::connect(&args.redis_url, &prefix)
        .await?
        .with_buckets();
    if args.redis_layout == 2 {
        ledger = ledger.with_records();
    }
    let ledger = Arc::new(ledger);
    anyhow::ensure!(ledger.is_cluster(), "{} is not a cluster", args.redis_url);
    println!(
        "bench buckets: {} buyers per sale, batches of {} ({}), {} in flight, {} primaries",
        args.buyers,
        args.batch,
        match (args.by_home, args.batcher) {
            (true, _) => "each of one home bucket",
            (_, true) => "formed by the service's batcher from buyers in arrival order",
            _ => "buyers in arrival order",
        },
        args.concurrency,
        nodes.iter().filter(|n| n.primary).count()
    );
    let mut runs = Vec::new();
    for _ in 0..args.rounds {
        for n in [1, args.buckets] {
            runs.push(sale_run(&ledger, &mut nodes, &args, n, args.buyers, false).await?);
        }
    }
    let units = args.buyers / 10;
    let mut over = Vec::new();
    for one_home in [false, true] {
        over.push(sale_run(&ledger, &mut nodes, &args, args.buckets, units, one_home).await?);
    }
    print_runs(&nodes, &runs, args.buckets);
    for (r, spread) in over
        .iter()
        .zip(["buyers at every bucket", "every buyer at one bucket"])
    {
        print_oversubscribed(r, spread);
    }
    Ok(())
}

async fn connect_nodes(urls: &str) -> anyhow::Result<Vec<Node>> {
    let mut nodes = Vec::new();
    for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await?;
        let primary = info.lines().any(|l| l.trim() == "role:master");
        nodes.push(Node {
            url: url.to_owned(),
            conn,
            primary,
        });
    }
    anyhow::ensure!(nodes.len() >= 2, "name every node of the cluster");
    Ok(nodes)
}

/// Main-thread CPU of each node so far, µs (INFO cpu, user + sys).
async fn cpu_us(nodes: &mut [Node]) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(nodes.len());
    for node in nodes.iter_mut() {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut node.conn)
            .await?;
        out.push(super::strategies::main_thread_cpu_us(&info));
    }
    Ok(out)
}

/// Script calls the primaries have run so far (`INFO commandstats`: EVALSHA, EVAL, FCALL).
async fn script_calls(nodes: &mut [Node]) -> anyhow::Result<u64> {
    let mut calls = 0;
    for node in nodes.iter_mut().filter(|n| n.primary) {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut node.conn)
            .await?;
        calls += info
            .lines()
            .filter_map(|l| l.split_once(":calls="))
            .filter(|(cmd, _)| matches!(*cmd, "cmdstat_evalsha" | "cmdstat_eval" | "cmdstat_fcall"))
            .filter_map(|(_, rest)| rest.split(',').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(calls)
}

/// A sale of `units` over `n` buckets, bought by `args.buyers` buyers of one unit each.
async fn sale_run(
    ledger: &Arc<RedisLedger>,
    nodes: &mut [Node],
    args: &BucketsArgs,
    n: u16,
    units: u64,
    one_home: bool,
) -> anyhow::Result<Run> {
    let sale = bench_sale(units, n);
    ledger.warm(&sale, &sale.fresh_counters(), 1).await?;
    let stats_before = ledger.bucket_stats();
    // Counted before the CPU is read, so that this INFO's own cost is not in the run's.
    let calls_before = script_calls(nodes).await?;
    let before = cpu_us(nodes).await?;
    let started = Instant::now();
    let buyers = batches(n, args, one_home);
    let (accepted, sold_out, flagged) = match args.batcher {
        true => spike_batched(ledger, sale.sku_id, buyers, args).await?,
        false => spike(ledger, sale.sku_id, buyers, args).await?,
    };
    let wall_s = started.elapsed().as_secs_f64();
    let after = cpu_us(nodes).await?;
    let calls = script_calls(nodes).await? - calls_before;
    let stats = ledger.bucket_stats();
    let counters = ledger.counters(sale.sku_id).await?.expect("warm");
    let false_sold_outs = stats.false_sold_outs - stats_before.false_sold_outs;
    anyhow::ensure!(
        counters.sold == accepted && accepted == units.min(args.buyers),
        "{n} buckets: {accepted} accepted, {counters:?}, {units} units; of the {sold_out} not \
         accepted, {flagged} refused by the batcher's sold-out flag, the rest by the ledger \
         ({false_sold_outs} SOLD_OUT while the buckets held stock)"
    );
    Ok(Run {
        buckets: n,
        units,
        accepted,
        sold_out,
        wall_s,
        cpu_us: after.iter().zip(&before).map(|(a, b)| a - b).collect(),
        script_calls: calls,
        transfers: stats.transfers - stats_before.transfers,
        false_sold_outs,
    })
}

fn bench_sale(units: u64, buckets: u16) -> Sale {
    let now = flashsale_core::clock::now_ms();
    Sale {
        sku_id: SkuId(rand::rng().random_range(1..=1u64 << 40)),
        name: "bench buckets".into(),
        total_stock: units,
        per_user_limit: 1,
        mode: SaleMode::Direct,
        payment_timeout_ms: 0,
        starts_at_ms: now - 60_000,
        ends_at_ms: now + 3_600_000,
        state: SaleState::Live,
        buckets,
        admission: Default::default(),
    }
}

/// The buyers' calls: in arrival order, or (`by_home`) each of one home bucket, the homes
/// taking turns so every bucket sells all along.
/// `one_home`: every buyer homed at the last bucket (the others' stock must come to them).
fn batches(n: u16, args: &BucketsArgs, one_home: bool) -> Vec<Vec<UserId>> {
    let base = rand::rng().random_range(1..=1u64 << 40);
    let homes = if args.by_home { n } else { 1 };
    let mut by_home: Vec<Vec<UserId>> = vec![Vec::new(); usize::from(homes)];
    let buyers = (base..)
        .map(UserId)
        .filter(|&u| !one_home || flashsale_core::buckets::home_bucket(u, n) == n - 1)
        .take(args.buyers as usize);
    for user in buyers {
        by_home[usize::from(flashsale_core::buckets::home_bucket(user, homes))].push(user);
    }
    let mut chunks: Vec<_> = by_home.iter().map(|h| h.chunks(args.batch)).collect();
    let mut out = Vec::new();
    loop {
        let round: Vec<Vec<UserId>> = chunks
            .iter_mut()
            .filter_map(|c| c.next().map(<[UserId]>::to_vec))
            .collect();
        if round.is_empty() {
            return out;
        }
        out.extend(round);
    }
}

/// Every buyer of `batches` once, in arrival order, each request alone through a `Batcher` as
/// the service sends it: (accepted, not accepted, of which refused by the batcher's sold-out
/// flag).
async fn spike_batched(
    ledger: &Arc<RedisLedger>,
    sku: SkuId,
    batches: Vec<Vec<UserId>>,
    args: &BucketsArgs,
) -> anyhow::Result<(u64, u64, u64)> {
    let users: Vec<UserId> = batches.concat();
    let (users, next) = (Arc::new(users), Arc::new(AtomicUsize::new(0)));
    let ledger: Arc<dyn flashsale_core::Ledger> = ledger.clone();
    let in_flight = args.concurrency * args.batch;
    let batcher = Arc::new(Batcher::new(ledger, args.batch, in_flight.max(args.batch)));
    // Accepted, refused by the ledger, refused by the batcher's flag (the ledger not asked).
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let rid = RequestId::parse("b").expect("request id");
    let mut tasks = Vec::new();
    for _ in 0..in_flight {
        let (batcher, users, next, counts) =
            (batcher.clone(), users.clone(), next.clone(), counts.clone());
        let rid = rid.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(&user_id) = users.get(next.fetch_add(1, Ordering::Relaxed)) {
                let req = PurchaseRequest {
                    sku_id: sku,
                    user_id,
                    request_id: rid.clone(),
                    quantity: 1,
                };
                let answer = match batcher.sold_out_here(&req) {
                    true => 2,
                    false => match batcher.purchase(req).await? {
                        PurchaseOutcome::Accepted { .. } => 0,
                        PurchaseOutcome::Rejected(_) => 1,
                    },
                };
                counts[answer].fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let [accepted, refused, flagged] = counts
        .as_ref()
        .each_ref()
        .map(|c| c.load(Ordering::Relaxed));
    Ok((accepted, refused + flagged, flagged))
}

/// Every buyer once, `batches` as they come, `args.concurrency` calls at a time: (accepted,
/// not accepted, 0: no flag stands before the ledger here).
async fn spike(
    ledger: &Arc<RedisLedger>,
    sku: SkuId,
    batches: Vec<Vec<UserId>>,
    args: &BucketsArgs,
) -> anyhow::Result<(u64, u64, u64)> {
    let batches = Arc::new(batches);
    let next = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let sold_out = Arc::new(AtomicU64::new(0));
    let rid = RequestId::parse("b").expect("request id");
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (ledger, next, accepted, sold_out) = (
            ledger.clone(),
            next.clone(),
            accepted.clone(),
            sold_out.clone(),
        );
        let (rid, batches) = (rid.clone(), batches.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(users) = batches.get(i) else {
                    return Ok::<(), anyhow::Error>(());
                };
                let reqs: Vec<PurchaseRequest> = users
                    .iter()
                    .map(|&user_id| PurchaseRequest {
                        sku_id: sku,
                        user_id,
                        request_id: rid.clone(),
                        quantity: 1,
                    })
                    .collect();
                for out in ledger.purchase_batch(sku, &reqs).await? {
                    match out {
                        PurchaseOutcome::Accepted { .. } => &accepted,
                        PurchaseOutcome::Rejected(_) => &sold_out,
                    }
                    .fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((
        accepted.load(Ordering::Relaxed),
        sold_out.load(Ordering::Relaxed),
        0,
    ))
}

fn print_runs(nodes: &[Node], runs: &[Run], buckets: u16) {
    println!();
    println!("| buckets | accepted | purchases/s | busiest primary µs/purchase | all primaries µs/purchase | all nodes µs/purchase | purchases per script call | transfers |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in runs {
        let (busiest, primaries, all) = per_purchase(nodes, r);
        println!(
            "| {} | {} | {:.0} | {busiest:.2} | {primaries:.2} | {all:.2} | {:.1} | {} |",
            r.buckets,
            r.accepted,
            r.accepted as f64 / r.wall_s,
            r.accepted as f64 / r.script_calls.max(1) as f64,
            r.transfers
        );
    }
    let mean = |n: u16, pick: fn((f64, f64, f64)) -> f64| {
        let of: Vec<f64> = runs
            .iter()
            .filter(|r| r.buckets == n)
            .map(|r| pick(per_purchase(nodes, r)))
            .collect();
        of.iter().sum::<f64>() / of.len().max(1) as f64
    };
    println!();
    println!(
        "ratio {buckets} buckets ÷ 1 (means): busiest primary {:.2}, all primaries {:.2}, all nodes {:.2}",
        mean(buckets, |t| t.0) / mean(1, |t| t.0),
        mean(buckets, |t| t.1) / mean(1, |t| t.1),
        mean(buckets, |t| t.2) / mean(1, |t| t.2),
    );
    for (node, r) in nodes.iter().zip(&runs[runs.len() - 1].cpu_us) {
        let role = if node.primary { "primary" } else { "replica" };
        println!("  last run, {} ({role}): {:.0} µs", node.url, r);
    }
}

/// (busiest primary, all primaries, all nodes) µs of main-thread CPU per accepted purchase.
fn per_purchase(nodes: &[Node], r: &Run) -> (f64, f64, f64) {
    let per = r.accepted.max(1) as f64;
    let primaries = nodes.iter().zip(&r.cpu_us).filter(|(n, _)| n.primary);
    let busiest = primaries.clone().map(|(_, c)| *c).fold(0.0, f64::max);
    let all_primaries: f64 = primaries.map(|(_, c)| c).sum();
    let all: f64 = r.cpu_us.iter().sum();
    (busiest / per, all_primaries / per, all / per)
}

fn print_oversubscribed(over: &Run, spread: &str) {
    println!(
        "oversubscribed, {spread} ({} buyers for {} units, {} buckets): sold {} of {}, {} sold out, {} transfers, {} false sold-outs, {:.0} answers/s",
        over.accepted + over.sold_out,
        over.units,
        over.buckets,
        over.accepted,
        over.units,
        over.sold_out,
        over.transfers,
        over.false_sold_outs,
        (over.accepted + over.sold_out) as f64 / over.wall_s
    );
}
