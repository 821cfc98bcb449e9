//! The HTTP API on both ledgers: outcomes, replay, limits, windows, bad input, auth.

use crate::common;

use crate::common::{code, Stack};
use reqwest::StatusCode;
use serde_json::{json, Value};

async fn sale_view(stack: &Stack, sku: u64) -> Value {
    stack.get_ok(&format!("/api/v1/sales/{sku}")).await
}

both_ledgers!(sells_replays_and_refuses);
async fn sells_replays_and_refuses(stack: &Stack) {
    stack.live_sale(11, 2, 1).await;
    let first = stack.buy_ok(1, 11, "a", 1).await;
    let (s, again) = stack.buy(1, 11, "a", json!(1)).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(
        again["order_no"], first["order_no"],
        "a retry answers the first outcome"
    );
    assert_eq!(again["replayed"], json!(true));
    stack.buy_refused(1, 11, "b", 1, "LIMIT_EXCEEDED").await;
    stack.buy_ok(2, 11, "a", 1).await;
    stack.buy_refused(3, 11, "a", 1, "SOLD_OUT").await;
    // Sold out, yet the first buyer's retry still gets its order.
    let (s, again) = stack.buy(1, 11, "a", json!(1)).await;
    assert_eq!(
        (s, &again["order_no"]),
        (StatusCode::ACCEPTED, &first["order_no"])
    );
    stack.drain(11).await;
    let view = sale_view(stack, 11).await;
    assert_eq!(
        (view["available"].as_u64(), view["sold"].as_u64()),
        (Some(0), Some(2))
    );
    common::assert_invariants(stack.store().as_ref(), 11).await;
}

both_ledgers!(per_user_limit_counts_units);
async fn per_user_limit_counts_units(stack: &Stack) {
    stack.live_sale(12, 100, 3).await;
    stack.buy_ok(1, 12, "a", 2).await;
    stack.buy_refused(1, 12, "b", 2, "LIMIT_EXCEEDED").await;
    stack.buy_ok(1, 12, "c", 1).await;
    stack.buy_refused(2, 12, "a", 4, "LIMIT_EXCEEDED").await;
    stack.buy_ok(2, 12, "d", 3).await;
    stack.drain(12).await;
    let view = sale_view(stack, 12).await;
    assert_eq!(view["sold"].as_u64(), Some(6));
    common::assert_invariants(stack.store().as_ref(), 12).await;
}

both_ledgers!(bad_input_is_400_and_changes_nothing);
async fn bad_input_is_400_and_changes_nothing(stack: &Stack) {
    stack.live_sale(13, 10, 5).await;
    let token = stack.token(1);
    let path = "/api/v1/sales/13/purchases";
    let bodies = [
        json!({"request_id": "q0", "quantity": 0}),
        json!({"request_id": "q1", "quantity": -1}),
        json!({"request_id": "q2", "quantity": 1_000_000_000_000u64}),
        json!({"request_id": "q3", "quantity": "x"}),
        json!({"request_id": "q4"}),
        json!({"request_id": "q5", "quantity": 1.5}),
        json!({"request_id": "", "quantity": 1}),
        json!({"request_id": "x".repeat(65), "quantity": 1}),
        json!({"request_id": "sp ace", "quantity": 1}),
        json!({"quantity": 1}),
        json!({"request_id": "q6", "quantity": 1, "extra": true}),
        json!([1, 2]),
    ];
    for body in bodies {
        let (s, b) = stack
            .call("POST", path, Some(&token), Some(body.clone()))
            .await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{body} → {b}"
        );
    }
    let raw = |body: String| {
        let req = stack.http.post(format!("{}{path}", stack.base));
        let req = req
            .bearer_auth(&token)
            .header("content-type", "application/json");
        req.body(body).send()
    };
    let resp = raw("{not json".into()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let huge = format!(
        "{{\"request_id\":\"{}\",\"quantity\":1}}",
        "x".repeat(10_000)
    );
    let resp = raw(huge).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let (s, b) = stack.buy(1, 999_999, "a", json!(1)).await;
    assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "SALE_NOT_FOUND"));
    let (s, b) = stack
        .call(
            "POST",
            "/api/v1/sales/abc/purchases",
            Some(&token),
            Some(json!({})),
        )
        .await;
    assert_eq!((s, code(&b)), (StatusCode::BAD_REQUEST, "INVALID_REQUEST"));
    let view = sale_view(stack, 13).await;
    assert_eq!(
        (view["available"].as_u64(), view["seq"].as_u64()),
        (Some(10), Some(0)),
        "nothing changed"
    );
}

both_ledgers!(a_body_in_chunks_is_read_whole);
/// A body sent in chunks reaches the handler as several frames: it is read whole (a purchase
/// in two chunks is accepted once), and one past the body limit is 413 as with a length.
async fn a_body_in_chunks_is_read_whole(stack: &Stack) {
    stack.live_sale(14, 10, 5).await;
    let token = stack.token(1);
    let path = "/api/v1/sales/14/purchases";
    let two = [r#"{"request_id":"ch1","#, r#""quantity":2}"#];
    assert_eq!(chunked_post(stack, path, &token, &two).await, 202);
    let view = sale_view(stack, 14).await;
    assert_eq!(
        view["available"].as_u64(),
        Some(8),
        "the two chunks made one purchase"
    );
    let big = format!(r#""x":"{}"}}"#, "y".repeat(10_000));
    let too_long = [r#"{"request_id":"ch2","#, &big];
    assert_eq!(chunked_post(stack, path, &token, &too_long).await, 413);
    let view = sale_view(stack, 14).await;
    assert_eq!(view["available"].as_u64(), Some(8), "nothing changed");
}

/// POSTs `chunks` as a chunked body over a connection of its own; the answer's status.
async fn chunked_post(stack: &Stack, path: &str, token: &str, chunks: &[&str]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = stack.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    // The server may answer (413) and close before the last chunks: writes may then fail.
    for chunk in chunks {
        let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
        let _ = conn.write_all(framed.as_bytes()).await;
        let _ = conn.flush().await;
    }
    let _ = conn.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split(' ').nth(1).unwrap_or_default();
    status
        .parse()
        .unwrap_or_else(|_| panic!("no status in {answer:?}"))
}

both_ledgers!(window_and_operator_state);
async fn window_and_operator_state(stack: &Stack) {
    let now = flashsale_engine::now_ms();
    let later =
        json!({"sku_id": 14, "name": "later", "total_stock": 5, "starts_at_ms": now + 3_600_000});
    stack.live_sale_with(later).await;
    stack.buy_refused(1, 14, "a", 1, "NOT_STARTED").await;
    let over = json!({"sku_id": 15, "name": "over", "total_stock": 5, "starts_at_ms": now - 7_200_000, "ends_at_ms": now - 3_600_000});
    stack.live_sale_with(over).await;
    stack.buy_refused(1, 15, "a", 1, "ENDED").await;

    let (s, _) = stack
        .create_sale(json!({"sku_id": 16, "name": "cold", "total_stock": 5}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, b) = stack.buy(1, 16, "a", json!(1)).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::CONFLICT, "NOT_STARTED"),
        "known but not warm"
    );
    assert_eq!(stack.sale_action(16, "warm").await.0, StatusCode::OK);
    assert_eq!(stack.sale_action(16, "pause").await.0, StatusCode::OK);
    stack.buy_refused(1, 16, "a", 1, "PAUSED").await;
    assert_eq!(stack.sale_action(16, "resume").await.0, StatusCode::OK);
    stack.buy_ok(1, 16, "a", 1).await;
    assert_eq!(stack.sale_action(16, "end").await.0, StatusCode::OK);
    stack.buy_refused(2, 16, "b", 1, "ENDED").await;
    let (s, b) = stack.sale_action(16, "warm").await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "ENDED"));
    // An unknown sale is not found, whatever its state would be.
    assert_eq!(
        stack.buy(1, 11_016, "a", json!(1)).await.0,
        StatusCode::NOT_FOUND
    );
}

both_ledgers!(admin_create_validates_and_refuses_duplicates);
async fn admin_create_validates_and_refuses_duplicates(stack: &Stack) {
    let ok = json!({"sku_id": 17, "name": "x", "total_stock": 3});
    assert_eq!(stack.create_sale(ok.clone()).await.0, StatusCode::CREATED);
    let (s, b) = stack.create_sale(ok).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "SALE_EXISTS"));
    for bad in [
        json!({"sku_id": 18, "name": "x", "total_stock": 0}),
        json!({"sku_id": 18, "name": "x", "total_stock": -5}),
        json!({"sku_id": 18, "name": "x", "total_stock": 2_000_000_000u64}),
        json!({"sku_id": 18, "name": "", "total_stock": 3}),
        json!({"sku_id": 18, "name": "x".repeat(201), "total_stock": 3}),
        json!({"sku_id": 18, "name": "x", "total_stock": 3, "per_user_limit": 0}),
        json!({"sku_id": 18, "name": "x", "total_stock": 3, "mode": "weird"}),
        json!({"sku_id": 0, "name": "x", "total_stock": 3}),
    ] {
        let (s, b) = stack.create_sale(bad.clone()).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{bad}"
        );
    }
    let (s, b) = stack.call("GET", "/api/v1/sales/18", None, None).await;
    assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "SALE_NOT_FOUND"));
    // Warm twice over sold units is refused without force.
    stack.live_sale(19, 3, 1).await;
    stack.buy_ok(1, 19, "a", 1).await;
    let (s, b) = stack.sale_action(19, "warm").await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "SALE_EXISTS"));
}

both_ledgers!(auth_and_order_privacy);
async fn auth_and_order_privacy(stack: &Stack) {
    stack.live_sale(21, 5, 1).await;
    let path = "/api/v1/sales/21/purchases";
    let body = Some(json!({"request_id": "a", "quantity": 1}));
    let (s, b) = stack.call("POST", path, None, body.clone()).await;
    assert_eq!((s, code(&b)), (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"));
    let (s, _) = stack
        .call("POST", path, Some("garbage"), body.clone())
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let forged = flashsale_server::auth::Auth::new("another-secret", "x")
        .sign(flashsale_core::UserId(1), 60);
    assert_eq!(
        stack
            .call("POST", path, Some(&forged), body.clone())
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    let expired = stack.auth.sign(flashsale_core::UserId(1), 0);
    let _ = expired; // expiry within leeway is accepted; an expired token is covered by unit tests
    let (s, b) = stack
        .call(
            "POST",
            "/api/v1/sales",
            Some(&stack.token(1)),
            Some(json!({})),
        )
        .await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "FORBIDDEN"));
    let (s, b) = stack.call("POST", path, Some(common::ADMIN), body).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "FORBIDDEN"));

    let (_, order) = stack.buy(1, 21, "a", json!(1)).await;
    let no = order["order_no"].as_str().unwrap().to_owned();
    let (s, mine) = stack.order(1, &no).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        ["PENDING", "CREATED"].contains(&mine["status"].as_str().unwrap()),
        "{mine}"
    );
    let (s, b) = stack.order(2, &no).await;
    assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "ORDER_NOT_FOUND"));
    let (s, _) = stack
        .call(
            "GET",
            "/api/v1/orders/not-an-order",
            Some(&stack.token(1)),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    stack.drain(21).await;
    let (_, stored) = stack.order(1, &no).await;
    assert_eq!(stored["status"], json!("CREATED"));
    let (s, b) = stack.call("GET", "/api/v1/nowhere", None, None).await;
    assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "ROUTE_NOT_FOUND"));
}

both_ledgers!(health_ready_and_metrics);
async fn health_ready_and_metrics(stack: &Stack) {
    assert_eq!(
        stack.call("GET", "/healthz", None, None).await.0,
        StatusCode::OK
    );
    stack.get_ok("/readyz").await;
    stack.live_sale(22, 1, 1).await;
    stack.buy(1, 22, "a", json!(1)).await;
    let text = stack.metrics_text().await;
    assert!(text.contains("flashsale_http_requests_total"), "{text}");
    assert!(
        text.contains("flashsale_purchase_latency_seconds_bucket"),
        "histograms have buckets"
    );
}

/// Sends a request and gives the status, the content type and the JSON body.
async fn raw_call(req: reqwest::RequestBuilder) -> (StatusCode, String, Value) {
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (
        status,
        content_type,
        resp.json().await.unwrap_or(Value::Null),
    )
}

/// Every kind of error (a rule's refusal, a rejected extraction, auth, an unknown route, a
/// body too large) answers RFC 9457 Problem Details, with `code` and `message` kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_problem_details() {
    let stack = Stack::embedded().await;
    stack.live_sale(19, 1, 1).await;
    stack.buy_ok(1, 19, "a", 1).await;
    let buy = |token: Option<String>, body: String| {
        let mut req = stack
            .http
            .post(format!("{}/api/v1/sales/19/purchases", stack.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req
    };
    let good = r#"{"request_id":"b","quantity":1}"#.to_owned();
    let cases = [
        (
            buy(Some(stack.token(2)), good.clone()),
            409,
            "SOLD_OUT",
            "sold-out",
        ),
        (
            buy(Some(stack.token(2)), "{not json".into()),
            400,
            "INVALID_REQUEST",
            "invalid-request",
        ),
        (buy(None, good.clone()), 401, "UNAUTHORIZED", "unauthorized"),
        (
            buy(Some(stack.token(2)), "x".repeat(10_000)),
            413,
            "PAYLOAD_TOO_LARGE",
            "payload-too-large",
        ),
        (
            stack.http.get(format!("{}/api/v1/nothing", stack.base)),
            404,
            "ROUTE_NOT_FOUND",
            "route-not-found",
        ),
        (
            stack.http.get(format!("{}/api/v1/sales/x", stack.base)),
            400,
            "INVALID_REQUEST",
            "invalid-request",
        ),
    ];
    for (req, status, code_, slug) in cases {
        let (s, content_type, b) = raw_call(req).await;
        assert_eq!((s.as_u16(), code(&b)), (status, code_), "{b}");
        assert_eq!(content_type, "application/problem+json", "{b}");
        assert_eq!(b["type"], format!("https://flashsale.dev/problems/{slug}"));
        assert_eq!(b["status"], status, "{b}");
        assert!(b["title"].as_str().is_some_and(|t| !t.is_empty()), "{b}");
        assert!(b["detail"].as_str().is_some_and(|t| !t.is_empty()), "{b}");
        assert_eq!(b["message"], b["detail"], "{b}");
    }
}

/// A purchase with these `Idempotency-Key` header lines and this body.
async fn buy_keyed(
    stack: &Stack,
    user: u64,
    sku: u64,
    keys: &[&str],
    body: Value,
) -> (StatusCode, Value) {
    let mut req = stack.purchase_request(user, sku, &body);
    for k in keys {
        req = req.header("idempotency-key", *k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

both_ledgers!(idempotency_key_names_the_attempt);
async fn idempotency_key_names_the_attempt(stack: &Stack) {
    stack.live_sale(17, 10, 5).await;
    stack.live_sale(18, 10, 5).await;
    let (s, first) = buy_keyed(stack, 1, 17, &["k-1"], json!({"quantity": 2})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{first}");
    assert_eq!(first["request_id"], "k-1");
    // The same attempt, however it names the key: header, quoted header, header and body.
    for (keys, body) in [
        (vec!["k-1"], json!({"quantity": 2})),
        (vec!["\"k-1\""], json!({"quantity": 2})),
        (vec!["k-1"], json!({"request_id": "k-1", "quantity": 2})),
        (vec![], json!({"request_id": "k-1", "quantity": 2})),
    ] {
        let (s, again) = buy_keyed(stack, 1, 17, &keys, body).await;
        assert_eq!(
            (s, &again["order_no"]),
            (StatusCode::ACCEPTED, &first["order_no"])
        );
        assert_eq!(again["replayed"], json!(true));
    }
    // Malformed: header and body disagree, neither given, a bad or doubled header.
    for (keys, body) in [
        (vec!["k-2"], json!({"request_id": "k-3", "quantity": 1})),
        (vec![], json!({"quantity": 1})),
        (vec!["sp ace"], json!({"quantity": 1})),
        (vec!["\"\""], json!({"quantity": 1})),
        (vec!["x".repeat(65).leak() as &str], json!({"quantity": 1})),
        (vec!["k-2", "k-2"], json!({"quantity": 1})),
    ] {
        let (s, b) = buy_keyed(stack, 1, 17, &keys, body.clone()).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{keys:?} {body} → {b}"
        );
    }
    // Reused with another quantity (header or body) or, as a header key, on another sale.
    for (sku, keys, body) in [
        (17, vec!["k-1"], json!({"quantity": 1})),
        (17, vec![], json!({"request_id": "k-1", "quantity": 3})),
        (18, vec!["k-1"], json!({"quantity": 2})),
    ] {
        let (s, b) = buy_keyed(stack, 1, sku, &keys, body.clone()).await;
        assert_eq!(
            (s.as_u16(), code(&b)),
            (422, "IDEMPOTENCY_KEY_REUSED"),
            "{sku} {keys:?} {body} → {b}"
        );
        assert!(b.get("order_no").is_none(), "never the first outcome: {b}");
    }
    // A body request_id stays scoped to its sale (the contract): a new attempt there.
    let (s, b) = buy_keyed(
        stack,
        1,
        18,
        &[],
        json!({"request_id": "k-1", "quantity": 1}),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{b}");
    stack.drain(17).await;
    stack.drain(18).await;
    let view = sale_view(stack, 17).await;
    assert_eq!(
        view["available"].as_u64(),
        Some(8),
        "one order of 2 units: {view}"
    );
    assert_eq!(sale_view(stack, 18).await["available"].as_u64(), Some(9));
    common::assert_invariants(stack.store().as_ref(), 17).await;
}

both_ledgers!(the_sale_view_carries_a_validator_and_answers_304_while_current);
async fn the_sale_view_carries_a_validator_and_answers_304_while_current(stack: &Stack) {
    stack.live_sale(17, 10, 1).await;
    let url = format!("{}/api/v1/sales/17", stack.base);
    let first = stack.http.get(&url).send().await.expect("GET");
    assert_eq!(first.status(), StatusCode::OK);
    let header = |r: &reqwest::Response, h: &str| {
        r.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    assert_eq!(
        header(&first, "cache-control").as_deref(),
        Some("public, max-age=1")
    );
    let tag = header(&first, "etag").expect("an ETag");
    let body: Value = first.json().await.expect("a JSON view");
    assert_eq!(body["available"], json!(10));
    let current = stack.http.get(&url).header("if-none-match", &tag);
    let again = current.send().await.expect("GET");
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(header(&again, "etag").as_deref(), Some(tag.as_str()));
    assert!(again.bytes().await.expect("body").is_empty());
    let other = stack.http.get(&url).header("if-none-match", "\"0\"");
    assert_eq!(other.send().await.expect("GET").status(), StatusCode::OK);
    // A sale that changed gets a new tag once the view's counters move (the cache's second).
    stack.buy_ok(1, 17, "a", 1).await;
    let changed =
        flashsale_testkit::wait::until("a new tag", std::time::Duration::from_secs(10), || async {
            let r = stack.http.get(&url).header("if-none-match", &tag);
            let r = r.send().await.ok()?;
            (r.status() == StatusCode::OK).then(|| header(&r, "etag"))?
        })
        .await;
    assert_ne!(changed, tag);
}
