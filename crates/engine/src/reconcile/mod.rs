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
pub mod journal;
pub mod rebuild;
pub mod worker;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use flashsale_core::clock::now_ms;
use flashsale_core::invariants::{check_bucketed_sale, check_sale, Violation};
use flashsale_core::{
    Counters, Event, EventKind, HotSnapshot, Ledger, LedgerError, OrderStatus, OrderStore,
    ReconcileRun, SaleMode, SaleState, SkuId, StoreError,
};
use serde::Serialize;

pub use diff::Diff;
pub use journal::{Journal, Losses};
pub use rebuild::{rebuild, rebuild_all, rebuild_bucket, RebuildError, Rebuilt, REBUILD_STALL_MS};
pub use worker::{Nudges, ReconcileWorker, WorkerSettings};

/// What started a run (stored with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    Worker,
    /// A request found the sale's copy fenced or missing (see [`Nudges`]).
    Nudge,
    Cli,
    Admin,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Worker => "worker",
            Trigger::Nudge => "nudge",
            Trigger::Cli => "cli",
            Trigger::Admin => "admin",
        }
    }
}

/// Most reads of a bucketed sale's hot units for two in a row that agree.
const HOT_UNITS_READS: usize = 5;

/// Most fenced events one run reports (the rest in the next runs).
const FENCED_PER_RUN_MAX: usize = 10_000;
/// Holds one expiry call of a repair expires at most, and calls per repair.
const EXPIRE_PER_CALL: usize = 1_024;
const EXPIRE_CALLS_MAX: usize = 64;

/// The kinds of repair (the `kind` label of `flashsale_reconcile_repairs_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    Replay,
    Rebuild,
    Expire,
}

impl Repair {
    pub fn as_str(self) -> &'static str {
        match self {
            Repair::Replay => "replay",
            Repair::Rebuild => "rebuild",
            Repair::Expire => "expire",
        }
    }
}

/// What one run found (and did) for one sale.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SaleReport {
    pub sku_id: u64,
    pub at_ms: i64,
    pub trigger: String,
    pub repair: bool,
    /// Every check passed and nothing is lost.
    pub ok: bool,
    pub state: String,
    pub db: Counters,
    pub db_epoch: u64,
    pub hot: Option<Counters>,
    pub hot_epoch: Option<u64>,
    /// The hot copy's operator state.
    pub hot_state: Option<String>,
    /// Events in the stream above the database's `applied_seq`.
    pub in_flight: u64,
    /// Hot counters with in-flight events folded out (or database counters folded back).
    pub folded: Option<Counters>,
    /// `None` when there is nothing to compare (hot sale missing or behind).
    pub diff: Option<Diff>,
    /// The hot sale is gone or behind the database: it needs a rebuild.
    pub hot_behind: bool,
    /// A sale kept in buckets: the buckets whose copy is gone or behind (each rebuilt by
    /// itself).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buckets_behind: Vec<u16>,
    /// A sale kept in buckets whose hot copies hold another number of units than its stock
    /// (a unit created or stranded by a lost transfer side): the transfers with one side
    /// stored, by id, and the buckets a repair rebuilds to count their other side.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub transfers_unbalanced: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buckets_unbalanced: Vec<u16>,
    pub violations: Vec<Violation>,
    /// Stream or fold problems (missing in-flight events, malformed entries …).
    pub findings: Vec<String>,
    pub overdue_holds: usize,
    /// Accepted purchases waiting in the stream longer than the lag bound.
    pub stale_pending: usize,
    /// Accepted purchases the hot ledger lost before the database got them.
    pub lost_orders: Vec<String>,
    /// Payments and cancellations answered 200 and lost, as `"<order_no> <kind>"`.
    pub lost_resolutions: Vec<String>,
    /// False when this instance's journal overflowed (loss reporting may be incomplete).
    pub journal_complete: bool,
    pub repairs: Vec<String>,
    pub run_id: u64,
    /// The state after repairs, when any were made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Box<SaleReport>>,
}

/// Tunables of the reconciler.
#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    /// An accepted purchase in flight longer than this is stale.
    pub lag_bound: Duration,
    /// A hold this long past its deadline, still RESERVED in the database, is overdue.
    pub hold_grace: Duration,
    /// A copy fenced this long is a rebuild that died midway: rebuilt again.
    pub rebuild_stall: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> ReconcileConfig {
        ReconcileConfig {
            lag_bound: Duration::from_secs(10),
            hold_grace: Duration::from_secs(5),
            rebuild_stall: Duration::from_millis(REBUILD_STALL_MS),
        }
    }
}

pub struct Reconciler {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub journal: Arc<Journal>,
    pub config: ReconcileConfig,
}

impl SaleReport {
    /// A run that could not finish (the sale is reported as not reconciled).
    fn failed(sku: SkuId, trigger: Trigger, repair: bool, e: &anyhow::Error) -> SaleReport {
        SaleReport {
            sku_id: sku.0,
            at_ms: now_ms(),
            trigger: trigger.as_str().to_owned(),
            repair,
            findings: vec![format!("run failed: {e:#}")],
            ..SaleReport::default()
        }
    }
}

impl SaleReport {
    /// Nothing can change the sale any more, and nothing is left to reconcile: ended in the
    /// database and in its hot copy (which then accepts nothing), no hold left to pay, cancel
    /// or expire, nothing in flight, and this run found everything in order. The worker's
    /// passes skip a settled sale (its persister retires too); `flashsale reconcile --sku`
    /// and the admin API still run it.
    pub fn settled(&self) -> bool {
        let hot_state = self.hot_state.as_deref().and_then(SaleState::parse);
        let (Some(state), Some(hot)) = (SaleState::parse(&self.state), hot_state.zip(self.hot))
        else {
            return false;
        };
        self.ok
            && self.in_flight == 0
            && flashsale_core::sale::settled(state, &self.db, Some((hot.0, hot.1.seq)))
    }
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
            None => self
                .store
                .sales()
                .await?
                .into_iter()
                .filter(|s| s.sale.state != SaleState::Scheduled)
                .map(|s| s.sale.sku_id)
                .filter(|&sku| !self.journal.is_settled(sku))
                .collect(),
        };
        let mut reports = Vec::with_capacity(skus.len());
        for sku in skus {
            match self.run_sale(sku, repair, trigger).await {
                Ok(report) => reports.push(report),
                Err(e) => {
                    tracing::warn!(%sku, error = %e, "reconcile run of one sale failed");
                    reports.push(SaleReport::failed(sku, trigger, repair, &e));
                }
            }
        }
        Ok(reports)
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
        let result = self.run_sale_locked(sku, repair, trigger).await;
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
        // Marked only once a stored run names them.
        self.store.mark_fenced_reported(sku, &fenced).await?;
        if !report.lost_orders.is_empty() || !report.lost_resolutions.is_empty() {
            tracing::error!(%sku, lost = ?report.lost_orders, resolutions = ?report.lost_resolutions, "promises lost with the hot ledger");
        }
        Ok(report)
    }

    /// Adds the events the database's epoch fence refused and no run reported yet; returns
    /// their `(epoch, seq)` to mark once the run is stored.
    async fn fenced_losses(
        &self,
        sku: SkuId,
        report: &mut SaleReport,
    ) -> anyhow::Result<Vec<(u64, u64)>> {
        let fenced = self
            .store
            .unreported_fenced(sku, FENCED_PER_RUN_MAX)
            .await?;
        let mut orders: BTreeSet<String> = report.lost_orders.drain(..).collect();
        let mut resolutions: BTreeSet<String> = report.lost_resolutions.drain(..).collect();
        for e in &fenced {
            match e.kind {
                EventKind::Deducted => orders.insert(e.order_no.to_string()),
                EventKind::Paid | EventKind::Cancelled => {
                    resolutions.insert(format!("{} {}", e.order_no, e.kind.as_str()))
                }
                // An expiry the database never got: the new copy expires the hold again.
                EventKind::Expired => false,
            };
        }
        report.lost_orders = orders.into_iter().collect();
        report.lost_resolutions = resolutions.into_iter().collect();
        if !fenced.is_empty() {
            metrics::counter!(flashsale_core::metric_names::RECONCILE_LOST, "sku" => sku.to_string())
                .increment(fenced.len() as u64);
        }
        Ok(fenced.iter().map(|e| (e.epoch, e.seq)).collect())
    }

    /// Reads both sides and checks everything; changes nothing except the journal (what the
    /// database holds is forgotten; what it never will is reported once and forgotten).
    pub async fn inspect(&self, sku: SkuId) -> anyhow::Result<SaleReport> {
        let at_ms = now_ms();
        let stored = self
            .store
            .sale(sku)
            .await?
            .ok_or(StoreError::SaleNotFound)?;
        if self.ledger.kept_in_buckets(&stored.sale) {
            return self.inspect_buckets(sku, stored.sale.buckets, at_ms).await;
        }
        // Hot first, then the database (I6's fold depends on this order).
        let hot = match self.ledger.hot_snapshot(sku).await {
            Ok(h) => Ok(h),
            Err(LedgerError::Internal(why)) => Err(why),
            Err(e) => return Err(e.into()),
        };
        let audit = self
            .store
            .audit(sku)
            .await?
            .ok_or(StoreError::SaleNotFound)?;
        // Hot once more: a healthy hot ledger is never behind what the database just showed.
        let hot_now = self.ledger.counters(sku).await?;
        let sale = &audit.sale.sale;
        let mut report = self.db_report(sku, &audit, at_ms);
        report.violations =
            check_sale(sale, &report.db, &audit.orders, &audit.events, false).violations;
        let expected_warm = sale.state != SaleState::Scheduled;
        match hot {
            // Not a loss by itself (a partial hash, a reply we do not understand): reported,
            // never rebuilt over.
            Err(why) => report.findings.push(format!("hot sale unreadable: {why}")),
            Ok(None) => {
                if expected_warm {
                    report.findings.push("hot sale is missing".into());
                    report.hot_behind = true;
                }
            }
            Ok(Some(snap)) => self.compare(&mut report, &snap, hot_now, &audit, at_ms),
        }
        Ok(self.conclude(report, &audit))
    }

    /// [`Reconciler::inspect`] of a bucketed sale: every bucket's snapshot first, then the
    /// database; I1–I7 with I5 per bucket and I2 over buckets; the diff per bucket
    /// (`buckets::compare`). A bucket missing or behind is listed in `buckets_behind`, never
    /// `hot_behind`: a repair rebuilds that bucket alone (`rebuild::rebuild_bucket`).
    async fn inspect_buckets(&self, sku: SkuId, n: u16, at_ms: i64) -> anyhow::Result<SaleReport> {
        rebuild::adopt_salts(self.ledger.as_ref(), self.store.as_ref(), sku).await?;
        let mut snaps = Vec::with_capacity(usize::from(n));
        let mut unreadable = Vec::new();
        for bucket in 0..n {
            match self.ledger.bucket_snapshot(sku, bucket).await {
                Ok(snap) => snaps.push(snap),
                Err(LedgerError::Internal(why)) => {
                    unreadable.push(format!("bucket {bucket}: hot copy unreadable: {why}"));
                    snaps.push(None);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let audit = (self.store.audit(sku).await?).ok_or(StoreError::SaleNotFound)?;
        let mut report = self.db_report(sku, &audit, at_ms);
        report.violations = check_bucketed_sale(
            &audit.sale.sale,
            &report.db,
            &audit.buckets,
            &audit.transfers,
            &audit.orders,
            &audit.events,
            false,
        )
        .violations;
        report.findings.extend(unreadable);
        let stale_before_ms = at_ms - self.config.lag_bound.as_millis() as i64;
        let stall_ms = self.config.rebuild_stall.as_millis() as u64;
        buckets::compare(&mut report, &snaps, &audit, stale_before_ms, stall_ms);
        if report.hot.is_some() {
            self.check_hot_units(sku, &mut report, &audit).await;
        }
        Ok(self.conclude(report, &audit))
    }

    /// The hot copies' units (their totals and the units in flight between them) against
    /// the stock. The buckets are read one after another, so a transfer during a read may
    /// count its units twice or not at all: a difference is a finding only when two reads
    /// in a row agree on every bucket's total and the units in flight (a transfer between
    /// them moves at least one of those), at most [`HOT_UNITS_READS`] reads; the transfers
    /// with one side stored are named by id (`buckets::unbalanced`).
    async fn check_hot_units(
        &self,
        sku: SkuId,
        report: &mut SaleReport,
        audit: &flashsale_core::SaleAudit,
    ) {
        let stock = audit.sale.sale.total_stock;
        let mut last: Option<(Vec<u64>, u64)> = None;
        let mut held = None;
        for _ in 0..HOT_UNITS_READS {
            let hot = match self.ledger.hot_buckets(sku).await {
                Ok(Some(hot)) => hot,
                Ok(None) => return,
                Err(e) => return report.findings.push(format!("hot units unreadable: {e}")),
            };
            let totals: Vec<u64> = hot.buckets.iter().map(|(_, c)| c.total).collect();
            let units = totals.iter().sum::<u64>() + hot.in_flight_units;
            if units == stock {
                return;
            }
            let read = (totals, hot.in_flight_units);
            if last.as_ref() == Some(&read) {
                held = Some(units);
                break;
            }
            last = Some(read);
        }
        let Some(held) = held else {
            // Transfers on the move at every read: judged on the next run.
            return tracing::debug!(%sku, "hot units not read at rest");
        };
        let (ids, buckets) = buckets::unbalanced(&audit.transfers);
        report.findings.push(format!(
            "hot copies hold {held} units, the stock is {stock}; transfers with one side stored: {ids:?}"
        ));
        tracing::error!(%sku, ?held, stock, transfers = ?ids, "hot copies hold another number of units than the stock");
        report.transfers_unbalanced = ids;
        report.buckets_unbalanced = buckets;
    }

    /// A report of what the database alone shows: counters, overdue holds, stale PENDING.
    fn db_report(&self, sku: SkuId, audit: &flashsale_core::SaleAudit, at_ms: i64) -> SaleReport {
        let mut report = SaleReport {
            sku_id: sku.0,
            at_ms,
            state: audit.sale.sale.state.as_str().to_owned(),
            db: audit.sale.counters,
            db_epoch: audit.sale.epoch,
            journal_complete: true,
            ..SaleReport::default()
        };
        report.overdue_holds = self.overdue_holds(&audit.orders, at_ms);
        // The database never stores PENDING on the Redis path; one there is stale.
        report.stale_pending = audit
            .orders
            .iter()
            .filter(|o| o.status == OrderStatus::Pending)
            .count();
        report
    }

    /// The journal settled, and the verdict.
    fn conclude(&self, mut report: SaleReport, audit: &flashsale_core::SaleAudit) -> SaleReport {
        self.settle_journal(&mut report, audit);
        report.ok = report.violations.is_empty()
            && report.findings.is_empty()
            && !report.hot_behind
            && report.overdue_holds == 0
            && report.stale_pending == 0
            && report.diff.as_ref().is_some_and(Diff::is_zero)
            && report.lost_orders.is_empty()
            && report.lost_resolutions.is_empty();
        report
    }

    fn overdue_holds(&self, orders: &[flashsale_core::HotOrder], at_ms: i64) -> usize {
        let grace = self.config.hold_grace.as_millis() as i64;
        orders
            .iter()
            .filter(|o| {
                o.status == OrderStatus::Reserved
                    && o.deadline_ms > 0
                    && o.deadline_ms + grace < at_ms
            })
            .count()
    }

    /// The hot copy against the database: behind (needs a rebuild) or folded and compared.
    fn compare(
        &self,
        report: &mut SaleReport,
        snap: &HotSnapshot,
        hot_now: Option<Counters>,
        audit: &flashsale_core::SaleAudit,
        at_ms: i64,
    ) {
        let a = report.db.seq;
        report.hot = Some(snap.counters);
        report.hot_epoch = Some(snap.epoch);
        report.hot_state = Some(snap.state.as_str().to_owned());
        for (id, why) in &snap.bad_entries {
            report.findings.push(format!("stream entry {id}: {why}"));
        }
        let stall_ms = self.config.rebuild_stall.as_millis() as u64;
        let stalled = snap.fenced_ms.is_some_and(|ms| ms >= stall_ms);
        let behind = snap.epoch < audit.sale.epoch || hot_now.is_none_or(|c| c.seq < a) || stalled;
        if behind {
            report.findings.push(format!(
                "hot copy behind the database: epoch {} seq {} fenced {:?} ms vs epoch {} applied_seq {a}",
                snap.epoch,
                hot_now.map_or(0, |c| c.seq),
                snap.fenced_ms,
                audit.sale.epoch
            ));
            report.hot_behind = true;
        } else if snap.fenced_ms.is_some() {
            // A rebuild is under way: nothing to compare yet.
            report
                .findings
                .push("hot copy fenced: a rebuild is under way".into());
        } else {
            self.fold(report, snap, &audit.events, audit.sale.sale.mode, at_ms);
        }
    }

    /// The journal: forget what the database holds, report what it never will.
    fn settle_journal(&self, report: &mut SaleReport, audit: &flashsale_core::SaleAudit) {
        let losses = (self.journal).settle(&audit.sale, &audit.orders, &audit.buckets);
        report.journal_complete = losses.complete;
        report.lost_orders = losses.orders.iter().map(|no| no.to_string()).collect();
        report.lost_resolutions = losses
            .resolutions
            .iter()
            .map(|(no, kind)| format!("{no} {}", kind.as_str()))
            .collect();
        let lost = losses.orders.len() + losses.resolutions.len();
        if lost > 0 {
            metrics::counter!(flashsale_core::metric_names::RECONCILE_LOST, "sku" => report.sku_id.to_string())
                .increment(lost as u64);
        }
    }

    /// I6: folds the in-flight events out of whichever side is ahead and compares.
    fn fold(
        &self,
        report: &mut SaleReport,
        snap: &HotSnapshot,
        db_events: &[Event],
        mode: SaleMode,
        at_ms: i64,
    ) {
        let (s, a) = (snap.counters.seq, report.db.seq);
        let lag_bound = self.config.lag_bound.as_millis() as i64;
        let (mut from, target, undo): (Counters, Counters, Vec<&Event>) = if a <= s {
            let undo: Vec<&Event> = snap
                .events
                .iter()
                .filter(|e| e.seq > a && e.seq <= s)
                .collect();
            report.in_flight = undo.len() as u64;
            report.stale_pending = undo
                .iter()
                .filter(|e| e.kind == EventKind::Deducted && e.at_ms + lag_bound < at_ms)
                .count();
            (snap.counters, report.db, undo)
        } else {
            let undo: Vec<&Event> = db_events
                .iter()
                .filter(|e| e.seq > s && e.seq <= a)
                .collect();
            (report.db, snap.counters, undo)
        };
        let (lo, hi) = (a.min(s), a.max(s));
        let contiguous = undo.len() as u64 == hi - lo
            && undo
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq == lo + 1 + i as u64);
        if !contiguous {
            report.findings.push(format!(
                "events ({lo}, {hi}] are not all there to fold: {} found",
                undo.len()
            ));
            return;
        }
        for e in undo.iter().rev() {
            match from.unapply(e.delta(mode)) {
                Some(c) => from = c,
                None => {
                    report
                        .findings
                        .push(format!("event {} cannot be undone from {from:?}", e.seq));
                    return;
                }
            }
        }
        let (hot_folded, db) = if a <= s {
            (from, target)
        } else {
            (target, from)
        };
        report.folded = Some(from);
        report.diff = Some(Diff::between(&hot_folded, &db));
    }

    /// Idempotent repairs; returns what was done, one line each.
    async fn repair(
        &self,
        sku: SkuId,
        report: &SaleReport,
    ) -> anyhow::Result<Vec<(Repair, String)>> {
        let mut done = Vec::new();
        // 1. Events still in the stream the database lacks (a stuck or dead persister). The
        // worker leaves fresh ones to the persister; on demand, everything is replayed.
        let replay = report.trigger != Trigger::Worker.as_str() || report.stale_pending > 0;
        // A bucketed sale's streams are each their own persister's: no replay from here.
        let stored = self.store.sale(sku).await?;
        let bucketed = stored.is_some_and(|s| self.ledger.kept_in_buckets(&s.sale));
        if replay && !report.hot_behind && !bucketed {
            if let Some(line) = self.replay(sku).await? {
                done.push((Repair::Replay, line));
            }
        }
        // 2. Rebuild the hot copy when it is gone, behind, or fenced by a stalled rebuild; of
        // a sale kept in buckets, each such bucket by itself.
        // A bucket whose transfer lost a side is rebuilt too: its rebuild stores the other
        // side of its transfers (`rebuild::rebuild_bucket`), so the unit is counted once.
        let mut rebuilt_buckets = report.buckets_behind.clone();
        for &bucket in &report.buckets_unbalanced {
            if !rebuilt_buckets.contains(&bucket) {
                rebuilt_buckets.push(bucket);
            }
        }
        for bucket in rebuilt_buckets {
            let (ledger, store) = (self.ledger.as_ref(), self.store.as_ref());
            let rebuilt = rebuild::rebuild_bucket(ledger, store, sku, bucket).await?;
            done.push((Repair::Rebuild, format!("bucket {bucket}: {rebuilt}")));
        }
        if report.hot_behind {
            let rebuilt = rebuild(self.ledger.as_ref(), self.store.as_ref(), sku).await?;
            done.push((Repair::Rebuild, rebuilt.to_string()));
        }
        // 3. Overdue holds.
        if let Some(line) = self.expire_overdue(sku).await? {
            done.push((Repair::Expire, line));
        }
        Ok(done)
    }

    async fn replay(&self, sku: SkuId) -> anyhow::Result<Option<String>> {
        let Some(snap) = self.ledger.hot_snapshot(sku).await? else {
            return Ok(None);
        };
        let stored = self
            .store
            .sale(sku)
            .await?
            .ok_or(StoreError::SaleNotFound)?;
        let a = stored.counters.seq;
        let missing = rebuild::contiguous_above(&snap.events, stored.epoch, a);
        if missing.is_empty() {
            return Ok(None);
        }
        match self.store.apply_events(sku, &missing).await {
            Ok(r) if r.applied > 0 => Ok(Some(format!(
                "applied {} events ({} already there) from seq {}",
                r.applied,
                r.duplicates,
                a + 1
            ))),
            Ok(_) => Ok(None),
            Err(StoreError::Gap { .. }) => Ok(None), // the persister moved on meanwhile
            Err(e) => Err(e.into()),
        }
    }

    async fn expire_overdue(&self, sku: SkuId) -> anyhow::Result<Option<String>> {
        let stored = self
            .store
            .sale(sku)
            .await?
            .ok_or(StoreError::SaleNotFound)?;
        if stored.sale.mode != SaleMode::Reserve || stored.sale.state == SaleState::Scheduled {
            return Ok(None);
        }
        let mut expired = 0;
        for _ in 0..EXPIRE_CALLS_MAX {
            let n = match self.ledger.expire_due(sku, EXPIRE_PER_CALL).await {
                Ok(n) => n,
                // A copy being rebuilt: its replacement expires them.
                Err(LedgerError::NotWarmed) => 0,
                Err(e) => return Err(e.into()),
            };
            expired += n;
            if n < EXPIRE_PER_CALL {
                break;
            }
        }
        Ok((expired > 0).then(|| format!("{expired} overdue holds expired")))
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
