//! `AppState`: what every handler shares. It holds the parts (ledger, store, batcher, caches,
//! gateway, journal, dashboard readings) and depends on their modules; none of them depends
//! on it: only handlers (`routes`, `*::routes`), middleware and workers read the state.

use std::sync::Arc;

use flashsale_core::{Ledger, OrderStore};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::auth::Auth;
use crate::bucket_view::BucketCache;
use crate::gateway::{BlacklistStore, Gateway, MemoryBlacklist};
use crate::risk::RiskCheck;
pub use crate::tunables::Tunables;
use flashsale_core::admission::AdmissionBook;
use flashsale_engine::admission::{Admission, AdmissionConfig};
use flashsale_engine::batcher::Batcher;
use flashsale_engine::breaker::Breaker;
use flashsale_engine::cache::{SaleCache, SoldOutFlags};
use flashsale_engine::reconcile::{Journal, Reconciler};

/// Consecutive hot-ledger failures that open the breaker, and how long it stays open before
/// one request may try again.
const BREAKER_FAILURES_MAX: u32 = 5;
const BREAKER_OPEN_MS: i64 = 1_000;

/// The handle handlers get: cheap to clone, derefs to [`Shared`].
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The parts every handler and worker shares.
pub struct Shared {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub batcher: Batcher,
    pub auth: Auth,
    pub sales: SaleCache,
    /// Bucketed sales' per-bucket counters, kept as long as the sales' counters.
    pub buckets: BucketCache,
    /// Shared with the batcher, which sets them; restocks and state changes clear them.
    pub sold_out: Arc<SoldOutFlags>,
    pub breaker: Breaker,
    pub metrics: PrometheusHandle,
    pub tunables: Tunables,
    pub gateway: Gateway,
    /// The shop's risk service, asked before the hot ledger.
    pub risk: RiskCheck,
    /// Promises not yet in the database (accepted purchases: the batcher; resolutions: the
    /// order routes), for the reconciler's loss report.
    pub journal: Arc<Journal>,
    /// Sales whose copy a request found fenced or missing, for the reconcile worker.
    pub nudges: flashsale_engine::reconcile::Nudges,
    /// Per-sale answers and readings for the live dashboard.
    pub dashboard: crate::dashboard::Dashboard,
    /// Queue and draw sales' admission (`None` without an admission book: such sales then
    /// admit no one, and their purchases answer 403 ADMISSION_REQUIRED).
    pub admission: Option<Arc<Admission>>,
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// The shared parts themselves (workers hold them weakly).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.0
    }

    pub fn new(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        auth: Auth,
        tunables: Tunables,
    ) -> AppState {
        AppState::with_blacklist(
            ledger,
            store,
            auth,
            tunables,
            Arc::new(MemoryBlacklist::default()),
        )
    }

    /// With the blacklist and token-sale flags kept in `blacklist` (Redis or the database).
    pub fn with_blacklist(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        auth: Auth,
        tunables: Tunables,
        blacklist: Arc<dyn BlacklistStore>,
    ) -> AppState {
        AppState::with_admission(ledger, store, auth, tunables, blacklist, None)
    }

    /// With the admission state of queue and draw sales kept in a book (the sale's Redis
    /// slot, or the embedded ledger's database), run by its settings.
    pub fn with_admission(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        auth: Auth,
        tunables: Tunables,
        blacklist: Arc<dyn BlacklistStore>,
        book: Option<(Arc<dyn AdmissionBook>, AdmissionConfig)>,
    ) -> AppState {
        let admission = book.map(|(book, config)| {
            let secret = auth.secret().as_bytes();
            Arc::new(Admission::new(book, secret, config))
        });
        let gateway = Gateway::new(tunables.gateway.clone(), auth.secret(), blacklist);
        let journal = Arc::new(Journal::default());
        let sold_out = Arc::new(SoldOutFlags::new(tunables.cache_ttl));
        // `Server::start` refuses a bad risk URL before building the state.
        let risk = RiskCheck::new(tunables.risk.clone()).expect("valid risk settings");
        let inner = Arc::new(Shared {
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
            buckets: BucketCache::new(tunables.cache_ttl),
            sold_out,
            breaker: Breaker::new(BREAKER_FAILURES_MAX, BREAKER_OPEN_MS),
            metrics: crate::metrics::handle(),
            tunables,
            gateway,
            risk,
            journal,
            nudges: Default::default(),
            dashboard: Default::default(),
            admission,
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
