//! `POST /api/v1/sales/{sku}/purchases`: the hot path.

use std::time::Instant;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use flashsale_core::limits::PER_USER_LIMIT_MAX;
use flashsale_core::{
    ErrorCode, LedgerError, PurchaseOutcome, PurchaseRequest, RequestId, SaleState, SkuId, UserId,
};
use serde::Deserialize;

use super::{ApiPath, OrderView};
use crate::auth::User;
use crate::error::AppError;
use crate::metrics::{PURCHASE_LATENCY, SOLD_OUT_LOCAL};
use crate::state::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurchaseBody {
    pub request_id: String,
    /// Units. Signed so that a negative number gets our message, not a parse error's.
    pub quantity: i64,
    /// Anti-scalping token (`POST /sales/{sku}/purchase-token`), for sales that require one.
    #[serde(default)]
    pub purchase_token: Option<String>,
}

impl PurchaseBody {
    pub fn validate(&self, sku: SkuId, user: UserId) -> Result<PurchaseRequest, AppError> {
        let request_id = RequestId::parse(&self.request_id)
            .ok_or_else(|| AppError::invalid("request_id must be 1..=64 of [A-Za-z0-9_-]"))?;
        let token_len_max = crate::gateway::scalping::TOKEN_LEN_MAX;
        if self
            .purchase_token
            .as_ref()
            .is_some_and(|t| t.len() > token_len_max)
        {
            return Err(AppError::invalid(format!(
                "purchase_token is at most {token_len_max} bytes"
            )));
        }
        if !(1..=i64::from(PER_USER_LIMIT_MAX)).contains(&self.quantity) {
            return Err(AppError::invalid(format!(
                "quantity must be 1..={PER_USER_LIMIT_MAX}"
            )));
        }
        Ok(PurchaseRequest {
            sku_id: sku,
            user_id: user,
            request_id,
            quantity: self.quantity as u32,
        })
    }
}

#[utoipa::path(post, path = "/sales/{sku_id}/purchases", tag = "purchases", operation_id = "purchase", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), request_body = crate::openapi::PurchaseBody,
    responses((status = 202, description = "accepted (or the replay of the first outcome)", body = crate::openapi::OrderView)))]
pub async fn purchase(
    State(st): State<AppState>,
    User(user): User,
    ApiPath(p): ApiPath<u64>,
    body: Result<Json<PurchaseBody>, JsonRejection>,
) -> Result<(StatusCode, Json<OrderView>), AppError> {
    let started = Instant::now();
    let sku = SkuId(p);
    let Json(body) = body?;
    let req = body.validate(sku, user)?;
    let stored = super::sale(&st, sku).await?;
    let key = req.key().to_string();
    let _permit = st
        .gateway
        .admit_purchase(sku, user, &key, body.purchase_token.as_deref())
        .await?;
    let result = decide(&st, req, stored.sale.state).await;
    let label = match &result {
        Ok(view) if view.replayed == Some(true) => "replayed",
        Ok(_) => "accepted",
        Err(e) => e.code.as_str(),
    };
    metrics::histogram!(PURCHASE_LATENCY, "outcome" => label)
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(flashsale_core::metric_names::PURCHASES, "outcome" => label).increment(1);
    let answer = crate::dashboard::live::Answer::from_label(label);
    st.dashboard.live.record(sku, answer, started.elapsed());
    result.map(|view| (StatusCode::ACCEPTED, Json(view)))
}

/// A sale past `scheduled` whose hot copy is missing lost it (Redis restarted empty, a
/// failover): a rebuild puts it back, so the client retries (503); it is not "not started".
fn copy_missing(state: SaleState) -> LedgerError {
    match state {
        SaleState::Scheduled => LedgerError::NotWarmed,
        _ => LedgerError::Unavailable(
            "the sale's hot copy is being restored; retry with the same request_id".into(),
        ),
    }
}

async fn decide(
    st: &AppState,
    req: PurchaseRequest,
    state: SaleState,
) -> Result<OrderView, AppError> {
    if st.batcher.sold_out_here(&req) {
        metrics::counter!(SOLD_OUT_LOCAL).increment(1);
        return Err(AppError::from_code(ErrorCode::SoldOut));
    }
    let sku = req.sku_id;
    if !st.breaker.allows(sku) {
        return Err(AppError::new(
            ErrorCode::Unavailable,
            "hot ledger unavailable; retry shortly",
        ));
    }
    // A SOLD_OUT answer sets the sale's local flag inside the batcher.
    let outcome = st.batcher.purchase(req).await;
    // The breaker counts the ledger's own faults: a missing copy is not one (Redis answered).
    match &outcome {
        Err(e) if e.is_unavailable() => st.breaker.failure(sku),
        Ok(_) => st.breaker.success(sku),
        Err(_) => {}
    }
    // A copy that is fenced (a failover moved it) or missing is rebuilt now, not at the next pass.
    let outcome = match outcome {
        Err(LedgerError::NotWarmed) => {
            if state != SaleState::Scheduled {
                st.nudges.nudge(sku);
            }
            Err(copy_missing(state))
        }
        Ok(PurchaseOutcome::Rejected(ErrorCode::Unavailable)) => {
            st.nudges.nudge(sku);
            outcome
        }
        other => other,
    };
    match outcome? {
        PurchaseOutcome::Accepted { order, replayed } => {
            let status = st.ledger.durability().as_answered(order.status);
            let mut view = OrderView::new(&order, status);
            view.replayed = Some(replayed);
            Ok(view)
        }
        PurchaseOutcome::Rejected(code) => Err(AppError::from_code(code)),
    }
}
