//! A circuit breaker in front of the hot ledger: after `failures_max` consecutive failures it
//! opens for `open_ms`, answering 503 at once instead of waiting on a dead Redis. After that,
//! calls go through again; one success closes it.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::Instant;

pub struct Breaker {
    failures: AtomicU32,
    /// Milliseconds since `epoch` until which the breaker is open.
    open_until_ms: AtomicI64,
    epoch: Instant,
    failures_max: u32,
    open_ms: i64,
}

impl Breaker {
    pub fn new(failures_max: u32, open_ms: i64) -> Breaker {
        assert!(failures_max > 0 && open_ms > 0);
        Breaker {
            failures: AtomicU32::new(0),
            open_until_ms: AtomicI64::new(0),
            epoch: Instant::now(),
            failures_max,
            open_ms,
        }
    }

    fn now_ms(&self) -> i64 {
        self.epoch.elapsed().as_millis() as i64
    }

    /// Whether a call may go to the ledger now.
    pub fn allows(&self) -> bool {
        self.now_ms() >= self.open_until_ms.load(Ordering::Relaxed)
    }

    pub fn success(&self) {
        if self.failures.swap(0, Ordering::Relaxed) >= self.failures_max {
            metrics::gauge!(crate::metrics::BREAKER_OPEN).set(0.0);
            tracing::info!("hot ledger reachable again: breaker closed");
        }
    }

    pub fn failure(&self) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.failures_max {
            self.open_until_ms
                .store(self.now_ms() + self.open_ms, Ordering::Relaxed);
            if failures == self.failures_max {
                metrics::gauge!(crate::metrics::BREAKER_OPEN).set(1.0);
                tracing::warn!(failures, "hot ledger failing: breaker open");
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
        b.failure();
        b.failure();
        assert!(b.allows());
        b.failure();
        assert!(!b.allows());
        b.success();
        b.open_until_ms.store(0, Ordering::Relaxed);
        assert!(b.allows());
        b.failure();
        assert!(b.allows(), "the count restarted after the success");
    }
}
