//! flashsale-engine: everything the service decides and runs that is not HTTP.
//!
//! - [`settings`]: the one settings tree (`Settings`: ledger, database, persister, reconcile);
//!   [`backends`]: the ledger and store it names, opened once, and the workers every process
//!   runs.
//! - [`shop`]: the application: `Shop` owns the parts a serving process runs on and offers
//!   the use cases (purchase, pay, cancel, sales, views, admission, reconcile); the HTTP
//!   server only translates. Its purchase holds the shop's [`Batcher`](shop::Batcher): the
//!   local sold-out flag, and natural batching per sale into one ledger call.
//! - [`admission`]: who may buy a queue or draw sale: joins, waves, places and passes, the
//!   purchase's pass check, draw entries, the published draw and the waitlist's reservations.
//! - [`cache`]: the sale cache and the sold-out flags; [`breaker`]: fast failure while a
//!   sale's hot ledger fails.
//! - [`placement`]: where each sale's hot copy lives (the configured ledger, or a dedicated
//!   Redis for the named hot sales).
//! - [`gateway_store`]: where the gateway's lists, used purchase tokens and `Idempotency-Key`
//!   bindings are kept (Redis, the embedded database, memory).
//! - [`persister`]: moves each sale's Redis Stream into the system of record, one writer per
//!   sale (lease), one transaction per batch, XACK after commit.
//! - [`reconcile`]: the reconciler (`diff`, its `worker`), the loss `journal`, and the hot
//!   copy's lifecycle (`rebuild`).
//! - [`relay`]: order events from the system of record's event log to NATS JetStream and
//!   signed webhooks (one relay per sink under a database lease, positions after the ack).
//! - [`runner`]: the `Worker` contract and the one runner of every worker (loop, shutdown,
//!   stop deadline, error logging, metrics); [`workers`]: the workers of no other module
//!   (hold expiry, restock subscriptions).
//!
//! May depend on flashsale-core, flashsale-redis, flashsale-store and flashsale-embedded;
//! never on an HTTP crate (axum, tower, hyper, utoipa). The server and the binary depend on it.

pub mod admission;
pub mod backends;
pub mod breaker;
pub mod cache;
pub mod gateway_store;
pub mod persister;
pub mod placement;
pub mod reconcile;
pub mod relay;
pub mod runner;
pub mod settings;
pub mod shop;
pub mod workers;

/// Milliseconds since the Unix epoch (the clock every timestamp of the service uses).
pub use flashsale_core::clock::now_ms;
