//! The order-event relay under the fault schedules: a throwaway `nats-server -js` of the run's
//! own, the relay's settings given to every serve and worker process (each runs a relay; the
//! database lease keeps one delivering), so the relays meet every fault the schedule lands
//! (kill -9 of a serve instance or the worker, MariaDB killed, Redis lost, partitions). After
//! the run quiesces, the admin API's relay status is polled until no sink lags, and what the
//! JetStream stream holds is checked against the database: every stored transition (and
//! every notice: losses the reconcilers reported, sales sold out) delivered once after
//! dedupe by `id`, nothing else, each order's events in order
//! ([`flashsale_testkit::events::check_exactly_once`]).

use std::sync::Mutex;
use std::time::Duration;

use flashsale_core::events::CloudEvent;
use flashsale_engine::relay;
use flashsale_testkit::events::check_exactly_once;
use flashsale_testkit::nats_server::{self, NatsServer};
use serde_json::Value;

use super::checker::{Failure, Verdict};
use super::procs::{Stack, ADMIN};

/// How long the relay gets to deliver everything after the run quiesced.
const DELIVERED_LIMIT: Duration = Duration::from_secs(30);
/// How long the delivered and the stored are compared again while they differ (a hold that
/// expires after the quiesce is stored, then delivered).
const MATCH_LIMIT: Duration = Duration::from_secs(15);

/// The run's NATS and the names its relays publish under.
pub struct Relayed {
    server: NatsServer,
    subject: String,
    stream: String,
}

impl Relayed {
    /// A NATS server listening on `host` (where every process of the run reaches it).
    pub async fn spawn_on(host: &str) -> Relayed {
        let (subject, stream) = nats_server::unique_names();
        Relayed {
            server: NatsServer::spawn_on(host).await,
            subject,
            stream,
        }
    }

    /// The relay's settings, for every flashsale process of the run.
    pub fn vars(&self) -> Vec<(String, String)> {
        [
            ("FLASHSALE_EVENTS_NATS_URL", self.server.url()),
            ("FLASHSALE_EVENTS_NATS_SUBJECT", self.subject.clone()),
            ("FLASHSALE_EVENTS_NATS_STREAM", self.stream.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// After the quiesce: the relay caught up, and the stream holds exactly what the database
    /// stored. A breach is a failure of the verdict; the counts are a note.
    pub async fn judge(&self, stack: &impl Stack, db_url: &str, verdict: &mut Verdict) {
        match self.check(stack, db_url).await {
            Ok(note) => verdict.notes.push(note),
            Err(detail) => verdict.failures.push(Failure {
                check: "events-exactly-once",
                detail,
            }),
        }
    }

    async fn check(&self, stack: &impl Stack, db_url: &str) -> Result<String, String> {
        caught_up(stack).await?;
        let store = flashsale_engine::backends::open_store(db_url)
            .await
            .map_err(|e| format!("open the database: {e}"))?;
        let log = store.event_log().ok_or("the store keeps no event log")?;
        let last = Mutex::new(String::new());
        let matched = flashsale_testkit::wait::within(MATCH_LIMIT, || async {
            // Delivered first: whatever was delivered was stored before it.
            let delivered = match self.consumed().await {
                Ok(d) => d,
                Err(e) => return Some(Err(e)),
            };
            let stored = match relay::stored_events(log.as_ref()).await {
                Ok(s) => s,
                Err(e) => return Some(Err(format!("read the event log: {e}"))),
            };
            match check_exactly_once(&stored, &delivered) {
                Ok(d) => Some(Ok(summary(&stored, d.received, d.unique))),
                Err(why) => {
                    *last.lock().unwrap() = why;
                    None
                }
            }
        })
        .await;
        matched.unwrap_or_else(|| Err(last.into_inner().unwrap()))
    }

    /// Every message of the run's stream, in stream order.
    async fn consumed(&self) -> Result<Vec<CloudEvent>, String> {
        let client = async_nats::connect(self.server.url())
            .await
            .map_err(|e| format!("connect to NATS: {e}"))?;
        let js = async_nats::jetstream::new(client);
        let Ok(mut stream) = js.get_stream(&self.stream).await else {
            // No relay ever published: an empty stream.
            return Ok(Vec::new());
        };
        let info = stream
            .info()
            .await
            .map_err(|e| format!("stream info: {e}"))?;
        let (first, last) = (info.state.first_sequence, info.state.last_sequence);
        let mut out = Vec::new();
        for seq in first.max(1)..=last {
            let msg = (stream.get_raw_message(seq).await)
                .map_err(|e| format!("stream message {seq}: {e}"))?;
            let event = serde_json::from_slice(&msg.payload)
                .map_err(|e| format!("stream message {seq} is no event: {e}"))?;
            out.push(event);
        }
        Ok(out)
    }
}

/// `events: S stored (notices N), R delivered to NATS (U unique)`.
fn summary(stored: &[CloudEvent], received: usize, unique: usize) -> String {
    let notices = stored
        .iter()
        .filter(|e| matches!(e.suffix(), "order.lost" | "sale.sold_out"))
        .count();
    format!(
        "events: {} stored (notices {notices}), {received} delivered to NATS ({unique} unique)",
        stored.len()
    )
}

/// Polls `GET /api/v1/admin/events` on instance 0 until the NATS sink lags by nothing.
async fn caught_up(stack: &impl Stack) -> Result<(), String> {
    let url = format!("{}/api/v1/admin/events", stack.base(0));
    let last = Mutex::new(String::from("no answer"));
    let done = flashsale_testkit::wait::within(DELIVERED_LIMIT, || async {
        let resp = stack.http().get(&url).bearer_auth(ADMIN).send().await;
        let body: Value = match resp {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(e) => {
                *last.lock().unwrap() = e.to_string();
                return None;
            }
        };
        let sinks = body["sinks"].as_array().cloned().unwrap_or_default();
        let nats = sinks.iter().find(|s| s["sink"] == "nats")?;
        *last.lock().unwrap() = format!(
            "lag {} events, oldest {} ms, paused {}, last error {}",
            nats["lag_events"], nats["oldest_age_ms"], nats["paused"], nats["last_error"]
        );
        (nats["lag_events"] == 0).then_some(())
    })
    .await;
    done.ok_or_else(|| {
        format!(
            "the NATS relay still lags {DELIVERED_LIMIT:?} after the quiesce: {}",
            last.into_inner().unwrap()
        )
    })
}
