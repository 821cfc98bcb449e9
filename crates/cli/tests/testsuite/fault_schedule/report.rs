//! What one seed of either schedule prints: a line when it passes, a bounded report when it
//! fails (a panic included).

use std::fmt::Display;
use std::future::Future;
use std::time::Instant;

use super::run::{clip, Outcome};

/// Failure lines shown per check: a broken run must not print a million lines.
const LINES_PER_CHECK: usize = 6;

/// Runs seed `seed` of schedule `name` in its own task (a panic is that seed's failure: its
/// processes and namespaces go on unwind, and the next seed still runs); prints a passing one,
/// returns a failing one's report. `plan_of` draws the seed's plan again for a panic's report.
pub async fn run_one<P, F>(name: &str, seed: u64, run: F, plan_of: fn(u64) -> P) -> Option<String>
where
    P: Display + Send + 'static,
    F: Future<Output = Outcome<P>> + Send + 'static,
{
    let started = Instant::now();
    let result = tokio::spawn(run).await;
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok(o) if o.verdict.failures.is_empty() => {
            println!("{}", o.timeline.lines.join("\n"));
            let notes = o.verdict.notes.join("; ");
            let drawn = drawn(&o);
            println!("{name} seed {seed}: PASS in {secs:.1}s; {drawn}{notes}");
            None
        }
        Ok(o) => Some(failure_report(name, seed, secs, &o)),
        Err(e) => {
            let why = e.try_into_panic().map(panic_text);
            let why = clip(&why.unwrap_or_else(|e| e.to_string()), 2_000);
            let plan = plan_of(seed);
            Some(format!(
                "{name} seed {seed}: FAIL in {secs:.1}s\nseed {seed} FAIL [harness] {why}\n{plan}"
            ))
        }
    }
}

/// `<drawn>; ` where the schedule says what it drew, else nothing.
fn drawn<P>(o: &Outcome<P>) -> String {
    o.drawn
        .as_ref()
        .map(|d| format!("{d}; "))
        .unwrap_or_default()
}

/// The seed, what it drew, what broke (bounded), the schedule as planned and as it happened.
fn failure_report<P: Display>(name: &str, seed: u64, secs: f64, o: &Outcome<P>) -> String {
    let checks = o.verdict.failed_checks();
    let mut lines = vec![format!(
        "{name} seed {seed}: FAIL in {secs:.1}s ({} requests); {}failed: {}",
        o.answers,
        drawn(o),
        checks.join(", ")
    )];
    for check in checks {
        let all: Vec<_> = (o.verdict.failures.iter())
            .filter(|f| f.check == check)
            .collect();
        for f in all.iter().take(LINES_PER_CHECK) {
            lines.push(format!(
                "seed {seed} FAIL [{check}] {}",
                clip(&f.detail, 600)
            ));
        }
        if all.len() > LINES_PER_CHECK {
            let more = all.len() - LINES_PER_CHECK;
            lines.push(format!("seed {seed} FAIL [{check}] … and {more} more"));
        }
    }
    lines.push(format!("notes: {}", o.verdict.notes.join("; ")));
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
        Err(p) => (p.downcast_ref::<&str>()).map_or("(no message)".into(), |s| s.to_string()),
    }
}
