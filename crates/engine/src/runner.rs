//! One contract for every background worker and one runner for all of them.
//!
//! A [`Worker`] says what one step is ([`Worker::work`]) and what it waits for between steps
//! ([`Worker::wait_for_work`]: an interval's tick, a nudge, a feed); [`run`] owns the loop:
//! the wait races shutdown, a step is never cut short by it, a failed step is counted and
//! logged (with backoff: the 1st, 2nd, 4th, 8th… failure in a row, and the recovery), and
//! every step is counted (`flashsale_worker_ticks_total{worker}`,
//! `flashsale_worker_errors_total{worker}`). [`Runner`] starts workers (and other tasks, such
//! as a listener) and stops them together, each within [`STOP_MAX`].

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_core::metric_names::{WORKER_ERRORS, WORKER_TICKS};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};

/// What a worker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// Step again at once (shutdown is checked first).
    Busy,
    /// Wait for work ([`Worker::wait_for_work`]) or shutdown.
    Idle,
    /// The worker is finished.
    Done,
}

/// A long-running task of the service, stepped by [`run`].
#[async_trait]
pub trait Worker: Send + 'static {
    fn name(&self) -> &'static str;

    /// How the worker starts: `Busy` (the default) steps at once, `Idle` waits for work first.
    fn first_state(&self) -> WorkerState {
        WorkerState::Busy
    }

    /// One step. An error is logged and counted by the runner; the worker then waits for
    /// work as after an `Idle` step.
    async fn work(&mut self) -> anyhow::Result<WorkerState>;

    /// Waits until there is work (cancelled when shutdown fires).
    async fn wait_for_work(&mut self) -> WorkerState;

    /// Finishes at shutdown or after `Done` (e.g. stops and joins tasks the worker started).
    async fn stop(&mut self) {}
}

/// Steps `worker` until `shutdown` fires (or its sender is dropped) or the worker is done,
/// starting in its [`Worker::first_state`].
pub async fn run(
    mut worker: Box<dyn Worker>,
    mut shutdown: broadcast::Receiver<()>,
) -> anyhow::Result<()> {
    let name = worker.name();
    let mut failures: u32 = 0;
    let mut state = worker.first_state();
    loop {
        state = match state {
            WorkerState::Done => break,
            WorkerState::Busy if stopping(&mut shutdown) => break,
            WorkerState::Busy => {
                let result = worker.work().await;
                metrics::counter!(WORKER_TICKS, "worker" => name).increment(1);
                failures = log_step(name, &result, failures);
                result.unwrap_or(WorkerState::Idle)
            }
            WorkerState::Idle => tokio::select! {
                _ = shutdown.recv() => break,
                next = worker.wait_for_work() => next,
            },
        };
    }
    worker.stop().await;
    Ok(())
}

/// Shutdown fired or its sender is gone.
fn stopping(shutdown: &mut broadcast::Receiver<()>) -> bool {
    !matches!(
        shutdown.try_recv(),
        Err(broadcast::error::TryRecvError::Empty)
    )
}

/// Counts and logs a failed step; returns the failures in a row. Logs the 1st, 2nd, 4th, 8th…
/// failure in a row (a worker failing every tick while a backend is down writes a few lines,
/// not one per tick) and the first success after failures.
fn log_step(name: &'static str, result: &anyhow::Result<WorkerState>, failures: u32) -> u32 {
    match result {
        Ok(_) if failures > 0 => {
            tracing::info!(worker = name, failures, "worker works again");
            0
        }
        Ok(_) => 0,
        Err(e) => {
            metrics::counter!(WORKER_ERRORS, "worker" => name).increment(1);
            let failures = failures.saturating_add(1);
            if failures.is_power_of_two() {
                tracing::warn!(worker = name, failures, error = %e, "worker step failed; will retry");
            }
            failures
        }
    }
}

/// How long a stopping task may take to finish its current work (a persister batch, a drain
/// of in-flight requests) before shutdown reports it.
pub const STOP_MAX: Duration = Duration::from_secs(30);

/// Tasks stopped together by one broadcast, joined in the order they were started.
pub struct Runner {
    shutdown: broadcast::Sender<()>,
    handles: Vec<(&'static str, JoinHandle<anyhow::Result<()>>)>,
}

impl Default for Runner {
    fn default() -> Runner {
        Runner {
            shutdown: broadcast::channel(1).0,
            handles: Vec::new(),
        }
    }
}

impl Runner {
    /// Steps `worker` (see [`run`]) until [`Runner::stop`].
    pub fn spawn(&mut self, worker: Box<dyn Worker>) {
        let name = worker.name();
        let rx = self.shutdown.subscribe();
        self.handles.push((name, tokio::spawn(run(worker, rx))));
    }

    /// Runs a task that ends by itself once `stop` (a receiver of the broadcast) fires.
    pub fn spawn_task<F>(
        &mut self,
        name: &'static str,
        task: impl FnOnce(broadcast::Receiver<()>) -> F,
    ) where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let stop = self.shutdown.subscribe();
        self.handles.push((name, tokio::spawn(task(stop))));
    }

    /// Fires the broadcast and waits for every task, each for at most [`STOP_MAX`]; the first
    /// error (a failure, a panic, a task too slow to stop) is returned, named by its task.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(());
        let mut first_error = None;
        for (name, task) in self.handles.drain(..) {
            let error = match tokio::time::timeout(STOP_MAX, task).await {
                Ok(Ok(Ok(()))) => None,
                Ok(Ok(Err(e))) => Some(e.context(name)),
                Ok(Err(join)) => Some(anyhow::anyhow!("{name} panicked: {join}")),
                Err(_) => Some(anyhow::anyhow!("{name} did not stop in {STOP_MAX:?}")),
            };
            first_error = first_error.or(error);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// An interval that does not burst after a slow step (missed ticks are delayed).
pub fn every(period: Duration) -> Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick
}

/// The pace of a worker that steps once per period: its first wait starts the interval, so
/// the next step comes one period after the first (which the runner runs at once).
pub struct Pace {
    period: Duration,
    missed: MissedTickBehavior,
    tick: Option<Interval>,
}

impl Pace {
    /// Missed ticks are delayed (no burst after a slow step).
    pub fn new(period: Duration) -> Pace {
        Pace::with_missed(period, MissedTickBehavior::Delay)
    }

    pub fn with_missed(period: Duration, missed: MissedTickBehavior) -> Pace {
        Pace {
            period,
            missed,
            tick: None,
        }
    }

    /// Waits for the next tick.
    pub async fn tick(&mut self) {
        let tick = match &mut self.tick {
            Some(tick) => tick,
            None => {
                let mut tick = tokio::time::interval(self.period);
                tick.set_missed_tick_behavior(self.missed);
                // The first tick is at once: it stands for the step already run.
                tick.tick().await;
                self.tick.insert(tick)
            }
        };
        tick.tick().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// Fails every other step; done after `steps_max` steps.
    struct Counting {
        steps: Arc<AtomicU32>,
        stopped: Arc<AtomicU32>,
        steps_max: u32,
    }

    #[async_trait]
    impl Worker for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }

        async fn work(&mut self) -> anyhow::Result<WorkerState> {
            let n = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
            anyhow::ensure!(n.is_multiple_of(2), "odd step {n}");
            Ok(if n >= self.steps_max {
                WorkerState::Done
            } else {
                WorkerState::Busy
            })
        }

        async fn wait_for_work(&mut self) -> WorkerState {
            WorkerState::Busy
        }

        async fn stop(&mut self) {
            self.stopped.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn failed_steps_are_retried_and_done_stops_the_worker_once() {
        let (steps, stopped) = (Arc::default(), Arc::default());
        let worker = Counting {
            steps: Arc::clone(&steps),
            stopped: Arc::clone(&stopped),
            steps_max: 6,
        };
        let (tx, rx) = broadcast::channel(1);
        run(Box::new(worker), rx).await.unwrap();
        drop(tx);
        assert_eq!(steps.load(Ordering::SeqCst), 6);
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn shutdown_ends_an_idle_worker_and_the_runner_joins_it() {
        struct Waiting(Arc<AtomicU32>);
        #[async_trait]
        impl Worker for Waiting {
            fn name(&self) -> &'static str {
                "waiting"
            }
            async fn work(&mut self) -> anyhow::Result<WorkerState> {
                Ok(WorkerState::Idle)
            }
            async fn wait_for_work(&mut self) -> WorkerState {
                std::future::pending().await
            }
            async fn stop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let stopped = Arc::new(AtomicU32::new(0));
        let mut runner = Runner::default();
        runner.spawn(Box::new(Waiting(Arc::clone(&stopped))));
        runner.spawn_task("task", |mut stop| async move {
            let _ = stop.recv().await;
            Ok(())
        });
        let stop = tokio::time::timeout(Duration::from_secs(5), runner.stop()).await;
        stop.expect("stops in time").unwrap();
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    }
}
