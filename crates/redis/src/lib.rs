//! flashsale-redis: the Redis hot ledger.
//!
//! - [`keys`]: the key schema; every key of a sale carries the hash tag `{<sku>}`.
//! - [`scripts`]: the Lua scripts (`scripts/*.lua`, loaded with `include_str!`).
//! - [`ledger`]: `RedisLedger`, the `HotLedger` over Redis or Redis Cluster.
//! - [`stream`]: reading a sale's event stream (consumer group, claim, ack, trim, lease).
//!
//! May depend on flashsale-core and redis-rs; never on sqlx or the server.
