//! Error codes of the HTTP contract, and the errors of ledgers and stores.

use serde::{Deserialize, Serialize};

/// Every error code the API answers with. The HTTP status belongs to the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    InvalidRequest,
    Unauthorized,
    Forbidden,
    Blacklisted,
    RiskDenied,
    /// A queue or draw sale's purchase without a valid admission pass for this user and sale.
    AdmissionRequired,
    SaleNotFound,
    OrderNotFound,
    RouteNotFound,
    MethodNotAllowed,
    /// An idempotency key (request id) sent again with another quantity or sale.
    IdempotencyKeyReused,
    SaleExists,
    SoldOut,
    LimitExceeded,
    NotStarted,
    Ended,
    Paused,
    HoldExpired,
    AlreadyResolved,
    PayloadTooLarge,
    RateLimited,
    Busy,
    Unavailable,
    Internal,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 24] = [
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::Blacklisted,
        ErrorCode::RiskDenied,
        ErrorCode::AdmissionRequired,
        ErrorCode::SaleNotFound,
        ErrorCode::OrderNotFound,
        ErrorCode::RouteNotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::SaleExists,
        ErrorCode::SoldOut,
        ErrorCode::LimitExceeded,
        ErrorCode::NotStarted,
        ErrorCode::Ended,
        ErrorCode::Paused,
        ErrorCode::HoldExpired,
        ErrorCode::AlreadyResolved,
        ErrorCode::PayloadTooLarge,
        ErrorCode::RateLimited,
        ErrorCode::Busy,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::Blacklisted => "BLACKLISTED",
            ErrorCode::RiskDenied => "RISK_DENIED",
            ErrorCode::AdmissionRequired => "ADMISSION_REQUIRED",
            ErrorCode::SaleNotFound => "SALE_NOT_FOUND",
            ErrorCode::OrderNotFound => "ORDER_NOT_FOUND",
            ErrorCode::RouteNotFound => "ROUTE_NOT_FOUND",
            ErrorCode::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ErrorCode::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            ErrorCode::SaleExists => "SALE_EXISTS",
            ErrorCode::SoldOut => "SOLD_OUT",
            ErrorCode::LimitExceeded => "LIMIT_EXCEEDED",
            ErrorCode::NotStarted => "NOT_STARTED",
            ErrorCode::Ended => "ENDED",
            ErrorCode::Paused => "PAUSED",
            ErrorCode::HoldExpired => "HOLD_EXPIRED",
            ErrorCode::AlreadyResolved => "ALREADY_RESOLVED",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::Busy => "BUSY",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Internal => "INTERNAL",
        }
    }

    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The HTTP status that goes with the code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden
            | ErrorCode::Blacklisted
            | ErrorCode::RiskDenied
            | ErrorCode::AdmissionRequired => 403,
            ErrorCode::SaleNotFound | ErrorCode::OrderNotFound | ErrorCode::RouteNotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::SaleExists
            | ErrorCode::SoldOut
            | ErrorCode::LimitExceeded
            | ErrorCode::NotStarted
            | ErrorCode::Ended
            | ErrorCode::Paused
            | ErrorCode::HoldExpired
            | ErrorCode::AlreadyResolved => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RateLimited | ErrorCode::Busy => 429,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }
}

/// A hot ledger could not answer (as opposed to answering with a rejection).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The ledger's backing server is down or slow: answer 503, never fall back.
    #[error("hot ledger unavailable: {0}")]
    Unavailable(String),
    /// Written on the ledger's primary but not confirmed by enough replicas in time: answer
    /// 503 like [`LedgerError::Unavailable`] (the client retries with the same request id).
    /// `written` names the purchases accepted (new or replayed) or the order resolved, so
    /// that the loss journal can report them if a failover drops them.
    #[error("hot ledger unavailable: {why}")]
    Unconfirmed {
        written: Vec<crate::OrderNo>,
        why: String,
    },
    /// The ledger's queue for this sale is full: answer 429 BUSY.
    #[error("hot ledger busy")]
    Busy,
    /// The sale is not in the hot ledger (never warmed, or lost).
    #[error("sale not warmed")]
    NotWarmed,
    /// Warm refused: the hot ledger already holds a sale that has sold units.
    #[error("sale already warm with sales; use force")]
    AlreadyWarm,
    #[error("hot ledger fault: {0}")]
    Internal(String),
}

impl LedgerError {
    /// Answered 503 and counted by the breaker: the server is down or slow, or a write was
    /// not confirmed by its replicas.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            LedgerError::Unavailable(_) | LedgerError::Unconfirmed { .. }
        )
    }
}

/// The system of record could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sale exists")]
    SaleExists,
    #[error("sale not found")]
    SaleNotFound,
    /// Events do not continue the sale's applied sequence.
    #[error("events out of order: applied_seq {applied_seq}, batch starts at {first_seq}")]
    Gap { applied_seq: u64, first_seq: u64 },
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database fault: {0}")]
    Internal(String),
}
