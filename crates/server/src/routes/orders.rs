//! Orders: status for their owner, pay and cancel.

use axum::Json;
use flashsale_core::{ErrorCode, OrderNo};

use super::OrderView;
use crate::error::AppError;
use crate::routes::{Answer, UserOn};

fn parse(p: String) -> Result<OrderNo, AppError> {
    // A malformed number names no order: the same 404 as someone else's order.
    OrderNo::parse(&p).ok_or_else(|| AppError::from_code(ErrorCode::OrderNotFound))
}

// The database's status once stored; PENDING from the hot ledger until then.
#[utoipa::path(get, path = "/orders/{order_no}", tag = "orders", operation_id = "get_order", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "the caller's order", body = OrderView)))]
pub async fn get(call: UserOn<String>) -> Answer<OrderView> {
    let (st, user, p) = call.into_parts();
    let now = st.shop.order(&parse(p)?, user).await?;
    Ok(Json(OrderView::new(&now.order, now.status)))
}

#[utoipa::path(post, path = "/orders/{order_no}/pay", tag = "orders", operation_id = "pay_order", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "paid", body = OrderView)))]
pub async fn pay(call: UserOn<String>) -> Answer<OrderView> {
    let (st, user, p) = call.into_parts();
    let order = st.shop.pay(&parse(p)?, user).await?;
    Ok(Json(OrderView::new(&order, order.status)))
}

#[utoipa::path(post, path = "/orders/{order_no}/cancel", tag = "orders", operation_id = "cancel_order", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "cancelled", body = OrderView)))]
pub async fn cancel(call: UserOn<String>) -> Answer<OrderView> {
    let (st, user, p) = call.into_parts();
    let order = st.shop.cancel(&parse(p)?, user).await?;
    Ok(Json(OrderView::new(&order, order.status)))
}
