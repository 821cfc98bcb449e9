//! `Tunables`: the request path's bounds and timings, with their defaults. Every queue and
//! batch has a bound; the gateway's own knobs are in [`GatewayConfig`].

use std::time::Duration;

use crate::gateway::GatewayConfig;
use crate::risk::RiskConfig;

/// Tunables of the request path. Every queue and batch has a bound.
#[derive(Debug, Clone)]
pub struct Tunables {
    pub batch_max: usize,
    pub queue_cap: usize,
    pub body_bytes_max: usize,
    pub request_timeout: Duration,
    /// Sold-out flag and sale cache lifetime.
    pub cache_ttl: Duration,
    /// A sold-out flag remembers at most this many accepted request keys.
    pub accepted_keys_max: usize,
    /// Rate limits, blacklist, back-pressure, per-sale isolation, anti-scalping, caps.
    pub gateway: GatewayConfig,
    /// The shop's risk service in the purchase path (off unless its URL is set).
    pub risk: RiskConfig,
}

impl Tunables {
    /// Every default, in one place: `Tunables::default()` and the CLI's flags take theirs
    /// from here.
    pub const DEFAULT: Tunables = Tunables {
        batch_max: 256,
        queue_cap: 8_192,
        body_bytes_max: 4_096,
        request_timeout: Duration::from_secs(10),
        cache_ttl: flashsale_engine::cache::CACHE_TTL_DEFAULT,
        accepted_keys_max: flashsale_engine::shop::ACCEPTED_KEYS_MAX_DEFAULT,
        gateway: GatewayConfig::DEFAULT,
        risk: RiskConfig::DEFAULT,
    };
}

impl Default for Tunables {
    fn default() -> Tunables {
        Tunables::DEFAULT
    }
}

impl Tunables {
    /// The engine's part of these bounds.
    pub fn shop(&self) -> flashsale_engine::shop::ShopConfig {
        flashsale_engine::shop::ShopConfig {
            batch_max: self.batch_max,
            queue_cap: self.queue_cap,
            cache_ttl: self.cache_ttl,
            accepted_keys_max: self.accepted_keys_max,
        }
    }
}
