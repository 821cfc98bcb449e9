//! The risk client as the engine's [`RiskGate`]: the purchase use case asks it between the
//! local refusals and the ledger. A retry of a purchase accepted here skips the service; with
//! no answer, the sale's fallback rule (else this instance's) decides, the allowlist first.

use std::net::IpAddr;

use flashsale_core::metric_names::{RISK_FALLBACKS, RISK_REPLAYS};
use flashsale_core::PurchaseRequest;
use flashsale_engine::shop::{RiskDenial, RiskGate, Screen};

use super::{Fallback, RiskCheck, RiskQuery, Verdict};
use crate::gateway::Blacklist;

/// One purchase's risk check: the client, the gateway's lists (allowlist, sales' fallback
/// rules) and the buyer's address.
pub struct PurchaseGate<'a> {
    pub risk: &'a RiskCheck,
    pub lists: &'a Blacklist,
    pub ip: Option<IpAddr>,
}

#[async_trait::async_trait]
impl RiskGate for PurchaseGate<'_> {
    async fn screen(&self, req: &PurchaseRequest) -> Screen {
        if !self.risk.enabled() {
            return Screen::Pass;
        }
        if self.risk.replays.contains(req.sku_id, &req.key()) {
            metrics::counter!(RISK_REPLAYS).increment(1);
            return Screen::Pass;
        }
        match self.risk.ask(&RiskQuery::new(req, self.ip)).await {
            Verdict::Allow => Screen::Pass,
            Verdict::Deny(reason) => Screen::Refuse(by_service(&reason)),
            Verdict::NoAnswer(why) => self.fallback(req, why.as_str()),
        }
    }

    fn accepted(&self, req: &PurchaseRequest) {
        if self.risk.enabled() {
            self.risk.replays.remember(req.sku_id, &req.key());
        }
    }
}

const REFUSED: &str = "refused by the shop's risk check";

fn by_service(reason: &str) -> RiskDenial {
    let message = match reason {
        "" => REFUSED.to_owned(),
        reason => format!("{REFUSED}: {reason}"),
    };
    RiskDenial {
        by: "service",
        message,
    }
}

impl PurchaseGate<'_> {
    /// The fallback rule's word while the service gives no answer (`why`).
    fn fallback(&self, req: &PurchaseRequest, why: &'static str) -> Screen {
        let rule = self.rule(req);
        let admitted = rule.admits(self.lists.risk_allowed(req.user_id));
        let decision = if admitted { "allow" } else { "deny" };
        metrics::counter!(RISK_FALLBACKS, "reason" => why, "decision" => decision).increment(1);
        if admitted {
            return Screen::Pass;
        }
        let message = format!(
            "the risk check gave no answer ({why}); the sale's fallback rule \
             ({rule}) refuses this user"
        );
        Screen::Refuse(RiskDenial {
            by: "fallback",
            message,
        })
    }

    /// The sale's own fallback rule, else this instance's.
    fn rule(&self, req: &PurchaseRequest) -> Fallback {
        let own = self.lists.risk_fallback(req.sku_id);
        own.unwrap_or(self.risk.config().fallback)
    }
}
