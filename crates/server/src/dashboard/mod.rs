//! The live dashboard: the page at `/` (one HTML answer with its CSS, its JS and the vendored
//! uPlot chart library inlined, all compiled into the binary: it works with no network), and
//! the JSON it polls every second.
//!
//! - `GET /api/v1/dashboard`: public: every sale, its state and stock ([`view::public`]).
//! - `GET /api/v1/admin/dashboard`: admin: per sale answers per second, latency, stream lag,
//!   backlog, flags and the last reconciliation; breaker and script latency ([`view::admin`]).
//! - [`live`]: per-sale answers and latency of this instance, fed by the purchase handler.
//! - [`prom`]: reads back the numbers the process's Prometheus recorder exports.

pub mod live;
pub mod prom;
pub mod view;

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

use crate::auth::Admin;
use crate::error::AppError;
use crate::state::AppState;

/// One self-contained answer, so the page needs no other route (and no document entry).
const PAGE: &str = concat!(
    include_str!("assets/head.html"),
    "<style>",
    include_str!("assets/uPlot.min.css"),
    include_str!("assets/app.css"),
    "</style></head>",
    include_str!("assets/body.html"),
    "<script>",
    include_str!("assets/uPlot.iife.min.js"),
    "</script><script>",
    include_str!("assets/app.js"),
    "</script></body></html>\n",
);

/// What the dashboard keeps between requests.
#[derive(Default)]
pub struct Dashboard {
    pub live: live::Live,
    pub scripts: view::ScriptReadings,
    /// The last public view and when it was made: anyone may poll it, during a sale too, so
    /// it is computed at most once per [`PUBLIC_TTL`] whatever the number of pages open.
    public: tokio::sync::Mutex<Option<(Instant, view::PublicView)>>,
}

/// How long one public view is served (the page polls once a second).
const PUBLIC_TTL: Duration = Duration::from_millis(500);

impl Dashboard {
    /// The public view, fresh or at most [`PUBLIC_TTL`] old; one caller computes it while the
    /// others wait for that result.
    async fn public(&self, st: &AppState) -> Result<view::PublicView, AppError> {
        let mut cached = self.public.lock().await;
        if let Some((at, v)) = cached.as_ref() {
            if at.elapsed() < PUBLIC_TTL {
                return Ok(v.clone());
            }
        }
        let fresh = view::public(st).await?;
        *cached = Some((Instant::now(), fresh.clone()));
        Ok(fresh)
    }
}

#[utoipa::path(get, path = "/", tag = "ops", operation_id = "dashboard", responses((status = 200, description = "the dashboard", content_type = "text/html", body = String)))]
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}

// `GET /api/v1/dashboard`.
#[utoipa::path(get, path = "/dashboard", tag = "ops", operation_id = "public_dashboard",
    responses((status = 200, description = "every sale (live first, at most 50) with its state and stock")))]
pub async fn public_route(State(st): State<AppState>) -> Result<Json<view::PublicView>, AppError> {
    st.dashboard.public(&st).await.map(Json)
}

// `GET /api/v1/admin/dashboard`.
#[utoipa::path(get, path = "/admin/dashboard", tag = "admin", operation_id = "admin_dashboard", security(("bearer" = [])),
    responses((status = 200, description = "per sale: answers per second and latency (last 60 s), stream lag, backlog, sold-out and back-pressure flags, last reconciliation; breaker, script latency")))]
pub async fn admin_route(
    State(st): State<AppState>,
    _: Admin,
) -> Result<Json<view::AdminView>, AppError> {
    view::admin(&st).await.map(Json)
}
