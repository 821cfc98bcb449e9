//! OpenAPI 3 description of the HTTP API at `/openapi.json`, Swagger UI at `/docs` (vendored:
//! nothing is downloaded at build time). Each handler carries its own `#[utoipa::path]` and
//! [`crate::app`] routes it with `utoipa-axum`'s `routes!`, so the document's paths are the
//! router's; this module holds what is common to them: the document's head, the schemas of
//! the bodies (mirrors of types that live in crates without utoipa), the error answers every
//! `/api/v1` operation may give, and the `/openapi.json` and `/docs` routes.
//! A handler's notes are `//` comments, not `///`: utoipa would make a doc comment the
//! operation's summary. `tests/testsuite/openapi.rs` checks that the routes and the document agree, and `scripts/fuzz.sh`
//! fuzzes the service against this document with schemathesis.

use axum::Router;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_swagger_ui::SwaggerUi;

use crate::openapi_extra::{IpAddresses, Links, Unsigned};
use crate::state::AppState;

/// `/openapi.json` and `/docs`, serving `doc` (the paths of the routes, from
/// `OpenApiRouter::split_for_parts`) completed by [`finish`].
pub fn router(doc: utoipa::openapi::OpenApi) -> Router<AppState> {
    SwaggerUi::new("/docs")
        .url("/openapi.json", finish(doc))
        .into()
}

/// The document's steps that need its paths: the common error answers and bearer scheme,
/// then the `u64` ranges, the `{ip}` parameters and the links.
pub fn finish(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let steps: [&dyn Modify; 4] = [&Common, &Unsigned, &IpAddresses, &Links];
    for step in steps {
        step.modify(&mut doc);
    }
    doc
}

/// Every error answer: RFC 9457 Problem Details (`application/problem+json`), with the
/// extension members `code` and `message` of the API's first error shape.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Error {
    /// A stable URI per code: `https://flashsale.dev/problems/<code in kebab case>`.
    #[schema(
        rename = "type",
        format = "uri",
        example = "https://flashsale.dev/problems/sold-out"
    )]
    kind: String,
    /// A short summary of the problem type; the same for every answer of a code.
    #[schema(example = "Sold out")]
    title: String,
    /// The answer's HTTP status.
    #[schema(minimum = 400, maximum = 599, example = 409)]
    status: u16,
    /// What went wrong with this request.
    detail: String,
    #[schema(example = "SOLD_OUT")]
    code: ErrorCodeSchema,
    /// The same text as `detail`.
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
    RiskDenied,
    SaleNotFound,
    OrderNotFound,
    RouteNotFound,
    MethodNotAllowed,
    IdempotencyKeyReused,
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

/// What the shop's risk service receives (`POST` to `FLASHSALE_RISK_URL`, JSON) before each
/// purchase reaches the hot ledger: the contract a shop implements, not an operation of this
/// API.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct RiskCheckRequest {
    sku_id: u64,
    user_id: u64,
    #[schema(minimum = 1, maximum = 1_000)]
    quantity: u32,
    /// The buyer's request id: the same on every retry of one purchase attempt.
    request_id: String,
    /// The buyer's address as the gateway sees it; `null` when unknown.
    client_ip: Option<String>,
}

/// What the shop's risk service answers (2xx, JSON, at most 4 KiB). `allow: false` refuses the
/// purchase with 403 `RISK_DENIED` and the reason. Any other answer, or none within
/// `FLASHSALE_RISK_TIMEOUT_MS`, leaves the decision to the fallback rule.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct RiskCheckAnswer {
    allow: bool,
    /// Shown to the buyer in the refusal's message (first 200 characters).
    reason: Option<String>,
}

/// Body of a purchase.
#[derive(ToSchema)]
#[allow(dead_code)]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurchaseBody {
    /// Chosen by the client, one per attempt, reused on retry. Required unless the
    /// `Idempotency-Key` header carries it (both: they must be equal).
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_-]{1,64}$")]
    request_id: Option<String>,
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
    info(
        title = "flashsale",
        description = "Flash-sale inventory service. Errors are RFC 9457 Problem Details (`application/problem+json`: `type`, `title`, `status`, `detail`, plus `code` and `message`); 429 and 503 carry `Retry-After`. With `FLASHSALE_RISK_URL` set, each purchase is first checked by the shop's risk service: schemas `RiskCheckRequest` (what it receives) and `RiskCheckAnswer` (what it answers)."
    ),
    components(schemas(
        Error,
        CreateSale,
        SaleView,
        PurchaseBody,
        OrderView,
        Health,
        Ready,
        RiskCheckRequest,
        RiskCheckAnswer,
    ))
)]
/// The document's head and the schemas of this module; the paths, and the schemas of the
/// gateway's answers, come from the routes ([`crate::app`]).
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
        ("403", "not allowed (FORBIDDEN, BLACKLISTED, RISK_DENIED)"),
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
                            crate::error::PROBLEM_JSON,
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
