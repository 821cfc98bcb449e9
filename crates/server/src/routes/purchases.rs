//! `POST /api/v1/sales/{sku}/purchases`: the hot path.
//!
//! The attempt's request id comes from the `Idempotency-Key` header or the body's
//! `request_id` (both: they must agree). A replay whose stored order has another quantity,
//! or a header key already bound to another sale ([`crate::gateway::idempotency`]), answers
//! 422 `IDEMPOTENCY_KEY_REUSED`, never the first outcome.
//!
//! The order of the checks: the caller (token, blacklist, the user's and the address's rates),
//! the body, the sale (and a queue sale's admission pass), the sale's sold-out flag, then the
//! gateway's per-sale checks and the shop. A request the flag answers SOLD_OUT (never a retry
//! of an accepted one) does not reach the ledger, so it spends nothing that guards it: no sale
//! rate, in-flight permit, purchase token or header-key binding.

use std::time::Instant;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::Json;
use flashsale_core::limits::PER_USER_LIMIT_MAX;
use flashsale_core::{ErrorCode, PurchaseRequest, RequestId, Sale, SkuId, UserId};
use serde::Deserialize;
use utoipa::ToSchema;

use super::{ApiJson, ApiPath, OrderView, UserAt};
use crate::error::AppError;
use crate::risk::gate::PurchaseGate;
use crate::state::AppState;
use flashsale_core::metric_names::RISK_DENIALS;
use flashsale_engine::shop::{PurchaseRefusal, Purchased};

/// The header that may carry the request id (IETF httpapi `Idempotency-Key`).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

const REQUEST_ID_RULE: &str = "request_id must be 1..=64 of [A-Za-z0-9_-]";

/// Body of a purchase.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PurchaseBody {
    /// Chosen by the client, one per attempt, reused on retry. Required unless the
    /// `Idempotency-Key` header carries it (both: they must be equal).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub request_id: Option<String>,
    // Signed so that a negative number gets our message, not a parse error's.
    #[schema(minimum = 1, maximum = 1_000)]
    pub quantity: i64,
    /// Required when the sale requires purchase tokens (anti-scalping).
    #[serde(default)]
    #[schema(max_length = 512)]
    pub purchase_token: Option<String>,
    /// Required by a queue sale: the pass `GET /api/v1/sales/{sku_id}/queue/me` gives an
    /// admitted buyer (bound to the user and the sale, short-lived).
    #[serde(default)]
    #[schema(max_length = 160)]
    pub admission_pass: Option<String>,
}

/// The request's `Idempotency-Key` lines, and no other header: the handler reads only these.
/// The first line and whether there were more, found by one look-up of a name parsed once (a
/// copy of every header, or a look-up by `&str`, which parses the name again, cost a purchase
/// more than the rest of this).
pub struct IdempotencyLines {
    pub first: Option<HeaderValue>,
    pub more: bool,
}

static IDEMPOTENCY_NAME: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyLines {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let mut lines = parts.headers.get_all(&IDEMPOTENCY_NAME).iter();
        let first = lines.next().cloned();
        let more = lines.next().is_some();
        Ok(IdempotencyLines { first, more })
    }
}

/// Where a purchase's request id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    Body,
    /// The `Idempotency-Key` header (alone, or equal to the body's).
    Header,
}

/// The `Idempotency-Key` header's value: one line, as a Structured Field string (`"abc"`,
/// what the draft specifies) or bare (`abc`, what most clients send). `None` when absent.
pub fn idempotency_header(lines: &IdempotencyLines) -> Result<Option<&str>, AppError> {
    let Some(value) = &lines.first else {
        return Ok(None);
    };
    if lines.more {
        return Err(AppError::invalid("Idempotency-Key is given more than once"));
    }
    let text = value
        .to_str()
        .map_err(|_| AppError::invalid("Idempotency-Key must be 1..=64 of [A-Za-z0-9_-]"))?;
    let unquoted = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    Ok(Some(unquoted))
}

/// The attempt's request id from the header and the body: either, or both when equal. The
/// body's string becomes the id as it is (no copy).
pub fn request_id(
    header: Option<&str>,
    body: Option<String>,
) -> Result<(RequestId, KeySource), AppError> {
    let (id, source) = match (header, body) {
        (Some(h), Some(b)) if h != b => {
            return Err(AppError::invalid(
                "Idempotency-Key and request_id differ: send one, or the same value in both",
            ))
        }
        (Some(h), _) => (RequestId::parse(h), KeySource::Header),
        (None, Some(b)) => (RequestId::parse_owned(b), KeySource::Body),
        (None, None) => {
            return Err(AppError::invalid(
                "request_id is required unless the Idempotency-Key header is given",
            ))
        }
    };
    let id = id.ok_or_else(|| AppError::invalid(REQUEST_ID_RULE))?;
    Ok((id, source))
}

impl PurchaseBody {
    /// The purchase this body asks for, under `request_id` (from [`request_id`]).
    pub fn validate(
        &self,
        sku: SkuId,
        user: UserId,
        request_id: RequestId,
    ) -> Result<PurchaseRequest, AppError> {
        let token_len_max = crate::gateway::scalping::TOKEN_LEN_MAX;
        if self
            .purchase_token
            .as_ref()
            .is_some_and(|t| t.len() > token_len_max)
        {
            return Err(AppError::invalid(format!(
                "purchase_token is at most {token_len_max} bytes"
            )));
        }
        if !(1..=i64::from(PER_USER_LIMIT_MAX)).contains(&self.quantity) {
            return Err(AppError::invalid(format!(
                "quantity must be 1..={PER_USER_LIMIT_MAX}"
            )));
        }
        Ok(PurchaseRequest {
            sku_id: sku,
            user_id: user,
            request_id,
            quantity: self.quantity as u32,
        })
    }
}

#[utoipa::path(post, path = "/sales/{sku_id}/purchases", tag = "purchases", operation_id = "purchase", security(("bearer" = [])),
    params(("sku_id" = u64, Path, minimum = 0),
        ("Idempotency-Key" = Option<String>, Header, pattern = "^\"?[A-Za-z0-9_-]{1,64}\"?$",
         description = "The attempt's request id (IETF httpapi Idempotency-Key; quoted or bare), \
            instead of or equal to the body's `request_id`. Reused with another quantity or sale: 422.")),
    request_body = PurchaseBody,
    responses((status = 202, description = "accepted (or the replay of the first outcome)", body = OrderView),
        (status = 403, description = "RISK_DENIED: refused by the shop's risk service (schemas RiskCheckRequest, RiskCheckAnswer), or by the fallback rule while it gives no answer; BLACKLISTED; FORBIDDEN (purchase token)", body = crate::openapi::Error, content_type = "application/problem+json"),
        (status = 422, description = "IDEMPOTENCY_KEY_REUSED: the request id was sent before with another quantity, or (header key) on another sale",
         body = crate::openapi::Error, content_type = "application/problem+json"),
        (status = 429, description = "RATE_LIMITED: a rate limit, or (header key) the user has FLASHSALE_IDEMPOTENCY_KEYS_PER_USER keys bound in the last 24 h; BUSY: the sale's queue is full; with Retry-After",
         body = crate::openapi::Error, content_type = "application/problem+json")))]
pub async fn purchase(
    State(st): State<AppState>,
    UserAt { user, ip }: UserAt,
    ApiPath(p): ApiPath<u64>,
    lines: IdempotencyLines,
    ApiJson(mut body): ApiJson<PurchaseBody>,
) -> Result<(StatusCode, Json<OrderView>), AppError> {
    let started = Instant::now();
    let sku = SkuId(p);
    let (request_id, source) = request_id(idempotency_header(&lines)?, body.request_id.take())?;
    let req = body.validate(sku, user, request_id)?;
    let pass = body.admission_pass.as_deref();
    let stored = st.shop.sale_to_buy(sku, user, pass).await?;
    let result = match st.shop.sold_out_here(&req) {
        true => Err(PurchaseRefusal::SoldOutHere),
        false => buy(&st, req, source, &body, ip, &stored.sale).await?,
    };
    let result = result.map(answer).map_err(refusal);
    let label = match &result {
        Ok(view) if view.replayed == Some(true) => "replayed",
        Ok(_) => "accepted",
        Err(e) => e.code.as_str(),
    };
    let took = started.elapsed();
    crate::hot_metrics::purchase(label, took.as_secs_f64());
    let answer = crate::dashboard::live::Answer::from_label(label);
    st.dashboard.live.record(sku, answer, took);
    result.map(|view| (StatusCode::ACCEPTED, Json(view)))
}

/// A purchase the sold-out flag did not answer: the gateway's admission (a header key's
/// binding, the sale's rate, its purchase token, back-pressure and in-flight permits; its
/// refusals are the outer error), then the shop.
async fn buy(
    st: &AppState,
    req: PurchaseRequest,
    source: KeySource,
    body: &PurchaseBody,
    ip: Option<std::net::IpAddr>,
    sale: &Sale,
) -> Result<Result<Purchased, PurchaseRefusal>, AppError> {
    let sku = req.sku_id;
    if source == KeySource::Header {
        let store = st.gateway.blacklist.store.as_ref();
        let per_user = st.gateway.config.idempotency_keys_per_user;
        crate::gateway::idempotency::bind(store, &req.key(), sku, per_user).await?;
    }
    let token = body.purchase_token.as_deref();
    let _permit = st.gateway.admit_purchase(&req, token).await?;
    let gate = PurchaseGate {
        risk: &st.risk,
        lists: &st.gateway.blacklist,
        ip,
    };
    Ok(st.shop.purchase(req, sale, &gate).await)
}

fn answer(p: Purchased) -> OrderView {
    let mut view = OrderView::new(&p.order, p.status);
    view.replayed = Some(p.replayed);
    view
}

fn refusal(r: PurchaseRefusal) -> AppError {
    match r {
        PurchaseRefusal::SoldOutHere => {
            crate::hot_metrics::sold_out_local();
            AppError::from_code(ErrorCode::SoldOut)
        }
        PurchaseRefusal::Risk(denial) => {
            metrics::counter!(RISK_DENIALS, "by" => denial.by).increment(1);
            AppError::new(ErrorCode::RiskDenied, denial.message)
        }
        PurchaseRefusal::Shop(e) => e.into(),
    }
}
