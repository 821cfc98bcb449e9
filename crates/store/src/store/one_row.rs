//! One row per purchase: an order row carries the seq, bucket and epoch of the `deducted`
//! event that created it (migration 16), so once the database is contracted
//! ([`Store::contract_one_row`]) a purchase writes that row only, and `stock_events` keeps the
//! other transitions (paid, cancelled, expired) and the deductions that have no order of
//! their own (a repeated order number or request key).
//!
//! Every reader of the event log reads both tables in one snapshot ([`log_rows`]): the rows
//! of `stock_events`, and an order row as its deduction when no event row holds its seq.
//! That reads the same log before the contract (every deduction also has its event row:
//! binaries of schema 15 and older read only those), during it, and after it.

use std::sync::atomic::Ordering;

use flashsale_core::buckets::bucket_of_epoch;
use flashsale_core::events::LoggedEvent;
use flashsale_core::{Event, HotOrder, OrderNo, SkuId, StoreError};

use super::base::{begin, Store, Tx};
use crate::backend::{Arg, Backend, Columns as _};
use crate::compat::MIN_BINARY_SQL;
use crate::rows::{self, db_error};
use crate::sql;

/// Orders read per step of the contract's backfill.
const BACKFILL_ROWS: usize = 1_000;

/// What a contract to one row per purchase did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContractReport {
    /// Orders written before migration 16 that were given their event's seq.
    pub backfilled: u64,
    /// `deducted` rows of `stock_events` removed: their order rows carry them.
    pub events_removed: u64,
}

/// Whether the database behind `conn` is contracted to one row per purchase.
pub(crate) async fn shape<B: Backend>(conn: &mut B::Connection) -> Result<bool, StoreError> {
    let rows = B::fetch(conn, MIN_BINARY_SQL, &[]).await?;
    match rows.first() {
        Some(row) => Ok(row.int("min_binary_version")? >= sql::ONE_ROW_VERSION),
        None => Ok(false),
    }
}

/// The event log's rows that `cond` selects (over `sku_id`, `bucket` and `seq`, with `args`),
/// by bucket then seq, at most `limit`: `stock_events`' rows and the orders that carry their
/// deduction, merged. Run it in one snapshot (a transaction) so that no row commits between
/// the two reads.
pub(crate) async fn log_rows<B: Backend>(
    conn: &mut B::Connection,
    cond: &str,
    args: &[Arg<'_>],
    limit: Option<usize>,
) -> Result<Vec<LoggedEvent>, StoreError> {
    let tail = limit.map_or(String::new(), |n| format!(" LIMIT {}", n.max(1)));
    let from_events = event_rows::<B>(&mut *conn, cond, args, &tail).await?;
    let orders = format!(
        "SELECT {} FROM orders o WHERE {cond} AND seq IS NOT NULL AND NOT EXISTS \
         (SELECT 1 FROM stock_events x WHERE x.sku_id = o.sku_id AND x.bucket = o.bucket \
         AND x.seq = o.seq) ORDER BY bucket, seq{tail}",
        sql::ORDER_EVENT_COLUMNS
    );
    let mut from_orders = Vec::new();
    for r in B::fetch(conn, &orders, args).await? {
        from_orders.push(rows::order_event(&r)?);
    }
    Ok(merge(from_events, from_orders, limit))
}

/// The rows of `stock_events` that `cond` selects, by bucket then seq (`tail`: a LIMIT or none).
async fn event_rows<B: Backend>(
    conn: &mut B::Connection,
    cond: &str,
    args: &[Arg<'_>],
    tail: &str,
) -> Result<Vec<LoggedEvent>, StoreError> {
    let events = format!(
        "SELECT bucket, rejected, {} FROM stock_events WHERE {cond} ORDER BY bucket, seq{tail}",
        sql::EVENT_COLUMNS
    );
    let mut from_events = Vec::new();
    for r in B::fetch(conn, &events, args).await? {
        from_events.push(LoggedEvent {
            bucket: rows::bucket_number("bucket", r.small("bucket")?)?,
            rejected: r.flag("rejected")?,
            event: rows::event(&r)?,
        });
    }
    Ok(from_events)
}

/// A whole sale's orders and its event log (what [`log_rows`] reads for the sale) from one
/// read of its order rows: each is an order and, when it carries a seq, the deduction that
/// created it unless an event row holds that seq (the merge keeps the event row, as
/// `log_rows`' `NOT EXISTS` does). The reconciler reads a whole sale every pass; reading its
/// orders once for the orders and once more for the log made the database side of a pass
/// twice the rows. Run it in one snapshot, as `log_rows`.
pub(crate) async fn orders_and_log<B: Backend>(
    conn: &mut B::Connection,
    sku: SkuId,
) -> Result<(Vec<HotOrder>, Vec<Event>), StoreError> {
    let one_row = shape::<B>(&mut *conn).await?;
    let sql = sale_orders_sql(one_row, true);
    let args = [Arg::Id(sku.0)];
    let mut orders = Vec::new();
    let mut deductions = Vec::new();
    for r in B::fetch(&mut *conn, &sql, &args).await? {
        let order = rows::order(&r)?;
        if r.opt_uint("seq")?.is_some() {
            deductions.push(rows::deduction(&r, &order)?);
        }
        orders.push(order);
    }
    // Before the contract the rows come in insertion order; the merge wants (bucket, seq).
    if !one_row {
        deductions.sort_by_key(|e| (e.bucket, e.event.seq));
    }
    let from_events = event_rows::<B>(conn, "sku_id = ?", &args, "").await?;
    let log = merge(from_events, deductions, None);
    Ok((orders, log.into_iter().map(|e| e.event).collect()))
}

/// A sale's orders (bound: its sku) in the order they were taken: by bucket and seq once the
/// database is contracted to one row per purchase (`one_row`), else by id; with the bucket,
/// seq and epoch of the deduction each carries when `deductions` (else not read at all: a
/// sale's orders are read whole at every load of its book).
pub(crate) fn sale_orders_sql(one_row: bool, deductions: bool) -> String {
    let by = if one_row { "bucket, seq" } else { "id" };
    let carried = if deductions {
        "bucket, seq, epoch, "
    } else {
        ""
    };
    format!(
        "SELECT {carried}{} FROM orders WHERE sku_id = ? ORDER BY {by}",
        sql::ORDER_COLUMNS
    )
}

/// Two logs sorted by (bucket, seq) as one, the first's row kept where both hold a seq.
fn merge(a: Vec<LoggedEvent>, b: Vec<LoggedEvent>, limit: Option<usize>) -> Vec<LoggedEvent> {
    let key = |e: &LoggedEvent| (e.bucket, e.event.seq);
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if key(x) == key(y) => {
                b.next();
                a.next()
            }
            (Some(x), Some(y)) if key(y) < key(x) => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        };
        match next {
            Some(e) if limit.is_none_or(|n| out.len() < n) => out.push(e),
            _ => return out,
        }
    }
}

impl<B: Backend> Store<B> {
    /// Reads whether the database is contracted to one row per purchase (at open).
    pub(crate) async fn read_shape(&self) -> Result<(), StoreError> {
        let mut conn = self.reader.acquire().await.map_err(db_error)?;
        if shape::<B>(&mut conn).await? {
            self.one_row.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The event log's rows that `cond` selects ([`log_rows`]), read in one snapshot.
    pub(crate) async fn logged(
        &self,
        cond: &str,
        args: &[Arg<'_>],
        limit: Option<usize>,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        let mut tx = snapshot(self).await?;
        let rows = log_rows::<B>(&mut tx, cond, args, limit).await?;
        tx.rollback().await.map_err(db_error)?;
        Ok(rows)
    }

    /// Whether this store writes one row per purchase (the database is contracted).
    pub fn one_row(&self) -> bool {
        self.one_row.load(Ordering::Relaxed)
    }

    /// Whether a batch in `tx` writes one row per purchase: read in the batch's own
    /// transaction until the contract is seen, so a batch never writes the old shape after
    /// the contract removed what it would have written beside it.
    pub(crate) async fn one_row_in(&self, tx: &mut Tx<B>) -> Result<bool, StoreError> {
        if !self.one_row() && shape::<B>(&mut **tx).await? {
            self.one_row.store(true, Ordering::Relaxed);
        }
        Ok(self.one_row())
    }

    /// The contract step to one row per purchase (`flashsale migrate --contract`; docs/DEPLOY.md,
    /// "Rolling upgrades"): declares schema version 16 the lowest binary that may run, gives
    /// every order written before migration 16 its event's seq, removes the `deducted` rows
    /// of `stock_events` that order rows carry, drops the order-number index (an order is
    /// found by its seq) and keys `orders` by `(sku_id, bucket, seq)` (its `id` goes): a
    /// purchase is then one row with one unique index besides its key, the request's. Run it only once no instance of a binary below schema version 16
    /// runs. Safe to run again, and while instances of this binary apply batches: a batch
    /// that began before it keeps both rows, which readers read as one.
    pub async fn contract_one_row(&self) -> Result<ContractReport, StoreError> {
        let declare = "UPDATE schema_compat SET min_binary_version = ? \
                       WHERE id = 1 AND min_binary_version < ?";
        let v = sql::ONE_ROW_VERSION;
        self.write(declare, &[Arg::Int(v), Arg::Int(v)]).await?;
        let ids = self.orders_have_ids().await?;
        let backfilled = if ids {
            self.backfill_order_seqs().await?
        } else {
            0
        };
        let remove = "DELETE FROM stock_events WHERE kind = 'deducted' AND EXISTS \
             (SELECT 1 FROM orders o WHERE o.sku_id = stock_events.sku_id \
             AND o.bucket = stock_events.bucket AND o.seq = stock_events.seq \
             AND o.order_no = stock_events.order_no)";
        let events_removed = self.write(remove, &[]).await?;
        let missing = "SELECT order_no FROM orders WHERE seq IS NULL LIMIT 5";
        let left = self.read(missing, &[]).await?;
        if let Some(row) = left.first() {
            return Err(StoreError::Internal(format!(
                "order {} has no deducted event to take its seq from: the order-number \
                 index stays until it has one",
                row.text("order_no")?
            )));
        }
        self.write(B::DIALECT.drop_order_no_index, &[]).await?;
        if ids {
            let mut tx = self.begin_write().await?;
            for statement in B::DIALECT.key_orders_by_seq {
                B::run(&mut *tx, statement, &[]).await?;
            }
            tx.commit().await.map_err(db_error)?;
        }
        self.one_row.store(true, Ordering::Relaxed);
        Ok(ContractReport {
            backfilled,
            events_removed,
        })
    }

    /// Whether `orders` still has its `id` (the contract's last step has not run).
    async fn orders_have_ids(&self) -> Result<bool, StoreError> {
        match self.read("SELECT id FROM orders WHERE 1 = 0", &[]).await {
            Ok(_) => Ok(true),
            Err(StoreError::Unavailable(e)) => Err(StoreError::Unavailable(e)),
            Err(_) => Ok(false),
        }
    }

    /// Whether the database is contracted to one row per purchase, read again while this
    /// store has not seen it (another process may have run the contract).
    pub(crate) async fn one_row_now(&self) -> Result<bool, StoreError> {
        if !self.one_row() {
            self.read_shape().await?;
        }
        Ok(self.one_row())
    }

    /// Gives each order without a seq (written by a binary before migration 16) the seq,
    /// epoch and bucket of the `deducted` event that created it, in id order.
    async fn backfill_order_seqs(&self) -> Result<u64, StoreError> {
        let mut after = 0u64;
        let mut done = 0u64;
        let mut buckets = std::collections::HashMap::new();
        loop {
            let page = format!(
                "SELECT id, sku_id, order_no FROM orders WHERE id > ? AND seq IS NULL \
                 ORDER BY id LIMIT {BACKFILL_ROWS}"
            );
            let rows = self.read(&page, &[Arg::Id(after)]).await?;
            for row in &rows {
                after = row.uint("id")?;
                let sku = SkuId(row.uint("sku_id")?);
                let no = crate::batch::order_no(&row.text("order_no")?)?;
                let n = match buckets.get(&sku) {
                    Some(&n) => n,
                    None => {
                        let sql = "SELECT buckets FROM sales WHERE sku_id = ?";
                        let rows = self.read(sql, &[Arg::Id(sku.0)]).await?;
                        let n = match rows.first() {
                            Some(r) => rows::bucket_number("buckets", r.small("buckets")?)?,
                            None => 1,
                        };
                        *buckets.entry(sku).or_insert(n)
                    }
                };
                done += self.backfill_one(sku, &no, n).await?;
            }
            if rows.len() < BACKFILL_ROWS {
                return Ok(done);
            }
        }
    }

    /// One order's backfill from its event (of bucket 0, or of its epoch's bucket).
    async fn backfill_one(&self, sku: SkuId, no: &OrderNo, n: u16) -> Result<u64, StoreError> {
        let text = no.to_string();
        let bucket = u32::from(bucket_of_epoch(no.epoch, n.max(1)));
        let set = "UPDATE orders SET bucket = (SELECT MIN(e.bucket) FROM stock_events e \
             WHERE e.sku_id = ? AND e.bucket IN (0, ?) AND e.seq = ? AND e.kind = 'deducted' \
             AND e.order_no = ?), seq = ?, epoch = ? \
             WHERE sku_id = ? AND order_no = ? AND seq IS NULL AND EXISTS \
             (SELECT 1 FROM stock_events e WHERE e.sku_id = ? AND e.bucket IN (0, ?) \
             AND e.seq = ? AND e.kind = 'deducted' AND e.order_no = ?)";
        let event = [
            Arg::Id(sku.0),
            Arg::Small(bucket),
            Arg::Id(no.seq),
            Arg::Text(&text),
        ];
        let mut args = event.to_vec();
        args.extend([
            Arg::Id(no.seq),
            Arg::Id(no.epoch),
            Arg::Id(sku.0),
            Arg::Text(&text),
        ]);
        args.extend(event);
        self.write(set, &args).await
    }
}

/// The stored orders of a sale with these numbers, found by their seq (after the contract
/// there is no order-number index): `(bucket, seq)` of bucket 0 or of the number's epoch's
/// bucket among `n`, as `log_rows`' `cond` and its `args` for `of_pairs`.
pub(crate) fn order_keys(nos: &[OrderNo], n: u16) -> Vec<(u32, u64)> {
    let mut keys: Vec<(u32, u64)> = Vec::with_capacity(nos.len() * 2);
    for no in nos {
        keys.push((0, no.seq));
        let b = u32::from(bucket_of_epoch(no.epoch, n.max(1)));
        if b != 0 {
            keys.push((b, no.seq));
        }
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// A read transaction of one snapshot on `store`'s readers.
pub(crate) async fn snapshot<B: Backend>(store: &Store<B>) -> Result<Tx<B>, StoreError> {
    begin(&store.reader, B::BEGIN_SNAPSHOT).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::{Event, EventKind, RequestId, UserId};

    fn row(bucket: u16, seq: u64, kind: EventKind) -> LoggedEvent {
        LoggedEvent {
            bucket,
            rejected: false,
            event: Event {
                sku_id: SkuId(1),
                epoch: 1,
                seq,
                kind,
                order_no: OrderNo::new(SkuId(1), 1, seq),
                request_id: RequestId::parse("r").unwrap(),
                user_id: UserId(1),
                quantity: 1,
                at_ms: 0,
                deadline_ms: 0,
            },
        }
    }

    /// Two sorted logs merge by (bucket, seq); a seq both hold is read once, from the first.
    #[test]
    fn logs_merge_in_order_once() {
        let a = vec![
            row(0, 2, EventKind::Paid),
            row(0, 3, EventKind::Deducted),
            row(1, 1, EventKind::Paid),
        ];
        let b = vec![
            row(0, 1, EventKind::Deducted),
            row(0, 3, EventKind::Deducted),
            row(0, 4, EventKind::Deducted),
        ];
        let merged = merge(a, b, None);
        let keys: Vec<(u16, u64)> = merged.iter().map(|e| (e.bucket, e.event.seq)).collect();
        assert_eq!(keys, vec![(0, 1), (0, 2), (0, 3), (0, 4), (1, 1)]);
        assert_eq!(
            merge(
                vec![row(0, 2, EventKind::Paid)],
                vec![row(0, 1, EventKind::Deducted)],
                Some(1)
            )
            .len(),
            1
        );
    }
}
