//! The server's own worker over the shared state: the gateway's periodic work (the blacklist
//! reload, the rate limiters' sweep and the back-pressure monitor with its auto-pause).

use std::sync::{Arc, Weak};
use std::time::Duration;

use flashsale_core::SkuId;

use flashsale_engine::runner::{every, Worker, WorkerState};
use tokio::time::Interval;

use crate::gateway::pressure::{self, Bounds};
use crate::state::{AppState, Shared};

/// The gateway's periodic work as one worker, stopped and joined with the others at
/// shutdown: the blacklist reload, the rate limiters' sweep and the back-pressure monitor.
/// It holds the state weakly: a state dropped without a shutdown ends it too.
pub struct GatewayWorker {
    state: Weak<Shared>,
    /// The three tickers, started by the first step (from the gateway's settings).
    ticks: Option<Ticks>,
    /// The job whose ticker fired last.
    due: Option<Job>,
}

struct Ticks {
    refresh: Interval,
    sweep: Interval,
    monitor: Interval,
}

#[derive(Clone, Copy)]
enum Job {
    Refresh,
    Sweep,
    Monitor,
}

impl GatewayWorker {
    pub fn new(state: &AppState) -> GatewayWorker {
        GatewayWorker {
            state: Arc::downgrade(state.shared()),
            ticks: None,
            due: None,
        }
    }
}

/// The shortest period of a gateway ticker, whatever the settings say.
const TICK_MIN: Duration = Duration::from_millis(10);

#[async_trait::async_trait]
impl Worker for GatewayWorker {
    fn name(&self) -> &'static str {
        "gateway"
    }

    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        let Some(st) = self.state.upgrade() else {
            return Ok(WorkerState::Done);
        };
        let c = &st.gateway.config;
        self.ticks.get_or_insert_with(|| Ticks {
            refresh: every(c.blacklist_refresh.max(TICK_MIN)),
            sweep: every(c.limiter_sweep.max(TICK_MIN)),
            monitor: every(c.backpressure_interval.max(TICK_MIN)),
        });
        match self.due.take() {
            Some(Job::Refresh) => refresh_blacklist(&st).await,
            Some(Job::Sweep) => st.gateway.rates.sweep(),
            Some(Job::Monitor) => monitor(&st).await,
            None => {}
        }
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        let Some(t) = self.ticks.as_mut() else {
            return WorkerState::Done;
        };
        let job = tokio::select! {
            _ = t.refresh.tick() => Job::Refresh,
            _ = t.sweep.tick() => Job::Sweep,
            _ = t.monitor.tick() => Job::Monitor,
        };
        self.due = Some(job);
        WorkerState::Busy
    }
}

async fn refresh_blacklist(st: &Shared) {
    use std::sync::atomic::Ordering;
    let failing = &st.gateway.blacklist.failing;
    match st.gateway.blacklist.refresh().await {
        // One line per change, not one per tick while the store is down.
        Err(e) if !failing.swap(true, Ordering::Relaxed) => {
            tracing::warn!(error = %e, "blacklist refresh failed; keeping the last copy")
        }
        Ok(()) if failing.swap(false, Ordering::Relaxed) => {
            tracing::info!("blacklist refresh works again")
        }
        _ => {}
    }
}

/// One back-pressure pass over every sale this instance has seen purchases for.
async fn monitor(st: &Shared) {
    let c = &st.gateway.config;
    let bounds = Bounds {
        lag: c.backpressure_lag,
        queue: c.backpressure_queue,
    };
    for gate in st.gateway.gates.all() {
        let sku = gate.sku;
        let queue = st.shop.queue_depth(sku) as u64;
        let lag = if bounds.lag > 0 && st.shop.streams() {
            st.shop
                .stream_lag(sku)
                .await
                .unwrap_or(gate.backlog.load(std::sync::atomic::Ordering::Relaxed))
        } else {
            0
        };
        let change = st.gateway.gates.observe(&gate, lag, queue, bounds);
        if let (Some(engaged), true) = (change, c.backpressure_auto_pause) {
            auto_pause(st, &gate, engaged).await;
        }
    }
}

async fn auto_pause(st: &Shared, gate: &pressure::SaleGate, engaged: bool) {
    use std::sync::atomic::Ordering;
    if !engaged && !gate.auto_paused.load(Ordering::Relaxed) {
        return;
    }
    let (from, to) = pressure::auto_transition(engaged);
    if !engaged && !operator_left_it_live(st, gate.sku).await {
        // An operator paused or ended the sale while it was auto-paused: theirs now.
        gate.auto_paused.store(false, Ordering::Relaxed);
        return;
    }
    match st.shop.set_hot_state_if(gate.sku, from, to).await {
        Ok(changed) => {
            gate.auto_paused
                .store(engaged && changed, Ordering::Relaxed);
            tracing::warn!(sku = gate.sku.0, ?to, changed, "back-pressure auto-pause");
        }
        Err(e) => tracing::warn!(sku = gate.sku.0, error = %e, "auto-pause failed"),
    }
}

/// The operator's state in the database is still `live` (the hot copy's state is the one
/// the auto-pause changed).
async fn operator_left_it_live(st: &Shared, sku: SkuId) -> bool {
    st.shop.stored_state(sku).await == Some(flashsale_core::SaleState::Live)
}
