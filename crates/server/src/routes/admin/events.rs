//! Order events over HTTP: each sink's position, lag and last error; an operator's
//! re-delivery from a position and resumption of a paused sink. The work is the engine's
//! (`flashsale_engine::relay`); these parse, call it and map the outcome.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use flashsale_core::events::{EventLog, StreamKey, NOTICES};
use flashsale_core::{ErrorCode, SkuId};
use flashsale_engine::relay::{self, SinkStatus, SINKS};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Admin;
use crate::error::AppError;
use crate::routes::{stored_sale, AdminOn, Answer, ApiJson, ApiPath};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(view))
        .routes(routes!(redeliver))
        .routes(routes!(resume))
}

/// Every sink (`nats`, `webhook`) with its per-stream positions.
#[derive(Debug, Serialize)]
pub struct EventsView {
    pub sinks: Vec<SinkStatus>,
}

/// Where a re-delivery starts: a sale's stream (`bucket` 0 for a sale of one bucket; 64 for
/// its notices) from `from_seq` on.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedeliverBody {
    pub sku_id: u64,
    #[serde(default)]
    pub bucket: u16,
    #[schema(minimum = 1)]
    pub from_seq: u64,
}

fn log(st: &AppState) -> Result<Arc<dyn EventLog>, AppError> {
    st.store
        .event_log()
        .ok_or_else(|| AppError::new(ErrorCode::Unavailable, "this store keeps no event log"))
}

fn sink_name(name: &str) -> Result<&'static str, AppError> {
    SINKS.into_iter().find(|s| *s == name).ok_or_else(|| {
        AppError::new(
            ErrorCode::InvalidRequest,
            format!("unknown sink {name:?}: one of {SINKS:?}"),
        )
    })
}

fn unavailable(e: anyhow::Error) -> AppError {
    AppError::new(ErrorCode::Unavailable, format!("{e:#}"))
}

async fn answer(st: &AppState) -> Answer<EventsView> {
    let sinks = relay::status(log(st)?.as_ref(), &SINKS)
        .await
        .map_err(unavailable)?;
    Ok(Json(EventsView { sinks }))
}

#[utoipa::path(get, path = "/admin/events", tag = "admin", operation_id = "events_view", security(("bearer" = [])),
    responses((status = 200, description = "each order-event sink: lease holder, paused, failures and last error, lag (events, oldest age) and its position per stream")))]
pub async fn view(State(st): State<AppState>, _: Admin) -> Answer<EventsView> {
    answer(&st).await
}

#[utoipa::path(post, path = "/admin/events/{sink}/redeliver", tag = "admin", operation_id = "events_redeliver", security(("bearer" = [])),
    params(("sink" = String, Path, description = "nats or webhook")), request_body = RedeliverBody,
    responses((status = 200, description = "the sink delivers the stream again from from_seq (and resumes when paused); the sinks as GET shows them")))]
pub async fn redeliver(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(sink): ApiPath<String>,
    ApiJson(body): ApiJson<RedeliverBody>,
) -> Answer<EventsView> {
    let sink = sink_name(&sink)?;
    if body.from_seq == 0 {
        return Err(AppError::new(
            ErrorCode::InvalidRequest,
            "from_seq counts from 1",
        ));
    }
    let sale = stored_sale(&st, SkuId(body.sku_id)).await?;
    // Bucket 64 is the sale's notice stream (orders reported lost, sold out).
    if body.bucket >= sale.sale.buckets.max(1) && body.bucket != NOTICES {
        return Err(AppError::new(
            ErrorCode::InvalidRequest,
            format!("sale {} has {} bucket(s)", body.sku_id, sale.sale.buckets),
        ));
    }
    let stream = StreamKey {
        sku: SkuId(body.sku_id),
        bucket: body.bucket,
    };
    relay::redeliver(log(&st)?.as_ref(), sink, stream, body.from_seq)
        .await
        .map_err(unavailable)?;
    answer(&st).await
}

#[utoipa::path(post, path = "/admin/events/{sink}/resume", tag = "admin", operation_id = "events_resume", security(("bearer" = [])),
    params(("sink" = String, Path, description = "nats or webhook")),
    responses((status = 200, description = "a paused sink retries where it stopped; the sinks as GET shows them")))]
pub async fn resume(AdminOn { st, p, .. }: AdminOn<String>) -> Answer<EventsView> {
    let sink = sink_name(&p)?;
    relay::resume(log(&st)?.as_ref(), sink)
        .await
        .map_err(unavailable)?;
    answer(&st).await
}
