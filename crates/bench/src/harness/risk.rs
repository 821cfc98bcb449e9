//! `bench http --risk MODE`: a tiny risk service of the bench's own, so the accepted path can
//! be measured with the shop's risk check in it. It answers `{"allow": true}` to everyone:
//! `instant` at once, `<N>ms` after N ms (a slow shop), `down` not at all (its port is closed:
//! connections are refused, as after a crash). `off` runs no service and no check.
//!
//! It runs on the bench's runtime, beside the server and the load generator (all of `bench
//! http` shares one process), so its CPU is counted in the `flashsale` column.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RiskMode {
    Off,
    Instant,
    Delay(Duration),
    Down,
}

impl RiskMode {
    pub fn parse(s: &str) -> anyhow::Result<RiskMode> {
        let ms = |n: &str| n.parse::<u64>().map(Duration::from_millis);
        match s {
            "off" => Ok(RiskMode::Off),
            "instant" => Ok(RiskMode::Instant),
            "down" => Ok(RiskMode::Down),
            _ => match s.strip_suffix("ms").map(ms) {
                Some(Ok(d)) => Ok(RiskMode::Delay(d)),
                _ => anyhow::bail!("--risk {s:?}: off, instant, <N>ms or down"),
            },
        }
    }
}

/// The running service: its URL and how many calls it answered.
pub struct RiskServer {
    pub url: String,
    pub calls: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RiskServer {
    /// `None` for `off`.
    pub async fn start(mode: RiskMode) -> anyhow::Result<Option<RiskServer>> {
        let delay = match mode {
            RiskMode::Off => return Ok(None),
            RiskMode::Down => return Ok(Some(RiskServer::down().await?)),
            RiskMode::Instant => Duration::ZERO,
            RiskMode::Delay(d) => d,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/check", listener.local_addr()?);
        let calls = Arc::new(AtomicU64::new(0));
        let app = Router::new()
            .route("/check", post(answer))
            .with_state((calls.clone(), delay));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Some(RiskServer {
            url,
            calls,
            task: Some(task),
        }))
    }

    /// A port that was just bound and closed: nothing listens there.
    async fn down() -> anyhow::Result<RiskServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/check", listener.local_addr()?);
        drop(listener);
        Ok(RiskServer {
            url,
            calls: Arc::default(),
            task: None,
        })
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

impl Drop for RiskServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn answer(
    State((calls, delay)): State<(Arc<AtomicU64>, Duration)>,
    Json(_): Json<Value>,
) -> Json<Value> {
    if !delay.is_zero() {
        // The slow shop being measured, not a wait for anything.
        tokio::time::sleep(delay).await;
    }
    calls.fetch_add(1, Ordering::Relaxed);
    Json(json!({"allow": true}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!(RiskMode::parse("off").unwrap(), RiskMode::Off);
        assert_eq!(RiskMode::parse("instant").unwrap(), RiskMode::Instant);
        assert_eq!(RiskMode::parse("down").unwrap(), RiskMode::Down);
        let d = RiskMode::parse("20ms").unwrap();
        assert_eq!(d, RiskMode::Delay(Duration::from_millis(20)));
        assert!(RiskMode::parse("20").is_err() && RiskMode::parse("fast").is_err());
    }
}
