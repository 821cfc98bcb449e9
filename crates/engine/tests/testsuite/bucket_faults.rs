//! A bucketed sale on Redis with one bucket lost: a retry of an accepted purchase still
//! reaches the ledger past the sold-out flag (I4), also after a bucket other than 0 was
//! rebuilt without a purchase and one new purchase left the count of accepted requests as it
//! was; and the other buckets' holds still expire, on an instance new to the sale too.

use std::sync::Arc;
use std::time::Duration;

use flashsale_core::{ErrorCode, PurchaseOutcome, SaleMode, SaleState};
use flashsale_engine::cache::SoldOutFlags;
use flashsale_engine::shop::Batcher;
use flashsale_redis::RedisLedger;
use flashsale_testkit::bucketed::{bucketed_sale, buyers, rebuild_with_one_unit, Spread};
use flashsale_testkit::conformance::{req, warm};
use flashsale_testkit::redis_server::{shared_url, unique_prefix};
use flashsale_testkit::wait;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_bucket_rebuild_reaches_the_ledger() {
    let ledger = RedisLedger::connect(&shared_url(), &unique_prefix())
        .await
        .unwrap()
        .with_buckets();
    let ledger = Arc::new(ledger);
    // One unit in each of two buckets.
    let sale = bucketed_sale(SaleMode::Direct, 2, 1, 2);
    let sku = warm(ledger.as_ref(), &sale).await;
    let flags = Arc::new(SoldOutFlags::new(Duration::from_millis(100)));
    let batcher = Batcher::with_flags(ledger.clone(), 16, 64, flags, 1_000, Arc::default());
    let (at0, at1) = (buyers(2, 20, Spread::Skewed), buyers(2, 2, Spread::OneHome));
    // Four in five skewed buyers are homed at bucket 0; these are.
    let at0: Vec<u64> = at0
        .into_iter()
        .filter(|&u| flashsale_core::buckets::home_bucket(flashsale_core::UserId(u), 2) == 0)
        .collect();
    let buy = |user: u64, rid: &'static str| batcher.purchase(req(sku, user, rid, 1));
    let accepted = |o: &PurchaseOutcome| matches!(o, PurchaseOutcome::Accepted { .. });
    assert!(
        accepted(&buy(at1[0], "a").await.unwrap()),
        "bucket 1's unit"
    );
    assert!(
        accepted(&buy(at0[0], "a").await.unwrap()),
        "bucket 0's unit"
    );
    let refused = buy(at0[1], "a").await.unwrap();
    assert_eq!(refused, PurchaseOutcome::Rejected(ErrorCode::SoldOut));
    let newcomer = req(sku, at0[1], "new", 1);
    let flagged = || async { batcher.sold_out_here(&newcomer).then_some(()) };
    wait::until("the sold-out flag", Duration::from_secs(5), flagged).await;

    // Bucket 1 rebuilt from a row that never stored its purchase (epoch 3 → 5): its unit is
    // back, and once the flag lapses a new buyer there takes it.
    rebuild_with_one_unit(ledger.as_ref(), &sale, 1, 5).await;
    let lapsed = || async { (!batcher.sold_out_here(&newcomer)).then_some(()) };
    wait::until("the flag to lapse", Duration::from_secs(5), lapsed).await;
    assert!(accepted(&buy(at1[1], "b").await.unwrap()), "the unit back");

    // Sold out again: the flag is set with keys that must name the new purchase.
    let refused = buy(at0[1], "again").await.unwrap();
    assert_eq!(refused, PurchaseOutcome::Rejected(ErrorCode::SoldOut));
    wait::until("the sold-out flag", Duration::from_secs(5), flagged).await;
    let retry = req(sku, at1[1], "b", 1);
    assert!(
        !batcher.sold_out_here(&retry),
        "a retry of an accepted purchase is not answered SOLD_OUT locally"
    );
    let again = buy(at1[1], "b").await.unwrap();
    assert!(
        matches!(again, PurchaseOutcome::Accepted { replayed: true, .. }),
        "{again:?}"
    );
}

/// An instance new to a reserve-mode sale of two buckets (it never read the layout), while
/// bucket 0's copy is gone: its expiry worker finds the other bucket where the database
/// keeps it, and that bucket's holds expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_expires_a_healthy_buckets_holds_while_bucket_0_is_missing() {
    use flashsale_core::HotPurchases;
    let db = flashsale_testkit::mariadb::TestDatabase::create().await;
    let store = flashsale_engine::backends::open_store(&db.url)
        .await
        .unwrap();
    let prefix = unique_prefix();
    let connect = || async {
        let ledger = RedisLedger::connect(&shared_url(), &prefix).await.unwrap();
        Arc::new(ledger.with_buckets())
    };
    let first = connect().await;
    let sale = bucketed_sale(SaleMode::Reserve, 6, 1, 2);
    let sku = sale.sku_id;
    store.create_sale(&sale).await.unwrap();
    store.set_state(sku, SaleState::Live).await.unwrap();
    flashsale_engine::reconcile::rebuild(first.as_ref(), store.as_ref(), sku)
        .await
        .unwrap();
    for user in buyers(2, 3, Spread::OneHome) {
        let out = first
            .purchase_batch(sku, &[req(sku, user, "a", 1)])
            .await
            .unwrap();
        assert!(
            matches!(out[0], PurchaseOutcome::Accepted { .. }),
            "{out:?}"
        );
    }
    let layout = first.layout(sku).await.unwrap();
    let mut conn = redis::Client::open(shared_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(first.keys().sale(layout.copy(0)))
        .query_async(&mut conn)
        .await
        .unwrap();

    let settled: flashsale_engine::workers::Settled = Arc::new(|_| false);
    let mut worker = flashsale_engine::workers::ExpiryWorker::new(
        connect().await,
        store.clone(),
        settled,
        Duration::from_millis(50),
        100,
    );
    let held_at_1 = first.keys().sale(layout.copy(1));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        use flashsale_engine::workers::Worker;
        worker.work().await.unwrap();
        let reserved: u64 = redis::cmd("HGET")
            .arg(&held_at_1)
            .arg("reserved")
            .query_async(&mut conn)
            .await
            .unwrap();
        if reserved == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "bucket 1's holds never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
