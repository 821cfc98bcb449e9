//! What the engine's tests run on: a system of record of the test's own (a MariaDB or a
//! PostgreSQL database on the shared servers, opened as the service opens it), the Redis
//! ledger under a key prefix of its own on the shared Redis, one live sale in both, and
//! persisters to start and stop. The checks read the database's rows.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use flashsale_core::invariants::check_sale;
use flashsale_core::{
    HotCopies, HotLedger, HotPurchases, OrderStore, PurchaseOutcome, PurchaseRequest, Sale,
    SaleState, SkuId, StoredSale,
};
use flashsale_engine::persister::{Persister, PersisterConfig};
use flashsale_redis::{RedisLedger, StreamReader};
use flashsale_testkit::conformance::req;
use flashsale_testkit::redis_server::{shared_url, unique_prefix};
use flashsale_testkit::{mariadb, postgres, wait};
use tokio::sync::broadcast;

/// The epoch a rig's sale is warmed in.
pub const EPOCH: u64 = 1;
pub const LIMIT: Duration = Duration::from_secs(30);

/// A system of record the tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sor {
    MariaDb,
    Postgres,
}

/// Runs each body (`async fn name(sor: Sor)`) on MariaDB and on PostgreSQL, as two tests
/// `name::mariadb` and `name::postgres`.
macro_rules! backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mariadb() {
                super::$name($crate::common::Sor::MariaDb).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::common::Sor::Postgres).await;
            }
        }
    )*};
}
pub(crate) use backends;

/// A test's database, dropped with it.
enum Db {
    MariaDb(mariadb::TestDatabase),
    Postgres(postgres::TestDatabase),
}

impl Db {
    async fn create(sor: Sor) -> Db {
        match sor {
            Sor::MariaDb => Db::MariaDb(mariadb::TestDatabase::create().await),
            Sor::Postgres => Db::Postgres(postgres::TestDatabase::create().await),
        }
    }

    fn url(&self) -> &str {
        match self {
            Db::MariaDb(db) => &db.url,
            Db::Postgres(db) => &db.url,
        }
    }
}

pub struct Rig {
    pub store: Arc<dyn OrderStore>,
    pub ledger: Arc<RedisLedger>,
    pub prefix: String,
    pub sku: SkuId,
    pub conn: redis::aio::MultiplexedConnection,
    _db: Db,
}

/// `sale` live in a fresh database on `sor` and in Redis (epoch 1), nothing sold.
pub async fn rig(sor: Sor, sale: Sale) -> Rig {
    let db = Db::create(sor).await;
    let store = flashsale_engine::backends::open_store(db.url())
        .await
        .expect("open the system of record");
    let prefix = unique_prefix();
    let ledger = RedisLedger::connect(&shared_url(), &prefix)
        .await
        .expect("shared redis");
    let sku = sale.sku_id;
    store.create_sale(&sale).await.unwrap();
    store.set_state(sku, SaleState::Live).await.unwrap();
    assert_eq!(store.take_epoch(sku, 0).await.unwrap(), Some(EPOCH));
    ledger
        .warm(&sale, &sale.fresh_counters(), EPOCH)
        .await
        .unwrap();
    let client = redis::Client::open(shared_url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    Rig {
        store,
        ledger: Arc::new(ledger),
        prefix,
        sku,
        conn,
        _db: db,
    }
}

/// A running persister: stop it with [`Running::stop`].
pub struct Running {
    stop: broadcast::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops it and waits until its task (and every sale's) has ended.
    pub async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap();
    }
}

impl Rig {
    pub async fn xadd(&mut self, fields: &[(String, String)]) -> String {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.ledger.keys().events(self.sku)).arg("*");
        for (k, v) in fields {
            cmd.arg(k).arg(v);
        }
        cmd.query_async(&mut self.conn).await.unwrap()
    }

    /// A persister named `consumer` with short bounds (a lease of 600 ms, entries idle 200
    /// ms claimed).
    pub fn start(&self, consumer: &str) -> Running {
        let mut config = PersisterConfig::new(&shared_url(), &self.prefix, consumer);
        (
            config.bounds.block_ms,
            config.bounds.lease_ttl_ms,
            config.bounds.claim_idle_ms,
        ) = (50, 600, 200);
        config.bounds.attempts_max = 2;
        config.bounds.discover_every = Duration::from_millis(50);
        let (stop, rx) = broadcast::channel(1);
        let persister = Persister::new(config, self.store.clone());
        let task = tokio::spawn(async move { persister.run(rx).await.unwrap() });
        Running { stop, task }
    }

    pub async fn reader(&self, consumer: &str) -> StreamReader {
        StreamReader::connect(&shared_url(), &self.prefix, consumer)
            .await
            .unwrap()
    }

    pub async fn stored(&self) -> StoredSale {
        self.store.sale(self.sku).await.unwrap().unwrap()
    }

    pub async fn applied_seq(&self) -> u64 {
        self.stored().await.counters.seq
    }

    pub async fn wait_applied(&self, seq: u64) {
        wait::until(&format!("applied_seq {seq}"), LIMIT, || async {
            (self.applied_seq().await == seq).then_some(())
        })
        .await;
    }

    pub async fn hot_seq(&self) -> u64 {
        let counters = self.ledger.counters(self.sku).await.unwrap();
        counters.expect("the sale is warm").seq
    }

    /// Waits until the database has applied every event of the hot copy.
    pub async fn drain(&self) {
        let seq = self.hot_seq().await;
        self.wait_applied(seq).await;
    }

    /// Users `users` buy one unit each (request `r<user>`), in purchase calls of `per_call`
    /// requests, four calls at a time; returns the order numbers accepted.
    pub async fn buy(&self, users: std::ops::RangeInclusive<u64>, per_call: usize) -> Accepted {
        let reqs: Vec<PurchaseRequest> = users
            .map(|u| req(self.sku, u, &format!("r{u}"), 1))
            .collect();
        let mut accepted = BTreeSet::new();
        for calls in reqs.chunks(per_call * 4) {
            let tasks: Vec<_> = calls
                .chunks(per_call)
                .map(|call| {
                    let (ledger, call, sku) = (self.ledger.clone(), call.to_vec(), self.sku);
                    tokio::spawn(async move { ledger.purchase_batch(sku, &call).await.unwrap() })
                })
                .collect();
            for task in tasks {
                for outcome in task.await.unwrap() {
                    if let PurchaseOutcome::Accepted { order, .. } = outcome {
                        assert!(accepted.insert(order.order_no.to_string()));
                    }
                }
            }
        }
        accepted
    }

    /// Every accepted purchase stored exactly once and nothing else, the stored counters
    /// equal to the hot copy's, I1–I5, I7 and I8 from the rows, nothing parked.
    pub async fn assert_stored(&self, accepted: &Accepted) {
        let orders = self.store.orders(self.sku).await.unwrap();
        let live: Vec<String> = orders
            .iter()
            .filter(|o| o.status.is_live())
            .map(|o| o.order_no.to_string())
            .collect();
        assert_eq!(live.len(), accepted.len(), "one row per accepted purchase");
        assert_eq!(&live.into_iter().collect::<Accepted>(), accepted);
        let stored = self.stored().await;
        let hot = self.ledger.counters(self.sku).await.unwrap().unwrap();
        assert_eq!(stored.counters, hot, "database and hot copy");
        assert_eq!(stored.counters.sold, accepted.len() as u64);
        assert_invariants(self.store.as_ref(), self.sku).await;
        self.assert_not_parked().await;
    }

    pub async fn assert_not_parked(&self) {
        assert!(self.store.dead_letters(self.sku).await.unwrap().is_empty());
        assert!(!self.store.stream_paused(self.sku).await.unwrap());
    }

    /// Deletes every key under the prefix.
    pub async fn cleanup(mut self) {
        let pattern = format!("{}:*", self.prefix);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut self.conn)
                .await
                .unwrap();
        }
    }
}

/// Order numbers, as text.
pub type Accepted = BTreeSet<String>;

/// I1–I5 and I7 (`check_sale`, drained) and I8 (each `(epoch, seq)` one event, each order
/// number one buyer) from the database's rows.
pub async fn assert_invariants(store: &dyn OrderStore, sku: SkuId) {
    let stored = store
        .sale(sku)
        .await
        .unwrap()
        .expect("sale in the database");
    let orders = store.orders(sku).await.unwrap();
    let events = store.events(sku).await.unwrap();
    let report = check_sale(&stored.sale, &stored.counters, &orders, &events, true);
    assert!(
        report.is_ok(),
        "invariants broken: {:#?}",
        report.violations
    );
    let mut pairs = BTreeSet::new();
    let mut owners = HashMap::new();
    for e in &events {
        assert!(pairs.insert((e.epoch, e.seq)), "I8: two events at {e:?}");
        let owner = *owners.entry(e.order_no).or_insert(e.user_id);
        assert_eq!(owner, e.user_id, "I8: order {} has two buyers", e.order_no);
    }
    for o in &orders {
        let owner = *owners.entry(o.order_no).or_insert(o.user_id);
        assert_eq!(owner, o.user_id, "I8: order {} has two buyers", o.order_no);
    }
}
