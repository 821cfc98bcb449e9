//! Token-bucket rate limits (governor): per instance, per sale, per user, per client IP.
//! Each check is O(1) and lock-free on the hot path (governor's GCRA on an atomic cell; keyed
//! state in a sharded map). Keyed limiters forget idle keys on a timer, which bounds memory.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use flashsale_core::{ErrorCode, SkuId, UserId};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::config::{GatewayConfig, TokenRate};
use crate::error::AppError;

pub use flashsale_core::metric_names::RATE_LIMITED;

fn quota(rate: TokenRate) -> Option<Quota> {
    let per_s = NonZeroU32::new(rate.per_s)?;
    let burst = NonZeroU32::new(rate.burst.max(1)).unwrap_or(per_s);
    Some(Quota::per_second(per_s).allow_burst(burst))
}

pub struct RateLimits {
    instance: Option<DefaultDirectRateLimiter>,
    sale: Option<DefaultKeyedRateLimiter<u64>>,
    user: Option<DefaultKeyedRateLimiter<u64>>,
    ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
    ip_exempt_loopback: bool,
    clock: DefaultClock,
}

impl RateLimits {
    pub fn new(c: &GatewayConfig) -> RateLimits {
        RateLimits {
            instance: quota(c.rate_instance).map(RateLimiter::direct),
            sale: quota(c.rate_sale).map(RateLimiter::keyed),
            user: quota(c.rate_user).map(RateLimiter::keyed),
            ip: quota(c.rate_ip).map(RateLimiter::keyed),
            ip_exempt_loopback: c.rate_ip_exempt_loopback,
            clock: DefaultClock::default(),
        }
    }

    fn refuse(&self, scope: &'static str, wait: Duration) -> AppError {
        metrics::counter!(RATE_LIMITED, "scope" => scope).increment(1);
        let mut e = AppError::new(
            ErrorCode::RateLimited,
            format!("too many requests ({scope} limit); retry later"),
        );
        e.retry_after_s = Some(wait.as_secs_f64().ceil().clamp(1.0, 3_600.0) as u32);
        e
    }

    /// Instance, client IP and user limits of an authenticated request.
    pub fn check_request(&self, user: UserId, ip: Option<IpAddr>) -> Result<(), AppError> {
        if let (Some(l), Some(ip)) = (&self.ip, ip) {
            if !(self.ip_exempt_loopback && ip.is_loopback()) {
                l.check_key(&ip)
                    .map_err(|n| self.refuse("ip", n.wait_time_from(self.clock.now())))?;
            }
        }
        if let Some(l) = &self.user {
            l.check_key(&user.0)
                .map_err(|n| self.refuse("user", n.wait_time_from(self.clock.now())))?;
        }
        if let Some(l) = &self.instance {
            l.check()
                .map_err(|n| self.refuse("instance", n.wait_time_from(self.clock.now())))?;
        }
        Ok(())
    }

    /// The per-sale purchase limit.
    pub fn check_sale(&self, sku: SkuId) -> Result<(), AppError> {
        if let Some(l) = &self.sale {
            l.check_key(&sku.0)
                .map_err(|n| self.refuse("sale", n.wait_time_from(self.clock.now())))?;
        }
        Ok(())
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
