//! `flashsale`: the binary. Commands: `serve`, `worker`, `demo`, `reconcile`, `bench`,
//! `token`, `migrate`.
//!
//! - [`settings`]: flags, environment, config file and secrets.
//! - [`demo`]: the whole flash sale in one command, with a report.
//! - [`reconcile`]: one reconciler run from the command line.
//! - [`bench`]: `flashsale bench …`, the measurements of `flashsale_bench::harness`.
//!
//! The top of the dependency graph: may depend on every crate of the workspace; none
//! depends on it.

mod bench;
mod demo;
mod demo_admission;
mod demo_events;
mod demo_reserve;
mod reconcile;
mod secrets;
mod settings;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use flashsale_core::UserId;
use flashsale_server::auth::Auth;
use flashsale_server::{Config, Server, Tunables};

use settings::Settings;

/// The server, the demo's load and the benches allocate per request; glibc's malloc showed up
/// at the top of their profiles.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "flashsale", version, about = "A flash-sale inventory service")]
struct Cli {
    /// A file of `NAME=value` lines (default ./flashsale.env when present).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API (embedded ledger unless a Redis URL is set).
    Serve {
        #[command(flatten)]
        settings: Settings,
        /// Do not run the stream persister in this process (run `flashsale worker` instead).
        #[arg(long)]
        no_persister: bool,
    },
    /// Run only the background workers (the stream persister, hold expiry, the reconciler),
    /// with /healthz, /readyz and /metrics on their own address.
    Worker {
        #[command(flatten)]
        settings: Settings,
        /// Address of the worker's /healthz, /readyz and /metrics (apart from FLASHSALE_LISTEN,
        /// so a worker beside a `serve` sharing its settings does not take its port).
        #[arg(
            long,
            env = "FLASHSALE_WORKER_LISTEN",
            default_value = "127.0.0.1:8081"
        )]
        worker_listen: std::net::SocketAddr,
    },
    /// A whole flash sale in one command: server, sale, spike, report.
    Demo(demo::DemoArgs),
    /// Measurements (run in release mode): see BENCHMARKS.md.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Check every sale (I1–I7, hot vs database, loss) and optionally repair.
    Reconcile(reconcile::ReconcileArgs),
    /// Print a user token signed with the configured secret.
    Token {
        #[command(flatten)]
        settings: Settings,
        #[arg(long)]
        user: u64,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 86_400)]
        ttl_s: u64,
    },
    /// Create or upgrade the database schema.
    Migrate {
        #[command(flatten)]
        settings: Settings,
        /// Also the contract step to one row per purchase (docs/DEPLOY.md, "Rolling
        /// upgrades"): only once every instance runs this release.
        #[arg(long)]
        contract: bool,
    },
}

fn main() -> anyhow::Result<()> {
    no_transparent_huge_pages();
    let pre = Cli::try_parse();
    if let Ok(cli) = &pre {
        settings::load_config_file(cli.config.as_deref())?;
    }
    // Parse again so values from the config file are seen as environment.
    let cli = Cli::parse();
    init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(cli.command))
}

/// The kernel's transparent huge pages off for this process. mimalloc reserves its memory in
/// 2 MiB-aligned ranges, so under THP `always` (this machine's and many distributions' setting)
/// a first touch faults in and zeroes a whole 2 MiB page, and the allocator's purges split them
/// again: a fifth of `bench ledger`'s time was the kernel zeroing pages; with THP off here it
/// committed 182,000–213,000 purchases/s against 149,000–165,000, and the HTTP paths measured
/// the same either way (BENCHMARKS.md, "Group commits pipelined…"). This is what mimalloc's
/// own `allow_thp=0` does, but mimalloc reads its options before `main`, where only the
/// environment reaches (set there, it also covers the arenas mapped before `main`).
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integers only and touches no memory of this process;
    // a kernel without it answers EINVAL, and the process runs as before.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLASHSALE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve {
            settings,
            no_persister,
        } => serve(settings, !no_persister).await,
        Command::Worker {
            settings,
            worker_listen,
        } => worker(settings, worker_listen).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Bench(cmd) => bench::run(cmd).await,
        Command::Reconcile(args) => reconcile::run(args).await,
        Command::Token {
            settings,
            user,
            ttl_s,
        } => {
            anyhow::ensure!(user > 0, "--user must be positive");
            let (jwt, admin) = settings.secrets()?;
            println!("{}", Auth::new(&jwt, &admin).sign(UserId(user), ttl_s));
            Ok(())
        }
        Command::Migrate { settings, contract } => {
            let url = settings.database_url();
            flashsale_engine::backends::open_store(&url).await?;
            println!("schema of {url} is current");
            if contract {
                let done = flashsale_engine::backends::contract_one_row(&url).await?;
                println!(
                    "contracted to one row per purchase: {} orders given their seq, {} event rows \
                     removed; binaries below schema version 16 no longer start",
                    done.backfilled, done.events_removed
                );
            }
            Ok(())
        }
    }
}

pub fn server_config(settings: &Settings, run_persister: bool) -> anyhow::Result<Config> {
    let (jwt_secret, admin_token) = settings.secrets()?;
    let mut tunables = Tunables::default();
    settings.gateway.apply(&mut tunables)?;
    settings.risk.apply(&mut tunables)?;
    Ok(Config {
        engine: settings.engine(run_persister)?,
        listen: settings.listen,
        jwt_secret,
        admin_token,
        tunables,
        identity: settings.identity.config()?,
    })
}

async fn serve(settings: Settings, run_persister: bool) -> anyhow::Result<()> {
    let config = server_config(&settings, run_persister)?;
    let server = Server::start(config).await?;
    println!(
        "flashsale listening on http://{} ({} ledger)",
        server.addr,
        server.state.shop.ledger().kind()
    );
    shutdown_signal().await;
    tracing::info!("shutting down: finishing in-flight requests");
    server.shutdown().await
}

async fn worker(settings: Settings, listen: std::net::SocketAddr) -> anyhow::Result<()> {
    let config = Config {
        listen,
        ..server_config(&settings, true)?
    };
    anyhow::ensure!(
        config.engine.ledger.redis_url.is_some(),
        "`flashsale worker` persists Redis streams: set FLASHSALE_REDIS_URL"
    );
    let workers = flashsale_server::serve::Workers::start(&config)
        .await
        .context("start workers")?;
    println!(
        "flashsale worker: /healthz, /readyz and /metrics on http://{}",
        workers.addr
    );
    shutdown_signal().await;
    workers.shutdown().await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
