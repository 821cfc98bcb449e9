//! Admin API of the risk check: the allowlist the fallback rule `allowlist` admits, and a
//! sale's own fallback rule. Both are stored with the blacklist (`gateway::blacklist`), so
//! every instance sees a change within its refresh, the one that made it at once.

use axum::extract::State;
use axum::Json;
use flashsale_core::SkuId;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Admin;
use crate::error::AppError;
use crate::gateway::blacklist;
use crate::risk::Fallback;
use crate::routes::{
    gateway_stored, gateway_write, stored_sale, user_id, v1, AdminOn, Answer, ApiJson, ApiPath,
};
use crate::state::AppState;

/// Routes under `/api/v1`, with their OpenAPI.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(v1(routes!(view)))
        .routes(v1(routes!(allow_user, disallow_user)))
        .routes(v1(routes!(set_sale_fallback, drop_sale_fallback)))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RiskView {
    /// Whether this instance calls a risk service (`FLASHSALE_RISK_URL` set).
    pub enabled: bool,
    pub timeout_ms: u64,
    pub inflight_max: usize,
    /// This instance's fallback rule.
    pub fallback: Fallback,
    pub breaker_open: bool,
    /// Users the fallback rule `allowlist` admits.
    pub allowlist: Vec<u64>,
    /// Sales with a fallback rule of their own.
    pub sales: Vec<SaleFallbackView>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AllowlistEntry {
    pub user_id: u64,
    pub allowlisted: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SaleFallbackView {
    pub sku_id: u64,
    /// The rule in force for the sale: its own, else this instance's.
    pub fallback: Fallback,
    /// Whether the sale has a rule of its own.
    pub own: bool,
}

/// `{"fallback": "allow" | "deny" | "allowlist"}`
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SaleFallbackBody {
    pub fallback: Fallback,
}

#[utoipa::path(get, path = "/admin/risk", tag = "admin", operation_id = "risk_view", security(("bearer" = [])),
    responses((status = 200, description = "the risk check of this instance, the allowlist and the sales' own fallback rules", body = RiskView)))]
pub async fn view(State(st): State<AppState>, _: Admin) -> Result<Json<RiskView>, AppError> {
    let s = gateway_stored(&st).await?;
    let mut allowlist: Vec<u64> = s.risk_allow.into_iter().collect();
    allowlist.sort_unstable();
    let mut sales: Vec<SaleFallbackView> = blacklist::risk_fallbacks(&s.risk_fallback)
        .into_iter()
        .map(|(sku_id, fallback)| SaleFallbackView {
            sku_id,
            fallback,
            own: true,
        })
        .collect();
    sales.sort_unstable_by_key(|v| v.sku_id);
    let config = st.risk.config();
    Ok(Json(RiskView {
        enabled: st.risk.enabled(),
        timeout_ms: config.timeout.as_millis() as u64,
        inflight_max: config.inflight_max,
        fallback: config.fallback,
        breaker_open: st.risk.breaker_open(),
        allowlist,
        sales,
    }))
}

flag_routes!(
    "/admin/risk/allowlist/users/{user_id}", ("user_id" = u64, Path, minimum = 1), u64 => AllowlistEntry, set_allowed,
    put allow_user = "risk_allow_user" ("on the allowlist"),
    delete disallow_user = "risk_disallow_user" ("off the allowlist"),
);

async fn set_allowed(st: &AppState, p: u64, on: bool) -> Result<Json<AllowlistEntry>, AppError> {
    let user = user_id(p)?;
    gateway_write(st, st.gateway.blacklist.store.set_risk_allowed(user, on)).await?;
    Ok(Json(AllowlistEntry {
        user_id: user.0,
        allowlisted: on,
    }))
}

async fn set_fallback(
    st: &AppState,
    p: u64,
    rule: Option<Fallback>,
) -> Result<Json<SaleFallbackView>, AppError> {
    let sku = SkuId(p);
    stored_sale(st, sku).await?;
    let stored = rule.map(Fallback::as_str);
    gateway_write(
        st,
        st.gateway.blacklist.store.set_risk_fallback(sku, stored),
    )
    .await?;
    Ok(Json(SaleFallbackView {
        sku_id: sku.0,
        fallback: rule.unwrap_or(st.risk.config().fallback),
        own: rule.is_some(),
    }))
}

#[utoipa::path(put, path = "/admin/sales/{sku_id}/risk-fallback", tag = "admin", operation_id = "set_risk_fallback", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), request_body = SaleFallbackBody,
    responses((status = 200, description = "the sale's own fallback rule", body = SaleFallbackView)))]
pub async fn set_sale_fallback(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(p): ApiPath<u64>,
    ApiJson(body): ApiJson<SaleFallbackBody>,
) -> Result<Json<SaleFallbackView>, AppError> {
    set_fallback(&st, p, Some(body.fallback)).await
}

#[utoipa::path(delete, path = "/admin/sales/{sku_id}/risk-fallback", tag = "admin", operation_id = "drop_risk_fallback", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the sale follows this instance's rule again", body = SaleFallbackView)))]
pub async fn drop_sale_fallback(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<SaleFallbackView> {
    set_fallback(&st, p, None).await
}
