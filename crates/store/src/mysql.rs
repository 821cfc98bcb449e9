//! `MySqlStore`: the production system of record over MySQL / MariaDB.
//!
//! `apply_events` locks the sale row (`SELECT ... FOR UPDATE`), so concurrent writers of one
//! sale serialize on it; the guarded counter update is the last word either way.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{MySql, Row, Transaction};

use flashsale_core::{
    ApplyReport, DeadLetter, Event, EventKind, HotOrder, OrderNo, OrderStatus, OrderStore,
    ReconcileRun, Sale, SaleAudit, SaleState, SkuId, StoreError, StoredSale,
};

use crate::batch::{self, Head, KnownOrder, Plan, StoredEvent, CHUNK_ROWS};
use crate::compat;
use crate::rows::{self, db_error, DeadLetterRow, SaleRow};

/// How long an instance waits for another one's migrations.
const MIGRATE_LOCK_WAIT_S: i64 = 60;

/// Runs the migrations on the locked connection (`run` would take another from the pool),
/// past a newer schema only when it declares this binary compatible (`compat`).
async fn run_migrations(conn: &mut MySqlConnection) -> Result<(), StoreError> {
    let migrator = sqlx::migrate!("./migrations/mysql");
    let binary = compat::binary_version(&migrator);
    let database = compat::database_version(conn).await?;
    let min_binary = match database {
        Some(d) if d > binary => sqlx::query_scalar(compat::MIN_BINARY_SQL)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_error)?,
        _ => None,
    };
    let migrator = compat::prepare(migrator, binary, database, min_binary)?;
    migrator
        .run_direct(conn)
        .await
        .map_err(compat::migrate_error)
}

/// The system of record on MySQL / MariaDB.
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
}

impl std::fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlStore").finish_non_exhaustive()
    }
}

impl MySqlStore {
    /// Connects a pool of 16 to `url` (`mysql://user:pass@host:port/db`) and runs the
    /// migrations.
    pub async fn connect(url: &str) -> Result<MySqlStore, StoreError> {
        MySqlStore::connect_with(url, 16).await
    }

    /// Like [`MySqlStore::connect`] with a pool of `max_connections`.
    pub async fn connect_with(url: &str, max_connections: u32) -> Result<MySqlStore, StoreError> {
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let store = MySqlStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    /// Runs the pending migrations (idempotent). Instances that start together take turns
    /// under a named lock of the database's own: sqlx's migration lock asks MariaDB for
    /// `GET_LOCK(name, -1)`, which MariaDB answers NULL without locking, so two instances would
    /// both apply the first migration.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db_error)?;
        let locked: Option<i64> = sqlx::query_scalar(
            "SELECT GET_LOCK(CONCAT('flashsale_migrate_', SHA1(DATABASE())), ?)",
        )
        .bind(MIGRATE_LOCK_WAIT_S)
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)?;
        if locked != Some(1) {
            return Err(StoreError::Unavailable(format!(
                "another instance held the migration lock for {MIGRATE_LOCK_WAIT_S} s"
            )));
        }
        let ran = run_migrations(&mut conn).await;
        let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('flashsale_migrate_', SHA1(DATABASE())))")
            .execute(&mut *conn)
            .await;
        ran
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Whether a dead letter has paused the sale's stream.
    pub async fn stream_paused(&self, sku: SkuId) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT stream_paused FROM sales WHERE sku_id = ?")
            .bind(sku.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?
            .ok_or(StoreError::SaleNotFound)?;
        row.try_get::<bool, _>(0).map_err(db_error)
    }

    /// Pauses or resumes the sale's stream (an operator resumes after fixing a dead letter).
    pub async fn set_stream_paused(&self, sku: SkuId, paused: bool) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE sales SET stream_paused = ? WHERE sku_id = ?")
            .bind(paused)
            .bind(sku.0)
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        // MySQL counts found rows (sqlx sets CLIENT_FOUND_ROWS): 0 means no such sale.
        if done.rows_affected() == 0 {
            return Err(StoreError::SaleNotFound);
        }
        Ok(())
    }

    /// One try at applying a batch. The short way (`short`) is for a spike's batch: fresh
    /// deductions only, none refused by the fold's own rules. It skips the look-ups of existing
    /// order numbers and request keys, because the unique indexes refuse what they would have
    /// found, and the locked sale row and the guarded update check the rest: then the rows are
    /// the long way's. A statement it gets refused rolls the whole try back and answers `None`:
    /// the caller takes the long way, which decides (and keeps what it refuses).
    async fn apply(
        &self,
        sku: SkuId,
        events: &[Event],
        short: bool,
    ) -> Result<Option<ApplyReport>, StoreError> {
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        let sql = format!(
            "SELECT {} FROM sales WHERE sku_id = ? FOR UPDATE",
            batch::SALE_COLUMNS
        );
        let row = sqlx::query(&sql)
            .bind(sku.0)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?
            .ok_or(StoreError::SaleNotFound)?;
        let sale = SaleRow::read(&row)?;
        let head = Head {
            counters: sale.counters()?,
            mode: sale.mode()?,
        };
        let seqs = batch::applied_seqs(head.counters.seq, events);
        let stored = MySqlStore::stored_events(&mut tx, sku, &seqs).await?;
        let split = batch::split(sku, sale.epoch, head.counters.seq, events, &stored)?;
        let spike = split.fenced.is_empty()
            && split.duplicates == 0
            && !split.fresh.is_empty()
            && split.fresh.iter().all(|e| e.kind == EventKind::Deducted);
        if short && spike {
            let mut plan = batch::fold(sku, head, &split.fresh, Vec::new());
            if plan.report.rejected.is_empty() {
                match MySqlStore::write_plan(&mut tx, sku, &head, &plan).await {
                    Ok(()) => {
                        tx.commit().await.map_err(db_error)?;
                        plan.report.duplicates = 0;
                        return Ok(Some(plan.report));
                    }
                    Err(StoreError::Internal(why)) => {
                        tracing::debug!(%sku, %why, "short apply refused; the long way decides");
                        tx.rollback().await.map_err(db_error)?;
                        return Ok(None);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        MySqlStore::write_fenced(&mut tx, &split.fenced).await?;
        batch::alert_fenced(sku, &split.fenced);
        let fenced: Vec<Event> = split.fenced.iter().map(|e| (*e).clone()).collect();
        let (fresh, duplicates) = (split.fresh, split.duplicates);
        if fresh.is_empty() {
            tx.commit().await.map_err(db_error)?;
            return Ok(Some(ApplyReport {
                duplicates,
                fenced,
                ..ApplyReport::default()
            }));
        }
        let (nos, keys) = batch::lookups(&fresh);
        let known = MySqlStore::known_orders(&mut tx, sku, &nos, &keys).await?;
        let mut plan = batch::fold(sku, head, &fresh, known);
        MySqlStore::write_plan(&mut tx, sku, &head, &plan).await?;
        tx.commit().await.map_err(db_error)?;
        plan.report.duplicates = duplicates;
        plan.report.fenced = fenced;
        batch::alert(sku, &plan.report);
        Ok(Some(plan.report))
    }

    async fn known_orders(
        tx: &mut Transaction<'_, MySql>,
        sku: SkuId,
        nos: &[String],
        keys: &[(u64, String)],
    ) -> Result<Vec<KnownOrder>, StoreError> {
        const COLS: &str = "sku_id, order_no, user_id, request_id, quantity, status";
        let mut known = Vec::new();
        for chunk in nos.chunks(CHUNK_ROWS) {
            let sql = format!(
                "SELECT {COLS} FROM orders WHERE order_no IN ({})",
                batch::list_placeholders(chunk.len())
            );
            let mut q = sqlx::query(&sql);
            for no in chunk {
                q = q.bind(no);
            }
            for row in q.fetch_all(&mut **tx).await.map_err(db_error)? {
                known.push(known_order(&row)?);
            }
        }
        for chunk in keys.chunks(CHUNK_ROWS) {
            let sql = format!(
                "SELECT {COLS} FROM orders WHERE sku_id = ? AND (user_id, request_id) IN ({})",
                batch::values_placeholders(chunk.len(), 2)
            );
            let mut q = sqlx::query(&sql).bind(sku.0);
            for (user, request_id) in chunk {
                q = q.bind(user).bind(request_id.as_str());
            }
            for row in q.fetch_all(&mut **tx).await.map_err(db_error)? {
                known.push(known_order(&row)?);
            }
        }
        Ok(known)
    }

    /// The stored identity of the applied events at `seqs`.
    async fn stored_events(
        tx: &mut Transaction<'_, MySql>,
        sku: SkuId,
        seqs: &[u64],
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut stored = Vec::with_capacity(seqs.len());
        for chunk in seqs.chunks(CHUNK_ROWS) {
            let sql = format!(
                "SELECT seq, epoch, kind, order_no FROM stock_events WHERE sku_id = ? AND seq IN ({})",
                batch::list_placeholders(chunk.len())
            );
            let mut q = sqlx::query(&sql).bind(sku.0);
            for seq in chunk {
                q = q.bind(*seq);
            }
            for row in q.fetch_all(&mut **tx).await.map_err(db_error)? {
                stored.push(stored_event(&row)?);
            }
        }
        Ok(stored)
    }

    /// Keeps events the fence refused, once each.
    async fn write_fenced(
        tx: &mut Transaction<'_, MySql>,
        fenced: &[&Event],
    ) -> Result<(), StoreError> {
        for chunk in fenced.chunks(CHUNK_ROWS) {
            let sql = format!(
                "INSERT IGNORE INTO {}{}",
                batch::FENCED_INTO,
                batch::values_placeholders(chunk.len(), batch::FENCED_COLS)
            );
            let mut q = sqlx::query(&sql);
            for e in chunk {
                q = bind_event(q, e);
            }
            q.execute(&mut **tx).await.map_err(db_error)?;
        }
        Ok(())
    }

    async fn write_plan(
        tx: &mut Transaction<'_, MySql>,
        sku: SkuId,
        head: &Head,
        plan: &Plan<'_>,
    ) -> Result<(), StoreError> {
        for chunk in plan.events.chunks(CHUNK_ROWS) {
            let sql = format!(
                "{}{}",
                batch::INSERT_EVENTS,
                batch::values_placeholders(chunk.len(), batch::EVENT_COLS)
            );
            let mut q = sqlx::query(&sql);
            for (e, rejected) in chunk {
                q = bind_event(q, e).bind(*rejected);
            }
            q.execute(&mut **tx).await.map_err(db_error)?;
        }
        for chunk in plan.new_orders.chunks(CHUNK_ROWS) {
            let sql = format!(
                "{}{}",
                batch::INSERT_ORDERS,
                batch::values_placeholders(chunk.len(), batch::ORDER_COLS)
            );
            let mut q = sqlx::query(&sql);
            for o in chunk {
                q = q
                    .bind(o.order_no.as_str())
                    .bind(sku.0)
                    .bind(o.user_id)
                    .bind(o.request_id.as_str())
                    .bind(o.quantity)
                    .bind(o.status.as_str())
                    .bind(o.deadline_ms)
                    .bind(o.created_at_ms)
                    .bind(o.updated_at_ms);
            }
            q.execute(&mut **tx).await.map_err(db_error)?;
        }
        for u in &plan.updates {
            let sql = format!(
                "UPDATE orders SET status = ?, updated_at_ms = ? WHERE sku_id = ? AND order_no IN ({})",
                batch::list_placeholders(u.order_nos.len())
            );
            let mut q = sqlx::query(&sql)
                .bind(u.status.as_str())
                .bind(u.at_ms)
                .bind(sku.0);
            for no in &u.order_nos {
                q = q.bind(no.as_str());
            }
            q.execute(&mut **tx).await.map_err(db_error)?;
        }
        let (old, new) = (head.counters, plan.after);
        let done = sqlx::query(batch::GUARDED_UPDATE)
            .bind(signed(new.available)?)
            .bind(signed(new.reserved)?)
            .bind(signed(new.sold)?)
            .bind(new.seq)
            .bind(sku.0)
            .bind(old.seq)
            .bind(signed(old.available)?)
            .bind(signed(old.reserved)?)
            .bind(signed(old.sold)?)
            .bind(signed(new.available)?)
            .bind(signed(new.reserved)?)
            .bind(signed(new.sold)?)
            .execute(&mut **tx)
            .await
            .map_err(db_error)?;
        // Found rows: 1 when the guard matched, whatever changed.
        if done.rows_affected() != 1 {
            return Err(StoreError::Internal(format!(
                "guarded counter update of sku {sku} matched no row (applied_seq {})",
                old.seq
            )));
        }
        Ok(())
    }
}

fn signed(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Internal(format!("counter out of range: {v}")))
}

/// Strings are read unchecked: `ascii_bin` columns carry the BINARY flag, which sqlx's
/// `String` refuses, though the bytes are ASCII text.
fn text(row: &MySqlRow, col: &str) -> Result<String, StoreError> {
    row.try_get_unchecked::<String, _>(col).map_err(db_error)
}

fn get<'r, T>(row: &'r MySqlRow, col: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, MySql> + sqlx::Type<MySql>,
{
    row.try_get::<T, _>(col).map_err(db_error)
}

impl rows::Columns for MySqlRow {
    fn text(&self, col: &str) -> Result<String, StoreError> {
        text(self, col)
    }
    fn uint(&self, col: &str) -> Result<u64, StoreError> {
        get(self, col)
    }
    fn int(&self, col: &str) -> Result<i64, StoreError> {
        get(self, col)
    }
    fn small(&self, col: &str) -> Result<u32, StoreError> {
        get(self, col)
    }
}

fn known_order(row: &MySqlRow) -> Result<KnownOrder, StoreError> {
    let status = text(row, "status")?;
    Ok(KnownOrder {
        sku_id: SkuId(get(row, "sku_id")?),
        order_no: text(row, "order_no")?,
        user_id: get(row, "user_id")?,
        request_id: text(row, "request_id")?,
        quantity: get(row, "quantity")?,
        status: batch::parse("status", &status, OrderStatus::parse)?,
    })
}

/// Binds an event's columns in `batch::EVENT_COLUMNS` order (stock_events, fenced_events).
fn bind_event<'q>(
    q: sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>,
    e: &'q Event,
) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
    q.bind(e.sku_id.0)
        .bind(e.epoch)
        .bind(e.seq)
        .bind(e.kind.as_str())
        .bind(e.order_no.to_string())
        .bind(e.request_id.as_str())
        .bind(e.user_id.0)
        .bind(e.quantity)
        .bind(e.at_ms)
        .bind(e.deadline_ms)
}

fn stored_event(row: &MySqlRow) -> Result<StoredEvent, StoreError> {
    let kind: String = text(row, "kind")?;
    Ok(StoredEvent {
        seq: get(row, "seq")?,
        epoch: get(row, "epoch")?,
        kind: batch::parse("kind", &kind, EventKind::parse)?,
        order_no: batch::order_no(&text(row, "order_no")?)?,
    })
}

#[async_trait]
impl OrderStore for MySqlStore {
    async fn create_sale(&self, sale: &Sale) -> Result<StoredSale, StoreError> {
        rows::validate(sale)?;
        let stored = rows::created(sale);
        let s = &stored.sale;
        let total = signed(s.total_stock)?;
        let result = sqlx::query(
            "INSERT INTO sales (sku_id, name, total_stock, available, reserved, sold, applied_seq, \
             epoch, per_user_limit, mode, payment_timeout_ms, starts_at_ms, ends_at_ms, state) \
             VALUES (?, ?, ?, ?, 0, 0, 0, 0, ?, ?, ?, ?, ?, ?)",
        )
        .bind(s.sku_id.0)
        .bind(&s.name)
        .bind(total)
        .bind(total)
        .bind(s.per_user_limit)
        .bind(s.mode.as_str())
        .bind(s.payment_timeout_ms)
        .bind(s.starts_at_ms)
        .bind(s.ends_at_ms)
        .bind(s.state.as_str())
        .execute(&self.pool)
        .await;
        match result {
            Ok(_) => Ok(stored),
            Err(e) if rows::is_unique_violation(&e) => Err(StoreError::SaleExists),
            Err(e) => Err(db_error(e)),
        }
    }

    async fn sale(&self, sku: SkuId) -> Result<Option<StoredSale>, StoreError> {
        let sql = format!("SELECT {} FROM sales WHERE sku_id = ?", batch::SALE_COLUMNS);
        let row = sqlx::query(&sql)
            .bind(sku.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.map(|r| SaleRow::read(&r)?.into_stored()).transpose()
    }

    async fn sales(&self) -> Result<Vec<StoredSale>, StoreError> {
        let sql = format!("SELECT {} FROM sales ORDER BY sku_id", batch::SALE_COLUMNS);
        let rows = sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|r| SaleRow::read(r)?.into_stored())
            .collect()
    }

    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE sales SET state = ? WHERE sku_id = ?")
            .bind(state.as_str())
            .bind(sku.0)
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::SaleNotFound);
        }
        Ok(())
    }

    async fn take_epoch(&self, sku: SkuId, current: u64) -> Result<Option<u64>, StoreError> {
        let done = sqlx::query(
            "UPDATE sales SET epoch = epoch + 1, epoch_at_ms = ? WHERE sku_id = ? AND epoch = ?",
        )
        .bind(flashsale_core::clock::now_ms())
        .bind(sku.0)
        .bind(current)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        // MySQL counts found rows, which is what this asks: did the compare match?
        Ok((done.rows_affected() == 1).then_some(current + 1))
    }

    async fn unreported_fenced(&self, sku: SkuId, max: usize) -> Result<Vec<Event>, StoreError> {
        let sql = format!(
            "SELECT {} FROM fenced_events WHERE sku_id = ? AND reported = FALSE \
             ORDER BY epoch, seq LIMIT ?",
            batch::EVENT_COLUMNS
        );
        let rows = sqlx::query(&sql)
            .bind(sku.0)
            .bind(max as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(rows::event).collect()
    }

    async fn mark_fenced_reported(
        &self,
        sku: SkuId,
        keys: &[(u64, u64)],
    ) -> Result<(), StoreError> {
        for chunk in keys.chunks(CHUNK_ROWS) {
            let sql = format!(
                "UPDATE fenced_events SET reported = TRUE WHERE sku_id = ? AND (epoch, seq) IN ({})",
                batch::values_placeholders(chunk.len(), 2)
            );
            let mut q = sqlx::query(&sql).bind(sku.0);
            for (epoch, seq) in chunk {
                q = q.bind(*epoch).bind(*seq);
            }
            q.execute(&self.pool).await.map_err(db_error)?;
        }
        Ok(())
    }

    async fn stream_paused(&self, sku: SkuId) -> Result<bool, StoreError> {
        MySqlStore::stream_paused(self, sku).await
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, StoreError> {
        let sql = format!(
            "SELECT {} FROM orders WHERE order_no = ?",
            batch::ORDER_COLUMNS
        );
        let row = sqlx::query(&sql)
            .bind(order_no.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.map(|r| rows::order(&r)).transpose()
    }

    async fn orders(&self, sku: SkuId) -> Result<Vec<HotOrder>, StoreError> {
        let sql = format!(
            "SELECT {} FROM orders WHERE sku_id = ? ORDER BY id",
            batch::ORDER_COLUMNS
        );
        let rows = sqlx::query(&sql)
            .bind(sku.0)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(rows::order).collect()
    }

    async fn events(&self, sku: SkuId) -> Result<Vec<Event>, StoreError> {
        self.events_between(sku, 0, u64::MAX).await
    }

    async fn events_between(
        &self,
        sku: SkuId,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let sql = format!(
            "SELECT {} FROM stock_events WHERE sku_id = ? AND seq >= ? AND seq <= ? ORDER BY seq",
            batch::EVENT_COLUMNS
        );
        let rows = sqlx::query(&sql)
            .bind(sku.0)
            .bind(from_seq)
            .bind(to_seq)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(rows::event).collect()
    }

    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        let sql = format!(
            "INSERT INTO dead_letters ({}) VALUES (?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE seq = VALUES(seq), payload = VALUES(payload), \
             error = VALUES(error), attempts = VALUES(attempts)",
            batch::DEAD_LETTER_COLUMNS
        );
        sqlx::query(&sql)
            .bind(letter.sku_id.0)
            .bind(&letter.entry_id)
            .bind(letter.seq)
            .bind(&letter.payload)
            .bind(&letter.error)
            .bind(letter.attempts)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        sqlx::query("UPDATE sales SET stream_paused = TRUE WHERE sku_id = ?")
            .bind(letter.sku_id.0)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(db_error)
    }

    async fn dead_letters(&self, sku: SkuId) -> Result<Vec<DeadLetter>, StoreError> {
        let sql = format!(
            "SELECT {} FROM dead_letters WHERE sku_id = ? ORDER BY id",
            batch::DEAD_LETTER_COLUMNS
        );
        let rows = sqlx::query(&sql)
            .bind(sku.0)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetterRow {
                    sku_id: get(r, "sku_id")?,
                    entry_id: text(r, "entry_id")?,
                    seq: get(r, "seq")?,
                    payload: text(r, "payload")?,
                    error: text(r, "error")?,
                    attempts: get(r, "attempts")?,
                }
                .into_letter())
            })
            .collect()
    }

    async fn apply_events(&self, sku: SkuId, events: &[Event]) -> Result<ApplyReport, StoreError> {
        if events.is_empty() {
            return Ok(ApplyReport::default());
        }
        match self.apply(sku, events, true).await? {
            Some(report) => Ok(report),
            // The short way was refused and rolled back: the long way decides.
            None => Ok(self
                .apply(sku, events, false)
                .await?
                .expect("the long way always decides")),
        }
    }

    async fn audit(&self, sku: SkuId) -> Result<Option<SaleAudit>, StoreError> {
        // One InnoDB REPEATABLE READ snapshot: counters, orders and events agree.
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        let sql = format!("SELECT {} FROM sales WHERE sku_id = ?", batch::SALE_COLUMNS);
        let Some(row) = sqlx::query(&sql)
            .bind(sku.0)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?
        else {
            return Ok(None);
        };
        let sale = SaleRow::read(&row)?.into_stored()?;
        let sql = format!(
            "SELECT {} FROM orders WHERE sku_id = ? ORDER BY id",
            batch::ORDER_COLUMNS
        );
        let orders = sqlx::query(&sql)
            .bind(sku.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(db_error)?
            .iter()
            .map(rows::order)
            .collect::<Result<Vec<_>, _>>()?;
        let sql = format!(
            "SELECT {} FROM stock_events WHERE sku_id = ? ORDER BY seq",
            batch::EVENT_COLUMNS
        );
        let events = sqlx::query(&sql)
            .bind(sku.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(db_error)?
            .iter()
            .map(rows::event)
            .collect::<Result<Vec<_>, _>>()?;
        tx.rollback().await.map_err(db_error)?;
        Ok(Some(SaleAudit {
            sale,
            orders,
            events,
        }))
    }

    async fn record_reconcile_run(&self, run: &ReconcileRun) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "INSERT INTO reconcile_runs (sku_id, at_ms, `trigger`, repair, ok, violations, \
             repairs, lost_orders, lost_resolutions, report) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run.sku_id.0)
        .bind(run.at_ms)
        .bind(&run.trigger)
        .bind(run.repair)
        .bind(run.ok)
        .bind(run.violations)
        .bind(run.repairs.join("\n"))
        .bind(run.lost_orders.join("\n"))
        .bind(run.lost_resolutions.join("\n"))
        .bind(&run.report)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(done.last_insert_id())
    }

    async fn reconcile_runs(
        &self,
        sku: Option<SkuId>,
        limit: usize,
    ) -> Result<Vec<ReconcileRun>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, sku_id, at_ms, `trigger`, repair, ok, violations, repairs, lost_orders, \
             lost_resolutions, report FROM reconcile_runs WHERE (? IS NULL OR sku_id = ?) ORDER BY id DESC LIMIT ?",
        )
        .bind(sku.map(|s| s.0))
        .bind(sku.map(|s| s.0))
        .bind(limit as u64)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        rows.iter()
            .map(|r| {
                Ok(ReconcileRun {
                    id: get(r, "id")?,
                    sku_id: SkuId(get(r, "sku_id")?),
                    at_ms: get(r, "at_ms")?,
                    trigger: text(r, "trigger")?,
                    repair: get(r, "repair")?,
                    ok: get(r, "ok")?,
                    violations: get(r, "violations")?,
                    repairs: crate::rows::lines(&text(r, "repairs")?),
                    lost_orders: crate::rows::lines(&text(r, "lost_orders")?),
                    lost_resolutions: crate::rows::lines(&text(r, "lost_resolutions")?),
                    report: text(r, "report")?,
                })
            })
            .collect()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(db_error)
    }
}
