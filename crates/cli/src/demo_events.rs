//! `flashsale demo --webhook`: the demo runs a webhook receiver of its own, points the
//! service's order-event relay at it (a fresh `whsec_` secret), and after the sale reports the
//! events delivered against the orders and transitions the database stored. The receiver is
//! what a shop's would be: it checks each Standard Webhooks signature and deduplicates by
//! `webhook-id`.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use flashsale_bench::report::Check;
use flashsale_core::SkuId;
use flashsale_engine::relay::{self, webhook};
use flashsale_server::Server;

#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    received: u64,
    bad_signatures: u64,
}

/// The receiver, on a loopback port; stops with the demo.
pub struct DemoReceiver {
    pub url: String,
    pub secret: String,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    key: Vec<u8>,
    seen: Arc<Mutex<Seen>>,
}

impl DemoReceiver {
    pub async fn start() -> anyhow::Result<DemoReceiver> {
        let key: [u8; 32] = rand::random();
        let secret = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(key)
        );
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = Arc::new(Shared {
            key: key.to_vec(),
            seen: seen.clone(),
        });
        let app = axum::Router::new()
            .route("/hooks", axum::routing::post(hook))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}/hooks", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(DemoReceiver {
            url,
            secret,
            seen,
            task,
        })
    }

    /// Waits (at most a minute) until the relay has delivered every stored event, then
    /// counts: what the database stored against what this receiver got.
    pub async fn report(
        &self,
        server: &Server,
        sku: u64,
        database: &mut BTreeMap<String, i64>,
    ) -> anyhow::Result<Check> {
        let log = server
            .state
            .shop
            .store()
            .event_log()
            .context("no event log")?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let caught_up = loop {
            let status = relay::status(log.as_ref(), &["webhook"]).await?;
            if status
                .iter()
                .any(|s| s.row.sink == "webhook" && s.lag_events == 0)
            {
                break true;
            }
            if std::time::Instant::now() >= deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut stored = HashSet::new();
        for head in log.event_streams().await? {
            if head.stream.sku != SkuId(sku) {
                continue;
            }
            // The relay's own reading: a sale's notices (sold out, lost) are a stream too.
            let rows = relay::entries(log.as_ref(), head.stream, 0, usize::MAX >> 1).await?;
            stored.extend(rows.into_iter().filter_map(|e| e.event).map(|e| e.id));
        }
        let orders = stored.iter().filter(|id| id.ends_with(".created")).count();
        let seen = self.seen.lock().expect("seen lock");
        let missing = stored.difference(&seen.ids).count();
        let unknown = seen.ids.difference(&stored).count();
        database.insert("order events stored".into(), stored.len() as i64);
        database.insert(
            "order events delivered (webhook)".into(),
            seen.ids.len() as i64,
        );
        database.insert("webhook posts received".into(), seen.received as i64);
        let held = caught_up && missing == 0 && unknown == 0 && seen.bad_signatures == 0;
        Ok(Check {
            name: "order events delivered".into(),
            held,
            detail: format!(
                "{} distinct events of {} stored transitions ({orders} orders) reached the \
                 demo's webhook, {} posts in all; missing {missing}, unknown {unknown}, bad \
                 signatures {}{}",
                seen.ids.len(),
                stored.len(),
                seen.received,
                seen.bad_signatures,
                if caught_up {
                    ""
                } else {
                    "; the relay did not catch up in 60 s"
                }
            ),
        })
    }
}

impl Drop for DemoReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One webhook: 204 once its signature holds and its event is kept; 401 otherwise.
async fn hook(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(ts), Some(sig)) = (
        header("webhook-id"),
        header("webhook-timestamp").and_then(|t| t.parse::<i64>().ok()),
        header("webhook-signature"),
    ) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut seen = shared.seen.lock().expect("seen lock");
    seen.received += 1;
    if !webhook::verify(&shared.key, id, ts, &body, sig) {
        seen.bad_signatures += 1;
        return StatusCode::UNAUTHORIZED;
    }
    seen.ids.insert(id.to_owned());
    StatusCode::NO_CONTENT
}
