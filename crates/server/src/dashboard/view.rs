//! The dashboard's JSON: the public part (every sale, its state and stock) and the admin part
//! (per sale: answers per second, latency, stream lag, backlog, flags, last reconciliation;
//! per instance: breaker, Lua script latency), computed from the stores, the gateway's gates
//! and the process's own metrics.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flashsale_core::ledger::{ReconcileRun, StoredSale};
use flashsale_core::{Counters, SaleState, SkuId};
use serde::Serialize;
use serde_json::Value;

use super::live::Series;
use super::prom::{self, Buckets, Sample};
use crate::error::AppError;
use crate::state::AppState;

/// Sales shown at most (live ones first).
const SALES_SHOWN_MAX: usize = 50;
/// Seconds of answers and latency per sale in one answer.
const SERIES_S: u64 = 60;
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
    pub total: u64,
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
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
    fn latency(&self, samples: &[Sample]) -> Vec<ScriptLatency> {
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

/// The public view: every sale (up to a bound) with its stock.
pub async fn public(st: &AppState) -> Result<PublicView, AppError> {
    let mut sales = Vec::new();
    for stored in shown_sales(st).await? {
        sales.push(card(st, &stored).await);
    }
    Ok(PublicView {
        at_ms: crate::routes::sales::now_ms(),
        sales,
    })
}

/// The admin view: the public one plus what the process knows of each sale.
pub async fn admin(st: &AppState) -> Result<AdminView, AppError> {
    let samples = prom::parse(&st.metrics.render());
    let mut sales = Vec::new();
    for stored in shown_sales(st).await? {
        let card = card(st, &stored).await;
        sales.push(sale_ops(st, card, &samples).await);
    }
    Ok(AdminView {
        at_ms: crate::routes::sales::now_ms(),
        ledger: st.ledger.kind(),
        breaker_open: st.breaker.any_open(),
        open_connections: prom::value(&samples, "flashsale_open_connections", "", ""),
        scripts: st.dashboard.scripts.latency(&samples),
        sales,
    })
}

async fn shown_sales(st: &AppState) -> Result<Vec<StoredSale>, AppError> {
    let mut sales = st.store.sales().await?;
    let rank = |s: &SaleState| match s {
        SaleState::Live => 0,
        SaleState::Paused => 1,
        SaleState::Scheduled => 2,
        SaleState::Ended => 3,
    };
    sales.sort_by_key(|s| (rank(&s.sale.state), std::cmp::Reverse(s.sale.sku_id.0)));
    sales.truncate(SALES_SHOWN_MAX);
    Ok(sales)
}

/// Hot counters when the ledger has the sale (fresher: the database lags the persister).
async fn card(st: &AppState, stored: &StoredSale) -> SaleCard {
    let sku = stored.sale.sku_id;
    let hot = match stored.sale.state {
        SaleState::Scheduled => None,
        _ => st.ledger.counters(sku).await.ok().flatten(),
    };
    let c: Counters = hot.unwrap_or(stored.counters);
    SaleCard {
        sku_id: sku.0,
        name: stored.sale.name.clone(),
        state: stored.sale.state,
        mode: stored.sale.mode.as_str().to_owned(),
        total: c.total,
        available: c.available,
        reserved: c.reserved,
        sold: c.sold,
    }
}

async fn sale_ops(st: &AppState, card: SaleCard, samples: &[Sample]) -> SaleOps {
    let sku = SkuId(card.sku_id);
    let label = sku.0.to_string();
    let gate = st.gateway.gates.all().into_iter().find(|g| g.sku == sku);
    let per_sku = |name: &str| prom::value(samples, name, "sku", &label);
    let run = st.store.reconcile_runs(Some(sku), 1).await.ok();
    SaleOps {
        answers: st.dashboard.live.series(sku, SERIES_S),
        stream_lag_events: per_sku("flashsale_stream_lag_events"),
        backlog: gate
            .as_ref()
            .map_or(0, |g| g.backlog.load(std::sync::atomic::Ordering::Relaxed)),
        backpressure: gate.as_ref().is_some_and(|g| g.is_busy()),
        // A request key is always `user:request_id`, so the empty key is never an accepted
        // retry: `answers` is then true exactly while the sale's flag is set.
        sold_out_flag: st.sold_out.is_set(sku),
        db_guard_rejections: per_sku("flashsale_db_guard_rejections_total").unwrap_or(0.0),
        dead_letters: per_sku("flashsale_dead_letters_total").unwrap_or(0.0),
        reconcile: run.and_then(|r| r.into_iter().next()).map(verdict),
        card,
    }
}

fn verdict(run: ReconcileRun) -> ReconcileVerdict {
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
