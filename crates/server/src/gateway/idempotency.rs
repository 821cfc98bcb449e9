//! An `Idempotency-Key` names one purchase attempt; the same key on another sale is a client
//! bug (a new attempt needs a new key), answered 422 `IDEMPOTENCY_KEY_REUSED`. The hot
//! ledger cannot see it (its replays are kept per sale, on the sale's own shard), so the
//! first sale a key is used on is bound to `(user, key)` in the store that keeps used
//! purchase tokens: Redis shared by every instance, or memory (embedded).
//! Only requests that carry the header pay these round trips; a body `request_id` keeps the
//! contract's meaning (scoped to its sale).
//!
//! Bindings are bounded per user ([`GatewayConfig::idempotency_keys_per_user`] live at once,
//! each for [`KEY_BINDING_TTL`]): a user past it is answered 429 `RATE_LIMITED` before
//! anything is bound, so one user can neither grow Redis without bound nor fill the embedded
//! table that every user's keys share.
//!
//! [`GatewayConfig::idempotency_keys_per_user`]: super::GatewayConfig::idempotency_keys_per_user

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flashsale_core::{ErrorCode, RequestKey, SkuId};

use super::BlacklistStore;
use crate::error::AppError;

/// How long a key stays bound to its sale: a day, as the idempotency-key draft's examples
/// and common APIs keep keys; retries come within seconds, reuse bugs within the same run.
pub const KEY_BINDING_TTL: Duration = Duration::from_secs(24 * 3_600);

/// Key bindings held in memory at most, over all users (embedded); past it, after expired
/// ones are swept, a new key is refused like a user past its own bound.
pub const BINDINGS_MAX: usize = 1_000_000;

/// What a store answered to a key's binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Bound to this sale now, or before (a retry).
    Bound,
    /// Bound to another sale.
    OtherSale,
    /// Not bound: the user holds its bound of live keys (or the shared table is full).
    Full,
}

/// Binds `key` to `sku` on first use; another sale → 422, a user past `per_user` live keys
/// → 429.
pub async fn bind(
    store: &dyn BlacklistStore,
    key: &RequestKey,
    sku: SkuId,
    per_user: usize,
) -> Result<(), AppError> {
    let bound = store
        .bind_key(key, sku, KEY_BINDING_TTL, per_user)
        .await
        .map_err(|e| AppError::new(ErrorCode::Unavailable, e))?;
    match bound {
        Binding::Bound => Ok(()),
        Binding::OtherSale => Err(AppError::new(
            ErrorCode::IdempotencyKeyReused,
            "this Idempotency-Key was first used on another sale; a new attempt needs a new key",
        )),
        Binding::Full => Err(AppError::new(
            ErrorCode::RateLimited,
            format!(
                "this user has {per_user} Idempotency-Keys bound in the last 24 h, the most \
                 allowed; retry a purchase with its own key, or send request_id in the body"
            ),
        )),
    }
}

/// Key bindings in memory (the embedded deployment, tests), apart from used purchase tokens
/// so that keys never crowd tokens out: per user, each key's sale and expiry.
#[derive(Default)]
pub struct MemoryBindings {
    users: Mutex<Users>,
}

#[derive(Default)]
struct Users {
    keys: HashMap<u64, HashMap<String, (SkuId, Instant)>>,
    /// Bindings over all users (expired ones included until swept).
    len: usize,
}

impl MemoryBindings {
    pub fn bind(&self, key: &RequestKey, sku: SkuId, ttl: Duration, per_user: usize) -> Binding {
        self.bind_at(key, sku, ttl, per_user, BINDINGS_MAX, Instant::now())
    }

    fn bind_at(
        &self,
        key: &RequestKey,
        sku: SkuId,
        ttl: Duration,
        per_user: usize,
        max: usize,
        now: Instant,
    ) -> Binding {
        let mut users = self.users.lock().expect("key bindings lock");
        let (user, id) = (key.user.0, key.request_id.as_str());
        users.expire(user, now);
        let mine = users.keys.get(&user);
        match mine.and_then(|keys| keys.get(id)) {
            Some((first, _)) if *first == sku => return Binding::Bound,
            Some(_) => return Binding::OtherSale,
            None if mine.map_or(0, HashMap::len) >= per_user => return Binding::Full,
            None => {}
        }
        if users.len >= max {
            users.sweep(now);
            if users.len >= max {
                return Binding::Full;
            }
        }
        let mine = users.keys.entry(user).or_default();
        mine.insert(id.to_owned(), (sku, now + ttl));
        users.len += 1;
        Binding::Bound
    }
}

impl Users {
    /// Drops `user`'s expired bindings.
    fn expire(&mut self, user: u64, now: Instant) {
        let Some(mine) = self.keys.get_mut(&user) else {
            return;
        };
        let before = mine.len();
        mine.retain(|_, (_, until)| *until > now);
        self.len -= before - mine.len();
        if mine.is_empty() {
            self.keys.remove(&user);
        }
    }

    /// Drops every expired binding (the table is full; a new key may fit then).
    fn sweep(&mut self, now: Instant) {
        for keys in self.keys.values_mut() {
            keys.retain(|_, (_, until)| *until > now);
        }
        self.keys.retain(|_, keys| !keys.is_empty());
        self.len = self.keys.values().map(HashMap::len).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::MemoryBlacklist;
    use flashsale_core::{RequestId, UserId};

    fn key(user: u64, id: &str) -> RequestKey {
        RequestKey {
            user: UserId(user),
            request_id: RequestId::parse(id).unwrap(),
        }
    }

    #[tokio::test]
    async fn a_key_stays_on_its_first_sale() {
        let store = MemoryBlacklist::default();
        assert!(bind(&store, &key(7, "k"), SkuId(1), 10).await.is_ok());
        assert!(
            bind(&store, &key(7, "k"), SkuId(1), 10).await.is_ok(),
            "a retry"
        );
        let e = bind(&store, &key(7, "k"), SkuId(2), 10).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::IdempotencyKeyReused);
        assert!(
            bind(&store, &key(8, "k"), SkuId(2), 10).await.is_ok(),
            "per user"
        );
    }

    #[tokio::test]
    async fn a_user_binds_at_most_its_bound_and_others_still_bind() {
        let store = MemoryBlacklist::default();
        for i in 0..3 {
            let k = key(7, &format!("k{i}"));
            assert!(bind(&store, &k, SkuId(1), 3).await.is_ok());
        }
        let e = bind(&store, &key(7, "k3"), SkuId(1), 3).await.unwrap_err();
        assert_eq!(
            (e.code, e.code.http_status()),
            (ErrorCode::RateLimited, 429)
        );
        assert!(
            bind(&store, &key(7, "k0"), SkuId(1), 3).await.is_ok(),
            "a retry of a bound key still passes"
        );
        let e = bind(&store, &key(7, "k0"), SkuId(2), 3).await.unwrap_err();
        assert_eq!(
            e.code,
            ErrorCode::IdempotencyKeyReused,
            "and is still judged"
        );
        assert!(bind(&store, &key(8, "k3"), SkuId(1), 3).await.is_ok());
    }

    #[test]
    fn the_shared_table_is_bounded_and_expired_bindings_make_room() {
        let table = MemoryBindings::default();
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        let bind = |user, id: &str, at| table.bind_at(&key(user, id), SkuId(1), ttl, 2, 4, at);
        for user in 0..2 {
            assert_eq!(bind(user, "a", now), Binding::Bound);
            assert_eq!(bind(user, "b", now), Binding::Bound);
        }
        assert_eq!(bind(9, "a", now), Binding::Full, "the table holds 4");
        assert_eq!(bind(0, "a", now), Binding::Bound, "a retry needs no room");
        let later = now + ttl + Duration::from_secs(1);
        assert_eq!(
            bind(9, "a", later),
            Binding::Bound,
            "expired ones swept for room"
        );
        assert_eq!(bind(0, "c", later), Binding::Bound, "user 0's keys expired");
    }
}
