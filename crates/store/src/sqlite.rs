//! `SqliteStore`: the embedded system of record over one SQLite file (WAL, synchronous=FULL).
//!
//! Every write goes through ONE writer connection (a pool of one) and every write
//! transaction starts with `BEGIN IMMEDIATE`, so writes of this process queue in Rust instead
//! of failing with SQLITE_BUSY, and a transaction never has to upgrade a read lock. Reads use
//! a small pool of their own (WAL readers do not block the writer).
//! SQLite integers are signed: u64 ids and sequence numbers are stored bit-for-bit as i64.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};

use flashsale_core::{
    ApplyReport, Counters, DeadLetter, Event, EventKind, HotOrder, OrderNo, OrderStatus,
    OrderStore, ReconcileRun, Sale, SaleAudit, SaleState, SkuId, StoreError, StoredSale, UserId,
};

use crate::batch::{self, Head, KnownOrder, Plan, StoredEvent, CHUNK_ROWS};
use crate::compat;
use crate::rows::{self, db_error, DeadLetterRow, SaleRow};

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
const READERS: u32 = 4;

/// Runs the migrations on the writer's connection, past a newer schema only when it declares
/// this binary compatible (`compat`).
async fn run_migrations(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    let migrator = sqlx::migrate!("./migrations/sqlite");
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

/// The system of record in one SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

/// u64 → i64 bit-for-bit (SQLite has no unsigned integers).
fn i(v: u64) -> i64 {
    v as i64
}

/// i64 → u64 bit-for-bit, the inverse of [`i`].
fn u(v: i64) -> u64 {
    v as u64
}

impl SqliteStore {
    /// Opens (creating the file and its directory when missing) `sqlite://path`,
    /// `sqlite:path`, `sqlite::memory:` or a plain path, and runs the migrations.
    pub async fn open(url_or_path: &str) -> Result<SqliteStore, StoreError> {
        let base = if url_or_path.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(url_or_path)
                .map_err(|e| StoreError::Unavailable(format!("bad sqlite url: {e}")))?
        } else {
            SqliteConnectOptions::new().filename(url_or_path)
        };
        let in_memory = url_or_path.contains(":memory:") || url_or_path.contains("mode=memory");
        if !in_memory {
            if let Some(dir) = base.get_filename().parent() {
                if !dir.as_os_str().is_empty() && !Path::new(dir).exists() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Unavailable(format!("create {}: {e}", dir.display()))
                    })?;
                }
            }
        }
        let opts = base
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.clone())
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        run_migrations(&mut *writer.acquire().await.map_err(db_error)?).await?;
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(READERS)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(opts)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?
        };
        Ok(SqliteStore { writer, reader })
    }

    /// The read pool (tests, ad-hoc queries). Never write through it.
    pub fn pool(&self) -> &SqlitePool {
        &self.reader
    }

    /// The single writer connection's pool.
    pub fn writer(&self) -> &SqlitePool {
        &self.writer
    }

    /// Closes both pools (waits for connections to return).
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }

    /// Whether a dead letter has paused the sale's stream.
    pub async fn stream_paused(&self, sku: SkuId) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT stream_paused FROM sales WHERE sku_id = ?")
            .bind(i(sku.0))
            .fetch_optional(&self.reader)
            .await
            .map_err(db_error)?
            .ok_or(StoreError::SaleNotFound)?;
        row.try_get::<bool, _>(0).map_err(db_error)
    }

    /// Pauses or resumes the sale's stream.
    pub async fn set_stream_paused(&self, sku: SkuId, paused: bool) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE sales SET stream_paused = ?, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE sku_id = ?")
            .bind(paused)
            .bind(i(sku.0))
            .execute(&self.writer)
            .await
            .map_err(db_error)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::SaleNotFound);
        }
        Ok(())
    }

    /// Blacklist entries as `(kind, value)`, kind `user` or `ip` (the gateway's cache).
    pub async fn blacklist(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query("SELECT kind, value FROM blacklist")
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<String, _>("kind"), r.get::<String, _>("value")))
            .collect())
    }

    /// Adds (`blocked`) or removes a blacklist entry; idempotent.
    pub async fn set_blacklisted(
        &self,
        kind: &str,
        value: &str,
        blocked: bool,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let q = if blocked {
            sqlx::query(
                "INSERT INTO blacklist (kind, value, created_at_ms) VALUES (?, ?, ?) \
                 ON CONFLICT (kind, value) DO NOTHING",
            )
            .bind(kind)
            .bind(value)
            .bind(now_ms)
        } else {
            sqlx::query("DELETE FROM blacklist WHERE kind = ? AND value = ?")
                .bind(kind)
                .bind(value)
        };
        q.execute(&self.writer).await.map_err(db_error)?;
        Ok(())
    }

    /// Skus of the sales that require a purchase token (anti-scalping).
    pub async fn token_sales(&self) -> Result<Vec<SkuId>, StoreError> {
        let rows = sqlx::query("SELECT sku_id FROM sale_guards WHERE purchase_token = 1")
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)?;
        Ok(rows
            .iter()
            .map(|r| SkuId(r.get::<i64, _>("sku_id") as u64))
            .collect())
    }

    /// Turns the purchase-token requirement of a sale on or off; idempotent.
    pub async fn set_token_sale(&self, sku: SkuId, on: bool) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sale_guards (sku_id, purchase_token) VALUES (?, ?) \
             ON CONFLICT (sku_id) DO UPDATE SET purchase_token = excluded.purchase_token",
        )
        .bind(i(sku.0))
        .bind(i64::from(on))
        .execute(&self.writer)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Users on the risk allowlist (admitted by the fallback rule `allowlist`).
    pub async fn risk_allowlist(&self) -> Result<Vec<UserId>, StoreError> {
        let rows = sqlx::query("SELECT user_id FROM risk_allowlist")
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)?;
        Ok(rows
            .iter()
            .map(|r| UserId(r.get::<i64, _>("user_id") as u64))
            .collect())
    }

    /// Adds (`on`) or removes a user of the risk allowlist; idempotent.
    pub async fn set_risk_allowed(
        &self,
        user: UserId,
        on: bool,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let q = if on {
            sqlx::query(
                "INSERT INTO risk_allowlist (user_id, created_at_ms) VALUES (?, ?) \
                 ON CONFLICT (user_id) DO NOTHING",
            )
            .bind(i(user.0))
            .bind(now_ms)
        } else {
            sqlx::query("DELETE FROM risk_allowlist WHERE user_id = ?").bind(i(user.0))
        };
        q.execute(&self.writer).await.map_err(db_error)?;
        Ok(())
    }

    /// Sales with a fallback rule of their own, as `(sku, rule)`.
    pub async fn risk_fallbacks(&self) -> Result<Vec<(SkuId, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT sku_id, risk_fallback FROM sale_guards WHERE risk_fallback IS NOT NULL",
        )
        .fetch_all(&self.reader)
        .await
        .map_err(db_error)?;
        Ok(rows
            .iter()
            .map(|r| {
                let sku = SkuId(r.get::<i64, _>("sku_id") as u64);
                (sku, r.get::<String, _>("risk_fallback"))
            })
            .collect())
    }

    /// Sets a sale's own fallback rule (`allow`, `deny`, `allowlist`), or drops it (`None`).
    pub async fn set_risk_fallback(
        &self,
        sku: SkuId,
        rule: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sale_guards (sku_id, risk_fallback) VALUES (?, ?) \
             ON CONFLICT (sku_id) DO UPDATE SET risk_fallback = excluded.risk_fallback",
        )
        .bind(i(sku.0))
        .bind(rule)
        .execute(&self.writer)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Creates or overwrites a sale's definition, state, counters (`applied_seq` =
    /// `counters.seq`) and epoch, leaving its orders and events alone. For the embedded
    /// ledger's `warm` (the operator's word: refused unless the sale sold nothing, or forced).
    pub async fn put_sale(
        &self,
        sale: &Sale,
        counters: &Counters,
        epoch: u64,
    ) -> Result<(), StoreError> {
        rows::validate(sale)?;
        if counters.total != sale.total_stock || !counters.conserved() {
            return Err(StoreError::Internal(format!(
                "counters {counters:?} do not conserve total {}",
                sale.total_stock
            )));
        }
        sqlx::query(
            "INSERT INTO sales (sku_id, name, total_stock, available, reserved, sold, applied_seq, \
             epoch, per_user_limit, mode, payment_timeout_ms, starts_at_ms, ends_at_ms, state) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (sku_id) DO UPDATE SET name = excluded.name, \
             total_stock = excluded.total_stock, available = excluded.available, \
             reserved = excluded.reserved, sold = excluded.sold, \
             applied_seq = excluded.applied_seq, epoch = excluded.epoch, \
             per_user_limit = excluded.per_user_limit, mode = excluded.mode, \
             payment_timeout_ms = excluded.payment_timeout_ms, \
             starts_at_ms = excluded.starts_at_ms, ends_at_ms = excluded.ends_at_ms, \
             state = excluded.state, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        )
        .bind(i(sale.sku_id.0))
        .bind(&sale.name)
        .bind(i(counters.total))
        .bind(i(counters.available))
        .bind(i(counters.reserved))
        .bind(i(counters.sold))
        .bind(i(counters.seq))
        .bind(i(epoch))
        .bind(sale.per_user_limit)
        .bind(sale.mode.as_str())
        .bind(i(sale.payment_timeout_ms))
        .bind(sale.starts_at_ms)
        .bind(sale.ends_at_ms)
        .bind(sale.state.as_str())
        .execute(&self.writer)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)
    }

    async fn known_orders(
        tx: &mut Transaction<'_, Sqlite>,
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
                q = q.bind(no.as_str());
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
            let mut q = sqlx::query(&sql).bind(i(sku.0));
            for (user, request_id) in chunk {
                q = q.bind(i(*user)).bind(request_id.as_str());
            }
            for row in q.fetch_all(&mut **tx).await.map_err(db_error)? {
                known.push(known_order(&row)?);
            }
        }
        Ok(known)
    }

    /// The stored identity of the applied events at `seqs`.
    async fn stored_events(
        tx: &mut Transaction<'_, Sqlite>,
        sku: SkuId,
        seqs: &[u64],
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut stored = Vec::with_capacity(seqs.len());
        for chunk in seqs.chunks(CHUNK_ROWS) {
            let sql = format!(
                "SELECT seq, epoch, kind, order_no FROM stock_events WHERE sku_id = ? AND seq IN ({})",
                batch::list_placeholders(chunk.len())
            );
            let mut q = sqlx::query(&sql).bind(i(sku.0));
            for seq in chunk {
                q = q.bind(i(*seq));
            }
            for row in q.fetch_all(&mut **tx).await.map_err(db_error)? {
                stored.push(stored_event(&row)?);
            }
        }
        Ok(stored)
    }

    /// Keeps events the fence refused, once each.
    async fn write_fenced(
        tx: &mut Transaction<'_, Sqlite>,
        fenced: &[&Event],
    ) -> Result<(), StoreError> {
        for chunk in fenced.chunks(CHUNK_ROWS) {
            let sql = format!(
                "INSERT OR IGNORE INTO {}{}",
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
        tx: &mut Transaction<'_, Sqlite>,
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
                    .bind(i(sku.0))
                    .bind(i(o.user_id))
                    .bind(o.request_id.as_str())
                    .bind(o.quantity)
                    .bind(o.status.as_str())
                    .bind(o.deadline_ms)
                    .bind(o.created_at_ms)
                    .bind(o.updated_at_ms);
            }
            q.execute(&mut **tx).await.map_err(db_error)?;
        }
        for up in &plan.updates {
            let sql = format!(
                "UPDATE orders SET status = ?, updated_at_ms = ? WHERE sku_id = ? AND order_no IN ({})",
                batch::list_placeholders(up.order_nos.len())
            );
            let mut q = sqlx::query(&sql)
                .bind(up.status.as_str())
                .bind(up.at_ms)
                .bind(i(sku.0));
            for no in &up.order_nos {
                q = q.bind(no.as_str());
            }
            q.execute(&mut **tx).await.map_err(db_error)?;
        }
        let (old, new) = (head.counters, plan.after);
        let done = sqlx::query(batch::GUARDED_UPDATE)
            .bind(i(new.available))
            .bind(i(new.reserved))
            .bind(i(new.sold))
            .bind(i(new.seq))
            .bind(i(sku.0))
            .bind(i(old.seq))
            .bind(i(old.available))
            .bind(i(old.reserved))
            .bind(i(old.sold))
            .bind(i(new.available))
            .bind(i(new.reserved))
            .bind(i(new.sold))
            .execute(&mut **tx)
            .await
            .map_err(db_error)?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Internal(format!(
                "guarded counter update of sku {sku} matched no row (applied_seq {})",
                old.seq
            )));
        }
        Ok(())
    }
}

fn get<'r, T>(row: &'r SqliteRow, col: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get::<T, _>(col).map_err(db_error)
}

fn id(row: &SqliteRow, col: &str) -> Result<u64, StoreError> {
    get::<i64>(row, col).map(u)
}

impl rows::Columns for SqliteRow {
    fn text(&self, col: &str) -> Result<String, StoreError> {
        get(self, col)
    }
    fn uint(&self, col: &str) -> Result<u64, StoreError> {
        id(self, col)
    }
    fn int(&self, col: &str) -> Result<i64, StoreError> {
        get(self, col)
    }
    fn small(&self, col: &str) -> Result<u32, StoreError> {
        get(self, col)
    }
}

fn known_order(row: &SqliteRow) -> Result<KnownOrder, StoreError> {
    let status: String = get(row, "status")?;
    Ok(KnownOrder {
        sku_id: SkuId(id(row, "sku_id")?),
        order_no: get(row, "order_no")?,
        user_id: id(row, "user_id")?,
        request_id: get(row, "request_id")?,
        quantity: get(row, "quantity")?,
        status: batch::parse("status", &status, OrderStatus::parse)?,
    })
}

/// Binds an event's columns in `batch::EVENT_COLUMNS` order (stock_events, fenced_events).
fn bind_event<'q>(
    q: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    e: &'q Event,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    q.bind(i(e.sku_id.0))
        .bind(i(e.epoch))
        .bind(i(e.seq))
        .bind(e.kind.as_str())
        .bind(e.order_no.to_string())
        .bind(e.request_id.as_str())
        .bind(i(e.user_id.0))
        .bind(e.quantity)
        .bind(e.at_ms)
        .bind(e.deadline_ms)
}

fn stored_event(row: &SqliteRow) -> Result<StoredEvent, StoreError> {
    let kind: String = get(row, "kind")?;
    Ok(StoredEvent {
        seq: id(row, "seq")?,
        epoch: id(row, "epoch")?,
        kind: batch::parse("kind", &kind, EventKind::parse)?,
        order_no: batch::order_no(&get::<String>(row, "order_no")?)?,
    })
}

#[async_trait]
impl OrderStore for SqliteStore {
    async fn create_sale(&self, sale: &Sale) -> Result<StoredSale, StoreError> {
        rows::validate(sale)?;
        let stored = rows::created(sale);
        let s = &stored.sale;
        let total = i(s.total_stock);
        let result = sqlx::query(
            "INSERT INTO sales (sku_id, name, total_stock, available, reserved, sold, applied_seq, \
             epoch, per_user_limit, mode, payment_timeout_ms, starts_at_ms, ends_at_ms, state) \
             VALUES (?, ?, ?, ?, 0, 0, 0, 0, ?, ?, ?, ?, ?, ?)",
        )
        .bind(i(s.sku_id.0))
        .bind(&s.name)
        .bind(total)
        .bind(total)
        .bind(s.per_user_limit)
        .bind(s.mode.as_str())
        .bind(i(s.payment_timeout_ms))
        .bind(s.starts_at_ms)
        .bind(s.ends_at_ms)
        .bind(s.state.as_str())
        .execute(&self.writer)
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
            .bind(i(sku.0))
            .fetch_optional(&self.reader)
            .await
            .map_err(db_error)?;
        row.map(|r| SaleRow::read(&r)?.into_stored()).transpose()
    }

    async fn sales(&self) -> Result<Vec<StoredSale>, StoreError> {
        let sql = format!("SELECT {} FROM sales ORDER BY sku_id", batch::SALE_COLUMNS);
        let rows = sqlx::query(&sql)
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|r| SaleRow::read(r)?.into_stored())
            .collect()
    }

    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE sales SET state = ?, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') \
             WHERE sku_id = ?",
        )
        .bind(state.as_str())
        .bind(i(sku.0))
        .execute(&self.writer)
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
        .bind(i(sku.0))
        .bind(i(current))
        .execute(&self.writer)
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
            .bind(i(sku.0))
            .bind(max as i64)
            .fetch_all(&self.reader)
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
            let mut q = sqlx::query(&sql).bind(i(sku.0));
            for (epoch, seq) in chunk {
                q = q.bind(i(*epoch)).bind(i(*seq));
            }
            q.execute(&self.writer).await.map_err(db_error)?;
        }
        Ok(())
    }

    async fn stream_paused(&self, sku: SkuId) -> Result<bool, StoreError> {
        SqliteStore::stream_paused(self, sku).await
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, StoreError> {
        let sql = format!(
            "SELECT {} FROM orders WHERE order_no = ?",
            batch::ORDER_COLUMNS
        );
        let row = sqlx::query(&sql)
            .bind(order_no.to_string())
            .fetch_optional(&self.reader)
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
            .bind(i(sku.0))
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)?;
        rows.iter().map(rows::order).collect()
    }

    async fn events(&self, sku: SkuId) -> Result<Vec<Event>, StoreError> {
        let sql = format!(
            "SELECT {} FROM stock_events WHERE sku_id = ? ORDER BY seq",
            batch::EVENT_COLUMNS
        );
        let rows = sqlx::query(&sql)
            .bind(i(sku.0))
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)?;
        rows.iter().map(rows::event).collect()
    }

    async fn events_between(
        &self,
        sku: SkuId,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<Event>, StoreError> {
        // Sequence numbers stay far below i64::MAX; clamp the bounds so the range is signed.
        let to = i64::try_from(to_seq).unwrap_or(i64::MAX);
        let from = i64::try_from(from_seq).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {} FROM stock_events WHERE sku_id = ? AND seq >= ? AND seq <= ? ORDER BY seq",
            batch::EVENT_COLUMNS
        );
        let rows = sqlx::query(&sql)
            .bind(i(sku.0))
            .bind(from)
            .bind(to)
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)?;
        rows.iter().map(rows::event).collect()
    }

    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let sql = format!(
            "INSERT INTO dead_letters ({}) VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (sku_id, entry_id) DO UPDATE SET seq = excluded.seq, \
             payload = excluded.payload, error = excluded.error, attempts = excluded.attempts",
            batch::DEAD_LETTER_COLUMNS
        );
        sqlx::query(&sql)
            .bind(i(letter.sku_id.0))
            .bind(&letter.entry_id)
            .bind(letter.seq.map(i))
            .bind(&letter.payload)
            .bind(&letter.error)
            .bind(letter.attempts)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        sqlx::query("UPDATE sales SET stream_paused = 1 WHERE sku_id = ?")
            .bind(i(letter.sku_id.0))
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
            .bind(i(sku.0))
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetterRow {
                    sku_id: id(r, "sku_id")?,
                    entry_id: get(r, "entry_id")?,
                    seq: get::<Option<i64>>(r, "seq")?.map(u),
                    payload: get(r, "payload")?,
                    error: get(r, "error")?,
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
        // The writer connection plus BEGIN IMMEDIATE is the lock on the sale row.
        let mut tx = self.begin().await?;
        let sql = format!("SELECT {} FROM sales WHERE sku_id = ?", batch::SALE_COLUMNS);
        let row = sqlx::query(&sql)
            .bind(i(sku.0))
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
        let stored = SqliteStore::stored_events(&mut tx, sku, &seqs).await?;
        let split = batch::split(sku, sale.epoch, head.counters.seq, events, &stored)?;
        SqliteStore::write_fenced(&mut tx, &split.fenced).await?;
        batch::alert_fenced(sku, &split.fenced);
        let fenced: Vec<Event> = split.fenced.iter().map(|e| (*e).clone()).collect();
        let (fresh, duplicates) = (split.fresh, split.duplicates);
        if fresh.is_empty() {
            tx.commit().await.map_err(db_error)?;
            return Ok(ApplyReport {
                duplicates,
                fenced,
                ..ApplyReport::default()
            });
        }
        let (nos, keys) = batch::lookups(&fresh);
        let known = SqliteStore::known_orders(&mut tx, sku, &nos, &keys).await?;
        let mut plan = batch::fold(sku, head, &fresh, known);
        SqliteStore::write_plan(&mut tx, sku, &head, &plan).await?;
        tx.commit().await.map_err(db_error)?;
        plan.report.duplicates = duplicates;
        plan.report.fenced = fenced;
        batch::alert(sku, &plan.report);
        Ok(plan.report)
    }

    async fn audit(&self, sku: SkuId) -> Result<Option<SaleAudit>, StoreError> {
        // One read transaction: one WAL snapshot, so counters, orders and events agree.
        let mut tx = self.reader.begin().await.map_err(db_error)?;
        let sql = format!("SELECT {} FROM sales WHERE sku_id = ?", batch::SALE_COLUMNS);
        let Some(row) = sqlx::query(&sql)
            .bind(i(sku.0))
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
            .bind(i(sku.0))
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
            .bind(i(sku.0))
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
        let row = sqlx::query(
            "INSERT INTO reconcile_runs (sku_id, at_ms, \"trigger\", repair, ok, violations, \
             repairs, lost_orders, lost_resolutions, report) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(i(run.sku_id.0))
        .bind(run.at_ms)
        .bind(&run.trigger)
        .bind(run.repair)
        .bind(run.ok)
        .bind(run.violations)
        .bind(run.repairs.join("\n"))
        .bind(run.lost_orders.join("\n"))
        .bind(run.lost_resolutions.join("\n"))
        .bind(&run.report)
        .fetch_one(&self.writer)
        .await
        .map_err(db_error)?;
        id(&row, "id")
    }

    async fn reconcile_runs(
        &self,
        sku: Option<SkuId>,
        limit: usize,
    ) -> Result<Vec<ReconcileRun>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, sku_id, at_ms, \"trigger\", repair, ok, violations, repairs, \
             lost_orders, lost_resolutions, report FROM reconcile_runs WHERE (?1 IS NULL OR sku_id = ?1) \
             ORDER BY id DESC LIMIT ?2",
        )
        .bind(sku.map(|s| i(s.0)))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.reader)
        .await
        .map_err(db_error)?;
        rows.iter()
            .map(|r| {
                Ok(ReconcileRun {
                    id: id(r, "id")?,
                    sku_id: SkuId(id(r, "sku_id")?),
                    at_ms: get(r, "at_ms")?,
                    trigger: get(r, "trigger")?,
                    repair: get(r, "repair")?,
                    ok: get(r, "ok")?,
                    violations: get(r, "violations")?,
                    repairs: crate::rows::lines(&get::<String>(r, "repairs")?),
                    lost_orders: crate::rows::lines(&get::<String>(r, "lost_orders")?),
                    lost_resolutions: crate::rows::lines(&get::<String>(r, "lost_resolutions")?),
                    report: get(r, "report")?,
                })
            })
            .collect()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.reader)
            .await
            .map(|_| ())
            .map_err(db_error)
    }
}
