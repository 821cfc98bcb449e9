//! A bucketed sale with one bucket failing: what the other buckets accepted is still named
//! when a batch fails, their holds still expire, and a rebuilt bucket moves the sold-out
//! flag's version.

use flashsale_core::buckets::home_bucket;
use flashsale_core::{
    HotLedger, HotPurchases, LedgerError, OrderNo, SaleMode, SoldOutSupport, UserId,
};
use flashsale_testkit::bucketed::{bucketed_sale, buyers, rebuild_with_one_unit, Spread};
use flashsale_testkit::conformance::{accepted, buy_ok, expire_until, req, warm};

use crate::common::{raw, TestLedger};

/// What a failed batch names as written (accepted by the ledger, maybe never answered).
fn written(result: Result<Vec<flashsale_core::PurchaseOutcome>, LedgerError>) -> Vec<OrderNo> {
    match result {
        Err(LedgerError::Unconfirmed { written, .. }) => written,
        other => panic!("a failed batch naming what it wrote, got {other:?}"),
    }
}

/// A batch of two buyers homed at two buckets, the second bucket broken (its requests key
/// is not a hash, so its script fails): the batch fails, and names the purchase the first
/// bucket accepted, so the batcher journals it.
#[tokio::test]
async fn a_batch_whose_second_home_fails_names_what_the_first_accepted() {
    let t = TestLedger::with_buckets().await;
    let sale = bucketed_sale(SaleMode::Direct, 4, 1, 2);
    let sku = warm(t.ledger.as_ref(), &sale).await;
    let layout = t.ledger.layout(sku).await.unwrap();
    let at0 = (buyers(2, 20, Spread::Skewed).into_iter())
        .find(|&u| home_bucket(UserId(u), 2) == 0)
        .expect("four in five skewed buyers are homed at bucket 0");
    let at1 = buyers(2, 1, Spread::OneHome)[0];
    let broken = t.ledger.keys().requests(layout.copy(1));
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg(&broken)
        .ignore()
        .cmd("SET")
        .arg(&broken)
        .arg("not a hash")
        .ignore()
        .query_async(&mut raw().await)
        .await
        .unwrap();
    let batch = [req(sku, at0, "a", 1), req(sku, at1, "a", 1)];
    let written = written(t.ledger.purchase_batch(sku, &batch).await);
    assert_eq!(written.len(), 1, "{written:?}");
    let order = t.ledger.order(&written[0]).await.unwrap().expect("stored");
    assert_eq!(order.user_id.0, at0);
    t.cleanup().await;
}

/// Two buyers at one home holding one unit: the first is accepted in the first round, the
/// second is short and a later round fails (its buyer's count unreadable): the batch fails
/// and still names the first round's purchase.
#[tokio::test]
async fn a_later_round_that_fails_keeps_the_first_rounds_purchase_named() {
    let t = TestLedger::with_buckets().await;
    let sale = bucketed_sale(SaleMode::Direct, 2, 1, 2);
    let sku = warm(t.ledger.as_ref(), &sale).await;
    let layout = t.ledger.layout(sku).await.unwrap();
    let users = buyers(2, 2, Spread::OneHome);
    let _: () = redis::cmd("HSET")
        .arg(t.ledger.keys().buyers(layout.copy(1)))
        .arg(users[1])
        .arg("unreadable")
        .query_async(&mut raw().await)
        .await
        .unwrap();
    let batch = [req(sku, users[0], "a", 1), req(sku, users[1], "a", 1)];
    let written = written(t.ledger.purchase_batch(sku, &batch).await);
    assert_eq!(written.len(), 1, "{written:?}");
    let order = t.ledger.order(&written[0]).await.unwrap().expect("stored");
    assert_eq!(order.user_id.0, users[0]);
    t.cleanup().await;
}

/// Reserve mode, two buckets, three holds at bucket 1, bucket 0's copy gone: the holds of
/// bucket 1 still expire.
#[tokio::test]
async fn holds_of_a_healthy_bucket_expire_while_another_is_missing() {
    let t = TestLedger::with_buckets().await;
    let sale = bucketed_sale(SaleMode::Reserve, 6, 1, 2);
    let sku = warm(t.ledger.as_ref(), &sale).await;
    let layout = t.ledger.layout(sku).await.unwrap();
    for user in buyers(2, 3, Spread::OneHome) {
        buy_ok(t.ledger.as_ref(), sku, user, "a", 1).await;
    }
    let _: i64 = redis::cmd("DEL")
        .arg(t.ledger.keys().sale(layout.copy(0)))
        .query_async(&mut raw().await)
        .await
        .unwrap();
    expire_until(t.ledger.as_ref(), sku, 3).await;
    let (reserved, available): (u64, u64) = redis::cmd("HMGET")
        .arg(t.ledger.keys().sale(layout.copy(1)))
        .arg(&["reserved", "available"])
        .query_async(&mut raw().await)
        .await
        .unwrap();
    assert_eq!((reserved, available), (0, 3), "bucket 1's holds came back");
    t.cleanup().await;
}

/// Bucket 1 rebuilt from a row without its one purchase, then one new purchase there: the
/// count of accepted requests is as before, and the version of the keys must still move,
/// or a sold-out flag would keep keys without the new purchase and refuse its retry.
#[tokio::test]
async fn a_rebuilt_bucket_moves_the_accepted_keys_version() {
    let t = TestLedger::with_buckets().await;
    let sale = bucketed_sale(SaleMode::Direct, 2, 1, 2);
    let sku = warm(t.ledger.as_ref(), &sale).await;
    let users = buyers(2, 2, Spread::OneHome);
    let lost = accepted(
        &t.ledger
            .purchase_batch(sku, &[req(sku, users[0], "a", 1)])
            .await
            .unwrap()[0],
    );
    let before = t.ledger.accepted_count(sku).await.unwrap().unwrap();

    // A rebuild of bucket 1 from a row that never stored the purchase (epoch 3 → 5).
    rebuild_with_one_unit(t.ledger.as_ref(), &sale, 1, 5).await;
    assert_eq!(t.ledger.order(&lost.order_no).await.unwrap(), None);

    buy_ok(t.ledger.as_ref(), sku, users[1], "a", 1).await;
    let after = t.ledger.accepted_count(sku).await.unwrap().unwrap();
    assert_eq!(after.1, before.1, "one lost, one new");
    assert_ne!(
        after, before,
        "the keys' version moved with bucket 1's epoch"
    );
    t.cleanup().await;
}
