//! The reconciler: proves, per sale, that no unit is lost between the hot ledger and the
//! system of record, and repairs what it safely can.
//!
//! - [`journal`]: what this instance promised (accepted purchases, resolutions answered 200)
//!   that the database may not hold yet; the source of the loss report when Redis loses
//!   writes together with its stream.
//! - [`rebuild`]: the life of a sale's hot copy and the one way a copy is (re)loaded: fence,
//!   drain, take the next epoch in the database, load, restore, open.
//! - [`diff`]: hot counters against the database's, field by field (I6).
//! - `buckets`: a bucketed sale compared bucket by bucket (each its own copy, stream and row);
//!   a bucket gone or behind is rebuilt by itself (`rebuild::rebuild_bucket`).
//! - [`worker`]: the reconciler as a background worker (its HTTP routes are the server's).
//! - `report`: what a run found ([`SaleReport`]), its [`Trigger`], the kinds of [`Repair`],
//!   the tunables. `inspect` (a run's checks) and `repair` (its repairs) add to the
//!   [`Reconciler`] of this file, which runs them and records the run; neither uses the other.
//!
//! One run of one sale (`Reconciler::run_sale`):
//! 1. reads the hot snapshot first (counters at `s`, epoch, fence, events still in the
//!    stream), then the database in one transaction (`OrderStore::audit`: counters at `a`,
//!    orders, events), then the hot counters once more;
//! 2. I1–I5, I7 from the database (`check_sale`), gap-free events, orders ↔ events;
//! 3. I6: folds the in-flight events out — `a <= s`: undo the stream's events in `(a, s]` from
//!    the hot counters; `a > s` (the persister moved on between the two reads): undo the
//!    database's events in `(s, a]` from the database counters — and compares every field;
//! 4. holds past their deadline, accepted purchases in flight longer than the lag bound;
//! 5. the hot copy behind the database (gone, of an older epoch, its seq below `a` when read
//!    after the database, or fenced by a rebuild that stalled): it must be rebuilt;
//! 6. losses: this instance's journal, and the events the database's epoch fence refused
//!    (`fenced_events`, from every instance's persister), reported once by order number.
//!
//! Repairs (when asked; each idempotent and listed in the run): replay stream events the
//! database lacks (`apply_events` applies each exactly once), rebuild the hot copy
//! ([`rebuild::rebuild`]), expire overdue holds. Every run is stored in `reconcile_runs` and
//! exported as metrics. A sale whose run fails is reported as failed; the others still run.

mod buckets;
pub mod diff;
#[cfg(test)]
mod fixtures;
mod inspect;
pub mod journal;
pub mod rebuild;
mod repair;
mod report;
pub mod worker;

use std::sync::Arc;

use flashsale_core::{Ledger, OrderStore, ReconcileRun, SaleState, SkuId};

pub use diff::Diff;
pub use journal::{Journal, Losses};
pub use rebuild::{
    rebuild, rebuild_all, rebuild_bucket, warm_snapshot, RebuildError, Rebuilt, REBUILD_STALL_MS,
};
pub use report::{ReconcileConfig, Repair, SaleReport, Trigger};
pub use worker::{Nudges, ReconcileWorker, WorkerSettings};

pub struct Reconciler {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub journal: Arc<Journal>,
    pub config: ReconcileConfig,
}

impl Reconciler {
    pub fn new(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        journal: Arc<Journal>,
    ) -> Reconciler {
        Reconciler {
            ledger,
            store,
            journal,
            config: ReconcileConfig::default(),
        }
    }

    /// Every sale that is not scheduled nor settled (or the one asked for: a settled sale
    /// too). A sale whose run fails is reported as failed and the others still run: one
    /// broken sale must not stop the rest.
    pub async fn run(
        &self,
        sku: Option<SkuId>,
        repair: bool,
        trigger: Trigger,
    ) -> anyhow::Result<Vec<SaleReport>> {
        let skus: Vec<SkuId> = match sku {
            Some(sku) => vec![sku],
            None => self.open_sales().await?,
        };
        let mut reports = Vec::with_capacity(skus.len());
        for sku in skus {
            reports.push(self.run_or_report(sku, repair, trigger).await);
        }
        Ok(reports)
    }

    /// The sales a run over every sale takes: neither scheduled nor settled.
    pub async fn open_sales(&self) -> anyhow::Result<Vec<SkuId>> {
        Ok(self
            .store
            .sales()
            .await?
            .into_iter()
            .filter(|s| s.sale.state != SaleState::Scheduled)
            .map(|s| s.sale.sku_id)
            .filter(|&sku| !self.journal.is_settled(sku))
            .collect())
    }

    /// [`Reconciler::run_sale`], a failure logged and reported as a failed run.
    pub async fn run_or_report(&self, sku: SkuId, repair: bool, trigger: Trigger) -> SaleReport {
        match self.run_sale(sku, repair, trigger).await {
            Ok(report) => report,
            Err(e) => {
                tracing::warn!(%sku, error = %e, "reconcile run of one sale failed");
                SaleReport::failed(sku, trigger, repair, &e)
            }
        }
    }

    /// One run of one sale: inspect, repair when asked, inspect again after repairs, store
    /// the run, export metrics.
    pub async fn run_sale(
        &self,
        sku: SkuId,
        repair: bool,
        trigger: Trigger,
    ) -> anyhow::Result<SaleReport> {
        let _one = self.journal.running.lock().await;
        // Losses a run took out and never stored (it was dropped midway) are reported now.
        self.journal.restore_taken(sku);
        let result = self.run_sale_locked(sku, repair, trigger).await;
        if result.is_err() {
            self.journal.restore_taken(sku);
        }
        let outcome = match &result {
            Ok(r) if r.ok => "ok",
            Ok(_) => "mismatch",
            Err(_) => "error",
        };
        metrics::counter!(flashsale_core::metric_names::RECONCILE_RUNS, "result" => outcome)
            .increment(1);
        result
    }

    async fn run_sale_locked(
        &self,
        sku: SkuId,
        repair: bool,
        trigger: Trigger,
    ) -> anyhow::Result<SaleReport> {
        let mut report = self.inspect(sku).await?;
        report.trigger = trigger.as_str().to_owned();
        report.repair = repair;
        if repair {
            let repairs = self.repair(sku, &report).await?;
            if !repairs.is_empty() {
                for (kind, _) in &repairs {
                    metrics::counter!(flashsale_core::metric_names::RECONCILE_REPAIRS, "kind" => kind.as_str())
                        .increment(1);
                }
                report.repairs = repairs
                    .iter()
                    .map(|(k, d)| format!("{}: {d}", k.as_str()))
                    .collect();
                let mut after = self.inspect(sku).await?;
                after.trigger = trigger.as_str().to_owned();
                // Loss is found once the rebuild has moved the epoch on: report it here.
                report.lost_orders.extend(after.lost_orders.iter().cloned());
                report
                    .lost_resolutions
                    .extend(after.lost_resolutions.iter().cloned());
                report.journal_complete &= after.journal_complete;
                report.after = Some(Box::new(after));
            }
        }
        let fenced = self.fenced_losses(sku, &mut report).await?;
        report.ok =
            report.ok && report.lost_orders.is_empty() && report.lost_resolutions.is_empty();
        if report.settled() {
            self.journal.settle_sale(sku);
        }
        self.export(&report);
        report.run_id = self.record(&report).await?;
        // Forgotten only once a stored run names them, like the fenced events below.
        self.journal.forget_taken(sku);
        // Marked only once a stored run names them.
        self.store.mark_fenced_reported(sku, &fenced).await?;
        if !report.lost_orders.is_empty() || !report.lost_resolutions.is_empty() {
            tracing::error!(%sku, lost = ?report.lost_orders, resolutions = ?report.lost_resolutions, "promises lost with the hot ledger");
        }
        Ok(report)
    }

    fn export(&self, report: &SaleReport) {
        let sku = report.sku_id.to_string();
        let last = report.after.as_deref().unwrap_or(report);
        let diff = last.diff.clone().unwrap_or_default();
        for (field, value) in diff.fields() {
            metrics::gauge!(flashsale_core::metric_names::RECONCILE_DIFF, "sku" => sku.clone(), "field" => field)
                .set(value as f64);
        }
        metrics::gauge!(flashsale_core::metric_names::RECONCILE_VIOLATIONS, "sku" => sku.clone())
            .set(last.violations.len() as f64);
        metrics::gauge!(flashsale_core::metric_names::RECONCILE_HOT_BEHIND, "sku" => sku)
            .set(if last.hot_behind { 1.0 } else { 0.0 });
    }

    async fn record(&self, report: &SaleReport) -> anyhow::Result<u64> {
        let run = ReconcileRun {
            id: 0,
            sku_id: SkuId(report.sku_id),
            at_ms: report.at_ms,
            trigger: report.trigger.clone(),
            repair: report.repair,
            ok: report.ok,
            violations: report.violations.len() as u32,
            repairs: report.repairs.clone(),
            lost_orders: report.lost_orders.clone(),
            lost_resolutions: report.lost_resolutions.clone(),
            report: serde_json::to_string(report)?,
        };
        Ok(self.store.record_reconcile_run(&run).await?)
    }
}
