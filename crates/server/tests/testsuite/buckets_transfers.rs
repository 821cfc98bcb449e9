//! A transfer whose side is lost with one bucket's copy, on one Redis without WAIT: the unit
//! is neither stranded nor created. The destination's rebuild counts the in of a stored out
//! (the pending record at the source lives until the in is stored, so it also carries the
//! units there again); the source's rebuild counts the out of an in its destination holds.

use std::time::Duration;

use flashsale_core::buckets::home_bucket;
use flashsale_core::{SkuId, TransferSide, UserId};
use flashsale_redis::keys::Keys;
use flashsale_redis::placement::place;
use flashsale_redis::scripts::{transfer_in_alone, transfer_out_alone};
use flashsale_redis::CopyTag;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{self, code, Stack};

const UNITS: u64 = 10;

fn sale_body(sku: u64) -> Value {
    json!({"sku_id": sku, "name": "two buckets", "total_stock": UNITS, "per_user_limit": 6,
           "buckets": 2})
}

/// The stack's Redis key names.
fn keys(stack: &Stack) -> Keys {
    Keys::new(&stack.config.engine.ledger.redis_prefix).unwrap()
}

async fn redis_conn(stack: &Stack) -> redis::aio::MultiplexedConnection {
    let url = stack.config.engine.ledger.redis_url.clone().unwrap();
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Bucket `bucket`'s copy of a two-bucket sale on one Redis (its salt as `place` picks it).
fn copy(sku: u64, bucket: u16) -> CopyTag {
    let salts = place(SkuId(sku), 2, 1, |_| 0);
    CopyTag::new(SkuId(sku), bucket, salts[usize::from(bucket)])
}

/// Some other owner holds bucket `bucket`'s persister lease: its stream is not persisted.
async fn hold_lease(stack: &Stack, sku: u64, bucket: u16) {
    let _: () = redis::cmd("SET")
        .arg(keys(stack).lease(copy(sku, bucket)))
        .arg("someone-else")
        .arg("PX")
        .arg(600_000)
        .query_async(&mut redis_conn(stack).await)
        .await
        .unwrap();
}

/// Bucket `bucket`'s persister lease let go (after [`hold_lease`]): its stream is persisted.
async fn let_go_lease(stack: &Stack, sku: u64, bucket: u16) {
    let _: i64 = redis::cmd("DEL")
        .arg(keys(stack).lease(copy(sku, bucket)))
        .query_async(&mut redis_conn(stack).await)
        .await
        .unwrap();
}

/// Every stream drained: I1–I7 hold from the database and the reconciler reports ok.
async fn settles_and_reconciles(stack: &Stack, sku: u64) {
    stack.drain(sku).await;
    common::assert_invariants(stack.store().as_ref(), sku).await;
    let report = stack.repair(sku).await;
    assert_eq!(report["ok"], true, "{report:#}");
}

/// Every key of bucket `bucket`'s copy deleted (its lease too): the copy is lost.
async fn lose_bucket(stack: &Stack, sku: u64, bucket: u16) {
    let mut conn = redis_conn(stack).await;
    let pattern = format!(
        "{}:{{{}}}:*",
        stack.config.engine.ledger.redis_prefix,
        copy(sku, bucket)
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!keys.is_empty(), "no keys match {pattern}");
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The first `n` users homed at `bucket` of two, from `from` on.
fn homed(bucket: u16, from: u64, n: usize) -> Vec<u64> {
    (from..)
        .filter(|u| home_bucket(UserId(*u), 2) == bucket)
        .take(n)
        .collect()
}

/// Waits until the database holds `side` of a transfer of `sku`.
async fn stored_side(stack: &Stack, sku: u64, side: TransferSide) {
    let store = stack.store();
    flashsale_testkit::wait::until("a transfer side stored", Duration::from_secs(20), || {
        let store = store.clone();
        async move {
            let audit = store.audit(SkuId(sku)).await.ok()??;
            audit.transfers.iter().any(|t| t.side == side).then_some(())
        }
    })
    .await;
}

/// New buyers, one unit each, until SOLD_OUT: how many units they got.
async fn sell_out(stack: &Stack, sku: u64, from: u64) -> u64 {
    let mut sold = 0;
    for user in from..from + 3 * UNITS {
        let (status, body) = stack.buy(user, sku, "new", json!(1)).await;
        match status.as_u16() {
            202 => sold += 1,
            409 if code(&body) == "SOLD_OUT" => return sold,
            other => panic!("unexpected {other}: {body}"),
        }
    }
    panic!("sale {sku} never sold out")
}

/// Creates and warms the sale with the persister leases of `held` buckets taken elsewhere (their
/// streams wait), then a buyer homed at `home` takes 6 units: one of them moves there from
/// the other bucket.
async fn one_unit_moved(stack: &Stack, sku: u64, held: &[u16], home: u16) {
    let (status, body) = stack.create_sale(sale_body(sku)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for &bucket in held {
        hold_lease(stack, sku, bucket).await;
    }
    let (status, body) = stack.sale_action(sku, "warm").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let buyer = homed(home, 1, 1)[0];
    let (status, body) = stack.buy(buyer, sku, "a", json!(6)).await;
    assert_eq!(status.as_u16(), 202, "six units, one of them moved: {body}");
}

/// The repair of a sale whose bucket lost its keys reports the one order lost with them, and
/// new buyers get every unit again (that order's too).
async fn repaired_with_one_lost_order(stack: &Stack, sku: u64) {
    let report = stack.repair(sku).await;
    assert_eq!(
        report["lost_orders"].as_array().map(Vec::len),
        Some(1),
        "{report:#}"
    );
    assert_eq!(
        sell_out(stack, sku, 1_000).await,
        UNITS,
        "every unit sells again"
    );
}

async fn stack() -> Stack {
    Stack::redis_mysql_with(|cfg| cfg.engine.reconcile.interval = Duration::ZERO).await
}

/// A [`stack`] with the two-bucket sale `sku` created, warmed and live.
async fn stack_with_live_sale(sku: u64) -> Stack {
    let stack = stack().await;
    stack.live_sale_with(sale_body(sku)).await;
    stack
}

/// The reproduction: 2 buckets of 5, a buyer homed at bucket 1 takes 6, so a unit moves
/// from bucket 0; bucket 1's stream is not persisted (its lease held elsewhere) and its
/// keys are then lost. The repair rebuilds bucket 1, which must count the transfer's in
/// (its out is stored): new buyers get all 10 units (the lost order's too), the database
/// holds I2 exactly, and the reconciler agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_loses_an_in_strands_no_unit() {
    const SKU: u64 = 311;
    let stack = stack().await;
    one_unit_moved(&stack, SKU, &[1], 1).await;
    stored_side(&stack, SKU, TransferSide::Out).await;
    lose_bucket(&stack, SKU, 1).await;

    repaired_with_one_lost_order(&stack, SKU).await;
    settles_and_reconciles(&stack, SKU).await;
}

/// As above, but no side is stored when bucket 1 loses its keys (both streams wait): its
/// rebuild knows nothing of the transfer, and the pending record at bucket 0, which lives
/// until the in is stored, carries the unit there again. Then bucket 0's stream is let go:
/// every unit sells and both sides are stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_loses_an_in_gets_it_again_from_the_pending_record() {
    const SKU: u64 = 314;
    let stack = stack().await;
    one_unit_moved(&stack, SKU, &[0, 1], 1).await;
    lose_bucket(&stack, SKU, 1).await;

    repaired_with_one_lost_order(&stack, SKU).await;
    let_go_lease(&stack, SKU, 0).await;
    settles_and_reconciles(&stack, SKU).await;
}

/// The other way round: the in is stored at bucket 0 while bucket 1, the source, never
/// persists its out and then loses its keys. Its rebuild must not load the units its
/// destination holds: the sale sells exactly its stock, and I2 holds exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_loses_an_out_creates_no_unit() {
    const SKU: u64 = 312;
    let stack = stack().await;
    one_unit_moved(&stack, SKU, &[1], 0).await;
    stored_side(&stack, SKU, TransferSide::In).await;
    lose_bucket(&stack, SKU, 1).await;

    let report = stack.repair(SKU).await;
    assert_eq!(report["lost_orders"], json!([]), "{report:#}");
    assert_eq!(
        sell_out(&stack, SKU, 1_000).await,
        UNITS - 6,
        "no unit created"
    );
    settles_and_reconciles(&stack, SKU).await;
}

/// A unit in flight that no record holds any more (its out stored, its pending record gone,
/// no in anywhere): every bucket matches its row, yet the hot copies hold 9 of 10 units.
/// The reconciler says so, naming the transfer, and its repair rebuilds the destination,
/// which counts the in: the sale sells all 10 units and reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_no_record_holds_is_reported_by_transfer_id_and_repaired() {
    const SKU: u64 = 313;
    let stack = stack_with_live_sale(SKU).await;
    let (keys, source) = (keys(&stack), copy(SKU, 0));
    let mut conn = redis_conn(&stack).await;
    let reply = transfer_out_alone(&mut conn, &keys, source, 1, 1)
        .await
        .unwrap();
    assert_eq!(reply[0], "OK", "{reply:?}");
    stored_side(&stack, SKU, TransferSide::Out).await;
    let _: i64 = redis::cmd("HDEL")
        .arg(keys.transfers_out(source))
        .arg(&reply[1])
        .query_async(&mut conn)
        .await
        .unwrap();

    let report = stack.repair(SKU).await;
    assert_eq!(report["ok"], false, "{report:#}");
    let named = report["transfers_unbalanced"].to_string();
    assert!(named.contains(&reply[1]), "the transfer by id: {report:#}");
    assert_eq!(report["buckets_unbalanced"], json!([1]), "{report:#}");
    assert_eq!(report["after"]["ok"], true, "repaired: {report:#}");
    assert_eq!(sell_out(&stack, SKU, 1_000).await, UNITS);
    settles_and_reconciles(&stack, SKU).await;
}

/// A hold at bucket 0 cancelled, and then every unit of bucket 0 (the cancelled one too)
/// carried to a buyer homed at bucket 1, while bucket 0's stream waits (its lease held): the
/// reconciler folds bucket 0's events and its out back out of its hot counters, whatever
/// their kinds. Undone by kind, the cancel came back before the out and asked bucket 0 for
/// an available unit it no longer had: the bucket was not compared, the report had no diff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_hold_whose_unit_went_out_folds_back() {
    const SKU: u64 = 315;
    let stack = stack().await;
    let body = json!({"sku_id": SKU, "name": "two buckets", "total_stock": 6,
        "per_user_limit": 6, "buckets": 2, "mode": "reserve", "payment_timeout_ms": 600_000});
    let (status, body) = stack.create_sale(body).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    hold_lease(&stack, SKU, 0).await;
    let (status, body) = stack.sale_action(SKU, "warm").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let holder = homed(0, 1, 1)[0];
    let no = common::order_no(&stack.buy_ok(holder, SKU, "a", 1).await);
    let cancel = format!("/api/v1/orders/{no}/cancel");
    let (s, b) = (stack.call("POST", &cancel, Some(&stack.token(holder)), None)).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("CANCELLED")),
        "{b}"
    );
    let buyer = homed(1, 1, 1)[0];
    let (status, body) = stack.buy(buyer, SKU, "b", json!(6)).await;
    assert_eq!(
        status.as_u16(),
        202,
        "six units, bucket 0's three moved: {body}"
    );

    let path = format!("/api/v1/admin/reconcile?sku={SKU}");
    let (s, b) = stack.admin("GET", &path, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let report = &b[0];
    let findings = report["findings"].as_array().cloned().unwrap_or_default();
    assert!(
        !findings
            .iter()
            .any(|f| f.as_str().unwrap_or("").contains("undone")),
        "{report:#}"
    );
    for field in ["total", "available", "reserved", "sold", "seq"] {
        assert_eq!(report["diff"][field], json!(0), "{field}: {report:#}");
    }
    let_go_lease(&stack, SKU, 0).await;
    settles_and_reconciles(&stack, SKU).await;
}

/// A created unit: bucket 1 takes in a unit no out ever sent, so the copies sell 11 of the
/// sale's 10. Each bucket's row stores its own sales and the sale row shows the stock at
/// most, so the persisters go on (no dead letter, no pause: every order is stored), and the
/// reconciler reports the unit by its transfer id. When the sale row moved by each change,
/// its CHECK refused the batch, which was dead-lettered and paused the sale's streams,
/// leaving orders neither stored nor reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_units_sale_is_stored_reported_and_stops_no_persister() {
    const SKU: u64 = 316;
    let stack = stack_with_live_sale(SKU).await;
    // Bucket 0's epoch is 2 (sale epoch 1 of two buckets): the id names it the source.
    let mut conn = redis_conn(&stack).await;
    let reply = transfer_in_alone(&mut conn, &keys(&stack), copy(SKU, 1), "2.99", 0, 1).await;
    assert_eq!(reply.unwrap(), "OK");
    assert_eq!(sell_out(&stack, SKU, 1_000).await, UNITS + 1);

    let store = stack.store();
    let orders =
        flashsale_testkit::wait::until("every order stored", Duration::from_secs(60), || {
            let store = store.clone();
            async move {
                let orders = store.orders(SkuId(SKU)).await.ok()?;
                (orders.len() as u64 == UNITS + 1).then_some(orders)
            }
        })
        .await;
    assert!(!store.stream_paused(SkuId(SKU)).await.unwrap());
    assert_eq!(store.dead_letters(SkuId(SKU)).await.unwrap(), vec![]);
    assert!(
        (orders.iter()).all(|o| o.status == flashsale_core::OrderStatus::Created),
        "{orders:?}"
    );
    let sale = store.sale(SkuId(SKU)).await.unwrap().unwrap();
    assert_eq!((sale.counters.sold, sale.counters.available), (UNITS, 0));
    let path = format!("/api/v1/admin/reconcile?sku={SKU}");
    let (s, b) = stack.admin("GET", &path, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b[0]["ok"], false, "{b:#}");
    let named = b[0]["transfers_unbalanced"].to_string();
    assert!(named.contains("2.99"), "the transfer by id: {b:#}");
}

/// A source whose copy got units back from expired holds, sent one of them out, and was lost
/// before any of it was stored: its row still holds the holds RESERVED and no unit available,
/// so its rebuild could not store the out of the in its destination holds, and the new copy
/// expired the holds again: a created unit (the sale sold 11 of 10). The rebuild now expires
/// the row's due holds first, as the new copy would, and the out is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_loses_expiries_and_an_out_creates_no_unit() {
    const SKU: u64 = 317;
    let stack = stack().await;
    let body = json!({"sku_id": SKU, "name": "two buckets", "total_stock": UNITS,
        "per_user_limit": 6, "buckets": 2, "mode": "reserve", "payment_timeout_ms": 1_500});
    let (status, body) = stack.create_sale(body).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    hold_lease(&stack, SKU, 1).await;
    let (status, body) = stack.sale_action(SKU, "warm").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for user in homed(1, 1, 5) {
        stack.buy_ok(user, SKU, "a", 1).await;
    }
    // The holds reach the database (the test stands in for bucket 1's persister), their
    // expiries never do.
    let state = stack.server.as_ref().unwrap().state.clone();
    let snap = state
        .shop
        .ledger()
        .bucket_snapshot(SkuId(SKU), 1)
        .await
        .unwrap();
    let holds = snap.expect("bucket 1's copy").events;
    assert_eq!(holds.len(), 5, "{holds:?}");
    stack
        .store()
        .apply_events(SkuId(SKU), &holds)
        .await
        .unwrap();
    flashsale_testkit::wait::until("bucket 1's holds expired", Duration::from_secs(20), || {
        let ledger = state.shop.ledger().clone();
        async move {
            let hot = ledger.hot_buckets(SkuId(SKU)).await.ok()??;
            let (_, c) = hot.buckets.iter().find(|(b, _)| *b == 1)?;
            (c.available == 5).then_some(())
        }
    })
    .await;
    let buyer = homed(0, 100, 1)[0];
    let (status, body) = stack.buy(buyer, SKU, "a", json!(6)).await;
    assert_eq!(status.as_u16(), 202, "six units, one from bucket 1: {body}");
    let pay = format!("/api/v1/orders/{}/pay", common::order_no(&body));
    let (s, b) = (stack.call("POST", &pay, Some(&stack.token(buyer)), None)).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("PAID")),
        "{b}"
    );
    stored_side(&stack, SKU, TransferSide::In).await;
    lose_bucket(&stack, SKU, 1).await;

    stack.repair(SKU).await;
    // Whatever the rebuilt copy holds RESERVED is past its deadline: expired before selling.
    flashsale_testkit::wait::until("no hold left", Duration::from_secs(20), || {
        let ledger = state.shop.ledger().clone();
        async move {
            let hot = ledger.hot_buckets(SkuId(SKU)).await.ok()??;
            hot.buckets
                .iter()
                .all(|(_, c)| c.reserved == 0)
                .then_some(())
        }
    })
    .await;
    assert_eq!(
        sell_out(&stack, SKU, 1_000).await,
        UNITS - 6,
        "no unit created"
    );
    settles_and_reconciles(&stack, SKU).await;
}
