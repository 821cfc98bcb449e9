//! The conformance suite: what every `HotLedger` must do, checked the same way for both.
//!
//! Each check creates its own sale with a random sku, so all of them can share one ledger (and
//! run in parallel on it), except [`restock_is_announced`], which replaces the ledger's restock
//! listener. [`run_all`] runs every check in turn.
//!
//! Statuses: a fresh purchase answer may say `PENDING` (Redis: not yet persisted) or the
//! mode's status (`CREATED` / `RESERVED`, embedded: committed); `order()` likewise until the
//! order is resolved.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashsale_core::buckets::BUCKETS_MAX;
use flashsale_core::limits::BATCH_LEN_MAX;
use flashsale_core::{
    CopyAt, Counters, ErrorCode, HotOrder, Ledger, LedgerError, OrderNo, OrderStatus,
    PurchaseOutcome, PurchaseRequest, RequestId, Sale, SaleMode, SaleState, SkuId, UserId,
};
use rand::Rng;

use crate::wait;

const HOUR_MS: i64 = 3_600_000;
/// Payment timeout of reserve-mode sales in this suite.
pub const PAYMENT_TIMEOUT_MS: u64 = 300;

/// Runs every check, one after the other, on one ledger.
pub async fn run_all(ledger: Arc<dyn Ledger>) {
    let l = ledger.as_ref();
    accepts_until_sold_out(l).await;
    a_bucketed_sale_is_held_whole_or_refused(l).await;
    per_user_limit_counts_units(l).await;
    window_and_state_are_judged(l).await;
    not_warmed_sales_are_refused(l).await;
    replay_returns_the_first_outcome(l).await;
    load_replaces_only_older_copies_and_fences_until_open(l).await;
    state_changes_only_from_the_expected_state(l).await;
    accepted_count_follows_the_copy(l).await;
    batch_results_come_in_order(l).await;
    accepted_keys_list_accepted_requests(l).await;
    oversized_batch_is_refused(l).await;
    reserve_pay_cancel_expire(l).await;
    one_resolution_per_reservation(l).await;
    direct_orders_are_already_resolved(l).await;
    restock_is_announced(l).await;
    concurrent_buyers_keep_invariants(ledger.clone()).await;
    crate::bucketed::run_all(ledger).await;
}

// ---------------------------------------------------------------------------------------------
// Helpers

pub use flashsale_core::clock::now_ms;

/// A sku no other check uses. Under [`run_all_spread`], the next shard's in turn.
pub fn random_sku() -> SkuId {
    let mut spread = SPREAD.lock().expect("spread lock");
    loop {
        let sku = SkuId(rand::rng().random_range(1..=1u64 << 40));
        let Some(spread) = spread.as_mut() else {
            return sku;
        };
        if (spread.shard_of)(sku) == spread.next {
            spread.next = (spread.next + 1) % spread.shards;
            return sku;
        }
    }
}

/// How the skus of [`run_all_spread`] are spread over a cluster's shards.
struct Spread {
    shard_of: Box<dyn Fn(SkuId) -> usize + Send>,
    shards: usize,
    next: usize,
}

static SPREAD: std::sync::Mutex<Option<Spread>> = std::sync::Mutex::new(None);

/// [`run_all`] with the sales of the suite taken from each of `shards` shards in turn
/// (`shard_of` names the shard of a sku), so every check runs on every shard of a cluster.
pub async fn run_all_spread(
    ledger: Arc<dyn Ledger>,
    shards: usize,
    shard_of: impl Fn(SkuId) -> usize + Send + 'static,
) {
    assert!(shards > 0, "a cluster has at least one shard");
    *SPREAD.lock().expect("spread lock") = Some(Spread {
        shard_of: Box::new(shard_of),
        shards,
        next: 0,
    });
    run_all(ledger).await;
    *SPREAD.lock().expect("spread lock") = None;
}

/// A live sale with a random sku, open from an hour ago to an hour from now.
pub fn live_sale(mode: SaleMode, total: u64, limit: u32) -> Sale {
    let now = now_ms();
    Sale {
        sku_id: random_sku(),
        name: "conformance".into(),
        total_stock: total,
        per_user_limit: limit,
        mode,
        payment_timeout_ms: if mode == SaleMode::Reserve {
            PAYMENT_TIMEOUT_MS
        } else {
            0
        },
        starts_at_ms: now - HOUR_MS,
        ends_at_ms: now + HOUR_MS,
        state: SaleState::Live,
        buckets: 1,
        admission: Default::default(),
    }
}

/// Warms a sale that has sold nothing; returns its sku.
pub async fn warm(ledger: &dyn Ledger, sale: &Sale) -> SkuId {
    let counters = sale.fresh_counters();
    ledger
        .warm(sale, &counters, 1)
        .await
        .expect("warm a fresh sale");
    sale.sku_id
}

pub fn req(sku: SkuId, user: u64, rid: &str, quantity: u32) -> PurchaseRequest {
    PurchaseRequest {
        sku_id: sku,
        user_id: UserId(user),
        request_id: RequestId::parse(rid).expect("valid request id"),
        quantity,
    }
}

/// One purchase, as a batch of one.
pub async fn buy(ledger: &dyn Ledger, sku: SkuId, user: u64, rid: &str, q: u32) -> PurchaseOutcome {
    let mut out = ledger
        .purchase_batch(sku, &[req(sku, user, rid, q)])
        .await
        .expect("purchase answered");
    assert_eq!(out.len(), 1, "one outcome per request");
    out.remove(0)
}

/// The order of an accepted outcome (panics with the outcome otherwise).
pub fn accepted(outcome: &PurchaseOutcome) -> HotOrder {
    match outcome {
        PurchaseOutcome::Accepted { order, .. } => order.clone(),
        other => panic!("expected an accepted purchase, got {other:?}"),
    }
}

/// Buys and expects acceptance; returns the order.
pub async fn buy_ok(ledger: &dyn Ledger, sku: SkuId, user: u64, rid: &str, q: u32) -> HotOrder {
    let outcome = buy(ledger, sku, user, rid, q).await;
    assert!(
        matches!(
            outcome,
            PurchaseOutcome::Accepted {
                replayed: false,
                ..
            }
        ),
        "user {user} request {rid}: {outcome:?}"
    );
    accepted(&outcome)
}

/// Buys and expects the rejection `code`.
pub async fn buy_refused(
    ledger: &dyn Ledger,
    sku: SkuId,
    user: u64,
    rid: &str,
    q: u32,
    code: ErrorCode,
) {
    let outcome = buy(ledger, sku, user, rid, q).await;
    assert_eq!(outcome.code(), Some(code), "user {user} request {rid}");
}

/// A live (unresolved) order's status: PENDING or the mode's own status.
/// Pays `paid` and cancels `cancelled` (reservations), each by its buyer; both must succeed.
pub async fn pay_and_cancel(ledger: &dyn Ledger, paid: &HotOrder, cancelled: &HotOrder) {
    let pay = ledger.pay(&paid.order_no, paid.user_id).await;
    assert!(matches!(pay, Ok(Ok(_))), "pay {}: {pay:?}", paid.order_no);
    let cancel = ledger.cancel(&cancelled.order_no, cancelled.user_id).await;
    let order = &cancelled.order_no;
    assert!(matches!(cancel, Ok(Ok(_))), "cancel {order}: {cancel:?}");
}

pub fn assert_unresolved(status: OrderStatus, mode: SaleMode) {
    let own = match mode {
        SaleMode::Direct => OrderStatus::Created,
        SaleMode::Reserve => OrderStatus::Reserved,
    };
    assert!(
        status == OrderStatus::Pending || status == own,
        "status {status:?} in {mode:?} mode"
    );
}

pub async fn counters(ledger: &dyn Ledger, sku: SkuId) -> Counters {
    let c = ledger.counters(sku).await.expect("counters answered");
    let c = c.expect("sale is warm");
    assert!(c.conserved(), "I2: {c:?}");
    c
}

/// (available, reserved, sold, seq) of a sale.
pub async fn stock(ledger: &dyn Ledger, sku: SkuId) -> (u64, u64, u64, u64) {
    let c = counters(ledger, sku).await;
    (c.available, c.reserved, c.sold, c.seq)
}

async fn order(ledger: &dyn Ledger, no: &OrderNo) -> HotOrder {
    let found = ledger.order(no).await.expect("order answered");
    found.unwrap_or_else(|| panic!("order {no} is known"))
}

/// Expires due holds until `n` have expired in all (polls; holds come due by the ledger clock).
pub async fn expire_until(ledger: &dyn Ledger, sku: SkuId, n: usize) {
    let done = Arc::new(Mutex::new(0usize));
    wait::until("holds to expire", Duration::from_secs(10), || {
        let done = done.clone();
        async move {
            let got = ledger.expire_due(sku, 100).await.expect("expire_due");
            let mut total = done.lock().unwrap();
            *total += got;
            (*total >= n).then_some(())
        }
    })
    .await;
    assert_eq!(*done.lock().unwrap(), n, "expired exactly the due holds");
}

// ---------------------------------------------------------------------------------------------
// Purchases

/// Accepts until the stock is gone; then SOLD_OUT to everyone, even a user at their limit.
pub async fn accepts_until_sold_out(ledger: &dyn Ledger) {
    let sale = live_sale(SaleMode::Direct, 3, 1);
    let sku = warm(ledger, &sale).await;
    for user in 1..=3 {
        let order = buy_ok(ledger, sku, user, "r1", 1).await;
        assert_eq!((order.sku_id, order.user_id), (sku, UserId(user)));
        assert_eq!(order.order_no.sku(), sku, "the order number names its sale");
        assert_unresolved(order.status, SaleMode::Direct);
    }
    buy_refused(ledger, sku, 4, "r1", 1, ErrorCode::SoldOut).await;
    buy_refused(ledger, sku, 1, "r2", 1, ErrorCode::SoldOut).await;
    assert_eq!(stock(ledger, sku).await, (0, 0, 3, 3));
}

/// A sale of [`BUCKETS_MAX`] buckets: a ledger that says it holds them sells exactly the
/// stock with the per-user limit kept, whichever buyers come; one that does not refuses the
/// copy and holds nothing of it.
pub async fn a_bucketed_sale_is_held_whole_or_refused(ledger: &dyn Ledger) {
    let sale = Sale {
        buckets: BUCKETS_MAX,
        ..live_sale(SaleMode::Direct, 10, 2)
    };
    let sku = sale.sku_id;
    if ledger.buckets_max() < sale.buckets {
        let refused = ledger.warm(&sale, &sale.fresh_counters(), 1).await;
        assert!(refused.is_err(), "a copy it cannot hold was loaded");
        assert_eq!(ledger.counters(sku).await.expect("counters"), None);
        return;
    }
    warm(ledger, &sale).await;
    for user in 1..=4 {
        buy_ok(ledger, sku, user, "a", 2).await;
    }
    buy_refused(ledger, sku, 1, "b", 1, ErrorCode::LimitExceeded).await;
    buy_ok(ledger, sku, 5, "a", 2).await;
    buy_refused(ledger, sku, 6, "a", 1, ErrorCode::SoldOut).await;
    assert_eq!(stock(ledger, sku).await, (0, 0, 10, 5));
}

/// The per-user limit counts units across orders; quantity 0 is invalid, above the limit is
/// LIMIT_EXCEEDED; a rejected request changes nothing.
pub async fn per_user_limit_counts_units(ledger: &dyn Ledger) {
    let sale = live_sale(SaleMode::Direct, 100, 3);
    let sku = warm(ledger, &sale).await;
    buy_ok(ledger, sku, 1, "a", 2).await;
    buy_refused(ledger, sku, 1, "b", 2, ErrorCode::LimitExceeded).await;
    buy_ok(ledger, sku, 1, "c", 1).await;
    buy_refused(ledger, sku, 1, "d", 1, ErrorCode::LimitExceeded).await;
    buy_refused(ledger, sku, 2, "a", 4, ErrorCode::LimitExceeded).await;
    buy_refused(ledger, sku, 2, "a", 0, ErrorCode::InvalidRequest).await;
    buy_ok(ledger, sku, 2, "a", 3).await;
    assert_eq!(stock(ledger, sku).await, (94, 0, 6, 3));
}

/// NOT_STARTED before starts_at and while scheduled, ENDED at ends_at and when ended,
/// PAUSED while paused; live again after resume. Nothing changes meanwhile. Warm keeps the
/// state it is given.
pub async fn window_and_state_are_judged(ledger: &dyn Ledger) {
    let now = now_ms();
    let mut early = live_sale(SaleMode::Direct, 5, 1);
    (early.starts_at_ms, early.ends_at_ms) = (now + HOUR_MS, now + 2 * HOUR_MS);
    let sku = warm(ledger, &early).await;
    buy_refused(ledger, sku, 1, "a", 1, ErrorCode::NotStarted).await;

    let mut late = live_sale(SaleMode::Direct, 5, 1);
    (late.starts_at_ms, late.ends_at_ms) = (now - 2 * HOUR_MS, now - HOUR_MS);
    let sku = warm(ledger, &late).await;
    buy_refused(ledger, sku, 1, "a", 1, ErrorCode::Ended).await;

    let mut scheduled = live_sale(SaleMode::Direct, 5, 1);
    scheduled.state = SaleState::Scheduled;
    let sku = warm(ledger, &scheduled).await;
    buy_refused(ledger, sku, 1, "a", 1, ErrorCode::NotStarted).await;
    let states = [
        (SaleState::Live, None),
        (SaleState::Paused, Some(ErrorCode::Paused)),
        (SaleState::Ended, Some(ErrorCode::Ended)),
        (SaleState::Live, None),
    ];
    for (i, (state, code)) in states.into_iter().enumerate() {
        ledger.set_state(sku, state).await.expect("set_state");
        let rid = format!("r{i}");
        assert_eq!(
            buy(ledger, sku, i as u64 + 1, &rid, 1).await.code(),
            code,
            "{state:?}"
        );
    }
    assert_eq!(stock(ledger, sku).await, (3, 0, 2, 2));
}

/// A sale that was never warmed: purchases and set_state fail with NotWarmed, counters and
/// orders are absent, pay answers ORDER_NOT_FOUND.
pub async fn not_warmed_sales_are_refused(ledger: &dyn Ledger) {
    let sku = random_sku();
    let r = ledger.purchase_batch(sku, &[req(sku, 1, "a", 1)]).await;
    assert!(matches!(r, Err(LedgerError::NotWarmed)), "{r:?}");
    let r = ledger.set_state(sku, SaleState::Paused).await;
    assert!(matches!(r, Err(LedgerError::NotWarmed)), "{r:?}");
    assert_eq!(ledger.counters(sku).await.expect("counters"), None);
    let no = OrderNo::new(sku, 1, 1);
    assert_eq!(ledger.order(&no).await.expect("order"), None);
    let paid = ledger.pay(&no, UserId(1)).await.expect("pay answered");
    assert_eq!(paid, Err(ErrorCode::OrderNotFound));
}

/// A retry answers the first outcome with the same order_no, even after the sale sold out,
/// ended or the retry carries another quantity; the same request_id of another user is a new
/// purchase.
pub async fn replay_returns_the_first_outcome(ledger: &dyn Ledger) {
    let sale = live_sale(SaleMode::Direct, 2, 2);
    let sku = warm(ledger, &sale).await;
    let first = buy_ok(ledger, sku, 1, "same", 1).await;
    let other = buy_ok(ledger, sku, 2, "same", 1).await;
    assert_ne!(first.order_no, other.order_no);
    ledger.set_state(sku, SaleState::Ended).await.expect("end");
    for q in [1, 2] {
        match buy(ledger, sku, 1, "same", q).await {
            PurchaseOutcome::Accepted { order, replayed } => {
                assert!(replayed);
                assert_eq!(order.order_no, first.order_no);
                assert_eq!(
                    (order.quantity, order.request_id),
                    (1, first.request_id.clone())
                );
            }
            other => panic!("replay answered {other:?}"),
        }
    }
    assert_eq!(stock(ledger, sku).await, (0, 0, 2, 2));
}

/// A copy stands against another load of its epoch; a newer epoch replaces it, fenced (every
/// write answers UNAVAILABLE) until it is opened, and its order numbers carry the new epoch.
/// Opening with a stale epoch is refused (a rebuild that lost a race).
pub async fn load_replaces_only_older_copies_and_fences_until_open(ledger: &dyn Ledger) {
    let sale = live_sale(SaleMode::Direct, 10, 1);
    let sku = warm(ledger, &sale).await;
    buy_ok(ledger, sku, 1, "a", 1).await;
    let fresh = sale.fresh_counters();
    let again = ledger.load(&sale, &fresh, 1).await;
    assert!(matches!(again, Err(LedgerError::AlreadyWarm)), "{again:?}");
    assert_eq!(stock(ledger, sku).await, (9, 0, 1, 1));
    assert!(ledger.fence(sku).await.expect("fence"));
    assert!(ledger.fence(sku).await.expect("fence again"), "idempotent");
    buy_refused(ledger, sku, 2, "f", 1, ErrorCode::Unavailable).await;
    assert_eq!(
        stock(ledger, sku).await,
        (9, 0, 1, 1),
        "a fenced copy sells nothing"
    );
    let rebuilt = Counters {
        available: 7,
        sold: 3,
        seq: 3,
        ..fresh
    };
    ledger
        .load(&sale, &rebuilt, 2)
        .await
        .expect("a newer epoch");
    buy_refused(ledger, sku, 2, "g", 1, ErrorCode::Unavailable).await;
    assert_eq!(
        ledger
            .restore_orders(CopyAt { sku, epoch: 2 }, &[])
            .await
            .expect("restore"),
        0
    );
    let stale = ledger.open(sku, 1, SaleState::Live).await;
    assert!(matches!(stale, Err(LedgerError::AlreadyWarm)), "{stale:?}");
    ledger.open(sku, 2, SaleState::Live).await.expect("open");
    assert_eq!(stock(ledger, sku).await, (7, 0, 3, 3));
    let next = buy_ok(ledger, sku, 2, "b", 1).await;
    assert_eq!(
        next.order_no,
        OrderNo::new(sku, 2, 4),
        "new epoch, next seq"
    );
    assert!(!ledger.fence(random_sku()).await.expect("fence"), "no copy");
}

/// `set_state_if` moves a sale only from the state it names (back-pressure's auto-pause must
/// never reopen a sale an operator paused or ended); a fenced copy takes no state change.
pub async fn state_changes_only_from_the_expected_state(ledger: &dyn Ledger) {
    let sale = live_sale(SaleMode::Direct, 10, 1);
    let sku = warm(ledger, &sale).await;
    let (live, paused, ended) = (SaleState::Live, SaleState::Paused, SaleState::Ended);
    assert!(ledger.set_state_if(sku, live, paused).await.expect("pause"));
    buy_refused(ledger, sku, 1, "a", 1, ErrorCode::Paused).await;
    ledger
        .set_state(sku, ended)
        .await
        .expect("an operator ends it");
    assert!(!ledger
        .set_state_if(sku, paused, live)
        .await
        .expect("resume"));
    buy_refused(ledger, sku, 1, "a", 1, ErrorCode::Ended).await;
    ledger.fence(sku).await.expect("fence");
    let fenced = ledger.set_state(sku, live).await;
    assert!(
        matches!(fenced, Err(LedgerError::Unavailable(_))),
        "{fenced:?}"
    );
}

/// `accepted_count` names the copy's epoch and how many requests it accepted.
pub async fn accepted_count_follows_the_copy(ledger: &dyn Ledger) {
    let sale = live_sale(SaleMode::Direct, 10, 2);
    let sku = warm(ledger, &sale).await;
    assert_eq!(
        ledger.accepted_count(sku).await.expect("count"),
        Some((1, 0))
    );
    buy_ok(ledger, sku, 1, "a", 1).await;
    buy(ledger, sku, 1, "a", 1).await; // a replay accepts nothing new
    buy_ok(ledger, sku, 2, "b", 1).await;
    assert_eq!(
        ledger.accepted_count(sku).await.expect("count"),
        Some((1, 2))
    );
    assert_eq!(
        ledger.accepted_count(random_sku()).await.expect("count"),
        None
    );
}

/// One outcome per request, in request order, judged one after the other.
pub async fn batch_results_come_in_order(ledger: &dyn Ledger) {
    let sale = live_sale(SaleMode::Direct, 2, 1);
    let sku = warm(ledger, &sale).await;
    let batch = [
        req(sku, 1, "a", 1),
        req(sku, 2, "a", 1),
        req(sku, 1, "a", 1),
        req(sku, 3, "a", 0),
        req(sku, 4, "a", 2),
        req(sku, 5, "a", 1),
    ];
    let out = ledger.purchase_batch(sku, &batch).await.expect("batch");
    assert_eq!(out.len(), batch.len());
    let (o1, o2) = (accepted(&out[0]), accepted(&out[1]));
    assert_eq!((o1.user_id, o2.user_id), (UserId(1), UserId(2)));
    assert_eq!(o1.order_no, OrderNo::new(sku, 1, 1));
    assert_eq!(o2.order_no, OrderNo::new(sku, 1, 2));
    assert!(
        matches!(&out[2], PurchaseOutcome::Accepted { replayed: true, order }
        if order.order_no == o1.order_no)
    );
    let codes: Vec<_> = out[3..].iter().map(PurchaseOutcome::code).collect();
    let expected = [
        ErrorCode::InvalidRequest,
        ErrorCode::LimitExceeded,
        ErrorCode::SoldOut,
    ];
    assert_eq!(codes, expected.map(Some));
    assert_eq!(stock(ledger, sku).await, (0, 0, 2, 2));
}

/// `accepted_keys` lists the keys of accepted requests only, or `None` when
/// there are more than `max` (or the sale is not warm).
pub async fn accepted_keys_list_accepted_requests(ledger: &dyn Ledger) {
    let sku = warm(ledger, &live_sale(SaleMode::Direct, 3, 2)).await;
    assert_eq!(ledger.accepted_keys(sku, 10).await.unwrap(), Some(vec![]));
    buy_ok(ledger, sku, 1, "a", 1).await;
    buy_ok(ledger, sku, 1, "b", 1).await;
    buy_refused(ledger, sku, 1, "c", 1, ErrorCode::LimitExceeded).await;
    buy_ok(ledger, sku, 22, "a", 1).await;
    buy_refused(ledger, sku, 3, "a", 1, ErrorCode::SoldOut).await;
    let keys = ledger
        .accepted_keys(sku, 3)
        .await
        .unwrap()
        .expect("3 <= max");
    // The scripts write the text `RequestKey` reads: the form lives in one place.
    let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    keys.sort();
    assert_eq!(keys, ["1:a", "1:b", "22:a"]);
    assert_eq!(ledger.accepted_keys(sku, 2).await.unwrap(), None);
    assert_eq!(ledger.accepted_keys(random_sku(), 10).await.unwrap(), None);
    // One key's lookup agrees: accepted, refused, another user's id, another sale.
    let key = |k: &str| flashsale_core::RequestKey::parse(k).unwrap();
    assert!(ledger.is_accepted(sku, &key("22:a")).await.unwrap());
    assert!(!ledger.is_accepted(sku, &key("1:c")).await.unwrap());
    assert!(!ledger.is_accepted(sku, &key("3:a")).await.unwrap());
    assert!(!ledger.is_accepted(random_sku(), &key("1:a")).await.unwrap());
}

/// A batch above `BATCH_LEN_MAX` is an error, and changes nothing.
pub async fn oversized_batch_is_refused(ledger: &dyn Ledger) {
    let sku = warm(ledger, &live_sale(SaleMode::Direct, 5, 1)).await;
    let batch: Vec<_> = (0..=BATCH_LEN_MAX as u64)
        .map(|u| req(sku, u + 1, "a", 1))
        .collect();
    assert!(ledger.purchase_batch(sku, &batch).await.is_err());
    assert_eq!(stock(ledger, sku).await, (5, 0, 0, 0));
}

// ---------------------------------------------------------------------------------------------
// Reserve mode

/// Reserve: pay moves reserved to sold, cancel and expiry give units and quota back.
pub async fn reserve_pay_cancel_expire(ledger: &dyn Ledger) {
    let sale = live_sale(SaleMode::Reserve, 10, 2);
    let sku = warm(ledger, &sale).await;
    let a = buy_ok(ledger, sku, 1, "a", 2).await;
    let c = buy_ok(ledger, sku, 2, "c", 1).await;
    assert_unresolved(a.status, SaleMode::Reserve);
    assert!(a.deadline_ms >= a.created_at_ms + PAYMENT_TIMEOUT_MS as i64 - 1);
    assert_unresolved(order(ledger, &a.order_no).await.status, SaleMode::Reserve);
    assert_eq!(stock(ledger, sku).await, (7, 3, 0, 2));

    let paid = ledger.pay(&a.order_no, UserId(1)).await.expect("pay");
    assert_eq!(paid.expect("paid").status, OrderStatus::Paid);
    assert_eq!(stock(ledger, sku).await, (7, 1, 2, 3));

    let cancelled = ledger.cancel(&c.order_no, UserId(2)).await.expect("cancel");
    assert_eq!(cancelled.expect("cancelled").status, OrderStatus::Cancelled);
    assert_eq!(
        order(ledger, &c.order_no).await.status,
        OrderStatus::Cancelled
    );
    assert_eq!(stock(ledger, sku).await, (8, 0, 2, 4));
    buy_ok(ledger, sku, 2, "c2", 2).await;

    let e = buy_ok(ledger, sku, 3, "e", 1).await;
    expire_until(ledger, sku, 2).await;
    assert_eq!(
        order(ledger, &e.order_no).await.status,
        OrderStatus::Expired
    );
    assert_eq!(stock(ledger, sku).await, (8, 0, 2, 8));
    buy_ok(ledger, sku, 3, "e2", 2).await;
}

/// Pay (or cancel) `no` as `user`; the error code when refused.
async fn resolve(ledger: &dyn Ledger, pay: bool, no: &OrderNo, user: u64) -> Option<ErrorCode> {
    let r = if pay {
        ledger.pay(no, UserId(user)).await
    } else {
        ledger.cancel(no, UserId(user)).await
    };
    r.expect("resolution answered").err()
}

/// I7: a reservation resolves once. A cancel after pay → ALREADY_RESOLVED, a second pay →
/// the paid order again (a retry's first outcome, no second event), another user →
/// ORDER_NOT_FOUND, pay or cancel past the deadline → HOLD_EXPIRED (before
/// and after the expiry worker ran).
pub async fn one_resolution_per_reservation(ledger: &dyn Ledger) {
    let sku = warm(ledger, &live_sale(SaleMode::Reserve, 10, 1)).await;
    let paid = buy_ok(ledger, sku, 1, "p", 1).await.order_no;
    let late = buy_ok(ledger, sku, 2, "l", 1).await;
    let (pay, cancel) = (true, false);
    assert_eq!(
        resolve(ledger, pay, &paid, 9).await,
        Some(ErrorCode::OrderNotFound)
    );
    assert_eq!(
        resolve(ledger, cancel, &paid, 9).await,
        Some(ErrorCode::OrderNotFound)
    );
    assert_eq!(resolve(ledger, pay, &paid, 1).await, None);
    let seq_paid = stock(ledger, sku).await.3;
    assert_eq!(resolve(ledger, pay, &paid, 1).await, None, "a retried pay");
    assert_eq!(
        stock(ledger, sku).await.3,
        seq_paid,
        "a retried pay writes nothing"
    );
    assert_eq!(
        resolve(ledger, cancel, &paid, 1).await,
        Some(ErrorCode::AlreadyResolved)
    );

    let deadline = late.deadline_ms;
    let past = || async move { (now_ms() > deadline + 20).then_some(()) };
    wait::until("the hold's deadline", Duration::from_secs(5), past).await;
    let no = &late.order_no;
    // Past its deadline, before and after the expiry sweep: neither paid nor cancelled.
    for sweep in [false, true] {
        if sweep {
            expire_until(ledger, sku, 1).await;
        }
        for paying in [pay, cancel] {
            let expired = resolve(ledger, paying, no, 2).await;
            assert_eq!(
                expired,
                Some(ErrorCode::HoldExpired),
                "pay {paying}, swept {sweep}"
            );
        }
    }
    assert_eq!(stock(ledger, sku).await, (9, 0, 1, 4));

    let cancelled = buy_ok(ledger, sku, 3, "c", 1).await.order_no;
    assert_eq!(resolve(ledger, cancel, &cancelled, 3).await, None);
    assert_eq!(
        resolve(ledger, cancel, &cancelled, 3).await,
        None,
        "a retried cancel"
    );
    assert_eq!(
        resolve(ledger, pay, &cancelled, 3).await,
        Some(ErrorCode::AlreadyResolved)
    );
    assert_eq!(stock(ledger, sku).await, (9, 0, 1, 6));
}

/// Direct-mode orders are sold at once: pay and cancel answer ALREADY_RESOLVED.
pub async fn direct_orders_are_already_resolved(ledger: &dyn Ledger) {
    let sku = warm(ledger, &live_sale(SaleMode::Direct, 1, 1)).await;
    let no = buy_ok(ledger, sku, 1, "d", 1).await.order_no;
    for pay in [true, false] {
        assert_eq!(
            resolve(ledger, pay, &no, 1).await,
            Some(ErrorCode::AlreadyResolved)
        );
    }
    assert_eq!(stock(ledger, sku).await, (0, 0, 1, 1));
}

/// When stock comes back from zero (cancel), the restock listener hears the sku.
/// Replaces the ledger's restock listener.
pub async fn restock_is_announced(ledger: &dyn Ledger) {
    let heard = Arc::new(Mutex::new(Vec::<SkuId>::new()));
    let sink = heard.clone();
    ledger.on_restock(Arc::new(move |sku| sink.lock().unwrap().push(sku)));
    let sku = warm(ledger, &live_sale(SaleMode::Reserve, 1, 1)).await;
    let o = buy_ok(ledger, sku, 1, "a", 1).await;
    buy_refused(ledger, sku, 2, "a", 1, ErrorCode::SoldOut).await;
    let r = ledger.cancel(&o.order_no, UserId(1)).await.unwrap();
    assert!(r.is_ok(), "{r:?}");
    wait::until("the restock to be heard", Duration::from_secs(5), || {
        let heard = heard.clone();
        async move { heard.lock().unwrap().contains(&sku).then_some(()) }
    })
    .await;
    buy_ok(ledger, sku, 2, "a", 1).await;
}

// ---------------------------------------------------------------------------------------------
// Concurrency

/// Users, requests and outcomes of the concurrency check.
const STOCK: u64 = 500;
const USERS: u64 = 2_000;
const LIMIT: u32 = 2;

/// 2,000 users race for 500 units in concurrent batches of 1..=32 requests, with retries of
/// the same request_id (in the same batch and in a later one) and second attempts that hit
/// the per-user limit. Then I1–I4 hold, from the ledger's own orders and counters.
pub async fn concurrent_buyers_keep_invariants(ledger: Arc<dyn Ledger>) {
    let sale = live_sale(SaleMode::Direct, STOCK, LIMIT);
    let sku = warm(ledger.as_ref(), &sale).await;
    let batches = concurrent_batches(sku, 1..=USERS, LIMIT);
    let answers = run_batches(ledger.clone(), sku, batches).await;
    check_concurrent_answers(ledger.as_ref(), &sale, &answers).await;
}

/// Runs every batch at once; each request with its answer.
pub async fn run_batches(
    ledger: Arc<dyn Ledger>,
    sku: SkuId,
    batches: Vec<Vec<PurchaseRequest>>,
) -> Vec<(PurchaseRequest, PurchaseOutcome)> {
    let tasks: Vec<_> = batches
        .into_iter()
        .map(|batch| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let out = ledger.purchase_batch(sku, &batch).await.expect("batch");
                assert_eq!(out.len(), batch.len());
                batch.into_iter().zip(out).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.expect("task"));
    }
    answers
}

/// Every user asks once (1..=`limit` units), a third of them retry, a fifth try a second
/// order; in batches of 1..=32 requests taken at random places.
pub fn concurrent_batches(
    sku: SkuId,
    users: impl IntoIterator<Item = u64>,
    limit: u32,
) -> Vec<Vec<PurchaseRequest>> {
    let mut rng = rand::rng();
    let mut reqs = Vec::new();
    for (i, user) in users.into_iter().enumerate() {
        reqs.push(req(sku, user, "first", rng.random_range(1..=limit)));
        if i % 3 == 2 {
            reqs.push(req(sku, user, "first", 1));
        }
        if i % 5 == 4 {
            reqs.push(req(sku, user, "second", 1));
        }
    }
    let mut batches = Vec::new();
    while !reqs.is_empty() {
        let n = rng.random_range(1..=32).min(reqs.len());
        let start = rng.random_range(0..=reqs.len() - n);
        batches.push(reqs.drain(start..start + n).collect());
    }
    batches
}

async fn check_concurrent_answers(
    ledger: &dyn Ledger,
    sale: &Sale,
    answers: &[(PurchaseRequest, PurchaseOutcome)],
) {
    let mut by_request: HashMap<(UserId, RequestId), OrderNo> = HashMap::new();
    for (r, outcome) in answers {
        let PurchaseOutcome::Accepted { order, .. } = outcome else {
            let code = outcome.code();
            let ok = [ErrorCode::SoldOut, ErrorCode::LimitExceeded].map(Some);
            assert!(ok.contains(&code), "unexpected {code:?}");
            continue;
        };
        assert_eq!(
            (order.user_id, &order.request_id),
            (r.user_id, &r.request_id)
        );
        let key = (r.user_id, r.request_id.clone());
        let first = by_request.entry(key).or_insert_with(|| order.order_no);
        assert_eq!(first, &order.order_no, "I4: a retry answered another order");
    }
    let numbers: HashSet<&OrderNo> = by_request.values().collect();
    assert_eq!(
        numbers.len(),
        by_request.len(),
        "I4: two requests share an order"
    );
    let mut orders = Vec::new();
    for no in numbers {
        orders.push(order(ledger, no).await);
    }
    check_orders_against_counters(ledger, sale, &orders).await;
}

/// I1 no oversell, I2 conservation, I3 per-user limit over a direct-mode sale's orders.
async fn check_orders_against_counters(ledger: &dyn Ledger, sale: &Sale, orders: &[HotOrder]) {
    let c = counters(ledger, sale.sku_id).await;
    let units: u64 = orders.iter().map(|o| u64::from(o.quantity)).sum();
    assert!(
        units <= sale.total_stock,
        "I1: {units} units sold of {}",
        sale.total_stock
    );
    assert_eq!(c.sold, units, "I2: sold counter vs orders");
    assert_eq!(c.seq, orders.len() as u64, "one event per order");
    assert_eq!(c.reserved, 0);
    let mut per_user: HashMap<UserId, u64> = HashMap::new();
    for o in orders {
        assert_unresolved(o.status, SaleMode::Direct);
        *per_user.entry(o.user_id).or_default() += u64::from(o.quantity);
    }
    let worst = per_user.values().max().copied().unwrap_or(0);
    assert!(
        worst <= u64::from(sale.per_user_limit),
        "I3: a user holds {worst}"
    );
    assert!(
        c.available < u64::from(LIMIT),
        "demand far above stock sells it out: {c:?}"
    );
}
