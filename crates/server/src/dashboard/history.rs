//! What the dashboard draws over time, kept by the server per sale from the sale's start, so a
//! page opened in the middle of a sale or after it draws the whole sale, not only what
//! happened while it was open.
//!
//! The server's sampler (`workers::HistoryWorker`) adds one [`Point`] per sale per second:
//! stock, backlog, the second's answers and latency, and for a queue or draw sale its queue
//! length, admitted, waiting, admission rate and ETA, or how far down the draw's waitlist the
//! reservations went. A sale's points are a bounded ring that never drops the start: when it
//! holds [`POINTS_MAX`] points, each two neighbours merge into one (the step doubles), so the
//! series always reaches back to the first point, at a coarser step the longer the sale runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use flashsale_core::SkuId;
use serde::Serialize;

/// Points kept per sale (then neighbours merge: the step doubles).
pub const POINTS_MAX: usize = 1_800;
/// Sales tracked at most; the one sampled longest ago goes first.
const SALES_MAX: usize = 256;

/// One sample of one sale.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Point {
    /// Unix seconds.
    pub t: u64,
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    pub backlog: u64,
    /// Answers of the sample's second (a merged point: their mean per second).
    pub accepted: f64,
    pub sold_out: f64,
    pub rejected: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// A queue sale's admission.
    pub queue: Option<QueuePoint>,
    /// A draw sale: how far down the waitlist the reservations have gone.
    pub draw_position: Option<u64>,
}

/// A queue sale's admission at a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueuePoint {
    pub queue_length: u64,
    pub admitted: u64,
    pub bought: u64,
    /// Places admitted per second since the previous sample.
    pub admission_rate: f64,
    /// Seconds until the last waiting place is admitted at that rate (`None`: no rate yet).
    pub eta_s: Option<f64>,
}

impl QueuePoint {
    pub fn waiting(&self) -> u64 {
        self.queue_length.saturating_sub(self.admitted)
    }
}

/// Two neighbours as one: counts and rates averaged, gauges as at the later one, the higher
/// percentile (a merged point never hides a slow second).
fn merge(a: &Point, b: &Point) -> Point {
    let mean = |x: f64, y: f64| (x + y) / 2.0;
    let high = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    let queue = match (a.queue, b.queue) {
        (Some(qa), Some(qb)) => Some(QueuePoint {
            admission_rate: mean(qa.admission_rate, qb.admission_rate),
            ..qb
        }),
        (_, q) => q,
    };
    Point {
        t: a.t,
        accepted: mean(a.accepted, b.accepted),
        sold_out: mean(a.sold_out, b.sold_out),
        rejected: mean(a.rejected, b.rejected),
        p50_ms: high(a.p50_ms, b.p50_ms),
        p99_ms: high(a.p99_ms, b.p99_ms),
        queue,
        ..*b
    }
}

/// One sale's points, oldest first, and the step between them.
#[derive(Debug, Clone)]
struct Track {
    points: Vec<Point>,
    step_s: u64,
    /// Samples taken since the last point was added (a point every `step_s` samples).
    pending: Option<Point>,
}

impl Default for Track {
    fn default() -> Self {
        Track {
            points: Vec::new(),
            step_s: 1,
            pending: None,
        }
    }
}

impl Track {
    fn push(&mut self, p: Point) {
        // At a step of s seconds, s samples make one point.
        let p = match self.pending.take() {
            Some(first) if p.t < first.t + self.step_s => {
                self.pending = Some(merge(&first, &p));
                return;
            }
            Some(first) => {
                self.points.push(first);
                p
            }
            None => p,
        };
        self.pending = Some(p);
        if self.points.len() >= POINTS_MAX {
            self.points = self
                .points
                .chunks(2)
                .map(|c| match c {
                    [a, b] => merge(a, b),
                    [a] => *a,
                    _ => unreachable!("chunks of two"),
                })
                .collect();
            self.step_s *= 2;
        }
    }

    fn all(&self) -> Vec<Point> {
        let mut all = self.points.clone();
        all.extend(self.pending);
        all
    }

    fn last_t(&self) -> u64 {
        self.pending
            .or(self.points.last().copied())
            .map_or(0, |p| p.t)
    }
}

/// Every sampled sale's track.
#[derive(Default)]
pub struct History {
    sales: RwLock<HashMap<SkuId, Arc<Mutex<Track>>>>,
}

impl History {
    /// Adds a sample of `sku`.
    pub fn record(&self, sku: SkuId, p: Point) {
        let track = self.track(sku);
        track.lock().expect("history lock").push(p);
    }

    /// The last sample of `sku`, if any (the sampler's previous reading, for rates).
    pub fn last(&self, sku: SkuId) -> Option<Point> {
        let track = self
            .sales
            .read()
            .expect("history lock")
            .get(&sku)
            .cloned()?;
        let track = track.lock().expect("history lock");
        track.pending.or(track.points.last().copied())
    }

    fn track(&self, sku: SkuId) -> Arc<Mutex<Track>> {
        if let Some(t) = self.sales.read().expect("history lock").get(&sku) {
            return t.clone();
        }
        let mut sales = self.sales.write().expect("history lock");
        if sales.len() >= SALES_MAX && !sales.contains_key(&sku) {
            let oldest = sales
                .iter()
                .min_by_key(|(_, t)| t.lock().expect("history lock").last_t())
                .map(|(sku, _)| *sku);
            if let Some(oldest) = oldest {
                sales.remove(&oldest);
            }
        }
        sales.entry(sku).or_default().clone()
    }

    /// The series of `sku` as columns; `admin`: with answers, latency and backlog.
    pub fn series(&self, sku: SkuId, admin: bool) -> HistorySeries {
        let track = self.sales.read().expect("history lock").get(&sku).cloned();
        let (points, step_s) = match track {
            Some(t) => {
                let t = t.lock().expect("history lock");
                (t.all(), t.step_s)
            }
            None => (Vec::new(), 1),
        };
        HistorySeries::of(sku, step_s, &points, admin)
    }
}

/// `GET /api/v1/dashboard/history/{sku}` (and the admin one): a sale's series from its first
/// sample, as columns (what a chart library wants). Queue and draw columns are present only
/// for such a sale; answers, latency and backlog only in the admin answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HistorySeries {
    pub sku_id: u64,
    /// Seconds between points (1 at first; doubles each time the ring is full).
    pub step_s: u64,
    /// Unix seconds.
    pub t: Vec<u64>,
    pub available: Vec<u64>,
    pub reserved: Vec<u64>,
    pub sold: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueColumns>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw_position: Option<Vec<Option<u64>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answers: Option<AnswerColumns>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct QueueColumns {
    pub queue_length: Vec<Option<u64>>,
    pub admitted: Vec<Option<u64>>,
    pub waiting: Vec<Option<u64>>,
    pub bought: Vec<Option<u64>>,
    /// Places admitted per second.
    pub admission_rate: Vec<Option<f64>>,
    /// Seconds until the last waiting place is admitted at that rate.
    pub eta_s: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct AnswerColumns {
    /// Answers per second.
    pub accepted: Vec<f64>,
    pub sold_out: Vec<f64>,
    pub rejected: Vec<f64>,
    pub p50_ms: Vec<Option<f64>>,
    pub p99_ms: Vec<Option<f64>>,
    pub backlog: Vec<u64>,
}

impl HistorySeries {
    fn of(sku: SkuId, step_s: u64, points: &[Point], admin: bool) -> HistorySeries {
        let col = |f: fn(&Point) -> u64| points.iter().map(f).collect::<Vec<_>>();
        let queued = points.iter().any(|p| p.queue.is_some());
        let drawn = points.iter().any(|p| p.draw_position.is_some());
        HistorySeries {
            sku_id: sku.0,
            step_s,
            t: col(|p| p.t),
            available: col(|p| p.available),
            reserved: col(|p| p.reserved),
            sold: col(|p| p.sold),
            queue: queued.then(|| queue_columns(points)),
            draw_position: drawn.then(|| points.iter().map(|p| p.draw_position).collect()),
            answers: admin.then(|| AnswerColumns {
                accepted: points.iter().map(|p| p.accepted).collect(),
                sold_out: points.iter().map(|p| p.sold_out).collect(),
                rejected: points.iter().map(|p| p.rejected).collect(),
                p50_ms: points.iter().map(|p| p.p50_ms).collect(),
                p99_ms: points.iter().map(|p| p.p99_ms).collect(),
                backlog: col(|p| p.backlog),
            }),
        }
    }
}

fn queue_columns(points: &[Point]) -> QueueColumns {
    let mut c = QueueColumns::default();
    for q in points.iter().map(|p| p.queue) {
        c.queue_length.push(q.map(|q| q.queue_length));
        c.admitted.push(q.map(|q| q.admitted));
        c.waiting.push(q.map(|q| q.waiting()));
        c.bought.push(q.map(|q| q.bought));
        c.admission_rate.push(q.map(|q| q.admission_rate));
        c.eta_s.push(q.and_then(|q| q.eta_s));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: u64, sold: u64) -> Point {
        Point {
            t,
            sold,
            accepted: 2.0,
            ..Point::default()
        }
    }

    #[test]
    fn a_full_ring_merges_neighbours_and_keeps_the_start() {
        let mut track = Track::default();
        let n = 3 * POINTS_MAX as u64;
        for t in 0..n {
            track.push(at(1_000 + t, t));
        }
        let all = track.all();
        assert!(all.len() <= POINTS_MAX + 1, "bounded: {}", all.len());
        assert_eq!(all[0].t, 1_000, "the start is kept");
        assert_eq!(
            all.last().unwrap().sold,
            n - 1,
            "the end is the last sample"
        );
        assert!(track.step_s >= 2);
        assert!(all.windows(2).all(|w| w[0].t < w[1].t), "in time order");
        assert!(
            all.iter().all(|p| p.accepted == 2.0),
            "rates stay per second"
        );
    }
}
