//! `GatewayConfig`: every knob of the gateway layers, with defaults generous enough that a
//! 100,000-buyer spike from 256 clients on loopback is never throttled.

use std::time::Duration;

/// A token-bucket rate: `per_s` requests a second, bursts of `burst`. `per_s == 0`: off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRate {
    pub per_s: u32,
    pub burst: u32,
}

impl std::fmt::Display for TokenRate {
    /// The form [`TokenRate::parse`] reads: `PER_S/BURST`, or `off`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.is_off() {
            true => f.write_str("off"),
            false => write!(f, "{}/{}", self.per_s, self.burst),
        }
    }
}

impl TokenRate {
    pub const OFF: TokenRate = TokenRate { per_s: 0, burst: 0 };

    pub const fn new(per_s: u32, burst: u32) -> TokenRate {
        TokenRate { per_s, burst }
    }

    pub const fn is_off(&self) -> bool {
        self.per_s == 0
    }

    /// `"PER_S"` or `"PER_S/BURST"`; `"0"` or `"off"` turns it off.
    pub fn parse(s: &str) -> Result<TokenRate, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("off") {
            return Ok(TokenRate::OFF);
        }
        let (per, burst) = match s.split_once('/') {
            Some((p, b)) => (p, Some(b)),
            None => (s, None),
        };
        let per_s: u32 = per
            .trim()
            .parse()
            .map_err(|_| format!("bad rate {s:?}: PER_S or PER_S/BURST"))?;
        let burst: u32 = match burst {
            Some(b) => b
                .trim()
                .parse()
                .map_err(|_| format!("bad rate {s:?}: PER_S or PER_S/BURST"))?,
            None => per_s,
        };
        Ok(TokenRate {
            per_s,
            burst: burst.max(1),
        })
    }
}

/// Gateway protections. Env names (see the README) are in brackets.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Authenticated requests of this instance [`FLASHSALE_RATE_INSTANCE`].
    pub rate_instance: TokenRate,
    /// Purchases of one sale on this instance [`FLASHSALE_RATE_SALE`].
    pub rate_sale: TokenRate,
    /// Authenticated requests of one user [`FLASHSALE_RATE_USER`].
    pub rate_user: TokenRate,
    /// Authenticated requests from one client IP [`FLASHSALE_RATE_IP`].
    pub rate_ip: TokenRate,
    /// Loopback clients skip the per-IP limit (a local bench is one IP) [`FLASHSALE_RATE_IP_LOOPBACK`].
    pub rate_ip_exempt_loopback: bool,
    /// Trusted proxies in front of the instance, each appending its peer to
    /// `X-Forwarded-For`: the client IP is the entry this many hops from the right; 0 = the
    /// connection's peer, the header ignored [`FLASHSALE_TRUST_FORWARDED_FOR`].
    pub forwarded_for_hops: u32,
    /// How often keyed limiters forget idle keys (their memory bound).
    pub limiter_sweep: Duration,
    /// How often the blacklist and token-sale cache is reloaded [`FLASHSALE_BLACKLIST_REFRESH_MS`].
    pub blacklist_refresh: Duration,
    /// Stream lag (hot seq − database applied_seq, events) above which purchases get BUSY
    /// (Redis ledger); 0 = off [`FLASHSALE_BACKPRESSURE_LAG`].
    pub backpressure_lag: u64,
    /// Requests queued for one sale above which purchases get BUSY; 0 = off [`FLASHSALE_BACKPRESSURE_QUEUE`].
    pub backpressure_queue: u64,
    /// Pause the sale in the hot ledger while back-pressure holds, resume after [`FLASHSALE_BACKPRESSURE_AUTO_PAUSE`].
    pub backpressure_auto_pause: bool,
    /// How often the back-pressure monitor samples each active sale.
    pub backpressure_interval: Duration,
    /// Purchases of one sale in flight on this instance; past it, BUSY [`FLASHSALE_SALE_INFLIGHT_MAX`].
    pub sale_inflight_max: usize,
    /// Open client connections; more wait in the accept backlog [`FLASHSALE_CONNECTIONS_MAX`].
    pub connections_max: usize,
    /// Requests in flight on this instance; past it, 503 at once [`FLASHSALE_INFLIGHT_MAX`].
    pub inflight_max: usize,
    /// Total bytes of request headers (names + values) [`FLASHSALE_HEADER_BYTES_MAX`].
    pub header_bytes_max: usize,
    /// Number of request headers.
    pub headers_max: usize,
    /// Lifetime of an anti-scalping purchase token [`FLASHSALE_PURCHASE_TOKEN_TTL_S`].
    pub purchase_token_ttl: Duration,
    /// `Idempotency-Key`s one user may have bound at once (each for 24 h); a new key past it
    /// is 429 `RATE_LIMITED` [`FLASHSALE_IDEMPOTENCY_KEYS_PER_USER`].
    pub idempotency_keys_per_user: usize,
}

impl Default for GatewayConfig {
    fn default() -> GatewayConfig {
        GatewayConfig::DEFAULT
    }
}

impl GatewayConfig {
    /// Every default, in one place: `GatewayConfig::default()` and the CLI's flags
    /// (`flashsale serve --help`) take theirs from here.
    pub const DEFAULT: GatewayConfig = GatewayConfig {
        rate_instance: TokenRate::new(200_000, 200_000),
        rate_sale: TokenRate::new(100_000, 100_000),
        rate_user: TokenRate::new(100, 200),
        rate_ip: TokenRate::new(2_000, 4_000),
        rate_ip_exempt_loopback: true,
        forwarded_for_hops: 0,
        limiter_sweep: Duration::from_secs(10),
        blacklist_refresh: Duration::from_millis(500),
        backpressure_lag: 100_000,
        backpressure_queue: 4_096,
        backpressure_auto_pause: false,
        backpressure_interval: Duration::from_millis(100),
        sale_inflight_max: 4_096,
        connections_max: 10_000,
        inflight_max: 20_000,
        header_bytes_max: 16 * 1_024,
        headers_max: 64,
        purchase_token_ttl: Duration::from_secs(60),
        idempotency_keys_per_user: 1_000,
    };

    /// `FLASHSALE_TRUST_FORWARDED_FOR`: `false`/`off`/`0` ignores the header, `true`/`on`
    /// trusts one proxy (the rightmost entry), `N` trusts a chain of N proxies.
    pub fn parse_forwarded_for_hops(s: &str) -> Result<u32, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "false" | "off" | "no" => Ok(0),
            "true" | "on" | "yes" => Ok(1),
            n => n
                .parse()
                .map_err(|_| format!("bad proxy hops {s:?}: true, false or a number")),
        }
    }

    /// No rate limits, no back-pressure: for tests that hammer one user.
    pub fn unlimited() -> GatewayConfig {
        GatewayConfig {
            rate_instance: TokenRate::OFF,
            rate_sale: TokenRate::OFF,
            rate_user: TokenRate::OFF,
            rate_ip: TokenRate::OFF,
            backpressure_lag: 0,
            backpressure_queue: 0,
            ..GatewayConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(TokenRate::parse("10").unwrap(), TokenRate::new(10, 10));
        assert_eq!(TokenRate::parse("10/50").unwrap(), TokenRate::new(10, 50));
        assert!(TokenRate::parse("0").unwrap().is_off());
        assert!(TokenRate::parse("off").unwrap().is_off());
        assert!(TokenRate::parse("x").is_err());
        assert!(TokenRate::parse("1/y").is_err());
        for r in [TokenRate::new(100, 200), TokenRate::OFF] {
            assert_eq!(TokenRate::parse(&r.to_string()).unwrap(), r);
        }
    }

    #[test]
    fn forwarded_for_hops_parse() {
        let parse = GatewayConfig::parse_forwarded_for_hops;
        assert_eq!(parse("false"), Ok(0));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("TRUE"), Ok(1));
        assert_eq!(parse(" 2 "), Ok(2));
        assert!(parse("-1").is_err() && parse("x").is_err());
    }
}
