use super::*;
use crate::ids::SkuId;

const NOW: i64 = 1_000;

fn sale(total: u64, limit: u32, mode: SaleMode) -> Sale {
    Sale {
        sku_id: SkuId(7),
        name: "t".into(),
        total_stock: total,
        per_user_limit: limit,
        mode,
        payment_timeout_ms: 100,
        starts_at_ms: 500,
        ends_at_ms: 5_000,
        state: SaleState::Live,
        buckets: 1,
        admission: Default::default(),
    }
}

fn book(total: u64, limit: u32, mode: SaleMode) -> SaleBook {
    let s = sale(total, limit, mode);
    let c = s.fresh_counters();
    SaleBook::new(s, c, 1)
}

fn req(user: u64, rid: &str, q: u32) -> PurchaseRequest {
    PurchaseRequest {
        sku_id: SkuId(7),
        user_id: UserId(user),
        request_id: RequestId::parse(rid).unwrap(),
        quantity: q,
    }
}

fn code(b: &mut SaleBook, r: PurchaseRequest, now: i64) -> Option<ErrorCode> {
    b.purchase(&r, now).0.code()
}

#[test]
fn accepts_until_sold_out_then_refuses() {
    let mut b = book(3, 1, SaleMode::Direct);
    for u in 1..=3 {
        assert_eq!(code(&mut b, req(u, "r", 1), NOW), None);
    }
    assert_eq!(code(&mut b, req(4, "r", 1), NOW), Some(ErrorCode::SoldOut));
    assert_eq!(
        (b.counters.available, b.counters.sold, b.counters.seq),
        (0, 3, 3)
    );
}

#[test]
fn replay_returns_the_first_order_even_after_the_sale_changes() {
    let mut b = book(5, 1, SaleMode::Direct);
    let (first, ev) = b.purchase(&req(1, "x", 1), NOW);
    assert!(ev.is_some());
    b.sale.state = SaleState::Ended;
    let (again, ev2) = b.purchase(&req(1, "x", 1), NOW);
    assert!(ev2.is_none());
    match (first, again) {
        (
            PurchaseOutcome::Accepted { order: a, .. },
            PurchaseOutcome::Accepted { order: b, replayed },
        ) => {
            assert_eq!(a.order_no, b.order_no);
            assert!(replayed);
        }
        other => panic!("{other:?}"),
    }
    // The same request id of another user is another request.
    b.sale.state = SaleState::Live;
    assert_eq!(code(&mut b, req(2, "x", 1), NOW), None);
}

#[test]
fn per_user_limit_counts_units_not_orders() {
    let mut b = book(100, 3, SaleMode::Direct);
    assert_eq!(code(&mut b, req(1, "a", 2), NOW), None);
    assert_eq!(
        code(&mut b, req(1, "b", 2), NOW),
        Some(ErrorCode::LimitExceeded)
    );
    assert_eq!(code(&mut b, req(1, "c", 1), NOW), None);
    assert_eq!(
        code(&mut b, req(1, "d", 1), NOW),
        Some(ErrorCode::LimitExceeded)
    );
    assert_eq!(
        code(&mut b, req(2, "a", 4), NOW),
        Some(ErrorCode::LimitExceeded)
    );
    assert_eq!(
        code(&mut b, req(2, "a", 0), NOW),
        Some(ErrorCode::InvalidRequest)
    );
    assert_eq!(b.units_held(UserId(1)), 3);
}

#[test]
fn window_and_state_are_judged_before_stock() {
    let mut b = book(1, 1, SaleMode::Direct);
    assert_eq!(
        code(&mut b, req(1, "a", 1), 499),
        Some(ErrorCode::NotStarted)
    );
    assert_eq!(code(&mut b, req(1, "a", 1), 5_000), Some(ErrorCode::Ended));
    b.sale.state = SaleState::Paused;
    assert_eq!(code(&mut b, req(1, "a", 1), NOW), Some(ErrorCode::Paused));
    b.sale.state = SaleState::Scheduled;
    assert_eq!(
        code(&mut b, req(1, "a", 1), NOW),
        Some(ErrorCode::NotStarted)
    );
    assert_eq!(b.counters.seq, 0);
}

#[test]
fn reserve_pay_cancel_expire_resolve_once() {
    let mut b = book(10, 2, SaleMode::Reserve);
    let no = |b: &mut SaleBook, u, r: &str| match b.purchase(&req(u, r, 1), NOW).0 {
        PurchaseOutcome::Accepted { order, .. } => order.order_no,
        other => panic!("{other:?}"),
    };
    let a = no(&mut b, 1, "a");
    let c = no(&mut b, 2, "c");
    let e = no(&mut b, 3, "e");
    assert_eq!((b.counters.available, b.counters.reserved), (7, 3));
    assert_eq!(b.pay(&a, UserId(9), NOW), Err(ErrorCode::OrderNotFound));
    assert_eq!(
        b.pay(&a, UserId(1), NOW).unwrap().0.status,
        OrderStatus::Paid
    );
    // A retried pay answers the paid order again and changes nothing; a cancel conflicts.
    let (again, event) = b.pay(&a, UserId(1), NOW).unwrap();
    assert_eq!((again.status, event), (OrderStatus::Paid, None));
    assert_eq!(
        b.cancel(&a, UserId(1), NOW),
        Err(ErrorCode::AlreadyResolved)
    );
    assert_eq!(
        b.cancel(&c, UserId(2), NOW).unwrap().0.status,
        OrderStatus::Cancelled
    );
    let (again, event) = b.cancel(&c, UserId(2), NOW).unwrap();
    assert_eq!((again.status, event), (OrderStatus::Cancelled, None));
    assert_eq!(b.pay(&c, UserId(2), NOW), Err(ErrorCode::AlreadyResolved));
    assert_eq!(b.units_held(UserId(2)), 0);
    assert_eq!(b.pay(&e, UserId(3), NOW + 100), Err(ErrorCode::HoldExpired));
    let expired = b.expire_due(NOW + 100, 10);
    assert_eq!(expired.len(), 1);
    assert_eq!(b.pay(&e, UserId(3), NOW + 1), Err(ErrorCode::HoldExpired));
    assert_eq!(
        b.cancel(&e, UserId(3), NOW + 1),
        Err(ErrorCode::HoldExpired)
    );
    let c2 = b.counters;
    assert_eq!((c2.available, c2.reserved, c2.sold, c2.seq), (9, 0, 1, 6));
    assert!(c2.conserved());
}

#[test]
fn expire_due_is_bounded_and_oldest_first() {
    let mut b = book(10, 1, SaleMode::Reserve);
    for u in 1..=5 {
        b.purchase(&req(u, "r", 1), NOW + u as i64);
    }
    let first = b.expire_due(NOW + 1_000, 2);
    assert_eq!(
        first.iter().map(|e| e.user_id.0).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(b.holds_len(), 3);
}

#[test]
fn restore_rebuilds_buyers_requests_and_holds() {
    let mut b = book(10, 2, SaleMode::Reserve);
    b.purchase(&req(1, "a", 2), NOW);
    let orders: Vec<HotOrder> = b.orders.values().cloned().collect();
    let mut r = SaleBook::new(b.sale.clone(), b.counters, 1);
    orders.into_iter().for_each(|o| r.restore_order(o));
    assert_eq!(
        code(&mut r, req(1, "b", 1), NOW),
        Some(ErrorCode::LimitExceeded)
    );
    assert!(matches!(
        r.purchase(&req(1, "a", 2), NOW).0,
        PurchaseOutcome::Accepted { replayed: true, .. }
    ));
    assert_eq!(r.expire_due(NOW + 100, 10).len(), 1);
}
