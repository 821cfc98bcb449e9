//! `flashsale reconcile [--sku N] [--repair]`: one reconciler run from the command line.
//!
//! This process answered no purchase, so its loss journal is empty: it finds every diff,
//! rebuilds a sale, and reports the events the database's epoch fence refused, but only the
//! serving instances (their worker, or `POST /api/v1/admin/reconcile/{sku}/repair`) can name
//! accepted purchases lost together with their stream.

use std::sync::Arc;

use flashsale_core::SkuId;
use flashsale_engine::reconcile::{Journal, Reconciler, Trigger};

use crate::settings::Settings;

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub settings: Settings,
    /// Only this sale (default: every sale that is not scheduled).
    #[arg(long)]
    pub sku: Option<u64>,
    /// Also repair: replay missing events, rebuild a hot sale behind the database, expire
    /// overdue holds.
    #[arg(long)]
    pub repair: bool,
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    let settings = args.settings.engine(false)?;
    // The embedded ledger has one writer per data dir: the serving process. A second one here
    // could expire holds behind its back.
    anyhow::ensure!(
        settings.ledger.redis_url.is_some() || !args.repair,
        "the embedded ledger is repaired by the process that serves it: \
         POST /api/v1/admin/reconcile/{{sku}}/repair"
    );
    let (ledger, store) = flashsale_engine::backends::open(&settings).await?;
    let reconciler = Reconciler::new(ledger, store, Arc::new(Journal::default()));
    let reports = reconciler
        .run(args.sku.map(SkuId), args.repair, Trigger::Cli)
        .await?;
    println!("{}", serde_json::to_string_pretty(&reports)?);
    let bad: Vec<u64> = reports.iter().filter(|r| !r.ok).map(|r| r.sku_id).collect();
    anyhow::ensure!(bad.is_empty(), "sales not reconciled: {bad:?}");
    Ok(())
}
