//! The breaker in front of the risk service: after `failures_max` consecutive timeouts or
//! errors it opens for `open_for`, and checks skip the service (the fallback decides). Then
//! one call at a time probes it; a probe's success closes the breaker, its failure opens it
//! again.
//!
//! The idea of `flashsale_engine::breaker`, not its code: that one keeps a breaker per Redis Cluster slot
//! and lets every call through once the open time is over, which suits a sharded ledger that
//! answers in microseconds. The risk service is one downstream, and a call to a dead one costs
//! a whole timeout, so here there is one circuit and a single probe: a dead service costs one
//! timeout per open period, not one per purchase.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use flashsale_core::metric_names::RISK_BREAKER_OPEN;

pub struct Circuit {
    failures: AtomicU32,
    /// Milliseconds since `epoch` until which the breaker is open; 0 while closed.
    open_until_ms: AtomicI64,
    /// A probe is under way (only while open and past `open_until_ms`).
    probing: AtomicBool,
    epoch: Instant,
    failures_max: u32,
    open_ms: i64,
}

/// May this call go to the service? A probe must report back (success or failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Closed,
    Probe,
    Open,
}

impl Circuit {
    pub fn new(failures_max: u32, open_for: Duration) -> Circuit {
        Circuit {
            failures: AtomicU32::new(0),
            open_until_ms: AtomicI64::new(0),
            probing: AtomicBool::new(false),
            epoch: Instant::now(),
            failures_max: failures_max.max(1),
            open_ms: (open_for.as_millis() as i64).max(1),
        }
    }

    fn now_ms(&self) -> i64 {
        self.epoch.elapsed().as_millis() as i64
    }

    pub fn is_open(&self) -> bool {
        self.open_until_ms.load(Ordering::Relaxed) != 0
    }

    pub fn admit(&self) -> Admission {
        let until = self.open_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return Admission::Closed;
        }
        if self.now_ms() < until {
            return Admission::Open;
        }
        match self.probing.swap(true, Ordering::AcqRel) {
            false => Admission::Probe,
            true => Admission::Open,
        }
    }

    /// A probe that reported nothing (it was dropped) lets the next call probe.
    pub fn probe_ended(&self) {
        self.probing.store(false, Ordering::Release);
    }

    pub fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
        if self.open_until_ms.swap(0, Ordering::Relaxed) != 0 {
            metrics::gauge!(RISK_BREAKER_OPEN).set(0.0);
            tracing::info!("risk service answers again: breaker closed");
        }
    }

    pub fn failure(&self) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < self.failures_max {
            return;
        }
        // Max with 1: 0 means closed, and the first millisecond after start is a real time.
        let until = (self.now_ms() + self.open_ms).max(1);
        if self.open_until_ms.swap(until, Ordering::Relaxed) == 0 {
            metrics::gauge!(RISK_BREAKER_OPEN).set(1.0);
            tracing::warn!(failures, "risk service failing: breaker open");
        }
        self.probing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A circuit started a while ago, so that its open time can be set in the past.
    fn circuit(failures_max: u32) -> Circuit {
        let mut c = Circuit::new(failures_max, Duration::from_secs(60));
        c.epoch = Instant::now() - Duration::from_secs(10);
        c
    }

    /// The open time is over (as if `open_for` had passed).
    fn lapse(c: &Circuit) {
        c.open_until_ms.store(1, Ordering::Relaxed);
    }

    #[test]
    fn opens_after_consecutive_failures_and_one_probe_closes_it() {
        let c = circuit(2);
        c.failure();
        c.success();
        c.failure();
        assert_eq!(c.admit(), Admission::Closed, "the count restarted");
        c.failure();
        assert!(c.is_open());
        assert_eq!(c.admit(), Admission::Open);
        lapse(&c);
        assert_eq!(c.admit(), Admission::Probe);
        assert_eq!(c.admit(), Admission::Open, "one probe at a time");
        c.failure();
        assert!(c.is_open(), "a failed probe opens it again");
        assert_eq!(c.admit(), Admission::Open);
        lapse(&c);
        assert_eq!(c.admit(), Admission::Probe);
        c.success();
        assert_eq!(c.admit(), Admission::Closed);
    }
}
