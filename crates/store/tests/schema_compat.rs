//! Rolling upgrades of the schema, on MariaDB and SQLite: a database that a newer binary
//! migrated past this binary's migrations opens when the newer schema declares this binary
//! compatible (`schema_compat`), and is refused with a message naming both versions when it
//! does not.

use flashsale_core::OrderStore;
use flashsale_store::{MySqlStore, SqliteStore};
use flashsale_testkit::mariadb::TestDatabase;
use sqlx::mysql::MySqlConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Executor};

const OURS: &str = "SELECT MAX(version) FROM _sqlx_migrations";

/// What a newer binary's migration `ours + 1` leaves behind: a table of its own, its row in
/// sqlx's table, and its compatibility declaration (the lowest binary schema version that
/// runs against it).
fn future_migration(ours: i64, min_binary: i64) -> [String; 3] {
    [
        "CREATE TABLE tomorrow (id INTEGER NOT NULL PRIMARY KEY)".into(),
        format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES ({}, 'tomorrow', TRUE, X'00', 1)",
            ours + 1
        ),
        format!("UPDATE schema_compat SET min_binary_version = {min_binary}"),
    ]
}

/// Applies the future migration to a MariaDB database this binary migrated; returns the
/// binary's schema version (the highest it applied).
async fn mariadb_future(url: &str, min_binary: impl Fn(i64) -> i64) -> i64 {
    let mut conn = MySqlConnection::connect(url).await.expect("connect");
    let ours: i64 = sqlx::query_scalar(OURS).fetch_one(&mut conn).await.unwrap();
    for sql in future_migration(ours, min_binary(ours)) {
        conn.execute(sql.as_str()).await.unwrap();
    }
    ours
}

/// Likewise on SQLite.
async fn sqlite_future(url: &str, min_binary: impl Fn(i64) -> i64) -> i64 {
    let mut conn = SqliteConnection::connect(url).await.expect("connect");
    let ours: i64 = sqlx::query_scalar(OURS).fetch_one(&mut conn).await.unwrap();
    for sql in future_migration(ours, min_binary(ours)) {
        conn.execute(sql.as_str()).await.unwrap();
    }
    conn.close().await.unwrap();
    ours
}

/// The refusal names the database's schema version and this binary's.
fn assert_refused<T: std::fmt::Debug>(opened: Result<T, flashsale_core::StoreError>, ours: i64) {
    let future = ours + 1;
    let err = opened
        .expect_err("an incompatible newer schema is refused")
        .to_string();
    assert!(err.contains(&format!("schema version {future}")), "{err}");
    assert!(
        err.contains(&format!("this binary's schema version {ours}")),
        "{err}"
    );
    assert!(err.contains(&format!("needs {future}")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_opens_a_newer_compatible_schema() {
    let db = TestDatabase::create().await;
    MySqlStore::connect(&db.url).await.expect("migrate");
    mariadb_future(&db.url, |ours| ours).await;
    let store = MySqlStore::connect(&db.url)
        .await
        .expect("a compatible newer schema opens");
    assert!(store.sales().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_refuses_a_newer_incompatible_schema() {
    let db = TestDatabase::create().await;
    MySqlStore::connect(&db.url).await.expect("migrate");
    let ours = mariadb_future(&db.url, |ours| ours + 1).await;
    assert_refused(MySqlStore::connect(&db.url).await, ours);
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("flashsale.db").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_opens_a_newer_compatible_schema() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    drop(SqliteStore::open(&url).await.expect("migrate"));
    sqlite_future(&url, |ours| ours - 1).await;
    let store = SqliteStore::open(&url)
        .await
        .expect("a compatible newer schema opens");
    assert!(store.sales().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_a_newer_incompatible_schema() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    drop(SqliteStore::open(&url).await.expect("migrate"));
    let ours = sqlite_future(&url, |ours| ours + 1).await;
    assert_refused(SqliteStore::open(&url).await, ours);
}
