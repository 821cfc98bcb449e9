//! A sale's admission state in the database (`admission_*` tables): the book of a sale whose
//! hot ledger is the embedded one. Each change is one write transaction; the clock is this
//! process's (the embedded ledger runs in one process, so one clock orders every join).
//!
//! Joins and draw entries (one per buyer: a spike's writes) commit unsynced
//! ([`Backend::UNSYNCED`]): a crash of the process keeps them, a power loss may drop the last
//! ones until the next synced commit. Everything computed from them is: sealing a pre-queue
//! or a draw's entries, a wave, a seed are synced commits, and so is every purchase.

use async_trait::async_trait;
use flashsale_core::admission::{
    hex, seed_from_hex, AdmissionBook, Entered, Entry, EntryWindow, GroupJoin, QueueCounts, Seed,
    Ticket,
};
use flashsale_core::clock::now_ms;
use flashsale_core::{SkuId, StoreError, UserId};

use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, Pool, Transaction};

use crate::backend::{Arg, Backend, Columns as _};
use crate::rows::db_error;
use crate::store::Store;

const STATE_COLUMNS: &str =
    "seed, sealed, prequeue, joined_after, admitted, bought, entries, draw_pos";

/// A sale's `admission_state` row.
struct State {
    sealed: bool,
    prequeue: u64,
    joined_after: u64,
    admitted: u64,
    bought: u64,
    entries: u64,
    draw_pos: u64,
}

impl State {
    fn read<R: crate::backend::Columns>(row: &R) -> Result<State, StoreError> {
        Ok(State {
            sealed: row.flag("sealed")?,
            prequeue: row.uint("prequeue")?,
            joined_after: row.uint("joined_after")?,
            admitted: row.uint("admitted")?,
            bought: row.uint("bought")?,
            entries: row.uint("entries")?,
            draw_pos: row.uint("draw_pos")?,
        })
    }
}

fn no_seed(sku: SkuId) -> StoreError {
    StoreError::Internal(format!("sale {}: no admission seed committed", sku.0))
}

fn ticket_of<R: crate::backend::Columns>(row: &R) -> Result<Ticket, StoreError> {
    Ok(Ticket {
        pre: row.flag("pre")?,
        n: row.uint("n")?,
    })
}

fn entry_of<R: crate::backend::Columns>(row: &R) -> Result<Entry, StoreError> {
    Ok(Entry {
        user_id: UserId(row.uint("user_id")?),
        quantity: row.small("quantity")?,
    })
}

impl<B: Backend> Store<B> {
    /// The sale's state row, locked in `tx` where the database locks rows.
    async fn locked_state(tx: &mut Transaction<'_, B>, sku: SkuId) -> Result<State, StoreError> {
        let sql = format!(
            "SELECT {STATE_COLUMNS} FROM admission_state WHERE sku_id = ?{}",
            B::DIALECT.lock_row
        );
        let rows = B::fetch(&mut **tx, &sql, &[Arg::Id(sku.0)]).await?;
        State::read(rows.first().ok_or_else(|| no_seed(sku))?)
    }

    async fn state(&self, sku: SkuId) -> Result<State, StoreError> {
        let sql = format!("SELECT {STATE_COLUMNS} FROM admission_state WHERE sku_id = ?");
        let rows = self.read(&sql, &[Arg::Id(sku.0)]).await?;
        State::read(rows.first().ok_or_else(|| no_seed(sku))?)
    }

    async fn count(&self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let rows = self.read(sql, args).await?;
        rows.first()
            .map(|r| r.int("n"))
            .transpose()
            .map(|n| n.unwrap_or(0) as u64)
    }
}

/// The writer connection with its commits unsynced ([`Backend::UNSYNCED`]), for the writes
/// each buyer makes (joins, entries). Synced again before it goes back to the pool; closed
/// instead (the pool opens a synced one) when that fails or the caller went away first, so
/// no other write ever commits unsynced.
struct Unsynced<B: Backend> {
    conn: PoolConnection<B>,
    synced: bool,
}

impl<B: Backend> Unsynced<B> {
    async fn acquire(pool: &Pool<B>) -> Result<Unsynced<B>, StoreError> {
        let conn = pool.acquire().await.map_err(db_error)?;
        // The setting goes with `begin`; from here the connection counts as unsynced (closed
        // on drop) until `release` sets it back, however far `begin` got.
        let synced = B::UNSYNCED.is_none();
        Ok(Unsynced { conn, synced })
    }

    /// The write transaction, its commit unsynced: where the database takes both in one
    /// call (SQLite runs a `BEGIN` given as text statement by statement), the setting and
    /// the `BEGIN` go together, one round trip to the connection's thread instead of two.
    async fn begin(&mut self) -> Result<Transaction<'_, B>, StoreError> {
        match (B::UNSYNCED, B::BEGIN_WRITE) {
            (Some((unsync, _)), Some(begin)) => {
                let both = format!("{unsync}; {begin}");
                self.conn.begin_with(both).await
            }
            (Some((unsync, _)), None) => {
                B::run(&mut self.conn, unsync, &[]).await?;
                self.conn.begin().await
            }
            (None, Some(begin)) => self.conn.begin_with(begin).await,
            (None, None) => self.conn.begin().await,
        }
        .map_err(db_error)
    }

    /// Syncs the connection's commits again (its last commit is already taken: a failure
    /// here only closes the connection).
    async fn release(mut self) {
        let Some((_, sync)) = B::UNSYNCED else {
            return;
        };
        match B::run(&mut self.conn, sync, &[]).await {
            Ok(_) => self.synced = true,
            Err(e) => tracing::warn!(error = %e, "admission writer not synced again: closed"),
        }
    }
}

impl<B: Backend> Drop for Unsynced<B> {
    fn drop(&mut self) {
        if !self.synced {
            self.conn.close_on_drop();
        }
    }
}

/// Users per `IN (…)` list and rows per multi-row insert: well inside every database's
/// bound on bound parameters.
const IN_LIST_MAX: usize = 500;
const INSERT_ROWS_MAX: usize = 200;

impl<B: Backend> Store<B> {
    /// Joins of one sale in one write transaction (one commit, one sync for the whole group),
    /// each answered as [`AdmissionBook::join`] answers one: a user already in the queue (or
    /// earlier in the group) keeps its ticket; `None` once the queue holds `len_max`. The
    /// group's clock is read once: every join of it happens at its commit.
    async fn commit_joins(
        &self,
        sku: SkuId,
        joins: &[GroupJoin],
    ) -> Result<Vec<Option<Ticket>>, StoreError> {
        let now = now_ms();
        let mut conn = Unsynced::acquire(&self.writer).await?;
        let mut tx = conn.begin().await?;
        let mut state = Self::locked_state(&mut tx, sku).await?;
        let users: Vec<UserId> = joins.iter().map(|j| j.user).collect();
        let mut known = Self::tickets_in(&mut tx, sku, &users).await?;
        let mut fresh = Vec::new();
        let mut answers = Vec::with_capacity(joins.len());
        for j in joins {
            if let Some(t) = known.get(&j.user) {
                answers.push(Some(*t));
                continue;
            }
            if state.prequeue + state.joined_after >= j.len_max {
                answers.push(None);
                continue;
            }
            let pre = !state.sealed && now < j.starts_at_ms;
            let n = match pre {
                true => &mut state.prequeue,
                false => &mut state.joined_after,
            };
            *n += 1;
            let t = Ticket { pre, n: *n };
            known.insert(j.user, t);
            fresh.push((j.user, t));
            answers.push(Some(t));
        }
        if !fresh.is_empty() {
            Self::insert_joins(&mut tx, sku, &fresh).await?;
            let sql = "UPDATE admission_state SET prequeue = ?, joined_after = ? WHERE sku_id = ?";
            let args = [
                Arg::Id(state.prequeue),
                Arg::Id(state.joined_after),
                Arg::Id(sku.0),
            ];
            B::run(&mut *tx, sql, &args).await?;
        }
        tx.commit().await.map_err(db_error)?;
        conn.release().await;
        Ok(answers)
    }

    /// The tickets of those of `users` already in the queue.
    async fn tickets_in(
        tx: &mut Transaction<'_, B>,
        sku: SkuId,
        users: &[UserId],
    ) -> Result<std::collections::HashMap<UserId, Ticket>, StoreError> {
        let mut known = std::collections::HashMap::new();
        for chunk in users.chunks(IN_LIST_MAX) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let sql = format!(
                "SELECT user_id, pre, n FROM admission_joins WHERE sku_id = ? AND user_id IN ({marks})"
            );
            let mut args = vec![Arg::Id(sku.0)];
            args.extend(chunk.iter().map(|u| Arg::Id(u.0)));
            for row in B::fetch(&mut **tx, &sql, &args).await? {
                known.insert(UserId(row.uint("user_id")?), ticket_of(&row)?);
            }
        }
        Ok(known)
    }

    async fn insert_joins(
        tx: &mut Transaction<'_, B>,
        sku: SkuId,
        fresh: &[(UserId, Ticket)],
    ) -> Result<(), StoreError> {
        for chunk in fresh.chunks(INSERT_ROWS_MAX) {
            let rows = vec!["(?, ?, ?, ?)"; chunk.len()].join(", ");
            let sql =
                format!("INSERT INTO admission_joins (sku_id, user_id, pre, n) VALUES {rows}");
            let args: Vec<Arg> = chunk
                .iter()
                .flat_map(|(u, t)| [Arg::Id(sku.0), Arg::Id(u.0), Arg::Flag(t.pre), Arg::Id(t.n)])
                .collect();
            B::run(&mut **tx, &sql, &args).await?;
        }
        Ok(())
    }
}

impl<B: Backend> Store<B> {
    /// One draw entry in `tx` (once per user: a second answers the first), by this
    /// process's clock.
    async fn enter_in(
        tx: &mut Transaction<'_, B>,
        sku: SkuId,
        entry: Entry,
        window: EntryWindow,
    ) -> Result<Entered, StoreError> {
        let now = now_ms();
        let state = Self::locked_state(tx, sku).await?;
        let sql = "SELECT user_id, quantity FROM admission_entries \
                   WHERE sku_id = ? AND user_id = ?";
        let args = [Arg::Id(sku.0), Arg::Id(entry.user_id.0)];
        if let Some(row) = B::fetch(&mut **tx, sql, &args).await?.first() {
            return entry_of(row).map(Entered::Already);
        }
        if now < window.opens_at_ms {
            return Ok(Entered::NotOpen);
        }
        if now >= window.closes_at_ms {
            return Ok(Entered::Closed);
        }
        if state.entries >= window.len_max {
            return Ok(Entered::Full);
        }
        let n = state.entries + 1;
        let sql = "INSERT INTO admission_entries (sku_id, user_id, quantity, n) \
                   VALUES (?, ?, ?, ?)";
        let args = [
            Arg::Id(sku.0),
            Arg::Id(entry.user_id.0),
            Arg::Small(entry.quantity),
            Arg::Id(n),
        ];
        B::run(&mut **tx, sql, &args).await?;
        let sql = "UPDATE admission_state SET entries = ? WHERE sku_id = ?";
        B::run(&mut **tx, sql, &[Arg::Id(n), Arg::Id(sku.0)]).await?;
        Ok(Entered::New(n))
    }
}

#[async_trait]
impl<B: Backend> AdmissionBook for Store<B> {
    async fn commit_seed(&self, sku: SkuId, seed: &Seed) -> Result<Seed, StoreError> {
        let (ins, tail) = B::DIALECT.insert_ignore;
        let sql = format!("{ins}admission_state (sku_id, seed) VALUES (?, ?){tail}");
        let text = hex(seed);
        self.write(&sql, &[Arg::Id(sku.0), Arg::Text(&text)])
            .await?;
        self.seed(sku).await?.ok_or_else(|| no_seed(sku))
    }

    async fn seed(&self, sku: SkuId) -> Result<Option<Seed>, StoreError> {
        let sql = "SELECT seed FROM admission_state WHERE sku_id = ?";
        let rows = self.read(sql, &[Arg::Id(sku.0)]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let text = row.text("seed")?;
        let seed = seed_from_hex(text.trim()).ok_or_else(|| no_seed(sku))?;
        Ok(Some(seed))
    }

    async fn join_group(
        &self,
        sku: SkuId,
        joins: &[GroupJoin],
    ) -> Result<Vec<Option<Ticket>>, StoreError> {
        self.commit_joins(sku, joins).await
    }

    async fn ticket(&self, sku: SkuId, user: UserId) -> Result<Option<Ticket>, StoreError> {
        let sql = "SELECT pre, n FROM admission_joins WHERE sku_id = ? AND user_id = ?";
        let rows = self.read(sql, &[Arg::Id(sku.0), Arg::Id(user.0)]).await?;
        rows.first().map(ticket_of).transpose()
    }

    async fn seal(&self, sku: SkuId, starts_at_ms: i64) -> Result<Option<u64>, StoreError> {
        if now_ms() < starts_at_ms {
            return Ok(None);
        }
        let mut tx = self.begin_write().await?;
        let state = Self::locked_state(&mut tx, sku).await?;
        if !state.sealed {
            let sql = "UPDATE admission_state SET sealed = ? WHERE sku_id = ?";
            B::run(&mut *tx, sql, &[Arg::Flag(true), Arg::Id(sku.0)]).await?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(Some(state.prequeue))
    }

    async fn prequeue(&self, sku: SkuId) -> Result<Vec<UserId>, StoreError> {
        let sql = "SELECT user_id FROM admission_joins WHERE sku_id = ? AND pre = ?";
        let rows = self.read(sql, &[Arg::Id(sku.0), Arg::Flag(true)]).await?;
        rows.iter().map(|r| r.uint("user_id").map(UserId)).collect()
    }

    async fn counts(&self, sku: SkuId, lapse_before_ms: i64) -> Result<QueueCounts, StoreError> {
        let state = self.state(sku).await?;
        let sql = "SELECT MAX(to_place) AS n FROM admission_waves WHERE sku_id = ? AND at_ms < ?";
        let rows = self
            .read(sql, &[Arg::Id(sku.0), Arg::Int(lapse_before_ms)])
            .await?;
        let lapsed_through = rows.first().map(|r| r.opt_uint("n")).transpose()?;
        let lapsed_through = lapsed_through.flatten().unwrap_or(0);
        let sql = "SELECT COUNT(*) AS n FROM admission_joins \
                   WHERE sku_id = ? AND bought_place IS NOT NULL AND bought_place <= ?";
        let bought_through = self
            .count(sql, &[Arg::Id(sku.0), Arg::Id(lapsed_through)])
            .await?;
        Ok(QueueCounts {
            sealed: state.sealed,
            prequeue: state.prequeue,
            joined_after: state.joined_after,
            cursor: state.admitted,
            bought: state.bought,
            lapsed_through,
            bought_through,
        })
    }

    async fn advance(&self, sku: SkuId, from: u64, to: u64) -> Result<bool, StoreError> {
        if to <= from {
            return Ok(false);
        }
        let mut tx = self.begin_write().await?;
        let sql = "UPDATE admission_state SET admitted = ? WHERE sku_id = ? AND admitted = ?";
        let moved = B::run(&mut *tx, sql, &[Arg::Id(to), Arg::Id(sku.0), Arg::Id(from)]).await?;
        if moved == 1 {
            let sql = "INSERT INTO admission_waves (sku_id, to_place, at_ms) VALUES (?, ?, ?)";
            let args = [Arg::Id(sku.0), Arg::Id(to), Arg::Int(now_ms())];
            B::run(&mut *tx, sql, &args).await?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(moved == 1)
    }

    async fn admitted_at(&self, sku: SkuId, place: u64) -> Result<(Option<i64>, i64), StoreError> {
        let sql = "SELECT at_ms FROM admission_waves WHERE sku_id = ? AND to_place >= ? \
                   ORDER BY to_place LIMIT 1";
        let rows = self.read(sql, &[Arg::Id(sku.0), Arg::Id(place)]).await?;
        let at = rows.first().map(|r| r.int("at_ms")).transpose()?;
        Ok((at, now_ms()))
    }

    async fn mark_bought(&self, sku: SkuId, user: UserId, place: u64) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let sql = "UPDATE admission_joins SET bought_place = ? \
                   WHERE sku_id = ? AND user_id = ? AND bought_place IS NULL";
        let args = [Arg::Id(place), Arg::Id(sku.0), Arg::Id(user.0)];
        if B::run(&mut *tx, sql, &args).await? == 1 {
            let sql = "UPDATE admission_state SET bought = bought + 1 WHERE sku_id = ?";
            B::run(&mut *tx, sql, &[Arg::Id(sku.0)]).await?;
        }
        tx.commit().await.map_err(db_error)
    }

    async fn enter(&self, sku: SkuId, e: Entry, w: EntryWindow) -> Result<Entered, StoreError> {
        let mut conn = Unsynced::acquire(&self.writer).await?;
        let mut tx = conn.begin().await?;
        let entered = Self::enter_in(&mut tx, sku, e, w).await?;
        tx.commit().await.map_err(db_error)?;
        conn.release().await;
        Ok(entered)
    }

    async fn entries(&self, sku: SkuId) -> Result<Vec<Entry>, StoreError> {
        let sql = "SELECT user_id, quantity FROM admission_entries WHERE sku_id = ? ORDER BY n";
        let rows = self.read(sql, &[Arg::Id(sku.0)]).await?;
        rows.iter().map(entry_of).collect()
    }

    async fn entry(&self, sku: SkuId, user: UserId) -> Result<Option<Entry>, StoreError> {
        let sql = "SELECT user_id, quantity FROM admission_entries \
                   WHERE sku_id = ? AND user_id = ?";
        let rows = self.read(sql, &[Arg::Id(sku.0), Arg::Id(user.0)]).await?;
        rows.first().map(entry_of).transpose()
    }

    async fn draw_pos(&self, sku: SkuId) -> Result<u64, StoreError> {
        Ok(self.state(sku).await?.draw_pos)
    }

    async fn advance_draw(&self, sku: SkuId, from: u64, to: u64) -> Result<bool, StoreError> {
        let sql = "UPDATE admission_state SET draw_pos = ? WHERE sku_id = ? AND draw_pos = ?";
        let args = [Arg::Id(to), Arg::Id(sku.0), Arg::Id(from)];
        Ok(self.write(sql, &args).await? == 1)
    }
}
