//! [`SqliteStore`]: the embedded system of record over one SQLite file (WAL, synchronous=FULL).
//!
//! The backend of [`Store`]: its dialect (`sql::sqlite`), ids bound bit for bit as SQLite's
//! signed integers, and the gateway state only the embedded deployment keeps here
//! (blacklist, purchase tokens, risk settings, `put_sale`).
//!
//! Every write goes through ONE writer connection (a pool of one) and every write
//! transaction starts with `BEGIN IMMEDIATE`, so writes of this process queue in Rust instead
//! of failing with SQLITE_BUSY, and a transaction never has to upgrade a read lock. Reads use
//! a small pool of their own (WAL readers do not block the writer).
//! SQLite integers are signed: u64 ids and sequence numbers are stored bit-for-bit as i64.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::query::Query;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite};

use flashsale_core::{Counters, Sale, SkuId, StoreError, UserId};

use crate::backend::{as_is, bind_args, decoded_columns, sqlx_steps, Backend, Columns};
use crate::rows::{self, db_error};
use crate::sql::{self, Dialect};
use crate::store::Store;

/// The system of record in one SQLite file.
pub type SqliteStore = Store<Sqlite>;

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
const READERS: u32 = 4;

/// u64 → i64 bit-for-bit (SQLite has no unsigned integers).
fn i(v: u64) -> i64 {
    v as i64
}

/// i64 → u64 bit-for-bit, the inverse of [`i`].
fn u(v: i64) -> u64 {
    v as u64
}

bind_args!('q, Sqlite, SqliteArguments<'q>, id: |v| Ok::<i64, StoreError>(i(v)), small: |v: u32| v);

impl Backend for Sqlite {
    const STORE: &'static str = "SqliteStore";
    const DIALECT: &'static Dialect = &sql::sqlite::DIALECT;
    // The writer connection plus BEGIN IMMEDIATE is the lock on the sale row.
    const BEGIN_WRITE: Option<&'static str> = Some("BEGIN IMMEDIATE");
    // In WAL mode, NORMAL appends a commit to the WAL without fsync: it survives a crash of
    // the process, and the next FULL commit's fsync of the WAL makes it durable too. FULL is
    // what the connect options set (every other write).
    const UNSYNCED: Option<(&'static str, &'static str)> =
        Some(("PRAGMA synchronous = NORMAL", "PRAGMA synchronous = FULL"));
    // A read transaction is one WAL snapshot, so the driver's BEGIN will do.
    const SHORT_WAY: bool = false;
    type Record = SqliteRow;

    sqlx_steps!(bind, as_is);
}

impl Columns for SqliteRow {
    decoded_columns!(text: String, int: i64, small: u32, flag: bool);
    fn uint(&self, col: &str) -> Result<u64, StoreError> {
        self.try_get::<i64, _>(col).map(u).map_err(db_error)
    }
    fn opt_uint(&self, col: &str) -> Result<Option<u64>, StoreError> {
        let v: Option<i64> = self.try_get(col).map_err(db_error)?;
        Ok(v.map(u))
    }
}

impl Store<Sqlite> {
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
        // A connection to a file in this process cannot drop as a network one can: the pools
        // do not ping a connection before handing it out (one round trip to its thread less
        // per use).
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.clone())
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        crate::compat::run_migrations::<Sqlite>(
            &mut *writer.acquire().await.map_err(db_error)?,
            sqlx::migrate!("./migrations/sqlite"),
        )
        .await?;
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(READERS)
                .test_before_acquire(false)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(opts)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?
        };
        let store = Store::new(writer, reader);
        store.read_shape().await?;
        Ok(store)
    }

    /// Every row `sql` selects (no arguments), on a reader.
    async fn read_all(&self, sql: &str) -> Result<Vec<SqliteRow>, StoreError> {
        sqlx::query(sql)
            .fetch_all(&self.reader)
            .await
            .map_err(db_error)
    }

    /// Runs one statement on the writer.
    async fn write_one<'q>(
        &self,
        q: Query<'q, Sqlite, SqliteArguments<'q>>,
    ) -> Result<(), StoreError> {
        q.execute(&self.writer).await.map_err(db_error)?;
        Ok(())
    }

    /// Blacklist entries as `(kind, value)`, kind `user` or `ip` (the gateway's cache).
    pub async fn blacklist(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = self.read_all("SELECT kind, value FROM blacklist").await?;
        let entry = |r: &SqliteRow| (r.get("kind"), r.get("value"));
        Ok(rows.iter().map(entry).collect())
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
            let q = sqlx::query("DELETE FROM blacklist WHERE kind = ? AND value = ?");
            q.bind(kind).bind(value)
        };
        self.write_one(q).await
    }

    /// Skus of the sales that require a purchase token (anti-scalping).
    pub async fn token_sales(&self) -> Result<Vec<SkuId>, StoreError> {
        let sql = "SELECT sku_id FROM sale_guards WHERE purchase_token = 1";
        let rows = self.read_all(sql).await?;
        Ok(rows.iter().map(|r| SkuId(u(r.get("sku_id")))).collect())
    }

    /// Turns the purchase-token requirement of a sale on or off; idempotent.
    pub async fn set_token_sale(&self, sku: SkuId, on: bool) -> Result<(), StoreError> {
        let q = sqlx::query(
            "INSERT INTO sale_guards (sku_id, purchase_token) VALUES (?, ?) \
             ON CONFLICT (sku_id) DO UPDATE SET purchase_token = excluded.purchase_token",
        );
        self.write_one(q.bind(i(sku.0)).bind(i64::from(on))).await
    }

    /// Users on the risk allowlist (admitted by the fallback rule `allowlist`).
    pub async fn risk_allowlist(&self) -> Result<Vec<UserId>, StoreError> {
        let rows = self.read_all("SELECT user_id FROM risk_allowlist").await?;
        Ok(rows.iter().map(|r| UserId(u(r.get("user_id")))).collect())
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
        self.write_one(q).await
    }

    /// Sales with a fallback rule of their own, as `(sku, rule)`.
    pub async fn risk_fallbacks(&self) -> Result<Vec<(SkuId, String)>, StoreError> {
        let sql = "SELECT sku_id, risk_fallback FROM sale_guards WHERE risk_fallback IS NOT NULL";
        let rows = self.read_all(sql).await?;
        let rule = |r: &SqliteRow| (SkuId(u(r.get("sku_id"))), r.get("risk_fallback"));
        Ok(rows.iter().map(rule).collect())
    }

    /// Sets a sale's own fallback rule (`allow`, `deny`, `allowlist`), or drops it (`None`).
    pub async fn set_risk_fallback(
        &self,
        sku: SkuId,
        rule: Option<&str>,
    ) -> Result<(), StoreError> {
        let q = sqlx::query(
            "INSERT INTO sale_guards (sku_id, risk_fallback) VALUES (?, ?) \
             ON CONFLICT (sku_id) DO UPDATE SET risk_fallback = excluded.risk_fallback",
        );
        self.write_one(q.bind(i(sku.0)).bind(rule)).await
    }

    /// Creates or overwrites a sale's definition, state, counters (`applied_seq` =
    /// `counters.seq`) and epoch, leaving its orders and events alone. For the embedded
    /// ledger's `warm` (the operator's word: refused unless the sale sold nothing, or forced).
    /// Drops the sale's bucket rows, in the same transaction: the embedded ledger runs a
    /// bucketed sale as one book on its sale row, so no bucket row may take its events.
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
        let upsert = sqlx::query(
            "INSERT INTO sales (sku_id, name, total_stock, available, reserved, sold, applied_seq, \
             epoch, per_user_limit, mode, payment_timeout_ms, starts_at_ms, ends_at_ms, state, \
             buckets, admission, admission_opens_at_ms, draw_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (sku_id) DO UPDATE SET name = excluded.name, \
             total_stock = excluded.total_stock, available = excluded.available, \
             reserved = excluded.reserved, sold = excluded.sold, \
             applied_seq = excluded.applied_seq, epoch = excluded.epoch, \
             per_user_limit = excluded.per_user_limit, mode = excluded.mode, \
             payment_timeout_ms = excluded.payment_timeout_ms, \
             starts_at_ms = excluded.starts_at_ms, ends_at_ms = excluded.ends_at_ms, \
             state = excluded.state, buckets = excluded.buckets, \
             admission = excluded.admission, \
             admission_opens_at_ms = excluded.admission_opens_at_ms, \
             draw_at_ms = excluded.draw_at_ms, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        );
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)?;
        upsert
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
            .bind(sale.buckets)
            .bind(sale.admission.mode.as_str())
            .bind(sale.admission.admission_opens_at_ms)
            .bind(sale.admission.draw_at_ms)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        sqlx::query("DELETE FROM sale_buckets WHERE sku_id = ?")
            .bind(i(sale.sku_id.0))
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(db_error)
    }
}
