//! OpenAPI 3 description of the HTTP API at `/openapi.json`, Swagger UI at `/docs` (vendored:
//! nothing is downloaded at build time). Each handler carries its own `#[utoipa::path]` and
//! [`crate::app`] routes it with `utoipa-axum`'s `routes!`, so the document's paths are the
//! router's; this module holds what is common to them: the document's head, the list of the
//! bodies' schemas (derived on the real types), the error answers every
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
    code: flashsale_core::ErrorCode,
    /// The same text as `detail`.
    message: String,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flashsale",
        description = "Flash-sale inventory service. Errors are RFC 9457 Problem Details (`application/problem+json`: `type`, `title`, `status`, `detail`, plus `code` and `message`); 429 and 503 carry `Retry-After`. With `FLASHSALE_RISK_URL` set, each purchase is first checked by the shop's risk service: schemas `RiskCheckRequest` (what it receives) and `RiskCheckAnswer` (what it answers)."
    ),
    components(schemas(
        Error,
        crate::routes::sales::CreateSale,
        crate::routes::sales::SaleView,
        crate::bucket_view::BucketCounters,
        crate::bucket_view::BucketSource,
        crate::routes::purchases::PurchaseBody,
        crate::routes::OrderView,
        crate::routes::health::Health,
        crate::routes::health::Ready,
        crate::risk::RiskQuery,
        crate::risk::Answer,
    ))
)]
/// The document's head and the schemas of the API's bodies (derived on the types the handlers
/// use; core's enums derive theirs under its `openapi` feature); the paths, and the schemas of
/// the gateway's answers, come from the routes ([`crate::app`]).
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
