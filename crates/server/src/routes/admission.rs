//! Admission of queue and draw sales: join a queue and read one's place (JSON, or an SSE
//! stream), enter a draw and read one's result, read the published draw. Each handler parses,
//! calls the engine's `Shop`, and maps the answer.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use flashsale_core::admission::Entry;
use flashsale_core::SkuId;
use flashsale_engine::shop::{DrawView, EntryResult, QueueState, QueueStatus};
use futures::Stream;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiJson, UserOn};
use crate::error::AppError;
use crate::state::AppState;

/// How often the SSE stream sends a buyer's state, and how long it runs at most.
const STREAM_EVERY: Duration = Duration::from_secs(1);
const STREAM_FOR: Duration = Duration::from_secs(30 * 60);
/// `Retry-After` of a waiting buyer: its ETA halved, within these bounds (seconds).
const RETRY_AFTER_S: (u64, u64) = (1, 30);

/// A buyer's place in a queue (`state`: `pre_queue`, `waiting`, `admitted`, `lapsed`,
/// `sold_out`). An admitted buyer sends `pass` as the purchase's `admission_pass`.
#[derive(Serialize, ToSchema)]
pub struct QueueView {
    pub state: &'static str,
    /// 1-based; absent in the pre-queue until the start shuffles it.
    pub place: Option<u64>,
    pub admitted_through: u64,
    pub queue_length: u64,
    pub eta_ms: Option<u64>,
    pub admitted_until_ms: Option<i64>,
    pub pass: Option<String>,
    /// SHA-256 (hex) of the pre-queue's seed, published when the queue opened.
    pub seed_sha256: String,
    /// The seed (hex), revealed once the pre-queue is shuffled.
    pub seed: Option<String>,
}

impl From<QueueStatus> for QueueView {
    fn from(s: QueueStatus) -> QueueView {
        QueueView {
            state: s.state.as_str(),
            place: s.place,
            admitted_through: s.admitted_through,
            queue_length: s.queue_length,
            eta_ms: s.eta_ms,
            admitted_until_ms: s.admitted_until_ms,
            pass: s.pass,
            seed_sha256: s.seed_sha256,
            seed: s.seed,
        }
    }
}

fn retry_after(s: &QueueStatus) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let secs = match s.state {
        QueueState::Waiting => {
            (s.eta_ms.unwrap_or(0) / 2_000).clamp(RETRY_AFTER_S.0, RETRY_AFTER_S.1)
        }
        QueueState::PreQueue => RETRY_AFTER_S.1,
        _ => return headers,
    };
    headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    headers
}

#[utoipa::path(post, path = "/sales/{sku_id}/queue", tag = "admission", operation_id = "join_queue", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the buyer's place (a second join answers the same place); before the start the pre-queue, shuffled at the start with the seed whose SHA-256 is `seed_sha256`", body = QueueView),
        (status = 400, description = "INVALID_REQUEST: not a queue sale", body = crate::openapi::Error, content_type = "application/problem+json"),
        (status = 409, description = "NOT_STARTED: the queue is not open yet; ENDED", body = crate::openapi::Error, content_type = "application/problem+json"),
        (status = 429, description = "BUSY: the queue is full; RATE_LIMITED (joins count against the user's rate limit)", body = crate::openapi::Error, content_type = "application/problem+json")))]
pub async fn join(call: UserOn<u64>) -> Result<(HeaderMap, Json<QueueView>), AppError> {
    let (st, user, p) = call.into_parts();
    let s = st.shop.join_queue(SkuId(p), user).await?;
    Ok((retry_after(&s), Json(s.into())))
}

#[utoipa::path(get, path = "/sales/{sku_id}/queue/me", tag = "admission", operation_id = "queue_me", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "place, state, ETA and (admitted) the pass; `Retry-After` while waiting", body = QueueView),
        (status = 400, description = "INVALID_REQUEST: not in the queue, or not a queue sale", body = crate::openapi::Error, content_type = "application/problem+json")))]
pub async fn me(call: UserOn<u64>) -> Result<(HeaderMap, Json<QueueView>), AppError> {
    let (st, user, p) = call.into_parts();
    let s = st.shop.queue_status(SkuId(p), user).await?;
    Ok((retry_after(&s), Json(s.into())))
}

#[utoipa::path(get, path = "/sales/{sku_id}/queue/me/events", tag = "admission", operation_id = "queue_me_events", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "Server-Sent Events: a `queue` event (a QueueView) every second and on each change, until admitted, lapsed or sold out", content_type = "text/event-stream")))]
pub async fn events(
    call: UserOn<u64>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, AppError> {
    let (st, user, p) = call.into_parts();
    let sku = SkuId(p);
    let first = st.shop.queue_status(sku, user).await?;
    let started = tokio::time::Instant::now();
    let stream = futures::stream::unfold(Some(first), move |next| {
        let st = st.clone();
        async move {
            let s = next?;
            let done = matches!(
                s.state,
                QueueState::Admitted | QueueState::Lapsed | QueueState::SoldOut
            ) || started.elapsed() >= STREAM_FOR;
            let event = Event::default()
                .event("queue")
                .json_data(QueueView::from(s))
                .unwrap_or_default();
            if done {
                return Some((Ok(event), None));
            }
            tokio::time::sleep(STREAM_EVERY).await;
            let after = st.shop.queue_status(sku, user).await.ok();
            Some((Ok(event), after))
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Body of a draw entry.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EntryBody {
    #[schema(minimum = 1, maximum = 1_000)]
    pub quantity: i64,
}

/// A draw entry as stored.
#[derive(Serialize, ToSchema)]
pub struct EntryView {
    pub user_id: u64,
    pub quantity: u32,
}

impl From<Entry> for EntryView {
    fn from(e: Entry) -> EntryView {
        EntryView {
            user_id: e.user_id.0,
            quantity: e.quantity,
        }
    }
}

#[utoipa::path(post, path = "/sales/{sku_id}/entries", tag = "admission", operation_id = "enter_draw", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), request_body = EntryBody,
    responses((status = 201, description = "entered", body = EntryView),
        (status = 200, description = "the user's entry was taken before: that one (one entry per user)", body = EntryView),
        (status = 400, description = "INVALID_REQUEST: quantity outside 1..=per_user_limit, or not a draw sale", body = crate::openapi::Error, content_type = "application/problem+json"),
        (status = 409, description = "NOT_STARTED / ENDED: outside the entry window", body = crate::openapi::Error, content_type = "application/problem+json"),
        (status = 429, description = "BUSY: the draw takes no more entries; RATE_LIMITED", body = crate::openapi::Error, content_type = "application/problem+json")))]
pub async fn enter(
    call: UserOn<u64>,
    ApiJson(body): ApiJson<EntryBody>,
) -> Result<(StatusCode, Json<EntryView>), AppError> {
    let (st, user, p) = call.into_parts();
    let (entry, new) = st.shop.enter_draw(SkuId(p), user, body.quantity).await?;
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(entry.into())))
}

/// A user's draw result (`result`: `entered`, `won` with `order_no`, `cancelled` or
/// `expired` (won, then the reservation was cancelled or lapsed: its units went down the
/// waitlist), `waitlisted`, `not_won`).
#[derive(Serialize, ToSchema)]
pub struct EntryResultView {
    pub user_id: u64,
    pub quantity: u32,
    pub result: String,
    pub rank: Option<usize>,
    pub order_no: Option<String>,
    /// The reservation's status now (`RESERVED`, `PAID`, `CANCELLED`, `EXPIRED`).
    pub order_status: Option<String>,
}

impl From<EntryResult> for EntryResultView {
    fn from(r: EntryResult) -> Self {
        EntryResultView {
            user_id: r.user_id,
            quantity: r.quantity,
            result: r.result.to_owned(),
            rank: r.rank,
            order_no: r.order_no,
            order_status: r.order_status.map(str::to_owned),
        }
    }
}

#[utoipa::path(get, path = "/sales/{sku_id}/entries/me", tag = "admission", operation_id = "draw_entry_me", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the user's entry and, after the draw, its result (a winner's reservation: pay it through /orders/{order_no}/pay)", body = EntryResultView),
        (status = 400, description = "INVALID_REQUEST: no entry, or not a draw sale", body = crate::openapi::Error, content_type = "application/problem+json")))]
pub async fn my_entry(call: UserOn<u64>) -> Result<Json<EntryResultView>, AppError> {
    let (st, user, p) = call.into_parts();
    let result = st.shop.draw_entry(SkuId(p), user).await?;
    Ok(Json(result.into()))
}

/// The published draw.
#[derive(Serialize, ToSchema)]
pub struct DrawPage {
    pub sku_id: u64,
    pub entries_open_at_ms: i64,
    pub draw_at_ms: i64,
    /// The stock the first round draws for.
    pub total_stock: u64,
    /// SHA-256 (hex) of the seed, committed when entries opened.
    pub seed_sha256: String,
    /// The seed (hex), revealed at the draw.
    pub seed: Option<String>,
    pub entry_count: u64,
    /// After the draw: every entry, in entry order.
    pub entries: Option<Vec<EntryView>>,
    /// After the draw: the first round's winners, in waitlist order.
    pub winners: Option<Vec<EntryView>>,
    pub waitlist_position: u64,
}

impl From<DrawView> for DrawPage {
    fn from(d: DrawView) -> Self {
        let list = |v: Option<Vec<Entry>>| v.map(|v| v.into_iter().map(EntryView::from).collect());
        DrawPage {
            sku_id: d.sku_id,
            entries_open_at_ms: d.entries_open_at_ms,
            draw_at_ms: d.draw_at_ms,
            total_stock: d.total_stock,
            seed_sha256: d.seed_sha256,
            seed: d.seed,
            entry_count: d.entry_count,
            entries: list(d.entries),
            winners: list(d.winners),
            waitlist_position: d.waitlist_position,
        }
    }
}

#[utoipa::path(get, path = "/sales/{sku_id}/draw", tag = "admission", operation_id = "get_draw",
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the committed seed's SHA-256; after the draw the seed, the entries and the winners (recompute them with scripts/draw-verify.py)", body = DrawPage)))]
pub async fn draw(
    State(st): State<AppState>,
    super::ApiPath(p): super::ApiPath<u64>,
) -> Result<Json<DrawPage>, AppError> {
    Ok(Json(st.shop.draw(SkuId(p)).await?.into()))
}
