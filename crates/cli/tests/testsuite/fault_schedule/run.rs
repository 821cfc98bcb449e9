//! One seed end to end: start, sell under faults, quiesce, read MariaDB, check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::checker::{self, Facts, Failure, Verdict};
use super::db::Stored;
use super::nemesis::{self, Timeline};
use super::plan::Plan;
use super::procs::{Cluster, Stack, ADMIN};
use super::{db, probe, workload};

/// How long the running reconcilers get to bring every sale to diff 0 after the workload.
const SETTLE_LIMIT: Duration = Duration::from_secs(15);
/// How long a warm answered 503 is asked again before the seed fails.
const WARM_LIMIT: Duration = Duration::from_secs(10);
/// How long after the harness's own `reconcile --repair`, when they did not.
const REPAIRED_LIMIT: Duration = Duration::from_secs(8);

/// One seed's run, whichever schedule drove it: its plan (`P`), what happened, the verdict.
pub struct Outcome<P> {
    pub plan: P,
    pub timeline: Timeline,
    pub verdict: Verdict,
    pub answers: usize,
    /// What the schedule drew and met beyond its plan, when it says (the cluster's does).
    pub drawn: Option<String>,
}

pub async fn run_seed(seed: u64) -> Outcome<Plan> {
    let plan = Plan::from_seed(seed);
    print!("{plan}");
    let t0 = Instant::now();
    let mut cluster = Cluster::start(&plan).await;
    create_sales(&cluster, &plan).await;
    let up_s = t0.elapsed().as_secs_f64();
    let sold = sell_under_faults(&plan, &mut cluster).await;
    let t1 = Instant::now();
    let reconciled = quiesce(&cluster, &plan).await;
    let settle_s = t1.elapsed().as_secs_f64();
    let stored = db::read(&cluster.db_url).await;
    let hot_copy_lost = plan.may_lose_hot_copy();
    let phases = [up_s, plan.workload_ms as f64 / 1000.0, settle_s];
    let drawn = match plan.sales.iter().find(|s| s.buckets > 1) {
        Some(sale) => format!("bucketed: transfers {}", transfers(&stored, sale.sku)),
        None => "bucketed: no".into(),
    };
    let mut outcome = judge(plan, sold, &stored, hot_copy_lost, reconciled, phases);
    outcome.drawn = Some(drawn);
    (cluster.events)
        .judge(&cluster, &cluster.db_url, &mut outcome.verdict)
        .await;
    keep_logs(&mut outcome, "loopback", seed, cluster.logs_dir());
    outcome
}

/// When `FLASHSALE_KEEP_LOGS` names a directory and the seed failed, copies its processes'
/// logs (which the run's temporary directory takes with it) to `<dir>/<schedule>-seed-<seed>/`.
pub fn keep_logs<P>(outcome: &mut Outcome<P>, schedule: &str, seed: u64, from: &std::path::Path) {
    let Some(dir) = std::env::var_os("FLASHSALE_KEEP_LOGS") else {
        return;
    };
    if outcome.verdict.failures.is_empty() {
        return;
    }
    let to = std::path::Path::new(&dir).join(format!("{schedule}-seed-{seed}"));
    std::fs::create_dir_all(&to).expect("the logs' directory");
    for entry in std::fs::read_dir(from).into_iter().flatten().flatten() {
        if entry.path().extension().is_some_and(|e| e == "log") {
            let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
        }
    }
    let kept = format!("logs kept in {}", to.display());
    outcome.verdict.notes.push(kept);
}

/// How many transfers of sale `sku` the database stored (a side or both).
pub fn transfers(stored: &Stored, sku: u64) -> usize {
    let ids: std::collections::BTreeSet<&str> = (stored.transfers.iter())
        .filter(|t| t.sku_id.0 == sku)
        .map(|t| t.id.as_str())
        .collect();
    ids.len()
}

/// The checker's verdict on a run (plus what broke while selling, the answers met and the
/// phases' lengths, start, workload and settle, in seconds).
pub fn judge<P>(
    plan: P,
    sold: Sold,
    stored: &Stored,
    hot_copy_lost: bool,
    reconciled: Result<(), String>,
    [up_s, sell_s, settle_s]: [f64; 3],
) -> Outcome<P> {
    let mut verdict = checker::check(&Facts {
        answers: &sold.answers,
        stored,
        timeline: &sold.timeline,
        hot_copy_lost,
        reconciled,
    });
    verdict.failures.extend(sold.failures);
    verdict.notes.push(answer_counts(&sold.answers));
    verdict.notes.push(format!(
        "phases: start {up_s:.1}s, workload {sell_s:.1}s, settle {settle_s:.1}s"
    ));
    Outcome {
        answers: sold.answers.len(),
        plan,
        timeline: sold.timeline,
        verdict,
        drawn: None,
    }
}

/// What the selling phase left: every answer (the probes' too), what the nemesis did, and
/// what already broke (a process that died by itself, a sale that did not come back).
pub struct Sold {
    pub answers: Vec<workload::Answer>,
    pub timeline: Timeline,
    pub failures: Vec<Failure>,
}

/// The workload and the nemesis together for the plan's length, then everything back and
/// every sale probed.
async fn sell_under_faults(plan: &Plan, cluster: &mut Cluster) -> Sold {
    let start = Instant::now();
    let selling = Selling::start(cluster, 2, plan, start);
    let timeline = nemesis::run(plan, cluster, start).await;
    // The schedule's end: the workload runs its planned length, faults or not.
    tokio::time::sleep_until((start + Duration::from_millis(plan.workload_ms)).into()).await;
    selling.finish(cluster, plan, timeline).await
}

/// The workload running on a stack's instances.
pub struct Selling {
    caller: workload::Caller,
    stop: Arc<AtomicBool>,
    clients: tokio::task::JoinHandle<Vec<workload::Answer>>,
}

impl Selling {
    /// Starts `plan`'s clients on the first `instances` serve instances of `stack`.
    pub fn start(stack: &impl Stack, instances: usize, plan: &Plan, start: Instant) -> Selling {
        let stop = Arc::new(AtomicBool::new(false));
        let bases = (0..instances).map(|i| stack.base(i)).collect();
        let caller = workload::Caller::new(bases, stack.http().clone(), start);
        let clients = workload::run(Arc::new(plan.clone()), caller.clone(), stop.clone());
        Selling {
            caller,
            stop,
            clients: tokio::spawn(clients),
        }
    }

    /// Stops the clients, starts again every process that died by itself (a failure each)
    /// and probes every sale.
    pub async fn finish(self, stack: &mut impl Stack, plan: &Plan, timeline: Timeline) -> Sold {
        self.stop.store(true, Ordering::Relaxed);
        let mut answers = self.clients.await.expect("the workload panicked");
        let mut failures: Vec<Failure> = (stack.revive_crashed().await)
            .into_iter()
            .map(|detail| Failure {
                check: "no-crash",
                detail,
            })
            .collect();
        let (probes, not_back) = probe::sales_back(plan, &self.caller).await;
        answers.extend(probes);
        failures.extend(not_back);
        Sold {
            answers,
            timeline,
            failures,
        }
    }
}

/// `requests: N; 202 x, 409 SOLD_OUT y, …, none z`: what the workload met.
pub fn answer_counts(answers: &[workload::Answer]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for a in answers {
        let label = match (a.status, &a.code) {
            (0, _) => "none".to_owned(),
            (s, Some(code)) => format!("{s} {code}"),
            (s, None) => s.to_string(),
        };
        *counts.entry(label).or_default() += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
    format!("requests: {} ({})", answers.len(), parts.join(", "))
}

pub async fn create_sales(cluster: &impl Stack, plan: &Plan) {
    let base = cluster.base(0);
    for s in &plan.sales {
        let mut body = json!({"sku_id": s.sku, "name": format!("sale{}", s.sku),
            "total_stock": s.stock, "per_user_limit": s.per_user_limit, "buckets": s.buckets});
        if let Some(t) = s.payment_timeout_ms {
            body["mode"] = json!("reserve");
            body["payment_timeout_ms"] = json!(t);
        }
        let created = cluster
            .http()
            .post(format!("{base}/api/v1/sales"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await;
        let status = created.map(|r| r.status().as_u16()).unwrap_or(0);
        assert_eq!(status, 201, "create sale {}", s.sku);
        let url = format!("{base}/api/v1/sales/{}/warm", s.sku);
        assert_eq!(warm(cluster, &url).await, 200, "warm sale {}", s.sku);
    }
}

/// A warm's status: 503 (a cluster just formed, a slow node) is asked again, as an operator
/// would, for at most `WARM_LIMIT`; any other answer is final.
async fn warm(cluster: &impl Stack, url: &str) -> u16 {
    let last = Mutex::new(0);
    let every = Duration::from_millis(200);
    let done = flashsale_testkit::wait::within_every(WARM_LIMIT, every, || async {
        let status = nemesis::admin_post(cluster, url).await;
        *last.lock().unwrap() = status;
        (status != 503).then_some(status)
    })
    .await;
    done.unwrap_or_else(|| last.into_inner().unwrap())
}

/// Everything is running again; waits until `flashsale reconcile` (no repair) exits 0 with
/// nothing in flight for every sale. When the running reconcilers do not get there, the
/// harness runs `reconcile --repair` itself (so the other checks see a settled database) and
/// still reports that they did not.
pub async fn quiesce(cluster: &impl Stack, plan: &Plan) -> Result<(), String> {
    if settled(cluster, plan, SETTLE_LIMIT).await.is_ok() {
        return Ok(());
    }
    // One more look: the last poll of the wait may have come just before it settled.
    let first = match settled(cluster, plan, Duration::ZERO).await {
        Ok(()) => return Ok(()),
        Err(why) => why,
    };
    let repair = cluster.cli(&["reconcile", "--repair"]).await;
    let after = match settled(cluster, plan, REPAIRED_LIMIT).await {
        Ok(()) => "reconciled after the harness's `reconcile --repair`".to_owned(),
        Err(why) => format!(
            "still not after the harness's `reconcile --repair` (exit {:?}): {why}",
            repair.code
        ),
    };
    Err(format!(
        "not reconciled {SETTLE_LIMIT:?} after the workload: {first}; {after}"
    ))
}

/// Polls until every sale reconciles drained, as `flashsale reconcile` sees it and as every
/// serving instance sees it (`GET /admin/reconcile`: its ledger routes hot sales, and its run
/// reports what its own journal promised and the database lacks), or says why not.
async fn settled(cluster: &impl Stack, plan: &Plan, limit: Duration) -> Result<(), String> {
    let last = Mutex::new(String::new());
    let ok = flashsale_testkit::wait::within_every(limit, Duration::from_millis(200), || async {
        let verdict = match cli_reconciled(cluster, plan).await {
            Ok(()) => instance_reconciled(cluster, plan).await,
            Err(why) => Err(why),
        };
        match verdict {
            Ok(()) => Some(()),
            Err(why) => {
                *last.lock().unwrap() = why;
                None
            }
        }
    })
    .await;
    ok.ok_or_else(|| last.into_inner().unwrap())
}

async fn cli_reconciled(cluster: &impl Stack, plan: &Plan) -> Result<(), String> {
    let run = cluster.cli(&["reconcile"]).await;
    let verdict = drained(&run.stdout, plan.sales.len());
    match (verdict, run.code) {
        (Ok(()), Some(0)) => Ok(()),
        (verdict, code) => {
            let why = verdict.err().unwrap_or_else(|| clip(&run.stderr, 300));
            Err(format!("`flashsale reconcile` exit {code:?}: {why}"))
        }
    }
}

/// Every instance, not only one: each journal names only the losses its own instance
/// answered, and the run that reports them may be an instance's own pass that has not come
/// round yet.
async fn instance_reconciled(cluster: &impl Stack, plan: &Plan) -> Result<(), String> {
    for i in 0..cluster.instances() {
        let url = format!("{}/api/v1/admin/reconcile", cluster.base(i));
        let resp = cluster.http().get(&url).bearer_auth(ADMIN).send().await;
        let body = match resp {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => return Err(format!("GET /admin/reconcile on instance {i}: {e}")),
        };
        drained(&body, plan.sales.len())
            .map_err(|why| format!("GET /admin/reconcile on instance {i}: {why}"))?;
    }
    Ok(())
}

/// Every sale's report ok with nothing in flight; else the reports that are not, clipped.
fn drained(stdout: &str, sales: usize) -> Result<(), String> {
    let reports: Vec<Value> = serde_json::from_str(stdout).map_err(|_| clip(stdout, 300))?;
    let bad: Vec<String> = reports
        .iter()
        .filter(|r| r["ok"] != json!(true) || r["in_flight"] != json!(0))
        .map(|r| {
            let keep = [
                "sku_id",
                "ok",
                "in_flight",
                "hot_behind",
                "diff",
                "findings",
                "violations",
                "overdue_holds",
                "stale_pending",
            ];
            let short: serde_json::Map<String, Value> = keep
                .iter()
                .map(|k| (k.to_string(), r[*k].clone()))
                .collect();
            clip(&Value::Object(short).to_string(), 400)
        })
        .collect();
    if bad.is_empty() && reports.len() == sales {
        Ok(())
    } else {
        Err(format!(
            "{} reports for {sales} sales; not reconciled: {}",
            reports.len(),
            bad.join(" | ")
        ))
    }
}

pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
