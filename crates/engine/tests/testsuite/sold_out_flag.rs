//! The sold-out flag of a bucketed sale on Redis: a retry of an accepted purchase always
//! reaches the ledger (I4), also after a bucket other than 0 was rebuilt without a purchase
//! and one new purchase left the count of accepted requests as it was.

use std::sync::Arc;
use std::time::Duration;

use flashsale_core::{
    BucketTransfers, Counters, ErrorCode, HotCopies, PurchaseOutcome, SaleMode, SaleState,
};
use flashsale_engine::batcher::Batcher;
use flashsale_engine::cache::SoldOutFlags;
use flashsale_redis::RedisLedger;
use flashsale_testkit::bucketed::{bucketed_sale, buyers, Spread};
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
    let share = Counters {
        total: 1,
        available: 1,
        ..Counters::default()
    };
    assert!(ledger.fence_bucket(sku, 1).await.unwrap());
    let none = BucketTransfers::default();
    ledger
        .load_bucket(&sale, 1, &share, 5, &none)
        .await
        .unwrap();
    ledger
        .open_bucket(sku, 1, 5, SaleState::Live)
        .await
        .unwrap();
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
