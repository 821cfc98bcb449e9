//! PostgreSQL for tests: a database of the test's own on the shared server, dropped on drop.

use sqlx::{Connection, Executor, PgConnection};

/// URL of the shared server (the machine's, or `FLASHSALE_TEST_POSTGRES_URL`), no database:
/// the role `postgres` over TCP without a password.
pub fn shared_server_url() -> String {
    std::env::var("FLASHSALE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// The server's maintenance database, to create and drop others from.
fn admin_url(server_url: &str) -> String {
    format!("{}/postgres", server_url.trim_end_matches('/'))
}

/// A database created for one test and dropped when this guard drops.
pub struct TestDatabase {
    pub url: String,
    server_url: String,
    name: String,
}

impl TestDatabase {
    /// Creates a fresh, empty database on the shared server.
    pub async fn create() -> TestDatabase {
        TestDatabase::create_on(&shared_server_url()).await
    }

    /// Creates a fresh, empty database on the server at `server_url`.
    pub async fn create_on(server_url: &str) -> TestDatabase {
        let name = crate::unique_name("fstest");
        let mut conn = PgConnection::connect(&admin_url(server_url))
            .await
            .expect("connect to PostgreSQL");
        conn.execute(format!("CREATE DATABASE \"{name}\"").as_str())
            .await
            .expect("create database");
        let url = format!("{}/{name}", server_url.trim_end_matches('/'));
        TestDatabase {
            url,
            server_url: server_url.to_owned(),
            name,
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (admin, name) = (admin_url(&self.server_url), self.name.clone());
        // FORCE ends the connections a test's pool still holds.
        crate::block_on_thread(async move {
            if let Ok(mut conn) = PgConnection::connect(&admin).await {
                let drop = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                let _ = conn.execute(drop.as_str()).await;
            }
        });
    }
}
