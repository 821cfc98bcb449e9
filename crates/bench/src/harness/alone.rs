//! `bench http --server-bin PATH`: the server alone. Each binary named (a baseline build beside
//! the current one, say) runs as its own `serve` process, configured by environment, and this
//! process is only the load generator: the server's CPU per answer is its own, not the
//! driver's. Per ledger and system of record (Redis + MariaDB, Redis + PostgreSQL unless
//! `--postgres-url ''`, embedded + SQLite) and binary it measures the accepted path, /healthz
//! right after, the sold-out path and /healthz right after, with the CPU µs per answer of the
//! server, the client, `redis-server`, `mariadbd` and, on PostgreSQL, `postgres` (the backends
//! of the run's database) and `postgres-all` (every `postgres` process) from `/proc/<pid>/stat`.
//!
//! `--callgrind N` runs each server under `valgrind --tool=callgrind` and reports the
//! instructions it executed per answer over N requests per path: a count that repeats on a
//! busy machine where answers/s do not. The server's idle work (its workers' timers), measured
//! first with no request, is taken out of each phase in proportion to its time.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::closed::{self, MakeRequest, Rate};
use crate::procs::{self, Meter, PhaseCpu, Watched};
use anyhow::Context;
use flashsale_core::{SkuId, UserId};
use flashsale_server::auth::Auth;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::http::HttpArgs;
use super::setup::{open, purchase_req, secret, sell_out, BENCH_USERS};

/// How long a server (under valgrind: much slower) may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a callgrind server's idle work is measured, to take it out of each phase's count.
const IDLE: Duration = Duration::from_secs(5);
/// How long the persister may take to write the accepted phase's orders to the database.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// One ledger a server runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
enum LedgerKind {
    Redis,
    Embedded,
}

impl LedgerKind {
    fn parse(s: &str) -> anyhow::Result<LedgerKind> {
        match s {
            "redis" => Ok(LedgerKind::Redis),
            "embedded" => Ok(LedgerKind::Embedded),
            _ => anyhow::bail!("--ledgers takes redis and/or embedded, not {s:?}"),
        }
    }
}

/// The system of record of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
enum Record {
    MariaDb,
    PostgreSql,
    Sqlite,
}

impl Record {
    /// The systems of record `ledger` runs with: the Redis ledger on MariaDB and, with a
    /// PostgreSQL server named, on PostgreSQL; the embedded ledger on its SQLite file.
    fn of(ledger: LedgerKind, args: &HttpArgs) -> Vec<Record> {
        match ledger {
            LedgerKind::Embedded => vec![Record::Sqlite],
            LedgerKind::Redis if args.postgres_url.is_empty() => vec![Record::MariaDb],
            LedgerKind::Redis => vec![Record::MariaDb, Record::PostgreSql],
        }
    }

    /// The server a run makes its database on (none: SQLite in the run's directory).
    fn server(self, args: &HttpArgs) -> Option<&str> {
        match self {
            Record::MariaDb => Some(&args.mysql_url),
            Record::PostgreSql => Some(&args.postgres_url),
            Record::Sqlite => None,
        }
    }
}

/// A `flashsale serve` child process.
struct Child {
    process: tokio::process::Child,
    pid: u32,
    base: String,
    /// The run's database on a server (Redis ledger only): its URL, read to see the persister
    /// drained, and its name, dropped at the end.
    db: Option<(String, String)>,
    db_server: String,
    secrets: (String, String),
    dir: PathBuf,
    /// The Redis and key prefix of a Redis-ledger run, whose keys are deleted at the end.
    redis: Option<(String, String)>,
}

/// What one (binary, ledger) run measured.
#[derive(Debug, serde::Serialize)]
struct RunReport {
    bin: String,
    ledger: LedgerKind,
    record: Record,
    rates: Vec<Rate>,
    cpu: Vec<PhaseCpu>,
    /// Instructions per answer under callgrind, per phase (same order as `rates`), less the
    /// server's idle work over the phase's time.
    instructions_per_answer: Vec<Option<f64>>,
}

pub async fn run(args: &HttpArgs) -> anyhow::Result<()> {
    let ledgers: Vec<LedgerKind> = args
        .ledgers
        .iter()
        .map(|s| LedgerKind::parse(s))
        .collect::<anyhow::Result<_>>()?;
    println!(
        "bench http, server alone: {} clients, {} s per path, binaries {:?}",
        args.concurrency, args.seconds, args.server_bin
    );
    // The servers run in directories of their own: a relative path would name nothing there.
    let bins: Vec<PathBuf> = args
        .server_bin
        .iter()
        .map(|b| b.canonicalize().with_context(|| format!("{}", b.display())))
        .collect::<anyhow::Result<_>>()?;
    let mut reports = Vec::new();
    for &ledger in &ledgers {
        for record in Record::of(ledger, args) {
            for bin in &bins {
                let report = one_run(args, bin, ledger, record).await?;
                print_run(&report);
                reports.push(report);
            }
        }
    }
    print_summary(&reports);
    let dir = args.data_dir.join("reports");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!(
        "bench-http-alone-{}.json",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
    ));
    std::fs::write(&path, serde_json::to_vec_pretty(&reports)?)?;
    println!("json: {}", path.display());
    Ok(())
}

async fn one_run(
    args: &HttpArgs,
    bin: &Path,
    ledger: LedgerKind,
    record: Record,
) -> anyhow::Result<RunReport> {
    let child = Child::start(args, bin, ledger, record).await?;
    let result = measure(args, &child, ledger).await;
    child.stop().await?;
    let (rates, cpu, instructions_per_answer) = result?;
    Ok(RunReport {
        bin: bin.display().to_string(),
        ledger,
        record,
        rates,
        cpu,
        instructions_per_answer,
    })
}

type Measured = (Vec<Rate>, Vec<PhaseCpu>, Vec<Option<f64>>);

/// The four phases: accepted, /healthz, sold out, /healthz.
async fn measure(args: &HttpArgs, child: &Child, ledger: LedgerKind) -> anyhow::Result<Measured> {
    let auth = Auth::new(&child.secrets.0, &child.secrets.1);
    let (big, tiny) = (1_001, 1_002);
    open(&child.base, &child.secrets.1, big, 1_000_000_000).await?;
    open(&child.base, &child.secrets.1, tiny, 1).await?;
    let tokens: Arc<Vec<String>> = Arc::new(
        (1..=BENCH_USERS)
            .map(|u| auth.sign(UserId(u), 3_600))
            .collect(),
    );
    let meter = Meter::new(watched(child, args));
    let health_url = format!("{}/healthz", child.base);
    let health: MakeRequest = Arc::new(move |cl, _| cl.get(&health_url));
    let accepted = purchase_req(&child.base, big, tokens.clone(), "s");
    let sold_out = purchase_req(&child.base, tiny, tokens.clone(), "x");
    let mut out: Measured = (Vec::new(), Vec::new(), Vec::new());
    let phases: [(&str, MakeRequest, u16); 4] = [
        ("accepted", accepted, 202),
        ("healthz", health.clone(), 200),
        ("sold out", sold_out, 409),
        ("healthz", health, 200),
    ];
    let callgrind = args.callgrind.is_some().then_some(child.pid);
    let idle_per_s = callgrind_idle_rate(callgrind, &child.dir).await?;
    for (i, (name, make, expect)) in phases.into_iter().enumerate() {
        if i == 2 {
            sell_out(&child.base, tiny, &tokens).await?;
        }
        callgrind_zero(callgrind).await?;
        let zeroed = Instant::now();
        let before = meter.sample();
        let stop = match args.callgrind {
            Some(n) => closed::Stop::Requests(n),
            None => closed::Stop::After(Duration::from_secs(args.seconds)),
        };
        let rate = closed::run(name, make, expect, args.concurrency, stop).await?;
        if i == 0 && ledger == LedgerKind::Redis {
            child.drain_wait(SkuId(big), rate.ok).await?;
        }
        out.1
            .push(meter.phase(&before, &meter.sample(), rate.ok, rate.seconds));
        let instructions = callgrind_dump(callgrind, &child.dir, i).await?;
        // Less what the server runs when idle (its workers' timers) over the phase's time.
        let busy =
            instructions.map(|n| (n as f64 - idle_per_s * zeroed.elapsed().as_secs_f64()).max(0.0));
        out.2.push(busy.map(|n| n / rate.ok.max(1) as f64));
        out.0.push(rate);
    }
    Ok(out)
}

/// The server, this process (the client) and the stores' servers.
fn watched(child: &Child, args: &HttpArgs) -> Vec<Watched> {
    let mut out = vec![
        Watched::one("server", child.pid),
        Watched::one("client", std::process::id()),
    ];
    let others = procs::path_processes(
        super::setup::port_of(Some(&args.redis_url_alone())),
        super::setup::port_of(Some(&args.mysql_url)),
    );
    out.extend(others.into_iter().skip(1));
    if let Some((url, _)) = &child.db {
        out.extend(super::setup::postgres_processes(url));
    }
    out
}

impl Child {
    async fn start(
        args: &HttpArgs,
        bin: &Path,
        ledger: LedgerKind,
        record: Record,
    ) -> anyhow::Result<Child> {
        let n = std::process::id();
        let tag = format!("fsalone{n}x{}", rand::random::<u32>() % 1_000_000);
        let dir = args.data_dir.join(&tag);
        std::fs::create_dir_all(&dir)?;
        let dir = dir.canonicalize()?;
        let (jwt, admin) = (secret(), secret());
        let (database_url, db) = match record.server(args) {
            Some(server) => {
                let url = super::setup::fresh_database(server, &tag).await?;
                (url.clone(), Some((url, tag.clone())))
            }
            None => (format!("sqlite://{}/flashsale.db", dir.display()), None),
        };
        let mut cmd = match args.callgrind {
            Some(_) => {
                let mut c = tokio::process::Command::new("valgrind");
                c.arg("--tool=callgrind")
                    .arg(format!(
                        "--callgrind-out-file={}/callgrind.out",
                        dir.display()
                    ))
                    .arg(bin);
                c
            }
            None => tokio::process::Command::new(bin),
        };
        cmd.arg("serve")
            .current_dir(&dir)
            .env("FLASHSALE_LISTEN", "127.0.0.1:0")
            .env("FLASHSALE_DATABASE_URL", &database_url)
            .env("FLASHSALE_DATA_DIR", &dir)
            .env("FLASHSALE_JWT_SECRET", &jwt)
            .env("FLASHSALE_ADMIN_TOKEN", &admin)
            .env("FLASHSALE_REDIS_PREFIX", &tag)
            .env("FLASHSALE_LOG", "warn")
            .env_remove("FLASHSALE_REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("server.log"))?)
            .kill_on_drop(true);
        for name in ["INSTANCE", "SALE", "USER", "IP"] {
            cmd.env(format!("FLASHSALE_RATE_{name}"), "off");
        }
        if ledger == LedgerKind::Redis {
            cmd.env("FLASHSALE_REDIS_URL", args.redis_url_alone());
        }
        let mut process = cmd
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let pid = process.id().context("the server exited at once")?;
        let stdout = process.stdout.take().context("server stdout")?;
        let addr = tokio::time::timeout(START_TIMEOUT, listening_addr(stdout))
            .await
            .with_context(|| {
                format!("{} did not listen (see {})", bin.display(), dir.display())
            })??;
        Ok(Child {
            process,
            pid,
            base: format!("http://{addr}"),
            db,
            db_server: record.server(args).unwrap_or_default().to_owned(),
            secrets: (jwt, admin),
            dir,
            redis: (ledger == LedgerKind::Redis).then(|| (args.redis_url_alone(), tag.clone())),
        })
    }

    /// Waits until the database holds every order the accepted phase was answered 202 for.
    async fn drain_wait(&self, sku: SkuId, accepted: u64) -> anyhow::Result<()> {
        let Some((url, _)) = &self.db else {
            return Ok(());
        };
        let store = flashsale_engine::backends::open_store(url).await?;
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            let sold = store.sale(sku).await?.map_or(0, |s| s.counters.sold);
            if sold >= accepted {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the persister wrote {sold} of {accepted} orders in {DRAIN_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM (a graceful stop), then drops the run's database and files.
    async fn stop(mut self) -> anyhow::Result<()> {
        let _ = tokio::process::Command::new("kill")
            .arg(self.pid.to_string())
            .status()
            .await;
        if tokio::time::timeout(Duration::from_secs(30), self.process.wait())
            .await
            .is_err()
        {
            self.process.kill().await?;
        }
        if let Some((_, name)) = &self.db {
            super::setup::drop_database(&self.db_server, name).await?;
        }
        if let Some((url, tag)) = &self.redis {
            let mut conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            super::setup::cleanup_redis(&mut conn, tag).await?;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// The address from the server's `flashsale listening on http://ADDR (...)` line.
async fn listening_addr(stdout: tokio::process::ChildStdout) -> anyhow::Result<String> {
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await? {
        if let Some(rest) = line.split("listening on http://").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or_default();
            return Ok(addr.to_owned());
        }
    }
    anyhow::bail!("the server exited before it listened")
}

/// Instructions per second a callgrind server runs with no request (its workers' timers:
/// blacklist refresh, reconciler, dashboard), measured over [`IDLE`]; 0 without callgrind.
async fn callgrind_idle_rate(pid: Option<u32>, dir: &Path) -> anyhow::Result<f64> {
    if pid.is_none() {
        return Ok(0.0);
    }
    callgrind_zero(pid).await?;
    let zeroed = Instant::now();
    tokio::time::sleep(IDLE).await;
    let idle = callgrind_dump(pid, dir, 9).await?.unwrap_or(0);
    Ok(idle as f64 / zeroed.elapsed().as_secs_f64())
}

/// Zeroes a callgrind server's counters (before a phase).
async fn callgrind_zero(pid: Option<u32>) -> anyhow::Result<()> {
    let Some(pid) = pid else { return Ok(()) };
    callgrind_control(&["--zero", &pid.to_string()]).await
}

/// Dumps a callgrind server's counters (after phase `phase`) and reads its instruction total.
async fn callgrind_dump(pid: Option<u32>, dir: &Path, phase: usize) -> anyhow::Result<Option<u64>> {
    let Some(pid) = pid else { return Ok(None) };
    let before: Vec<PathBuf> = dumps(dir);
    callgrind_control(&[&format!("--dump=phase{phase}"), &pid.to_string()]).await?;
    let fresh = dumps(dir).into_iter().find(|p| !before.contains(p));
    let file = fresh.context("callgrind wrote no dump")?;
    let text = std::fs::read_to_string(&file)?;
    let total = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok());
    Ok(total)
}

fn dumps(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("callgrind.out"))
        })
        .collect();
    out.sort();
    out
}

async fn callgrind_control(args: &[&str]) -> anyhow::Result<()> {
    let out = tokio::process::Command::new("callgrind_control")
        .args(args)
        .output()
        .await
        .context("run callgrind_control (Debian package valgrind)")?;
    anyhow::ensure!(
        out.status.success(),
        "callgrind_control {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn print_run(r: &RunReport) {
    println!("\n{} · {:?} ledger · {:?}", r.bin, r.ledger, r.record);
    println!(
        "{:<10} {:>10} {:>7} {:>8} {:>8} {:>12}  CPU µs per answer",
        "path", "answers/s", "ratio", "p50 ms", "p99 ms", "instr/answer"
    );
    for (i, rate) in r.rates.iter().enumerate() {
        // A path's ratio is to the /healthz measured right after it.
        let ratio = match i % 2 {
            0 => rate.per_s / r.rates[i + 1].per_s.max(1e-9),
            _ => 1.0,
        };
        let instr = r.instructions_per_answer[i].map_or("-".into(), |n| format!("{n:.0}"));
        println!(
            "{:<10} {:>10.0} {:>7.2} {:>8.2} {:>8.2} {:>12}  {}",
            rate.name,
            rate.per_s,
            ratio,
            rate.p50_ms,
            rate.p99_ms,
            instr,
            r.cpu[i].line()
        );
    }
}

/// The ratios measured, and the same ratios of the server's CPU per answer (/healthz's over
/// the path's): what answers/s would show with the client on other cores, the server's own
/// cost alone deciding.
fn print_summary(reports: &[RunReport]) {
    println!("\nsummary: path answers/s ÷ /healthz right after (server CPU µs ratio)");
    for r in reports {
        let ratio = |i: usize| r.rates[i].per_s / r.rates[i + 1].per_s.max(1e-9);
        let cpu = |i: usize| match (r.cpu[i + 1].us("server"), r.cpu[i].us("server")) {
            (Some(h), Some(p)) if p > 0.0 => format!("{:.2}", h / p),
            _ => "-".into(),
        };
        println!(
            "{:<40} {:<20} accepted {:.2} ({})  sold out {:.2} ({})",
            r.bin,
            format!("{:?} + {:?}", r.ledger, r.record),
            ratio(0),
            cpu(0),
            ratio(2),
            cpu(2)
        );
    }
    print_records(reports);
}

/// The Redis ledger's accepted path on PostgreSQL against MariaDB, per binary, same run.
fn print_records(reports: &[RunReport]) {
    let find = |bin: &str, record| {
        reports
            .iter()
            .find(|r| r.bin == bin && r.ledger == LedgerKind::Redis && r.record == record)
    };
    for maria in reports.iter().filter(|r| r.record == Record::MariaDb) {
        let Some(pg) = find(&maria.bin, Record::PostgreSql) else {
            continue;
        };
        let us =
            |r: &RunReport, label| r.cpu[0].us(label).map_or("-".into(), |u| format!("{u:.1}"));
        println!(
            "{}: Redis accepted, PostgreSQL / MariaDB answers/s = {:.2}; server µs {} vs {}; \
             database µs per answer: postgres backends {} (all postgres processes {}) vs mariadbd {}",
            maria.bin,
            pg.rates[0].per_s / maria.rates[0].per_s.max(1e-9),
            us(pg, "server"),
            us(maria, "server"),
            us(pg, "postgres"),
            us(pg, "postgres-all"),
            us(maria, "mariadbd")
        );
    }
}
