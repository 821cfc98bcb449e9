//! `AppState`: what every handler shares. It holds the parts (ledger, store, batcher, caches,
//! gateway, journal, dashboard readings) and depends on their modules; none of them depends
//! on it: only handlers (`routes`, `*::routes`), middleware and workers read the state.

use std::sync::Arc;

use flashsale_core::{Ledger, OrderStore};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::auth::Auth;
use crate::batcher::Batcher;
use crate::breaker::Breaker;
use crate::cache::{SaleCache, SoldOutFlags};
use crate::gateway::{Gateway, GuardStore, MemoryGuards};
use crate::reconcile::{Journal, Reconciler};
pub use crate::tunables::Tunables;

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
    pub tunables: Tunables,
    pub gateway: Gateway,
    /// Promises not yet in the database (accepted purchases: the batcher; resolutions: the
    /// order routes), for the reconciler's loss report.
    pub journal: Arc<Journal>,
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
        tunables: Tunables,
    ) -> AppState {
        AppState::with_guards(
            ledger,
            store,
            auth,
            tunables,
            Arc::new(MemoryGuards::default()),
        )
    }

    /// With the blacklist and token-sale flags kept in `guards` (Redis or the database).
    pub fn with_guards(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        auth: Auth,
        tunables: Tunables,
        guards: Arc<dyn GuardStore>,
    ) -> AppState {
        let gateway = Gateway::new(tunables.gateway.clone(), auth.secret(), guards);
        let journal = Arc::new(Journal::default());
        let sold_out = Arc::new(SoldOutFlags::new(tunables.cache_ttl));
        let inner = Arc::new(Inner {
            batcher: Batcher::with_flags(
                ledger.clone(),
                tunables.batch_max,
                tunables.queue_cap,
                sold_out.clone(),
                tunables.accepted_keys_max,
                journal.clone(),
            ),
            ledger,
            store,
            auth,
            sales: SaleCache::new(tunables.cache_ttl),
            sold_out,
            breaker: Breaker::new(BREAKER_FAILURES_MAX, BREAKER_OPEN_MS),
            metrics: crate::metrics::handle(),
            tunables,
            gateway,
            journal,
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

    /// A reconciler over this state's ledger, store and loss journal.
    pub fn reconciler(&self) -> Reconciler {
        Reconciler::new(
            self.ledger.clone(),
            self.store.clone(),
            self.journal.clone(),
        )
    }
}
