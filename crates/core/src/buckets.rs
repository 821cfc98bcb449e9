//! Stock buckets: one sale's stock split over several hot copies so that one hot SKU can use
//! several Redis primaries. Bucket 0 is the sale's own hot copy (today's keys); a sale with one
//! bucket is exactly a sale without buckets.

/// Most buckets one sale may have.
pub const BUCKETS_MAX: u16 = 64;

/// Whether `n` is a bucket count a sale may have.
pub fn valid_count(n: u16) -> bool {
    (1..=BUCKETS_MAX).contains(&n)
}
