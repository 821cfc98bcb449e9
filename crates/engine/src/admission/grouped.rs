//! [`GroupedBook`]: an admission book with its queue joins taken in groups.
//!
//! Each join on its own is one write: a synced commit on the embedded ledger's database, a
//! script call on Redis. Here the joins that arrive while a group is written queue up, and
//! the next write takes them all (up to a bound: [`GROUP_MAX`], [`REDIS_GROUP_MAX`]) at once
//! ([`AdmissionBook::join_group`]: one transaction, one script call), as the ledgers group
//! purchases. No task of its own: the first waiting caller writes the group (in a spawned
//! task, so a caller that goes away mid-write cancels nobody's join) while the others wait for
//! its answer. Every other call goes straight to the book. Each group's joins and write time
//! go to `/metrics` (`flashsale_admission_join_group_joins`, `…_seconds`).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use flashsale_core::admission::{
    AdmissionBook, Entered, Entry, EntryWindow, GroupJoin, QueueCounts, Seed, Ticket,
};
use flashsale_core::{metric_names, SkuId, StoreError, UserId};
use tokio::sync::oneshot;

/// Most joins one write takes on a database (the rest go in the next): one transaction,
/// whose commit is the group's cost.
pub const GROUP_MAX: usize = 2_048;
/// Most joins one script call takes on Redis: a call runs alone on Redis's one thread, so a
/// group's length is what a purchase may wait behind (256 joins: about a millisecond).
pub const REDIS_GROUP_MAX: usize = 256;

type Answer = Result<Option<Ticket>, StoreError>;

struct Pending {
    sku: SkuId,
    join: GroupJoin,
    answer: oneshot::Sender<Answer>,
}

/// An admission book, queue joins grouped into shared writes.
pub struct GroupedBook {
    book: Arc<dyn AdmissionBook>,
    pending: Arc<Mutex<Vec<Pending>>>,
    /// Held by the caller writing a group.
    turn: tokio::sync::Mutex<()>,
    /// Most joins one write takes.
    group_max: usize,
}

impl GroupedBook {
    /// Joins of `book` taken up to `group_max` at a time ([`GROUP_MAX`] for a database,
    /// [`REDIS_GROUP_MAX`] for Redis).
    pub fn new(book: Arc<dyn AdmissionBook>, group_max: usize) -> Self {
        GroupedBook {
            book,
            pending: Arc::default(),
            turn: tokio::sync::Mutex::new(()),
            group_max: group_max.max(1),
        }
    }

    /// Writes queued groups until `rx` is answered: a join is answered by the group that
    /// took it, and groups take the queue from its front, so each caller's own join is taken
    /// by it or by a caller ahead of it. A caller waits for its answer and for the turn at
    /// once, so the callers a group answered return together, not one turn after another.
    async fn wait(&self, mut rx: oneshot::Receiver<Answer>) -> Answer {
        loop {
            let _turn = tokio::select! {
                biased;
                answer = &mut rx => return answer.unwrap_or_else(|_| Err(lost())),
                turn = self.turn.lock() => turn,
            };
            if let Some(answer) = answered(&mut rx) {
                return answer;
            }
            let group: Vec<Pending> = {
                let mut pending = self.pending.lock().expect("pending joins");
                let n = pending.len().min(self.group_max);
                pending.drain(..n).collect()
            };
            if tokio::spawn(write(self.book.clone(), group)).await.is_err() {
                return Err(lost());
            }
            // Most often the group just written took this caller's join: answer now rather
            // than after every caller queued for the turn meanwhile.
            if let Some(answer) = answered(&mut rx) {
                return answer;
            }
        }
    }
}

/// The join's answer if it came (an error if its group was dropped unanswered).
fn answered(rx: &mut oneshot::Receiver<Answer>) -> Option<Answer> {
    match rx.try_recv() {
        Ok(answer) => Some(answer),
        Err(oneshot::error::TryRecvError::Closed) => Some(Err(lost())),
        Err(oneshot::error::TryRecvError::Empty) => None,
    }
}

fn lost() -> StoreError {
    StoreError::Unavailable("the join's group write did not finish".into())
}

/// Writes a group, one `join_group` per sale in it, and answers each join.
async fn write(book: Arc<dyn AdmissionBook>, group: Vec<Pending>) {
    let mut by_sale: Vec<(SkuId, Vec<Pending>)> = Vec::new();
    for p in group {
        match by_sale.iter_mut().find(|(sku, _)| *sku == p.sku) {
            Some((_, list)) => list.push(p),
            None => by_sale.push((p.sku, vec![p])),
        }
    }
    for (sku, list) in by_sale {
        let joins: Vec<GroupJoin> = list.iter().map(|p| p.join).collect();
        let started = std::time::Instant::now();
        let written = book.join_group(sku, &joins).await;
        metrics::histogram!(metric_names::ADMISSION_JOIN_GROUP).record(joins.len() as f64);
        metrics::histogram!(metric_names::ADMISSION_JOIN_GROUP_SECONDS)
            .record(started.elapsed().as_secs_f64());
        match written {
            Ok(answers) if answers.len() == list.len() => {
                for (p, a) in list.into_iter().zip(answers) {
                    let _ = p.answer.send(Ok(a));
                }
            }
            Ok(answers) => {
                let why = format!("{} answers to {} joins", answers.len(), list.len());
                for p in list {
                    let _ = p.answer.send(Err(StoreError::Internal(why.clone())));
                }
            }
            Err(e) => {
                let why = e.to_string();
                for p in list {
                    let _ = p.answer.send(Err(StoreError::Unavailable(why.clone())));
                }
            }
        }
    }
}

#[async_trait]
impl AdmissionBook for GroupedBook {
    async fn commit_seed(&self, sku: SkuId, seed: &Seed) -> Result<Seed, StoreError> {
        self.book.commit_seed(sku, seed).await
    }

    async fn seed(&self, sku: SkuId) -> Result<Option<Seed>, StoreError> {
        self.book.seed(sku).await
    }

    /// Queues the joins for the next group write and waits for their answers.
    async fn join_group(
        &self,
        sku: SkuId,
        joins: &[GroupJoin],
    ) -> Result<Vec<Option<Ticket>>, StoreError> {
        let waiting: Vec<oneshot::Receiver<Answer>> = {
            let mut pending = self.pending.lock().expect("pending joins");
            let queue = |&join: &GroupJoin| {
                let (answer, rx) = oneshot::channel();
                pending.push(Pending { sku, join, answer });
                rx
            };
            joins.iter().map(queue).collect()
        };
        let mut answers = Vec::with_capacity(waiting.len());
        for rx in waiting {
            answers.push(self.wait(rx).await?);
        }
        Ok(answers)
    }

    async fn ticket(&self, sku: SkuId, user: UserId) -> Result<Option<Ticket>, StoreError> {
        self.book.ticket(sku, user).await
    }

    async fn seal(&self, sku: SkuId, starts_at_ms: i64) -> Result<Option<u64>, StoreError> {
        self.book.seal(sku, starts_at_ms).await
    }

    async fn prequeue(&self, sku: SkuId) -> Result<Vec<UserId>, StoreError> {
        self.book.prequeue(sku).await
    }

    async fn counts(&self, sku: SkuId, lapse_before_ms: i64) -> Result<QueueCounts, StoreError> {
        self.book.counts(sku, lapse_before_ms).await
    }

    async fn advance(&self, sku: SkuId, from: u64, to: u64) -> Result<bool, StoreError> {
        self.book.advance(sku, from, to).await
    }

    async fn admitted_at(&self, sku: SkuId, place: u64) -> Result<(Option<i64>, i64), StoreError> {
        self.book.admitted_at(sku, place).await
    }

    async fn mark_bought(&self, sku: SkuId, user: UserId, place: u64) -> Result<(), StoreError> {
        self.book.mark_bought(sku, user, place).await
    }

    async fn enter(&self, sku: SkuId, e: Entry, w: EntryWindow) -> Result<Entered, StoreError> {
        self.book.enter(sku, e, w).await
    }

    async fn entries(&self, sku: SkuId) -> Result<Vec<Entry>, StoreError> {
        self.book.entries(sku).await
    }

    async fn entry(&self, sku: SkuId, user: UserId) -> Result<Option<Entry>, StoreError> {
        self.book.entry(sku, user).await
    }

    async fn draw_pos(&self, sku: SkuId) -> Result<u64, StoreError> {
        self.book.draw_pos(sku).await
    }

    async fn advance_draw(&self, sku: SkuId, from: u64, to: u64) -> Result<bool, StoreError> {
        self.book.advance_draw(sku, from, to).await
    }
}
