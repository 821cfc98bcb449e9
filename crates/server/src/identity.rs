//! An external identity provider: user tokens signed with RS256, ES256 or EdDSA by keys the
//! provider publishes as a JWK set (`FLASHSALE_JWKS_URL`, or `FLASHSALE_JWKS_FILE`), checked
//! for issuer, audience, expiry and not-before, the user id read from a configured claim.
//!
//! The key set is cached and chosen from by `kid`. It is fetched at start, refreshed every
//! [`IdentityConfig::refresh_interval`], and fetched again when a token names a `kid` the
//! cache lacks (a rotation), at most once per [`IdentityConfig::refetch_cooldown`] and one
//! fetch at a time: a spike of forged `kid`s costs one fetch, and the requests that wait for
//! it are bounded by the fetch timeout. A fetch that fails (provider down, a document that
//! does not parse, no usable key) keeps the cached set (served stale), counts
//! `flashsale_jwks_fetches_total{result="error"}`, sets `flashsale_jwks_stale` and logs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use flashsale_core::metric_names::{JWKS_FETCHES, JWKS_STALE, JWKS_UNKNOWN_KID};
use flashsale_core::{ErrorCode, UserId};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use serde_json::{Map, Value};

use flashsale_engine::runner::{Worker, WorkerState};

use crate::error::AppError;

/// Largest key set document read, in bytes (a limit on everything).
pub const JWKS_BYTES_MAX: usize = 256 * 1024;
/// Most keys taken from one document.
pub const JWKS_KEYS_MAX: usize = 64;
/// Longest `kid` looked up: longer ones are never in a set we accept.
const KID_LEN_MAX: usize = 256;

/// Where the key set comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    Url(String),
    File(PathBuf),
}

/// What the service trusts: whose keys, for which issuer and audience, and where the user
/// id is.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub source: JwksSource,
    pub issuer: String,
    pub audience: String,
    /// The claim holding the user id (a positive integer, as a number or a string).
    pub user_claim: String,
    /// Least time between two fetches for an unknown `kid`.
    pub refetch_cooldown: Duration,
    /// Refresh of the set, to learn keys published ahead of their use.
    pub refresh_interval: Duration,
    /// One fetch's bound (connect, answer and body).
    pub fetch_timeout: Duration,
}

impl IdentityConfig {
    pub const REFETCH_COOLDOWN: Duration = Duration::from_secs(10);
    pub const REFRESH_INTERVAL: Duration = Duration::from_secs(300);
    pub const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

    /// The defaults, `sub` as the user claim.
    pub fn new(source: JwksSource, issuer: &str, audience: &str) -> IdentityConfig {
        IdentityConfig {
            source,
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
            user_claim: "sub".into(),
            refetch_cooldown: IdentityConfig::REFETCH_COOLDOWN,
            refresh_interval: IdentityConfig::REFRESH_INTERVAL,
            fetch_timeout: IdentityConfig::FETCH_TIMEOUT,
        }
    }
}

/// A verification key and the one algorithm it verifies.
struct Key {
    decoding: DecodingKey,
    alg: Algorithm,
}

type Keys = HashMap<String, Arc<Key>>;

/// The provider's keys and how to check its tokens.
pub struct Identity {
    config: IdentityConfig,
    keys: RwLock<Arc<Keys>>,
    /// Held while fetching (one fetch at a time); the last fetch an unknown `kid` caused.
    fetching: tokio::sync::Mutex<Option<Instant>>,
    /// The last fetch failed: the cached set is served stale.
    stale: AtomicBool,
    /// The claims' checks, one per provider algorithm, built once.
    validations: HashMap<Algorithm, Validation>,
    http: reqwest::Client,
}

/// The algorithms a provider's key may have; HS256 is never taken from a key set.
pub fn is_provider_alg(alg: Algorithm) -> bool {
    matches!(alg, Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA)
}

impl Identity {
    /// Loads the key set. A file that does not give a usable set stops the start (an
    /// operator's mistake, visible at once); a provider that does not answer is retried in
    /// the background while tokens are refused (logged).
    pub async fn start(config: IdentityConfig) -> anyhow::Result<Arc<Identity>> {
        anyhow::ensure!(
            !config.issuer.trim().is_empty() && !config.audience.trim().is_empty(),
            "a JWKS needs FLASHSALE_JWT_ISSUER and FLASHSALE_JWT_AUDIENCE: without them a token \
             the provider made for any other service would be accepted"
        );
        anyhow::ensure!(
            !config.user_claim.is_empty(),
            "FLASHSALE_JWT_USER_CLAIM is empty"
        );
        let http = reqwest::Client::builder()
            .timeout(config.fetch_timeout)
            .connect_timeout(config.fetch_timeout)
            .build()?;
        let validations = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA]
            .into_iter()
            .map(|alg| (alg, validation(&config, alg)))
            .collect();
        let identity = Arc::new(Identity {
            config,
            validations,
            keys: RwLock::new(Arc::new(Keys::new())),
            fetching: tokio::sync::Mutex::new(None),
            stale: AtomicBool::new(false),
            http,
        });
        match (identity.refresh().await, &identity.config.source) {
            (Ok(_), _) => {}
            (Err(e), JwksSource::File(path)) => {
                anyhow::bail!("the key set {} is not usable: {e}", path.display())
            }
            (Err(e), JwksSource::Url(url)) => {
                tracing::error!(%url, error = %e, "identity provider key set not loaded at start; provider tokens are refused until it is");
            }
        }
        Ok(identity)
    }

    pub fn config(&self) -> &IdentityConfig {
        &self.config
    }

    /// Whether the last fetch failed (the cached set is served).
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Keys now cached.
    pub fn key_count(&self) -> usize {
        self.snapshot().len()
    }

    fn snapshot(&self) -> Arc<Keys> {
        self.keys.read().expect("key set lock").clone()
    }

    /// A token whose header names a provider algorithm: its key by `kid`, signature, `iss`,
    /// `aud`, `exp`, `nbf`, then the user claim. Every failure is 401.
    pub async fn verify(&self, token: &str, header: &Header) -> Result<UserId, AppError> {
        let unauthorized = |m: String| AppError::new(ErrorCode::Unauthorized, m);
        let kid = header
            .kid
            .as_deref()
            .filter(|k| !k.is_empty() && k.len() <= KID_LEN_MAX)
            .ok_or_else(|| unauthorized("token has no usable kid".into()))?;
        let key = self
            .key(kid)
            .await
            .ok_or_else(|| unauthorized(format!("no key {kid:?} in the provider's key set")))?;
        if key.alg != header.alg {
            return Err(unauthorized(format!(
                "key {kid:?} is for {:?}, the token says {:?}",
                key.alg, header.alg
            )));
        }
        let validation = self
            .validations
            .get(&key.alg)
            .ok_or_else(|| unauthorized(format!("{:?} is not a provider algorithm", key.alg)))?;
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, validation)
            .map_err(|e| unauthorized(format!("invalid token: {e}")))?;
        user_of(&data.claims, &self.config.user_claim)
    }

    /// The key named `kid`: cached, or after one fetch when the cooldown allows it.
    async fn key(&self, kid: &str) -> Option<Arc<Key>> {
        if let Some(key) = self.snapshot().get(kid) {
            return Some(key.clone());
        }
        metrics::counter!(JWKS_UNKNOWN_KID).increment(1);
        let mut last = self.fetching.lock().await;
        // Whoever held the lock may have fetched the key meanwhile.
        if let Some(key) = self.snapshot().get(kid) {
            return Some(key.clone());
        }
        let cooling = last.is_some_and(|at| at.elapsed() < self.config.refetch_cooldown);
        if cooling {
            return None;
        }
        *last = Some(Instant::now());
        let _ = self.fetch_and_swap().await;
        self.snapshot().get(kid).cloned()
    }

    /// Fetches the set now (start, the refresh worker), one fetch at a time.
    pub async fn refresh(&self) -> Result<usize, String> {
        let _one_at_a_time = self.fetching.lock().await;
        self.fetch_and_swap().await
    }

    /// Replaces the cache with a freshly loaded set, or keeps it (stale) and says why.
    async fn fetch_and_swap(&self) -> Result<usize, String> {
        match self.load().await {
            Ok(keys) => {
                let n = keys.len();
                *self.keys.write().expect("key set lock") = Arc::new(keys);
                metrics::counter!(JWKS_FETCHES, "result" => "ok").increment(1);
                self.stale.store(false, Ordering::Relaxed);
                metrics::gauge!(JWKS_STALE).set(0.0);
                tracing::debug!(keys = n, "identity provider key set loaded");
                Ok(n)
            }
            Err(e) => {
                metrics::counter!(JWKS_FETCHES, "result" => "error").increment(1);
                self.stale.store(true, Ordering::Relaxed);
                metrics::gauge!(JWKS_STALE).set(1.0);
                tracing::warn!(error = %e, cached_keys = self.key_count(), "identity provider key set fetch failed; serving the cached set");
                Err(e)
            }
        }
    }

    async fn load(&self) -> Result<Keys, String> {
        let bytes = match &self.config.source {
            JwksSource::Url(url) => fetch_bounded(&self.http, url).await?,
            JwksSource::File(path) => read_bounded(path)?,
        };
        parse_jwks(&bytes)
    }
}

/// The checks of a provider token signed with `alg`: issuer, audience, expiry, not-before.
fn validation(config: &IdentityConfig, alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.set_required_spec_claims(&["exp", "iss", "aud"]);
    v.set_issuer(&[&config.issuer]);
    v.set_audience(&[&config.audience]);
    v.validate_nbf = true;
    v.leeway = 5;
    v
}

/// Refreshes the key set every `refresh_interval`, so keys a provider publishes ahead of
/// their use are known before the first token that names them.
pub struct RefreshWorker {
    identity: Arc<Identity>,
    /// The first tick one period after start (the key set was fetched at start).
    tick: tokio::time::Interval,
}

impl RefreshWorker {
    pub fn new(identity: Arc<Identity>) -> RefreshWorker {
        let period = identity.config.refresh_interval.max(Duration::from_secs(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        RefreshWorker { identity, tick }
    }
}

#[async_trait::async_trait]
impl Worker for RefreshWorker {
    fn name(&self) -> &'static str {
        "jwks-refresh"
    }

    /// The key set was fetched at start: the first refresh is one period later.
    fn first_state(&self) -> WorkerState {
        WorkerState::Idle
    }

    /// A failure is counted and logged inside; the cached set stays.
    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        let _ = self.identity.refresh().await;
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        self.tick.tick().await;
        WorkerState::Busy
    }
}

/// The user id in `claim`: a positive integer, as a JSON number or a string of digits.
fn user_of(claims: &Map<String, Value>, claim: &str) -> Result<UserId, AppError> {
    let id = match claims.get(claim) {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        _ => None,
    };
    match id {
        Some(id) if id > 0 => Ok(UserId(id)),
        _ => Err(AppError::new(
            ErrorCode::Unauthorized,
            format!("token claim {claim:?} is not a user id"),
        )),
    }
}

/// An error with its causes (reqwest's own text leaves out why a request failed).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text = format!("{text}: {c}");
        cause = c.source();
    }
    text
}

async fn fetch_bounded(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let failed = |e: reqwest::Error| format!("GET {url}: {}", chain(&e));
    let mut resp = http
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(failed)?;
    if !resp.status().is_success() {
        return Err(format!("GET {url}: {}", resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > JWKS_BYTES_MAX {
            return Err(format!("GET {url}: key set over {JWKS_BYTES_MAX} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn read_bounded(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut body = Vec::new();
    file.take(JWKS_BYTES_MAX as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if body.len() > JWKS_BYTES_MAX {
        return Err(format!("{}: over {JWKS_BYTES_MAX} bytes", path.display()));
    }
    Ok(body)
}

/// The signing keys of a JWK set document. The document must be `{"keys": [...]}` with at
/// most [`JWKS_KEYS_MAX`] keys and at least one usable one; keys we cannot use (another
/// `use`, another algorithm or curve, no `kid`, symmetric) are skipped, so a provider that
/// also publishes other keys still works.
fn parse_jwks(bytes: &[u8]) -> Result<Keys, String> {
    #[derive(serde::Deserialize)]
    struct Document {
        keys: Vec<Value>,
    }
    let doc: Document = serde_json::from_slice(bytes).map_err(|e| format!("not a JWK set: {e}"))?;
    if doc.keys.len() > JWKS_KEYS_MAX {
        return Err(format!(
            "{} keys, at most {JWKS_KEYS_MAX} taken",
            doc.keys.len()
        ));
    }
    let keys: Keys = doc
        .keys
        .into_iter()
        .filter_map(|v| serde_json::from_value::<Jwk>(v).ok())
        .filter_map(|jwk| usable(&jwk))
        .collect();
    if keys.is_empty() {
        return Err("no usable signing key (RS256, ES256 on P-256, EdDSA on Ed25519)".into());
    }
    Ok(keys)
}

/// A JWK as a verification key, when it is one we use.
fn usable(jwk: &Jwk) -> Option<(String, Arc<Key>)> {
    let kid = jwk
        .common
        .key_id
        .clone()
        .filter(|k| k.len() <= KID_LEN_MAX)?;
    if matches!(&jwk.common.public_key_use, Some(u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let alg = match (&jwk.algorithm, jwk.common.key_algorithm) {
        (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
        (AlgorithmParameters::EllipticCurve(p), None | Some(KeyAlgorithm::ES256))
            if p.curve == EllipticCurve::P256 =>
        {
            Algorithm::ES256
        }
        (AlgorithmParameters::OctetKeyPair(p), None | Some(KeyAlgorithm::EdDSA))
            if p.curve == EllipticCurve::Ed25519 =>
        {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let decoding = DecodingKey::from_jwk(jwk).ok()?;
    Some((kid, Arc::new(Key { decoding, alg })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_that_are_not_usable_key_sets_are_refused() {
        for doc in [
            &b"not json"[..],
            b"{}",
            b"{\"keys\": {}}",
            b"{\"keys\": []}",
            // A symmetric key is never taken from a provider.
            b"{\"keys\": [{\"kty\":\"oct\",\"kid\":\"h\",\"k\":\"c2VjcmV0\"}]}",
            // An EC key on a curve we do not take.
            b"{\"keys\": [{\"kty\":\"EC\",\"kid\":\"e\",\"crv\":\"P-384\",\"x\":\"AA\",\"y\":\"AA\"}]}",
        ] {
            assert!(parse_jwks(doc).is_err(), "{}", String::from_utf8_lossy(doc));
        }
        let many = format!(
            "{{\"keys\": [{}]}}",
            vec!["{}"; JWKS_KEYS_MAX + 1].join(",")
        );
        assert!(parse_jwks(many.as_bytes()).is_err());
    }

    /// Providers publish over https: a fetch of an https URL gets as far as connecting (here
    /// to a port nobody listens on), rather than failing for want of TLS support.
    #[tokio::test]
    async fn https_urls_are_fetched() {
        let url = "https://127.0.0.1:9/jwks.json".to_owned();
        let c = IdentityConfig::new(JwksSource::Url(url), "https://idp", "aud");
        let identity = Identity::start(c).await.unwrap();
        let e = identity.refresh().await.unwrap_err();
        assert!(e.contains("error sending request"), "{e}");
        assert!(!e.contains("builder error") && !e.contains("scheme"), "{e}");
        assert!(identity.is_stale());
    }

    #[test]
    fn the_user_claim_must_be_a_positive_integer() {
        let claims = |v: Value| Map::from_iter([("uid".to_owned(), v)]);
        assert_eq!(user_of(&claims(7.into()), "uid").unwrap(), UserId(7));
        assert_eq!(user_of(&claims("8".into()), "uid").unwrap(), UserId(8));
        for bad in [Value::from(0), "x".into(), Value::from(-1), Value::Null] {
            assert!(user_of(&claims(bad), "uid").is_err());
        }
        assert!(user_of(&claims(7.into()), "sub").is_err());
    }
}
