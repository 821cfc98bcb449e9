//! MariaDB for tests: a database of the test's own on the shared server, or a throwaway server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use sqlx::{Connection, MySqlConnection};
use tempfile::TempDir;

/// URL of the shared server (the machine's, or `FLASHSALE_TEST_MYSQL_URL`), no database.
pub fn shared_server_url() -> String {
    crate::process::env_or("FLASHSALE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306")
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
        let create = format!("CREATE DATABASE `{name}`");
        let created = crate::execute_once::<MySqlConnection>(server_url, &create).await;
        created.unwrap_or_else(|e| panic!("{create} on MariaDB: {e}"));
        let url = format!("{server_url}/{name}");
        TestDatabase {
            url,
            server_url: server_url.to_owned(),
            name,
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let drop = format!("DROP DATABASE IF EXISTS `{}`", self.name);
        crate::execute_on_drop::<MySqlConnection>(&self.server_url, &drop);
    }
}

/// A `mariadbd` of this test's own (for tests that stop or kill the database).
pub struct MariaDbServer {
    pub port: u16,
    /// The address it listens on.
    pub bind: String,
    dir: TempDir,
    child: Option<Child>,
}

impl MariaDbServer {
    pub async fn spawn() -> MariaDbServer {
        MariaDbServer::spawn_on("127.0.0.1").await
    }

    /// A server listening on `bind` (e.g. the root namespace's address on a
    /// [`crate::netns::Net`], so that hosts in namespaces reach it).
    pub async fn spawn_on(bind: &str) -> MariaDbServer {
        let dir = tempfile::tempdir().expect("temp dir");
        install_db(dir.path());
        let mut server = MariaDbServer {
            port: crate::free_port(),
            bind: bind.to_owned(),
            dir,
            child: None,
        };
        server.start().await;
        server
    }

    /// Server URL without a database, as root with no password.
    pub fn url(&self) -> String {
        format!("mysql://root@{}:{}", self.bind, self.port)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub async fn start(&mut self) {
        let dir = self.dir.path();
        let mut cmd = Command::new(crate::process::env_or(
            "FLASHSALE_TEST_MARIADBD",
            "mariadbd",
        ));
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_dir().display()))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!("--tmpdir={}", tmp_dir(dir).display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--bind-address={}", self.bind))
            .args(["--skip-grant-tables", "--user=root"])
            .args([
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
            ]);
        let ready = ("mariadbd to accept connections", Duration::from_secs(60));
        let url = self.url();
        let up = |url: String| async move { MySqlConnection::connect(&url).await.is_ok() };
        crate::process::spawn_server(&mut self.child, &mut cmd, "mariadbd", ready, url, up).await;
    }

    /// SIGKILL, like a crash.
    pub fn kill(&mut self) {
        crate::process::kill(&mut self.child);
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Its own temporary directory: servers that share one (the default `/tmp`) collide on the
/// names of their temporary tables when two bootstrap at once (`Unknown table
/// 'mysql.tmp_user_sys'`), so tests that each spawn a server at the same time failed now and then.
fn tmp_dir(dir: &Path) -> PathBuf {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).expect("mariadbd's temp dir");
    tmp
}

fn install_db(dir: &Path) {
    let out = Command::new(crate::process::env_or(
        "FLASHSALE_TEST_MARIADB_INSTALL_DB",
        "mariadb-install-db",
    ))
    .arg("--no-defaults")
    .arg(format!("--datadir={}", dir.join("data").display()))
    .arg(format!("--tmpdir={}", tmp_dir(dir).display()))
    .args([
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        "--user=root",
    ])
    .output()
    .expect("run mariadb-install-db");
    assert!(
        out.status.success(),
        "mariadb-install-db failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
