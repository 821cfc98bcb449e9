//! Stock buckets: one sale's stock split over several hot copies so that one hot SKU can use
//! several Redis primaries. Bucket 0 is the sale's own hot copy (today's keys); a sale with one
//! bucket is exactly a sale without buckets.
//!
//! What this module holds, all pure (no I/O, no clock, no randomness):
//! - the bound on the count ([`BUCKETS_MAX`], [`valid_count`]);
//! - where a buyer lives ([`home_bucket`]): every purchase and replay of a buyer goes to one
//!   bucket, so the per-user limit (I3) and replays (I4) stay decided by one atomic script.
//!   Stock moves between buckets, buyers never do;
//! - the initial stock of each bucket ([`split_stock`]);
//! - how buckets share order numbers ([`bucket_of_epoch`], [`bucket_epoch`], [`next_epoch`]): bucket `b` takes
//!   only the epochs `≡ b (mod n)`, so no two buckets can hand out the same number;
//! - how stock moves ([`Transfer`], [`plan_transfers`]): out of a source first, then into the
//!   destination, so a crash midway leaves units in flight, never created or lost.
//!
//! Where the buckets live on Redis (hash tags, salts chosen over the cluster's slot map) is the
//! redis crate's concern (`flashsale_redis::placement`); the domain knows a bucket's salt only
//! as a number the system of record keeps. The reference model of a bucketed sale the tests
//! check against is in the testkit (`flashsale_testkit::bucket_model`).
//!
//! The bucket count of a sale is fixed when it is created: the home of a buyer, the epochs of a
//! bucket and the bucket of an order number all depend on it.

use serde::{Deserialize, Serialize};

use crate::ids::UserId;

/// Most buckets one sale may have.
pub const BUCKETS_MAX: u16 = 64;

/// Whether `n` is a bucket count a sale may have.
pub fn valid_count(n: u16) -> bool {
    (1..=BUCKETS_MAX).contains(&n)
}

/// splitmix64's increment (2^64 / φ).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's finalizer: a fixed bijection of u64 whose output bits all depend on every
/// input bit.
fn mix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The first output of splitmix64 seeded with `x`. Written out here rather than taken from a
/// hasher: std's and aHash's are seeded per process and may change between releases.
fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN))
}

fn assert_count(n: u16) {
    assert!(valid_count(n), "bucket count {n} not in 1..={BUCKETS_MAX}");
}

/// The bucket where `user` buys, among `n`: splitmix64 of the user id, mod `n`. Mixed first
/// because user ids are often sequential or share low bits; never a seeded hasher, because
/// every instance of every release must route a buyer to the same bucket.
///
/// Fixed forever: changing this function (or a sale's `n`) would move buyers to another
/// bucket mid-sale, where their units held and their request replays are not, so the
/// per-user limit and replays would no longer hold.
pub fn home_bucket(user: UserId, n: u16) -> u16 {
    assert_count(n);
    (splitmix64(user.0) % u64::from(n)) as u16
}

/// The initial stock of each of `n` buckets: even, the remainder one unit each to the first
/// buckets, so it sums to `total`. A bucket gets 0 when `total < n`; transfers bring it stock
/// when its buyers come.
pub fn split_stock(total: u64, n: u16) -> Vec<u64> {
    assert_count(n);
    let n = u64::from(n);
    (0..n)
        .map(|b| total / n + u64::from(b < total % n))
        .collect()
}

/// The bucket whose hot copy took `epoch`: its epochs are the numbers `≡ b (mod n)`, so an
/// order number names its bucket without a lookup.
pub fn bucket_of_epoch(epoch: u64, n: u16) -> u16 {
    assert_count(n);
    (epoch % u64::from(n)) as u16
}

/// The epoch of `bucket`'s hot copy when its sale's copy is loaded as epoch `sale_epoch`:
/// `sale_epoch · n + bucket`, so the bucket's epochs are `≡ bucket (mod n)`
/// ([`bucket_of_epoch`] gives the bucket back) and grow with the sale's. With `n == 1` it is
/// `sale_epoch`. The system of record sets it in `sale_buckets` when it hands out a sale
/// epoch; the Redis ledger computes the same in `Layout::epoch_of`.
pub fn bucket_epoch(sale_epoch: u64, bucket: u16, n: u16) -> u64 {
    assert_count(n);
    assert!(bucket < n, "bucket {bucket} of {n}");
    sale_epoch
        .checked_mul(u64::from(n))
        .and_then(|e| e.checked_add(u64::from(bucket)))
        .expect("epochs stay far below u64::MAX / 64")
}

/// The epoch of `bucket`'s next hot copy: the smallest `e > current` with `e % n == bucket`.
/// Buckets never share an epoch, so order numbers (`<sku>-<epoch>-<seq>`) stay unique across
/// the sale (I8). With `n == 1` it is `current + 1`, as without buckets. `current` is the
/// largest epoch taken before, the bucket's own or the sale's across its buckets: either keeps
/// the bucket's epochs growing and apart from the others'. The result is at most `n` past it.
pub fn next_epoch(current: u64, bucket: u16, n: u16) -> u64 {
    assert_count(n);
    assert!(bucket < n, "bucket {bucket} of {n}");
    let n = u64::from(n);
    let base = current - current % n + u64::from(bucket);
    if base > current {
        base
    } else {
        base.checked_add(n).expect("epochs stay far below u64::MAX")
    }
}

/// Units moving from one bucket to another. Out of `from` first (durably: its available and
/// its own total drop by `units`), then into `to` (its available and total grow). In between
/// the units are in flight, counted by neither bucket:
/// `Σ buckets (available + reserved + sold) + units in flight == sale total`.
///
/// `id` is unique within the sale; the destination keeps the ids it took in, so applying the
/// "in" side twice counts once. The out record names `to` and `units`, so a recovery can
/// finish a transfer whose carrier crashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Transfer {
    pub id: u64,
    pub from: u16,
    pub to: u16,
    pub units: u64,
}

/// The transfers that bring the `home` bucket up to `need_units` available, given each
/// bucket's `available` units; ids from `next_id` on.
///
/// - Empty when home already has `need_units`.
/// - Empty too when the other buckets together cannot cover the shortfall: the sale cannot
///   serve this quantity, and only then is the answer SOLD_OUT (no false sold-out). Moving
///   some units anyway would gain nothing.
/// - Otherwise from the richest other buckets first (ties: the lowest bucket), each moving
///   `max(shortfall left, refill_units)` capped at what its source has, until the shortfall is
///   covered: the last units gather where the buyers are, and `refill_units` brings a batch so
///   the next buyers at home need no transfer.
///
/// At most `n − 1` transfers (each other bucket at most once).
pub fn plan_transfers(
    available: &[u64],
    home: u16,
    need_units: u64,
    refill_units: u64,
    next_id: u64,
) -> Vec<Transfer> {
    let home_units = available[usize::from(home)];
    let shortfall_units = need_units.saturating_sub(home_units);
    let others_units: u64 = available.iter().sum::<u64>() - home_units;
    if shortfall_units == 0 || others_units < shortfall_units {
        return Vec::new();
    }
    let mut sources: Vec<u16> = (0..available.len() as u16)
        .filter(|&b| b != home && available[usize::from(b)] > 0)
        .collect();
    sources.sort_by_key(|&b| (std::cmp::Reverse(available[usize::from(b)]), b));
    let mut left_units = shortfall_units;
    let mut plan = Vec::new();
    for from in sources {
        if left_units == 0 {
            break;
        }
        let units = left_units
            .max(refill_units)
            .min(available[usize::from(from)]);
        plan.push(Transfer {
            id: next_id + plan.len() as u64,
            from,
            to: home,
            units,
        });
        left_units = left_units.saturating_sub(units);
    }
    plan
}
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ids::SkuId;

    /// A deterministic PRNG for the tests: splitmix64's stream.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(GOLDEN);
            mix64(self.0)
        }

        fn below(&mut self, k: u64) -> u64 {
            self.next_u64() % k
        }
    }

    const COUNTS: [u16; 5] = [1, 2, 3, 7, 64];

    #[test]
    fn bucket_epochs_name_their_bucket_and_grow_with_the_sale() {
        assert_eq!(bucket_epoch(7, 0, 1), 7);
        assert_eq!(bucket_epoch(1, 0, 3), 3);
        assert_eq!(bucket_epoch(1, 2, 3), 5);
        assert_eq!(bucket_epoch(2, 1, 3), 7);
        for n in COUNTS {
            for sale_epoch in 0..5 {
                for bucket in 0..n {
                    let e = bucket_epoch(sale_epoch, bucket, n);
                    assert_eq!(bucket_of_epoch(e, n), bucket);
                    assert!(e < bucket_epoch(sale_epoch + 1, 0, n));
                }
            }
        }
    }

    #[test]
    fn splitmix64_is_the_reference_function() {
        // The first outputs of the reference splitmix64 seeded with 0 and 1234567.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(1234567), 0x599E_D017_FB08_FC85);
    }

    #[test]
    fn home_buckets_never_change() {
        // Pinned: a change here moves buyers mid-sale (see home_bucket).
        let homes: Vec<u16> = (1..=12).map(|u| home_bucket(UserId(u), 64)).collect();
        assert_eq!(homes, PINNED_HOMES_64);
        let homes: Vec<u16> = (1..=12).map(|u| home_bucket(UserId(u), 3)).collect();
        assert_eq!(homes, PINNED_HOMES_3);
        assert_eq!(home_bucket(UserId(u64::MAX), 7), PINNED_HOME_MAX_7);
        for u in 0..1_000 {
            assert_eq!(home_bucket(UserId(u), 1), 0);
        }
    }

    /// Homes of users 1..=12, computed apart from this crate (a Python splitmix64).
    const PINNED_HOMES_64: [u16; 12] = [1, 14, 45, 10, 26, 0, 23, 54, 36, 10, 29, 3];
    const PINNED_HOMES_3: [u16; 12] = [2, 1, 0, 1, 2, 2, 0, 1, 1, 1, 0, 0];
    const PINNED_HOME_MAX_7: u16 = 0;

    /// Chi-square of bucket counts of users 1..=100k (sequential ids, the usual case), and the
    /// largest and smallest count.
    fn spread(n: u16) -> (f64, u64, u64) {
        let users = 100_000u64;
        let mut counts = vec![0u64; usize::from(n)];
        for u in 1..=users {
            counts[usize::from(home_bucket(UserId(u), n))] += 1;
        }
        let expected = users as f64 / f64::from(n);
        let chi2 = counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        let max = *counts.iter().max().unwrap();
        let min = *counts.iter().min().unwrap();
        (chi2, max, min)
    }

    #[test]
    fn home_buckets_spread_evenly() {
        // Critical values of chi-square at p = 0.001: 13.8 (2 degrees), 103.4 (63 degrees).
        for (n, chi2_max) in [(3u16, 13.8), (64, 103.4)] {
            let (chi2, max, min) = spread(n);
            let mean = 100_000 / u64::from(n);
            assert!(chi2 < chi2_max, "n={n}: chi-square {chi2}");
            assert!(max <= mean + mean / 10 && min >= mean - mean / 10, "n={n}");
        }
    }

    #[test]
    fn stock_splits_evenly_and_sums_to_the_total() {
        assert_eq!(split_stock(10, 3), vec![4, 3, 3]);
        assert_eq!(split_stock(2, 3), vec![1, 1, 0]);
        assert_eq!(split_stock(7, 1), vec![7]);
        assert_eq!(split_stock(128, 64), vec![2; 64]);
        for n in COUNTS {
            for total in [0, 1, 5, 63, 64, 65, 1_000, 1_000_000_000] {
                let split = split_stock(total, n);
                assert_eq!(split.len(), usize::from(n));
                assert_eq!(split.iter().sum::<u64>(), total);
                assert!(split.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
            }
        }
    }

    #[test]
    #[should_panic(expected = "bucket count")]
    fn a_count_out_of_bounds_is_refused() {
        split_stock(1, BUCKETS_MAX + 1);
    }

    #[test]
    fn epochs_of_one_bucket_go_up_by_one() {
        let mut epoch = 0;
        for expected in 1..=5 {
            epoch = next_epoch(epoch, 0, 1);
            assert_eq!(epoch, expected);
            assert_eq!(bucket_of_epoch(epoch, 1), 0);
        }
    }

    #[test]
    fn each_bucket_takes_its_own_epochs() {
        assert_eq!(next_epoch(0, 0, 3), 3);
        assert_eq!(next_epoch(0, 1, 3), 1);
        assert_eq!(next_epoch(0, 2, 3), 2);
        assert_eq!(next_epoch(3, 1, 3), 4);
        assert_eq!(next_epoch(4, 1, 3), 7);
        assert_eq!(next_epoch(5, 0, 3), 6);
        assert_eq!(bucket_of_epoch(7, 3), 1);
        let mut rng = Rng(3);
        for n in COUNTS {
            for _ in 0..1_000 {
                let current = rng.below(1 << 40);
                let bucket = rng.below(u64::from(n)) as u16;
                let e = next_epoch(current, bucket, n);
                assert!(e > current && e - current <= u64::from(n));
                assert_eq!(bucket_of_epoch(e, n), bucket);
            }
        }
    }

    #[test]
    fn buckets_hand_out_disjoint_order_numbers() {
        let n = 7;
        let mut current = 0;
        let mut taken = BTreeMap::new();
        let mut rng = Rng(11);
        for _ in 0..500 {
            let bucket = rng.below(u64::from(n)) as u16;
            let e = next_epoch(current, bucket, n);
            assert_eq!(taken.insert(e, bucket), None, "epoch {e} taken twice");
            current = current.max(e);
        }
        for (e, b) in taken {
            let no = crate::OrderNo::new(SkuId(42), e, 1);
            assert_eq!(bucket_of_epoch(no.epoch(), n), b);
        }
    }

    #[test]
    fn no_transfer_when_home_has_enough() {
        assert!(plan_transfers(&[5, 0, 0], 0, 5, 10, 1).is_empty());
        assert!(plan_transfers(&[1], 0, 1, 0, 1).is_empty());
    }

    #[test]
    fn no_transfer_when_the_sale_cannot_cover() {
        assert!(plan_transfers(&[1, 1, 0], 2, 3, 0, 1).is_empty());
        assert!(plan_transfers(&[0, 0], 0, 1, 5, 1).is_empty());
    }

    #[test]
    fn transfers_take_from_the_richest_first() {
        let t = |id, from, units| Transfer {
            id,
            from,
            to: 1,
            units,
        };
        assert_eq!(plan_transfers(&[2, 0, 5, 1], 1, 3, 0, 7), vec![t(7, 2, 3)]);
        assert_eq!(
            plan_transfers(&[2, 0, 2, 2], 1, 5, 0, 1),
            vec![t(1, 0, 2), t(2, 2, 2), t(3, 3, 1)]
        );
        // A refill batch, capped by what the source has.
        assert_eq!(plan_transfers(&[4, 1, 9], 1, 2, 6, 1), vec![t(1, 2, 6)]);
        assert_eq!(
            plan_transfers(&[4, 1, 3], 1, 7, 6, 1),
            vec![t(1, 0, 4), t(2, 2, 3)]
        );
    }

    #[test]
    fn plans_cover_the_shortfall_in_at_most_n_minus_one_transfers() {
        let mut rng = Rng(5);
        for _ in 0..2_000 {
            let n = COUNTS[rng.below(5) as usize];
            let available: Vec<u64> = (0..n).map(|_| rng.below(4)).collect();
            let home = rng.below(u64::from(n)) as u16;
            let need_units = 1 + rng.below(6);
            let refill_units = rng.below(4);
            let plan = plan_transfers(&available, home, need_units, refill_units, 1);
            let home_units = available[usize::from(home)];
            let sale_units: u64 = available.iter().sum();
            let moved_units: u64 = plan.iter().map(|t| t.units).sum();
            assert!(plan.len() < usize::from(n));
            if home_units >= need_units || sale_units < need_units {
                assert!(plan.is_empty());
            } else {
                assert!(home_units + moved_units >= need_units);
            }
            for t in &plan {
                assert!(t.to == home && t.from != home && t.units >= 1);
                assert!(t.units <= available[usize::from(t.from)]);
            }
        }
    }
}
