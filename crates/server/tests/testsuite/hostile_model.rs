//! Property test of the ledger rules on the embedded ledger: random operation sequences
//! (purchases in batches, pay, cancel, state changes; valid and invalid) give the same
//! outcomes, order numbers and counters as core's `SaleBook`, the reference model. The Redis
//! ledger runs the same kind of test in crates/redis/tests/testsuite/model.rs.

use std::sync::Arc;

use flashsale_core::{
    HotCopies, HotLedger, HotOrder, OrderNo, OrderStatus, OrderStore, PurchaseOutcome, Sale,
    SaleBook, SaleMode, SaleState, UserId,
};
use flashsale_embedded::EmbeddedLedger;
use flashsale_store::SqliteStore;
use flashsale_testkit::conformance::{live_sale, now_ms, req};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// (user, request id index, quantity) × 1..=8, one batch.
    Buy(Vec<(u64, u8, u32)>),
    /// Pay (true) or cancel an earlier order (index modulo their number), as its owner or not.
    Resolve {
        pick: usize,
        pay: bool,
        owner: bool,
    },
    State(SaleState),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec((1u64..=12, 0u8..4, 0u32..=4), 1..=8).prop_map(Op::Buy),
        2 => (any::<usize>(), any::<bool>(), prop::bool::weighted(0.9))
            .prop_map(|(pick, pay, owner)| Op::Resolve { pick, pay, owner }),
        1 => prop_oneof![
            3 => Just(SaleState::Live),
            1 => Just(SaleState::Paused),
            1 => Just(SaleState::Ended),
        ]
        .prop_map(Op::State),
    ]
}

fn same_order(got: &HotOrder, want: &HotOrder) {
    assert_eq!(got.order_no, want.order_no);
    assert_eq!(
        (got.user_id, &got.request_id),
        (want.user_id, &want.request_id)
    );
    assert_eq!(got.quantity, want.quantity);
    let unresolved = |s| {
        matches!(
            s,
            OrderStatus::Pending | OrderStatus::Created | OrderStatus::Reserved
        )
    };
    assert!(got.status == want.status || unresolved(got.status) && unresolved(want.status));
}

fn same_outcome(got: &PurchaseOutcome, want: &PurchaseOutcome) {
    match (got, want) {
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

async fn run(ledger: &EmbeddedLedger, mode: SaleMode, total: u64, limit: u32, ops: Vec<Op>) {
    let mut sale: Sale = live_sale(mode, total, limit);
    sale.payment_timeout_ms = if mode == SaleMode::Reserve {
        3_600_000
    } else {
        0
    };
    ledger.warm(&sale, &sale.fresh_counters(), 1).await.unwrap();
    let mut book = SaleBook::new(sale.clone(), sale.fresh_counters(), 1);
    let mut orders: Vec<OrderNo> = Vec::new();
    for op in ops {
        match op {
            Op::State(state) => {
                ledger.set_state(sale.sku_id, state).await.unwrap();
                book.sale.state = state;
            }
            Op::Resolve { pick, pay, owner } => {
                if orders.is_empty() {
                    continue;
                }
                let no = orders[pick % orders.len()];
                let user = if owner {
                    book.order(&no).unwrap().user_id
                } else {
                    UserId(99)
                };
                let (got, want) = if pay {
                    (
                        ledger.pay(&no, user).await.unwrap(),
                        book.pay(&no, user, now_ms()).map(|r| r.0),
                    )
                } else {
                    (
                        ledger.cancel(&no, user).await.unwrap(),
                        book.cancel(&no, user, now_ms()).map(|r| r.0),
                    )
                };
                match (&got, &want) {
                    (Ok(a), Ok(b)) => same_order(a, b),
                    _ => assert_eq!(got, want, "pay={pay} {no}"),
                }
            }
            Op::Buy(batch) => {
                let reqs: Vec<_> = batch
                    .iter()
                    .map(|(u, r, q)| req(sale.sku_id, *u, &format!("r{r}"), *q))
                    .collect();
                let out = ledger.purchase_batch(sale.sku_id, &reqs).await.unwrap();
                assert_eq!(out.len(), reqs.len());
                for (r, got) in reqs.iter().zip(&out) {
                    let (want, event) = book.purchase(r, now_ms());
                    same_outcome(got, &want);
                    if let (Some(_), PurchaseOutcome::Accepted { order, .. }) = (event, &want) {
                        orders.push(order.order_no);
                    }
                }
            }
        }
    }
    let counters = ledger.counters(sale.sku_id).await.unwrap().unwrap();
    assert_eq!(counters, book.counters);
    let c = counters;
    assert_eq!(c.available + c.reserved + c.sold, c.total, "I2");
    for no in &orders {
        same_order(
            &ledger.order(no).await.unwrap().unwrap(),
            book.order(no).unwrap(),
        );
    }
    // The system of record agrees with the model (the embedded ledger commits before answering).
    let stored = ledger.store().events(sale.sku_id).await.unwrap();
    assert_eq!(
        stored.len() as u64,
        counters.seq,
        "one event per change, gap-free"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn embedded_ledger_judges_like_the_sale_book(
        reserve in any::<bool>(),
        total in 1u64..=30,
        limit in 1u32..=3,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = Arc::new(SqliteStore::open("sqlite::memory:").await.unwrap());
            let ledger = EmbeddedLedger::open(store).await.unwrap();
            let mode = if reserve { SaleMode::Reserve } else { SaleMode::Direct };
            run(&ledger, mode, total, limit, ops).await;
        });
    }
}
