//! What the report charts over time and by size, from the records of a run: answers per
//! second by outcome and latency percentiles per timeline bucket, and a latency histogram in
//! log-spaced bins. Buckets are by the time of the answer, like [`crate::summary`]'s timeline.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::load::Record;
use crate::summary::BUCKET_MS;

/// Per timeline bucket (one entry per bucket, oldest first).
#[derive(Debug, Clone, Default, Serialize)]
pub struct OverTime {
    /// Bucket start, ms from the run's start.
    pub t_ms: Vec<u64>,
    /// Answers per second in each bucket, by outcome.
    pub answers_per_s: BTreeMap<String, Vec<f64>>,
    /// Latency percentiles of the answers in each bucket; `None` when it had none.
    pub p50_ms: Vec<Option<f64>>,
    pub p99_ms: Vec<Option<f64>>,
    pub max_ms: Vec<Option<f64>>,
}

/// One bar of the latency histogram: answers with latency in `(lower_ms, upper_ms]`.
#[derive(Debug, Clone, Serialize)]
pub struct Bin {
    pub lower_ms: f64,
    pub upper_ms: f64,
    pub count: u64,
}

/// Answers by outcome and latency percentiles, bucket by bucket.
pub fn over_time(records: &[Record]) -> OverTime {
    let buckets = bucket_count(records);
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); buckets];
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in records {
        let b = bucket_of(r);
        latencies[b].push(r.latency_us);
        counts
            .entry(r.outcome.clone())
            .or_insert_with(|| vec![0; buckets])[b] += 1;
    }
    let per_s = 1_000.0 / BUCKET_MS as f64;
    let mut out = OverTime {
        t_ms: (0..buckets as u64).map(|b| b * BUCKET_MS).collect(),
        answers_per_s: counts
            .into_iter()
            .map(|(k, v)| (k, v.iter().map(|n| *n as f64 * per_s).collect()))
            .collect(),
        ..OverTime::default()
    };
    for mut l in latencies {
        l.sort_unstable();
        out.p50_ms.push(percentile_ms(&l, 0.50));
        out.p99_ms.push(percentile_ms(&l, 0.99));
        out.max_ms.push(l.last().map(|us| *us as f64 / 1_000.0));
    }
    out
}

fn bucket_of(r: &Record) -> usize {
    ((r.due_us + r.latency_us) / 1_000 / BUCKET_MS) as usize
}

fn bucket_count(records: &[Record]) -> usize {
    records.iter().map(bucket_of).max().map_or(0, |b| b + 1)
}

/// Nearest-rank percentile of sorted microseconds, in ms.
fn percentile_ms(sorted_us: &[u64], q: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    Some(sorted_us[rank - 1] as f64 / 1_000.0)
}

/// Bin bounds in ms: 1-2-5 steps from 10 µs to 100 s (a latency past that lands in the last).
fn bin_bounds_ms() -> Vec<f64> {
    let mut bounds = Vec::new();
    let mut decade = 0.01;
    while decade < 100_000.0 {
        bounds.extend([decade, 2.0 * decade, 5.0 * decade]);
        decade *= 10.0;
    }
    bounds.push(100_000.0);
    bounds
}

/// The latency histogram, trimmed to the bins from the first to the last that has answers.
pub fn histogram(records: &[Record]) -> Vec<Bin> {
    let bounds = bin_bounds_ms();
    let mut counts = vec![0u64; bounds.len()];
    for r in records {
        let ms = r.latency_us as f64 / 1_000.0;
        let i = bounds
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(bounds.len() - 1);
        counts[i] += 1;
    }
    let first = counts.iter().position(|c| *c > 0).unwrap_or(0);
    let last = counts.iter().rposition(|c| *c > 0).unwrap_or(0);
    (first..=last)
        .map(|i| Bin {
            lower_ms: if i == 0 { 0.0 } else { bounds[i - 1] },
            upper_ms: bounds[i],
            count: counts[i],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(due_us: u64, latency_us: u64, outcome: &str) -> Record {
        Record::answered(due_us, latency_us, outcome)
    }

    #[test]
    fn answers_and_percentiles_per_bucket() {
        let s = over_time(&Record::three_answers());
        assert_eq!(s.t_ms, vec![0, 100, 200]);
        assert_eq!(s.answers_per_s["ACCEPTED"], vec![20.0, 0.0, 0.0]);
        assert_eq!(s.answers_per_s["SOLD_OUT"], vec![0.0, 0.0, 10.0]);
        assert_eq!(s.p50_ms, vec![Some(1.0), None, Some(0.5)]);
        assert_eq!(s.p99_ms[0], Some(3.0));
    }

    #[test]
    fn the_histogram_bins_by_latency_and_trims_empty_ends() {
        let records = vec![rec(0, 1_000, "A"), rec(0, 1_500, "A"), rec(0, 4_000, "A")];
        let bins = histogram(&records);
        assert_eq!(bins.first().unwrap().upper_ms, 1.0);
        assert_eq!(bins.first().unwrap().count, 1);
        assert_eq!(bins.iter().map(|b| b.count).sum::<u64>(), 3);
        assert_eq!(bins.last().unwrap().upper_ms, 5.0);
    }
}
