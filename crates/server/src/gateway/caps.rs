//! A limit on everything a request can make us hold: header count and size, requests in
//! flight, and time. Each answer is in our error shape (Problem Details, `AppError`), never an empty
//! body. Body size is axum's `DefaultBodyLimit` (413 PAYLOAD_TOO_LARGE); quantities and id
//! lengths are checked by the handlers.

use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use flashsale_core::ErrorCode;

use super::Gateway;
use crate::error::AppError;

pub use flashsale_core::metric_names::{SHED, TIMEOUTS};

/// Outermost layer: headers, in-flight cap, request timeout (`middleware::caps` installs it).
pub async fn enforce(gateway: &Gateway, timeout: Duration, req: Request, next: Next) -> Response {
    let c = &gateway.config;
    let headers = req.headers();
    if headers.len() > c.headers_max {
        return AppError::invalid(format!("too many headers (at most {})", c.headers_max))
            .into_response();
    }
    let bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if bytes > c.header_bytes_max {
        return AppError::invalid(format!(
            "request headers too large (at most {} bytes)",
            c.header_bytes_max
        ))
        .into_response();
    }
    let Ok(_permit) = gateway.inflight.clone().try_acquire_owned() else {
        metrics::counter!(SHED).increment(1);
        return AppError::new(
            ErrorCode::Unavailable,
            "too many requests in flight on this instance; retry shortly",
        )
        .into_response();
    };
    // A purchase cut short here still completes in the ledger (the batcher owns it); the
    // client's retry with the same request_id gets its first outcome.
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            metrics::counter!(TIMEOUTS).increment(1);
            AppError::new(
                ErrorCode::Unavailable,
                "the request timed out; retry with the same request_id",
            )
            .into_response()
        }
    }
}
