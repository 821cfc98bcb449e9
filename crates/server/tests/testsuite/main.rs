//! The server's integration tests, one binary (each former test file is a module): the whole
//! service over real HTTP on Redis+MariaDB, Redis+PostgreSQL and the embedded ledger, its
//! gateway, identity, risk service, dashboard, deployment files, stock buckets and faults.

#[macro_use]
mod common;

mod admission;
mod api;
mod bucket_counters;
mod buckets;
mod buckets_transfers;
mod cluster;
mod dashboard;
mod dashboard_api;
mod deploy;
mod events;
mod faults;
mod first_load;
mod gateway;
mod hostile;
mod hostile_model;
mod hot_sales;
mod identity;
mod lifecycle;
mod openapi;
mod openapi_extra;
mod persister_recovery;
mod reconcile_faults;
mod risk;
mod shutdown;
mod spike;
