//! A rolling upgrade and a rollback with real binaries: the previous release (docs/RELEASES.md;
//! `scripts/upgrade-check.sh` builds it and names it in `FLASHSALE_UPGRADE_OLD_BIN`) beside this
//! tree's `flashsale`, on one Redis and on a Redis Cluster, one fresh MariaDB database each,
//! with a sale of one bucket and a sale of three:
//!
//! 1. the previous release runs (a worker and a `serve --no-persister`); a new `serve
//!    --no-persister` comes up (it migrates the database), creates and warms the sales, and a
//!    spike goes through both writers: the old reader persists what it reads and waits on what
//!    it cannot (it says so: `flashsale_stream_unknown_format`);
//! 2. the workers rolled first: a new worker instead of the old, a spike through both writers;
//! 3. rolled forward: a new `serve` alone;
//! 4. rolled back: an old `serve` alone.
//!
//! After each phase every acknowledged purchase reaches the database; at the end the new
//! binary's `flashsale reconcile` exits 0, every acknowledged order is stored once (not
//! PENDING), no event was fenced, no entry dead-lettered, no sale paused.
//! `FLASHSALE_UPGRADE_NEW_BIN` replaces this tree's binary (to run two older releases).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use flashsale_core::buckets::home_bucket;
use flashsale_core::UserId;
use flashsale_server::auth::Auth;
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::process::Proc;
use flashsale_testkit::redis_cluster::RedisCluster;
use flashsale_testkit::redis_server::RedisServer;
use flashsale_testkit::{free_port, wait};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};
use sqlx::{MySqlPool, Row};

const ADMIN: &str = "upgrade-admin-token";
const SECRET: &str = "upgrade-jwt-secret";
/// A sale of one bucket and a sale of three, 300 units each: more than the phases ask.
const ONE: u64 = 71;
const BUCKETED: u64 = 72;
const BUCKETS: u16 = 3;
const STOCK: u64 = 300;
/// Buyers per phase homed at the bucketed sale's last bucket (the first phase's more than its
/// share of 100, so stock moves there from the first phase on), and a fifth as many again homed
/// at the other two: 276 of 300 units asked of each sale.
const BUYERS: [usize; 4] = [110, 40, 40, 40];
const START_LIMIT: Duration = Duration::from_secs(60);
const DRAIN_LIMIT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    Old,
    New,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Serve,
    /// `serve --no-persister`: a writer only.
    Writer,
    Worker,
}

/// One Redis (or cluster) and one database that both releases share.
struct Stack {
    redis_url: String,
    db: TestDatabase,
    dir: tempfile::TempDir,
    http: reqwest::Client,
    _redis: Option<RedisServer>,
    _cluster: Option<RedisCluster>,
}

struct Instance {
    proc: Proc,
    base: String,
}

fn binary(release: Release) -> PathBuf {
    let var = match release {
        Release::Old => "FLASHSALE_UPGRADE_OLD_BIN",
        Release::New => "FLASHSALE_UPGRADE_NEW_BIN",
    };
    match (std::env::var(var), release) {
        (Ok(path), _) => PathBuf::from(path),
        (Err(_), Release::New) => PathBuf::from(env!("CARGO_BIN_EXE_flashsale")),
        (Err(_), Release::Old) => panic!("{var} names no binary: run scripts/upgrade-check.sh"),
    }
}

impl Stack {
    async fn single() -> Stack {
        let redis = RedisServer::spawn().await;
        Stack::on(redis.url(), Some(redis), None).await
    }

    async fn cluster() -> Stack {
        let cluster = RedisCluster::spawn(1_000).await;
        Stack::on(cluster.urls(), None, Some(cluster)).await
    }

    async fn on(url: String, redis: Option<RedisServer>, cluster: Option<RedisCluster>) -> Stack {
        Stack {
            redis_url: url,
            db: TestDatabase::create().await,
            dir: tempfile::tempdir().unwrap(),
            http: reqwest::Client::new(),
            _redis: redis,
            _cluster: cluster,
        }
    }

    fn env(&self, name: &str) -> Vec<(String, String)> {
        let data = self.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let env = [
            ("FLASHSALE_REDIS_URL", self.redis_url.clone()),
            ("FLASHSALE_REDIS_PREFIX", "fs".into()),
            ("FLASHSALE_DATABASE_URL", self.db.url.clone()),
            ("FLASHSALE_DATA_DIR", data.display().to_string()),
            ("FLASHSALE_JWT_SECRET", SECRET.into()),
            ("FLASHSALE_ADMIN_TOKEN", ADMIN.into()),
            ("HOSTNAME", name.into()),
            ("RUST_LOG", "info".into()),
        ];
        env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    /// Starts `role` of `release` and waits until it is ready (it migrated the database, or
    /// found it declared compatible).
    async fn start(&self, name: &str, release: Release, role: Role) -> Instance {
        let port = free_port();
        let mut env = self.env(name);
        let listen = match role {
            Role::Worker => "FLASHSALE_WORKER_LISTEN",
            Role::Serve | Role::Writer => "FLASHSALE_LISTEN",
        };
        env.push((listen.into(), format!("127.0.0.1:{port}")));
        let args: &[&str] = match role {
            Role::Serve => &["serve"],
            Role::Writer => &["serve", "--no-persister"],
            Role::Worker => &["worker"],
        };
        let mut proc = Proc::new(name, binary(release), args, env, self.dir.path());
        proc.start();
        let base = format!("http://127.0.0.1:{port}");
        let ready = wait::within(START_LIMIT, || async {
            let r = self.http.get(format!("{base}/readyz")).send().await;
            r.is_ok_and(|r| r.status().is_success()).then_some(())
        })
        .await;
        assert!(ready.is_some(), "{name} not ready:\n{}", proc.log_tail(30));
        Instance { proc, base }
    }

    /// The new binary run to its end (`reconcile`): its exit status and output.
    fn run_new(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(binary(Release::New))
            .args(args)
            .env_clear()
            .envs(self.env("reconcile"))
            .current_dir(self.dir.path())
            .output()
            .expect("run flashsale")
    }

    async fn admin(&self, via: &Instance, path: &str, body: Value) -> (u16, String) {
        let r = self
            .http
            .post(format!("{}{path}", via.base))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// Creates and warms both sales through `via`.
    async fn sales(&self, via: &Instance) {
        for (sku, buckets) in [(ONE, 1), (BUCKETED, BUCKETS)] {
            let sale = json!({"sku_id": sku, "name": "upgrade", "total_stock": STOCK,
                "per_user_limit": 1, "buckets": buckets});
            let (status, body) = self.admin(via, "/api/v1/sales", sale).await;
            assert_eq!(status, 201, "create {sku}: {body}");
            let (status, body) = self
                .admin(via, &format!("/api/v1/sales/{sku}/warm"), json!({}))
                .await;
            assert_eq!(status, 200, "warm {sku}: {body}");
        }
    }
}

/// `count` user ids from `from` on homed at the bucketed sale's last bucket, and `count / 5`
/// homed at the others.
fn buyers(from: u64, count: usize) -> Vec<u64> {
    let last = |u: &u64| home_bucket(UserId(*u), BUCKETS) == BUCKETS - 1;
    let mut users: Vec<u64> = (from..).filter(last).take(count).collect();
    users.extend((from..).filter(|u| !last(u)).take(count / 5));
    users
}

/// One purchase, retried with its request id on an answer that promises nothing (429, 503, no
/// answer): the order number of its 202.
async fn buy(http: &reqwest::Client, base: &str, sku: u64, user: u64) -> String {
    let token = Auth::new(SECRET, ADMIN).sign(UserId(user), 600);
    let body = json!({"request_id": format!("u{user}"), "quantity": 1});
    let url = format!("{base}/api/v1/sales/{sku}/purchases");
    let answer = wait::within_every(Duration::from_secs(30), Duration::from_millis(50), || {
        let sent = http.post(&url).bearer_auth(&token).json(&body).send();
        async move {
            let resp = sent.await.ok()?;
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.ok()?;
            assert!(
                status == 202 || status == 429 || status == 503,
                "sale {sku}, user {user}: {status} {body}"
            );
            (status == 202).then(|| body["order_no"].as_str().unwrap().to_owned())
        }
    })
    .await;
    answer.unwrap_or_else(|| panic!("sale {sku}, user {user}: no 202 within 30 s"))
}

/// Every user buys one unit of both sales through the instances in turn, 16 at a time: the
/// acknowledged orders by sale.
async fn spike(http: &reqwest::Client, via: &[&Instance], users: &[u64]) -> Acked {
    let bases: Vec<&str> = via.iter().map(|i| i.base.as_str()).collect();
    let calls = users.iter().enumerate().flat_map(|(i, &u)| {
        let base = bases[i % bases.len()];
        [(ONE, u, base), (BUCKETED, u, base)]
    });
    let orders: Vec<(u64, String)> = stream::iter(calls)
        .map(|(sku, u, base)| async move { (sku, buy(http, base, sku, u).await) })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut acked = Acked::default();
    for (sku, order) in orders {
        acked.0.entry(sku).or_default().push(order);
    }
    acked
}

/// Acknowledged order numbers by sale.
#[derive(Default, Debug)]
struct Acked(HashMap<u64, Vec<String>>);

impl Acked {
    fn add(&mut self, other: Acked) {
        for (sku, orders) in other.0 {
            self.0.entry(sku).or_default().extend(orders);
        }
    }

    fn of(&self, sku: u64) -> &[String] {
        self.0.get(&sku).map_or(&[], Vec::as_slice)
    }
}

async fn db(stack: &Stack) -> MySqlPool {
    MySqlPool::connect(&stack.db.url).await.unwrap()
}

/// The sale's stored orders that are not PENDING, with how many rows each order number has.
async fn stored(db: &MySqlPool, sku: u64) -> HashMap<String, i64> {
    let sql = "SELECT CAST(order_no AS CHAR) AS o, COUNT(*) AS n FROM orders \
               WHERE sku_id = ? AND status <> 'PENDING' GROUP BY order_no";
    let rows = sqlx::query(sql).bind(sku).fetch_all(db).await.unwrap();
    rows.iter()
        .map(|r| (r.get::<String, _>("o"), r.get::<i64, _>("n")))
        .collect()
}

/// Waits until the database holds every order of `sku` in `acked`.
async fn persisted(stack: &Stack, sku: u64, acked: &[String], phase: &str) {
    let pool = db(stack).await;
    let held = wait::within(DRAIN_LIMIT, || {
        let pool = pool.clone();
        async move {
            let rows = stored(&pool, sku).await;
            acked.iter().all(|o| rows.contains_key(o)).then_some(())
        }
    })
    .await;
    if held.is_none() {
        let rows = stored(&pool, sku).await;
        let missing: Vec<&String> = acked.iter().filter(|o| !rows.contains_key(*o)).collect();
        panic!(
            "{phase}: sale {sku}: {} of {} acknowledged orders never reached the database \
             (first: {:?}); {}",
            missing.len(),
            acked.len(),
            missing.first(),
            checks(&pool).await
        );
    }
}

/// What must stay 0 whatever the roll does: fenced events, dead letters, paused sales.
async fn checks(db: &MySqlPool) -> String {
    let mut out = Vec::new();
    for (what, sql) in [
        ("fenced events", "SELECT COUNT(*) FROM fenced_events"),
        ("dead letters", "SELECT COUNT(*) FROM dead_letters"),
        (
            "paused sales",
            "SELECT COUNT(*) FROM sales WHERE stream_paused",
        ),
    ] {
        let n: i64 = sqlx::query_scalar(sql).fetch_one(db).await.unwrap();
        out.push(format!("{what}: {n}"));
    }
    out.join(", ")
}

/// What the old worker did with the bucketed sale's entries of the new writer: read them (a
/// previous release that reads their format) or waited on them and said so.
async fn old_reader_reads_or_waits(
    stack: &Stack,
    worker: &Instance,
    acked: &[String],
) -> &'static str {
    let pool = db(stack).await;
    let seen = wait::within(Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let rows = stored(&pool, BUCKETED).await;
            if acked.iter().all(|o| rows.contains_key(o)) {
                return Some("read them");
            }
            let text = (stack
                .http
                .get(format!("{}/metrics", worker.base))
                .send()
                .await)
                .ok()?
                .text()
                .await
                .ok()?;
            let alarm = flashsale_testkit::prometheus::by_label(
                &text,
                "flashsale_stream_unknown_format",
                "sku",
            );
            let bucketed = |sku: &str| sku.split('/').next() == Some(&BUCKETED.to_string());
            let says = alarm.iter().any(|(sku, v)| bucketed(sku) && *v > 0.0);
            says.then_some("waited on them and said so")
        }
    })
    .await;
    if let Some(did) = seen {
        return did;
    }
    panic!(
        "the old worker neither stored the bucketed sale's orders nor raised \
         flashsale_stream_unknown_format ({}):\n{}",
        checks(&pool).await,
        worker.proc.log_tail(30)
    )
}

async fn stop(mut instance: Instance) {
    instance.proc.terminate(Duration::from_secs(30)).await;
}

/// The four phases and the checker on `stack`.
async fn roll(stack: Stack) {
    let http = stack.http.clone();
    let mut users = (1..=4).map(|phase| buyers(phase * 1_000_000, BUYERS[phase as usize - 1]));
    let mut acked = Acked::default();

    // 1. The previous release runs (its worker and a writer); a new writer comes up, migrates
    //    the database and creates the sales; a spike through both writers.
    let old_worker = stack.start("old-worker", Release::Old, Role::Worker).await;
    let old_writer = stack.start("old-writer", Release::Old, Role::Writer).await;
    let new_writer = stack.start("new-writer", Release::New, Role::Writer).await;
    stack.sales(&new_writer).await;
    let writers = [&new_writer, &old_writer];
    let got = spike(&http, &writers, &users.next().unwrap()).await;
    persisted(&stack, ONE, got.of(ONE), "both writers, old worker").await;
    let did = old_reader_reads_or_waits(&stack, &old_worker, got.of(BUCKETED)).await;
    eprintln!("phase 1: the old worker, given a bucketed sale's new entries, {did}");
    acked.add(got);

    // 2. The workers rolled first: a new reader beside both writers.
    let new_worker = stack.start("new-worker", Release::New, Role::Worker).await;
    stop(old_worker).await;
    acked.add(spike(&http, &writers, &users.next().unwrap()).await);
    for sku in [ONE, BUCKETED] {
        persisted(&stack, sku, acked.of(sku), "both writers, new worker").await;
    }

    // 3. Rolled forward: the new release alone.
    let new_serve = stack.start("new-serve", Release::New, Role::Serve).await;
    stop(old_writer).await;
    stop(new_writer).await;
    stop(new_worker).await;
    acked.add(spike(&http, &[&new_serve], &users.next().unwrap()).await);
    for sku in [ONE, BUCKETED] {
        persisted(&stack, sku, acked.of(sku), "rolled forward").await;
    }

    // 4. Rolled back: the previous release alone (the new one drained what it wrote).
    let old_serve = stack.start("old-serve", Release::Old, Role::Serve).await;
    stop(new_serve).await;
    acked.add(spike(&http, &[&old_serve], &users.next().unwrap()).await);
    for sku in [ONE, BUCKETED] {
        persisted(&stack, sku, acked.of(sku), "rolled back").await;
    }

    // The checker, on what the roll left.
    let out = stack.run_new(&["reconcile"]);
    assert!(
        out.status.success(),
        "flashsale reconcile: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    stop(old_serve).await;
    let pool = db(&stack).await;
    for sku in [ONE, BUCKETED] {
        let rows = stored(&pool, sku).await;
        let answered: BTreeSet<&String> = acked.of(sku).iter().collect();
        let twice = "an order number answered twice";
        assert_eq!(answered.len(), acked.of(sku).len(), "sale {sku}: {twice}");
        assert!(
            rows.values().all(|&n| n == 1),
            "sale {sku}: an order stored twice"
        );
        let held: BTreeSet<&String> = rows.keys().collect();
        assert_eq!(
            held, answered,
            "sale {sku}: stored orders are the acknowledged ones"
        );
    }
    let clean = checks(&pool).await;
    assert_eq!(clean, "fenced events: 0, dead letters: 0, paused sales: 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the previous release's binary: scripts/upgrade-check.sh"]
async fn a_roll_forward_and_back_on_one_redis_keeps_every_acknowledged_order() {
    roll(Stack::single().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the previous release's binary: scripts/upgrade-check.sh"]
async fn a_roll_forward_and_back_on_a_cluster_keeps_every_acknowledged_order() {
    roll(Stack::cluster().await).await;
}
