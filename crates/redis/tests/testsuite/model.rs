//! Differential test: random operations on the Redis ledger and on core's `SaleBook` (the
//! reference rules) give the same outcomes, order numbers and counters.

use crate::common::TestLedger;
use flashsale_core::{OrderNo, PurchaseRequest, Sale, SaleMode, SaleState};
use flashsale_testkit::conformance::{live_sale, req};
use flashsale_testkit::model;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What a run's random requests range over.
struct Shape {
    stock: (u64, u64),
    users: u64,
    request_ids: u32,
    limit: (u32, u32),
    steps: usize,
}

/// Few orders per buyer: every answer of the rules, against a small stock.
const MIXED: Shape = Shape {
    stock: (5, 30),
    users: 12,
    request_ids: 4,
    limit: (1, 3),
    steps: 60,
};

/// Buyers of a high per-user limit who take many orders each: their records grow long (in
/// layout 2, past the length at which a record carries its live units).
const MANY_ORDERS: Shape = Shape {
    stock: (100, 400),
    users: 3,
    request_ids: 60,
    limit: (40, 60),
    steps: 160,
};

fn random_batch(rng: &mut StdRng, sale: &Sale, shape: &Shape) -> Vec<PurchaseRequest> {
    (0..rng.random_range(1..=8))
        .map(|_| {
            let user = rng.random_range(1..=shape.users);
            let rid = format!("r{}", rng.random_range(0..shape.request_ids));
            let q = rng.random_range(0..=sale.per_user_limit.min(3) + 1);
            let q = if q > 3 { sale.per_user_limit + 1 } else { q };
            req(sale.sku_id, user, &rid, q)
        })
        .collect()
}

async fn run_seed(t: &TestLedger, seed: u64, mode: SaleMode, shape: &Shape) {
    let mut rng = StdRng::seed_from_u64(seed);
    let stock = rng.random_range(shape.stock.0..=shape.stock.1);
    let mut sale = live_sale(mode, stock, rng.random_range(shape.limit.0..=shape.limit.1));
    sale.payment_timeout_ms = 3_600_000;
    let l = t.ledger.as_ref();
    let mut book = model::warm(l, &sale).await;
    let mut orders: Vec<OrderNo> = Vec::new();
    for _ in 0..shape.steps {
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
                let batch = random_batch(&mut rng, &sale, shape);
                orders.extend(model::buy_batch(l, &mut book, sale.sku_id, &batch).await);
            }
        }
    }
    model::same_end(l, &book, &orders, &format!("seed {seed}")).await;
}

/// Even seeds run a direct sale, odd ones a sale of holds.
fn mode_of(seed: u64) -> SaleMode {
    if seed.is_multiple_of(2) {
        SaleMode::Direct
    } else {
        SaleMode::Reserve
    }
}

#[tokio::test]
async fn redis_scripts_judge_like_the_sale_book() {
    let t = TestLedger::new().await;
    for seed in 0..40 {
        run_seed(&t, seed, mode_of(seed), &MIXED).await;
    }
    t.cleanup().await;
}

/// The same in layout 2 (one record per buyer), with few orders per buyer and with many.
#[tokio::test]
async fn buyer_records_judge_like_the_sale_book() {
    let t = TestLedger::with_records().await;
    for seed in 0..24 {
        let shape = if seed < 12 { &MIXED } else { &MANY_ORDERS };
        run_seed(&t, seed, mode_of(seed), shape).await;
    }
    t.cleanup().await;
}
