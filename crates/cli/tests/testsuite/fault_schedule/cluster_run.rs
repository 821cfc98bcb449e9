//! One seed of the cluster schedule end to end: namespaces and processes up, sell under the
//! nemesis, quiesce, read MariaDB, and the loopback schedule's checker on it.

use std::time::{Duration, Instant};

use super::cluster_copies::Copies;
use super::cluster_nemesis::{self, Seen};
use super::cluster_plan::{ClusterPlan, INSTANCES};
use super::cluster_procs::NsStack;
use super::db;
use super::db::Stored;
use super::run::{self, Outcome, Selling, Sold};

/// The workload goes on this long after the last fault healed: every sale sells again.
const TAIL: Duration = Duration::from_millis(1_000);

/// Its `drawn`: `WAIT on|off, partitions P, failovers F (primaries moved M), losses …`.
pub async fn run_seed(seed: u64) -> Outcome<ClusterPlan> {
    let plan = ClusterPlan::from_seed(seed);
    print!("{plan}");
    let t0 = Instant::now();
    let mut stack = NsStack::start(&plan).await;
    run::create_sales(&stack, &plan.base).await;
    let mut copies = Copies::connect(&stack.redis.urls(), &stack.db_url).await;
    let up_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let (sold, seen) = sell_under_faults(&plan, &mut stack, &mut copies).await;
    let sell_s = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let reconciled = run::quiesce(&stack, &plan.base).await;
    let settle_s = t2.elapsed().as_secs_f64();
    let stored = db::read(&stack.db_url).await;
    let hot_copy_lost = plan.may_lose_hot_copy();
    let drawn = drawn(&plan, &seen, &stored);
    let phases = [up_s, sell_s, settle_s];
    let mut outcome = run::judge(plan, sold, &stored, hot_copy_lost, reconciled, phases);
    outcome.verdict.notes.extend(seen.unsettled);
    outcome.drawn = Some(drawn);
    (stack.events)
        .judge(&stack, &stack.db_url, &mut outcome.verdict)
        .await;
    run::keep_logs(&mut outcome, "cluster", seed, stack.logs_dir());
    outcome
}

/// The workload and the nemesis together, the workload at least its planned length and
/// `TAIL` past the last fault; then every process back and every sale probed.
async fn sell_under_faults(
    plan: &ClusterPlan,
    stack: &mut NsStack,
    copies: &mut Copies,
) -> (Sold, Seen) {
    let start = Instant::now();
    let selling = Selling::start(stack, INSTANCES, &plan.base, start);
    let (timeline, seen) = cluster_nemesis::run(plan, stack, copies, start).await;
    let planned_end = start + Duration::from_millis(plan.workload_ms);
    tokio::time::sleep_until(planned_end.max(Instant::now() + TAIL).into()).await;
    (selling.finish(stack, &plan.base, timeline).await, seen)
}

/// What the run drew and what it met: WAIT, partitions, failovers (planned or provoked) and how
/// many primaries really moved, losses reported by the reconcilers; with a bucketed sale, its
/// transfers stored and the faults on its buckets.
fn drawn(plan: &ClusterPlan, seen: &Seen, stored: &Stored) -> String {
    let wait = if plan.wait_timeout_ms.is_some() {
        "on"
    } else {
        "off"
    };
    format!(
        "WAIT {wait}, partitions {}, failovers {} (primaries moved {}), {}, losses reported: {} orders, {} resolutions",
        plan.partitions(),
        plan.failovers(),
        seen.primary_changes,
        bucketed(plan, seen, stored),
        stored.lost_orders.len(),
        stored.lost_resolutions.len()
    )
}

/// `bucketed: transfers T, faults on buckets B (in flight I), restarts empty R`, or
/// `bucketed: no`.
fn bucketed(plan: &ClusterPlan, seen: &Seen, stored: &Stored) -> String {
    let Some(skew) = plan.base.skew else {
        return "bucketed: no".into();
    };
    let empty = plan.steps.iter().filter(|s| s.fault.loses()).count();
    format!(
        "bucketed: transfers {}, faults on buckets {} (in flight {}), restarts empty {empty}",
        run::transfers(stored, skew.sku),
        seen.on_buckets,
        seen.in_flight
    )
}
