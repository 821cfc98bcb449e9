//! The namespace plumbing: a namespaced cluster forms, a partition cuts exactly one pair of
//! addresses and heals, and dropping the `Net` leaves no namespace or link behind.

use std::process::Command;
use std::time::Duration;

use flashsale_testkit::netns::Net;
use flashsale_testkit::redis_cluster_ns::NsRedisCluster;

/// Held by each test here that makes a `Net`: both run in one process, so one's `Net` would
/// be the "namespace left" the other looks for when it checks that its own are gone.
static ONE_NET_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn listing(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn pings(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let connected = tokio::time::timeout(
        Duration::from_millis(500),
        client.get_multiplexed_async_connection(),
    )
    .await;
    let Ok(Ok(mut conn)) = connected else {
        return false;
    };
    let ping = redis::cmd("PING");
    let pong = ping.query_async::<String>(&mut conn);
    matches!(
        tokio::time::timeout(Duration::from_millis(500), pong).await,
        Ok(Ok(_))
    )
}

#[tokio::test]
async fn a_namespaced_cluster_forms_partitions_heal_and_nothing_is_left() {
    let _alone = ONE_NET_AT_A_TIME.lock().await;
    let tag;
    {
        let mut net = Net::new();
        tag = net.hosts().len();
        let cluster = NsRedisCluster::spawn(&mut net, 1_000, Some(5)).await;
        assert_eq!(cluster.replica_of(0).await, Some(3));
        assert_eq!(cluster.replica_of(2).await, None, "node 5 attaches late");
        cluster.attach_replica(5, 2).await;
        assert_eq!(cluster.replica_of(2).await, Some(5));
        let (root, node) = (net.root_addr(), cluster.addr(1));
        assert!(pings(&cluster.url(1)).await);
        net.partition(root, node);
        assert!(!pings(&cluster.url(1)).await, "cut from the root");
        assert!(pings(&cluster.url(2)).await, "only that pair is cut");
        net.heal(root, node);
        assert!(pings(&cluster.url(1)).await, "healed");
        net.partition(root, node);
        drop(cluster);
    }
    assert_eq!(tag, 0);
    let me = format!("fsnet-{}-", std::process::id());
    assert!(
        !listing(&["netns", "list"]).contains(&me),
        "a namespace left"
    );
    let link = format!("fsnet{:x}x", std::process::id());
    assert!(!listing(&["link", "show"]).contains(&link), "a link left");
    assert!(!listing(&["route", "show", "type", "blackhole"]).contains("198.1"));
}

#[test]
fn a_new_net_removes_what_a_dead_run_left() {
    let _alone = ONE_NET_AT_A_TIME.blocking_lock();
    // A pid above any the kernel hands out (pid_max is at most 2^22): its run is gone.
    let dead = (1u32 << 22) + 7;
    let ns = format!("fsnet-{dead}-0-r0");
    let made = Command::new("ip").args(["netns", "add", &ns]).status();
    assert!(made.expect("run ip").success());
    drop(Net::new());
    assert!(!listing(&["netns", "list"]).contains(&ns), "{ns} left");
}
