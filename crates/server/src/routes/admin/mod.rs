//! Admin handlers: [`events`] (order-event sinks: positions, lag, re-delivery),
//! [`reconcile`] (reports and repairs), [`gateway`] (the blacklist, token-only
//! sales and the purchase-token route), [`risk`] (the risk allowlist and a sale's fallback rule).

pub mod events;
pub mod gateway;
pub mod reconcile;
pub mod risk;
