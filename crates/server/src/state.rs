//! `AppState`: what every handler shares. It holds the engine's `Shop` (the use cases over
//! the ledger, the store and their parts) and the HTTP side's parts (auth, gateway, risk
//! client, dashboard readings, settings, metrics) and depends on their modules; none of them
//! depends on it: only handlers (`routes`, `*::routes`), middleware and workers read the
//! state.

use std::sync::Arc;

use flashsale_core::{Ledger, OrderStore};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::auth::Auth;
use crate::gateway::{BlacklistStore, Gateway, MemoryBlacklist};
use crate::risk::RiskCheck;
pub use crate::tunables::Tunables;
use flashsale_core::admission::AdmissionBook;
use flashsale_engine::admission::{Admission, AdmissionConfig};
use flashsale_engine::reconcile::Reconciler;
use flashsale_engine::shop::Shop;

/// The handle handlers get: cheap to clone, derefs to [`Shared`].
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// What every handler and worker shares: the engine's application and the HTTP side's own
/// parts.
pub struct Shared {
    /// The engine's use cases over the ledger, the store and their parts.
    pub shop: Arc<Shop>,
    pub auth: Auth,
    pub metrics: PrometheusHandle,
    pub tunables: Tunables,
    pub gateway: Gateway,
    /// The shop's risk service, asked before the hot ledger.
    pub risk: RiskCheck,
    /// Per-sale answers and readings for the live dashboard.
    pub dashboard: crate::dashboard::Dashboard,
    /// Each sale's public view as last answered (the stock read answers it again).
    pub views: crate::sale_views::SaleViews,
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
        let blacklist = Arc::new(MemoryBlacklist::default());
        AppState::with_admission(ledger, store, auth, tunables, blacklist, None)
    }

    /// With the blacklist and token-sale flags kept in `blacklist` (Redis or the database),
    /// and the admission state of queue and draw sales kept in a book (the sale's Redis slot,
    /// or the embedded ledger's database), run by its settings.
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
        // `Server::start` refuses a bad risk URL before building the state.
        let risk = RiskCheck::new(tunables.risk.clone()).expect("valid risk settings");
        let shop = Shop::new(ledger, store, tunables.shop(), admission);
        AppState(Arc::new(Shared {
            shop,
            auth,
            metrics: crate::metrics::handle(),
            tunables,
            gateway,
            risk,
            dashboard: Default::default(),
            views: Default::default(),
        }))
    }

    /// A reconciler over the shop's ledger, store and loss journal.
    pub fn reconciler(&self) -> Reconciler {
        self.shop.reconciler()
    }
}
