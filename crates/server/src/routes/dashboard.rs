//! The dashboard's routes (its parts are in [`crate::dashboard`]): the page at `/` and the JSON it polls, computed from the shared
//! state (the stores, the gateway's gates and the process's own metrics).

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use flashsale_core::clock::now_ms;
use flashsale_core::ledger::StoredSale;
use flashsale_core::{Counters, SaleState, SkuId};

use crate::auth::Admin;
use crate::dashboard::history::HistorySeries;
use crate::dashboard::prom::{self, Sample};
use crate::dashboard::view::{
    verdict, AdminView, PublicView, SaleCard, SaleOps, SALES_SHOWN_MAX, SERIES_S,
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
    let mut sales = Vec::new();
    for stored in shown_sales(st).await? {
        sales.push(card(st, &stored).await);
    }
    Ok(PublicView {
        at_ms: now_ms(),
        sales,
    })
}

/// The admin view: the public one plus what the process knows of each sale.
pub async fn admin(st: &AppState) -> Result<AdminView, AppError> {
    let samples = prom::parse(&st.metrics.render());
    let mut sales = Vec::new();
    for stored in shown_sales(st).await? {
        let card = card(st, &stored).await;
        sales.push(sale_ops(st, card, &samples).await);
    }
    Ok(AdminView {
        at_ms: now_ms(),
        ledger: st.ledger.kind(),
        breaker_open: st.breaker.any_open(),
        risk_breaker_open: st.risk.enabled().then(|| st.risk.breaker_open()),
        open_connections: prom::value(&samples, "flashsale_open_connections", "", ""),
        scripts: st.dashboard.scripts.latency(&samples),
        sales,
    })
}

async fn shown_sales(st: &AppState) -> Result<Vec<StoredSale>, AppError> {
    let mut sales = st.store.sales().await?;
    let rank = |s: &SaleState| match s {
        SaleState::Live => 0,
        SaleState::Paused => 1,
        SaleState::Scheduled => 2,
        SaleState::Ended => 3,
    };
    sales.sort_by_key(|s| (rank(&s.sale.state), std::cmp::Reverse(s.sale.sku_id.0)));
    sales.truncate(SALES_SHOWN_MAX);
    Ok(sales)
}

/// A queue sale's counts (`None` for other sales, or when the admission state does not answer).
async fn queue_tile(
    st: &AppState,
    stored: &StoredSale,
) -> Option<crate::dashboard::view::QueueTile> {
    if stored.sale.admission.mode != flashsale_core::AdmissionMode::Queue {
        return None;
    }
    let book = st.admission.as_ref()?.book();
    let counts = book.counts(stored.sale.sku_id, 0).await.ok()?;
    Some(crate::dashboard::view::QueueTile {
        queue_length: counts.queued(),
        admitted: counts.cursor,
        bought: counts.bought,
    })
}

/// Hot counters when the ledger has the sale (fresher: the database lags the persister); a
/// bucketed sale's buckets likewise.
async fn card(st: &AppState, stored: &StoredSale) -> SaleCard {
    let sku = stored.sale.sku_id;
    let hot = match stored.sale.state {
        SaleState::Scheduled => None,
        _ => st.ledger.counters(sku).await.ok().flatten(),
    };
    let c: Counters = hot.unwrap_or(stored.counters);
    SaleCard {
        sku_id: sku.0,
        name: stored.sale.name.clone(),
        state: stored.sale.state,
        mode: stored.sale.mode.as_str().to_owned(),
        buckets: stored.sale.buckets,
        admission: stored.sale.admission.mode.as_str().to_owned(),
        queue: queue_tile(st, stored).await,
        total: c.total,
        available: c.available,
        reserved: c.reserved,
        sold: c.sold,
        per_bucket: st
            .buckets
            .read(st.ledger.as_ref(), st.store.as_ref(), stored)
            .await,
    }
}

async fn sale_ops(st: &AppState, card: SaleCard, samples: &[Sample]) -> SaleOps {
    let sku = SkuId(card.sku_id);
    let label = sku.0.to_string();
    let gate = st.gateway.gates.all().into_iter().find(|g| g.sku == sku);
    let per_sku = |name: &str| prom::value(samples, name, "sku", &label);
    let run = st.store.reconcile_runs(Some(sku), 1).await.ok();
    SaleOps {
        answers: st.dashboard.live.series(sku, SERIES_S),
        stream_lag_events: per_sku("flashsale_stream_lag_events"),
        backlog: gate
            .as_ref()
            .map_or(0, |g| g.backlog.load(std::sync::atomic::Ordering::Relaxed)),
        backpressure: gate.as_ref().is_some_and(|g| g.is_busy()),
        // A request key is always `user:request_id`, so the empty key is never an accepted
        // retry: `answers` is then true exactly while the sale's flag is set.
        sold_out_flag: st.sold_out.is_set(sku),
        db_guard_rejections: per_sku("flashsale_db_guard_rejections_total").unwrap_or(0.0),
        dead_letters: per_sku("flashsale_dead_letters_total").unwrap_or(0.0),
        reconcile: run.and_then(|r| r.into_iter().next()).map(verdict),
        card,
    }
}
