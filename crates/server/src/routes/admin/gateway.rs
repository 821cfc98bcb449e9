//! Gateway routes: the admin API of the blacklist and of token-only sales, and the
//! purchase-token route of users.

use std::net::IpAddr;

use axum::extract::State;
use axum::Json;
use flashsale_core::{ErrorCode, SaleState, SkuId, UserId};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{Admin, User};
use crate::error::AppError;
use crate::routes::{
    gateway_store_error, gateway_write, stored_sale, user_id, AdminOn, Answer, UserOn,
};
use crate::state::AppState;

/// Routes to nest under `/api/v1`, with their OpenAPI.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(block_user, unblock_user))
        .routes(routes!(block_ip, unblock_ip))
        .routes(routes!(require_token, drop_token))
        .routes(routes!(issue_token))
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
    let s = st
        .gateway
        .blacklist
        .store
        .load()
        .await
        .map_err(gateway_store_error)?;
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

async fn set_user(st: &AppState, user: UserId, on: bool) -> Result<Json<BlacklistEntry>, AppError> {
    gateway_write(st, st.gateway.blacklist.store.set_user(user, on)).await?;
    Ok(Json(BlacklistEntry {
        kind: "user".into(),
        value: user.0.to_string(),
        blocked: on,
    }))
}

async fn set_ip(st: &AppState, ip: IpAddr, on: bool) -> Result<Json<BlacklistEntry>, AppError> {
    gateway_write(st, st.gateway.blacklist.store.set_ip(ip, on)).await?;
    Ok(Json(BlacklistEntry {
        kind: "ip".into(),
        value: ip.to_string(),
        blocked: on,
    }))
}

#[utoipa::path(put, path = "/admin/blacklist/users/{user_id}", tag = "admin", operation_id = "block_user", security(("bearer" = [])),
    params(("user_id" = u64, Path, minimum = 1)), responses((status = 200, description = "blocked", body = BlacklistEntry)))]
pub async fn block_user(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<BlacklistEntry> {
    set_user(&st, user_id(p)?, true).await
}

#[utoipa::path(delete, path = "/admin/blacklist/users/{user_id}", tag = "admin", operation_id = "unblock_user", security(("bearer" = [])),
    params(("user_id" = u64, Path, minimum = 1)), responses((status = 200, description = "unblocked", body = BlacklistEntry)))]
pub async fn unblock_user(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<BlacklistEntry> {
    set_user(&st, user_id(p)?, false).await
}

#[utoipa::path(put, path = "/admin/blacklist/ips/{ip}", tag = "admin", operation_id = "block_ip", security(("bearer" = [])),
    params(("ip" = String, Path)), responses((status = 200, description = "blocked", body = BlacklistEntry)))]
pub async fn block_ip(AdminOn { st, p, .. }: AdminOn<String>) -> Answer<BlacklistEntry> {
    set_ip(&st, ip(p)?, true).await
}

#[utoipa::path(delete, path = "/admin/blacklist/ips/{ip}", tag = "admin", operation_id = "unblock_ip", security(("bearer" = [])),
    params(("ip" = String, Path)), responses((status = 200, description = "unblocked", body = BlacklistEntry)))]
pub async fn unblock_ip(AdminOn { st, p, .. }: AdminOn<String>) -> Answer<BlacklistEntry> {
    set_ip(&st, ip(p)?, false).await
}

async fn set_token_sale(st: &AppState, p: u64, on: bool) -> Result<Json<TokenSaleView>, AppError> {
    let sku = SkuId(p);
    stored_sale(st, sku).await?;
    gateway_write(st, st.gateway.blacklist.store.set_token_sale(sku, on)).await?;
    Ok(Json(TokenSaleView {
        sku_id: sku.0,
        purchase_token: on,
    }))
}

#[utoipa::path(put, path = "/admin/sales/{sku_id}/purchase-token", tag = "admin", operation_id = "require_token", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "purchases now need a token", body = TokenSaleView)))]
pub async fn require_token(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<TokenSaleView> {
    set_token_sale(&st, p, true).await
}

#[utoipa::path(delete, path = "/admin/sales/{sku_id}/purchase-token", tag = "admin", operation_id = "drop_token", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "purchases need no token", body = TokenSaleView)))]
pub async fn drop_token(AdminOn { st, p, .. }: AdminOn<u64>) -> Answer<TokenSaleView> {
    set_token_sale(&st, p, false).await
}

// A purchase token, only while the sale is live (state and window).
#[utoipa::path(post, path = "/sales/{sku_id}/purchase-token", tag = "purchases", operation_id = "issue_purchase_token", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "a single-use purchase token (only while the sale is live)", body = PurchaseTokenView)))]
pub async fn issue_token(
    UserOn {
        st,
        caller: User(user),
        p,
    }: UserOn<u64>,
) -> Answer<PurchaseTokenView> {
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
