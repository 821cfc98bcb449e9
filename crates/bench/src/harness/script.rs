//! `flashsale bench script`: what the purchase script costs Redis per purchase, part by part.
//!
//! The script marks its parts with `--@stage NAME` lines. For each stage this loads a copy of
//! the script that returns right there (and the whole script last), runs the same batches of
//! new buyers against a sale of its own, and reads Redis's main-thread CPU (INFO cpu) and the
//! script's command time (INFO commandstats) per purchase. The difference between two
//! consecutive stages is what the part between them costs.

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use redis::aio::MultiplexedConnection;

/// Batches run before measuring, so the sale's hashes are past their small encodings.
const WARM_BATCHES: usize = 100;

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
}

/// One stage's cost, µs per purchase.
struct StageCost {
    stage: String,
    cpu_us: f64,
    script_us: f64,
}

pub async fn run(args: ScriptArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=1024).contains(&args.batch), "--batch must be 1..=1024");
    let client = redis::Client::open(args.redis_url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let script = flashsale_redis::scripts::PURCHASE;
    println!(
        "bench script: the purchase script cut at each stage, {} calls of {} new buyers each",
        args.calls, args.batch
    );
    let mut rows = Vec::new();
    for (stage, text) in variants(script) {
        rows.push(measure(&mut conn, &stage, &text, &args).await?);
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
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(text)
        .query_async(conn)
        .await?;
    let keys = sale_keys();
    open_sale(conn, &keys, args.layout).await?;
    let mut user = 1u64;
    for _ in 0..WARM_BATCHES {
        call(conn, &sha, &keys, &mut user, args.batch).await?;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await?;
    let before = main_thread_cpu_us(conn).await?;
    for _ in 0..args.calls {
        call(conn, &sha, &keys, &mut user, args.batch).await?;
    }
    let cpu = main_thread_cpu_us(conn).await? - before;
    let script_usec = evalsha_usec(conn).await?;
    let _: () = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
    let purchases = (args.calls * args.batch) as f64;
    Ok(StageCost {
        stage: stage.to_string(),
        cpu_us: cpu / purchases,
        script_us: script_usec / purchases,
    })
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
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    let node = info_field(&info, "run_id").unwrap_or_default();
    let units = 1_000_000_000u64.to_string();
    let layout = layout.to_string();
    let fields: [(&str, &str); 15] = [
        ("total", &units),
        ("available", &units),
        ("reserved", "0"),
        ("sold", "0"),
        ("seq", "0"),
        ("epoch", "1"),
        ("limit", "1"),
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

/// One call of `n` requests by new buyers.
async fn call(
    conn: &mut MultiplexedConnection,
    sha: &str,
    keys: &[String],
    user: &mut u64,
    n: usize,
) -> anyhow::Result<()> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(keys.len()).arg(keys).arg(n);
    for _ in 0..n {
        cmd.arg(*user).arg(format!("r{user}")).arg(1);
        *user += 1;
    }
    let _: redis::Value = cmd.query_async(conn).await?;
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
        "\n{:<22} {:>12} {:>12} {:>12}",
        "returns after", "cpu µs", "script µs", "part µs"
    );
    let mut prev = 0.0;
    for r in rows {
        println!(
            "{:<22} {:>12.2} {:>12.2} {:>12.2}",
            r.stage,
            r.cpu_us,
            r.script_us,
            r.cpu_us - prev
        );
        prev = r.cpu_us;
    }
    println!(
        "(µs per purchase; cpu: Redis main thread, INFO cpu; part: this stage less the one before)"
    );
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
