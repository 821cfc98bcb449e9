//! Order events over HTTP: each sink's position, lag and last error; an operator's
//! re-delivery from a position and resumption of a paused sink. The work is the engine's
//! (`Shop`, over its relays); these parse, call it and map the outcome.

use axum::extract::State;
use axum::Json;
use flashsale_core::SkuId;
use flashsale_engine::shop::SinkStatus;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Admin;
use crate::routes::{v1, AdminOn, Answer, ApiJson, ApiPath};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(v1(routes!(view)))
        .routes(v1(routes!(redeliver)))
        .routes(v1(routes!(resume)))
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

async fn answer(st: &AppState) -> Answer<EventsView> {
    let sinks = st.shop.sinks().await?;
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
    let sku = SkuId(body.sku_id);
    st.shop
        .redeliver(&sink, sku, body.bucket, body.from_seq)
        .await?;
    answer(&st).await
}

#[utoipa::path(post, path = "/admin/events/{sink}/resume", tag = "admin", operation_id = "events_resume", security(("bearer" = [])),
    params(("sink" = String, Path, description = "nats or webhook")),
    responses((status = 200, description = "a paused sink retries where it stopped; the sinks as GET shows them")))]
pub async fn resume(AdminOn { st, p, .. }: AdminOn<String>) -> Answer<EventsView> {
    st.shop.resume_sink(&p).await?;
    answer(&st).await
}
