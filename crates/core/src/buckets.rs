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
//! - where buckets live ([`bucket_tag`], [`place`]): the hash tag of each bucket's keys, salted
//!   so that the buckets land on distinct primaries;
//! - how stock moves ([`Transfer`], [`plan_transfers`]): out of a source first, then into the
//!   destination, so a crash midway leaves units in flight, never created or lost;
//! - [`BucketModel`], the reference the Redis implementation is checked against: it proves
//!   that whenever demand ≥ stock the sale sells exactly its stock, however the buyers fall
//!   over the buckets, and that no buyer is answered SOLD_OUT while the sale could serve it
//!   (outside the window in which units are in flight).
//!
//! The bucket count of a sale is fixed when it is created: the home of a buyer, the epochs of a
//! bucket and the bucket of an order number all depend on it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{SkuId, UserId};

/// Most buckets one sale may have.
pub const BUCKETS_MAX: u16 = 64;

/// Whether `n` is a bucket count a sale may have.
pub fn valid_count(n: u16) -> bool {
    (1..=BUCKETS_MAX).contains(&n)
}

/// Most salts [`place`] tries for one bucket. Bounded so placement always ends; with a fair
/// slot function and 64 primaries, 1024 salts miss the one free primary left with odds
/// (63/64)^1024 ≈ 1e-7.
pub const SALTS_MAX: u32 = 1_024;

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
    assert_count(n);
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

/// A purchase's outcome in [`BucketModel`], in the order [`crate::SaleBook`] judges them:
/// quantity over the limit, then stock, then the units the buyer already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Accepted,
    SoldOut,
    LimitExceeded,
}

/// What one side of a transfer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferStep {
    /// Moved the units.
    Applied,
    /// This side of this transfer was applied before; nothing changed.
    Replayed,
    /// Not applicable, nothing changed: an out larger than its source's available, an in
    /// whose out is not done (or that differs from it), a bucket out of range.
    Refused,
}

/// One bucket's counters in [`BucketModel`]. Direct mode: nothing is reserved, so
/// `available + sold == total`; `total` moves with transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BucketCounters {
    pub total: u64,
    pub available: u64,
    pub sold: u64,
}

/// One bucket's state in [`BucketModel`]: what its hot copy holds.
#[derive(Debug, Clone, Default)]
struct Bucket {
    counters: BucketCounters,
    /// Units bought by each buyer homed here (the `buyers` hash of its hot copy).
    buyers: BTreeMap<UserId, u64>,
    /// Transfers taken out of this bucket.
    outs: BTreeSet<u64>,
    /// Transfers taken into this bucket: an in applied twice counts once.
    ins: BTreeSet<u64>,
}

/// The reference model of a direct-mode sale over buckets, the one the Redis implementation
/// is checked against. A purchase is answered as one hot copy holding the whole sale's
/// available units would answer it; it is then sold at the buyer's home bucket, which holds
/// the buyer's units, after transfers bring the units home when home is short. (In Redis: the
/// home script answers that it is short, the service reads the other buckets, transfers, and
/// asks home again.) `transfer_out` and `transfer_in` are separate steps so a test can crash
/// between them; [`BucketModel::check`] holds the invariants after any step. Units in flight
/// are not available: while a crashed transfer is unfinished, a buyer may be answered
/// SOLD_OUT for units that are in flight (the documented window), until a recovery finishes
/// it.
///
/// A transfer happens only for a purchase that will be accepted (the limit is judged before
/// units move), so an over-limit buyer cannot make stock churn, and a sale makes at most
/// `(n − 1) ×` its accepted purchases transfers.
#[derive(Debug, Clone)]
pub struct BucketModel {
    total_units: u64,
    refill_units: u64,
    buckets: Vec<Bucket>,
    /// Transfers out and not yet in, by id.
    in_flight: BTreeMap<u64, Transfer>,
    next_transfer_id: u64,
    /// The largest per-user limit a purchase named: what [`BucketModel::check`] holds buyers to.
    limit_max: u32,
}

impl BucketModel {
    /// A fresh sale of `total_units` over `n` buckets ([`split_stock`]); transfers move at
    /// least `refill_units` when their source has them.
    pub fn new(total_units: u64, n: u16, refill_units: u64) -> BucketModel {
        let buckets = split_stock(total_units, n)
            .into_iter()
            .map(|units| Bucket {
                counters: BucketCounters {
                    total: units,
                    available: units,
                    sold: 0,
                },
                ..Bucket::default()
            })
            .collect();
        BucketModel {
            total_units,
            refill_units,
            buckets,
            in_flight: BTreeMap::new(),
            next_transfer_id: 1,
            limit_max: 0,
        }
    }

    pub fn n(&self) -> u16 {
        self.buckets.len() as u16
    }

    pub fn bucket(&self, bucket: u16) -> BucketCounters {
        self.buckets[usize::from(bucket)].counters
    }

    /// Units the sale can sell now: the sum of its buckets' (units in flight excluded).
    pub fn available(&self) -> u64 {
        self.buckets.iter().map(|b| b.counters.available).sum()
    }

    pub fn sold(&self) -> u64 {
        self.buckets.iter().map(|b| b.counters.sold).sum()
    }

    /// Transfers out and not yet in, by id.
    pub fn in_flight(&self) -> Vec<Transfer> {
        self.in_flight.values().copied().collect()
    }

    pub fn in_flight_units(&self) -> u64 {
        self.in_flight.values().map(|t| t.units).sum()
    }

    /// Units `user` bought, as its home bucket holds them.
    pub fn units_held(&self, user: UserId) -> u64 {
        let home = &self.buckets[usize::from(home_bucket(user, self.n()))];
        home.buyers.get(&user).copied().unwrap_or(0)
    }

    /// One purchase of `quantity` (≥ 1) by `user` under the per-user `limit`: judged as one
    /// hot copy would judge it against the whole sale, then sold at the buyer's home bucket,
    /// after transfers if home is short.
    pub fn buy(&mut self, user: UserId, quantity: u32, limit: u32) -> Outcome {
        assert!(quantity >= 1, "quantity is validated before the ledger");
        self.limit_max = self.limit_max.max(limit);
        let quantity_units = u64::from(quantity);
        if quantity > limit {
            return Outcome::LimitExceeded;
        }
        if self.available() < quantity_units {
            return Outcome::SoldOut;
        }
        if self.units_held(user) + quantity_units > u64::from(limit) {
            return Outcome::LimitExceeded;
        }
        let home = home_bucket(user, self.n());
        self.bring_home(home, quantity_units);
        self.sell_at_home(home, user, quantity_units)
    }

    /// Plans the transfers that bring `home` up to `need_units` ([`plan_transfers`]) and takes
    /// their ids; applies nothing.
    pub fn plan(&mut self, home: u16, need_units: u64) -> Vec<Transfer> {
        let available: Vec<u64> = self.buckets.iter().map(|b| b.counters.available).collect();
        let plan = plan_transfers(
            &available,
            home,
            need_units,
            self.refill_units,
            self.next_transfer_id,
        );
        self.next_transfer_id += plan.len() as u64;
        plan
    }

    fn bring_home(&mut self, home: u16, need_units: u64) {
        for transfer in self.plan(home, need_units) {
            assert_eq!(self.transfer_out(transfer), TransferStep::Applied);
            assert_eq!(self.transfer_in(transfer), TransferStep::Applied);
        }
    }

    fn sell_at_home(&mut self, home: u16, user: UserId, quantity_units: u64) -> Outcome {
        let bucket = &mut self.buckets[usize::from(home)];
        let counters = &mut bucket.counters;
        counters.available = counters
            .available
            .checked_sub(quantity_units)
            .expect("transfers brought the units home");
        counters.sold += quantity_units;
        *bucket.buyers.entry(user).or_default() += quantity_units;
        Outcome::Accepted
    }

    /// The out side, at the source bucket: its available and total drop by the units, which
    /// are then in flight.
    pub fn transfer_out(&mut self, transfer: Transfer) -> TransferStep {
        if !self.in_range(transfer) {
            return TransferStep::Refused;
        }
        let source = &mut self.buckets[usize::from(transfer.from)];
        if source.outs.contains(&transfer.id) {
            return TransferStep::Replayed;
        }
        if source.counters.available < transfer.units {
            return TransferStep::Refused;
        }
        source.counters.available -= transfer.units;
        source.counters.total -= transfer.units;
        source.outs.insert(transfer.id);
        self.in_flight.insert(transfer.id, transfer);
        TransferStep::Applied
    }

    /// The in side, at the destination bucket: its available and total grow by the units of a
    /// transfer out and not yet in. Applied twice, it counts once.
    pub fn transfer_in(&mut self, transfer: Transfer) -> TransferStep {
        if !self.in_range(transfer) {
            return TransferStep::Refused;
        }
        let destination = &mut self.buckets[usize::from(transfer.to)];
        if destination.ins.contains(&transfer.id) {
            return TransferStep::Replayed;
        }
        if self.in_flight.get(&transfer.id) != Some(&transfer) {
            return TransferStep::Refused;
        }
        self.in_flight.remove(&transfer.id);
        destination.counters.available += transfer.units;
        destination.counters.total += transfer.units;
        destination.ins.insert(transfer.id);
        TransferStep::Applied
    }

    fn in_range(&self, transfer: Transfer) -> bool {
        let n = self.n();
        transfer.from < n && transfer.to < n && transfer.from != transfer.to && transfer.units > 0
    }

    /// Panics unless every invariant holds: each bucket conserved (`available + sold ==
    /// total`), the sale conserved with its units in flight, each bucket's sold the units of
    /// its buyers, every buyer in its home bucket within the limit, every transfer in flight
    /// out and not in.
    pub fn check(&self) {
        for (b, bucket) in self.buckets.iter().enumerate() {
            self.check_bucket(b as u16, bucket);
        }
        let totals_units: u64 = self.buckets.iter().map(|b| b.counters.total).sum();
        assert_eq!(
            totals_units + self.in_flight_units(),
            self.total_units,
            "sale conservation: buckets' totals + units in flight"
        );
        assert!(self.sold() <= self.total_units);
        for t in self.in_flight.values() {
            assert!(self.buckets[usize::from(t.from)].outs.contains(&t.id));
            assert!(!self.buckets[usize::from(t.to)].ins.contains(&t.id));
        }
    }

    fn check_bucket(&self, b: u16, bucket: &Bucket) {
        let c = bucket.counters;
        assert_eq!(c.available + c.sold, c.total, "bucket {b} conservation");
        let buyers_units: u64 = bucket.buyers.values().sum();
        assert_eq!(
            buyers_units, c.sold,
            "bucket {b}: sold is its buyers' units"
        );
        for (user, &units) in &bucket.buyers {
            assert_eq!(
                home_bucket(*user, self.n()),
                b,
                "{user} bought away from home"
            );
            assert!(units <= u64::from(self.limit_max), "{user} over the limit");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
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

    #[test]
    fn a_transfer_in_applied_twice_counts_once() {
        let mut model = BucketModel::new(10, 2, 0);
        let t = Transfer {
            id: 1,
            from: 0,
            to: 1,
            units: 3,
        };
        assert_eq!(model.transfer_in(t), TransferStep::Refused, "no out yet");
        assert_eq!(model.transfer_out(t), TransferStep::Applied);
        assert_eq!(model.transfer_out(t), TransferStep::Replayed);
        model.check();
        assert_eq!((model.available(), model.in_flight_units()), (7, 3));
        let other = Transfer { units: 4, ..t };
        assert_eq!(
            model.transfer_in(other),
            TransferStep::Refused,
            "not its out"
        );
        assert_eq!(model.transfer_in(t), TransferStep::Applied);
        assert_eq!(model.transfer_in(t), TransferStep::Replayed);
        model.check();
        assert_eq!(model.bucket(0).total, 2);
        assert_eq!(model.bucket(1).total, 8);
        let too_much = Transfer {
            id: 2,
            units: 3,
            ..t
        };
        assert_eq!(model.transfer_out(too_much), TransferStep::Refused);
        let to_itself = Transfer { id: 3, to: 0, ..t };
        assert_eq!(model.transfer_out(to_itself), TransferStep::Refused);
        model.check();
    }

    #[test]
    fn one_bucket_sells_as_without_buckets() {
        let mut model = BucketModel::new(3, 1, 0);
        for u in 1..=3 {
            assert_eq!(model.buy(UserId(u), 1, 1), Outcome::Accepted);
        }
        assert_eq!(model.buy(UserId(1), 1, 1), Outcome::SoldOut);
        assert_eq!(model.buy(UserId(9), 1, 1), Outcome::SoldOut);
        assert!(model.in_flight().is_empty());
        model.check();
    }

    #[test]
    fn the_last_units_gather_where_the_buyers_are() {
        let n = 64;
        let mut model = BucketModel::new(64, n, 0);
        let buyers = users_by_home(n, 70);
        for (i, &user) in buyers[5].iter().take(64).enumerate() {
            assert_eq!(model.buy(user, 1, 1), Outcome::Accepted, "buyer {i}");
        }
        assert_eq!(model.buy(buyers[5][64], 1, 1), Outcome::SoldOut);
        assert_eq!(model.bucket(5).sold, 64);
        model.check();
    }

    #[test]
    fn checks_come_in_the_order_of_one_hot_copy() {
        let mut model = BucketModel::new(2, 2, 0);
        let user = UserId(1);
        assert_eq!(
            model.buy(user, 4, 3),
            Outcome::LimitExceeded,
            "quantity first"
        );
        assert_eq!(model.buy(user, 3, 3), Outcome::SoldOut, "then stock");
        assert_eq!(model.buy(user, 2, 3), Outcome::Accepted);
        assert_eq!(model.buy(user, 1, 3), Outcome::SoldOut);
        let mut model = BucketModel::new(5, 2, 0);
        assert_eq!(model.buy(user, 3, 3), Outcome::Accepted);
        assert_eq!(
            model.buy(user, 1, 3),
            Outcome::LimitExceeded,
            "then the limit"
        );
        model.check();
    }

    /// User ids 1.. grouped by home bucket among `n`, `per_bucket` each.
    fn users_by_home(n: u16, per_bucket: usize) -> Vec<Vec<UserId>> {
        let mut homed = vec![Vec::new(); usize::from(n)];
        let mut user = 0;
        while homed.iter().any(|h| h.len() < per_bucket) {
            user += 1;
            let home = &mut homed[usize::from(home_bucket(UserId(user), n))];
            if home.len() < per_bucket {
                home.push(UserId(user));
            }
        }
        homed
    }

    /// How buyers fall over the buckets.
    #[derive(Debug, Clone, Copy)]
    enum Spread {
        Uniform,
        /// 80% of buyers homed on one bucket, the rest anywhere.
        Skewed,
        OneBucket,
    }

    /// A stream of buyers of one sale: fresh buyers mostly, some come back for more.
    struct Crowd<'a> {
        rng: Rng,
        homed: &'a [Vec<UserId>],
        fresh: Vec<usize>,
        spread: Spread,
        target: u16,
        limit: u32,
    }

    impl Crowd<'_> {
        fn home(&mut self) -> usize {
            let n = self.homed.len() as u64;
            let anywhere = self.rng.below(n) as usize;
            match self.spread {
                Spread::Uniform => anywhere,
                Spread::Skewed if self.rng.chance(80) => usize::from(self.target),
                Spread::Skewed => anywhere,
                Spread::OneBucket => usize::from(self.target),
            }
        }

        /// The next buyer and the quantity it asks for.
        fn buyer(&mut self) -> (UserId, u32) {
            let home = self.home();
            let (users, fresh) = (&self.homed[home], self.fresh[home]);
            let returning = fresh > 0 && (fresh == users.len() || self.rng.chance(25));
            let user = if returning {
                users[self.rng.below(fresh as u64) as usize]
            } else {
                self.fresh[home] += 1;
                users[fresh]
            };
            let quantity = 1 + self.rng.below(u64::from(self.limit)) as u32;
            (user, quantity)
        }
    }

    /// The answer one hot copy holding `available_units` would give.
    fn one_copy(available_units: u64, held_units: u64, quantity: u32, limit: u32) -> Outcome {
        let quantity_units = u64::from(quantity);
        if quantity > limit {
            Outcome::LimitExceeded
        } else if available_units < quantity_units {
            Outcome::SoldOut
        } else if held_units + quantity_units > u64::from(limit) {
            Outcome::LimitExceeded
        } else {
            Outcome::Accepted
        }
    }

    /// One sale of the property tests.
    #[derive(Debug, Clone, Copy)]
    struct Case {
        seed: u64,
        n: u16,
        total_units: u64,
        limit: u32,
        spread: Spread,
    }

    impl Case {
        fn totals(n: u16) -> Vec<u64> {
            let n = u64::from(n);
            let mut totals = vec![1, (n / 2).max(1), n + 1, 97, 600];
            totals.dedup();
            totals
        }

        fn all(seeds: u64) -> Vec<Case> {
            let mut cases = Vec::new();
            for seed in 0..seeds {
                for n in COUNTS {
                    for total_units in Case::totals(n) {
                        for limit in [1, 3] {
                            for spread in [Spread::Uniform, Spread::Skewed, Spread::OneBucket] {
                                cases.push(Case {
                                    seed,
                                    n,
                                    total_units,
                                    limit,
                                    spread,
                                });
                            }
                        }
                    }
                }
            }
            cases
        }

        fn crowd<'a>(&self, homed: &'a [Vec<UserId>]) -> Crowd<'a> {
            let mut rng = Rng(self.seed * 1_000_003 + u64::from(self.n) * 7 + self.total_units);
            let target = rng.below(u64::from(self.n)) as u16;
            Crowd {
                rng,
                homed,
                fresh: vec![0; homed.len()],
                spread: self.spread,
                target,
                limit: self.limit,
            }
        }

        fn model(&self, rng: &mut Rng) -> BucketModel {
            let refill_units = [0, 1, 5, self.total_units / u64::from(self.n)];
            BucketModel::new(
                self.total_units,
                self.n,
                refill_units[rng.below(4) as usize],
            )
        }

        /// Enough demand to empty the sale: more buyers than units, most asking for 1.
        fn steps_max(&self) -> u64 {
            self.total_units * 20 + 200
        }
    }

    /// Buyers of one case, grouped by home; enough fresh ones to buy the whole stock alone.
    fn homed_for(n: u16) -> Vec<Vec<UserId>> {
        users_by_home(n, 700)
    }

    /// One purchase held to one hot copy's answer; returns it.
    fn buy_as_one_copy(
        model: &mut BucketModel,
        held: &mut BTreeMap<UserId, u64>,
        (user, quantity): (UserId, u32),
        limit: u32,
    ) -> Outcome {
        let held_units = held.get(&user).copied().unwrap_or(0);
        let expected = one_copy(model.available(), held_units, quantity, limit);
        let available_units = model.available();
        let outcome = model.buy(user, quantity, limit);
        assert_eq!(outcome, expected, "{user} asked {quantity}");
        if outcome == Outcome::SoldOut {
            assert!(available_units < u64::from(quantity), "a false sold-out");
        }
        if outcome == Outcome::Accepted {
            *held.entry(user).or_default() += u64::from(quantity);
        }
        assert_eq!(model.units_held(user), *held.get(&user).unwrap_or(&0));
        outcome
    }

    /// Runs `run` on every case of `seeds` seeds (buyers homed per bucket count once) and
    /// sums what it counts.
    fn sum_over_cases(seeds: u64, run: fn(Case, &[Vec<UserId>]) -> u64) -> u64 {
        let mut sum = 0;
        for n in COUNTS {
            let homed = homed_for(n);
            for case in Case::all(seeds).into_iter().filter(|c| c.n == n) {
                sum += run(case, &homed);
            }
        }
        sum
    }

    #[test]
    fn whenever_demand_covers_the_stock_the_sale_sells_exactly_its_stock() {
        let transfers = sum_over_cases(8, run_sale);
        assert!(transfers > 10_000, "only {transfers} transfers");
    }

    /// Sells one case's stock with no crash: every answer is one hot copy's answer (so no
    /// false SOLD_OUT and the limit holds), and the sale sells exactly its stock. Returns the
    /// transfers it took.
    fn run_sale(case: Case, homed: &[Vec<UserId>]) -> u64 {
        let mut crowd = case.crowd(homed);
        let mut model = case.model(&mut crowd.rng);
        let mut held = BTreeMap::new();
        let mut steps = 0;
        while model.available() > 0 && steps < case.steps_max() {
            buy_as_one_copy(&mut model, &mut held, crowd.buyer(), case.limit);
            assert!(model.in_flight().is_empty());
            if steps % 16 == 0 {
                model.check();
            }
            steps += 1;
        }
        model.check();
        assert_eq!(model.sold(), case.total_units, "{case:?}");
        assert_eq!(held.values().sum::<u64>(), case.total_units);
        model.next_transfer_id - 1
    }

    #[test]
    fn transfers_left_in_flight_by_a_crash_keep_conservation_and_sell_the_stock() {
        let crashes = sum_over_cases(6, run_sale_with_crashes);
        assert!(crashes > 1_000, "only {crashes} crashes");
    }

    /// Sells one case's stock while carriers of transfers crash between out and in; the
    /// transfers left in flight are finished later, some twice, in any order. Returns the
    /// crashes.
    fn run_sale_with_crashes(case: Case, homed: &[Vec<UserId>]) -> u64 {
        let mut crowd = case.crowd(homed);
        let mut model = case.model(&mut crowd.rng);
        let mut held = BTreeMap::new();
        let mut pending = Vec::new();
        let (mut steps, mut crashes) = (0, 0);
        while model.available() + model.in_flight_units() > 0 && steps < case.steps_max() {
            let buyer = crowd.buyer();
            if crowd.rng.chance(30) && crash_midway(&mut model, &mut crowd.rng, buyer, case) {
                pending = model.in_flight();
                crashes += 1;
            } else if !pending.is_empty() && crowd.rng.chance(20) {
                finish_one(&mut model, &mut crowd.rng, &mut pending);
            } else {
                buy_as_one_copy(&mut model, &mut held, buyer, case.limit);
            }
            model.check();
            let counted = model.available() + model.sold() + model.in_flight_units();
            assert_eq!(counted, case.total_units);
            steps += 1;
        }
        assert!(model.in_flight().is_empty(), "{case:?}");
        assert_eq!(model.sold(), case.total_units, "{case:?}");
        crashes
    }

    /// If `buyer`'s purchase needs transfers, starts them and crashes: some outs done, some of
    /// those in, the buyer never answered. Returns whether it crashed.
    fn crash_midway(
        model: &mut BucketModel,
        rng: &mut Rng,
        buyer: (UserId, u32),
        case: Case,
    ) -> bool {
        let (user, quantity) = buyer;
        let held_units = model.units_held(user);
        let fits = one_copy(model.available(), held_units, quantity, case.limit);
        let home = home_bucket(user, case.n);
        let plan = model.plan(home, u64::from(quantity));
        if fits != Outcome::Accepted || plan.is_empty() {
            return false;
        }
        let outs = 1 + rng.below(plan.len() as u64) as usize;
        let ins = rng.below(outs as u64) as usize;
        for &t in &plan[..outs] {
            assert_eq!(model.transfer_out(t), TransferStep::Applied);
        }
        for &t in &plan[..ins] {
            assert_eq!(model.transfer_in(t), TransferStep::Applied);
        }
        true
    }

    /// A recovery finishes one transfer in flight: its in (sometimes twice), after a replay of
    /// its out now and then.
    fn finish_one(model: &mut BucketModel, rng: &mut Rng, pending: &mut Vec<Transfer>) {
        let t = pending.swap_remove(rng.below(pending.len() as u64) as usize);
        if rng.chance(25) {
            assert_eq!(model.transfer_out(t), TransferStep::Replayed);
        }
        assert_eq!(model.transfer_in(t), TransferStep::Applied);
        if rng.chance(50) {
            assert_eq!(model.transfer_in(t), TransferStep::Replayed);
        }
    }
}
