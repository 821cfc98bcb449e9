//! The store's integration tests, one binary (each former test file is a module): every
//! backend (MariaDB, PostgreSQL, SQLite) against the same bodies, the short apply path,
//! rolling schema upgrades and the order-event relay's rows.

mod buckets;
mod events;
mod schema_compat;
mod short_apply;
mod store;
