//! Property test of the ledger rules on the embedded ledger: random operation sequences
//! (purchases in batches, pay, cancel, state changes; valid and invalid) give the same
//! outcomes, order numbers and counters as core's `SaleBook`, the reference model. The Redis
//! ledger runs the same kind of test in crates/redis/tests/testsuite/model.rs; both check
//! with `flashsale_testkit::model`.

use std::sync::Arc;

use flashsale_core::{OrderNo, OrderStore, Sale, SaleMode, SaleState};
use flashsale_embedded::EmbeddedLedger;
use flashsale_store::SqliteStore;
use flashsale_testkit::conformance::{live_sale, req};
use flashsale_testkit::model;
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

async fn run(ledger: &EmbeddedLedger, mode: SaleMode, total: u64, limit: u32, ops: Vec<Op>) {
    let mut sale: Sale = live_sale(mode, total, limit);
    sale.payment_timeout_ms = if mode == SaleMode::Reserve {
        3_600_000
    } else {
        0
    };
    let mut book = model::warm(ledger, &sale).await;
    let mut orders: Vec<OrderNo> = Vec::new();
    for op in ops {
        match op {
            Op::State(state) => {
                model::set_state(ledger, &mut book, state).await;
            }
            Op::Resolve { pick, pay, owner } => {
                if orders.is_empty() {
                    continue;
                }
                let no = orders[pick % orders.len()];
                let user = model::owner_or_stranger(&book, &no, owner);
                model::resolve(ledger, &mut book, &no, user, pay, "").await;
            }
            Op::Buy(batch) => {
                let reqs: Vec<_> = batch
                    .iter()
                    .map(|(u, r, q)| req(sale.sku_id, *u, &format!("r{r}"), *q))
                    .collect();
                orders.extend(model::buy_batch(ledger, &mut book, sale.sku_id, &reqs).await);
            }
        }
    }
    model::same_end(ledger, &book, &orders, "").await;
    // The system of record agrees with the model (the embedded ledger commits before answering).
    let stored = ledger.store().events(sale.sku_id).await.unwrap();
    assert_eq!(
        stored.len() as u64,
        book.counters.seq,
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
