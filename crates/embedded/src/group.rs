//! One sale's book and queue, and the group commit: the task that gets the book's lock takes
//! every queued job, runs them through the book with one clock reading, commits their events
//! in one transaction (the writer thread, or the store), and only then answers them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use flashsale_core::clock::now_ms;
use flashsale_core::ledger::RestockListener;
use flashsale_core::limits::BATCH_LEN_MAX;
use flashsale_core::{Event, EventKind, LedgerError, OrderStore, RequestKey, SaleBook, SkuId};
use flashsale_store::SqliteStore;

use crate::job::{unavailable, Answer, Job};
use crate::writer::{Group, NotWritten, Writer};

/// Most requests one group commit takes from the queue (the rest wait for the next one).
const GROUP_REQUESTS_MAX: usize = 4 * BATCH_LEN_MAX;

pub(crate) struct Inner {
    pub(crate) store: Arc<SqliteStore>,
    /// The group commit's writer; None for an in-memory store (no file to open twice).
    pub(crate) writer: Option<Writer>,
    /// Groups the writer refused and the store applied instead.
    pub(crate) refused_groups: std::sync::atomic::AtomicU64,
    pub(crate) sales: RwLock<HashMap<SkuId, Arc<Slot>>>,
    /// Serializes `warm` calls (rare, operator-driven) so two cannot race on one sku.
    pub(crate) warm_lock: AsyncMutex<()>,
    pub(crate) restock: RwLock<Option<RestockListener>>,
}

/// One sale: its book and its queue of jobs.
pub(crate) struct Slot {
    pub(crate) sku: SkuId,
    pub(crate) book: Arc<AsyncMutex<Loaded>>,
    pub(crate) queue: Mutex<VecDeque<Job>>,
    /// Requests (purchase requests, one per other job) queued and not yet answered.
    pub(crate) depth: AtomicUsize,
}

/// A book as committed to SQLite (`stale` when a failure may have left it ahead).
pub(crate) struct Loaded {
    pub(crate) book: SaleBook,
    pub(crate) stale: bool,
    /// Since when a rebuild has fenced the book (it judges nothing until opened).
    pub(crate) fenced_at: Option<std::time::Instant>,
    /// Every accepted request (for `accepted_keys`).
    pub(crate) accepted: Vec<RequestKey>,
}

impl Inner {
    pub(crate) fn sales(&self) -> std::sync::RwLockReadGuard<'_, HashMap<SkuId, Arc<Slot>>> {
        self.sales.read().expect("sales lock")
    }

    pub(crate) fn slot(&self, sku: SkuId) -> Option<Arc<Slot>> {
        self.sales().get(&sku).cloned()
    }

    pub(crate) fn insert(&self, sku: SkuId, loaded: Loaded) -> Arc<Slot> {
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
    pub(crate) async fn load(&self, sku: SkuId) -> Result<Loaded, LedgerError> {
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
    pub(crate) async fn refresh(&self, sku: SkuId, loaded: &mut Loaded) -> Result<(), LedgerError> {
        if loaded.stale {
            *loaded = self.load(sku).await?;
        }
        Ok(())
    }

    pub(crate) fn announce_restock(&self, sku: SkuId) {
        let listener = self.restock.read().expect("restock lock").clone();
        if let Some(listener) = listener {
            listener(sku);
        }
    }

    /// Takes the queued jobs of a sale (up to a bound), applies them to the book, commits
    /// their events in one transaction, then answers them.
    pub(crate) async fn drain(self: Arc<Self>, slot: Arc<Slot>) {
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

    pub(crate) async fn run_group(&self, sku: SkuId, loaded: &mut Loaded, jobs: Vec<Job>) {
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
    pub(crate) async fn commit(&self, group: Group) -> Result<(), LedgerError> {
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
    pub(crate) async fn apply_with_store(
        &self,
        sku: SkuId,
        events: &[Event],
    ) -> Result<(), LedgerError> {
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
