//! The persister's recovery paths: its own pending entries behind a gap that a dead consumer
//! holds, pending entries trimmed meanwhile, and a stream a dead letter stopped, across a
//! restart. Real Redis, real MariaDB (and PostgreSQL for the first).

use crate::common;

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::common::Stack;
use flashsale_core::{OrderStore, SkuId};
use flashsale_engine::persister::{Persister, PersisterConfig};
use flashsale_redis::StreamReader;
use flashsale_server::Config;
use flashsale_store::MySqlStore;
use flashsale_testkit::wait;
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::broadcast;

/// No persister and no reconciler in the server: the tests run their own persisters.
fn without_persister(cfg: &mut Config) {
    cfg.engine.persister.run = false;
    cfg.engine.reconcile.interval = Duration::ZERO;
}

async fn stack_without_persister() -> Stack {
    Stack::redis_mysql_with(without_persister).await
}

/// A live sale `sku` with a purchase of each of `users`, and the stream's consumer group read
/// by a reader named `consumer`.
async fn sold_to(
    stack: &Stack,
    sku: u64,
    users: RangeInclusive<u64>,
    consumer: &str,
) -> StreamReader {
    stack.live_sale(sku, 10, 1).await;
    buy(stack, sku, users).await;
    let reader = reader(stack, consumer).await;
    reader.ensure_group(SkuId(sku)).await.unwrap();
    reader
}

/// A connection to the stack's Redis.
async fn redis_conn(stack: &Stack) -> redis::aio::MultiplexedConnection {
    let url = stack.config.engine.ledger.redis_url.clone().unwrap();
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

async fn buy(stack: &Stack, sku: u64, users: RangeInclusive<u64>) {
    for u in users {
        let (s, b) = stack.buy(u, sku, "r", json!(1)).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{b}");
    }
}

async fn reader(stack: &Stack, consumer: &str) -> StreamReader {
    let url = stack.config.engine.ledger.redis_url.clone().unwrap();
    StreamReader::connect(&url, &stack.config.engine.ledger.redis_prefix, consumer)
        .await
        .unwrap()
}

/// A persister named `consumer`, until the returned sender fires.
fn start(stack: &Stack, consumer: &str) -> (broadcast::Sender<()>, tokio::task::JoinHandle<()>) {
    let url = stack.config.engine.ledger.redis_url.clone().unwrap();
    let mut config = PersisterConfig::new(&url, &stack.config.engine.ledger.redis_prefix, consumer);
    config.bounds.claim_idle_ms = 200;
    let (stop, rx) = broadcast::channel(1);
    let persister = Persister::new(config, stack.store());
    let task = tokio::spawn(async move {
        persister.run(rx).await.unwrap();
    });
    (stop, task)
}

async fn applied_seq(store: &dyn OrderStore, sku: u64) -> u64 {
    store.sale(SkuId(sku)).await.unwrap().unwrap().counters.seq
}

/// On both databases of the production path (the persister's writes are the store's).
mod own_pending_entries_behind_a_gap_wait_for_the_dead_consumers_to_be_claimed {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_mysql() {
        let stack = Stack::redis_mysql_with(without_persister).await;
        super::own_pending_entries_behind_a_gap_wait_for_the_dead_consumers_to_be_claimed(&stack)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_postgres() {
        let stack = Stack::redis_postgres_with(without_persister).await;
        super::own_pending_entries_behind_a_gap_wait_for_the_dead_consumers_to_be_claimed(&stack)
            .await;
    }
}

async fn own_pending_entries_behind_a_gap_wait_for_the_dead_consumers_to_be_claimed(stack: &Stack) {
    let sku = SkuId(61);
    let dead = sold_to(stack, 61, 1..=4, "dead").await;
    assert_eq!(dead.read_new(sku, 2, 0).await.unwrap().len(), 2);
    // The next owner held 3 and 4 before it restarted: its own pending entries have a gap.
    let own = reader(stack, "next").await;
    assert_eq!(own.read_new(sku, 2, 0).await.unwrap().len(), 2);
    let (stop, task) = start(stack, "next");
    stack.drain(61).await;
    stop.send(()).unwrap();
    task.await.unwrap();
    assert_eq!(own.pending_summary(sku).await.unwrap().count, 0);
    assert!(stack.store().dead_letters(sku).await.unwrap().is_empty());
    common::assert_invariants(stack.store().as_ref(), 61).await;
    common::sql_counts(stack.database_url(), 61)
        .await
        .assert_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_entry_trimmed_after_it_was_applied_is_acknowledged_not_parked() {
    let stack = stack_without_persister().await;
    let sku = SkuId(62);
    let gone = sold_to(&stack, 62, 1..=2, "gone").await;
    let entries = gone.read_new(sku, 10, 0).await.unwrap();
    assert_eq!(entries.len(), 2);
    // Another writer (a reconciler's replay) applied them; then the stream was trimmed.
    stack.repair(62).await;
    assert_eq!(applied_seq(stack.store().as_ref(), 62).await, 2);
    let last = entries.last().unwrap().0.clone();
    let mut conn = redis_conn(&stack).await;
    let key = gone.keys().events(sku);
    let _: i64 = redis::cmd("XDEL")
        .arg(&key)
        .arg(&entries[0].0)
        .arg(&last)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (stop, task) = start(&stack, "gone");
    let probe = reader(&stack, "probe").await;
    wait::until(
        "the trimmed entries acknowledged",
        Duration::from_secs(20),
        || async { (probe.pending_summary(sku).await.unwrap().count == 0).then_some(()) },
    )
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
    assert!(stack.store().dead_letters(sku).await.unwrap().is_empty());
    assert_eq!(applied_seq(stack.store().as_ref(), 62).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_stopped_by_a_dead_letter_stays_stopped_across_a_restart() {
    let stack = stack_without_persister().await;
    stack.live_sale(63, 10, 1).await;
    let store = MySqlStore::connect(&stack.db.as_ref().unwrap().url)
        .await
        .unwrap();
    store
        .record_dead_letter(&flashsale_core::DeadLetter {
            sku_id: SkuId(63),
            entry_id: "1-0".into(),
            seq: None,
            payload: String::new(),
            error: "poison".into(),
            attempts: 5,
        })
        .await
        .unwrap();
    buy(&stack, 63, 1..=1).await;
    let (stop, task) = start(&stack, "restarted");
    // The lease is renewed on every step, parked or not: two renewals mean two steps taken.
    let conn = redis_conn(&stack).await;
    let lease = reader(&stack, "probe").await.keys().lease(SkuId(63));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    wait::until("two lease renewals", Duration::from_secs(20), || {
        let (mut conn, lease, seen) = (conn.clone(), lease.clone(), seen.clone());
        async move {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&lease)
                .query_async(&mut conn)
                .await
                .unwrap();
            let mut seen = seen.lock().unwrap();
            match seen.last_mut() {
                _ if ttl <= 0 => {}
                Some(last) if ttl <= *last => *last = ttl,
                _ => seen.push(ttl),
            }
            (seen.len() >= 3).then_some(())
        }
    })
    .await;
    assert_eq!(
        applied_seq(&store, 63).await,
        0,
        "a parked stream applies nothing"
    );
    // The operator resumes it: the event goes through.
    store.set_stream_paused(SkuId(63), false).await.unwrap();
    stack.drain(63).await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// Whether some persister holds `sku`'s lease right now.
async fn leased(stack: &Stack, sku: u64) -> bool {
    let mut conn = redis_conn(stack).await;
    let key = format!(
        "{}:{{{sku}}}:lease",
        stack.config.engine.ledger.redis_prefix
    );
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<bool>(&mut conn)
        .await
        .unwrap()
}

/// An ended sale whose stream is applied and that holds no unit retires its persister task
/// (its lease is given up and never taken again, so no read or renewal goes on); a live sale,
/// and an ended one with a hold left, keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_sale_retires_its_persister() {
    let stack = stack_without_persister().await;
    stack.live_sale(61, 5, 1).await;
    stack.live_sale(62, 5, 1).await;
    stack
        .live_sale_with(json!({"sku_id": 63, "name": "t", "total_stock": 5,
            "per_user_limit": 1, "mode": "reserve", "payment_timeout_ms": 600_000}))
        .await;
    for sku in [61, 62, 63] {
        buy(&stack, sku, 1..=2).await;
    }
    for sku in [61, 63] {
        let (s, b) = stack.sale_action(sku, "end").await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let (stop, task) = start(&stack, "p1");
    for sku in [61, 62, 63] {
        stack.drain(sku).await;
    }
    let st = &stack;
    wait::until(
        "sale 61's persister to retire",
        Duration::from_secs(20),
        || async move { (!leased(st, 61).await).then_some(()) },
    )
    .await;
    assert!(leased(&stack, 62).await, "a live sale keeps its persister");
    assert!(
        leased(&stack, 63).await,
        "an ended sale with holds keeps its persister"
    );
    // Retired for good: a discovery pass (which picks up the new sale 64) does not start it
    // again.
    stack.live_sale(64, 5, 1).await;
    buy(&stack, 64, 1..=1).await;
    wait::until(
        "sale 64's persister",
        Duration::from_secs(20),
        || async move { leased(st, 64).await.then_some(()) },
    )
    .await;
    assert!(!leased(&stack, 61).await);
    let _ = stop.send(());
    task.await.unwrap();
}
