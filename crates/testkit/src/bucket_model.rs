//! The reference model of a direct-mode sale over stock buckets ([`BucketModel`]), the one a
//! bucketed hot ledger is checked against. Its property tests prove that whenever demand ≥
//! stock the sale sells exactly its stock, however the buyers fall over the buckets, and that
//! no buyer is answered SOLD_OUT while the sale could serve it (outside the window in which
//! units are in flight). Built on the domain's bucket arithmetic (`flashsale_core::buckets`).

use std::collections::{BTreeMap, BTreeSet};

use flashsale_core::buckets::{home_bucket, plan_transfers, split_stock, Transfer};
use flashsale_core::UserId;

/// A purchase's outcome in [`BucketModel`], in the order [`flashsale_core::SaleBook`] judges them:
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
    /// A fresh sale of `total_units` over `n` buckets (`buckets::split_stock`); transfers move at
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

    /// Plans the transfers that bring `home` up to `need_units` (`buckets::plan_transfers`) and takes
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

    /// splitmix64's increment (2^64 / φ).
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

    /// A deterministic PRNG for the tests: splitmix64's stream.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(GOLDEN);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
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
