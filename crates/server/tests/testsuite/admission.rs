//! Queue and draw sales over HTTP on both ledgers: bad admission settings are 400, and so are
//! the draw routes of a live sale without a draw; a queue sale's purchase without a valid pass
//! is 403 ADMISSION_REQUIRED; joins keep their place, the queue admits after the start, an
//! admitted buyer buys with its pass and the rest hear SOLD_OUT (JSON and SSE); a draw
//! publishes its commitment, then the seed and winners, which the independent script
//! recomputes, and each winner reads its reservation; concurrent joins are written in groups,
//! counted and timed in `/metrics`.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{code, Stack};

const LIMIT: Duration = Duration::from_secs(30);
/// A buyer's poll interval: every request counts against the user's rate limit, and a loop
/// without one is refused 429 once the answers are fast.
const POLL: Duration = Duration::from_millis(250);

fn now_ms() -> i64 {
    flashsale_core::clock::now_ms()
}

async fn queue_me(stack: &Stack, sku: u64, user: u64) -> (StatusCode, Value, Option<String>) {
    let url = format!("{}/api/v1/sales/{sku}/queue/me", stack.base);
    let resp = stack
        .http
        .get(url)
        .bearer_auth(stack.token(user))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, resp.json().await.unwrap(), retry)
}

async fn buy_with(stack: &Stack, user: u64, sku: u64, pass: Option<&str>) -> (StatusCode, Value) {
    let body = json!({"request_id": format!("q{user}"), "quantity": 1, "admission_pass": pass});
    let path = format!("/api/v1/sales/{sku}/purchases");
    stack
        .call("POST", &path, Some(&stack.token(user)), Some(body))
        .await
}

both_ledgers!(bad_admission_settings_are_400);
async fn bad_admission_settings_are_400(stack: &Stack) {
    let starts = now_ms() + 60_000;
    let bad = [
        json!({"sku_id": 901, "name": "q", "total_stock": 5, "admission": "queue",
               "starts_at_ms": starts, "admission_opens_at_ms": starts}),
        json!({"sku_id": 902, "name": "d", "total_stock": 5, "admission": "draw",
               "starts_at_ms": starts, "draw_at_ms": starts + 1}),
        json!({"sku_id": 903, "name": "x", "total_stock": 5, "admission": "lottery"}),
        json!({"sku_id": 904, "name": "o", "total_stock": 5, "admission_opens_at_ms": 5}),
    ];
    for body in bad {
        let (s, b) = stack.create_sale(body.clone()).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            "{body}: {b}"
        );
        let sku = body["sku_id"].as_u64().unwrap();
        let (s, _) = stack
            .call("GET", &format!("/api/v1/sales/{sku}"), None, None)
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "nothing stored");
    }
}

both_ledgers!(a_sale_without_a_draw_answers_the_draw_routes_400);
async fn a_sale_without_a_draw_answers_the_draw_routes_400(stack: &Stack) {
    stack
        .live_sale_with(json!({"sku_id": 905, "name": "open", "total_stock": 2}))
        .await;
    live_queue_sale(stack, 906, 60_000).await;
    let user = stack.token(7);
    for sku in [905, 906] {
        // The draw asked twice: the first question leaves nothing the second would see.
        let calls = [
            ("GET", format!("/api/v1/sales/{sku}/draw"), None),
            (
                "GET",
                format!("/api/v1/sales/{sku}/entries/me"),
                Some(&user),
            ),
            ("GET", format!("/api/v1/sales/{sku}/draw"), None),
        ];
        for (method, path, token) in calls {
            let (s, b) = stack
                .call(method, &path, token.map(String::as_str), None)
                .await;
            assert_eq!(
                (s, code(&b)),
                (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
                "{method} {path}: {b}"
            );
        }
    }
}

/// A live queue sale of two units starting `in_ms` from now; answers its start.
async fn live_queue_sale(stack: &Stack, sku: u64, in_ms: i64) -> i64 {
    let starts = now_ms() + in_ms;
    stack
        .live_sale_with(json!({"sku_id": sku, "name": "queue", "total_stock": 2,
            "admission": "queue", "starts_at_ms": starts}))
        .await;
    starts
}

both_ledgers!(a_queue_sale_admits_then_sells_with_passes);
async fn a_queue_sale_admits_then_sells_with_passes(stack: &Stack) {
    let sku = 910;
    live_queue_sale(stack, sku, 2_000).await;
    let (_, sale) = stack
        .call("GET", &format!("/api/v1/sales/{sku}"), None, None)
        .await;
    assert_eq!(sale["admission"], "queue", "{sale}");
    for pass in [None, Some("v1.910.1.9999999999999.00")] {
        let (s, b) = buy_with(stack, 1, sku, pass).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::FORBIDDEN, "ADMISSION_REQUIRED"),
            "{b}"
        );
    }
    let join = |user: u64| async move {
        let path = format!("/api/v1/sales/{sku}/queue");
        stack
            .call("POST", &path, Some(&stack.token(user)), None)
            .await
    };
    let (s, first) = join(1).await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(first["state"], "pre_queue");
    let commitment = first["seed_sha256"].as_str().unwrap().to_owned();
    for user in 2..=6 {
        assert_eq!(join(user).await.0, StatusCode::OK);
    }
    let (_, again) = join(1).await;
    assert_eq!(again["state"], "pre_queue");

    // After the start: places are drawn, the first wave admits, admitted buyers buy.
    let deadline = Instant::now() + LIMIT;
    let mut bought = Vec::new();
    let mut sold_out = Vec::new();
    while bought.len() + sold_out.len() < 6 {
        assert!(
            Instant::now() < deadline,
            "bought {bought:?}, sold out {sold_out:?}"
        );
        for user in 1..=6u64 {
            if bought.contains(&user) || sold_out.contains(&user) {
                continue;
            }
            let (s, me, retry) = queue_me(stack, sku, user).await;
            assert_eq!(s, StatusCode::OK, "{me}");
            assert_eq!(me["seed_sha256"], commitment.as_str());
            match me["state"].as_str().unwrap() {
                "admitted" => {
                    let pass = me["pass"].as_str().unwrap();
                    let other = if user == 6 { 5 } else { user + 1 };
                    let (s, b) = buy_with(stack, other, sku, Some(pass)).await;
                    assert_eq!(s, StatusCode::FORBIDDEN, "another user's pass: {b}");
                    let (s, b) = buy_with(stack, user, sku, Some(pass)).await;
                    match s {
                        StatusCode::ACCEPTED => bought.push(user),
                        StatusCode::CONFLICT => assert_eq!(code(&b), "SOLD_OUT"),
                        _ => panic!("{s}: {b}"),
                    }
                }
                "sold_out" => sold_out.push(user),
                "waiting" => assert!(retry.is_some(), "Retry-After while waiting"),
                "pre_queue" => {}
                other => panic!("state {other}: {me}"),
            }
        }
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(bought.len(), 2, "exactly the stock");
    let (_, me, _) = queue_me(stack, sku, 1).await;
    let seed = me["seed"].as_str().unwrap();
    let digest = flashsale_core::admission::seed_from_hex(seed)
        .map(|s| flashsale_core::admission::commitment(&s));
    assert_eq!(
        digest.as_deref(),
        Some(commitment.as_str()),
        "the seed revealed"
    );

    // The live stream gives the same state.
    let url = format!("{}/api/v1/sales/{sku}/queue/me/events", stack.base);
    let resp = stack
        .http
        .get(url)
        .bearer_auth(stack.token(1))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("event: queue") && text.contains("sold_out"),
        "{text}"
    );

    // The dashboard's card shows the queue from the admission state.
    let (_, dash) = stack.call("GET", "/api/v1/dashboard", None, None).await;
    let cards = dash["sales"].as_array().unwrap();
    let card = cards.iter().find(|c| c["sku_id"] == sku).unwrap();
    assert_eq!(card["admission"], "queue", "{card}");
    let queue = &card["queue"];
    let counts = (queue["queue_length"].as_u64(), queue["bought"].as_u64());
    assert_eq!(counts, (Some(6), Some(2)), "{card}");
}

both_ledgers!(a_draw_sale_publishes_a_recomputable_draw);
async fn a_draw_sale_publishes_a_recomputable_draw(stack: &Stack) {
    let sku = 920;
    let now = now_ms();
    let draw_at = now + 2_000;
    stack
        .live_sale_with(json!({"sku_id": sku, "name": "draw", "total_stock": 3,
            "per_user_limit": 2, "mode": "reserve", "admission": "draw",
            "starts_at_ms": now, "draw_at_ms": draw_at}))
        .await;
    let path = format!("/api/v1/sales/{sku}/entries");
    for user in 1..=8u64 {
        let body = json!({"quantity": user % 2 + 1});
        let (s, b) = stack
            .call("POST", &path, Some(&stack.token(user)), Some(body))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let (s, b) = stack
        .call(
            "POST",
            &path,
            Some(&stack.token(1)),
            Some(json!({"quantity": 1})),
        )
        .await;
    assert_eq!(
        (s, b["quantity"].as_u64()),
        (StatusCode::OK, Some(2)),
        "one entry per user"
    );
    let (s, b) = stack
        .call(
            "POST",
            &path,
            Some(&stack.token(9)),
            Some(json!({"quantity": 3})),
        )
        .await;
    assert_eq!((s, code(&b)), (StatusCode::BAD_REQUEST, "INVALID_REQUEST"));
    let (s, b) = buy_with(stack, 1, sku, None).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "ADMISSION_REQUIRED"));
    let draw_path = format!("/api/v1/sales/{sku}/draw");
    let (_, before) = stack.call("GET", &draw_path, None, None).await;
    assert!(
        before["seed"].is_null() && before["winners"].is_null(),
        "{before}"
    );

    let deadline = Instant::now() + LIMIT;
    let drawn = loop {
        assert!(Instant::now() < deadline, "no draw");
        let (_, d) = stack.call("GET", &draw_path, None, None).await;
        if !d["seed"].is_null() {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(drawn["seed_sha256"], before["seed_sha256"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("draw.json");
    std::fs::write(&file, drawn.to_string()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/draw-verify.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    for w in drawn["winners"].as_array().unwrap() {
        let user = w["user_id"].as_u64().unwrap();
        let me = format!("/api/v1/sales/{sku}/entries/me");
        let (s, r) = stack.call("GET", &me, Some(&stack.token(user)), None).await;
        assert_eq!(
            (s, r["result"].as_str()),
            (StatusCode::OK, Some("won")),
            "{r}"
        );
        let (s, order) = stack.order(user, r["order_no"].as_str().unwrap()).await;
        assert_eq!(s, StatusCode::OK, "{order}");
    }
}

/// Polls every buyer's place and buys with each pass it is given, until each bought or heard
/// SOLD_OUT; answers the buyers who bought.
async fn settle(stack: &Stack, sku: u64, users: &[u64]) -> Vec<u64> {
    let deadline = Instant::now() + LIMIT;
    let (mut bought, mut sold_out) = (Vec::new(), Vec::new());
    while bought.len() + sold_out.len() < users.len() {
        assert!(Instant::now() < deadline, "bought {bought:?}");
        for &user in users {
            if bought.contains(&user) || sold_out.contains(&user) {
                continue;
            }
            let (_, me, _) = queue_me(stack, sku, user).await;
            match me["state"].as_str().unwrap() {
                "admitted" => {
                    let pass = me["pass"].as_str();
                    if buy_with(stack, user, sku, pass).await.0 == StatusCode::ACCEPTED {
                        bought.push(user);
                    }
                }
                "sold_out" => sold_out.push(user),
                _ => {}
            }
        }
        tokio::time::sleep(POLL).await;
    }
    bought
}

both_ledgers!(concurrent_joins_are_written_in_groups_that_metrics_count);
async fn concurrent_joins_are_written_in_groups_that_metrics_count(stack: &Stack) {
    const JOINS: &str = "flashsale_admission_join_group_joins";
    const SECONDS: &str = "flashsale_admission_join_group_seconds";
    let sku = 932;
    live_queue_sale(stack, sku, 3_600_000).await;
    // The joins, groups and timed writes so far, and the text they were read from.
    let read = || async {
        let text = stack.metrics_text().await;
        let value = |sample: &str| flashsale_testkit::prometheus::value(&text, sample);
        let [joins, groups, writes] = [
            format!("{JOINS}_sum"),
            format!("{JOINS}_count"),
            format!("{SECONDS}_count"),
        ]
        .map(|sample| value(&sample).unwrap_or(0.0));
        ((joins, groups, writes), text)
    };
    let (before, _) = read().await;
    let users = 1..=40u64;
    let path = format!("/api/v1/sales/{sku}/queue");
    let joins = users.clone().map(|user| {
        let path = path.clone();
        async move {
            let token = stack.token(user);
            stack.call("POST", &path, Some(&token), None).await
        }
    });
    for (s, b) in futures::future::join_all(joins).await {
        assert_eq!(
            (s, b["state"].as_str()),
            (StatusCode::OK, Some("pre_queue")),
            "{b}"
        );
    }
    let (after, text) = read().await;
    // Other tests of this process join queues too: the counts can only have grown by more.
    let joined = users.count() as f64;
    assert!(after.0 - before.0 >= joined, "joins {before:?} → {after:?}");
    assert!(after.1 - before.1 >= 1.0, "groups {before:?} → {after:?}");
    assert!(
        after.2 - before.2 >= 1.0,
        "writes timed {before:?} → {after:?}"
    );
    for name in [JOINS, SECONDS] {
        assert!(
            text.contains(&format!("# TYPE {name} histogram")),
            "{name}: {text}"
        );
    }
}

both_ledgers!(the_dashboard_history_shows_a_queue_sale_from_its_start);
async fn the_dashboard_history_shows_a_queue_sale_from_its_start(stack: &Stack) {
    let sku = 930;
    let starts = live_queue_sale(stack, sku, 1_500).await;
    let users = [1, 2, 3, 4, 5];
    for &user in &users {
        let path = format!("/api/v1/sales/{sku}/queue");
        let (s, b) = stack
            .call("POST", &path, Some(&stack.token(user)), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    assert_eq!(settle(stack, sku, &users).await.len(), 2);

    // Opened after the run (once the sampler read the run's last second): the series reach
    // back to before the start.
    let path = format!("/api/v1/admin/dashboard/history/{sku}");
    let deadline = Instant::now() + LIMIT;
    let accepted = |h: &Value| -> f64 {
        let col = h["answers"]["accepted"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        col.iter().filter_map(Value::as_f64).sum()
    };
    let h = loop {
        let (s, h) = stack.admin("GET", &path, None).await;
        assert_eq!(s, StatusCode::OK, "{h}");
        let sold = h["sold"].as_array().and_then(|v| v.last().cloned());
        if sold == Some(json!(2)) && accepted(&h) > 0.0 {
            break h;
        }
        assert!(Instant::now() < deadline, "{h}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let t = h["t"].as_array().unwrap();
    assert!(
        t[0].as_i64().unwrap() <= starts / 1000,
        "a point before the start: {h}"
    );
    assert_eq!(h["sold"][0], 0, "from the start: {h}");
    let queue = &h["queue"];
    let last = |col: &str| queue[col].as_array().unwrap().last().cloned().unwrap();
    assert_eq!(last("queue_length"), json!(5), "{h}");
    assert!(last("admitted").as_u64().unwrap() >= 2, "{h}");
    assert_eq!(
        queue["queue_length"].as_array().unwrap().len(),
        t.len(),
        "one value a point"
    );
    // The public series: stock and queue, no answers.
    let (s, public) = stack
        .call(
            "GET",
            &format!("/api/v1/dashboard/history/{sku}"),
            None,
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(public["t"][0], t[0]);
    assert!(public.get("answers").is_none(), "{public}");
}
