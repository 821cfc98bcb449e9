//! PostgreSQL for tests: a database of the test's own on the shared server, dropped on drop.

use sqlx::PgConnection;

/// URL of the shared server (the machine's, or `FLASHSALE_TEST_POSTGRES_URL`), no database:
/// the role `postgres` over TCP without a password.
pub fn shared_server_url() -> String {
    crate::process::env_or(
        "FLASHSALE_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432",
    )
}

/// A database created for one test on the shared server, dropped when this guard drops.
pub struct TestDatabase {
    pub url: String,
    /// The server's maintenance database, to create and drop others from.
    admin: String,
    name: String,
}

impl TestDatabase {
    /// Creates a fresh, empty database on the shared server.
    pub async fn create() -> TestDatabase {
        let server = shared_server_url().trim_end_matches('/').to_owned();
        let (admin, name) = (format!("{server}/postgres"), crate::unique_name("fstest"));
        let create = format!("CREATE DATABASE \"{name}\"");
        let created = crate::execute_once::<PgConnection>(&admin, &create).await;
        created.unwrap_or_else(|e| panic!("{create} on PostgreSQL: {e}"));
        TestDatabase {
            url: format!("{server}/{name}"),
            admin,
            name,
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // FORCE ends the connections a test's pool still holds.
        let drop = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        crate::execute_on_drop::<PgConnection>(&self.admin, &drop);
    }
}
