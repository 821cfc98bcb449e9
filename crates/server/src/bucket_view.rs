//! The per-bucket counters of a bucketed sale, as `GET /api/v1/sales/{sku}` and the dashboard
//! show them: the JSON of the engine's reading ([`Buckets`]: the hot ledger's, else the
//! system of record's rows, else nothing). The sale's own counters are the sum over its
//! buckets and are read as before.

use flashsale_core::{BucketRow, Counters, HotBuckets};
use flashsale_engine::shop::Buckets;
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

impl From<&Buckets> for BucketFields {
    fn from(b: &Buckets) -> BucketFields {
        match b {
            Buckets::None => BucketFields::default(),
            Buckets::Hot(hot) => BucketFields::hot(hot),
            Buckets::Database { rows, total } => BucketFields::database(rows, *total),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A copy's counters after 9 events (the sale views' tests use them too).
    pub(crate) fn counters(total: u64, available: u64, reserved: u64, sold: u64) -> Counters {
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
