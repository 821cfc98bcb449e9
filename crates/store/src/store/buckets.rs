//! A bucketed sale's rows: created with the sale or split later, each bucket's epoch taken
//! with the sale's, a bucket's row locked for a batch or a transfer, read for an audit.

use flashsale_core::buckets::{bucket_epoch, split_stock};
use flashsale_core::{BucketRow, Event, SkuId, StoreError, TransferEvent, TransferSide};

use super::base::{locked_sale, Store, Tx};
use crate::backend::{signed, Arg, Backend, Columns as _};
use crate::rows::{self, db_error};
use crate::sql::{self, values_placeholders};

impl<B: Backend> Store<B> {
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
        let cond = "sku_id = ? AND bucket = ? AND seq >= ? AND seq <= ?";
        let args = [
            Arg::Id(sku.0),
            Arg::Small(u32::from(bucket)),
            Arg::Id(clamp(from_seq)),
            Arg::Id(clamp(to_seq)),
        ];
        let rows = self.logged(cond, &args, None).await?;
        Ok(rows.into_iter().map(|r| r.event).collect())
    }

    /// A sale's bucket count, `None` for no such sale. Fixed when the sale is created, so it
    /// may be read outside the transaction that depends on it.
    pub(super) async fn bucket_count(&self, sku: SkuId) -> Result<Option<u16>, StoreError> {
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
    pub(super) async fn insert_bucketed(
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
    pub(super) async fn split_fresh(&self, sku: SkuId) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let stored = locked_sale::<B>(&mut tx, sku).await?.into_stored()?;
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
    pub(super) async fn take_bucketed_epoch(
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
}

/// A bucket's row, locked where the database has row locks (after its sale row, always in
/// that order, so two writers never wait for each other crosswise).
pub(super) async fn locked_bucket<B: Backend>(
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

/// A bucketed sale's bucket rows and applied transfer sides (by id, out before in), in the
/// audit's snapshot. Sorted here, not by the database: collations order ids differently.
pub(super) async fn audit_buckets<B: Backend>(
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
