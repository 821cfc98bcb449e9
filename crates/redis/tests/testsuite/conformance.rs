//! The ledger conformance suite (flashsale-testkit) against the real, shared Redis.

use crate::common::TestLedger;
use flashsale_testkit::conformance;

macro_rules! conformance_test {
    ($ledger:expr; $($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            let t = $ledger.await;
            conformance::$name(t.ledger.as_ref()).await;
            t.cleanup().await;
        }
    )*};
}

/// The checks of one ledger, on copies of layout 1 (the default) or of layout 2.
macro_rules! conformance_tests {
    ($ledger:expr) => {
        conformance_test!($ledger;
    accepts_until_sold_out,
    per_user_limit_counts_units,
    window_and_state_are_judged,
    not_warmed_sales_are_refused,
    replay_returns_the_first_outcome,
    load_replaces_only_older_copies_and_fences_until_open,
    state_changes_only_from_the_expected_state,
    accepted_count_follows_the_copy,
    batch_results_come_in_order,
    accepted_keys_list_accepted_requests,
    oversized_batch_is_refused,
    reserve_pay_cancel_expire,
    one_resolution_per_reservation,
    direct_orders_are_already_resolved,
    restock_is_announced,
        );
    };
}

conformance_tests!(TestLedger::new());

/// Every check on copies of layout 2 (one record per buyer), with and without buckets.
mod records {
    use super::*;

    conformance_tests!(TestLedger::with_records());

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_buyers_keep_invariants() {
        let t = TestLedger::with_records().await;
        conformance::concurrent_buyers_keep_invariants(t.dyn_ledger()).await;
        t.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_all_on_one_ledger() {
        let t = TestLedger::with_records().await;
        conformance::run_all(t.dyn_ledger()).await;
        t.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_all_with_buckets_on_one_redis() {
        let t = TestLedger::with_buckets_and_records().await;
        conformance::run_all(t.dyn_ledger()).await;
        t.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_buyers_keep_invariants() {
    let t = TestLedger::new().await;
    conformance::concurrent_buyers_keep_invariants(t.dyn_ledger()).await;
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_on_one_ledger() {
    let t = TestLedger::new().await;
    conformance::run_all(t.dyn_ledger()).await;
    t.cleanup().await;
}

/// The whole suite with buckets on: every check, plus the bucketed ones (transfers, holds at
/// their bucket, exact stock for every spread of buyers) on one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_with_buckets_on_one_redis() {
    let t = TestLedger::with_buckets().await;
    conformance::run_all(t.dyn_ledger()).await;
    t.cleanup().await;
}
