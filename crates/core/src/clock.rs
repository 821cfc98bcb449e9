//! The wall clock, read in one place: milliseconds since the Unix epoch. The rules never read
//! it (`SaleBook` takes the time as an argument; Redis scripts use Redis `TIME`); the callers
//! that stamp times (the embedded ledger, the store, the reconciler, the routes) read it here.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in ms since the Unix epoch (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
