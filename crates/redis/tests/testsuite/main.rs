//! The crate's integration tests, one binary (each former test file is a module).

mod bucket_failover;
mod bucket_faults;
mod buckets;
mod cluster;
mod common;
mod conformance;
mod failover;
mod faults;
mod layout;
mod model;
mod restock;
mod restore;
mod scripts;
mod stream;
mod stream_format;
