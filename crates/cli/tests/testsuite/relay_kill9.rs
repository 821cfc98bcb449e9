//! The order-event relay as deployed: two `flashsale worker` processes on one MariaDB, both
//! configured with NATS JetStream, while transitions keep being stored; the one holding the
//! sink's lease is killed with SIGKILL mid-stream and started again. After quiescing, the
//! stream holds every stored transition exactly once (`Nats-Msg-Id` dedupe), in order per
//! order.

use std::time::Duration;

use flashsale_core::events::CloudEvent;
use flashsale_core::{OrderStore, PurchaseRequest, RequestId, SaleBook, SaleMode, SkuId, UserId};
use flashsale_testkit::events::{check_exactly_once, stored_live_sale};
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::process::Proc;
use flashsale_testkit::{free_port, nats_server, redis_server, wait};

const LIMIT: Duration = Duration::from_secs(60);

fn worker(name: &str, db: &TestDatabase, subject: &str, stream: &str) -> (Proc, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        (
            "FLASHSALE_WORKER_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        ("FLASHSALE_REDIS_URL", redis_server::shared_url()),
        ("FLASHSALE_REDIS_PREFIX", redis_server::unique_prefix()),
        ("FLASHSALE_DATABASE_URL", db.url.clone()),
        ("FLASHSALE_DATA_DIR", dir.path().display().to_string()),
        ("FLASHSALE_JWT_SECRET", "relay-kill9-secret".into()),
        ("FLASHSALE_ADMIN_TOKEN", "relay-kill9-admin".into()),
        ("FLASHSALE_RECONCILE_INTERVAL_MS", "0".into()),
        ("FLASHSALE_EVENTS_NATS_URL", nats_server::shared_url()),
        ("FLASHSALE_EVENTS_NATS_SUBJECT", subject.into()),
        ("FLASHSALE_EVENTS_NATS_STREAM", stream.into()),
    ];
    let env = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let mut p = Proc::new(
        name,
        env!("CARGO_BIN_EXE_flashsale"),
        &["worker"],
        env,
        dir.path(),
    );
    p.start();
    (p, dir)
}

/// Stores `n` more purchases (every other one then paid) as the persister would.
async fn store_transitions(
    store: &dyn OrderStore,
    book: &mut SaleBook,
    sku: SkuId,
    from: u64,
    n: u64,
) {
    let now = flashsale_core::clock::now_ms();
    for chunk in (from..from + n).collect::<Vec<_>>().chunks(50) {
        let mut events = Vec::new();
        for &u in chunk {
            let r = PurchaseRequest {
                sku_id: sku,
                user_id: UserId(u),
                request_id: RequestId::parse(&format!("r{u}")).unwrap(),
                quantity: 1,
            };
            let (_, e) = book.purchase(&r, now);
            let e = e.expect("accepted");
            let no = e.order_no;
            events.push(e);
            if u % 2 == 0 {
                events.extend(book.pay(&no, UserId(u), now).unwrap().1);
            }
        }
        store.apply_events(sku, &events).await.unwrap();
    }
}

async fn consumed(stream: &str) -> Vec<CloudEvent> {
    let client = async_nats::connect(nats_server::shared_url())
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let mut s = js.get_stream(stream).await.unwrap();
    let last = s.info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let msg = s.get_raw_message(seq).await.unwrap();
        out.push(serde_json::from_slice(&msg.payload).unwrap());
    }
    out
}

async fn stream_len(stream: &str) -> u64 {
    let Ok(client) = async_nats::connect(nats_server::shared_url()).await else {
        return 0;
    };
    let js = async_nats::jetstream::new(client);
    match js.get_stream(stream).await {
        Ok(mut s) => s.info().await.map_or(0, |i| i.state.messages),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_and_a_kill_9_mid_stream_deliver_every_transition_once() {
    let db = TestDatabase::create().await;
    let store = flashsale_engine::backends::open_store(&db.url)
        .await
        .unwrap();
    let mut sale = flashsale_testkit::conformance::live_sale(SaleMode::Reserve, 1_000_000, 1);
    sale.payment_timeout_ms = 600_000;
    let mut book = stored_live_sale(store.as_ref(), &sale).await;
    let sku = sale.sku_id;
    let (subject, stream) = nats_server::unique_names();
    let (mut a, _da) = worker("worker-a", &db, &subject, &stream);
    let (mut b, _db) = worker("worker-b", &db, &subject, &stream);
    store_transitions(store.as_ref(), &mut book, sku, 1, 1_000).await;
    // Mid-stream: some delivered, not all.
    wait::until("the relay to start delivering", LIMIT, || async {
        (stream_len(&stream).await > 0).then_some(())
    })
    .await;
    // Each in turn is killed while transitions keep being stored (one of them holds the
    // sink's lease; the other takes over once it lapses), then started again.
    let log = store.event_log().unwrap();
    a.kill();
    store_transitions(store.as_ref(), &mut book, sku, 1_001, 500).await;
    a.start();
    b.kill();
    store_transitions(store.as_ref(), &mut book, sku, 1_501, 500).await;
    b.start();
    wait::until("every stored event delivered", LIMIT, || async {
        let status = flashsale_engine::relay::status(log.as_ref(), &["nats"])
            .await
            .ok()?;
        (status
            .iter()
            .any(|s| s.row.sink == "nats" && s.lag_events == 0))
        .then_some(())
    })
    .await;
    let mut stored = Vec::new();
    for head in log.event_streams().await.unwrap() {
        let rows = log.logged_events(head.stream, 0, 1_000_000).await.unwrap();
        stored.extend(rows.iter().filter_map(CloudEvent::of));
    }
    assert_eq!(stored.len(), 3_000, "2,000 orders, half of them paid");
    let got = consumed(&stream).await;
    if let Err(e) = check_exactly_once(&stored, &got) {
        panic!("{e}\n{}\n{}", a.log_tail(20), b.log_tail(20));
    }
    assert_eq!(
        got.len(),
        stored.len(),
        "Nats-Msg-Id dropped every re-delivery"
    );
}
