//! `bench ledger`: the embedded ledger in-process (no HTTP): purchases committed per second.

use std::sync::Arc;
use std::time::Instant;

use super::setup::*;
use clap::Args;
use flashsale_core::{
    HotPurchases, PurchaseOutcome, PurchaseRequest, RequestId, Sale, SaleState, SkuId, UserId,
};
use flashsale_embedded::EmbeddedLedger;
use flashsale_store::SqliteStore;

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

pub async fn run(args: LedgerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.batch >= 1 && args.batch <= flashsale_core::limits::BATCH_LEN_MAX,
        "--batch must be 1..=1024"
    );
    let dir = tempfile_dir(std::path::Path::new("./flashsale-data"))?;
    let url = format!("sqlite://{}/ledger.db", dir.display());
    one_row(&url).await?;
    let store = Arc::new(SqliteStore::open(&url).await?);
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
        "batch {} × {} callers; database sold = {} (target >= 250000/s)",
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
