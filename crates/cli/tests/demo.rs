//! The main job, as a user runs it: `flashsale demo` in a fresh data dir, small. Its report
//! must agree with what SQL counts in its SQLite file.

use std::process::Command;

use sqlx::{Connection, Row, SqliteConnection};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_sells_exactly_the_stock_and_its_report_matches_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .args([
            "demo",
            "--stock",
            "300",
            "--users",
            "3000",
            "--concurrency",
            "32",
            "--ramp-ms",
            "300",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("FLASHSALE_REDIS_URL")
        .output()
        .expect("run flashsale demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
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
