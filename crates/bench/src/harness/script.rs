//! `flashsale bench script`: what the purchase script costs Redis per purchase, part by part.
//!
//! The script marks its parts with `--@stage NAME` lines. For each stage this loads a copy of
//! the script that returns right there (and the whole script last), runs the same batches (of
//! new buyers, or of `--buyers` buyers in turn) against a sale of its own, and reads Redis's
//! main-thread CPU (INFO cpu) and the script's command time (INFO commandstats) per purchase.
//! The difference between two consecutive stages is what the part between them costs.
//!
//! Both are times, and on a shared machine they move by a µs or more from one run to the next.
//! Given the pid of a Redis server running under valgrind's callgrind (`--callgrind-pid`),
//! each stage also counts the instructions Redis's main thread ran per purchase (zeroed after
//! the warm-up, read after the calls, with `callgrind_control`): a count that repeats to
//! within a fraction of a percent, so a change of a few hundred instructions a purchase shows.
//! The seed's script (one buyer a call, [`super::strategies::SEED_LUA`]) is counted the same
//! way last, for reference.

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use redis::aio::MultiplexedConnection;

/// Batches run before measuring, so the sale's hashes are past their small encodings.
const WARM_BATCHES: usize = 100;
/// The sale's per-user limit: the most orders of one unit a buyer of `--buyers` may take.
const LIMIT: u64 = 1_000;

#[derive(Debug, Clone, Args)]
pub struct ScriptArgs {
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Requests per script call (the batcher's batch under load is ~80).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Calls measured per stage.
    #[arg(long, default_value_t = 400)]
    pub calls: usize,
    /// The copy's key layout: 2, one record per buyer (what the stages mark); 1, the
    /// requests, orders and buyers hashes (only the whole script is worth reading then).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub layout: u8,
    /// Buyers the requests cycle through, each request a new request id: a buyer takes an
    /// order every round, as in a sale of a high per-user limit, so its record (layout 2)
    /// grows call by call. Unset: every request is a new buyer's.
    #[arg(long)]
    pub buyers: Option<u64>,
    /// The pid of the Redis server at `--redis-url` when it runs under `valgrind
    /// --tool=callgrind`: each stage also counts Redis's main-thread instructions per purchase.
    #[arg(long)]
    pub callgrind_pid: Option<u32>,
}

/// The row of the seed's script, counted after the stages.
const SEED_STAGE: &str = "the seed's script";

/// One stage's cost per purchase: µs, and instructions when counted.
struct StageCost {
    stage: String,
    cpu_us: f64,
    script_us: f64,
    instructions: Option<f64>,
}

pub async fn run(args: ScriptArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=1024).contains(&args.batch), "--batch must be 1..=1024");
    let requests = ((WARM_BATCHES + args.calls) * args.batch) as u64;
    let who = match args.buyers {
        None => "new buyers".to_string(),
        Some(n) => {
            anyhow::ensure!(
                n > 0 && requests.div_ceil(n) <= LIMIT,
                "--buyers must be 1.. and leave each at most {LIMIT} orders"
            );
            format!(
                "requests of {n} buyers in turn (up to {} orders each)",
                requests.div_ceil(n)
            )
        }
    };
    let client = redis::Client::open(args.redis_url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let script = flashsale_redis::scripts::PURCHASE;
    println!(
        "bench script: the purchase script cut at each stage, {} calls of {} {who} each",
        args.calls, args.batch
    );
    let mut rows = Vec::new();
    for (stage, text) in variants(script) {
        rows.push(measure(&mut conn, &stage, &text, &args).await?);
    }
    if let Some(pid) = args.callgrind_pid {
        rows.push(measure_seed(&mut conn, pid, &args).await?);
    }
    print(&rows);
    Ok(())
}

/// The script returning at each `--@stage` line, in order, then the whole script.
fn variants(script: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = script
        .lines()
        .filter_map(|l| l.strip_prefix("--@stage "))
        .map(|stage| {
            let marker = format!("--@stage {stage}\n");
            let cut = script.replacen(&marker, "do return {} end\n", 1);
            (stage.to_string(), cut)
        })
        .collect();
    out.push(("reply (whole script)".into(), script.to_string()));
    out
}

async fn measure(
    conn: &mut MultiplexedConnection,
    stage: &str,
    text: &str,
    args: &ScriptArgs,
) -> anyhow::Result<StageCost> {
    let sha = load(conn, text).await?;
    let keys = sale_keys();
    open_sale(conn, &keys, args.layout).await?;
    let calls = Calls::Batches {
        sha: &sha,
        keys: &keys,
        batch: args.batch,
        buyers: args.buyers,
    };
    let cost = measured(
        conn,
        stage,
        &calls,
        WARM_BATCHES,
        args.calls,
        args.callgrind_pid,
    )
    .await;
    let _: () = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
    cost
}

/// The seed's script, one new buyer a call, as many purchases as a stage makes: its cost per
/// purchase, counted as the stages are.
async fn measure_seed(
    conn: &mut MultiplexedConnection,
    pid: u32,
    args: &ScriptArgs,
) -> anyhow::Result<StageCost> {
    let sha = load(conn, super::strategies::SEED_LUA).await?;
    let keys = sale_keys();
    let _: () = redis::cmd("SET")
        .arg(&keys[0])
        .arg(1_000_000_000u64)
        .query_async(conn)
        .await?;
    // The seed's stock, buyers' set and stream.
    let calls = Calls::Seed {
        sha: &sha,
        keys: [&keys[0], &keys[1], &keys[5]],
    };
    let warm = WARM_BATCHES * args.batch;
    let n = args.calls * args.batch;
    let cost = measured(conn, SEED_STAGE, &calls, warm, n, Some(pid)).await;
    let _: () = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
    cost
}

async fn load(conn: &mut MultiplexedConnection, text: &str) -> anyhow::Result<String> {
    let sha = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(text)
        .query_async(conn)
        .await?;
    Ok(sha)
}

/// What a stage calls: the purchase script (or a cut of it) with batches of requests, or the
/// seed's script with one new buyer a call.
enum Calls<'a> {
    Batches {
        sha: &'a str,
        keys: &'a [String],
        batch: usize,
        /// Buyers the requests cycle through (`None`: a new buyer each).
        buyers: Option<u64>,
    },
    Seed {
        sha: &'a str,
        keys: [&'a String; 3],
    },
}

impl Calls<'_> {
    /// One call, by the requests from the `user`-th on (each a new buyer, or of `buyers` in
    /// turn); the purchases it asked for.
    async fn one(&self, conn: &mut MultiplexedConnection, user: &mut u64) -> anyhow::Result<usize> {
        let mut cmd = redis::cmd("EVALSHA");
        let asked = match self {
            Calls::Batches {
                sha,
                keys,
                batch,
                buyers,
            } => {
                cmd.arg(*sha).arg(keys.len()).arg(*keys).arg(*batch);
                for _ in 0..*batch {
                    let buyer = buyers.map_or(*user, |n| 1 + (*user - 1) % n);
                    cmd.arg(buyer).arg(format!("r{user}")).arg(1);
                    *user += 1;
                }
                *batch
            }
            Calls::Seed { sha, keys } => {
                cmd.arg(*sha).arg(3).arg(&keys[..]);
                let order = format!("o{user}");
                cmd.arg(*user)
                    .arg(order)
                    .arg(1)
                    .arg(1)
                    .arg(format!("r{user}"));
                *user += 1;
                1
            }
        };
        let _: redis::Value = cmd.query_async(conn).await?;
        Ok(asked)
    }
}

/// `warm` calls, then `n` calls measured: Redis's main-thread CPU and the scripts' command time
/// per purchase, and its instructions when it runs under callgrind (`pid`).
async fn measured(
    conn: &mut MultiplexedConnection,
    stage: &str,
    calls: &Calls<'_>,
    warm: usize,
    n: usize,
    pid: Option<u32>,
) -> anyhow::Result<StageCost> {
    let mut user = 1u64;
    for _ in 0..warm {
        calls.one(conn, &mut user).await?;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await?;
    let before = main_thread_cpu_us(conn).await?;
    callgrind::zero(pid)?;
    let mut purchases = 0;
    for _ in 0..n {
        purchases += calls.one(conn, &mut user).await?;
    }
    let instructions = callgrind::main_thread(pid)?;
    let cpu = main_thread_cpu_us(conn).await? - before;
    let script_usec = evalsha_usec(conn).await?;
    let purchases = purchases.max(1) as f64;
    Ok(StageCost {
        stage: stage.to_string(),
        cpu_us: cpu / purchases,
        script_us: script_usec / purchases,
        instructions: instructions.map(|n| n as f64 / purchases),
    })
}

/// Counting a Redis server's instructions under callgrind, through `callgrind_control`.
mod callgrind {
    use std::process::Command;

    use anyhow::Context as _;

    /// Zeroes the counters of the process `pid` (nothing when `None`).
    pub fn zero(pid: Option<u32>) -> anyhow::Result<()> {
        if let Some(pid) = pid {
            control(&["-z", &pid.to_string()])?;
        }
        Ok(())
    }

    /// The instructions the main thread of `pid` ran since its counters were zeroed.
    pub fn main_thread(pid: Option<u32>) -> anyhow::Result<Option<u64>> {
        let Some(pid) = pid else { return Ok(None) };
        let out = control(&["-e", &pid.to_string()])?;
        thread_one(&out)
            .map(Some)
            .with_context(|| format!("no main-thread total in callgrind_control's answer: {out}"))
    }

    fn control(args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("callgrind_control")
            .args(args)
            .output()
            .context("callgrind_control (valgrind) is needed with --callgrind-pid")?;
        anyhow::ensure!(out.status.success(), "callgrind_control {args:?} failed");
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Thread 1's count in `callgrind_control -e`'s table (`   Th 1  31,516,173`).
    pub(super) fn thread_one(out: &str) -> Option<u64> {
        out.lines()
            .find_map(|l| l.trim_start().strip_prefix("Th 1 "))
            .and_then(|n| n.trim().replace(',', "").parse().ok())
    }
}

/// The eight keys of a sale of its own (a prefix no other run uses).
fn sale_keys() -> Vec<String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    [
        "sale", "buyers", "requests", "orders", "holds", "events", "rec", "seqs",
    ]
    .iter()
    .map(|k| format!("fsbenchscript{nanos}:{{1}}:{k}"))
    .collect()
}

/// A live direct sale that never runs out, opened on this node (as a load would).
async fn open_sale(
    conn: &mut MultiplexedConnection,
    keys: &[String],
    layout: u8,
) -> anyhow::Result<()> {
    // The node as load.lua writes it (`<run_id>/<replid>`): a value that long also makes the
    // sale's hash a table, not a listpack, as the service's sales are.
    let info: String = redis::cmd("INFO")
        .arg("server")
        .arg("replication")
        .query_async(conn)
        .await?;
    let field = |name| info_field(&info, name).unwrap_or_default();
    let node = format!("{}/{}", field("run_id"), field("master_replid"));
    let units = 1_000_000_000u64.to_string();
    let (limit, layout) = (LIMIT.to_string(), layout.to_string());
    let fields: [(&str, &str); 15] = [
        ("total", &units),
        ("available", &units),
        ("reserved", "0"),
        ("sold", "0"),
        ("seq", "0"),
        ("epoch", "1"),
        ("limit", &limit),
        ("mode", "direct"),
        ("timeout_ms", "0"),
        ("starts_at_ms", "0"),
        ("ends_at_ms", "4102444800000"),
        ("state", "live"),
        ("sku", "1"),
        ("node", &node),
        ("layout", &layout),
    ];
    let _: () = redis::cmd("HSET")
        .arg(&keys[0])
        .arg(&fields[..])
        .query_async(conn)
        .await?;
    Ok(())
}

async fn main_thread_cpu_us(conn: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| -> f64 {
        info_field(&info, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    Ok((field("used_cpu_user_main_thread") + field("used_cpu_sys_main_thread")) * 1e6)
}

/// Microseconds spent in EVALSHA since the last reset (0 when none ran).
async fn evalsha_usec(conn: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let usec = info_field(&info, "cmdstat_evalsha").and_then(|v| {
        v.split(',')
            .find_map(|kv| kv.strip_prefix("usec="))?
            .parse()
            .ok()
    });
    Ok(usec.unwrap_or(0.0))
}

fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

fn print(rows: &[StageCost]) {
    println!(
        "\n{:<22} {:>12} {:>12} {:>12} {:>14}",
        "returns after", "cpu µs", "script µs", "part µs", "instructions"
    );
    let mut prev = 0.0;
    for r in rows {
        let counted = r.instructions.map_or("-".into(), |n| format!("{n:.0}"));
        println!(
            "{:<22} {:>12.2} {:>12.2} {:>12.2} {:>14}",
            r.stage,
            r.cpu_us,
            r.script_us,
            r.cpu_us - prev,
            counted
        );
        prev = r.cpu_us;
    }
    println!(
        "(per purchase; cpu: Redis main thread, INFO cpu; part: this stage less the one before; \
         instructions: Redis main thread, callgrind, with --callgrind-pid)"
    );
    if let Some(ratio) = whole_to_seed(rows) {
        println!("the whole script's instructions per purchase ÷ the seed's script's: {ratio:.3}");
    }
}

/// The whole script's instructions per purchase over the seed's, when both were counted (the
/// seed's row comes last, right after the whole script's).
fn whole_to_seed(rows: &[StageCost]) -> Option<f64> {
    let [.., whole, seed] = rows else { return None };
    (seed.stage == SEED_STAGE).then_some(())?;
    Some(whole.instructions? / seed.instructions?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_script_is_cut_at_each_stage_in_order() {
        let script = flashsale_redis::scripts::PURCHASE;
        let cuts = variants(script);
        let names: Vec<&str> = cuts.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "sale",
                "records",
                "judged",
                "written",
                "reply (whole script)"
            ]
        );
        for (stage, text) in &cuts[..cuts.len() - 1] {
            assert_eq!(text.matches("do return {} end").count(), 1, "{stage}");
            assert!(!text.contains(&format!("--@stage {stage}\n")), "{stage}");
        }
        assert_eq!(cuts.last().map(|(_, t)| t.as_str()), Some(script));
    }

    #[test]
    fn the_ratio_to_the_seed_needs_both_counts() {
        let row = |stage: &str, n: Option<f64>| StageCost {
            stage: stage.into(),
            cpu_us: 0.0,
            script_us: 0.0,
            instructions: n,
        };
        let counted = [
            row("reply (whole script)", Some(30.0)),
            row(SEED_STAGE, Some(60.0)),
        ];
        assert_eq!(whole_to_seed(&counted), Some(0.5));
        let timed = [row("reply (whole script)", None), row("judged", None)];
        assert_eq!(whole_to_seed(&timed), None);
    }

    #[test]
    fn callgrind_totals_are_read_from_thread_one() {
        let out = "PID 7: redis-server\n\n  Totals:        Ir \n   Th 1  31,516,173 \n   Th 10      33,391 \n";
        assert_eq!(callgrind::thread_one(out), Some(31_516_173));
        assert_eq!(callgrind::thread_one("  Totals:  Ir\n   Th 2  5\n"), None);
    }

    #[test]
    fn info_fields_are_read_by_exact_name() {
        let info = "# CPU\r\nused_cpu_user_main_thread:1.5\r\nused_cpu_user:9\r\n";
        assert_eq!(
            info_field(info, "used_cpu_user").as_deref(),
            Some("9"),
            "a name that prefixes another is not confused with it"
        );
        assert_eq!(info_field(info, "missing"), None);
    }
}
