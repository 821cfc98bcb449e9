//! The reconciler over HTTP: a fresh report (admin) and a repair of one sale.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use flashsale_core::{LedgerError, SkuId, StoreError};
use serde::Deserialize;

use crate::auth::Admin;
use crate::error::AppError;
use crate::routes::{AdminOn, Answer};
use crate::state::AppState;
use flashsale_engine::reconcile::{RebuildError, SaleReport, Trigger};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportQuery {
    pub sku: Option<u64>,
}

// `GET /api/v1/admin/reconcile[?sku=N]`: a fresh run (no repairs) of every sale or one.
#[utoipa::path(get, path = "/admin/reconcile", tag = "admin", operation_id = "reconcile_report", security(("bearer" = [])),
    params(("sku" = Option<u64>, Query, minimum = 0)),
    responses((status = 200, description = "a fresh reconciler run (no repairs) per sale: I1-I7, hot vs database diff, loss")))]
pub async fn report_route(
    State(st): State<AppState>,
    _: Admin,
    q: Result<Query<ReportQuery>, QueryRejection>,
) -> Result<Json<Vec<SaleReport>>, AppError> {
    let Query(q) = q?;
    let reconciler = st.reconciler();
    reconciler
        .run(q.sku.map(SkuId), false, Trigger::Admin)
        .await
        .map(Json)
        .map_err(internal)
}

// `POST /api/v1/admin/reconcile/{sku_id}/repair`: a run with repairs.
#[utoipa::path(post, path = "/admin/reconcile/{sku_id}/repair", tag = "admin", operation_id = "reconcile_repair", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "a reconciler run with repairs (replay, rebuild, expire)")))]
pub async fn repair_route(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<SaleReport> {
    let sku = SkuId(p);
    if st.store.sale(sku).await?.is_none() {
        return Err(AppError::from_code(flashsale_core::ErrorCode::SaleNotFound));
    }
    let reconciler = st.reconciler();
    let report = reconciler
        .run_sale(sku, true, Trigger::Admin)
        .await
        .map_err(internal)?;
    st.sold_out.clear(sku);
    st.sales.forget(sku);
    st.buckets.forget(sku);
    Ok(Json(report))
}

fn internal(e: anyhow::Error) -> AppError {
    if let Some(RebuildError::Raced(sku)) = e.downcast_ref::<RebuildError>() {
        return AppError::new(
            flashsale_core::ErrorCode::Unavailable,
            format!("another rebuild of sale {sku} is under way; retry"),
        );
    }
    match e.downcast::<LedgerError>() {
        Ok(l) => l.into(),
        Err(e) => match e.downcast::<StoreError>() {
            Ok(s) => s.into(),
            Err(e) => AppError::new(flashsale_core::ErrorCode::Unavailable, e.to_string()),
        },
    }
}
