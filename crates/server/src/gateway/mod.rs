//! Gateway protections in front of the handlers.
//!
//! - [`config`]: `GatewayConfig`, every knob and its default.
//! - [`ratelimit`]: governor token buckets per instance, sale, user and client IP.
//! - [`blacklist`]: blocked users and IPs, and token-only sales, cached per instance and
//!   refreshed in the background from their store (`flashsale_engine::gateway_store`: Redis
//!   sets or the SQLite database).
//! - [`pressure`]: per-sale in-flight limit (hot-sale isolation) and back-pressure (BUSY).
//! - [`scalping`]: single-use purchase tokens, HMAC-bound to user, sale and expiry.
//! - [`idempotency`]: an `Idempotency-Key` stays on the sale it was first used on.
//! - [`listener`]: a connection cap, and the peer address of each request.
//! - [`caps`]: the outermost middleware: header caps, in-flight cap and the request timeout,
//!   all in our error shape.
//!
//! This module holds what the shared state keeps; what reads the state lives elsewhere: the
//! admin API in `routes::admin::gateway`, the middleware in `middleware`, the periodic work
//! in `workers`.
//!
//! Per request the gateway does O(1) work and no I/O, except the single-use check of a
//! purchase token (one Redis `SET NX` on the Redis deployment, only for token-only sales) and
//! the binding of an `Idempotency-Key` to its sale (likewise, only for requests with one).

pub mod blacklist;
pub mod caps;
pub mod config;
pub mod idempotency;
pub mod listener;
pub mod pressure;
pub mod ratelimit;
pub mod scalping;

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use flashsale_core::{ErrorCode, PurchaseRequest, UserId};

pub use blacklist::Blacklist;
pub use config::{GatewayConfig, TokenRate};
pub use flashsale_engine::gateway_store::{BlacklistSnapshot, BlacklistStore, MemoryBlacklist};
use pressure::SaleGates;
use ratelimit::RateLimits;
use scalping::PurchaseTokens;

use crate::error::AppError;

pub struct Gateway {
    pub config: GatewayConfig,
    pub rates: RateLimits,
    pub blacklist: Blacklist,
    pub gates: SaleGates,
    pub tokens: PurchaseTokens,
    /// Requests in flight on this instance (`inflight_max`).
    pub inflight: Arc<tokio::sync::Semaphore>,
}

impl Gateway {
    pub fn new(config: GatewayConfig, jwt_secret: &str, store: Arc<dyn BlacklistStore>) -> Gateway {
        Gateway {
            rates: RateLimits::new(&config),
            blacklist: Blacklist::new(store),
            gates: SaleGates::new(config.sale_inflight_max),
            tokens: PurchaseTokens::new(jwt_secret, config.purchase_token_ttl),
            inflight: Arc::new(tokio::sync::Semaphore::new(config.inflight_max.max(1))),
            config,
        }
    }

    /// The client's IP: the connection's peer, or, behind trusted proxies, the
    /// `X-Forwarded-For` entry they appended (see [`forwarded_client`]). `None` when the
    /// request came without a connection (tests).
    pub fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        let hops = self.config.forwarded_for_hops;
        if hops > 0 {
            let lines = parts.headers.get_all("x-forwarded-for").iter();
            let lines = lines.filter_map(|v| v.to_str().ok());
            if let Some(ip) = forwarded_client(lines, hops) {
                return Some(ip);
            }
        }
        parts
            .extensions
            .get::<ConnectInfo<listener::ClientAddr>>()
            .map(|c| c.0 .0.ip())
    }

    /// Every authenticated user request: blacklist (403), then IP, user and instance limits.
    /// `ip`: the request's [`Gateway::client_ip`].
    pub fn check_user(&self, user: UserId, ip: Option<IpAddr>) -> Result<(), AppError> {
        if self.blacklist.user_blocked(user) || ip.is_some_and(|ip| self.blacklist.ip_blocked(ip)) {
            metrics::counter!(flashsale_core::metric_names::BLACKLISTED).increment(1);
            return Err(AppError::new(
                ErrorCode::Blacklisted,
                "this user or address is blocked",
            ));
        }
        self.rates.check_request(user, ip)
    }

    /// A purchase: its sale's rate, the purchase token when the sale requires one, back-pressure
    /// and the sale's in-flight limit. Hold the permit until the purchase is answered. The
    /// request's key is written out only for a sale that requires a purchase token.
    pub async fn admit_purchase(
        &self,
        req: &PurchaseRequest,
        token: Option<&str>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, AppError> {
        let (sku, user) = (req.sku_id, req.user_id);
        self.rates.check_sale(sku)?;
        let permit = self.gates.admit(sku)?;
        if self.blacklist.token_required(sku) {
            let token = token.ok_or_else(|| {
                AppError::new(
                    ErrorCode::Forbidden,
                    "this sale requires a purchase token: POST /api/v1/sales/{sku_id}/purchase-token",
                )
            })?;
            let verified = self.tokens.verify(token, user, sku)?;
            let fresh = self
                .blacklist
                .store
                .once()
                .consume_token(&verified.jti, &req.key().to_string(), verified.remaining)
                .await
                .map_err(|e| AppError::new(ErrorCode::Unavailable, e))?;
            if !fresh {
                return Err(AppError::new(
                    ErrorCode::Forbidden,
                    "the purchase token was already used",
                ));
            }
        }
        Ok(permit)
    }
}

/// The client named by `X-Forwarded-For` behind `hops` trusted proxies. Each proxy appends
/// the address of its peer, so the entry `hops` from the right is the one the outermost
/// trusted proxy saw; everything left of it came from the client and may be forged. Several
/// header lines are one list, in order (HAProxy adds a line of its own after the client's).
/// A shorter list than `hops` (a request that skipped a proxy) yields its leftmost entry, the
/// farthest one a trusted proxy wrote; an unreadable entry yields `None` (use the peer).
pub fn forwarded_client<'a>(lines: impl Iterator<Item = &'a str>, hops: u32) -> Option<IpAddr> {
    let entries: Vec<&str> = lines.flat_map(|l| l.split(',')).map(str::trim).collect();
    let from_right = usize::try_from(hops).ok()?.min(entries.len());
    let entry = entries.get(entries.len().checked_sub(from_right)?)?;
    entry.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::SkuId;

    #[test]
    fn forwarded_client_counts_hops_from_the_right() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let one = |lines: &[&str], hops| forwarded_client(lines.iter().copied(), hops);
        assert_eq!(one(&["1.2.3.4, 10.0.0.5"], 1), ip("10.0.0.5"));
        assert_eq!(one(&["1.2.3.4", "10.0.0.5"], 1), ip("10.0.0.5"));
        assert_eq!(one(&["1.2.3.4, 10.0.0.5, 192.168.0.1"], 2), ip("10.0.0.5"));
        assert_eq!(one(&["10.0.0.5"], 3), ip("10.0.0.5"));
        assert_eq!(one(&["::1,2001:db8::7"], 1), ip("2001:db8::7"));
        assert_eq!(one(&["1.2.3.4, junk"], 1), None);
        assert_eq!(one(&[], 1), None);
        assert_eq!(one(&["10.0.0.5"], 0), None);
    }

    /// The gateway's per-purchase work, without I/O: `cargo test -p flashsale-server --release
    /// --lib gateway::tests::per_purchase_cost -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore]
    async fn per_purchase_cost() {
        let huge = TokenRate::new(1_000_000_000, 1_000_000_000);
        let config = GatewayConfig {
            rate_instance: huge,
            rate_sale: huge,
            rate_user: huge,
            rate_ip: huge,
            rate_ip_exempt_loopback: false,
            ..GatewayConfig::default()
        };
        let g = Gateway::new(config, "s", Arc::new(MemoryBlacklist::default()));
        let n = 1_000_000u64;
        let started = std::time::Instant::now();
        for i in 0..n {
            let user = UserId(i % 100_000 + 1);
            assert!(!g.blacklist.user_blocked(user));
            let ip: IpAddr = "127.0.0.1".parse().unwrap();
            assert!(!g.blacklist.ip_blocked(ip));
            g.rates.check_request(user, Some(ip)).unwrap();
            let req = PurchaseRequest {
                sku_id: SkuId(1),
                user_id: user,
                request_id: flashsale_core::RequestId::parse("a").unwrap(),
                quantity: 1,
            };
            let permit = g.admit_purchase(&req, None).await.unwrap();
            drop(permit);
        }
        let ns = started.elapsed().as_nanos() as u64 / n;
        println!("gateway checks: {ns} ns per purchase");
    }
}
