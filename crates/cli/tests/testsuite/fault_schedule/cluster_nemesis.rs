//! The cluster nemesis: one fault at a time, at its planned time or as soon as the one before
//! it has healed and the cluster has settled. Each fault resolves its shard when it lands (a
//! sale's primary may have moved since the plan was drawn) and writes down what it did, in
//! the loopback nemesis's [`Timeline`] so that the same checker reads it. A fault on a bucket
//! of a bucketed sale waits, a bounded while, for a transfer to or from that bucket to be in
//! flight, and lands then (or at the bound, noted).

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::cluster_copies::Copies;
use super::cluster_plan::{ClusterPlan, Fault};
use super::cluster_procs::NsStack;
use super::nemesis::Timeline;

/// How long the cluster gets to settle (every slot served, replicas linked) after a fault.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);
/// How long a killed primary's replica gets to be promoted before the node comes back anyway.
const PROMOTE_LIMIT: Duration = Duration::from_secs(10);
/// How long a fault on a bucket waits for a transfer in flight there before it lands anyway.
const IN_FLIGHT_LIMIT: Duration = Duration::from_secs(3);
/// One slot of each shard (the shards' first slots).
const SHARD_SLOTS: [u16; 3] = [0, 5461, 10923];

/// What the nemesis saw besides the timeline.
#[derive(Debug, Default)]
pub struct Seen {
    /// Shards whose primary changed across a fault, summed over the faults.
    pub primary_changes: usize,
    /// Faults that settled late or could not land (no replica to fail over to, …).
    pub unsettled: Vec<String>,
    /// Faults on a bucket of a bucketed sale, and how many of them found a transfer to or
    /// from that bucket in flight when they landed.
    pub on_buckets: usize,
    pub in_flight: usize,
}

pub async fn run(
    plan: &ClusterPlan,
    stack: &mut NsStack,
    copies: &mut Copies,
    start: Instant,
) -> (Timeline, Seen) {
    let mut t = Timeline::default();
    let mut seen = Seen::default();
    for step in &plan.steps {
        // The schedule: wait for the planned time (a late step runs at once).
        tokio::time::sleep_until((start + Duration::from_millis(step.at_ms)).into()).await;
        let before = primaries(stack).await;
        let mut n = Nemesis {
            plan,
            stack,
            copies: &mut *copies,
            start,
            t: &mut t,
        };
        if let Some(found) = n.await_transfer(step.fault).await {
            seen.on_buckets += 1;
            seen.in_flight += usize::from(found);
        }
        n.apply(step.fault).await;
        if !n.stack.redis.settled_within(SETTLE_LIMIT).await {
            let why = format!(
                "cluster not settled {SETTLE_LIMIT:?} after {:?}",
                step.fault
            );
            n.t.note(start, why.clone());
            seen.unsettled.push(why);
        }
        let after = primaries(stack).await;
        let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        seen.primary_changes += changed;
        if changed > 0 {
            t.note(start, format!("primaries now {after:?} (were {before:?})"));
        }
    }
    (t, seen)
}

/// The primary node of each shard, as most nodes see it.
async fn primaries(stack: &NsStack) -> Vec<Option<usize>> {
    stack.redis.primaries_of(&SHARD_SLOTS).await
}

struct Nemesis<'a> {
    plan: &'a ClusterPlan,
    stack: &'a mut NsStack,
    copies: &'a mut Copies,
    start: Instant,
    t: &'a mut Timeline,
}

impl Nemesis<'_> {
    async fn apply(&mut self, fault: Fault) {
        match fault {
            Fault::InstancePrimary {
                instance,
                sku,
                bucket,
                ms,
            } => self.instance_primary(instance, (sku, bucket), ms).await,
            Fault::PrimaryReplica { sku, bucket, ms } => {
                self.primary_replica((sku, bucket), ms).await
            }
            Fault::MinorityPrimary {
                sku,
                bucket,
                instance,
                ms,
            } => self.minority((sku, bucket), instance, ms).await,
            Fault::BusCut { ms } => self.bus_cut(ms).await,
            Fault::KillPrimary { sku, bucket } => self.kill_primary((sku, bucket)).await,
            Fault::Failover { sku, bucket } => self.failover((sku, bucket)).await,
            Fault::RestartEmpty { sku, bucket } => self.restart_empty((sku, bucket)).await,
            Fault::AttachReplica => self.attach_late_replica().await,
            Fault::RestartServe { instance, down_ms } => {
                self.restart_serve(instance, down_ms).await
            }
        }
    }

    /// Before a fault on a bucket of the plan's bucketed sale: waits (bounded) for a transfer
    /// to or from it to be in flight and notes what it saw. `None` for other faults.
    async fn await_transfer(&mut self, fault: Fault) -> Option<bool> {
        let (sku, bucket) = fault.copy()?;
        self.plan.base.skew.filter(|s| s.sku == sku)?;
        let seen = (self.copies)
            .wait_in_flight(sku, bucket, IN_FLIGHT_LIMIT)
            .await;
        let what = match &seen {
            Some(transfer) => format!("in flight at sale {sku} bucket {bucket}: {transfer}"),
            None => format!(
                "no transfer seen in flight at sale {sku} bucket {bucket} within {IN_FLIGHT_LIMIT:?}"
            ),
        };
        self.note(what);
        Some(seen.is_some())
    }

    async fn instance_primary(&mut self, instance: usize, copy: (u64, u16), ms: u64) {
        let Some(p) = self.primary(copy).await else {
            return;
        };
        let pair = (self.stack.instance_addr(instance), self.stack.redis.addr(p));
        let what = format!("serve{instance} ↔ primary node {p} ({})", name(copy));
        self.cut_for(&[pair], ms, &what).await;
    }

    async fn primary_replica(&mut self, copy: (u64, u16), ms: u64) {
        let Some((p, r)) = self.pair(copy).await else {
            return;
        };
        let pair = (self.stack.redis.addr(p), self.stack.redis.addr(r));
        let what = format!("primary node {p} ↔ its replica node {r} ({})", name(copy));
        self.cut_for(&[pair], ms, &what).await;
    }

    /// Every node-to-node pair cut: the bus (and replication) gone, clients still connected.
    async fn bus_cut(&mut self, ms: u64) {
        let nodes: Vec<Ipv4Addr> = (0..6).map(|i| self.stack.redis.addr(i)).collect();
        let pairs: Vec<_> = (0..6)
            .flat_map(|a| (a + 1..6).map(move |b| (a, b)))
            .map(|(a, b)| (nodes[a], nodes[b]))
            .collect();
        self.cut_for(&pairs, ms, "every node ↔ every node (the cluster bus)")
            .await;
        // A primary failed over once the cut heals loses what it acknowledged meanwhile.
        self.lose_here();
    }

    async fn failover(&mut self, copy: (u64, u16)) {
        let Some((p, r)) = self.pair(copy).await else {
            return;
        };
        let result = self.stack.redis.failover(r).await;
        self.note(format!(
            "CLUSTER FAILOVER on node {r} (replica of node {p}, {}): {result:?}",
            name(copy)
        ));
    }

    /// The late replica joins the shard it was meant for: its original primary, which kept
    /// the shard (with no replica it could not be failed over).
    async fn attach_late_replica(&mut self) {
        let node = self.plan.late_replica.expect("a late replica in the plan");
        self.stack.redis.attach_replica(node, node - 3).await;
        let primary = node - 3;
        self.note(format!(
            "late replica node {node} attached to node {primary}, in sync"
        ));
    }

    /// The copy's primary now, or `None` (noted) when no majority names one.
    async fn primary(&mut self, (sku, bucket): (u64, u16)) -> Option<usize> {
        let slot = self.copies.slot(sku, bucket);
        let p = self.stack.redis.primary_of_slot(slot).await;
        if p.is_none() {
            let copy = name((sku, bucket));
            self.note(format!("skipped: no primary of {copy} agreed on"));
        }
        p
    }

    /// The copy's primary and a replica of it, or `None` (noted) when it has none (a late
    /// replica not attached yet).
    async fn pair(&mut self, copy: (u64, u16)) -> Option<(usize, usize)> {
        let p = self.primary(copy).await?;
        let r = self.stack.redis.replica_of(p).await;
        if r.is_none() {
            let copy = name(copy);
            self.note(format!(
                "skipped: primary node {p} of {copy} has no replica"
            ));
        }
        Some((p, r?))
    }

    /// Cuts every pair for `ms`, then heals them; the downtime counts for the journal check.
    async fn cut_for(&mut self, pairs: &[(Ipv4Addr, Ipv4Addr)], ms: u64, what: &str) {
        for &(a, b) in pairs {
            self.stack.net.partition(a, b);
        }
        let from = Timeline::now(self.start);
        self.note(format!("partition: {what}, for {ms} ms"));
        // The fault's planned length: the schedule, not synchronisation.
        tokio::time::sleep(Duration::from_millis(ms)).await;
        for &(a, b) in pairs {
            self.stack.net.heal(a, b);
        }
        self.t.downs.push((from, Timeline::now(self.start)));
        self.note(format!("healed: {what}"));
    }

    /// The copy's primary cut from every other node, the other instance and the worker;
    /// `instance` still reaches it.
    async fn minority(&mut self, copy: (u64, u16), instance: usize, ms: u64) {
        let Some(p) = self.primary(copy).await else {
            return;
        };
        let addr = self.stack.redis.addr(p);
        let mut others: Vec<Ipv4Addr> = (0..6)
            .filter(|&i| i != p)
            .map(|i| self.stack.redis.addr(i))
            .collect();
        others.push(self.stack.instance_addr(1 - instance));
        others.push(self.stack.hosts[2].addr);
        let pairs: Vec<_> = others.into_iter().map(|o| (addr, o)).collect();
        self.lose_here();
        let what = format!("primary node {p} ({}) alone with serve{instance}, cut from the other nodes, serve{} and the worker", name(copy), 1 - instance);
        self.cut_for(&pairs, ms, &what).await;
        // What `instance` had acknowledged on the minority side is dropped only now, when the
        // old primary rejoins as a replica: its loss can be reported from here, not before.
        self.lose_here();
    }

    async fn kill_primary(&mut self, copy: (u64, u16)) {
        let Some(p) = self.primary(copy).await else {
            return;
        };
        let replica = self.stack.redis.replica_of(p).await;
        self.stack.redis.kill(p);
        let from = Timeline::now(self.start);
        self.lose_here();
        self.note(format!(
            "kill -9 of primary node {p} ({}); replica {replica:?}",
            name(copy)
        ));
        let promoted = match replica {
            Some(r) => self.stack.redis.promoted_within(r, PROMOTE_LIMIT).await,
            None => false,
        };
        self.note(format!("replica {replica:?} promoted: {promoted}"));
        // Back only after the promotion: a primary without persistence that came back first
        // would hand its replica an empty data set (the documented way to lose everything).
        self.stack.redis.restart(p).await;
        self.t.downs.push((from, Timeline::now(self.start)));
        let role = match promoted {
            true => "rejoins as a replica",
            false => "still the primary: the shard's data is gone",
        };
        self.note(format!("node {p} back, empty ({role})"));
    }

    /// kill -9 of the copy's primary and back at once, empty, its replica barred from failing
    /// over meanwhile (`cluster-replica-no-failover`): the node keeps its slots and the
    /// replica resyncs from it, empty too. Every copy on that shard is lost.
    async fn restart_empty(&mut self, copy: (u64, u16)) {
        let Some(p) = self.primary(copy).await else {
            return;
        };
        let replica = self.stack.redis.replica_of(p).await;
        if let Some(r) = replica {
            let barred = no_failover(&self.stack.redis.url(r), "yes").await;
            self.note(format!("replica node {r} may not fail over: {barred:?}"));
        }
        self.stack.redis.kill(p);
        let from = Timeline::now(self.start);
        self.lose_here();
        self.note(format!("kill -9 of primary node {p} ({})", name(copy)));
        self.stack.redis.restart(p).await;
        self.t.downs.push((from, Timeline::now(self.start)));
        self.note(format!("node {p} back empty, still the primary"));
        if let Some(r) = replica {
            if !self.stack.redis.settled_within(SETTLE_LIMIT).await {
                self.note(format!(
                    "replica node {r} not resynced within {SETTLE_LIMIT:?}"
                ));
            }
            let allowed = no_failover(&self.stack.redis.url(r), "no").await;
            self.note(format!("replica node {r} may fail over again: {allowed:?}"));
        }
    }

    async fn restart_serve(&mut self, instance: usize, down_ms: u64) {
        self.stack.serves[instance].kill();
        let from = Timeline::now(self.start);
        self.t.serve_kills.push((instance, from));
        self.note(format!("kill -9 of serve{instance}"));
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        self.stack.serves[instance].start();
        self.stack.ready(instance).await;
        self.t.downs.push((from, Timeline::now(self.start)));
        self.note(format!("serve{instance} back and ready"));
    }

    /// A hot copy may lose acknowledged writes from here (a promotion of a replica that lacks
    /// them): the checker's journal rule counts from it.
    fn lose_here(&mut self) {
        self.t.losses.push(Timeline::now(self.start));
    }

    fn note(&mut self, what: String) {
        self.t.note(self.start, what);
    }
}

/// `sale 3` for a sale's own copy, `sale 3 bucket 2` for another bucket's.
fn name((sku, bucket): (u64, u16)) -> String {
    match bucket {
        0 => format!("sale {sku}"),
        b => format!("sale {sku} bucket {b}"),
    }
}

/// `CONFIG SET cluster-replica-no-failover <yes|no>` on the node at `url`.
async fn no_failover(url: &str, value: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let set = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-replica-no-failover")
            .arg(value)
            .query_async::<()>(&mut conn)
            .await
    };
    match tokio::time::timeout(Duration::from_secs(5), set).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(_) => Err("timed out".into()),
    }
}
