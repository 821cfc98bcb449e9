//! The group commit's writer: one thread holding one `rusqlite` connection to the ledger's
//! SQLite file (WAL, synchronous=FULL), cached prepared statements, multi-row inserts, values
//! bound straight from the events (no per-value allocation). It runs the store's SQL text
//! (`flashsale_store::sql::sqlite`), so the rows cannot drift from the store's.
//!
//! It writes exactly the rows `SqliteStore::apply_events` writes for a group the book has
//! accepted (events with `rejected = 0`, one order per deduction with its status after the
//! group, resolved stored orders' status and time, the guarded counter update), and skips
//! the look-ups that only matter when the book and the database disagree: which seqs are
//! applied already, which order numbers and request keys exist. The book guarantees them;
//! the database still checks them, cheaply:
//!
//! - the counter update (the store's own statement, `sql::sqlite::GUARDED_UPDATE`) names the
//!   counters, `applied_seq` and `epoch` the book started the group from (contiguity, the
//!   epoch fence and the final guard in one statement);
//! - the unique indexes refuse a repeated order number or request key;
//! - a resolution updates only a RESERVED order of the same user and quantity.
//!
//! Any of these failing rolls the whole transaction back and the group goes to
//! `SqliteStore::apply_events`, which sorts out duplicates, fenced and rejected events as it
//! always has (and the ledger then reloads its book). So the rows are the store's in every
//! case, and nothing is answered before its group is durable.

use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use flashsale_core::{Counters, Event, EventKind, OrderNo, OrderStatus, SaleMode, SkuId};
use flashsale_store::notices;
use flashsale_store::sql::sqlite::{
    values_placeholders, EVENT_COLS, GUARDED_UPDATE, INSERT_EVENTS, INSERT_ORDERS, ORDER_COLS,
};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::oneshot;

/// Rows per multi-row insert, largest first; a group is cut greedily into these.
const CHUNKS: [usize; 4] = [128, 32, 8, 1];
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What the book accepted in one group, and the state it started from.
pub(crate) struct Group {
    pub sku: SkuId,
    pub epoch: u64,
    pub mode: SaleMode,
    /// The book's counters before the group (as committed).
    pub before: Counters,
    pub events: Vec<Event>,
}

/// Why the writer did not commit a group (rolled back; nothing of it was written).
#[derive(Debug)]
pub(crate) struct NotWritten(pub String);

/// A group as the writer gives it back, and whether it is committed.
pub(crate) type Written = (Group, Result<(), NotWritten>);

type Reply = oneshot::Sender<Written>;

/// The writer thread's handle. Dropping it ends the thread after the groups it holds.
pub(crate) struct Writer {
    jobs: mpsc::Sender<(Group, Reply)>,
}

impl Writer {
    /// Starts the thread and opens `path` in it (the schema must be migrated already);
    /// `one_row`: the database is contracted to one row per purchase (a deduction is its
    /// order's row, no event row).
    pub(crate) fn start(path: PathBuf, one_row: bool) -> Result<Writer, String> {
        let (jobs, rx) = mpsc::channel::<(Group, Reply)>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                let mut conn = match open(&path) {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let sql = Sql::new(one_row);
                let mut buf = Buffers::default();
                // Dropped when this loop ends: the checkpointer stops with the writer.
                let _checkpointer = Checkpointer::start(path.clone());
                while let Ok((group, reply)) = rx.recv() {
                    let result = write(&mut conn, &sql, &mut buf, &group).map_err(NotWritten);
                    let _ = reply.send((group, result));
                }
            })
            .map_err(|e| format!("spawn the writer thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "the writer thread ended before opening".to_string())??;
        Ok(Writer { jobs })
    }

    /// Hands a group to the thread (groups are written in the order they are sent) and gives
    /// back what finishes when it is committed (durable when `Ok`), with the group either way.
    pub(crate) fn send(&self, group: Group) -> impl Future<Output = Written> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let sku = group.sku;
        let unsent = self.jobs.send((group, tx)).err().map(|e| e.0 .0);
        async move {
            if let Some(group) = unsent {
                return (group, Err(NotWritten("the writer thread stopped".into())));
            }
            match rx.await {
                Ok(done) => done,
                // The thread died holding the group (a panic): nothing is known to be
                // written, and the group is gone; the book is reloaded from the database.
                Err(_) => (
                    Group {
                        sku,
                        epoch: 0,
                        mode: SaleMode::Direct,
                        before: Counters::default(),
                        events: Vec::new(),
                    },
                    Err(NotWritten("the writer thread stopped".into())),
                ),
            }
        }
    }
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL is a property of the file (the store set it); synchronous is per connection.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.set_prepared_statement_cache_capacity(32);
    // The checkpointer thread copies the log into the database beside the writer; the writer
    // checkpoints itself only when the log outgrows this bound (it fell behind, or it never
    // started), which also restarts the log from its beginning.
    conn.pragma_update(None, "wal_autocheckpoint", WAL_PAGES_MAX)?;
    Ok(conn)
}

/// Pages the write-ahead log may hold before the writer checkpoints it itself.
const WAL_PAGES_MAX: i64 = 8_192;
/// How often the checkpointer copies the log into the database.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);

/// A thread with its own connection that checkpoints the log (PASSIVE: it never waits for, nor
/// blocks, the writer) every [`CHECKPOINT_EVERY`], so that the copying of pages into the
/// database and its fsync are off the group commit's path: with SQLite's default the writer
/// checkpoints every 1,000 pages, inside the commit its callers wait for. Dropping it stops it.
struct Checkpointer {
    _stop: mpsc::Sender<()>,
}

impl Checkpointer {
    fn start(path: PathBuf) -> Option<Checkpointer> {
        let (stop, stopped) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || {
                let Ok(conn) = Connection::open_with_flags(
                    &path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                ) else {
                    return; // the writer's own checkpoints bound the log
                };
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(CHECKPOINT_EVERY)
                {
                    let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                }
            });
        spawned.ok().map(|_| Checkpointer { _stop: stop })
    }
}

/// The statements' text, made once.
struct Sql {
    events: Vec<(usize, String)>,
    orders: Vec<(usize, String)>,
    /// One row per purchase: deductions are written as their orders only, and a stored
    /// order is found by its seq (the contracted database has no order-number index).
    one_row: bool,
}

/// A stored order resolved: only a RESERVED one of the same user and quantity. The writer's
/// own statement: the store updates resolved orders after its fold has checked them.
const RESOLVE: &str = "UPDATE orders SET status = ?1, updated_at_ms = ?2 \
     WHERE sku_id = ?3 AND order_no = ?4 AND status = 'RESERVED' AND user_id = ?5 AND quantity = ?6 \
     AND ?7 >= 0";

/// `RESOLVE` by the order's seq (bucket 0: the embedded ledger runs a sale as one book).
const RESOLVE_BY_SEQ: &str = "UPDATE orders SET status = ?1, updated_at_ms = ?2 \
     WHERE sku_id = ?3 AND bucket = 0 AND seq = ?7 AND order_no = ?4 AND status = 'RESERVED' \
     AND user_id = ?5 AND quantity = ?6";

impl Sql {
    fn new(one_row: bool) -> Sql {
        let text = |head: &str, n: usize, cols: usize| {
            (n, format!("{head}{}", values_placeholders(n, cols)))
        };
        Sql {
            events: CHUNKS
                .iter()
                .map(|&n| text(INSERT_EVENTS, n, EVENT_COLS))
                .collect(),
            orders: CHUNKS
                .iter()
                .map(|&n| text(INSERT_ORDERS, n, ORDER_COLS))
                .collect(),
            one_row,
        }
    }
}

/// Reused across groups: no allocation per group once warm.
#[derive(Default)]
struct Buffers {
    /// Per new order: index of its deduction in the group, final status, updated_at_ms.
    orders: Vec<(usize, OrderStatus, i64)>,
    /// Order number → index in `orders` (only filled when the group resolves orders).
    placed: std::collections::HashMap<OrderNo, usize>,
    /// Stored orders resolved: (event index).
    resolved: Vec<usize>,
    /// The events written as rows of `stock_events` (event index).
    event_rows: Vec<usize>,
    no: String,
}

/// u64 → i64 bit-for-bit, as the store keeps ids (SQLite has no unsigned integers).
fn i(v: u64) -> i64 {
    v as i64
}

fn order_no<'a>(buf: &'a mut String, no: &OrderNo) -> &'a str {
    buf.clear();
    let _ = write!(buf, "{no}");
    buf.as_str()
}

fn write(conn: &mut Connection, sql: &Sql, buf: &mut Buffers, g: &Group) -> Result<(), String> {
    let after = plan(g, buf)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| e.to_string())?;
    insert_rows(&tx, sql, buf, g).map_err(|e| e.to_string())?;
    for &k in &buf.resolved {
        let e = &g.events[k];
        let resolve = if sql.one_row { RESOLVE_BY_SEQ } else { RESOLVE };
        let mut st = tx.prepare_cached(resolve).map_err(|e| e.to_string())?;
        let changed = st
            .execute(rusqlite::params![
                e.kind.status_after(g.mode).as_str(),
                e.at_ms,
                i(g.sku.0),
                order_no(&mut buf.no, &e.order_no),
                i(e.user_id.0),
                e.quantity,
                i(e.order_no.seq),
            ])
            .map_err(|e| e.to_string())?;
        if changed != 1 {
            return Err(format!("order {} is not a stored hold", e.order_no));
        }
    }
    let (old, new) = (g.before, after);
    // The store's guarded update (`sql::GUARDED_UPDATE`): the writer reads no sale row, so
    // the statement's epoch condition is its fence; the `>= 0` conditions hold for any
    // counters the book folded (its plan refuses a negative one before any write).
    let changed = tx
        .prepare_cached(GUARDED_UPDATE)
        .and_then(|mut st| {
            st.execute(rusqlite::params![
                i(new.available),
                i(new.reserved),
                i(new.sold),
                i(new.seq),
                i(g.sku.0),
                i(g.epoch),
                i(old.seq),
                i(old.available),
                i(old.reserved),
                i(old.sold),
                i(new.available),
                i(new.reserved),
                i(new.sold),
            ])
        })
        .map_err(|e| e.to_string())?;
    if changed != 1 {
        return Err(format!(
            "the stored counters of sku {} are not the book's at seq {} epoch {}",
            g.sku, old.seq, g.epoch
        ));
    }
    note_sold_out(&tx, g, old, new).map_err(|e| e.to_string())?;
    tx.commit().map_err(|e| e.to_string())
}

/// The store's sold-out notice (`notices::SOLD_OUT_GATE`, `INSERT_SOLD_OUT`) in the group's
/// transaction, when the group sold the sale's last unit.
fn note_sold_out(
    tx: &rusqlite::Transaction<'_>,
    g: &Group,
    old: Counters,
    new: Counters,
) -> rusqlite::Result<()> {
    if !notices::may_sell_out(old, new, false) {
        return Ok(());
    }
    let gate = tx
        .prepare_cached(notices::SOLD_OUT_GATE)?
        .execute(rusqlite::params![i(g.sku.0)])?;
    if gate == 1 {
        let at_ms = g.events.last().map_or(0, |e| e.at_ms);
        tx.prepare_cached(notices::INSERT_SOLD_OUT)?
            .execute(rusqlite::params![at_ms, i(g.sku.0)])?;
    }
    Ok(())
}

/// Folds the group over the book's counters as the store's fold does for an accepted group:
/// the counters after it, each new order's final status, the stored orders it resolves.
fn plan(g: &Group, buf: &mut Buffers) -> Result<Counters, String> {
    buf.orders.clear();
    buf.placed.clear();
    buf.resolved.clear();
    let resolves = g.events.iter().any(|e| e.kind != EventKind::Deducted);
    let mut c = g.before;
    for (k, e) in g.events.iter().enumerate() {
        if e.sku_id != g.sku || e.epoch != g.epoch {
            return Err(format!("event seq {} is not of the group's sale", e.seq));
        }
        c = c
            .apply(e.delta(g.mode))
            .ok_or_else(|| format!("event seq {} would drive a counter negative", e.seq))?;
        if c.seq != e.seq {
            return Err(format!("event seq {} does not follow {}", e.seq, c.seq - 1));
        }
        match e.kind {
            EventKind::Deducted => {
                if resolves {
                    buf.placed.insert(e.order_no, buf.orders.len());
                }
                buf.orders.push((k, e.kind.status_after(g.mode), e.at_ms));
            }
            _ => match buf.placed.get(&e.order_no) {
                Some(&o) => {
                    let placed = &mut buf.orders[o];
                    let d = &g.events[placed.0];
                    if placed.1 != OrderStatus::Reserved
                        || d.user_id != e.user_id
                        || d.quantity != e.quantity
                    {
                        return Err(format!("order {} is not a hold of the group", e.order_no));
                    }
                    placed.1 = e.kind.status_after(g.mode);
                    placed.2 = e.at_ms;
                }
                None => buf.resolved.push(k),
            },
        }
    }
    Ok(c)
}

/// The group's events (but the deductions their orders carry, one row per purchase), then its
/// new orders, in as few multi-row statements as their sizes take.
fn insert_rows(
    tx: &rusqlite::Transaction<'_>,
    sql: &Sql,
    buf: &mut Buffers,
    g: &Group,
) -> rusqlite::Result<()> {
    buf.event_rows.clear();
    let carried = |e: &Event| sql.one_row && e.kind == EventKind::Deducted;
    (buf.event_rows).extend((0..g.events.len()).filter(|&k| !carried(&g.events[k])));
    let no = &mut buf.no;
    insert_chunked(tx, &sql.events, &buf.event_rows, |st, p, &k| {
        let e = &g.events[k];
        st.raw_bind_parameter(p, i(e.sku_id.0))?;
        st.raw_bind_parameter(p + 1, i(e.epoch))?;
        st.raw_bind_parameter(p + 2, i(e.seq))?;
        st.raw_bind_parameter(p + 3, e.kind.as_str())?;
        st.raw_bind_parameter(p + 4, order_no(no, &e.order_no))?;
        st.raw_bind_parameter(p + 5, e.request_id.as_str())?;
        st.raw_bind_parameter(p + 6, i(e.user_id.0))?;
        st.raw_bind_parameter(p + 7, e.quantity)?;
        st.raw_bind_parameter(p + 8, e.at_ms)?;
        st.raw_bind_parameter(p + 9, e.deadline_ms)?;
        st.raw_bind_parameter(p + 10, false)?;
        Ok(p + 11)
    })?;
    let new_order = |st: &mut rusqlite::CachedStatement<'_>,
                     p: usize,
                     &(k, status, updated_at_ms): &(usize, OrderStatus, i64)|
     -> rusqlite::Result<usize> {
        let e = &g.events[k];
        st.raw_bind_parameter(p, order_no(no, &e.order_no))?;
        st.raw_bind_parameter(p + 1, i(g.sku.0))?;
        st.raw_bind_parameter(p + 2, i(e.user_id.0))?;
        st.raw_bind_parameter(p + 3, e.request_id.as_str())?;
        st.raw_bind_parameter(p + 4, e.quantity)?;
        st.raw_bind_parameter(p + 5, status.as_str())?;
        st.raw_bind_parameter(p + 6, e.deadline_ms)?;
        st.raw_bind_parameter(p + 7, e.at_ms)?;
        st.raw_bind_parameter(p + 8, updated_at_ms)?;
        st.raw_bind_parameter(p + 9, 0)?;
        st.raw_bind_parameter(p + 10, i(e.seq))?;
        st.raw_bind_parameter(p + 11, i(e.epoch))?;
        Ok(p + 12)
    };
    insert_chunked(tx, &sql.orders, &buf.orders, new_order)
}

/// Inserts `rows` with the multi-row statements `statements` (rows per statement, its SQL;
/// largest first), each row bound by `bind` from a parameter index on (returning the next).
fn insert_chunked<T>(
    tx: &rusqlite::Transaction<'_>,
    statements: &[(usize, String)],
    rows: &[T],
    mut bind: impl FnMut(&mut rusqlite::CachedStatement<'_>, usize, &T) -> rusqlite::Result<usize>,
) -> rusqlite::Result<()> {
    let mut rest = rows;
    for (n, text) in statements {
        while rest.len() >= *n {
            let (chunk, tail) = rest.split_at(*n);
            let mut st = tx.prepare_cached(text)?;
            let mut p = 1;
            for row in chunk {
                p = bind(&mut st, p, row)?;
            }
            st.raw_execute()?;
            rest = tail;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::{RequestId, UserId};

    fn ev(seq: u64, kind: EventKind, order: u64, user: u64, at_ms: i64) -> Event {
        Event {
            sku_id: SkuId(7),
            epoch: 2,
            seq,
            kind,
            order_no: OrderNo::new(SkuId(7), 2, order),
            request_id: RequestId::parse(&format!("r{order}")).unwrap(),
            user_id: UserId(user),
            quantity: 1,
            at_ms,
            deadline_ms: 0,
        }
    }

    fn group(events: Vec<Event>) -> Group {
        Group {
            sku: SkuId(7),
            epoch: 2,
            mode: SaleMode::Reserve,
            before: Counters {
                total: 3,
                available: 2,
                reserved: 1,
                sold: 0,
                seq: 4,
            },
            events,
        }
    }

    /// A hold made and paid in one group is inserted once, PAID, at the payment's time; a
    /// stored hold's payment is an update.
    #[test]
    fn a_group_folds_like_the_store() {
        let g = group(vec![
            ev(5, EventKind::Deducted, 5, 1, 10),
            ev(6, EventKind::Paid, 5, 1, 11),
            ev(7, EventKind::Paid, 4, 9, 12),
        ]);
        let mut buf = Buffers::default();
        let after = plan(&g, &mut buf).unwrap();
        assert_eq!(
            (after.available, after.reserved, after.sold, after.seq),
            (1, 0, 2, 7)
        );
        assert_eq!(buf.orders, vec![(0, OrderStatus::Paid, 11)]);
        assert_eq!(buf.resolved, vec![2]);
    }

    /// What the book never hands over is refused before any write: a gap, another epoch, a
    /// negative counter, a resolution of an order the group settled already.
    #[test]
    fn a_group_the_book_could_not_have_made_is_refused() {
        let mut buf = Buffers::default();
        assert!(plan(&group(vec![ev(6, EventKind::Deducted, 6, 1, 1)]), &mut buf).is_err());
        let mut other = ev(5, EventKind::Deducted, 5, 1, 1);
        other.epoch = 1;
        assert!(plan(&group(vec![other]), &mut buf).is_err());
        let three: Vec<Event> = (5..8)
            .map(|s| ev(s, EventKind::Deducted, s, s, 1))
            .collect();
        assert!(plan(&group(three), &mut buf).is_err());
        let twice = vec![
            ev(5, EventKind::Deducted, 5, 1, 1),
            ev(6, EventKind::Paid, 5, 1, 2),
            ev(7, EventKind::Cancelled, 5, 1, 3),
        ];
        assert!(plan(&group(twice), &mut buf).is_err());
    }
}
