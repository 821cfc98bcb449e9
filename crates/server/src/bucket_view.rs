//! The per-bucket counters of a bucketed sale, as `GET /api/v1/sales/{sku}` and the dashboard
//! show them: the hot ledger's buckets when it answers (fresher: the database lags the
//! persister), else the system of record's bucket rows, else nothing. Nothing is what a sale
//! of one bucket shows, and what a bucketed sale on the embedded ledger shows: that ledger
//! runs the sale as one book, so it has no buckets to read and stores no bucket rows. The
//! sale's own counters are the sum over its buckets and are read as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flashsale_core::ledger::StoredSale;
use flashsale_core::{BucketRow, Counters, HotBuckets, Ledger, OrderStore, SaleState, SkuId};
use serde::Serialize;
use utoipa::ToSchema;

/// One bucket's stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct BucketCounters {
    /// The bucket, from 0 (the sale's own hot copy) to `buckets` − 1.
    pub bucket: u16,
    /// The units this bucket holds now: its share of the stock, moved by transfers, so not
    /// fixed. Always `available + reserved + sold`.
    pub total: u64,
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
}

impl BucketCounters {
    fn new(bucket: u16, c: &Counters) -> BucketCounters {
        BucketCounters {
            bucket,
            total: c.total,
            available: c.available,
            reserved: c.reserved,
            sold: c.sold,
        }
    }
}

/// Where a sale's per-bucket counters were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BucketSource {
    /// The hot ledger's buckets.
    Hot,
    /// The system of record's bucket rows: the hot ledger did not answer or has no copy.
    Database,
}

/// A bucketed sale's buckets, as a sale's JSON carries them: the three fields are there
/// together or not at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct BucketFields {
    /// One entry per bucket, by bucket. Their `available`, `reserved` and `sold` add up to
    /// the sale's (when read at one moment). Absent for a sale of one bucket, and on the
    /// embedded ledger, which runs a bucketed sale as one book.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket_counters: Option<Vec<BucketCounters>>,
    /// Units that left one bucket and have not reached another yet: the buckets' totals and
    /// this add up to the sale's total.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub in_flight_units: Option<u64>,
    /// Where `bucket_counters` was read: `hot` (the hot ledger) or `database` (the system
    /// of record's bucket rows, when the hot ledger did not answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket_source: Option<BucketSource>,
}

impl BucketFields {
    /// The hot ledger's buckets.
    pub fn hot(hot: &HotBuckets) -> BucketFields {
        let list = hot
            .buckets
            .iter()
            .map(|(b, c)| BucketCounters::new(*b, c))
            .collect();
        BucketFields::of(list, hot.in_flight_units, BucketSource::Hot)
    }

    /// The system of record's bucket rows of a sale whose total is `sale_total`; none for no
    /// rows. The rows do not record the units in flight: they are what the sale's total has
    /// that no bucket holds.
    pub fn database(rows: &[BucketRow], sale_total: u64) -> BucketFields {
        if rows.is_empty() {
            return BucketFields::default();
        }
        let list: Vec<BucketCounters> = rows
            .iter()
            .map(|r| BucketCounters::new(r.bucket, &r.counters))
            .collect();
        let held: u64 = list.iter().map(|b| b.total).sum();
        let in_flight = sale_total.saturating_sub(held);
        BucketFields::of(list, in_flight, BucketSource::Database)
    }

    fn of(mut list: Vec<BucketCounters>, in_flight: u64, source: BucketSource) -> BucketFields {
        list.sort_by_key(|b| b.bucket);
        BucketFields {
            bucket_counters: Some(list),
            in_flight_units: Some(in_flight),
            bucket_source: Some(source),
        }
    }
}

/// The buckets of `stored`'s sale: hot, else the database's rows, else none. Never fails: a
/// sale's view is answered without its buckets rather than not at all.
pub async fn read(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    stored: &StoredSale,
) -> BucketFields {
    // A sale of one bucket costs no more round trips than before. A ledger that runs a
    // bucketed sale as one book (the embedded one) has no per-bucket counters to show, and
    // its database rows are dropped when the book is loaded.
    let sku = stored.sale.sku_id;
    if !ledger.kept_in_buckets(&stored.sale) {
        return BucketFields::default();
    }
    if let Some(hot) = read_hot(ledger, stored).await {
        return BucketFields::hot(&hot);
    }
    match store.buckets(sku).await {
        Ok(rows) => BucketFields::database(&rows, stored.counters.total),
        Err(e) => {
            tracing::debug!(%sku, error = %e, "bucket rows unread; the sale is shown without them");
            BucketFields::default()
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

/// Bucket views by sale, each kept `ttl`: a bucketed sale's view costs a read per bucket,
/// and a sale's page is polled hard during a spike (the sale's counters are cached alike).
pub struct BucketCache {
    ttl: Duration,
    views: Mutex<HashMap<SkuId, (Instant, BucketFields)>>,
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
    ) -> BucketFields {
        let sku = stored.sale.sku_id;
        if let Some(fresh) = self.get(sku) {
            return fresh;
        }
        let view = read(ledger, store, stored).await;
        self.put(sku, &view);
        view
    }

    /// Drops a sale's view: a rebuild may have moved its stock between buckets.
    pub fn forget(&self, sku: SkuId) {
        self.views.lock().expect("bucket cache lock").remove(&sku);
    }

    fn get(&self, sku: SkuId) -> Option<BucketFields> {
        let views = self.views.lock().expect("bucket cache lock");
        views
            .get(&sku)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, v)| v.clone())
    }

    fn put(&self, sku: SkuId, view: &BucketFields) {
        let mut views = self.views.lock().expect("bucket cache lock");
        // Expired views go when another is stored, so ended sales do not stay forever.
        views.retain(|_, (at, _)| at.elapsed() < self.ttl);
        views.insert(sku, (Instant::now(), view.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(total: u64, available: u64, reserved: u64, sold: u64) -> Counters {
        Counters {
            total,
            available,
            reserved,
            sold,
            seq: 9,
        }
    }

    #[test]
    fn hot_buckets_are_listed_by_bucket_with_their_units_in_flight() {
        let hot = HotBuckets {
            buckets: vec![(1, counters(30, 20, 0, 10)), (0, counters(40, 35, 1, 4))],
            in_flight_units: 5,
        };
        let f = BucketFields::hot(&hot);
        let list = f.bucket_counters.expect("a list");
        assert_eq!(list.iter().map(|b| b.bucket).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(list[0], BucketCounters::new(0, &counters(40, 35, 1, 4)));
        assert_eq!(f.in_flight_units, Some(5));
        assert_eq!(f.bucket_source, Some(BucketSource::Hot));
    }

    #[test]
    fn database_rows_give_the_units_in_flight_as_what_no_bucket_holds() {
        let rows = [0, 1, 2].map(|b| BucketRow {
            bucket: b,
            epoch: 3 * 7 + u64::from(b),
            epoch_at_ms: 0,
            counters: counters(30, 25, 0, 5),
        });
        let f = BucketFields::database(&rows, 100);
        assert_eq!(f.bucket_counters.as_ref().map(Vec::len), Some(3));
        assert_eq!(f.in_flight_units, Some(10));
        assert_eq!(f.bucket_source, Some(BucketSource::Database));
        // More held than the sale's total (an in stored before its out: each bucket's stream
        // has its own persister): no negative flight.
        assert_eq!(BucketFields::database(&rows, 80).in_flight_units, Some(0));
    }

    #[test]
    fn no_rows_show_nothing() {
        let f = BucketFields::database(&[], 100);
        assert_eq!(f, BucketFields::default());
        assert_eq!(serde_json::to_value(&f).unwrap(), serde_json::json!({}));
    }
}
