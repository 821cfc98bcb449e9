//! [`Store`] itself: its pools, reads and writes through them, transactions, connecting and
//! migrating; and the small SQL helpers every other file of the store uses.

use sqlx::{Pool, Transaction};

use flashsale_core::{Event, SkuId, StoreError};

use crate::backend::{Arg, Backend, Server};
use crate::rows::{self, db_error, SaleRow};
use crate::sql::{self, values_placeholders};

/// The system of record on the database `B`: a writer pool and a reader pool (the same pool
/// where the database has no single writer).
pub struct Store<B: Backend> {
    pub(crate) writer: Pool<B>,
    pub(crate) reader: Pool<B>,
    /// Whether the database is contracted to one row per purchase (`one_row`): once seen
    /// true it stays true (a contract is never undone); while false, every batch reads it
    /// again in its own transaction.
    pub(crate) one_row: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<B: Backend> Clone for Store<B> {
    fn clone(&self) -> Self {
        Store {
            writer: self.writer.clone(),
            reader: self.reader.clone(),
            one_row: self.one_row.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Store<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("database", &B::STORE)
            .finish_non_exhaustive()
    }
}

/// A transaction of the store.
pub(crate) type Tx<B> = Transaction<'static, B>;

pub(super) async fn begin<B: Backend>(
    pool: &Pool<B>,
    with: Option<&'static str>,
) -> Result<Tx<B>, StoreError> {
    match with {
        Some(statement) => pool.begin_with(statement).await,
        None => pool.begin().await,
    }
    .map_err(db_error)
}

/// The sale row in `tx`, locked where the database has row locks (SQLite's writer holds the
/// whole file): what a batch or a split of buckets reads first.
pub(super) async fn locked_sale<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
) -> Result<SaleRow, StoreError> {
    let sql = format!(
        "SELECT {} FROM sales WHERE sku_id = ?{}",
        sql::SALE_COLUMNS,
        B::DIALECT.lock_row
    );
    let rows = B::fetch(&mut **tx, &sql, &[Arg::Id(sku.0)]).await?;
    SaleRow::read(rows.first().ok_or(StoreError::SaleNotFound)?)
}

impl<B: Backend> Store<B> {
    pub(crate) fn new(writer: Pool<B>, reader: Pool<B>) -> Store<B> {
        Store {
            writer,
            reader,
            one_row: Default::default(),
        }
    }

    /// The read pool (tests, ad-hoc queries). On SQLite, never write through it.
    pub fn pool(&self) -> &Pool<B> {
        &self.reader
    }

    /// The writers' pool (SQLite: the single writer connection).
    pub fn writer(&self) -> &Pool<B> {
        &self.writer
    }

    /// Closes the pools (waits for connections to return).
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }

    /// Rows of a read through the read pool.
    pub(crate) async fn read(
        &self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Vec<B::Record>, StoreError> {
        let mut conn = self.reader.acquire().await.map_err(db_error)?;
        B::fetch(&mut *conn, sql, args).await
    }

    /// Every row of `table` (its columns `cols`) for one sale, oldest first.
    pub(super) async fn sale_rows(
        &self,
        table: &str,
        cols: &str,
        sku: SkuId,
    ) -> Result<Vec<B::Record>, StoreError> {
        let sql = format!("SELECT {cols} FROM {table} WHERE sku_id = ? ORDER BY id");
        self.read(&sql, &[Arg::Id(sku.0)]).await
    }

    /// A write outside a transaction; answers the rows it matched.
    pub(crate) async fn write(&self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let mut conn = self.writer.acquire().await.map_err(db_error)?;
        B::run(&mut *conn, sql, args).await
    }

    pub(crate) async fn begin_write(&self) -> Result<Tx<B>, StoreError> {
        begin(&self.writer, B::BEGIN_WRITE).await
    }
}

impl<B: Server> Store<B> {
    /// Connects a pool of 16 to `url` (`mysql://user:pass@host:port/db`,
    /// `postgres://user:pass@host:port/db`) and runs the migrations.
    pub async fn connect(url: &str) -> Result<Store<B>, StoreError> {
        Store::connect_with(url, 16).await
    }

    /// Like [`Store::connect`] with a pool of `max_connections`.
    pub async fn connect_with(url: &str, max_connections: u32) -> Result<Store<B>, StoreError> {
        let pool = sqlx::pool::PoolOptions::<B>::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let store = Store::new(pool.clone(), pool);
        store.migrate().await?;
        store.read_shape().await?;
        Ok(store)
    }

    /// Runs the pending migrations (idempotent), under the database's migration lock.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.writer.acquire().await.map_err(db_error)?;
        B::migrate_locked(&mut conn).await
    }
}

/// `head` limited to one sale's rows whose `pair` of columns is one of `n` pairs (binds:
/// sku_id, then the pairs).
pub(super) fn of_pairs(head: &str, pair: &str, n: usize) -> String {
    format!(
        "{head} WHERE sku_id = ? AND ({pair}) IN ({})",
        values_placeholders(n, 2)
    )
}

pub(super) fn events_of<R: crate::backend::Columns>(rows: &[R]) -> Result<Vec<Event>, StoreError> {
    rows.iter().map(rows::event).collect()
}
