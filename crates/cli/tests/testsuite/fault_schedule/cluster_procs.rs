//! The processes of one cluster run, each in a network namespace of its own on one [`Net`]:
//! six Redis Cluster nodes, two `flashsale serve`, one `flashsale worker`. MariaDB and the
//! one-shot CLI runs stay in the root namespace (MariaDB bound to the root's address on the
//! bridge, which is never partitioned). Fields drop in order: processes first, then the net.

use std::net::Ipv4Addr;
use std::time::Duration;

use flashsale_testkit::mariadb::MariaDbServer;
use flashsale_testkit::netns::{Host, Net};
use flashsale_testkit::process::Proc;
use flashsale_testkit::redis_cluster_ns::NsRedisCluster;
use tempfile::TempDir;

use super::cluster_plan::{ClusterPlan, INSTANCES};
use super::events_relay::Relayed;
use super::procs::{self, CliRun, Stack, ADMIN, SECRET};

/// The cluster's node timeout: a primary cut off this long is failed over.
pub const NODE_TIMEOUT_MS: u64 = 1_000;
/// Every instance's HTTP port (each in its own namespace).
const SERVE_PORT: u16 = 8080;
const WORKER_PORT: u16 = 8081;
const RECONCILE_INTERVAL_MS: &str = "500";
const READY_LIMIT: Duration = Duration::from_secs(30);

pub struct NsStack {
    pub serves: Vec<Proc>,
    pub worker: Proc,
    pub redis: NsRedisCluster,
    /// Held for its lifetime: the stack's MariaDB stops when the stack is dropped.
    _db: MariaDbServer,
    pub db_url: String,
    pub http: reqwest::Client,
    /// The NATS the processes' order-event relays publish to (on the bridge's root address).
    pub events: Relayed,
    /// serve0, serve1, worker.
    pub hosts: Vec<Host>,
    env: Vec<(String, String)>,
    dir: TempDir,
    /// Last: every namespace, link and partition goes after the processes in it.
    pub net: Net,
}

impl NsStack {
    pub async fn start(plan: &ClusterPlan) -> NsStack {
        let mut net = Net::new();
        let redis = NsRedisCluster::spawn(&mut net, NODE_TIMEOUT_MS, plan.late_replica).await;
        let db = MariaDbServer::spawn_on(&net.root_addr().to_string()).await;
        procs::create_database(&db.url()).await;
        let db_url = format!("{}/flashsale", db.url());
        let dir = tempfile::tempdir().expect("temp dir");
        let events = Relayed::spawn_on(&net.root_addr().to_string()).await;
        let mut env = shared_env(&redis, &db_url, plan);
        env.extend(events.vars());
        let hosts: Vec<Host> = ["s0", "s1", "w"].map(|n| net.add_host(n)).to_vec();
        let serves = (0..INSTANCES)
            .map(|i| flashsale(&net, &hosts[i], &format!("serve{i}"), &env, dir.path()))
            .collect();
        let worker = flashsale(&net, &hosts[2], "worker", &env, dir.path());
        let mut stack = NsStack {
            serves,
            worker,
            redis,
            _db: db,
            db_url,
            http: procs::http_client(),
            events,
            hosts,
            env,
            dir,
            net,
        };
        stack.migrate().await;
        stack.worker.start();
        for i in 0..INSTANCES {
            stack.serves[i].start();
            stack.ready(i).await;
        }
        stack
    }

    async fn migrate(&self) {
        let run = self.cli(&["migrate"]).await;
        let why = run.stderr.lines().last().unwrap_or_default().to_owned();
        assert_eq!(run.code, Some(0), "flashsale migrate failed: {why}");
    }

    pub fn instance_addr(&self, i: usize) -> Ipv4Addr {
        self.hosts[i].addr
    }

    /// Waits until instance `i` answers `/readyz` 200; panics with its log's tail if never.
    pub async fn ready(&self, i: usize) {
        if !self.ready_within(i, READY_LIMIT).await {
            let tail = self.serves[i].log_tail(20);
            panic!("serve{i} never became ready; its log ends:\n{tail}");
        }
    }

    pub async fn ready_within(&self, i: usize, limit: Duration) -> bool {
        let url = format!("{}/readyz", self.base(i));
        procs::answers_200(&self.http, &url, limit).await
    }

    /// Where every process's `<name>.log` is.
    pub fn logs_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Processes that died by themselves, started again so that the run can be checked.
    pub async fn revive_crashed(&mut self) -> Vec<String> {
        let crashed = procs::restart_exited(self.serves.iter_mut().chain([&mut self.worker]));
        for i in 0..INSTANCES {
            self.ready(i).await;
        }
        crashed
    }
}

impl Stack for NsStack {
    fn base(&self, instance: usize) -> String {
        format!("http://{}:{SERVE_PORT}", self.hosts[instance].addr)
    }

    fn instances(&self) -> usize {
        self.serves.len()
    }

    fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn cli(&self, args: &[&str]) -> impl std::future::Future<Output = CliRun> + Send {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"));
        let data = self.dir.path().join("cli");
        std::fs::create_dir_all(&data).expect("cli data dir");
        cmd.args(args)
            .env_clear()
            .envs(self.env.iter().cloned())
            .env("FLASHSALE_DATA_DIR", &data)
            .current_dir(self.dir.path())
            .kill_on_drop(true);
        procs::output(cmd, args)
    }

    fn revive_crashed(&mut self) -> impl std::future::Future<Output = Vec<String>> + Send {
        NsStack::revive_crashed(self)
    }
}

/// What every flashsale process of the run shares (each adds its data dir and listen address).
fn shared_env(redis: &NsRedisCluster, db_url: &str, plan: &ClusterPlan) -> Vec<(String, String)> {
    let mut env = vec![
        ("FLASHSALE_REDIS_URL", redis.urls()),
        ("FLASHSALE_REDIS_PREFIX", "fs".into()),
        ("FLASHSALE_DATABASE_URL", db_url.to_owned()),
        ("FLASHSALE_JWT_SECRET", SECRET.into()),
        ("FLASHSALE_ADMIN_TOKEN", ADMIN.into()),
        (
            "FLASHSALE_RECONCILE_INTERVAL_MS",
            RECONCILE_INTERVAL_MS.into(),
        ),
        ("FLASHSALE_LOG", "info,sqlx=warn".into()),
    ];
    if let Some(ms) = plan.wait_timeout_ms {
        env.push(("FLASHSALE_REDIS_WAIT_REPLICAS", "1".into()));
        env.push(("FLASHSALE_REDIS_WAIT_TIMEOUT_MS", ms.to_string()));
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// `flashsale serve` (`serveN`) or `flashsale worker` in `host`'s namespace. As in the
/// loopback schedule, only the worker's reconciler repairs.
fn flashsale(
    net: &Net,
    host: &Host,
    name: &str,
    env: &[(String, String)],
    dir: &std::path::Path,
) -> Proc {
    let data = dir.join(name);
    std::fs::create_dir_all(&data).expect("data dir");
    let mut vars = env.to_vec();
    vars.push(("FLASHSALE_DATA_DIR".into(), data.display().to_string()));
    let worker = name == "worker";
    let (listen_var, port) = match worker {
        true => ("FLASHSALE_WORKER_LISTEN", WORKER_PORT),
        false => ("FLASHSALE_LISTEN", SERVE_PORT),
    };
    vars.push((listen_var.into(), format!("{}:{port}", host.addr)));
    let repair = if worker { "1" } else { "0" };
    vars.push(("FLASHSALE_RECONCILE_REPAIR".into(), repair.into()));
    let (program, mut args) = net.exec_prefix(host);
    args.push(env!("CARGO_BIN_EXE_flashsale").into());
    args.extend(match worker {
        true => vec!["worker".to_owned()],
        false => vec!["serve".to_owned(), "--no-persister".to_owned()],
    });
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proc::new(name, program, &args, vars, dir)
}
