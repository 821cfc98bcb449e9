//! The seeded fault schedules: one harness, one module per concern, and two drivers:
//! [`loopback`] (one Redis, processes on loopback) and [`cluster`] (a partitioned Redis Cluster
//! in network namespaces). The cluster's driver reuses the loopback's workload, probes,
//! checker and database reader, and has its own plan, processes, nemesis and run.

pub mod checker;
pub mod cluster_copies;
pub mod cluster_nemesis;
pub mod cluster_plan;
pub mod cluster_procs;
pub mod cluster_run;
pub mod db;
pub mod events_relay;
pub mod nemesis;
pub mod plan;
pub mod probe;
pub mod procs;
pub mod report;
pub mod run;
pub mod seeds;
pub mod workload;

mod cluster;
mod loopback;
