//! The application: one [`Shop`] owns the engine's parts of a serving process (the hot
//! ledger, the system of record, the batcher, the sale cache, the sold-out flags, the
//! breaker, the loss journal, the nudges to the reconcile worker, admission and the restock
//! wiring) and offers the use cases, each as one method that returns an engine outcome
//! (a domain value, or a [`ShopError`]), never an HTTP type.
//!
//! - [`purchase`](Shop::purchase): sold-out flag → breaker → risk gate → ledger → journal,
//!   in that order, in one function (`purchase.rs`, with the [`Batcher`] it sends through);
//!   [`RiskGate`] is the risk check the caller brings (the server's risk client).
//! - `orders.rs`: an order's view, pay and cancel; `sales.rs`: create, warm, pause / resume /
//!   end, a sale's view; `buckets.rs`: a bucketed sale's per-bucket counters and their cache.
//!
//! The HTTP server holds one `Arc<Shop>` and translates: a handler parses, calls one method
//! and maps the outcome to an answer.

mod admission;
mod buckets;
mod error;
mod events;
mod orders;
mod process;
mod purchase;
mod readings;
mod reconcile;
mod sales;

use std::sync::Arc;
use std::time::Duration;

use flashsale_core::ledger::StoredSale;
use flashsale_core::{ErrorCode, Ledger, OrderStore, SkuId};

use crate::admission::Admission;
use crate::breaker::Breaker;
use crate::cache::{SaleCache, SoldOutFlags};
use crate::reconcile::{Journal, Nudges, Reconciler};
use buckets::BucketCache;

/// The outcomes of admission's use cases.
pub use crate::admission::draw::{DrawView, EntryResult};
pub use crate::admission::{QueueState, QueueStatus};
pub use crate::reconcile::SaleReport;
pub use crate::relay::SinkStatus;
pub use buckets::Buckets;
pub use error::ShopError;
pub use orders::OrderNow;
pub use process::Readiness;
pub use purchase::{
    Batcher, PurchaseRefusal, Purchased, RiskDenial, RiskGate, Screen, ACCEPTED_KEYS_MAX_DEFAULT,
};
pub use readings::SaleReading;
pub use sales::SaleNow;

/// Consecutive hot-ledger failures that open a sale's breaker, and how long it stays open
/// before one request may try again.
const BREAKER_FAILURES_MAX: u32 = 5;
const BREAKER_OPEN_MS: i64 = 1_000;

/// The shop's bounds: the batcher's and the caches'.
#[derive(Debug, Clone, Copy)]
pub struct ShopConfig {
    /// Most purchases of one sale in one ledger call.
    pub batch_max: usize,
    /// Most purchases of one sale waiting for the ledger.
    pub queue_cap: usize,
    /// Sold-out flag and sale cache lifetime.
    pub cache_ttl: Duration,
    /// A sold-out flag remembers at most this many accepted request keys.
    pub accepted_keys_max: usize,
}

impl ShopConfig {
    pub const DEFAULT: ShopConfig = ShopConfig {
        batch_max: 256,
        queue_cap: 8_192,
        cache_ttl: crate::cache::CACHE_TTL_DEFAULT,
        accepted_keys_max: ACCEPTED_KEYS_MAX_DEFAULT,
    };
}

impl Default for ShopConfig {
    fn default() -> ShopConfig {
        ShopConfig::DEFAULT
    }
}

/// The application over one hot ledger and one system of record.
pub struct Shop {
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn OrderStore>,
    batcher: Batcher,
    sales: SaleCache,
    /// Bucketed sales' per-bucket counters, kept as long as the sales' counters.
    buckets: BucketCache,
    /// Shared with the batcher, which sets them; restocks, cancellations and state changes
    /// clear them.
    sold_out: Arc<SoldOutFlags>,
    breaker: Breaker,
    /// Promises not yet in the database (accepted purchases: the batcher; resolutions: pay
    /// and cancel), for the reconciler's loss report.
    journal: Arc<Journal>,
    /// Sales whose copy a request found fenced or missing, for the reconcile worker.
    nudges: Nudges,
    /// Queue and draw sales' admission (`None`: such sales admit no one).
    admission: Option<Arc<Admission>>,
}

impl Shop {
    /// The shop over `ledger` and `store`; `admission` decides who may buy a queue or draw
    /// sale. The ledger's restock notices clear the sale's sold-out flag.
    pub fn new(
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        config: ShopConfig,
        admission: Option<Arc<Admission>>,
    ) -> Arc<Shop> {
        let journal = Arc::new(Journal::default());
        let sold_out = Arc::new(SoldOutFlags::new(config.cache_ttl));
        let batcher = Batcher::with_flags(
            ledger.clone(),
            config.batch_max,
            config.queue_cap,
            sold_out.clone(),
            config.accepted_keys_max,
            journal.clone(),
        );
        let shop = Arc::new(Shop {
            ledger,
            store,
            batcher,
            sales: SaleCache::new(config.cache_ttl),
            buckets: BucketCache::new(config.cache_ttl),
            sold_out,
            breaker: Breaker::new(BREAKER_FAILURES_MAX, BREAKER_OPEN_MS),
            journal,
            nudges: Nudges::default(),
            admission,
        });
        let weak = Arc::downgrade(&shop);
        shop.ledger.on_restock(Arc::new(move |sku| {
            if let Some(shop) = weak.upgrade() {
                shop.sold_out.clear(sku);
            }
        }));
        shop
    }

    /// A reconciler over this shop's ledger, store and loss journal.
    pub fn reconciler(&self) -> Reconciler {
        Reconciler::new(
            self.ledger.clone(),
            self.store.clone(),
            self.journal.clone(),
        )
    }

    /// The sale from the cache, or the database (a stale cached copy when the database does
    /// not answer): what every use case that names a sale reads first.
    pub async fn sale(&self, sku: SkuId) -> Result<Arc<StoredSale>, ShopError> {
        let cached = match self.sales.get(sku) {
            Some(entry) => entry,
            None => match self.store.sale(sku).await {
                Ok(sale) => self.sales.put(sku, sale),
                Err(e) => match self.sales.stale(sku) {
                    Some(sale) => Some(sale),
                    None => return Err(e.into()),
                },
            },
        };
        cached.ok_or(ShopError::Code(ErrorCode::SaleNotFound))
    }

    /// The hot ledger (the server's probes, back-pressure and tests read it).
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.ledger
    }

    /// The system of record.
    pub fn store(&self) -> &Arc<dyn OrderStore> {
        &self.store
    }
}
