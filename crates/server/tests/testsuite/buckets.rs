//! Stock buckets over HTTP: a sale's `buckets` is taken, validated, stored and shown; the
//! embedded ledger runs a bucketed sale as one book (no per-bucket counters to show) and sells
//! exactly its stock; the Redis ledger, which holds a sale on one shard, refuses more than one
//! bucket and stores nothing.

use std::collections::HashSet;

use futures::stream::{self, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{self, code, Stack};

fn sale_body(sku: u64, total: u64, buckets: Value) -> Value {
    json!({"sku_id": sku, "name": "bucketed", "total_stock": total, "per_user_limit": 1,
           "buckets": buckets})
}

both_ledgers!(bad_bucket_counts_are_refused_and_change_nothing);
/// Zero, too many, negative, fractional, text and null counts: each a 400 that names the
/// field, and no sale is created by any of them.
async fn bad_bucket_counts_are_refused_and_change_nothing(stack: &Stack) {
    let sku = 301;
    let bad = [
        json!(0),
        json!(65),
        json!(70_000),
        json!(-1),
        json!(1.5),
        json!("3"),
    ];
    for buckets in bad {
        let (status, body) = stack.create_sale(sale_body(sku, 10, buckets.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{buckets}: {body}");
        assert_eq!(code(&body), "INVALID_REQUEST", "{buckets}: {body}");
        let (status, _) = stack
            .call("GET", &format!("/api/v1/sales/{sku}"), None, None)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{buckets} created a sale");
    }
    let (status, body) = stack.create_sale(sale_body(sku, 10, Value::Null)).await;
    assert_eq!(status, StatusCode::CREATED, "null is the default: {body}");
    assert_eq!(body["buckets"], 1, "{body}");
}

on_systems!(the_redis_ledger_refuses_a_bucketed_sale_and_stores_nothing: redis_mysql);
async fn the_redis_ledger_refuses_a_bucketed_sale_and_stores_nothing(stack: &Stack) {
    let sku = 302;
    let (status, body) = stack.create_sale(sale_body(sku, 10, json!(2))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(code(&body), "INVALID_REQUEST", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("buckets") && message.contains("redis"),
        "{body}"
    );
    let stored = stack
        .store()
        .sale(flashsale_core::SkuId(sku))
        .await
        .unwrap();
    assert_eq!(stored, None, "nothing stored");
    let (status, body) = stack.create_sale(sale_body(sku, 10, json!(1))).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "one bucket is every sale: {body}"
    );
}

on_systems!(a_bucketed_sale_on_the_embedded_ledger_sells_exactly_its_stock: embedded);
/// Three buckets on the embedded ledger: shown by the API, stored by the database, and sold
/// as one book: a spike of five buyers a unit sells every unit once, one per buyer.
async fn a_bucketed_sale_on_the_embedded_ledger_sells_exactly_its_stock(stack: &Stack) {
    const SKU: u64 = 303;
    const UNITS: u64 = 300;
    const USERS: u64 = 1_500;
    stack.live_sale_with(sale_body(SKU, UNITS, json!(3))).await;
    let shown = stack.get_ok(&format!("/api/v1/sales/{SKU}")).await;
    assert_eq!(shown["buckets"], 3, "{shown}");
    let stored = stack
        .store()
        .sale(flashsale_core::SkuId(SKU))
        .await
        .unwrap();
    assert_eq!(stored.map(|s| s.sale.buckets), Some(3));

    let answers = stream::iter(1..=USERS)
        .map(|user| async move { (user, stack.buy(user, SKU, "a", json!(1)).await) })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let mut buyers = HashSet::new();
    for (user, (status, body)) in &answers {
        match status.as_u16() {
            202 => assert!(buyers.insert(*user), "{user} bought twice"),
            409 => assert_eq!(code(body), "SOLD_OUT", "{body}"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(buyers.len() as u64, UNITS, "every unit sold, one per buyer");
    common::assert_invariants(stack.store().as_ref(), SKU).await;
    common::assert_sold_out_in_units_of_one(stack.database_url(), SKU, UNITS).await;
}

/// The fields a bucketed sale's view has only when its buckets were read one by one.
const PER_BUCKET_FIELDS: [&str; 3] = ["bucket_counters", "in_flight_units", "bucket_source"];

fn assert_no_bucket_counters(view: &Value) {
    for field in PER_BUCKET_FIELDS {
        assert!(view.get(field).is_none(), "{field} shown: {view}");
    }
}

on_systems!(the_embedded_ledger_shows_the_count_and_no_bucket_counters: embedded);
/// The embedded ledger runs a bucketed sale as one book and the database has no bucket rows
/// for it: the sale's view shows its count and its summed counters only, scheduled and live,
/// and so does the dashboard's card. A bad or unknown sku is still refused.
async fn the_embedded_ledger_shows_the_count_and_no_bucket_counters(stack: &Stack) {
    const SKU: u64 = 304;
    let path = format!("/api/v1/sales/{SKU}");
    let (status, created) = stack.create_sale(sale_body(SKU, 30, json!(3))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_no_bucket_counters(&created);
    let scheduled = stack.get_ok(&path).await;
    assert_eq!(scheduled["buckets"], 3, "{scheduled}");
    assert_no_bucket_counters(&scheduled);

    let (status, warm) = stack
        .admin("POST", &format!("/api/v1/sales/{SKU}/warm"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{warm}");
    stack.buy_ok(1, SKU, "a", 1).await;
    stack.buy_ok(2, SKU, "a", 1).await;
    let live = stack.get_ok(&path).await;
    assert_eq!(live["buckets"], 3, "{live}");
    assert_eq!(
        (live["available"].as_u64(), live["sold"].as_u64()),
        (Some(28), Some(2)),
        "{live}"
    );
    assert_no_bucket_counters(&live);

    let public = stack.get_ok("/api/v1/dashboard").await;
    let card = public["sales"]
        .as_array()
        .and_then(|s| s.iter().find(|c| c["sku_id"] == json!(SKU)))
        .expect("the sale's card");
    assert_eq!(card["buckets"], 3, "{card}");
    assert_no_bucket_counters(card);

    for (bad, want) in [
        ("x", StatusCode::BAD_REQUEST),
        ("-1", StatusCode::BAD_REQUEST),
        ("305", StatusCode::NOT_FOUND),
    ] {
        let (status, body) = stack
            .call("GET", &format!("/api/v1/sales/{bad}"), None, None)
            .await;
        assert_eq!(status, want, "{bad}: {body}");
        assert!(!code(&body).is_empty(), "the API's error shape: {body}");
    }
}
