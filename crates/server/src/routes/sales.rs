//! Sales: admin create / warm / pause / resume / end, and the public view.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use flashsale_core::ledger::StoredSale;
use flashsale_core::{Counters, ErrorCode, LedgerError, Sale, SaleMode, SaleState, SkuId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{stored_sale, AdminOn, Answer, ApiJson, ApiPath};
use crate::auth::Admin;
use crate::bucket_view::BucketFields;
use crate::error::AppError;
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
}

/// Re-exported for the binary's benches; the server reads the clock from flashsale-core.
pub use flashsale_core::clock::now_ms;

impl CreateSale {
    fn into_sale(self) -> Result<Sale, AppError> {
        let starts_at_ms = self.starts_at_ms.unwrap_or_else(now_ms);
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
        };
        sale.validate().map_err(AppError::invalid)?;
        Ok(sale)
    }
}

#[utoipa::path(post, path = "/sales", tag = "sales", operation_id = "create_sale", security(("bearer" = [])),
    request_body = CreateSale, responses((status = 201, description = "created", body = SaleView)))]
pub async fn create(
    State(st): State<AppState>,
    _: Admin,
    ApiJson(body): ApiJson<CreateSale>,
) -> Result<(StatusCode, Json<SaleView>), AppError> {
    let sale = body.into_sale()?;
    // Refused before anything is stored: the ledger could not load the sale's copy.
    st.ledger.check_buckets(&sale).map_err(AppError::invalid)?;
    let stored = st.store.create_sale(&sale).await?;
    st.sales.forget(sale.sku_id);
    Ok((
        StatusCode::CREATED,
        Json(SaleView::new(&stored.sale, &stored.counters)),
    ))
}

#[utoipa::path(get, path = "/sales/{sku_id}", tag = "sales", operation_id = "get_sale",
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the sale (counters may be 1 s old); a bucketed sale also its per-bucket counters, from the hot ledger or else the database (`bucket_source`), when either has them", body = SaleView)))]
pub async fn get(
    State(st): State<AppState>,
    ApiPath(p): ApiPath<u64>,
) -> Result<Json<SaleView>, AppError> {
    let sku = SkuId(p);
    let stored = super::sale(&st, sku).await?;
    let counters = match st.sales.counters(sku) {
        Some(c) => c,
        None => hot_or_stored_counters(&st, &stored).await,
    };
    let per_bucket = st
        .buckets
        .read(st.ledger.as_ref(), st.store.as_ref(), &stored)
        .await;
    Ok(Json(
        SaleView::new(&stored.sale, &counters).with_buckets(per_bucket),
    ))
}

/// Hot counters when the sale is warm and the ledger answers; else the database's.
async fn hot_or_stored_counters(st: &AppState, stored: &StoredSale) -> Counters {
    let hot = match stored.sale.state {
        SaleState::Scheduled => None,
        _ => st.ledger.counters(stored.sale.sku_id).await.ok().flatten(),
    };
    let c = hot.unwrap_or(stored.counters);
    st.sales.put_counters(stored.sale.sku_id, c);
    c
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmQuery {
    #[serde(default)]
    pub force: bool,
}

// Loads a sale into the hot ledger. A sale whose hot copy is intact (open, of the
// database's epoch) and has sold is refused unless `force`; everything else — the first
// load, a copy that is gone or older than the database, a forced warm — is a rebuild: the
// old copy is fenced and drained, the next epoch is taken in the database, and the new copy
// is loaded with the database's orders (see `reconcile::rebuild`). No order number is ever
// handed out twice, and nothing the old copy accepted is lost while it is readable.
#[utoipa::path(post, path = "/sales/{sku_id}/warm", tag = "sales", operation_id = "warm_sale", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0), ("force" = Option<bool>, Query, description = "rebuild a hot sale that sold units")),
    responses((status = 200, description = "warm and live", body = SaleView)))]
pub async fn warm(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(p): ApiPath<u64>,
    q: Result<Query<WarmQuery>, QueryRejection>,
) -> Result<Json<SaleView>, AppError> {
    let sku = SkuId(p);
    let Query(q) = q?;
    let stored = stored_sale(&st, sku).await?;
    if stored.sale.state == SaleState::Ended {
        return Err(AppError::from_code(ErrorCode::Ended));
    }
    if stored.sale.state == SaleState::Scheduled {
        // The database first: a rebuild opens the copy in the database's state.
        st.store.set_state(sku, SaleState::Live).await?;
    }
    let snap = warm_snapshot(&st, &stored).await?;
    let intact = snap
        .as_ref()
        .filter(|s| s.epoch == stored.epoch && s.fenced_ms.is_none());
    match intact {
        Some(s) if s.counters.seq > 0 && !q.force => {
            return Err(AppError::new(
                ErrorCode::SaleExists,
                format!(
                    "sale {sku} is warm and has sold; ?force=true rebuilds it from the database \
                     in a new epoch (its stream is drained first: nothing accepted is lost)"
                ),
            ));
        }
        Some(_) if !q.force => {
            let state = stored_sale(&st, sku).await?.sale.state;
            st.ledger.set_state(sku, state).await?;
        }
        _ => {
            flashsale_engine::reconcile::rebuild_all(st.ledger.as_ref(), st.store.as_ref(), sku)
                .await
                .map_err(rebuild_error)?;
        }
    }
    st.sales.forget(sku);
    st.buckets.forget(sku);
    st.sold_out.clear(sku);
    let stored = stored_sale(&st, sku).await?;
    let hot = st.ledger.counters(sku).await.ok().flatten();
    Ok(Json(SaleView::new(
        &stored.sale,
        &hot.unwrap_or(stored.counters),
    )))
}

fn rebuild_error(e: flashsale_engine::reconcile::RebuildError) -> AppError {
    use flashsale_engine::reconcile::RebuildError;
    match e {
        RebuildError::Raced(sku) => AppError::new(
            ErrorCode::Unavailable,
            format!("another rebuild of sale {sku} is under way; retry"),
        ),
        RebuildError::Ledger(e) => e.into(),
        RebuildError::Store(e) => e.into(),
    }
}

async fn set_state(st: AppState, p: u64, state: SaleState) -> Result<Json<SaleView>, AppError> {
    let sku = SkuId(p);
    let stored = stored_sale(&st, sku).await?;
    if stored.sale.state == SaleState::Ended {
        return Err(AppError::from_code(ErrorCode::Ended));
    }
    if stored.sale.state == SaleState::Scheduled {
        return Err(AppError::new(ErrorCode::NotStarted, "warm the sale first"));
    }
    st.store.set_state(sku, state).await?;
    match st.ledger.set_state(sku, state).await {
        Ok(()) | Err(LedgerError::NotWarmed) => {}
        Err(e) => return Err(e.into()),
    }
    st.sales.forget(sku);
    let mut sale = stored.sale.clone();
    sale.state = state;
    let counters = hot_or_stored_counters(
        &st,
        &StoredSale {
            sale: sale.clone(),
            ..stored
        },
    )
    .await;
    Ok(Json(SaleView::new(&sale, &counters)))
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

/// The copy `warm` looks at: the sale's own, or for a sale kept in buckets its bucket 0,
/// whose epoch is given as the sale's when it is its row's (the copy is current), else as 0.
async fn warm_snapshot(
    st: &AppState,
    stored: &flashsale_core::StoredSale,
) -> Result<Option<flashsale_core::HotSnapshot>, AppError> {
    let sku = stored.sale.sku_id;
    if st.ledger.kept_in_buckets(&stored.sale) {
        if let Some(mut snap) = st.ledger.bucket_snapshot(sku, 0).await? {
            let rows = st.store.buckets(sku).await?;
            let current = rows.first().is_some_and(|r| r.epoch == snap.epoch);
            snap.epoch = if current { stored.epoch } else { 0 };
            return Ok(Some(snap));
        }
        if st.ledger.bucket_salts(sku).await?.is_some() {
            // Placed in buckets and bucket 0 missing (a first load that failed midway):
            // rebuilt, never read as a copy of one bucket.
            return Ok(None);
        }
    }
    Ok(st.ledger.hot_snapshot(sku).await?)
}

#[cfg(test)]
mod tests {
    use flashsale_core::{BucketRow, HotBuckets};
    use serde_json::Value;

    use super::*;

    fn counters(total: u64, available: u64, reserved: u64, sold: u64) -> Counters {
        Counters {
            total,
            available,
            reserved,
            sold,
            seq: 4,
        }
    }

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
