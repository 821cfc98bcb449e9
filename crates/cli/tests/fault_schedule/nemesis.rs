//! The nemesis: lands the plan's faults at their planned times (each one over, everything
//! running again, before the next) and writes down when each really happened.

use std::time::{Duration, Instant};

use super::plan::{Fault, Plan};
use super::procs::{Cluster, ADMIN};

/// What the nemesis did, with times in ms after the workload started.
#[derive(Debug, Default)]
pub struct Timeline {
    pub lines: Vec<String>,
    /// (instance, when) of every kill -9 of a serve instance: its loss journal died there.
    pub serve_kills: Vec<(usize, u64)>,
    pub redis_kills: Vec<u64>,
}

impl Timeline {
    fn note(&mut self, start: Instant, what: String) {
        let at = start.elapsed().as_millis();
        self.lines.push(format!("  at {at:>5} ms: {what}"));
    }

    /// Whether `instance` was killed at or after `at_ms`.
    pub fn killed_after(&self, instance: usize, at_ms: u64) -> bool {
        self.serve_kills
            .iter()
            .any(|&(i, t)| i == instance && t >= at_ms)
    }
}

pub async fn run(plan: &Plan, cluster: &mut Cluster, start: Instant) -> Timeline {
    let mut timeline = Timeline::default();
    for step in &plan.steps {
        // The schedule: wait for the step's planned time (a late step runs at once).
        tokio::time::sleep_until((start + Duration::from_millis(step.at_ms)).into()).await;
        apply(step.fault, cluster, start, &mut timeline).await;
    }
    timeline
}

async fn apply(fault: Fault, cluster: &mut Cluster, start: Instant, t: &mut Timeline) {
    let ms = |start: Instant| start.elapsed().as_millis() as u64;
    match fault {
        Fault::RedisRestart => {
            cluster.redis.kill();
            t.redis_kills.push(ms(start));
            t.note(start, "redis killed".into());
            cluster.redis.start().await;
            t.note(start, "redis back".into());
        }
        Fault::ForcedWarm { sku } => {
            let url = format!("{}/api/v1/sales/{sku}/warm?force=true", cluster.base(0));
            let status = admin_post(cluster, &url).await;
            t.note(start, format!("forced warm of sale {sku}: HTTP {status}"));
        }
        Fault::ServeRestart { instance } => {
            cluster.serves[instance].kill();
            t.serve_kills.push((instance, ms(start)));
            t.note(start, format!("serve{instance} killed"));
            cluster.restart_serve(instance).await;
            t.note(start, format!("serve{instance} back"));
        }
        Fault::WorkerRestart => {
            cluster.restart_worker();
            t.note(start, "worker killed and restarted".into());
        }
        Fault::MariaDbRestart => {
            cluster.db.kill();
            t.note(start, "mariadb killed".into());
            cluster.db.start().await;
            t.note(start, "mariadb back".into());
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
pub async fn admin_post(cluster: &Cluster, url: &str) -> u16 {
    match cluster.http.post(url).bearer_auth(ADMIN).send().await {
        Ok(resp) => resp.status().as_u16(),
        Err(_) => 0,
    }
}
