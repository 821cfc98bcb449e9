//! OpenAPI 3 description of the HTTP API at `/openapi.json`, Swagger UI at `/docs` (vendored:
//! nothing is downloaded at build time). Each handler has an entry here; `tests/openapi.rs`
//! checks that the routes of [`crate::app`] and the paths of the document are the same set,
//! and `scripts/fuzz.sh` fuzzes the service against this document with schemathesis.

use axum::Router;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_swagger_ui::SwaggerUi;

use crate::gateway::routes::{BlacklistEntry, BlacklistView, PurchaseTokenView, TokenSaleView};
use crate::openapi_extra::{IpAddresses, Links, Unsigned};
use crate::state::AppState;

/// `/openapi.json` and `/docs`.
pub fn router() -> Router<AppState> {
    SwaggerUi::new("/docs")
        .url("/openapi.json", ApiDoc::openapi())
        .into()
}

/// `{"code": "...", "message": "..."}`: every error answer.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Error {
    #[schema(example = "INVALID_REQUEST")]
    code: ErrorCodeSchema,
    message: String,
}

#[derive(ToSchema)]
#[allow(dead_code, clippy::upper_case_acronyms)]
#[schema(as = ErrorCode)]
#[schema(rename_all = "SCREAMING_SNAKE_CASE")]
enum ErrorCodeSchema {
    InvalidRequest,
    Unauthorized,
    Forbidden,
    Blacklisted,
    SaleNotFound,
    OrderNotFound,
    RouteNotFound,
    MethodNotAllowed,
    SaleExists,
    SoldOut,
    LimitExceeded,
    NotStarted,
    Ended,
    Paused,
    HoldExpired,
    AlreadyResolved,
    PayloadTooLarge,
    RateLimited,
    Busy,
    Unavailable,
    Internal,
}

#[derive(ToSchema, serde::Deserialize)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
enum SaleMode {
    Direct,
    Reserve,
}

#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
enum SaleState {
    Scheduled,
    Live,
    Paused,
    Ended,
}

#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "SCREAMING_SNAKE_CASE")]
enum OrderStatus {
    Pending,
    Created,
    Reserved,
    Paid,
    Cancelled,
    Expired,
    Rejected,
}

/// Body of `POST /api/v1/sales`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSale {
    /// At most 2^53 − 1 (the Redis scripts hold numbers as Lua doubles).
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    sku_id: u64,
    #[schema(min_length = 1, max_length = 200)]
    name: String,
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    total_stock: u64,
    #[schema(minimum = 1, maximum = 1_000)]
    per_user_limit: Option<u32>,
    mode: Option<SaleMode>,
    payment_timeout_ms: Option<u64>,
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    starts_at_ms: Option<i64>,
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_i64)]
    ends_at_ms: Option<i64>,
}

/// A sale with its stock.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SaleView {
    sku_id: u64,
    name: String,
    total_stock: u64,
    per_user_limit: u32,
    mode: SaleMode,
    payment_timeout_ms: u64,
    starts_at_ms: i64,
    ends_at_ms: i64,
    state: SaleState,
    available: u64,
    reserved: u64,
    sold: u64,
    seq: u64,
}

/// Body of a purchase.
#[derive(ToSchema)]
#[allow(dead_code)]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurchaseBody {
    /// Chosen by the client, one per attempt, reused on retry.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_-]{1,64}$")]
    request_id: String,
    #[schema(minimum = 1, maximum = 1_000)]
    quantity: i64,
    /// Required when the sale requires purchase tokens (anti-scalping).
    #[schema(max_length = 512)]
    purchase_token: Option<String>,
}

/// An order.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct OrderView {
    order_no: String,
    sku_id: u64,
    user_id: u64,
    request_id: String,
    quantity: u32,
    status: OrderStatus,
    deadline_ms: Option<i64>,
    created_at_ms: i64,
    /// True when this answer repeats the first outcome of the request.
    replayed: Option<bool>,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Health {
    status: String,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Ready {
    ledger: String,
    database: String,
    ledger_kind: String,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "flashsale", description = "Flash-sale inventory service. Errors are `{\"code\",\"message\"}`; 429 and 503 carry `Retry-After`."),
    paths(
        create_sale, get_sale, warm_sale, pause_sale, resume_sale, end_sale, purchase,
        get_order, pay_order, cancel_order, issue_purchase_token, list_blacklist,
        block_user, unblock_user, block_ip, unblock_ip, require_token, drop_token,
        reconcile_report, reconcile_repair, public_dashboard, admin_dashboard,
        healthz, readyz, metrics, dashboard,
    ),
    components(schemas(
        Error, CreateSale, SaleView, PurchaseBody, OrderView, Health, Ready, BlacklistView,
        BlacklistEntry, TokenSaleView, PurchaseTokenView,
    )),
    modifiers(&Common, &Unsigned, &IpAddresses, &Links),
)]
pub struct ApiDoc;

/// Adds the bearer scheme and the error answers every `/api/v1` operation may give.
struct Common;

impl Modify for Common {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            if !path.starts_with("/api/") {
                continue;
            }
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
            ];
            for op in ops.into_iter().flatten() {
                add_errors(op);
            }
        }
    }
}

fn add_errors(op: &mut Operation) {
    let errors = [
        ("400", "invalid request (INVALID_REQUEST)"),
        ("401", "missing or invalid token (UNAUTHORIZED)"),
        ("403", "not allowed (FORBIDDEN, BLACKLISTED)"),
        ("404", "no such sale, order or route"),
        ("405", "method not allowed"),
        ("409", "refused by the sale's rules or state"),
        ("413", "body too large (PAYLOAD_TOO_LARGE)"),
        ("429", "RATE_LIMITED or BUSY, with Retry-After"),
        (
            "503",
            "UNAVAILABLE (hot ledger or database down, timeout), with Retry-After",
        ),
    ];
    for (status, description) in errors {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| {
                RefOr::T(
                    ResponseBuilder::new()
                        .description(description)
                        .content(
                            "application/json",
                            utoipa::openapi::ContentBuilder::new()
                                .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                                    "Error",
                                ))))
                                .build(),
                        )
                        .build(),
                )
            });
    }
}

// One stub per handler: only their attributes matter.

#[utoipa::path(post, path = "/api/v1/sales", tag = "sales", security(("bearer" = [])),
    request_body = CreateSale, responses((status = 201, description = "created", body = SaleView)))]
#[allow(dead_code)]
fn create_sale() {}

#[utoipa::path(get, path = "/api/v1/sales/{sku_id}", tag = "sales",
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the sale (counters may be 1 s old)", body = SaleView)))]
#[allow(dead_code)]
fn get_sale() {}

#[utoipa::path(post, path = "/api/v1/sales/{sku_id}/warm", tag = "sales", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0), ("force" = Option<bool>, Query, description = "rebuild a hot sale that sold units")),
    responses((status = 200, description = "warm and live", body = SaleView)))]
#[allow(dead_code)]
fn warm_sale() {}

#[utoipa::path(post, path = "/api/v1/sales/{sku_id}/pause", tag = "sales", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "paused", body = SaleView)))]
#[allow(dead_code)]
fn pause_sale() {}

#[utoipa::path(post, path = "/api/v1/sales/{sku_id}/resume", tag = "sales", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "live", body = SaleView)))]
#[allow(dead_code)]
fn resume_sale() {}

#[utoipa::path(post, path = "/api/v1/sales/{sku_id}/end", tag = "sales", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "ended", body = SaleView)))]
#[allow(dead_code)]
fn end_sale() {}

#[utoipa::path(post, path = "/api/v1/sales/{sku_id}/purchases", tag = "purchases", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), request_body = PurchaseBody,
    responses((status = 202, description = "accepted (or the replay of the first outcome)", body = OrderView)))]
#[allow(dead_code)]
fn purchase() {}

#[utoipa::path(post, path = "/api/v1/sales/{sku_id}/purchase-token", tag = "purchases", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "a single-use purchase token (only while the sale is live)", body = PurchaseTokenView)))]
#[allow(dead_code)]
fn issue_purchase_token() {}

#[utoipa::path(get, path = "/api/v1/orders/{order_no}", tag = "orders", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "the caller's order", body = OrderView)))]
#[allow(dead_code)]
fn get_order() {}

#[utoipa::path(post, path = "/api/v1/orders/{order_no}/pay", tag = "orders", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "paid", body = OrderView)))]
#[allow(dead_code)]
fn pay_order() {}

#[utoipa::path(post, path = "/api/v1/orders/{order_no}/cancel", tag = "orders", security(("bearer" = [])),
    params(("order_no" = String, Path)), responses((status = 200, description = "cancelled", body = OrderView)))]
#[allow(dead_code)]
fn cancel_order() {}

#[utoipa::path(get, path = "/api/v1/admin/blacklist", tag = "admin", security(("bearer" = [])),
    responses((status = 200, description = "blocked users and addresses", body = BlacklistView)))]
#[allow(dead_code)]
fn list_blacklist() {}

#[utoipa::path(put, path = "/api/v1/admin/blacklist/users/{user_id}", tag = "admin", security(("bearer" = [])),
    params(("user_id" = u64, Path, minimum = 1)), responses((status = 200, description = "blocked", body = BlacklistEntry)))]
#[allow(dead_code)]
fn block_user() {}

#[utoipa::path(delete, path = "/api/v1/admin/blacklist/users/{user_id}", tag = "admin", security(("bearer" = [])),
    params(("user_id" = u64, Path, minimum = 1)), responses((status = 200, description = "unblocked", body = BlacklistEntry)))]
#[allow(dead_code)]
fn unblock_user() {}

#[utoipa::path(put, path = "/api/v1/admin/blacklist/ips/{ip}", tag = "admin", security(("bearer" = [])),
    params(("ip" = String, Path)), responses((status = 200, description = "blocked", body = BlacklistEntry)))]
#[allow(dead_code)]
fn block_ip() {}

#[utoipa::path(delete, path = "/api/v1/admin/blacklist/ips/{ip}", tag = "admin", security(("bearer" = [])),
    params(("ip" = String, Path)), responses((status = 200, description = "unblocked", body = BlacklistEntry)))]
#[allow(dead_code)]
fn unblock_ip() {}

#[utoipa::path(put, path = "/api/v1/admin/sales/{sku_id}/purchase-token", tag = "admin", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "purchases now need a token", body = TokenSaleView)))]
#[allow(dead_code)]
fn require_token() {}

#[utoipa::path(delete, path = "/api/v1/admin/sales/{sku_id}/purchase-token", tag = "admin", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)), responses((status = 200, description = "purchases need no token", body = TokenSaleView)))]
#[allow(dead_code)]
fn drop_token() {}

#[utoipa::path(get, path = "/api/v1/admin/reconcile", tag = "admin", security(("bearer" = [])),
    params(("sku" = Option<u64>, Query, minimum = 0)),
    responses((status = 200, description = "a fresh reconciler run (no repairs) per sale: I1-I7, hot vs database diff, loss")))]
#[allow(dead_code)]
fn reconcile_report() {}

#[utoipa::path(post, path = "/api/v1/admin/reconcile/{sku_id}/repair", tag = "admin", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "a reconciler run with repairs (replay, rebuild, expire)")))]
#[allow(dead_code)]
fn reconcile_repair() {}

#[utoipa::path(get, path = "/api/v1/dashboard", tag = "ops",
    responses((status = 200, description = "every sale (live first, at most 50) with its state and stock")))]
#[allow(dead_code)]
fn public_dashboard() {}

#[utoipa::path(get, path = "/api/v1/admin/dashboard", tag = "admin", security(("bearer" = [])),
    responses((status = 200, description = "per sale: answers per second and latency (last 60 s), stream lag, backlog, sold-out and back-pressure flags, last reconciliation; breaker, script latency")))]
#[allow(dead_code)]
fn admin_dashboard() {}

#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "alive", body = Health)))]
#[allow(dead_code)]
fn healthz() {}

#[utoipa::path(get, path = "/readyz", tag = "ops", responses(
    (status = 200, description = "ledger and database answer", body = Ready),
    (status = 503, description = "a dependency does not answer", body = Ready)))]
#[allow(dead_code)]
fn readyz() {}

#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, description = "Prometheus text", content_type = "text/plain", body = String)))]
#[allow(dead_code)]
fn metrics() {}

#[utoipa::path(get, path = "/", tag = "ops", responses((status = 200, description = "the dashboard", content_type = "text/html", body = String)))]
#[allow(dead_code)]
fn dashboard() {}
