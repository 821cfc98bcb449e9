//! The shop's one error: a refusal (a domain code, with the code's own message or one of
//! its own) or a backend that failed.

use std::borrow::Cow;

use flashsale_core::{ErrorCode, LedgerError, StoreError};

use crate::admission::AdmissionError;

/// Why a use case did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    /// A refusal the code's own message says enough about (`SALE_NOT_FOUND`, `SOLD_OUT`…).
    #[error("{}", .0.as_str())]
    Code(ErrorCode),
    /// A refusal with its own message (a literal for those a spike repeats: no copy each).
    #[error("{1}")]
    Refused(ErrorCode, Cow<'static, str>),
    /// The hot ledger failed or refused.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The system of record failed or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ShopError {
    pub(crate) fn refused(code: ErrorCode, why: impl Into<Cow<'static, str>>) -> ShopError {
        ShopError::Refused(code, why.into())
    }

    /// `INVALID_REQUEST` with why.
    pub(crate) fn invalid(why: impl Into<Cow<'static, str>>) -> ShopError {
        ShopError::refused(ErrorCode::InvalidRequest, why)
    }
}

impl From<AdmissionError> for ShopError {
    fn from(e: AdmissionError) -> ShopError {
        match e {
            AdmissionError::Refused(code, why) => ShopError::Refused(code, why),
            AdmissionError::Store(e) => ShopError::Store(e),
        }
    }
}
