//! A real HTTP receiver of webhooks for tests, on a free port: it keeps every request it
//! acknowledged (headers and body), and answers as the test sets it: 204, a status, a hang
//! past any timeout, or a dropped connection. HTTP/1.1 over plain TCP, one request per
//! connection (`Connection: close`), which is all a webhook sender needs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How the receiver answers the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 204, and the request is kept.
    Accept,
    /// This status (e.g. 500); nothing kept.
    Status(u16),
    /// Reads the request and never answers (the sender's timeout must end it).
    Hang,
    /// Closes the connection after reading the request, answering nothing.
    Drop,
}

/// One acknowledged request.
#[derive(Debug, Clone)]
pub struct Received {
    /// Header names lowercased.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

#[derive(Default)]
struct Shared {
    answer: Option<Answer>,
    received: Vec<Received>,
    requests: u64,
}

/// The receiver; stops on drop.
pub struct WebhookReceiver {
    pub port: u16,
    shared: Arc<Mutex<Shared>>,
    task: JoinHandle<()>,
}

impl WebhookReceiver {
    pub async fn spawn() -> WebhookReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, serving.clone()));
            }
        });
        WebhookReceiver { port, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks", self.port)
    }

    pub fn set(&self, answer: Answer) {
        self.shared.lock().expect("lock").answer = Some(answer);
    }

    /// Every request acknowledged so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.shared.lock().expect("lock").received.clone()
    }

    /// Requests seen, answered or not.
    pub fn requests(&self) -> u64 {
        self.shared.lock().expect("lock").requests
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut conn: TcpStream, shared: Arc<Mutex<Shared>>) {
    let Some(request) = read_request(&mut conn).await else {
        return;
    };
    let answer = {
        let mut s = shared.lock().expect("lock");
        s.requests += 1;
        let answer = s.answer.unwrap_or(Answer::Accept);
        if answer == Answer::Accept {
            s.received.push(request);
        }
        answer
    };
    let status = match answer {
        Answer::Accept => 204,
        Answer::Status(code) => code,
        Answer::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        }
        Answer::Drop => return,
    };
    let head = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// One request: its headers and its body (by `content-length`).
async fn read_request(conn: &mut TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let headers: HashMap<String, String> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = buf[end + 4..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Some(Received { headers, body })
}
