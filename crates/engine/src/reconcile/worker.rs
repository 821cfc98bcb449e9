//! The reconciler as a background worker: every sale, every interval (a large healthy sale
//! paced by its size), and at once a sale a request found fenced or missing (a nudge).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use flashsale_core::SkuId;
use tokio::sync::mpsc;

use super::{Reconciler, SaleReport, Trigger};
use crate::runner::{Pace, Worker, WorkerState};

/// How the reconcile worker of a process runs (the CLI's `FLASHSALE_RECONCILE_*` settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Between passes; zero = no reconcile worker in this process.
    pub interval: Duration,
    /// Whether passes repair (replay, rebuild, expire) or only report.
    pub repair: bool,
}

/// Default pass interval.
pub const INTERVAL_DEFAULT: Duration = Duration::from_secs(5);

impl Default for WorkerSettings {
    fn default() -> WorkerSettings {
        WorkerSettings {
            interval: INTERVAL_DEFAULT,
            repair: true,
        }
    }
}

/// Nudges queued at most; more are dropped (the next pass covers them).
const NUDGES_MAX: usize = 64;
/// A sale nudged again within this long is not reconciled again (a rebuild is under way).
const NUDGE_GAP: Duration = Duration::from_millis(200);
/// Sales remembered for [`NUDGE_GAP`]; the memory is cleared when it is full.
const NUDGED_SALES_MAX: usize = 1_024;

/// Sales whose hot copy a request found fenced or missing. After a failover the promoted
/// replica's copy fences itself on its first write (it may lack acknowledged purchases); a
/// nudge has the reconcile worker rebuild it now instead of at its next pass.
pub struct Nudges {
    tx: mpsc::Sender<SkuId>,
    rx: Mutex<Option<mpsc::Receiver<SkuId>>>,
}

impl Default for Nudges {
    fn default() -> Nudges {
        let (tx, rx) = mpsc::channel(NUDGES_MAX);
        Nudges {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }
}

impl Nudges {
    /// Never waits: when the queue is full the sale is left to the next pass.
    pub fn nudge(&self, sku: SkuId) {
        let _ = self.tx.try_send(sku);
    }

    /// The receiving end, for the one reconcile worker of the process.
    pub fn take(&self) -> Option<mpsc::Receiver<SkuId>> {
        self.rx.lock().expect("nudges lock").take()
    }
}

/// How long a healthy sale's next worker pass waits, at least, per event of the sale (its
/// `seq`). A pass reads every order of the sale, so on a large sale under way it costs the
/// machine much every interval (about 7 µs of CPU per order here: a second at 137,000 orders,
/// every 5 s). At 100 µs per event a pass takes at most about a fifteenth of a core: a sale of
/// 10,000 events still passes every interval, one of 300,000 every 30 s. Measured in events,
/// not in the time a pass took: a pass is slow in a partition too, and that is when its
/// repairs must not wait.
pub const PAUSE_PER_EVENT: Duration = Duration::from_micros(100);
/// The longest pause, whatever the sale's size.
pub const PAUSE_MAX: Duration = Duration::from_secs(300);
/// Sales whose next pass is remembered; the memory is cleared when full (each then passes at
/// its next interval).
const PACED_SALES_MAX: usize = 4_096;

/// When each healthy sale's next worker pass is due ([`PAUSE_PER_EVENT`]). A sale whose pass
/// found anything (a mismatch, a repair, a copy behind, a failed run) is not paused.
#[derive(Debug, Default)]
pub struct Pacing {
    next: HashMap<SkuId, Instant>,
}

impl Pacing {
    /// Whether `sku` may pass at `now`: not paused, or its pause is over.
    pub fn due(&self, sku: SkuId, now: Instant) -> bool {
        self.next.get(&sku).is_none_or(|&at| now >= at)
    }

    /// `sku` passed at `now` with `report`.
    pub fn passed(&mut self, sku: SkuId, report: &SaleReport, now: Instant) {
        if !healthy(report) {
            self.next.remove(&sku);
            return;
        }
        if self.next.len() >= PACED_SALES_MAX {
            self.next.clear();
        }
        let events = u32::try_from(report.db.seq).unwrap_or(u32::MAX);
        let pause = PAUSE_PER_EVENT.saturating_mul(events).min(PAUSE_MAX);
        self.next.insert(sku, now + pause);
    }
}

/// A pass that found nothing to do: everything it checked agreed.
fn healthy(r: &SaleReport) -> bool {
    r.ok && r.repairs.is_empty() && !r.hot_behind && r.buckets_behind.is_empty()
}

/// Reconciles every sale every `interval` (repairing when `repair`), a large sale paced by its
/// size ([`Pacing`]), and a nudged sale at once.
pub struct ReconcileWorker {
    pub reconciler: Arc<Reconciler>,
    pub settings: WorkerSettings,
    nudges: Option<mpsc::Receiver<SkuId>>,
    /// When each sale was last nudged (a nudge within [`NUDGE_GAP`] is dropped).
    nudged: HashMap<SkuId, Instant>,
    /// What the next step reconciles: every sale (`None`) or a nudged one.
    next: Option<Option<SkuId>>,
    pace: Pace,
    pacing: Pacing,
}

impl ReconcileWorker {
    /// `None` when the settings turn the worker off.
    pub fn boxed(
        reconciler: Reconciler,
        settings: WorkerSettings,
        nudges: Option<mpsc::Receiver<SkuId>>,
    ) -> Option<Box<dyn Worker>> {
        (!settings.interval.is_zero()).then(|| {
            Box::new(ReconcileWorker {
                reconciler: Arc::new(reconciler),
                settings,
                nudges,
                nudged: HashMap::new(),
                next: None,
                pace: Pace::new(settings.interval),
                pacing: Pacing::default(),
            }) as Box<dyn Worker>
        })
    }

    /// Whether a nudge of `sku` is to be followed (not one within [`NUDGE_GAP`]).
    fn follow(&mut self, sku: SkuId) -> bool {
        if self
            .nudged
            .get(&sku)
            .is_some_and(|at| at.elapsed() < NUDGE_GAP)
        {
            return false;
        }
        if self.nudged.len() >= NUDGED_SALES_MAX {
            self.nudged.clear();
        }
        true
    }
}

/// The next nudge, or never when there is no nudge channel (or it closed).
async fn next_nudge(rx: &mut Option<mpsc::Receiver<SkuId>>) -> SkuId {
    match rx {
        Some(rx) => match rx.recv().await {
            Some(sku) => sku,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

#[async_trait]
impl Worker for ReconcileWorker {
    fn name(&self) -> &'static str {
        "reconciler"
    }

    /// The first pass is one interval after start.
    fn first_state(&self) -> WorkerState {
        WorkerState::Idle
    }

    /// A pass over every sale that is due, or over a nudged one.
    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        let Some(next) = self.next.take() else {
            return Ok(WorkerState::Idle);
        };
        let repair = self.settings.repair;
        if let Some(sku) = next {
            let result = self.reconciler.run(Some(sku), repair, Trigger::Nudge).await;
            self.nudged.insert(sku, Instant::now());
            result?;
            return Ok(WorkerState::Idle);
        }
        for sku in self.reconciler.open_sales().await? {
            if !self.pacing.due(sku, Instant::now()) {
                continue;
            }
            let report = self
                .reconciler
                .run_or_report(sku, repair, Trigger::Worker)
                .await;
            self.pacing.passed(sku, &report, Instant::now());
        }
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        loop {
            tokio::select! {
                _ = self.pace.tick() => {
                    self.next = Some(None);
                    return WorkerState::Busy;
                }
                sku = next_nudge(&mut self.nudges) => if self.follow(sku) {
                    self.next = Some(Some(sku));
                    return WorkerState::Busy;
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(seq: u64, ok: bool) -> SaleReport {
        let db = flashsale_core::Counters {
            seq,
            ..Default::default()
        };
        SaleReport {
            ok,
            db,
            ..SaleReport::default()
        }
    }

    #[test]
    fn a_healthy_sale_waits_by_its_events() {
        let mut pacing = Pacing::default();
        let (a, b) = (SkuId(1), SkuId(2));
        let t0 = Instant::now();
        assert!(pacing.due(a, t0), "never passed: due");
        pacing.passed(a, &report(1_000, true), t0);
        let pause = PAUSE_PER_EVENT * 1_000;
        assert!(!pacing.due(a, t0 + pause - Duration::from_millis(1)));
        assert!(pacing.due(a, t0 + pause));
        assert!(pacing.due(b, t0), "another sale is not held back");
        pacing.passed(b, &report(u64::MAX, true), t0);
        assert!(pacing.due(b, t0 + PAUSE_MAX), "the pause is bounded");
    }

    #[test]
    fn a_sale_with_findings_is_not_paused() {
        let mut pacing = Pacing::default();
        let sku = SkuId(1);
        let t0 = Instant::now();
        pacing.passed(sku, &report(1_000_000, true), t0);
        assert!(!pacing.due(sku, t0));
        let mut behind = report(1_000_000, true);
        behind.hot_behind = true;
        pacing.passed(sku, &behind, t0);
        assert!(
            pacing.due(sku, t0),
            "a copy behind passes again at the next interval"
        );
        pacing.passed(sku, &report(1_000_000, false), t0);
        assert!(
            pacing.due(sku, t0),
            "a mismatch passes again at the next interval"
        );
    }

    #[test]
    fn the_memory_of_paced_sales_is_bounded() {
        let mut pacing = Pacing::default();
        let t0 = Instant::now();
        for sku in 0..(PACED_SALES_MAX as u64 * 2) {
            pacing.passed(SkuId(sku), &report(1_000, true), t0);
        }
        assert!(pacing.next.len() <= PACED_SALES_MAX);
    }
}
