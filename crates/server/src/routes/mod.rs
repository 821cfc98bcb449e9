//! HTTP handlers, one module per resource, what they share ([`sale`]: a sale through the
//! shop's cache; [`OrderView`]), and the API's extractors: [`ApiPath`], [`ApiJson`], and the callers
//! [`User`] (a user token, not blacklisted; [`UserAt`]: with the client's address) and [`Admin`]
//! (the admin token).

pub mod admin;
pub mod admission;
pub mod dashboard;
pub mod health;
pub mod orders;
pub mod purchases;
pub mod sales;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use axum::Json;
use flashsale_core::events::OrderFields;
use flashsale_core::ledger::StoredSale;
use flashsale_core::{ErrorCode, HotOrder, OrderStatus, SkuId, UserId};
use serde::de::DeserializeOwned;
use serde::Serialize;
use utoipa::openapi::path::Paths;
use utoipa_axum::router::UtoipaMethodRouter;

use crate::auth::{bearer, Admin, User};
use crate::error::AppError;
use crate::state::AppState;

/// The API's version prefix.
pub const V1: &str = "/api/v1";

/// A route declared by its handler's `#[utoipa::path]`, moved under [`V1`] (in the router and
/// in the OpenAPI document alike). The prefix is written into each route rather than nested:
/// a nested router strips its prefix from every request's URI (a new `Uri`, parsed, and a
/// `NestedPath` extension) before the handler runs, a cost every API answer paid.
pub fn v1<S>((schemas, paths, method): UtoipaMethodRouter<S>) -> UtoipaMethodRouter<S> {
    let mut prefixed = Paths::new();
    prefixed.extensions = paths.extensions;
    for (path, item) in paths.paths {
        prefixed.paths.insert(format!("{V1}{path}"), item);
    }
    (schemas, prefixed, method)
}

/// `Path` whose rejection is the API's own error (400 `INVALID_REQUEST`, our JSON shape).
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(AppError))]
pub struct ApiPath<T>(pub T);

/// `Json` whose rejection is the API's own error (`application/problem+json`: 413
/// `PAYLOAD_TOO_LARGE` for a body too large, 400 `INVALID_REQUEST` otherwise).
///
/// A body sent as plain `application/json` is read here within the state's body limit and
/// parsed straight into `T`; `Json` itself, which tracks the path of every field it parses
/// (an allocation per key) so that a refusal can name it, runs only for another media type
/// or a body that does not parse, and words the refusal exactly as before.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        let plain = req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes() == b"application/json");
        if !plain {
            let Json(value) = Json::<T>::from_request(req, state).await?;
            return Ok(ApiJson(value));
        }
        let bytes = body_bytes(req, state.tunables.body_bytes_max).await?;
        match serde_json::from_slice(&bytes) {
            Ok(value) => Ok(ApiJson(value)),
            Err(_) => Ok(ApiJson(Json::<T>::from_bytes(&bytes)?.0)),
        }
    }
}

/// A request's body, at most `len_max` bytes (the limit `DefaultBodyLimit` sets for `Json`):
/// a declared length past it is refused before a byte is read, a body that grows past it as
/// it comes. A small body arrives in one frame and is taken as it came. The body is read as
/// hyper hands it over: a general reader (a list of buffers) or axum's limited body (a layer
/// and a box more per frame) cost a purchase more than its JSON.
async fn body_bytes(req: Request, len_max: usize) -> Result<Bytes, AppError> {
    use http_body_util::BodyExt as _;
    let declared = req.headers().get(header::CONTENT_LENGTH);
    if declared
        .is_some_and(|v| v.to_str().ok().and_then(|v| v.parse::<u64>().ok()) > Some(len_max as u64))
    {
        return Err(body_too_large());
    }
    let mut body = req.into_body();
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(body_error)?.into_data() else {
            continue; // trailers
        };
        len += data.len();
        if len > len_max {
            return Err(body_too_large());
        }
        match first.take() {
            None if more.is_empty() => first = Some(data),
            earlier => {
                more.extend_from_slice(earlier.as_deref().unwrap_or_default());
                more.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(more)))
}

fn body_too_large() -> AppError {
    AppError::new(ErrorCode::PayloadTooLarge, "request body too large")
}

/// A body that could not be read (cut off): 400.
fn body_error(e: axum::Error) -> AppError {
    AppError::invalid(format!("Failed to buffer the request body: {e}"))
}

/// A call on one resource: the state, the caller (`Admin` or `User`: its token checked),
/// then the path's value (`p`), in that order (an unknown caller hears 401 before a bad
/// path's 400).
pub struct Call<C, T> {
    pub st: AppState,
    pub caller: C,
    pub p: T,
}

/// An admin's call on one resource.
pub type AdminOn<T> = Call<Admin, T>;
/// A user's call on one resource (the user not blacklisted).
pub type UserOn<T> = Call<User, T>;

impl<C, T> FromRequestParts<AppState> for Call<C, T>
where
    C: FromRequestParts<AppState, Rejection = AppError> + Send,
    T: Send,
    ApiPath<T>: FromRequestParts<AppState, Rejection = AppError>,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, AppError> {
        let caller = C::from_request_parts(parts, st).await?;
        let ApiPath(p) = ApiPath::<T>::from_request_parts(parts, st).await?;
        let st = st.clone();
        Ok(Call { st, caller, p })
    }
}

impl<T> UserOn<T> {
    /// The state, the user, the path's value.
    pub fn into_parts(self) -> (AppState, UserId, T) {
        (self.st, self.caller.0, self.p)
    }
}

/// A handler's JSON answer, or the API's error.
pub type Answer<T> = Result<Json<T>, AppError>;

/// The sale as the database has it now (no cache): what an admin change reads first.
pub async fn stored_sale(st: &AppState, sku: SkuId) -> Result<StoredSale, AppError> {
    Ok(st.shop.stored_sale(sku).await?)
}

/// A user id in a path: positive.
pub fn user_id(p: u64) -> Result<UserId, AppError> {
    match p {
        0 => Err(AppError::invalid("user_id must be positive")),
        u => Ok(UserId(u)),
    }
}

/// The gateway's store (blacklist, purchase-token sales, the risk allowlist and rules) did
/// not answer.
pub fn gateway_store_error(e: String) -> AppError {
    AppError::new(ErrorCode::Unavailable, format!("gateway store: {e}"))
}

/// The gateway's lists as its store holds them now (not this instance's copy, which lags a
/// change another instance made until its next refresh).
pub async fn gateway_stored(st: &AppState) -> Result<crate::gateway::BlacklistSnapshot, AppError> {
    let load = st.gateway.blacklist.store.load();
    load.await.map_err(gateway_store_error)
}

/// Writes through the gateway's store, then reloads this instance's copy, so the change
/// holds here at once (other instances see it within their refresh).
pub async fn gateway_write(
    st: &AppState,
    write: impl std::future::Future<Output = Result<(), String>>,
) -> Result<(), AppError> {
    write.await.map_err(gateway_store_error)?;
    st.gateway
        .blacklist
        .refresh()
        .await
        .map_err(gateway_store_error)
}

/// The sale from the instance cache, or the database (a stale cached copy when the database
/// does not answer): what every handler that names a sale reads first.
pub async fn sale(st: &AppState, sku: SkuId) -> Result<Arc<StoredSale>, AppError> {
    Ok(st.shop.sale(sku).await?)
}

/// An order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OrderView {
    #[serde(flatten)]
    pub order: OrderFields,
    pub created_at_ms: i64,
    /// True when this answer repeats the first outcome of the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<bool>,
}

impl OrderView {
    pub fn new(order: &HotOrder, status: OrderStatus) -> OrderView {
        OrderView {
            order: OrderFields::of(order, status),
            created_at_ms: order.created_at_ms,
            replayed: None,
        }
    }
}

impl FromRequestParts<AppState> for User {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<User, AppError> {
        let at = UserAt::from_request_parts(parts, state).await?;
        Ok(User(at.user))
    }
}

/// A request from a user (as [`User`]), with the client's address as the gateway saw it
/// (`None` without a connection, in tests): found once, for the checks and the handler.
pub struct UserAt {
    pub user: UserId,
    pub ip: Option<std::net::IpAddr>,
}

impl FromRequestParts<AppState> for UserAt {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<UserAt, AppError> {
        let token = bearer(parts)?;
        if state.auth.is_admin(token) {
            return Err(AppError::new(
                ErrorCode::Forbidden,
                "the admin token is not a user",
            ));
        }
        let user = state.auth.verify(token).await?;
        let ip = state.gateway.client_ip(parts);
        state.gateway.check_user(user, ip)?;
        Ok(UserAt { user, ip })
    }
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Admin, AppError> {
        let token = bearer(parts)?;
        if state.auth.is_admin(token) {
            return Ok(Admin);
        }
        // A valid user token is known but not allowed; anything else is not known at all.
        state.auth.verify(token).await?;
        Err(AppError::new(ErrorCode::Forbidden, "admin only"))
    }
}
