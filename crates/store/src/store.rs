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
    TransferEvent,
};

use crate::backend::{signed, Arg, Backend, Server};
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

    async fn begin_write(&self) -> Result<Tx<B>, StoreError> {
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
        use crate::backend::Columns as _;
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
        let head = Head {
            counters: sale.counters()?,
            mode: sale.mode()?,
        };
        let seqs = batch::applied_seqs(head.counters.seq, events);
        let stored = stored_events::<B>(&mut tx, sku, &seqs).await?;
        let split = batch::split(sku, sale.epoch, head.counters.seq, events, &stored)?;
        if short && spike(&split) {
            let plan = batch::fold(sku, head, &split.fresh, Vec::new());
            if plan.report.rejected.is_empty() {
                return match write_plan::<B>(&mut tx, sku, sale.epoch, &head, &plan).await {
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
        let report = settle::<B>(&mut tx, sku, sale.epoch, head, split).await?;
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
    sku: SkuId,
    epoch: u64,
    head: Head,
    split: Split<'_>,
) -> Result<ApplyReport, StoreError> {
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
    let mut plan = batch::fold(sku, head, &fresh, known);
    write_plan::<B>(tx, sku, epoch, &head, &plan).await?;
    plan.report.duplicates = duplicates;
    plan.report.fenced = fenced;
    Ok(plan.report)
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

/// The stored identity of the applied events at `seqs`.
async fn stored_events<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
    seqs: &[u64],
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stored = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(CHUNK_ROWS) {
        let sql = format!(
            "SELECT seq, epoch, kind, order_no FROM stock_events WHERE sku_id = ? AND seq IN ({})",
            list_placeholders(chunk.len())
        );
        let mut args = vec![Arg::Id(sku.0)];
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
    sku: SkuId,
    epoch: u64,
    head: &Head,
    plan: &Plan<'_>,
) -> Result<(), StoreError> {
    for chunk in plan.events.chunks(CHUNK_ROWS) {
        let sql = format!(
            "{}{}",
            sql::INSERT_EVENTS,
            values_placeholders(chunk.len(), sql::EVENT_COLS)
        );
        let nos: Vec<String> = chunk.iter().map(|(e, _)| e.order_no.to_string()).collect();
        let mut args = Vec::with_capacity(chunk.len() * sql::EVENT_COLS);
        for ((e, rejected), no) in chunk.iter().zip(&nos) {
            event_args(&mut args, e, no);
            args.push(Arg::Flag(*rejected));
        }
        B::run(&mut **tx, &sql, &args).await?;
    }
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
    guarded_update::<B>(tx, (sku, epoch), head.counters, plan.after).await
}

/// Moves the counters of the sale `(sku, epoch)` from `old` to `new` (`sql::GUARDED_UPDATE`).
async fn guarded_update<B: Backend>(
    tx: &mut Tx<B>,
    (sku, epoch): (SkuId, u64),
    old: Counters,
    new: Counters,
) -> Result<(), StoreError> {
    let args = [
        Arg::Int(signed(new.available)?),
        Arg::Int(signed(new.reserved)?),
        Arg::Int(signed(new.sold)?),
        Arg::Id(new.seq),
        Arg::Id(sku.0),
        Arg::Id(epoch),
        Arg::Id(old.seq),
        Arg::Int(signed(old.available)?),
        Arg::Int(signed(old.reserved)?),
        Arg::Int(signed(old.sold)?),
        Arg::Int(signed(new.available)?),
        Arg::Int(signed(new.reserved)?),
        Arg::Int(signed(new.sold)?),
    ];
    // Matched rows: 1 when the guard matched, whatever changed.
    if B::run(&mut **tx, sql::GUARDED_UPDATE, &args).await? != 1 {
        return Err(StoreError::Internal(format!(
            "guarded counter update of sku {sku} matched no row (applied_seq {})",
            old.seq
        )));
    }
    Ok(())
}

fn events_of<R: crate::backend::Columns>(rows: &[R]) -> Result<Vec<Event>, StoreError> {
    rows.iter().map(rows::event).collect()
}

#[async_trait]
impl<B: Backend> OrderStore for Store<B> {
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
        ];
        match self.write(sql::INSERT_SALE, &args).await {
            Ok(_) => Ok(stored),
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

    async fn events(&self, sku: SkuId) -> Result<Vec<Event>, StoreError> {
        self.events_between(sku, 0, u64::MAX).await
    }

    async fn events_between(
        &self,
        sku: SkuId,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<Event>, StoreError> {
        // Sequence numbers stay far below i64::MAX; clamp the bounds so every backend's
        // column type holds them.
        let clamp = |seq: u64| seq.min(i64::MAX as u64);
        let sql = format!(
            "SELECT {} FROM stock_events WHERE sku_id = ? AND seq >= ? AND seq <= ? ORDER BY seq",
            sql::EVENT_COLUMNS
        );
        let args = [
            Arg::Id(sku.0),
            Arg::Id(clamp(from_seq)),
            Arg::Id(clamp(to_seq)),
        ];
        events_of(&self.read(&sql, &args).await?)
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
        Err(StoreError::Internal(format!(
            "transfer {} of sale {}: bucketed sales are not stored yet",
            transfer.id, transfer.sku_id
        )))
    }

    async fn buckets(&self, _sku: SkuId) -> Result<Vec<BucketRow>, StoreError> {
        Ok(Vec::new())
    }

    async fn split_buckets(&self, sku: SkuId) -> Result<(), StoreError> {
        Err(StoreError::Internal(format!(
            "sale {sku}: bucketed sales are not stored yet"
        )))
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
            "SELECT {} FROM stock_events WHERE sku_id = ? ORDER BY seq",
            sql::EVENT_COLUMNS
        );
        let events = events_of(&B::fetch(&mut *tx, &sql, &[Arg::Id(sku.0)]).await?)?;
        tx.rollback().await.map_err(db_error)?;
        Ok(Some(SaleAudit {
            sale,
            orders,
            events,
            buckets: Vec::new(),
            transfers: Vec::new(),
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
        let mut conn = self.writer.acquire().await.map_err(db_error)?;
        B::insert_id(&mut *conn, &sql, &args).await
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
