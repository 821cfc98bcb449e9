//! A throwaway Redis Cluster: six `redis-server` processes (three primaries, one replica
//! each) on free ports in temp dirs, made with `redis-cli --cluster create`. Killing and
//! restarting a node and a planned `CLUSTER FAILOVER` are test operations.
//!
//! Every node runs with `cluster-require-full-coverage no` (a shard that is down does not stop
//! the others, as production should run) and `cluster-replica-validity-factor 0` (a replica
//! that has seen no writes for a while may still be promoted: Redis 7.0 otherwise refuses).

use std::process::Command;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::redis_server::RedisServer;
use crate::wait;

/// How long the cluster may take to form, or to settle after a failover.
const SETTLE_MAX: Duration = Duration::from_secs(30);

/// One line of `CLUSTER NODES`, the parts a test needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: String,
    /// The address the node announces (`127.0.0.1` here; its namespace's in a
    /// [`crate::redis_cluster_ns::NsRedisCluster`]).
    pub ip: String,
    pub port: u16,
    pub primary: bool,
    pub failed: bool,
    /// The primary's id, for a replica.
    pub primary_id: Option<String>,
    /// Slot ranges served, for a primary.
    pub slots: Vec<(u16, u16)>,
}

/// Six nodes: three primaries with one replica each.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    pub node_timeout_ms: u64,
}

impl RedisCluster {
    /// Starts six nodes and forms the cluster; returns when every slot is served and every
    /// primary has a replica in sync. `node_timeout_ms` is `cluster-node-timeout` (how long a
    /// node must be unreachable before it is failed over).
    pub async fn spawn(node_timeout_ms: u64) -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            nodes.push(spawn_node(node_timeout_ms).await);
        }
        let cluster = RedisCluster {
            nodes,
            node_timeout_ms,
        };
        cluster.create();
        cluster.settle().await;
        cluster
    }

    fn create(&self) {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create (is redis-tools installed?)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The seed list a client is given: every node, comma-separated.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        urls.join(",")
    }

    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The index of the node on `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// SIGKILL of node `i`: what it had not replicated is gone.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again (same port, dir and nodes.conf: it rejoins the cluster).
    pub async fn restart(&mut self, i: usize) {
        self.nodes[i].start().await;
    }

    /// `CLUSTER NODES` as seen from a live node.
    pub async fn topology(&self) -> Vec<NodeInfo> {
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let Some(mut conn) = connect(&node.url()).await else {
                continue;
            };
            let text: Result<String, _> = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut conn)
                .await;
            if let Ok(text) = text {
                return text.lines().filter_map(parse_node_line).collect();
            }
        }
        panic!("no live node answers CLUSTER NODES")
    }

    /// The index of the primary serving `slot` now.
    pub async fn primary_of_slot(&self, slot: u16) -> usize {
        let topology = self.topology().await;
        let node = topology
            .iter()
            .find(|n| {
                n.primary && !n.failed && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .unwrap_or_else(|| panic!("no primary serves slot {slot}: {topology:?}"));
        self.index_of(node.port)
    }

    /// The index of a live replica of primary `i`.
    pub async fn replica_of(&self, i: usize) -> usize {
        let topology = self.topology().await;
        let port = self.nodes[i].port;
        let id = &topology
            .iter()
            .find(|n| n.port == port)
            .expect("the primary is in the topology")
            .id;
        let replica = topology
            .iter()
            .find(|n| !n.failed && n.primary_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("primary on {port} has no replica: {topology:?}"));
        self.index_of(replica.port)
    }

    /// The slot ranges of the three primaries, in slot order (shard 0 serves slot 0).
    pub async fn shards(&self) -> Vec<(u16, u16)> {
        let mut ranges: Vec<(u16, u16)> = self
            .topology()
            .await
            .into_iter()
            .filter(|n| n.primary && !n.failed)
            .flat_map(|n| n.slots)
            .collect();
        ranges.sort();
        ranges
    }

    /// A planned failover: replica `i` takes over from its primary (`CLUSTER FAILOVER`),
    /// returns once it is primary and the cluster is ok again.
    pub async fn failover(&self, i: usize) {
        let mut conn = connect(&self.nodes[i].url())
            .await
            .expect("connect to the replica");
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query_async(&mut conn)
            .await
            .expect("CLUSTER FAILOVER");
        self.wait_promoted(i).await;
        self.wait_ok().await;
    }

    /// Waits until node `i` is a primary (a replica promoted by a failover).
    pub async fn wait_promoted(&self, i: usize) {
        let port = self.nodes[i].port;
        wait::until("the replica to be promoted", SETTLE_MAX, || async move {
            let me = self.topology().await.into_iter().find(|n| n.port == port)?;
            (me.primary && !me.failed).then_some(())
        })
        .await;
    }

    /// Cuts replica `i`'s link to its primary and keeps it cut: the replica is given a
    /// password the primary does not have (its resync fails) and its link is killed. From
    /// then on the primary acknowledges writes the replica lacks.
    pub async fn cut_replication(&self, i: usize) {
        let mut conn = connect(&self.nodes[i].url())
            .await
            .expect("connect to the replica");
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "masterauth", "not-the-primary-password"])
            .query_async(&mut conn)
            .await
            .expect("CONFIG SET masterauth");
        let _: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "master"])
            .query_async(&mut conn)
            .await
            .expect("CLIENT KILL TYPE master");
    }

    /// Waits until replica `i` has everything its primary `p` wrote so far.
    pub async fn wait_replicated(&self, p: usize, i: usize) {
        let offset = |url: String| async move {
            let info = info(&url, "replication").await?;
            info.lines()
                .find_map(|l| l.strip_prefix("master_repl_offset:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let (primary, replica) = (self.nodes[p].url(), self.nodes[i].url());
        wait::until("the replica to catch up", SETTLE_MAX, || {
            let (primary, replica) = (primary.clone(), replica.clone());
            async move {
                let (a, b) = (offset(primary).await?, offset(replica).await?);
                (b >= a).then_some(())
            }
        })
        .await;
    }

    /// Waits until every live node says `cluster_state:ok`.
    pub async fn wait_ok(&self) {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|n| n.url())
            .collect();
        wait::until("every node to say cluster_state:ok", SETTLE_MAX, || {
            all_say_ok(&urls)
        })
        .await;
    }

    /// Waits for a formed cluster: all slots served, three primaries, each with a replica whose
    /// link to it is up.
    pub async fn settle(&self) {
        self.wait_ok().await;
        wait::until("a replica in sync on every primary", SETTLE_MAX, || async {
            let topology = self.topology().await;
            let primaries: Vec<&NodeInfo> = topology
                .iter()
                .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
                .collect();
            if primaries.len() != 3 {
                return None;
            }
            for p in primaries {
                let replica = topology
                    .iter()
                    .find(|n| !n.failed && n.primary_id.as_deref() == Some(&p.id))?;
                let url = format!("redis://127.0.0.1:{}", replica.port);
                if !link_up(&url).await {
                    return None;
                }
            }
            Some(())
        })
        .await;
    }
}

/// One cluster-enabled `redis-server` of no cluster yet (see the module doc for its settings).
/// A one-node cluster is this plus `CLUSTER ADDSLOTSRANGE 0 16383`.
pub async fn spawn_node(node_timeout_ms: u64) -> RedisServer {
    // The bus port is port + 10000 unless set: past 55535 that is no port at all.
    let bus_port = crate::free_port().to_string();
    let timeout = node_timeout_ms.to_string();
    RedisServer::spawn_with(&node_args(&bus_port, &timeout)).await
}

/// The settings of every test cluster node (see the module doc), its bus on `bus_port`.
pub(crate) fn node_args<'a>(bus_port: &'a str, node_timeout_ms: &'a str) -> Vec<&'a str> {
    vec![
        "--cluster-port",
        bus_port,
        "--save",
        "",
        "--appendonly",
        "no",
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        node_timeout_ms,
        "--cluster-require-full-coverage",
        "no",
        "--cluster-replica-validity-factor",
        "0",
    ]
}

/// `INFO <section>` of the node at `url`, `None` when it does not answer.
pub(crate) async fn info(url: &str, section: &str) -> Option<String> {
    let mut conn = connect(url).await?;
    let cmd = if section == "cluster" {
        redis::cmd("CLUSTER").arg("INFO").clone()
    } else {
        redis::cmd("INFO").arg(section).clone()
    };
    cmd.query_async(&mut conn).await.ok()
}

/// `Some` when every node at `urls` answers `cluster_state:ok`.
pub async fn all_say_ok(urls: &[String]) -> Option<()> {
    for url in urls {
        info(url, "cluster")
            .await
            .filter(|i| i.contains("cluster_state:ok"))?;
    }
    Some(())
}

/// Whether the replica at `url` says `master_link_status:up`.
pub async fn link_up(url: &str) -> bool {
    info(url, "replication")
        .await
        .is_some_and(|i| i.contains("master_link_status:up"))
}

pub(crate) async fn connect(url: &str) -> Option<MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    tokio::time::timeout(
        Duration::from_secs(1),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()
}

/// `<id> <ip:port@cport[,hostname]> <flags> <primary> <ping> <pong> <epoch> <link> <slot>...`
pub(crate) fn parse_node_line(line: &str) -> Option<NodeInfo> {
    let parts: Vec<&str> = line.split_whitespace().collect();
    if parts.len() < 8 {
        return None;
    }
    let addr = parts[1].split('@').next()?;
    let (ip, port) = addr.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let flags: Vec<&str> = parts[2].split(',').collect();
    let slots = parts[8..]
        .iter()
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|n| (n, n)),
        })
        .collect();
    Some(NodeInfo {
        id: parts[0].to_owned(),
        ip: ip.to_owned(),
        port,
        primary: flags.contains(&"master"),
        failed: flags.contains(&"fail") || flags.contains(&"fail?"),
        primary_id: (parts[3] != "-").then(|| parts[3].to_owned()),
        slots,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_line_is_parsed() {
        let line =
            "07c3 127.0.0.1:30004@40004 myself,master - 0 1426238318243 3 connected 10923-16383 5";
        let n = parse_node_line(line).unwrap();
        assert_eq!(n.port, 30004);
        assert!(n.primary && !n.failed);
        assert_eq!(n.slots, vec![(10923, 16383), (5, 5)]);
        let line = "e7d1 127.0.0.1:30005@40005 slave,fail 07c3 0 1426238316232 3 connected";
        let n = parse_node_line(line).unwrap();
        assert!(!n.primary && n.failed);
        assert_eq!(n.primary_id.as_deref(), Some("07c3"));
    }
}
