//! Differential testing against core's `SaleBook`, the reference model of the ledger rules:
//! the same operation on a hot ledger and on the book must give the same outcome, order
//! numbers and counters. What the model tests of every hot ledger (Redis, embedded) share;
//! each test draws its own operations.

use flashsale_core::{
    HotCopies, HotLedger, HotOrder, HotPurchases, OrderNo, OrderStatus, PurchaseOutcome,
    PurchaseRequest, Sale, SaleBook, SaleState, SkuId, UserId,
};

use crate::conformance::now_ms;

/// Warms `sale` (fresh counters, epoch 1) on `ledger`; gives the book that models it.
pub async fn warm<L: HotCopies + ?Sized>(ledger: &L, sale: &Sale) -> SaleBook {
    ledger.warm(sale, &sale.fresh_counters(), 1).await.unwrap();
    SaleBook::new(sale.clone(), sale.fresh_counters(), 1)
}

/// Sets the sale's state on `ledger` and in `book`.
pub async fn set_state(ledger: &dyn HotLedger, book: &mut SaleBook, state: SaleState) {
    ledger.set_state(book.sale.sku_id, state).await.unwrap();
    book.sale.state = state;
}

/// The owner of order `no` in `book` when `owner`, else a user who owns none of them.
pub fn owner_or_stranger(book: &SaleBook, no: &OrderNo, owner: bool) -> UserId {
    if owner {
        book.order(no).expect("an order of the book").user_id
    } else {
        UserId(99)
    }
}

/// The same order, whatever status each side reports for an unresolved one (a hot ledger may
/// say `PENDING` where the model already says `CREATED` or `RESERVED`).
pub fn same_order(got: &HotOrder, want: &HotOrder) {
    let unresolved = |s| {
        matches!(
            s,
            OrderStatus::Pending | OrderStatus::Created | OrderStatus::Reserved
        )
    };
    assert_eq!(got.order_no, want.order_no);
    assert_eq!(
        (got.user_id, &got.request_id),
        (want.user_id, &want.request_id)
    );
    assert_eq!(got.quantity, want.quantity);
    assert!(got.status == want.status || unresolved(got.status) && unresolved(want.status));
}

/// The same purchase outcome: an accepted one names the same order ([`same_order`]) and the
/// same replay flag; a refusal is the same refusal.
pub fn same_outcome(got: &PurchaseOutcome, want: &PurchaseOutcome) {
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

/// Buys `reqs` as one batch on `ledger` and one by one in `book`; every answer must agree.
/// Gives the order numbers of the new orders (not the replays).
pub async fn buy_batch(
    ledger: &dyn HotPurchases,
    book: &mut SaleBook,
    sku: SkuId,
    reqs: &[PurchaseRequest],
) -> Vec<OrderNo> {
    let out = ledger.purchase_batch(sku, reqs).await.unwrap();
    assert_eq!(out.len(), reqs.len(), "one answer per request");
    let mut new = Vec::new();
    for (r, got) in reqs.iter().zip(&out) {
        let (want, event) = book.purchase(r, now_ms());
        same_outcome(got, &want);
        if let (Some(_), PurchaseOutcome::Accepted { order, .. }) = (event, &want) {
            new.push(order.order_no);
        }
    }
    new
}

/// Pays (`pay`) or cancels order `no` as `user` on `ledger` and in `book`; both must answer
/// the same (`what` names the case in a failure).
pub async fn resolve(
    ledger: &dyn HotLedger,
    book: &mut SaleBook,
    no: &OrderNo,
    user: UserId,
    pay: bool,
    what: &str,
) {
    let (got, want) = if pay {
        (
            ledger.pay(no, user).await.unwrap(),
            book.pay(no, user, now_ms()).map(|r| r.0),
        )
    } else {
        (
            ledger.cancel(no, user).await.unwrap(),
            book.cancel(no, user, now_ms()).map(|r| r.0),
        )
    };
    match (&got, &want) {
        (Ok(a), Ok(b)) => same_order(a, b),
        _ => assert_eq!(got, want, "{what} pay={pay} {no}"),
    }
}

/// At the end of a run: `ledger` holds the book's counters and every order as the book has
/// it (`what` names the run in a failure).
pub async fn same_end(ledger: &dyn HotLedger, book: &SaleBook, orders: &[OrderNo], what: &str) {
    let counters = ledger.counters(book.sale.sku_id).await.unwrap().unwrap();
    assert_eq!(counters, book.counters, "{what}");
    let c = counters;
    assert_eq!(c.available + c.reserved + c.sold, c.total, "I2 {what}");
    for no in orders {
        same_order(
            &ledger.order(no).await.unwrap().unwrap(),
            book.order(no).unwrap(),
        );
    }
}
