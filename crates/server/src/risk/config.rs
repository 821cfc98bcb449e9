//! `RiskConfig`: the risk check's settings and their defaults, and the fallback rule.

use std::time::Duration;

/// Who is admitted while the risk service gives no answer (timeout, error, breaker open,
/// too many checks in flight).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Everyone: the sale goes on unchecked (the ledger still enforces every sale rule).
    Allow,
    /// No one: purchases are refused with RISK_DENIED until the service answers again.
    Deny,
    /// Users on the admin-managed risk allowlist; everyone else is refused.
    Allowlist,
}

impl Fallback {
    pub const fn as_str(self) -> &'static str {
        match self {
            Fallback::Allow => "allow",
            Fallback::Deny => "deny",
            Fallback::Allowlist => "allowlist",
        }
    }

    pub fn parse(s: &str) -> Result<Fallback, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "allow" => Ok(Fallback::Allow),
            "deny" => Ok(Fallback::Deny),
            "allowlist" => Ok(Fallback::Allowlist),
            _ => Err(format!("bad fallback {s:?}: allow, deny or allowlist")),
        }
    }

    /// Whether this rule admits a user (`allowlisted`: on the risk allowlist).
    pub fn admits(self, allowlisted: bool) -> bool {
        match self {
            Fallback::Allow => true,
            Fallback::Deny => false,
            Fallback::Allowlist => allowlisted,
        }
    }
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The risk check. Env names (see the README) are in brackets.
#[derive(Debug, Clone)]
pub struct RiskConfig {
    /// The shop's risk service; `None`: no check [`FLASHSALE_RISK_URL`].
    pub url: Option<String>,
    /// One check, connecting included; past it the fallback decides [`FLASHSALE_RISK_TIMEOUT_MS`].
    pub timeout: Duration,
    /// Checks in flight on this instance; past it the fallback decides at once
    /// [`FLASHSALE_RISK_INFLIGHT_MAX`].
    pub inflight_max: usize,
    /// The rule of this instance when the service gives no answer [`FLASHSALE_RISK_FALLBACK`].
    pub fallback: Fallback,
    /// Consecutive timeouts or errors that open the breaker [`FLASHSALE_RISK_BREAKER_FAILURES`].
    pub breaker_failures: u32,
    /// How long the breaker stays open before one probe may call [`FLASHSALE_RISK_BREAKER_OPEN_MS`].
    pub breaker_open: Duration,
    /// Accepted request keys remembered so a retry skips the service (memory bound).
    pub replay_keys_max: usize,
}

impl RiskConfig {
    /// Every default, in one place: `RiskConfig::default()` and the CLI's flags take theirs
    /// from here.
    pub const DEFAULT: RiskConfig = RiskConfig {
        url: None,
        timeout: Duration::from_millis(50),
        inflight_max: 512,
        fallback: Fallback::Allow,
        breaker_failures: 5,
        breaker_open: Duration::from_secs(1),
        replay_keys_max: 262_144,
    };
}

impl Default for RiskConfig {
    fn default() -> RiskConfig {
        RiskConfig::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallbacks_parse_and_admit() {
        for f in [Fallback::Allow, Fallback::Deny, Fallback::Allowlist] {
            assert_eq!(Fallback::parse(&f.to_string()).unwrap(), f);
        }
        assert!(Fallback::parse("maybe").is_err());
        assert!(Fallback::Allow.admits(false));
        assert!(!Fallback::Deny.admits(true));
        assert!(Fallback::Allowlist.admits(true) && !Fallback::Allowlist.admits(false));
    }
}
