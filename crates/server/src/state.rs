//! `AppState`: what every handler shares.

use std::sync::Arc;
use std::time::Duration;

use flashsale_core::{Ledger, OrderStore};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::auth::Auth;
use crate::batcher::Batcher;
use crate::breaker::Breaker;
use crate::cache::{SaleCache, SoldOutFlags};
use crate::gateway::{Gateway, GatewayConfig, GuardStore, MemoryGuards};

/// Tunables of the request path. Every queue and batch has a bound.
#[derive(Debug, Clone)]
pub struct Limits {
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
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            batch_max: 256,
            queue_cap: 8_192,
            body_bytes_max: 4_096,
            request_timeout: Duration::from_secs(10),
            cache_ttl: Duration::from_secs(1),
            accepted_keys_max: 1_000_000,
            gateway: GatewayConfig::default(),
        }
    }
}

/// Consecutive hot-ledger failures that open the breaker, and how long it stays open before
/// one request may try again.
const BREAKER_FAILURES_MAX: u32 = 5;
const BREAKER_OPEN_MS: i64 = 1_000;

#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub batcher: Batcher,
    pub auth: Auth,
    pub sales: SaleCache,
    /// Shared with the batcher, which sets them; restocks and state changes clear them.
    pub sold_out: Arc<SoldOutFlags>,
    pub breaker: Breaker,
    pub metrics: PrometheusHandle,
    pub limits: Limits,
    pub gateway: Gateway,
    /// Promises not yet in the database (accepted purchases: the batcher; resolutions: the
    /// order routes), for the reconciler's loss report.
    pub journal: Arc<crate::reconcile::Journal>,
    /// Sales whose copy a request found fenced or missing, for the reconcile worker.
    pub nudges: crate::reconcile::Nudges,
    /// Per-sale answers and readings for the live dashboard.
    pub dashboard: crate::dashboard::Dashboard,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// The shared state itself (workers hold it weakly).
    pub fn inner(&self) -> &Arc<Inner> {
        &self.0
    }

    pub fn new(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        auth: Auth,
        limits: Limits,
    ) -> AppState {
        AppState::with_guards(
            ledger,
            store,
            auth,
            limits,
            Arc::new(MemoryGuards::default()),
        )
    }

    /// With the blacklist and token-sale flags kept in `guards` (Redis or the database).
    pub fn with_guards(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        auth: Auth,
        limits: Limits,
        guards: Arc<dyn GuardStore>,
    ) -> AppState {
        let gateway = Gateway::new(limits.gateway.clone(), auth.secret(), guards);
        let journal = Arc::new(crate::reconcile::Journal::default());
        let sold_out = Arc::new(SoldOutFlags::new(limits.cache_ttl));
        let inner = Arc::new(Inner {
            batcher: Batcher::with_flags(
                ledger.clone(),
                limits.batch_max,
                limits.queue_cap,
                sold_out.clone(),
                limits.accepted_keys_max,
                journal.clone(),
            ),
            ledger,
            store,
            auth,
            sales: SaleCache::new(limits.cache_ttl),
            sold_out,
            breaker: Breaker::new(BREAKER_FAILURES_MAX, BREAKER_OPEN_MS),
            metrics: crate::metrics::handle(),
            limits,
            gateway,
            journal,
            nudges: Default::default(),
            dashboard: Default::default(),
        });
        let weak = Arc::downgrade(&inner);
        inner.ledger.on_restock(Arc::new(move |sku| {
            if let Some(inner) = weak.upgrade() {
                inner.sold_out.clear(sku);
            }
        }));
        AppState(inner)
    }
}
