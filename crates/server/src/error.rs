//! `AppError`: every error answer, as `{"code": "...", "message": "..."}` with the code's status.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashsale_core::{ErrorCode, LedgerError, StoreError};
use serde::Serialize;

/// An error answer. Built from a code; 5xx only for `UNAVAILABLE` and true internal faults.
#[derive(Debug)]
pub struct AppError {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds, sent as `Retry-After` (429, 503).
    pub retry_after_s: Option<u32>,
}

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    message: &'a str,
}

impl AppError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> AppError {
        let retry_after_s = match code {
            ErrorCode::RateLimited | ErrorCode::Busy | ErrorCode::Unavailable => Some(1),
            _ => None,
        };
        AppError {
            code,
            message: message.into(),
            retry_after_s,
        }
    }

    pub fn invalid(message: impl Into<String>) -> AppError {
        AppError::new(ErrorCode::InvalidRequest, message)
    }

    /// The default message of a code, for rejections a ledger answers.
    pub fn from_code(code: ErrorCode) -> AppError {
        let message = match code {
            ErrorCode::SoldOut => "the sale is sold out",
            ErrorCode::LimitExceeded => "this would exceed the per-user limit",
            ErrorCode::NotStarted => "the sale has not started",
            ErrorCode::Ended => "the sale has ended",
            ErrorCode::Paused => "the sale is paused",
            ErrorCode::HoldExpired => "the reservation's payment time has passed",
            ErrorCode::AlreadyResolved => "the order is already resolved",
            ErrorCode::OrderNotFound => "no such order",
            ErrorCode::SaleNotFound => "no such sale",
            ErrorCode::InvalidRequest => "invalid request",
            _ => code.as_str(),
        };
        AppError::new(code, message)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = Body {
            code: self.code.as_str(),
            message: &self.message,
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

impl From<LedgerError> for AppError {
    fn from(e: LedgerError) -> AppError {
        match e {
            LedgerError::Unavailable(m) | LedgerError::Unconfirmed { why: m, .. } => {
                AppError::new(ErrorCode::Unavailable, m)
            }
            LedgerError::Busy => AppError::new(ErrorCode::Busy, "the sale's queue is full; retry"),
            LedgerError::NotWarmed => {
                AppError::new(ErrorCode::NotStarted, "the sale is not open yet")
            }
            LedgerError::AlreadyWarm => AppError::new(
                ErrorCode::SaleExists,
                "the sale is already warm and has sold units; pass ?force=true to rebuild it",
            ),
            LedgerError::Internal(m) => internal(m),
        }
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> AppError {
        match e {
            StoreError::SaleExists => {
                AppError::new(ErrorCode::SaleExists, "a sale for this sku exists")
            }
            StoreError::SaleNotFound => AppError::from_code(ErrorCode::SaleNotFound),
            StoreError::Unavailable(m) => AppError::new(ErrorCode::Unavailable, m),
            other => internal(other.to_string()),
        }
    }
}

fn internal(message: String) -> AppError {
    tracing::error!(%message, "internal error");
    AppError::new(ErrorCode::Internal, "internal error")
}

impl From<JsonRejection> for AppError {
    fn from(r: JsonRejection) -> AppError {
        match r {
            JsonRejection::BytesRejection(_) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                AppError::new(ErrorCode::PayloadTooLarge, "request body too large")
            }
            other => AppError::invalid(other.body_text()),
        }
    }
}

impl From<PathRejection> for AppError {
    fn from(r: PathRejection) -> AppError {
        AppError::invalid(r.body_text())
    }
}

impl From<QueryRejection> for AppError {
    fn from(r: QueryRejection) -> AppError {
        AppError::invalid(r.body_text())
    }
}
