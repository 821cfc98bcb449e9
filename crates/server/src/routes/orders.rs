//! Orders: status for their owner, pay and cancel.

use axum::Json;
use flashsale_core::{
    ErrorCode, EventKind, HotOrder, LedgerError, OrderNo, OrderStatus, Resolution, SkuId, UserId,
};

use super::OrderView;
use crate::auth::User;
use crate::error::AppError;
use crate::routes::{Answer, UserOn};
use crate::state::AppState;

fn parse(p: String) -> Result<OrderNo, AppError> {
    let raw = p;
    // A malformed number names no order: the same 404 as someone else's order.
    OrderNo::parse(&raw).ok_or_else(|| AppError::from_code(ErrorCode::OrderNotFound))
}

// The database's status once stored; PENDING from the hot ledger until then.
#[utoipa::path(get, path = "/orders/{order_no}", tag = "orders", operation_id = "get_order", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "the caller's order", body = OrderView)))]
pub async fn get(
    UserOn {
        st,
        caller: User(user),
        p,
    }: UserOn<String>,
) -> Answer<OrderView> {
    let no = parse(p)?;
    match st.store.order(&no).await {
        Ok(Some(order)) => {
            let status = order.status;
            return owned(order, user, status);
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "database unreachable; answering from the hot ledger"),
    }
    let hot = st.ledger.order(&no).await?;
    match hot {
        Some(order) => {
            let status = st.ledger.durability().as_answered(order.status);
            owned(order, user, status)
        }
        None => Err(AppError::from_code(ErrorCode::OrderNotFound)),
    }
}

fn owned(order: HotOrder, user: UserId, status: OrderStatus) -> Result<Json<OrderView>, AppError> {
    if order.user_id != user {
        return Err(AppError::from_code(ErrorCode::OrderNotFound));
    }
    Ok(Json(OrderView::new(&order, status)))
}

/// Answers a pay or cancel; one answered 200, or written but not confirmed by the replicas
/// (answered 503), goes into the loss journal (a hot ledger that loses it afterwards must not
/// lose it silently).
async fn resolve(
    st: &AppState,
    sku: SkuId,
    kind: EventKind,
    result: Result<Resolution, LedgerError>,
) -> Result<Json<OrderView>, AppError> {
    match &result {
        Err(e) if e.is_unavailable() => st.breaker.failure(sku),
        Ok(_) => st.breaker.success(sku),
        Err(_) => {}
    }
    if let Err(LedgerError::Unconfirmed { written, .. }) = &result {
        let at_ms = flashsale_core::clock::now_ms();
        for no in written {
            st.journal.record_resolution(no, kind, at_ms);
        }
    }
    if matches!(result, Ok(Err(ErrorCode::Unavailable))) {
        st.nudges.nudge(sku);
    }
    let order = result?.map_err(AppError::from_code)?;
    let at_ms = flashsale_core::clock::now_ms();
    st.journal.record_resolution(&order.order_no, kind, at_ms);
    Ok(Json(OrderView::new(&order, order.status)))
}

#[utoipa::path(post, path = "/orders/{order_no}/pay", tag = "orders", operation_id = "pay_order", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "paid", body = OrderView)))]
pub async fn pay(
    UserOn {
        st,
        caller: User(user),
        p,
    }: UserOn<String>,
) -> Answer<OrderView> {
    let no = parse(p)?;
    let result = st.ledger.pay(&no, user).await;
    resolve(&st, no.sku(), EventKind::Paid, result).await
}

#[utoipa::path(post, path = "/orders/{order_no}/cancel", tag = "orders", operation_id = "cancel_order", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "cancelled", body = OrderView)))]
pub async fn cancel(
    UserOn {
        st,
        caller: User(user),
        p,
    }: UserOn<String>,
) -> Answer<OrderView> {
    let no = parse(p)?;
    let result = st.ledger.cancel(&no, user).await;
    let answer = resolve(&st, no.sku(), EventKind::Cancelled, result).await;
    if answer.is_ok() {
        st.sold_out.clear(no.sku());
    }
    answer
}
