//! Liveness, readiness and metrics: routed in the API by `crate::app`, and on their own by
//! [`router`] for a process without the API (`flashsale worker`), so both answer alike.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use flashsale_core::{ErrorCode, Ledger, OrderStore};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::AppError;
use crate::state::AppState;

/// What these handlers read: the process's hot ledger, system of record and metrics.
#[derive(Clone)]
pub struct Probes {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub metrics: PrometheusHandle,
}

impl FromRef<AppState> for Probes {
    fn from_ref(st: &AppState) -> Probes {
        Probes {
            ledger: st.ledger.clone(),
            store: st.store.clone(),
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

/// How long readiness waits for each dependency.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

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
    let ledger = tokio::time::timeout(PING_TIMEOUT, st.ledger.ping()).await;
    let store = tokio::time::timeout(PING_TIMEOUT, st.store.ping()).await;
    let ledger_ok = matches!(ledger, Ok(Ok(())));
    let store_ok = matches!(store, Ok(Ok(())));
    let word = |ok: bool| if ok { "ok" } else { "unreachable" };
    let body = Ready {
        ledger: word(ledger_ok),
        database: word(store_ok),
        ledger_kind: st.ledger.kind(),
    };
    let status = if ledger_ok && store_ok {
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
