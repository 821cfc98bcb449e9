//! The gateway's periodic work as one worker: the blacklist reload, the rate limiters' sweep
//! and the back-pressure monitor (with its auto-pause).

use std::sync::{Arc, Weak};
use std::time::Duration;

use flashsale_core::SkuId;

use super::pressure::{self, Bounds};
use crate::state::{AppState, Shared};
use flashsale_engine::workers::Worker;

/// The gateway's periodic work as one worker, stopped and joined with the others at
/// shutdown: the blacklist reload, the rate limiters' sweep and the back-pressure monitor.
/// It holds the state weakly: a state dropped without a shutdown ends it too.
pub struct GatewayWorker {
    state: Weak<Shared>,
}

impl GatewayWorker {
    pub fn new(state: &AppState) -> GatewayWorker {
        GatewayWorker {
            state: Arc::downgrade(state.shared()),
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

    async fn run(
        self: Box<Self>,
        mut shutdown: tokio::sync::broadcast::Receiver<()>,
    ) -> anyhow::Result<()> {
        let Some(c) = self.state.upgrade().map(|st| st.gateway.config.clone()) else {
            return Ok(());
        };
        let every = |d: Duration| {
            let mut tick = tokio::time::interval(d.max(TICK_MIN));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        };
        let (mut refresh, mut sweep, mut monitor_tick) = (
            every(c.blacklist_refresh),
            every(c.limiter_sweep),
            every(c.backpressure_interval),
        );
        loop {
            tokio::select! {
                _ = shutdown.recv() => return Ok(()),
                _ = refresh.tick() => match self.state.upgrade() {
                    Some(st) => refresh_blacklist(&st).await,
                    None => return Ok(()),
                },
                _ = sweep.tick() => match self.state.upgrade() {
                    Some(st) => st.gateway.rates.sweep(),
                    None => return Ok(()),
                },
                _ = monitor_tick.tick() => match self.state.upgrade() {
                    Some(st) => monitor(&st).await,
                    None => return Ok(()),
                },
            }
        }
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
        let queue = st.batcher.queue_depth(sku) as u64;
        let streamed = st.ledger.durability() == flashsale_core::Durability::Streamed;
        let lag = if bounds.lag > 0 && streamed {
            stream_lag(st, sku)
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

/// Hot `seq` minus the database's `applied_seq`: events accepted but not yet persisted.
async fn stream_lag(st: &Shared, sku: SkuId) -> Option<u64> {
    let hot = st.ledger.counters(sku).await.ok()??;
    let stored = st.store.sale(sku).await.ok()??;
    Some(hot.seq.saturating_sub(stored.counters.seq))
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
    match st.ledger.set_state_if(gate.sku, from, to).await {
        Ok(changed) => {
            gate.auto_paused
                .store(engaged && changed, Ordering::Relaxed);
            st.sales.forget(gate.sku);
            tracing::warn!(sku = gate.sku.0, ?to, changed, "back-pressure auto-pause");
        }
        Err(e) => tracing::warn!(sku = gate.sku.0, error = %e, "auto-pause failed"),
    }
}

/// The operator's state in the database is still `live` (the hot copy's state is the one
/// the auto-pause changed).
async fn operator_left_it_live(st: &Shared, sku: SkuId) -> bool {
    matches!(st.store.sale(sku).await, Ok(Some(s)) if s.sale.state == flashsale_core::SaleState::Live)
}
