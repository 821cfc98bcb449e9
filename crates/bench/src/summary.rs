//! Numbers from the records of a run: outcomes, percentiles, timeline.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::load::Record;

/// Width of one timeline bucket.
pub const BUCKET_MS: u64 = 100;

#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TimelinePoint {
    pub t_ms: u64,
    /// Buyers answered in this bucket, per second.
    pub answered_per_s: f64,
    pub accepted: u64,
    /// Stock left after this bucket, from the accepted answers.
    pub remaining: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub buyers: u64,
    /// HTTP requests sent, retries included.
    pub requests: u64,
    pub outcomes: BTreeMap<String, u64>,
    pub accepted_units: u64,
    pub elapsed_s: f64,
    pub buyers_per_s: f64,
    pub requests_per_s: f64,
    pub latency: Percentiles,
    pub latency_by_outcome: BTreeMap<String, Percentiles>,
    /// (percentile, ms) pairs for the latency distribution chart.
    pub latency_curve: Vec<(f64, f64)>,
    pub timeline: Vec<TimelinePoint>,
    /// Answers per second by outcome and latency percentiles, per timeline bucket.
    pub over_time: crate::series::OverTime,
    pub latency_histogram: Vec<crate::series::Bin>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1_000.0;
    Percentiles {
        count: h.len(),
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: h.max() as f64 / 1_000.0,
    }
}

/// Summarises a run that sold from `total_stock` units of `quantity` each.
pub fn summarize(records: &[Record], total_stock: u64, quantity: u32) -> Summary {
    let mut all = histogram();
    let mut by_outcome: BTreeMap<String, Histogram<u64>> = BTreeMap::new();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut end_us = 1;
    for r in records {
        let v = r.latency_us.max(1);
        all.saturating_record(v);
        by_outcome
            .entry(r.outcome.clone())
            .or_insert_with(histogram)
            .saturating_record(v);
        *outcomes.entry(r.outcome.clone()).or_default() += 1;
        end_us = end_us.max(r.due_us + r.latency_us);
    }
    let accepted = outcomes.get("ACCEPTED").copied().unwrap_or(0);
    let elapsed_s = end_us as f64 / 1e6;
    let requests: u64 = records.iter().map(|r| u64::from(r.tries)).sum();
    Summary {
        buyers: records.len() as u64,
        requests,
        accepted_units: accepted * u64::from(quantity),
        elapsed_s,
        buyers_per_s: records.len() as f64 / elapsed_s,
        requests_per_s: requests as f64 / elapsed_s,
        latency: percentiles(&all),
        latency_by_outcome: by_outcome
            .iter()
            .map(|(k, h)| (k.clone(), percentiles(h)))
            .collect(),
        latency_curve: curve(&all),
        timeline: timeline(records, total_stock, quantity, end_us),
        over_time: crate::series::over_time(records),
        latency_histogram: crate::series::histogram(records),
        outcomes,
    }
}

fn curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let qs = [
        0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 100.0,
    ];
    qs.iter()
        .map(|q| (*q, h.value_at_percentile(*q) as f64 / 1_000.0))
        .collect()
}

fn timeline(
    records: &[Record],
    total_stock: u64,
    quantity: u32,
    end_us: u64,
) -> Vec<TimelinePoint> {
    let buckets = (end_us / 1_000 / BUCKET_MS + 1) as usize;
    let mut answered = vec![0u64; buckets];
    let mut accepted = vec![0u64; buckets];
    for r in records {
        let b = ((r.due_us + r.latency_us) / 1_000 / BUCKET_MS) as usize;
        answered[b] += 1;
        accepted[b] += u64::from(r.outcome == "ACCEPTED");
    }
    let mut remaining = total_stock as i64;
    (0..buckets)
        .map(|b| {
            remaining -= (accepted[b] * u64::from(quantity)) as i64;
            TimelinePoint {
                t_ms: b as u64 * BUCKET_MS,
                answered_per_s: answered[b] as f64 * 1_000.0 / BUCKET_MS as f64,
                accepted: accepted[b],
                remaining,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outcomes_and_draws_the_stock_down() {
        let s = summarize(&Record::three_answers(), 2, 1);
        assert_eq!(s.outcomes["ACCEPTED"], 2);
        assert_eq!(s.accepted_units, 2);
        assert_eq!(s.timeline.last().unwrap().remaining, 0);
        assert!(s.latency.p50_ms >= 0.9 && s.latency.max_ms >= 1.9);
    }
}
