//! Gateway protections in front of the handlers.
//!
//! - [`config`]: `GatewayConfig`, every knob and its default.
//! - [`ratelimit`]: governor token buckets per instance, sale, user and client IP.
//! - [`blacklist`]: blocked users and IPs, and token-only sales, behind `GuardStore`
//!   (Redis sets or the SQLite database), cached per instance and refreshed in the background.
//! - [`pressure`]: per-sale in-flight limit (hot-sale isolation) and back-pressure (BUSY).
//! - [`scalping`]: single-use purchase tokens, HMAC-bound to user, sale and expiry.
//! - [`listener`]: a connection cap, and the peer address of each request.
//! - [`limits`]: header limits, in-flight cap and the request timeout, all in our error shape.
//! - [`routes`]: admin API for the blacklist and token sales; the purchase-token route.
//! - [`routing`]: where a sale lives: the configured ledger, or `flashsale_redis::RoutedLedger`
//!   (named hot sales on a dedicated Redis).
//!
//! Per request the gateway does O(1) work and no I/O, except the single-use check of a
//! purchase token (one Redis `SET NX` on the Redis deployment, only for token-only sales).

pub mod blacklist;
pub mod config;
pub mod limits;
pub mod listener;
pub mod pressure;
pub mod ratelimit;
pub mod routes;
pub mod routing;
pub mod scalping;

use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use flashsale_core::{ErrorCode, SkuId, UserId};

pub use blacklist::{GuardStore, Guards, MemoryGuards};
pub use config::{GatewayConfig, Rate};
use pressure::{Bounds, SaleGates};
use ratelimit::RateLimits;
use scalping::PurchaseTokens;

use crate::error::AppError;
use crate::state::Inner;

pub struct Gateway {
    pub config: GatewayConfig,
    pub rates: RateLimits,
    pub guards: Guards,
    pub gates: SaleGates,
    pub tokens: PurchaseTokens,
    /// Requests in flight on this instance (`inflight_max`).
    pub inflight: Arc<tokio::sync::Semaphore>,
}

impl Gateway {
    pub fn new(config: GatewayConfig, jwt_secret: &str, store: Arc<dyn GuardStore>) -> Gateway {
        Gateway {
            rates: RateLimits::new(&config),
            guards: Guards::new(store),
            gates: SaleGates::new(config.sale_inflight_max),
            tokens: PurchaseTokens::new(jwt_secret, config.purchase_token_ttl),
            inflight: Arc::new(tokio::sync::Semaphore::new(config.inflight_max.max(1))),
            config,
        }
    }

    /// The client's IP: the connection's peer, or the first `X-Forwarded-For` hop when the
    /// proxy in front is trusted. `None` when the request came without a connection (tests).
    pub fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        if self.config.trust_forwarded_for {
            let forwarded = parts
                .headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .and_then(|v| v.trim().parse().ok());
            if forwarded.is_some() {
                return forwarded;
            }
        }
        parts
            .extensions
            .get::<ConnectInfo<listener::ClientAddr>>()
            .map(|c| c.0 .0.ip())
    }

    /// Every authenticated user request: blacklist (403), then IP, user and instance limits.
    pub fn check_user(&self, parts: &Parts, user: UserId) -> Result<(), AppError> {
        let ip = self.client_ip(parts);
        if self.guards.user_blocked(user) || ip.is_some_and(|ip| self.guards.ip_blocked(ip)) {
            metrics::counter!(flashsale_core::metric_names::BLACKLISTED).increment(1);
            return Err(AppError::new(
                ErrorCode::Blacklisted,
                "this user or address is blocked",
            ));
        }
        self.rates.check_request(user, ip)
    }

    /// A purchase of `sku`: the sale's rate, its purchase token when required, back-pressure
    /// and the sale's in-flight limit. Hold the permit until the purchase is answered.
    pub async fn admit_purchase(
        &self,
        sku: SkuId,
        user: UserId,
        request_key: &str,
        token: Option<&str>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, AppError> {
        self.rates.check_sale(sku)?;
        let permit = self.gates.admit(sku)?;
        if self.guards.token_required(sku) {
            let token = token.ok_or_else(|| {
                AppError::new(
                    ErrorCode::Forbidden,
                    "this sale requires a purchase token: POST /api/v1/sales/{sku_id}/purchase-token",
                )
            })?;
            let verified = self.tokens.verify(token, user, sku)?;
            let fresh = self
                .guards
                .store
                .consume_token(&verified.jti, request_key, verified.remaining)
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

/// The gateway's periodic work as one worker, stopped and joined with the others at
/// shutdown: the blacklist reload, the rate limiters' sweep and the back-pressure monitor.
/// It holds the state weakly: a state dropped without a shutdown ends it too.
pub struct GatewayWorker {
    state: Weak<Inner>,
}

impl GatewayWorker {
    pub fn new(state: &crate::state::AppState) -> GatewayWorker {
        GatewayWorker {
            state: Arc::downgrade(state.inner()),
        }
    }
}

/// The shortest period of a gateway ticker, whatever the settings say.
const TICK_MIN: Duration = Duration::from_millis(10);

#[async_trait::async_trait]
impl crate::workers::Worker for GatewayWorker {
    fn name(&self) -> &'static str {
        "gateway"
    }

    async fn run(
        self: Box<Self>,
        mut shutdown: tokio::sync::broadcast::Receiver<()>,
    ) -> anyhow::Result<()> {
        let Some(c) = self.state.upgrade().map(|st| st.gateway.config.clone()) else {
            return Ok(());
        };
        let every = |d: Duration| {
            let mut tick = tokio::time::interval(d.max(TICK_MIN));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        };
        let (mut refresh, mut sweep, mut monitor_tick) = (
            every(c.blacklist_refresh),
            every(c.limiter_sweep),
            every(c.backpressure_interval),
        );
        loop {
            tokio::select! {
                _ = shutdown.recv() => return Ok(()),
                _ = refresh.tick() => match self.state.upgrade() {
                    Some(st) => refresh_guards(&st).await,
                    None => return Ok(()),
                },
                _ = sweep.tick() => match self.state.upgrade() {
                    Some(st) => st.gateway.rates.sweep(),
                    None => return Ok(()),
                },
                _ = monitor_tick.tick() => match self.state.upgrade() {
                    Some(st) => monitor(&st).await,
                    None => return Ok(()),
                },
            }
        }
    }
}

async fn refresh_guards(st: &Inner) {
    use std::sync::atomic::Ordering;
    let failing = &st.gateway.guards.failing;
    match st.gateway.guards.refresh().await {
        // One line per change, not one per tick while the store is down.
        Err(e) if !failing.swap(true, Ordering::Relaxed) => {
            tracing::warn!(error = %e, "blacklist refresh failed; keeping the last copy")
        }
        Ok(()) if failing.swap(false, Ordering::Relaxed) => {
            tracing::info!("blacklist refresh works again")
        }
        _ => {}
    }
}

/// One back-pressure pass over every sale this instance has seen purchases for.
async fn monitor(st: &Inner) {
    let c = &st.gateway.config;
    let bounds = Bounds {
        lag: c.backpressure_lag,
        queue: c.backpressure_queue,
    };
    for gate in st.gateway.gates.all() {
        let sku = gate.sku;
        let queue = st.batcher.queue_depth(sku) as u64;
        let streamed = st.ledger.durability() == flashsale_core::Durability::Streamed;
        let lag = if bounds.lag > 0 && streamed {
            stream_lag(st, sku)
                .await
                .unwrap_or(gate.backlog.load(std::sync::atomic::Ordering::Relaxed))
        } else {
            0
        };
        let change = st.gateway.gates.observe(&gate, lag, queue, bounds);
        if let (Some(engaged), true) = (change, c.backpressure_auto_pause) {
            auto_pause(st, &gate, engaged).await;
        }
    }
}

/// Hot `seq` minus the database's `applied_seq`: events accepted but not yet persisted.
async fn stream_lag(st: &Inner, sku: SkuId) -> Option<u64> {
    let hot = st.ledger.counters(sku).await.ok()??;
    let stored = st.store.sale(sku).await.ok()??;
    Some(hot.seq.saturating_sub(stored.counters.seq))
}

async fn auto_pause(st: &Inner, gate: &pressure::SaleGate, engaged: bool) {
    use std::sync::atomic::Ordering;
    if !engaged && !gate.auto_paused.load(Ordering::Relaxed) {
        return;
    }
    let (from, to) = pressure::auto_transition(engaged);
    if !engaged && !operator_left_it_live(st, gate.sku).await {
        // An operator paused or ended the sale while it was auto-paused: theirs now.
        gate.auto_paused.store(false, Ordering::Relaxed);
        return;
    }
    match st.ledger.set_state_if(gate.sku, from, to).await {
        Ok(changed) => {
            gate.auto_paused
                .store(engaged && changed, Ordering::Relaxed);
            st.sales.forget(gate.sku);
            tracing::warn!(sku = gate.sku.0, ?to, changed, "back-pressure auto-pause");
        }
        Err(e) => tracing::warn!(sku = gate.sku.0, error = %e, "auto-pause failed"),
    }
}

/// The operator's state in the database is still `live` (the hot copy's state is the one
/// the auto-pause changed).
async fn operator_left_it_live(st: &Inner, sku: SkuId) -> bool {
    matches!(st.store.sale(sku).await, Ok(Some(s)) if s.sale.state == flashsale_core::SaleState::Live)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gateway's per-purchase work, without I/O: `cargo test -p flashsale-server --release
    /// --lib gateway::tests::per_purchase_cost -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore]
    async fn per_purchase_cost() {
        let huge = Rate::new(1_000_000_000, 1_000_000_000);
        let config = GatewayConfig {
            rate_instance: huge,
            rate_sale: huge,
            rate_user: huge,
            rate_ip: huge,
            rate_ip_exempt_loopback: false,
            ..GatewayConfig::default()
        };
        let g = Gateway::new(config, "s", Arc::new(MemoryGuards::default()));
        let n = 1_000_000u64;
        let started = std::time::Instant::now();
        for i in 0..n {
            let user = UserId(i % 100_000 + 1);
            assert!(!g.guards.user_blocked(user));
            let ip: IpAddr = "127.0.0.1".parse().unwrap();
            assert!(!g.guards.ip_blocked(ip));
            g.rates.check_request(user, Some(ip)).unwrap();
            let permit = g.admit_purchase(SkuId(1), user, "1:a", None).await.unwrap();
            drop(permit);
        }
        let ns = started.elapsed().as_nanos() as u64 / n;
        println!("gateway checks: {ns} ns per purchase");
    }
}
