//! A bucketed sale's first load failing midway on the six-node cluster: one primary stops
//! taking writes (`CLIENT PAUSE … WRITE`, as a primary that stalls or times out) while the
//! service loads the buckets. The epoch is taken, some buckets are loaded, bucket 0 (loaded
//! last, the one that names the others) is not. An operator's forced warm recovers the sale,
//! and so does the reconciler's repair without one; the sale then sells exactly its stock.

use std::collections::HashSet;
use std::time::Duration;

use flashsale_core::{HotCopies, SkuId};
use flashsale_engine::reconcile::{ReconcileConfig, Trigger};
use flashsale_redis::{slot, CopyTag, Keys, RedisLedger};
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::redis_cluster::RedisCluster;
use reqwest::StatusCode;
use serde_json::json;

use crate::common::{self, Stack};

const SKU: u64 = 93;
const UNITS: u64 = 30;

/// Pauses writes on one node for `ms` (`None`: ends a pause).
async fn pause_writes(url: &str, ms: Option<u64>) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut cmd = redis::cmd("CLIENT");
    match ms {
        Some(ms) => cmd.arg("PAUSE").arg(ms).arg("WRITE"),
        None => cmd.arg("UNPAUSE"),
    };
    let _: () = cmd.query_async(&mut conn).await.unwrap();
}

/// Creates the sale on a fresh stack over `cluster` and makes its first warm fail midway
/// (bucket 2 loaded, bucket 1's primary paused for writes, bucket 0 never loaded): returns
/// the stack and the salts the sale was placed with.
async fn a_failed_first_load(cluster: &RedisCluster) -> (Stack, Vec<u32>) {
    let stack = Stack::on_redis(&cluster.urls(), TestDatabase::create().await, |cfg| {
        // The test recovers the sale, not a running reconciler.
        cfg.engine.reconcile.interval = Duration::ZERO;
    })
    .await;
    let body = json!({"sku_id": SKU, "name": "first load", "total_stock": UNITS,
        "per_user_limit": 1, "buckets": 3});
    let (status, created) = stack.create_sale(body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");

    // Where the service will put bucket 1: placement is a function of the slot map alone.
    let prefix = &stack.config.engine.ledger.redis_prefix;
    let probe = RedisLedger::connect(&cluster.urls(), prefix)
        .await
        .unwrap()
        .with_buckets();
    let sale = stack.store().sale(SkuId(SKU)).await.unwrap().unwrap().sale;
    let salts = probe.place_buckets(&sale).await.unwrap().expect("placed");
    let tag_slot = |bucket: u16| {
        slot(&Keys::default().sale(CopyTag::new(SkuId(SKU), bucket, salts[usize::from(bucket)])))
    };
    let stalled = cluster.primary_of_slot(tag_slot(1)).await;
    assert_ne!(stalled, cluster.primary_of_slot(tag_slot(0)).await);
    assert_ne!(stalled, cluster.primary_of_slot(tag_slot(2)).await);

    // Buckets load 2, 1, 0: bucket 2 loads, bucket 1's primary does not answer in time.
    let stalled_url = cluster.node(stalled).url();
    pause_writes(&stalled_url, Some(10_000)).await;
    let (status, body) = stack.sale_action(SKU, "warm").await;
    pause_writes(&stalled_url, None).await;
    assert!(status.is_server_error(), "the load failed: {status} {body}");
    let stored = stack.store().sale(SkuId(SKU)).await.unwrap().unwrap();
    assert_eq!(
        stored.epoch, 1,
        "the epoch was taken before the load failed"
    );
    let (status, body) = stack.buy(1, SKU, "a", json!(1)).await;
    assert_ne!(
        status,
        StatusCode::ACCEPTED,
        "no sale without bucket 0: {body}"
    );
    (stack, salts)
}

/// The recovered sale, placed where it was first placed, sells exactly its stock, each order
/// once, and reconciles.
async fn sells_exactly_its_stock(stack: &Stack, salts: &[u32]) {
    let kept = stack.store().bucket_salts(SkuId(SKU)).await.unwrap();
    assert_eq!(
        kept.as_deref(),
        Some(salts),
        "placed where it was first placed"
    );
    let mut sold = HashSet::new();
    for user in 1..=UNITS * 2 {
        let (status, body) = stack.buy(user, SKU, "a", json!(1)).await;
        match status.as_u16() {
            202 => assert!(sold.insert(common::order_no(&body)), "{body}"),
            409 => assert_eq!(common::code(&body), "SOLD_OUT", "{body}"),
            _ => panic!("user {user}: {status} {body}"),
        }
    }
    assert_eq!(
        sold.len() as u64,
        UNITS,
        "exactly the stock, each order once"
    );
    stack.drain(SKU).await;
    common::assert_invariants(stack.store().as_ref(), SKU).await;
    common::assert_sold_out_in_units_of_one(stack.database_url(), SKU, UNITS).await;
    let report = stack.repair(SKU).await;
    assert_eq!(report["ok"], true, "{report:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_load_that_fails_midway_is_recovered_by_a_forced_warm() {
    let cluster = RedisCluster::spawn(1_000).await;
    let (stack, salts) = a_failed_first_load(&cluster).await;
    let (status, body) = stack.sale_action(SKU, "warm?force=true").await;
    assert_eq!(status, StatusCode::OK, "a forced warm recovers it: {body}");
    sells_exactly_its_stock(&stack, &salts).await;
}

/// No operator: the reconciler's repair finds the buckets missing (0 and 1) or fenced since
/// the load (2; its stall time set to 0 here) and rebuilds each from its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_load_that_fails_midway_is_recovered_by_the_reconciler() {
    let cluster = RedisCluster::spawn(1_000).await;
    let (stack, salts) = a_failed_first_load(&cluster).await;
    let mut reconciler = stack.server.as_ref().unwrap().state.reconciler();
    reconciler.config = ReconcileConfig {
        rebuild_stall: Duration::ZERO,
        ..ReconcileConfig::default()
    };
    let report = reconciler.run_sale(SkuId(SKU), true, Trigger::Cli).await;
    let report = report.unwrap();
    assert!(!report.repairs.is_empty(), "{report:#?}");
    assert!(report.after.as_ref().unwrap().ok, "{report:#?}");
    sells_exactly_its_stock(&stack, &salts).await;
}
