//! `# HELP` text and units for every metric the service exports (the names of docs/DESIGN.md,
//! recorded by this crate and by the ledger, store and persister crates through the one global
//! recorder). The exporter writes HELP only for described metrics, and `promtool check metrics`
//! flags a metric without it.

use flashsale_core::metric_names as names;
use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Describes every metric; call once, after the recorder is installed.
pub fn describe() {
    describe_requests();
    describe_ledger();
    describe_persister();
    describe_gateway();
    describe_risk();
    describe_reconciler();
    describe_identity();
    describe_events();
}

fn describe_events() {
    describe_counter!(
        names::EVENTS_DELIVERED,
        "Order events a sink acknowledged (NATS PubAck, webhook 2xx), by sink."
    );
    describe_counter!(
        names::EVENTS_FAILURES,
        "Order-event deliveries that failed and will be retried with backoff, by sink."
    );
    describe_gauge!(
        names::EVENTS_LAG,
        "Stored order events not yet delivered to the sink, over every stream."
    );
    describe_gauge!(
        names::EVENTS_OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest stored order event the sink has not acknowledged (0 when none)."
    );
    describe_gauge!(
        names::EVENTS_PAUSED,
        "1 while the sink is paused after failing in a row, until an operator resumes it."
    );
    describe_histogram!(
        names::EVENTS_DELIVERY_LATENCY,
        Unit::Seconds,
        "From an order event's time to the sink's acknowledgement."
    );
}

fn describe_identity() {
    describe_counter!(
        names::JWKS_FETCHES,
        "Fetches of the identity provider's key set, by result (ok, error)."
    );
    describe_gauge!(
        names::JWKS_STALE,
        "1 while the cached key set is served because the last fetch failed."
    );
    describe_counter!(
        names::JWKS_UNKNOWN_KID,
        "Tokens naming a kid the cached key set lacks (a rotation, or forged)."
    );
}

fn describe_risk() {
    describe_counter!(
        names::RISK_CALLS,
        "Calls to the shop's risk service, by result (allow, deny, timeout, error)."
    );
    describe_histogram!(
        names::RISK_LATENCY,
        Unit::Seconds,
        "One call to the risk service, answered or not (bounded by FLASHSALE_RISK_TIMEOUT_MS)."
    );
    describe_counter!(
        names::RISK_DENIALS,
        "Purchases refused with RISK_DENIED, by who refused (service, fallback)."
    );
    describe_counter!(
        names::RISK_FALLBACKS,
        "Purchases the fallback rule decided, by why the service gave no answer and the decision."
    );
    describe_counter!(
        names::RISK_REPLAYS,
        "Retries of accepted purchases that skipped the risk service or overruled its refusal."
    );
    describe_gauge!(
        names::RISK_BREAKER_OPEN,
        "1 while the circuit breaker in front of the risk service is open."
    );
}

fn describe_requests() {
    describe_counter!(
        names::HTTP_REQUESTS,
        "HTTP answers by route template and status."
    );
    describe_histogram!(
        names::PURCHASE_LATENCY,
        Unit::Seconds,
        "Purchase handling time in the server, by outcome."
    );
    describe_counter!(
        names::PURCHASES,
        "Purchase answers by outcome (accepted, replayed or the error code)."
    );
    describe_counter!(
        names::SOLD_OUT_LOCAL,
        "Purchases answered SOLD_OUT by the local sold-out flag, without the ledger."
    );
    describe_histogram!(
        names::BATCH_SIZE,
        Unit::Count,
        "Purchase requests per ledger call (natural batching), by ledger."
    );
    describe_histogram!(
        names::ADMISSION_JOIN_GROUP,
        Unit::Count,
        "Queue joins per write of the admission book (one commit or script call per group)."
    );
    describe_histogram!(
        names::ADMISSION_JOIN_GROUP_SECONDS,
        Unit::Seconds,
        "One group of queue joins written to the admission book."
    );
}

fn describe_ledger() {
    describe_histogram!(
        names::SCRIPT_LATENCY,
        Unit::Seconds,
        "Redis Lua script round trip, by script."
    );
    describe_histogram!(
        names::REDIS_WAIT_SECONDS,
        Unit::Seconds,
        "A write script and its WAIT for replicas, one pipeline (FLASHSALE_REDIS_WAIT_REPLICAS set)."
    );
    describe_counter!(
        names::REDIS_WAIT_TIMEOUTS,
        "Writes answered 503 because fewer replicas than asked acknowledged them in time."
    );
    describe_gauge!(
        names::BREAKER_OPEN,
        "1 while the circuit breaker in front of the hot ledger is open."
    );
    describe_counter!(
        names::BUCKET_TRANSFERS,
        "Transfers of stock between the buckets of a sale, by side applied (out, in)."
    );
    describe_gauge!(
        names::BUCKET_AVAILABLE,
        "A bucket's available units, as the ledger last read them, by sale and bucket."
    );
    describe_counter!(
        names::BUCKET_TRANSFER_UNITS,
        "Units moved between the buckets of a sale."
    );
    describe_counter!(
        names::FALSE_SOLD_OUT,
        "SOLD_OUT answers while the sale's buckets together held the quantity (must stay 0)."
    );
    describe_counter!(
        names::GUARD_REJECTIONS,
        "Accepted orders the database's guard refused (stored REJECTED; must stay 0), by sale."
    );
}

fn describe_persister() {
    describe_gauge!(
        names::STREAM_LAG,
        "Events in a sale's Redis stream not yet stored in the database."
    );
    describe_counter!(
        names::PERSISTED_EVENTS,
        "Events stored in the database by the persister, by sale."
    );
    describe_histogram!(
        names::PERSIST_BATCH,
        Unit::Seconds,
        "Time to store one batch of events in the database."
    );
    describe_counter!(
        names::DEAD_LETTERS,
        "Stream entries parked after repeated failures (the sale's stream pauses), by sale."
    );
    describe_gauge!(
        names::STREAM_UNKNOWN_FORMAT,
        "Format version of a stream entry newer than this instance reads, while its persister waits on it (0: reading), by sale."
    );
    describe_counter!(
        names::FENCED_EVENTS,
        "Events refused by the database's epoch fence (kept in fenced_events, reported), by sale."
    );
    describe_counter!(
        names::EXPIRY_FAILURES,
        "Hold expiry passes of one sale that failed (the other sales go on), by sale."
    );
    describe_counter!(
        names::WORKER_TICKS,
        "Steps a background worker ran (a pass, a discovery, a refresh), by worker."
    );
    describe_counter!(
        names::WORKER_ERRORS,
        "Steps of a background worker that failed (it retries at its next step), by worker."
    );
}

fn describe_gateway() {
    describe_counter!(
        names::RATE_LIMITED,
        "Requests refused RATE_LIMITED, by scope (ip, user, instance, sale)."
    );
    describe_counter!(
        names::BLACKLISTED,
        "Requests refused for a blacklisted user or address."
    );
    describe_gauge!(
        names::BACKPRESSURE,
        "1 while a sale's purchases answer BUSY because its backlog is past the bound."
    );
    describe_counter!(
        names::BACKPRESSURE_CHANGES,
        "Back-pressure engaging and releasing, by sale and direction."
    );
    describe_counter!(
        names::SALE_INFLIGHT_REFUSED,
        "Purchases refused BUSY at a sale's in-flight cap."
    );
    describe_gauge!(names::OPEN_CONNECTIONS, "Client connections open now.");
    describe_counter!(
        names::TIMEOUTS,
        "Requests answered UNAVAILABLE after the request timeout."
    );
    describe_counter!(
        names::SHED,
        "Requests refused UNAVAILABLE at the instance's in-flight cap."
    );
}

fn describe_reconciler() {
    describe_gauge!(
        names::RECONCILE_DIFF,
        "Hot (in-flight folded) minus database counters after repairs, by sale and field."
    );
    describe_counter!(
        names::RECONCILE_RUNS,
        "Reconciler runs by result (ok, mismatch, error)."
    );
    describe_counter!(
        names::RECONCILE_REPAIRS,
        "Repairs made by the reconciler, by kind (replay, rebuild, expire)."
    );
    describe_counter!(
        names::RECONCILE_LOST,
        "Accepted orders lost with the hot ledger, by sale."
    );
    describe_gauge!(
        names::RECONCILE_VIOLATIONS,
        "Invariant violations found by the last reconciler run, by sale."
    );
    describe_gauge!(
        names::RECONCILE_HOT_BEHIND,
        "1 when the last run found a sale's hot copy missing or behind the database."
    );
}
