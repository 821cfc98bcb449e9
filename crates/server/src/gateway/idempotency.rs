//! An `Idempotency-Key` names one purchase attempt; the same key on another sale is a client
//! bug (a new attempt needs a new key), answered 422 `IDEMPOTENCY_KEY_REUSED`. The hot
//! ledger cannot see it (its replays are kept per sale, on the sale's own shard), so the
//! first sale a key is used on is bound to `(user, key)` in the store that keeps used
//! purchase tokens: a Redis `SET NX PX` shared by every instance, or memory (embedded).
//! Only requests that carry the header pay this round trip; a body `request_id` keeps the
//! contract's meaning (scoped to its sale).

use std::time::Duration;

use flashsale_core::{ErrorCode, SkuId};

use super::BlacklistStore;
use crate::error::AppError;

/// How long a key stays bound to its sale: a day, as the idempotency-key draft's examples
/// and common APIs keep keys; retries come within seconds, reuse bugs within the same run.
pub const KEY_BINDING_TTL: Duration = Duration::from_secs(24 * 3_600);

/// Binds `request_key` (`<user>:<request id>`) to `sku` on first use; another sale → 422.
pub async fn bind(
    store: &dyn BlacklistStore,
    request_key: &str,
    sku: SkuId,
) -> Result<(), AppError> {
    let name = format!("idem:{request_key}");
    let fresh = store
        .consume_token(&name, &sku.0.to_string(), KEY_BINDING_TTL)
        .await
        .map_err(|e| AppError::new(ErrorCode::Unavailable, e))?;
    if fresh {
        return Ok(());
    }
    Err(AppError::new(
        ErrorCode::IdempotencyKeyReused,
        "this Idempotency-Key was first used on another sale; a new attempt needs a new key",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::MemoryBlacklist;

    #[tokio::test]
    async fn a_key_stays_on_its_first_sale() {
        let store = MemoryBlacklist::default();
        assert!(bind(&store, "7:k", SkuId(1)).await.is_ok());
        assert!(bind(&store, "7:k", SkuId(1)).await.is_ok(), "a retry");
        let e = bind(&store, "7:k", SkuId(2)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::IdempotencyKeyReused);
        assert!(bind(&store, "8:k", SkuId(2)).await.is_ok(), "per user");
    }
}
