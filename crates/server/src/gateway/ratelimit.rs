//! Token-bucket rate limits (governor): per instance, per sale, per user, per client IP.
//! Each check is O(1) and lock-free on the hot path (governor's GCRA on an atomic cell; keyed
//! state in a sharded map). Keyed limiters forget idle keys on a timer, which bounds memory.
//!
//! Answers of rate-limited routes carry the IETF httpapi ratelimit-headers fields (draft
//! 08+): `RateLimit-Policy` lists the route's policies (`"user";q=20;w=2`: a bucket of `q`
//! requests that refills from empty in `w` seconds), precomputed once; `RateLimit` names the
//! tightest policy this request met, with what it has left and when it is full again
//! (`"user";r=19;t=1`). The checks note what they saw in a task-local slot that [`headers`]
//! opens around each request: no allocation until the one header value is written.

use std::cell::Cell;
use std::net::IpAddr;
use std::num::NonZeroU32;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use flashsale_core::{ErrorCode, SkuId, UserId};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, NotUntil, Quota, RateLimiter};

use super::config::{GatewayConfig, TokenRate};
use crate::error::AppError;

pub use flashsale_core::metric_names::RATE_LIMITED;

/// `RateLimit-Policy`: the policies of the route that answered.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: the tightest policy's remaining quota and reset, for this request.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

type Direct = DefaultDirectRateLimiter<StateInformationMiddleware>;
type Keyed<K> = DefaultKeyedRateLimiter<K, StateInformationMiddleware>;
type Instant = <DefaultClock as Clock>::Instant;

fn quota(rate: TokenRate) -> Option<Quota> {
    let per_s = NonZeroU32::new(rate.per_s)?;
    let burst = NonZeroU32::new(rate.burst.max(1)).unwrap_or(per_s);
    Some(Quota::per_second(per_s).allow_burst(burst))
}

/// The four limits, as named in metrics and in the headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Ip,
    User,
    Instance,
    Sale,
}

impl Scope {
    fn name(self) -> &'static str {
        match self {
            Scope::Ip => "ip",
            Scope::User => "user",
            Scope::Instance => "instance",
            Scope::Sale => "sale",
        }
    }
}

/// What one request's checks saw: the tightest policy (least left), and whether the sale's
/// limit applied (a purchase), which picks the `RateLimit-Policy` value.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    tightest: Option<(Scope, u32, u32)>,
    purchase: bool,
}

tokio::task_local! {
    static SEEN: Cell<Seen>;
}

/// Notes a check's result for this request's headers (nothing outside [`headers`]).
fn note(scope: Scope, remaining: u32, reset_s: u32) {
    let _ = SEEN.try_with(|cell| {
        let mut seen = cell.get();
        if seen.tightest.is_none_or(|(_, r, _)| remaining < r) {
            seen.tightest = Some((scope, remaining, reset_s));
        }
        seen.purchase |= scope == Scope::Sale;
        cell.set(seen);
    });
}

/// Seconds until a bucket of `rate` with `remaining` left is full again, at least 0.
fn reset_s(rate: TokenRate, remaining: u32) -> u32 {
    let missing = rate.burst.max(1).saturating_sub(remaining);
    missing.div_ceil(rate.per_s.max(1))
}

/// One policy item, `"name";q=<burst>;w=<seconds to refill from empty>`.
fn policy_item(scope: Scope, rate: TokenRate) -> Option<String> {
    (!rate.is_off()).then(|| {
        let window = rate.burst.max(1).div_ceil(rate.per_s).max(1);
        format!("\"{}\";q={};w={window}", scope.name(), rate.burst.max(1))
    })
}

/// The `RateLimit-Policy` value of a route checked by `scopes`, or none when all are off.
fn policy_header(c: &GatewayConfig, scopes: &[Scope]) -> Option<HeaderValue> {
    let items: Vec<String> = scopes
        .iter()
        .filter_map(|&s| policy_item(s, rate_of(c, s)))
        .collect();
    (!items.is_empty()).then(|| HeaderValue::try_from(items.join(", ")).ok())?
}

fn rate_of(c: &GatewayConfig, scope: Scope) -> TokenRate {
    match scope {
        Scope::Ip => c.rate_ip,
        Scope::User => c.rate_user,
        Scope::Instance => c.rate_instance,
        Scope::Sale => c.rate_sale,
    }
}

const USER_SCOPES: [Scope; 3] = [Scope::Ip, Scope::User, Scope::Instance];
const PURCHASE_SCOPES: [Scope; 4] = [Scope::Ip, Scope::User, Scope::Instance, Scope::Sale];

pub struct RateLimits {
    instance: Option<Direct>,
    sale: Option<Keyed<u64>>,
    user: Option<Keyed<u64>>,
    ip: Option<Keyed<IpAddr>>,
    ip_exempt_loopback: bool,
    clock: DefaultClock,
    rates: [TokenRate; 4],
    /// `RateLimit-Policy` of user routes and of purchases, computed once.
    user_policy: Option<HeaderValue>,
    purchase_policy: Option<HeaderValue>,
}

/// Opens the slot the checks write to, and writes `RateLimit-Policy` and `RateLimit` on the
/// answer of a request that met a rate limit (user routes; never admin or public ones).
pub async fn headers(rates: &RateLimits, req: Request, next: Next) -> Response {
    let (seen, mut response) = SEEN
        .scope(Cell::new(Seen::default()), async {
            let response = next.run(req).await;
            (SEEN.with(Cell::get), response)
        })
        .await;
    rates.write_headers(seen, response.headers_mut());
    response
}

impl RateLimits {
    pub fn new(c: &GatewayConfig) -> RateLimits {
        fn keyed<K: std::hash::Hash + Eq + Clone>(q: Quota) -> Keyed<K> {
            RateLimiter::keyed(q).with_middleware()
        }
        RateLimits {
            instance: quota(c.rate_instance).map(|q| RateLimiter::direct(q).with_middleware()),
            sale: quota(c.rate_sale).map(keyed),
            user: quota(c.rate_user).map(keyed),
            ip: quota(c.rate_ip).map(keyed),
            ip_exempt_loopback: c.rate_ip_exempt_loopback,
            clock: DefaultClock::default(),
            rates: [c.rate_ip, c.rate_user, c.rate_instance, c.rate_sale],
            user_policy: policy_header(c, &USER_SCOPES),
            purchase_policy: policy_header(c, &PURCHASE_SCOPES),
        }
    }

    fn rate(&self, scope: Scope) -> TokenRate {
        self.rates[scope as usize]
    }

    /// Notes a check's outcome for the headers; a refusal becomes 429 with `Retry-After`.
    fn judge(
        &self,
        scope: Scope,
        outcome: Result<governor::middleware::StateSnapshot, NotUntil<Instant>>,
    ) -> Result<(), AppError> {
        match outcome {
            Ok(snapshot) => {
                let left = snapshot.remaining_burst_capacity();
                note(scope, left, reset_s(self.rate(scope), left));
                Ok(())
            }
            Err(n) => {
                let wait = n.wait_time_from(self.clock.now());
                let wait_s = wait.as_secs_f64().ceil().clamp(1.0, 3_600.0) as u32;
                note(scope, 0, wait_s);
                Err(self.refuse(scope.name(), wait_s))
            }
        }
    }

    fn refuse(&self, scope: &'static str, wait_s: u32) -> AppError {
        metrics::counter!(RATE_LIMITED, "scope" => scope).increment(1);
        let mut e = AppError::new(
            ErrorCode::RateLimited,
            format!("too many requests ({scope} limit); retry later"),
        );
        e.retry_after_s = Some(wait_s);
        e
    }

    /// Instance, client IP and user limits of an authenticated request.
    pub fn check_request(&self, user: UserId, ip: Option<IpAddr>) -> Result<(), AppError> {
        if let (Some(l), Some(ip)) = (&self.ip, ip) {
            if !(self.ip_exempt_loopback && ip.is_loopback()) {
                self.judge(Scope::Ip, l.check_key(&ip))?;
            }
        }
        if let Some(l) = &self.user {
            self.judge(Scope::User, l.check_key(&user.0))?;
        }
        if let Some(l) = &self.instance {
            self.judge(Scope::Instance, l.check())?;
        }
        Ok(())
    }

    /// The per-sale purchase limit.
    pub fn check_sale(&self, sku: SkuId) -> Result<(), AppError> {
        if let Some(l) = &self.sale {
            self.judge(Scope::Sale, l.check_key(&sku.0))?;
        }
        Ok(())
    }

    /// `RateLimit-Policy` and `RateLimit` of a request whose checks noted `seen`.
    fn write_headers(&self, seen: Seen, headers: &mut HeaderMap) {
        let Some((scope, remaining, reset)) = seen.tightest else {
            return;
        };
        let policy = match seen.purchase {
            true => &self.purchase_policy,
            false => &self.user_policy,
        };
        if let Some(p) = policy {
            headers.insert(RATELIMIT_POLICY, p.clone());
        }
        let value = format!("\"{}\";r={remaining};t={reset}", scope.name());
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.insert(RATELIMIT, v);
        }
    }

    /// Forgets keys whose bucket is full again (idle), and frees the memory.
    pub fn sweep(&self) {
        if let Some(l) = &self.sale {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.user {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.ip {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }

    /// Keys held by the keyed limiters (sale, user, ip).
    pub fn keys(&self) -> (usize, usize, usize) {
        (
            self.sale.as_ref().map_or(0, |l| l.len()),
            self.user.as_ref().map_or(0, |l| l.len()),
            self.ip.as_ref().map_or(0, |l| l.len()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_limit_refuses_with_retry_after_and_sweep_forgets() {
        let c = GatewayConfig {
            rate_user: TokenRate::new(1, 2),
            ..GatewayConfig::unlimited()
        };
        let r = RateLimits::new(&c);
        assert!(r.check_request(UserId(1), None).is_ok());
        assert!(r.check_request(UserId(1), None).is_ok());
        let e = r.check_request(UserId(1), None).unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert!(e.retry_after_s.unwrap() >= 1);
        assert!(r.check_request(UserId(2), None).is_ok(), "per user");
        assert_eq!(r.keys().1, 2);
    }

    #[test]
    fn policies_and_resets_read_as_the_draft_says() {
        let c = GatewayConfig {
            rate_user: TokenRate::new(5, 10),
            rate_sale: TokenRate::new(100, 50),
            ..GatewayConfig::unlimited()
        };
        let user = policy_header(&c, &USER_SCOPES).unwrap();
        assert_eq!(user, "\"user\";q=10;w=2");
        let purchase = policy_header(&c, &PURCHASE_SCOPES).unwrap();
        assert_eq!(purchase, "\"user\";q=10;w=2, \"sale\";q=50;w=1");
        assert!(policy_header(&GatewayConfig::unlimited(), &USER_SCOPES).is_none());
        assert_eq!(reset_s(TokenRate::new(5, 10), 10), 0);
        assert_eq!(reset_s(TokenRate::new(5, 10), 9), 1);
        assert_eq!(reset_s(TokenRate::new(5, 10), 0), 2);
    }

    /// The checks of one request note the tightest policy; nothing is noted outside a scope.
    #[tokio::test]
    async fn the_tightest_policy_is_the_one_reported() {
        let c = GatewayConfig {
            rate_user: TokenRate::new(1, 3),
            rate_instance: TokenRate::new(1_000, 1_000),
            ..GatewayConfig::unlimited()
        };
        let r = RateLimits::new(&c);
        r.check_request(UserId(1), None).unwrap();
        let seen = SEEN
            .scope(Cell::new(Seen::default()), async {
                r.check_request(UserId(1), None).unwrap();
                SEEN.with(Cell::get)
            })
            .await;
        assert_eq!(seen.tightest, Some((Scope::User, 1, 2)));
        assert!(!seen.purchase);
        let mut headers = HeaderMap::new();
        r.write_headers(seen, &mut headers);
        assert_eq!(headers[RATELIMIT], "\"user\";r=1;t=2");
        assert_eq!(
            headers[RATELIMIT_POLICY],
            "\"user\";q=3;w=3, \"instance\";q=1000;w=1"
        );
    }

    #[test]
    fn loopback_is_exempt_from_the_ip_limit_unless_configured() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let ext: IpAddr = "203.0.113.9".parse().unwrap();
        let c = GatewayConfig {
            rate_ip: TokenRate::new(1, 1),
            ..GatewayConfig::unlimited()
        };
        let r = RateLimits::new(&c);
        for u in 1..10 {
            assert!(r.check_request(UserId(u), Some(lo)).is_ok());
        }
        assert!(r.check_request(UserId(1), Some(ext)).is_ok());
        assert!(r.check_request(UserId(2), Some(ext)).is_err());
    }
}
