//! `# HELP` text and units for every metric the service exports (the names of docs/DESIGN.md,
//! recorded by this crate and by the ledger, store and persister crates through the one global
//! recorder). The exporter writes HELP only for described metrics, and `promtool check metrics`
//! flags a metric without it.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Describes every metric; call once, after the recorder is installed.
pub fn describe() {
    describe_requests();
    describe_ledger();
    describe_persister();
    describe_gateway();
    describe_reconciler();
}

fn describe_requests() {
    describe_counter!(
        "flashsale_http_requests_total",
        "HTTP answers by route template and status."
    );
    describe_histogram!(
        "flashsale_purchase_latency_seconds",
        Unit::Seconds,
        "Purchase handling time in the server, by outcome."
    );
    describe_counter!(
        "flashsale_purchases_total",
        "Purchase answers by outcome (accepted, replayed or the error code)."
    );
    describe_counter!(
        "flashsale_sold_out_local_total",
        "Purchases answered SOLD_OUT by the local sold-out flag, without the ledger."
    );
    describe_histogram!(
        "flashsale_batch_size",
        Unit::Count,
        "Purchase requests per ledger call (natural batching), by ledger."
    );
}

fn describe_ledger() {
    describe_histogram!(
        "flashsale_script_latency_seconds",
        Unit::Seconds,
        "Redis Lua script round trip, by script."
    );
    describe_gauge!(
        "flashsale_breaker_open",
        "1 while the circuit breaker in front of the hot ledger is open."
    );
    describe_counter!(
        "flashsale_db_guard_rejections_total",
        "Accepted orders the database's guard refused (stored REJECTED; must stay 0), by sale."
    );
}

fn describe_persister() {
    describe_gauge!(
        "flashsale_stream_lag_events",
        "Events in a sale's Redis stream not yet stored in the database."
    );
    describe_counter!(
        "flashsale_persisted_events_total",
        "Events stored in the database by the persister, by sale."
    );
    describe_histogram!(
        "flashsale_persist_batch_seconds",
        Unit::Seconds,
        "Time to store one batch of events in the database."
    );
    describe_counter!(
        "flashsale_dead_letters_total",
        "Stream entries parked after repeated failures (the sale's stream pauses), by sale."
    );
}

fn describe_gateway() {
    describe_counter!(
        "flashsale_rate_limited_total",
        "Requests refused RATE_LIMITED, by scope (ip, user, instance, sale)."
    );
    describe_counter!(
        "flashsale_blacklisted_total",
        "Requests refused for a blacklisted user or address."
    );
    describe_gauge!(
        "flashsale_backpressure_engaged",
        "1 while a sale's purchases answer BUSY because its backlog is past the bound."
    );
    describe_counter!(
        "flashsale_backpressure_changes_total",
        "Back-pressure engaging and releasing, by sale and direction."
    );
    describe_counter!(
        "flashsale_sale_inflight_refused_total",
        "Purchases refused BUSY at a sale's in-flight cap."
    );
    describe_gauge!("flashsale_open_connections", "Client connections open now.");
    describe_counter!(
        "flashsale_request_timeouts_total",
        "Requests answered UNAVAILABLE after the request timeout."
    );
    describe_counter!(
        "flashsale_requests_shed_total",
        "Requests refused UNAVAILABLE at the instance's in-flight cap."
    );
}

fn describe_reconciler() {
    describe_gauge!(
        "flashsale_reconcile_diff",
        "Hot (in-flight folded) minus database counters after repairs, by sale and field."
    );
    describe_counter!(
        "flashsale_reconcile_runs_total",
        "Reconciler runs by result (ok, mismatch, error)."
    );
    describe_counter!(
        "flashsale_reconcile_repairs_total",
        "Repairs made by the reconciler, by kind (replay, rebuild, expire)."
    );
    describe_counter!(
        "flashsale_reconcile_lost_orders_total",
        "Accepted orders lost with the hot ledger, by sale."
    );
    describe_gauge!(
        "flashsale_reconcile_violations",
        "Invariant violations found by the last reconciler run, by sale."
    );
    describe_gauge!(
        "flashsale_reconcile_hot_behind",
        "1 when the last run found a sale's hot copy missing or behind the database."
    );
}
