//! The reconciler as a background worker: every sale, every interval.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::{Reconciler, Trigger};
use crate::workers::Worker;

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

/// Reconciles every sale every `interval` (repairing when `repair`).
pub struct ReconcileWorker {
    pub reconciler: Arc<Reconciler>,
    pub settings: WorkerSettings,
}

impl ReconcileWorker {
    /// `None` when the settings turn the worker off.
    pub fn boxed(reconciler: Reconciler, settings: WorkerSettings) -> Option<Box<dyn Worker>> {
        (!settings.interval.is_zero()).then(|| {
            Box::new(ReconcileWorker {
                reconciler: Arc::new(reconciler),
                settings,
            }) as Box<dyn Worker>
        })
    }
}

#[async_trait]
impl Worker for ReconcileWorker {
    fn name(&self) -> &'static str {
        "reconciler"
    }

    async fn run(self: Box<Self>, mut shutdown: broadcast::Receiver<()>) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.recv() => return Ok(()),
                _ = tick.tick() => {
                    let repair = self.settings.repair;
                    if let Err(e) = self.reconciler.run(None, repair, Trigger::Worker).await {
                        tracing::warn!(error = %e, "reconcile pass failed; will retry");
                    }
                }
            }
        }
    }
}
