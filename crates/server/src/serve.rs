//! From a `Config` to a running service: ledger, store, workers, listener, graceful shutdown.
//!
//! Shutdown follows mini-redis: one broadcast tells the listener and every worker to stop;
//! the listener stops accepting, finishes in-flight requests, then the workers finish their
//! current batch and return.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context};
use flashsale_core::{Ledger, OrderStore};
use flashsale_engine::gateway_store::{RedisBlacklist, SqliteBlacklist};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

use crate::auth::Auth;
use crate::gateway::BlacklistStore;
use crate::state::AppState;
use crate::tunables::Tunables;
use flashsale_core::admission::AdmissionBook;
use flashsale_engine::admission::grouped::{GroupedBook, GROUP_MAX, REDIS_GROUP_MAX};
use flashsale_engine::backends::Background;
use flashsale_engine::runner::Runner;
use flashsale_engine::settings::Settings;

/// Everything the service needs to start: the engine's settings and the HTTP-only ones. The
/// CLI fills it from flags, env and a file.
#[derive(Debug, Clone)]
pub struct Config {
    /// Ledger, database, instance name, persister, reconcile worker.
    pub engine: Settings,
    pub listen: SocketAddr,
    pub jwt_secret: String,
    pub admin_token: String,
    pub tunables: Tunables,
    /// An external identity provider whose RS256/ES256/EdDSA tokens are accepted too.
    pub identity: Option<crate::identity::IdentityConfig>,
}

/// A running service.
pub struct Server {
    pub addr: SocketAddr,
    pub state: AppState,
    tasks: Runner,
}

/// What a process serves from, opened once from its config: the engine's backends (see
/// [`flashsale_engine::backends::Backends::open`]) and where the blacklist lives (Redis, or
/// the embedded ledger's SQLite database).
pub struct Backends {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub blacklist: Arc<dyn BlacklistStore>,
    /// Where queue and draw sales keep their admission state: the sale's Redis slot, or the
    /// embedded ledger's database.
    pub admission: Arc<dyn AdmissionBook>,
}

impl Backends {
    pub async fn open(config: &Config) -> anyhow::Result<Backends> {
        let b = flashsale_engine::backends::Backends::open(&config.engine).await?;
        let l = &config.engine.ledger;
        // Joins of a spike share writes (`GroupedBook`): one script call per group on Redis,
        // one transaction on the database.
        let (blacklist, admission): (Arc<dyn BlacklistStore>, Arc<dyn AdmissionBook>) =
            match (&l.redis_url, b.embedded) {
                (Some(redis_url), _) => {
                    let keys =
                        flashsale_redis::Keys::new(&l.redis_prefix).map_err(anyhow::Error::msg)?;
                    let conn = flashsale_redis::conn::Conn::lazy(
                        redis_url,
                        flashsale_redis::conn::Timeouts::HOT,
                    );
                    let book = flashsale_redis::admission::RedisAdmission::new(conn, keys);
                    (
                        Arc::new(RedisBlacklist::connect(redis_url, &l.redis_prefix)),
                        Arc::new(GroupedBook::new(Arc::new(book), REDIS_GROUP_MAX)),
                    )
                }
                (None, Some(sqlite)) => (
                    Arc::new(SqliteBlacklist::new(sqlite.clone())),
                    Arc::new(GroupedBook::new(sqlite, GROUP_MAX)),
                ),
                (None, None) => bail!("the embedded ledger needs its SQLite database"),
            };
        Ok(Backends {
            ledger: b.ledger,
            store: b.store,
            blacklist,
            admission,
        })
    }
}

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
    /// The engine's background work ([`flashsale_engine::backends::Background`]), and the
    /// probe routes over its backends.
    pub async fn start(config: &Config) -> anyhow::Result<Workers> {
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("bind {}", config.listen))?;
        let addr = listener.local_addr()?;
        // Before any worker runs, so the recorder sees their first metrics.
        let metrics = crate::metrics::handle();
        let Background { shop, mut tasks } = Background::start(&config.engine).await?;
        let probes = crate::routes::health::Probes { shop, metrics };
        let router = crate::routes::health::router(probes);
        tasks.spawn_task("probes", |stop| serve_probes(listener, router, stop));
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
            admission,
        } = Backends::open(&config).await?;
        let state = AppState::with_admission(
            ledger,
            store,
            auth,
            config.tunables.clone(),
            blacklist,
            Some((admission, config.engine.admission)),
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
        tasks.spawn(Box::new(crate::workers::GatewayWorker::new(&state)));
        let every = crate::workers::HISTORY_EVERY;
        tasks.spawn(Box::new(crate::workers::HistoryWorker::new(&state, every)));
        if let Some(identity) = state.auth.identity() {
            let identity = identity.clone();
            tasks.spawn(Box::new(crate::identity::RefreshWorker::new(identity)));
        }
        let shop = &state.shop;
        for worker in shop.restock_workers() {
            tasks.spawn(worker);
        }
        for worker in shop.workers(&config.engine) {
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
