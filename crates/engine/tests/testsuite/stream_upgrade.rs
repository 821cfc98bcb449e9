//! A rolling upgrade as the persister sees it, on real Redis and MariaDB: entries without a
//! format version (one-event and batch entries, what earlier scripts wrote) and entries of
//! the current version apply in one stream; an entry of a version newer than this binary
//! reads stops the sale's persister with an alarm, without dead letter or pause and with
//! the lease given up, until a newer reader handles it; then the sale goes on. An entry
//! whose version is not a version is corrupt and dead-letters as before.

use std::sync::OnceLock;

use flashsale_core::{Event, EventKind, HotPurchases, OrderNo, RequestId, SaleMode, SkuId, UserId};
use flashsale_testkit::conformance::{live_sale, req};
use flashsale_testkit::wait;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::common::{self, Rig, Sor, EPOCH, LIMIT};
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

/// A live sale on MariaDB and in Redis (epoch 1), nothing sold.
async fn rig() -> Rig {
    metrics();
    common::rig(Sor::MariaDb, live_sale(SaleMode::Direct, 100, 5)).await
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
    // A version this binary does not read: one above the newest it does.
    let newer_version = flashsale_redis::FORMAT_VERSION + 1;
    let mut future = one_event(sku, 7, Some(&newer_version.to_string()));
    future.push(("field_of_tomorrow".into(), "x".into()));
    let future_id = rig.xadd(&future).await;
    rig.xadd(&one_event(sku, 8, Some("1"))).await;

    let persister = rig.start("old");
    rig.wait_applied(6).await;
    // The lease is given up for a newer instance to take: "newer" gets it.
    let newer = rig.reader("newer").await;
    wait::until("the old persister gives the lease up", LIMIT, || async {
        newer
            .acquire_lease(sku.into(), "newer", 10_000)
            .await
            .unwrap()
            .then_some(())
    })
    .await;
    wait::until("the alarm names the version", LIMIT, || async {
        (alarm(sku) == Some(newer_version as f64)).then_some(())
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
    assert!(newer.release_lease(sku.into(), "newer").await.unwrap());
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
    persister.stop().await;
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
    let persister = rig.start("old");
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
    persister.stop().await;
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
