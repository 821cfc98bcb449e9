//! Circuit breakers in front of the hot ledger, one per Redis Cluster slot: after
//! `failures_max` consecutive failures of a slot's sales, that slot's breaker opens for
//! `open_ms`, answering 503 at once instead of waiting on a dead node. After that, calls go
//! through again; one success closes it.
//!
//! One breaker per slot rather than one for the whole ledger: on a cluster, a primary that dies
//! takes only its own slots down, and sales on the other shards must go on undisturbed. On a
//! single Redis every slot fails together, so every sale's breaker opens on its own first
//! failures. The slot is that of the sale's hash tag `{<sku>}`, whatever the ledger.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::Instant;

use flashsale_core::SkuId;

/// Redis Cluster's slot count.
const SLOTS: usize = 16_384;

pub struct Breaker {
    /// Consecutive failures, per slot.
    failures: Box<[AtomicU32]>,
    /// Milliseconds since `epoch` until which a slot's breaker is open.
    open_until_ms: Box<[AtomicI64]>,
    /// Slots whose breaker opened and has not seen a success since (the gauge).
    open_slots: AtomicU32,
    epoch: Instant,
    failures_max: u32,
    open_ms: i64,
}

impl Breaker {
    pub fn new(failures_max: u32, open_ms: i64) -> Breaker {
        assert!(failures_max > 0 && open_ms > 0);
        Breaker {
            failures: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            open_until_ms: (0..SLOTS).map(|_| AtomicI64::new(0)).collect(),
            open_slots: AtomicU32::new(0),
            epoch: Instant::now(),
            failures_max,
            open_ms,
        }
    }

    fn now_ms(&self) -> i64 {
        self.epoch.elapsed().as_millis() as i64
    }

    fn slot(sku: SkuId) -> usize {
        flashsale_redis::keys::crc16(sku.0.to_string().as_bytes()) as usize % SLOTS
    }

    /// Whether a call for this sale may go to the ledger now.
    pub fn allows(&self, sku: SkuId) -> bool {
        self.now_ms() >= self.open_until_ms[Breaker::slot(sku)].load(Ordering::Relaxed)
    }

    /// Whether any slot's breaker is open (has not seen a success since it opened).
    pub fn any_open(&self) -> bool {
        self.open_slots.load(Ordering::Relaxed) > 0
    }

    pub fn success(&self, sku: SkuId) {
        let slot = Breaker::slot(sku);
        if self.failures[slot].load(Ordering::Relaxed) == 0 {
            return;
        }
        if self.failures[slot].swap(0, Ordering::Relaxed) >= self.failures_max {
            let before = self.open_slots.fetch_sub(1, Ordering::Relaxed);
            metrics::gauge!(flashsale_core::metric_names::BREAKER_OPEN).set(if before > 1 {
                1.0
            } else {
                0.0
            });
            tracing::info!(sku = sku.0, "hot ledger reachable again: breaker closed");
        }
    }

    pub fn failure(&self, sku: SkuId) {
        let slot = Breaker::slot(sku);
        let failures = self.failures[slot].fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.failures_max {
            self.open_until_ms[slot].store(self.now_ms() + self.open_ms, Ordering::Relaxed);
            if failures == self.failures_max {
                self.open_slots.fetch_add(1, Ordering::Relaxed);
                metrics::gauge!(flashsale_core::metric_names::BREAKER_OPEN).set(1.0);
                tracing::warn!(sku = sku.0, failures, "hot ledger failing: breaker open");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_closes_on_success() {
        let b = Breaker::new(3, 60_000);
        let sku = SkuId(7);
        b.failure(sku);
        b.failure(sku);
        assert!(b.allows(sku));
        b.failure(sku);
        assert!(!b.allows(sku) && b.any_open());
        b.success(sku);
        assert!(!b.any_open());
        b.open_until_ms[Breaker::slot(sku)].store(0, Ordering::Relaxed);
        assert!(b.allows(sku));
        b.failure(sku);
        assert!(b.allows(sku), "the count restarted after the success");
    }

    #[test]
    fn a_failing_slot_leaves_the_others_closed() {
        let b = Breaker::new(2, 60_000);
        let (down, up) = (SkuId(1), SkuId(2));
        assert_ne!(Breaker::slot(down), Breaker::slot(up));
        b.failure(down);
        b.failure(down);
        assert!(!b.allows(down));
        assert!(b.allows(up), "another slot's sales still go through");
    }
}
