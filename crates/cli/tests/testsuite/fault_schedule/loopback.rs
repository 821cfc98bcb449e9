//! A seeded fault schedule (in the spirit of Jepsen's nemesis and TigerBeetle's VOPR) that
//! checks I1–I8 end to end, black-box, with real processes: one throwaway MariaDB and Redis
//! (its persistence drawn from the seed), two `flashsale serve` and one `flashsale worker`.
//! Seeded clients buy, retry, pay and cancel over HTTP while seeded faults land — kill -9 of
//! Redis, a serve instance, the worker or MariaDB, a forced re-warm, racing repairs. After
//! the run quiesces, the rows in MariaDB are checked against every answer the clients got:
//!
//! - **no order number twice**: one request per answered order number, and the database
//!   agrees whose it is; `stock_events` deducts each at most once;
//! - **no acked loss**: every accepted purchase is in `orders`, or reported lost by number
//!   where a hot copy was lost — a Redis that keeps nothing killed; a forced warm drains its
//!   copy first and may lose nothing (a loss
//!   that died with its instance's journal is the documented limit: counted and printed, not
//!   failed);
//! - **paid kept**: every 200 PAID is PAID in `orders` or reported as a lost resolution;
//! - **I1–I7** per sale (`check_sale`, drained), no guard rejection, I4 from the answers;
//! - **I8**: `(epoch, seq)` of stored events unique, one user per order number;
//! - **sale back**: after the faults every sale takes a purchase again on every instance;
//! - **diff 0**: `flashsale reconcile` exits 0 with nothing in flight.
//!
//! The same seed draws the same schedule (printed up front). Seeds: `FLASHSALE_SEEDS` (a
//! comma list and/or ranges `a..b`, `a..=b`), else a few CI seeds. Replay one:
//! `FLASHSALE_SEEDS=<seed> cargo test -p flashsale --test testsuite fault_schedule::loopback -- --nocapture`;
//! soak many: `scripts/soak.sh N`.

use std::time::Instant;

use super::checker::Verdict;
use super::run::{clip, Outcome};
use super::{plan, run, seeds};

/// Failure lines shown per check: a broken run must not print a million lines.
const LINES_PER_CHECK: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_fault_schedules_keep_i1_to_i8() {
    let seeds = seeds::from_env();
    seeds::run_all("fault_schedule", &seeds, run_one, replay).await;
}

/// Runs one seed; prints a passing one, returns a failing one's report.
async fn run_one(seed: u64) -> Option<String> {
    let started = Instant::now();
    // Its own task: a panic in one seed (processes killed on unwind) is that seed's failure,
    // and the next seed still runs.
    let result = tokio::spawn(run::run_seed(seed)).await;
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok(outcome) if outcome.verdict.failures.is_empty() => {
            println!("{}", outcome.timeline.lines.join("\n"));
            let notes = notes(&outcome.verdict);
            println!("fault_schedule seed {seed}: PASS in {secs:.1}s; {notes}");
            None
        }
        Ok(outcome) => Some(failure_report(seed, secs, &outcome)),
        Err(e) => {
            let why = e.try_into_panic().map(panic_text);
            let why = why.unwrap_or_else(|e| e.to_string());
            let plan = plan::Plan::from_seed(seed);
            let why = clip(&why, 2_000);
            Some(format!("fault_schedule seed {seed}: FAIL in {secs:.1}s\nseed {seed} FAIL [harness] {why}\n{plan}"))
        }
    }
}

fn replay(seed: u64) -> String {
    format!("replay: FLASHSALE_SEEDS={seed} cargo test -p flashsale --test testsuite fault_schedule::loopback -- --nocapture")
}

fn notes(v: &Verdict) -> String {
    v.notes.join("; ")
}

/// The seed, the whole schedule as planned and as it happened, and what broke (bounded).
fn failure_report(seed: u64, secs: f64, o: &Outcome) -> String {
    let mut lines = vec![format!(
        "fault_schedule seed {seed}: FAIL in {secs:.1}s ({} requests); failed: {}",
        o.answers,
        o.verdict.failed_checks().join(", ")
    )];
    for check in o.verdict.failed_checks() {
        let all: Vec<_> = o
            .verdict
            .failures
            .iter()
            .filter(|f| f.check == check)
            .collect();
        for f in all.iter().take(LINES_PER_CHECK) {
            lines.push(format!(
                "seed {seed} FAIL [{check}] {}",
                clip(&f.detail, 600)
            ));
        }
        if all.len() > LINES_PER_CHECK {
            lines.push(format!(
                "seed {seed} FAIL [{check}] … and {} more",
                all.len() - LINES_PER_CHECK
            ));
        }
    }
    lines.push(format!("notes: {}", notes(&o.verdict)));
    lines.push(format!(
        "schedule as planned:\n{}",
        o.plan.to_string().trim_end()
    ));
    lines.push(format!("as it happened:\n{}", o.timeline.lines.join("\n")));
    lines.join("\n")
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    match p.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => p
            .downcast_ref::<&str>()
            .map_or("(no message)".into(), |s| s.to_string()),
    }
}
