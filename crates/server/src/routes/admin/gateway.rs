//! Gateway routes: the admin API of the blacklist and of token-only sales, and the
//! purchase-token route of users.

use std::net::IpAddr;

use axum::extract::State;
use axum::Json;
use flashsale_core::{ErrorCode, SaleState, SkuId};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Admin;
use crate::error::AppError;
use crate::routes::{
    gateway_stored, gateway_write, stored_sale, user_id, v1, AdminOn, Answer, UserOn,
};
use crate::state::AppState;

/// Routes under `/api/v1`, with their OpenAPI.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(v1(routes!(list)))
        .routes(v1(routes!(block_user, unblock_user)))
        .routes(v1(routes!(block_ip, unblock_ip)))
        .routes(v1(routes!(require_token, drop_token)))
        .routes(v1(routes!(issue_token)))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BlacklistView {
    pub users: Vec<u64>,
    pub ips: Vec<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BlacklistEntry {
    /// `user` or `ip`.
    pub kind: String,
    pub value: String,
    pub blocked: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenSaleView {
    pub sku_id: u64,
    pub purchase_token: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PurchaseTokenView {
    pub sku_id: u64,
    pub token: String,
    pub expires_at_ms: i64,
}

#[utoipa::path(get, path = "/admin/blacklist", tag = "admin", operation_id = "list_blacklist", security(("bearer" = [])),
    responses((status = 200, description = "blocked users and addresses", body = BlacklistView)))]
pub async fn list(State(st): State<AppState>, _: Admin) -> Result<Json<BlacklistView>, AppError> {
    let s = gateway_stored(&st).await?;
    let mut users: Vec<u64> = s.users.into_iter().collect();
    users.sort_unstable();
    let mut ips: Vec<String> = s.ips.into_iter().map(|i| i.to_string()).collect();
    ips.sort();
    Ok(Json(BlacklistView { users, ips }))
}

fn ip(p: String) -> Result<IpAddr, AppError> {
    let raw = p;
    if raw.len() > 64 {
        return Err(AppError::invalid("not an IP address"));
    }
    raw.parse()
        .map_err(|_| AppError::invalid("not an IP address"))
}

flag_routes!(
    "/admin/blacklist/users/{user_id}", ("user_id" = u64, Path, minimum = 1), u64 => BlacklistEntry, set_user,
    put block_user = "block_user" ("blocked"),
    delete unblock_user = "unblock_user" ("unblocked"),
);

async fn set_user(st: &AppState, p: u64, on: bool) -> Result<Json<BlacklistEntry>, AppError> {
    let user = user_id(p)?;
    gateway_write(st, st.gateway.blacklist.store.set_user(user, on)).await?;
    Ok(Json(BlacklistEntry {
        kind: "user".into(),
        value: user.0.to_string(),
        blocked: on,
    }))
}

flag_routes!(
    "/admin/blacklist/ips/{ip}", ("ip" = String, Path), String => BlacklistEntry, set_ip,
    put block_ip = "block_ip" ("blocked"),
    delete unblock_ip = "unblock_ip" ("unblocked"),
);

async fn set_ip(st: &AppState, p: String, on: bool) -> Result<Json<BlacklistEntry>, AppError> {
    let ip = ip(p)?;
    gateway_write(st, st.gateway.blacklist.store.set_ip(ip, on)).await?;
    Ok(Json(BlacklistEntry {
        kind: "ip".into(),
        value: ip.to_string(),
        blocked: on,
    }))
}

flag_routes!(
    "/admin/sales/{sku_id}/purchase-token", ("sku_id" = u64, Path, minimum = 0), u64 => TokenSaleView, set_token_sale,
    put require_token = "require_token" ("purchases now need a token"),
    delete drop_token = "drop_token" ("purchases need no token"),
);

async fn set_token_sale(st: &AppState, p: u64, on: bool) -> Result<Json<TokenSaleView>, AppError> {
    let sku = SkuId(p);
    stored_sale(st, sku).await?;
    gateway_write(st, st.gateway.blacklist.store.set_token_sale(sku, on)).await?;
    Ok(Json(TokenSaleView {
        sku_id: sku.0,
        purchase_token: on,
    }))
}

// A purchase token, only while the sale is live (state and window).
#[utoipa::path(post, path = "/sales/{sku_id}/purchase-token", tag = "purchases", operation_id = "issue_purchase_token", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "a single-use purchase token (only while the sale is live)", body = PurchaseTokenView)))]
pub async fn issue_token(call: UserOn<u64>) -> Answer<PurchaseTokenView> {
    let (st, user, p) = call.into_parts();
    let sku = SkuId(p);
    let stored = crate::routes::sale(&st, sku).await?;
    let sale = &stored.sale;
    let now = flashsale_core::clock::now_ms();
    let code = match sale.state {
        SaleState::Scheduled => Some(ErrorCode::NotStarted),
        SaleState::Paused => Some(ErrorCode::Paused),
        SaleState::Ended => Some(ErrorCode::Ended),
        SaleState::Live if now < sale.starts_at_ms => Some(ErrorCode::NotStarted),
        SaleState::Live if now >= sale.ends_at_ms => Some(ErrorCode::Ended),
        SaleState::Live => None,
    };
    if let Some(code) = code {
        return Err(AppError::from_code(code));
    }
    let (token, expires_at_ms) = st.gateway.tokens.issue(user, sku);
    Ok(Json(PurchaseTokenView {
        sku_id: sku.0,
        token,
        expires_at_ms,
    }))
}
