//! The order-event relay: every transition the system of record stored, delivered to the
//! shop's other systems as CloudEvents ([`flashsale_core::events`]), from the database's own
//! ordered event log and never from Redis.
//!
//! One [`Relay`] per sink ([`nats::NatsSink`], [`webhook::WebhookSink`]), a [`Worker`] of the
//! one runner. Each step it holds the sink's lease in the database (so of N processes one
//! delivers; both ledgers have the database, only one has Redis), reads each stream after the
//! sink's position, delivers the events in seq order and moves the position by compare and
//! set, only over what the sink acknowledged. A relay killed between the acknowledgement and
//! the position's write delivers those events again after restart: delivery is at least once,
//! and consumers deduplicate by the event `id` (NATS JetStream does it for them within its
//! duplicate window, by `Nats-Msg-Id`). A failed delivery is retried with exponential backoff
//! and jitter; a sink that fails `pause_after` times in a row is paused (an alert and a
//! gauge) until an operator resumes it, and never skips an event.
//!
//! A sale's notices (an order reported lost, the sale sold out) are one more stream of the
//! log ([`StreamKey::notices`]), delivered the same way ([`entries`]).
//!
//! [`status`] is what `GET /api/v1/admin/events` shows; [`redeliver`] and [`resume`] are its
//! operator actions.

pub mod nats;
pub mod webhook;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_core::events::{CloudEvent, EventLog, SinkRow, StreamKey};
use flashsale_core::metric_names as m;
use serde::Serialize;

use crate::now_ms;
use crate::runner::{Worker, WorkerState};

/// Where order events go, and how the relay runs (`FLASHSALE_EVENTS_*`, `FLASHSALE_WEBHOOK_*`).
#[derive(Debug, Clone)]
pub struct EventsSettings {
    /// Run the relays of the configured sinks in this process (the lease keeps one active).
    pub run: bool,
    pub nats: Option<nats::NatsSettings>,
    pub webhook: Option<webhook::WebhookSettings>,
    pub relay: RelaySettings,
}

impl Default for EventsSettings {
    fn default() -> EventsSettings {
        EventsSettings {
            run: true,
            nats: None,
            webhook: None,
            relay: RelaySettings::default(),
        }
    }
}

/// The relay's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelaySettings {
    /// Events read and delivered per stream per step.
    pub batch_max: usize,
    /// Between looks at the log when it had nothing new.
    pub poll: Duration,
    /// How long a sink's lease lasts unrenewed (a killed relay's is taken over after it).
    pub lease_ttl: Duration,
    /// The first and the longest wait between retries of a failing delivery.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for RelaySettings {
    fn default() -> RelaySettings {
        RelaySettings {
            batch_max: 512,
            poll: Duration::from_millis(50),
            lease_ttl: Duration::from_secs(10),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// Where a relay delivers.
#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// The sink's name in the database, metrics and the admin API (`nats`, `webhook`).
    fn name(&self) -> &'static str;

    /// Delivers `events` in order, spending at most about `budget`; answers how many of them
    /// (a prefix) the sink acknowledged, and the error that stopped it short, if one did.
    async fn deliver(
        &mut self,
        events: &[CloudEvent],
        budget: Duration,
    ) -> (usize, Option<anyhow::Error>);

    /// Failures in a row after which the sink is paused for an operator (`None`: never: a
    /// broker that is down is waited for).
    fn pause_after(&self) -> Option<u32>;
}

/// The relays `settings` configure, each under `holder`'s name, over `log`.
pub fn relays(
    settings: &EventsSettings,
    holder: &str,
    log: Option<Arc<dyn EventLog>>,
) -> anyhow::Result<Vec<Relay>> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(n) = &settings.nats {
        sinks.push(Box::new(nats::NatsSink::new(n.clone())));
    }
    if let Some(w) = &settings.webhook {
        sinks.push(Box::new(webhook::WebhookSink::new(w)?));
    }
    if !settings.run || sinks.is_empty() {
        return Ok(Vec::new());
    }
    let log = log.ok_or_else(|| anyhow::anyhow!("order events need a database event log"))?;
    Ok(sinks
        .into_iter()
        .map(|sink| Relay::new(sink, log.clone(), holder, settings.relay))
        .collect())
}

/// One row of a stream as the relay delivers it: its seq, when its transition happened, and
/// its event (`None`: a row that announces nothing, one the guard rejected).
#[derive(Debug, Clone)]
pub struct Entry {
    pub seq: u64,
    pub at_ms: i64,
    pub event: Option<CloudEvent>,
}

/// The rows of `stream` after `after`, by seq, at most `max`: the order events of a sale's
/// (or a bucket's) stream, or the notices of its notice stream.
pub async fn entries(
    log: &dyn EventLog,
    stream: StreamKey,
    after: u64,
    max: usize,
) -> Result<Vec<Entry>, flashsale_core::StoreError> {
    if stream.is_notices() {
        let notices = log.logged_notices(stream.sku, after, max).await?;
        return Ok(notices
            .iter()
            .map(|n| Entry {
                seq: n.seq,
                at_ms: n.at_ms,
                event: Some(CloudEvent::of_notice(n)),
            })
            .collect());
    }
    let rows = log.logged_events(stream, after, max).await?;
    Ok(rows
        .iter()
        .map(|l| Entry {
            seq: l.event.seq,
            at_ms: l.event.at_ms,
            event: CloudEvent::of(l),
        })
        .collect())
}

/// Every event the database stored, over every stream, each stream in seq order: what a
/// consumer that deduplicates by `id` must end up holding.
pub async fn stored_events(
    log: &dyn EventLog,
) -> Result<Vec<CloudEvent>, flashsale_core::StoreError> {
    let mut out = Vec::new();
    for head in log.event_streams().await? {
        let mut at = 0;
        while at < head.head {
            let page = entries(log, head.stream, at, 10_000).await?;
            let Some(last) = page.last() else { break };
            at = last.seq;
            out.extend(page.into_iter().filter_map(|e| e.event));
        }
    }
    Ok(out)
}

/// Delivers the event log to one sink (see the module's doc).
pub struct Relay {
    sink: Box<dyn Sink>,
    log: Arc<dyn EventLog>,
    /// The instance's id, its name in the sink's lease (another instance's relay of the same
    /// sink waits for the lease to lapse).
    holder: String,
    settings: RelaySettings,
    /// Until when this relay knows it holds the lease (its own clock; renewed at half).
    lease_until_ms: i64,
    /// Paused by failures or an operator: only the row is read until it is resumed.
    paused: bool,
    failures: u32,
    next_wait: Duration,
}

/// One stream's delivery in a step.
struct Moved {
    /// The stream's position after it.
    to: u64,
    /// The position moved by this relay (false: moved by another relay or an operator, or
    /// nothing acknowledged).
    advanced: bool,
    full: bool,
}

impl Relay {
    pub fn new(
        sink: Box<dyn Sink>,
        log: Arc<dyn EventLog>,
        holder: &str,
        settings: RelaySettings,
    ) -> Relay {
        Relay {
            sink,
            log,
            holder: holder.to_owned(),
            settings,
            lease_until_ms: 0,
            paused: false,
            failures: 0,
            next_wait: settings.poll,
        }
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.settings.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// Whether this relay holds the sink's lease, renewing it once half of it has run out. A
    /// lease taken anew reads the sink's row (another holder may have paused it).
    async fn hold_lease(&mut self, now: i64) -> anyhow::Result<bool> {
        if self.lease_until_ms - now > self.ttl_ms() / 2 {
            return Ok(true);
        }
        let fresh = self.lease_until_ms <= now;
        let name = self.sink.name();
        if !self
            .log
            .take_sink_lease(name, &self.holder, now, self.ttl_ms())
            .await?
        {
            self.lease_until_ms = 0;
            return Ok(false);
        }
        self.lease_until_ms = now + self.ttl_ms();
        if fresh {
            tracing::info!(sink = name, holder = %self.holder, "order-event relay holds the sink's lease");
            // Take over the last holder's state: a pause, and failures still to clear.
            let row = self.row().await?;
            self.paused = row.as_ref().is_some_and(|r| r.paused);
            self.failures = row.map_or(0, |r| r.failures);
        }
        Ok(true)
    }

    async fn row(&self) -> anyhow::Result<Option<SinkRow>> {
        let name = self.sink.name();
        Ok(self.log.sinks().await?.into_iter().find(|r| r.sink == name))
    }

    /// One pass over every stream with events after the sink's position. A stream that is
    /// behind by more than a batch is delivered batch after batch without reading the heads
    /// and positions again, for at most a sixth of the lease (so that with its last delivery's
    /// budget, a third, the pass ends before the lease needs renewing).
    async fn pass(&mut self) -> anyhow::Result<bool> {
        let name = self.sink.name();
        let heads = self.log.event_streams().await?;
        let positions: HashMap<StreamKey, u64> =
            self.log.positions(name).await?.into_iter().collect();
        let (mut lag, mut oldest_ms, mut more) = (0u64, None::<i64>, false);
        let until = tokio::time::Instant::now() + self.settings.lease_ttl / 6;
        for head in heads {
            let mut at = positions.get(&head.stream).copied().unwrap_or(0);
            let mut first_round = true;
            while head.head > at {
                let events =
                    entries(self.log.as_ref(), head.stream, at, self.settings.batch_max).await?;
                if let Some(first) = events.first().filter(|_| first_round) {
                    oldest_ms = Some(oldest_ms.map_or(first.at_ms, |o| o.min(first.at_ms)));
                }
                first_round = false;
                let moved = self.relay_stream(head.stream, at, &events).await?;
                let go_on = moved.advanced && moved.full;
                if moved.advanced {
                    at = moved.to;
                }
                if !go_on || tokio::time::Instant::now() >= until {
                    more |= moved.full;
                    break;
                }
            }
            lag += head.head.saturating_sub(at);
        }
        metrics::gauge!(m::EVENTS_LAG, "sink" => name).set(lag as f64);
        let age = oldest_ms.map_or(0.0, |o| (now_ms() - o).max(0) as f64 / 1000.0);
        metrics::gauge!(m::EVENTS_OLDEST_AGE, "sink" => name).set(age);
        Ok(more)
    }

    /// Delivers `events` (of `stream`, after `at`) and moves the position over what the sink
    /// acknowledged; rows that announce nothing (rejected) are passed with them.
    async fn relay_stream(
        &mut self,
        stream: StreamKey,
        at: u64,
        events: &[Entry],
    ) -> anyhow::Result<Moved> {
        let name = self.sink.name();
        let announced: Vec<(u64, CloudEvent)> = events
            .iter()
            .filter_map(|e| e.event.clone().map(|c| (e.seq, c)))
            .collect();
        let cloud: Vec<CloudEvent> = announced.iter().map(|(_, c)| c.clone()).collect();
        let budget = self.settings.lease_ttl / 3;
        let (acked, error) = self.sink.deliver(&cloud, budget).await;
        let to = match announced.get(acked) {
            Some((first_unacked, _)) => first_unacked - 1,
            None => events.last().map_or(at, |e| e.seq),
        };
        if acked > 0 {
            metrics::counter!(m::EVENTS_DELIVERED, "sink" => name).increment(acked as u64);
            let now = now_ms();
            for (_, c) in &announced[..acked] {
                let secs = (now - c.data.at_ms()).max(0) as f64 / 1000.0;
                metrics::histogram!(m::EVENTS_DELIVERY_LATENCY, "sink" => name).record(secs);
            }
        }
        let advanced = to > at
            && self
                .log
                .advance_position(name, stream, at, to, now_ms())
                .await?;
        if to > at && !advanced {
            tracing::info!(sink = name, %stream, "position moved by another relay or an operator; read again");
        }
        if let Some(e) = error {
            return Err(e.context(format!("deliver {stream} after seq {at} to {name}")));
        }
        Ok(Moved {
            to,
            advanced,
            full: events.len() >= self.settings.batch_max,
        })
    }

    /// Counts a failed step, pauses a sink that kept failing, and backs off.
    async fn failed(&mut self, error: &anyhow::Error) {
        let name = self.sink.name();
        metrics::counter!(m::EVENTS_FAILURES, "sink" => name).increment(1);
        let text = format!("{error:#}");
        self.failures = match self
            .log
            .record_sink_outcome(name, Some(&text), now_ms())
            .await
        {
            Ok(n) => n,
            Err(_) => self.failures.saturating_add(1),
        };
        if self.sink.pause_after().is_some_and(|n| self.failures >= n) {
            tracing::error!(sink = name, failures = self.failures, error = %text,
                "ALERT: order-event sink paused after failing in a row; no event is dropped: \
                 resume it with POST /api/v1/admin/events/{name}/resume");
            if self.log.set_sink_paused(name, true).await.is_ok() {
                self.paused = true;
                metrics::gauge!(m::EVENTS_PAUSED, "sink" => name).set(1.0);
            }
        }
        self.next_wait = backoff(&self.settings, self.failures);
    }

    /// Clears the failures after a delivery that went through.
    async fn succeeded(&mut self) -> anyhow::Result<()> {
        if self.failures > 0 {
            let name = self.sink.name();
            self.log.record_sink_outcome(name, None, now_ms()).await?;
            tracing::info!(
                sink = name,
                failures = self.failures,
                "order-event sink delivers again"
            );
            self.failures = 0;
        }
        Ok(())
    }
}

/// The wait before the next try after `failures` failures in a row: exponential from
/// `backoff_min`, capped at `backoff_max`, with jitter (half fixed, half random) so relays of
/// many deployments do not retry a shared endpoint in step.
pub fn backoff(s: &RelaySettings, failures: u32) -> Duration {
    let exp = s
        .backoff_min
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    let cap = exp.min(s.backoff_max);
    let half = cap / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[async_trait]
impl Worker for Relay {
    fn name(&self) -> &'static str {
        match self.sink.name() {
            "nats" => "events-nats",
            "webhook" => "events-webhook",
            _ => "events",
        }
    }

    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        let name = self.sink.name();
        self.next_wait = self.settings.poll;
        if !self.hold_lease(now_ms()).await? {
            self.next_wait = self.settings.lease_ttl / 4;
            return Ok(WorkerState::Idle);
        }
        if self.paused {
            self.paused = self.row().await?.is_some_and(|r| r.paused);
            metrics::gauge!(m::EVENTS_PAUSED, "sink" => name).set(f64::from(self.paused));
            if self.paused {
                self.next_wait = self.settings.lease_ttl / 4;
                return Ok(WorkerState::Idle);
            }
            self.failures = 0;
        }
        match self.pass().await {
            Ok(more) => {
                self.succeeded().await?;
                Ok(if more {
                    WorkerState::Busy
                } else {
                    WorkerState::Idle
                })
            }
            Err(e) => {
                self.failed(&e).await;
                Err(e)
            }
        }
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        tokio::time::sleep(self.next_wait).await;
        WorkerState::Busy
    }

    async fn stop(&mut self) {
        if self.lease_until_ms > 0 {
            let _ = self
                .log
                .release_sink_lease(self.sink.name(), &self.holder)
                .await;
        }
    }
}

/// One stream as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct StreamStatus {
    pub sku_id: u64,
    pub bucket: u16,
    /// The last seq the sink acknowledged.
    pub position: u64,
    /// The last seq the database stored.
    pub head: u64,
    pub lag: u64,
}

/// One sink as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SinkStatus {
    /// Its row (name, lease, pause, failures), its fields shown inline.
    #[serde(flatten)]
    pub row: SinkRow,
    /// Stored events not yet delivered, over every stream.
    pub lag_events: u64,
    /// Age of the oldest of them (ms; 0 when none).
    pub oldest_age_ms: i64,
    /// Streams with a lag, or a position.
    pub streams: Vec<StreamStatus>,
}

/// The position, lag and last error of each sink named in `sinks` or with a row.
pub async fn status(log: &dyn EventLog, sinks: &[&str]) -> anyhow::Result<Vec<SinkStatus>> {
    let rows = log.sinks().await?;
    let heads = log.event_streams().await?;
    let mut names: Vec<String> = rows.iter().map(|r| r.sink.clone()).collect();
    names.extend(sinks.iter().map(|s| s.to_string()));
    names.sort();
    names.dedup();
    let mut out = Vec::new();
    for name in names {
        let row = rows
            .iter()
            .find(|r| r.sink == name)
            .cloned()
            .unwrap_or_default();
        let positions: HashMap<StreamKey, u64> = log.positions(&name).await?.into_iter().collect();
        let (mut streams, mut lag, mut oldest) = (Vec::new(), 0, None::<i64>);
        for h in &heads {
            let position = positions.get(&h.stream).copied().unwrap_or(0);
            let behind = h.head.saturating_sub(position);
            if behind > 0 {
                lag += behind;
                if let Some(e) = entries(log, h.stream, position, 1).await?.first() {
                    oldest = Some(oldest.map_or(e.at_ms, |o| o.min(e.at_ms)));
                }
            }
            streams.push(StreamStatus {
                sku_id: h.stream.sku.0,
                bucket: h.stream.bucket,
                position,
                head: h.head,
                lag: behind,
            });
        }
        out.push(SinkStatus {
            row: SinkRow { sink: name, ..row },
            lag_events: lag,
            oldest_age_ms: oldest.map_or(0, |o| (now_ms() - o).max(0)),
            streams,
        });
    }
    Ok(out)
}

/// The sink names the admin API accepts.
pub const SINKS: [&str; 2] = ["nats", "webhook"];

/// An operator's re-delivery: `sink` delivers `stream`'s events from `from_seq` on again
/// (its position becomes `from_seq - 1`), and a paused sink resumes.
pub async fn redeliver(
    log: &dyn EventLog,
    sink: &str,
    stream: StreamKey,
    from_seq: u64,
) -> anyhow::Result<()> {
    log.set_position(sink, stream, from_seq.saturating_sub(1), now_ms())
        .await?;
    log.set_sink_paused(sink, false).await?;
    tracing::info!(sink, %stream, from_seq, "order events re-delivered from a position");
    Ok(())
}

/// An operator resumes a paused sink (it retries where it stopped).
pub async fn resume(log: &dyn EventLog, sink: &str) -> anyhow::Result<()> {
    log.set_sink_paused(sink, false).await?;
    tracing::info!(sink, "order-event sink resumed");
    Ok(())
}
