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

use std::time::Duration;

use flashsale_core::{ErrorCode, RequestKey, SkuId};

use flashsale_engine::gateway_store::{Binding, KeyBind};

use super::BlacklistStore;
use crate::error::AppError;

/// How long a key stays bound to its sale: a day, as the idempotency-key draft's examples
/// and common APIs keep keys; retries come within seconds, reuse bugs within the same run.
pub const KEY_BINDING_TTL: Duration = Duration::from_secs(24 * 3_600);

/// Binds `key` to `sku` on first use; another sale → 422, a user past `per_user` live keys
/// → 429.
pub async fn bind(
    store: &dyn BlacklistStore,
    key: &RequestKey,
    sku: SkuId,
    per_user: usize,
) -> Result<(), AppError> {
    let bound = store
        .once()
        .bind_key(
            key,
            KeyBind {
                sku,
                ttl: KEY_BINDING_TTL,
                per_user,
            },
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::MemoryBlacklist;
    use flashsale_core::{RequestId, UserId};

    fn key(user: u64, id: &str) -> RequestKey {
        RequestKey::new(UserId(user), RequestId::parse(id).unwrap())
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
}
