//! Rows as every backend reads them, and their conversion to domain types. Each backend only
//! says how it decodes one column ([`Columns`]: the column types differ); the mapping of a
//! row is written once, here.

use flashsale_core::{
    Admission, AdmissionMode, BucketRow, Counters, DeadLetter, Event, EventKind, HotOrder,
    OrderStatus, ReconcileRun, RequestId, Sale, SaleMode, SaleState, SkuId, StoreError, StoredSale,
    TransferEvent, TransferSide, UserId,
};

use crate::backend::Columns;
use crate::batch::{order_no, parse, KnownOrder};
use flashsale_core::events::LoggedEvent;

pub(crate) struct SaleRow {
    pub sku_id: u64,
    pub name: String,
    pub total_stock: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub applied_seq: u64,
    pub epoch: u64,
    pub epoch_at_ms: i64,
    pub per_user_limit: u32,
    pub mode: String,
    pub payment_timeout_ms: u64,
    pub starts_at_ms: i64,
    pub ends_at_ms: i64,
    pub state: String,
    pub buckets: u32,
    pub admission: String,
    pub admission_opens_at_ms: i64,
    pub draw_at_ms: i64,
}

fn count(what: &str, v: i64) -> Result<u64, StoreError> {
    u64::try_from(v)
        .map_err(|_| StoreError::Internal(format!("negative {what} in the database: {v}")))
}

impl SaleRow {
    /// A row of `sales`.
    pub fn read<R: Columns>(row: &R) -> Result<SaleRow, StoreError> {
        Ok(SaleRow {
            sku_id: row.uint("sku_id")?,
            name: row.text("name")?,
            total_stock: row.int("total_stock")?,
            available: row.int("available")?,
            reserved: row.int("reserved")?,
            sold: row.int("sold")?,
            applied_seq: row.uint("applied_seq")?,
            epoch: row.uint("epoch")?,
            epoch_at_ms: row.int("epoch_at_ms")?,
            per_user_limit: row.small("per_user_limit")?,
            mode: row.text("mode")?,
            payment_timeout_ms: row.uint("payment_timeout_ms")?,
            starts_at_ms: row.int("starts_at_ms")?,
            ends_at_ms: row.int("ends_at_ms")?,
            state: row.text("state")?,
            buckets: row.small("buckets")?,
            admission: row.text("admission")?,
            admission_opens_at_ms: row.int("admission_opens_at_ms")?,
            draw_at_ms: row.int("draw_at_ms")?,
        })
    }

    pub fn mode(&self) -> Result<SaleMode, StoreError> {
        parse("mode", &self.mode, SaleMode::parse)
    }

    pub fn counters(&self) -> Result<Counters, StoreError> {
        Ok(Counters {
            total: count("total_stock", self.total_stock)?,
            available: count("available", self.available)?,
            reserved: count("reserved", self.reserved)?,
            sold: count("sold", self.sold)?,
            seq: self.applied_seq,
        })
    }

    /// How many buckets the sale's stock is split over (fixed when it is created).
    pub fn bucket_count(&self) -> Result<u16, StoreError> {
        bucket_number("buckets", self.buckets)
    }

    pub fn into_stored(self) -> Result<StoredSale, StoreError> {
        let counters = self.counters()?;
        let mode = self.mode()?;
        let state = parse("state", &self.state, SaleState::parse)?;
        let buckets = self.bucket_count()?;
        let admission = Admission {
            mode: parse("admission", &self.admission, AdmissionMode::parse)?,
            admission_opens_at_ms: self.admission_opens_at_ms,
            draw_at_ms: self.draw_at_ms,
        };
        Ok(StoredSale {
            sale: Sale {
                sku_id: SkuId(self.sku_id),
                name: self.name,
                total_stock: counters.total,
                per_user_limit: self.per_user_limit,
                mode,
                payment_timeout_ms: self.payment_timeout_ms,
                starts_at_ms: self.starts_at_ms,
                ends_at_ms: self.ends_at_ms,
                state,
                buckets,
                admission,
            },
            counters,
            epoch: self.epoch,
            epoch_at_ms: self.epoch_at_ms,
        })
    }
}

/// An order row (`orders`).
pub(crate) fn order<R: Columns>(row: &R) -> Result<HotOrder, StoreError> {
    Ok(HotOrder {
        order_no: order_no(&row.text("order_no")?)?,
        sku_id: SkuId(row.uint("sku_id")?),
        user_id: UserId(row.uint("user_id")?),
        request_id: parse("request_id", &row.text("request_id")?, RequestId::parse)?,
        quantity: row.small("quantity")?,
        status: parse("status", &row.text("status")?, OrderStatus::parse)?,
        deadline_ms: row.int("deadline_ms")?,
        created_at_ms: row.int("created_at_ms")?,
    })
}

/// An event row (`stock_events`, `fenced_events`).
pub(crate) fn event<R: Columns>(row: &R) -> Result<Event, StoreError> {
    let kind = parse("kind", &row.text("kind")?, EventKind::parse)?;
    event_as(row, kind, row.int("at_ms")?)
}

/// The event a row holds, of `kind` at `at_ms` (what an event row stores and an order row
/// implies), its other columns named as in `stock_events`.
fn event_as<R: Columns>(row: &R, kind: EventKind, at_ms: i64) -> Result<Event, StoreError> {
    Ok(Event {
        sku_id: SkuId(row.uint("sku_id")?),
        epoch: row.uint("epoch")?,
        seq: row.uint("seq")?,
        kind,
        order_no: order_no(&row.text("order_no")?)?,
        request_id: parse("request_id", &row.text("request_id")?, RequestId::parse)?,
        user_id: UserId(row.uint("user_id")?),
        quantity: row.small("quantity")?,
        at_ms,
        deadline_ms: row.int("deadline_ms")?,
    })
}

/// An order row read as the `deducted` event that created it (`sql::ORDER_EVENT_COLUMNS`):
/// the event at its seq, at the order's creation, rejected when the guard made it REJECTED.
pub(crate) fn order_event<R: Columns>(row: &R) -> Result<LoggedEvent, StoreError> {
    deduction(row, &order(row)?)
}

/// The `deducted` event of `order`, read from its row already: the row's bucket, seq and
/// epoch are the deduction's.
pub(crate) fn deduction<R: Columns>(row: &R, order: &HotOrder) -> Result<LoggedEvent, StoreError> {
    Ok(LoggedEvent {
        bucket: bucket_number("bucket", row.small("bucket")?)?,
        rejected: order.status == OrderStatus::Rejected,
        event: Event {
            sku_id: order.sku_id,
            epoch: row.uint("epoch")?,
            seq: row.uint("seq")?,
            kind: EventKind::Deducted,
            order_no: order.order_no,
            request_id: order.request_id.clone(),
            user_id: order.user_id,
            quantity: order.quantity,
            at_ms: order.created_at_ms,
            deadline_ms: order.deadline_ms,
        },
    })
}

/// A bucket number or count as stored (below 65: the CHECKs).
pub(crate) fn bucket_number(what: &str, v: u32) -> Result<u16, StoreError> {
    u16::try_from(v).map_err(|_| StoreError::Internal(format!("{what} out of range: {v}")))
}

/// A row of `sale_buckets` (`sql::BUCKET_COLUMNS`).
pub(crate) fn bucket_row<R: Columns>(row: &R) -> Result<BucketRow, StoreError> {
    Ok(BucketRow {
        bucket: bucket_number("bucket", row.small("bucket")?)?,
        epoch: row.uint("epoch")?,
        epoch_at_ms: row.int("epoch_at_ms")?,
        counters: Counters {
            total: count("total_stock", row.int("total_stock")?)?,
            available: count("available", row.int("available")?)?,
            reserved: count("reserved", row.int("reserved")?)?,
            sold: count("sold", row.int("sold")?)?,
            seq: row.uint("applied_seq")?,
        },
    })
}

/// A row of `stock_transfers` (`sql::TRANSFER_COLUMNS`).
pub(crate) fn transfer<R: Columns>(row: &R) -> Result<TransferEvent, StoreError> {
    Ok(TransferEvent {
        sku_id: SkuId(row.uint("sku_id")?),
        epoch: row.uint("epoch")?,
        id: row.text("transfer_id")?,
        side: parse("side", &row.text("side")?, TransferSide::parse)?,
        from: bucket_number("from_bucket", row.small("from_bucket")?)?,
        to: bucket_number("to_bucket", row.small("to_bucket")?)?,
        units: row.uint("units")?,
        at_ms: row.int("at_ms")?,
    })
}

/// A row of `dead_letters`.
pub(crate) fn dead_letter<R: Columns>(row: &R) -> Result<DeadLetter, StoreError> {
    Ok(DeadLetter {
        sku_id: SkuId(row.uint("sku_id")?),
        entry_id: row.text("entry_id")?,
        seq: row.opt_uint("seq")?,
        payload: row.text("payload")?,
        error: row.text("error")?,
        attempts: row.small("attempts")?,
    })
}

/// A row of `reconcile_runs`.
pub(crate) fn reconcile_run<R: Columns>(row: &R) -> Result<ReconcileRun, StoreError> {
    Ok(ReconcileRun {
        id: row.uint("id")?,
        sku_id: SkuId(row.uint("sku_id")?),
        at_ms: row.int("at_ms")?,
        trigger: row.text("trigger")?,
        repair: row.flag("repair")?,
        ok: row.flag("ok")?,
        violations: row.small("violations")?,
        repairs: lines(&row.text("repairs")?),
        lost_orders: lines(&row.text("lost_orders")?),
        lost_resolutions: lines(&row.text("lost_resolutions")?),
        report: row.text("report")?,
    })
}

/// An order the batch names, as `apply_events` reads it (`sql::KNOWN_ORDER_COLUMNS`).
pub(crate) fn known_order<R: Columns>(row: &R) -> Result<KnownOrder, StoreError> {
    Ok(KnownOrder {
        sku_id: SkuId(row.uint("sku_id")?),
        order_no: row.text("order_no")?,
        user_id: row.uint("user_id")?,
        request_id: row.text("request_id")?,
        quantity: row.small("quantity")?,
        status: parse("status", &row.text("status")?, OrderStatus::parse)?,
    })
}

/// Checks a sale before it is stored (the service validated it; the store checks again).
pub(crate) fn validate(sale: &Sale) -> Result<(), StoreError> {
    sale.validate()
        .map_err(|e| StoreError::Internal(format!("invalid sale: {e}")))?;
    i64::try_from(sale.total_stock)
        .map(|_| ())
        .map_err(|_| StoreError::Internal("total_stock too large".into()))
}

/// A sale as `create_sale` stores it: scheduled, fresh counters, epoch 0 (no hot copy yet).
pub(crate) fn created(sale: &Sale) -> StoredSale {
    StoredSale {
        sale: Sale {
            state: SaleState::Scheduled,
            ..sale.clone()
        },
        counters: sale.fresh_counters(),
        epoch: 0,
        epoch_at_ms: 0,
    }
}

/// Maps a sqlx error: connection-level trouble is `Unavailable` (retry later), the rest
/// `Internal`.
pub(crate) fn db_error(e: sqlx::Error) -> StoreError {
    use sqlx::Error as E;
    match &e {
        E::Io(_)
        | E::Tls(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed
        | E::Protocol(_) => StoreError::Unavailable(e.to_string()),
        E::Database(db) => {
            let transient =
                if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                    // Server shutdown, connection killed, gone away, lost, lock wait, deadlock.
                    matches!(my.number(), 1053 | 1927 | 2006 | 2013 | 1205 | 1213)
                } else if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                    // Connection exceptions (class 08), shutdowns and start-ups (57P01-03),
                    // too many connections, serialization failure, deadlock, lock timeout.
                    let code = pg.code();
                    code.starts_with("08")
                        || matches!(
                            code,
                            "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01" | "55P03"
                        )
                } else {
                    // SQLite primary codes: BUSY, LOCKED, IOERR, FULL, CANTOPEN.
                    db.code()
                        .and_then(|c| c.parse::<i64>().ok())
                        .is_some_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13 | 14))
                };
            if transient {
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Internal(e.to_string())
            }
        }
        _ => StoreError::Internal(e.to_string()),
    }
}

/// Newline-separated lines of a text column (empty text → no lines).
pub(crate) fn lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}
