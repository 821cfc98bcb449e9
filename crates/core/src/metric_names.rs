//! The name of every metric the service exports, in one place (Prometheus conventions: base
//! units, `_seconds`, `_total`). Each crate records under these names; the server sets the
//! histogram buckets and serves `/metrics`. Labels are given per name.

/// Counter `{route, status, outcome}`: HTTP requests answered.
pub const HTTP_REQUESTS: &str = "flashsale_http_requests_total";
/// Histogram `{outcome}`: purchase latency as the server saw it.
pub const PURCHASE_LATENCY: &str = "flashsale_purchase_latency_seconds";
/// Counter `{outcome}`: purchases answered, by outcome.
pub const PURCHASES: &str = "flashsale_purchases_total";
/// Histogram `{script}`: one Redis script call.
pub const SCRIPT_LATENCY: &str = "flashsale_script_latency_seconds";
/// Histogram: one write confirmed by replicas (with `FLASHSALE_REDIS_WAIT_REPLICAS`): the
/// script and its `WAIT` go in one pipeline, so this is their round trip together.
pub const REDIS_WAIT_SECONDS: &str = "flashsale_redis_wait_seconds";
/// Counter: writes answered 503 because too few replicas acknowledged them in time.
pub const REDIS_WAIT_TIMEOUTS: &str = "flashsale_redis_wait_timeouts_total";
/// Histogram `{ledger}`: requests per ledger call.
pub const BATCH_SIZE: &str = "flashsale_batch_size";
/// Counter: purchases answered SOLD_OUT by an instance's local flag.
pub const SOLD_OUT_LOCAL: &str = "flashsale_sold_out_local_total";
/// Gauge: 1 while the hot ledger's circuit breaker is open.
pub const BREAKER_OPEN: &str = "flashsale_breaker_open";
/// Counter `{side = out | in}`: transfers of stock between the buckets of a sale, by side
/// applied (an out whose in is missing is in flight).
pub const BUCKET_TRANSFERS: &str = "flashsale_bucket_transfers_total";
/// Gauge `{sku, bucket}`: a bucket's available units, as last read by the ledger (when a
/// home runs short, and by `bucket_view`).
pub const BUCKET_AVAILABLE: &str = "flashsale_bucket_available_units";
/// Counter: units moved between buckets (counted at the in side).
pub const BUCKET_TRANSFER_UNITS: &str = "flashsale_bucket_transfer_units_total";
/// Counter: purchases answered SOLD_OUT by a bucketed sale while its buckets together still
/// held the quantity (after the bounded transfer rounds): must stay 0 outside the window of
/// units in flight.
pub const FALSE_SOLD_OUT: &str = "flashsale_false_sold_out_total";

/// Histogram: queue joins written by one write of the admission book (joins that arrive while
/// a group is written wait and go in the next: one commit, one script call per group).
pub const ADMISSION_JOIN_GROUP: &str = "flashsale_admission_join_group_joins";
/// Histogram: one group of queue joins written (a transaction on the database, a script
/// call on Redis); a join waits for the group ahead of its own and then its own.
pub const ADMISSION_JOIN_GROUP_SECONDS: &str = "flashsale_admission_join_group_seconds";

/// Gauge `{sku}`: events in a sale's stream not yet persisted.
pub const STREAM_LAG: &str = "flashsale_stream_lag_events";
/// Counter `{sku}`: events the persister applied.
pub const PERSISTED_EVENTS: &str = "flashsale_persisted_events_total";
/// Histogram: one persister batch (read, apply, ack).
pub const PERSIST_BATCH: &str = "flashsale_persist_batch_seconds";
/// Counter `{sku}`: accepted orders the database's guard refused (must stay 0).
pub const GUARD_REJECTIONS: &str = "flashsale_db_guard_rejections_total";
/// Counter `{sku}`: events the database's epoch fence refused (kept in `fenced_events`).
pub const FENCED_EVENTS: &str = "flashsale_fenced_events_total";
/// Counter `{sku}`: stream entries parked as dead letters (the stream stops).
pub const DEAD_LETTERS: &str = "flashsale_dead_letters_total";
/// Gauge `{sku}`: the format version of a stream entry this instance cannot read (newer
/// than its binary), while its persister waits on it for a newer instance; 0 once it reads
/// the sale's stream again.
pub const STREAM_UNKNOWN_FORMAT: &str = "flashsale_stream_unknown_format";
/// Counter `{sku}`: hold expiry passes of a sale that failed.
pub const EXPIRY_FAILURES: &str = "flashsale_expiry_failures_total";
/// Counter `{worker}`: steps a background worker ran (a pass, a discovery, a refresh).
pub const WORKER_TICKS: &str = "flashsale_worker_ticks_total";
/// Counter `{worker}`: steps of a background worker that failed (it retries).
pub const WORKER_ERRORS: &str = "flashsale_worker_errors_total";

/// Gauge `{sku, field}`: hot minus database counters after a reconciler run.
pub const RECONCILE_DIFF: &str = "flashsale_reconcile_diff";
/// Counter `{result = ok | mismatch | error}`: reconciler runs.
pub const RECONCILE_RUNS: &str = "flashsale_reconcile_runs_total";
/// Counter `{kind = replay | rebuild | expire}`: repairs made.
pub const RECONCILE_REPAIRS: &str = "flashsale_reconcile_repairs_total";
/// Counter `{sku}`: promises (purchases, resolutions) reported lost with the hot ledger.
pub const RECONCILE_LOST: &str = "flashsale_reconcile_lost_orders_total";
/// Gauge `{sku}`: invariant violations found by the last run.
pub const RECONCILE_VIOLATIONS: &str = "flashsale_reconcile_violations";
/// Gauge `{sku}`: 1 while the hot copy is behind the database.
pub const RECONCILE_HOT_BEHIND: &str = "flashsale_reconcile_hot_behind";

/// Counter `{scope = ip | user | instance | sale}`: requests refused by a rate limit.
pub const RATE_LIMITED: &str = "flashsale_rate_limited_total";
/// Counter: requests refused by the blacklist.
pub const BLACKLISTED: &str = "flashsale_blacklisted_total";
/// Counter `{result = allow | deny | timeout | error}`: calls to the shop's risk service.
pub const RISK_CALLS: &str = "flashsale_risk_calls_total";
/// Histogram: one call to the risk service, answered or not (bounded by its timeout).
pub const RISK_LATENCY: &str = "flashsale_risk_latency_seconds";
/// Counter `{by = service | fallback}`: purchases refused by the risk check (RISK_DENIED).
pub const RISK_DENIALS: &str = "flashsale_risk_denials_total";
/// Counter `{reason = timeout | error | breaker | saturated, decision = allow | deny}`:
/// purchases the fallback rule decided because the risk service gave no answer.
pub const RISK_FALLBACKS: &str = "flashsale_risk_fallbacks_total";
/// Counter: retries of accepted purchases that skipped the risk service or overruled its refusal.
pub const RISK_REPLAYS: &str = "flashsale_risk_replays_total";
/// Gauge: 1 while the circuit breaker in front of the risk service is open.
pub const RISK_BREAKER_OPEN: &str = "flashsale_risk_breaker_open";
/// Gauge `{sku}`: 1 while back-pressure holds.
pub const BACKPRESSURE: &str = "flashsale_backpressure_engaged";
/// Counter `{sku, to}`: back-pressure engaging or letting go.
pub const BACKPRESSURE_CHANGES: &str = "flashsale_backpressure_changes_total";
/// Counter: purchases refused by a sale's in-flight limit.
pub const SALE_INFLIGHT_REFUSED: &str = "flashsale_sale_inflight_refused_total";
/// Gauge: open client connections.
pub const OPEN_CONNECTIONS: &str = "flashsale_open_connections";
/// Counter: requests past the request timeout.
pub const TIMEOUTS: &str = "flashsale_request_timeouts_total";
/// Counter: requests shed by the in-flight cap.
pub const SHED: &str = "flashsale_requests_shed_total";

/// Fetches of the identity provider's key set, by result (`ok`, `error`).
pub const JWKS_FETCHES: &str = "flashsale_jwks_fetches_total";
/// 1 while the cached key set is served stale (the last fetch failed), else 0.
pub const JWKS_STALE: &str = "flashsale_jwks_stale";
/// Tokens naming a `kid` the cached key set lacks (rotations, and forged kids).
pub const JWKS_UNKNOWN_KID: &str = "flashsale_jwks_unknown_kid_total";

/// Counter `{sink}`: order events a sink acknowledged (NATS PubAck, webhook 2xx).
pub const EVENTS_DELIVERED: &str = "flashsale_events_delivered_total";
/// Counter `{sink}`: deliveries that failed (the relay retries them with backoff).
pub const EVENTS_FAILURES: &str = "flashsale_events_delivery_failures_total";
/// Gauge `{sink}`: stored events not yet delivered to the sink, over every stream.
pub const EVENTS_LAG: &str = "flashsale_events_lag_events";
/// Gauge `{sink}`: age of the oldest stored event not yet delivered (0 when none).
pub const EVENTS_OLDEST_AGE: &str = "flashsale_events_oldest_age_seconds";
/// Gauge `{sink}`: 1 while the sink is paused (an endpoint that kept failing), awaiting an operator.
pub const EVENTS_PAUSED: &str = "flashsale_events_sink_paused";
/// Histogram `{sink}`: from an event's time to the sink's acknowledgement.
pub const EVENTS_DELIVERY_LATENCY: &str = "flashsale_events_delivery_latency_seconds";
