//! `OrderStore` on [`Store`]: each method once over the backend. A batch's apply and a
//! transfer side are in `apply` and `transfers`; a bucketed sale's rows in `buckets`.

use std::ops::RangeInclusive;

use async_trait::async_trait;

use flashsale_core::buckets::split_stock;
use flashsale_core::{
    ApplyReport, BucketRow, DeadLetter, Event, HotOrder, OrderNo, OrderStore, ReconcileRun, Sale,
    SaleAudit, SaleState, SkuId, StoreError, StoredSale, TransferApplied, TransferEvent,
};

use super::base::{begin, events_of, of_pairs, Store};
use super::buckets::audit_buckets;
use super::one_row::{orders_and_log, sale_orders_sql};
use super::transfers::{check_transfer, insert_transfer, locked_transfer_bucket, move_stock};
use crate::backend::{signed, Arg, Backend, Columns as _};
use crate::batch::CHUNK_ROWS;
use crate::rows::{self, db_error, SaleRow};
use crate::sql::{self, list_placeholders};

impl<B: Backend> Store<B> {
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
        let no = order_no.to_string();
        if !self.one_row_now().await? {
            let sql = format!(
                "SELECT {} FROM orders WHERE order_no = ?",
                sql::ORDER_COLUMNS
            );
            let rows = self.read(&sql, &[Arg::Text(&no)]).await?;
            return rows.first().map(rows::order).transpose();
        }
        // No order-number index after the contract: the number names the seq, and the
        // bucket is 0 or the number's epoch's among the sale's buckets.
        let sql = format!(
            "SELECT {} FROM orders WHERE sku_id = ? AND bucket IN (0, ? % \
             (SELECT buckets FROM sales WHERE sku_id = ?)) AND seq = ? AND order_no = ?",
            sql::ORDER_COLUMNS
        );
        let sku = order_no.sku;
        let args = [
            Arg::Id(sku.0),
            Arg::Id(order_no.epoch),
            Arg::Id(sku.0),
            Arg::Id(order_no.seq),
            Arg::Text(&no),
        ];
        let rows = self.read(&sql, &args).await?;
        rows.first().map(rows::order).transpose()
    }

    async fn orders(&self, sku: SkuId) -> Result<Vec<HotOrder>, StoreError> {
        let sql = sale_orders_sql(self.one_row_now().await?, false);
        let rows = self.read(&sql, &[Arg::Id(sku.0)]).await?;
        rows.iter().map(rows::order).collect()
    }

    /// Every bucket's events, by bucket then seq (a sale of one bucket: its events by seq);
    /// an event's bucket is `epoch % buckets`.
    async fn events(&self, sku: SkuId) -> Result<Vec<Event>, StoreError> {
        let rows = self.logged("sku_id = ?", &[Arg::Id(sku.0)], None).await?;
        Ok(rows.into_iter().map(|r| r.event).collect())
    }

    /// Bucket 0's range: a sale of one bucket's events (seqs are a bucket's own, so a
    /// bucketed sale's other buckets are read with [`Store::bucket_events_between`]).
    async fn events_between(
        &self,
        sku: SkuId,
        seqs: RangeInclusive<u64>,
    ) -> Result<Vec<Event>, StoreError> {
        self.bucket_events_between(sku, 0, *seqs.start(), *seqs.end())
            .await
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
        row: &BucketRow,
    ) -> Result<Option<u64>, StoreError> {
        let (bucket, current) = (row.bucket, row.epoch);
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
        let (orders, events) = orders_and_log::<B>(&mut tx, sku).await?;
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
