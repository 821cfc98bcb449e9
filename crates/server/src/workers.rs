//! The server's own workers over the shared state: the gateway's periodic work (the blacklist
//! reload, the rate limiters' sweep and the back-pressure monitor with its auto-pause), and
//! the dashboard's history sampler.

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

/// Samples every sale the dashboard shows once a second into the dashboard's history
/// (`dashboard::history`), so the series of a sale reach back to its start whenever a page is
/// opened. Holds the state weakly, like the gateway's worker.
pub struct HistoryWorker {
    state: Weak<Shared>,
    pace: flashsale_engine::runner::Pace,
}

/// Between two samples of the dashboard's history.
pub const HISTORY_EVERY: Duration = Duration::from_secs(1);

impl HistoryWorker {
    pub fn new(state: &AppState, every: Duration) -> HistoryWorker {
        HistoryWorker {
            state: Arc::downgrade(state.shared()),
            pace: flashsale_engine::runner::Pace::new(every),
        }
    }
}

#[async_trait::async_trait]
impl Worker for HistoryWorker {
    fn name(&self) -> &'static str {
        "dashboard_history"
    }

    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        let Some(st) = self.state.upgrade() else {
            return Ok(WorkerState::Done);
        };
        sample_all(&st).await?;
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        self.pace.tick().await;
        WorkerState::Busy
    }
}

/// Sales sampled at most per pass (as many as the dashboard shows).
const SAMPLED_MAX: usize = 50;

/// One sample of every sale that is running: live or paused, or a queue or draw sale whose
/// queue or entries opened before its start.
async fn sample_all(st: &Shared) -> anyhow::Result<()> {
    use flashsale_core::{AdmissionMode, SaleState};
    let now = flashsale_core::clock::now_ms();
    let running = |s: &flashsale_core::Sale| match s.state {
        SaleState::Live | SaleState::Paused => true,
        SaleState::Scheduled => {
            s.admission.mode != AdmissionMode::Open && now >= s.admission.admission_opens_at_ms
        }
        SaleState::Ended => false,
    };
    let sales = st.shop.sales().await?;
    for stored in sales.iter().filter(|s| running(&s.sale)).take(SAMPLED_MAX) {
        let point = sample(st, stored, now).await;
        st.dashboard.history.record(stored.sale.sku_id, point);
    }
    Ok(())
}

/// One sale's point: its counters (the hot ledger's when it has them), its backlog, the last
/// complete second of its answers, and its admission.
async fn sample(
    st: &Shared,
    stored: &flashsale_core::ledger::StoredSale,
    now_ms: i64,
) -> crate::dashboard::history::Point {
    use crate::dashboard::history::Point;
    let sku = stored.sale.sku_id;
    let c = st.shop.stock_now(stored).await;
    let gate = st.gateway.gates.all().into_iter().find(|g| g.sku == sku);
    let t = (now_ms / 1000) as u64;
    // Every complete second since the previous sample (a late sample skips none).
    let since = st
        .dashboard
        .history
        .last(sku)
        .map_or(1, |p| t.saturating_sub(p.t));
    let seconds = since.clamp(1, crate::dashboard::live::WINDOW_S / 2);
    let a = st.dashboard.live.series(sku, seconds);
    let mean = |xs: &[u32]| xs.iter().map(|&n| f64::from(n)).sum::<f64>() / seconds as f64;
    let high = |xs: &[Option<f64>]| xs.iter().flatten().copied().reduce(f64::max);
    let (queue, draw_position) = admission_point(st, stored, t).await;
    Point {
        t,
        available: c.available,
        reserved: c.reserved,
        sold: c.sold,
        backlog: gate.map_or(0, |g| g.backlog.load(std::sync::atomic::Ordering::Relaxed)),
        accepted: mean(&a.accepted),
        sold_out: mean(&a.sold_out),
        rejected: mean(&a.rejected),
        p50_ms: high(&a.p50_ms),
        p99_ms: high(&a.p99_ms),
        queue,
        draw_position,
    }
}

/// A queue sale's counts with its admission rate since the previous sample and the ETA of
/// its last waiting place; a draw sale's waitlist position.
async fn admission_point(
    st: &Shared,
    stored: &flashsale_core::ledger::StoredSale,
    t: u64,
) -> (Option<crate::dashboard::history::QueuePoint>, Option<u64>) {
    use flashsale_core::AdmissionMode;
    let sku = stored.sale.sku_id;
    match stored.sale.admission.mode {
        AdmissionMode::Open => (None, None),
        AdmissionMode::Draw => (None, st.shop.draw_position(sku).await),
        AdmissionMode::Queue => {
            let Some(counts) = st.shop.queue_counts(stored).await else {
                return (None, None);
            };
            let before = st.dashboard.history.last(sku);
            let rate = match before.and_then(|p| p.queue.map(|q| (p.t, q.admitted))) {
                Some((t0, a0)) if t > t0 => {
                    counts.cursor.saturating_sub(a0) as f64 / (t - t0) as f64
                }
                _ => 0.0,
            };
            let mut q = crate::dashboard::history::QueuePoint {
                queue_length: counts.queued(),
                admitted: counts.cursor,
                bought: counts.bought,
                admission_rate: rate,
                eta_s: None,
            };
            q.eta_s = (rate > 0.0).then(|| q.waiting() as f64 / rate);
            (Some(q), None)
        }
    }
}
