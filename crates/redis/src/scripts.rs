//! The Lua scripts, compiled into the binary with `include_str!`.
//!
//! Every script starts with `#!lua` (Redis 7 refuses a write script before it runs when out of
//! memory; for the nine that share the node prelude it is prepended here), names every key it touches in KEYS (all keys of one sale share a hash tag, so a
//! script runs on one cluster slot), does every check for a request before any write for it,
//! reads the clock with `TIME`, and validates its own arguments. `redis::Script` sends EVALSHA
//! and reloads the script on NOSCRIPT (after a restart, a failover or SCRIPT FLUSH).

use redis::Script;

use crate::keys::{CopyTag, Keys};

/// A script that writes or stamps a sale's copy: the shebang, the node prelude
/// (`scripts/node.lua`: which node a copy was opened on, and fencing a copy that moved), then
/// the script's own file (which therefore has no shebang of its own).
macro_rules! with_node {
    ($file:literal) => {
        concat!(
            "#!lua\n",
            include_str!("../scripts/node.lua"),
            include_str!($file)
        )
    };
}

/// A script that reads a copy's buyer records (layout 2): [`with_node!`] and the records
/// prelude (`scripts/records.lua`: the record's format, its parsing and the batch look-up).
macro_rules! with_records {
    ($file:literal) => {
        concat!(
            "#!lua\n",
            include_str!("../scripts/node.lua"),
            include_str!("../scripts/records.lua"),
            include_str!($file)
        )
    };
}

pub const PURCHASE: &str = with_records!("../scripts/purchase.lua");
/// Pay and cancel: the event kind is its third argument.
pub const RESOLVE: &str = with_records!("../scripts/resolve.lua");
pub const EXPIRE_DUE: &str = with_records!("../scripts/expire_due.lua");
/// One order of a copy, whichever its layout (reads only).
pub const ORDER: &str = with_records!("../scripts/order.lua");
pub const LOAD: &str = with_node!("../scripts/load.lua");
pub const FENCE: &str = include_str!("../scripts/fence.lua");
pub const OPEN: &str = with_node!("../scripts/open.lua");
pub const SET_STATE: &str = include_str!("../scripts/set_state.lua");
pub const SNAPSHOT: &str = with_node!("../scripts/snapshot.lua");
pub const LEASE_ACQUIRE: &str = include_str!("../scripts/lease_acquire.lua");
pub const LEASE_RELEASE: &str = include_str!("../scripts/lease_release.lua");
pub const RESTORE_ORDERS: &str = with_records!("../scripts/restore_orders.lua");
/// The two sides of a transfer of stock between buckets of a sale.
pub const TRANSFER_OUT: &str = with_node!("../scripts/transfer_out.lua");
pub const TRANSFER_IN: &str = with_node!("../scripts/transfer_in.lua");
/// A sale's admission state (queue and draw): one script, its first argument the operation.
pub const ADMISSION: &str = include_str!("../scripts/admission.lua");

/// Every script with its name (the `script` label of `flashsale_script_latency_seconds`).
pub const ALL: [(&str, &str); 15] = [
    ("purchase", PURCHASE),
    ("order", ORDER),
    ("resolve", RESOLVE),
    ("expire_due", EXPIRE_DUE),
    ("load", LOAD),
    ("fence", FENCE),
    ("open", OPEN),
    ("set_state", SET_STATE),
    ("snapshot", SNAPSHOT),
    ("lease_acquire", LEASE_ACQUIRE),
    ("lease_release", LEASE_RELEASE),
    ("restore_orders", RESTORE_ORDERS),
    ("transfer_out", TRANSFER_OUT),
    ("transfer_in", TRANSFER_IN),
    ("admission", ADMISSION),
];

/// The out side of one transfer alone, `units` from `source` to bucket `to` (no in after it,
/// no write confirmed): what a carrier that dies between the two sides leaves. For tests and
/// tools that set up such a cut; the ledger moves stock through its own transfers. The
/// script's reply: `OK` and the transfer's id, or `X` when the source lacks the units.
pub async fn transfer_out_alone(
    conn: &mut impl redis::aio::ConnectionLike,
    keys: &Keys,
    source: impl Into<CopyTag>,
    to: u16,
    units: u64,
) -> redis::RedisResult<Vec<String>> {
    Script::new(TRANSFER_OUT)
        .key(keys.transfer_out_side(source).to_vec())
        .arg(to)
        .arg(units)
        .invoke_async(conn)
        .await
}

/// The in side of transfer `id` alone, `units` from bucket `from` into `destination`: what a
/// carrier does after [`transfer_out_alone`], or an in that no out ever sent. For tests and
/// tools; the script's reply (`OK` when taken in now).
pub async fn transfer_in_alone(
    conn: &mut impl redis::aio::ConnectionLike,
    keys: &Keys,
    destination: impl Into<CopyTag>,
    id: &str,
    from: u16,
    units: u64,
) -> redis::RedisResult<String> {
    Script::new(TRANSFER_IN)
        .key(keys.transfer_in_side(destination).to_vec())
        .arg(id)
        .arg(from)
        .arg(units)
        .invoke_async(conn)
        .await
}

/// The scripts of the hot ledger, hashed once.
pub struct Scripts {
    pub purchase: Script,
    pub resolve: Script,
    pub expire_due: Script,
    pub order: Script,
    pub load: Script,
    pub fence: Script,
    pub open: Script,
    pub set_state: Script,
    pub snapshot: Script,
    pub restore_orders: Script,
    pub transfer_out: Script,
    pub transfer_in: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            purchase: Script::new(PURCHASE),
            resolve: Script::new(RESOLVE),
            expire_due: Script::new(EXPIRE_DUE),
            order: Script::new(ORDER),
            load: Script::new(LOAD),
            fence: Script::new(FENCE),
            open: Script::new(OPEN),
            set_state: Script::new(SET_STATE),
            snapshot: Script::new(SNAPSHOT),
            restore_orders: Script::new(RESTORE_ORDERS),
            transfer_out: Script::new(TRANSFER_OUT),
            transfer_in: Script::new(TRANSFER_IN),
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_starts_with_the_shebang_and_uses_the_server_clock() {
        for (name, src) in ALL {
            assert_eq!(src.lines().next(), Some("#!lua"), "{name}");
            assert!(!src.contains("PUBLISH"), "{name} publishes inside a script");
        }
        for src in [PURCHASE, RESOLVE, EXPIRE_DUE] {
            assert!(src.contains("redis.call('TIME')"));
            assert!(src.contains("XADD"));
        }
    }

    /// Every entry a script writes names its format version, so a reader of an older binary
    /// knows it cannot read it (and waits) instead of misreading it: a sale of one bucket's
    /// entries the version every release reads, a bucketed sale's (its purchases, resolutions,
    /// expiries, and every transfer side) the version of bucketed entries.
    #[test]
    fn every_stream_entry_carries_the_format_version() {
        use crate::codec::{FORMAT_BUCKETED, FORMAT_FIELD, FORMAT_ONE_COPY};
        let xadd = |v: &str| format!("'XADD', K_EVENTS, '*', '{FORMAT_FIELD}', {v},");
        let chosen = format!("'{FORMAT_BUCKETED}' or '{FORMAT_ONE_COPY}'");
        for (name, src) in ALL {
            let by_copy = src.matches(&xadd("entry_v")).count();
            let bucketed = src.matches(&xadd(&format!("'{FORMAT_BUCKETED}'"))).count();
            assert_eq!(src.matches("XADD").count(), by_copy + bucketed, "{name}");
            if by_copy > 0 {
                let line = src.lines().find(|l| l.starts_with("local entry_v = "));
                let line = line.unwrap_or_else(|| panic!("{name} never sets entry_v"));
                assert!(line.ends_with(&chosen), "{name}: {line}");
            }
        }
        for src in [TRANSFER_OUT, TRANSFER_IN] {
            assert_eq!(
                src.matches(&xadd(&format!("'{FORMAT_BUCKETED}'"))).count(),
                1
            );
        }
        for src in [PURCHASE, RESOLVE, EXPIRE_DUE] {
            assert_eq!(src.matches(&xadd("entry_v")).count(), 1);
        }
    }
}
