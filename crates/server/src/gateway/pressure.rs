//! Per-sale gates: a concurrency limit on in-flight purchases (hot-sale isolation) and
//! back-pressure (BUSY while a sale's backlog is past its bound, with hysteresis).
//!
//! The request path reads one atomic flag and takes one semaphore permit; a background monitor
//! measures each active sale's backlog (Redis: hot `seq` − database `applied_seq`; every ledger:
//! requests queued in the batcher) and flips the flag, with a metric and a log line each way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use flashsale_core::{ErrorCode, SaleState, SkuId};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::AppError;

pub use flashsale_core::metric_names::{BACKPRESSURE, BACKPRESSURE_CHANGES, SALE_INFLIGHT_REFUSED};

/// Sales tracked at most (gates are made only for sales that exist).
const GATES_MAX: usize = 100_000;

pub struct SaleGate {
    pub sku: SkuId,
    inflight: Arc<Semaphore>,
    busy: AtomicBool,
    /// We paused the sale in the hot ledger (auto-pause) and must resume it.
    pub auto_paused: AtomicBool,
    /// Last measured backlog (events or queued requests).
    pub backlog: AtomicU64,
}

impl SaleGate {
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }
}

pub struct SaleGates {
    /// Looked up at every purchase: hashed with aHash.
    gates: RwLock<HashMap<SkuId, Arc<SaleGate>, ahash::RandomState>>,
    inflight_max: usize,
}

impl SaleGates {
    pub fn new(inflight_max: usize) -> SaleGates {
        SaleGates {
            gates: RwLock::default(),
            inflight_max: inflight_max.max(1),
        }
    }

    pub fn gate(&self, sku: SkuId) -> Arc<SaleGate> {
        if let Some(g) = self.gates.read().expect("gates lock").get(&sku) {
            return g.clone();
        }
        let mut gates = self.gates.write().expect("gates lock");
        if gates.len() >= GATES_MAX {
            gates.retain(|_, g| g.is_busy() || Arc::strong_count(g) > 1);
        }
        gates
            .entry(sku)
            .or_insert_with(|| {
                Arc::new(SaleGate {
                    sku,
                    inflight: Arc::new(Semaphore::new(self.inflight_max)),
                    busy: AtomicBool::new(false),
                    auto_paused: AtomicBool::new(false),
                    backlog: AtomicU64::new(0),
                })
            })
            .clone()
    }

    pub fn all(&self) -> Vec<Arc<SaleGate>> {
        self.gates
            .read()
            .expect("gates lock")
            .values()
            .cloned()
            .collect()
    }

    /// Admits one purchase of a sale: BUSY while back-pressure holds or when the sale already
    /// has `inflight_max` purchases in flight on this instance. Hold the permit until answered.
    pub fn admit(&self, sku: SkuId) -> Result<OwnedSemaphorePermit, AppError> {
        let gate = self.gate(sku);
        if gate.is_busy() {
            return Err(AppError::new(
                ErrorCode::Busy,
                "the sale's backlog is past its bound; retry shortly",
            ));
        }
        gate.inflight.clone().try_acquire_owned().map_err(|_| {
            metrics::counter!(SALE_INFLIGHT_REFUSED).increment(1);
            AppError::new(
                ErrorCode::Busy,
                "too many purchases of this sale in flight; retry shortly",
            )
        })
    }

    /// Sets a sale's back-pressure from its backlog: engages when the stream lag or the queue
    /// passes its bound (0 = no bound), lets go when both are at or below half of theirs.
    /// Returns the change, if any (`Some(true)`: engaged).
    pub fn observe(&self, gate: &SaleGate, lag: u64, queue: u64, b: Bounds) -> Option<bool> {
        gate.backlog.store(lag.max(queue), Ordering::Relaxed);
        let past = |v: u64, bound: u64| bound > 0 && v > bound;
        let below = |v: u64, bound: u64| bound == 0 || v <= bound / 2;
        let busy = gate.is_busy();
        let change = if !busy && (past(lag, b.lag) || past(queue, b.queue)) {
            Some(true)
        } else if busy && below(lag, b.lag) && below(queue, b.queue) {
            Some(false)
        } else {
            None
        };
        if let Some(on) = change {
            gate.busy.store(on, Ordering::Relaxed);
            let sku = gate.sku.0.to_string();
            metrics::gauge!(BACKPRESSURE, "sku" => sku.clone()).set(if on { 1.0 } else { 0.0 });
            let to = if on { "engaged" } else { "released" };
            metrics::counter!(BACKPRESSURE_CHANGES, "sku" => sku, "to" => to).increment(1);
            if on {
                tracing::warn!(
                    sku = gate.sku.0,
                    lag,
                    queue,
                    ?b,
                    "back-pressure engaged: purchases answer BUSY"
                );
            } else {
                tracing::info!(sku = gate.sku.0, lag, queue, ?b, "back-pressure released");
            }
        }
        change
    }
}

/// Back-pressure bounds: stream lag (events) and queued requests; 0 = no bound.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub lag: u64,
    pub queue: u64,
}

/// What the auto-pause does to a sale when back-pressure engages or lets go, as
/// `(from, to)`: it only ever moves a live sale to paused and back, never a sale an operator
/// paused or ended meanwhile.
pub fn auto_transition(engaged: bool) -> (SaleState, SaleState) {
    if engaged {
        (SaleState::Live, SaleState::Paused)
    } else {
        (SaleState::Paused, SaleState::Live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_engages_above_the_bound_and_lets_go_at_half() {
        let gates = SaleGates::new(2);
        let g = gates.gate(SkuId(1));
        let b = Bounds { lag: 10, queue: 0 };
        assert_eq!(gates.observe(&g, 10, 1_000, b), None);
        assert_eq!(gates.observe(&g, 11, 0, b), Some(true));
        assert_eq!(gates.admit(SkuId(1)).unwrap_err().code, ErrorCode::Busy);
        assert_eq!(gates.observe(&g, 6, 0, b), None, "hysteresis");
        assert_eq!(gates.observe(&g, 5, 0, b), Some(false));
        let q = Bounds { lag: 0, queue: 4 };
        assert_eq!(gates.observe(&g, 1_000, 5, q), Some(true));
        assert_eq!(gates.observe(&g, 1_000, 2, q), Some(false));
        let a = gates.admit(SkuId(1)).unwrap();
        let _b = gates.admit(SkuId(1)).unwrap();
        assert_eq!(gates.admit(SkuId(1)).unwrap_err().code, ErrorCode::Busy);
        assert!(gates.admit(SkuId(2)).is_ok(), "another sale is not starved");
        drop(a);
        assert!(gates.admit(SkuId(1)).is_ok());
    }
}
