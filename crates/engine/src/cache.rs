//! Per-instance caches: sale metadata (and public counters, at most 1 s old), and sold-out
//! flags that answer SOLD_OUT without asking the ledger.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashsale_core::ledger::StoredSale;
use flashsale_core::{Counters, RequestKey, SkuId};

/// Sold-out flag and sale cache lifetime, by default.
pub const CACHE_TTL_DEFAULT: Duration = Duration::from_secs(1);

/// Entries kept at most; the map is cleared when full (a bound on memory under junk ids).
const ENTRIES_MAX: usize = 10_000;

/// A map by sale, hashed with aHash (seeded per process): every purchase looks a sale up in two
/// of these, and SipHash of the key cost more than the rest of the look-up.
type BySku<V> = HashMap<SkuId, V, ahash::RandomState>;

/// A sold-out sale's accepted request keys, hashed with aHash: a refusal looks its key up in
/// them, at every request of a spike.
pub type AcceptedKeys = HashSet<RequestKey, ahash::RandomState>;

/// When an entry was fetched, and the sale (`None`: known not to exist).
type SaleEntry = (Instant, Option<Arc<StoredSale>>);

/// Sales by sku, refreshed after `ttl`; unknown skus are remembered too (as `None`).
pub struct SaleCache {
    ttl: Duration,
    entries: Mutex<BySku<SaleEntry>>,
    counters: Mutex<BySku<(Instant, Counters)>>,
}

impl SaleCache {
    pub fn new(ttl: Duration) -> SaleCache {
        SaleCache {
            ttl,
            entries: Mutex::default(),
            counters: Mutex::default(),
        }
    }

    /// `Some(entry)` when fresh; the entry itself is `None` for a sku known not to exist.
    pub fn get(&self, sku: SkuId) -> Option<Option<Arc<StoredSale>>> {
        let entries = self.entries.lock().expect("sale cache lock");
        match entries.get(&sku) {
            Some((at, sale)) if at.elapsed() < self.ttl => Some(sale.clone()),
            _ => None,
        }
    }

    /// The last known sale however old: used while the database is unreachable, so that
    /// purchases go on (the hot ledger, not this copy, judges them).
    pub fn stale(&self, sku: SkuId) -> Option<Arc<StoredSale>> {
        let entries = self.entries.lock().expect("sale cache lock");
        entries.get(&sku).and_then(|(_, sale)| sale.clone())
    }

    pub fn put(&self, sku: SkuId, sale: Option<StoredSale>) -> Option<Arc<StoredSale>> {
        let sale = sale.map(Arc::new);
        let mut entries = self.entries.lock().expect("sale cache lock");
        if entries.len() >= ENTRIES_MAX {
            entries.clear();
        }
        entries.insert(sku, (Instant::now(), sale.clone()));
        sale
    }

    pub fn forget(&self, sku: SkuId) {
        self.entries.lock().expect("sale cache lock").remove(&sku);
        self.counters
            .lock()
            .expect("counter cache lock")
            .remove(&sku);
    }

    pub fn counters(&self, sku: SkuId) -> Option<Counters> {
        let counters = self.counters.lock().expect("counter cache lock");
        counters
            .get(&sku)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, c)| *c)
    }

    pub fn put_counters(&self, sku: SkuId, c: Counters) {
        let mut counters = self.counters.lock().expect("counter cache lock");
        if counters.len() >= ENTRIES_MAX {
            counters.clear();
        }
        counters.insert(sku, (Instant::now(), c));
    }
}

enum Flag {
    /// Someone is loading the accepted keys; meanwhile ask the ledger.
    Loading(Instant),
    /// Sold out as of `Instant`; requests not in `accepted` are answered locally.
    Set(Instant, Arc<AcceptedKeys>),
}

/// Local sold-out flags, cleared by restock notices and by a short TTL.
pub struct SoldOutFlags {
    ttl: Duration,
    flags: Mutex<BySku<Flag>>,
    /// The accepted keys last loaded per sale, with the `(epoch, count)` they were loaded
    /// at: while a sale stays sold out nothing new is accepted, so a flag that lapsed is set
    /// again from these without reading every key again. Dropped on restock.
    loaded: Mutex<BySku<Loaded>>,
}

/// Accepted request keys as last loaded, and the `(epoch, count)` of the copy they came from.
#[derive(Clone)]
pub struct Loaded {
    pub version: (u64, usize),
    pub keys: Arc<AcceptedKeys>,
}

impl SoldOutFlags {
    pub fn new(ttl: Duration) -> SoldOutFlags {
        SoldOutFlags {
            ttl,
            flags: Mutex::default(),
            loaded: Mutex::default(),
        }
    }

    /// The keys last loaded for a sale when they are still of `version`.
    pub fn loaded(&self, sku: SkuId, version: (u64, usize)) -> Option<Arc<AcceptedKeys>> {
        let loaded = self.loaded.lock().expect("loaded lock");
        loaded
            .get(&sku)
            .filter(|l| l.version == version)
            .map(|l| l.keys.clone())
    }

    /// True when this request can be answered SOLD_OUT without the ledger: the sale is
    /// flagged and the request is not a retry of an accepted one.
    pub fn answers(&self, sku: SkuId, key: &RequestKey) -> bool {
        let flags = self.flags.lock().expect("flags lock");
        match flags.get(&sku) {
            Some(Flag::Set(at, accepted)) => at.elapsed() < self.ttl && !accepted.contains(key),
            _ => false,
        }
    }

    /// Whether a fresh flag stands for the sale (the dashboard shows it).
    pub fn is_set(&self, sku: SkuId) -> bool {
        let flags = self.flags.lock().expect("flags lock");
        matches!(flags.get(&sku), Some(Flag::Set(at, _)) if at.elapsed() < self.ttl)
    }

    /// Claims the right to load the accepted keys after a SOLD_OUT answer; false when a
    /// fresh flag or load is already there.
    pub fn begin_load(&self, sku: SkuId) -> bool {
        let mut flags = self.flags.lock().expect("flags lock");
        let fresh = match flags.get(&sku) {
            Some(Flag::Set(at, _)) | Some(Flag::Loading(at)) => at.elapsed() < self.ttl,
            None => false,
        };
        if !fresh {
            flags.insert(sku, Flag::Loading(Instant::now()));
        }
        !fresh
    }

    /// Sets the flag with the accepted keys of copy `version` (`(epoch, count)`).
    pub fn set(
        &self,
        sku: SkuId,
        accepted: Arc<AcceptedKeys>,
        version: (u64, usize),
        loaded_at: Instant,
    ) {
        let mut flags = self.flags.lock().expect("flags lock");
        // A restock that arrived during the load removed the Loading mark: do not set.
        if matches!(flags.get(&sku), Some(Flag::Loading(_))) {
            flags.insert(sku, Flag::Set(loaded_at, accepted.clone()));
            let loaded = Loaded {
                version,
                keys: accepted,
            };
            self.loaded.lock().expect("loaded lock").insert(sku, loaded);
        }
    }

    pub fn clear(&self, sku: SkuId) {
        self.flags.lock().expect("flags lock").remove(&sku);
        self.loaded.lock().expect("loaded lock").remove(&sku);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> RequestKey {
        RequestKey::parse(text).unwrap()
    }

    #[test]
    fn a_flag_answers_new_requests_but_not_retries_and_clears_on_restock() {
        let flags = SoldOutFlags::new(Duration::from_secs(60));
        let sku = SkuId(1);
        assert!(!flags.answers(sku, &key("1:a")));
        assert!(flags.begin_load(sku));
        assert!(!flags.begin_load(sku), "one loader at a time");
        let keys = Arc::new(AcceptedKeys::from_iter([key("1:a")]));
        flags.set(sku, keys, (1, 1), Instant::now());
        assert!(flags.loaded(sku, (1, 1)).is_some());
        assert!(
            flags.loaded(sku, (2, 1)).is_none(),
            "another copy's keys are not reused"
        );
        assert!(flags.answers(sku, &key("2:b")));
        assert!(
            !flags.answers(sku, &key("1:a")),
            "a retry of an accepted request goes to the ledger"
        );
        flags.clear(sku);
        assert!(!flags.answers(sku, &key("2:b")));
        assert!(
            flags.loaded(sku, (1, 1)).is_none(),
            "a restock drops the keys"
        );
        flags.set(sku, Arc::default(), (1, 0), Instant::now());
        assert!(
            !flags.answers(sku, &key("2:b")),
            "a set after a restock is ignored"
        );
    }
}
