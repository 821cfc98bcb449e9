//! Differential test: random operations on the Redis ledger and on core's `SaleBook` (the
//! reference rules) give the same outcomes, order numbers and counters.

use crate::common::TestLedger;
use flashsale_core::{OrderNo, PurchaseRequest, Sale, SaleMode, SaleState};
use flashsale_testkit::conformance::{live_sale, req};
use flashsale_testkit::model;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_batch(rng: &mut StdRng, sale: &Sale) -> Vec<PurchaseRequest> {
    (0..rng.random_range(1..=8))
        .map(|_| {
            let user = rng.random_range(1..=12);
            let rid = format!("r{}", rng.random_range(0..4));
            let q = rng.random_range(0..=sale.per_user_limit + 1);
            req(sale.sku_id, user, &rid, q)
        })
        .collect()
}

async fn run_seed(t: &TestLedger, seed: u64, mode: SaleMode) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sale = live_sale(mode, rng.random_range(5..=30), rng.random_range(1..=3));
    sale.payment_timeout_ms = 3_600_000;
    let l = t.ledger.as_ref();
    let mut book = model::warm(l, &sale).await;
    let mut orders: Vec<OrderNo> = Vec::new();
    for _ in 0..60 {
        match rng.random_range(0..10) {
            0 => {
                let state =
                    [SaleState::Live, SaleState::Paused, SaleState::Ended][rng.random_range(0..3)];
                let state = if rng.random_bool(0.6) {
                    SaleState::Live
                } else {
                    state
                };
                model::set_state(l, &mut book, state).await;
            }
            1..=2 if !orders.is_empty() => {
                let no = orders[rng.random_range(0..orders.len())];
                let user = model::owner_or_stranger(&book, &no, rng.random_bool(0.9));
                let pay = rng.random_bool(0.5);
                model::resolve(l, &mut book, &no, user, pay, &format!("seed {seed}")).await;
            }
            _ => {
                let batch = random_batch(&mut rng, &sale);
                orders.extend(model::buy_batch(l, &mut book, sale.sku_id, &batch).await);
            }
        }
    }
    model::same_end(l, &book, &orders, &format!("seed {seed}")).await;
}

#[tokio::test]
async fn redis_scripts_judge_like_the_sale_book() {
    let t = TestLedger::new().await;
    for seed in 0..40 {
        let mode = if seed % 2 == 0 {
            SaleMode::Direct
        } else {
            SaleMode::Reserve
        };
        run_seed(&t, seed, mode).await;
    }
    t.cleanup().await;
}
