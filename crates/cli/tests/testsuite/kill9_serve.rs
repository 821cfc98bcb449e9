//! The embedded server process is killed with SIGKILL during a spike and restarted on the same
//! data dir: every purchase it answered "accepted" is in SQLite, nothing is oversold, and the
//! sale goes on to sell exactly its stock.

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::stream::{self, StreamExt};
use serde_json::{json, Value};
use sqlx::{Connection, Row, SqliteConnection};

const ADMIN: &str = "kill9-admin-token";
const SECRET: &str = "kill9-jwt-secret";
const STOCK: u64 = 120;

fn serve(dir: &std::path::Path, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .arg("serve")
        .env("FLASHSALE_LISTEN", format!("127.0.0.1:{port}"))
        .env("FLASHSALE_DATA_DIR", dir)
        .env("FLASHSALE_JWT_SECRET", SECRET)
        .env("FLASHSALE_ADMIN_TOKEN", ADMIN)
        .env_remove("FLASHSALE_REDIS_URL")
        .env_remove("FLASHSALE_DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start flashsale serve")
}

async fn ready(http: &reqwest::Client, base: &str) {
    for _ in 0..500 {
        if http
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("server at {base} never became ready");
}

fn token(user: u64) -> String {
    flashsale_server::auth::Auth::new(SECRET, ADMIN).sign(flashsale_core::UserId(user), 600)
}

/// Fires buyers `users` with 16 clients; returns the order numbers answered 202 and how many
/// requests got no answer at all (the server was gone).
async fn spike(
    http: &reqwest::Client,
    base: &str,
    users: std::ops::Range<u64>,
) -> (Vec<String>, usize) {
    let answers: Vec<Result<Option<String>, ()>> = stream::iter(users)
        .map(|u| async move {
            let body = json!({"request_id": format!("k{u}"), "quantity": 1});
            let url = format!("{base}/api/v1/sales/1/purchases");
            let resp = http
                .post(url)
                .bearer_auth(token(u))
                .json(&body)
                .send()
                .await
                .map_err(|_| ())?;
            if resp.status().as_u16() != 202 {
                return Ok(None);
            }
            let body: Value = resp.json().await.map_err(|_| ())?;
            Ok(body["order_no"].as_str().map(str::to_owned))
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let lost = answers.iter().filter(|a| a.is_err()).count();
    (
        answers
            .into_iter()
            .filter_map(|a| a.ok().flatten())
            .collect(),
        lost,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_purchases_survive_kill_9_of_the_server_and_the_sale_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let port = flashsale_testkit::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut server = serve(dir.path(), port);
    ready(&http, &base).await;
    let sale = json!({"sku_id": 1, "name": "kill9", "total_stock": STOCK, "per_user_limit": 1});
    assert_eq!(
        http.post(format!("{base}/api/v1/sales"))
            .bearer_auth(ADMIN)
            .json(&sale)
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    assert!(http
        .post(format!("{base}/api/v1/sales/1/warm"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .status()
        .is_success());

    // Kill while the spike is in flight: once SQLite holds 30 sales of 120, not at a time that a
    // fast machine could outrun.
    let db_url = format!("sqlite://{}/flashsale.db", dir.path().display());
    let killer = async {
        let mut db = SqliteConnection::connect(&db_url).await.unwrap();
        for _ in 0..10_000 {
            let sold: i64 = sqlx::query("SELECT sold FROM sales WHERE sku_id = 1")
                .fetch_one(&mut db)
                .await
                .unwrap()
                .get("sold");
            if sold >= 30 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        server.kill().expect("SIGKILL");
        server.wait().unwrap();
    };
    let ((before, unanswered), ()) = tokio::join!(spike(&http, &base, 1..2_000), killer);
    assert!(unanswered > 0, "the kill landed mid-spike");

    let mut server = serve(dir.path(), port);
    ready(&http, &base).await;
    let (after, unanswered) = spike(&http, &base, 2_000..4_000).await;
    assert_eq!(unanswered, 0);
    server.kill().unwrap();
    server.wait().unwrap();

    let mut db =
        SqliteConnection::connect(&format!("sqlite://{}/flashsale.db", dir.path().display()))
            .await
            .unwrap();
    let rows = sqlx::query("SELECT order_no FROM orders WHERE sku_id = 1 AND status = 'CREATED'")
        .fetch_all(&mut db)
        .await
        .unwrap();
    let stored: HashSet<String> = rows.iter().map(|r| r.get("order_no")).collect();
    for no in before.iter().chain(&after) {
        assert!(
            stored.contains(no),
            "order {no} was answered accepted but is not in SQLite"
        );
    }
    let sold: i64 = sqlx::query("SELECT sold FROM sales WHERE sku_id = 1")
        .fetch_one(&mut db)
        .await
        .unwrap()
        .get("sold");
    assert_eq!(
        stored.len() as u64,
        STOCK,
        "exactly the stock sold, across the kill"
    );
    assert_eq!(sold as u64, STOCK);
    assert!(!before.is_empty() || !after.is_empty());
}
