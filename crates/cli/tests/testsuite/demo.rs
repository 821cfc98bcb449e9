//! The main job, as a user runs it: `flashsale demo` in a fresh data dir, small. Its report
//! must agree with what SQL counts in its SQLite file.

use std::process::Command;

use sqlx::{Connection, Row, SqliteConnection};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_sells_exactly_the_stock_and_its_report_matches_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = demo(
        &dir,
        &[
            "--stock",
            "300",
            "--users",
            "3000",
            "--concurrency",
            "32",
            "--ramp-ms",
            "300",
        ],
    );
    assert!(stdout.contains("report: "), "{stdout}");

    let reports: Vec<_> = std::fs::read_dir(dir.path().join("reports"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let json = reports
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a JSON report");
    assert!(
        reports
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "html")),
        "an HTML report"
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert!(
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["held"] == true),
        "{}",
        report["checks"]
    );
    assert_eq!(report["summary"]["outcomes"]["ACCEPTED"], 300);

    let url = format!("sqlite://{}/demo.db", dir.path().display());
    let mut db = SqliteConnection::connect(&url).await.unwrap();
    let row = sqlx::query(
        "SELECT COUNT(*) AS n, SUM(quantity) AS units FROM orders WHERE status = 'CREATED'",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    let (n, units): (i64, i64) = (row.get("n"), row.get("units"));
    assert_eq!((n, units), (300, 300), "SQL in the demo's SQLite file");
    assert_eq!(report["database"]["orders CREATED"], n);
    let sold: i64 = sqlx::query("SELECT sold FROM sales WHERE sku_id = 1")
        .fetch_one(&mut db)
        .await
        .unwrap()
        .get("sold");
    assert_eq!(sold, 300);
}

/// `flashsale demo --mode reserve`: holds are paid, cancelled or left to expire, the units
/// that come back are sold to later buyers, and the report's counts over time agree with
/// the events and orders SQL counts in the demo's SQLite file. With `--webhook`, the demo's own
/// receiver gets every stored transition as a signed order event, once after dedupe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_demo_resolves_every_hold_and_resells_what_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    demo(
        &dir,
        &[
            "--mode",
            "reserve",
            "--stock",
            "100",
            "--users",
            "1000",
            "--concurrency",
            "32",
            "--ramp-ms",
            "200",
            "--hold-ms",
            "2000",
            "--webhook",
        ],
    );
    let json = std::fs::read_dir(dir.path().join("reports"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a JSON report");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.iter().all(|c| c["held"] == true), "{checks:?}");
    for name in [
        "I7 one resolution",
        "resolutions as answered",
        "returned units resold",
        "order events delivered",
    ] {
        assert!(checks.iter().any(|c| c["name"] == name), "{name} checked");
    }
    let totals = &report["lifecycle"]["totals"];
    let url = format!("sqlite://{}/demo.db", dir.path().display());
    let mut db = SqliteConnection::connect(&url).await.unwrap();
    let events = |kind: &'static str| {
        let sql = "SELECT COALESCE(SUM(quantity), 0) AS n FROM stock_events WHERE kind = ?";
        sqlx::query(sql).bind(kind)
    };
    for (kind, total) in [
        ("paid", "payments"),
        ("cancelled", "cancellations"),
        ("expired", "expiries"),
    ] {
        let n: i64 = events(kind).fetch_one(&mut db).await.unwrap().get("n");
        assert_eq!(totals[total], n, "{total} in the report vs SQL");
        assert!(n > 0, "the demo had {total}");
    }
    let deducted: i64 = events("deducted")
        .fetch_one(&mut db)
        .await
        .unwrap()
        .get("n");
    let (reserved, resold) = (totals["reservations"].as_i64(), totals["resales"].as_i64());
    assert_eq!(reserved.unwrap() + resold.unwrap(), deducted);
    assert!(resold.unwrap() > 0, "returned units were resold");
    let row = sqlx::query("SELECT sold, reserved, available FROM sales WHERE sku_id = 1")
        .fetch_one(&mut db)
        .await
        .unwrap();
    let counters: (i64, i64, i64) = (row.get("sold"), row.get("reserved"), row.get("available"));
    assert_eq!(counters, (100, 0, 0), "every unit ends paid");
    let stored: i64 = sqlx::query("SELECT COUNT(*) AS n FROM stock_events WHERE rejected = 0")
        .fetch_one(&mut db)
        .await
        .unwrap()
        .get("n");
    // The sale ends sold out: one `sale.sold_out` notice beside the order events.
    let notices: i64 = sqlx::query("SELECT COUNT(*) AS n FROM sale_notices")
        .fetch_one(&mut db)
        .await
        .unwrap()
        .get("n");
    assert_eq!(notices, 1, "the sale's sold-out notice");
    let stored = stored + notices;
    let database = &report["database"];
    assert_eq!(database["order events stored"], stored);
    assert_eq!(database["order events delivered (webhook)"], stored);
}

/// Runs `flashsale demo <args>` in `dir` without Redis; asserts it succeeded and returns its
/// stdout.
fn demo(dir: &tempfile::TempDir, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .arg("demo")
        .args(args)
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("FLASHSALE_REDIS_URL")
        .output()
        .expect("run flashsale demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `flashsale demo --admission queue`: the queue sells exactly the stock to buyers who
/// joined before or after the start, and its report shows who bought per way of joining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_demo_sells_exactly_the_stock_through_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--admission",
        "queue",
        "--stock",
        "40",
        "--users",
        "600",
        "--concurrency",
        "32",
    ];
    let stdout = demo(&dir, &args);
    assert!(
        stdout.contains("sale: sold 40 of 40 (buyers who bought: 40)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("burst at open") && stdout.contains("after start"),
        "{stdout}"
    );
}

/// `flashsale demo --admission draw`: the published winners are recomputed from the seed,
/// and the units of cancelled winners pass down the waitlist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draw_demo_recomputes_the_winners_and_passes_cancelled_units_down() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--admission",
        "draw",
        "--stock",
        "30",
        "--users",
        "400",
        "--concurrency",
        "32",
        "--hold-ms",
        "600000",
    ];
    let stdout = demo(&dir, &args);
    assert!(
        stdout.contains("30 winners recomputed from the seed"),
        "{stdout}"
    );
    assert!(stdout.contains("waitlist position 36 of 400"), "{stdout}");
    assert!(stdout.contains("available 0"), "{stdout}");
}
