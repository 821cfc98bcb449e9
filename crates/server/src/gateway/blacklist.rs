//! The instance's copy of the gateway's lists ([`Blacklist`]): blocked users and client IPs,
//! the sales that require a purchase token, and the risk check's lists. Stored behind
//! `BlacklistStore` (`flashsale_engine::gateway_store`: Redis sets for the Redis ledger, the
//! database for the embedded one), reloaded in the background every `blacklist_refresh` and at
//! once after an admin change, so a request checks it without any I/O.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use flashsale_core::{SkuId, UserId};
use flashsale_engine::gateway_store::{BlacklistSnapshot, BlacklistStore};

use crate::risk::Fallback;

/// The sales' own risk fallback rules of a stored snapshot, read; a rule the server cannot
/// read is skipped.
pub fn risk_fallbacks(stored: &HashMap<u64, String>) -> HashMap<u64, Fallback> {
    stored
        .iter()
        .filter_map(|(sku, rule)| Some((*sku, Fallback::parse(rule).ok()?)))
        .collect()
}

/// A stored snapshot with its fallback rules read once, at reload.
#[derive(Default)]
struct Copy {
    lists: BlacklistSnapshot,
    risk_fallback: HashMap<u64, Fallback>,
}

/// The instance's copy of the blacklist: read per request without I/O, reloaded in the background.
pub struct Blacklist {
    pub store: Arc<dyn BlacklistStore>,
    snapshot: RwLock<Arc<Copy>>,
    /// The last background reload failed (logged once per change).
    pub failing: std::sync::atomic::AtomicBool,
}

impl Blacklist {
    pub fn new(store: Arc<dyn BlacklistStore>) -> Blacklist {
        Blacklist {
            store,
            snapshot: RwLock::new(Arc::new(Copy::default())),
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn user_blocked(&self, user: UserId) -> bool {
        self.snapshot
            .read()
            .expect("blacklist lock")
            .lists
            .users
            .contains(&user.0)
    }

    pub fn ip_blocked(&self, ip: IpAddr) -> bool {
        self.snapshot
            .read()
            .expect("blacklist lock")
            .lists
            .ips
            .contains(&ip)
    }

    /// Whether a user is on the risk allowlist.
    pub fn risk_allowed(&self, user: UserId) -> bool {
        let snapshot = self.snapshot.read().expect("blacklist lock");
        snapshot.lists.risk_allow.contains(&user.0)
    }

    /// A sale's own risk fallback rule, if an admin set one.
    pub fn risk_fallback(&self, sku: SkuId) -> Option<Fallback> {
        let snapshot = self.snapshot.read().expect("blacklist lock");
        snapshot.risk_fallback.get(&sku.0).copied()
    }

    pub fn token_required(&self, sku: SkuId) -> bool {
        self.snapshot
            .read()
            .expect("blacklist lock")
            .lists
            .token_sales
            .contains(&sku.0)
    }

    /// Reloads the copy from the store (keeps the old copy when the store fails).
    pub async fn refresh(&self) -> Result<(), String> {
        let lists = self.store.load().await?;
        let risk_fallback = risk_fallbacks(&lists.risk_fallback);
        let fresh = Copy {
            lists,
            risk_fallback,
        };
        *self.snapshot.write().expect("blacklist lock") = Arc::new(fresh);
        Ok(())
    }
}
