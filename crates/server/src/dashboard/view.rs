//! The dashboard's JSON: the public part (every sale, its state and stock) and the admin part
//! (per sale: answers per second, latency, stream lag, backlog, flags, last reconciliation;
//! per instance: breaker, Lua script latency), and the script latency readings kept between
//! requests. The dashboard's `routes` compute them from the stores, the gateway's gates and the
//! process's own metrics.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flashsale_core::ledger::ReconcileRun;
use flashsale_core::SaleState;
use serde::Serialize;
use serde_json::Value;

use super::live::Series;
use super::prom::{self, Buckets, Sample};
use crate::bucket_view::BucketFields;

/// Sales shown at most (live ones first).
pub(crate) const SALES_SHOWN_MAX: usize = 50;
/// Seconds of answers and latency per sale in one answer.
pub(crate) const SERIES_S: u64 = 60;
/// Script latency percentiles are read over the last few seconds, not since start.
const SCRIPT_WINDOW: Duration = Duration::from_secs(5);
const SCRIPT_LATENCY: &str = "flashsale_script_latency_seconds";

/// One sale, public fields.
#[derive(Debug, Clone, Serialize)]
pub struct SaleCard {
    pub sku_id: u64,
    pub name: String,
    pub state: SaleState,
    pub mode: String,
    /// Hot copies the stock is split over (1: one).
    pub buckets: u16,
    /// Who may buy: `open`, `queue` or `draw`.
    pub admission: String,
    /// A queue sale: its length, the places admitted and the admitted buyers who bought (from
    /// the admission state, so a page opened at any time shows the whole queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueTile>,
    pub total: u64,
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    /// A bucketed sale's per-bucket counters, when the hot ledger or the database has them.
    #[serde(flatten)]
    pub per_bucket: BucketFields,
}

/// A queue sale's admission, read from where its state lives.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueueTile {
    pub queue_length: u64,
    pub admitted: u64,
    pub bought: u64,
}

/// `GET /api/v1/dashboard`.
#[derive(Debug, Clone, Serialize)]
pub struct PublicView {
    pub at_ms: i64,
    pub sales: Vec<SaleCard>,
}

/// What an operator sees of one sale besides its card.
#[derive(Debug, Serialize)]
pub struct SaleOps {
    #[serde(flatten)]
    pub card: SaleCard,
    pub answers: Series,
    /// Redis ledger: events the persister has not stored yet (`None`: no persister here).
    pub stream_lag_events: Option<f64>,
    /// What back-pressure measures: stream lag or queued requests, whichever is larger.
    pub backlog: u64,
    pub backpressure: bool,
    /// Purchases are answered SOLD_OUT here without asking the ledger.
    pub sold_out_flag: bool,
    pub db_guard_rejections: f64,
    pub dead_letters: f64,
    pub reconcile: Option<ReconcileVerdict>,
}

/// The last stored reconciler run of a sale.
#[derive(Debug, Serialize)]
pub struct ReconcileVerdict {
    pub at_ms: i64,
    pub trigger: String,
    pub ok: bool,
    pub violations: u32,
    pub lost_orders: usize,
    /// Hot (folded) minus database, per field; `null` when there was nothing to compare.
    pub diff: Value,
    pub hot_behind: bool,
}

/// Percentiles of one Lua script over the last seconds.
#[derive(Debug, Serialize)]
pub struct ScriptLatency {
    pub script: String,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// `GET /api/v1/admin/dashboard`.
#[derive(Debug, Serialize)]
pub struct AdminView {
    pub at_ms: i64,
    pub ledger: &'static str,
    pub breaker_open: bool,
    /// The risk service's breaker; `None` when this instance calls no risk service.
    pub risk_breaker_open: Option<bool>,
    pub open_connections: Option<f64>,
    pub scripts: Vec<ScriptLatency>,
    pub sales: Vec<SaleOps>,
}

/// Readings of the script latency histograms, a second or more apart, for windowed percentiles.
#[derive(Default)]
pub struct ScriptReadings {
    readings: Mutex<VecDeque<(Instant, HashMap<String, Buckets>)>>,
}

impl ScriptReadings {
    /// Percentiles per script between the oldest reading in the window and `samples`.
    pub(crate) fn latency(&self, samples: &[Sample]) -> Vec<ScriptLatency> {
        let now = script_buckets(samples);
        let mut readings = self.readings.lock().expect("readings lock");
        let due = readings
            .back()
            .is_none_or(|(at, _)| at.elapsed() >= Duration::from_secs(1));
        if due {
            readings.push_back((Instant::now(), now.clone()));
        }
        while readings.len() > 1 && readings[0].0.elapsed() > SCRIPT_WINDOW {
            readings.pop_front();
        }
        let before = &readings[0].1;
        let mut out: Vec<ScriptLatency> = now
            .iter()
            .map(|(script, b)| {
                let window = prom::minus(b, before.get(script).unwrap_or(&Vec::new()));
                ScriptLatency {
                    script: script.clone(),
                    p50_ms: prom::quantile(&window, 0.50).map(|s| s * 1e3),
                    p99_ms: prom::quantile(&window, 0.99).map(|s| s * 1e3),
                }
            })
            .collect();
        out.sort_by(|a, b| a.script.cmp(&b.script));
        out
    }
}

fn script_buckets(samples: &[Sample]) -> HashMap<String, Buckets> {
    let bucket_name = format!("{SCRIPT_LATENCY}_bucket");
    let scripts: Vec<&str> = samples
        .iter()
        .filter(|s| s.name == bucket_name)
        .filter_map(|s| s.label("script"))
        .collect();
    scripts
        .into_iter()
        .map(|name| {
            let b = prom::buckets(samples, SCRIPT_LATENCY, "script", name);
            (name.to_owned(), b)
        })
        .collect()
}

pub(crate) fn verdict(run: ReconcileRun) -> ReconcileVerdict {
    let report: Value = serde_json::from_str(&run.report).unwrap_or(Value::Null);
    ReconcileVerdict {
        at_ms: run.at_ms,
        trigger: run.trigger,
        ok: run.ok,
        violations: run.violations,
        lost_orders: run.lost_orders.len(),
        diff: report.get("diff").cloned().unwrap_or(Value::Null),
        hot_behind: report
            .get("hot_behind")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }
}
