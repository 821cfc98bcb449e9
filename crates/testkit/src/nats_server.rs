//! NATS for tests: unique subjects and stream names on the shared server with JetStream, or a
//! throwaway `nats-server -js` of the test's own (its own port and store dir) for tests that
//! kill or restart it.

use std::process::{Child, Command};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::AsyncReadExt;

/// URL of the shared NATS with JetStream (the machine's, or `FLASHSALE_TEST_NATS_URL`).
pub fn shared_url() -> String {
    crate::process::env_or("FLASHSALE_TEST_NATS_URL", "nats://127.0.0.1:4222")
}

/// A subject prefix and a stream name no other test uses (streams on one server must not
/// share subjects).
pub fn unique_names() -> (String, String) {
    let name = crate::unique_name("fstest");
    (format!("{name}.events"), name.to_uppercase())
}

/// A `nats-server` with JetStream of this test's own, killed on drop; its store survives a
/// restart (same dir), as a server's disk would: after a SIGKILL JetStream recovers it on the
/// next start. Its controls (kill, pause, resume) are those of `process::server_controls`.
pub struct NatsServer {
    pub port: u16,
    /// The address it listens on (127.0.0.1, or a bridge's for processes in namespaces).
    host: String,
    dir: TempDir,
    child: Option<Child>,
}

impl NatsServer {
    pub async fn spawn() -> NatsServer {
        NatsServer::spawn_on("127.0.0.1").await
    }

    /// Like [`NatsServer::spawn`], listening on `host`.
    pub async fn spawn_on(host: &str) -> NatsServer {
        let mut server = NatsServer {
            port: crate::free_port(),
            host: host.to_owned(),
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        server.start().await;
        server
    }

    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.host, self.port)
    }

    /// Starts (again) on the same port and store dir; waits for its INFO with JetStream.
    pub async fn start(&mut self) {
        let mut cmd = Command::new(nats_binary());
        cmd.args(["-a", &self.host, "-p", &self.port.to_string(), "-js"])
            .args(["-sd", self.dir.path().to_str().expect("utf-8 path")]);
        let name = "nats-server (is it installed? see scripts/test-deps.sh)";
        let ready = (
            "nats-server to greet with JetStream",
            Duration::from_secs(15),
        );
        let addr = format!("{}:{}", self.host, self.port);
        crate::process::spawn_server(&mut self.child, &mut cmd, name, ready, addr, greets).await;
    }
}

crate::process::server_controls!(NatsServer);

/// Whether the server at `addr` greets a client with an INFO that offers JetStream.
async fn greets(addr: String) -> bool {
    let Ok(Ok(mut conn)) = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(&addr),
    )
    .await
    else {
        return false;
    };
    let mut buf = vec![0u8; 4096];
    let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), conn.read(&mut buf)).await else {
        return false;
    };
    let info = String::from_utf8_lossy(&buf[..n]);
    info.starts_with("INFO ") && info.contains("\"jetstream\":true")
}

fn nats_binary() -> String {
    crate::process::env_or("FLASHSALE_TEST_NATS_SERVER", "nats-server")
}
