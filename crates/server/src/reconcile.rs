//! The reconciler: proves, per sale, that no unit is lost between the hot ledger and the
//! system of record, and repairs what it safely can.
//!
//! One run of one sale (`Reconciler::run_sale`):
//! 1. reads the hot snapshot first (counters at `s`, epoch, events still in the stream), then
//!    the database in one transaction (`OrderStore::audit`: counters at `a`, orders, events),
//!    then the hot counters once more;
//! 2. I1–I5, I7 from the database (`check_sale`), gap-free events, orders ↔ events;
//! 3. I6: folds the in-flight events out — `a <= s`: undo the stream's events in `(a, s]` from
//!    the hot counters; `a > s` (the persister moved on between the two reads): undo the
//!    database's events in `(s, a]` from the database counters — and compares every field;
//! 4. holds past their deadline, accepted purchases in flight longer than the lag bound;
//! 5. Redis behind the database (sale hash gone, its epoch older, or its seq below `a` when
//!    read after the database): the sale must be rebuilt;
//! 6. accepted-but-lost purchases, from this instance's [`Journal`].
//!
//! Repairs (when asked; each idempotent and listed in the run): replay stream events the
//! database lacks (`apply_events` applies each exactly once), rebuild the hot sale from the
//! database (bump the epoch, warm paused with force, `restore_orders`, set the operator state
//! back), expire overdue holds. Every run is stored in `reconcile_runs` and exported as
//! metrics.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use flashsale_core::invariants::{check_sale, Violation};
use flashsale_core::ledger::RestockListener;
use flashsale_core::{
    Counters, Event, EventKind, HotLedger, HotOrder, HotSnapshot, LedgerError, OrderNo,
    OrderStatus, OrderStore, PurchaseOutcome, PurchaseRequest, ReconcileRun, Resolution, Sale,
    SaleMode, SaleState, SkuId, StoreError, UserId,
};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::auth::Admin;
use crate::error::AppError;
use crate::state::AppState;
use crate::workers::Worker;

/// Most accepted order numbers the journal keeps per sale (beyond it, the oldest go and the
/// journal says it is incomplete).
pub const JOURNAL_PER_SALE_MAX: usize = 262_144;

/// Accepted purchases this instance answered that the database may not hold yet, per sale:
/// `(epoch, seq) → order_no`. Trimmed as the database's `applied_seq` passes them. When the
/// hot ledger loses writes (Redis restarted without persistence) its stream goes too, so this
/// is the only record left of what was promised: after a rebuild, an entry of an older epoch
/// that the database does not hold is an accepted-but-lost purchase, and is reported.
#[derive(Default)]
pub struct Journal {
    sales: Mutex<HashMap<SkuId, SaleJournal>>,
    /// One reconciler run at a time in this process (worker, admin API).
    running: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct SaleJournal {
    entries: BTreeMap<(u64, u64), OrderNo>,
    /// Entries dropped because the journal was full.
    dropped: u64,
}

/// `(epoch, seq)` of an order number `<sku>-<epoch>-<seq>`.
pub fn epoch_seq(no: &OrderNo) -> Option<(u64, u64)> {
    let mut parts = no.as_str().split('-').skip(1);
    let epoch = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    Some((epoch, seq))
}

impl Journal {
    pub fn record(&self, sku: SkuId, orders: impl Iterator<Item = OrderNo>) {
        let mut sales = self.sales.lock().expect("journal lock");
        let journal = sales.entry(sku).or_default();
        for no in orders {
            let Some(key) = epoch_seq(&no) else { continue };
            journal.entries.insert(key, no);
            if journal.entries.len() > JOURNAL_PER_SALE_MAX {
                journal.entries.pop_first();
                journal.dropped += 1;
            }
        }
    }

    /// Forgets entries the database holds: epoch `epoch` and seq `<= applied_seq`.
    fn trim(&self, sku: SkuId, epoch: u64, applied_seq: u64) {
        let mut sales = self.sales.lock().expect("journal lock");
        if let Some(j) = sales.get_mut(&sku) {
            j.entries
                .retain(|&(e, s), _| !(e == epoch && s <= applied_seq));
        }
    }

    /// Entries of epochs older than `epoch` (candidates for loss), and whether nothing was
    /// dropped.
    fn older_than(&self, sku: SkuId, epoch: u64) -> (Vec<OrderNo>, bool) {
        let sales = self.sales.lock().expect("journal lock");
        match sales.get(&sku) {
            Some(j) => (
                j.entries
                    .range(..(epoch, 0))
                    .map(|(_, no)| no.clone())
                    .collect(),
                j.dropped == 0,
            ),
            None => (Vec::new(), true),
        }
    }

    fn forget(&self, sku: SkuId, nos: &[OrderNo]) {
        let mut sales = self.sales.lock().expect("journal lock");
        if let Some(j) = sales.get_mut(&sku) {
            for no in nos {
                if let Some(key) = epoch_seq(no) {
                    j.entries.remove(&key);
                }
            }
        }
    }

    /// Entries kept for a sale (for tests and metrics).
    pub fn len(&self, sku: SkuId) -> usize {
        let sales = self.sales.lock().expect("journal lock");
        sales.get(&sku).map_or(0, |j| j.entries.len())
    }

    pub fn is_empty(&self, sku: SkuId) -> bool {
        self.len(sku) == 0
    }
}

/// A hot ledger that writes every newly accepted purchase into a [`Journal`]; everything
/// else passes through.
pub struct JournalingLedger {
    inner: Arc<dyn HotLedger>,
    journal: Arc<Journal>,
}

impl JournalingLedger {
    pub fn wrap(inner: Arc<dyn HotLedger>, journal: Arc<Journal>) -> Arc<dyn HotLedger> {
        Arc::new(JournalingLedger { inner, journal })
    }
}

#[async_trait]
impl HotLedger for JournalingLedger {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn warm(
        &self,
        sale: &Sale,
        counters: &Counters,
        epoch: u64,
        force: bool,
    ) -> Result<(), LedgerError> {
        self.inner.warm(sale, counters, epoch, force).await
    }

    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), LedgerError> {
        self.inner.set_state(sku, state).await
    }

    async fn purchase_batch(
        &self,
        sku: SkuId,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        let outcomes = self.inner.purchase_batch(sku, reqs).await?;
        self.journal.record(
            sku,
            outcomes.iter().filter_map(|o| match o {
                PurchaseOutcome::Accepted {
                    order,
                    replayed: false,
                } => Some(order.order_no.clone()),
                _ => None,
            }),
        );
        Ok(outcomes)
    }

    async fn pay(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.inner.pay(order_no, user).await
    }

    async fn cancel(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.inner.cancel(order_no, user).await
    }

    async fn expire_due(&self, sku: SkuId, max: usize) -> Result<usize, LedgerError> {
        self.inner.expire_due(sku, max).await
    }

    async fn counters(&self, sku: SkuId) -> Result<Option<Counters>, LedgerError> {
        self.inner.counters(sku).await
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, LedgerError> {
        self.inner.order(order_no).await
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.inner.ping().await
    }

    async fn accepted_keys(
        &self,
        sku: SkuId,
        max: usize,
    ) -> Result<Option<Vec<String>>, LedgerError> {
        self.inner.accepted_keys(sku, max).await
    }

    fn on_restock(&self, listener: RestockListener) {
        self.inner.on_restock(listener)
    }

    async fn hot_snapshot(&self, sku: SkuId) -> Result<Option<HotSnapshot>, LedgerError> {
        self.inner.hot_snapshot(sku).await
    }

    async fn restore_orders(&self, sku: SkuId, orders: &[HotOrder]) -> Result<usize, LedgerError> {
        self.inner.restore_orders(sku, orders).await
    }
}

/// Counters of the two sides and their difference per field (hot folded minus database).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Diff {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub seq: i64,
}

impl Diff {
    fn between(hot: &Counters, db: &Counters) -> Diff {
        let d = |h: u64, d: u64| h as i64 - d as i64;
        Diff {
            total: d(hot.total, db.total),
            available: d(hot.available, db.available),
            reserved: d(hot.reserved, db.reserved),
            sold: d(hot.sold, db.sold),
            seq: d(hot.seq, db.seq),
        }
    }

    fn is_zero(&self) -> bool {
        self.fields().iter().all(|(_, v)| *v == 0)
    }

    fn fields(&self) -> [(&'static str, i64); 5] {
        [
            ("total", self.total),
            ("available", self.available),
            ("reserved", self.reserved),
            ("sold", self.sold),
            ("seq", self.seq),
        ]
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
    /// Events in the stream above the database's `applied_seq`.
    pub in_flight: u64,
    /// Hot counters with in-flight events folded out (or database counters folded back).
    pub folded: Option<Counters>,
    /// `None` when there is nothing to compare (hot sale missing or behind).
    pub diff: Option<Diff>,
    /// The hot sale is gone or behind the database: it needs a rebuild.
    pub hot_behind: bool,
    pub violations: Vec<Violation>,
    /// Stream or fold problems (missing in-flight events, malformed entries …).
    pub findings: Vec<String>,
    pub overdue_holds: usize,
    /// Accepted purchases waiting in the stream longer than the lag bound.
    pub stale_pending: usize,
    /// Accepted purchases the hot ledger lost before the database got them.
    pub lost_orders: Vec<String>,
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
}

impl Default for ReconcileConfig {
    fn default() -> ReconcileConfig {
        ReconcileConfig {
            lag_bound: Duration::from_secs(10),
            hold_grace: Duration::from_secs(5),
        }
    }
}

pub struct Reconciler {
    pub ledger: Arc<dyn HotLedger>,
    pub store: Arc<dyn OrderStore>,
    pub journal: Arc<Journal>,
    pub config: ReconcileConfig,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Reconciler {
    pub fn new(
        ledger: Arc<dyn HotLedger>,
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

    pub fn from_state(st: &AppState) -> Reconciler {
        Reconciler::new(st.ledger.clone(), st.store.clone(), st.journal.clone())
    }

    /// Every sale that is not scheduled (or the one asked for).
    pub async fn run(
        &self,
        sku: Option<SkuId>,
        repair: bool,
        trigger: &str,
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
                .collect(),
        };
        let mut reports = Vec::with_capacity(skus.len());
        for sku in skus {
            reports.push(self.run_sale(sku, repair, trigger).await?);
        }
        Ok(reports)
    }

    /// One run of one sale: inspect, repair when asked, inspect again after repairs, store
    /// the run, export metrics.
    pub async fn run_sale(
        &self,
        sku: SkuId,
        repair: bool,
        trigger: &str,
    ) -> anyhow::Result<SaleReport> {
        let _one = self.journal.running.lock().await;
        let result = self.run_sale_locked(sku, repair, trigger).await;
        let outcome = match &result {
            Ok(r) if r.ok => "ok",
            Ok(_) => "mismatch",
            Err(_) => "error",
        };
        metrics::counter!("flashsale_reconcile_runs_total", "result" => outcome).increment(1);
        result
    }

    async fn run_sale_locked(
        &self,
        sku: SkuId,
        repair: bool,
        trigger: &str,
    ) -> anyhow::Result<SaleReport> {
        let mut report = self.inspect(sku).await?;
        report.trigger = trigger.to_owned();
        report.repair = repair;
        if repair {
            let repairs = self.repair(sku, &report).await?;
            if !repairs.is_empty() {
                for r in &repairs {
                    let kind = r.split(':').next().unwrap_or("other").to_owned();
                    metrics::counter!("flashsale_reconcile_repairs_total", "kind" => kind)
                        .increment(1);
                }
                report.repairs = repairs;
                let mut after = self.inspect(sku).await?;
                after.trigger = trigger.to_owned();
                // Loss is found once the rebuild has moved the epoch on: report it here.
                report.lost_orders.extend(after.lost_orders.iter().cloned());
                report.journal_complete &= after.journal_complete;
                report.after = Some(Box::new(after));
            }
        }
        report.ok = report.ok && report.lost_orders.is_empty();
        self.export(&report);
        report.run_id = self.record(&report).await?;
        if !report.lost_orders.is_empty() {
            tracing::error!(%sku, lost = ?report.lost_orders, "accepted purchases lost with the hot ledger");
        }
        Ok(report)
    }

    /// Reads both sides and checks everything; changes nothing except the journal (entries
    /// the database holds are trimmed; lost ones are reported once and forgotten).
    pub async fn inspect(&self, sku: SkuId) -> anyhow::Result<SaleReport> {
        let at_ms = now_ms();
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
        let db = audit.sale.counters;
        let a = db.seq;
        let mut report = SaleReport {
            sku_id: sku.0,
            at_ms,
            state: sale.state.as_str().to_owned(),
            db,
            db_epoch: audit.sale.epoch,
            journal_complete: true,
            ..SaleReport::default()
        };
        report.violations = check_sale(sale, &db, &audit.orders, &audit.events, false).violations;

        let grace = self.config.hold_grace.as_millis() as i64;
        report.overdue_holds = audit
            .orders
            .iter()
            .filter(|o| {
                o.status == OrderStatus::Reserved
                    && o.deadline_ms > 0
                    && o.deadline_ms + grace < at_ms
            })
            .count();
        // The database never stores PENDING on the Redis path; one there is stale.
        let pending_in_db = audit
            .orders
            .iter()
            .filter(|o| o.status == OrderStatus::Pending)
            .count();

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
            Ok(Some(snap)) => {
                report.hot = Some(snap.counters);
                report.hot_epoch = Some(snap.epoch);
                for (id, why) in &snap.bad_entries {
                    report.findings.push(format!("stream entry {id}: {why}"));
                }
                let behind = snap.epoch < audit.sale.epoch || hot_now.is_none_or(|c| c.seq < a);
                if behind {
                    report.findings.push(format!(
                        "hot sale behind the database: epoch {} seq {} vs epoch {} applied_seq {a}",
                        snap.epoch,
                        hot_now.map_or(0, |c| c.seq),
                        audit.sale.epoch
                    ));
                    report.hot_behind = true;
                } else {
                    self.fold(&mut report, &snap, &audit.events, sale.mode, at_ms);
                }
            }
        }

        report.stale_pending += pending_in_db;

        // The journal: trim what the database holds, report what it never will.
        self.journal.trim(sku, audit.sale.epoch, a);
        let (older, complete) = self.journal.older_than(sku, audit.sale.epoch);
        report.journal_complete = complete;
        if !older.is_empty() {
            let held: std::collections::HashSet<&OrderNo> =
                audit.orders.iter().map(|o| &o.order_no).collect();
            let lost: Vec<OrderNo> = older
                .iter()
                .filter(|no| !held.contains(no))
                .cloned()
                .collect();
            report.lost_orders = lost.iter().map(|no| no.to_string()).collect();
            report.lost_orders.sort();
            if !lost.is_empty() {
                metrics::counter!("flashsale_reconcile_lost_orders_total", "sku" => sku.to_string())
                    .increment(lost.len() as u64);
            }
            self.journal.forget(sku, &older);
        }
        report.ok = report.violations.is_empty()
            && report.findings.is_empty()
            && !report.hot_behind
            && report.overdue_holds == 0
            && report.stale_pending == 0
            && report.diff.as_ref().is_some_and(Diff::is_zero)
            && report.lost_orders.is_empty();
        Ok(report)
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

    /// Idempotent repairs; returns what was done, one line each (`kind: detail`).
    async fn repair(&self, sku: SkuId, report: &SaleReport) -> anyhow::Result<Vec<String>> {
        let mut done = Vec::new();
        // 1. Events still in the stream the database lacks (a stuck or dead persister). The
        // worker leaves fresh ones to the persister; on demand, everything is replayed.
        let replay = report.trigger != "worker" || report.stale_pending > 0;
        if let (true, Ok(Some(snap))) = (replay, self.ledger.hot_snapshot(sku).await) {
            let a = self
                .store
                .sale(sku)
                .await?
                .ok_or(StoreError::SaleNotFound)?
                .counters
                .seq;
            let missing: Vec<Event> = snap.events.into_iter().filter(|e| e.seq > a).collect();
            if !missing.is_empty() {
                match self.store.apply_events(sku, &missing).await {
                    Ok(r) if r.applied > 0 => done.push(format!(
                        "replay: applied {} events ({} already there) from seq {}",
                        r.applied,
                        r.duplicates,
                        a + 1
                    )),
                    Ok(_) => {}
                    Err(StoreError::Gap { .. }) => {} // the persister moved on meanwhile
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // 2. Rebuild the hot sale when it is gone or behind.
        if report.hot_behind {
            done.push(self.rebuild(sku).await?);
        }
        // 3. Overdue holds.
        let stored = self
            .store
            .sale(sku)
            .await?
            .ok_or(StoreError::SaleNotFound)?;
        if stored.sale.mode == SaleMode::Reserve && stored.sale.state != SaleState::Scheduled {
            let mut expired = 0;
            for _ in 0..64 {
                let n = self.ledger.expire_due(sku, 1_024).await?;
                expired += n;
                if n < 1_024 {
                    break;
                }
            }
            if expired > 0 {
                done.push(format!("expire: {expired} overdue holds expired"));
            }
        }
        Ok(done)
    }

    /// Rebuilds the hot sale from the database in a new epoch: warm it paused (force), put
    /// back every order, then give it back its operator state.
    async fn rebuild(&self, sku: SkuId) -> anyhow::Result<String> {
        let epoch = self.store.bump_epoch(sku).await?;
        let stored = self
            .store
            .sale(sku)
            .await?
            .ok_or(StoreError::SaleNotFound)?;
        let state = stored.sale.state;
        let mut paused = stored.sale.clone();
        paused.state = SaleState::Paused;
        self.ledger
            .warm(&paused, &stored.counters, epoch, true)
            .await?;
        let orders = self.store.orders(sku).await?;
        let restored = self.ledger.restore_orders(sku, &orders).await?;
        self.ledger.set_state(sku, state).await?;
        tracing::warn!(%sku, epoch, restored, applied_seq = stored.counters.seq, "hot sale rebuilt from the database");
        Ok(format!(
            "rebuild: epoch {epoch}, counters at seq {}, {restored} orders restored, state {}",
            stored.counters.seq,
            state.as_str()
        ))
    }

    fn export(&self, report: &SaleReport) {
        let sku = report.sku_id.to_string();
        let last = report.after.as_deref().unwrap_or(report);
        let diff = last.diff.clone().unwrap_or_default();
        for (field, value) in diff.fields() {
            metrics::gauge!("flashsale_reconcile_diff", "sku" => sku.clone(), "field" => field)
                .set(value as f64);
        }
        metrics::gauge!("flashsale_reconcile_violations", "sku" => sku.clone())
            .set(last.violations.len() as f64);
        metrics::gauge!("flashsale_reconcile_hot_behind", "sku" => sku).set(if last.hot_behind {
            1.0
        } else {
            0.0
        });
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
            report: serde_json::to_string(report)?,
        };
        Ok(self.store.record_reconcile_run(&run).await?)
    }
}

/// Reconciles every sale every `interval` (repairing when `repair`).
pub struct ReconcileWorker {
    pub reconciler: Arc<Reconciler>,
    pub interval: Duration,
    pub repair: bool,
}

#[async_trait]
impl Worker for ReconcileWorker {
    fn name(&self) -> &'static str {
        "reconciler"
    }

    async fn run(self: Box<Self>, mut shutdown: broadcast::Receiver<()>) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.recv() => return Ok(()),
                _ = tick.tick() => {
                    if let Err(e) = self.reconciler.run(None, self.repair, "worker").await {
                        tracing::warn!(error = %e, "reconcile pass failed; will retry");
                    }
                }
            }
        }
    }
}

/// The reconcile worker as the environment sets it: `FLASHSALE_RECONCILE_INTERVAL_MS`
/// (default 5,000; 0 = no worker) and `FLASHSALE_RECONCILE_REPAIR` (default 1: repair).
pub fn worker_from_env(
    ledger: Arc<dyn HotLedger>,
    store: Arc<dyn OrderStore>,
    journal: Arc<Journal>,
) -> Option<Box<dyn Worker>> {
    let var = |name: &str| std::env::var(name).ok();
    let interval_ms: u64 = var("FLASHSALE_RECONCILE_INTERVAL_MS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let repair = var("FLASHSALE_RECONCILE_REPAIR").is_none_or(|v| v != "0" && v != "false");
    (interval_ms > 0).then(|| {
        Box::new(ReconcileWorker {
            reconciler: Arc::new(Reconciler::new(ledger, store, journal)),
            interval: Duration::from_millis(interval_ms),
            repair,
        }) as Box<dyn Worker>
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportQuery {
    pub sku: Option<u64>,
}

/// `GET /api/v1/admin/reconcile[?sku=N]`: a fresh run (no repairs) of every sale or one.
pub async fn report_route(
    State(st): State<AppState>,
    _: Admin,
    q: Result<Query<ReportQuery>, QueryRejection>,
) -> Result<Json<Vec<SaleReport>>, AppError> {
    let Query(q) = q?;
    let reconciler = Reconciler::from_state(&st);
    reconciler
        .run(q.sku.map(SkuId), false, "admin")
        .await
        .map(Json)
        .map_err(internal)
}

/// `POST /api/v1/admin/reconcile/{sku_id}/repair`: a run with repairs.
pub async fn repair_route(
    State(st): State<AppState>,
    _: Admin,
    p: Result<Path<u64>, PathRejection>,
) -> Result<Json<SaleReport>, AppError> {
    let sku = SkuId(crate::routes::path(p)?);
    if st.store.sale(sku).await?.is_none() {
        return Err(AppError::from_code(flashsale_core::ErrorCode::SaleNotFound));
    }
    let reconciler = Reconciler::from_state(&st);
    let report = reconciler
        .run_sale(sku, true, "admin")
        .await
        .map_err(internal)?;
    st.sold_out.clear(sku);
    st.sales.forget(sku);
    Ok(Json(report))
}

fn internal(e: anyhow::Error) -> AppError {
    match e.downcast::<LedgerError>() {
        Ok(l) => l.into(),
        Err(e) => match e.downcast::<StoreError>() {
            Ok(s) => s.into(),
            Err(e) => AppError::new(flashsale_core::ErrorCode::Unavailable, e.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no(epoch: u64, seq: u64) -> OrderNo {
        OrderNo::new(SkuId(7), epoch, seq)
    }

    #[test]
    fn the_journal_trims_what_the_database_holds_and_keeps_older_epochs_as_candidates() {
        let j = Journal::default();
        let sku = SkuId(7);
        j.record(sku, (1..=10).map(|s| no(1, s)));
        assert_eq!(epoch_seq(&no(3, 42)), Some((3, 42)));
        j.trim(sku, 1, 6);
        assert_eq!(j.len(sku), 4);
        // Rebuilt in epoch 2: the four above applied_seq are candidates for loss.
        j.record(sku, [no(2, 7)].into_iter());
        let (older, complete) = j.older_than(sku, 2);
        assert_eq!(older, (7..=10).map(|s| no(1, s)).collect::<Vec<_>>());
        assert!(complete);
        j.forget(sku, &older);
        assert_eq!(j.len(sku), 1);
        j.trim(sku, 2, 7);
        assert!(j.is_empty(sku));
    }

    #[test]
    fn diffs_name_every_field() {
        let hot = Counters {
            total: 10,
            available: 4,
            reserved: 1,
            sold: 5,
            seq: 7,
        };
        assert!(Diff::between(&hot, &hot).is_zero());
        let db = Counters {
            sold: 4,
            available: 5,
            ..hot
        };
        let d = Diff::between(&hot, &db);
        assert_eq!((d.available, d.sold, d.seq), (-1, 1, 0));
        assert!(!d.is_zero());
    }
}
