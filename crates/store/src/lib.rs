//! flashsale-store: the system of record.
//!
//! - [`store`]: [`Store`], every `OrderStore` method written once over a [`Backend`]: the
//!   apply of a batch, audits, fenced events, dead letters, reconcile runs, migrations.
//! - [`backend`]: the [`Backend`] trait, what a database gives that algorithm (its dialect,
//!   binds and column types, migrations, the steps that differ), in the manner of sqlx's
//!   `Migrate`.
//! - [`events`]: the order-event relay's side ([`flashsale_core::events::EventLog`]): the
//!   ordered event log per stream, each sink's lease, pause and delivered positions.
//! - [`notices`]: sale notices (an order reported lost, a sale sold out), an ordered log per
//!   sale written in the transaction that makes each true, read by the relay as a stream.
//! - [`sql`]: the SQL text, written once with `?` placeholders, and each dialect's clauses
//!   (public: the embedded ledger's writer runs the store's statements).
//! - [`mysql`]: `MySqlStore`, the production backend over MySQL/MariaDB.
//! - [`postgres`]: `PgStore`, the backend over PostgreSQL.
//! - [`admission`]: a sale's admission state (queue, draw) in the database, the book of a
//!   sale on the embedded ledger (`AdmissionBook`; a group of queue joins in one commit).
//! - [`sqlite`]: `SqliteStore`, the embedded backend over SQLite (WAL, synchronous=FULL).
//!
//! Migrations live in `migrations/mysql`, `migrations/postgres` and `migrations/sqlite`
//! beside this crate (one logical schema: `sales`, `orders`, `stock_events`, `dead_letters`,
//! a bucketed sale's `sale_buckets` and `stock_transfers`),
//! numbered alike; they are expand-then-contract, and `compat` lets a binary run against a
//! newer schema that declares it compatible (`schema_compat`), so an instance restarted
//! mid-upgrade or rolled back starts.
//!
//! Private modules hold what touches no connection: `batch` (the fold of an `apply_events`
//! batch into a plan of writes) and `rows` (rows to domain types, error mapping).
//!
//! May depend on flashsale-core and sqlx.

pub mod admission;
pub mod backend;
mod batch;
mod compat;
pub mod events;
pub mod mysql;
pub mod notices;
pub mod postgres;
mod rows;
pub mod sql;
pub mod sqlite;
pub mod store;

pub use backend::{Backend, Server};
pub use mysql::MySqlStore;
pub use postgres::PgStore;
pub use sqlite::SqliteStore;
pub use store::{ContractReport, Store};
