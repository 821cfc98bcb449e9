//! flashsale-store: the system of record.
//!
//! - [`mysql`]: `MySqlStore`, the production `OrderStore` over MySQL/MariaDB.
//! - [`sqlite`]: `SqliteStore`, the embedded `OrderStore` over SQLite (WAL, synchronous=FULL).
//! - [`persister`]: the worker that moves a sale's Redis Stream into an `OrderStore`, one
//!   writer per sale (lease), one transaction per batch, XACK after commit.
//!
//! Migrations live in `migrations/mysql` and `migrations/sqlite` beside this crate.
//! May depend on flashsale-core, flashsale-redis (the persister reads streams), sqlx, redis.

mod batch;
pub mod mysql;
pub mod persister;
mod rows;
pub mod sqlite;

pub use mysql::MySqlStore;
pub use sqlite::SqliteStore;
