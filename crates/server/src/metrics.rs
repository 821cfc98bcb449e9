//! The Prometheus recorder (installed once per process). Histograms get buckets, so they
//! export as histograms, not summaries. Every metric's name lives in
//! `flashsale_core::metric_names`; the ones the request path uses are re-exported here.

use std::sync::OnceLock;

use flashsale_core::metric_names::ADMISSION_JOIN_GROUP;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Seconds: 50 µs … 10 s.
const LATENCY_BUCKETS_S: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];
const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Installs the global recorder on first call; later calls return the same handle.
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS_S)
                .expect("non-empty buckets")
                .set_buckets_for_metric(Matcher::Full(BATCH_SIZE.into()), &BATCH_BUCKETS)
                .expect("non-empty buckets")
                .set_buckets_for_metric(Matcher::Full(ADMISSION_JOIN_GROUP.into()), &BATCH_BUCKETS)
                .expect("non-empty buckets");
            match builder.install_recorder() {
                Ok(handle) => {
                    crate::metrics_help::describe();
                    handle
                }
                // Another recorder is installed (a test harness): render an empty one.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

pub use flashsale_core::metric_names::{
    BATCH_SIZE, BREAKER_OPEN, HTTP_REQUESTS, PURCHASE_LATENCY, SOLD_OUT_LOCAL,
};
