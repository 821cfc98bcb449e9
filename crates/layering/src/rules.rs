//! The rules, as data: which workspace crates each crate may depend on, and the module rules
//! inside the server crate.

/// Each workspace crate and the workspace crates its `[dependencies]` may name. Dev-dependencies
/// may add `flashsale-testkit`. The binary sits on top: nothing depends on it.
pub const CRATE_DEPS: &[(&str, &[&str])] = &[
    ("flashsale-core", &[]),
    ("flashsale-redis", &[CORE]),
    ("flashsale-store", &[CORE]),
    ("flashsale-embedded", &[CORE, STORE]),
    ("flashsale-engine", &[CORE, REDIS, STORE, EMBEDDED]),
    ("flashsale-server", &[CORE, REDIS, STORE, EMBEDDED, ENGINE]),
    ("flashsale-testkit", &[CORE]),
    (
        "flashsale-bench",
        &[CORE, REDIS, STORE, EMBEDDED, ENGINE, SERVER],
    ),
    (
        "flashsale",
        &[CORE, REDIS, STORE, EMBEDDED, ENGINE, SERVER, BENCH],
    ),
    ("flashsale-layering", &[]),
];

const CORE: &str = "flashsale-core";
const REDIS: &str = "flashsale-redis";
const STORE: &str = "flashsale-store";
const EMBEDDED: &str = "flashsale-embedded";
const ENGINE: &str = "flashsale-engine";
const SERVER: &str = "flashsale-server";
const BENCH: &str = "flashsale-bench";

/// The crates any crate's dev-dependencies may add to its own.
pub const DEV_EXTRA: &[&str] = &["flashsale-testkit"];

/// Server modules that read the shared state (handlers, middleware, workers, the assembly).
/// Every other top-level module of the server is a part the state holds, and a part never
/// imports a reader nor names `AppState`: arrows run from readers to parts only.
pub const SERVER_READERS: &[&str] = &[
    "state",
    "routes",
    "middleware",
    "workers",
    "serve",
    "openapi",
    "openapi_extra",
];

/// The engine's parts (as the server's state held them before the engine's `Shop` did, and as
/// the shop's accessors are named). A handler under `routes/` that names one, as a field of
/// the state or an accessor of the shop, drives the engine's parts itself instead of asking
/// the shop for a use case.
pub const ENGINE_PARTS: &[&str] = &[
    "ledger", "store", "batcher", "sales", "buckets", "sold_out", "breaker", "journal", "nudges",
];

/// The engine modules a handler may name: the application's use cases and their outcomes.
pub const ENGINE_API: &[&str] = &["shop"];
