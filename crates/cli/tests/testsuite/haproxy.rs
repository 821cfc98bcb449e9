//! Three `flashsale serve` processes behind HAProxy (deploy/haproxy.cfg, health checks on
//! /readyz), on a six-node Redis Cluster and MariaDB: a spike through the load balancer sells
//! exactly the stock with answers spread over the instances and every event persisted once;
//! an instance killed with SIGKILL mid-spike loses no accepted purchase and the others carry
//! on. `scripts/haproxy-check.sh` checks the config with Debian's haproxy (installed by the test
//! command before any test runs: scripts/test-deps.sh).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use flashsale_server::auth::Auth;
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::process::Proc;
use flashsale_testkit::redis_cluster::RedisCluster;
use flashsale_testkit::{free_port, wait};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};
use sqlx::{Connection, MySqlConnection, Row};

const ADMIN: &str = "haproxy-admin-token";
const SECRET: &str = "haproxy-jwt-secret";
const INSTANCES: usize = 3;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `scripts/haproxy-check.sh`; returns haproxy's path.
fn haproxy_binary() -> String {
    let out = std::process::Command::new("bash")
        .arg(repo_root().join("scripts/haproxy-check.sh"))
        .output()
        .expect("run scripts/haproxy-check.sh");
    assert!(
        out.status.success(),
        "scripts/haproxy-check.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The cluster, the database, three instances and HAProxy in front of them.
struct Deployment {
    _cluster: RedisCluster,
    db: TestDatabase,
    _dir: tempfile::TempDir,
    instances: Vec<Proc>,
    ports: Vec<u16>,
    _haproxy: Proc,
    base: String,
    http: reqwest::Client,
}

impl Deployment {
    async fn start() -> Deployment {
        let haproxy = haproxy_binary();
        let cluster = RedisCluster::spawn(1_000).await;
        let db = TestDatabase::create().await;
        let dir = tempfile::tempdir().unwrap();
        let prefix = flashsale_testkit::redis_server::unique_prefix();
        let ports: Vec<u16> = (0..INSTANCES).map(|_| free_port()).collect();
        let mut instances = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let data = dir.path().join(format!("s{i}"));
            std::fs::create_dir_all(&data).unwrap();
            let env = vec![
                ("FLASHSALE_LISTEN".into(), format!("127.0.0.1:{port}")),
                ("FLASHSALE_REDIS_URL".into(), cluster.urls()),
                ("FLASHSALE_REDIS_PREFIX".into(), prefix.clone()),
                ("FLASHSALE_DATABASE_URL".into(), db.url.clone()),
                ("FLASHSALE_DATA_DIR".into(), data.display().to_string()),
                ("FLASHSALE_JWT_SECRET".into(), SECRET.into()),
                ("FLASHSALE_ADMIN_TOKEN".into(), ADMIN.into()),
                // As docs/DEPLOY.md runs them: behind one proxy that appends the client.
                ("FLASHSALE_TRUST_FORWARDED_FOR".into(), "1".into()),
                ("HOSTNAME".into(), format!("s{}", i + 1)),
                ("RUST_LOG".into(), "warn".into()),
            ];
            let mut p = Proc::new(
                &format!("s{}", i + 1),
                env!("CARGO_BIN_EXE_flashsale"),
                &["serve"],
                env,
                dir.path(),
            );
            p.start();
            instances.push(p);
        }
        let (lb_port, stats_port) = (free_port(), free_port());
        let cfg = repo_root().join("deploy/haproxy.cfg");
        let mut env = vec![
            ("FLASHSALE_LB_BIND".into(), format!("127.0.0.1:{lb_port}")),
            (
                "FLASHSALE_LB_STATS".into(),
                format!("127.0.0.1:{stats_port}"),
            ),
        ];
        for (i, port) in ports.iter().enumerate() {
            env.push((format!("FLASHSALE_S{}", i + 1), format!("127.0.0.1:{port}")));
        }
        let mut lb = Proc::new(
            "haproxy",
            haproxy,
            &["-db", "-f", cfg.to_str().unwrap()],
            env,
            dir.path(),
        );
        lb.start();
        let deployment = Deployment {
            _cluster: cluster,
            db,
            _dir: dir,
            instances,
            ports,
            _haproxy: lb,
            base: format!("http://127.0.0.1:{lb_port}"),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .unwrap(),
        };
        for port in &deployment.ports {
            deployment.ready(&format!("http://127.0.0.1:{port}")).await;
        }
        deployment.ready(&deployment.base.clone()).await;
        deployment.all_up(stats_port).await;
        deployment
    }

    /// Waits until HAProxy has every instance UP: one that was not listening yet at its first
    /// checks is DOWN until `rise` checks pass, and would get none of a spike sent before.
    async fn all_up(&self, stats_port: u16) {
        let url = format!("http://127.0.0.1:{stats_port}/;csv");
        let up = wait::within(Duration::from_secs(30), || async {
            let csv = self.http.get(&url).send().await.ok()?.text().await.ok()?;
            // Columns: proxy, server, …, status (the 18th).
            let up = csv
                .lines()
                .map(|l| l.split(',').collect::<Vec<_>>())
                .filter(|f| f.len() > 17 && f[0] == "instances" && f[17] == "UP")
                .filter(|f| (1..=INSTANCES).any(|i| f[1] == format!("s{i}")))
                .count();
            (up == INSTANCES).then_some(())
        })
        .await;
        assert!(up.is_some(), "HAProxy never had every instance UP");
    }

    async fn ready(&self, base: &str) {
        let http = self.http.clone();
        let url = format!("{base}/readyz");
        let ready = wait::within(Duration::from_secs(60), || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http.get(url).send().await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await;
        if ready.is_none() {
            let logs: Vec<String> = self
                .instances
                .iter()
                .chain([&self._haproxy])
                .map(|p| format!("--- {}:\n{}", p.name, p.log_tail(20)))
                .collect();
            panic!("{base} never became ready\n{}", logs.join("\n"));
        }
    }

    /// Creates and warms a live sale through the load balancer.
    async fn sale(&self, sku: u64, stock: u64) {
        let body = json!({"sku_id": sku, "name": "lb", "total_stock": stock, "per_user_limit": 1});
        let r = self
            .http
            .post(format!("{}/api/v1/sales", self.base))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        let r = self
            .http
            .post(format!("{}/api/v1/sales/{sku}/warm", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }

    /// `flashsale_persisted_events_total` of one instance, by sku.
    async fn persisted(&self, i: usize) -> HashMap<u64, f64> {
        let url = format!("http://127.0.0.1:{}/metrics", self.ports[i]);
        let resp = self.http.get(url).send().await.unwrap();
        let text = resp.text().await.unwrap();
        flashsale_testkit::prometheus::by_label(&text, "flashsale_persisted_events_total", "sku")
            .into_iter()
            .filter_map(|(sku, n)| Some((sku.parse().ok()?, n)))
            .collect()
    }
}

/// One buyer's answer: status, order number (202), the instance that answered.
#[derive(Debug)]
struct Answer {
    user: u64,
    status: Option<u16>,
    order_no: Option<String>,
    instance: Option<String>,
}

async fn buy(http: &reqwest::Client, base: &str, sku: u64, user: u64) -> Answer {
    let token = Auth::new(SECRET, ADMIN).sign(flashsale_core::UserId(user), 600);
    let sent = http
        .post(format!("{base}/api/v1/sales/{sku}/purchases"))
        .bearer_auth(token)
        .json(&json!({"request_id": format!("r{user}"), "quantity": 1}))
        .send()
        .await;
    let Ok(resp) = sent else {
        return Answer {
            user,
            status: None,
            order_no: None,
            instance: None,
        };
    };
    let status = resp.status().as_u16();
    let instance = resp
        .headers()
        .get("x-flashsale-instance")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = resp.json().await.unwrap_or_default();
    Answer {
        user,
        status: Some(status),
        order_no: body["order_no"].as_str().map(str::to_owned),
        instance,
    }
}

/// Buyers `users` of `sku` through the load balancer, 16 at a time.
async fn spike(d: &Deployment, sku: u64, users: std::ops::Range<u64>) -> Vec<Answer> {
    stream::iter(users)
        .map(|u| buy(&d.http, &d.base, sku, u))
        .buffer_unordered(16)
        .collect()
        .await
}

/// (orders, units sold per the sales row, stock events) of a sale, from MariaDB.
async fn stored(db: &TestDatabase, sku: u64) -> (HashMap<String, u64>, i64, i64) {
    let mut conn = MySqlConnection::connect(&db.url).await.unwrap();
    let orders = sqlx::query(
        "SELECT CAST(order_no AS CHAR) AS order_no, user_id FROM orders WHERE sku_id = ?",
    )
    .bind(sku)
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get::<String, _>("order_no"), r.get::<u64, _>("user_id")))
    .collect();
    let sold = "SELECT CAST(sold AS SIGNED) FROM sales WHERE sku_id = ?";
    let events = "SELECT COUNT(*) FROM stock_events WHERE sku_id = ?";
    let sold = count(&mut conn, sold, sku).await;
    (orders, sold, count(&mut conn, events, sku).await)
}

/// The one number `sql` selects for sale `sku`.
async fn count(conn: &mut sqlx::MySqlConnection, sql: &str, sku: u64) -> i64 {
    let row = sqlx::query(sql).bind(sku).fetch_one(conn).await.unwrap();
    row.get(0)
}

/// Waits until MariaDB holds `n` orders of the sale.
async fn persisted_orders(db: &TestDatabase, sku: u64, n: usize) -> HashMap<String, u64> {
    wait::until(
        "the persisters to drain",
        Duration::from_secs(90),
        || async {
            let (orders, _, _) = stored(db, sku).await;
            (orders.len() >= n).then_some(orders)
        },
    )
    .await
}

fn accepted(answers: &[Answer]) -> HashMap<String, u64> {
    answers
        .iter()
        .filter(|a| a.status == Some(202))
        .map(|a| (a.order_no.clone().expect("a 202 names its order"), a.user))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spike_through_haproxy_sells_exactly_the_stock_on_three_instances() {
    let d = Deployment::start().await;
    let (sku, stock) = (7, 150);
    d.sale(sku, stock).await;
    let answers = spike(&d, sku, 1..601).await;

    let by_status = answers.iter().fold(HashMap::new(), |mut m, a| {
        *m.entry(a.status).or_insert(0) += 1;
        m
    });
    assert!(
        by_status.keys().all(|s| [Some(202), Some(409)].contains(s)),
        "{by_status:?}"
    );
    let acc = accepted(&answers);
    assert_eq!(
        acc.len() as u64,
        stock,
        "exactly the stock is accepted: {by_status:?}"
    );
    let users: HashSet<u64> = acc.values().copied().collect();
    assert_eq!(users.len() as u64, stock, "one order per buyer");
    let instances: HashSet<&str> = answers
        .iter()
        .filter_map(|a| a.instance.as_deref())
        .collect();
    assert_eq!(
        instances.len(),
        INSTANCES,
        "answers spread over {instances:?}"
    );

    let orders = persisted_orders(&d.db, sku, stock as usize).await;
    assert_eq!(
        orders, acc,
        "the database holds exactly the accepted orders"
    );
    let (_, sold, events) = stored(&d.db, sku).await;
    assert_eq!(sold as u64, stock);
    // Every event applied once over all instances: the persisters' own counts add up to the
    // database's rows (one lease per sale: a second writer would apply nothing new). A
    // persister counts a batch just after its commit, so the counts are polled, not read once.
    let applied_by = || async {
        let mut applied = 0.0;
        let mut writers = Vec::new();
        for i in 0..INSTANCES {
            let n = d.persisted(i).await.get(&sku).copied().unwrap_or(0.0);
            applied += n;
            if n > 0.0 {
                writers.push(i + 1);
            }
        }
        (applied as i64, writers)
    };
    let counted = wait::within(Duration::from_secs(30), || async {
        let (applied, writers) = applied_by().await;
        (applied >= events).then_some((applied, writers))
    })
    .await;
    let (applied, writers) = match counted {
        Some(counted) => counted,
        None => applied_by().await,
    };
    assert_eq!(applied, events, "applied once each; writers s{writers:?}");
    println!("haproxy spike: {by_status:?}, answered by {instances:?}, persisted by s{writers:?}");
    a_forged_forwarded_for_hides_no_one(&d, sku).await;
}

/// With the client's own address blacklisted, a forged `X-Forwarded-For` sent through
/// HAProxy still gets 403 from every instance: they read the entry HAProxy appended. (Last:
/// it blocks this test's client.)
async fn a_forged_forwarded_for_hides_no_one(d: &Deployment, sku: u64) {
    let path = "/api/v1/admin/blacklist/ips/127.0.0.1";
    let r = d
        .http
        .put(format!("{}{path}", d.base))
        .bearer_auth(ADMIN)
        .send()
        .await;
    assert_eq!(r.unwrap().status(), 200);
    let forged = |user: u64| {
        let token = Auth::new(SECRET, ADMIN).sign(flashsale_core::UserId(user), 600);
        let body = json!({"request_id": "forged", "quantity": 1});
        let url = format!("{}/api/v1/sales/{sku}/purchases", d.base);
        let req = d.http.post(url).bearer_auth(token).json(&body);
        req.header("x-forwarded-for", "1.2.3.4").send()
    };
    // Each instance reloads the blacklist every 500 ms: wait for a round of 403s from all.
    let mut user = 10_000;
    let blocked = wait::within(Duration::from_secs(10), || {
        user += INSTANCES as u64;
        let round = (user..user + INSTANCES as u64).map(forged);
        async move {
            let answers = futures::future::join_all(round).await;
            let statuses: Vec<u16> = answers
                .iter()
                .map(|r| r.as_ref().map_or(0, |r| r.status().as_u16()))
                .collect();
            statuses.iter().all(|s| *s == 403).then_some(())
        }
    })
    .await;
    assert!(
        blocked.is_some(),
        "a forged X-Forwarded-For got past the IP blacklist"
    );
}

/// The instance whose persister writes `sku`'s stream now (the lease holder).
async fn writer_of(d: &Deployment, sku: u64) -> usize {
    wait::until(
        "a persister to write the sale",
        Duration::from_secs(30),
        || async {
            for i in 0..INSTANCES {
                if d.persisted(i).await.get(&sku).copied().unwrap_or(0.0) > 0.0 {
                    return Some(i);
                }
            }
            None
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_spike_loses_no_accepted_purchase() {
    let mut d = Deployment::start().await;
    let (sku, stock) = (8, 300);
    d.sale(sku, stock).await;
    let first = spike(&d, sku, 1..101).await;
    // The instance that writes the sale's stream dies with SIGKILL while buyers keep coming:
    // requests in flight to it get no answer (or a 5xx from HAProxy) until the health checks
    // take it out, and its lease on the sale moves to another instance.
    let victim = writer_of(&d, sku).await;
    let mut killed = d.instances.remove(victim);
    let killer = async {
        wait::until(
            "the spike to be under way",
            Duration::from_secs(60),
            || async {
                let (orders, _, _) = stored(&d.db, sku).await;
                (orders.len() >= 150).then_some(())
            },
        )
        .await;
        killed.kill();
    };
    let (second, ()) = tokio::join!(spike(&d, sku, 101..1_201), killer);
    let answers: Vec<Answer> = first.into_iter().chain(second).collect();

    let acc = accepted(&answers);
    let refused = answers.iter().filter(|a| a.status == Some(409)).count();
    assert!(refused > 0, "the sale sold out");
    // Purchases in flight to the victim when it died may be accepted without an answer: the
    // database holds them too, so it holds exactly the stock and every answered one.
    let orders = persisted_orders(&d.db, sku, stock as usize).await;
    for (no, user) in &acc {
        assert_eq!(
            orders.get(no),
            Some(user),
            "accepted order {no} is in the database"
        );
    }
    assert_eq!(orders.len() as u64, stock, "no order beyond the stock");
    let (_, sold, _) = stored(&d.db, sku).await;
    assert_eq!(sold as u64, stock);
    let failed = answers
        .iter()
        .filter(|a| !matches!(a.status, Some(202 | 409)))
        .count();
    println!(
        "writer s{} killed mid-spike: {} accepted and answered, {refused} sold out, \
         {failed} unanswered or 5xx",
        victim + 1,
        acc.len()
    );
}
