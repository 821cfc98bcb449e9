//! [`Store`]: the system of record's algorithm, written once over a [`Backend`]. Every
//! `OrderStore` method lives here: the apply of a batch (read the locked sale row and the
//! stored events the batch names, split off duplicates and fenced events, fold the fresh
//! ones, write the plan under the guarded counter update), audits, fenced events, dead
//! letters, reconcile runs. A backend (`mysql`, `sqlite`, `postgres`) adds how it connects
//! and migrates, and what only it has.

use async_trait::async_trait;
use sqlx::{Pool, Transaction};

use flashsale_core::{
    ApplyReport, BucketRow, Counters, DeadLetter, Event, EventKind, HotOrder, OrderNo, OrderStore,
    ReconcileRun, Sale, SaleAudit, SaleState, SkuId, StoreError, StoredSale, TransferApplied,
    TransferEvent, TransferSide,
};

use flashsale_core::buckets::{bucket_epoch, bucket_of_epoch, split_stock};

use crate::backend::{signed, Arg, Backend, Columns as _, Server};
use crate::batch::{self, Head, KnownOrder, Plan, Split, StoredEvent, CHUNK_ROWS};
use crate::rows::{self, db_error, SaleRow};
use crate::sql::{self, list_placeholders, values_placeholders};

/// The system of record on the database `B`: a writer pool and a reader pool (the same pool
/// where the database has no single writer).
pub struct Store<B: Backend> {
    pub(crate) writer: Pool<B>,
    pub(crate) reader: Pool<B>,
}

impl<B: Backend> Clone for Store<B> {
    fn clone(&self) -> Self {
        Store {
            writer: self.writer.clone(),
            reader: self.reader.clone(),
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

type Tx<B> = Transaction<'static, B>;

async fn begin<B: Backend>(
    pool: &Pool<B>,
    with: Option<&'static str>,
) -> Result<Tx<B>, StoreError> {
    match with {
        Some(statement) => pool.begin_with(statement).await,
        None => pool.begin().await,
    }
    .map_err(db_error)
}

/// Where a batch applies: the sale row, or the row of the one bucket whose events it holds
/// (a bucketed sale). Its epoch is the fence, its counters what the fold starts from.
#[derive(Debug, Clone, Copy)]
struct Target {
    sku: SkuId,
    /// `None`: the sale row (a sale of one bucket, or a bucketed sale the embedded ledger
    /// runs as one book); `Some(b)`: bucket b's row, and the sale row follows it.
    bucket: Option<u16>,
    epoch: u64,
    head: Head,
}

impl Target {
    /// The bucket its events are stored under (0: a sale's own, as before buckets).
    fn events_bucket(&self) -> u16 {
        self.bucket.unwrap_or(0)
    }
}

/// Whether a split batch is a spike's: fresh deductions only, nothing else.
fn spike(split: &Split<'_>) -> bool {
    split.fenced.is_empty()
        && split.duplicates == 0
        && !split.fresh.is_empty()
        && split.fresh.iter().all(|e| e.kind == EventKind::Deducted)
}

impl<B: Backend> Store<B> {
    pub(crate) fn new(writer: Pool<B>, reader: Pool<B>) -> Store<B> {
        Store { writer, reader }
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
    async fn sale_rows(
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

    /// Whether a dead letter has paused the sale's stream.
    pub async fn stream_paused(&self, sku: SkuId) -> Result<bool, StoreError> {
        let rows = self
            .read(
                "SELECT stream_paused FROM sales WHERE sku_id = ?",
                &[Arg::Id(sku.0)],
            )
            .await?;
        rows.first()
            .ok_or(StoreError::SaleNotFound)?
            .flag("stream_paused")
    }

    /// Pauses or resumes the sale's stream (an operator resumes after fixing a dead letter).
    pub async fn set_stream_paused(&self, sku: SkuId, paused: bool) -> Result<(), StoreError> {
        let sql = format!(
            "UPDATE sales SET stream_paused = ?{} WHERE sku_id = ?",
            B::DIALECT.touch
        );
        let matched = self
            .write(&sql, &[Arg::Flag(paused), Arg::Id(sku.0)])
            .await?;
        // Matched rows (MySQL: sqlx sets CLIENT_FOUND_ROWS): 0 means no such sale.
        if matched == 0 {
            return Err(StoreError::SaleNotFound);
        }
        Ok(())
    }

    /// The events of one bucket with `from_seq <= seq <= to_seq`, by seq (bucket 0 of a sale
    /// of one bucket: all its events).
    pub async fn bucket_events_between(
        &self,
        sku: SkuId,
        bucket: u16,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<Event>, StoreError> {
        // Sequence numbers stay far below i64::MAX; clamp the bounds so every backend's
        // column type holds them.
        let clamp = |seq: u64| seq.min(i64::MAX as u64);
        let sql = format!(
            "SELECT {} FROM stock_events WHERE sku_id = ? AND bucket = ? AND seq >= ? \
             AND seq <= ? ORDER BY seq",
            sql::EVENT_COLUMNS
        );
        let args = [
            Arg::Id(sku.0),
            Arg::Small(u32::from(bucket)),
            Arg::Id(clamp(from_seq)),
            Arg::Id(clamp(to_seq)),
        ];
        events_of(&self.read(&sql, &args).await?)
    }

    /// A sale's bucket count, `None` for no such sale. Fixed when the sale is created, so it
    /// may be read outside the transaction that depends on it.
    async fn bucket_count(&self, sku: SkuId) -> Result<Option<u16>, StoreError> {
        let sql = "SELECT buckets FROM sales WHERE sku_id = ?";
        let rows = self.read(sql, &[Arg::Id(sku.0)]).await?;
        let count = |r: &B::Record| {
            let n = r.small("buckets")?;
            u16::try_from(n).map_err(|_| StoreError::Internal(format!("buckets: {n}")))
        };
        rows.first().map(count).transpose()
    }

    /// Inserts a sale (binds of `sql::INSERT_SALE`) and its buckets' rows, `shares` their
    /// stock, in one transaction.
    async fn insert_bucketed(
        &self,
        sku: SkuId,
        sale_args: &[Arg<'_>],
        shares: Vec<u64>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        B::run(&mut *tx, sql::INSERT_SALE, sale_args).await?;
        insert_bucket_rows::<B>(&mut tx, sku, &shares).await?;
        tx.commit().await.map_err(db_error)
    }

    /// `split_buckets` in one transaction: rows there already are kept; a sale without rows
    /// gets them only while it has not sold (its stock then splits as on creation).
    async fn split_fresh(&self, sku: SkuId) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let sql = format!(
            "SELECT {} FROM sales WHERE sku_id = ?{}",
            sql::SALE_COLUMNS,
            B::DIALECT.lock_row
        );
        let rows = B::fetch(&mut *tx, &sql, &[Arg::Id(sku.0)]).await?;
        let stored = SaleRow::read(rows.first().ok_or(StoreError::SaleNotFound)?)?.into_stored()?;
        let n = stored.sale.buckets;
        let sql = "SELECT COUNT(*) AS n FROM sale_buckets WHERE sku_id = ?";
        let count = B::fetch(&mut *tx, sql, &[Arg::Id(sku.0)]).await?;
        let have = count.first().map(|r| r.int("n")).transpose()?.unwrap_or(0);
        if have == i64::from(n) {
            return tx.rollback().await.map_err(db_error);
        }
        if have != 0 || n <= 1 || stored.counters != stored.sale.fresh_counters() {
            return Err(StoreError::Internal(format!(
                "sale {sku} of {n} buckets has {have} bucket rows and counters {:?}: it cannot \
                 be split now",
                stored.counters
            )));
        }
        insert_bucket_rows::<B>(&mut tx, sku, &split_stock(stored.sale.total_stock, n)).await?;
        tx.commit().await.map_err(db_error)
    }

    /// `take_epoch` of a sale of `n > 1` buckets: the sale's compare and set and, when it
    /// matched, every bucket's epoch `E·n + bucket`, in one transaction.
    async fn take_bucketed_epoch(
        &self,
        sku: SkuId,
        current: u64,
        n: u16,
    ) -> Result<Option<u64>, StoreError> {
        let mut tx = self.begin_write().await?;
        let args = [
            Arg::Int(flashsale_core::clock::now_ms()),
            Arg::Id(sku.0),
            Arg::Id(current),
        ];
        if B::run(&mut *tx, sql::TAKE_EPOCH, &args).await? != 1 {
            return Ok(None);
        }
        let taken = current + 1;
        let args = [
            Arg::Id(bucket_epoch(taken, 0, n)),
            Arg::Int(flashsale_core::clock::now_ms()),
            Arg::Id(sku.0),
        ];
        B::run(&mut *tx, sql::TAKE_BUCKET_EPOCHS, &args).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(Some(taken))
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
        let mut tx = self.begin_write().await?;
        // A row lock where the database has one; SQLite's writer holds the whole file.
        let sql = format!(
            "SELECT {} FROM sales WHERE sku_id = ?{}",
            sql::SALE_COLUMNS,
            B::DIALECT.lock_row
        );
        let rows = B::fetch(&mut *tx, &sql, &[Arg::Id(sku.0)]).await?;
        let sale = SaleRow::read(rows.first().ok_or(StoreError::SaleNotFound)?)?;
        let target = target::<B>(&mut tx, sku, &sale, events).await?;
        let applied_seq = target.head.counters.seq;
        let seqs = batch::applied_seqs(applied_seq, events);
        let stored = stored_events::<B>(&mut tx, &target, &seqs).await?;
        let split = batch::split(sku, target.epoch, applied_seq, events, &stored)?;
        if short && spike(&split) {
            let plan = batch::fold(sku, target.head, &split.fresh, Vec::new());
            if plan.report.rejected.is_empty() {
                return match write_plan::<B>(&mut tx, &target, &plan).await {
                    Ok(()) => {
                        tx.commit().await.map_err(db_error)?;
                        Ok(Some(plan.report))
                    }
                    Err(StoreError::Internal(why)) => {
                        tracing::debug!(%sku, %why, "short apply refused; the long way decides");
                        tx.rollback().await.map_err(db_error)?;
                        Ok(None)
                    }
                    Err(e) => Err(e),
                };
            }
        }
        let report = settle::<B>(&mut tx, &target, split).await?;
        tx.commit().await.map_err(db_error)?;
        batch::alert(sku, &report);
        Ok(Some(report))
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
        Ok(store)
    }

    /// Runs the pending migrations (idempotent), under the database's migration lock.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.writer.acquire().await.map_err(db_error)?;
        B::migrate_locked(&mut conn).await
    }
}

/// The long way's writes: keeps the fenced events, reads the orders the fresh ones name,
/// folds and writes the plan (no commit).
async fn settle<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    split: Split<'_>,
) -> Result<ApplyReport, StoreError> {
    let sku = target.sku;
    write_fenced::<B>(tx, &split.fenced).await?;
    batch::alert_fenced(sku, &split.fenced);
    let fenced: Vec<Event> = split.fenced.iter().map(|e| (*e).clone()).collect();
    let (fresh, duplicates) = (split.fresh, split.duplicates);
    if fresh.is_empty() {
        return Ok(ApplyReport {
            duplicates,
            fenced,
            ..ApplyReport::default()
        });
    }
    let (nos, keys) = batch::lookups(&fresh);
    let known = known_orders::<B>(tx, sku, &nos, &keys).await?;
    let mut plan = batch::fold(sku, target.head, &fresh, known);
    write_plan::<B>(tx, target, &plan).await?;
    // An event the guard refused was accepted by the hot copy: a promise the database will
    // never keep. Kept with the fenced ones, so the reconciler reports it lost by order
    // number, once, as it does for an event the fence refused.
    let refused: Vec<&Event> = (plan.events.iter())
        .filter(|(_, rejected)| *rejected)
        .map(|(e, _)| *e)
        .collect();
    write_fenced::<B>(tx, &refused).await?;
    plan.report.duplicates = duplicates;
    plan.report.fenced = fenced;
    Ok(plan.report)
}

/// The row a batch applies to, locked after the sale row: the sale row for a sale of one
/// bucket; for a bucketed sale, the row of its first event's bucket (`epoch % n`), and every
/// event must be of that bucket. A bucketed sale without bucket rows is one the embedded
/// ledger runs as one book (`SqliteStore::put_sale` drops them): its sale row, as for one
/// bucket.
async fn target<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
    sale: &SaleRow,
    events: &[Event],
) -> Result<Target, StoreError> {
    let head = Head {
        counters: sale.counters()?,
        mode: sale.mode()?,
        sale_available: None,
    };
    let n = sale.bucket_count()?;
    let on_sale = Target {
        sku,
        bucket: None,
        epoch: sale.epoch,
        head,
    };
    let Some(first) = events.first().filter(|_| n > 1) else {
        return Ok(on_sale);
    };
    let bucket = bucket_of_epoch(first.epoch, n);
    let Some(row) = locked_bucket::<B>(tx, sku, bucket).await? else {
        return Ok(on_sale);
    };
    batch::one_bucket(events, n, bucket)?;
    Ok(Target {
        sku,
        bucket: Some(bucket),
        epoch: row.epoch,
        head: Head {
            counters: row.counters,
            mode: head.mode,
            sale_available: Some(head.counters.available),
        },
    })
}

/// A bucket's row, locked where the database has row locks (after its sale row, always in
/// that order, so two writers never wait for each other crosswise).
async fn locked_bucket<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
    bucket: u16,
) -> Result<Option<BucketRow>, StoreError> {
    let sql = format!(
        "SELECT {} FROM sale_buckets WHERE sku_id = ? AND bucket = ?{}",
        sql::BUCKET_COLUMNS,
        B::DIALECT.lock_row
    );
    let args = [Arg::Id(sku.0), Arg::Small(u32::from(bucket))];
    let rows = B::fetch(&mut **tx, &sql, &args).await?;
    rows.first().map(rows::bucket_row).transpose()
}

/// The orders already stored that the batch names, by order number or request key.
async fn known_orders<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
    nos: &[String],
    keys: &[(u64, String)],
) -> Result<Vec<KnownOrder>, StoreError> {
    let cols = sql::KNOWN_ORDER_COLUMNS;
    let mut found = Vec::new();
    for chunk in nos.chunks(CHUNK_ROWS) {
        let sql = format!(
            "SELECT {cols} FROM orders WHERE order_no IN ({})",
            list_placeholders(chunk.len())
        );
        let args: Vec<Arg<'_>> = chunk.iter().map(|no| Arg::Text(no)).collect();
        found.extend(B::fetch(&mut **tx, &sql, &args).await?);
    }
    for chunk in keys.chunks(CHUNK_ROWS) {
        let head = format!("SELECT {cols} FROM orders");
        let sql = of_pairs(&head, "user_id, request_id", chunk.len());
        let pairs = chunk.iter().flat_map(|(u, r)| [Arg::Id(*u), Arg::Text(r)]);
        let args: Vec<Arg<'_>> = std::iter::once(Arg::Id(sku.0)).chain(pairs).collect();
        found.extend(B::fetch(&mut **tx, &sql, &args).await?);
    }
    found.iter().map(rows::known_order).collect()
}

/// `head` limited to one sale's rows whose `pair` of columns is one of `n` pairs (binds:
/// sku_id, then the pairs).
fn of_pairs(head: &str, pair: &str, n: usize) -> String {
    format!(
        "{head} WHERE sku_id = ? AND ({pair}) IN ({})",
        values_placeholders(n, 2)
    )
}

/// The stored identity of the applied events at `seqs` of the target's bucket (seqs are a
/// bucket's own).
async fn stored_events<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    seqs: &[u64],
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stored = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(CHUNK_ROWS) {
        let sql = format!(
            "SELECT seq, epoch, kind, order_no FROM stock_events \
             WHERE sku_id = ? AND bucket = ? AND seq IN ({})",
            list_placeholders(chunk.len())
        );
        let bucket = u32::from(target.events_bucket());
        let mut args = vec![Arg::Id(target.sku.0), Arg::Small(bucket)];
        args.extend(chunk.iter().map(|seq| Arg::Id(*seq)));
        for row in B::fetch(&mut **tx, &sql, &args).await? {
            stored.push(rows::stored_event(&row)?);
        }
    }
    Ok(stored)
}

/// An event's columns in `sql::EVENT_COLUMNS` order (stock_events, fenced_events);
/// `order_no` is the event's order number as text.
fn event_args<'a>(args: &mut Vec<Arg<'a>>, e: &'a Event, order_no: &'a str) {
    args.extend([
        Arg::Id(e.sku_id.0),
        Arg::Id(e.epoch),
        Arg::Id(e.seq),
        Arg::Text(e.kind.as_str()),
        Arg::Text(order_no),
        Arg::Text(e.request_id.as_str()),
        Arg::Id(e.user_id.0),
        Arg::Small(e.quantity),
        Arg::Int(e.at_ms),
        Arg::Int(e.deadline_ms),
    ]);
}

/// Keeps events the fence refused, once each.
async fn write_fenced<B: Backend>(tx: &mut Tx<B>, fenced: &[&Event]) -> Result<(), StoreError> {
    let (into, tail) = B::DIALECT.insert_ignore;
    for chunk in fenced.chunks(CHUNK_ROWS) {
        let sql = format!(
            "{into}{}{}{tail}",
            sql::FENCED_INTO,
            values_placeholders(chunk.len(), sql::FENCED_COLS)
        );
        let nos: Vec<String> = chunk.iter().map(|e| e.order_no.to_string()).collect();
        let mut args = Vec::with_capacity(chunk.len() * sql::FENCED_COLS);
        for (e, no) in chunk.iter().zip(&nos) {
            event_args(&mut args, e, no);
        }
        B::run(&mut **tx, &sql, &args).await?;
    }
    Ok(())
}

/// Writes a plan: its events, new orders and status changes, then the guarded counter update
/// (an `Internal` error when it matches no row: nothing of the batch may commit then).
async fn write_plan<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    plan: &Plan<'_>,
) -> Result<(), StoreError> {
    let sku = target.sku;
    write_events::<B>(tx, target.bucket, &plan.events).await?;
    for chunk in plan.new_orders.chunks(CHUNK_ROWS) {
        let sql = format!(
            "{}{}",
            sql::INSERT_ORDERS,
            values_placeholders(chunk.len(), sql::ORDER_COLS)
        );
        let mut args = Vec::with_capacity(chunk.len() * sql::ORDER_COLS);
        for o in chunk {
            args.extend([
                Arg::Text(&o.order_no),
                Arg::Id(sku.0),
                Arg::Id(o.user_id),
                Arg::Text(&o.request_id),
                Arg::Small(o.quantity),
                Arg::Text(o.status.as_str()),
                Arg::Int(o.deadline_ms),
                Arg::Int(o.created_at_ms),
                Arg::Int(o.updated_at_ms),
            ]);
        }
        B::run(&mut **tx, &sql, &args).await?;
    }
    for u in &plan.updates {
        let sql = format!(
            "UPDATE orders SET status = ?, updated_at_ms = ? WHERE sku_id = ? AND order_no IN ({})",
            list_placeholders(u.order_nos.len())
        );
        let mut args = vec![
            Arg::Text(u.status.as_str()),
            Arg::Int(u.at_ms),
            Arg::Id(sku.0),
        ];
        args.extend(u.order_nos.iter().map(|no| Arg::Text(no)));
        B::run(&mut **tx, &sql, &args).await?;
    }
    guarded_update::<B>(tx, target, plan.after).await?;
    let moved = (target.head.counters, plan.after, target.bucket.is_some());
    let at_ms = plan.events.last().map_or(0, |(e, _)| e.at_ms);
    crate::notices::note_sold_out::<B>(tx, target.sku, moved, at_ms).await
}

/// Inserts a plan's events: a sale's own with `INSERT_EVENTS` (bucket 0, the default), a
/// bucket's with its number.
async fn write_events<B: Backend>(
    tx: &mut Tx<B>,
    bucket: Option<u16>,
    events: &[(&Event, bool)],
) -> Result<(), StoreError> {
    let (insert, cols) = match bucket {
        None => (sql::INSERT_EVENTS, sql::EVENT_COLS),
        Some(_) => (sql::INSERT_BUCKET_EVENTS, sql::BUCKET_EVENT_COLS),
    };
    for chunk in events.chunks(CHUNK_ROWS) {
        let sql = format!("{insert}{}", values_placeholders(chunk.len(), cols));
        let nos: Vec<String> = chunk.iter().map(|(e, _)| e.order_no.to_string()).collect();
        let mut args = Vec::with_capacity(chunk.len() * cols);
        for ((e, rejected), no) in chunk.iter().zip(&nos) {
            if let Some(b) = bucket {
                args.push(Arg::Small(u32::from(b)));
            }
            event_args(&mut args, e, no);
            args.push(Arg::Flag(*rejected));
        }
        B::run(&mut **tx, &sql, &args).await?;
    }
    Ok(())
}

/// One row per bucket of `sku`, bucket b holding `shares[b]` units (epoch 0, nothing
/// applied).
async fn insert_bucket_rows<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
    shares: &[u64],
) -> Result<(), StoreError> {
    let sql = format!(
        "{}{}",
        sql::INSERT_BUCKETS,
        values_placeholders(shares.len(), sql::BUCKET_COLS)
    );
    let mut args = Vec::with_capacity(shares.len() * sql::BUCKET_COLS);
    for (bucket, share) in (0u32..).zip(shares) {
        let share = signed(*share)?;
        args.extend([
            Arg::Id(sku.0),
            Arg::Small(bucket),
            Arg::Int(share),
            Arg::Int(share),
        ]);
    }
    B::run(&mut **tx, &sql, &args).await?;
    Ok(())
}

/// Moves the target's counters from those the fold started from to `new`
/// (`sql::GUARDED_UPDATE`, or `sql::BUCKET_GUARDED_UPDATE` and the sale row by the same
/// change).
async fn guarded_update<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    new: Counters,
) -> Result<(), StoreError> {
    let (sku, old) = (target.sku, target.head.counters);
    let mut args = vec![
        Arg::Int(signed(new.available)?),
        Arg::Int(signed(new.reserved)?),
        Arg::Int(signed(new.sold)?),
        Arg::Id(new.seq),
        Arg::Id(sku.0),
    ];
    let statement = match target.bucket {
        None => sql::GUARDED_UPDATE,
        Some(b) => {
            args.push(Arg::Small(u32::from(b)));
            sql::BUCKET_GUARDED_UPDATE
        }
    };
    args.extend([
        Arg::Id(target.epoch),
        Arg::Id(old.seq),
        Arg::Int(signed(old.available)?),
        Arg::Int(signed(old.reserved)?),
        Arg::Int(signed(old.sold)?),
        Arg::Int(signed(new.available)?),
        Arg::Int(signed(new.reserved)?),
        Arg::Int(signed(new.sold)?),
    ]);
    // Matched rows: 1 when the guard matched, whatever changed.
    if B::run(&mut **tx, statement, &args).await? != 1 {
        return Err(StoreError::Internal(format!(
            "guarded counter update of sku {sku} bucket {:?} matched no row (applied_seq {})",
            target.bucket, old.seq
        )));
    }
    match target.bucket {
        None => Ok(()),
        Some(_) => add_to_sale::<B>(tx, sku, old, new).await,
    }
}

/// Moves a bucketed sale's row by its bucket's change from `old` to `new`.
async fn add_to_sale<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
    old: Counters,
    new: Counters,
) -> Result<(), StoreError> {
    let change = |new: u64, old: u64| Ok::<_, StoreError>(Arg::Int(signed(new)? - signed(old)?));
    let args = [
        change(new.available, old.available)?,
        change(new.reserved, old.reserved)?,
        change(new.sold, old.sold)?,
        Arg::Id(sku.0),
    ];
    if B::run(&mut **tx, sql::ADD_TO_SALE, &args).await? != 1 {
        return Err(StoreError::Internal(format!(
            "the counters of sku {sku} did not follow its bucket's"
        )));
    }
    Ok(())
}

/// What a transfer side must be before the store looks at it (the CHECKs refuse it too, but
/// MySQL's `INSERT IGNORE` would turn a refusal into a skipped row).
fn check_transfer(t: &TransferEvent) -> Result<(), StoreError> {
    let id_ok = (1..=TRANSFER_ID_LEN_MAX).contains(&t.id.len()) && t.id.is_ascii();
    if id_ok && t.from != t.to && t.units > 0 {
        return Ok(());
    }
    Err(StoreError::Internal(format!(
        "bad transfer side of sku {}: id {:?}, {} → {}, {} units",
        t.sku_id, t.id, t.from, t.to, t.units
    )))
}

/// The longest transfer id (`<source epoch>.<n>`) stored (`stock_transfers.transfer_id`).
const TRANSFER_ID_LEN_MAX: usize = 40;

/// Locks the sale row, then the row of the bucket the side moves; refuses a sale of one
/// bucket (transfers exist only between buckets) and one without bucket rows.
async fn locked_transfer_bucket<B: Backend>(
    tx: &mut Tx<B>,
    t: &TransferEvent,
) -> Result<BucketRow, StoreError> {
    let sql = format!(
        "SELECT buckets FROM sales WHERE sku_id = ?{}",
        B::DIALECT.lock_row
    );
    let rows = B::fetch(&mut **tx, &sql, &[Arg::Id(t.sku_id.0)]).await?;
    let n = rows
        .first()
        .ok_or(StoreError::SaleNotFound)?
        .small("buckets")?;
    let refused = |why: &str| {
        StoreError::Internal(format!(
            "transfer {} {} of sku {} ({n} buckets, {} → {}): {why}",
            t.id,
            t.side.as_str(),
            t.sku_id,
            t.from,
            t.to
        ))
    };
    if n <= 1 || u32::from(t.from.max(t.to)) >= n {
        return Err(refused("no such buckets"));
    }
    locked_bucket::<B>(tx, t.sku_id, t.bucket())
        .await?
        .ok_or_else(|| refused("the sale has no bucket rows"))
}

/// Stores a side of the bucket's epoch once and moves the bucket's total and available by
/// it; a side stored before is a redelivery. A side kept as fenced under the key (a copy
/// replaced before its side was stored) is taken over: the new copy applied the same side
/// again, and this one counts.
async fn move_stock<B: Backend>(
    tx: &mut Tx<B>,
    t: &TransferEvent,
    row: &BucketRow,
) -> Result<TransferApplied, StoreError> {
    if insert_transfer::<B>(tx, t, false).await? == 0 && !take_over_fenced::<B>(tx, t).await? {
        return Ok(TransferApplied::Duplicate);
    }
    let delta = t.units_delta();
    let available = signed(row.counters.available)?;
    if available.checked_add(delta).is_none_or(|a| a < 0) {
        return Err(StoreError::Internal(format!(
            "transfer {} out of sku {} bucket {}: {} units, {available} available",
            t.id, t.sku_id, row.bucket, t.units
        )));
    }
    let args = [
        Arg::Int(delta),
        Arg::Int(delta),
        Arg::Id(t.sku_id.0),
        Arg::Small(u32::from(row.bucket)),
        Arg::Id(t.epoch),
        Arg::Int(delta),
    ];
    if B::run(&mut **tx, sql::MOVE_BUCKET_STOCK, &args).await? != 1 {
        return Err(StoreError::Internal(format!(
            "transfer {} of sku {}: the bucket {} update matched no row",
            t.id, t.sku_id, row.bucket
        )));
    }
    Ok(TransferApplied::Applied)
}

/// Inserts a side unless its key is stored; answers how many rows it inserted (0 or 1).
async fn insert_transfer<B: Backend>(
    tx: &mut Tx<B>,
    t: &TransferEvent,
    fenced: bool,
) -> Result<u64, StoreError> {
    let (into, tail) = B::DIALECT.insert_ignore;
    let sql = format!("{into}{}{tail}", sql::TRANSFER_INTO);
    let args = [
        Arg::Id(t.sku_id.0),
        Arg::Text(&t.id),
        Arg::Text(t.side.as_str()),
        Arg::Id(t.epoch),
        Arg::Small(u32::from(t.from)),
        Arg::Small(u32::from(t.to)),
        Arg::Id(t.units),
        Arg::Int(t.at_ms),
        Arg::Flag(fenced),
    ];
    // Inserted rows (MySQL's found rows count only for UPDATE).
    B::run(&mut **tx, &sql, &args).await
}

/// A side whose key is stored: false for a redelivery (the stored side is the same move); true
/// when the stored side was fenced and is the same transfer (buckets and units), now
/// replaced by this one, applied; another side under the same key is a bug of the ledger,
/// refused.
async fn take_over_fenced<B: Backend>(
    tx: &mut Tx<B>,
    t: &TransferEvent,
) -> Result<bool, StoreError> {
    let sql = format!(
        "SELECT {} FROM stock_transfers WHERE sku_id = ? AND transfer_id = ? AND side = ?",
        sql::TRANSFER_COLUMNS
    );
    let key = [
        Arg::Id(t.sku_id.0),
        Arg::Text(&t.id),
        Arg::Text(t.side.as_str()),
    ];
    let rows = B::fetch(&mut **tx, &sql, &key).await?;
    let stored = match rows.first() {
        Some(r) => Some((rows::transfer(r)?, r.flag("fenced")?)),
        None => None,
    };
    let same_move = |s: &TransferEvent| (s.from, s.to, s.units) == (t.from, t.to, t.units);
    match stored {
        // The same move under its key: a redelivery, whatever its time. A rebuild stores a
        // side its copy lost with the other side's time, and the original, read from the old
        // stream before the loss, may still arrive.
        Some((stored, false)) if same_move(&stored) => Ok(false),
        Some((stored, true)) if same_move(&stored) => {
            let sql = "UPDATE stock_transfers SET epoch = ?, at_ms = ?, fenced = FALSE \
                WHERE sku_id = ? AND transfer_id = ? AND side = ? AND fenced = TRUE";
            let [sku, id, side] = key;
            let args = [Arg::Id(t.epoch), Arg::Int(t.at_ms), sku, id, side];
            Ok(B::run(&mut **tx, sql, &args).await? == 1)
        }
        stored => Err(StoreError::Internal(format!(
            "transfer side {t:?} not stored; under its key: {stored:?}"
        ))),
    }
}

/// A bucketed sale's bucket rows and applied transfer sides (by id, out before in), in the
/// audit's snapshot. Sorted here, not by the database: collations order ids differently.
async fn audit_buckets<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
) -> Result<(Vec<BucketRow>, Vec<TransferEvent>), StoreError> {
    let sql = format!(
        "SELECT {} FROM sale_buckets WHERE sku_id = ? ORDER BY bucket",
        sql::BUCKET_COLUMNS
    );
    let rows = B::fetch(&mut **tx, &sql, &[Arg::Id(sku.0)]).await?;
    let buckets = rows
        .iter()
        .map(rows::bucket_row)
        .collect::<Result<_, _>>()?;
    let sql = format!(
        "SELECT {} FROM stock_transfers WHERE sku_id = ? AND fenced = FALSE",
        sql::TRANSFER_COLUMNS
    );
    let rows = B::fetch(&mut **tx, &sql, &[Arg::Id(sku.0)]).await?;
    let mut transfers = rows
        .iter()
        .map(rows::transfer)
        .collect::<Result<Vec<_>, _>>()?;
    let side_rank = |t: &TransferEvent| t.side != TransferSide::Out;
    transfers.sort_by(|a, b| (&a.id, side_rank(a)).cmp(&(&b.id, side_rank(b))));
    Ok((buckets, transfers))
}

fn events_of<R: crate::backend::Columns>(rows: &[R]) -> Result<Vec<Event>, StoreError> {
    rows.iter().map(rows::event).collect()
}

#[async_trait]
impl<B: Backend> OrderStore for Store<B> {
    fn event_log(&self) -> Option<std::sync::Arc<dyn flashsale_core::events::EventLog>> {
        Some(std::sync::Arc::new(self.clone()))
    }

    async fn create_sale(&self, sale: &Sale) -> Result<StoredSale, StoreError> {
        rows::validate(sale)?;
        let stored = rows::created(sale);
        let s = &stored.sale;
        let total = signed(s.total_stock)?;
        let args = [
            Arg::Id(s.sku_id.0),
            Arg::Text(&s.name),
            Arg::Int(total),
            Arg::Int(total),
            Arg::Small(s.per_user_limit),
            Arg::Text(s.mode.as_str()),
            Arg::Id(s.payment_timeout_ms),
            Arg::Int(s.starts_at_ms),
            Arg::Int(s.ends_at_ms),
            Arg::Text(s.state.as_str()),
            Arg::Small(u32::from(s.buckets)),
            Arg::Text(s.admission.mode.as_str()),
            Arg::Int(s.admission.admission_opens_at_ms),
            Arg::Int(s.admission.draw_at_ms),
        ];
        let written = match s.buckets {
            0 | 1 => self.write(sql::INSERT_SALE, &args).await.map(drop),
            n => {
                self.insert_bucketed(s.sku_id, &args, split_stock(s.total_stock, n))
                    .await
            }
        };
        match written {
            Ok(()) => Ok(stored),
            // Refused: by the primary key when the sale is there (a CHECK refuses the rest).
            Err(e) => match self.sale(s.sku_id).await {
                Ok(Some(_)) => Err(StoreError::SaleExists),
                _ => Err(e),
            },
        }
    }

    async fn sale(&self, sku: SkuId) -> Result<Option<StoredSale>, StoreError> {
        let sql = format!("SELECT {} FROM sales WHERE sku_id = ?", sql::SALE_COLUMNS);
        let rows = self.read(&sql, &[Arg::Id(sku.0)]).await?;
        rows.first()
            .map(|r| SaleRow::read(r)?.into_stored())
            .transpose()
    }

    async fn sales(&self) -> Result<Vec<StoredSale>, StoreError> {
        let sql = format!("SELECT {} FROM sales ORDER BY sku_id", sql::SALE_COLUMNS);
        let rows = self.read(&sql, &[]).await?;
        rows.iter()
            .map(|r| SaleRow::read(r)?.into_stored())
            .collect()
    }

    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), StoreError> {
        let sql = format!(
            "UPDATE sales SET state = ?{} WHERE sku_id = ?",
            B::DIALECT.touch
        );
        let matched = self
            .write(&sql, &[Arg::Text(state.as_str()), Arg::Id(sku.0)])
            .await?;
        if matched == 0 {
            return Err(StoreError::SaleNotFound);
        }
        Ok(())
    }

    async fn take_epoch(&self, sku: SkuId, current: u64) -> Result<Option<u64>, StoreError> {
        match self.bucket_count(sku).await? {
            Some(n) if n > 1 => return self.take_bucketed_epoch(sku, current, n).await,
            _ => {}
        }
        let args = [
            Arg::Int(flashsale_core::clock::now_ms()),
            Arg::Id(sku.0),
            Arg::Id(current),
        ];
        // Matched rows, which is what this asks: did the compare match?
        let matched = self.write(sql::TAKE_EPOCH, &args).await?;
        Ok((matched == 1).then_some(current + 1))
    }

    async fn unreported_fenced(&self, sku: SkuId, max: usize) -> Result<Vec<Event>, StoreError> {
        let sql = format!(
            "SELECT {} FROM fenced_events WHERE sku_id = ? AND reported = FALSE \
             ORDER BY epoch, seq LIMIT ?",
            sql::EVENT_COLUMNS
        );
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        events_of(&self.read(&sql, &[Arg::Id(sku.0), Arg::Int(limit)]).await?)
    }

    async fn mark_fenced_reported(
        &self,
        sku: SkuId,
        keys: &[(u64, u64)],
    ) -> Result<(), StoreError> {
        let head = "UPDATE fenced_events SET reported = TRUE";
        for chunk in keys.chunks(CHUNK_ROWS) {
            let sql = of_pairs(head, "epoch, seq", chunk.len());
            let pairs = chunk.iter().flat_map(|(e, s)| [Arg::Id(*e), Arg::Id(*s)]);
            let args: Vec<Arg<'_>> = std::iter::once(Arg::Id(sku.0)).chain(pairs).collect();
            self.write(&sql, &args).await?;
        }
        Ok(())
    }

    async fn stream_paused(&self, sku: SkuId) -> Result<bool, StoreError> {
        Store::stream_paused(self, sku).await
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, StoreError> {
        let sql = format!(
            "SELECT {} FROM orders WHERE order_no = ?",
            sql::ORDER_COLUMNS
        );
        let no = order_no.to_string();
        let rows = self.read(&sql, &[Arg::Text(&no)]).await?;
        rows.first().map(rows::order).transpose()
    }

    async fn orders(&self, sku: SkuId) -> Result<Vec<HotOrder>, StoreError> {
        let rows = self.sale_rows("orders", sql::ORDER_COLUMNS, sku).await?;
        rows.iter().map(rows::order).collect()
    }

    /// Every bucket's events, by bucket then seq (a sale of one bucket: its events by seq);
    /// an event's bucket is `epoch % buckets`.
    async fn events(&self, sku: SkuId) -> Result<Vec<Event>, StoreError> {
        let sql = format!(
            "SELECT {} FROM stock_events WHERE sku_id = ? ORDER BY bucket, seq",
            sql::EVENT_COLUMNS
        );
        events_of(&self.read(&sql, &[Arg::Id(sku.0)]).await?)
    }

    /// Bucket 0's range: a sale of one bucket's events (seqs are a bucket's own, so a
    /// bucketed sale's other buckets are read with [`Store::bucket_events_between`]).
    async fn events_between(
        &self,
        sku: SkuId,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.bucket_events_between(sku, 0, from_seq, to_seq).await
    }

    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let sql = format!(
            "INSERT INTO dead_letters ({}) VALUES (?, ?, ?, ?, ?, ?){}",
            sql::DEAD_LETTER_COLUMNS,
            B::DIALECT.upsert_dead_letter
        );
        let args = [
            Arg::Id(letter.sku_id.0),
            Arg::Text(&letter.entry_id),
            Arg::OptId(letter.seq),
            Arg::Text(&letter.payload),
            Arg::Text(&letter.error),
            Arg::Small(letter.attempts),
        ];
        B::run(&mut *tx, &sql, &args).await?;
        let pause = "UPDATE sales SET stream_paused = TRUE WHERE sku_id = ?";
        B::run(&mut *tx, pause, &[Arg::Id(letter.sku_id.0)]).await?;
        tx.commit().await.map_err(db_error)
    }

    async fn dead_letters(&self, sku: SkuId) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = self.sale_rows("dead_letters", sql::DEAD_LETTER_COLUMNS, sku);
        rows.await?.iter().map(rows::dead_letter).collect()
    }

    async fn apply_events(&self, sku: SkuId, events: &[Event]) -> Result<ApplyReport, StoreError> {
        if events.is_empty() {
            return Ok(ApplyReport::default());
        }
        match self.apply(sku, events, B::SHORT_WAY).await? {
            Some(report) => Ok(report),
            // The short way was refused and rolled back: the long way decides.
            None => Ok(self
                .apply(sku, events, false)
                .await?
                .expect("the long way always decides")),
        }
    }

    async fn apply_transfer(
        &self,
        transfer: &TransferEvent,
    ) -> Result<TransferApplied, StoreError> {
        check_transfer(transfer)?;
        let mut tx = self.begin_write().await?;
        let row = locked_transfer_bucket::<B>(&mut tx, transfer).await?;
        let applied = if row.epoch == transfer.epoch {
            move_stock::<B>(&mut tx, transfer, &row).await?
        } else {
            // Of a replaced copy: kept for the loss report, its bucket unchanged.
            insert_transfer::<B>(&mut tx, transfer, true).await?;
            tracing::error!(sku = %transfer.sku_id, id = %transfer.id, side = transfer.side.as_str(),
                epoch = transfer.epoch, bucket_epoch = row.epoch,
                "a transfer side refused by the epoch fence: kept in stock_transfers");
            TransferApplied::Fenced
        };
        tx.commit().await.map_err(db_error)?;
        Ok(applied)
    }

    async fn buckets(&self, sku: SkuId) -> Result<Vec<BucketRow>, StoreError> {
        let sql = format!(
            "SELECT {} FROM sale_buckets WHERE sku_id = ? ORDER BY bucket",
            sql::BUCKET_COLUMNS
        );
        let rows = self.read(&sql, &[Arg::Id(sku.0)]).await?;
        rows.iter().map(rows::bucket_row).collect()
    }

    async fn split_buckets(&self, sku: SkuId) -> Result<(), StoreError> {
        self.split_fresh(sku).await
    }

    async fn bucket_salts(&self, sku: SkuId) -> Result<Option<Vec<u32>>, StoreError> {
        let sql = "SELECT bucket, salt FROM sale_buckets WHERE sku_id = ? ORDER BY bucket";
        let rows = self.read(sql, &[Arg::Id(sku.0)]).await?;
        let salts: Option<Vec<u64>> = (rows.iter())
            .map(|r| r.opt_uint("salt"))
            .collect::<Result<_, _>>()?;
        let salts = salts.filter(|s| s.len() > 1);
        salts
            .map(|s| {
                s.into_iter()
                    .map(u32::try_from)
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()
            .map_err(|_| StoreError::Internal(format!("sale {sku}: a salt out of range")))
    }

    async fn keep_bucket_salts(&self, sku: SkuId, salts: &[u32]) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let sql =
            "UPDATE sale_buckets SET salt = ? WHERE sku_id = ? AND bucket = ? AND salt IS NULL";
        for (bucket, salt) in (0u32..).zip(salts) {
            let args = [Arg::Small(*salt), Arg::Id(sku.0), Arg::Small(bucket)];
            B::run(&mut *tx, sql, &args).await?;
        }
        tx.commit().await.map_err(db_error)
    }

    async fn take_bucket_epoch(
        &self,
        sku: SkuId,
        bucket: u16,
        current: u64,
    ) -> Result<Option<u64>, StoreError> {
        let n = match self.bucket_count(sku).await? {
            Some(n) if n > 1 && bucket < n => n,
            _ => {
                return Err(StoreError::Internal(format!(
                    "sale {sku} has no bucket {bucket}"
                )))
            }
        };
        let next = flashsale_core::buckets::next_epoch(current, bucket, n);
        let sql = "UPDATE sale_buckets SET epoch = ?, epoch_at_ms = ? \
                   WHERE sku_id = ? AND bucket = ? AND epoch = ?";
        let args = [
            Arg::Id(next),
            Arg::Int(flashsale_core::clock::now_ms()),
            Arg::Id(sku.0),
            Arg::Small(u32::from(bucket)),
            Arg::Id(current),
        ];
        // Matched rows (MySQL: CLIENT_FOUND_ROWS): did the compare match?
        Ok((self.write(sql, &args).await? == 1).then_some(next))
    }

    async fn audit(&self, sku: SkuId) -> Result<Option<SaleAudit>, StoreError> {
        // One snapshot: counters, orders and events agree.
        let mut tx = begin(&self.reader, B::BEGIN_SNAPSHOT).await?;
        let sql = format!("SELECT {} FROM sales WHERE sku_id = ?", sql::SALE_COLUMNS);
        let rows = B::fetch(&mut *tx, &sql, &[Arg::Id(sku.0)]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let sale = SaleRow::read(row)?.into_stored()?;
        let sql = format!(
            "SELECT {} FROM orders WHERE sku_id = ? ORDER BY id",
            sql::ORDER_COLUMNS
        );
        let orders = B::fetch(&mut *tx, &sql, &[Arg::Id(sku.0)])
            .await?
            .iter()
            .map(rows::order)
            .collect::<Result<Vec<_>, _>>()?;
        let sql = format!(
            "SELECT {} FROM stock_events WHERE sku_id = ? ORDER BY bucket, seq",
            sql::EVENT_COLUMNS
        );
        let events = events_of(&B::fetch(&mut *tx, &sql, &[Arg::Id(sku.0)]).await?)?;
        let (buckets, transfers) = audit_buckets::<B>(&mut tx, sku).await?;
        tx.rollback().await.map_err(db_error)?;
        Ok(Some(SaleAudit {
            sale,
            orders,
            events,
            buckets,
            transfers,
        }))
    }

    async fn record_reconcile_run(&self, run: &ReconcileRun) -> Result<u64, StoreError> {
        let sql = format!(
            "INSERT INTO reconcile_runs ({}) VALUES ({}){}",
            sql::reconcile_run_columns(B::DIALECT),
            list_placeholders(10),
            B::DIALECT.returning_id
        );
        let (repairs, lost_orders, lost_resolutions) = (
            run.repairs.join("\n"),
            run.lost_orders.join("\n"),
            run.lost_resolutions.join("\n"),
        );
        let args = [
            Arg::Id(run.sku_id.0),
            Arg::Int(run.at_ms),
            Arg::Text(&run.trigger),
            Arg::Flag(run.repair),
            Arg::Flag(run.ok),
            Arg::Small(run.violations),
            Arg::Text(&repairs),
            Arg::Text(&lost_orders),
            Arg::Text(&lost_resolutions),
            Arg::Text(&run.report),
        ];
        // The run and the losses it reports as notices commit together.
        let mut tx = self.begin_write().await?;
        let id = B::insert_id(&mut *tx, &sql, &args).await?;
        crate::notices::note_losses::<B>(&mut tx, run.sku_id, id, run.at_ms, &run.lost_orders)
            .await?;
        tx.commit().await.map_err(db_error)?;
        Ok(id)
    }

    async fn reconcile_runs(
        &self,
        sku: Option<SkuId>,
        limit: usize,
    ) -> Result<Vec<ReconcileRun>, StoreError> {
        let sql = format!(
            "SELECT id, {} FROM reconcile_runs WHERE (? IS NULL OR sku_id = ?) \
             ORDER BY id DESC LIMIT ?",
            sql::reconcile_run_columns(B::DIALECT)
        );
        let sku = sku.map(|s| s.0);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .read(&sql, &[Arg::OptId(sku), Arg::OptId(sku), Arg::Int(limit)])
            .await?;
        rows.iter().map(rows::reconcile_run).collect()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.read("SELECT 1", &[]).await.map(|_| ())
    }
}
