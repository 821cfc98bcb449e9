//! Stock buckets over HTTP: a sale's `buckets` is taken, validated, stored and shown; the
//! embedded ledger runs a bucketed sale as one book (no per-bucket counters to show), the
//! Redis ledger as a copy per bucket with a stream, a persister task and a database row
//! each (its counters shown per bucket); both sell exactly the stock.

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

all_systems!(a_bucketed_sale_sells_exactly_its_stock_to_any_spread_of_buyers);
/// Three buckets, a spike of five buyers a unit: spread over every bucket, then all homed on
/// one (every unit elsewhere must travel to them). Each sells every unit once, one per
/// buyer, with no false sold-out; a retried request gets its first answer; the database
/// (per bucket on Redis, as one book embedded) holds I1–I7, and the reconciler finds no
/// diff in any bucket.
async fn a_bucketed_sale_sells_exactly_its_stock_to_any_spread_of_buyers(stack: &Stack) {
    const UNITS: u64 = 150;
    let spread: Vec<u64> = (1..=UNITS * 5).collect();
    let one_home: Vec<u64> = (1..)
        .filter(|u| flashsale_core::buckets::home_bucket(flashsale_core::UserId(*u), 3) == 1)
        .take(UNITS as usize * 5)
        .collect();
    for (sku, users) in [(304, spread), (305, one_home)] {
        stack.live_sale_with(sale_body(sku, UNITS, json!(3))).await;
        let buyers = spike(stack, sku, &users).await;
        assert_eq!(
            buyers.len() as u64,
            UNITS,
            "sale {sku}: every unit sold, one per buyer"
        );
        for user in buyers.iter().take(5) {
            let (status, body) = stack.buy(*user, sku, "a", json!(1)).await;
            assert_eq!(
                status.as_u16(),
                202,
                "a replay answers its first outcome: {body}"
            );
        }
        stack.drain(sku).await;
        common::assert_invariants(stack.store().as_ref(), sku).await;
        common::assert_sold_out_in_units_of_one(stack.database_url(), sku, UNITS).await;
        let report = stack.repair(sku).await;
        assert_eq!(report["ok"], true, "sale {sku} reconciles: {report:#}");
        let shown = stack.get_ok(&format!("/api/v1/sales/{sku}")).await;
        assert_eq!(shown["buckets"], 3, "{shown}");
    }
}

/// Every user of `users` buys one unit of `sku`, 64 at a time; the users answered 202, each
/// once (every other answer must be SOLD_OUT).
async fn spike(stack: &Stack, sku: u64, users: &[u64]) -> HashSet<u64> {
    let answers = stream::iter(users.iter().copied())
        .map(|user| async move { (user, stack.buy(user, sku, "a", json!(1)).await) })
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
    buyers
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

/// A bucketed sale whose Redis restarts empty mid-sale: every bucket's copy is gone. Buyers
/// hear 503 until the repair rebuilds each bucket from its own row (epoch, counters,
/// transfers, orders); then replays get their first answer, a forced warm rebuilds every
/// bucket once more, and the sale sells exactly the rest of its stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucketed_sale_whose_redis_restarts_empty_is_rebuilt_bucket_by_bucket() {
    const SKU: u64 = 306;
    const UNITS: u64 = 90;
    let mut redis = flashsale_testkit::redis_server::RedisServer::spawn().await;
    let db = flashsale_testkit::mariadb::TestDatabase::create().await;
    let stack = Stack::on_redis(&redis.url(), db, |cfg| {
        cfg.engine.reconcile.interval = std::time::Duration::ZERO;
    })
    .await;
    stack.live_sale_with(sale_body(SKU, UNITS, json!(3))).await;
    let first: Vec<u64> = (1..=UNITS / 2).collect();
    assert_eq!(spike(&stack, SKU, &first).await.len() as u64, UNITS / 2);
    stack.drain(SKU).await;
    let salts = stack
        .store()
        .bucket_salts(flashsale_core::SkuId(SKU))
        .await
        .unwrap();
    assert_eq!(
        salts.map(|s| (s.len(), s[0])),
        Some((3, 0)),
        "placement kept in the database"
    );

    redis.kill();
    redis.start().await;
    let (status, body) = stack.buy(1_000, SKU, "a", json!(1)).await;
    assert_eq!(status.as_u16(), 503, "no copy, no sale: {body}");
    let st = &stack;
    let report = flashsale_testkit::wait::until(
        "a repair once Redis is back",
        std::time::Duration::from_secs(20),
        || async move {
            let path = format!("/api/v1/admin/reconcile/{SKU}/repair");
            let (s, report) = st.admin("POST", &path, None).await;
            (s == StatusCode::OK).then_some(report)
        },
    )
    .await;
    let repairs = report["repairs"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        repairs.len(),
        3,
        "each bucket rebuilt by itself: {report:#}"
    );
    assert_eq!(report["lost_orders"], json!([]), "{report:#}");

    for user in first.iter().take(5) {
        let (status, body) = stack.buy(*user, SKU, "a", json!(1)).await;
        assert_eq!(status.as_u16(), 202, "a replay after the rebuild: {body}");
    }
    // A forced warm rebuilds every bucket again, each in its next epoch.
    let epochs =
        |rows: Vec<flashsale_core::BucketRow>| rows.iter().map(|r| r.epoch).collect::<Vec<_>>();
    let before = epochs(
        stack
            .store()
            .buckets(flashsale_core::SkuId(SKU))
            .await
            .unwrap(),
    );
    let (status, body) = stack.sale_action(SKU, "warm?force=true").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let after = epochs(
        stack
            .store()
            .buckets(flashsale_core::SkuId(SKU))
            .await
            .unwrap(),
    );
    let moved: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(
        moved,
        [3, 3, 3],
        "each bucket's next epoch: {before:?} → {after:?}"
    );
    let (status, body) = stack.buy(first[0], SKU, "a", json!(1)).await;
    assert_eq!(
        status.as_u16(),
        202,
        "a replay after the forced warm: {body}"
    );
    let rest: Vec<u64> = (UNITS / 2 + 1..=UNITS * 4).collect();
    assert_eq!(
        spike(&stack, SKU, &rest).await.len() as u64,
        UNITS - UNITS / 2
    );
    stack.drain(SKU).await;
    common::assert_invariants(stack.store().as_ref(), SKU).await;
    common::assert_sold_out_in_units_of_one(stack.database_url(), SKU, UNITS).await;
    let report = stack.repair(SKU).await;
    assert_eq!(report["ok"], true, "{report:#}");
}
