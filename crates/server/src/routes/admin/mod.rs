//! Admin handlers: [`reconcile`] (reports and repairs), [`gateway`] (the blacklist, token-only
//! sales and the purchase-token route), [`risk`] (the risk allowlist and a sale's fallback rule).

pub mod gateway;
pub mod reconcile;
pub mod risk;
