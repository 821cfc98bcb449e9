//! Anti-scalping purchase tokens: fetched from the API only while a sale is live, bound by an
//! HMAC (HS256 under a key derived from the JWT secret, so a purchase token is never a user
//! token) to the user, the sale and an expiry, and used once (a retry of the same request
//! may present it again and gets the first outcome).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flashsale_core::{ErrorCode, SkuId, UserId};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::AppError;

/// Longest purchase token accepted, in bytes.
pub const TOKEN_LEN_MAX: usize = 512;

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    /// User id.
    sub: String,
    sku: u64,
    /// Expiry, seconds since the epoch.
    exp: u64,
    /// Unique id: what "used once" remembers.
    jti: String,
    typ: String,
}

const TYP: &str = "purchase";

pub struct PurchaseTokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    pub ttl: Duration,
}

/// A verified purchase token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub jti: String,
    /// Remaining life: how long its use must be remembered.
    pub remaining: Duration,
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl PurchaseTokens {
    pub fn new(jwt_secret: &str, ttl: Duration) -> PurchaseTokens {
        let key = format!("flashsale purchase token\0{jwt_secret}");
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 0;
        PurchaseTokens {
            encoding: EncodingKey::from_secret(key.as_bytes()),
            decoding: DecodingKey::from_secret(key.as_bytes()),
            validation,
            ttl: ttl.max(Duration::from_secs(1)),
        }
    }

    /// A token for `user` on `sku`, and its expiry in ms since the epoch.
    pub fn issue(&self, user: UserId, sku: SkuId) -> (String, i64) {
        let exp = now_s() + self.ttl.as_secs();
        let jti = format!("{:032x}", rand::rng().random::<u128>());
        let claims = Claims {
            sub: user.0.to_string(),
            sku: sku.0,
            exp,
            jti,
            typ: TYP.into(),
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .expect("HS256 signing cannot fail");
        (token, exp as i64 * 1_000)
    }

    /// Checks signature, expiry, user and sale. Every failure is 403 FORBIDDEN: the caller is
    /// known, but this token does not let them buy.
    pub fn verify(&self, token: &str, user: UserId, sku: SkuId) -> Result<Verified, AppError> {
        let refuse = |m: &str| AppError::new(ErrorCode::Forbidden, m.to_owned());
        if token.is_empty() || token.len() > TOKEN_LEN_MAX {
            return Err(refuse("malformed purchase token"));
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| refuse(&format!("invalid purchase token: {e}")))?;
        let c = data.claims;
        if c.typ != TYP || c.sub != user.0.to_string() || c.sku != sku.0 {
            return Err(refuse("the purchase token is for another user or sale"));
        }
        let remaining = Duration::from_secs(c.exp.saturating_sub(now_s()).max(1));
        Ok(Verified {
            jti: c.jti,
            remaining,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_bind_user_sale_and_secret() {
        let t = PurchaseTokens::new("s", Duration::from_secs(60));
        let (tok, exp) = t.issue(UserId(7), SkuId(42));
        assert!(exp > 0);
        assert!(t.verify(&tok, UserId(7), SkuId(42)).is_ok());
        assert!(t.verify(&tok, UserId(8), SkuId(42)).is_err());
        assert!(t.verify(&tok, UserId(7), SkuId(43)).is_err());
        let other = PurchaseTokens::new("t", Duration::from_secs(60));
        assert!(other.verify(&tok, UserId(7), SkuId(42)).is_err());
        assert!(t.verify("garbage", UserId(7), SkuId(42)).is_err());
        // A user token signed with the plain secret is not a purchase token.
        let user_token = crate::auth::Auth::new("s", "a").sign(UserId(7), 60);
        assert!(t.verify(&user_token, UserId(7), SkuId(42)).is_err());
    }

    #[test]
    fn expired_tokens_fail() {
        let t = PurchaseTokens::new("s", Duration::from_secs(60));
        let claims = Claims {
            sub: "7".into(),
            sku: 42,
            exp: now_s() - 10,
            jti: "x".into(),
            typ: TYP.into(),
        };
        let tok =
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &t.encoding).unwrap();
        assert!(t.verify(&tok, UserId(7), SkuId(42)).is_err());
    }
}
