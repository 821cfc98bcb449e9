//! The reconciler as a background worker: every sale, every interval (a large sale paced by
//! what its passes cost), and at once a sale a request found fenced or missing (a nudge).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use flashsale_core::SkuId;
use tokio::sync::mpsc;

use super::{Reconciler, Trigger};
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

/// At least how many times as long as a sale's last pass took its next worker pass waits. A
/// pass reads every order of the sale, so on a large sale under way it costs the machine much
/// each interval (about a second of CPU at 300,000 orders here, every 5 s: a fifth of a core,
/// growing with the sale). Paced so, the worker spends at most about a twenty-first of its time
/// on one sale; a small sale's passes still come every interval, and nudged or asked-for runs
/// are never held back.
pub const PASS_COST_FACTOR: u32 = 20;
/// Sales whose next pass is remembered; the memory is cleared when full (each then passes at
/// its next interval).
const PACED_SALES_MAX: usize = 4_096;

/// When each sale's next worker pass is due ([`PASS_COST_FACTOR`]).
#[derive(Debug, Default)]
pub struct Pacing {
    next: HashMap<SkuId, Instant>,
}

impl Pacing {
    /// Whether `sku` may pass at `now`: never passed, or its pause is over.
    pub fn due(&self, sku: SkuId, now: Instant) -> bool {
        self.next.get(&sku).is_none_or(|&at| now >= at)
    }

    /// `sku` passed, taking `took`, ending at `now`.
    pub fn passed(&mut self, sku: SkuId, took: Duration, now: Instant) {
        if self.next.len() >= PACED_SALES_MAX {
            self.next.clear();
        }
        self.next.insert(sku, now + took * PASS_COST_FACTOR);
    }
}

/// Reconciles every sale every `interval` (repairing when `repair`), a large sale paced by its
/// passes' cost ([`Pacing`]), and a nudged sale at once.
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
            let started = Instant::now();
            self.reconciler
                .run_or_report(sku, repair, Trigger::Worker)
                .await;
            self.pacing.passed(sku, started.elapsed(), Instant::now());
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

    #[test]
    fn a_sale_waits_the_factor_of_its_last_pass() {
        let mut pacing = Pacing::default();
        let (a, b) = (SkuId(1), SkuId(2));
        let t0 = Instant::now();
        assert!(pacing.due(a, t0), "never passed: due");
        pacing.passed(a, Duration::from_millis(100), t0);
        let pause = Duration::from_millis(100) * PASS_COST_FACTOR;
        assert!(!pacing.due(a, t0 + pause - Duration::from_millis(1)));
        assert!(pacing.due(a, t0 + pause));
        assert!(pacing.due(b, t0), "another sale is not held back");
    }

    #[test]
    fn the_memory_of_paced_sales_is_bounded() {
        let mut pacing = Pacing::default();
        let t0 = Instant::now();
        for sku in 0..(PACED_SALES_MAX as u64 * 2) {
            pacing.passed(SkuId(sku), Duration::from_secs(1), t0);
        }
        assert!(pacing.next.len() <= PACED_SALES_MAX);
    }
}
