//! The apply of a batch of a stream's events, in one transaction: lock the sale row (and the
//! bucket's row the batch is of), read the stored events the batch names, split off
//! duplicates and fenced events, fold the fresh ones (`batch`), and write the plan under the
//! guarded counter update. A spike's batch tries a short way first.

use flashsale_core::buckets::bucket_of_epoch;
use flashsale_core::{ApplyReport, Counters, Event, EventKind, SkuId, StoreError};

use super::base::{locked_sale, of_pairs, Store, Tx};
use super::buckets::locked_bucket;
use super::one_row::{log_rows, order_keys};
use crate::backend::{signed, Arg, Backend};
use crate::batch::{self, Head, KnownOrder, Plan, Split, StoredEvent, CHUNK_ROWS};
use crate::rows::{self, db_error, SaleRow};
use crate::sql::{self, list_placeholders, values_placeholders};

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
    /// The sale's stock (its row's total).
    sale_total: u64,
    /// The sale's bucket count (an order's bucket is 0 or its epoch's among them).
    buckets: u16,
    /// Whether the batch writes one row per purchase (the database is contracted).
    one_row: bool,
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
    /// One try at applying a batch. The short way (`short`) is for a spike's batch: fresh
    /// deductions only, none refused by the fold's own rules. It skips the look-ups of existing
    /// order numbers and request keys, because the unique indexes refuse what they would have
    /// found, and the locked sale row and the guarded update check the rest: then the rows are
    /// the long way's. A statement it gets refused rolls the whole try back and answers `None`:
    /// the caller takes the long way, which decides (and keeps what it refuses).
    pub(super) async fn apply(
        &self,
        sku: SkuId,
        events: &[Event],
        short: bool,
    ) -> Result<Option<ApplyReport>, StoreError> {
        let mut tx = self.begin_write().await?;
        let sale = locked_sale::<B>(&mut tx, sku).await?;
        let mut target = target::<B>(&mut tx, sku, &sale, events).await?;
        target.one_row = self.one_row_in(&mut tx).await?;
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
    let known = known_orders::<B>(tx, target, &nos, &keys).await?;
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
    };
    let n = sale.bucket_count()?;
    let on_sale = Target {
        sku,
        bucket: None,
        epoch: sale.epoch,
        head,
        sale_total: head.counters.total,
        buckets: n,
        one_row: false,
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
        },
        sale_total: head.counters.total,
        buckets: n,
        one_row: false,
    })
}

/// The orders already stored that the batch names, by order number or request key.
async fn known_orders<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    nos: &[String],
    keys: &[(u64, String)],
) -> Result<Vec<KnownOrder>, StoreError> {
    let (sku, cols) = (target.sku, sql::KNOWN_ORDER_COLUMNS);
    let mut found = Vec::new();
    if target.one_row {
        found.extend(orders_by_seq::<B>(tx, target, nos, cols).await?);
    }
    for chunk in nos.chunks(CHUNK_ROWS).filter(|_| !target.one_row) {
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

/// The stored orders of the target's sale with these numbers, found by their seq (there
/// is no order-number index once the database is contracted to one row per purchase), as
/// the rows `cols` of each.
async fn orders_by_seq<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    nos: &[String],
    cols: &str,
) -> Result<Vec<B::Record>, StoreError> {
    let mut found = Vec::new();
    // Up to two keys per number (bucket 0 and its epoch's bucket).
    for names in nos.chunks(CHUNK_ROWS / 2) {
        let parsed = (names.iter())
            .map(|no| batch::order_no(no))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = order_keys(&parsed, target.buckets);
        let head = format!("SELECT {cols} FROM orders");
        let sql = format!(
            "{} AND order_no IN ({})",
            of_pairs(&head, "bucket, seq", keys.len()),
            list_placeholders(names.len())
        );
        let pairs = keys
            .iter()
            .flat_map(|(b, seq)| [Arg::Small(*b), Arg::Id(*seq)]);
        let mut args: Vec<Arg<'_>> = std::iter::once(Arg::Id(target.sku.0))
            .chain(pairs)
            .collect();
        args.extend(names.iter().map(|no| Arg::Text(no)));
        found.extend(B::fetch(&mut **tx, &sql, &args).await?);
    }
    Ok(found)
}

/// The stored identity of the applied events at `seqs` of the target's bucket (seqs are a
/// bucket's own): event rows, and order rows that carry their deduction.
async fn stored_events<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    seqs: &[u64],
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stored = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(CHUNK_ROWS) {
        let cond = format!(
            "sku_id = ? AND bucket = ? AND seq IN ({})",
            list_placeholders(chunk.len())
        );
        let bucket = u32::from(target.events_bucket());
        let mut args = vec![Arg::Id(target.sku.0), Arg::Small(bucket)];
        args.extend(chunk.iter().map(|seq| Arg::Id(*seq)));
        for row in log_rows::<B>(&mut **tx, &cond, &args, None).await? {
            let e = row.event;
            stored.push(StoredEvent {
                seq: e.seq,
                epoch: e.epoch,
                kind: e.kind,
                order_no: e.order_no,
            });
        }
    }
    Ok(stored)
}

/// An event's columns in `sql::EVENT_COLUMNS` order (stock_events, fenced_events);
/// `order_no` is the event's order number as text.
pub(super) fn event_args<'a>(args: &mut Vec<Arg<'a>>, e: &'a Event, order_no: &'a str) {
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
    write_events::<B>(tx, target, plan).await?;
    let bucket = u32::from(target.events_bucket());
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
                Arg::Small(bucket),
                Arg::Id(o.seq),
                Arg::Id(o.epoch),
            ]);
        }
        B::run(&mut **tx, &sql, &args).await?;
    }
    for u in &plan.updates {
        update_status::<B>(tx, target, u).await?;
    }
    guarded_update::<B>(tx, target, plan.after).await?;
    let moved = (target.head.counters, plan.after, target.bucket.is_some());
    let at_ms = plan.events.last().map_or(0, |(e, _)| e.at_ms);
    crate::notices::note_sold_out::<B>(tx, target.sku, moved, at_ms).await
}

/// Sets the status of stored orders (by number; by seq once the database is contracted to one
/// row per purchase, as `orders_by_seq` finds them).
async fn update_status<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    u: &batch::StatusUpdate,
) -> Result<(), StoreError> {
    let head = "UPDATE orders SET status = ?, updated_at_ms = ?";
    let nos = list_placeholders(u.order_nos.len());
    let mut args = vec![Arg::Text(u.status.as_str()), Arg::Int(u.at_ms)];
    let sql = if target.one_row {
        let parsed = (u.order_nos.iter())
            .map(|no| batch::order_no(no))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = order_keys(&parsed, target.buckets);
        args.push(Arg::Id(target.sku.0));
        args.extend(
            keys.iter()
                .flat_map(|(b, seq)| [Arg::Small(*b), Arg::Id(*seq)]),
        );
        let pairs = of_pairs(head, "bucket, seq", keys.len());
        format!("{pairs} AND order_no IN ({nos})")
    } else {
        args.push(Arg::Id(target.sku.0));
        format!("{head} WHERE sku_id = ? AND order_no IN ({nos})")
    };
    args.extend(u.order_nos.iter().map(|no| Arg::Text(no)));
    B::run(&mut **tx, &sql, &args).await?;
    Ok(())
}

/// Inserts a plan's events: a sale's own with `INSERT_EVENTS` (bucket 0, the default), a
/// bucket's with its number. Once the database is contracted to one row per purchase, a
/// deduction that creates an order is that order's row and no event row.
async fn write_events<B: Backend>(
    tx: &mut Tx<B>,
    target: &Target,
    plan: &Plan<'_>,
) -> Result<(), StoreError> {
    let bucket = target.bucket;
    let carried: std::collections::HashSet<u64> = match target.one_row {
        true => plan.new_orders.iter().map(|o| o.seq).collect(),
        false => Default::default(),
    };
    let events: Vec<(&Event, bool)> = (plan.events.iter())
        .filter(|(e, _)| !(e.kind == EventKind::Deducted && carried.contains(&e.seq)))
        .copied()
        .collect();
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
        Some(_) => follow_buckets::<B>(tx, sku, target.sale_total).await,
    }
}

/// Sets a bucketed sale's row to the sum of its bucket rows (read in this transaction, after
/// the bucket's update, under the sale row's lock that every bucket's writer takes first).
/// The buckets may hold more reserved and sold units than the stock for a while: each bucket
/// is persisted on its own, so a unit that left one bucket (its hold expired there, then an
/// out) can be stored as sold in another before the first bucket's expiry is. A unit created
/// by a lost out does it for good. The sale row then shows the stock at most (sold first,
/// then reserved) and follows again once the buckets are back within it; the buckets keep
/// the excess, which the checks report (I2 and the reconciler's count of hot units). Moving
/// the row by each change instead let its CHECK refuse the batch, and the persister dead-
/// lettered it and paused every bucket of the sale.
async fn follow_buckets<B: Backend>(
    tx: &mut Tx<B>,
    sku: SkuId,
    total: u64,
) -> Result<(), StoreError> {
    let sql = format!(
        "SELECT {} FROM sale_buckets WHERE sku_id = ?",
        sql::BUCKET_COLUMNS
    );
    let rows = B::fetch(&mut **tx, &sql, &[Arg::Id(sku.0)]).await?;
    let (mut reserved, mut sold) = (0u64, 0u64);
    for row in &rows {
        let c = rows::bucket_row(row)?.counters;
        (reserved, sold) = (reserved + c.reserved, sold + c.sold);
    }
    let shown = sale_of_buckets(total, reserved, sold);
    if shown.reserved + shown.sold < reserved + sold {
        tracing::warn!(%sku, total, reserved, sold,
            "the buckets hold more reserved and sold units than the stock: units in flight, or created");
    }
    let args = [
        Arg::Int(signed(shown.available)?),
        Arg::Int(signed(shown.reserved)?),
        Arg::Int(signed(shown.sold)?),
        Arg::Id(sku.0),
    ];
    if B::run(&mut **tx, sql::SET_SALE_COUNTERS, &args).await? != 1 {
        return Err(StoreError::Internal(format!(
            "the counters of sku {sku} did not follow its buckets'"
        )));
    }
    Ok(())
}

/// The sale row's counters for buckets holding `reserved` and `sold` units in all: their sum,
/// at most the stock (sold first).
fn sale_of_buckets(total: u64, reserved: u64, sold: u64) -> Counters {
    let sold = sold.min(total);
    let reserved = reserved.min(total - sold);
    Counters {
        total,
        available: total - sold - reserved,
        reserved,
        sold,
        seq: 0,
    }
}
