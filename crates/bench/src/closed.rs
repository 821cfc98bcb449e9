//! A closed-loop HTTP driver: `concurrency` clients, each sending its next request as soon as
//! the previous one is answered, for a fixed time. The same driver measures every endpoint of
//! a comparison, so the ratio between them is fair.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Builds request number `i` (unique across clients).
pub type MakeRequest = Arc<dyn Fn(&reqwest::Client, u64) -> reqwest::RequestBuilder + Send + Sync>;

#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    pub name: String,
    pub requests: u64,
    /// Answers with the expected status.
    pub ok: u64,
    pub seconds: f64,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// When a run ends.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// After this long.
    After(Duration),
    /// After this many requests (a count, for instruction counts per answer).
    Requests(u64),
}

impl Stop {
    fn done(self, started: Instant, i: u64) -> bool {
        match self {
            Stop::After(d) => started.elapsed() >= d,
            Stop::Requests(n) => i >= n,
        }
    }
}

impl From<Duration> for Stop {
    fn from(d: Duration) -> Stop {
        Stop::After(d)
    }
}

/// Runs `make` in a closed loop until `stop` (a `Duration`, or [`Stop::Requests`]); an
/// answer counts as ok when its status is `expect`.
pub async fn run(
    name: &str,
    make: MakeRequest,
    expect: u16,
    concurrency: usize,
    stop: impl Into<Stop>,
) -> anyhow::Result<Rate> {
    let stop = stop.into();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .tcp_nodelay(true)
        .build()?;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, make, next) = (client.clone(), make.clone(), next.clone());
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
                let mut ok = 0u64;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if stop.done(started, i) {
                        break;
                    }
                    let sent = Instant::now();
                    let status = make(&client, i)
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0);
                    h.saturating_record(sent.elapsed().as_micros().max(1) as u64);
                    ok += u64::from(status == expect);
                }
                (h, ok)
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut ok = 0;
    for t in tasks {
        let (h, n) = t.await?;
        all.add(h)?;
        ok += n;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Rate {
        name: name.to_owned(),
        requests: all.len(),
        ok,
        seconds,
        per_s: ok as f64 / seconds,
        p50_ms: all.value_at_quantile(0.5) as f64 / 1_000.0,
        p99_ms: all.value_at_quantile(0.99) as f64 / 1_000.0,
    })
}
