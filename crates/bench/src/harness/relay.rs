//! `bench relay`: the order-event relay's throughput from MariaDB to NATS JetStream and to a
//! local webhook receiver (events/s), and the time from a transition's commit to its PubAck
//! while transitions are stored at a steady rate (p50, p99, max).
//!
//! Throughput: N transitions are stored first (one direct sale, batches of 512 as the
//! persister writes them), then one relay (the service's, default settings) is timed from
//! its start until its positions reach the head. Latency: a relay runs while a producer
//! stores `rate` transitions per second for `seconds`; each event's commit instant (when
//! `apply_events` returned) is paired with the instant the sink reported it acknowledged
//! (every PubAck of its batch in; an upper bound on its own PubAck).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Args;
use flashsale_core::events::{event_id, CloudEvent, EventLog, OrderEventType};
use flashsale_core::{
    Event, OrderStore, PurchaseRequest, RequestId, Sale, SaleBook, SaleState, SkuId, UserId,
};
use flashsale_engine::relay::nats::{NatsSettings, NatsSink};
use flashsale_engine::relay::webhook::{WebhookSettings, WebhookSink};
use flashsale_engine::relay::{Relay, RelaySettings, Sink};
use hdrhistogram::Histogram;

use super::setup::{drop_database, fresh_store};

/// A Standard Webhooks secret for the bench's own receiver (it checks nothing).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SKU: u64 = 7_001;
/// Transitions per `apply_events` call while filling the log.
const FILL_BATCH: usize = 512;
/// How long a relay gets to catch up before the bench gives up.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Transitions stored, then relayed, to NATS.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Transitions stored, then relayed, to the webhook receiver (one request each).
    #[arg(long, default_value_t = 20_000)]
    pub webhook_events: u64,
    /// The latency phase: transitions stored per second while a relay runs.
    #[arg(long, default_value_t = 20_000)]
    pub rate: u64,
    /// The latency phase's length.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    pub mysql_url: String,
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Events the relay reads and delivers per step (the service's default when not given).
    #[arg(long)]
    pub batch_max: Option<usize>,
}

impl RelayArgs {
    fn settings(&self) -> RelaySettings {
        let default = RelaySettings::default();
        RelaySettings {
            batch_max: self.batch_max.unwrap_or(default.batch_max).clamp(1, 65_536),
            ..default
        }
    }
}

pub async fn run(args: RelayArgs) -> anyhow::Result<()> {
    println!(
        "bench relay: MariaDB → NATS JetStream ({}) and → a local webhook receiver",
        args.nats_url
    );
    let nats = throughput(&args, "nats", args.events).await?;
    let nats = rate_line("NATS JetStream:", args.events, nats);
    println!("{nats} (target >= 20,000)");
    let hook = throughput(&args, "webhook", args.webhook_events).await?;
    println!(
        "{}",
        rate_line("webhook:       ", args.webhook_events, hook)
    );
    latency(&args).await?;
    println!(
        "load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .next()
            .unwrap_or("?")
    );
    Ok(())
}

/// A fresh database with a live direct sale of `units` and its book.
struct Shop {
    store: Arc<dyn OrderStore>,
    log: Arc<dyn EventLog>,
    book: SaleBook,
    users: u64,
    db: String,
}

impl Shop {
    async fn open(args: &RelayArgs, units: u64, tag: &str) -> anyhow::Result<Shop> {
        let db = format!("fsrelay{}{tag}", std::process::id());
        let store = fresh_store(&args.mysql_url, &db).await?;
        let sale = Sale {
            name: "relay".into(),
            ..Sale::always_open(SkuId(SKU), units.max(1))
        };
        store.create_sale(&sale).await?;
        store.set_state(sale.sku_id, SaleState::Live).await?;
        anyhow::ensure!(store.take_epoch(sale.sku_id, 0).await? == Some(1), "epoch");
        let live = Sale {
            state: SaleState::Live,
            ..sale
        };
        let log = store
            .event_log()
            .ok_or_else(|| anyhow::anyhow!("no event log"))?;
        Ok(Shop {
            book: SaleBook::new(live.clone(), live.fresh_counters(), 1),
            store,
            log,
            users: 0,
            db,
        })
    }

    /// Stores `n` more purchases (one transition each) in one transaction; their events.
    async fn store(&mut self, n: u64) -> anyhow::Result<Vec<Event>> {
        let now = flashsale_core::clock::now_ms();
        let first = self.users + 1;
        self.users += n;
        let events: Vec<Event> = (first..=self.users)
            .filter_map(|u| {
                let r = PurchaseRequest {
                    sku_id: SkuId(SKU),
                    user_id: UserId(u),
                    request_id: RequestId::parse(&format!("b{u}")).expect("id"),
                    quantity: 1,
                };
                self.book.purchase(&r, now).1
            })
            .collect();
        self.store.apply_events(SkuId(SKU), &events).await?;
        Ok(events)
    }

    async fn close(self, args: &RelayArgs) -> anyhow::Result<()> {
        drop(self.log);
        drop(self.store);
        drop_database(&args.mysql_url, &self.db).await
    }
}

/// Where a sink of this run delivers: the bench's receiver, or a JetStream stream of its own.
enum Target {
    Receiver(Receiver),
    Stream(String),
}

impl Target {
    /// Checks the receiver got `n`; deletes the stream.
    async fn finish(self, args: &RelayArgs, n: u64) -> anyhow::Result<()> {
        match self {
            Target::Receiver(r) => {
                anyhow::ensure!(r.count() >= n, "the receiver got {} of {n}", r.count());
            }
            Target::Stream(stream) => {
                let client = async_nats::connect(args.nats_url.as_str()).await?;
                let js = async_nats::jetstream::new(client);
                js.delete_stream(&stream).await?;
            }
        }
        Ok(())
    }
}

/// The sink `name` of this run (its own NATS subject and stream, or the bench's receiver).
async fn sink(args: &RelayArgs, name: &str) -> anyhow::Result<(Box<dyn Sink>, Target)> {
    if name == "webhook" {
        let receiver = Receiver::start().await?;
        let settings = WebhookSettings::new(&receiver.url, SECRET);
        let sink = Box::new(WebhookSink::new(&settings)?);
        return Ok((sink, Target::Receiver(receiver)));
    }
    let tag = format!("fsbench{}x{}", std::process::id(), rand::random::<u32>());
    let settings = NatsSettings {
        url: args.nats_url.clone(),
        subject: format!("{tag}.events"),
        stream: tag.to_uppercase(),
    };
    let stream = settings.stream.clone();
    Ok((Box::new(NatsSink::new(settings)), Target::Stream(stream)))
}

/// Stores `n` transitions, then times one relay delivering them all to `name`.
/// `sink`'s line of the report: `events` delivered in `took`, and their rate.
fn rate_line(sink: &str, events: u64, took: Duration) -> String {
    let secs = took.as_secs_f64();
    let rate = events as f64 / secs;
    format!("{sink} {events} events in {secs:.2}s = {rate:>8.0} events/s")
}

async fn throughput(args: &RelayArgs, name: &str, n: u64) -> anyhow::Result<Duration> {
    let mut shop = Shop::open(args, n, name).await?;
    let mut left = n;
    while left > 0 {
        let step = left.min(FILL_BATCH as u64);
        shop.store(step).await?;
        left -= step;
    }
    let (sink, target) = sink(args, name).await?;
    let started = Instant::now();
    let relay = Running::start(sink, &shop.log, args.settings());
    delivered(shop.log.as_ref(), name, n).await?;
    let took = started.elapsed();
    relay.stop().await?;
    target.finish(args, n).await?;
    shop.close(args).await?;
    Ok(took)
}

/// Waits until `sink`'s positions add up to `n`.
async fn delivered(log: &dyn EventLog, sink: &str, n: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let at: u64 = log.positions(sink).await?.iter().map(|(_, seq)| seq).sum();
        if at >= n {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < CATCH_UP_LIMIT,
            "{sink}: {at} of {n} delivered after {CATCH_UP_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A relay on its own task.
struct Running {
    stop: tokio::sync::broadcast::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    fn start(sink: Box<dyn Sink>, log: &Arc<dyn EventLog>, settings: RelaySettings) -> Running {
        let relay = Relay::new(sink, log.clone(), "bench", settings);
        let (stop, rx) = tokio::sync::broadcast::channel(1);
        let task = tokio::spawn(flashsale_engine::runner::run(Box::new(relay), rx));
        Running { stop, task }
    }

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await?
    }
}

/// A sink that notes when each event was acknowledged.
struct Timed {
    inner: Box<dyn Sink>,
    acked: Arc<Mutex<Vec<(String, Instant)>>>,
}

#[async_trait]
impl Sink for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn deliver(
        &mut self,
        events: &[CloudEvent],
        budget: Duration,
    ) -> (usize, Option<anyhow::Error>) {
        let (n, error) = self.inner.deliver(events, budget).await;
        let now = Instant::now();
        let mut acked = self.acked.lock().expect("acked lock");
        acked.extend(events[..n].iter().map(|e| (e.id.clone(), now)));
        (n, error)
    }

    fn pause_after(&self) -> Option<u32> {
        self.inner.pause_after()
    }
}

/// Stores `rate` transitions per second for `seconds` (a batch every 10 ms) while a NATS relay
/// runs; prints commit → PubAck percentiles.
async fn latency(args: &RelayArgs) -> anyhow::Result<()> {
    let total = args.rate * args.seconds;
    let mut shop = Shop::open(args, total, "lat").await?;
    let (inner, target) = sink(args, "nats").await?;
    let acked = Arc::new(Mutex::new(Vec::new()));
    let timed = Timed {
        inner,
        acked: acked.clone(),
    };
    let relay = Running::start(Box::new(timed), &shop.log, args.settings());
    let per_tick = (args.rate / 100).max(1);
    let mut committed: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    while shop.users < total {
        tick.tick().await;
        let events = shop.store(per_tick.min(total - shop.users)).await?;
        let now = Instant::now();
        for e in events {
            committed.insert(
                event_id(&e.order_no.to_string(), OrderEventType::Created),
                now,
            );
        }
    }
    let stored_rate = total as f64 / started.elapsed().as_secs_f64();
    delivered(shop.log.as_ref(), "nats", total).await?;
    relay.stop().await?;
    target.finish(args, total).await?;
    let mut hist = Histogram::<u64>::new(3)?;
    for (id, at) in acked.lock().expect("acked lock").iter() {
        if let Some(c) = committed.get(id) {
            hist.record(at.saturating_duration_since(*c).as_micros() as u64)?;
        }
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "commit → PubAck at {stored_rate:.0} events/s stored ({} events): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        hist.len(),
        ms(0.5),
        ms(0.99),
        hist.max() as f64 / 1000.0
    );
    shop.close(args).await
}

/// A local webhook receiver: answers 204 to every POST and counts them.
struct Receiver {
    url: String,
    count: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> anyhow::Result<Receiver> {
        let count = Arc::new(AtomicU64::new(0));
        let seen = count.clone();
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(move || {
                let seen = seen.clone();
                async move {
                    seen.fetch_add(1, Ordering::Relaxed);
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Receiver { url, count, task })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
