//! Per-sale answers and latency of this instance, second by second, for the live dashboard.
//!
//! The Prometheus metrics count purchases by outcome for the whole process (a sku label there
//! would multiply every series by the number of sales); the dashboard wants them per sale, so
//! the purchase handler also records each answer here: a ring of the last [`WINDOW_S`]
//! seconds per sale, each second with its counts and a log-scale latency histogram.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flashsale_core::SkuId;
use serde::Serialize;

/// Seconds kept per sale.
pub const WINDOW_S: u64 = 120;
/// Sales tracked at most; the one idle longest goes first.
const SALES_MAX: usize = 1_024;
/// Latency buckets: bucket `i` holds latencies up to `FIRST_BOUND_US · 2^(i/4)` µs, so a
/// percentile read as a bound is at most 19 % high; 84 buckets reach past 10 s.
const BUCKETS: usize = 84;
const FIRST_BOUND_US: f64 = 10.0;

/// How a purchase was answered, as the dashboard groups answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Accepted,
    SoldOut,
    Rejected,
}

impl Answer {
    /// From the label the purchase handler gives its metrics.
    pub fn from_label(label: &str) -> Answer {
        match label {
            "accepted" | "replayed" => Answer::Accepted,
            "SOLD_OUT" => Answer::SoldOut,
            _ => Answer::Rejected,
        }
    }
}

#[derive(Clone)]
struct Second {
    at_s: u64,
    counts: [u32; 3],
    latency: [u32; BUCKETS],
}

impl Second {
    fn new(at_s: u64) -> Second {
        Second {
            at_s,
            counts: [0; 3],
            latency: [0; BUCKETS],
        }
    }
}

#[derive(Default)]
struct SaleRing {
    seconds: VecDeque<Second>,
}

impl SaleRing {
    fn record(&mut self, now_s: u64, answer: Answer, latency: Duration) {
        if self.seconds.back().is_none_or(|s| s.at_s < now_s) {
            self.seconds.push_back(Second::new(now_s));
        }
        while self
            .seconds
            .front()
            .is_some_and(|s| s.at_s + WINDOW_S <= now_s)
        {
            self.seconds.pop_front();
        }
        let second = self.seconds.back_mut().expect("pushed above");
        second.counts[answer as usize] += 1;
        second.latency[bucket(latency)] += 1;
    }

    fn last_at(&self) -> u64 {
        self.seconds.back().map_or(0, |s| s.at_s)
    }
}

fn bucket(latency: Duration) -> usize {
    let us = latency.as_secs_f64() * 1e6;
    if us <= FIRST_BOUND_US {
        return 0;
    }
    let i = ((us / FIRST_BOUND_US).log2() * 4.0).ceil() as usize;
    i.min(BUCKETS - 1)
}

fn bound_ms(i: usize) -> f64 {
    FIRST_BOUND_US * 2f64.powf(i as f64 / 4.0) / 1_000.0
}

/// The last seconds of one sale, one entry per second (zeros where nothing was answered),
/// oldest first, as columns (what a chart library wants).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Series {
    /// Unix seconds.
    pub t: Vec<u64>,
    pub accepted: Vec<u32>,
    pub sold_out: Vec<u32>,
    pub rejected: Vec<u32>,
    /// Milliseconds (bucket bounds); `None` in a second without answers.
    pub p50_ms: Vec<Option<f64>>,
    pub p99_ms: Vec<Option<f64>>,
}

/// Each sale's ring, hashed with aHash (seeded per process): every purchase answer looks its
/// sale up here.
type Rings = HashMap<SkuId, Arc<Mutex<SaleRing>>, ahash::RandomState>;

/// Every tracked sale's ring.
#[derive(Default)]
pub struct Live {
    sales: RwLock<Rings>,
}

impl Live {
    /// Records one answer of a purchase of `sku`.
    pub fn record(&self, sku: SkuId, answer: Answer, latency: Duration) {
        let at_s = unix_s();
        // A known sale's ring is written under the map's read lock: no clone of its `Arc` (two
        // atomic writes on a line both cores share) per answer.
        if let Some(ring) = self.sales.read().expect("live lock").get(&sku) {
            ring.lock()
                .expect("ring lock")
                .record(at_s, answer, latency);
            return;
        }
        let ring = self.ring(sku);
        ring.lock()
            .expect("ring lock")
            .record(at_s, answer, latency);
    }

    /// The ring of a sale [`Live::record`] did not find under the read lock: made under the
    /// write lock (or found, when another answer made it meanwhile).
    fn ring(&self, sku: SkuId) -> Arc<Mutex<SaleRing>> {
        let mut sales = self.sales.write().expect("live lock");
        if sales.len() >= SALES_MAX && !sales.contains_key(&sku) {
            evict_idlest(&mut sales);
        }
        sales.entry(sku).or_default().clone()
    }

    /// The last `seconds` complete seconds of `sku` (the current one is still filling, and a
    /// partial second would read as a drop in the rate).
    pub fn series(&self, sku: SkuId, seconds: u64) -> Series {
        let now_s = unix_s();
        let ring = self.sales.read().expect("live lock").get(&sku).cloned();
        let ring = ring.map(|r| r.lock().expect("ring lock").seconds.clone());
        let ring = ring.unwrap_or_default();
        let mut out = Series::default();
        for at_s in now_s.saturating_sub(seconds)..now_s {
            let second = ring.iter().find(|s| s.at_s == at_s);
            push_second(&mut out, at_s, second);
        }
        out
    }
}

fn evict_idlest(sales: &mut Rings) {
    let idlest = sales
        .iter()
        .min_by_key(|(_, r)| r.lock().expect("ring lock").last_at())
        .map(|(sku, _)| *sku);
    if let Some(sku) = idlest {
        sales.remove(&sku);
    }
}

fn push_second(out: &mut Series, at_s: u64, second: Option<&Second>) {
    let empty = Second::new(at_s);
    let s = second.unwrap_or(&empty);
    out.t.push(at_s);
    out.accepted.push(s.counts[Answer::Accepted as usize]);
    out.sold_out.push(s.counts[Answer::SoldOut as usize]);
    out.rejected.push(s.counts[Answer::Rejected as usize]);
    out.p50_ms.push(percentile_ms(&s.latency, 0.50));
    out.p99_ms.push(percentile_ms(&s.latency, 0.99));
}

fn percentile_ms(latency: &[u32; BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = latency.iter().map(|&n| u64::from(n)).sum();
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0u64;
    for (i, &n) in latency.iter().enumerate() {
        seen += u64::from(n);
        if seen >= rank {
            return Some(bound_ms(i));
        }
    }
    Some(bound_ms(BUCKETS - 1))
}

fn unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_grow_by_a_quarter_octave_and_cap() {
        assert_eq!(bucket(Duration::from_micros(5)), 0);
        assert_eq!(bucket(Duration::from_micros(20)), 4);
        assert_eq!(bucket(Duration::from_secs(3_600)), BUCKETS - 1);
        assert!(bound_ms(BUCKETS - 1) > 10_000.0);
    }

    #[test]
    fn a_ring_counts_answers_and_reads_percentiles() {
        let mut ring = SaleRing::default();
        for i in 0..100 {
            let answer = if i < 90 {
                Answer::Accepted
            } else {
                Answer::SoldOut
            };
            ring.record(1_000, answer, Duration::from_micros(100 + i * 10));
        }
        ring.record(1_001, Answer::Rejected, Duration::from_millis(1));
        let s = &ring.seconds[0];
        assert_eq!(s.counts, [90, 10, 0]);
        let p50 = percentile_ms(&s.latency, 0.5).unwrap();
        let p99 = percentile_ms(&s.latency, 0.99).unwrap();
        assert!((0.59..0.72).contains(&p50), "{p50}");
        assert!((1.08..1.3).contains(&p99), "{p99}");
        ring.record(1_000 + WINDOW_S + 1, Answer::Accepted, Duration::ZERO);
        assert_eq!(ring.seconds.len(), 1, "seconds past the window go");
    }
}
