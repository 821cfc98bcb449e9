//! Rolling upgrades of the schema, on MariaDB, PostgreSQL and SQLite: a database that a newer
//! binary migrated past this binary's migrations opens when the newer schema declares this
//! binary compatible (`schema_compat`), and is refused with a message naming both versions
//! when it does not.

use flashsale_core::OrderStore;
use flashsale_store::{MySqlStore, PgStore, SqliteStore};
use sqlx::mysql::MySqlConnection;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Executor};

const OURS: &str = "SELECT MAX(version) FROM _sqlx_migrations";
const MIN_BINARY: &str = "SELECT min_binary_version FROM schema_compat WHERE id = 1";
/// The first binary schema version that reads a bucketed sale's stream entries (or waits on
/// them): migration 10 declares it the lowest that may run.
const BUCKETED_ENTRIES_READ_FROM: i64 = 9;

/// What a newer binary's migration `ours + 1` leaves behind: a table of its own, its row in
/// sqlx's table (`checksum`: a one-byte literal in the database's dialect), and its
/// compatibility declaration (the lowest binary schema version that runs against it).
fn future_migration(ours: i64, min_binary: i64, checksum: &str) -> [String; 3] {
    [
        "CREATE TABLE tomorrow (id INTEGER NOT NULL PRIMARY KEY)".into(),
        format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES ({}, 'tomorrow', TRUE, {checksum}, 1)",
            ours + 1
        ),
        format!("UPDATE schema_compat SET min_binary_version = {min_binary}"),
    ]
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

/// The four cases on one backend: `$db` makes `(guard, url)`, `$open` opens the store,
/// `$conn` is the raw connection the future migration is applied through.
macro_rules! upgrades {
    ($backend:ident, $db:expr, $open:path, $conn:ty, $checksum:expr) => {
        mod $backend {
            use super::*;

            /// Applies the future migration to a database this binary migrated; returns the
            /// binary's schema version (the highest it applied).
            async fn future(url: &str, min_binary: impl Fn(i64) -> i64) -> i64 {
                $open(url).await.expect("migrate").close().await;
                let mut conn = <$conn>::connect(url).await.expect("connect");
                let ours: i64 = sqlx::query_scalar(OURS).fetch_one(&mut conn).await.unwrap();
                for sql in future_migration(ours, min_binary(ours), $checksum) {
                    conn.execute(sql.as_str()).await.unwrap();
                }
                conn.close().await.unwrap();
                ours
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn opens_a_newer_compatible_schema() {
                let (_db, url) = $db.await;
                // Declared compatible from this binary's version on (the boundary).
                future(&url, |ours| ours).await;
                let store = $open(&url).await.expect("a compatible newer schema opens");
                assert!(store.sales().await.unwrap().is_empty());
                store.close().await;
            }

            /// Binaries from before bucketed stream entries (schema version 8 and below)
            /// would misread a bucketed sale: the database refuses them; the previous
            /// release (9) still runs beside this one and can be rolled back to.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn declares_binaries_before_bucketed_entries_incompatible() {
                let (_db, url) = $db.await;
                $open(&url).await.expect("migrate").close().await;
                let mut conn = <$conn>::connect(&url).await.expect("connect");
                let min: i64 = sqlx::query_scalar(MIN_BINARY)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(min, BUCKETED_ENTRIES_READ_FROM);
                conn.close().await.unwrap();
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn refuses_a_newer_incompatible_schema() {
                let (_db, url) = $db.await;
                let ours = future(&url, |ours| ours + 1).await;
                assert_refused($open(&url).await, ours);
            }
        }
    };
}

async fn mariadb() -> (flashsale_testkit::mariadb::TestDatabase, String) {
    let db = flashsale_testkit::mariadb::TestDatabase::create().await;
    let url = db.url.clone();
    (db, url)
}

async fn postgres() -> (flashsale_testkit::postgres::TestDatabase, String) {
    let db = flashsale_testkit::postgres::TestDatabase::create().await;
    let url = db.url.clone();
    (db, url)
}

async fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("flashsale.db").display());
    (dir, url)
}

upgrades!(
    mariadb_schema,
    mariadb(),
    MySqlStore::connect,
    MySqlConnection,
    "X'00'"
);
upgrades!(
    postgres_schema,
    postgres(),
    PgStore::connect,
    PgConnection,
    "'\\x00'::bytea"
);
upgrades!(
    sqlite_schema,
    sqlite(),
    SqliteStore::open,
    SqliteConnection,
    "X'00'"
);
