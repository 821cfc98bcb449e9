//! The schedule of one seed on the partitioned Redis Cluster: the same sales and workload as
//! the single-Redis schedule draws for that seed ([`Plan::from_seed`]), plus, from a stream of
//! its own, WAIT on or off, a replica that may attach late, and one network or process fault
//! at a time. The same seed draws the same plan.

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::plan::Plan;

/// Which instance, in the cluster schedule: the two `flashsale serve`.
pub const INSTANCES: usize = 2;

/// One fault; a sale names the shard (its primary, its replica) the fault lands on, as the
/// cluster serves it when the fault lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Instance ↔ the primary of the sale's shard, for `ms`.
    InstancePrimary { instance: usize, sku: u64, ms: u64 },
    /// The sale's primary ↔ its replica, for `ms`.
    PrimaryReplica { sku: u64, ms: u64 },
    /// The sale's primary cut from every other node and from the other instance, for `ms`;
    /// `instance` still reaches it (Jepsen's minority primary: it keeps acknowledging until
    /// it notices, and its replica is promoted on the majority side).
    MinorityPrimary { sku: u64, instance: usize, ms: u64 },
    /// Every node-to-node link (the cluster bus; without a port filter on this machine the
    /// replication links go too), for `ms`; instances still reach every node.
    BusCut { ms: u64 },
    /// kill -9 of the sale's primary; back (empty, rejoining as a replica) once its replica
    /// is promoted.
    KillPrimary { sku: u64 },
    /// `CLUSTER FAILOVER` on the sale's replica.
    Failover { sku: u64 },
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
            Fault::MinorityPrimary { .. } | Fault::KillPrimary { .. } | Fault::Failover { .. }
        )
    }

    /// Faults after which a promoted replica may lack acknowledged writes (without WAIT).
    pub fn may_lose(&self) -> bool {
        matches!(
            self,
            Fault::MinorityPrimary { .. } | Fault::KillPrimary { .. }
        )
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

impl ClusterPlan {
    pub fn from_seed(seed: u64) -> ClusterPlan {
        let mut base = Plan::from_seed(seed);
        // Sales of one bucket here: the bucketed ones meet failovers in the redis testsuite's
        // bucket schedule.
        for sale in &mut base.sales {
            sale.buckets = 1;
        }
        (base.steps, base.hot_sku) = (Vec::new(), None);
        let mut rng = StdRng::seed_from_u64(seed ^ STREAM);
        let wait_timeout_ms = rng.random_bool(0.5).then(|| rng.random_range(100..=400));
        let late_replica = rng.random_bool(0.3).then(|| rng.random_range(3..6));
        let skus: Vec<u64> = base.sales.iter().map(|s| s.sku).collect();
        let steps = draw_steps(&mut rng, &skus, late_replica.is_some());
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
        self.wait_timeout_ms.is_none() && self.steps.iter().any(|s| s.fault.may_lose())
    }

    pub fn partitions(&self) -> usize {
        self.steps.iter().filter(|s| s.fault.is_partition()).count()
    }

    pub fn failovers(&self) -> usize {
        self.steps.iter().filter(|s| s.fault.is_failover()).count()
    }
}

/// Faults one after the other, each planned to start after the one before it ends: 2–4 of
/// them (the late replica's attach among them), until the tail.
fn draw_steps(rng: &mut StdRng, skus: &[u64], late: bool) -> Vec<Step> {
    let n = rng.random_range(2..=4);
    let attach_at = late.then(|| rng.random_range(0..n));
    let mut at = rng.random_range(700..=1_200);
    let mut steps = Vec::new();
    for k in 0..n {
        let fault = if attach_at == Some(k) {
            Fault::AttachReplica
        } else {
            draw_fault(rng, skus)
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
    match rng.random_range(0..7) {
        0 => Fault::InstancePrimary {
            instance,
            sku,
            ms: rng.random_range(800..=2_500),
        },
        1 => Fault::PrimaryReplica {
            sku,
            ms: rng.random_range(800..=2_500),
        },
        // Long enough for the majority to fail it over (node timeout 1 s, then an election).
        2 => Fault::MinorityPrimary {
            sku,
            instance,
            ms: rng.random_range(3_000..=4_500),
        },
        3 => Fault::BusCut {
            ms: rng.random_range(800..=2_500),
        },
        4 => Fault::KillPrimary { sku },
        5 => Fault::Failover { sku },
        _ => Fault::RestartServe {
            instance,
            down_ms: rng.random_range(0..=1_500),
        },
    }
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
        super::plan::write_sales(f, &b.sales)?;
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
