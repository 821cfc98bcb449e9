//! Hostile input: auth (missing, malformed, expired, wrong-secret tokens; user tokens on admin
//! routes; other users' orders) over real HTTP on both ledgers, and a property test of request
//! parsing through the whole router: any body, path or header gets a 4xx in our error shape
//! (never 5xx) and a refused request changes nothing.

use crate::common;

use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::{code, Stack};
use axum::body::Body;
use axum::http::{Request, StatusCode as HttpStatus};
use flashsale_core::{SkuId, UserId};
use flashsale_server::auth::Auth;
use flashsale_server::gateway::GatewayConfig;
use flashsale_server::{AppState, Tunables};
use proptest::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tower::ServiceExt;

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token signed with the right secret whose `exp` is `ago_s` seconds in the past.
fn expired_token(user: u64, ago_s: u64) -> String {
    #[derive(serde::Serialize)]
    struct Claims {
        sub: String,
        exp: u64,
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &Claims {
            sub: user.to_string(),
            exp: now_s() - ago_s,
        },
        &jsonwebtoken::EncodingKey::from_secret(common::JWT_SECRET.as_bytes()),
    )
    .unwrap()
}

both_ledgers!(every_bad_token_is_401_and_roles_hold);
async fn every_bad_token_is_401_and_roles_hold(stack: &Stack) {
    stack.live_sale(31, 10, 1).await;
    let path = "/api/v1/sales/31/purchases";
    let body = || Some(json!({"request_id": "a", "quantity": 1}));
    let forged = Auth::new("another-secret", "x").sign(UserId(1), 600);
    let none_alg = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiIxIiwiZXhwIjo5OTk5OTk5OTk5fQ.";
    let zero_user = stack.auth.sign(UserId(0), 600);
    let long = "a".repeat(5_000);
    for (what, token) in [
        ("expired", expired_token(1, 120)),
        ("wrong secret", forged),
        ("alg none", none_alg.to_owned()),
        ("garbage", "garbage".to_owned()),
        ("three dots", "a.b.c".to_owned()),
        ("user 0", zero_user),
        ("too long", long),
    ] {
        let (s, b) = stack.call("POST", path, Some(&token), body()).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            "{what}: {b}"
        );
    }
    let (s, b) = stack.call("POST", path, None, body()).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
        "missing"
    );
    for header in [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer ",
        "bearer x",
        "Token abc",
    ] {
        let resp = stack
            .http
            .post(format!("{}{path}", stack.base))
            .header("authorization", header)
            .json(&json!({"request_id": "a", "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{header:?}");
        let b: Value = resp.json().await.unwrap();
        assert_eq!(code(&b), "UNAUTHORIZED");
    }
    // A user token on every admin route → 403; an expired one → 401.
    let user = stack.token(1);
    for (method, admin_path) in [
        ("POST", "/api/v1/sales"),
        ("POST", "/api/v1/sales/31/warm"),
        ("POST", "/api/v1/sales/31/pause"),
        ("POST", "/api/v1/sales/31/resume"),
        ("POST", "/api/v1/sales/31/end"),
        ("GET", "/api/v1/admin/blacklist"),
        ("PUT", "/api/v1/admin/blacklist/users/5"),
        ("DELETE", "/api/v1/admin/blacklist/users/5"),
        ("PUT", "/api/v1/admin/blacklist/ips/10.0.0.1"),
        ("PUT", "/api/v1/admin/sales/31/purchase-token"),
    ] {
        let (s, b) = stack
            .call(method, admin_path, Some(&user), Some(json!({})))
            .await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::FORBIDDEN, "FORBIDDEN"),
            "{method} {admin_path}"
        );
        let (s, _) = stack
            .call(
                method,
                admin_path,
                Some(&expired_token(1, 120)),
                Some(json!({})),
            )
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} {admin_path}");
    }
    // Nothing changed: the sale is live and untouched.
    let (_, view) = stack.call("GET", "/api/v1/sales/31", None, None).await;
    assert_eq!(
        (view["state"].as_str(), view["seq"].as_u64()),
        (Some("live"), Some(0))
    );

    // Another user's order is not found, for reading, paying and cancelling.
    let (s, order) = stack.buy(1, 31, "mine", json!(1)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{order}");
    let no = order["order_no"].as_str().unwrap();
    for (method, p) in [
        ("GET", format!("/api/v1/orders/{no}")),
        ("POST", format!("/api/v1/orders/{no}/pay")),
        ("POST", format!("/api/v1/orders/{no}/cancel")),
    ] {
        let (s, b) = stack.call(method, &p, Some(&stack.token(2)), None).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::NOT_FOUND, "ORDER_NOT_FOUND"),
            "{method} {p}"
        );
    }
    let (s, b) = stack.order(1, no).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_ne!(b["status"], json!("CANCELLED"));
}

/// An in-process service on the embedded ledger, without rate limits.
async fn in_process() -> (axum::Router, AppState, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(None, common::sqlite_url(&dir));
    config.tunables = Tunables {
        gateway: GatewayConfig::unlimited(),
        ..Tunables::default()
    };
    let (ledger, store) = flashsale_engine::backends::open(&config.engine)
        .await
        .unwrap();
    let state = AppState::new(
        ledger,
        store,
        Auth::new(common::JWT_SECRET, common::ADMIN),
        config.tunables,
    );
    (flashsale_server::app(state.clone()), state, dir)
}

async fn send(app: &axum::Router, req: Request<Body>) -> (HttpStatus, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, bytes.to_vec())
}

fn body_strategy() -> impl Strategy<Value = Vec<u8>> {
    let json_body = (
        prop_oneof![
            6 => "[A-Za-z0-9_-]{1,64}".prop_map(Value::from),
            1 => "\\PC{0,80}".prop_map(Value::from),
            1 => any::<i64>().prop_map(Value::from),
            1 => Just(Value::Null),
        ],
        prop_oneof![
            6 => (-3i64..1_005).prop_map(Value::from),
            1 => any::<i64>().prop_map(Value::from),
            1 => any::<f64>().prop_map(|f| json!(f)),
            1 => "\\PC{0,8}".prop_map(Value::from),
            1 => Just(Value::Null),
            1 => Just(json!(u64::MAX)),
        ],
        prop::option::of("\\PC{0,40}"),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(rid, q, token, extra)| {
            let mut v = json!({"request_id": rid, "quantity": q});
            if let Some(t) = token {
                v["purchase_token"] = json!(t);
            }
            if extra {
                v["extra"] = json!(1);
            }
            serde_json::to_vec(&v).unwrap()
        });
    prop_oneof![
        6 => json_body,
        1 => prop::collection::vec(any::<u8>(), 0..300),
        1 => "\\PC{0,300}".prop_map(String::into_bytes),
    ]
}

fn path_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => Just("41".to_owned()),
        1 => "[0-9]{1,25}",
        1 => "[-a-zA-Z0-9%._~]{0,30}",
    ]
}

#[test]
fn purchase_parsing_never_500s_and_refusals_change_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (app, state, _dir) = rt.block_on(in_process());
    let admin = |method: &str, path: &str, body: Value| {
        Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {}", common::ADMIN))
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    };
    rt.block_on(async {
        let sale = json!({"sku_id": 41, "name": "fuzz", "total_stock": 1_000_000, "per_user_limit": 1_000});
        assert_eq!(send(&app, admin("POST", "/api/v1/sales", sale)).await.0, HttpStatus::CREATED);
        assert_eq!(send(&app, admin("POST", "/api/v1/sales/41/warm", json!(null))).await.0, HttpStatus::OK);
    });
    let auth = Auth::new(common::JWT_SECRET, common::ADMIN);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 400,
        ..ProptestConfig::default()
    });
    let strategy = (
        body_strategy(),
        path_strategy(),
        1u64..50,
        prop::bool::weighted(0.9),
        prop::option::of("[ -~]{0,40}"),
    );
    let (accepted, refused) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    runner
        .run(&strategy, |(body, sku, user, json_ct, extra_header)| {
            rt.block_on(async {
                let counters = || async { state.shop.ledger().counters(SkuId(41)).await };
                let before = counters().await.unwrap().unwrap();
                let mut req = Request::builder()
                    .method("POST")
                    .uri(format!("/api/v1/sales/{sku}/purchases"))
                    .header(
                        "authorization",
                        format!("Bearer {}", auth.sign(UserId(user), 600)),
                    );
                if json_ct {
                    req = req.header("content-type", "application/json");
                }
                if let Some(h) = extra_header {
                    req = req.header("x-junk", h);
                }
                let req = req.body(Body::from(body.clone())).unwrap();
                let (status, bytes) = send(&app, req).await;
                let after = counters().await.unwrap().unwrap();
                prop_assert!(
                    status.as_u16() < 500,
                    "{status} for {:?}",
                    String::from_utf8_lossy(&body)
                );
                if status != HttpStatus::ACCEPTED {
                    refused.set(refused.get() + 1);
                    let v: Value = serde_json::from_slice(&bytes)
                        .map_err(|e| TestCaseError::fail(format!("{status} body not JSON: {e}")))?;
                    prop_assert!(v["code"].is_string() && v["message"].is_string(), "{v}");
                    prop_assert_eq!(before, after, "a refused request changed the sale");
                } else {
                    accepted.set(accepted.get() + 1);
                    // Accepted only for a well-formed body on the real sale.
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    let q = v["quantity"].as_i64().unwrap();
                    prop_assert!((1..=1_000).contains(&q));
                    prop_assert_eq!(sku.as_str(), "41");
                    let rid = v["request_id"].as_str().unwrap();
                    prop_assert!(flashsale_core::RequestId::parse(rid).is_some());
                }
                Ok(())
            })
        })
        .unwrap();
    println!(
        "purchase parsing: {} accepted, {} refused",
        accepted.get(),
        refused.get()
    );
    assert!(
        accepted.get() > 0 && refused.get() > 0,
        "the generator reaches both outcomes: {} accepted, {} refused",
        accepted.get(),
        refused.get()
    );
}
