//! The order-event relay's side of the system of record ([`EventLog`] for [`Store`]): the
//! ordered event log read by `(sku_id, bucket, seq)` off `stock_events`' primary key, each
//! stream's head from the guarded counters (`sales.applied_seq`, `sale_buckets.applied_seq`),
//! and the relay's own rows (`event_sinks`, `event_positions`, migration 0013). A sale's
//! notices ([`crate::notices`]) are one more stream ([`StreamKey::notices`]): its head is
//! `sales.notice_seq` and its positions are in `notice_positions` (migration 0015).
//!
//! A stream's events commit in seq order (the guarded update is a contiguity check), so a
//! reader that sees seq n has seen every seq below it: reading `seq > position` skips nothing.

use std::collections::BTreeMap;

use async_trait::async_trait;
use flashsale_core::events::{EventLog, LoggedEvent, Notice, SinkRow, StreamHead, StreamKey};
use flashsale_core::{SkuId, StoreError};

use crate::backend::{Arg, Backend, Columns};
use crate::store::Store;

/// The longest error text kept per sink.
const ERROR_LEN_MAX: usize = 1_000;

fn bucket_of<R: Columns>(row: &R) -> Result<u16, StoreError> {
    let b = row.small("bucket")?;
    u16::try_from(b).map_err(|_| StoreError::Internal(format!("bucket out of range: {b}")))
}

fn stream_of<R: Columns>(row: &R) -> Result<StreamKey, StoreError> {
    Ok(StreamKey {
        sku: SkuId(row.uint("sku_id")?),
        bucket: bucket_of(row)?,
    })
}

fn sink_row<R: Columns>(row: &R) -> Result<SinkRow, StoreError> {
    let last_error = row.text("last_error")?;
    Ok(SinkRow {
        sink: row.text("sink")?,
        holder: row.text("holder")?,
        lease_until_ms: row.int("lease_until_ms")?,
        paused: row.flag("paused")?,
        failures: row.small("failures")?,
        last_error: (!last_error.is_empty()).then_some(last_error),
        last_error_at_ms: row.int("last_error_at_ms")?,
    })
}

/// At most `max` bytes of `s`, cut on a character boundary.
fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl<B: Backend> Store<B> {
    /// The sink's row, created when missing.
    async fn ensure_sink(&self, sink: &str) -> Result<(), StoreError> {
        let (head, tail) = B::DIALECT.insert_ignore;
        let sql = format!("{head}event_sinks (sink) VALUES (?){tail}");
        self.write(&sql, &[Arg::Text(sink)]).await.map(drop)
    }

    /// The sink's position row in a stream, created at 0 when missing.
    async fn ensure_position(&self, sink: &str, stream: StreamKey) -> Result<(), StoreError> {
        let (head, tail) = B::DIALECT.insert_ignore;
        let (table, _, args) = position_key(sink, stream);
        let (cols, values) = match stream.is_notices() {
            true => ("sink, sku_id", "?, ?"),
            false => ("sink, sku_id, bucket", "?, ?, ?"),
        };
        let sql =
            format!("{head}{table} ({cols}, seq, updated_at_ms) VALUES ({values}, 0, 0){tail}");
        self.write(&sql, &args).await.map(drop)
    }
}

/// Where a sink's position in `stream` is kept: the table, the condition naming its row and
/// that condition's binds.
fn position_key(sink: &str, stream: StreamKey) -> (&'static str, &'static str, Vec<Arg<'_>>) {
    let mut args = vec![Arg::Text(sink), Arg::Id(stream.sku.0)];
    if stream.is_notices() {
        return ("notice_positions", "sink = ? AND sku_id = ?", args);
    }
    args.push(Arg::Small(u32::from(stream.bucket)));
    (
        "event_positions",
        "sink = ? AND sku_id = ? AND bucket = ?",
        args,
    )
}

#[async_trait]
impl<B: Backend> EventLog for Store<B> {
    async fn event_streams(&self) -> Result<Vec<StreamHead>, StoreError> {
        let mut heads: BTreeMap<StreamKey, u64> = BTreeMap::new();
        let sales = self
            .read(
                "SELECT sku_id, applied_seq FROM sales WHERE applied_seq > 0",
                &[],
            )
            .await?;
        for row in &sales {
            let stream = StreamKey {
                sku: SkuId(row.uint("sku_id")?),
                bucket: 0,
            };
            heads.insert(stream, row.uint("applied_seq")?);
        }
        let buckets = self
            .read(
                "SELECT sku_id, bucket, applied_seq FROM sale_buckets WHERE applied_seq > 0",
                &[],
            )
            .await?;
        for row in &buckets {
            let head = row.uint("applied_seq")?;
            let seen = heads.entry(stream_of(row)?).or_insert(head);
            *seen = (*seen).max(head);
        }
        let notices = self
            .read(
                "SELECT sku_id, notice_seq FROM sales WHERE notice_seq > 0",
                &[],
            )
            .await?;
        for row in &notices {
            let stream = StreamKey::notices(SkuId(row.uint("sku_id")?));
            heads.insert(stream, row.uint("notice_seq")?);
        }
        Ok(heads
            .into_iter()
            .map(|(stream, head)| StreamHead { stream, head })
            .collect())
    }

    async fn logged_notices(
        &self,
        sku: SkuId,
        after: u64,
        max: usize,
    ) -> Result<Vec<Notice>, StoreError> {
        crate::notices::read(self, sku, after, max).await
    }

    async fn logged_events(
        &self,
        stream: StreamKey,
        after: u64,
        max: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError> {
        let args = [
            Arg::Id(stream.sku.0),
            Arg::Small(u32::from(stream.bucket)),
            Arg::Id(after.min(i64::MAX as u64)),
        ];
        self.logged(
            "sku_id = ? AND bucket = ? AND seq > ?",
            &args,
            Some(max.max(1)),
        )
        .await
    }

    async fn positions(&self, sink: &str) -> Result<Vec<(StreamKey, u64)>, StoreError> {
        let rows = self
            .read(
                "SELECT sku_id, bucket, seq FROM event_positions WHERE sink = ?",
                &[Arg::Text(sink)],
            )
            .await?;
        let mut out = rows
            .iter()
            .map(|r| Ok((stream_of(r)?, r.uint("seq")?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let notices = self
            .read(
                "SELECT sku_id, seq FROM notice_positions WHERE sink = ?",
                &[Arg::Text(sink)],
            )
            .await?;
        for r in &notices {
            out.push((StreamKey::notices(SkuId(r.uint("sku_id")?)), r.uint("seq")?));
        }
        Ok(out)
    }

    async fn advance_position(
        &self,
        sink: &str,
        stream: StreamKey,
        from: u64,
        to: u64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        if from == 0 {
            self.ensure_position(sink, stream).await?;
        }
        let (table, row, key) = position_key(sink, stream);
        let sql = format!("UPDATE {table} SET seq = ?, updated_at_ms = ? WHERE {row} AND seq = ?");
        let mut args = vec![Arg::Id(to), Arg::Int(now_ms)];
        args.extend(key);
        args.push(Arg::Id(from));
        Ok(self.write(&sql, &args).await? == 1)
    }

    async fn set_position(
        &self,
        sink: &str,
        stream: StreamKey,
        seq: u64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.ensure_position(sink, stream).await?;
        let (table, row, key) = position_key(sink, stream);
        let sql = format!("UPDATE {table} SET seq = ?, updated_at_ms = ? WHERE {row}");
        let mut args = vec![Arg::Id(seq), Arg::Int(now_ms)];
        args.extend(key);
        self.write(&sql, &args).await.map(drop)
    }

    async fn take_sink_lease(
        &self,
        sink: &str,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE event_sinks SET holder = ?, lease_until_ms = ? \
                   WHERE sink = ? AND (holder = ? OR lease_until_ms < ?)";
        let args = [
            Arg::Text(holder),
            Arg::Int(now_ms.saturating_add(ttl_ms)),
            Arg::Text(sink),
            Arg::Text(holder),
            Arg::Int(now_ms),
        ];
        if self.write(sql, &args).await? == 1 {
            return Ok(true);
        }
        self.ensure_sink(sink).await?;
        Ok(self.write(sql, &args).await? == 1)
    }

    async fn release_sink_lease(&self, sink: &str, holder: &str) -> Result<(), StoreError> {
        let sql = "UPDATE event_sinks SET lease_until_ms = 0 WHERE sink = ? AND holder = ?";
        self.write(sql, &[Arg::Text(sink), Arg::Text(holder)])
            .await
            .map(drop)
    }

    async fn sinks(&self) -> Result<Vec<SinkRow>, StoreError> {
        let rows = self
            .read(
                "SELECT sink, holder, lease_until_ms, paused, failures, last_error, \
                 last_error_at_ms FROM event_sinks ORDER BY sink",
                &[],
            )
            .await?;
        rows.iter().map(sink_row).collect()
    }

    async fn record_sink_outcome(
        &self,
        sink: &str,
        error: Option<&str>,
        now_ms: i64,
    ) -> Result<u32, StoreError> {
        let Some(error) = error else {
            let sql = "UPDATE event_sinks SET failures = 0 WHERE sink = ? AND failures <> 0";
            self.write(sql, &[Arg::Text(sink)]).await?;
            return Ok(0);
        };
        self.ensure_sink(sink).await?;
        let sql = "UPDATE event_sinks SET failures = failures + 1, last_error = ?, \
                   last_error_at_ms = ? WHERE sink = ?";
        let args = [
            Arg::Text(clip(error, ERROR_LEN_MAX)),
            Arg::Int(now_ms),
            Arg::Text(sink),
        ];
        self.write(sql, &args).await?;
        let rows = self
            .read(
                "SELECT failures FROM event_sinks WHERE sink = ?",
                &[Arg::Text(sink)],
            )
            .await?;
        rows.first().map_or(Ok(0), |r| r.small("failures"))
    }

    async fn set_sink_paused(&self, sink: &str, paused: bool) -> Result<(), StoreError> {
        self.ensure_sink(sink).await?;
        let sql = "UPDATE event_sinks SET paused = ?, failures = 0 WHERE sink = ?";
        self.write(sql, &[Arg::Flag(paused), Arg::Text(sink)])
            .await
            .map(drop)
    }
}
