//! Redis Cluster: the key schema keeps a sale on one slot, and the whole conformance suite
//! runs through the cluster client on a one-node cluster that owns every slot; the salts of a
//! bucketed sale spread its buckets over the primaries of a six-node cluster.

use std::sync::Arc;
use std::time::Duration;

use flashsale_core::{Ledger, SkuId};
use flashsale_redis::{placement, slot, Keys, RedisLedger};
use flashsale_testkit::conformance;
use flashsale_testkit::redis_cluster::{self, RedisCluster};
use flashsale_testkit::redis_server::RedisServer;
use flashsale_testkit::wait;

async fn one_node_cluster() -> RedisServer {
    let server = redis_cluster::spawn_node(2_000).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg(&["ADDSLOTSRANGE", "0", "16383"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let urls = [server.url()];
    let ok = || redis_cluster::all_say_ok(&urls);
    wait::until("the cluster to be ok", Duration::from_secs(10), ok).await;
    server
}

/// The slot the cluster itself gives `key` (`CLUSTER KEYSLOT`).
async fn keyslot(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_on_a_cluster() {
    let server = one_node_cluster().await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys = Keys::default();
    for sku in [1u64, 42, 123_456_789] {
        for key in keys.all_of_sale(SkuId(sku)) {
            assert_eq!(slot(&key), keyslot(&mut conn, &key).await, "{key}");
        }
    }
    // Two URLs name a cluster (here the same node twice).
    let urls = format!("{},{}", server.url(), server.url());
    let ledger = RedisLedger::connect(&urls, "fs").await.unwrap();
    assert!(ledger.is_cluster());
    let ledger: Arc<dyn Ledger> = Arc::new(ledger);
    conformance::run_all(ledger).await;
}

/// The shard (0, 1, 2 in slot order) that serves a sku's keys.
fn shard_of(shards: &[(u16, u16)], sku: SkuId) -> usize {
    let s = slot(&Keys::default().sale(sku));
    shards
        .iter()
        .position(|&(a, b)| a <= s && s <= b)
        .expect("every slot is served")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_on_every_shard_of_a_six_node_cluster() {
    let cluster = RedisCluster::spawn(2_000).await;
    let shards = cluster.shards().await;
    assert_eq!(shards.len(), 3, "three primaries, one slot range each");
    let ledger = RedisLedger::connect(&cluster.urls(), "fs").await.unwrap();
    assert!(ledger.is_cluster());
    let ledger: Arc<dyn Ledger> = Arc::new(ledger);
    conformance::run_all_spread(ledger, 3, move |sku| shard_of(&shards, sku)).await;
}

/// One seed URL of a cluster is the cluster: sales on every primary sell through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_seed_url_runs_the_whole_cluster() {
    let cluster = RedisCluster::spawn(2_000).await;
    let shards = cluster.shards().await;
    let seed = cluster.urls().split(',').next().unwrap().to_owned();
    let ledger = RedisLedger::connect(&seed, "fs").await.unwrap();
    assert!(ledger.is_cluster(), "{seed} is a node of a cluster");
    let mut served = std::collections::HashSet::new();
    while served.len() < shards.len() {
        let sale = conformance::live_sale(flashsale_core::SaleMode::Direct, 5, 1);
        if !served.insert(shard_of(&shards, sale.sku_id)) {
            continue;
        }
        let sku = conformance::warm(&ledger, &sale).await;
        conformance::buy_ok(&ledger, sku, 1, "a", 1).await;
    }
}

/// The salts `placement::place` picks for a sale's buckets land its buckets on distinct primaries of a
/// real six-node cluster, asked slot by slot of the cluster itself (`CLUSTER KEYSLOT`): three
/// buckets on three primaries, six buckets two on each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_salts_put_a_sales_buckets_on_distinct_primaries() {
    let cluster = RedisCluster::spawn(2_000).await;
    let shards = cluster.shards().await;
    let client = redis::Client::open(cluster.node(0).url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let shard_of_slot = |s: u16| {
        shards
            .iter()
            .position(|&(a, b)| a <= s && s <= b)
            .expect("every slot is served")
    };
    for sku in (1..=20).map(SkuId) {
        for n in [3u16, 6] {
            let primary_of = |tag: &str| shard_of_slot(slot(&format!("fs:{{{tag}}}:sale")));
            let salts = placement::place(sku, n, shards.len(), primary_of);
            let mut buckets_on = [0; 3];
            for (bucket, salt) in (0..n).zip(salts) {
                let key = format!("fs:{{{}}}:sale", placement::bucket_tag(sku, bucket, salt));
                buckets_on[shard_of_slot(keyslot(&mut conn, &key).await)] += 1;
            }
            let each = usize::from(n) / 3;
            assert_eq!(buckets_on, [each; 3], "sale {sku}, {n} buckets");
        }
    }
}

/// With buckets on, the whole suite and its bucketed checks pass on a six-node cluster, and a
/// warmed sale of three buckets has its copies on the three primaries (asked of the cluster
/// with `CLUSTER KEYSLOT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucketed_sales_pass_the_suite_on_a_six_node_cluster() {
    let cluster = RedisCluster::spawn(2_000).await;
    let shards = cluster.shards().await;
    let ledger = RedisLedger::connect(&cluster.urls(), "fs").await.unwrap();
    let ledger = Arc::new(ledger.with_buckets());
    let sale =
        flashsale_testkit::bucketed::bucketed_sale(flashsale_core::SaleMode::Direct, 9, 1, 3);
    let sku = conformance::warm(ledger.as_ref(), &sale).await;
    let view = ledger.bucket_view(sku).await.unwrap().expect("warm");
    let client = redis::Client::open(cluster.node(0).url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut primaries = std::collections::HashSet::new();
    for bucket in &view.buckets {
        let key = format!("fs:{{{}}}:sale", bucket.tag);
        let s = keyslot(&mut conn, &key).await;
        primaries.insert(shards.iter().position(|&(a, b)| a <= s && s <= b));
        assert_eq!(bucket.counters.total, 3, "an even split");
    }
    assert_eq!(primaries.len(), 3, "{view:?}");
    assert_eq!((view.total_units(), view.in_flight_units), (9, 0));
    let ledger: Arc<dyn Ledger> = ledger;
    conformance::run_all_spread(ledger, 3, move |sku| shard_of(&shards, sku)).await;
}
