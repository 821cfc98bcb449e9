//! The system of record as the checker reads it: straight from MariaDB's tables with sqlx,
//! never through the service's own code or counters' API.

use std::collections::BTreeSet;

use flashsale_core::ledger::StoredSale;
use flashsale_core::{
    BucketRow, Counters, Event, EventKind, HotOrder, OrderNo, OrderStatus, RequestId, Sale,
    SaleMode, SaleState, SkuId, TransferEvent, TransferSide, UserId,
};
use sqlx::mysql::MySqlRow;
use sqlx::{Connection, MySqlConnection, Row};

/// A `stock_events` row: the event, its epoch when the table has that column, and whether the
/// guard refused it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub event: Event,
    pub epoch: Option<u64>,
    pub rejected: bool,
}

/// Everything the checker reads from the database.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    pub sales: Vec<StoredSale>,
    pub orders: Vec<HotOrder>,
    pub events: Vec<StoredEvent>,
    /// `sale_buckets` rows of sales kept in buckets, with their sku.
    pub buckets: Vec<(SkuId, BucketRow)>,
    /// Applied (unfenced) `stock_transfers` sides.
    pub transfers: Vec<TransferEvent>,
    /// Union of `reconcile_runs.lost_orders`: order numbers reported lost.
    pub lost_orders: BTreeSet<String>,
    /// Union of `reconcile_runs.lost_resolutions` (`"<order_no> paid"` lines); empty when the
    /// column does not exist.
    pub lost_resolutions: BTreeSet<String>,
}

/// Reads everything in one transaction: one InnoDB snapshot, so that a hold the expiry worker
/// resolves meanwhile cannot show as an event without its counters.
pub async fn read(url: &str) -> Stored {
    let mut conn = MySqlConnection::connect(url)
        .await
        .expect("connect to MariaDB to check");
    let mut tx = conn.begin().await.expect("begin a read transaction");
    let db: &mut MySqlConnection = &mut tx;
    let has_epoch = has_column(db, "stock_events", "epoch").await;
    let has_resolutions = has_column(db, "reconcile_runs", "lost_resolutions").await;
    let sales = fetch(db, "SELECT * FROM sales ORDER BY sku_id").await;
    let orders = fetch(db, "SELECT * FROM orders ORDER BY id").await;
    let events = fetch(db, "SELECT * FROM stock_events ORDER BY sku_id, seq").await;
    let mut stored = Stored {
        sales: sales.iter().map(sale).collect(),
        orders: orders.iter().map(order).collect(),
        events: events.iter().map(|r| event(r, has_epoch)).collect(),
        ..Stored::default()
    };
    if has_column(db, "sale_buckets", "bucket").await {
        let rows = fetch(db, "SELECT * FROM sale_buckets ORDER BY sku_id, bucket").await;
        stored.buckets = rows.iter().map(bucket_row).collect();
        let sql = "SELECT * FROM stock_transfers WHERE NOT fenced ORDER BY sku_id, transfer_id";
        stored.transfers = fetch(db, sql).await.iter().map(transfer).collect();
    }
    stored.lost_orders = lines(db, "lost_orders", 1).await;
    if has_resolutions {
        stored.lost_resolutions = lines(db, "lost_resolutions", 2).await;
    }
    tx.rollback().await.expect("end the read transaction");
    stored
}

async fn fetch(db: &mut MySqlConnection, sql: &str) -> Vec<MySqlRow> {
    sqlx::query(sql)
        .fetch_all(db)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn has_column(db: &mut MySqlConnection, table: &str, column: &str) -> bool {
    let sql = "SELECT COUNT(*) AS n FROM information_schema.COLUMNS \
               WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?";
    let n: i64 = sqlx::query(sql)
        .bind(table)
        .bind(column)
        .fetch_one(db)
        .await
        .expect("read information_schema")
        .get("n");
    n > 0
}

/// The non-empty lines of one text column over every reconcile run, each cut to its first
/// `words` words (an order number; an order number and what was lost of it), so that a line
/// that says more after them still names the same thing.
async fn lines(db: &mut MySqlConnection, column: &str, words: usize) -> BTreeSet<String> {
    let sql = format!("SELECT `{column}` AS v FROM reconcile_runs");
    let mut all = BTreeSet::new();
    for row in fetch(db, &sql).await {
        let value: Option<String> = row.try_get_unchecked("v").unwrap_or_default();
        for line in value.unwrap_or_default().lines() {
            let head: Vec<&str> = line.split_whitespace().take(words).collect();
            if !head.is_empty() {
                all.insert(head.join(" "));
            }
        }
    }
    all
}

fn sale(r: &MySqlRow) -> StoredSale {
    let total: i64 = r.get("total_stock");
    let counters = Counters {
        total: total as u64,
        available: r.get::<i64, _>("available") as u64,
        reserved: r.get::<i64, _>("reserved") as u64,
        sold: r.get::<i64, _>("sold") as u64,
        seq: r.get("applied_seq"),
    };
    let sale = Sale {
        sku_id: SkuId(r.get("sku_id")),
        name: r.get("name"),
        total_stock: total as u64,
        per_user_limit: r.get("per_user_limit"),
        mode: SaleMode::parse(r.get("mode")).expect("stored mode"),
        payment_timeout_ms: r.get("payment_timeout_ms"),
        starts_at_ms: r.get("starts_at_ms"),
        ends_at_ms: r.get("ends_at_ms"),
        state: SaleState::parse(r.get("state")).expect("stored state"),
        buckets: u16::try_from(r.get::<u32, _>("buckets")).expect("stored buckets"),
        admission: Default::default(),
    };
    StoredSale {
        sale,
        counters,
        epoch: r.get("epoch"),
        epoch_at_ms: r.get("epoch_at_ms"),
    }
}

fn bucket_row(r: &MySqlRow) -> (SkuId, BucketRow) {
    let counters = Counters {
        total: r.get::<i64, _>("total_stock") as u64,
        available: r.get::<i64, _>("available") as u64,
        reserved: r.get::<i64, _>("reserved") as u64,
        sold: r.get::<i64, _>("sold") as u64,
        seq: r.get("applied_seq"),
    };
    let bucket = u16::try_from(r.get::<u32, _>("bucket")).expect("stored bucket");
    let row = BucketRow {
        bucket,
        epoch: r.get("epoch"),
        epoch_at_ms: r.get("epoch_at_ms"),
        counters,
    };
    (SkuId(r.get("sku_id")), row)
}

fn transfer(r: &MySqlRow) -> TransferEvent {
    let bucket = |c: &str| u16::try_from(r.get::<u32, _>(c)).expect("stored bucket");
    TransferEvent {
        sku_id: SkuId(r.get("sku_id")),
        epoch: r.get("epoch"),
        id: text(r, "transfer_id"),
        side: TransferSide::parse(&text(r, "side")).expect("stored side"),
        from: bucket("from_bucket"),
        to: bucket("to_bucket"),
        units: r.get("units"),
        at_ms: r.get("at_ms"),
    }
}

fn order(r: &MySqlRow) -> HotOrder {
    HotOrder {
        order_no: order_no(&text(r, "order_no")),
        sku_id: SkuId(r.get("sku_id")),
        user_id: UserId(r.get("user_id")),
        request_id: request_id(&text(r, "request_id")),
        quantity: r.get("quantity"),
        status: OrderStatus::parse(r.get("status")).expect("stored status"),
        deadline_ms: r.get("deadline_ms"),
        created_at_ms: r.get("created_at_ms"),
    }
}

fn event(r: &MySqlRow, has_epoch: bool) -> StoredEvent {
    let event = Event {
        sku_id: SkuId(r.get("sku_id")),
        epoch: if has_epoch { r.get("epoch") } else { 0 },
        seq: r.get("seq"),
        kind: EventKind::parse(r.get("kind")).expect("stored kind"),
        order_no: order_no(&text(r, "order_no")),
        request_id: request_id(&text(r, "request_id")),
        user_id: UserId(r.get("user_id")),
        quantity: r.get("quantity"),
        at_ms: r.get("at_ms"),
        deadline_ms: r.get("deadline_ms"),
    };
    StoredEvent {
        event,
        epoch: has_epoch.then(|| r.get("epoch")),
        rejected: r.get("rejected"),
    }
}

/// An `ascii_bin` column (MariaDB reports it as VARBINARY) as text.
fn text(r: &MySqlRow, column: &str) -> String {
    r.try_get_unchecked::<String, _>(column)
        .unwrap_or_else(|e| panic!("column {column}: {e}"))
}

fn order_no(s: &str) -> OrderNo {
    OrderNo::parse(s).unwrap_or_else(|| panic!("stored order_no {s:?} is malformed"))
}

fn request_id(s: &str) -> RequestId {
    RequestId::parse(s).unwrap_or_else(|| panic!("stored request_id {s:?} is malformed"))
}
