//! Who is asking: user tokens and the admin bearer token. A user token is HS256 under the
//! configured secret (`sub` = user id; `flashsale token`), or, with an external identity
//! provider configured, RS256, ES256 or EdDSA under one of its keys ([`crate::identity`]).
//! The token's header picks the way; an HS256 token is only ever checked with our secret,
//! never with a provider's key (no algorithm confusion), and `alg: none` parses as nothing.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use flashsale_core::{ErrorCode, UserId};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::error::AppError;
use crate::identity::{is_provider_alg, Identity};
use crate::token_cache::TokenCache;

/// Longest bearer token accepted, in bytes (a limit on everything).
const TOKEN_LEN_MAX: usize = 2_048;
/// Seconds a user token is still accepted after its `exp` (clock skew).
const LEEWAY_S: u64 = 5;

/// Signs and checks tokens with the configured secrets.
pub struct Auth {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    admin_token: String,
    /// Kept to derive the purchase-token key (gateway::scalping).
    secret: String,
    /// The external identity provider, when one is configured.
    identity: Option<Arc<Identity>>,
    /// HS256 tokens already verified (a client sends its token with every request).
    verified: TokenCache,
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
}

impl Auth {
    /// Panics on an empty secret: for tests and tools whose secrets are constants. A service
    /// starts through [`Auth::try_new`].
    pub fn new(jwt_secret: &str, admin_token: &str) -> Auth {
        Auth::try_new(jwt_secret, admin_token).expect("secrets must not be empty")
    }

    /// Refuses an empty (or blank) secret: an empty HS256 key signs tokens anyone can forge,
    /// and an empty admin token would make every caller an admin.
    pub fn try_new(jwt_secret: &str, admin_token: &str) -> Result<Auth, String> {
        if jwt_secret.trim().is_empty() {
            return Err("the JWT secret (FLASHSALE_JWT_SECRET) is empty".into());
        }
        if admin_token.trim().is_empty() {
            return Err("the admin token (FLASHSALE_ADMIN_TOKEN) is empty".into());
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = LEEWAY_S;
        Ok(Auth {
            encoding: EncodingKey::from_secret(jwt_secret.as_bytes()),
            decoding: DecodingKey::from_secret(jwt_secret.as_bytes()),
            validation,
            admin_token: admin_token.to_owned(),
            secret: jwt_secret.to_owned(),
            identity: None,
            verified: TokenCache::new(LEEWAY_S),
        })
    }

    /// Also accepts the provider's RS256, ES256 and EdDSA tokens.
    pub fn with_identity(mut self, identity: Arc<Identity>) -> Auth {
        self.identity = Some(identity);
        self
    }

    pub fn identity(&self) -> Option<&Arc<Identity>> {
        self.identity.as_ref()
    }

    /// A user token of either kind, by its header's algorithm.
    pub async fn verify(&self, token: &str) -> Result<UserId, AppError> {
        // Without a provider there is one way; skip reading the header twice.
        if self.identity.is_none() {
            return self.verify_user(token);
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| AppError::new(ErrorCode::Unauthorized, format!("invalid token: {e}")))?;
        match (&self.identity, header.alg) {
            (_, Algorithm::HS256) => self.verify_user(token),
            (Some(identity), alg) if is_provider_alg(alg) => identity.verify(token, &header).await,
            (_, alg) => Err(AppError::new(
                ErrorCode::Unauthorized,
                format!("tokens signed with {alg:?} are not accepted here"),
            )),
        }
    }

    /// A user token valid for `ttl_s` seconds.
    pub fn sign(&self, user: UserId, ttl_s: u64) -> String {
        let claims = Claims {
            sub: user.0.to_string(),
            exp: now_s() + ttl_s,
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .expect("HS256 signing cannot fail")
    }

    /// An HS256 token under the configured secret.
    pub fn verify_user(&self, token: &str) -> Result<UserId, AppError> {
        if let Some(user) = self.verified.get(token, now_s()) {
            return Ok(user);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| AppError::new(ErrorCode::Unauthorized, format!("invalid token: {e}")))?;
        match data.claims.sub.parse::<u64>() {
            Ok(id) if id > 0 => {
                self.verified.put(token, UserId(id), data.claims.exp);
                Ok(UserId(id))
            }
            _ => Err(AppError::new(
                ErrorCode::Unauthorized,
                "token subject is not a user id",
            )),
        }
    }

    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    pub fn is_admin(&self, token: &str) -> bool {
        constant_time_eq(token.as_bytes(), self.admin_token.as_bytes())
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) fn bearer(parts: &Parts) -> Result<&str, AppError> {
    let unauthorized = |m: &'static str| AppError::new(ErrorCode::Unauthorized, m);
    let value = parts
        .headers
        .get(AUTHORIZATION)
        .ok_or_else(|| unauthorized("missing bearer token"))?;
    let value = value
        .to_str()
        .map_err(|_| unauthorized("malformed authorization header"))?;
    let token = value
        .strip_prefix("Bearer ")
        .ok_or_else(|| unauthorized("expected a Bearer token"))?;
    if token.is_empty() || token.len() > TOKEN_LEN_MAX {
        return Err(unauthorized("malformed bearer token"));
    }
    Ok(token)
}

/// A request from a user, named by a valid token.
#[derive(Debug, Clone, Copy)]
pub struct User(pub UserId);

/// A request with the admin token.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_wrong_secrets_fail() {
        let auth = Auth::new("secret-a", "admin");
        let token = auth.sign(UserId(7), 60);
        assert_eq!(auth.verify_user(&token).unwrap(), UserId(7));
        let other = Auth::new("secret-b", "admin");
        assert_eq!(
            other.verify_user(&token).unwrap_err().code,
            ErrorCode::Unauthorized
        );
        assert!(auth.verify_user("not.a.token").is_err());
        assert!(auth.is_admin("admin") && !auth.is_admin("admin2") && !auth.is_admin(""));
    }

    #[test]
    fn empty_secrets_are_refused() {
        for (jwt, admin) in [("", "a"), (" ", "a"), ("s", ""), ("s", "\n")] {
            assert!(Auth::try_new(jwt, admin).is_err(), "{jwt:?} {admin:?}");
        }
        assert!(Auth::try_new("s", "a").is_ok());
    }
}
