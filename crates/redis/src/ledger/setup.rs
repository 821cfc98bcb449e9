//! The [`RedisLedger`]: its connections, settings (replication, buckets, hot sales), and
//! where a sale lives: the Redis that holds its keys, and its buckets there.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use flashsale_core::{LedgerError, SkuId};

use super::layout::{BucketTable, Layout};
use crate::conn::{bounded, split_urls, Conn, Timeouts};
use crate::keys::Keys;
use crate::restock::RestockHub;
use crate::scripts::Scripts;

/// The hot ledger on Redis: one script call per batch, pay, cancel, expiry or warm.
pub struct RedisLedger {
    main: Server,
    /// Named hot sales on a Redis of their own ([`RedisLedger::with_hot_sales`]).
    hot: Option<HotSales>,
    pub(super) keys: Keys,
    pub(crate) scripts: Scripts,
    pub(super) replication: Option<Replication>,
    /// Sales of several buckets, when this ledger takes them ([`RedisLedger::with_buckets`]).
    pub(crate) buckets: Option<BucketTable>,
    /// The key layout of the copies this ledger loads ([`RedisLedger::with_records`]); it
    /// serves a copy of either layout, as the copy says.
    pub(crate) records: bool,
}

/// One Redis (a node or a cluster) that holds sales: every key of a sale lives wholly on
/// one, so its scripts stay atomic.
pub(super) struct Server {
    pub(super) conn: Conn,
    /// Restocks of its sales, published on its channel.
    pub(super) restock: Arc<RestockHub>,
}

impl Server {
    fn lazy(url: &str, keys: &Keys) -> Server {
        Server {
            conn: Conn::lazy(url, Timeouts::HOT),
            restock: Arc::new(RestockHub::new(split_urls(url), keys.restock_channel())),
        }
    }
}

/// Named sales kept on a Redis of their own, so that their spike cannot slow the others.
/// The route is a pure function of the sku, which every order number carries, so every
/// instance routes alike.
struct HotSales {
    server: Server,
    skus: HashSet<u64>,
}

/// Longest WAIT timeout: below the connection's response timeout, so a WAIT that times out
/// is answered by Redis, not cut by the client.
pub const WAIT_TIMEOUT_MAX: Duration = Duration::from_millis(900);

/// Answer a purchase, payment or cancellation only once its write reached `replicas`
/// replicas of the sale's primary (`WAIT replicas timeout` after the script). It narrows
/// the window in which a failover loses acknowledged purchases; it does not close it (Redis
/// replication stays asynchronous: see docs/DEPLOY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replication {
    pub replicas: u32,
    pub timeout: Duration,
}

impl RedisLedger {
    /// Connects to one node (`redis://host:port`) or to a cluster (a comma-separated list of
    /// node URLs), with a 300 ms connection timeout and a 1 s response timeout.
    pub async fn connect(url: &str, prefix: &str) -> Result<RedisLedger, LedgerError> {
        let ledger = RedisLedger::connect_lazy(url, prefix)?;
        ledger.ready().await?;
        Ok(ledger)
    }

    /// Like [`RedisLedger::connect`], connecting on first use: a service starts while Redis
    /// is down and answers 503 (and `/readyz` false) until it is back.
    pub fn connect_lazy(url: &str, prefix: &str) -> Result<RedisLedger, LedgerError> {
        let keys = Keys::new(prefix).map_err(LedgerError::Internal)?;
        Ok(RedisLedger {
            main: Server::lazy(url, &keys),
            hot: None,
            keys,
            scripts: Scripts::new(),
            replication: None,
            buckets: None,
            records: false,
        })
    }

    /// Answers accepted writes only once they reached replicas (see [`Replication`]).
    pub fn with_replication(mut self, replication: Replication) -> Result<Self, LedgerError> {
        if replication.replicas == 0 || replication.timeout > WAIT_TIMEOUT_MAX {
            return Err(LedgerError::Internal(format!(
                "replicas must be at least 1 and the timeout at most {WAIT_TIMEOUT_MAX:?}"
            )));
        }
        self.replication = Some(replication);
        Ok(self)
    }

    /// Takes sales of up to [`BUCKETS_MAX`](flashsale_core::buckets::BUCKETS_MAX) buckets,
    /// each bucket a hot copy of its own placed on its own primary (docs/DESIGN.md, "Stock
    /// buckets"). Off by default: the persister and the reconciler read one stream per sale,
    /// so the service keeps to sales of one bucket on Redis until they read a stream per
    /// bucket; the hot path (purchases, transfers, holds) is complete.
    pub fn with_buckets(mut self) -> Self {
        self.buckets = Some(BucketTable::default());
        self
    }

    /// Loads every copy (a warm, a rebuild) in layout 2: one record per buyer, read and written
    /// once per purchase (`scripts/records.lua`), instead of the requests, orders and buyers
    /// hashes of layout 1. Copies already loaded keep their layout until their next load; this
    /// ledger serves both. Off by default: a release before this one serves a copy of layout 2
    /// as if it held no buyer (docs/DEPLOY.md, "Rolling upgrades"), so turn it on once no
    /// instance of an older release runs beside this one.
    pub fn with_records(mut self) -> Self {
        self.records = true;
        self
    }

    /// Keeps the sales `skus` on the Redis at `url` (connected on first use, with this
    /// ledger's prefix, replication and buckets), every other sale on the main one. Both
    /// Redis' streams are persisted (a persister per Redis).
    pub fn with_hot_sales(mut self, url: &str, skus: impl IntoIterator<Item = u64>) -> Self {
        self.hot = Some(HotSales {
            server: Server::lazy(url, &self.keys),
            skus: skus.into_iter().collect(),
        });
        self
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Whether the main Redis is a cluster.
    pub fn is_cluster(&self) -> bool {
        self.main.conn.is_cluster()
    }

    /// The Redis that holds `sku`'s keys.
    pub(super) fn server(&self, sku: SkuId) -> &Server {
        match &self.hot {
            Some(hot) if hot.skus.contains(&sku.0) => &hot.server,
            _ => &self.main,
        }
    }

    /// A connection to the Redis that holds `sku`'s keys.
    pub(crate) fn conn(&self, sku: SkuId) -> Conn {
        self.server(sku).conn.clone()
    }

    /// A connection to the main Redis.
    pub(crate) fn main_conn(&self) -> Conn {
        self.main.conn.clone()
    }

    /// Every Redis this ledger's sales live on, the main one first.
    pub(super) fn servers(&self) -> impl Iterator<Item = &Server> {
        std::iter::once(&self.main).chain(self.hot.as_ref().map(|hot| &hot.server))
    }

    /// The skus of warmed sales (`fs:sales` of every Redis), e.g. for the expiry worker.
    pub async fn sales(&self) -> Result<Vec<SkuId>, LedgerError> {
        let mut ids = Vec::new();
        for server in self.servers() {
            let mut conn = server.conn.clone();
            let cmd = redis::cmd("SMEMBERS").arg(self.keys.sales()).clone();
            let some: Vec<u64> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
            ids.extend(some.into_iter().map(SkuId));
        }
        ids.sort();
        Ok(ids)
    }

    /// Whether every Redis answers (a connection made, a PING), the main one first.
    pub(super) async fn ready(&self) -> Result<(), LedgerError> {
        for server in self.servers() {
            bounded(Timeouts::HOT.call, server.conn.ready()).await?;
        }
        Ok(())
    }

    /// Where `sku`'s buckets live. Without [`RedisLedger::with_buckets`] every sale is of one
    /// bucket, with no round trip. Otherwise read once from bucket 0's hash (and kept): a
    /// sale not warm yet is taken as one bucket and asked again next time.
    pub async fn layout(&self, sku: SkuId) -> Result<Layout, LedgerError> {
        let Some(table) = &self.buckets else {
            return Ok(Layout::single(sku));
        };
        if let Some(layout) = table.known(sku) {
            return Ok(layout);
        }
        let cmd = redis::cmd("HMGET")
            .arg(self.keys().sale(sku))
            .arg(&["epoch", "buckets", "salts"])
            .clone();
        let mut conn = self.conn(sku);
        let got: Vec<Option<String>> =
            bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        let layout = match &got[..] {
            [None, ..] => return Ok(Layout::single(sku)),
            [Some(_), Some(n), Some(salts)] => Layout::parse(sku, n, salts).ok_or_else(|| {
                LedgerError::Internal(format!("sale {sku}: bad buckets {n:?} {salts:?}"))
            })?,
            _ => Layout::single(sku),
        };
        table.keep(&layout);
        Ok(layout)
    }
}
