//! `RedisLedger`: the hot ledger over Redis or Redis Cluster, one file a concern. Each file
//! uses only the files listed above it, never one below:
//!
//! - `layout`: where a sale's buckets live ([`Layout`]) and what the ledger keeps of them.
//! - `setup`: the [`RedisLedger`] itself: connection, settings, and reading a sale's layout.
//! - `place`: a salt per bucket, so that a sale's buckets land on distinct primaries.
//! - `call`: running a script (deadline, latency, NOSCRIPT, WAIT for replicas), the restock
//!   announcement.
//! - `copy`: one hot copy's scripts but the purchase: pay or cancel, expiry, load, state,
//!   counters.
//! - `snapshot`: a copy's hash and stream read at once, and orders put back into it.
//! - `transfers`: stock moved between the buckets of a sale (out, in, finish, restore).
//! - `bucketed`: what a purchase on a sale of several buckets asks of its buckets: whether
//!   the sale may still serve, the buyers' limits, stock brought home; the buckets' view.
//! - `purchase`: the purchase, top-down (`HotPurchases`): the sale's layout, one script call
//!   per copy, a bucketed sale's rounds at home; calls the files above, never back.
//! - `copies`, `hot`, `sold_out`: the other core traits (`HotCopies`, `HotLedger`,
//!   `SoldOutSupport`), each a dispatch to the one copy or the buckets of a sale.

mod bucketed;
mod call;
mod copies;
mod copy;
mod hot;
mod layout;
mod place;
mod purchase;
mod setup;
mod snapshot;
mod sold_out;
mod transfers;

pub use bucketed::{BucketState, BucketStats, BucketsView};
pub use copy::EXPIRE_MAX;
pub use layout::{Layout, LAYOUTS_MAX};
pub use purchase::ROUNDS_MAX;
pub use setup::{RedisLedger, Replication, WAIT_TIMEOUT_MAX};
pub use snapshot::Snapshot;
