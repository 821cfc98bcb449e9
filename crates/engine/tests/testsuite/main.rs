//! The engine's integration tests, one binary: the persister and the reconciler on real Redis
//! with each system of record (MariaDB, PostgreSQL), and the stream's format across a rolling
//! upgrade; order events to a real nats-server and a real webhook receiver; admission (queue
//! and draw) on the embedded ledger and on Redis.

mod admission;
mod bucket_faults;
mod common;
mod events;
mod persister;
mod rebuild_traps;
mod reconcile;
mod shop;
mod stream_upgrade;
