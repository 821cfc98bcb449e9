//! The shop's risk service in the purchase path: one `POST` per purchase before the hot
//! ledger, off unless `FLASHSALE_RISK_URL` is set.
//!
//! - [`config`]: `RiskConfig` (every knob and its default) and the `Fallback` rule.
//! - [`circuit`]: the breaker in front of the service (one circuit, one probe at a time).
//! - [`replays`]: accepted purchases seen here, whose retries skip the service.
//! - [`gate`]: the client as the engine's `RiskGate`, asked by the purchase use case.
//!
//! Its admin API (the allowlist and a sale's own fallback rule) is `routes::admin::risk`.
//!
//! The contract a shop implements (docs/DESIGN.md, "The shop's risk check"): the service
//! receives `{sku_id, user_id, quantity, request_id, client_ip}` as JSON and answers 2xx with
//! `{"allow": bool, "reason": "..."}`. Anything else — another status, a body that is not
//! that JSON, no answer within the timeout — is no answer, and the fallback rule decides.
//!
//! Every call is bounded: a timeout (connecting included), a cap on checks in flight (past
//! it the fallback decides at once, nothing queues), and the breaker. One `reqwest::Client`
//! keeps its connections alive across purchases.

pub mod circuit;
pub mod config;
pub mod gate;
pub mod replays;

use std::net::IpAddr;
use std::time::Instant;

use flashsale_core::metric_names::{RISK_CALLS, RISK_LATENCY};
use flashsale_core::PurchaseRequest;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use circuit::{Admission, Circuit};
pub use config::{Fallback, RiskConfig};
use replays::Replays;

/// Most bytes of an answer read; a longer one is an error.
const ANSWER_BYTES_MAX: usize = 4_096;
/// Most characters of a denial's reason passed on to the buyer.
const REASON_CHARS_MAX: usize = 200;

/// What the shop's risk service receives (`POST` to `FLASHSALE_RISK_URL`, JSON) before each
/// purchase reaches the hot ledger: the contract a shop implements, not an operation of this
/// API.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = RiskCheckRequest)]
pub struct RiskQuery<'a> {
    pub sku_id: u64,
    pub user_id: u64,
    #[schema(minimum = 1, maximum = 1_000)]
    pub quantity: u32,
    /// The buyer's request id: the same on every retry of one purchase attempt.
    pub request_id: &'a str,
    /// The buyer's address as the gateway sees it; `null` when unknown.
    #[schema(value_type = Option<String>)]
    pub client_ip: Option<IpAddr>,
}

impl<'a> RiskQuery<'a> {
    pub fn new(req: &'a PurchaseRequest, client_ip: Option<IpAddr>) -> RiskQuery<'a> {
        RiskQuery {
            sku_id: req.sku_id.0,
            user_id: req.user_id.0,
            quantity: req.quantity,
            request_id: req.request_id.as_str(),
            client_ip,
        }
    }
}

/// What the shop's risk service answers (2xx, JSON, at most 4 KiB). `allow: false` refuses the
/// purchase with 403 `RISK_DENIED` and the reason. Any other answer, or none within
/// `FLASHSALE_RISK_TIMEOUT_MS`, leaves the decision to the fallback rule.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = RiskCheckAnswer)]
pub(crate) struct Answer {
    allow: bool,
    /// Shown to the buyer in the refusal's message (first 200 characters).
    #[serde(default)]
    reason: Option<String>,
}

/// Why the service gave no answer (the label of the fallback metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAnswer {
    Timeout,
    Error,
    /// The breaker is open: the service was not called.
    Breaker,
    /// Too many checks in flight here: the service was not called.
    Saturated,
}

impl NoAnswer {
    pub fn as_str(self) -> &'static str {
        match self {
            NoAnswer::Timeout => "timeout",
            NoAnswer::Error => "error",
            NoAnswer::Breaker => "breaker",
            NoAnswer::Saturated => "saturated",
        }
    }
}

/// The service's word on one purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Refused, with the service's reason (shortened).
    Deny(String),
    NoAnswer(NoAnswer),
}

/// The risk check of this instance.
pub struct RiskCheck {
    config: RiskConfig,
    /// `None` when no service is configured.
    target: Option<(reqwest::Client, reqwest::Url)>,
    permits: Semaphore,
    circuit: Circuit,
    pub replays: Replays,
}

impl RiskCheck {
    /// Whether `config` makes a risk check (the URL parses, http or https).
    pub fn validate(config: &RiskConfig) -> Result<(), String> {
        config
            .url
            .as_deref()
            .map_or(Ok(()), |u| parse_url(u).map(drop))
    }

    /// Fails on a URL that does not parse (at start, not at the first purchase).
    pub fn new(config: RiskConfig) -> Result<RiskCheck, String> {
        let target = match &config.url {
            None => None,
            Some(url) => Some((client(&config)?, parse_url(url)?)),
        };
        Ok(RiskCheck {
            permits: Semaphore::new(config.inflight_max.max(1)),
            circuit: Circuit::new(config.breaker_failures, config.breaker_open),
            replays: Replays::new(config.replay_keys_max),
            target,
            config,
        })
    }

    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    pub fn config(&self) -> &RiskConfig {
        &self.config
    }

    pub fn breaker_open(&self) -> bool {
        self.circuit.is_open()
    }

    /// Asks the service, within every bound. `Allow` when no service is configured.
    pub async fn ask(&self, q: &RiskQuery<'_>) -> Verdict {
        let Some((client, url)) = &self.target else {
            return Verdict::Allow;
        };
        let Ok(_permit) = self.permits.try_acquire() else {
            return Verdict::NoAnswer(NoAnswer::Saturated);
        };
        let admission = self.circuit.admit();
        if admission == Admission::Open {
            return Verdict::NoAnswer(NoAnswer::Breaker);
        }
        // A probe cut short (the buyer gave up) must not leave the breaker waiting for it.
        let _probe = ProbeGuard(&self.circuit, admission == Admission::Probe);
        let started = Instant::now();
        let call = call(client, url, q, self.config.timeout);
        let result = tokio::time::timeout(self.config.timeout, call).await;
        metrics::histogram!(RISK_LATENCY).record(started.elapsed().as_secs_f64());
        self.judge(result)
    }

    fn judge(
        &self,
        result: Result<Result<Answer, Failure>, tokio::time::error::Elapsed>,
    ) -> Verdict {
        let (label, verdict) = match result {
            Ok(Ok(answer)) if answer.allow => ("allow", Verdict::Allow),
            Ok(Ok(answer)) => ("deny", Verdict::Deny(shorten(answer.reason))),
            Ok(Err(Failure::Error(e))) => {
                tracing::debug!(error = %e, "risk service: no answer");
                ("error", Verdict::NoAnswer(NoAnswer::Error))
            }
            Ok(Err(Failure::Timeout)) | Err(_) => ("timeout", Verdict::NoAnswer(NoAnswer::Timeout)),
        };
        match verdict {
            Verdict::NoAnswer(_) => self.circuit.failure(),
            _ => self.circuit.success(),
        }
        metrics::counter!(RISK_CALLS, "result" => label).increment(1);
        verdict
    }
}

/// Clears the probe flag when a probe ends without reporting (it was dropped).
struct ProbeGuard<'a>(&'a Circuit, bool);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.probe_ended();
        }
    }
}

fn client(config: &RiskConfig) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(config.timeout)
        .pool_max_idle_per_host(config.inflight_max.max(1))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| format!("risk client: {e}"))
}

fn parse_url(url: &str) -> Result<reqwest::Url, String> {
    let parsed =
        reqwest::Url::parse(url).map_err(|e| format!("FLASHSALE_RISK_URL {url:?}: {e}"))?;
    match parsed.scheme() {
        "http" | "https" => Ok(parsed),
        other => Err(format!("FLASHSALE_RISK_URL: scheme {other:?}, not http(s)")),
    }
}

/// Why a call brought no answer.
enum Failure {
    /// reqwest's own timeout (connecting, or the whole call) fired before ours.
    Timeout,
    Error(String),
}

impl From<reqwest::Error> for Failure {
    fn from(e: reqwest::Error) -> Failure {
        match e.is_timeout() {
            true => Failure::Timeout,
            false => Failure::Error(e.to_string()),
        }
    }
}

/// One call: 2xx with the answer's JSON, at most `ANSWER_BYTES_MAX` of it.
async fn call(
    client: &reqwest::Client,
    url: &reqwest::Url,
    q: &RiskQuery<'_>,
    timeout: std::time::Duration,
) -> Result<Answer, Failure> {
    let mut resp = client
        .post(url.clone())
        .json(q)
        .timeout(timeout)
        .send()
        .await?;
    if !resp.status().is_success() {
        return Err(Failure::Error(format!("status {}", resp.status())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        body.extend_from_slice(&chunk);
        if body.len() > ANSWER_BYTES_MAX {
            let e = format!("answer longer than {ANSWER_BYTES_MAX} bytes");
            return Err(Failure::Error(e));
        }
    }
    serde_json::from_slice(&body).map_err(|e| Failure::Error(format!("answer: {e}")))
}

fn shorten(reason: Option<String>) -> String {
    let reason = reason.unwrap_or_default();
    match reason.char_indices().nth(REASON_CHARS_MAX) {
        Some((end, _)) => reason[..end].to_owned(),
        None => reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reason_is_cut_on_a_char_boundary() {
        assert_eq!(shorten(None), "");
        assert_eq!(shorten(Some("velocity".into())), "velocity");
        let long = "é".repeat(REASON_CHARS_MAX + 5);
        assert_eq!(shorten(Some(long)).chars().count(), REASON_CHARS_MAX);
    }

    #[test]
    fn urls_must_be_http() {
        assert!(parse_url("http://127.0.0.1:9/check").is_ok());
        assert!(parse_url("ftp://x").is_err());
        assert!(parse_url("not a url").is_err());
    }
}
