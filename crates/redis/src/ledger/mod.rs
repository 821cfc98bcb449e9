//! `RedisLedger`: the hot ledger over Redis or Redis Cluster.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use flashsale_core::ledger::{Changed, HotSnapshot, RestockFeed, RestockListener};
use flashsale_core::limits::BATCH_LEN_MAX;
use flashsale_core::{
    BucketTransfers, Counters, Durability, ErrorCode, HotBuckets, HotCopies, HotLedger, HotOrder,
    LedgerError, OrderNo, PurchaseOutcome, PurchaseRequest, RequestKey, Resolution, Sale,
    SaleState, SkuId, SoldOutSupport, UserId,
};
use redis::{Cmd, FromRedisValue, RedisError, ScriptInvocation, Value};

pub mod bucketed;

use crate::codec::{as_int, as_string, decode_order, parse_entries, unexpected, Entry, Item};
use crate::conn::{bounded, split_urls, Conn, Timeouts};
use crate::keys::{CopyTag, Keys};
use crate::ledger::bucketed::{BucketTable, Layout};
use crate::restock::RestockHub;
use crate::scripts::Scripts;

/// Most holds one `expire_due` call may expire (the script's own bound).
pub const EXPIRE_MAX: usize = 10_000;

/// The hot ledger on Redis: one script call per batch, pay, cancel, expiry or warm.
pub struct RedisLedger {
    pub(crate) conn: Conn,
    keys: Keys,
    pub(crate) scripts: Scripts,
    restock: Arc<RestockHub>,
    replication: Option<Replication>,
    /// Sales of several buckets, when this ledger takes them ([`RedisLedger::with_buckets`]).
    pub(crate) buckets: Option<BucketTable>,
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

/// A sale's hash and every event of its stream, read in one atomic step (for the reconciler).
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub counters: Counters,
    pub epoch: u64,
    /// Every field of the sale hash, as stored.
    pub fields: HashMap<String, String>,
    /// Every entry of the events stream (not yet trimmed), in stream order.
    pub events: Vec<Entry>,
    /// How long the copy has been fenced; `None` when it is open.
    pub fenced_ms: Option<u64>,
}

impl RedisLedger {
    /// Connects to one node (`redis://host:port`) or to a cluster (a comma-separated list of
    /// node URLs), with a 300 ms connection timeout and a 1 s response timeout.
    pub async fn connect(url: &str, prefix: &str) -> Result<RedisLedger, LedgerError> {
        let ledger = RedisLedger::connect_lazy(url, prefix)?;
        ledger.ping().await?;
        Ok(ledger)
    }

    /// Like [`RedisLedger::connect`], connecting on first use: a service starts while Redis
    /// is down and answers 503 (and `/readyz` false) until it is back.
    pub fn connect_lazy(url: &str, prefix: &str) -> Result<RedisLedger, LedgerError> {
        let keys = Keys::new(prefix).map_err(LedgerError::Internal)?;
        let conn = Conn::lazy(url, Timeouts::HOT);
        let restock = Arc::new(RestockHub::new(split_urls(url), keys.restock_channel()));
        Ok(RedisLedger {
            conn,
            keys,
            scripts: Scripts::new(),
            restock,
            replication: None,
            buckets: None,
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

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// The skus of warmed sales (`fs:sales`), e.g. for the expiry worker.
    pub async fn sales(&self) -> Result<Vec<SkuId>, LedgerError> {
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("SMEMBERS").arg(self.keys.sales()).clone();
        let ids: Vec<u64> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        let mut ids: Vec<SkuId> = ids.into_iter().map(SkuId).collect();
        ids.sort();
        Ok(ids)
    }

    /// The sale hash and all events of its stream, atomically; `None` when not warm.
    pub async fn snapshot(
        &self,
        copy: impl Into<CopyTag>,
    ) -> Result<Option<Snapshot>, LedgerError> {
        let copy: CopyTag = copy.into();
        let sku = copy.sku;
        let mut inv = self.scripts.snapshot.prepare_invoke();
        inv.key(self.keys.sale(copy)).key(self.keys.events(copy));
        let reply: Vec<Value> = self.run("snapshot", &inv).await?;
        let (Some(Value::Array(flat)), Some(events), Some(fenced)) =
            (reply.first(), reply.get(1), reply.get(2).and_then(as_int))
        else {
            return Err(unexpected("snapshot", &Value::Array(reply)));
        };
        if flat.is_empty() {
            return Ok(None);
        }
        let fields: HashMap<String, String> = flat
            .chunks(2)
            .filter_map(|kv| Some((as_string(kv.first()?)?, as_string(kv.get(1)?)?)))
            .collect();
        let num = |name: &str| -> Result<u64, LedgerError> {
            fields
                .get(name)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| LedgerError::Internal(format!("sale {sku}: bad field {name}")))
        };
        Ok(Some(Snapshot {
            counters: Counters {
                total: num("total")?,
                available: num("available")?,
                reserved: num("reserved")?,
                sold: num("sold")?,
                seq: num("seq")?,
            },
            epoch: num("epoch")?,
            events: parse_entries(copy, events)?,
            fields,
            fenced_ms: u64::try_from(fenced).ok(),
        }))
    }

    /// One copy's [`HotSnapshot`]: its entries sorted into events (by epoch and seq),
    /// transfer sides (stream order) and entries that are neither.
    pub(crate) async fn copy_snapshot(
        &self,
        copy: CopyTag,
    ) -> Result<Option<HotSnapshot>, LedgerError> {
        let Some(snap) = self.snapshot(copy).await? else {
            return Ok(None);
        };
        let (mut events, mut transfers, mut bad_entries) = (Vec::new(), Vec::new(), Vec::new());
        for (id, parsed) in snap.events {
            match parsed {
                Ok(Item::Event(e)) => events.push(e),
                Ok(Item::Transfer(t)) => transfers.push(t),
                Err(why) => bad_entries.push((id, why.to_string())),
            }
        }
        events.sort_by_key(|e| (e.epoch, e.seq));
        let state = snap
            .fields
            .get("state")
            .and_then(|s| SaleState::parse(s))
            .ok_or_else(|| LedgerError::Internal(format!("copy {copy}: bad field state")))?;
        Ok(Some(HotSnapshot {
            counters: snap.counters,
            epoch: snap.epoch,
            events,
            transfers,
            bad_entries,
            fenced_ms: snap.fenced_ms,
            state,
        }))
    }

    /// Rebuild: puts orders read back from the system of record into the loaded (fenced)
    /// copy of `epoch` (its order, request, buyer units and hold), in chunks of
    /// `BATCH_LEN_MAX`; orders already present are skipped, so it can be repeated. Counters
    /// are not touched. Returns how many orders were added.
    pub async fn restore_orders(
        &self,
        sku: SkuId,
        epoch: u64,
        orders: &[HotOrder],
    ) -> Result<usize, LedgerError> {
        if let Some(other) = orders
            .iter()
            .find(|o| o.sku_id != sku || o.order_no.sku() != sku)
        {
            return Err(LedgerError::Internal(format!(
                "order {} is not of sale {sku}",
                other.order_no
            )));
        }
        // A bucketed sale's copies are restored one bucket at a time (its rebuild): the copy
        // of `epoch`, with the orders it sold.
        let layout = self.layout(sku).await?;
        let copy = layout.copy(flashsale_core::buckets::bucket_of_epoch(epoch, layout.n()));
        let orders: Vec<&HotOrder> = (orders.iter())
            .filter(|o| layout.copy_of_order(&o.order_no) == copy)
            .collect();
        let mut added = 0;
        for chunk in orders.chunks(BATCH_LEN_MAX) {
            let mut inv = self.scripts.restore_orders.prepare_invoke();
            for key in self.keys.copy_state(copy) {
                inv.key(key);
            }
            inv.arg(epoch).arg(chunk.len());
            for o in chunk {
                inv.arg(o.order_no.to_string())
                    .arg(o.user_id.0)
                    .arg(o.request_id.as_str())
                    .arg(o.quantity)
                    .arg(o.status.as_str())
                    .arg(o.deadline_ms)
                    .arg(o.created_at_ms);
            }
            let n: i64 = self.run("restore_orders", &inv).await?;
            added += usize::try_from(n).map_err(|_| LedgerError::AlreadyWarm)?;
        }
        Ok(added)
    }

    /// Runs a script under the call deadline and records its latency.
    async fn run<T: FromRedisValue>(
        &self,
        name: &'static str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, LedgerError> {
        let started = Instant::now();
        let mut conn = self.conn.clone();
        let result = bounded(Timeouts::HOT.call, inv.invoke_async(&mut conn)).await;
        metrics::histogram!(flashsale_core::metric_names::SCRIPT_LATENCY, "script" => name)
            .record(started.elapsed().as_secs_f64());
        result
    }

    fn resolve_keys<'a>(&self, inv: &mut ScriptInvocation<'a>, copy: CopyTag) {
        for key in self.resolve_key_list(copy) {
            inv.key(key);
        }
    }

    fn resolve_key_list(&self, copy: CopyTag) -> [String; 5] {
        [
            self.keys.sale(copy),
            self.keys.buyers(copy),
            self.keys.orders(copy),
            self.keys.holds(copy),
            self.keys.events(copy),
        ]
    }

    /// Runs a write script (`cmd`, its EVALSHA). With [`Replication`] set, the script, a bump
    /// of the sale's wait mark and `WAIT` go in one pipeline: over one connection to one
    /// node, in that order, so the WAIT counts the replicas of the node that ran the script
    /// and covers its writes (a replay writes nothing of its own: the mark is the write the
    /// WAIT waits for). A WAIT sent apart may reach another node: once a primary dies, the
    /// cluster client sends a command whose node it has no connection to over a random
    /// one, whose replicas would then confirm a write they never saw. Returns the script's
    /// reply and, with replication, how many replicas acknowledged. Loads `source` (the
    /// script's text) once on NOSCRIPT (a restart, a failover, SCRIPT FLUSH) and tries again.
    pub(crate) async fn run_write(
        &self,
        name: &'static str,
        copy: CopyTag,
        source: &'static str,
        cmd: &Cmd,
    ) -> Result<(Value, Option<i64>), LedgerError> {
        let started = Instant::now();
        let mut result = self.send_write(copy, cmd).await;
        if matches!(&result, Err(e) if e.kind() == redis::ErrorKind::NoScriptError) {
            // To every primary (the cluster client's routing of SCRIPT LOAD): a slot map that
            // is a failover behind would send a load for one slot to a node that is no longer
            // its primary.
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(source);
            let mut conn = self.conn.clone();
            bounded::<String>(Timeouts::HOT.call, load.query_async(&mut conn)).await?;
            result = self.send_write(copy, cmd).await;
        }
        let elapsed_s = started.elapsed().as_secs_f64();
        metrics::histogram!(flashsale_core::metric_names::SCRIPT_LATENCY, "script" => name)
            .record(elapsed_s);
        // Still NOSCRIPT after a load: the slot moved meanwhile (a failover); retry later.
        let (reply, acked) = result.map_err(|e| match e.kind() {
            redis::ErrorKind::NoScriptError => LedgerError::Unavailable(e.to_string()),
            _ => crate::conn::map_err(e),
        })?;
        if acked.is_some() {
            metrics::histogram!(flashsale_core::metric_names::REDIS_WAIT_SECONDS).record(elapsed_s);
        }
        Ok((reply, acked))
    }

    /// One try of [`RedisLedger::run_write`].
    async fn send_write(
        &self,
        copy: CopyTag,
        cmd: &Cmd,
    ) -> Result<(Value, Option<i64>), RedisError> {
        let mut conn = self.conn.clone();
        let call = async {
            let Some(want) = self.replication else {
                let reply: Value = cmd.query_async(&mut conn).await?;
                return Ok((reply, None));
            };
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone())
                .cmd("INCR")
                .arg(self.keys.wait_mark(copy))
                .ignore()
                .cmd("WAIT")
                .arg(want.replicas)
                .arg(want.timeout.as_millis() as u64);
            let (reply, acked): (Value, i64) = pipe.query_async(&mut conn).await?;
            Ok((reply, Some(acked)))
        };
        match tokio::time::timeout(Timeouts::HOT.call, call).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from((
                redis::ErrorKind::IoError,
                "redis did not answer in time",
            ))),
        }
    }

    /// Pay (`kind` "paid") or cancel ("cancelled"); `name` labels the script's latency.
    async fn resolve(
        &self,
        name: &'static str,
        kind: &'static str,
        order_no: &OrderNo,
        user: UserId,
    ) -> Result<Resolution, LedgerError> {
        let sku = order_no.sku();
        let copy = self.layout(sku).await?.copy_of_order(order_no);
        let mut cmd = evalsha(&self.scripts.resolve, &self.resolve_key_list(copy));
        cmd.arg(order_no.to_string()).arg(user.0).arg(kind);
        let (reply, acked) = self
            .run_write(name, copy, crate::scripts::RESOLVE, &cmd)
            .await?;
        let reply: Vec<Value> = redis::from_redis_value(&reply).map_err(crate::conn::map_err)?;
        let head = reply.first().and_then(as_string);
        match head.as_deref() {
            Some("OK" | "R") => {
                let encoded = reply.get(1).and_then(as_string).unwrap_or_default();
                let order =
                    decode_order(&order_no.to_string(), &encoded).map_err(LedgerError::Internal)?;
                self.confirmed(acked, vec![*order_no])?;
                if reply.get(2).and_then(as_int) == Some(1) {
                    self.announce_restock(sku).await;
                }
                Ok(Ok(order))
            }
            Some("X") => Ok(Err(code_of(reply.get(1))?)),
            _ => Err(unexpected(name, &Value::Array(reply))),
        }
    }

    /// With [`Replication`] set (`acked` is the WAIT's count): confirms that `written`
    /// (accepted purchases or a resolved order) reached the replicas, or answers
    /// [`LedgerError::Unconfirmed`] naming them: the loss journal keeps them and the client
    /// retries with the same request id (and gets the first outcome).
    fn confirmed(&self, acked: Option<i64>, written: Vec<OrderNo>) -> Result<(), LedgerError> {
        let (Some(want), Some(acked)) = (self.replication, acked) else {
            return Ok(());
        };
        if acked >= i64::from(want.replicas) {
            return Ok(());
        }
        metrics::counter!(flashsale_core::metric_names::REDIS_WAIT_TIMEOUTS).increment(1);
        Err(LedgerError::Unconfirmed {
            written,
            why: format!(
                "written to the primary but acknowledged by {acked} of {} replicas within {:?}; \
                 retry with the same request_id",
                want.replicas, want.timeout
            ),
        })
    }

    /// [`RedisLedger::confirmed`] of a write that names no order (a transfer).
    pub(crate) fn confirmed_write(&self, acked: Option<i64>) -> Result<(), LedgerError> {
        self.confirmed(acked, Vec::new())
    }

    /// `set_state.lua`'s answer: applied or skipped; a fenced copy is `Unavailable` (its
    /// rebuild opens it in the database's state).
    async fn state_answer(&self, inv: &ScriptInvocation<'_>) -> Result<bool, LedgerError> {
        match self.run::<String>("set_state", inv).await?.as_str() {
            "OK" => Ok(true),
            "SKIPPED" => Ok(false),
            other => Err(LedgerError::Unavailable(format!(
                "the sale's hot copy is {other}: a rebuild is under way"
            ))),
        }
    }

    /// Tells this instance's listener at once, and every instance through the channel.
    pub(crate) async fn announce_restock(&self, sku: SkuId) {
        if let Some(listener) = self.restock.listener() {
            listener(sku);
        }
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("PUBLISH")
            .arg(&self.restock.channel)
            .arg(sku.0)
            .clone();
        let sent: Result<i64, _> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await;
        if let Err(e) = sent {
            tracing::warn!(%sku, error = %e, "could not publish a restock");
        }
    }
}

/// `EVALSHA <script> <numkeys> <keys…>`; the script's arguments follow.
pub(crate) fn evalsha(script: &redis::Script, keys: &[String]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}

fn code_of(v: Option<&Value>) -> Result<ErrorCode, LedgerError> {
    let text = v.and_then(as_string).unwrap_or_default();
    ErrorCode::parse(&text)
        .ok_or_else(|| LedgerError::Internal(format!("script answered unknown code {text:?}")))
}

/// One request's `[tag, order_no | code, encoded | ""]` of the purchase reply.
fn outcome_of(entry: &[String]) -> Result<PurchaseOutcome, LedgerError> {
    let bad = || LedgerError::Internal(format!("unexpected purchase result {entry:?}"));
    match entry {
        [tag, order_no, encoded] if tag == "A" || tag == "R" => {
            let order = decode_order(order_no, encoded).map_err(LedgerError::Internal)?;
            Ok(PurchaseOutcome::Accepted {
                order,
                replayed: tag == "R",
            })
        }
        [tag, code, empty] if tag == "X" && empty.is_empty() => ErrorCode::parse(code)
            .map(PurchaseOutcome::Rejected)
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

#[async_trait]
impl HotLedger for RedisLedger {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn durability(&self) -> Durability {
        Durability::Streamed
    }

    /// One by default: every key of a sale carries one hash tag, so its stock lives on one
    /// shard. [`BUCKETS_MAX`](flashsale_core::buckets::BUCKETS_MAX) with
    /// [`RedisLedger::with_buckets`].
    fn buckets_max(&self) -> u16 {
        match self.buckets {
            Some(_) => flashsale_core::buckets::BUCKETS_MAX,
            None => 1,
        }
    }

    /// Every bucket in turn (bucket 0 first): a purchase racing the change may be judged by a
    /// bucket changed and another not yet, as it may be on one copy just before or after.
    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), LedgerError> {
        for copy in self.layout(sku).await?.copies() {
            let mut inv = self.scripts.set_state.prepare_invoke();
            inv.key(self.keys.sale(copy)).arg(state.as_str());
            self.state_answer(&inv).await?;
        }
        Ok(())
    }

    /// Every bucket that is in `from`, bucket 0 last; answered by bucket 0. A call that
    /// fails midway leaves bucket 0 in `from`, so its retry changes the rest.
    async fn set_state_if(&self, sku: SkuId, from: SaleState, to: SaleState) -> Changed {
        let mut changed = false;
        for copy in self.layout(sku).await?.copies().into_iter().rev() {
            let mut inv = self.scripts.set_state.prepare_invoke();
            inv.key(self.keys.sale(copy))
                .arg(to.as_str())
                .arg(from.as_str());
            changed = self.state_answer(&inv).await?;
        }
        Ok(changed)
    }

    async fn purchase_batch(
        &self,
        sku: SkuId,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        flashsale_core::ledger::check_batch(sku, reqs)?;
        let layout = self.layout(sku).await?;
        if layout.is_single() {
            return self.purchase_copy(sku.into(), reqs).await;
        }
        self.purchase_bucketed(&layout, reqs).await
    }

    async fn pay(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.resolve("pay", "paid", order_no, user).await
    }

    async fn cancel(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.resolve("cancel", "cancelled", order_no, user).await
    }

    async fn expire_due(&self, sku: SkuId, max: usize) -> Result<usize, LedgerError> {
        if max == 0 {
            return Ok(0);
        }
        let layout = self.layout(sku).await?;
        if !layout.is_single() {
            // The worker that expires holds also finishes transfers left in flight; one it
            // cannot finish now must not stop the holds from expiring.
            if let Err(e) = self.finish_transfers(sku).await {
                tracing::warn!(%sku, error = %e, "could not finish transfers in flight");
            }
        }
        let mut expired = 0;
        let mut restocked = false;
        let (mut failed, mut failures) = (None, 0u64);
        let mut answered = false;
        for copy in layout.copies() {
            // A bucket missing, fenced or down keeps only its own holds: the others' still
            // expire. The call fails only when no bucket answered (its caller counts that).
            let (n, back) = match self.expire_copy(copy, max - expired).await {
                Ok(done) => done,
                Err(e) if layout.is_single() => return Err(e),
                Err(e) => {
                    tracing::warn!(%sku, bucket = copy.bucket, error = %e, "hold expiry of one bucket failed; the others go on");
                    failures += 1;
                    failed.get_or_insert(e);
                    continue;
                }
            };
            answered = true;
            expired += n;
            restocked |= back;
            if expired >= max {
                break;
            }
        }
        if restocked {
            self.announce_restock(sku).await;
        }
        match failed {
            Some(e) if !answered => Err(e),
            _ => {
                if failures > 0 {
                    metrics::counter!(flashsale_core::metric_names::EXPIRY_FAILURES, "sku" => sku.to_string())
                        .increment(failures);
                }
                Ok(expired)
            }
        }
    }

    async fn counters(&self, sku: SkuId) -> Result<Option<Counters>, LedgerError> {
        let layout = self.layout(sku).await?;
        let mut sum: Option<Counters> = None;
        for copy in layout.copies() {
            let Some(c) = self.counters_copy(copy).await? else {
                return Ok(None);
            };
            sum = Some(sum.unwrap_or_default().plus(&c));
        }
        Ok(sum)
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, LedgerError> {
        let copy = self.layout(order_no.sku()).await?.copy_of_order(order_no);
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("HGET")
            .arg(self.keys.orders(copy))
            .arg(order_no.to_string())
            .clone();
        let v: Option<String> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        v.map(|encoded| decode_order(&order_no.to_string(), &encoded))
            .transpose()
            .map_err(LedgerError::Internal)
    }

    fn lane(&self, sku: SkuId, user: UserId) -> u16 {
        self.buckets
            .as_ref()
            .and_then(|table| table.known(sku))
            .map_or(0, |layout| layout.home(user).bucket)
    }

    fn keeps_buckets(&self, _sku: SkuId) -> bool {
        self.buckets.is_some()
    }

    async fn hot_buckets(&self, sku: SkuId) -> Result<Option<HotBuckets>, LedgerError> {
        if self.layout(sku).await?.is_single() {
            return Ok(None);
        }
        Ok(self.bucket_view(sku).await?.map(|view| HotBuckets {
            buckets: view
                .buckets
                .iter()
                .map(|b| (b.bucket, b.counters))
                .collect(),
            in_flight_units: view.in_flight_units,
        }))
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        bounded(Timeouts::HOT.call, self.conn.ready()).await
    }
}

impl RedisLedger {
    /// One purchase script call on one hot copy (a sale's own, or one of its buckets).
    pub(crate) async fn purchase_copy(
        &self,
        copy: CopyTag,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        let keys = [
            self.keys.sale(copy),
            self.keys.buyers(copy),
            self.keys.requests(copy),
            self.keys.orders(copy),
            self.keys.holds(copy),
            self.keys.events(copy),
        ];
        let mut cmd = evalsha(&self.scripts.purchase, &keys);
        cmd.arg(reqs.len());
        for r in reqs {
            cmd.arg(r.user_id.0)
                .arg(r.request_id.as_str())
                .arg(r.quantity);
        }
        let (reply, acked) = self
            .run_write("purchase", copy, crate::scripts::PURCHASE, &cmd)
            .await?;
        // One flat array, three fields per request (see purchase.lua).
        let flat: Vec<String> = redis::from_redis_value(&reply).map_err(crate::conn::map_err)?;
        if flat.len() != 3 * reqs.len() {
            return Err(LedgerError::Internal(format!(
                "{} result fields for {} requests",
                flat.len(),
                reqs.len()
            )));
        }
        let outcomes = flat
            .chunks_exact(3)
            .map(outcome_of)
            .collect::<Result<Vec<_>, _>>()?;
        let written: Vec<OrderNo> = outcomes
            .iter()
            .filter_map(|o| match o {
                PurchaseOutcome::Accepted { order, .. } => Some(order.order_no),
                _ => None,
            })
            .collect();
        if !written.is_empty() {
            self.confirmed(acked, written)?;
        }
        Ok(outcomes)
    }

    /// Expires at most `max` due holds of one copy: how many, and whether stock came back.
    async fn expire_copy(&self, copy: CopyTag, max: usize) -> Result<(usize, bool), LedgerError> {
        let mut inv = self.scripts.expire_due.prepare_invoke();
        self.resolve_keys(&mut inv, copy);
        inv.arg(max.min(EXPIRE_MAX));
        let reply: Vec<i64> = self.run("expire_due", &inv).await?;
        let [expired, restocked] = reply[..] else {
            return Err(LedgerError::Internal(format!(
                "unexpected expire_due reply {reply:?}"
            )));
        };
        let expired =
            usize::try_from(expired).map_err(|_| LedgerError::Internal("negative count".into()))?;
        Ok((expired, restocked == 1))
    }

    /// The counters of one copy, `None` when it is not warm.
    pub(crate) async fn counters_copy(
        &self,
        copy: CopyTag,
    ) -> Result<Option<Counters>, LedgerError> {
        let sku = copy.sku;
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("HMGET")
            .arg(self.keys.sale(copy))
            .arg(&["total", "available", "reserved", "sold", "seq"])
            .clone();
        let v: Vec<Option<u64>> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        match v[..] {
            [None, ..] => Ok(None),
            [Some(total), Some(available), Some(reserved), Some(sold), Some(seq)] => {
                Ok(Some(Counters {
                    total,
                    available,
                    reserved,
                    sold,
                    seq,
                }))
            }
            _ => Err(LedgerError::Internal(format!(
                "sale {sku}: incomplete counters {v:?}"
            ))),
        }
    }
}

#[async_trait]
impl HotCopies for RedisLedger {
    async fn load(&self, sale: &Sale, counters: &Counters, epoch: u64) -> Result<(), LedgerError> {
        sale.validate().map_err(LedgerError::Internal)?;
        self.check_buckets(sale).map_err(LedgerError::Internal)?;
        if !counters.conserved() || counters.total != sale.total_stock {
            return Err(LedgerError::Internal(format!(
                "counters do not fit the sale: {counters:?}"
            )));
        }
        if sale.buckets > 1 {
            return self.load_bucketed(sale, counters, epoch).await;
        }
        self.load_copy(sale.sku_id.into(), sale, counters, epoch, None)
            .await
    }

    async fn fence(&self, sku: SkuId) -> Result<bool, LedgerError> {
        let mut present = false;
        for copy in self.layout(sku).await?.copies() {
            let mut inv = self.scripts.fence.prepare_invoke();
            inv.key(self.keys.sale(copy));
            present |= self.run::<i64>("fence", &inv).await? == 1;
        }
        Ok(present)
    }

    async fn open(&self, sku: SkuId, epoch: u64, state: SaleState) -> Result<(), LedgerError> {
        let layout = self.layout(sku).await?;
        for copy in layout.copies() {
            let mut inv = self.scripts.open.prepare_invoke();
            inv.key(self.keys.sale(copy))
                .arg(layout.epoch_of(copy.bucket, epoch))
                .arg(state.as_str());
            if self.run::<String>("open", &inv).await? != "OK" {
                return Err(LedgerError::AlreadyWarm);
            }
        }
        Ok(())
    }

    async fn bucket_salts(&self, sku: SkuId) -> Result<Option<Vec<u32>>, LedgerError> {
        let layout = self.layout(sku).await?;
        Ok((!layout.is_single()).then(|| layout.copies().iter().map(|c| c.salt).collect()))
    }

    async fn place_buckets(&self, sale: &Sale) -> Result<Option<Vec<u32>>, LedgerError> {
        if !self.kept_in_buckets(sale) {
            return Ok(None);
        }
        Ok(Some(self.place(sale.sku_id, sale.buckets).await?))
    }

    fn adopt_salts(&self, sku: SkuId, salts: &[u32]) {
        if let Some(table) = &self.buckets {
            if table.known(sku).is_none() && salts.len() > 1 && salts[0] == 0 {
                table.keep(&Layout::many(sku, salts.to_vec()));
            }
        }
    }

    async fn fence_bucket(&self, sku: SkuId, bucket: u16) -> Result<bool, LedgerError> {
        let (_, copy) = self.bucket_copy(sku, bucket).await?;
        let mut inv = self.scripts.fence.prepare_invoke();
        inv.key(self.keys.sale(copy));
        Ok(self.run::<i64>("fence", &inv).await? == 1)
    }

    async fn load_bucket(
        &self,
        sale: &Sale,
        bucket: u16,
        counters: &Counters,
        epoch: u64,
        transfers: &BucketTransfers,
    ) -> Result<(), LedgerError> {
        let (layout, copy) = self.bucket_copy(sale.sku_id, bucket).await?;
        let text = layout.salts_text();
        self.load_copy(copy, sale, counters, epoch, Some((layout.n(), &text)))
            .await?;
        self.restore_transfers(copy, transfers).await
    }

    async fn open_bucket(
        &self,
        sku: SkuId,
        bucket: u16,
        epoch: u64,
        state: SaleState,
    ) -> Result<(), LedgerError> {
        let (_, copy) = self.bucket_copy(sku, bucket).await?;
        let mut inv = self.scripts.open.prepare_invoke();
        inv.key(self.keys.sale(copy)).arg(epoch).arg(state.as_str());
        match self.run::<String>("open", &inv).await?.as_str() {
            "OK" => Ok(()),
            _ => Err(LedgerError::AlreadyWarm),
        }
    }

    async fn hot_snapshot(&self, sku: SkuId) -> Result<Option<HotSnapshot>, LedgerError> {
        self.layout(sku).await?.single_only("a snapshot")?;
        self.copy_snapshot(sku.into()).await
    }

    async fn bucket_snapshot(
        &self,
        sku: SkuId,
        bucket: u16,
    ) -> Result<Option<HotSnapshot>, LedgerError> {
        match self.layout(sku).await?.bucket(bucket) {
            Some(copy) => self.copy_snapshot(copy).await,
            None => Ok(None),
        }
    }

    async fn restore_orders(
        &self,
        sku: SkuId,
        epoch: u64,
        orders: &[HotOrder],
    ) -> Result<usize, LedgerError> {
        RedisLedger::restore_orders(self, sku, epoch, orders).await
    }
}

impl RedisLedger {
    /// Bucket `bucket` of a sale of several, with the sale's layout.
    async fn bucket_copy(&self, sku: SkuId, bucket: u16) -> Result<(Layout, CopyTag), LedgerError> {
        let layout = self.layout(sku).await?;
        let copy = layout.bucket(bucket).ok_or_else(|| {
            LedgerError::Internal(format!("sale {sku} has no bucket {bucket} in Redis"))
        })?;
        Ok((layout, copy))
    }

    /// Puts a rebuilt bucket's transfers back (its copy was loaded with none): the ids it
    /// took in, and its outs still pending, which `finish_transfers` then carries home.
    async fn restore_transfers(
        &self,
        copy: CopyTag,
        transfers: &BucketTransfers,
    ) -> Result<(), LedgerError> {
        if transfers.ins.is_empty() && transfers.pending.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for chunk in transfers.ins.chunks(BATCH_LEN_MAX) {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(self.keys.transfers_in(copy));
            for id in chunk {
                cmd.arg(id).arg("restored");
            }
            pipe.add_command(cmd).ignore();
        }
        for chunk in transfers.pending.chunks(BATCH_LEN_MAX) {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(self.keys.transfers_out(copy));
            for (id, to, units) in chunk {
                cmd.arg(id).arg(format!("{to}:{units}"));
            }
            pipe.add_command(cmd).ignore();
        }
        let mut conn = self.conn.clone();
        bounded(Timeouts::HOT.call, pipe.query_async::<()>(&mut conn)).await
    }

    /// Loads one copy: a sale's own, or one bucket of a sale of several (`layout`: the
    /// sale's bucket count and salts, stored with every bucket).
    pub(crate) async fn load_copy(
        &self,
        copy: CopyTag,
        sale: &Sale,
        counters: &Counters,
        epoch: u64,
        layout: Option<(u16, &str)>,
    ) -> Result<(), LedgerError> {
        let sku = sale.sku_id;
        let mut inv = self.scripts.load.prepare_invoke();
        for key in self.keys.copy_state(copy) {
            inv.key(key);
        }
        if layout.is_some() {
            // A bucket's transfers belong to its copy: a new copy starts with none.
            inv.key(self.keys.transfers_out(copy))
                .key(self.keys.transfers_in(copy));
        }
        inv.arg(sku.0)
            .arg(counters.total)
            .arg(counters.available)
            .arg(counters.reserved)
            .arg(counters.sold)
            .arg(counters.seq)
            .arg(epoch)
            .arg(sale.per_user_limit)
            .arg(sale.mode.as_str())
            .arg(sale.payment_timeout_ms)
            .arg(sale.starts_at_ms)
            .arg(sale.ends_at_ms)
            .arg(sale.state.as_str());
        if let Some((buckets, salts)) = layout {
            inv.arg(buckets).arg(salts);
        }
        let answer: String = self.run("load", &inv).await?;
        if answer == "ALREADY_WARM" {
            return Err(LedgerError::AlreadyWarm);
        }
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("SADD").arg(self.keys.sales()).arg(sku.0).clone();
        let _: i64 = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        Ok(())
    }
}

#[async_trait]
impl SoldOutSupport for RedisLedger {
    async fn accepted_keys(
        &self,
        sku: SkuId,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError> {
        let mut all = Vec::new();
        for copy in self.layout(sku).await?.copies() {
            let Some(keys) = self.accepted_keys_copy(copy, max - all.len()).await? else {
                return Ok(None);
            };
            all.extend(keys);
        }
        Ok(Some(all))
    }

    async fn is_accepted(&self, sku: SkuId, key: &RequestKey) -> Result<bool, LedgerError> {
        let copy = self.layout(sku).await?.home(key.user);
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("HEXISTS")
            .arg(self.keys.requests(copy))
            .arg(key.to_string())
            .clone();
        bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await
    }

    /// The copy's epoch and its accepted requests; for a sale of several buckets, a version
    /// of every bucket's epoch and the accepted requests of all. Every bucket's epoch is in
    /// it, not bucket 0's only: a rebuild of another bucket that lost a purchase, then one
    /// new purchase, leaves the count as it was, and keys read before would miss the new one.
    async fn accepted_count(&self, sku: SkuId) -> Result<Option<(u64, usize)>, LedgerError> {
        let layout = self.layout(sku).await?;
        let mut epochs = Vec::with_capacity(usize::from(layout.n()));
        let mut count = 0;
        for copy in layout.copies() {
            let Some((epoch, len)) = self.accepted_count_copy(copy).await? else {
                return Ok(None);
            };
            epochs.push(epoch);
            count += len;
        }
        let version = match epochs[..] {
            [epoch] => epoch,
            _ => crate::ledger::bucketed::epochs_version(&epochs),
        };
        Ok(Some((version, count)))
    }

    fn on_restock(&self, listener: RestockListener) {
        self.restock.set_listener(listener);
    }

    fn restock_feeds(&self) -> Vec<RestockFeed> {
        vec![RestockHub::feed(&self.restock)]
    }
}

impl RedisLedger {
    /// The accepted request keys of one copy, `None` when more than `max` or not warm.
    async fn accepted_keys_copy(
        &self,
        copy: CopyTag,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError> {
        let sku = copy.sku;
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS")
            .arg(self.keys.sale(copy))
            .cmd("HLEN")
            .arg(self.keys.requests(copy));
        let (warm, len): (bool, usize) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        if !warm || len > max {
            return Ok(None);
        }
        let cmd = redis::cmd("HKEYS").arg(self.keys.requests(copy)).clone();
        let keys: Vec<String> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        if keys.len() > max {
            return Ok(None);
        }
        let parse = |k: &String| {
            RequestKey::parse(k)
                .ok_or_else(|| LedgerError::Internal(format!("sale {sku}: bad request key {k:?}")))
        };
        keys.iter().map(parse).collect::<Result<_, _>>().map(Some)
    }

    async fn accepted_count_copy(
        &self,
        copy: CopyTag,
    ) -> Result<Option<(u64, usize)>, LedgerError> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("HGET")
            .arg(self.keys.sale(copy))
            .arg("epoch")
            .cmd("HLEN")
            .arg(self.keys.requests(copy));
        let (epoch, len): (Option<u64>, usize) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        Ok(epoch.map(|e| (e, len)))
    }
}
