//! From a `Config` to a running service: ledger, store, workers, listener, graceful shutdown.
//!
//! Shutdown follows mini-redis: one broadcast tells the listener and every worker to stop;
//! the listener stops accepting, finishes in-flight requests, then the workers finish their
//! current batch and return.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use flashsale_core::{Ledger, OrderStore};
use flashsale_embedded::EmbeddedLedger;
use flashsale_redis::RedisLedger;
use flashsale_store::{MySqlStore, SqliteStore};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

use crate::auth::Auth;
use crate::gateway::blacklist::{RedisBlacklist, SqliteBlacklist};
use crate::gateway::BlacklistStore;
use crate::state::AppState;
use crate::tunables::Tunables;
use flashsale_engine::reconcile::{ReconcileWorker, Reconciler};
use flashsale_engine::runner::{Runner, Worker};
use flashsale_engine::workers::{persister, ExpiryWorker, RestockWorker};

/// Everything the service needs to start. The CLI fills it from flags, env and a file.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// Set → Redis ledger; unset → embedded ledger.
    pub redis_url: Option<String>,
    pub redis_prefix: String,
    pub database_url: String,
    pub jwt_secret: String,
    pub admin_token: String,
    pub tunables: Tunables,
    /// Run the stream persister inside this process (Redis ledger only).
    pub run_persister: bool,
    /// Names this instance as a stream consumer and lease owner.
    pub instance_id: String,
    /// The reconcile worker of this process.
    pub reconcile: flashsale_engine::reconcile::WorkerSettings,
    /// Redis ledger: answer writes only once replicas have them (`WAIT`); `None` = off.
    pub redis_replication: Option<flashsale_redis::Replication>,
    /// An external identity provider whose RS256/ES256/EdDSA tokens are accepted too.
    pub identity: Option<crate::identity::IdentityConfig>,
}

/// A running service.
pub struct Server {
    pub addr: SocketAddr,
    pub state: AppState,
    tasks: Runner,
}

/// Opens the system of record a URL names (and runs its migrations).
pub async fn open_store(url: &str) -> anyhow::Result<Arc<dyn OrderStore>> {
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        Ok(Arc::new(
            MySqlStore::connect(url)
                .await
                .context("connect to the database")?,
        ))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(
            SqliteStore::open(url)
                .await
                .context("open the SQLite database")?,
        ))
    } else {
        bail!("unsupported database URL {url}: use mysql://… or sqlite://…")
    }
}

/// What a process serves from, opened once from its config: the hot ledger (routed as every
/// process of a deployment routes it: hot sales to their own Redis, so `serve`, `worker` and
/// `reconcile` see each sale where it lives), the system of record, and where the blacklist
/// lives. The embedded mode opens its SQLite file once and shares the one writer. Redis is
/// connected on first use: a process starts while Redis is down and answers 503 (`/readyz`
/// false) until it is back.
pub struct Backends {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub blacklist: Arc<dyn BlacklistStore>,
}

impl Backends {
    pub async fn open(config: &Config) -> anyhow::Result<Backends> {
        let url = config.database_url.as_str();
        let backends = match &config.redis_url {
            Some(redis_url) => {
                let mut ledger = RedisLedger::connect_lazy(redis_url, &config.redis_prefix)
                    .context("the Redis ledger")?;
                if let Some(replication) = config.redis_replication {
                    ledger = ledger
                        .with_replication(replication)
                        .context("FLASHSALE_REDIS_WAIT_*")?;
                }
                let blacklist = RedisBlacklist::connect(redis_url, &config.redis_prefix);
                Backends {
                    ledger: Arc::new(ledger),
                    store: open_store(url).await?,
                    blacklist: Arc::new(blacklist),
                }
            }
            None => {
                if !url.starts_with("sqlite:") {
                    bail!("the embedded ledger (no FLASHSALE_REDIS_URL) needs a sqlite:// database, not {url}");
                }
                let store = Arc::new(
                    SqliteStore::open(url)
                        .await
                        .context("open the SQLite database")?,
                );
                let ledger = EmbeddedLedger::open(store.clone())
                    .await
                    .context("open the embedded ledger")?;
                Backends {
                    ledger: Arc::new(ledger),
                    blacklist: Arc::new(SqliteBlacklist::new(store.clone())),
                    store,
                }
            }
        };
        Ok(Backends {
            ledger: flashsale_engine::placement::hot_routed(
                &flashsale_engine::placement::HotSales {
                    redis_url: config.tunables.gateway.hot_redis_url.clone(),
                    skus: config.tunables.gateway.hot_skus.clone(),
                },
                config.redis_url.as_deref(),
                &config.redis_prefix,
                config.redis_replication,
                backends.ledger,
            )?,
            ..backends
        })
    }
}

/// The ledger and store a config names (see [`Backends::open`]).
pub async fn backends(config: &Config) -> anyhow::Result<(Arc<dyn Ledger>, Arc<dyn OrderStore>)> {
    let b = Backends::open(config).await?;
    Ok((b.ledger, b.store))
}

/// Between hold expiry passes, and the most holds one `expire_due` call expires.
const EXPIRY_INTERVAL: Duration = Duration::from_millis(250);
const EXPIRY_BATCH_MAX: usize = 256;

/// Serves `router` on `listener` until `stop` fires (the probes of a worker process).
async fn serve_probes(
    listener: TcpListener,
    router: axum::Router,
    mut stop: broadcast::Receiver<()>,
) -> anyhow::Result<()> {
    let graceful = async move {
        let _ = stop.recv().await;
    };
    axum::serve(listener, router)
        .with_graceful_shutdown(graceful)
        .await?;
    Ok(())
}

/// Only the background workers (`flashsale worker`), and `/healthz`, `/readyz` and `/metrics`
/// on `config.listen` so the process is probed and scraped like `serve`.
pub struct Workers {
    /// Where the health and metrics routes listen.
    pub addr: SocketAddr,
    tasks: Runner,
}

impl Workers {
    pub async fn start(config: &Config) -> anyhow::Result<Workers> {
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("bind {}", config.listen))?;
        let addr = listener.local_addr()?;
        // Before any worker runs, so the recorder sees their first metrics.
        let metrics = crate::metrics::handle();
        let (ledger, store) = backends(config).await?;
        let mut tasks = Runner::default();
        let probes = crate::routes::health::Probes {
            ledger: ledger.clone(),
            store: store.clone(),
            metrics,
        };
        let router = crate::routes::health::router(probes);
        tasks.spawn_task("probes", |stop| serve_probes(listener, router, stop));
        let journal = Arc::new(flashsale_engine::reconcile::Journal::default());
        let reconciler = Reconciler::new(ledger.clone(), store.clone(), journal.clone());
        if let Some(worker) = ReconcileWorker::boxed(reconciler, config.reconcile, None) {
            tasks.spawn(worker);
        }
        for worker in workers(config, ledger, store, journal) {
            tasks.spawn(worker);
        }
        tracing::info!(%addr, "flashsale worker: /healthz, /readyz and /metrics");
        Ok(Workers { addr, tasks })
    }

    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.tasks.stop().await
    }
}

impl Server {
    /// Binds, builds the backends and starts serving and the workers.
    pub async fn start(config: Config) -> anyhow::Result<Server> {
        let mut auth =
            Auth::try_new(&config.jwt_secret, &config.admin_token).map_err(anyhow::Error::msg)?;
        crate::risk::RiskCheck::validate(&config.tunables.risk).map_err(anyhow::Error::msg)?;
        if let Some(identity) = &config.identity {
            auth = auth.with_identity(crate::identity::Identity::start(identity.clone()).await?);
        }
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("bind {}", config.listen))?;
        let addr = listener.local_addr()?;
        let Backends {
            ledger,
            store,
            blacklist,
        } = Backends::open(&config).await?;
        let state = AppState::with_blacklist(
            ledger.clone(),
            store.clone(),
            auth,
            config.tunables.clone(),
            blacklist,
        );
        if let Err(e) = state.gateway.blacklist.refresh().await {
            tracing::warn!(error = %e, "could not load the blacklist at start; retrying in the background");
        }
        let mut tasks = Runner::default();
        let app = crate::app(state.clone());
        let listener = crate::gateway::listener::CappedListener::new(
            listener,
            config.tunables.gateway.connections_max,
        );
        // The listener first: on shutdown it drains in-flight requests before workers stop.
        tasks.spawn_task("http", |mut stop| async move {
            let graceful = async move {
                let _ = stop.recv().await;
            };
            let app =
                app.into_make_service_with_connect_info::<crate::gateway::listener::ClientAddr>();
            axum::serve(listener, app)
                .with_graceful_shutdown(graceful)
                .await?;
            Ok(())
        });
        tasks.spawn(Box::new(crate::gateway::worker::GatewayWorker::new(&state)));
        if let Some(identity) = state.auth.identity() {
            let identity = identity.clone();
            tasks.spawn(Box::new(crate::identity::RefreshWorker::new(identity)));
        }
        for feed in ledger.restock_feeds() {
            tasks.spawn(Box::new(RestockWorker::new(feed)));
        }
        for worker in workers(&config, ledger, store, state.journal.clone()) {
            tasks.spawn(worker);
        }
        let reconciler = state.reconciler();
        let nudges = state.nudges.take();
        if let Some(worker) = ReconcileWorker::boxed(reconciler, config.reconcile, nudges) {
            tasks.spawn(worker);
        }
        let server = Server { addr, state, tasks };
        tracing::info!(%addr, "flashsale listening");
        Ok(server)
    }

    /// Stops accepting, finishes in-flight requests, then stops the workers.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.tasks.stop().await
    }
}

/// The workers every process runs; `journal` is the one its reconciler settles sales in.
fn workers(
    config: &Config,
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn OrderStore>,
    journal: Arc<flashsale_engine::reconcile::Journal>,
) -> Vec<Box<dyn Worker>> {
    let mut workers: Vec<Box<dyn Worker>> = vec![Box::new(ExpiryWorker::new(
        ledger,
        store.clone(),
        Arc::new(move |sku| journal.is_settled(sku)),
        EXPIRY_INTERVAL,
        EXPIRY_BATCH_MAX,
    ))];
    if let (Some(redis_url), true) = (&config.redis_url, config.run_persister) {
        workers.push(Box::new(persister(
            redis_url,
            &config.redis_prefix,
            &config.instance_id,
            store.clone(),
        )));
        // Hot sales on a dedicated Redis: its streams need a persister of their own.
        if let Some(hot_url) = &config.tunables.gateway.hot_redis_url {
            workers.push(Box::new(persister(
                hot_url,
                &config.redis_prefix,
                &format!("{}-hot", config.instance_id),
                store,
            )));
        }
    }
    workers
}
