//! Accepted purchases this instance has seen, so a retry of one skips the risk service (its
//! first outcome is the ledger's replay, which the service cannot change).
//!
//! Bounded: at most `max` entries, the oldest forgotten first. An entry is a 64-bit hash of
//! (sale, request key) under this process's random hash keys, 8 bytes however long the key:
//! a client cannot craft a collision, and an accidental one (odds ~n/2^64) would only skip
//! one check. Only accepted purchases enter it: a denial is never remembered past its request.
//! A retry that lands on another instance, or after a restart, is asked about again; a denial
//! then is overruled by the ledger's own request keys (`SoldOutSupport::is_accepted`).

use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::Mutex;

use flashsale_core::{RequestKey, SkuId};

pub struct Replays {
    max: usize,
    hasher: std::collections::hash_map::RandomState,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    set: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Replays {
    pub fn new(max: usize) -> Replays {
        Replays {
            max,
            hasher: Default::default(),
            seen: Mutex::default(),
        }
    }

    fn hash(&self, sku: SkuId, key: &RequestKey) -> u64 {
        self.hasher.hash_one((sku.0, key))
    }

    pub fn contains(&self, sku: SkuId, key: &RequestKey) -> bool {
        let h = self.hash(sku, key);
        self.seen.lock().expect("replays lock").set.contains(&h)
    }

    pub fn remember(&self, sku: SkuId, key: &RequestKey) {
        if self.max == 0 {
            return;
        }
        let h = self.hash(sku, key);
        let mut seen = self.seen.lock().expect("replays lock");
        if !seen.set.insert(h) {
            return;
        }
        seen.order.push_back(h);
        while seen.order.len() > self.max {
            if let Some(old) = seen.order.pop_front() {
                seen.set.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> RequestKey {
        RequestKey::parse(s).unwrap()
    }

    #[test]
    fn remembers_per_sale_and_forgets_the_oldest_past_the_bound() {
        let r = Replays::new(2);
        r.remember(SkuId(1), &key("7:a"));
        assert!(r.contains(SkuId(1), &key("7:a")));
        assert!(!r.contains(SkuId(2), &key("7:a")), "another sale");
        assert!(!r.contains(SkuId(1), &key("8:a")), "another user");
        r.remember(SkuId(1), &key("7:b"));
        r.remember(SkuId(1), &key("7:a"));
        r.remember(SkuId(1), &key("7:c"));
        assert!(!r.contains(SkuId(1), &key("7:a")), "the oldest went");
        assert!(r.contains(SkuId(1), &key("7:b")) && r.contains(SkuId(1), &key("7:c")));
    }
}
