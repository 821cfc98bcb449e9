//! flashsale-embedded: the embedded hot ledger. No servers: one in-process writer per sale,
//! group commit to SQLite, recovery from SQLite at start.
//!
//! Per sale, a [`SaleBook`] (core's reference rules) sits behind an async mutex. Callers
//! never touch it directly: each call queues a job on the sale and spawns a drain task; the
//! task that gets the lock takes every queued job (flat combining), runs them through the
//! book with one clock reading, commits all their events in ONE transaction
//! (synchronous=FULL) through the [`writer`] thread (a purpose-built `rusqlite` writer; a
//! group it cannot write cleanly, and every group of an in-memory store, goes through
//! `SqliteStore::apply_events`), and only then answers every job. Nothing is answered before its commit, so an accepted purchase survives
//! kill -9. The drain runs in its own task, so a caller that gives up (timeout, closed
//! connection) cannot leave the book ahead of the database. If a commit fails, the book is
//! reloaded from SQLite and every job of the group gets `Unavailable`.
//!
//! May depend on flashsale-core and flashsale-store (its `SqliteStore`); never on Redis or
//! the server.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use tokio::sync::{oneshot, Mutex as AsyncMutex, OwnedMutexGuard};

use flashsale_core::clock::now_ms;
use flashsale_core::ledger::{Changed, RestockListener};
use flashsale_core::limits::BATCH_LEN_MAX;
use flashsale_core::{
    Counters, ErrorCode, Event, EventKind, HotCopies, HotLedger, HotOrder, LedgerError, OrderNo,
    OrderStore, PurchaseOutcome, PurchaseRequest, RequestKey, Resolution, Sale, SaleBook,
    SaleState, SkuId, SoldOutSupport, StoreError, UserId,
};
use flashsale_store::SqliteStore;

mod writer;
use writer::{Group, NotWritten, Writer};

/// Most requests one group commit takes from the queue (the rest wait for the next one).
const GROUP_REQUESTS_MAX: usize = 4 * BATCH_LEN_MAX;

/// The embedded hot ledger over a [`SqliteStore`].
#[derive(Clone)]
pub struct EmbeddedLedger {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<SqliteStore>,
    /// The group commit's writer; None for an in-memory store (no file to open twice).
    writer: Option<Writer>,
    /// Groups the writer refused and the store applied instead.
    refused_groups: std::sync::atomic::AtomicU64,
    sales: RwLock<HashMap<SkuId, Arc<Slot>>>,
    /// Serializes `warm` calls (rare, operator-driven) so two cannot race on one sku.
    warm_lock: AsyncMutex<()>,
    restock: RwLock<Option<RestockListener>>,
}

/// One sale: its book and its queue of jobs.
struct Slot {
    sku: SkuId,
    book: Arc<AsyncMutex<Loaded>>,
    queue: Mutex<VecDeque<Job>>,
    /// Requests (purchase requests, one per other job) queued and not yet answered.
    depth: AtomicUsize,
}

/// A book as committed to SQLite (`stale` when a failure may have left it ahead).
struct Loaded {
    book: SaleBook,
    stale: bool,
    /// Since when a rebuild has fenced the book (it judges nothing until opened).
    fenced_at: Option<std::time::Instant>,
    /// Every accepted request (for `accepted_keys`).
    accepted: Vec<RequestKey>,
}

enum Job {
    Purchase {
        reqs: Vec<PurchaseRequest>,
        reply: oneshot::Sender<Result<Vec<PurchaseOutcome>, LedgerError>>,
    },
    Resolve {
        order_no: OrderNo,
        user: UserId,
        kind: EventKind,
        reply: oneshot::Sender<Result<Resolution, LedgerError>>,
    },
    Expire {
        max: usize,
        reply: oneshot::Sender<Result<usize, LedgerError>>,
    },
}

impl Job {
    fn weight(&self) -> usize {
        match self {
            Job::Purchase { reqs, .. } => reqs.len().max(1),
            _ => 1,
        }
    }

    /// The answer of a fenced book: UNAVAILABLE to every purchase and resolution, no expiry.
    fn fenced(self) {
        let unavailable = PurchaseOutcome::Rejected(ErrorCode::Unavailable);
        let _ = match self {
            Job::Purchase { reqs, reply } => {
                let outcomes = vec![unavailable; reqs.len()];
                reply.send(Ok(outcomes)).map_err(drop)
            }
            Job::Resolve { reply, .. } => reply.send(Ok(Err(ErrorCode::Unavailable))).map_err(drop),
            Job::Expire { reply, .. } => reply.send(Ok(0)).map_err(drop),
        };
    }

    fn fail(self, err: impl Fn() -> LedgerError) {
        // A caller that went away does not need the answer.
        let _ = match self {
            Job::Purchase { reply, .. } => reply.send(Err(err())).map_err(drop),
            Job::Resolve { reply, .. } => reply.send(Err(err())).map_err(drop),
            Job::Expire { reply, .. } => reply.send(Err(err())).map_err(drop),
        };
    }
}

/// A job's answer, held back until the group's commit.
enum Answer {
    Purchase(
        oneshot::Sender<Result<Vec<PurchaseOutcome>, LedgerError>>,
        Vec<PurchaseOutcome>,
    ),
    Resolve(oneshot::Sender<Result<Resolution, LedgerError>>, Resolution),
    Expire(oneshot::Sender<Result<usize, LedgerError>>, usize),
}

impl Answer {
    fn send(self) {
        let _ = match self {
            Answer::Purchase(tx, v) => tx.send(Ok(v)).map_err(drop),
            Answer::Resolve(tx, v) => tx.send(Ok(v)).map_err(drop),
            Answer::Expire(tx, v) => tx.send(Ok(v)).map_err(drop),
        };
    }

    fn fail(self, err: &LedgerError) {
        let e = || LedgerError::Unavailable(err.to_string());
        let _ = match self {
            Answer::Purchase(tx, _) => tx.send(Err(e())).map_err(drop),
            Answer::Resolve(tx, _) => tx.send(Err(e())).map_err(drop),
            Answer::Expire(tx, _) => tx.send(Err(e())).map_err(drop),
        };
    }
}

fn unavailable(e: StoreError) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

/// Set (to anything): every group goes through `SqliteStore::apply_events`, as before the
/// writer thread; for comparing the two in one build (`flashsale bench ledger`).
pub const SQLX_WRITER_ENV: &str = "FLASHSALE_EMBEDDED_SQLX_WRITER";

/// What writes a group commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupWriter {
    /// The writer thread ([`writer`]), falling back to the store for a group it refuses.
    Thread,
    /// `SqliteStore::apply_events` for every group.
    Store,
}

/// The file of the store's main database; None when it is in memory.
async fn database_file(store: &SqliteStore) -> Result<Option<std::path::PathBuf>, LedgerError> {
    use sqlx::Row;
    let row = sqlx::query("SELECT file FROM pragma_database_list WHERE name = 'main'")
        .fetch_optional(store.writer())
        .await
        .map_err(|e| LedgerError::Unavailable(e.to_string()))?;
    let file: Option<String> = row.and_then(|r| r.try_get::<String, _>(0).ok());
    Ok(file.filter(|f| !f.is_empty()).map(Into::into))
}

impl EmbeddedLedger {
    /// Opens the ledger over `store` and rebuilds, from SQLite, the book of every sale that
    /// is not `scheduled` or has sold anything.
    /// The group writer is the writer thread unless [`SQLX_WRITER_ENV`] is set.
    pub async fn open(store: Arc<SqliteStore>) -> Result<EmbeddedLedger, LedgerError> {
        let writer = match std::env::var_os(SQLX_WRITER_ENV) {
            Some(_) => GroupWriter::Store,
            None => GroupWriter::Thread,
        };
        EmbeddedLedger::open_with(store, writer).await
    }

    /// [`EmbeddedLedger::open`] with the group writer chosen (an in-memory store always
    /// uses the store's).
    pub async fn open_with(
        store: Arc<SqliteStore>,
        writer: GroupWriter,
    ) -> Result<EmbeddedLedger, LedgerError> {
        let writer = match (writer, database_file(&store).await?) {
            (GroupWriter::Thread, Some(path)) => {
                Some(Writer::start(path).map_err(LedgerError::Unavailable)?)
            }
            _ => None,
        };
        let inner = Arc::new(Inner {
            store,
            writer,
            refused_groups: Default::default(),
            sales: RwLock::new(HashMap::new()),
            warm_lock: AsyncMutex::new(()),
            restock: RwLock::new(None),
        });
        let stored = inner.store.sales().await.map_err(unavailable)?;
        for s in stored {
            if s.sale.state == SaleState::Scheduled && s.counters.seq == 0 {
                continue;
            }
            let sku = s.sale.sku_id;
            let loaded = inner.load(sku).await?;
            inner.insert(sku, loaded);
        }
        Ok(EmbeddedLedger { inner })
    }

    /// Groups the writer thread refused (rolled back) and the store's apply wrote instead:
    /// 0 while the book and SQLite agree.
    pub fn refused_groups(&self) -> u64 {
        self.inner.refused_groups.load(Ordering::Relaxed)
    }

    /// The system of record this ledger commits to.
    pub fn store(&self) -> &Arc<SqliteStore> {
        &self.inner.store
    }

    /// Requests queued on a sale and not yet answered (0 when it is not warm): for
    /// back-pressure.
    pub fn queue_depth(&self, sku: SkuId) -> usize {
        self.inner
            .slot(sku)
            .map(|s| s.depth.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Skus of the sales this ledger holds.
    pub fn warm_skus(&self) -> Vec<SkuId> {
        let mut skus: Vec<SkuId> = self.inner.sales().keys().copied().collect();
        skus.sort_unstable();
        skus
    }

    /// Queues a job on a warm sale and makes sure a drain runs; returns the answer.
    async fn submit<T>(
        &self,
        slot: Arc<Slot>,
        job: Job,
        rx: oneshot::Receiver<Result<T, LedgerError>>,
    ) -> Result<T, LedgerError> {
        slot.depth.fetch_add(job.weight(), Ordering::Relaxed);
        slot.queue.lock().expect("queue lock").push_back(job);
        tokio::spawn(Inner::drain(self.inner.clone(), slot));
        rx.await
            .map_err(|_| LedgerError::Internal("the sale's writer stopped".into()))?
    }

    /// Runs `f` on a sale's book under its lock, in a task of its own (so the caller giving
    /// up cannot cut it short), after reloading a stale book.
    async fn with_book<T, F>(&self, slot: Arc<Slot>, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: for<'a> FnOnce(
                &'a Inner,
                &'a mut Loaded,
            ) -> std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<T, LedgerError>> + Send + 'a>,
            > + Send
            + 'static,
    {
        let inner = self.inner.clone();
        let task = tokio::spawn(async move {
            let mut guard = slot.book.clone().lock_owned().await;
            inner.refresh(slot.sku, &mut guard).await?;
            f(&inner, &mut guard).await
        });
        task.await
            .map_err(|e| LedgerError::Internal(format!("ledger task: {e}")))?
    }
}

impl Inner {
    fn sales(&self) -> std::sync::RwLockReadGuard<'_, HashMap<SkuId, Arc<Slot>>> {
        self.sales.read().expect("sales lock")
    }

    fn slot(&self, sku: SkuId) -> Option<Arc<Slot>> {
        self.sales().get(&sku).cloned()
    }

    fn insert(&self, sku: SkuId, loaded: Loaded) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            sku,
            book: Arc::new(AsyncMutex::new(loaded)),
            queue: Mutex::new(VecDeque::new()),
            depth: AtomicUsize::new(0),
        });
        self.sales
            .write()
            .expect("sales lock")
            .insert(sku, slot.clone());
        slot
    }

    /// A sale's book, rebuilt from its counters and orders in SQLite.
    async fn load(&self, sku: SkuId) -> Result<Loaded, LedgerError> {
        let stored = self
            .store
            .sale(sku)
            .await
            .map_err(unavailable)?
            .ok_or(LedgerError::NotWarmed)?;
        let orders = self.store.orders(sku).await.map_err(unavailable)?;
        if !stored.counters.conserved() {
            return Err(LedgerError::Internal(format!(
                "stored counters of sku {sku} are not conserved: {:?}",
                stored.counters
            )));
        }
        let mut book = SaleBook::new(stored.sale, stored.counters, stored.epoch);
        let mut accepted = Vec::with_capacity(orders.len());
        for order in orders {
            accepted.push(RequestKey::new(order.user_id, order.request_id.clone()));
            book.restore_order(order);
        }
        Ok(Loaded {
            book,
            stale: false,
            fenced_at: None,
            accepted,
        })
    }

    /// Reloads a book that a failure may have left ahead of SQLite.
    async fn refresh(&self, sku: SkuId, loaded: &mut Loaded) -> Result<(), LedgerError> {
        if loaded.stale {
            *loaded = self.load(sku).await?;
        }
        Ok(())
    }

    fn announce_restock(&self, sku: SkuId) {
        let listener = self.restock.read().expect("restock lock").clone();
        if let Some(listener) = listener {
            listener(sku);
        }
    }

    /// Takes the queued jobs of a sale (up to a bound), applies them to the book, commits
    /// their events in one transaction, then answers them.
    async fn drain(self: Arc<Self>, slot: Arc<Slot>) {
        let mut guard: OwnedMutexGuard<Loaded> = slot.book.clone().lock_owned().await;
        let jobs = {
            let mut queue = slot.queue.lock().expect("queue lock");
            let mut jobs = Vec::new();
            let mut weight = 0;
            while let Some(job) = queue.front() {
                if weight > 0 && weight + job.weight() > GROUP_REQUESTS_MAX {
                    break;
                }
                weight += job.weight();
                jobs.push(queue.pop_front().expect("front exists"));
            }
            jobs
        };
        if jobs.is_empty() {
            return; // another drain took them
        }
        // Taken off the queue: no longer queued (before the answers, so a caller that got
        // its answer never sees its own job still counted).
        let weight: usize = jobs.iter().map(Job::weight).sum();
        slot.depth.fetch_sub(weight, Ordering::Relaxed);
        self.run_group(slot.sku, &mut guard, jobs).await;
    }

    async fn run_group(&self, sku: SkuId, loaded: &mut Loaded, jobs: Vec<Job>) {
        if loaded.fenced_at.is_some() {
            // As the Redis scripts answer a fenced copy: nothing changes, the client retries.
            for job in jobs {
                job.fenced();
            }
            return;
        }
        if let Err(e) = self.refresh(sku, loaded).await {
            let msg = e.to_string();
            for job in jobs {
                job.fail(|| LedgerError::Unavailable(msg.clone()));
            }
            return;
        }
        // Until the commit: a panic halfway leaves the book to be reloaded, not trusted.
        loaded.stale = true;
        let now = now_ms();
        let before = loaded.book.counters;
        let mut events: Vec<Event> = Vec::new();
        let mut answers = Vec::with_capacity(jobs.len());
        let mut keys = Vec::new();
        let mut requests = 0usize;
        let mut gave_back = false;
        for job in jobs {
            match job {
                Job::Purchase { reqs, reply } => {
                    requests += reqs.len();
                    let mut outcomes = Vec::with_capacity(reqs.len());
                    for r in &reqs {
                        let (outcome, event) = loaded.book.purchase(r, now);
                        if let Some(e) = event {
                            keys.push(RequestKey::new(e.user_id, e.request_id.clone()));
                            events.push(e);
                        }
                        outcomes.push(outcome);
                    }
                    answers.push(Answer::Purchase(reply, outcomes));
                }
                Job::Resolve {
                    order_no,
                    user,
                    kind,
                    reply,
                } => {
                    let result = match kind {
                        EventKind::Paid => loaded.book.pay(&order_no, user, now),
                        _ => loaded.book.cancel(&order_no, user, now),
                    };
                    let resolution = result.map(|(order, event)| {
                        if let Some(event) = event {
                            gave_back |= kind == EventKind::Cancelled;
                            events.push(event);
                        }
                        order
                    });
                    answers.push(Answer::Resolve(reply, resolution));
                }
                Job::Expire { max, reply } => {
                    let expired = loaded.book.expire_due(now, max);
                    gave_back |= !expired.is_empty();
                    answers.push(Answer::Expire(reply, expired.len()));
                    events.extend(expired);
                }
            }
        }
        if requests > 0 {
            metrics::histogram!(flashsale_core::metric_names::BATCH_SIZE, "ledger" => "embedded")
                .record(requests as f64);
        }
        if !events.is_empty() {
            let group = Group {
                sku,
                epoch: loaded.book.epoch,
                mode: loaded.book.sale.mode,
                before,
                events,
            };
            if let Err(err) = self.commit(group).await {
                tracing::warn!(%sku, error = %err, "group commit failed");
                loaded.stale = true;
                if let Ok(fresh) = self.load(sku).await {
                    *loaded = fresh;
                }
                for answer in answers {
                    answer.fail(&err);
                }
                return;
            }
        }
        loaded.stale = false;
        loaded.accepted.extend(keys);
        for answer in answers {
            answer.send();
        }
        if gave_back && before.available == 0 && loaded.book.counters.available > 0 {
            self.announce_restock(sku);
        }
    }

    /// Commits a group's events: through the writer thread, or when it refuses the group
    /// (rolled back: the book and SQLite disagree, or SQLite failed) through the store's
    /// general apply, which keeps what its fence and guard refuse. Anything but a clean
    /// apply means the book and SQLite disagree: the caller reloads the book.
    async fn commit(&self, group: Group) -> Result<(), LedgerError> {
        let sku = group.sku;
        let group = match &self.writer {
            Some(writer) => match writer.commit(group).await {
                (_, Ok(())) => return Ok(()),
                (group, Err(NotWritten(why))) => {
                    self.refused_groups.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%sku, %why, "the group writer refused a group: the store applies it");
                    group
                }
            },
            None => group,
        };
        if group.events.is_empty() {
            return Err(LedgerError::Internal("the group writer stopped".into()));
        }
        self.apply_with_store(sku, &group.events).await
    }

    /// The store's general apply of a group's events.
    async fn apply_with_store(&self, sku: SkuId, events: &[Event]) -> Result<(), LedgerError> {
        let report = self
            .store
            .apply_events(sku, events)
            .await
            .map_err(unavailable)?;
        if !report.rejected.is_empty() {
            metrics::counter!(flashsale_core::metric_names::GUARD_REJECTIONS, "sku" => sku.to_string())
                .increment(report.rejected.len() as u64);
        }
        if report.applied != events.len() || !report.rejected.is_empty() {
            tracing::error!(%sku, ?report, "SQLite refused part of a group the book accepted");
            return Err(LedgerError::Internal(format!(
                "system of record disagreed with the book: {report:?}"
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl HotLedger for EmbeddedLedger {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn durability(&self) -> flashsale_core::Durability {
        flashsale_core::Durability::BeforeAnswer
    }

    /// All: the embedded ledger has no shards, so a bucketed sale runs as one book (one
    /// writer, one SQLite database); its buckets are only the sale's definition.
    fn buckets_max(&self) -> u16 {
        flashsale_core::buckets::BUCKETS_MAX
    }

    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), LedgerError> {
        self.change_state(sku, None, state).await.map(|_| ())
    }

    /// The book's state only: SQLite keeps the operator's word (as the database does for
    /// the Redis ledger), so an auto-pause never looks like an operator's pause.
    async fn set_state_if(&self, sku: SkuId, from: SaleState, to: SaleState) -> Changed {
        self.change_state(sku, Some(from), to).await
    }

    async fn purchase_batch(
        &self,
        sku: SkuId,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        flashsale_core::ledger::check_batch(sku, reqs)?;
        let slot = self.inner.slot(sku).ok_or(LedgerError::NotWarmed)?;
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = oneshot::channel();
        let job = Job::Purchase {
            reqs: reqs.to_vec(),
            reply,
        };
        self.submit(slot, job, rx).await
    }

    async fn pay(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.resolve(order_no, user, EventKind::Paid).await
    }

    async fn cancel(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.resolve(order_no, user, EventKind::Cancelled).await
    }

    async fn expire_due(&self, sku: SkuId, max: usize) -> Result<usize, LedgerError> {
        let slot = self.inner.slot(sku).ok_or(LedgerError::NotWarmed)?;
        if max == 0 {
            return Ok(0);
        }
        let (reply, rx) = oneshot::channel();
        self.submit(slot, Job::Expire { max, reply }, rx).await
    }

    async fn counters(&self, sku: SkuId) -> Result<Option<Counters>, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(None);
        };
        self.with_book(slot, |_, loaded| {
            Box::pin(async move { Ok(Some(loaded.book.counters)) })
        })
        .await
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, LedgerError> {
        let Some(slot) = self.inner.slot(order_no.sku()) else {
            return Ok(None);
        };
        let no = *order_no;
        self.with_book(slot, move |_, loaded| {
            Box::pin(async move { Ok(loaded.book.order(&no).cloned()) })
        })
        .await
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.inner.store.ping().await.map_err(unavailable)
    }
}

#[async_trait]
impl HotCopies for EmbeddedLedger {
    async fn load(&self, sale: &Sale, counters: &Counters, epoch: u64) -> Result<(), LedgerError> {
        let sku = sale.sku_id;
        if counters.total != sale.total_stock || !counters.conserved() || epoch == 0 {
            return Err(LedgerError::Internal(format!(
                "load with counters {counters:?} for total {} at epoch {epoch}",
                sale.total_stock
            )));
        }
        let (wanted, counters) = (sale.clone(), *counters);
        let inner = self.inner.clone();
        // In a task of its own: a caller giving up must not leave book and store apart.
        let task = tokio::spawn(async move {
            let _serial = inner.warm_lock.lock().await;
            let slot = inner.slot(sku);
            let mut guard = match &slot {
                Some(slot) => Some(slot.book.clone().lock_owned().await),
                None => None,
            };
            if guard.as_ref().is_some_and(|g| g.book.epoch >= epoch) {
                return Err(LedgerError::AlreadyWarm);
            }
            if let Some(g) = guard.as_mut() {
                g.stale = true; // until it is loaded again below
            }
            inner
                .store
                .put_sale(&wanted, &counters, epoch)
                .await
                .map_err(unavailable)?;
            let mut loaded = inner.load(sku).await?;
            loaded.fenced_at = Some(std::time::Instant::now());
            match guard.as_mut() {
                Some(g) => **g = loaded,
                None => {
                    inner.insert(sku, loaded);
                }
            }
            Ok(())
        });
        task.await
            .map_err(|e| LedgerError::Internal(format!("load task: {e}")))?
    }

    async fn fence(&self, sku: SkuId) -> Result<bool, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(false);
        };
        self.with_book(slot, |_, loaded| {
            Box::pin(async move {
                loaded.fenced_at.get_or_insert_with(std::time::Instant::now);
                Ok(true)
            })
        })
        .await
    }

    async fn open(&self, sku: SkuId, epoch: u64, state: SaleState) -> Result<(), LedgerError> {
        let slot = self.inner.slot(sku).ok_or(LedgerError::AlreadyWarm)?;
        self.with_book(slot, move |inner, loaded| {
            Box::pin(async move {
                if loaded.book.epoch != epoch {
                    return Err(LedgerError::AlreadyWarm);
                }
                inner
                    .store
                    .set_state(sku, state)
                    .await
                    .map_err(unavailable)?;
                loaded.book.sale.state = state;
                loaded.fenced_at = None;
                Ok(())
            })
        })
        .await
    }

    /// No stream: every group is committed to SQLite before it is answered, so there are
    /// never events in flight (read under the book's lock, so never mid-commit).
    async fn hot_snapshot(
        &self,
        sku: SkuId,
    ) -> Result<Option<flashsale_core::HotSnapshot>, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(None);
        };
        self.with_book(slot, |_, loaded| {
            Box::pin(async move {
                Ok(Some(flashsale_core::HotSnapshot {
                    counters: loaded.book.counters,
                    epoch: loaded.book.epoch,
                    events: Vec::new(),
                    transfers: Vec::new(),
                    bad_entries: Vec::new(),
                    fenced_ms: loaded.fenced_at.map(|t| t.elapsed().as_millis() as u64),
                    state: loaded.book.sale.state,
                }))
            })
        })
        .await
    }

    /// Nothing to restore: the embedded book is loaded from SQLite, the system of record
    /// itself, orders included. Only checks that the book is still the one of `epoch`.
    async fn restore_orders(
        &self,
        sku: SkuId,
        epoch: u64,
        _orders: &[HotOrder],
    ) -> Result<usize, LedgerError> {
        let slot = self.inner.slot(sku).ok_or(LedgerError::AlreadyWarm)?;
        self.with_book(slot, move |_, loaded| {
            Box::pin(async move {
                match loaded.book.epoch == epoch {
                    true => Ok(0),
                    false => Err(LedgerError::AlreadyWarm),
                }
            })
        })
        .await
    }
}

#[async_trait]
impl SoldOutSupport for EmbeddedLedger {
    async fn accepted_keys(
        &self,
        sku: SkuId,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(None);
        };
        self.with_book(slot, move |_, loaded| {
            Box::pin(
                async move { Ok((loaded.accepted.len() <= max).then(|| loaded.accepted.clone())) },
            )
        })
        .await
    }

    async fn is_accepted(&self, sku: SkuId, key: &RequestKey) -> Result<bool, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(false);
        };
        let key = key.clone();
        self.with_book(slot, move |_, loaded| {
            Box::pin(async move { Ok(loaded.book.accepted(key.user, &key.request_id)) })
        })
        .await
    }

    async fn accepted_count(&self, sku: SkuId) -> Result<Option<(u64, usize)>, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(None);
        };
        self.with_book(slot, |_, loaded| {
            Box::pin(async move { Ok(Some((loaded.book.epoch, loaded.accepted.len()))) })
        })
        .await
    }

    fn on_restock(&self, listener: RestockListener) {
        *self.inner.restock.write().expect("restock lock") = Some(listener);
    }
}

impl EmbeddedLedger {
    /// Sets the state of the book, only from `from` when given; without `from` (an operator's
    /// change) in SQLite too. A fenced book is `Unavailable` (its rebuild opens it in the
    /// stored state).
    async fn change_state(
        &self,
        sku: SkuId,
        from: Option<SaleState>,
        to: SaleState,
    ) -> Result<bool, LedgerError> {
        let slot = self.inner.slot(sku).ok_or(LedgerError::NotWarmed)?;
        self.with_book(slot, move |inner, loaded| {
            Box::pin(async move {
                if loaded.fenced_at.is_some() {
                    return Err(LedgerError::Unavailable("a rebuild owns the sale".into()));
                }
                if from.is_some_and(|f| f != loaded.book.sale.state) {
                    return Ok(false);
                }
                if from.is_none() {
                    match inner.store.set_state(sku, to).await {
                        Ok(()) => {}
                        Err(StoreError::SaleNotFound) => return Err(LedgerError::NotWarmed),
                        Err(e) => return Err(unavailable(e)),
                    }
                }
                loaded.book.sale.state = to;
                Ok(true)
            })
        })
        .await
    }

    async fn resolve(
        &self,
        order_no: &OrderNo,
        user: UserId,
        kind: EventKind,
    ) -> Result<Resolution, LedgerError> {
        let Some(slot) = self.inner.slot(order_no.sku()) else {
            return Ok(Err(ErrorCode::OrderNotFound));
        };
        let (reply, rx) = oneshot::channel();
        let job = Job::Resolve {
            order_no: *order_no,
            user,
            kind,
            reply,
        };
        self.submit(slot, job, rx).await
    }
}
