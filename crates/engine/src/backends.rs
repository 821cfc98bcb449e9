//! What a process runs on, opened once from its [`Settings`]: the hot ledger (placed as every
//! process of a deployment places it: hot sales on their own Redis, so `serve`, `worker` and
//! `reconcile` see each sale where it lives) and the system of record; and the workers every
//! process runs over them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use flashsale_core::{Ledger, OrderStore};
use flashsale_embedded::EmbeddedLedger;
use flashsale_redis::RedisLedger;
use flashsale_store::{MySqlStore, PgStore, SqliteStore};

use crate::persister::{Persister, PersisterConfig};
use crate::reconcile::Journal;
use crate::runner::{Runner, Worker};
use crate::settings::Settings;
use crate::shop::{Shop, ShopConfig};
use crate::workers::ExpiryWorker;

/// The hot ledger and the system of record of a process.
pub struct Backends {
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    /// The SQLite store the embedded ledger writes to (`None` on the Redis ledger).
    pub embedded: Option<Arc<SqliteStore>>,
}

/// Opens the system of record a URL names (and runs its migrations).
pub async fn open_store(url: &str) -> anyhow::Result<Arc<dyn OrderStore>> {
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        Ok(Arc::new(
            MySqlStore::connect(url)
                .await
                .context("connect to the database")?,
        ))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(
            PgStore::connect(url)
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
        bail!("unsupported database URL {url}: use mysql://…, postgres://… or sqlite://…")
    }
}

/// The contract step to one row per purchase on the database at `url`
/// (`Store::contract_one_row`; docs/DEPLOY.md, "Rolling upgrades"), after its migrations.
pub async fn contract_one_row(url: &str) -> anyhow::Result<flashsale_store::ContractReport> {
    let report = if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        MySqlStore::connect(url).await?.contract_one_row().await?
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        PgStore::connect(url).await?.contract_one_row().await?
    } else if url.starts_with("sqlite:") {
        SqliteStore::open(url).await?.contract_one_row().await?
    } else {
        bail!("unsupported database URL {url}: use mysql://…, postgres://… or sqlite://…")
    };
    Ok(report)
}

impl Backends {
    /// The embedded mode opens its SQLite file once and shares the one writer. Redis is
    /// connected on first use: a process starts while Redis is down and answers 503
    /// (`/readyz` false) until it is back.
    pub async fn open(settings: &Settings) -> anyhow::Result<Backends> {
        let url = settings.database_url.as_str();
        let l = &settings.ledger;
        Ok(match &l.redis_url {
            Some(redis_url) => {
                let mut ledger = RedisLedger::connect_lazy(redis_url, &l.redis_prefix)
                    .context("the Redis ledger")?
                    .with_buckets();
                if l.redis_records {
                    ledger = ledger.with_records();
                }
                if let Some(replication) = l.replication {
                    ledger = ledger
                        .with_replication(replication)
                        .context("FLASHSALE_REDIS_WAIT_*")?;
                }
                Backends {
                    ledger: Arc::new(l.hot_sales.place(ledger)),
                    store: open_store(url).await?,
                    embedded: None,
                }
            }
            None => {
                l.hot_sales.check_embedded()?;
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
                    store: store.clone(),
                    embedded: Some(store),
                }
            }
        })
    }
}

/// The ledger and store `settings` name (see [`Backends::open`]).
pub async fn open(settings: &Settings) -> anyhow::Result<(Arc<dyn Ledger>, Arc<dyn OrderStore>)> {
    let b = Backends::open(settings).await?;
    Ok((b.ledger, b.store))
}

/// Between hold expiry passes, and the most holds one `expire_due` call expires.
const EXPIRY_INTERVAL: Duration = Duration::from_millis(250);
const EXPIRY_BATCH_MAX: usize = 256;

/// The workers every process runs (hold expiry; the persisters when they run here);
/// `journal` is the one its reconciler settles sales in.
pub fn workers(
    settings: &Settings,
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn OrderStore>,
    journal: Arc<Journal>,
) -> Vec<Box<dyn Worker>> {
    let mut workers: Vec<Box<dyn Worker>> = vec![Box::new(ExpiryWorker::new(
        ledger,
        store.clone(),
        Arc::new(move |sku| journal.is_settled(sku)),
        EXPIRY_INTERVAL,
        EXPIRY_BATCH_MAX,
    ))];
    match crate::relay::relays(&settings.events, &settings.instance_id, store.event_log()) {
        Ok(relays) => workers.extend(relays.into_iter().map(|r| Box::new(r) as Box<dyn Worker>)),
        Err(e) => tracing::error!(error = %e, "order events are not relayed by this process"),
    }
    let l = &settings.ledger;
    let p = &settings.persister;
    if let (Some(redis_url), true) = (&l.redis_url, p.run) {
        let id = &settings.instance_id;
        let config = PersisterConfig::with(redis_url, &l.redis_prefix, id, p);
        workers.push(Box::new(Persister::new(config, store.clone())));
        // Hot sales on a dedicated Redis: its streams need a persister of their own.
        if let Some(hot_url) = &l.hot_sales.redis_url {
            let consumer = format!("{id}-hot");
            let config = PersisterConfig::with(hot_url, &l.redis_prefix, &consumer, p);
            workers.push(Box::new(Persister::new(config, store)));
        }
    }
    workers
}

/// The engine's background work alone, with no requests to serve (`flashsale worker`): the
/// shop over the backends its settings name (built as `serve` builds it), and in one runner
/// its workers (the reconcile worker settles sales in this shop's loss journal: this process
/// promises nothing to buyers).
pub struct Background {
    pub shop: Arc<Shop>,
    pub tasks: Runner,
}

impl Background {
    pub async fn start(settings: &Settings) -> anyhow::Result<Background> {
        let (ledger, store) = open(settings).await?;
        let shop = Shop::new(ledger, store, ShopConfig::default(), None);
        let mut tasks = Runner::default();
        for worker in shop.workers(settings) {
            tasks.spawn(worker);
        }
        Ok(Background { shop, tasks })
    }
}
