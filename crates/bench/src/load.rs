//! The load generator.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

/// One buyer: user id and bearer token.
#[derive(Debug, Clone)]
pub struct Buyer {
    pub user_id: u64,
    pub token: String,
}

/// How buyers arrive.
#[derive(Debug, Clone, Copy)]
pub enum Arrival {
    /// Buyer `i` of `n` is due at `ramp_ms * i / n` after the start.
    Spike { ramp_ms: u64 },
    /// Arrivals ramp linearly from 0 to `rate_per_s` within `ramp_ms`, then hold that rate.
    Ramp { rate_per_s: u64, ramp_ms: u64 },
    /// As fast as `concurrency` clients can go.
    Closed,
}

#[derive(Debug, Clone)]
pub struct Plan {
    /// Base URLs, used round-robin (several instances).
    pub targets: Vec<String>,
    pub sku_id: u64,
    pub buyers: Vec<Buyer>,
    pub quantity: u32,
    pub concurrency: usize,
    pub arrival: Arrival,
    pub timeout: Duration,
    /// Tries after the first, each with the same request id.
    pub retries_max: u32,
}

/// What happened to one buyer.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub user_id: u64,
    /// Microseconds from the run's start to when the buyer was due.
    pub due_us: u64,
    /// Microseconds from due to the final answer (includes waiting for a client and retries).
    pub latency_us: u64,
    /// HTTP status of the final answer; 0 when every try failed in transport.
    pub status: u16,
    /// Error code of the final answer, or "ACCEPTED" / "REPLAYED".
    pub outcome: String,
    pub order_no: Option<String>,
    pub tries: u32,
}

#[cfg(test)]
impl Record {
    /// Two purchases accepted in the first 100 ms (1 ms and 3 ms), one SOLD_OUT at 250 ms.
    pub(crate) fn three_answers() -> Vec<Record> {
        vec![
            Record::answered(0, 1_000, "ACCEPTED"),
            Record::answered(10_000, 3_000, "ACCEPTED"),
            Record::answered(250_000, 500, "SOLD_OUT"),
        ]
    }

    /// A buyer answered on the first try (for the tests of what is computed from records).
    pub(crate) fn answered(due_us: u64, latency_us: u64, outcome: &str) -> Record {
        Record {
            user_id: 1,
            due_us,
            latency_us,
            status: 202,
            outcome: outcome.into(),
            order_no: None,
            tries: 1,
        }
    }
}

/// Fires the plan; `on_done` is called once per finished buyer with its record (a progress
/// bar; the reserve demo, whose buyers act on their holds at once).
pub async fn run(
    plan: Plan,
    on_done: impl Fn(&Record) + Send + Sync + 'static,
) -> anyhow::Result<Vec<Record>> {
    anyhow::ensure!(
        !plan.targets.is_empty() && plan.concurrency > 0,
        "need targets and concurrency"
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(plan.concurrency)
        .timeout(plan.timeout)
        .tcp_nodelay(true)
        .build()?;
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicUsize::new(0));
    let on_done = Arc::new(on_done);
    let start = Instant::now();
    let workers: Vec<_> = (0..plan.concurrency)
        .map(|_| {
            tokio::spawn(client_loop(
                plan.clone(),
                client.clone(),
                next.clone(),
                start,
                on_done.clone(),
            ))
        })
        .collect();
    let mut records = Vec::with_capacity(plan.buyers.len());
    for w in workers {
        records.extend(w.await?);
    }
    records.sort_by_key(|r| r.due_us);
    Ok(records)
}

async fn client_loop(
    plan: Arc<Plan>,
    client: reqwest::Client,
    next: Arc<AtomicUsize>,
    start: Instant,
    on_done: Arc<dyn Fn(&Record) + Send + Sync>,
) -> Vec<Record> {
    let mut records = Vec::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(buyer) = plan.buyers.get(i) else {
            break;
        };
        let due = due_at(&plan, i);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let target = &plan.targets[i % plan.targets.len()];
        let mut record = buy(&client, &plan, target, buyer, i).await;
        record.due_us = due.as_micros() as u64;
        record.latency_us = (start.elapsed().saturating_sub(due)).as_micros() as u64;
        on_done(&record);
        records.push(record);
    }
    records
}

fn due_at(plan: &Plan, i: usize) -> Duration {
    match plan.arrival {
        Arrival::Spike { ramp_ms } => {
            let n = plan.buyers.len().max(1) as u64;
            Duration::from_micros(ramp_ms * 1_000 * i as u64 / n)
        }
        Arrival::Ramp {
            rate_per_s,
            ramp_ms,
        } => ramp_due(i as f64, rate_per_s as f64, ramp_ms as f64 / 1e3),
        Arrival::Closed => Duration::ZERO,
    }
}

/// Arrival `i` when the rate grows linearly to `rate` over `ramp_s` seconds and then holds:
/// during the ramp N(t) = rate·t²/(2·ramp_s), after it N(t) = rate·ramp_s/2 + rate·(t − ramp_s).
fn ramp_due(i: f64, rate: f64, ramp_s: f64) -> Duration {
    let rate = rate.max(1.0);
    let in_ramp = rate * ramp_s / 2.0;
    let t = if i <= in_ramp {
        (2.0 * ramp_s * i / rate).sqrt()
    } else {
        ramp_s + (i - in_ramp) / rate
    };
    Duration::from_secs_f64(t)
}

/// One buyer's purchase, retried with the same request id on timeouts, transport errors,
/// 429 and 503.
async fn buy(
    client: &reqwest::Client,
    plan: &Plan,
    target: &str,
    buyer: &Buyer,
    i: usize,
) -> Record {
    let url = format!("{target}/api/v1/sales/{}/purchases", plan.sku_id);
    let body = json!({"request_id": format!("demo-{i}"), "quantity": plan.quantity});
    let mut record = Record {
        user_id: buyer.user_id,
        due_us: 0,
        latency_us: 0,
        status: 0,
        outcome: "TRANSPORT_ERROR".into(),
        order_no: None,
        tries: 0,
    };
    while record.tries <= plan.retries_max {
        record.tries += 1;
        let sent = client
            .post(&url)
            .bearer_auth(&buyer.token)
            .json(&body)
            .send()
            .await;
        let Ok(resp) = sent else {
            record.outcome = "TIMEOUT_OR_TRANSPORT".into();
            continue;
        };
        record.status = resp.status().as_u16();
        let value: serde_json::Value = resp.json().await.unwrap_or_default();
        record.outcome = outcome_of(record.status, &value);
        record.order_no = value["order_no"].as_str().map(str::to_owned);
        if !matches!(record.status, 429 | 503) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20 << record.tries.min(5))).await;
    }
    record
}

fn outcome_of(status: u16, body: &serde_json::Value) -> String {
    match (status, body["replayed"].as_bool()) {
        (202, Some(true)) => "REPLAYED".into(),
        (202, _) => "ACCEPTED".into(),
        _ => body["code"].as_str().unwrap_or("UNKNOWN").to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_reaches_its_rate_and_holds_it() {
        let d = |i| ramp_due(i, 1_000.0, 1.0).as_secs_f64();
        assert_eq!(d(0.0), 0.0);
        assert!(
            (d(500.0) - 1.0).abs() < 1e-9,
            "half a ramp's area by its end"
        );
        assert!((d(1_500.0) - 2.0).abs() < 1e-9, "then 1,000 per second");
        assert!(d(10.0) > d(9.0));
    }
}
