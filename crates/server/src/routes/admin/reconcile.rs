//! The reconciler over HTTP: a fresh report (admin) and a repair of one sale.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use flashsale_core::SkuId;
use serde::Deserialize;

use crate::auth::Admin;
use crate::error::AppError;
use crate::routes::{AdminOn, Answer};
use crate::state::AppState;
use flashsale_engine::shop::SaleReport;

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
    Ok(Json(st.shop.reconcile(q.sku.map(SkuId)).await?))
}

// `POST /api/v1/admin/reconcile/{sku_id}/repair`: a run with repairs.
#[utoipa::path(post, path = "/admin/reconcile/{sku_id}/repair", tag = "admin", operation_id = "reconcile_repair", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "a reconciler run with repairs (replay, rebuild, expire)")))]
pub async fn repair_route(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<SaleReport> {
    Ok(Json(st.shop.repair(SkuId(p)).await?))
}
