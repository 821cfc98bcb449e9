//! The dashboard's JSON on both ledgers: the public view shows sales and stock only; the admin
//! view counts this instance's answers per sale and second, and on Redis also shows the
//! stream lag and the Lua scripts' latency. The page itself and the API docs are served.

use std::time::{Duration, Instant};

use crate::common::Stack;
use reqwest::StatusCode;
use serde_json::{json, Value};

const SKU: u64 = 77;
const UNITS: u64 = 20;
const BUYERS: u64 = 30;

fn sale(view: &Value, sku: u64) -> &Value {
    let sales = view["sales"].as_array().expect("sales");
    sales
        .iter()
        .find(|s| s["sku_id"] == json!(sku))
        .expect("the sale is listed")
}

fn sum(v: &Value) -> u64 {
    v.as_array().unwrap().iter().filter_map(Value::as_u64).sum()
}

/// The admin view once `done` holds for it (answers land in the second they were given and
/// show once that second is over), or the last one read after the deadline.
async fn admin_view(stack: &Stack, done: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, view) = stack.admin("GET", "/api/v1/admin/dashboard", None).await;
        assert_eq!(s, StatusCode::OK, "{view}");
        if done(&view) || Instant::now() >= until {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn dashboard_counts_a_small_sale(stack: &Stack) {
    stack.live_sale(SKU, UNITS, 1).await;
    for user in 1..=BUYERS {
        stack.buy(user, SKU, &format!("r{user}"), json!(1)).await;
    }

    let public = stack.get_ok("/api/v1/dashboard").await;
    let card = sale(&public, SKU);
    assert_eq!(card["sold"], json!(UNITS), "{card}");
    assert_eq!(card["total"], json!(UNITS));
    assert!(
        card.get("answers").is_none(),
        "no admin field in public: {card}"
    );

    let user = stack.token(1);
    let (s, _) = stack
        .call("GET", "/api/v1/admin/dashboard", Some(&user), None)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "a user token is not the admin's");

    let all_counted = |v: &Value| {
        let a = &sale(v, SKU)["answers"];
        sum(&a["accepted"]) + sum(&a["sold_out"]) + sum(&a["rejected"]) == BUYERS
    };
    let view = admin_view(stack, all_counted).await;
    let ops = sale(&view, SKU);
    let answers = &ops["answers"];
    assert_eq!(sum(&answers["accepted"]), UNITS, "{answers}");
    assert_eq!(sum(&answers["sold_out"]), BUYERS - UNITS, "{answers}");
    assert!(answers["p99_ms"]
        .as_array()
        .unwrap()
        .iter()
        .any(Value::is_f64));
    assert_eq!(ops["backpressure"], json!(false));
    assert_eq!(view["breaker_open"], json!(false));
    assert_eq!(
        view["risk_breaker_open"],
        Value::Null,
        "no risk service here"
    );
    if view["ledger"] == "redis" {
        let lag_or_scripts = |v: &Value| {
            sale(v, SKU)["stream_lag_events"].is_number()
                && v["scripts"].as_array().is_some_and(|s| !s.is_empty())
        };
        let view = admin_view(stack, lag_or_scripts).await;
        assert!(
            lag_or_scripts(&view),
            "Redis shows stream lag and scripts: {view}"
        );
    }
}

both_ledgers!(dashboard_counts_a_small_sale);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_docs_are_served() {
    let stack = Stack::embedded_with(|_| {}).await;
    let resp = stack.raw_get("/").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(resp.text().await.unwrap().contains("/api/v1/dashboard"));
    let resp = stack.raw_get("/docs/").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp
        .text()
        .await
        .unwrap()
        .to_lowercase()
        .contains("swagger"));
}
