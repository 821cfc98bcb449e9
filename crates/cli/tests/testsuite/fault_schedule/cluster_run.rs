//! One seed of the cluster schedule end to end: namespaces and processes up, sell under the
//! nemesis, quiesce, read MariaDB, and the loopback schedule's checker on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::checker::{self, Facts, Failure, Verdict};
use super::cluster_nemesis::{self, Seen};
use super::cluster_plan::{ClusterPlan, INSTANCES};
use super::cluster_procs::NsStack;
use super::db::Stored;
use super::nemesis::Timeline;
use super::procs::Stack;
use super::{db, probe, run, workload};

/// The workload goes on this long after the last fault healed: every sale sells again.
const TAIL: Duration = Duration::from_millis(1_000);

pub struct Outcome {
    pub plan: ClusterPlan,
    pub timeline: Timeline,
    pub verdict: Verdict,
    pub answers: usize,
    /// `WAIT on|off, partitions P, failovers F (primaries moved M), losses …`: drawn and met.
    pub drawn: String,
}

pub async fn run_seed(seed: u64) -> Outcome {
    let plan = ClusterPlan::from_seed(seed);
    print!("{plan}");
    let t0 = Instant::now();
    let mut stack = NsStack::start(&plan).await;
    run::create_sales(&stack, &plan.base).await;
    let up_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let sold = sell_under_faults(&plan, &mut stack).await;
    let sell_s = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let reconciled = run::quiesce(&stack, &plan.base).await;
    let settle_s = t2.elapsed().as_secs_f64();
    let stored = db::read(&stack.db_url).await;
    let mut verdict = checker::check(&Facts {
        answers: &sold.answers,
        stored: &stored,
        timeline: &sold.timeline,
        hot_copy_lost: plan.may_lose_hot_copy(),
        reconciled,
    });
    verdict.failures.extend(sold.failures);
    verdict.notes.push(run::answer_counts(&sold.answers));
    verdict.notes.push(format!(
        "phases: start {up_s:.1}s, workload {sell_s:.1}s, settle {settle_s:.1}s"
    ));
    verdict.notes.extend(sold.seen.unsettled.iter().cloned());
    Outcome {
        drawn: drawn(&plan, &sold.seen, &stored),
        answers: sold.answers.len(),
        plan,
        timeline: sold.timeline,
        verdict,
    }
}

struct Sold {
    answers: Vec<workload::Answer>,
    timeline: Timeline,
    seen: Seen,
    failures: Vec<Failure>,
}

/// The workload and the nemesis together, the workload at least its planned length and
/// `TAIL` past the last fault; then every process back and every sale probed.
async fn sell_under_faults(plan: &ClusterPlan, stack: &mut NsStack) -> Sold {
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let bases = (0..INSTANCES).map(|i| stack.base(i)).collect();
    let caller = workload::Caller::new(bases, stack.http.clone(), start);
    let clients = workload::run(Arc::new(plan.base.clone()), caller.clone(), stop.clone());
    let clients = tokio::spawn(clients);
    let (timeline, seen) = cluster_nemesis::run(plan, stack, start).await;
    let planned_end = start + Duration::from_millis(plan.workload_ms);
    tokio::time::sleep_until(planned_end.max(Instant::now() + TAIL).into()).await;
    stop.store(true, Ordering::Relaxed);
    let mut answers = clients.await.expect("the workload panicked");
    let mut failures: Vec<Failure> = (stack.revive_crashed().await)
        .into_iter()
        .map(|detail| Failure {
            check: "no-crash",
            detail,
        })
        .collect();
    let (probes, not_back) = probe::sales_back(&plan.base, &caller).await;
    answers.extend(probes);
    failures.extend(not_back);
    Sold {
        answers,
        timeline,
        seen,
        failures,
    }
}

/// What the run drew and what it met: WAIT, partitions, failovers (planned or provoked) and how
/// many primaries really moved, losses reported by the reconcilers.
fn drawn(plan: &ClusterPlan, seen: &Seen, stored: &Stored) -> String {
    let wait = if plan.wait_timeout_ms.is_some() {
        "on"
    } else {
        "off"
    };
    format!(
        "WAIT {wait}, partitions {}, failovers {} (primaries moved {}), losses reported: {} orders, {} resolutions",
        plan.partitions(),
        plan.failovers(),
        seen.primary_changes,
        stored.lost_orders.len(),
        stored.lost_resolutions.len()
    )
}
