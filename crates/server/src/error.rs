//! `AppError`: every error answer, an RFC 9457 Problem Details object
//! (`application/problem+json`): `type` (a stable URI per code, [`problem_type`]), `title`,
//! `status`, `detail`, and the extension members `code` and `message` that clients read
//! before Problem Details (the same strings as `title`'s code and `detail`).

use std::borrow::Cow;
use std::sync::LazyLock;

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use flashsale_core::{ErrorCode, LedgerError, StoreError};
use serde::Serialize;

/// The media type of every error answer (RFC 9457 §3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Where the problem types live: `<base><code in kebab case>`, e.g. `…/problems/sold-out`.
pub const PROBLEM_BASE: &str = "https://flashsale.dev/problems/";

/// An error answer. Built from a code; 5xx only for `UNAVAILABLE` and true internal faults.
#[derive(Debug)]
pub struct AppError {
    pub code: ErrorCode,
    /// A literal for the refusals a spike repeats (no copy per answer), else the text made.
    pub message: Cow<'static, str>,
    /// Seconds, sent as `Retry-After` (429, 503).
    pub retry_after_s: Option<u32>,
}

/// The Problem Details body. `code` and `message` are extension members (RFC 9457 §3.2) kept
/// so that clients written against `{"code","message"}` keep working.
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    code: &'a str,
    message: &'a str,
}

/// The problem type URI of a code: stable, one per code (the list is in docs/DESIGN.md).
/// Literals rather than a format at each answer: a sold-out spike answers it 90,000 times.
pub fn problem_type(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InvalidRequest => "https://flashsale.dev/problems/invalid-request",
        ErrorCode::Unauthorized => "https://flashsale.dev/problems/unauthorized",
        ErrorCode::Forbidden => "https://flashsale.dev/problems/forbidden",
        ErrorCode::Blacklisted => "https://flashsale.dev/problems/blacklisted",
        ErrorCode::RiskDenied => "https://flashsale.dev/problems/risk-denied",
        ErrorCode::AdmissionRequired => "https://flashsale.dev/problems/admission-required",
        ErrorCode::SaleNotFound => "https://flashsale.dev/problems/sale-not-found",
        ErrorCode::OrderNotFound => "https://flashsale.dev/problems/order-not-found",
        ErrorCode::RouteNotFound => "https://flashsale.dev/problems/route-not-found",
        ErrorCode::MethodNotAllowed => "https://flashsale.dev/problems/method-not-allowed",
        ErrorCode::IdempotencyKeyReused => "https://flashsale.dev/problems/idempotency-key-reused",
        ErrorCode::SaleExists => "https://flashsale.dev/problems/sale-exists",
        ErrorCode::SoldOut => "https://flashsale.dev/problems/sold-out",
        ErrorCode::LimitExceeded => "https://flashsale.dev/problems/limit-exceeded",
        ErrorCode::NotStarted => "https://flashsale.dev/problems/not-started",
        ErrorCode::Ended => "https://flashsale.dev/problems/ended",
        ErrorCode::Paused => "https://flashsale.dev/problems/paused",
        ErrorCode::HoldExpired => "https://flashsale.dev/problems/hold-expired",
        ErrorCode::AlreadyResolved => "https://flashsale.dev/problems/already-resolved",
        ErrorCode::PayloadTooLarge => "https://flashsale.dev/problems/payload-too-large",
        ErrorCode::RateLimited => "https://flashsale.dev/problems/rate-limited",
        ErrorCode::Busy => "https://flashsale.dev/problems/busy",
        ErrorCode::Unavailable => "https://flashsale.dev/problems/unavailable",
        ErrorCode::Internal => "https://flashsale.dev/problems/internal",
    }
}

/// The short, occurrence-independent summary of a code (RFC 9457 `title`).
pub fn problem_title(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InvalidRequest => "Invalid request",
        ErrorCode::Unauthorized => "Unauthorized",
        ErrorCode::Forbidden => "Forbidden",
        ErrorCode::Blacklisted => "Blacklisted",
        ErrorCode::RiskDenied => "Refused by the risk check",
        ErrorCode::AdmissionRequired => "Admission pass required",
        ErrorCode::SaleNotFound => "Sale not found",
        ErrorCode::OrderNotFound => "Order not found",
        ErrorCode::RouteNotFound => "Route not found",
        ErrorCode::MethodNotAllowed => "Method not allowed",
        ErrorCode::IdempotencyKeyReused => "Idempotency key reused",
        ErrorCode::SaleExists => "Sale exists",
        ErrorCode::SoldOut => "Sold out",
        ErrorCode::LimitExceeded => "Per-user limit exceeded",
        ErrorCode::NotStarted => "Sale not started",
        ErrorCode::Ended => "Sale ended",
        ErrorCode::Paused => "Sale paused",
        ErrorCode::HoldExpired => "Hold expired",
        ErrorCode::AlreadyResolved => "Order already resolved",
        ErrorCode::PayloadTooLarge => "Payload too large",
        ErrorCode::RateLimited => "Rate limited",
        ErrorCode::Busy => "Busy",
        ErrorCode::Unavailable => "Unavailable",
        ErrorCode::Internal => "Internal error",
    }
}

impl AppError {
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> AppError {
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

    pub fn invalid(message: impl Into<Cow<'static, str>>) -> AppError {
        AppError::new(ErrorCode::InvalidRequest, message)
    }

    /// The default message of a code, for rejections a ledger answers.
    pub fn from_code(code: ErrorCode) -> AppError {
        AppError::new(code, default_message(code))
    }
}

/// The message of [`AppError::from_code`].
fn default_message(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::SoldOut => SOLD_OUT_MESSAGE,
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
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = match preformatted(self.code, &self.message) {
            Some(bytes) => bytes,
            None => serialise(self.code, status, &self.message),
        };
        let mut response = problem_response(status, body);
        if let Some(s) = self.retry_after_s {
            let headers = response.headers_mut();
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

fn serialise(code: ErrorCode, status: StatusCode, message: &str) -> Bytes {
    let body = Problem {
        kind: problem_type(code),
        title: problem_title(code),
        status: status.as_u16(),
        detail: message,
        code: code.as_str(),
        message,
    };
    // Plain strings and numbers: serializing cannot fail.
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

/// The message of a ledger's SOLD_OUT ([`AppError::from_code`]).
const SOLD_OUT_MESSAGE: &str = "the sale is sold out";

/// The answers a spike repeats at every request, by code and message: each code's default
/// message ([`AppError::from_code`], what a ledger's refusal carries) and the refusals of a
/// purchase without an admission pass.
fn repeated() -> Vec<(ErrorCode, &'static str)> {
    let mut list: Vec<(ErrorCode, &'static str)> = ErrorCode::ALL
        .into_iter()
        .map(|code| (code, default_message(code)))
        .collect();
    use flashsale_engine::admission::{DRAW_NEEDS_NO_PASS, PASS_MISSING};
    list.push((ErrorCode::AdmissionRequired, PASS_MISSING));
    list.push((ErrorCode::AdmissionRequired, DRAW_NEEDS_NO_PASS));
    list
}

/// The bodies of [`repeated`] answers, serialised once, by code (`code as usize`).
static PREFORMATTED: LazyLock<Vec<Vec<(&'static str, Bytes)>>> = LazyLock::new(|| {
    let status = |code: ErrorCode| {
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    };
    let mut by_code = vec![Vec::new(); ErrorCode::ALL.len()];
    for (code, m) in repeated() {
        by_code[code as usize].push((m, serialise(code, status(code), m)));
    }
    by_code
});

/// The body of an answer written before, if this is one (a clone of `Bytes` is a count).
fn preformatted(code: ErrorCode, message: &str) -> Option<Bytes> {
    let bodies = PREFORMATTED.get(code as usize)?;
    bodies
        .iter()
        .find(|(m, _)| *m == message)
        .map(|(_, body)| body.clone())
}

/// A problem answer, built as it is sent (a body given as `Bytes` would first be labelled
/// `application/octet-stream`, then relabelled).
fn problem_response(status: StatusCode, body: Bytes) -> Response {
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
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

impl From<flashsale_engine::shop::ShopError> for AppError {
    fn from(e: flashsale_engine::shop::ShopError) -> AppError {
        use flashsale_engine::shop::ShopError;
        match e {
            ShopError::Code(code) => AppError::from_code(code),
            ShopError::Refused(code, why) => AppError::new(code, why),
            ShopError::Ledger(e) => e.into(),
            ShopError::Store(e) => e.into(),
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

/// A 500 whose cause is logged, not shown.
pub(crate) fn internal(message: String) -> AppError {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each code has its own type URI, `<base><code in kebab case>`, and a title.
    #[test]
    fn every_code_has_its_own_problem_type() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            let slug = code.as_str().to_lowercase().replace('_', "-");
            assert_eq!(problem_type(code), format!("{PROBLEM_BASE}{slug}"));
            assert!(seen.insert(problem_type(code)));
            assert!(!problem_title(code).is_empty());
        }
    }

    /// docs/DESIGN.md lists every problem type, so the list cannot fall behind the codes.
    #[test]
    fn the_design_doc_lists_every_problem_type() {
        let doc = include_str!("../../../docs/DESIGN.md");
        for code in ErrorCode::ALL {
            let slug = &problem_type(code)[PROBLEM_BASE.len()..];
            assert!(doc.contains(&format!("`{slug}`")), "{slug} missing");
        }
    }

    /// The answer's body, checked to be Problem Details.
    async fn problem(response: Response) -> serde_json::Value {
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        let bytes = axum::body::to_bytes(response.into_body(), 4_096)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn an_error_is_problem_json_with_code_and_message() {
        let response = AppError::from_code(ErrorCode::SoldOut).into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        let v = problem(response).await;
        assert_eq!(v["type"], "https://flashsale.dev/problems/sold-out");
        assert_eq!(v["title"], "Sold out");
        assert_eq!(v["status"], 409);
        assert_eq!(v["code"], "SOLD_OUT");
        assert_eq!(v["detail"], "the sale is sold out");
        assert_eq!(v["message"], v["detail"]);
    }

    /// Every answer written once reads as the one serialised at the answer: the pass-less
    /// purchase's 403 among them, with its status and type.
    #[tokio::test]
    async fn preformatted_answers_match_the_serialised_ones() {
        for (code, message) in repeated() {
            let status = StatusCode::from_u16(code.http_status()).unwrap();
            let body = preformatted(code, message).expect("kept");
            assert_eq!(body, serialise(code, status, message), "{code:?} {message}");
        }
        let pass = flashsale_engine::admission::PASS_MISSING;
        let response = AppError::new(ErrorCode::AdmissionRequired, pass).into_response();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let v = problem(response).await;
        assert_eq!(
            v["type"],
            "https://flashsale.dev/problems/admission-required"
        );
        assert_eq!(
            (v["code"].as_str(), v["detail"].as_str()),
            (Some("ADMISSION_REQUIRED"), Some(pass))
        );
        assert!(preformatted(ErrorCode::AdmissionRequired, "another reason").is_none());
    }

    /// A 429 answered from kept bytes still carries its `Retry-After`.
    #[test]
    fn a_kept_answer_keeps_its_retry_after() {
        let response = AppError::from_code(ErrorCode::RateLimited).into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    /// The pre-serialised SOLD_OUT body is only for the default message.
    #[tokio::test]
    async fn a_sold_out_with_its_own_message_keeps_it() {
        let response =
            AppError::new(ErrorCode::SoldOut, "two left, you asked three").into_response();
        let v = problem(response).await;
        assert_eq!(v["detail"], "two left, you asked three");
        assert_eq!(v["code"], "SOLD_OUT");
    }
}
