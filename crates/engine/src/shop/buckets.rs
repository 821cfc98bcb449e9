//! A bucketed sale's per-bucket counters as its view shows them: the hot ledger's buckets
//! when it answers (fresher: the database lags the persister), else the system of record's
//! bucket rows, else nothing. Nothing is what a sale of one bucket shows, and what a
//! bucketed sale on the embedded ledger shows: that ledger runs the sale as one book, so it
//! has no buckets to read and stores no bucket rows. Readings are cached like the sale's
//! counters: a bucketed sale's reading costs a read per bucket, and a sale's page is polled
//! hard during a spike.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flashsale_core::ledger::StoredSale;
use flashsale_core::{BucketRow, HotBuckets, Ledger, OrderStore, SaleState, SkuId};

/// Where a sale's per-bucket counters were read, with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Buckets {
    /// None to show (one bucket, the embedded ledger, or neither source answered).
    #[default]
    None,
    /// The hot ledger's buckets.
    Hot(HotBuckets),
    /// The system of record's bucket rows (never empty), and the sale's total.
    Database { rows: Vec<BucketRow>, total: u64 },
}

/// The buckets of `stored`'s sale: hot, else the database's rows, else none. Never fails: a
/// sale's view is answered without its buckets rather than not at all.
pub async fn read(ledger: &dyn Ledger, store: &dyn OrderStore, stored: &StoredSale) -> Buckets {
    // A sale of one bucket costs no more round trips than before. A ledger that runs a
    // bucketed sale as one book (the embedded one) has no per-bucket counters to show, and
    // its database rows are dropped when the book is loaded.
    let sku = stored.sale.sku_id;
    if !ledger.kept_in_buckets(&stored.sale) {
        return Buckets::None;
    }
    if let Some(hot) = read_hot(ledger, stored).await {
        return Buckets::Hot(hot);
    }
    match store.buckets(sku).await {
        Ok(rows) if rows.is_empty() => Buckets::None,
        Ok(rows) => Buckets::Database {
            rows,
            total: stored.counters.total,
        },
        Err(e) => {
            tracing::debug!(%sku, error = %e, "bucket rows unread; the sale is shown without them");
            Buckets::None
        }
    }
}

/// The hot ledger's buckets, or `None` (not warm yet, no buckets there, or no answer).
async fn read_hot(ledger: &dyn Ledger, stored: &StoredSale) -> Option<HotBuckets> {
    let sku = stored.sale.sku_id;
    // Like the sale's counters: a scheduled sale has no hot copy to ask.
    if stored.sale.state == SaleState::Scheduled {
        return None;
    }
    match ledger.hot_buckets(sku).await {
        Ok(hot) => hot.filter(|h| !h.buckets.is_empty()),
        Err(e) => {
            tracing::debug!(%sku, error = %e, "hot buckets unread; reading the database's");
            None
        }
    }
}

/// Bucket readings by sale, each kept `ttl`.
pub struct BucketCache {
    ttl: Duration,
    views: Mutex<HashMap<SkuId, (Instant, Buckets)>>,
}

impl BucketCache {
    pub fn new(ttl: Duration) -> BucketCache {
        BucketCache {
            ttl,
            views: Mutex::new(HashMap::new()),
        }
    }

    /// [`read`] through the cache.
    pub async fn read(
        &self,
        ledger: &dyn Ledger,
        store: &dyn OrderStore,
        stored: &StoredSale,
    ) -> Buckets {
        let sku = stored.sale.sku_id;
        if let Some(fresh) = self.get(sku) {
            return fresh;
        }
        let view = read(ledger, store, stored).await;
        self.put(sku, &view);
        view
    }

    /// Drops a sale's reading: a rebuild may have moved its stock between buckets.
    pub fn forget(&self, sku: SkuId) {
        self.views.lock().expect("bucket cache lock").remove(&sku);
    }

    fn get(&self, sku: SkuId) -> Option<Buckets> {
        let views = self.views.lock().expect("bucket cache lock");
        views
            .get(&sku)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, v)| v.clone())
    }

    fn put(&self, sku: SkuId, view: &Buckets) {
        let mut views = self.views.lock().expect("bucket cache lock");
        // Expired readings go when another is stored, so ended sales do not stay forever.
        views.retain(|_, (at, _)| at.elapsed() < self.ttl);
        views.insert(sku, (Instant::now(), view.clone()));
    }
}
