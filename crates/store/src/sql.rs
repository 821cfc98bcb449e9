//! The SQL text of the system of record: the statements every database runs alike, written
//! once with `?` placeholders (the PostgreSQL backend numbers them `$1, $2, ...` when it
//! runs them), and each dialect's [`Dialect`]: only the clauses the databases spell
//! differently.
//!
//! Public so that the embedded ledger's own SQLite writer runs the store's statements
//! ([`sqlite`]) instead of copies of them.

/// Where the dialects differ (see [`mysql::DIALECT`], [`sqlite::DIALECT`],
/// [`postgres::DIALECT`]).
#[derive(Debug)]
pub struct Dialect {
    /// After the locking read of the sale row in `apply_events` (` FOR UPDATE`, or nothing
    /// where the writer already holds the whole database).
    pub lock_row: &'static str,
    /// Before `fenced_events (...) VALUES ...`, and after it: an insert that skips a row whose
    /// key is stored already (a redelivered fenced event is kept once).
    pub insert_ignore: (&'static str, &'static str),
    /// After `INSERT INTO dead_letters (...) VALUES (...)`: a redelivered entry updates its row.
    pub upsert_dead_letter: &'static str,
    /// Appended to the `SET` of an operator's sale update: keeps `updated_at` current where
    /// the column does not do it by itself (MySQL's `ON UPDATE`).
    pub touch: &'static str,
    /// The column `trigger`, quoted (a reserved word everywhere).
    pub trigger: &'static str,
    /// Appended to an insert whose new `id` is wanted (empty: the driver reports it).
    pub returning_id: &'static str,
    /// Drops the unique index on `orders.order_no` if it is there (the contract to one row
    /// per purchase: an order is found by its seq).
    pub drop_order_no_index: &'static str,
    /// The contract's last step, run once while `orders` still has its `id`: the order row
    /// keyed by its deduction, `(sku_id, bucket, seq)`, with the request key its one unique
    /// index (`id` and the seq index go).
    pub key_orders_by_seq: &'static [&'static str],
}

/// `(?, ?, ...), (?, ?, ...)` for `rows` rows of `cols` placeholders.
pub fn values_placeholders(rows: usize, cols: usize) -> String {
    let row = format!("({})", vec!["?"; cols].join(", "));
    vec![row; rows].join(", ")
}

/// `?, ?, ?` for an `IN (...)` list.
pub fn list_placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Followed by `values_placeholders(n, EVENT_COLS)`. Binds per row: sku_id, epoch, seq,
/// kind, order_no, request_id, user_id, quantity, at_ms, deadline_ms, rejected.
pub const INSERT_EVENTS: &str = "INSERT INTO stock_events \
     (sku_id, epoch, seq, kind, order_no, request_id, user_id, quantity, at_ms, deadline_ms, rejected) \
     VALUES ";
pub const EVENT_COLS: usize = 11;

/// `INSERT_EVENTS` for the events of one bucket of a bucketed sale, the bucket first.
/// Followed by `values_placeholders(n, BUCKET_EVENT_COLS)`. Binds per row: bucket, then
/// `INSERT_EVENTS`'s. (A sale of one bucket keeps `INSERT_EVENTS`: its events are bucket 0,
/// the column's default, and the embedded ledger's writer runs that statement.)
pub const INSERT_BUCKET_EVENTS: &str = "INSERT INTO stock_events \
     (bucket, sku_id, epoch, seq, kind, order_no, request_id, user_id, quantity, at_ms, deadline_ms, rejected) \
     VALUES ";
pub const BUCKET_EVENT_COLS: usize = 12;

/// Followed by `values_placeholders(n, ORDER_COLS)`. Binds per row: order_no, sku_id,
/// user_id, request_id, quantity, status, deadline_ms, created_at_ms, updated_at_ms, and the
/// bucket, seq and epoch of the `deducted` event that created the order (the order row is
/// that event once the database is contracted to one row per purchase).
pub const INSERT_ORDERS: &str = "INSERT INTO orders \
     (order_no, sku_id, user_id, request_id, quantity, status, deadline_ms, created_at_ms, \
     updated_at_ms, bucket, seq, epoch) \
     VALUES ";
pub const ORDER_COLS: usize = 12;

/// An order row read as the `deducted` event it carries (`rows::order_event`): its bucket,
/// its status (REJECTED: the guard rejected the deduction), then the event's columns.
pub const ORDER_EVENT_COLUMNS: &str = "bucket, status, sku_id, epoch, seq, order_no, \
     request_id, user_id, quantity, created_at_ms, deadline_ms";

/// The schema version whose contract step makes an order row the only record of the
/// deduction that created it (`schema_compat.min_binary_version` at least this one).
pub const ONE_ROW_VERSION: i64 = 16;

/// Between the dialect's `insert_ignore` pair, followed by `values_placeholders(n,
/// FENCED_COLS)`: an event's columns in `EVENT_COLUMNS` order.
pub const FENCED_INTO: &str = "fenced_events \
     (sku_id, epoch, seq, kind, order_no, request_id, user_id, quantity, at_ms, deadline_ms) \
     VALUES ";
pub const FENCED_COLS: usize = 10;

/// The guarded counter update: the contiguity check (`applied_seq` as read), the epoch
/// fence (the sale's epoch is the one the batch's events carry) and the final guard (the
/// counters are what the fold started from, the new ones conserve the total and none is
/// negative) in one statement, so it holds whichever reads came before it. The epoch is
/// here because the embedded ledger's writer runs this statement without reading the sale
/// row first (it trusts its book): the statement is its only fence. The store's apply reads
/// the epoch under its lock and binds that one, which costs nothing more. Binds:
/// available, reserved, sold, applied_seq (new); sku_id, epoch; applied_seq, available,
/// reserved, sold (old); available, reserved, sold (new).
pub const GUARDED_UPDATE: &str = "UPDATE sales SET available = ?, reserved = ?, sold = ?, \
     applied_seq = ? \
     WHERE sku_id = ? AND epoch = ? AND applied_seq = ? AND available = ? AND reserved = ? \
     AND sold = ? AND ? >= 0 AND ? >= 0 AND ? >= 0";

/// The guarded counter update of one bucket of a bucketed sale: `GUARDED_UPDATE` on its
/// `sale_buckets` row (the bucket's own epoch and applied_seq). Binds: available, reserved,
/// sold, applied_seq (new); sku_id, bucket, epoch; applied_seq, available, reserved, sold
/// (old); available, reserved, sold (new).
pub const BUCKET_GUARDED_UPDATE: &str = "UPDATE sale_buckets SET available = ?, reserved = ?, \
     sold = ?, applied_seq = ? \
     WHERE sku_id = ? AND bucket = ? AND epoch = ? AND applied_seq = ? AND available = ? \
     AND reserved = ? AND sold = ? AND ? >= 0 AND ? >= 0 AND ? >= 0";

/// A bucketed sale's row follows its buckets: set to their sum (`follow_buckets` in
/// `store/apply.rs`).
/// Binds: available, reserved, sold; sku_id.
pub const SET_SALE_COUNTERS: &str =
    "UPDATE sales SET available = ?, reserved = ?, sold = ? WHERE sku_id = ?";

/// Followed by `values_placeholders(n, BUCKET_COLS)`: a new bucketed sale's buckets, nothing
/// sold, no epoch yet (the columns' defaults). Binds per row: sku_id, bucket, total_stock,
/// available.
pub const INSERT_BUCKETS: &str =
    "INSERT INTO sale_buckets (sku_id, bucket, total_stock, available) VALUES ";
pub const BUCKET_COLS: usize = 4;

/// Every bucket's epoch for a new sale epoch E: `E·n + bucket`, i.e. bucket 0's plus the
/// bucket (`buckets::bucket_epoch`). Binds: bucket 0's epoch, sku_id.
pub const TAKE_BUCKET_EPOCHS: &str =
    "UPDATE sale_buckets SET epoch = ? + bucket, epoch_at_ms = ? WHERE sku_id = ?";

/// One transfer side moves its bucket's total and available, while the bucket's epoch is
/// the side's and its available stays non-negative. Binds: the change of units (twice),
/// sku_id, bucket, epoch, the change of units.
pub const MOVE_BUCKET_STOCK: &str = "UPDATE sale_buckets SET total_stock = total_stock + ?, \
     available = available + ? WHERE sku_id = ? AND bucket = ? AND epoch = ? \
     AND available + ? >= 0";

/// Between the dialect's `insert_ignore` pair: one transfer side, kept once by its key
/// `(sku_id, transfer_id, side)`. Binds: `TRANSFER_COLUMNS` in order.
pub const TRANSFER_INTO: &str = "stock_transfers \
     (sku_id, transfer_id, side, epoch, from_bucket, to_bucket, units, at_ms, fenced) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
pub const TRANSFER_COLUMNS: &str =
    "sku_id, transfer_id, side, epoch, from_bucket, to_bucket, units, at_ms, fenced";
pub const BUCKET_COLUMNS: &str =
    "bucket, epoch, epoch_at_ms, applied_seq, total_stock, available, reserved, sold";

pub const ORDER_COLUMNS: &str =
    "order_no, sku_id, user_id, request_id, quantity, status, deadline_ms, created_at_ms";
pub const EVENT_COLUMNS: &str =
    "sku_id, epoch, seq, kind, order_no, request_id, user_id, quantity, at_ms, deadline_ms";
pub const SALE_COLUMNS: &str = "sku_id, name, total_stock, available, reserved, sold, \
     applied_seq, epoch, epoch_at_ms, per_user_limit, mode, payment_timeout_ms, starts_at_ms, ends_at_ms, state, buckets, \
     admission, admission_opens_at_ms, draw_at_ms";
pub const DEAD_LETTER_COLUMNS: &str = "sku_id, entry_id, seq, payload, error, attempts";
/// What `apply_events` needs of an order the batch names.
pub const KNOWN_ORDER_COLUMNS: &str = "sku_id, order_no, user_id, request_id, quantity, status";

/// Binds: sku_id, name, total_stock, available, per_user_limit, mode, payment_timeout_ms,
/// starts_at_ms, ends_at_ms, state, buckets, admission, admission_opens_at_ms, draw_at_ms. A new sale has sold nothing and has no epoch yet.
pub const INSERT_SALE: &str = "INSERT INTO sales (sku_id, name, total_stock, available, reserved, \
     sold, applied_seq, epoch, per_user_limit, mode, payment_timeout_ms, starts_at_ms, ends_at_ms, \
     state, buckets, admission, admission_opens_at_ms, draw_at_ms) \
     VALUES (?, ?, ?, ?, 0, 0, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// The compare and set of a sale's epoch. Binds: epoch_at_ms, sku_id, the current epoch.
pub const TAKE_EPOCH: &str =
    "UPDATE sales SET epoch = epoch + 1, epoch_at_ms = ? WHERE sku_id = ? AND epoch = ?";

/// The columns of `reconcile_runs` after `id`, with `trigger` quoted by the dialect.
pub fn reconcile_run_columns(d: &Dialect) -> String {
    format!(
        "sku_id, at_ms, {}, repair, ok, violations, repairs, lost_orders, lost_resolutions, report",
        d.trigger
    )
}

/// MySQL / MariaDB.
pub mod mysql {
    use super::Dialect;

    pub const DIALECT: Dialect = Dialect {
        lock_row: " FOR UPDATE",
        insert_ignore: ("INSERT IGNORE INTO ", ""),
        upsert_dead_letter: " ON DUPLICATE KEY UPDATE seq = VALUES(seq), \
             payload = VALUES(payload), error = VALUES(error), attempts = VALUES(attempts)",
        touch: "",
        trigger: "`trigger`",
        returning_id: "",
        // MariaDB's form (MySQL has no IF EXISTS here).
        drop_order_no_index: "ALTER TABLE orders DROP INDEX IF EXISTS orders_order_no",
        key_orders_by_seq: &["ALTER TABLE orders DROP PRIMARY KEY, DROP COLUMN id, \
             MODIFY seq BIGINT UNSIGNED NOT NULL, MODIFY epoch BIGINT UNSIGNED NOT NULL, \
             ADD PRIMARY KEY (sku_id, bucket, seq), DROP INDEX orders_seq"],
    };
}

/// SQLite (the embedded deployment). The embedded ledger's writer runs these texts with
/// rusqlite; `?` placeholders bind in order there too.
pub mod sqlite {
    use super::Dialect;
    pub use super::{
        values_placeholders, EVENT_COLS, GUARDED_UPDATE, INSERT_EVENTS, INSERT_ORDERS, ORDER_COLS,
    };

    pub const DIALECT: Dialect = Dialect {
        // The one writer connection and BEGIN IMMEDIATE already hold the whole database.
        lock_row: "",
        insert_ignore: ("INSERT OR IGNORE INTO ", ""),
        upsert_dead_letter: " ON CONFLICT (sku_id, entry_id) DO UPDATE SET seq = excluded.seq, \
             payload = excluded.payload, error = excluded.error, attempts = excluded.attempts",
        touch: ", updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        trigger: "\"trigger\"",
        returning_id: " RETURNING id",
        drop_order_no_index: "DROP INDEX IF EXISTS orders_order_no",
        // SQLite changes no primary key in place: the table is rebuilt (every column and
        // CHECK of migrations 1 and 16, `id` left out), without a rowid.
        key_orders_by_seq: &[
            "CREATE TABLE orders_by_seq (
                sku_id        INTEGER NOT NULL,
                bucket        INTEGER NOT NULL DEFAULT 0,
                seq           INTEGER NOT NULL,
                epoch         INTEGER NOT NULL,
                order_no      TEXT NOT NULL,
                user_id       INTEGER NOT NULL,
                request_id    TEXT NOT NULL,
                quantity      INTEGER NOT NULL,
                status        TEXT NOT NULL,
                deadline_ms   INTEGER NOT NULL DEFAULT 0,
                created_at_ms INTEGER NOT NULL,
                updated_at_ms INTEGER NOT NULL,
                PRIMARY KEY (sku_id, bucket, seq),
                CONSTRAINT orders_quantity_positive CHECK (quantity > 0),
                CONSTRAINT orders_status CHECK (status IN
                    ('PENDING', 'CREATED', 'RESERVED', 'PAID', 'CANCELLED', 'EXPIRED', 'REJECTED'))
            ) WITHOUT ROWID",
            "INSERT INTO orders_by_seq (sku_id, bucket, seq, epoch, order_no, user_id, request_id, \
             quantity, status, deadline_ms, created_at_ms, updated_at_ms) \
             SELECT sku_id, bucket, seq, epoch, order_no, user_id, request_id, quantity, status, \
             deadline_ms, created_at_ms, updated_at_ms FROM orders",
            "DROP TABLE orders",
            "ALTER TABLE orders_by_seq RENAME TO orders",
            "CREATE UNIQUE INDEX orders_request ON orders (sku_id, user_id, request_id)",
        ],
    };
}

/// PostgreSQL.
pub mod postgres {
    use super::Dialect;

    /// SQLite's where both speak standard SQL (upsert, quoting, `RETURNING`).
    pub const DIALECT: Dialect = Dialect {
        lock_row: " FOR UPDATE",
        insert_ignore: ("INSERT INTO ", " ON CONFLICT DO NOTHING"),
        touch: ", updated_at = CURRENT_TIMESTAMP",
        drop_order_no_index: "ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_order_no",
        key_orders_by_seq: &[
            "ALTER TABLE orders DROP COLUMN id, ALTER COLUMN seq SET NOT NULL, \
             ALTER COLUMN epoch SET NOT NULL, \
             ADD CONSTRAINT orders_by_seq PRIMARY KEY (sku_id, bucket, seq)",
            "DROP INDEX IF EXISTS orders_seq",
        ],
        ..super::sqlite::DIALECT
    };

    /// `sql` with its `?` placeholders numbered `$1, $2, ...` in order (the statements of
    /// this crate hold no `?` inside a literal).
    pub fn numbered(sql: &str) -> String {
        let mut out = String::with_capacity(sql.len() + sql.len() / 4);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn placeholders_are_numbered_in_order() {
            assert_eq!(
                super::numbered("UPDATE t SET a = ? WHERE b IN (?, ?)"),
                "UPDATE t SET a = $1 WHERE b IN ($2, $3)"
            );
        }
    }
}
