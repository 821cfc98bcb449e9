//! A rolling upgrade as the persister sees it, on real Redis and MariaDB: entries without a
//! format version (one-event and batch entries, what earlier scripts wrote) and entries of
//! the current version apply in one stream; an entry of a version newer than this binary
//! reads stops the sale's persister with an alarm, without dead letter or pause and with
//! the lease given up, until a newer reader handles it; then the sale goes on. An entry
//! whose version is not a version is corrupt and dead-letters as before.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use flashsale_core::{
    Event, EventKind, HotCopies, HotLedger, OrderNo, OrderStore, RequestId, Sale, SaleMode,
    SaleState, SkuId, UserId,
};
use flashsale_engine::persister::{Persister, PersisterConfig};
use flashsale_redis::{RedisLedger, StreamReader};
use flashsale_store::MySqlStore;
use flashsale_testkit::conformance::{live_sale, req};
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::redis_server::{shared_url, unique_prefix};
use flashsale_testkit::wait;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::broadcast;

const EPOCH: u64 = 1;
const LIMIT: Duration = Duration::from_secs(20);
const ALARM: &str = "flashsale_stream_unknown_format";

/// The metrics this test binary records (one recorder per process).
fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("install the recorder")
    })
}

/// The alarm's value for `sku`, when it was ever set.
fn alarm(sku: SkuId) -> Option<f64> {
    let head = format!("{ALARM}{{sku=\"{}\"}} ", sku.0);
    metrics()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&head).and_then(|v| v.parse().ok()))
}

struct Rig {
    store: Arc<MySqlStore>,
    ledger: RedisLedger,
    prefix: String,
    sku: SkuId,
    conn: redis::aio::MultiplexedConnection,
    _db: TestDatabase,
}

/// A live sale in the database and in Redis (epoch 1), nothing sold.
async fn rig() -> Rig {
    metrics();
    let db = TestDatabase::create().await;
    let store = Arc::new(MySqlStore::connect(&db.url).await.expect("connect"));
    let prefix = unique_prefix();
    let ledger = RedisLedger::connect(&shared_url(), &prefix)
        .await
        .expect("shared redis");
    let sale: Sale = live_sale(SaleMode::Direct, 100, 5);
    let sku = sale.sku_id;
    store.create_sale(&sale).await.unwrap();
    store.set_state(sku, SaleState::Live).await.unwrap();
    assert_eq!(store.take_epoch(sku, 0).await.unwrap(), Some(EPOCH));
    ledger
        .warm(&sale, &sale.fresh_counters(), EPOCH)
        .await
        .unwrap();
    let client = redis::Client::open(shared_url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    Rig {
        store,
        ledger,
        prefix,
        sku,
        conn,
        _db: db,
    }
}

impl Rig {
    async fn xadd(&mut self, fields: &[(String, String)]) -> String {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.ledger.keys().events(self.sku)).arg("*");
        for (k, v) in fields {
            cmd.arg(k).arg(v);
        }
        cmd.query_async(&mut self.conn).await.unwrap()
    }

    /// A persister named `consumer` with short bounds, until the sender fires.
    fn start(&self, consumer: &str) -> (broadcast::Sender<()>, tokio::task::JoinHandle<()>) {
        let mut config = PersisterConfig::new(&shared_url(), &self.prefix, consumer);
        (
            config.bounds.block_ms,
            config.bounds.lease_ttl_ms,
            config.bounds.claim_idle_ms,
        ) = (50, 600, 200);
        config.bounds.attempts_max = 2;
        config.bounds.discover_every = Duration::from_millis(50);
        let (stop, rx) = broadcast::channel(1);
        let persister = Persister::new(config, self.store.clone());
        let task = tokio::spawn(async move { persister.run(rx).await.unwrap() });
        (stop, task)
    }

    async fn reader(&self, consumer: &str) -> StreamReader {
        StreamReader::connect(&shared_url(), &self.prefix, consumer)
            .await
            .unwrap()
    }

    async fn applied_seq(&self) -> u64 {
        let sale = self.store.sale(self.sku).await.unwrap().unwrap();
        sale.counters.seq
    }

    async fn wait_applied(&self, seq: u64) {
        wait::until(&format!("applied_seq {seq}"), LIMIT, || async {
            (self.applied_seq().await == seq).then_some(())
        })
        .await;
    }

    /// Deletes every key under the prefix.
    async fn cleanup(mut self) {
        let pattern = format!("{}:*", self.prefix);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut self.conn)
                .await
                .unwrap();
        }
    }

    async fn assert_not_parked(&self) {
        assert!(self.store.dead_letters(self.sku).await.unwrap().is_empty());
        assert!(!self.store.stream_paused(self.sku).await.unwrap());
    }
}

fn pairs(kv: &[(&str, String)], version: Option<&str>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    if let Some(v) = version {
        out.push(("v".into(), v.into()));
    }
    out
}

/// The deduction of `seq` (user 100 + seq, one unit) as an event.
fn event(sku: SkuId, seq: u64) -> Event {
    Event {
        sku_id: sku,
        epoch: EPOCH,
        seq,
        kind: EventKind::Deducted,
        order_no: OrderNo::new(sku, EPOCH, seq),
        request_id: RequestId::parse(&format!("r{seq}")).unwrap(),
        user_id: UserId(100 + seq),
        quantity: 1,
        at_ms: 10,
        deadline_ms: 0,
    }
}

/// A one-event entry of that deduction, with format version `version` (none: the format
/// before versions).
fn one_event(sku: SkuId, seq: u64, version: Option<&str>) -> Vec<(String, String)> {
    let e = event(sku, seq);
    let kv = [
        ("sku_id", sku.0.to_string()),
        ("epoch", EPOCH.to_string()),
        ("seq", seq.to_string()),
        ("kind", "deducted".into()),
        ("order_no", e.order_no.to_string()),
        ("request_id", e.request_id.as_str().to_owned()),
        ("user_id", e.user_id.0.to_string()),
        ("quantity", "1".into()),
        ("at_ms", "10".into()),
        ("deadline_ms", "0".into()),
    ];
    pairs(&kv, version)
}

/// A batch entry (no version: what the purchase script wrote before versions) of the
/// deductions `first..first + n`.
fn legacy_batch(sku: SkuId, first: u64, n: u64) -> Vec<(String, String)> {
    let seqs = first..first + n;
    let list = |f: &dyn Fn(u64) -> String| seqs.clone().map(f).collect::<Vec<_>>().join(",");
    let kv = [
        ("sku_id", sku.0.to_string()),
        ("epoch", EPOCH.to_string()),
        ("kind", "deducted".into()),
        ("first_seq", first.to_string()),
        ("n", n.to_string()),
        ("at_ms", "10".into()),
        ("deadline_ms", "0".into()),
        ("users", list(&|s| (100 + s).to_string())),
        ("request_ids", list(&|s| format!("r{s}"))),
        ("quantities", list(&|_| "1".into())),
    ];
    pairs(&kv, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_format_stops_the_sale_until_a_newer_reader_handles_it() {
    let mut rig = rig().await;
    let sku = rig.sku;
    // A purchase call of this binary's scripts: seq 1 and 2, the current format.
    let reqs = [req(sku, 1, "a", 1), req(sku, 2, "b", 1)];
    rig.ledger.purchase_batch(sku, &reqs).await.unwrap();
    rig.xadd(&legacy_batch(sku, 3, 2)).await;
    rig.xadd(&one_event(sku, 5, None)).await;
    rig.xadd(&one_event(sku, 6, Some("1"))).await;
    let mut future = one_event(sku, 7, Some("2"));
    future.push(("field_of_tomorrow".into(), "x".into()));
    let future_id = rig.xadd(&future).await;
    rig.xadd(&one_event(sku, 8, Some("1"))).await;

    let (stop, task) = rig.start("old");
    rig.wait_applied(6).await;
    // The lease is given up for a newer instance to take: "newer" gets it.
    let newer = rig.reader("newer").await;
    wait::until("the old persister gives the lease up", LIMIT, || async {
        newer
            .acquire_lease(sku, "newer", 10_000)
            .await
            .unwrap()
            .then_some(())
    })
    .await;
    wait::until("the alarm names the version", LIMIT, || async {
        (alarm(sku) == Some(2.0)).then_some(())
    })
    .await;
    assert_eq!(rig.applied_seq().await, 6);
    rig.assert_not_parked().await;
    assert_eq!(newer.pending_summary(sku).await.unwrap().count, 2);

    // The newer reader claims the entries, applies the one it knows the format of, acks it
    // and hands the sale back (a rollback): the old persister goes on from there.
    let claimed = newer.autoclaim(sku, 0, 10).await.unwrap();
    assert!(claimed.entries.iter().any(|(id, _)| *id == future_id));
    rig.store.apply_events(sku, &[event(sku, 7)]).await.unwrap();
    newer.ack(sku, &[future_id]).await.unwrap();
    assert!(newer.release_lease(sku, "newer").await.unwrap());
    rig.wait_applied(8).await;
    wait::until("the alarm cleared", LIMIT, || async {
        (alarm(sku) == Some(0.0)).then_some(())
    })
    .await;
    wait::until("every entry acknowledged", LIMIT, || async {
        (newer.pending_summary(sku).await.unwrap().count == 0).then_some(())
    })
    .await;
    rig.assert_not_parked().await;
    stop.send(()).unwrap();
    task.await.unwrap();
    rig.cleanup().await;
}

/// Runs a persister over the entries `entries` gives for the rig's sale and waits for the
/// stream to pause on the entry at `bad`: the one dead letter, the entries before it (one
/// event each) applied, no format alarm.
async fn parks_on(entries: impl Fn(SkuId) -> Vec<Vec<(String, String)>>, bad: usize) {
    let mut rig = rig().await;
    let mut ids = Vec::new();
    for fields in entries(rig.sku) {
        ids.push(rig.xadd(&fields).await);
    }
    let (stop, task) = rig.start("old");
    wait::until("the stream paused", LIMIT, || async {
        rig.store
            .stream_paused(rig.sku)
            .await
            .unwrap()
            .then_some(())
    })
    .await;
    let letters = rig.store.dead_letters(rig.sku).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].entry_id, ids[bad]);
    assert_eq!(rig.applied_seq().await, bad as u64);
    assert_eq!(alarm(rig.sku), None);
    stop.send(()).unwrap();
    task.await.unwrap();
    rig.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_whose_version_is_not_a_version_is_a_dead_letter() {
    parks_on(|sku| vec![one_event(sku, 1, Some("banana"))], 0).await;
}

/// The corrupt entry comes in the same read as good ones: those apply, and the corrupt one is
/// read again (from this consumer's pending entries) until it is parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_entry_read_after_good_ones_is_a_dead_letter() {
    let entries = |sku| {
        let mut corrupt = one_event(sku, 3, Some("1"));
        corrupt.retain(|(k, _)| k != "quantity");
        vec![
            one_event(sku, 1, None),
            one_event(sku, 2, Some("1")),
            corrupt,
        ]
    };
    parks_on(entries, 2).await;
}
