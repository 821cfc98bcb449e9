//! An external identity provider: a JWKS endpoint of the test's own on 127.0.0.1:0 serving
//! keys the test generates (RSA, P-256, Ed25519); tokens it signs are accepted, every kind of
//! bad token is refused 401, the key set is refetched on an unknown `kid` at most once per
//! cooldown, served stale while the provider is down, and a key rotation mid-spike costs no
//! valid buyer a 401 while the spike sells exactly the stock.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::{code, Stack};
use axum::http::StatusCode as AxumStatus;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use flashsale_server::identity::{IdentityConfig, JwksSource};
use futures::StreamExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};

const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "flashsale";

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A signing key of the provider and its public JWK.
#[derive(Clone)]
struct TestKey {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
    /// The public key's bytes, for the algorithm-confusion attempt.
    public: Vec<u8>,
}

/// One RSA key per test binary: 2048-bit generation is slow in a debug build.
fn rsa_key() -> TestKey {
    static KEY: OnceLock<TestKey> = OnceLock::new();
    KEY.get_or_init(|| {
        use rsa::pkcs1::{EncodeRsaPrivateKey, EncodeRsaPublicKey};
        use rsa::traits::PublicKeyParts;
        let private = rsa::RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
        let public = private.to_public_key();
        TestKey {
            kid: "rsa-1".into(),
            alg: Algorithm::RS256,
            encoding: EncodingKey::from_rsa_der(private.to_pkcs1_der().unwrap().as_bytes()),
            jwk: json!({"kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256",
                "n": b64(&public.n().to_bytes_be()), "e": b64(&public.e().to_bytes_be())}),
            public: public.to_pkcs1_der().unwrap().as_bytes().to_vec(),
        }
    })
    .clone()
}

fn ec_key(kid: &str) -> TestKey {
    let rng = SystemRandom::new();
    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    // Uncompressed point: 0x04 ‖ x ‖ y.
    let point = pair.public_key().as_ref();
    TestKey {
        kid: kid.into(),
        alg: Algorithm::ES256,
        encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk: json!({"kty": "EC", "kid": kid, "crv": "P-256",
            "x": b64(&point[1..33]), "y": b64(&point[33..65])}),
        public: point.to_vec(),
    }
}

fn ed_key(kid: &str) -> TestKey {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let public = pair.public_key().as_ref();
    TestKey {
        kid: kid.into(),
        alg: Algorithm::EdDSA,
        encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk: json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "alg": "EdDSA", "x": b64(public)}),
        public: public.to_vec(),
    }
}

/// Claims of a good token for `user` (the user id in `uid`; `sub` is the provider's own).
fn claims(user: u64) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": format!("idp|{user}"), "uid": user,
        "iat": now_s(), "exp": now_s() + 600})
}

fn sign(key: &TestKey, claims: &Value) -> String {
    let mut header = Header::new(key.alg);
    header.kid = Some(key.kid.clone());
    jsonwebtoken::encode(&header, claims, &key.encoding).unwrap()
}

/// The provider: serves a JWK set document (or 503 while down) and counts the fetches.
#[derive(Clone)]
struct Provider {
    url: String,
    body: Arc<Mutex<Option<Vec<u8>>>>,
    fetches: Arc<AtomicUsize>,
}

impl Provider {
    async fn start(keys: &[&TestKey]) -> Provider {
        let provider = Provider {
            url: String::new(),
            body: Arc::new(Mutex::new(None)),
            fetches: Arc::new(AtomicUsize::new(0)),
        };
        provider.publish(keys);
        let (body, fetches) = (provider.body.clone(), provider.fetches.clone());
        let app = axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let (body, fetches) = (body.clone(), fetches.clone());
                async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    match body.lock().unwrap().clone() {
                        Some(b) => (AxumStatus::OK, b),
                        None => (AxumStatus::SERVICE_UNAVAILABLE, Vec::new()),
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Provider { url, ..provider }
    }

    fn publish(&self, keys: &[&TestKey]) {
        let doc = json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
        self.serve_raw(Some(doc.to_string().into_bytes()));
    }

    fn serve_raw(&self, body: Option<Vec<u8>>) {
        *self.body.lock().unwrap() = body;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

fn identity_config(source: JwksSource, cooldown: Duration) -> IdentityConfig {
    let mut c = IdentityConfig::new(source, ISSUER, AUDIENCE);
    c.user_claim = "uid".into();
    c.refetch_cooldown = cooldown;
    c
}

async fn stack_with(provider: &Provider, cooldown: Duration, redis: bool) -> Stack {
    let source = JwksSource::Url(provider.url.clone());
    let stack = match redis {
        true => {
            Stack::redis_mysql_with(|config| {
                config.identity = Some(identity_config(source, cooldown))
            })
            .await
        }
        false => {
            Stack::embedded_with(|config| config.identity = Some(identity_config(source, cooldown)))
                .await
        }
    };
    stack
}

async fn buy(stack: &Stack, token: &str, sku: u64, rid: &str) -> (StatusCode, Value) {
    let body = json!({"request_id": rid, "quantity": 1});
    let path = format!("/api/v1/sales/{sku}/purchases");
    stack.call("POST", &path, Some(token), Some(body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_each_provider_algorithm_buy() {
    let (rsa, ec, ed) = (rsa_key(), ec_key("ec-1"), ed_key("ed-1"));
    let provider = Provider::start(&[&rsa, &ec, &ed]).await;
    let stack = stack_with(&provider, Duration::from_secs(60), false).await;
    stack.live_sale(71, 10, 1).await;
    for (user, key) in [(1, &rsa), (2, &ec), (3, &ed)] {
        let (s, b) = buy(&stack, &sign(key, &claims(user)), 71, "a").await;
        assert_eq!(s, StatusCode::ACCEPTED, "{:?}: {b}", key.alg);
        assert_eq!(b["user_id"], user, "the user is the configured claim's");
    }
    // Our own HS256 tokens (`flashsale token`) still work beside the provider's.
    let (s, b) = buy(&stack, &stack.token(4), 71, "a").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{b}");
    assert_eq!(
        provider.fetches(),
        1,
        "one fetch at start, none per request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_provider_tokens_are_refused() {
    let (rsa, ec) = (rsa_key(), ec_key("ec-1"));
    let provider = Provider::start(&[&rsa, &ec]).await;
    let stack = stack_with(&provider, Duration::from_secs(60), false).await;
    stack.live_sale(72, 100, 1).await;
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut c = claims(5);
        edit(&mut c);
        sign(&rsa, &c)
    };
    // `alg: none`: a header and claims, no signature.
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT","kid":"rsa-1"}"#),
        b64(claims(5).to_string().as_bytes())
    );
    // HS256 keyed with the provider's public RSA key: algorithm confusion.
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some(rsa.kid.clone());
    let confused =
        jsonwebtoken::encode(&hs, &claims(5), &EncodingKey::from_secret(&rsa.public)).unwrap();
    // An RS256 header on the EC key's kid.
    let mut mixed = Header::new(Algorithm::RS256);
    mixed.kid = Some(ec.kid.clone());
    let mixed = jsonwebtoken::encode(&mixed, &claims(5), &rsa.encoding).unwrap();
    let cases = [
        ("alg none", none),
        ("HS256 with the RSA public key", confused),
        ("alg of another key", mixed),
        (
            "wrong issuer",
            with(&|c| c["iss"] = json!("https://evil.test")),
        ),
        (
            "wrong audience",
            with(&|c| c["aud"] = json!("other-service")),
        ),
        ("expired", with(&|c| c["exp"] = json!(now_s() - 60))),
        ("not yet valid", with(&|c| c["nbf"] = json!(now_s() + 600))),
        (
            "no user claim",
            with(&|c| c.as_object_mut().unwrap().remove("uid").map(drop).unwrap()),
        ),
        ("tampered", {
            let t = sign(&rsa, &claims(5));
            let (rest, _) = t.rsplit_once('.').unwrap();
            format!("{rest}.{}", b64(&[7; 256]))
        }),
    ];
    for (what, token) in cases {
        let (s, b) = buy(&stack, &token, 72, "a").await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            "{what}: {b}"
        );
    }
    // An unknown kid: refetched once, still unknown, refused.
    let before = provider.fetches();
    let stranger = ec_key("never-published");
    let (s, b) = buy(&stack, &sign(&stranger, &claims(5)), 72, "a").await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
        "{b}"
    );
    assert_eq!(
        provider.fetches(),
        before + 1,
        "the unknown kid caused one refetch"
    );
    let (s, _) = buy(&stack, &sign(&rsa, &claims(5)), 72, "a").await;
    assert_eq!(s, StatusCode::ACCEPTED, "the good token still buys");
    let view = stack.call("GET", "/api/v1/sales/72", None, None).await.1;
    assert_eq!(view["available"], 99, "no refused token bought: {view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spike_of_forged_kids_costs_one_fetch() {
    let rsa = rsa_key();
    let provider = Provider::start(&[&rsa]).await;
    let stack = stack_with(&provider, Duration::from_secs(60), false).await;
    stack.live_sale(73, 10, 1).await;
    let forger = ec_key("unused");
    let before = provider.fetches();
    const UNKNOWN: &str = "flashsale_jwks_unknown_kid_total";
    let unknown_before = stack.metric(UNKNOWN).await;
    let answers: Vec<StatusCode> = futures::stream::iter(0..300u64)
        .map(|i| {
            let mut forged = forger.clone();
            forged.kid = format!("forged-{i}");
            let token = sign(&forged, &claims(i + 1));
            let stack = &stack;
            async move { buy(stack, &token, 73, "a").await.0 }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    assert!(answers.iter().all(|s| *s == StatusCode::UNAUTHORIZED));
    assert_eq!(provider.fetches(), before + 1, "300 forged kids, one fetch");
    let unknown = stack.metric(UNKNOWN).await;
    assert!(
        unknown - unknown_before >= 300.0,
        "{unknown_before} → {unknown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cached_set_is_served_while_the_provider_is_down_or_broken() {
    let rsa = rsa_key();
    let provider = Provider::start(&[&rsa]).await;
    let stack = stack_with(&provider, Duration::ZERO, false).await;
    stack.live_sale(74, 10, 1).await;
    let identity = stack
        .server
        .as_ref()
        .unwrap()
        .state
        .auth
        .identity()
        .unwrap()
        .clone();
    // The recorder is one per test binary: counters are compared with their start.
    const ERRORS: &str = "flashsale_jwks_fetches_total{result=\"error\"}";
    let errors_before = stack.metric(ERRORS).await;
    let broken: [Option<&[u8]>; 3] = [
        None,
        Some(b"<html>not a key set</html>"),
        Some(b"{\"keys\": []}"),
    ];
    for (i, body) in broken.into_iter().enumerate() {
        provider.serve_raw(body.map(<[u8]>::to_vec));
        assert!(identity.refresh().await.is_err(), "case {i} refused");
        assert_eq!(identity.key_count(), 1, "case {i}: the cached set stays");
        // A new kid cannot be learnt meanwhile, but the cached keys still verify.
        let stranger = ec_key("rotated");
        let (s, _) = buy(&stack, &sign(&stranger, &claims(9)), 74, "x").await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let user = i as u64 + 1;
        let (s, b) = buy(&stack, &sign(&rsa, &claims(user)), 74, "a").await;
        assert_eq!(s, StatusCode::ACCEPTED, "case {i}: {b}");
    }
    assert!(identity.is_stale());
    let errors = stack.metric(ERRORS).await;
    assert!(errors - errors_before >= 3.0, "{errors_before} → {errors}");
    // Back up: the next fetch clears the flag.
    provider.publish(&[&rsa]);
    assert_eq!(identity.refresh().await, Ok(1));
    assert!(!identity.is_stale());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_set_file_that_does_not_parse_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, b"{\"keys\": [").unwrap();
    let url = common::sqlite_url(&dir);
    let mut config = common::config(None, url.clone());
    config.identity = Some(identity_config(
        JwksSource::File(path.clone()),
        Duration::ZERO,
    ));
    let err = flashsale_server::Server::start(config)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not usable"), "{err:#}");
    // The same file, once it holds a key set, is used.
    let ed = ed_key("ed-file");
    std::fs::write(&path, json!({"keys": [ed.jwk]}).to_string()).unwrap();
    let mut config = common::config(None, url);
    config.identity = Some(identity_config(JwksSource::File(path), Duration::ZERO));
    let stack = Stack::start(config, None, Some(dir)).await;
    stack.live_sale(75, 1, 1).await;
    assert_eq!(
        buy(&stack, &sign(&ed, &claims(1)), 75, "a").await.0,
        StatusCode::ACCEPTED
    );
}

/// Buyers arrive with the old key; mid-spike the provider publishes a new one beside it and
/// signs every later token with it. The first token of the new kid refetches the set; no
/// valid buyer gets 401, and the sale sells exactly its stock (checked from the database).
async fn rotation_mid_spike(redis: bool) {
    const STOCK: u64 = 100;
    const BUYERS: u64 = 400;
    let (old, new) = (rsa_key(), ec_key("ec-next"));
    let provider = Provider::start(&[&old]).await;
    let stack = stack_with(&provider, Duration::from_secs(60), redis).await;
    let sku = 76;
    stack.live_sale(sku, STOCK, 1).await;
    let (publishing, rotated) = (AtomicBool::new(false), AtomicBool::new(false));
    let answered = AtomicUsize::new(0);
    let answers: Vec<(StatusCode, Value)> = futures::stream::iter(1..=BUYERS)
        .map(|user| {
            let (stack, rotated, answered) = (&stack, &rotated, &answered);
            let (old, new, provider, publishing) = (&old, &new, &provider, &publishing);
            async move {
                // Once a quarter is answered, one task publishes the new key, then every
                // later token is signed with it (the old key stays published: an overlap).
                let due = answered.load(Ordering::SeqCst) >= (BUYERS / 4) as usize;
                if due && !publishing.swap(true, Ordering::SeqCst) {
                    provider.publish(&[old, new]);
                    rotated.store(true, Ordering::SeqCst);
                }
                let key = if rotated.load(Ordering::SeqCst) {
                    new
                } else {
                    old
                };
                let answer = buy(stack, &sign(key, &claims(user)), sku, "r").await;
                answered.fetch_add(1, Ordering::SeqCst);
                answer
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(
        rotated.load(Ordering::SeqCst),
        "the rotation happened mid-spike"
    );
    let mut accepted = 0;
    for (s, b) in &answers {
        match (*s, code(b)) {
            (StatusCode::ACCEPTED, _) => accepted += 1,
            (StatusCode::CONFLICT, "SOLD_OUT") => {}
            other => panic!("unexpected answer {other:?}: {b}"),
        }
    }
    assert_eq!(accepted, STOCK, "the spike sells exactly the stock");
    stack.drain(sku).await;
    common::assert_invariants(stack.store().as_ref(), sku).await;
    let view = stack
        .call("GET", &format!("/api/v1/sales/{sku}"), None, None)
        .await
        .1;
    assert_eq!(
        (view["available"].as_u64(), view["sold"].as_u64()),
        (Some(0), Some(STOCK))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rotation_mid_spike_embedded() {
    rotation_mid_spike(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rotation_mid_spike_redis_mysql() {
    rotation_mid_spike(true).await;
}
