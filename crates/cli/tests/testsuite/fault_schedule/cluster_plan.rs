//! The schedule of one seed on the partitioned Redis Cluster: the same sales and workload as
//! the single-Redis schedule draws for that seed ([`Plan::from_seed`]), plus, from a stream of
//! its own, WAIT on or off, a replica that may attach late, and one network or process fault
//! at a time. The same seed draws the same plan.

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::plan::{Plan, Skew};

/// The buckets of a bucketed sale, as the base plan splits it.
const BUCKETS: u16 = 3;

/// Which instance, in the cluster schedule: the two `flashsale serve`.
pub const INSTANCES: usize = 2;

/// One fault. A sale and one of its buckets (0 for a sale of one bucket) name the shard the
/// fault lands on, as the cluster serves that hot copy when the fault lands (a primary may
/// have moved since the plan was drawn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Instance ↔ the primary of the copy's shard, for `ms`.
    InstancePrimary {
        instance: usize,
        sku: u64,
        bucket: u16,
        ms: u64,
    },
    /// The copy's primary ↔ its replica, for `ms`.
    PrimaryReplica { sku: u64, bucket: u16, ms: u64 },
    /// The copy's primary cut from every other node and from the other instance, for `ms`;
    /// `instance` still reaches it (Jepsen's minority primary: it keeps acknowledging until
    /// it notices, and its replica is promoted on the majority side).
    MinorityPrimary {
        sku: u64,
        bucket: u16,
        instance: usize,
        ms: u64,
    },
    /// Every node-to-node link (the cluster bus; without a port filter on this machine the
    /// replication links go too), for `ms`; instances still reach every node.
    BusCut { ms: u64 },
    /// kill -9 of the copy's primary; back (empty, rejoining as a replica) once its replica
    /// is promoted.
    KillPrimary { sku: u64, bucket: u16 },
    /// `CLUSTER FAILOVER` on the copy's replica.
    Failover { sku: u64, bucket: u16 },
    /// kill -9 of the copy's primary, back at once and empty while its replica may not fail
    /// over, so that the replica resyncs empty too: the shard's data gone, acknowledged
    /// writes with it, WAIT or not (drawn for a bucketed sale's destination bucket).
    RestartEmpty { sku: u64, bucket: u16 },
    /// The plan's late replica is attached (`CLUSTER REPLICATE`, a full sync mid-spike).
    AttachReplica,
    /// kill -9 of a serve instance, back after `down_ms`.
    RestartServe { instance: usize, down_ms: u64 },
}

impl Fault {
    pub fn is_partition(&self) -> bool {
        matches!(
            self,
            Fault::InstancePrimary { .. }
                | Fault::PrimaryReplica { .. }
                | Fault::MinorityPrimary { .. }
                | Fault::BusCut { .. }
        )
    }

    /// Faults that move a shard's primary (one planned, the others once the failure is seen).
    pub fn is_failover(&self) -> bool {
        matches!(
            self,
            Fault::MinorityPrimary { .. }
                | Fault::KillPrimary { .. }
                | Fault::Failover { .. }
                | Fault::RestartEmpty { .. }
        )
    }

    /// Faults after which a promoted replica may lack acknowledged writes (without WAIT). A
    /// bus cut is one: it cuts replication too, and one longer than the node timeout can
    /// still fail a primary over once it heals (the failure reports gossip then).
    pub fn may_lose(&self) -> bool {
        matches!(
            self,
            Fault::MinorityPrimary { .. } | Fault::KillPrimary { .. } | Fault::BusCut { .. }
        )
    }

    /// Faults that lose acknowledged writes whatever WAIT says.
    pub fn loses(&self) -> bool {
        matches!(self, Fault::RestartEmpty { .. })
    }

    /// The hot copy the fault lands on, if it lands on one.
    pub fn copy(&self) -> Option<(u64, u16)> {
        match *self {
            Fault::InstancePrimary { sku, bucket, .. }
            | Fault::PrimaryReplica { sku, bucket, .. }
            | Fault::MinorityPrimary { sku, bucket, .. }
            | Fault::KillPrimary { sku, bucket }
            | Fault::Failover { sku, bucket }
            | Fault::RestartEmpty { sku, bucket } => Some((sku, bucket)),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub at_ms: u64,
    pub fault: Fault,
}

#[derive(Debug, Clone)]
pub struct ClusterPlan {
    pub seed: u64,
    /// Sales, buyers, clients and pace, as the single-Redis schedule draws them (its faults,
    /// Redis persistence and hot sale are not used here).
    pub base: Plan,
    /// `FLASHSALE_REDIS_WAIT_REPLICAS=1` with this `FLASHSALE_REDIS_WAIT_TIMEOUT_MS`, or off.
    pub wait_timeout_ms: Option<u64>,
    /// A replica node (3..6) that starts detached and is attached by a step.
    pub late_replica: Option<usize>,
    pub workload_ms: u64,
    pub steps: Vec<Step>,
}

/// The workload's planned length; a fault that runs late runs the workload longer.
const WORKLOAD_MS: u64 = 12_000;
/// The fault-free tail the plan leaves (the nemesis also waits a settled cluster).
const TAIL_MS: u64 = 1_500;
/// Distinguishes this plan's stream from the base plan's, seed for seed.
const STREAM: u64 = 0x6e65_746e_735f_636c;
/// The stream of a bucketed sale's draws (its skew, and where its faults land), apart so that
/// a seed without a bucketed sale draws what it always drew.
const BUCKET_STREAM: u64 = 0x6275_636b_6574_7321;

impl ClusterPlan {
    pub fn from_seed(seed: u64) -> ClusterPlan {
        let mut base = Plan::from_seed(seed);
        (base.steps, base.hot_sku) = (Vec::new(), None);
        let mut rng = StdRng::seed_from_u64(seed ^ STREAM);
        let wait_timeout_ms = rng.random_bool(0.5).then(|| rng.random_range(100..=400));
        let late_replica = rng.random_bool(0.3).then(|| rng.random_range(3..6));
        let skus: Vec<u64> = base.sales.iter().map(|s| s.sku).collect();
        let mut buckets = StdRng::seed_from_u64(seed ^ BUCKET_STREAM);
        base.skew = skew_bucketed(&mut buckets, &base);
        let late = late_replica.is_some();
        let steps = draw_steps(&mut rng, &mut buckets, &skus, base.skew, late);
        base.workload_ms = WORKLOAD_MS;
        ClusterPlan {
            seed,
            base,
            wait_timeout_ms,
            late_replica,
            workload_ms: WORKLOAD_MS,
            steps,
        }
    }

    /// Whether acknowledged writes may be lost and only reported: WAIT off and a fault that
    /// can promote a replica lacking them.
    pub fn may_lose_hot_copy(&self) -> bool {
        let may = self.wait_timeout_ms.is_none() && self.steps.iter().any(|s| s.fault.may_lose());
        may || self.steps.iter().any(|s| s.fault.loses())
    }

    pub fn partitions(&self) -> usize {
        self.steps.iter().filter(|s| s.fault.is_partition()).count()
    }

    pub fn failovers(&self) -> usize {
        self.steps.iter().filter(|s| s.fault.is_failover()).count()
    }
}

/// Faults one after the other, each planned to start after the one before it ends: 2–4 of
/// them (the late replica's attach among them), until the tail. With a bucketed sale, where
/// each fault lands is drawn from the bucket stream (see [`on_bucket`]).
fn draw_steps(
    rng: &mut StdRng,
    buckets: &mut StdRng,
    skus: &[u64],
    skew: Option<Skew>,
    late: bool,
) -> Vec<Step> {
    let n = rng.random_range(2..=4);
    let attach_at = late.then(|| rng.random_range(0..n));
    let mut at = rng.random_range(700..=1_200);
    let mut steps = Vec::new();
    for k in 0..n {
        let fault = if attach_at == Some(k) {
            Fault::AttachReplica
        } else {
            let fault = draw_fault(rng, skus);
            match skew {
                Some(skew) => on_bucket(buckets, fault, skew),
                None => fault,
            }
        };
        steps.push(Step { at_ms: at, fault });
        at += planned_ms(&fault) + rng.random_range(300..=900);
        if at > WORKLOAD_MS - TAIL_MS {
            break;
        }
    }
    steps
}

fn draw_fault(rng: &mut StdRng, skus: &[u64]) -> Fault {
    let sku = skus[rng.random_range(0..skus.len())];
    let instance = rng.random_range(0..INSTANCES);
    let bucket = 0;
    match rng.random_range(0..7) {
        0 => Fault::InstancePrimary {
            instance,
            sku,
            bucket,
            ms: rng.random_range(800..=2_500),
        },
        1 => Fault::PrimaryReplica {
            sku,
            bucket,
            ms: rng.random_range(800..=2_500),
        },
        // Long enough for the majority to fail it over (node timeout 1 s, then an election).
        2 => Fault::MinorityPrimary {
            sku,
            bucket,
            instance,
            ms: rng.random_range(3_000..=4_500),
        },
        3 => Fault::BusCut {
            ms: rng.random_range(800..=2_500),
        },
        4 => Fault::KillPrimary { sku, bucket },
        5 => Fault::Failover { sku, bucket },
        _ => Fault::RestartServe {
            instance,
            down_ms: rng.random_range(0..=1_500),
        },
    }
}

/// With a bucketed sale, a fault that lands on a shard lands on one of its buckets: the
/// destination of its transfers (the skew's home) half the time, else a source. (Its three
/// buckets are placed on the three primaries, so the shards of the other sales are hit too.)
/// One such fault in five restarts the destination's shard empty instead.
fn on_bucket(rng: &mut StdRng, fault: Fault, skew: Skew) -> Fault {
    let Some(_) = fault.copy() else {
        return fault;
    };
    let (sku, home) = (skew.sku, skew.home);
    if rng.random_range(0..5) == 0 {
        return Fault::RestartEmpty { sku, bucket: home };
    }
    let bucket = match rng.random_bool(0.5) {
        true => home,
        false => (home + rng.random_range(1..BUCKETS)) % BUCKETS,
    };
    match fault {
        Fault::InstancePrimary { instance, ms, .. } => Fault::InstancePrimary {
            instance,
            sku,
            bucket,
            ms,
        },
        Fault::PrimaryReplica { ms, .. } => Fault::PrimaryReplica { sku, bucket, ms },
        Fault::MinorityPrimary { instance, ms, .. } => Fault::MinorityPrimary {
            sku,
            bucket,
            instance,
            ms,
        },
        Fault::KillPrimary { .. } => Fault::KillPrimary { sku, bucket },
        Fault::Failover { .. } => Fault::Failover { sku, bucket },
        other => other,
    }
}

/// A bucketed sale (the base plan splits the last sale of half the seeds over three
/// buckets) gets its skew drawn from the bucket stream: most new buyers homed at one bucket.
fn skew_bucketed(rng: &mut StdRng, base: &Plan) -> Option<Skew> {
    let sale = base.sales.iter().find(|s| s.buckets > 1)?;
    assert_eq!(
        sale.buckets, BUCKETS,
        "the base plan splits a sale in three"
    );
    Some(Skew {
        sku: sale.sku,
        home: rng.random_range(0..BUCKETS),
        percent: rng.random_range(60..=90),
    })
}

/// About how long a fault lasts, to space the next one (the nemesis also waits for the
/// cluster to settle, so the real times drift later).
fn planned_ms(f: &Fault) -> u64 {
    match *f {
        Fault::InstancePrimary { ms, .. }
        | Fault::PrimaryReplica { ms, .. }
        | Fault::MinorityPrimary { ms, .. }
        | Fault::BusCut { ms } => ms,
        Fault::KillPrimary { .. } => 3_000,
        Fault::RestartEmpty { .. } => 1_500,
        Fault::Failover { .. } | Fault::AttachReplica => 500,
        Fault::RestartServe { down_ms, .. } => down_ms + 500,
    }
}

impl fmt::Display for ClusterPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.base;
        let wait = match self.wait_timeout_ms {
            Some(ms) => format!("WAIT 1 replica, {ms} ms"),
            None => "WAIT off".into(),
        };
        writeln!(
            f,
            "cluster seed {}: {wait}; {} buyers, {} clients, pace {} ms, workload {} ms",
            self.seed, b.buyers, b.clients, b.pace_ms, self.workload_ms
        )?;
        if let Some(node) = self.late_replica {
            writeln!(f, "  replica node {node} attaches late")?;
        }
        super::plan::write_sales(f, &b.sales, b.skew)?;
        for s in &self.steps {
            writeln!(f, "  at {:>5} ms: {:?}", s.at_ms, s.fault)?;
        }
        Ok(())
    }
}

#[test]
fn the_same_seed_draws_the_same_cluster_plan() {
    let (a, b) = (ClusterPlan::from_seed(42), ClusterPlan::from_seed(42));
    assert_eq!(a.to_string(), b.to_string());
    assert_ne!(a.to_string(), ClusterPlan::from_seed(43).to_string());
    assert_eq!(a.base.sales.len(), Plan::from_seed(42).sales.len());
}

#[test]
fn half_the_seeds_split_a_sale_and_aim_their_faults_at_its_buckets() {
    let plans: Vec<ClusterPlan> = (1..=100).map(ClusterPlan::from_seed).collect();
    let bucketed = plans.iter().filter(|p| p.base.skew.is_some()).count();
    assert!((35..=65).contains(&bucketed), "{bucketed} of 100 seeds");
    for p in &plans {
        for (sku, bucket) in p.steps.iter().filter_map(|s| s.fault.copy()) {
            match p.base.skew {
                Some(skew) => assert_eq!(sku, skew.sku, "seed {}", p.seed),
                None => assert_eq!(bucket, 0, "seed {}", p.seed),
            }
        }
    }
    let empty = plans
        .iter()
        .filter(|p| p.steps.iter().any(|s| s.fault.loses()));
    assert!(empty.count() > 5, "few seeds restart a destination empty");
}
