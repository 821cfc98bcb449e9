//! The six-node Redis Cluster of [`crate::redis_cluster`] with every node in a network
//! namespace of its own on a [`Net`]: each binds to and announces its namespace's address
//! (`--cluster-announce-ip`), all on port 6379 with the bus on 16379, so that a partition
//! between two addresses cuts exactly the links between those two nodes.
//!
//! The cluster is formed by hand (slots, `CLUSTER MEET`, `CLUSTER REPLICATE`) rather than by
//! `redis-cli --cluster create`, so that one replica may be left out and attached later, mid
//! test ([`NsRedisCluster::attach_replica`]). Node `s` (0..3) starts as the primary of shard
//! `s`, node `s + 3` as its replica. Settings as in the loopback cluster (see its module doc).

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::netns::{Host, Net};
use crate::redis_cluster::{all_say_ok, connect, link_up, node_args, parse_node_line, NodeInfo};
use crate::redis_server::RedisServer;
use crate::wait;

/// Every node's client port (each in its own namespace, so they do not clash).
pub const PORT: u16 = 6379;
/// Every node's cluster bus port.
pub const BUS_PORT: u16 = 16379;
/// How long forming, a promotion or settling may take.
const SETTLE_MAX: Duration = Duration::from_secs(30);
/// The slot ranges of the three shards, as `redis-cli --cluster create` splits them.
const SHARDS: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// Six nodes in namespaces; node `i` is `hosts[i]`.
pub struct NsRedisCluster {
    nodes: Vec<RedisServer>,
    hosts: Vec<Host>,
    pub node_timeout_ms: u64,
}

impl NsRedisCluster {
    /// Starts six nodes in new hosts `r0`..`r5` of `net` and forms the cluster, every replica
    /// attached except `late` (a node index 3..6, left a primary without slots until
    /// [`NsRedisCluster::attach_replica`]).
    pub async fn spawn(net: &mut Net, node_timeout_ms: u64, late: Option<usize>) -> NsRedisCluster {
        let mut nodes = Vec::new();
        let mut hosts = Vec::new();
        for i in 0..6 {
            let host = net.add_host(&format!("r{i}"));
            nodes.push(spawn_node(net, &host, node_timeout_ms).await);
            hosts.push(host);
        }
        let cluster = NsRedisCluster {
            nodes,
            hosts,
            node_timeout_ms,
        };
        cluster.form(late).await;
        cluster
    }

    async fn form(&self, late: Option<usize>) {
        for i in 0..6 {
            self.command(i, &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()])
                .await;
        }
        for (s, (from, to)) in SHARDS.iter().enumerate() {
            let (from, to) = (from.to_string(), to.to_string());
            self.command(s, &["CLUSTER", "ADDSLOTSRANGE", &from, &to])
                .await;
        }
        for i in 1..6 {
            let addr = self.hosts[i].addr.to_string();
            let (port, bus) = (PORT.to_string(), BUS_PORT.to_string());
            self.command(0, &["CLUSTER", "MEET", &addr, &port, &bus])
                .await;
        }
        wait::until("every node to know all six", SETTLE_MAX, || async {
            for i in 0..6 {
                let known = self.topology_of(i).await?;
                if known.len() != 6 {
                    return None;
                }
            }
            Some(())
        })
        .await;
        for r in (3..6).filter(|r| Some(*r) != late) {
            self.attach_replica(r, r - 3).await;
        }
        self.settle().await;
    }

    /// Makes node `replica` a replica of node `primary` (`CLUSTER REPLICATE`) and waits until
    /// its link is up: a replica attached late does its full sync here.
    pub async fn attach_replica(&self, replica: usize, primary: usize) {
        let id = self.id(primary).await;
        wait::until("CLUSTER REPLICATE to be accepted", SETTLE_MAX, || async {
            let mut conn = connect(&self.nodes[replica].url()).await?;
            let done: Result<(), _> = redis::cmd("CLUSTER")
                .arg("REPLICATE")
                .arg(&id)
                .query_async(&mut conn)
                .await;
            done.ok()
        })
        .await;
        wait::until("the late replica's link to be up", SETTLE_MAX, || async {
            link_up(&self.nodes[replica].url()).await.then_some(())
        })
        .await;
        // The primary learns of its new replica by gossip, a moment after the replica knows.
        wait::until("the primary to know its replica", SETTLE_MAX, || async {
            (self.replica_of(primary).await == Some(replica)).then_some(())
        })
        .await;
    }

    /// The seed list a client is given: every node, comma-separated.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        urls.join(",")
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    pub fn addr(&self, i: usize) -> Ipv4Addr {
        self.hosts[i].addr
    }

    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].is_running()
    }

    /// SIGKILL of node `i`: what it had not replicated is gone (no persistence).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again (same namespace, address, dir and nodes.conf: it rejoins).
    pub async fn restart(&mut self, i: usize) {
        self.nodes[i].start().await;
    }

    /// The node's id (`CLUSTER MYID`).
    pub async fn id(&self, i: usize) -> String {
        let mut conn = connect(&self.nodes[i].url())
            .await
            .unwrap_or_else(|| panic!("connect to node {i}"));
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut conn)
            .await
            .expect("CLUSTER MYID")
    }

    /// `CLUSTER NODES` as node `i` sees it, `None` when it does not answer.
    pub async fn topology_of(&self, i: usize) -> Option<Vec<NodeInfo>> {
        if !self.nodes[i].is_running() {
            return None;
        }
        let mut conn = connect(&self.nodes[i].url()).await?;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .ok()?;
        Some(text.lines().filter_map(parse_node_line).collect())
    }

    /// The index of the node announcing `ip`.
    pub fn index_of(&self, ip: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.addr.to_string() == ip)
    }

    /// The primary serving `slot` as the majority of live nodes sees it (a node cut off may
    /// still believe itself primary), `None` when no view is held by most.
    pub async fn primary_of_slot(&self, slot: u16) -> Option<usize> {
        self.primaries_of(&[slot]).await[0]
    }

    /// [`NsRedisCluster::primary_of_slot`] of each slot, asking every node once.
    pub async fn primaries_of(&self, slots: &[u16]) -> Vec<Option<usize>> {
        let mut votes = vec![[0usize; 6]; slots.len()];
        for i in 0..6 {
            let Some(topology) = self.topology_of(i).await else {
                continue;
            };
            for (k, &slot) in slots.iter().enumerate() {
                let serving = topology.iter().find(|n| {
                    n.primary && !n.failed && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
                });
                if let Some(p) = serving.and_then(|n| self.index_of(&n.ip)) {
                    votes[k][p] += 1;
                }
            }
        }
        let majority = |v: &[usize; 6]| {
            let (best, n) = v.iter().enumerate().max_by_key(|(_, n)| **n)?;
            (*n >= 3).then_some(best)
        };
        votes.iter().map(majority).collect()
    }

    /// A replica of node `primary`, as node `primary` sees it (any replica, failed or not).
    pub async fn replica_of(&self, primary: usize) -> Option<usize> {
        let topology = self.topology_of(primary).await?;
        let me = topology
            .iter()
            .find(|n| n.ip == self.addr(primary).to_string())?;
        let replica = topology
            .iter()
            .find(|n| n.primary_id.as_deref() == Some(me.id.as_str()))?;
        self.index_of(&replica.ip)
    }

    /// A planned failover: replica `i` takes over from its primary (`CLUSTER FAILOVER`, which
    /// waits for the replica to catch up first); waits until it is primary.
    pub async fn failover(&self, i: usize) -> Result<(), String> {
        let mut conn = connect(&self.nodes[i].url())
            .await
            .ok_or_else(|| format!("node {i} does not answer"))?;
        let asked: Result<(), _> = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query_async(&mut conn)
            .await;
        asked.map_err(|e| format!("CLUSTER FAILOVER on node {i}: {e}"))?;
        match self.promoted_within(i, SETTLE_MAX).await {
            true => Ok(()),
            false => Err(format!("node {i} not promoted within {SETTLE_MAX:?}")),
        }
    }

    /// Whether node `i` is a primary serving slots, in its own view, within `limit`.
    pub async fn promoted_within(&self, i: usize, limit: Duration) -> bool {
        let ip = self.addr(i).to_string();
        let promoted = wait::within(limit, || async {
            let topology = self.topology_of(i).await?;
            let me = topology.into_iter().find(|n| n.ip == ip)?;
            (me.primary && !me.slots.is_empty()).then_some(())
        })
        .await;
        promoted.is_some()
    }

    /// Whether every live node says `cluster_state:ok` within `limit`.
    pub async fn ok_within(&self, limit: Duration) -> bool {
        let urls: Vec<String> = (self.nodes.iter())
            .filter(|n| n.is_running())
            .map(|n| n.url())
            .collect();
        let ok = wait::within(limit, || all_say_ok(&urls)).await;
        ok.is_some()
    }

    /// Whether, within `limit`, every live node says ok, three primaries serve every slot and
    /// each has a replica whose link to it is up (but for one per node not attached yet: a
    /// primary without slots).
    pub async fn settled_within(&self, limit: Duration) -> bool {
        if !self.ok_within(limit).await {
            return false;
        }
        let settled = wait::within(limit, || async {
            let topology = self.topology_of(self.live()?).await?;
            let serving = |n: &&NodeInfo| n.primary && !n.failed && !n.slots.is_empty();
            let primaries: Vec<&NodeInfo> = topology.iter().filter(serving).collect();
            let detached = (topology.iter())
                .filter(|n| n.primary && !n.failed && n.slots.is_empty())
                .count();
            if primaries.len() != 3 {
                return None;
            }
            let mut replicated = 0;
            for p in primaries {
                let replica =
                    (topology.iter()).find(|n| !n.failed && n.primary_id.as_deref() == Some(&p.id));
                if let Some(replica) = replica {
                    let url = format!("redis://{}:{PORT}", replica.ip);
                    if !link_up(&url).await {
                        return None;
                    }
                    replicated += 1;
                }
            }
            (replicated + detached >= 3).then_some(())
        })
        .await;
        settled.is_some()
    }

    /// Panics unless the cluster settles (see [`NsRedisCluster::settled_within`]).
    pub async fn settle(&self) {
        assert!(
            self.settled_within(SETTLE_MAX).await,
            "the namespaced cluster did not settle within {SETTLE_MAX:?}"
        );
    }

    fn live(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| self.nodes[i].is_running())
    }

    /// One command on node `i`; panics when it fails (forming the cluster).
    async fn command(&self, i: usize, args: &[&str]) {
        let mut conn = connect(&self.nodes[i].url())
            .await
            .unwrap_or_else(|| panic!("connect to node {i}"));
        let _: redis::Value = redis::cmd(args[0])
            .arg(&args[1..])
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{args:?} on node {i}: {e}"));
    }
}

/// One cluster node in `host`'s namespace, bound to and announcing its address.
async fn spawn_node(net: &Net, host: &Host, node_timeout_ms: u64) -> RedisServer {
    let (addr, bus, timeout) = (
        host.addr.to_string(),
        BUS_PORT.to_string(),
        node_timeout_ms.to_string(),
    );
    let mut args = vec!["--cluster-announce-ip", &addr];
    args.extend(node_args(&bus, &timeout));
    // A full sync starts at once (the default waits 5 s for more replicas to share it):
    // replicas attach, and a demoted primary resyncs, within the test's bounds.
    args.extend(["--protected-mode", "no", "--repl-diskless-sync-delay", "0"]);
    RedisServer::spawn_wrapped(net.exec_prefix(host), &addr, PORT, &args).await
}
