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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 and restart of Redis (its data gone when it keeps nothing).
    RedisRestart,
    /// `POST /sales/{sku}/warm?force=true` as admin, mid-sale.
    ForcedWarm { sku: u64 },
    /// kill -9 and restart of one `flashsale serve`.
    ServeRestart { instance: usize },
    /// kill -9 and restart of `flashsale worker` (persister mid-batch, expiry, reconciler).
    WorkerRestart,
    /// kill -9 and restart of MariaDB.
    MariaDbRestart,
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
    /// Buyers are users `1..=buyers`: more than any sale's stock.
    pub buyers: u64,
    pub clients: usize,
    /// Each client's pause between operations: shapes the load so that sales are still
    /// selling when the faults land (not synchronisation).
    pub pace_ms: u64,
    pub workload_ms: u64,
    pub steps: Vec<Step>,
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
        let sales = draw_sales(&mut rng);
        let most = sales.iter().map(|s| s.stock).max().unwrap_or(1);
        let buyers = most * rng.random_range(15..=25) / 10;
        let steps = draw_steps(&mut rng, &sales);
        Plan {
            seed,
            redis,
            sales,
            buyers,
            clients: rng.random_range(3..=5),
            pace_ms: rng.random_range(12..=25),
            workload_ms: WORKLOAD_MS,
            steps,
        }
    }

    /// Whether a kill of Redis in this plan can drop acknowledged writes.
    pub fn redis_loses_data(&self) -> bool {
        self.redis == RedisKeeps::Nothing
            && self.steps.iter().any(|s| s.fault == Fault::RedisRestart)
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
            }
        })
        .collect()
}

/// 2–4 faults at distinct, sorted times in `[600, WORKLOAD_MS - 1000)` ms.
fn draw_steps(rng: &mut StdRng, sales: &[SaleSpec]) -> Vec<Step> {
    let n = rng.random_range(2..=4);
    let mut steps: Vec<Step> = (0..n)
        .map(|_| Step {
            at_ms: rng.random_range(600..WORKLOAD_MS - 1_000),
            fault: draw_fault(rng, sales),
        })
        .collect();
    steps.sort_by_key(|s| s.at_ms);
    steps
}

fn draw_fault(rng: &mut StdRng, sales: &[SaleSpec]) -> Fault {
    let sku = sales[rng.random_range(0..sales.len())].sku;
    match rng.random_range(0..7) {
        0 => Fault::RedisRestart,
        1 => Fault::ForcedWarm { sku },
        2 => Fault::ServeRestart {
            instance: rng.random_range(0..2),
        },
        3 => Fault::WorkerRestart,
        4 => Fault::MariaDbRestart,
        5 => Fault::RacingRepairCli,
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
        for s in &self.sales {
            let mode = match s.payment_timeout_ms {
                Some(t) => format!("reserve {t} ms"),
                None => "direct".into(),
            };
            writeln!(
                f,
                "  sale {}: {mode}, stock {}, limit {}",
                s.sku, s.stock, s.per_user_limit
            )?;
        }
        for s in &self.steps {
            writeln!(f, "  at {:>5} ms: {:?}", s.at_ms, s.fault)?;
        }
        Ok(())
    }
}

#[test]
fn the_same_seed_draws_the_same_plan() {
    let (a, b) = (Plan::from_seed(42), Plan::from_seed(42));
    assert_eq!(a.to_string(), b.to_string());
    assert_ne!(a.to_string(), Plan::from_seed(43).to_string());
}
