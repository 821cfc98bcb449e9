//! Where a sale's buckets live on Redis: the hash tag of each bucket's keys ([`bucket_tag`]),
//! salted so that the buckets land on distinct primaries ([`place`]). Pure: the slot map it
//! places over is read by the ledger (`CLUSTER SLOTS`) and passed in as `primary_of`.

use flashsale_core::buckets::{self, BUCKETS_MAX};
use flashsale_core::SkuId;

/// Most salts [`place`] tries for one bucket. Bounded so placement always ends; with a fair
/// slot function and 64 primaries, 1024 salts miss the one free primary left with odds
/// (63/64)^1024 ≈ 1e-7.
pub const SALTS_MAX: u32 = 1_024;
/// The text inside the `{}` hash tag of `bucket`'s keys. Bucket 0 keeps the sale's own tag
/// (the sku, as without buckets; its salt is ignored, always 0). Other buckets add their
/// number and the salt [`place`] chose: `<sku>.<bucket>.<salt>`. The dots keep it apart from
/// any sku's tag (digits only).
pub fn bucket_tag(sku: SkuId, bucket: u16, salt: u32) -> String {
    if bucket == 0 {
        sku.to_string()
    } else {
        format!("{sku}.{bucket}.{salt}")
    }
}

/// A salt per bucket (bucket 0 always 0) so that the `n` buckets of `sku` land on distinct
/// primaries when there are at least `n` (`primaries_len`), and as evenly as possible
/// otherwise. `primary_of(tag)` says which primary, `0..primaries_len`, serves keys tagged
/// `{tag}` (on Redis Cluster: the owner of the slot of the tag).
///
/// Greedy, one bucket at a time: of the salts `0..SALTS_MAX`, the first whose primary holds
/// the fewest buckets so far. The salts are part of the sale's definition, stored with it and
/// never recomputed: a reshard changes `primary_of`, and a new salt would move a bucket's keys.
pub fn place(
    sku: SkuId,
    n: u16,
    primaries_len: usize,
    primary_of: impl Fn(&str) -> usize,
) -> Vec<u32> {
    assert!(
        buckets::valid_count(n),
        "bucket count {n} not in 1..={BUCKETS_MAX}"
    );
    assert!(primaries_len >= 1, "no primary");
    let mut buckets_of = vec![0u32; primaries_len];
    let mut salts = Vec::with_capacity(usize::from(n));
    for bucket in 0..n {
        let (salt, primary) = pick_salt(sku, bucket, &buckets_of, &primary_of);
        buckets_of[primary] += 1;
        salts.push(salt);
    }
    salts
}

/// The first salt of `bucket` whose primary holds the fewest buckets, and that primary. Stops
/// at a primary with the fewest of all, since no salt can do better.
fn pick_salt(
    sku: SkuId,
    bucket: u16,
    buckets_of: &[u32],
    primary_of: &impl Fn(&str) -> usize,
) -> (u32, usize) {
    let salts = if bucket == 0 { 1 } else { SALTS_MAX };
    let fewest = *buckets_of.iter().min().expect("at least one primary");
    let mut best: Option<(u32, usize)> = None;
    for salt in 0..salts {
        let primary = primary_of(&bucket_tag(sku, bucket, salt));
        assert!(primary < buckets_of.len(), "primary {primary} out of range");
        if best.is_none_or(|(_, p)| buckets_of[primary] < buckets_of[p]) {
            best = Some((salt, primary));
        }
        if buckets_of[primary] == fewest {
            break;
        }
    }
    best.expect("at least one salt")
}

#[cfg(test)]
mod tests {
    use super::*;

    const COUNTS: [u16; 5] = [1, 2, 3, 7, 64];

    #[test]
    fn bucket_zero_keeps_the_sale_tag() {
        assert_eq!(bucket_tag(SkuId(42), 0, 0), "42");
        assert_eq!(bucket_tag(SkuId(42), 0, 9), "42");
        assert_eq!(bucket_tag(SkuId(42), 3, 5), "42.3.5");
        assert_eq!(bucket_tag(SkuId(42), 63, 0), "42.63.0");
    }

    /// A fake cluster: FNV-1a of the tag, mod `k` primaries.
    fn fnv_primary(k: usize) -> impl Fn(&str) -> usize {
        move |tag: &str| {
            let hash = tag.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
            });
            (hash % k as u64) as usize
        }
    }

    fn primaries_used(sku: SkuId, salts: &[u32], k: usize) -> Vec<usize> {
        let primary_of = fnv_primary(k);
        let mut per_primary = vec![0; k];
        for (b, &salt) in salts.iter().enumerate() {
            per_primary[primary_of(&bucket_tag(sku, b as u16, salt))] += 1;
        }
        per_primary
    }

    #[test]
    fn buckets_land_on_distinct_primaries_when_there_are_enough() {
        for sku in 1..=50 {
            for n in COUNTS {
                for k in [usize::from(n), usize::from(n) + 1, 64] {
                    let salts = place(SkuId(sku), n, k, fnv_primary(k));
                    assert_eq!(salts.len(), usize::from(n));
                    assert_eq!(salts[0], 0);
                    assert!(salts.iter().all(|&s| s < SALTS_MAX));
                    let used = primaries_used(SkuId(sku), &salts, k);
                    assert!(used.iter().all(|&c| c <= 1), "sku {sku} n {n} k {k}");
                }
            }
        }
    }

    #[test]
    fn buckets_spread_evenly_over_fewer_primaries() {
        for sku in 1..=50 {
            for (n, k) in [(2u16, 1usize), (3, 2), (7, 3), (64, 3), (64, 10), (64, 63)] {
                let salts = place(SkuId(sku), n, k, fnv_primary(k));
                assert_eq!(salts[0], 0);
                let used = primaries_used(SkuId(sku), &salts, k);
                let (max, min) = (used.iter().max().unwrap(), used.iter().min().unwrap());
                assert!(max - min <= 1, "sku {sku} n {n} k {k}: {used:?}");
            }
        }
        let once = place(SkuId(9), 64, 10, fnv_primary(10));
        assert_eq!(place(SkuId(9), 64, 10, fnv_primary(10)), once);
    }
}
