//! The engine's integration tests, one binary: the persister and the reconciler on real Redis
//! with each system of record (MariaDB, PostgreSQL), and the stream's format across a rolling
//! upgrade.

mod bucket_faults;
mod common;
mod persister;
mod reconcile;
mod stream_upgrade;
