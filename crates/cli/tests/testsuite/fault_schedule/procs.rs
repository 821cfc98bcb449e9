//! The processes of one run: a throwaway mariadbd and redis-server, two `flashsale serve`,
//! one `flashsale worker`, and one-shot CLI runs. All on 127.0.0.1, all killed and their temp
//! dirs removed on drop (also when the run panics).

use std::path::PathBuf;
use std::time::Duration;

use flashsale_testkit::mariadb::MariaDbServer;
use flashsale_testkit::process::Proc;
use flashsale_testkit::redis_server::RedisServer;
use sqlx::{Connection, Executor, MySqlConnection};
use tempfile::TempDir;

use super::events_relay::Relayed;
use super::plan::{Plan, RedisKeeps};

pub const ADMIN: &str = "fault-schedule-admin-token";
pub const SECRET: &str = "fault-schedule-jwt-secret";
/// A short reconcile interval so that a lost hot sale is rebuilt within the run.
const RECONCILE_INTERVAL_MS: &str = "500";
/// Bound on one CLI run (`migrate`, `reconcile`).
const CLI_LIMIT: Duration = Duration::from_secs(30);
/// Bound on a serve instance becoming ready.
const READY_LIMIT: Duration = Duration::from_secs(30);

pub struct Cluster {
    pub db: MariaDbServer,
    pub redis: RedisServer,
    /// The hot sale's dedicated Redis, when the plan routes one.
    pub hot: Option<RedisServer>,
    pub serves: Vec<Proc>,
    pub ports: Vec<u16>,
    pub worker: Proc,
    pub db_url: String,
    pub http: reqwest::Client,
    /// The NATS the processes' order-event relays publish to.
    pub events: Relayed,
    env: Env,
    /// Removed on drop, after the processes (fields drop in order) are gone.
    _dir: TempDir,
}

impl Cluster {
    /// Where every process's `<name>.log` is.
    pub fn logs_dir(&self) -> &std::path::Path {
        &self.env.dir
    }
}

/// Where this run's flashsale processes find Redis, MariaDB and their data dirs.
struct Env {
    redis_url: String,
    /// The hot Redis's URL and the sku routed there.
    hot: Option<(String, u64)>,
    db_url: String,
    dir: PathBuf,
    /// The order-event relay's settings.
    events: Vec<(String, String)>,
}

impl Env {
    /// The environment every flashsale process of this run shares, with a data dir of its own.
    fn vars(&self, name: &str) -> Vec<(String, String)> {
        let data = self.dir.join(name);
        std::fs::create_dir_all(&data).expect("data dir");
        [
            ("FLASHSALE_REDIS_URL", self.redis_url.clone()),
            ("FLASHSALE_REDIS_PREFIX", "fs".into()),
            ("FLASHSALE_DATABASE_URL", self.db_url.clone()),
            ("FLASHSALE_DATA_DIR", data.display().to_string()),
            ("FLASHSALE_JWT_SECRET", SECRET.into()),
            ("FLASHSALE_ADMIN_TOKEN", ADMIN.into()),
            (
                "FLASHSALE_RECONCILE_INTERVAL_MS",
                RECONCILE_INTERVAL_MS.into(),
            ),
            ("FLASHSALE_LOG", "info,sqlx=warn".into()),
        ]
        .into_iter()
        .chain(self.hot.iter().flat_map(|(url, sku)| {
            [
                ("FLASHSALE_HOT_REDIS_URL", url.clone()),
                ("FLASHSALE_HOT_SKUS", sku.to_string()),
            ]
        }))
        .map(|(k, v)| (k.to_owned(), v))
        .chain(self.events.iter().cloned())
        .collect()
    }
}

fn serve(env: &Env, i: usize, port: u16) -> Proc {
    let name = format!("serve{i}");
    let mut vars = env.vars(&name);
    vars.push(("FLASHSALE_LISTEN".into(), format!("127.0.0.1:{port}")));
    // One repairing reconciler (the worker's), as the design asks of a multi-instance
    // deployment; the instances' reconcilers still name the losses they answered.
    vars.push(("FLASHSALE_RECONCILE_REPAIR".into(), "0".into()));
    let bin = env!("CARGO_BIN_EXE_flashsale");
    Proc::new(&name, bin, &["serve", "--no-persister"], vars, &env.dir)
}

fn worker(env: &Env) -> Proc {
    let mut vars = env.vars("worker");
    vars.push(("FLASHSALE_RECONCILE_REPAIR".into(), "1".into()));
    // Its probes on a port of its own: the default one may be taken by another run.
    let listen = format!("127.0.0.1:{}", flashsale_testkit::free_port());
    vars.push(("FLASHSALE_WORKER_LISTEN".into(), listen));
    Proc::new(
        "worker",
        env!("CARGO_BIN_EXE_flashsale"),
        &["worker"],
        vars,
        &env.dir,
    )
}

/// One `flashsale <args>` on this run's Redis and MariaDB, bounded by `CLI_LIMIT`.
async fn cli(env: &Env, args: &[&str]) -> CliRun {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"));
    cmd.args(args)
        .env_clear()
        .envs(env.vars("cli"))
        .current_dir(&env.dir)
        .kill_on_drop(true);
    output(cmd, args).await
}

/// Runs `cmd` (`flashsale <args>`) to its end, bounded by `CLI_LIMIT`.
pub async fn output(mut cmd: tokio::process::Command, args: &[&str]) -> CliRun {
    match tokio::time::timeout(CLI_LIMIT, cmd.output()).await {
        Ok(Ok(out)) => CliRun {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("run flashsale {args:?}: {e}"),
        Err(_) => CliRun {
            code: None,
            stdout: String::new(),
            stderr: format!("flashsale {args:?} did not finish in {CLI_LIMIT:?}"),
        },
    }
}

/// What the run's shared steps (creating sales, quiescing, probing) need of a deployment,
/// whether on loopback ([`Cluster`]) or in network namespaces.
pub trait Stack {
    /// `http://…` of serve instance `instance`.
    fn base(&self, instance: usize) -> String;
    /// How many serve instances the stack runs.
    fn instances(&self) -> usize;
    fn http(&self) -> &reqwest::Client;
    /// One `flashsale <args>` on this run's Redis and MariaDB.
    fn cli(&self, args: &[&str]) -> impl std::future::Future<Output = CliRun> + Send;
    /// Processes that died by themselves (they should not), each started again so that the
    /// run can still quiesce and be checked: one line each.
    fn revive_crashed(&mut self) -> impl std::future::Future<Output = Vec<String>> + Send;
}

impl Stack for Cluster {
    fn base(&self, instance: usize) -> String {
        Cluster::base(self, instance)
    }

    fn instances(&self) -> usize {
        self.serves.len()
    }

    fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn cli(&self, args: &[&str]) -> impl std::future::Future<Output = CliRun> + Send {
        cli(&self.env, args)
    }

    fn revive_crashed(&mut self) -> impl std::future::Future<Output = Vec<String>> + Send {
        Cluster::revive_crashed(self)
    }
}

/// What a one-shot CLI run did: exit status (None: killed at its bound) and stdout.
pub struct CliRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Cluster {
    pub async fn start(plan: &Plan) -> Cluster {
        let db = MariaDbServer::spawn().await;
        let redis = redis_server(plan.redis).await;
        let hot = match plan.hot_sku {
            Some(_) => Some(redis_server(plan.redis).await),
            None => None,
        };
        create_database(&db.url()).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let db_url = format!("{}/flashsale", db.url());
        let events = Relayed::spawn_on("127.0.0.1").await;
        let base_env = Env {
            redis_url: redis.url(),
            hot: hot
                .as_ref()
                .zip(plan.hot_sku)
                .map(|(r, sku)| (r.url(), sku)),
            db_url: db_url.clone(),
            dir: dir.path().to_path_buf(),
            events: events.vars(),
        };
        let migrate = cli(&base_env, &["migrate"]).await;
        let why = migrate.stderr.lines().last().unwrap_or_default().to_owned();
        assert_eq!(migrate.code, Some(0), "flashsale migrate failed: {why}");
        let ports = vec![
            flashsale_testkit::free_port(),
            flashsale_testkit::free_port(),
        ];
        let serves = ports
            .iter()
            .enumerate()
            .map(|(i, port)| serve(&base_env, i, *port))
            .collect();
        let mut cluster = Cluster {
            db,
            redis,
            hot,
            serves,
            ports,
            worker: worker(&base_env),
            db_url,
            http: http_client(),
            events,
            env: base_env,
            _dir: dir,
        };
        cluster.worker.start();
        for i in 0..2 {
            cluster.serves[i].start();
            cluster.ready(i).await;
        }
        cluster
    }

    pub fn base(&self, instance: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[instance])
    }

    /// Waits until the instance answers `/readyz` 200.
    pub async fn ready(&mut self, instance: usize) {
        let url = format!("{}/readyz", self.base(instance));
        let name = self.serves[instance].name.clone();
        if !answers_200(&self.http, &url, READY_LIMIT).await {
            let tail = self.serves[instance].log_tail(20);
            panic!("{name} never became ready; its log ends:\n{tail}");
        }
    }

    /// Processes that died by themselves (they should not), each started again so that the
    /// run can still quiesce and be checked.
    pub async fn revive_crashed(&mut self) -> Vec<String> {
        let crashed = restart_exited(self.serves.iter_mut().chain([&mut self.worker]));
        for i in 0..self.serves.len() {
            self.ready(i).await;
        }
        crashed
    }

    /// One `flashsale <args>` on this run's Redis and MariaDB, bounded by `CLI_LIMIT`.
    pub async fn cli(&self, args: &[&str]) -> CliRun {
        cli(&self.env, args).await
    }
}

/// Polls `url` until it answers 200, for at most `limit`.
pub async fn answers_200(http: &reqwest::Client, url: &str, limit: Duration) -> bool {
    let ok = flashsale_testkit::wait::within_every(limit, Duration::from_millis(20), || async {
        let resp = http.get(url).send().await.ok()?;
        resp.status().is_success().then_some(())
    })
    .await;
    ok.is_some()
}

/// Starts again each of `procs` that exited by itself; says which and how each log ends.
pub fn restart_exited<'a>(procs: impl Iterator<Item = &'a mut Proc>) -> Vec<String> {
    let mut crashed = Vec::new();
    for p in procs {
        if let Some(status) = p.exited() {
            let tail = p.log_tail(6);
            crashed.push(format!(
                "{} exited by itself ({status}); its log ends: {tail}",
                p.name
            ));
            p.kill();
            p.start();
        }
    }
    crashed
}

async fn redis_server(keeps: RedisKeeps) -> RedisServer {
    match keeps {
        RedisKeeps::Everything => {
            RedisServer::spawn_with(&["--appendonly", "yes", "--appendfsync", "always"]).await
        }
        RedisKeeps::Nothing => RedisServer::spawn().await,
    }
}

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(1))
        .no_proxy()
        .build()
        .expect("http client")
}

pub async fn create_database(server_url: &str) {
    let mut conn = MySqlConnection::connect(server_url)
        .await
        .expect("connect to the throwaway MariaDB");
    conn.execute("CREATE DATABASE flashsale")
        .await
        .expect("create database");
}
