//! The Prometheus recorder (installed once per process) and the names of the metrics the
//! server itself records. Histograms get buckets, so they export as histograms, not summaries.

use std::sync::OnceLock;

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
                .set_buckets_for_metric(
                    Matcher::Full("flashsale_batch_size".into()),
                    &BATCH_BUCKETS,
                )
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

pub const HTTP_REQUESTS: &str = "flashsale_http_requests_total";
pub const PURCHASE_LATENCY: &str = "flashsale_purchase_latency_seconds";
pub const BATCH_SIZE: &str = "flashsale_batch_size";
pub const SOLD_OUT_LOCAL: &str = "flashsale_sold_out_local_total";
pub const BREAKER_OPEN: &str = "flashsale_breaker_open";
