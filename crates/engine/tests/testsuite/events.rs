//! Order events from the system of record to a real nats-server with JetStream and to a real
//! HTTP receiver, on the embedded ledger's SQLite and on MariaDB, through the faults a relay
//! meets: aborted mid-stream, nats-server killed and restarted, a receiver that answers 500,
//! hangs past the timeout or drops the connection, two relays at once. After quiescing, the
//! consumer that dedupes by `id` holds exactly the stored transitions, each once, in order per
//! order ([`flashsale_testkit::events::check_exactly_once`]).

use std::sync::Arc;
use std::time::Duration;

use flashsale_core::events::{CloudEvent, EventLog};
use flashsale_core::{
    HotLedger, HotPurchases, OrderStore, PurchaseOutcome, PurchaseRequest, ReconcileRun, Sale,
    SaleBook, SaleMode, SkuId, UserId,
};
use flashsale_embedded::EmbeddedLedger;
use flashsale_engine::relay::nats::{NatsSettings, NatsSink};
use flashsale_engine::relay::webhook::{self, WebhookSettings, WebhookSink};
use flashsale_engine::relay::{self, Relay, RelaySettings, Sink};
use flashsale_store::SqliteStore;
use flashsale_testkit::conformance::{live_sale, req, warm};
use flashsale_testkit::events::{check_exactly_once, stored_live_sale};
use flashsale_testkit::nats_server::{self, NatsServer};
use flashsale_testkit::webhook_receiver::{Answer, WebhookReceiver};
use flashsale_testkit::{mariadb, wait};
use tokio::sync::broadcast;

const LIMIT: Duration = Duration::from_secs(60);
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Where the transitions are stored.
enum Shop {
    /// The embedded ledger: purchases, payments and cancellations committed to SQLite by its
    /// group writer.
    Embedded {
        ledger: Arc<EmbeddedLedger>,
        _dir: tempfile::TempDir,
    },
    /// MariaDB: the transitions a hot ledger's book produced, applied in batches as the
    /// persister applies a stream.
    MariaDb {
        book: Box<SaleBook>,
        _db: mariadb::TestDatabase,
    },
}

struct Rig {
    shop: Shop,
    store: Arc<dyn OrderStore>,
    log: Arc<dyn EventLog>,
    sku: SkuId,
    /// Users served so far.
    users: u64,
}

/// A reserve sale whose holds outlive the test (resolutions must not meet an expiry).
fn reserve_sale() -> Sale {
    let mut sale = live_sale(SaleMode::Reserve, 100_000, 1);
    sale.payment_timeout_ms = 600_000;
    sale
}

async fn embedded() -> Rig {
    embedded_with(reserve_sale()).await
}

async fn embedded_with(sale: Sale) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flashsale.db");
    let sqlite = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    let ledger = Arc::new(EmbeddedLedger::open(sqlite.clone()).await.unwrap());
    let sku = warm(ledger.as_ref(), &sale).await;
    let store: Arc<dyn OrderStore> = sqlite;
    Rig {
        log: store.event_log().unwrap(),
        store,
        shop: Shop::Embedded { ledger, _dir: dir },
        sku,
        users: 0,
    }
}

async fn mariadb() -> Rig {
    mariadb_with(reserve_sale()).await
}

async fn mariadb_with(sale: Sale) -> Rig {
    let db = mariadb::TestDatabase::create().await;
    let store = flashsale_engine::backends::open_store(&db.url)
        .await
        .unwrap();
    let book = stored_live_sale(store.as_ref(), &sale).await;
    Rig {
        log: store.event_log().unwrap(),
        store,
        shop: Shop::MariaDb {
            book: Box::new(book),
            _db: db,
        },
        sku: sale.sku_id,
        users: 0,
    }
}

impl Rig {
    /// `n` new buyers each buy one unit; then every third pays and the next cancels.
    async fn spike(&mut self, n: u64) {
        let first = self.users + 1;
        self.users += n;
        let reqs: Vec<PurchaseRequest> = (first..=self.users)
            .map(|u| req(self.sku, u, &format!("r{u}"), 1))
            .collect();
        for chunk in reqs.chunks(64) {
            let orders = self.purchase(chunk).await;
            for (i, (no, user)) in orders.iter().enumerate() {
                match i % 3 {
                    0 => self.resolve(no, *user, true).await,
                    1 => self.resolve(no, *user, false).await,
                    _ => {}
                }
            }
        }
    }

    async fn purchase(
        &mut self,
        reqs: &[PurchaseRequest],
    ) -> Vec<(flashsale_core::OrderNo, UserId)> {
        let outcomes = match &mut self.shop {
            Shop::Embedded { ledger, .. } => ledger.purchase_batch(self.sku, reqs).await.unwrap(),
            Shop::MariaDb { book, .. } => {
                let now = flashsale_core::clock::now_ms();
                let (outcomes, events): (Vec<_>, Vec<_>) =
                    reqs.iter().map(|r| book.purchase(r, now)).unzip();
                let events: Vec<_> = events.into_iter().flatten().collect();
                self.store.apply_events(self.sku, &events).await.unwrap();
                outcomes
            }
        };
        outcomes
            .into_iter()
            .map(|o| match o {
                PurchaseOutcome::Accepted { order, .. } => (order.order_no, order.user_id),
                other => panic!("a purchase was refused: {other:?}"),
            })
            .collect()
    }

    async fn resolve(&mut self, no: &flashsale_core::OrderNo, user: UserId, pay: bool) {
        match &mut self.shop {
            Shop::Embedded { ledger, .. } => {
                let done = if pay {
                    ledger.pay(no, user).await
                } else {
                    ledger.cancel(no, user).await
                };
                assert!(matches!(done, Ok(Ok(_))), "{no}: {done:?}");
            }
            Shop::MariaDb { book, .. } => {
                let now = flashsale_core::clock::now_ms();
                let done = if pay {
                    book.pay(no, user, now)
                } else {
                    book.cancel(no, user, now)
                };
                let (_, event) = done.unwrap();
                self.store
                    .apply_events(self.sku, &event.into_iter().collect::<Vec<_>>())
                    .await
                    .unwrap();
            }
        }
    }

    /// Every transition the database stored, as the relay maps it, by stream and seq.
    async fn stored(&self) -> Vec<CloudEvent> {
        relay::stored_events(self.log.as_ref()).await.unwrap()
    }

    /// Waits until `sink` has delivered every stored event (its positions at the heads).
    async fn quiesced(&self, sink: &str) {
        wait::until(
            &format!("{sink} to deliver every stored event"),
            LIMIT,
            || async {
                let status = relay::status(self.log.as_ref(), &[sink]).await.ok()?;
                let s = status.iter().find(|s| s.row.sink == sink)?;
                (s.lag_events == 0).then_some(())
            },
        )
        .await;
    }
}

/// A relay running on its own task, stopped or aborted by the test.
struct Running {
    stop: broadcast::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

fn settings() -> RelaySettings {
    RelaySettings {
        batch_max: 64,
        poll: Duration::from_millis(10),
        lease_ttl: Duration::from_secs(2),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
    }
}

fn start(sink: Box<dyn Sink>, log: &Arc<dyn EventLog>, holder: &str) -> Running {
    let relay = Relay::new(sink, log.clone(), holder, settings());
    let (stop, rx) = broadcast::channel(1);
    let task = tokio::spawn(flashsale_engine::runner::run(Box::new(relay), rx));
    Running { stop, task }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }

    /// Kills it mid-step, as a kill -9 would: no lease given up, no position written after.
    fn abort(self) {
        self.task.abort();
    }
}

struct Nats {
    settings: NatsSettings,
}

impl Nats {
    fn on(url: &str) -> Nats {
        let (subject, stream) = nats_server::unique_names();
        Nats {
            settings: NatsSettings {
                url: url.to_owned(),
                subject,
                stream,
            },
        }
    }

    fn sink(&self) -> Box<dyn Sink> {
        Box::new(NatsSink::new(self.settings.clone()))
    }

    /// Every message of the stream, in stream order, with its `Nats-Msg-Id`.
    async fn consumed(&self) -> Vec<CloudEvent> {
        let client = async_nats::connect(self.settings.url.as_str())
            .await
            .unwrap();
        let js = async_nats::jetstream::new(client);
        let mut stream = js.get_stream(&self.settings.stream).await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            let msg = stream.get_raw_message(seq).await.unwrap();
            let event: CloudEvent = serde_json::from_slice(&msg.payload).unwrap();
            let id = msg
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .unwrap();
            assert_eq!(id.as_str(), event.id, "Nats-Msg-Id is the event id");
            assert_eq!(msg.subject.as_str(), self.settings.subject_of(&event));
            out.push(event);
        }
        out
    }
}

fn webhook_sink(receiver: &WebhookReceiver) -> Box<dyn Sink> {
    let mut s = WebhookSettings::new(&receiver.url(), SECRET);
    s.timeout = Duration::from_millis(500);
    s.pause_after = 1_000;
    Box::new(WebhookSink::new(&s).unwrap())
}

/// Every event the receiver acknowledged, each signature checked.
fn received(receiver: &WebhookReceiver) -> Vec<CloudEvent> {
    let key = webhook::secret_key(SECRET).unwrap();
    receiver
        .received()
        .iter()
        .map(|r| {
            let id = &r.headers["webhook-id"];
            let ts: i64 = r.headers["webhook-timestamp"].parse().unwrap();
            let sig = &r.headers["webhook-signature"];
            assert!(
                webhook::verify(&key, id, ts, &r.body, sig),
                "signature of {id}"
            );
            let event: CloudEvent = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(&event.id, id);
            event
        })
        .collect()
}

fn check(stored: &[CloudEvent], delivered: &[CloudEvent]) {
    if let Err(e) = check_exactly_once(stored, delivered) {
        panic!("{e}");
    }
}

macro_rules! both_ledgers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                super::$name(super::embedded().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mariadb() {
                super::$name(super::mariadb().await).await;
            }
        }
    )*};
}

both_ledgers!(
    every_stored_transition_reaches_nats_once_in_order,
    every_stored_transition_reaches_the_webhook_signed_once_in_order,
    an_aborted_relay_and_a_restarted_nats_server_lose_and_double_nothing,
    a_failing_receiver_delays_and_never_drops,
    two_relays_at_once_deliver_once,
);

macro_rules! both_ledgers_direct {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                super::$name(super::embedded_with(super::small_direct_sale()).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mariadb() {
                super::$name(super::mariadb_with(super::small_direct_sale()).await).await;
            }
        }
    )*};
}

both_ledgers_direct!(a_sold_out_sale_and_lost_orders_reach_both_sinks_once);

/// A direct sale of 40 units: buying them all sells it out.
fn small_direct_sale() -> Sale {
    live_sale(SaleMode::Direct, 40, 1)
}

fn lost_run(sku: SkuId, lost: &[String]) -> ReconcileRun {
    ReconcileRun {
        id: 0,
        sku_id: sku,
        at_ms: flashsale_core::clock::now_ms(),
        trigger: "worker".into(),
        repair: false,
        ok: false,
        violations: 0,
        repairs: Vec::new(),
        lost_orders: lost.to_vec(),
        lost_resolutions: Vec::new(),
        report: "{}".into(),
    }
}

async fn a_sold_out_sale_and_lost_orders_reach_both_sinks_once(mut rig: Rig) {
    let nats = Nats::on(&nats_server::shared_url());
    let receiver = WebhookReceiver::spawn().await;
    let relays = [
        start(nats.sink(), &rig.log, "a"),
        start(webhook_sink(&receiver), &rig.log, "a"),
    ];
    let reqs: Vec<PurchaseRequest> = (1..=40)
        .map(|u| req(rig.sku, u, &format!("r{u}"), 1))
        .collect();
    for chunk in reqs.chunks(16) {
        rig.purchase(chunk).await;
    }
    // Two runs report losses, the second one again with a new one: two notices.
    let lost: Vec<String> = (1..=2)
        .map(|n| format!("{}-1-{}", rig.sku, 900 + n))
        .collect();
    let store = &rig.store;
    store
        .record_reconcile_run(&lost_run(rig.sku, &lost[..1]))
        .await
        .unwrap();
    store
        .record_reconcile_run(&lost_run(rig.sku, &lost))
        .await
        .unwrap();
    rig.quiesced("nats").await;
    rig.quiesced("webhook").await;
    for r in relays {
        r.stop().await;
    }
    let stored = rig.stored().await;
    let kinds = |suffix: &str| stored.iter().filter(|e| e.suffix() == suffix).count();
    assert_eq!(
        (
            kinds("order.created"),
            kinds("sale.sold_out"),
            kinds("order.lost")
        ),
        (40, 1, 2)
    );
    let sold_out = stored
        .iter()
        .find(|e| e.suffix() == "sale.sold_out")
        .unwrap();
    assert_eq!(sold_out.id, format!("sale-{}.sold_out.40", rig.sku));
    let consumed = nats.consumed().await;
    check(&stored, &consumed);
    assert_eq!(consumed.len(), stored.len());
    let got = received(&receiver);
    check(&stored, &got);
    assert_eq!(got.len(), stored.len());
}

async fn every_stored_transition_reaches_nats_once_in_order(mut rig: Rig) {
    let nats = Nats::on(&nats_server::shared_url());
    let relay = start(nats.sink(), &rig.log, "a");
    rig.spike(300).await;
    rig.quiesced("nats").await;
    relay.stop().await;
    let stored = rig.stored().await;
    let created = stored
        .iter()
        .filter(|e| e.suffix() == "order.created")
        .count();
    assert_eq!(created, 300);
    assert!(
        stored.len() > 500,
        "and about two thirds of them paid or cancelled"
    );
    let consumed = nats.consumed().await;
    check(&stored, &consumed);
    assert_eq!(consumed.len(), stored.len(), "JetStream kept no duplicate");
}

async fn every_stored_transition_reaches_the_webhook_signed_once_in_order(mut rig: Rig) {
    let receiver = WebhookReceiver::spawn().await;
    let relay = start(webhook_sink(&receiver), &rig.log, "a");
    rig.spike(150).await;
    rig.quiesced("webhook").await;
    relay.stop().await;
    let stored = rig.stored().await;
    let got = received(&receiver);
    check(&stored, &got);
    assert_eq!(
        got.len(),
        stored.len(),
        "nothing failed, so nothing was sent twice"
    );
}

async fn an_aborted_relay_and_a_restarted_nats_server_lose_and_double_nothing(mut rig: Rig) {
    let mut server = NatsServer::spawn().await;
    let nats = Nats::on(&server.url());
    let relay = start(nats.sink(), &rig.log, "a");
    rig.spike(200).await;
    // Mid-stream: the relay dies without a word, its lease still held.
    relay.abort();
    rig.spike(100).await;
    let relay = start(nats.sink(), &rig.log, "b");
    // The broker dies and comes back on its own store while the spike goes on.
    server.kill();
    rig.spike(100).await;
    server.start().await;
    rig.spike(100).await;
    rig.quiesced("nats").await;
    relay.stop().await;
    let stored = rig.stored().await;
    let consumed = nats.consumed().await;
    check(&stored, &consumed);
    assert_eq!(
        consumed.len(),
        stored.len(),
        "Nats-Msg-Id dropped every re-delivery"
    );
}

async fn a_failing_receiver_delays_and_never_drops(mut rig: Rig) {
    let receiver = WebhookReceiver::spawn().await;
    let relay = start(webhook_sink(&receiver), &rig.log, "a");
    rig.spike(60).await;
    for fault in [Answer::Status(500), Answer::Hang, Answer::Drop] {
        receiver.set(fault);
        let before = receiver.requests();
        rig.spike(30).await;
        // The relay tried, and retried, against the fault.
        wait::until("retries against the fault", LIMIT, || async {
            (receiver.requests() >= before + 2).then_some(())
        })
        .await;
        receiver.set(Answer::Accept);
    }
    rig.quiesced("webhook").await;
    relay.stop().await;
    let sinks = rig.log.sinks().await.unwrap();
    let row = sinks.iter().find(|s| s.sink == "webhook").unwrap();
    assert_eq!(
        row.failures, 0,
        "the failures were cleared once it delivered"
    );
    assert!(
        row.last_error.is_some(),
        "the last error is kept for the operator"
    );
    check(&rig.stored().await, &received(&receiver));
}

async fn two_relays_at_once_deliver_once(mut rig: Rig) {
    let nats = Nats::on(&nats_server::shared_url());
    let receiver = WebhookReceiver::spawn().await;
    let relays = [
        start(nats.sink(), &rig.log, "one"),
        start(nats.sink(), &rig.log, "two"),
        start(webhook_sink(&receiver), &rig.log, "one"),
        start(webhook_sink(&receiver), &rig.log, "two"),
    ];
    rig.spike(300).await;
    rig.quiesced("nats").await;
    rig.quiesced("webhook").await;
    for r in relays {
        r.stop().await;
    }
    let stored = rig.stored().await;
    let consumed = nats.consumed().await;
    check(&stored, &consumed);
    assert_eq!(consumed.len(), stored.len());
    let got = received(&receiver);
    check(&stored, &got);
    assert_eq!(
        got.len(),
        stored.len(),
        "one relay at a time: no event posted twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_keeps_failing_pauses_the_sink_until_an_operator_resumes_it() {
    let mut rig = embedded().await;
    let receiver = WebhookReceiver::spawn().await;
    receiver.set(Answer::Status(500));
    let mut s = WebhookSettings::new(&receiver.url(), SECRET);
    s.pause_after = 3;
    let relay = start(Box::new(WebhookSink::new(&s).unwrap()), &rig.log, "a");
    rig.spike(10).await;
    wait::until("the sink to pause", LIMIT, || async {
        let sinks = rig.log.sinks().await.ok()?;
        sinks
            .iter()
            .any(|s| s.sink == "webhook" && s.paused)
            .then_some(())
    })
    .await;
    receiver.set(Answer::Accept);
    let asked = receiver.requests();
    // Paused: nothing is posted, however long it waits (a bounded look).
    let posted = wait::within(Duration::from_millis(500), || async {
        (receiver.requests() > asked).then_some(())
    })
    .await;
    assert!(posted.is_none(), "a paused sink posts nothing");
    relay::resume(rig.log.as_ref(), "webhook").await.unwrap();
    rig.quiesced("webhook").await;
    relay.stop().await;
    check(&rig.stored().await, &received(&receiver));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_redelivers_from_a_position() {
    let mut rig = embedded().await;
    let receiver = WebhookReceiver::spawn().await;
    let relay = start(webhook_sink(&receiver), &rig.log, "a");
    rig.spike(30).await;
    rig.quiesced("webhook").await;
    let first = receiver.received().len();
    let stream = rig.log.event_streams().await.unwrap()[0].stream;
    relay::redeliver(rig.log.as_ref(), "webhook", stream, 11)
        .await
        .unwrap();
    wait::until("the re-delivery", LIMIT, || async {
        (receiver.received().len() >= first * 2 - 10).then_some(())
    })
    .await;
    rig.quiesced("webhook").await;
    relay.stop().await;
    let got = received(&receiver);
    check(&rig.stored().await, &got);
    assert_eq!(got.len(), first * 2 - 10, "seq 11 on delivered again, once");
}

/// The broker stops reading (SIGSTOP) while events are published, is killed in that state
/// (what waited in its socket buffers is gone, though the client wrote it) and restarted: no
/// PubAck came for those events, so their positions stayed behind them and they are
/// published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_frozen_then_killed_loses_nothing() {
    let mut rig = embedded().await;
    let mut server = NatsServer::spawn().await;
    let nats = Nats::on(&server.url());
    let relay = start(nats.sink(), &rig.log, "a");
    rig.spike(50).await;
    rig.quiesced("nats").await;
    server.pause();
    rig.spike(300).await;
    // The relay has written to the frozen broker and is waiting for its PubAcks.
    let log = rig.log.clone();
    wait::until("a PubAck to time out", LIMIT, || async {
        let sinks = log.sinks().await.ok()?;
        sinks
            .iter()
            .any(|s| s.sink == "nats" && s.failures > 0)
            .then_some(())
    })
    .await;
    server.kill();
    server.start().await;
    rig.quiesced("nats").await;
    relay.stop().await;
    let consumed = nats.consumed().await;
    check(&rig.stored().await, &consumed);
}
