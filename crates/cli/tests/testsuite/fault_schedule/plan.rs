//! The schedule of one seed, drawn up front and printed: Redis persistence, the sales, the
//! workload's shape and the faults with their times. The same seed draws the same plan.

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What the throwaway Redis keeps across a kill -9.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisKeeps {
    /// `appendonly yes`, `appendfsync always`: every acknowledged write survives.
    Everything,
    /// No persistence: a restart comes back empty.
    Nothing,
}

#[derive(Debug, Clone)]
pub struct SaleSpec {
    pub sku: u64,
    /// Reserve mode with this payment timeout; `None` is direct mode.
    pub payment_timeout_ms: Option<u64>,
    pub stock: u64,
    pub per_user_limit: u32,
    /// Hot copies the stock is split over (1: one copy).
    pub buckets: u16,
}

/// A process the nemesis kills with SIGKILL and brings back `down_ms` later (other faults may
/// land meanwhile: a Redis loss while the persister is down leaves accepted writes in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Its data gone when it keeps nothing.
    Redis,
    /// The dedicated Redis of the hot sale, when the plan has one.
    HotRedis,
    Serve(usize),
    /// `flashsale worker`: persister (mid-batch), expiry, repairing reconciler.
    Worker,
    MariaDb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 of a process, back after `down_ms`.
    Kill { target: Target, down_ms: u64 },
    /// `POST /sales/{sku}/warm?force=true` as admin, mid-sale.
    ForcedWarm { sku: u64 },
    /// Two `flashsale reconcile --repair` processes at once.
    RacingRepairCli,
    /// `POST /admin/reconcile/{sku}/repair` on both instances at once.
    RacingRepairAdmin { sku: u64 },
}

/// One fault at its planned time (ms after the workload starts).
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub at_ms: u64,
    pub fault: Fault,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub redis: RedisKeeps,
    pub sales: Vec<SaleSpec>,
    /// A sale routed to a dedicated Redis (`FLASHSALE_HOT_SKUS`), as every process is told.
    pub hot_sku: Option<u64>,
    /// Buyers are users `1..=buyers`: more than any sale's stock.
    pub buyers: u64,
    pub clients: usize,
    /// Each client's pause between operations: shapes the load so that sales are still
    /// selling when the faults land (not synchronisation).
    pub pace_ms: u64,
    pub workload_ms: u64,
    pub steps: Vec<Step>,
    /// Most new buyers of one bucketed sale homed at one of its buckets, when the schedule
    /// draws it (the cluster's does).
    pub skew: Option<Skew>,
}

/// New buyers of sale `sku` homed at bucket `home` `percent` of the time (the rest anywhere):
/// that bucket's stock runs out first and transfers carry the others' stock there for the
/// rest of the sale, so that faults land while transfers are in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skew {
    pub sku: u64,
    pub home: u16,
    pub percent: u32,
}

/// Length of the workload; faults land inside it, leaving the last second fault-free.
const WORKLOAD_MS: u64 = 8_000;

impl Plan {
    pub fn from_seed(seed: u64) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let redis = if rng.random_bool(0.5) {
            RedisKeeps::Nothing
        } else {
            RedisKeeps::Everything
        };
        let mut sales = draw_sales(&mut rng);
        draw_buckets(seed, &mut sales);
        let most = sales.iter().map(|s| s.stock).max().unwrap_or(1);
        let buyers = most * rng.random_range(15..=25) / 10;
        let hot_sku = rng
            .random_bool(0.5)
            .then(|| rng.random_range(1..=sales.len() as u64));
        let steps = draw_steps(&mut rng, &sales, hot_sku.is_some());
        Plan {
            seed,
            redis,
            sales,
            hot_sku,
            buyers,
            clients: rng.random_range(3..=5),
            pace_ms: rng.random_range(12..=25),
            workload_ms: WORKLOAD_MS,
            steps,
            skew: None,
        }
    }

    /// Whether this plan may lose a sale's hot copy with accepted writes in it: only a kill of
    /// a Redis that keeps nothing. A forced warm rebuilds a readable copy, which drains its
    /// stream into the database before the epoch moves: it loses nothing, and a loss it
    /// reported would fail the run.
    pub fn may_lose_hot_copy(&self) -> bool {
        self.steps.iter().any(|s| match s.fault {
            Fault::Kill {
                target: Target::Redis | Target::HotRedis,
                ..
            } => self.redis == RedisKeeps::Nothing,
            _ => false,
        })
    }
}

/// 2–3 sales: the first direct, the second reserve with a short timeout, a third either.
fn draw_sales(rng: &mut StdRng) -> Vec<SaleSpec> {
    let n = rng.random_range(2..=3u64);
    (1..=n)
        .map(|sku| {
            let reserve = match sku {
                1 => false,
                2 => true,
                _ => rng.random_bool(0.5),
            };
            SaleSpec {
                sku,
                payment_timeout_ms: reserve.then(|| rng.random_range(300..=800)),
                stock: rng.random_range(40..=150),
                per_user_limit: rng.random_range(1..=2),
                buckets: 1,
            }
        })
        .collect()
}

/// Half the seeds split their last sale over three buckets. Drawn from a stream of its own,
/// so that each seed's other draws (and the faults the CI seeds were chosen for) stay.
fn draw_buckets(seed: u64, sales: &mut [SaleSpec]) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb0c4_e7ed);
    if let Some(last) = sales.last_mut() {
        last.buckets = if rng.random_bool(0.5) { 3 } else { 1 };
    }
}

/// 2–5 faults at sorted times in `[600, WORKLOAD_MS - 1000)` ms; every killed process is back
/// by `WORKLOAD_MS - 300`.
fn draw_steps(rng: &mut StdRng, sales: &[SaleSpec], hot: bool) -> Vec<Step> {
    let n = rng.random_range(2..=5);
    let mut steps: Vec<Step> = (0..n)
        .map(|_| {
            let at_ms = rng.random_range(600..WORKLOAD_MS - 1_000);
            Step {
                at_ms,
                fault: draw_fault(rng, sales, hot, WORKLOAD_MS - 300 - at_ms),
            }
        })
        .collect();
    steps.sort_by_key(|s| s.at_ms);
    steps
}

/// Redis kills weigh most: with the worker or MariaDB down around them, they are what leaves
/// accepted writes in flight.
fn draw_fault(rng: &mut StdRng, sales: &[SaleSpec], hot: bool, room_ms: u64) -> Fault {
    let sku = sales[rng.random_range(0..sales.len())].sku;
    let kill = |target, most: u64, rng: &mut StdRng| Fault::Kill {
        target,
        down_ms: rng.random_range(0..=most.min(room_ms)),
    };
    match rng.random_range(0..11) {
        0..=2 => {
            let hot_one = hot && rng.random_bool(0.5);
            let target = if hot_one {
                Target::HotRedis
            } else {
                Target::Redis
            };
            kill(target, 400, rng)
        }
        3 | 4 => kill(Target::Worker, 2_500, rng),
        5 | 6 => {
            let i = rng.random_range(0..2);
            kill(Target::Serve(i), 1_500, rng)
        }
        7 => kill(Target::MariaDb, 2_000, rng),
        8 => Fault::ForcedWarm { sku },
        9 => Fault::RacingRepairCli,
        _ => Fault::RacingRepairAdmin { sku },
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: redis keeps {:?}; {} buyers, {} clients, pace {} ms, workload {} ms",
            self.seed, self.redis, self.buyers, self.clients, self.pace_ms, self.workload_ms
        )?;
        if let Some(sku) = self.hot_sku {
            writeln!(f, "  sale {sku} routed to a hot Redis of its own")?;
        }
        write_sales(f, &self.sales, self.skew)?;
        for s in &self.steps {
            writeln!(f, "  at {:>5} ms: {:?}", s.at_ms, s.fault)?;
        }
        Ok(())
    }
}

/// A line per sale: its mode, stock, limit and buckets, and how its buyers are homed when
/// skewed (both schedules print their plans so).
pub fn write_sales(
    f: &mut fmt::Formatter<'_>,
    sales: &[SaleSpec],
    skew: Option<Skew>,
) -> fmt::Result {
    for s in sales {
        let mode = match s.payment_timeout_ms {
            Some(t) => format!("reserve {t} ms"),
            None => "direct".into(),
        };
        let (stock, limit, buckets) = (s.stock, s.per_user_limit, s.buckets);
        writeln!(
            f,
            "  sale {}: {mode}, stock {stock}, limit {limit}, buckets {buckets}",
            s.sku
        )?;
    }
    if let Some(Skew { sku, home, percent }) = skew {
        writeln!(
            f,
            "  sale {sku}: {percent}% of new buyers homed at bucket {home}"
        )?;
    }
    Ok(())
}

#[test]
fn the_same_seed_draws_the_same_plan() {
    let (a, b) = (Plan::from_seed(42), Plan::from_seed(42));
    assert_eq!(a.to_string(), b.to_string());
    assert_ne!(a.to_string(), Plan::from_seed(43).to_string());
}
