//! HTTP handlers, one module per resource.

pub mod health;
pub mod orders;
pub mod purchases;
pub mod sales;

use serde::Serialize;

use flashsale_core::{HotOrder, OrderStatus};

use crate::error::AppError;

/// `Path` whose rejection is the API's own error (400 `INVALID_REQUEST`, our JSON shape).
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(AppError))]
pub struct ApiPath<T>(pub T);

/// An order as the API shows it.
#[derive(Debug, Serialize)]
pub struct OrderView {
    pub order_no: String,
    pub sku_id: u64,
    pub user_id: u64,
    pub request_id: String,
    pub quantity: u32,
    pub status: OrderStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<i64>,
    pub created_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<bool>,
}

impl OrderView {
    pub fn new(order: &HotOrder, status: OrderStatus) -> OrderView {
        OrderView {
            order_no: order.order_no.to_string(),
            sku_id: order.sku_id.0,
            user_id: order.user_id.0,
            request_id: order.request_id.to_string(),
            quantity: order.quantity,
            status,
            deadline_ms: (order.deadline_ms > 0).then_some(order.deadline_ms),
            created_at_ms: order.created_at_ms,
            replayed: None,
        }
    }
}
