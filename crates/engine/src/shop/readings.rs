//! What the live dashboard reads: every sale shown with its stock (hot when the ledger has
//! it: the database lags the persister), a queue sale's counts, a bucketed sale's buckets;
//! and for operators the ledger's kind, the breaker, a sale's sold-out flag and its last
//! reconciliation.

use flashsale_core::admission::QueueCounts;
use flashsale_core::ledger::StoredSale;
use flashsale_core::{AdmissionMode, Counters, ReconcileRun, RequestKey, SaleState, SkuId};

use super::buckets::Buckets;
use super::{Shop, ShopError};

/// One sale as the dashboard shows it.
#[derive(Debug, Clone)]
pub struct SaleReading {
    pub stored: StoredSale,
    /// The hot counters when the ledger has the sale, else the database's.
    pub counters: Counters,
    /// A queue sale's counts (`None` for other sales, or when admission does not answer).
    pub queue: Option<QueueCounts>,
    pub buckets: Buckets,
}

impl Shop {
    /// The sales shown (live first, then paused, scheduled, ended; newest first within
    /// each), at most `max`, each read.
    pub async fn sale_readings(&self, max: usize) -> Result<Vec<SaleReading>, ShopError> {
        let mut sales = self.store.sales().await?;
        let rank = |s: &SaleState| match s {
            SaleState::Live => 0,
            SaleState::Paused => 1,
            SaleState::Scheduled => 2,
            SaleState::Ended => 3,
        };
        sales.sort_by_key(|s| (rank(&s.sale.state), std::cmp::Reverse(s.sale.sku_id.0)));
        sales.truncate(max);
        let mut read = Vec::with_capacity(sales.len());
        for stored in sales {
            read.push(self.reading(stored).await);
        }
        Ok(read)
    }

    async fn reading(&self, stored: StoredSale) -> SaleReading {
        let counters = self.stock_now(&stored).await;
        let queue = self.queue_counts(&stored).await;
        let buckets = self.buckets_of(&stored).await;
        SaleReading {
            stored,
            counters,
            queue,
            buckets,
        }
    }

    /// Every sale in the database.
    pub async fn sales(&self) -> Result<Vec<StoredSale>, ShopError> {
        Ok(self.store.sales().await?)
    }

    /// The sale's stock: the hot counters when the ledger has the sale (fresher: the
    /// database lags the persister), else the database's.
    pub async fn stock_now(&self, stored: &StoredSale) -> Counters {
        let hot = match stored.sale.state {
            SaleState::Scheduled => None,
            _ => self
                .ledger
                .counters(stored.sale.sku_id)
                .await
                .ok()
                .flatten(),
        };
        hot.unwrap_or(stored.counters)
    }

    /// A draw sale's waitlist position (`None` without admission, or when it does not
    /// answer).
    pub async fn draw_position(&self, sku: SkuId) -> Option<u64> {
        let book = self.admission.as_ref()?.book();
        book.draw_pos(sku).await.ok()
    }

    /// A queue sale's counts (`None` for other sales, without admission, or when it does
    /// not answer).
    pub async fn queue_counts(&self, stored: &StoredSale) -> Option<QueueCounts> {
        if stored.sale.admission.mode != AdmissionMode::Queue {
            return None;
        }
        let book = self.admission.as_ref()?.book();
        book.counts(stored.sale.sku_id, 0).await.ok()
    }

    /// The hot ledger's kind (`redis`, `embedded`…).
    pub fn ledger_kind(&self) -> &'static str {
        self.ledger.kind()
    }

    /// Whether any sale's breaker is open (its hot ledger failed just now).
    pub fn breaker_open(&self) -> bool {
        self.breaker.any_open()
    }

    /// Whether the sale's sold-out flag is set here.
    pub fn sold_out_flag(&self, sku: SkuId) -> bool {
        self.sold_out.is_set(sku)
    }

    /// Whether the sale's sold-out flag answers a request of `key` here (set, and `key` not
    /// an accepted request's).
    pub fn sold_out_answers(&self, sku: SkuId, key: &RequestKey) -> bool {
        self.sold_out.answers(sku, key)
    }

    /// The sale's last reconciler run, if any is recorded (and the database answers).
    pub async fn last_reconcile_run(&self, sku: SkuId) -> Option<ReconcileRun> {
        let runs = self.store.reconcile_runs(Some(sku), 1).await.ok()?;
        runs.into_iter().next()
    }
}
