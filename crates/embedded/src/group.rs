//! One sale's book and queue, and the group commit: the task that gets the book's lock takes
//! every queued job, runs them through the book with one clock reading, hands their events to
//! the writer thread as one transaction and lets the lock go (or, without the thread, commits
//! them through the store holding it), and answers them once committed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use flashsale_core::clock::now_ms;
use flashsale_core::ledger::RestockListener;
use flashsale_core::limits::BATCH_LEN_MAX;
use flashsale_core::{
    Counters, Event, EventKind, LedgerError, OrderStore, RequestKey, SaleBook, SkuId,
};
use flashsale_store::SqliteStore;

use crate::job::{unavailable, Answer, Job};
use crate::pipeline::Pipeline;
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
    /// The group commits in flight.
    pub(crate) pipeline: Pipeline,
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
            pipeline: Pipeline::new(),
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
    /// their events in one transaction, then answers them. With the writer thread, the book's
    /// lock is let go once the group is handed to it ([`crate::pipeline`]).
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
        match &self.writer {
            Some(writer) => self.run_pipelined(&slot, writer, guard, jobs).await,
            None => self.run_group(&slot, &mut guard, jobs).await,
        }
    }

    /// A group through the writer thread: applied under the lock, handed to the writer, the
    /// lock let go; answered when committed and every group before it has ended.
    async fn run_pipelined(
        &self,
        slot: &Slot,
        writer: &Writer,
        mut guard: OwnedMutexGuard<Loaded>,
        jobs: Vec<Job>,
    ) {
        let Some(jobs) = self.ready(slot, &mut guard, jobs).await else {
            return;
        };
        let mut applied = apply(&mut guard, jobs);
        let turn = slot.pipeline.take();
        let written = match applied.events.is_empty() {
            true => None,
            false => Some(writer.send(applied.group(&guard))),
        };
        // Ahead of SQLite by the groups in flight: readers settle the pipeline first, and a
        // failure marks it (the book is reloaded by the next holder of the lock).
        guard.accepted.append(&mut applied.keys);
        guard.stale = false;
        drop(guard);
        let written = match written {
            Some(w) => Some(w.await),
            None => None,
        };
        turn.wait().await;
        let result = match written {
            Some((_, Ok(()))) => Ok(()),
            // Judged on a book that a failed group before it had changed: refused by the
            // writer for that, or with nothing to write (replays, refusals).
            _ if turn.failed() => Err(LedgerError::Unavailable(
                "an earlier group commit failed; retry".into(),
            )),
            None => Ok(()),
            Some((group, Err(NotWritten(why)))) => self.write_refused(group, why).await,
        };
        if let Err(err) = &result {
            tracing::warn!(sku = %slot.sku, error = %err, "group commit failed");
        }
        turn.end(result.is_ok());
        applied.answer(self, result);
    }

    /// The jobs to run, or None when they were answered already (a fenced book, or one that
    /// could not be reloaded); settles the pipeline and reloads the book when it may be ahead.
    async fn ready(&self, slot: &Slot, loaded: &mut Loaded, jobs: Vec<Job>) -> Option<Vec<Job>> {
        if loaded.fenced_at.is_some() {
            // As the Redis scripts answer a fenced copy: nothing changes, the client retries.
            for job in jobs {
                job.fenced();
            }
            return None;
        }
        if loaded.stale || slot.pipeline.failed() {
            loaded.stale |= slot.pipeline.settle().await;
        }
        if let Err(e) = self.refresh(slot.sku, loaded).await {
            let msg = e.to_string();
            for job in jobs {
                job.fail(|| LedgerError::Unavailable(msg.clone()));
            }
            return None;
        }
        // Until the group is handed on: a panic halfway leaves the book to be reloaded.
        loaded.stale = true;
        Some(jobs)
    }

    /// A group the writer refused (rolled back: the book and SQLite disagree, or SQLite
    /// failed) goes through the store's general apply, which keeps what its fence and guard
    /// refuse; anything but a clean apply is a failure (the book is reloaded).
    async fn write_refused(&self, group: Group, why: String) -> Result<(), LedgerError> {
        let sku = group.sku;
        self.refused_groups.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%sku, %why, "the group writer refused a group: the store applies it");
        if group.events.is_empty() {
            return Err(LedgerError::Internal("the group writer stopped".into()));
        }
        self.apply_with_store(sku, &group.events).await
    }

    /// A group without the writer thread (an in-memory store): committed by the store while
    /// the lock is held.
    async fn run_group(&self, slot: &Slot, loaded: &mut Loaded, jobs: Vec<Job>) {
        let Some(jobs) = self.ready(slot, loaded, jobs).await else {
            return;
        };
        let sku = slot.sku;
        let mut applied = apply(loaded, jobs);
        let result = match applied.events.is_empty() {
            true => Ok(()),
            false => self.apply_with_store(sku, &applied.events).await,
        };
        match &result {
            Ok(()) => {
                loaded.stale = false;
                loaded.accepted.append(&mut applied.keys);
            }
            Err(err) => {
                tracing::warn!(%sku, error = %err, "group commit failed");
                if let Ok(fresh) = self.load(sku).await {
                    *loaded = fresh;
                }
            }
        }
        applied.answer(self, result);
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

/// A group run through the book: its events, its held answers, what to announce.
struct Applied {
    sku: SkuId,
    before: Counters,
    events: Vec<Event>,
    answers: Vec<Answer>,
    /// The accepted requests (for `Loaded::accepted`).
    keys: Vec<RequestKey>,
    /// Units came back to a sale that had none.
    restocked: bool,
}

/// Runs the jobs through the book with one clock reading.
fn apply(loaded: &mut Loaded, jobs: Vec<Job>) -> Applied {
    let now = now_ms();
    let before = loaded.book.counters;
    let mut applied = Applied {
        sku: loaded.book.sale.sku_id,
        before,
        events: Vec::new(),
        answers: Vec::with_capacity(jobs.len()),
        keys: Vec::new(),
        restocked: false,
    };
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
                        applied
                            .keys
                            .push(RequestKey::new(e.user_id, e.request_id.clone()));
                        applied.events.push(e);
                    }
                    outcomes.push(outcome);
                }
                applied.answers.push(Answer::Purchase(reply, outcomes));
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
                        applied.events.push(event);
                    }
                    order
                });
                applied.answers.push(Answer::Resolve(reply, resolution));
            }
            Job::Expire { max, reply } => {
                let expired = loaded.book.expire_due(now, max);
                gave_back |= !expired.is_empty();
                applied.answers.push(Answer::Expire(reply, expired.len()));
                applied.events.extend(expired);
            }
        }
    }
    if requests > 0 {
        metrics::histogram!(flashsale_core::metric_names::BATCH_SIZE, "ledger" => "embedded")
            .record(requests as f64);
    }
    applied.restocked = gave_back && before.available == 0 && loaded.book.counters.available > 0;
    applied
}

impl Applied {
    /// The group the writer commits (its events moved out).
    fn group(&mut self, loaded: &Loaded) -> Group {
        Group {
            sku: self.sku,
            epoch: loaded.book.epoch,
            mode: loaded.book.sale.mode,
            before: self.before,
            events: std::mem::take(&mut self.events),
        }
    }

    /// Answers every job: their outcomes when the group is committed, else the failure.
    fn answer(self, inner: &Inner, result: Result<(), LedgerError>) {
        match result {
            Ok(()) => {
                for answer in self.answers {
                    answer.send();
                }
                if self.restocked {
                    inner.announce_restock(self.sku);
                }
            }
            Err(err) => {
                for answer in self.answers {
                    answer.fail(&err);
                }
            }
        }
    }
}
