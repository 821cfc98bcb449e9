//! Liveness, readiness and metrics: routed in the API by `crate::app`, and on their own by
//! [`router`] for a process without the API (`flashsale worker`), so both answer alike.

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use flashsale_core::ErrorCode;
use flashsale_engine::shop::Shop;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::AppError;
use crate::state::AppState;

/// What these handlers read: the process's shop (its backends' readiness) and metrics.
#[derive(Clone)]
pub struct Probes {
    pub shop: Arc<Shop>,
    pub metrics: PrometheusHandle,
}

impl FromRef<AppState> for Probes {
    fn from_ref(st: &AppState) -> Probes {
        Probes {
            shop: st.shop.clone(),
            metrics: st.metrics.clone(),
        }
    }
}

/// `/healthz`, `/readyz` and `/metrics` alone; any other path is 404 in the API's error shape.
pub fn router(probes: Probes) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { AppError::new(ErrorCode::RouteNotFound, "no such route") })
        .with_state(probes)
}

/// The liveness answer.
#[derive(Serialize, ToSchema)]
pub struct Health {
    status: &'static str,
}

/// The readiness answer: each dependency `ok` or `unreachable`, and the ledger's kind.
#[derive(Serialize, ToSchema)]
pub struct Ready {
    ledger: &'static str,
    database: &'static str,
    ledger_kind: &'static str,
}

#[utoipa::path(get, path = "/healthz", tag = "ops", operation_id = "healthz", responses((status = 200, description = "alive", body = Health)))]
pub async fn healthz() -> impl IntoResponse {
    Json(Health { status: "ok" })
}

// Ready only while both the hot ledger and the database answer.
#[utoipa::path(get, path = "/readyz", tag = "ops", operation_id = "readyz", responses(
    (status = 200, description = "ledger and database answer", body = Ready),
    (status = 503, description = "a dependency does not answer", body = Ready)))]
pub async fn readyz(State(st): State<Probes>) -> impl IntoResponse {
    let r = st.shop.readiness().await;
    let word = |ok: bool| if ok { "ok" } else { "unreachable" };
    let body = Ready {
        ledger: word(r.ledger),
        database: word(r.store),
        ledger_kind: r.ledger_kind,
    };
    let status = if r.ledger && r.store {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

#[utoipa::path(get, path = "/metrics", tag = "ops", operation_id = "metrics", responses((status = 200, description = "Prometheus text", content_type = "text/plain", body = String)))]
pub async fn metrics(State(st): State<Probes>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
}
