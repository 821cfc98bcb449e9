//! Sales: admin create / warm / pause / resume / end, and the public view.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashsale_core::{Admission, AdmissionMode, Counters, Sale, SaleMode, SaleState, SkuId};
use flashsale_engine::shop::SaleNow;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{AdminOn, Answer, ApiJson, ApiPath};
use crate::auth::Admin;
use crate::bucket_view::BucketFields;
use crate::error::AppError;
use crate::sale_views::Rendered;
use crate::state::AppState;

/// Default payment timeout of a reserve-mode sale.
const PAYMENT_TIMEOUT_MS_DEFAULT: u64 = 15 * 60 * 1_000;
/// Default length of a sale when `ends_at_ms` is not given.
const SALE_LENGTH_MS_DEFAULT: i64 = 24 * 3_600 * 1_000;

/// Body of `POST /api/v1/sales`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSale {
    /// At most 2^53 − 1 (the Redis scripts hold numbers as Lua doubles).
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub sku_id: u64,
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub total_stock: u64,
    #[schema(minimum = 1, maximum = 1_000)]
    pub per_user_limit: Option<u32>,
    pub mode: Option<SaleMode>,
    pub payment_timeout_ms: Option<u64>,
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    pub starts_at_ms: Option<i64>,
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_i64)]
    pub ends_at_ms: Option<i64>,
    /// How many hot copies the stock is split over. The embedded ledger takes up to 64 and
    /// runs them as one book; the Redis ledger takes 1 (a sale lives on one shard).
    #[schema(minimum = 1, maximum = 64, default = 1)]
    pub buckets: Option<u16>,
    /// Who may buy: `open` (anyone; the default), `queue` (a waiting room: joins before
    /// `starts_at_ms` are shuffled at the start, then admitted in waves; purchases need the
    /// admission pass) or `draw` (entries from `admission_opens_at_ms` to `draw_at_ms`, winners
    /// drawn then, each a reservation; needs `mode: reserve`).
    pub admission: Option<AdmissionMode>,
    /// When the queue or the entry window opens (default: now). Before `starts_at_ms` for a
    /// queue, before `draw_at_ms` for a draw.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    pub admission_opens_at_ms: Option<i64>,
    /// A draw: when entries close and winners are drawn; within `starts_at_ms..ends_at_ms`.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    pub draw_at_ms: Option<i64>,
}

/// A sale with its stock. `available`, `reserved` and `sold` are the whole sale's (for a
/// bucketed sale, the sum over its buckets); `GET /api/v1/sales/{sku_id}` adds a bucketed
/// sale's per-bucket counters when the hot ledger or the database has them.
#[derive(Debug, Serialize, ToSchema)]
pub struct SaleView {
    #[serde(flatten)]
    #[schema(inline)]
    pub sale: Sale,
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    pub seq: u64,
    #[serde(flatten)]
    #[schema(inline)]
    pub per_bucket: BucketFields,
}

impl SaleView {
    fn new(sale: &Sale, c: &Counters) -> SaleView {
        SaleView {
            sale: sale.clone(),
            available: c.available,
            reserved: c.reserved,
            sold: c.sold,
            seq: c.seq,
            per_bucket: BucketFields::default(),
        }
    }

    fn with_buckets(self, per_bucket: BucketFields) -> SaleView {
        SaleView { per_bucket, ..self }
    }

    /// The engine's sale as it stands.
    fn of(now: &SaleNow) -> SaleView {
        SaleView::new(&now.sale, &now.counters).with_buckets((&now.buckets).into())
    }
}

/// Re-exported for the binary's benches; the server reads the clock from flashsale-core.
pub use flashsale_core::clock::now_ms;

impl CreateSale {
    fn into_sale(self) -> Result<Sale, AppError> {
        let now = now_ms();
        let starts_at_ms = self.starts_at_ms.unwrap_or(now);
        let admission = self.admission(now);
        let mode = self.mode.unwrap_or_default();
        let sale = Sale {
            sku_id: SkuId(self.sku_id),
            name: self.name,
            total_stock: self.total_stock,
            per_user_limit: self.per_user_limit.unwrap_or(1),
            mode,
            payment_timeout_ms: match mode {
                SaleMode::Reserve => self
                    .payment_timeout_ms
                    .unwrap_or(PAYMENT_TIMEOUT_MS_DEFAULT),
                SaleMode::Direct => self.payment_timeout_ms.unwrap_or(0),
            },
            starts_at_ms,
            ends_at_ms: self
                .ends_at_ms
                .unwrap_or(starts_at_ms.saturating_add(SALE_LENGTH_MS_DEFAULT)),
            state: SaleState::Scheduled,
            buckets: self.buckets.unwrap_or(1),
            admission,
        };
        sale.validate().map_err(AppError::invalid)?;
        Ok(sale)
    }

    /// The admission asked for; a queue or draw opens now unless told otherwise.
    fn admission(&self, now: i64) -> Admission {
        let mode = self.admission.unwrap_or_default();
        let opens = match mode {
            AdmissionMode::Open => 0,
            _ => now,
        };
        Admission {
            mode,
            admission_opens_at_ms: self.admission_opens_at_ms.unwrap_or(opens),
            draw_at_ms: self.draw_at_ms.unwrap_or(0),
        }
    }
}

#[utoipa::path(post, path = "/sales", tag = "sales", operation_id = "create_sale", security(("bearer" = [])),
    request_body = CreateSale, responses((status = 201, description = "created", body = SaleView)))]
pub async fn create(
    State(st): State<AppState>,
    _: Admin,
    ApiJson(body): ApiJson<CreateSale>,
) -> Result<(StatusCode, Json<SaleView>), AppError> {
    let now = st.shop.create_sale(body.into_sale()?).await?;
    Ok((StatusCode::CREATED, Json(SaleView::of(&now))))
}

#[utoipa::path(get, path = "/sales/{sku_id}", tag = "sales", operation_id = "get_sale",
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the sale (counters may be 1 s old); a bucketed sale also its per-bucket counters, from the hot ledger or else the database (`bucket_source`), when either has them. Carries `ETag` and `Cache-Control: public, max-age=1`", body = SaleView,
        headers(("ETag" = String, description = "the view's validator"), ("Cache-Control" = String, description = "public, max-age=1"))),
        (status = 304, description = "`If-None-Match` named the current `ETag`: the client's copy is current")))]
pub async fn get(
    State(st): State<AppState>,
    ApiPath(p): ApiPath<u64>,
    IfNoneMatch(tags): IfNoneMatch,
) -> Result<Response, AppError> {
    let now = st.shop.sale_now(SkuId(p)).await?;
    let view = st.views.get_or_render(now, render)?;
    Ok(cacheable(&tags, &view))
}

/// The request's `If-None-Match` lines and no other header: the read looks at nothing else,
/// and a `HeaderMap` argument copies every header, an allocation per read.
pub struct IfNoneMatch(pub Vec<HeaderValue>);

impl<S: Send + Sync> FromRequestParts<S> for IfNoneMatch {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let lines = parts.headers.get_all(header::IF_NONE_MATCH);
        Ok(IfNoneMatch(lines.iter().cloned().collect()))
    }
}

/// How long a browser or a shared cache (a CDN in front of the service) may keep a sale's view
/// without asking again: the counters in it are up to a second old already (the sale cache),
/// and the contract allows a view cached for at most a second (`max-age` is in seconds).
const SALE_VIEW_CACHE_CONTROL: HeaderValue = HeaderValue::from_static("public, max-age=1");

/// A sale's view as JSON, and its validator: `ETag`, a hash of the body's bytes, the same on
/// every instance for the same view.
fn render(now: &SaleNow) -> Result<(Bytes, HeaderValue), AppError> {
    let body = serde_json::to_vec(&SaleView::of(now))
        .map_err(|e| crate::error::internal(format!("serialize a view: {e}")))?;
    let tag = HeaderValue::try_from(format!("\"{:016x}\"", fnv1a(&body)))
        .map_err(|e| crate::error::internal(format!("a view's tag: {e}")))?;
    Ok((Bytes::from(body), tag))
}

/// A rendered view with `ETag` and `Cache-Control: public, max-age=1`; a request whose
/// `If-None-Match` names the current tag is answered `304 Not Modified` without the body.
fn cacheable(if_none_match: &[HeaderValue], view: &Rendered) -> Response {
    let headers = [
        (header::ETAG, view.etag.clone()),
        (header::CACHE_CONTROL, SALE_VIEW_CACHE_CONTROL),
    ];
    if none_match(if_none_match, view.etag.as_bytes()) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    let json = [(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )];
    (StatusCode::OK, headers, json, view.body.clone()).into_response()
}

/// Whether `If-None-Match` names `tag` (or is `*`): the client's copy is current.
fn none_match(if_none_match: &[HeaderValue], tag: &[u8]) -> bool {
    let mut tags = if_none_match
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    tags.any(|t| {
        let t = t.trim();
        t == "*" || t.trim_start_matches("W/").as_bytes() == tag
    })
}

/// FNV-1a, 64 bits: a stable hash (the same in every process and release, unlike the
/// standard library's seeded hashers), so instances behind a balancer give one view one tag.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmQuery {
    #[serde(default)]
    pub force: bool,
}

// Loads a sale into the hot ledger (the engine's `Shop::warm`: a sale warm and sold is
// refused unless `force`; otherwise a rebuild in a new epoch, nothing accepted lost).
#[utoipa::path(post, path = "/sales/{sku_id}/warm", tag = "sales", operation_id = "warm_sale", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0), ("force" = Option<bool>, Query, description = "rebuild a hot sale that sold units")),
    responses((status = 200, description = "warm and live", body = SaleView)))]
pub async fn warm(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(p): ApiPath<u64>,
    q: Result<Query<WarmQuery>, QueryRejection>,
) -> Result<Json<SaleView>, AppError> {
    let Query(q) = q?;
    let now = st.shop.warm(SkuId(p), q.force).await?;
    Ok(Json(SaleView::of(&now)))
}

async fn set_state(st: AppState, p: u64, state: SaleState) -> Answer<SaleView> {
    let now = st.shop.set_state(SkuId(p), state).await?;
    Ok(Json(SaleView::of(&now)))
}

#[utoipa::path(post, path = "/sales/{sku_id}/pause", tag = "sales", operation_id = "pause_sale", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "paused", body = SaleView)))]
pub async fn pause(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<SaleView> {
    set_state(st, p, SaleState::Paused).await
}

#[utoipa::path(post, path = "/sales/{sku_id}/resume", tag = "sales", operation_id = "resume_sale", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "live", body = SaleView)))]
pub async fn resume(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<SaleView> {
    set_state(st, p, SaleState::Live).await
}

#[utoipa::path(post, path = "/sales/{sku_id}/end", tag = "sales", operation_id = "end_sale", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "ended", body = SaleView)))]
pub async fn end(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<SaleView> {
    set_state(st, p, SaleState::Ended).await
}

#[cfg(test)]
mod tests {
    use flashsale_core::{BucketRow, HotBuckets};
    use serde_json::Value;

    use super::*;
    use crate::bucket_view::tests::counters;

    /// A sale of 100 units over three buckets, 10 of them in flight: its counters are the
    /// sum over its buckets (units in flight are in none), and the view's JSON.
    fn view(per_bucket: BucketFields) -> Value {
        let sale = Sale {
            buckets: 3,
            ..Sale::always_open(SkuId(7), 100)
        };
        let sum = counters(100, 67, 3, 10);
        serde_json::to_value(SaleView::new(&sale, &sum).with_buckets(per_bucket)).unwrap()
    }

    fn bucket_sums(v: &Value) -> [u64; 4] {
        let list = v["bucket_counters"].as_array().expect("a list");
        let sum = |k: &str| list.iter().map(|b| b[k].as_u64().unwrap()).sum::<u64>();
        [sum("total"), sum("available"), sum("reserved"), sum("sold")]
    }

    /// The buckets of the sale above: they hold 90 units, 67 available, 3 reserved, 10 sold.
    fn split() -> [(u16, Counters); 3] {
        [
            (0, counters(40, 30, 2, 8)),
            (1, counters(30, 27, 1, 2)),
            (2, counters(20, 10, 0, 0)),
        ]
    }

    #[test]
    fn a_hot_answer_lists_the_buckets_which_add_up_to_the_sale() {
        let hot = HotBuckets {
            buckets: split().to_vec(),
            in_flight_units: 10,
        };
        let v = view(BucketFields::hot(&hot));
        assert_eq!(v["buckets"], 3);
        assert_eq!(v["bucket_source"], "hot");
        assert_eq!(v["in_flight_units"], 10);
        assert_eq!(
            v["bucket_counters"][1],
            serde_json::json!({"bucket": 1, "total": 30, "available": 27, "reserved": 1, "sold": 2})
        );
        let [total, available, reserved, sold] = bucket_sums(&v);
        assert_eq!(total + 10, v["total_stock"].as_u64().unwrap());
        assert_eq!(available, v["available"].as_u64().unwrap(), "{v}");
        assert_eq!(reserved, v["reserved"].as_u64().unwrap());
        assert_eq!(sold, v["sold"].as_u64().unwrap());
    }

    #[test]
    fn database_rows_are_listed_with_their_source_and_the_units_in_flight() {
        let rows = split().map(|(bucket, counters)| BucketRow {
            bucket,
            epoch: 3 + u64::from(bucket),
            epoch_at_ms: 0,
            counters,
        });
        let v = view(BucketFields::database(&rows, 100));
        assert_eq!(v["bucket_source"], "database");
        assert_eq!(v["in_flight_units"], 10);
        assert_eq!(v["bucket_counters"].as_array().map(Vec::len), Some(3));
        assert_eq!(bucket_sums(&v), [90, 67, 3, 10]);
        assert_eq!(
            (v["available"].as_u64(), v["sold"].as_u64()),
            (Some(67), Some(10))
        );
    }

    #[test]
    fn a_sale_without_bucket_counters_shows_none_of_their_fields() {
        let v = view(BucketFields::default());
        assert_eq!(v["buckets"], 3);
        for field in ["bucket_counters", "in_flight_units", "bucket_source"] {
            assert!(v.get(field).is_none(), "{field} in {v}");
        }
    }
}
