//! The NATS JetStream sink: each event published to `<subject>.<sku>.<type tail>` (e.g.
//! `flashsale.events.42.order.created`) with `Nats-Msg-Id` = the event id, so the stream drops
//! a re-delivery inside its duplicate window; acknowledged only by its PubAck. The stream
//! (subjects `<subject>.>`) is created when missing, on connect and after a failure.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_trait::async_trait;
use flashsale_core::events::CloudEvent;
use tokio::time::{timeout, Instant};

use super::Sink;

/// `FLASHSALE_EVENTS_NATS_*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsSettings {
    pub url: String,
    /// Subjects start with it.
    pub subject: String,
    /// The JetStream stream that holds them.
    pub stream: String,
}

impl NatsSettings {
    pub const DEFAULT_SUBJECT: &'static str = "flashsale.events";
    pub const DEFAULT_STREAM: &'static str = "FLASHSALE_EVENTS";

    pub fn new(url: &str) -> NatsSettings {
        NatsSettings {
            url: url.to_owned(),
            subject: Self::DEFAULT_SUBJECT.to_owned(),
            stream: Self::DEFAULT_STREAM.to_owned(),
        }
    }

    /// The subject of one event.
    pub fn subject_of(&self, event: &CloudEvent) -> String {
        format!("{}.{}.{}", self.subject, event.partitionkey, event.suffix())
    }
}

/// How long the stream keeps a message id to drop its duplicates (JetStream's default is
/// two minutes; a relay that retries after a long broker outage may exceed that, which the
/// consumers' own dedupe by id covers).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(600);
/// A connect, a stream look-up or one PubAck, at most.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Publishes to JetStream (see the module's doc).
pub struct NatsSink {
    settings: NatsSettings,
    js: Option<jetstream::Context>,
    stream_ready: bool,
}

impl NatsSink {
    pub fn new(settings: NatsSettings) -> NatsSink {
        NatsSink {
            settings,
            js: None,
            stream_ready: false,
        }
    }

    /// The JetStream context, connecting and creating the stream when needed.
    async fn ready(&mut self) -> anyhow::Result<jetstream::Context> {
        let js = match &self.js {
            Some(js) => js.clone(),
            None => {
                let client = async_nats::ConnectOptions::new()
                    .connection_timeout(CALL_TIMEOUT)
                    .connect(self.settings.url.as_str())
                    .await?;
                let js = jetstream::ContextBuilder::new()
                    .timeout(CALL_TIMEOUT)
                    .ack_timeout(CALL_TIMEOUT)
                    .build(client);
                self.js = Some(js.clone());
                js
            }
        };
        if !self.stream_ready {
            let config = stream::Config {
                name: self.settings.stream.clone(),
                subjects: vec![format!("{}.>", self.settings.subject)],
                duplicate_window: DUPLICATE_WINDOW,
                storage: stream::StorageType::File,
                ..Default::default()
            };
            timeout(CALL_TIMEOUT, js.get_or_create_stream(config))
                .await
                .map_err(|_| anyhow::anyhow!("JetStream stream look-up timed out"))??;
            self.stream_ready = true;
        }
        Ok(js)
    }

    /// Publishes every event (pipelined), then waits for the PubAcks in order: the count of
    /// the acknowledged prefix, and the first failure.
    async fn publish(
        &self,
        js: &jetstream::Context,
        events: &[CloudEvent],
        budget: Duration,
    ) -> (usize, Option<anyhow::Error>) {
        let deadline = Instant::now() + budget.max(CALL_TIMEOUT);
        let mut pending = Vec::with_capacity(events.len());
        let mut error = None;
        for e in events {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, e.id.as_str());
            headers.insert("Content-Type", "application/cloudevents+json");
            let subject = self.settings.subject_of(e);
            let sent = timeout(
                CALL_TIMEOUT,
                js.publish_with_headers(subject, headers, e.to_json().into()),
            )
            .await;
            match sent {
                Ok(Ok(ack)) => pending.push(ack),
                Ok(Err(err)) => {
                    error = Some(anyhow::Error::from(err).context("publish"));
                    break;
                }
                Err(_) => {
                    error = Some(anyhow::anyhow!("publish timed out"));
                    break;
                }
            }
        }
        let mut acked = 0;
        for ack in pending {
            let left = deadline.saturating_duration_since(Instant::now());
            match timeout(left.max(Duration::from_millis(1)), ack).await {
                Ok(Ok(_)) => acked += 1,
                Ok(Err(err)) => return (acked, Some(anyhow::Error::from(err).context("PubAck"))),
                Err(_) => return (acked, Some(anyhow::anyhow!("PubAck timed out"))),
            }
        }
        (acked, error)
    }
}

#[async_trait]
impl Sink for NatsSink {
    fn name(&self) -> &'static str {
        "nats"
    }

    async fn deliver(
        &mut self,
        events: &[CloudEvent],
        budget: Duration,
    ) -> (usize, Option<anyhow::Error>) {
        let js = match self.ready().await {
            Ok(js) => js,
            Err(e) => return (0, Some(e.context(format!("NATS at {}", self.settings.url)))),
        };
        let (acked, error) = self.publish(&js, events, budget).await;
        if error.is_some() {
            // The stream may be gone (deleted, a server with a fresh store): look again.
            self.stream_ready = false;
        }
        (acked, error)
    }

    fn pause_after(&self) -> Option<u32> {
        None
    }
}
