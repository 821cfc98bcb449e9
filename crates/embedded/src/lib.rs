//! flashsale-embedded: the embedded hot ledger. No servers: one in-process writer per sale,
//! group commit to SQLite, recovery from SQLite at start.
//!
//! Per sale, a [`SaleBook`] (core's reference rules) sits behind an async mutex. Callers
//! never touch it directly: each call queues a job on the sale and spawns a drain task; the
//! task that gets the lock takes every queued job (flat combining), runs them through the
//! book with one clock reading, and hands all their events, as ONE transaction
//! (synchronous=FULL), to the [`writer`] thread (a purpose-built `rusqlite` writer; a group it
//! cannot write cleanly, and every group of an in-memory store, goes through
//! `SqliteStore::apply_events`). The lock is let go once the group is handed on, so the next
//! group runs through the book while this one commits ([`pipeline`]); a group is answered
//! only after its own commit and the end of every group sent before it. Nothing is answered
//! before its commit, so an accepted purchase survives kill -9. The drain runs in its own
//! task, so a caller that gives up (timeout, closed connection) cannot leave the book ahead of
//! the database. If a commit fails, every job of its group and of the groups sent behind it
//! (their book was ahead) gets `Unavailable`, and the book is reloaded from SQLite. Whatever
//! reads the book waits, under its lock, for every group in flight: it reads it as committed.
//!
//! Files, each using only those listed before it: `writer` (the group writer thread), `job`
//! (a queued job and its held answer), `pipeline` (the groups in flight, their order),
//! `group` (a sale's book and queue, the group commit), this file (`EmbeddedLedger`: opening,
//! submitting a job), `ledger` (the core traits).
//!
//! May depend on flashsale-core and flashsale-store (its `SqliteStore`); never on Redis or
//! the server.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use tokio::sync::{oneshot, Mutex as AsyncMutex};

use flashsale_core::{LedgerError, OrderStore, SaleState, SkuId};
use flashsale_store::SqliteStore;

mod group;
mod job;
mod ledger;
mod pipeline;
mod writer;

use group::{Inner, Loaded, Slot};
use job::{unavailable, Job};
use writer::Writer;

/// The embedded hot ledger over a [`SqliteStore`].
#[derive(Clone)]
pub struct EmbeddedLedger {
    inner: Arc<Inner>,
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
                let one_row = store.one_row();
                Some(Writer::start(path, one_row).map_err(LedgerError::Unavailable)?)
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
    pub(crate) async fn submit<T>(
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
    pub(crate) async fn with_book<T, F>(&self, slot: Arc<Slot>, f: F) -> Result<T, LedgerError>
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
            // The book as committed: every group in flight ended (a failed one: reloaded).
            guard.stale |= slot.pipeline.settle().await;
            inner.refresh(slot.sku, &mut guard).await?;
            f(&inner, &mut guard).await
        });
        task.await
            .map_err(|e| LedgerError::Internal(format!("ledger task: {e}")))?
    }
}
