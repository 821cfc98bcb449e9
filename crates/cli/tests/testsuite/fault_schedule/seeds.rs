//! Which seeds run: `FLASHSALE_SEEDS` (a comma list of seeds and ranges `a..b`, `a..=b`), or
//! the default set CI runs.

/// Seeds CI runs when `FLASHSALE_SEEDS` is unset; chosen so that together their schedules
/// land every kind of fault under both Redis persistences, with and without a hot sale:
/// 1 routes a reserve sale to a hot Redis (keeping everything) and kills it, a serve instance
/// and the worker, with racing CLI and admin repairs; 59 force-warms a reserve sale, kills a
/// serve instance, MariaDB and a Redis that keeps nothing; 55 loses Redis (keeping nothing)
/// twice while the worker (persister) is down, with payments in flight.
pub const DEFAULT: &[u64] = &[1, 59, 55];

/// Most seeds one invocation accepts: a typo like `1..1000000` must not run for a week.
const SEEDS_MAX: usize = 10_000;

pub fn from_env() -> Vec<u64> {
    from_var("FLASHSALE_SEEDS", DEFAULT)
}

/// The seeds `var` lists, else `default`.
pub fn from_var(var: &str, default: &[u64]) -> Vec<u64> {
    match std::env::var(var) {
        Ok(spec) if !spec.trim().is_empty() => {
            parse(&spec).unwrap_or_else(|e| panic!("{var}={spec:?}: {e}"))
        }
        _ => default.to_vec(),
    }
}

/// Runs every seed in turn (`run_one` returns a failing seed's report, having printed a
/// passing one), prints `<name>: N passed, M failed`, and fails with every failing report and
/// its replay command.
pub async fn run_all<F, Fut>(name: &str, seeds: &[u64], run_one: F, replay: fn(u64) -> String)
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let mut failed = Vec::new();
    for &seed in seeds {
        if let Some(report) = run_one(seed).await {
            println!("{report}\n{}", replay(seed));
            failed.push(format!("{report}\n{}", replay(seed)));
        }
    }
    let passed = seeds.len() - failed.len();
    println!("{name}: {passed} passed, {} failed", failed.len());
    assert!(
        failed.is_empty(),
        "{} of {} seeds failed:\n\n{}",
        failed.len(),
        seeds.len(),
        failed.join("\n\n")
    );
}

/// `"1,5..8,20..=21"` → `[1, 5, 6, 7, 20, 21]`.
pub fn parse(spec: &str) -> Result<Vec<u64>, String> {
    let mut seeds = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (from, to) = match (part.split_once("..="), part.split_once("..")) {
            (Some((a, b)), _) => (number(a)?, number(b)?.saturating_add(1)),
            (None, Some((a, b))) => (number(a)?, number(b)?),
            (None, None) => (number(part)?, number(part)?.saturating_add(1)),
        };
        if to.saturating_sub(from) as usize > SEEDS_MAX - seeds.len().min(SEEDS_MAX) {
            return Err(format!("more than {SEEDS_MAX} seeds"));
        }
        seeds.extend(from..to);
    }
    if seeds.is_empty() {
        return Err("no seed".into());
    }
    Ok(seeds)
}

fn number(s: &str) -> Result<u64, String> {
    s.trim().parse().map_err(|_| format!("{s:?} is not a seed"))
}

#[test]
fn seed_lists_and_ranges_parse() {
    assert_eq!(parse("1,5..8, 20..=21").unwrap(), vec![1, 5, 6, 7, 20, 21]);
    assert_eq!(parse("7").unwrap(), vec![7]);
    assert!(parse("x").is_err() && parse("").is_err() && parse("0..100000").is_err());
}
