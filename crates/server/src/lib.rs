//! flashsale-server: the HTTP service over the engine (`flashsale-engine`).
//!
//! - [`app`]: the axum router, built apart from `main` so tests call it. Every route is
//!   declared once, by its handler's `#[utoipa::path]`, and routed with `utoipa-axum`.
//! - [`routes`]: every handler (`sales`, `purchases`, `orders`, `health`, `dashboard`, and
//!   `admin::{events, gateway, risk, reconcile}`) and the API's extractors (`ApiPath`, `ApiJson`,
//!   `User`, `Admin`).
//! - [`middleware`]: the layers that hand the gateway its parts of the state;
//!   [`workers`]: the server's own periodic work (the gateway's).
//! - [`auth`]: user tokens and the admin token; [`token_cache`]: tokens verified before, by
//!   their bytes; [`identity`]: an external identity provider's key set (JWKS) and the
//!   RS256, ES256 and EdDSA tokens it signs.
//! - [`error`]: `AppError`, the one error answer.
//! - [`gateway`]: protections in front of the handlers (`caps`, `ratelimit`, `blacklist`,
//!   `pressure`, `scalping`, `idempotency`, `listener`) and its `config`.
//! - [`risk`]: the shop's risk service in the purchase path: its client (bounded, with a
//!   breaker and a fallback rule), the replays that skip it, and `gate`: the client as the
//!   engine's `RiskGate`.
//! - [`state`]: `AppState`, what every handler shares; [`tunables`]: the request path's
//!   bounds and timings, with their defaults.
//! - [`serve`]: `Config` → backends (opened once), workers, listener; graceful shutdown.
//! - [`metrics`]: the Prometheus recorder; [`metrics_help`]: the HELP text of every metric;
//!   [`hot_metrics`]: the request path's metric handles, resolved once per thread.
//! - [`bucket_view`]: a bucketed sale's per-bucket counters as JSON (the engine reads them).
//! - [`sale_views`]: each sale's public view as last answered, rendered (the stock read).
//! - [`dashboard`]: what the live page keeps between requests (`live`, `prom`, `view`).
//! - [`openapi`]: the document's head and schemas; [`openapi_extra`]: `u64` ranges, `{ip}`
//!   parameters and links in it.
//!
//! Inside the crate, dependencies point one way: `state` holds the engine's `Shop` (every use
//! case) and the HTTP side's parts (auth, gateway, risk client, dashboard readings) and
//! depends on their modules; `routes`, `middleware`, `workers`, `serve` and
//! `openapi` depend on `state`; no module that `state` holds imports `state`, `routes`,
//! `middleware`, `workers` or `serve` (the layering check in `crates/layering` reads it from the code).
//!
//! May depend on every backend crate and the engine; the domain rules stay in flashsale-core.
//! Only the binary (flashsale) and tests depend on it.

pub mod auth;
pub mod bucket_view;
pub mod dashboard;
pub mod error;
pub mod gateway;
pub mod hot_metrics;
pub mod identity;
pub mod metrics;
pub mod metrics_help;
pub mod middleware;
pub mod openapi;
pub mod openapi_extra;
pub mod risk;
pub mod routes;
pub mod sale_views;
pub mod serve;
pub mod state;
pub mod token_cache;
pub mod tunables;
pub mod workers;

use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::Router;
use flashsale_core::ErrorCode;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use routes::v1;

pub use error::AppError;
pub use serve::{Config, Server};
pub use state::AppState;
pub use tunables::Tunables;

/// The whole HTTP API. Each route is declared once, by its handler's `#[utoipa::path]`:
/// `routes!` routes it and puts it in the OpenAPI document.
pub fn app(state: AppState) -> Router {
    use routes::health;
    let (router, doc) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(api())
        .routes(routes!(routes::dashboard::page))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .split_for_parts();
    router
        .merge(openapi::router(doc))
        .fallback(|| async { AppError::new(ErrorCode::RouteNotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            AppError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this route",
            )
        })
        .layer(from_fn_with_state(state.clone(), middleware::rate_headers))
        .layer(DefaultBodyLimit::max(state.tunables.body_bytes_max))
        .layer(from_fn_with_state(state.clone(), middleware::caps))
        .layer(from_fn_with_state(
            state.clone(),
            middleware::count_requests,
        ))
        .with_state(state)
}

/// The routes under `/api/v1` (each with the prefix written in: [`routes::v1`]).
fn api() -> OpenApiRouter<AppState> {
    use routes::admin::reconcile as reconcile_routes;
    use routes::{admission, orders, purchases, sales};
    OpenApiRouter::new()
        .routes(v1(routes!(sales::create)))
        .routes(v1(routes!(sales::get)))
        .routes(v1(routes!(sales::warm)))
        .routes(v1(routes!(sales::pause)))
        .routes(v1(routes!(sales::resume)))
        .routes(v1(routes!(sales::end)))
        .routes(v1(routes!(purchases::purchase)))
        .routes(v1(routes!(admission::join)))
        .routes(v1(routes!(admission::me)))
        .routes(v1(routes!(admission::events)))
        .routes(v1(routes!(admission::enter)))
        .routes(v1(routes!(admission::my_entry)))
        .routes(v1(routes!(admission::draw)))
        .routes(v1(routes!(orders::get)))
        .routes(v1(routes!(orders::pay)))
        .routes(v1(routes!(orders::cancel)))
        .routes(v1(routes!(routes::dashboard::public_route)))
        .routes(v1(routes!(routes::dashboard::admin_route)))
        .routes(v1(routes!(routes::dashboard::history_route)))
        .routes(v1(routes!(routes::dashboard::admin_history_route)))
        .routes(v1(routes!(reconcile_routes::report_route)))
        .routes(v1(routes!(reconcile_routes::repair_route)))
        .merge(routes::admin::gateway::router())
        .merge(routes::admin::risk::router())
        .merge(routes::admin::events::router())
}
