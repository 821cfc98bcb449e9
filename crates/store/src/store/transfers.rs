//! A transfer side between a bucketed sale's buckets, stored once per key in its own
//! transaction: moved into its bucket's row when of the bucket's epoch, kept as fenced when
//! of a replaced copy.

use flashsale_core::{BucketRow, StoreError, TransferApplied, TransferEvent};

use super::base::Tx;
use super::buckets::locked_bucket;
use crate::backend::{signed, Arg, Backend, Columns as _};
use crate::rows;
use crate::sql;

/// What a transfer side must be before the store looks at it (the CHECKs refuse it too, but
/// MySQL's `INSERT IGNORE` would turn a refusal into a skipped row).
pub(super) fn check_transfer(t: &TransferEvent) -> Result<(), StoreError> {
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
pub(super) async fn locked_transfer_bucket<B: Backend>(
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
pub(super) async fn move_stock<B: Backend>(
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
pub(super) async fn insert_transfer<B: Backend>(
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
