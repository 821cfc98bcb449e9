//! Redis for tests: a unique key prefix on the shared server, or a throwaway server.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use tempfile::TempDir;

/// URL of the shared Redis (the machine's, or `FLASHSALE_TEST_REDIS_URL`).
pub fn shared_url() -> String {
    crate::process::env_or("FLASHSALE_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// A key prefix no other test uses; tests on the shared server put all their keys under it.
pub fn unique_prefix() -> String {
    crate::unique_name("fstest")
}

/// A `redis-server` of this test's own, killed and removed on drop. Its controls are
/// those of `process::server_controls`: a SIGKILL loses whatever was not persisted; a paused
/// one is a replica that stops acknowledging, a primary frozen by a long pause.
pub struct RedisServer {
    pub port: u16,
    dir: TempDir,
    child: Option<Child>,
    args: Vec<String>,
    /// The address it binds to and announces.
    pub bind: String,
    /// A program and leading arguments that run it elsewhere (`ip netns exec <ns>`).
    wrapper: Option<(String, Vec<String>)>,
}

impl RedisServer {
    /// Starts a server without persistence.
    pub async fn spawn() -> RedisServer {
        RedisServer::spawn_with(&["--save", "", "--appendonly", "no"]).await
    }

    /// Starts a server with extra arguments (e.g. `--appendonly yes --appendfsync always`).
    pub async fn spawn_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = crate::free_port();
        let args = extra.iter().map(|s| s.to_string()).collect();
        let mut server = RedisServer {
            port,
            dir,
            child: None,
            args,
            bind: "127.0.0.1".into(),
            wrapper: None,
        };
        server.start().await;
        server
    }

    /// Starts a server run through `wrapper` (a program and its leading arguments, e.g.
    /// `ip netns exec <ns>` from [`crate::netns::Net::exec_prefix`]) on `bind:port`.
    pub async fn spawn_wrapped(
        wrapper: (String, Vec<String>),
        bind: &str,
        port: u16,
        extra: &[&str],
    ) -> RedisServer {
        let mut server = RedisServer {
            port,
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            args: extra.iter().map(|s| s.to_string()).collect(),
            bind: bind.to_owned(),
            wrapper: Some(wrapper),
        };
        server.start().await;
        server
    }

    /// Starts a replica of `primary` (no persistence of its own).
    pub async fn spawn_replica_of(primary: &RedisServer) -> RedisServer {
        let port = primary.port.to_string();
        let args = [
            "--save",
            "",
            "--appendonly",
            "no",
            "--replicaof",
            "127.0.0.1",
            &port,
        ];
        RedisServer::spawn_with(&args).await
    }

    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.bind, self.port)
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Starts (again) on the same port and directory.
    pub async fn start(&mut self) {
        let mut cmd = match &self.wrapper {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(redis_binary());
                cmd
            }
            None => Command::new(redis_binary()),
        };
        cmd.args(["--port", &self.port.to_string(), "--bind", &self.bind])
            .args(["--dir", self.dir.path().to_str().expect("utf-8 path")])
            .args(&self.args);
        let name = "redis-server (is it installed? see scripts/services.sh)";
        let ready = ("redis-server to answer PING", Duration::from_secs(10));
        let url = self.url();
        let up = |url: String| async move { ping(&url).await };
        crate::process::spawn_server(&mut self.child, &mut cmd, name, ready, url, up).await;
    }
}

crate::process::server_controls!(RedisServer);

async fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .is_ok()
}

fn redis_binary() -> String {
    crate::process::env_or("FLASHSALE_TEST_REDIS_SERVER", "redis-server")
}
