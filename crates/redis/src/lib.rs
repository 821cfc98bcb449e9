//! flashsale-redis: the Redis hot ledger.
//!
//! - [`admission`]: `RedisAdmission`, a sale's admission state (queue, draw) in its slot.
//! - [`keys`]: the key schema; every key of a hot copy carries its hash tag (`{<sku>}`).
//! - [`placement`]: where a sale's buckets live: each bucket's hash tag, salted so that the
//!   buckets land on distinct primaries of the cluster's slot map.
//! - [`scripts`]: the Lua scripts (`scripts/*.lua`, loaded with `include_str!`).
//! - [`bucketed`]: sales of several buckets, each a hot copy of its own on its own primary,
//!   and the transfers of stock between them.
//! - [`ledger`]: `RedisLedger`, the hot ledger over Redis or Redis Cluster (lazy connection,
//!   fenced copies), with named hot sales on a Redis of their own when asked.
//! - `restock`: restocks told across instances (PUBLISH, and the subscription the service
//!   runs as a worker).
//! - [`stream`]: reading a sale's event stream (consumer group, claim, ack, trim, lease).
//! - [`conn`]: one connection type over a node or a cluster, and error mapping.
//! - [`codec`]: how orders and events are stored and parsed; the stream format version.
//!
//! May depend on flashsale-core and redis-rs; never on sqlx or the server.

pub mod admission;

pub mod codec;
pub mod conn;
pub mod keys;
pub mod ledger;
pub mod placement;
mod restock;
pub mod scripts;
pub mod stream;

pub use codec::{Entry, EntryError, Item, FORMAT_BUCKETED, FORMAT_ONE_COPY, FORMAT_VERSION};
pub use keys::{slot, CopyTag, Keys};
pub use ledger::{BucketState, BucketStats, BucketsView, Layout};
pub use ledger::{RedisLedger, Replication, Snapshot};
pub use stream::{AutoClaimed, PendingSummary, StreamReader, GROUP};
