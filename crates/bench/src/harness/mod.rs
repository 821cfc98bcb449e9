//! The harness behind `flashsale bench`: the project's measurements (run in release mode).
//! Each prints ratios measured in one run and writes JSON under `<data dir>/reports/`.
//!
//! - [`http`]: `bench http`, /healthz vs the accepted and the sold-out purchase paths over
//!   HTTP, the server in this process; [`alone`]: `bench http --server-bin`, the server as
//!   its own process; [`risk`]: the bench's own risk service.
//! - [`ledger`]: `bench ledger`, the embedded ledger in-process.
//! - [`compare`]: `bench strategies`, the seeds' designs ([`strategies`]) against ours.
//! - [`persister`]: `bench persister`, the persister's drain rate.
//! - [`relay`]: `bench relay`, the order-event relay's throughput to NATS JetStream and to a
//!   webhook receiver, and commit → PubAck latency at a steady rate.
//! - [`script`]: `bench script`, the purchase script's cost to Redis, part by part.
//! - [`buckets`]: `bench buckets`, one hot sale over a Redis Cluster's primaries.
//! - [`spike`]: `bench spike`, a spike of buyers at running instances, with a report.
//! - [`setup`]: what they share (tokens, sales, fresh databases, processes to meter).
//!
//! Arrows point one way: every bench may use [`setup`]; [`alone`] and [`compare`] use the
//! arguments of [`http`] and the strategies of [`strategies`]; nothing here uses this module
//! but the dispatcher below.

pub mod alone;
pub mod buckets;
pub mod compare;
pub mod http;
pub mod ledger;
pub mod persister;
pub mod relay;
pub mod risk;
pub mod script;
pub mod setup;
pub mod spike;
pub mod strategies;

use clap::Subcommand;

/// The measurements `flashsale bench` runs (`bench spike` is the binary's own: it reads the
/// service's settings for its secrets, then calls [`spike::run`]).
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// /healthz vs purchase success path vs sold-out path over HTTP.
    Http(http::HttpArgs),
    /// The embedded ledger in-process: purchases committed per second.
    Ledger(ledger::LedgerArgs),
    /// One hot SKU, one strategy after another: the seeds' designs against ours.
    Strategies(compare::StrategiesArgs),
    /// Persister drain rate: batched transactions vs one transaction per event.
    Persister(persister::PersisterArgs),
    /// The order-event relay: events/s to NATS JetStream and to a webhook receiver, and
    /// commit → PubAck latency at a steady rate.
    Relay(relay::RelayArgs),
    /// The purchase script's cost to Redis per purchase, part by part.
    Script(script::ScriptArgs),
    /// One hot sale on a Redis Cluster with one bucket and with several: Redis CPU per
    /// purchase on the busiest primary and on all nodes, and no false sold-out.
    Buckets(buckets::BucketsArgs),
}

/// Runs one measurement.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Http(args) if !args.server_bin.is_empty() => alone::run(&args).await,
        BenchCommand::Http(args) => http::run(args).await,
        BenchCommand::Ledger(args) => ledger::run(args).await,
        BenchCommand::Strategies(args) => compare::run(args).await,
        BenchCommand::Persister(args) => persister::run(args).await,
        BenchCommand::Relay(args) => relay::run(args).await,
        BenchCommand::Script(args) => script::run(args).await,
        BenchCommand::Buckets(args) => buckets::run(args).await,
    }
}
