//! Buckets on one Redis: a transfer cut between its out and its in (a carrier that died) is
//! counted in flight, finished once (its pending record kept until the in is stored), and
//! its units sold; the transfer scripts refuse what is
//! not a transfer between two buckets of one sale.

use flashsale_core::buckets::home_bucket;
use flashsale_core::{ErrorCode, HotLedger, SaleMode, UserId};
use flashsale_redis::scripts::{transfer_in_alone, transfer_out_alone};
use flashsale_redis::CopyTag;
use flashsale_testkit::bucketed::{bucketed_sale, buyers, Spread};
use flashsale_testkit::conformance::{buy_ok, buy_refused, live_sale, warm};

use crate::common::{raw, TestLedger};

/// The out side alone, as a carrier that dies before the in leaves it: the transfer's id.
async fn out_only(
    t: &TestLedger,
    from: CopyTag,
    to: u16,
    units: u64,
) -> redis::RedisResult<Vec<String>> {
    transfer_out_alone(&mut raw().await, t.ledger.keys(), from, to, units).await
}

async fn in_only(
    t: &TestLedger,
    to: CopyTag,
    id: &str,
    from: u16,
    units: u64,
) -> redis::RedisResult<String> {
    transfer_in_alone(&mut raw().await, t.ledger.keys(), to, id, from, units).await
}

#[tokio::test]
async fn a_transfer_cut_midway_is_in_flight_then_finished_once_and_sold() {
    let t = TestLedger::with_buckets().await;
    let sale = bucketed_sale(SaleMode::Direct, 9, 1, 3);
    let sku = warm(t.ledger.as_ref(), &sale).await;
    let layout = t.ledger.layout(sku).await.unwrap();
    let reply = out_only(&t, layout.copy(1), 0, 2).await.unwrap();
    assert_eq!(reply[0], "OK", "{reply:?}");
    let view = t.ledger.bucket_view(sku).await.unwrap().unwrap();
    assert_eq!(
        (view.in_flight_units, view.total_units()),
        (2, 9),
        "I2 with units in flight"
    );
    assert_eq!(t.ledger.finish_transfers(sku).await.unwrap(), 1);
    assert_eq!(
        t.ledger.finish_transfers(sku).await.unwrap(),
        0,
        "finished once"
    );
    let replay = in_only(&t, layout.copy(0), &reply[1], 1, 2).await.unwrap();
    assert_eq!(replay, "R", "a second in of one id counts once");
    // The pending record lives until the in is stored in the database: a destination that
    // loses the in before that is taken in again from it. Loaded with the in from the
    // database (as a rebuild loads it), the destination answers so and the record goes.
    let keys = t.ledger.keys();
    let pending = || async {
        redis::cmd("HEXISTS")
            .arg(keys.transfers_out(layout.copy(1)))
            .arg(&reply[1])
            .query_async::<bool>(&mut raw().await)
            .await
            .unwrap()
    };
    assert!(pending().await, "kept until the in is stored");
    let _: () = redis::cmd("HSET")
        .arg(keys.transfers_in(layout.copy(0)))
        .arg(&reply[1])
        .arg("restored")
        .query_async(&mut raw().await)
        .await
        .unwrap();
    assert_eq!(t.ledger.finish_transfers(sku).await.unwrap(), 0);
    assert!(
        !pending().await,
        "dropped once the destination holds the in stored"
    );
    let view = t.ledger.bucket_view(sku).await.unwrap().unwrap();
    let totals: Vec<u64> = view.buckets.iter().map(|b| b.counters.total).collect();
    assert_eq!((totals, view.in_flight_units), (vec![5, 1, 3], 0));

    // Another carrier dies midway; buyers all homed at bucket 0 still get every unit: the
    // purchase that finds the sale short finishes the transfer first.
    let reply = out_only(&t, layout.copy(2), 0, 3).await.unwrap();
    assert_eq!(reply[0], "OK");
    let users = buyers(3, 10, Spread::Uniform);
    let at_zero: Vec<u64> = buyers(3, 200, Spread::Uniform)
        .into_iter()
        .filter(|&u| home_bucket(UserId(u), 3) == 0)
        .take(10)
        .collect();
    for &user in &at_zero[..9] {
        buy_ok(t.ledger.as_ref(), sku, user, "a", 1).await;
    }
    buy_refused(
        t.ledger.as_ref(),
        sku,
        at_zero[9],
        "a",
        1,
        ErrorCode::SoldOut,
    )
    .await;
    buy_refused(t.ledger.as_ref(), sku, users[0], "b", 1, ErrorCode::SoldOut).await;
    let view = t.ledger.bucket_view(sku).await.unwrap().unwrap();
    assert_eq!((view.in_flight_units, view.total_units()), (0, 9));
    assert_eq!(t.ledger.bucket_stats().false_sold_outs, 0);
    t.cleanup().await;
}

#[tokio::test]
async fn transfer_scripts_refuse_what_is_not_a_transfer_between_two_buckets() {
    let t = TestLedger::with_buckets().await;
    let sale = bucketed_sale(SaleMode::Direct, 9, 1, 3);
    let sku = warm(t.ledger.as_ref(), &sale).await;
    let layout = t.ledger.layout(sku).await.unwrap();
    for (to, units) in [(1, 1), (3, 1), (0, 0)] {
        let refused = out_only(&t, layout.copy(1), to, units).await;
        assert!(
            refused.is_err(),
            "out of bucket 1 to {to}, {units} units: {refused:?}"
        );
    }
    let short = out_only(&t, layout.copy(1), 0, 4).await.unwrap();
    assert_eq!(short, ["X", "SHORT"]);
    // An in naming a source its id's epoch does not (bucket 1's epoch is 3·1 + 1 = 4).
    assert!(in_only(&t, layout.copy(0), "4.1", 2, 1).await.is_err());
    assert!(
        in_only(&t, layout.copy(0), "4.1", 0, 1).await.is_err(),
        "from itself"
    );
    let single = live_sale(SaleMode::Direct, 5, 1);
    let one = warm(t.ledger.as_ref(), &single).await;
    assert!(
        out_only(&t, one.into(), 1, 1).await.is_err(),
        "a sale of one bucket"
    );
    assert!(
        in_only(&t, one.into(), "4.1", 1, 1).await.is_err(),
        "a sale of one bucket"
    );
    let view = t.ledger.bucket_view(sku).await.unwrap().unwrap();
    assert_eq!(
        (view.total_units(), view.in_flight_units),
        (9, 0),
        "nothing moved"
    );
    assert_eq!(t.ledger.counters(one).await.unwrap().unwrap().total, 5);
    t.cleanup().await;
}

/// A buyer at the limit whose home is empty hears LIMIT_EXCEEDED, as with one copy, and no
/// stock moves for it; a buyer under the limit there gets stock brought home.
#[tokio::test]
async fn a_buyer_at_the_limit_moves_no_stock() {
    let t = TestLedger::with_buckets().await;
    let sale = bucketed_sale(SaleMode::Direct, 6, 1, 3);
    let sku = warm(t.ledger.as_ref(), &sale).await;
    let users = buyers(3, 3, Spread::OneHome);
    buy_ok(t.ledger.as_ref(), sku, users[0], "a", 1).await;
    buy_ok(t.ledger.as_ref(), sku, users[1], "a", 1).await;
    let transfers = t.ledger.bucket_stats().transfers;
    buy_refused(
        t.ledger.as_ref(),
        sku,
        users[0],
        "b",
        1,
        ErrorCode::LimitExceeded,
    )
    .await;
    assert_eq!(
        t.ledger.bucket_stats().transfers,
        transfers,
        "stock moved for nothing"
    );
    buy_ok(t.ledger.as_ref(), sku, users[2], "a", 1).await;
    assert!(t.ledger.bucket_stats().transfers > transfers);
    t.cleanup().await;
}

/// The same in layout 2 with a buyer of many orders: its record is long, so the per-user check
/// before moving stock reads the units from the record's mark (and checks them against its
/// orders).
#[tokio::test]
async fn a_buyer_of_many_orders_at_the_limit_moves_no_stock() {
    let t = TestLedger::with_buckets_and_records().await;
    let l = t.ledger.as_ref();
    let sale = bucketed_sale(SaleMode::Direct, 90, 30, 3);
    let sku = warm(l, &sale).await;
    let users = buyers(3, 2, Spread::OneHome);
    for i in 0..30 {
        buy_ok(l, sku, users[0], &format!("order-{i:02}"), 1).await;
    }
    let transfers = t.ledger.bucket_stats().transfers;
    buy_refused(l, sku, users[0], "one-more", 1, ErrorCode::LimitExceeded).await;
    assert_eq!(
        t.ledger.bucket_stats().transfers,
        transfers,
        "stock moved for nothing"
    );
    buy_ok(l, sku, users[1], "a", 1).await;
    assert!(t.ledger.bucket_stats().transfers > transfers);
    t.cleanup().await;
}
