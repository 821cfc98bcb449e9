//! A run's checks of one sale: the hot snapshot and the database's audit read, compared
//! field by field with in-flight events folded out, losses and overdue holds found.

use std::collections::BTreeSet;

use flashsale_core::invariants::{check_bucketed_sale, check_sale};
use flashsale_core::{
    Counters, Event, EventKind, HotSnapshot, LedgerError, OrderStatus, SaleMode, SaleState, SkuId,
    StoreError,
};

use flashsale_core::clock::now_ms;

use super::diff::Diff;
use super::report::SaleReport;
use super::Reconciler;
use super::{buckets, rebuild};

/// Most reads of a bucketed sale's hot units for two in a row that agree.
const HOT_UNITS_READS: usize = 5;

/// Most fenced events one run reports (the rest in the next runs).
const FENCED_PER_RUN_MAX: usize = 10_000;

impl Reconciler {
    /// Adds the events the database's epoch fence refused and no run reported yet; returns
    /// their `(epoch, seq)` to mark once the run is stored.
    pub(super) async fn fenced_losses(
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
    pub(super) async fn inspect_buckets(
        &self,
        sku: SkuId,
        n: u16,
        at_ms: i64,
    ) -> anyhow::Result<SaleReport> {
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
    pub(super) async fn check_hot_units(
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
    pub(super) fn db_report(
        &self,
        sku: SkuId,
        audit: &flashsale_core::SaleAudit,
        at_ms: i64,
    ) -> SaleReport {
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
    pub(super) fn conclude(
        &self,
        mut report: SaleReport,
        audit: &flashsale_core::SaleAudit,
    ) -> SaleReport {
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

    pub(super) fn overdue_holds(&self, orders: &[flashsale_core::HotOrder], at_ms: i64) -> usize {
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
    pub(super) fn compare(
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
    pub(super) fn settle_journal(
        &self,
        report: &mut SaleReport,
        audit: &flashsale_core::SaleAudit,
    ) {
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
    pub(super) fn fold(
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
}
