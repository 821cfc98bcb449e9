//! After the faults: every sale must be back on every instance. A probe buyer per sale and
//! instance retries one purchase (same request id) until it gets a final answer — accepted,
//! or refused for stock or limit — and a sale that still answers NOT_STARTED or 503 is one
//! whose hot copy was never rebuilt where the instances look for it.

use std::sync::Mutex;
use std::time::Duration;

use super::checker::Failure;
use super::plan::Plan;
use super::workload::{Answer, Attempt, Caller};

/// How long a sale gets to come back after the last fault healed.
const BACK_LIMIT: Duration = Duration::from_secs(10);

/// Probe answers (recorded like the workload's) and the sales that did not come back. All
/// probes run at once, so the wait is one `BACK_LIMIT` at most.
pub async fn sales_back(plan: &Plan, caller: &Caller) -> (Vec<Answer>, Vec<Failure>) {
    let probes = plan.sales.iter().flat_map(|sale| {
        (0..caller.bases.len()).map(move |instance| {
            let attempt = Attempt {
                sku: sale.sku,
                // Beyond the workload's buyers, one per sale and instance.
                user: plan.buyers + 1 + sale.sku * 2 + instance as u64,
                request_id: format!("probe-s{}-{}-{instance}", plan.seed, sale.sku),
                quantity: 1,
            };
            async move { (instance, probe(caller, instance, &attempt).await) }
        })
    });
    let mut answers = Vec::new();
    let mut failures = Vec::new();
    for (instance, (tries, last)) in futures::future::join_all(probes).await {
        if !is_final(&last) {
            let code = last.code.as_deref().unwrap_or("");
            failures.push(Failure {
                check: "sale-back",
                detail: format!(
                    "sale {} on instance {instance} still answers {} {code} {BACK_LIMIT:?} after the faults",
                    last.sku, last.status
                ),
            });
        }
        answers.extend(tries);
        answers.push(last);
    }
    (answers, failures)
}

/// Retries one purchase until a final answer or `BACK_LIMIT`; every try is returned.
async fn probe(caller: &Caller, instance: usize, attempt: &Attempt) -> (Vec<Answer>, Answer) {
    let tries = Mutex::new(Vec::new());
    let last =
        flashsale_testkit::wait::within_every(BACK_LIMIT, Duration::from_millis(100), || async {
            let answer = caller.purchase(instance, attempt).await;
            if is_final(&answer) {
                return Some(answer);
            }
            tries.lock().unwrap().push(answer);
            None
        })
        .await;
    let mut tries = tries.into_inner().unwrap();
    match last {
        Some(answer) => (tries, answer),
        None => {
            let last = tries.pop().expect("at least one try");
            (tries, last)
        }
    }
}

/// Accepted, or refused for a reason of the sale itself (not of its hot copy's absence).
fn is_final(a: &Answer) -> bool {
    a.status == 202 || matches!(a.code.as_deref(), Some("SOLD_OUT" | "LIMIT_EXCEEDED"))
}
