//! `bench persister`: the persister's drain rate, batched transactions vs one transaction per
//! event, on MariaDB and PostgreSQL.

use std::time::{Duration, Instant};

use super::setup::*;
use clap::Args;
use flashsale_core::{HotPurchases, PurchaseRequest, RequestId, SaleState, UserId};

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

pub async fn run(args: PersisterArgs) -> anyhow::Result<()> {
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

/// Fills a sale's stream with `events` accepted purchases (calls of 256, or of one when the
/// persister reads one entry at a time), then times a persister draining it into a fresh
/// database on `server`.
async fn drain_rate(args: &PersisterArgs, server: &str, batch_max: usize) -> anyhow::Result<f64> {
    let prefix = format!("fspers{}b{batch_max}", std::process::id());
    let store = fresh_store(server, &prefix).await?;
    let ledger = flashsale_redis::RedisLedger::connect(&args.redis_url, &prefix).await?;
    let sale = super::strategies::bench_sale(args.events);
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
