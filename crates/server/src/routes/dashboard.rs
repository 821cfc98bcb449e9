//! The dashboard's routes (its parts are in [`crate::dashboard`]): the page at `/` and the JSON it polls, computed from the
//! shop's readings, the gateway's gates and the process's own metrics.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use flashsale_core::clock::now_ms;
use flashsale_core::SkuId;
use flashsale_engine::shop::SaleReading;

use crate::auth::Admin;
use crate::dashboard::history::HistorySeries;
use crate::dashboard::prom::{self, Sample};
use crate::dashboard::view::{
    verdict, AdminView, PublicView, QueueTile, SaleCard, SaleOps, SALES_SHOWN_MAX, SERIES_S,
};
use crate::error::AppError;
use crate::state::AppState;

/// One self-contained answer, so the page needs no other route (and no document entry).
const PAGE: &str = concat!(
    include_str!("../dashboard/assets/head.html"),
    "<style>",
    include_str!("../dashboard/assets/uPlot.min.css"),
    include_str!("../dashboard/assets/app.css"),
    "</style></head>",
    include_str!("../dashboard/assets/body.html"),
    "<script>",
    include_str!("../dashboard/assets/uPlot.iife.min.js"),
    "</script><script>",
    include_str!("../dashboard/assets/app.js"),
    "</script></body></html>\n",
);

/// How long one public view is served (the page polls once a second).
const PUBLIC_TTL: Duration = Duration::from_millis(500);

/// The public view, fresh or at most [`PUBLIC_TTL`] old; one caller computes it while the
/// others wait for that result.
async fn cached_public(st: &AppState) -> Result<PublicView, AppError> {
    let mut cached = st.dashboard.public.lock().await;
    if let Some((at, v)) = cached.as_ref() {
        if at.elapsed() < PUBLIC_TTL {
            return Ok(v.clone());
        }
    }
    let fresh = public(st).await?;
    *cached = Some((Instant::now(), fresh.clone()));
    Ok(fresh)
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
    responses((status = 200, description = "every sale (live first, at most 50) with its state and stock, and a bucketed sale's per-bucket counters when the hot ledger or the database has them")))]
pub async fn public_route(State(st): State<AppState>) -> Result<Json<PublicView>, AppError> {
    cached_public(&st).await.map(Json)
}

// `GET /api/v1/admin/dashboard`.
#[utoipa::path(get, path = "/admin/dashboard", tag = "admin", operation_id = "admin_dashboard", security(("bearer" = [])),
    responses((status = 200, description = "per sale: answers per second and latency (last 60 s), stream lag, backlog, sold-out and back-pressure flags, last reconciliation; breaker, script latency")))]
pub async fn admin_route(
    State(st): State<AppState>,
    _: Admin,
) -> Result<Json<AdminView>, AppError> {
    admin(&st).await.map(Json)
}

// `GET /api/v1/dashboard/history/{sku_id}`.
#[utoipa::path(get, path = "/dashboard/history/{sku_id}", tag = "ops", operation_id = "dashboard_history",
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the sale's series from its first sample (one a second, merged in pairs when the ring is full: `step_s`): stock, and a queue's length, admitted, waiting, admission rate and ETA, or a draw's waitlist position")))]
pub async fn history_route(
    State(st): State<AppState>,
    super::ApiPath(p): super::ApiPath<u64>,
) -> Json<HistorySeries> {
    Json(st.dashboard.history.series(SkuId(p), false))
}

// `GET /api/v1/admin/dashboard/history/{sku_id}`.
#[utoipa::path(get, path = "/admin/dashboard/history/{sku_id}", tag = "admin", operation_id = "admin_dashboard_history", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0)),
    responses((status = 200, description = "the public history plus answers per second, latency and backlog")))]
pub async fn admin_history_route(
    State(st): State<AppState>,
    _: Admin,
    super::ApiPath(p): super::ApiPath<u64>,
) -> Json<HistorySeries> {
    Json(st.dashboard.history.series(SkuId(p), true))
}

/// The public view: every sale (up to a bound) with its stock.
pub async fn public(st: &AppState) -> Result<PublicView, AppError> {
    let sales = st.shop.sale_readings(SALES_SHOWN_MAX).await?;
    Ok(PublicView {
        at_ms: now_ms(),
        sales: sales.into_iter().map(card).collect(),
    })
}

/// The admin view: the public one plus what the process knows of each sale.
pub async fn admin(st: &AppState) -> Result<AdminView, AppError> {
    let samples = prom::parse(&st.metrics.render());
    let mut sales = Vec::new();
    for reading in st.shop.sale_readings(SALES_SHOWN_MAX).await? {
        sales.push(sale_ops(st, card(reading), &samples).await);
    }
    Ok(AdminView {
        at_ms: now_ms(),
        ledger: st.shop.ledger_kind(),
        breaker_open: st.shop.breaker_open(),
        risk_breaker_open: st.risk.enabled().then(|| st.risk.breaker_open()),
        open_connections: prom::value(&samples, "flashsale_open_connections", "", ""),
        scripts: st.dashboard.scripts.latency(&samples),
        sales,
    })
}

/// A sale's tile: its stock (hot when the ledger has it), a queue sale's counts, a bucketed
/// sale's buckets.
fn card(r: SaleReading) -> SaleCard {
    let (sale, c) = (r.stored.sale, r.counters);
    SaleCard {
        sku_id: sale.sku_id.0,
        name: sale.name.clone(),
        state: sale.state,
        mode: sale.mode.as_str().to_owned(),
        buckets: sale.buckets,
        admission: sale.admission.mode.as_str().to_owned(),
        queue: r.queue.map(|counts| QueueTile {
            queue_length: counts.queued(),
            admitted: counts.cursor,
            bought: counts.bought,
        }),
        total: c.total,
        available: c.available,
        reserved: c.reserved,
        sold: c.sold,
        per_bucket: (&r.buckets).into(),
    }
}

async fn sale_ops(st: &AppState, card: SaleCard, samples: &[Sample]) -> SaleOps {
    let sku = SkuId(card.sku_id);
    let label = sku.0.to_string();
    let gate = st.gateway.gates.all().into_iter().find(|g| g.sku == sku);
    let per_sku = |name: &str| prom::value(samples, name, "sku", &label);
    SaleOps {
        answers: st.dashboard.live.series(sku, SERIES_S),
        stream_lag_events: per_sku("flashsale_stream_lag_events"),
        backlog: gate
            .as_ref()
            .map_or(0, |g| g.backlog.load(std::sync::atomic::Ordering::Relaxed)),
        backpressure: gate.as_ref().is_some_and(|g| g.is_busy()),
        sold_out_flag: st.shop.sold_out_flag(sku),
        db_guard_rejections: per_sku("flashsale_db_guard_rejections_total").unwrap_or(0.0),
        dead_letters: per_sku("flashsale_dead_letters_total").unwrap_or(0.0),
        reconcile: st.shop.last_reconcile_run(sku).await.map(verdict),
        card,
    }
}
