//! flashsale-store: the system of record.
//!
//! - [`mysql`]: `MySqlStore`, the production `OrderStore` over MySQL/MariaDB.
//! - [`sqlite`]: `SqliteStore`, the embedded `OrderStore` over SQLite (WAL, synchronous=FULL).
//!
//! Migrations live in `migrations/mysql` and `migrations/sqlite` beside this crate (one
//! logical schema: `sales`, `orders`, `stock_events`, `dead_letters`), numbered alike; they
//! are expand-then-contract, and `compat` lets a binary run against a newer schema that
//! declares it compatible (`schema_compat`), so an instance restarted mid-upgrade or rolled
//! back starts.
//!
//! Both stores share, in private modules, everything that does not touch a connection:
//! `batch` (the fold of an `apply_events` batch into a plan of writes, the SQL text) and
//! `rows` (rows to domain types, error mapping). Each backend only reads, binds and writes
//! with its own column types (MySQL has unsigned integers, SQLite does not).
//!
//! May depend on flashsale-core and sqlx.

mod batch;
mod compat;
pub mod mysql;
mod rows;
pub mod sqlite;

pub use mysql::MySqlStore;
pub use sqlite::SqliteStore;
