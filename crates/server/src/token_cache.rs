//! Verified user tokens, remembered by their exact bytes until they expire: a client sends the
//! same token with every request, and checking its HS256 signature (base64, HMAC-SHA256, JSON)
//! cost more than the rest of a sold-out answer. Only tokens that verified are kept, each with
//! its `exp`, so a hit answers exactly what verifying again would (a token's bytes fix its
//! claims); an expired entry is a miss and verifies (and fails) the long way.
//!
//! Keyed through aHash rather than the standard SipHash: a token is some 150 bytes, and
//! hashing it with SipHash at every request cost more than the rest of the lookup. The maps
//! hold only tokens that verified (no caller chooses what lands in them), and aHash is
//! seeded per process all the same.
//!
//! Bounded: [`SHARDS`] maps of at most [`SHARD_LEN_MAX`] tokens; a full shard is emptied
//! (its tokens verify once more) rather than kept in order: eviction by age would cost a
//! write per hit.

use std::collections::HashMap;
use std::sync::Mutex;

use ahash::RandomState;

use flashsale_core::UserId;

/// Shards, so that threads answering different users rarely wait on one lock.
const SHARDS: usize = 16;
/// Tokens per shard (65,536 in all, some 20 MB at the longest tokens accepted).
const SHARD_LEN_MAX: usize = 4_096;

#[derive(Debug, Clone, Copy)]
struct Entry {
    user: UserId,
    exp_s: u64,
}

/// One shard: verified tokens by their bytes.
type Shard = HashMap<Box<str>, Entry, RandomState>;

/// Verified tokens by their bytes.
#[derive(Debug)]
pub struct TokenCache {
    shards: Vec<Mutex<Shard>>,
    /// Seconds a token is still accepted after its `exp` (the verifier's leeway).
    leeway_s: u64,
}

impl TokenCache {
    pub fn new(leeway_s: u64) -> TokenCache {
        TokenCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            leeway_s,
        }
    }

    /// The shard of a token: its last bytes are its signature's, evenly spread.
    fn shard(&self, token: &str) -> &Mutex<Shard> {
        let b = token.as_bytes();
        let tail = b
            .iter()
            .rev()
            .take(2)
            .fold(0usize, |a, &x| a * 31 + x as usize);
        &self.shards[tail % SHARDS]
    }

    /// The user of a token verified before and not expired at `now_s`.
    pub fn get(&self, token: &str, now_s: u64) -> Option<UserId> {
        let shard = self.shard(token).lock().unwrap_or_else(|e| e.into_inner());
        let entry = shard.get(token)?;
        // The verifier's rule: expired when exp < now - leeway.
        (entry.exp_s.saturating_add(self.leeway_s) >= now_s).then_some(entry.user)
    }

    /// Remembers a token that verified as `user`, valid until `exp_s`.
    pub fn put(&self, token: &str, user: UserId, exp_s: u64) {
        let mut shard = self.shard(token).lock().unwrap_or_else(|e| e.into_inner());
        if shard.len() >= SHARD_LEN_MAX {
            shard.clear();
        }
        shard.insert(token.into(), Entry { user, exp_s });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_known_until_it_expires() {
        let cache = TokenCache::new(5);
        assert_eq!(cache.get("a.b.c", 100), None);
        cache.put("a.b.c", UserId(7), 100);
        assert_eq!(cache.get("a.b.c", 100), Some(UserId(7)));
        assert_eq!(cache.get("a.b.c", 105), Some(UserId(7)));
        assert_eq!(cache.get("a.b.c", 106), None);
        assert_eq!(cache.get("a.b.d", 100), None);
    }

    #[test]
    fn a_full_shard_is_emptied_not_grown() {
        let cache = TokenCache::new(0);
        for i in 0..SHARD_LEN_MAX * SHARDS * 2 {
            cache.put(&format!("t{i}"), UserId(1), u64::MAX);
        }
        for shard in &cache.shards {
            assert!(shard.lock().unwrap().len() <= SHARD_LEN_MAX);
        }
    }
}
