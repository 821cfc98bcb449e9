//! Differential test: random operations on the Redis ledger and on core's `SaleBook` (the
//! reference rules) give the same outcomes, order numbers and counters.

use crate::common::TestLedger;
use flashsale_core::{
    HotCopies, HotLedger, HotOrder, OrderNo, OrderStatus, PurchaseOutcome, PurchaseRequest, Sale,
    SaleBook, SaleMode, SaleState, UserId,
};
use flashsale_testkit::conformance::{live_sale, now_ms, req};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same order, whatever status each ledger reports for an unresolved one.
fn same_order(redis: &HotOrder, model: &HotOrder) {
    let unresolved = |s| {
        matches!(
            s,
            OrderStatus::Pending | OrderStatus::Created | OrderStatus::Reserved
        )
    };
    assert_eq!(redis.order_no, model.order_no);
    assert_eq!(
        (redis.user_id, &redis.request_id),
        (model.user_id, &model.request_id)
    );
    assert_eq!(redis.quantity, model.quantity);
    assert!(redis.status == model.status || unresolved(redis.status) && unresolved(model.status));
}

fn same_outcome(redis: &PurchaseOutcome, model: &PurchaseOutcome) {
    match (redis, model) {
        (
            PurchaseOutcome::Accepted {
                order: a,
                replayed: ra,
            },
            PurchaseOutcome::Accepted {
                order: b,
                replayed: rb,
            },
        ) => {
            same_order(a, b);
            assert_eq!(ra, rb);
        }
        (a, b) => assert_eq!(a, b),
    }
}

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
    l.warm(&sale, &sale.fresh_counters(), 1).await.unwrap();
    let mut book = SaleBook::new(sale.clone(), sale.fresh_counters(), 1);
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
                l.set_state(sale.sku_id, state).await.unwrap();
                book.sale.state = state;
            }
            1..=2 if !orders.is_empty() => {
                let no = orders[rng.random_range(0..orders.len())];
                let user = if rng.random_bool(0.9) {
                    book.order(&no).unwrap().user_id
                } else {
                    UserId(99)
                };
                let pay = rng.random_bool(0.5);
                let (redis, model) = if pay {
                    (
                        l.pay(&no, user).await.unwrap(),
                        book.pay(&no, user, now_ms()).map(|r| r.0),
                    )
                } else {
                    (
                        l.cancel(&no, user).await.unwrap(),
                        book.cancel(&no, user, now_ms()).map(|r| r.0),
                    )
                };
                match (&redis, &model) {
                    (Ok(a), Ok(b)) => same_order(a, b),
                    _ => assert_eq!(redis, model, "seed {seed} pay={pay} {no}"),
                }
            }
            _ => {
                let batch = random_batch(&mut rng, &sale);
                let out = l.purchase_batch(sale.sku_id, &batch).await.unwrap();
                for (r, got) in batch.iter().zip(&out) {
                    let (want, event) = book.purchase(r, now_ms());
                    same_outcome(got, &want);
                    if let (Some(_), PurchaseOutcome::Accepted { order, .. }) = (event, &want) {
                        orders.push(order.order_no);
                    }
                }
            }
        }
    }
    let counters = l.counters(sale.sku_id).await.unwrap().unwrap();
    assert_eq!(counters, book.counters, "seed {seed}");
    for no in &orders {
        same_order(
            &l.order(no).await.unwrap().unwrap(),
            book.order(no).unwrap(),
        );
    }
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
