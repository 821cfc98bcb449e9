//! A bucketed sale on the six-node cluster loses the primary of one of its buckets (SIGKILL)
//! mid-spike, while every buyer is homed at another bucket and transfers keep bringing stock
//! there. With writes confirmed by a replica: every acknowledged purchase is still there
//! after the failover, no order number is handed out twice, no unit is created (the buckets
//! and the units in flight hold at most the sale's stock), the promoted copy of the lost
//! bucket fences itself (its buyers hear UNAVAILABLE, not SOLD_OUT), and the other buckets
//! keep selling.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashsale_core::buckets::home_bucket;
use flashsale_core::{ErrorCode, HotLedger, OrderNo, PurchaseOutcome, SaleMode, UserId};
use flashsale_redis::{slot, RedisLedger, Replication};
use flashsale_testkit::bucketed::bucketed_sale;
use flashsale_testkit::conformance::{buy, req, warm};
use flashsale_testkit::redis_cluster::RedisCluster;
use flashsale_testkit::wait;

/// `count` buyers (from a random base) homed at `bucket` of three.
fn homed_at(bucket: u16, count: usize) -> Vec<u64> {
    let base = rand::random_range(1..=1u64 << 40);
    (base..)
        .filter(|&u| home_bucket(UserId(u), 3) == bucket)
        .take(count)
        .collect()
}

/// Acknowledged orders, and how many answers came back at all.
#[derive(Default)]
struct Tally {
    acknowledged: Mutex<Vec<OrderNo>>,
    answered: AtomicU64,
}

/// Buys one unit for each of `users`, in batches of 8, four at a time; a batch that fails
/// (the lost primary, a write not confirmed) is not acknowledged.
async fn spike(
    ledger: Arc<RedisLedger>,
    sku: flashsale_core::SkuId,
    users: Vec<u64>,
    tally: Arc<Tally>,
) {
    let batches: Vec<Vec<u64>> = users.chunks(8).map(<[u64]>::to_vec).collect();
    let batches = Arc::new(Mutex::new(batches));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (ledger, batches, tally) = (ledger.clone(), batches.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(batch) = batches.lock().unwrap().pop() else {
                    return;
                };
                let reqs: Vec<_> = batch.iter().map(|&u| req(sku, u, "a", 1)).collect();
                let Ok(out) = ledger.purchase_batch(sku, &reqs).await else {
                    continue;
                };
                tally
                    .answered
                    .fetch_add(out.len() as u64, Ordering::Relaxed);
                let mut acked = tally.acknowledged.lock().unwrap();
                for o in out {
                    if let PurchaseOutcome::Accepted { order, .. } = o {
                        acked.push(order.order_no);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("spike task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_buckets_primary_mid_transfer_loses_no_confirmed_unit() {
    let mut cluster = RedisCluster::spawn(2_000).await;
    cluster.settle().await;
    let replication = Replication {
        replicas: 1,
        timeout: Duration::from_millis(500),
    };
    let ledger = RedisLedger::connect(&cluster.urls(), "fs").await.unwrap();
    let ledger = Arc::new(ledger.with_buckets().with_replication(replication).unwrap());
    let sale = bucketed_sale(SaleMode::Direct, 9_000, 1, 3);
    let sku = warm(ledger.as_ref(), &sale).await;
    let layout = ledger.layout(sku).await.unwrap();
    let lost = cluster
        .primary_of_slot(slot(&format!("{{{}}}", layout.copy(1))))
        .await;
    let promoted = cluster.replica_of(lost).await;

    // Every buyer homed at bucket 0: past its 3,000 units, stock comes from buckets 1 and 2.
    let users = homed_at(0, 8_000);
    let (first, later) = users.split_at(6_400);
    let tally = Arc::new(Tally::default());
    let running = tokio::spawn(spike(ledger.clone(), sku, first.to_vec(), tally.clone()));
    wait::until(
        "bucket 0's own stock to be sold",
        Duration::from_secs(60),
        || {
            let tally = tally.clone();
            async move { (tally.answered.load(Ordering::Relaxed) >= 3_300).then_some(()) }
        },
    )
    .await;
    cluster.kill(lost);
    running.await.expect("spike");
    cluster.wait_promoted(promoted).await;
    cluster.wait_ok().await;
    let before_kill = tally.acknowledged.lock().unwrap().len();

    // The others keep selling: bucket 2's stock comes to bucket 0's buyers.
    spike(ledger.clone(), sku, later.to_vec(), tally.clone()).await;
    let acknowledged = tally.acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > before_kill,
        "nothing sold after the failover"
    );
    check_after(&ledger, sku, &acknowledged).await;

    // The promoted copy of bucket 1 fences itself: its buyers are told to retry.
    let answer = buy(ledger.as_ref(), sku, homed_at(1, 1)[0], "z", 1).await;
    assert_eq!(answer.code(), Some(ErrorCode::Unavailable), "{answer:?}");
}

/// Every acknowledged order is there, each number once; no unit created.
async fn check_after(ledger: &RedisLedger, sku: flashsale_core::SkuId, acknowledged: &[OrderNo]) {
    let distinct: HashSet<&OrderNo> = acknowledged.iter().collect();
    assert_eq!(
        distinct.len(),
        acknowledged.len(),
        "I8: an order number twice"
    );
    for no in acknowledged {
        let order = ledger.order(no).await.expect("order read");
        assert!(
            order.is_some(),
            "acknowledged order {no} lost in the failover"
        );
    }
    let view = ledger.bucket_view(sku).await.unwrap().expect("warm");
    for b in &view.buckets {
        assert!(
            b.counters.conserved(),
            "I2 in bucket {}: {:?}",
            b.bucket,
            b.counters
        );
    }
    let sold: u64 = view.buckets.iter().map(|b| b.counters.sold).sum();
    assert!(view.total_units() <= 9_000, "units created: {view:?}");
    assert!(
        sold >= acknowledged.len() as u64,
        "sold {sold} < acknowledged"
    );
    assert!(sold <= 9_000, "I1");
}
