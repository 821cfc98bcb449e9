//! The nemesis: lands the plan's faults at their planned times and brings every killed
//! process back `down_ms` later (faults may overlap: Redis killed while the worker is down),
//! writing down when each thing really happened.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::plan::{Fault, Plan, RedisKeeps, Target};
use super::procs::{Cluster, Stack, ADMIN};

/// How long after a loss (and every outage around it) the running reconcilers get to rebuild
/// the sale and name what was lost: a few 500 ms reconcile intervals.
const REPORT_GRACE_MS: u64 = 3_000;

/// What the nemesis did, with times in ms after the workload started.
#[derive(Debug, Default)]
pub struct Timeline {
    pub lines: Vec<String>,
    /// (instance, when) of every kill -9 of a serve instance: its loss journal died there.
    pub serve_kills: Vec<(usize, u64)>,
    /// When a hot copy may have been lost: a kill of a Redis that keeps nothing, a forced warm.
    pub losses: Vec<u64>,
    /// (from, to) of every process's downtime.
    pub downs: Vec<(u64, u64)>,
}

impl Timeline {
    pub fn note(&mut self, start: Instant, what: String) {
        let at = start.elapsed().as_millis();
        self.lines.push(format!("  at {at:>5} ms: {what}"));
    }

    /// Whether an order `instance` accepted at `sent_ms` or later could not be reported lost
    /// because its journal died: the instance was killed after that, and no later than the
    /// first loss after it could have been reported (the loss, every outage around it, then
    /// `REPORT_GRACE_MS`).
    pub fn journal_died(&self, instance: usize, sent_ms: u64) -> bool {
        let Some(loss) = self.losses.iter().copied().filter(|&l| l >= sent_ms).min() else {
            return false;
        };
        let around = |&&(from, to): &&(u64, u64)| from <= loss + REPORT_GRACE_MS && to >= loss;
        let healed = self.downs.iter().filter(around).map(|d| d.1).max();
        let deadline = healed.unwrap_or(loss).max(loss) + REPORT_GRACE_MS;
        self.serve_kills
            .iter()
            .any(|&(i, t)| i == instance && (sent_ms..=deadline).contains(&t))
    }

    pub fn now(start: Instant) -> u64 {
        start.elapsed().as_millis() as u64
    }
}

/// One thing the nemesis does at one time.
#[derive(Debug, Clone, Copy)]
enum Action {
    Kill(Target),
    Heal(Target),
    Other(Fault),
}

/// The plan's steps as kills, heals and other faults in time order. A kill that lands while
/// its target is still down from an earlier one extends that downtime: each target's down
/// intervals are merged, so every kill has exactly one heal, after it.
fn actions(plan: &Plan) -> Vec<(u64, Action)> {
    let mut all = Vec::new();
    let mut downs: HashMap<Target, Vec<(u64, u64)>> = HashMap::new();
    for s in &plan.steps {
        match s.fault {
            Fault::Kill { target, down_ms } => {
                downs
                    .entry(target)
                    .or_default()
                    .push((s.at_ms, s.at_ms + down_ms));
            }
            other => all.push((s.at_ms, Action::Other(other))),
        }
    }
    for (target, mut spans) in downs {
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (from, to) in spans {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        for (from, to) in merged {
            all.push((from, Action::Kill(target)));
            all.push((to, Action::Heal(target)));
        }
    }
    // Stable, and kills sort before heals at one time: a zero-length downtime still kills.
    all.sort_by_key(|(at, a)| (*at, matches!(a, Action::Heal(_))));
    all
}

const BACKENDS: [Target; 3] = [Target::Redis, Target::HotRedis, Target::MariaDb];

/// Which processes are down, and which of them wait to come back: `flashsale` processes do
/// not start without Redis and MariaDB, so their heal waits for both.
#[derive(Default)]
struct Down {
    /// Each process down now, since when (ms).
    now: HashMap<Target, u64>,
    waiting: Vec<Target>,
}

impl Down {
    fn backends_up(&self) -> bool {
        BACKENDS.iter().all(|b| !self.now.contains_key(b))
    }

    /// Brought back: its downtime goes to the timeline.
    fn healed(&mut self, target: Target, start: Instant, t: &mut Timeline) {
        if let Some(from) = self.now.remove(&target) {
            t.downs.push((from, Timeline::now(start)));
        }
    }
}

pub async fn run(plan: &Plan, cluster: &mut Cluster, start: Instant) -> Timeline {
    let mut t = Timeline::default();
    let mut down = Down::default();
    for (at_ms, action) in actions(plan) {
        // The schedule: wait for the planned time (a late action runs at once).
        tokio::time::sleep_until((start + Duration::from_millis(at_ms)).into()).await;
        match action {
            Action::Kill(target) => {
                // Still down (its heal waits for the backends): nothing to kill.
                if let Entry::Vacant(slot) = down.now.entry(target) {
                    slot.insert(Timeline::now(start));
                    kill(target, cluster, start, &mut t);
                    let redis = matches!(target, Target::Redis | Target::HotRedis);
                    if redis && plan.redis == RedisKeeps::Nothing {
                        t.losses.push(Timeline::now(start));
                    }
                }
            }
            Action::Other(other) => apply(other, cluster, start, &down, &mut t).await,
            Action::Heal(target) => {
                heal_when_possible(target, cluster, start, &mut down, &mut t).await
            }
        }
    }
    // Everything back before the run quiesces: the backends first.
    let rest: Vec<Target> = BACKENDS
        .into_iter()
        .chain(down.now.keys().copied())
        .collect();
    for target in rest {
        heal_when_possible(target, cluster, start, &mut down, &mut t).await;
    }
    t
}

async fn heal_when_possible(
    target: Target,
    cluster: &mut Cluster,
    start: Instant,
    down: &mut Down,
    t: &mut Timeline,
) {
    if !down.now.contains_key(&target) || down.waiting.contains(&target) {
        return;
    }
    let backend = BACKENDS.contains(&target);
    if !backend && !down.backends_up() {
        down.waiting.push(target);
        return;
    }
    heal(target, cluster, start, t).await;
    down.healed(target, start, t);
    if backend && down.backends_up() {
        for waiting in std::mem::take(&mut down.waiting) {
            heal(waiting, cluster, start, t).await;
            down.healed(waiting, start, t);
        }
    }
}

fn kill(target: Target, cluster: &mut Cluster, start: Instant, t: &mut Timeline) {
    match target {
        Target::Redis => cluster.redis.kill(),
        Target::HotRedis => cluster.hot.as_mut().expect("a hot Redis").kill(),
        Target::Serve(i) => {
            cluster.serves[i].kill();
            t.serve_kills.push((i, Timeline::now(start)));
        }
        Target::Worker => cluster.worker.kill(),
        Target::MariaDb => cluster.db.kill(),
    }
    t.note(start, format!("{target:?} killed"));
}

async fn heal(target: Target, cluster: &mut Cluster, start: Instant, t: &mut Timeline) {
    match target {
        Target::Redis => cluster.redis.start().await,
        Target::HotRedis => cluster.hot.as_mut().expect("a hot Redis").start().await,
        Target::Serve(i) => {
            cluster.serves[i].start();
            cluster.ready(i).await;
        }
        Target::Worker => cluster.worker.start(),
        Target::MariaDb => cluster.db.start().await,
    }
    t.note(start, format!("{target:?} back"));
}

async fn apply(fault: Fault, cluster: &mut Cluster, start: Instant, down: &Down, t: &mut Timeline) {
    match fault {
        Fault::Kill { .. } => unreachable!("kills are handled with their heals"),
        Fault::ForcedWarm { sku } => {
            // Through an instance that is up, so that the warm lands.
            let up = usize::from(down.now.contains_key(&Target::Serve(0)));
            let url = format!("{}/api/v1/sales/{sku}/warm?force=true", cluster.base(up));
            t.losses.push(Timeline::now(start));
            let status = admin_post(cluster, &url).await;
            t.note(start, format!("forced warm of sale {sku}: HTTP {status}"));
        }
        Fault::RacingRepairCli => {
            let args = ["reconcile", "--repair"];
            let (a, b) = tokio::join!(cluster.cli(&args), cluster.cli(&args));
            t.note(
                start,
                format!(
                    "two `reconcile --repair` raced: exit {:?} and {:?}",
                    a.code, b.code
                ),
            );
        }
        Fault::RacingRepairAdmin { sku } => {
            let path = format!("/api/v1/admin/reconcile/{sku}/repair");
            let (u0, u1) = (cluster.base(0) + &path, cluster.base(1) + &path);
            let (a, b) = tokio::join!(admin_post(cluster, &u0), admin_post(cluster, &u1));
            t.note(
                start,
                format!("admin repair of sale {sku} on both instances: HTTP {a} and {b}"),
            );
        }
    }
}

/// An admin POST; 0 when no answer came.
pub async fn admin_post(cluster: &impl Stack, url: &str) -> u16 {
    match cluster.http().post(url).bearer_auth(ADMIN).send().await {
        Ok(resp) => resp.status().as_u16(),
        Err(_) => 0,
    }
}

#[test]
fn a_kill_while_down_extends_the_downtime() {
    use super::plan::Step;
    let mut plan = Plan::from_seed(1);
    let kill = |at_ms, down_ms| Step {
        at_ms,
        fault: Fault::Kill {
            target: Target::Worker,
            down_ms,
        },
    };
    plan.steps = vec![kill(100, 500), kill(300, 1_000), kill(2_000, 0)];
    let times: Vec<(u64, bool)> = actions(&plan)
        .iter()
        .map(|(at, a)| (*at, matches!(a, Action::Kill(_))))
        .collect();
    let expected = [(100, true), (1_300, false), (2_000, true), (2_000, false)];
    assert_eq!(times, expected);
}
