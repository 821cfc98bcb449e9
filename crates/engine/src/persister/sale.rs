//! One hot copy's task: a [`Worker`] stepped by the runner. A step holds the copy's lease,
//! reads entries (own pending, claimed, or new, by [`Mode`]), applies them to the store in
//! transactions, then acknowledges and trims them; see the persister's module docs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_core::{
    DeadLetter, Event, OrderStore, SkuId, StoreError, TransferApplied, TransferEvent, TransferSide,
};
use flashsale_redis::{CopyTag, EntryError, Item, StreamReader};
use tokio::sync::{broadcast, watch};

use super::config::{PersistError, PersisterConfig, EVENTS_PER_APPLY_MAX, FILL_ENTRIES};
use crate::runner::{Worker, WorkerState};

/// What a sale's task does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Read own pending entries, then claim idle ones of others, then go on with new ones.
    Recover,
    /// Earlier entries are pending elsewhere: claim them before own pending ones again.
    Claim,
    Tail,
    /// A dead letter stopped the stream.
    Parked,
}

pub(super) struct SaleWorker {
    config: PersisterConfig,
    store: Arc<dyn OrderStore>,
    /// The hot copy whose stream this task persists.
    copy: CopyTag,
    /// Every copy of the sale, by bucket (a transfer's source is one of them).
    copies: Vec<CopyTag>,
    sku: SkuId,
    stop: watch::Receiver<bool>,
    mode: Mode,
    backoff_ms: u64,
    /// Failed tries by the first entry id of a batch.
    attempts: HashMap<String, u32>,
    /// Tries in a row that stopped on an entry of a newer format (0: not stopped).
    format_waits: u32,
    /// When [`SaleWorker::settled`] last looked (it reads both stores: not every read).
    settle_checked: Option<Instant>,
    /// The stream's reader, once connected.
    reader: Option<StreamReader>,
    /// The sale is settled: the task ends.
    retired: bool,
    /// `retired`, for whoever awaits the task once the runner has dropped the worker.
    retired_flag: Arc<AtomicBool>,
}

type Entry = flashsale_redis::Entry;

impl SaleWorker {
    pub(super) fn new(
        config: PersisterConfig,
        store: Arc<dyn OrderStore>,
        copy: CopyTag,
        copies: Vec<CopyTag>,
        stop: watch::Receiver<bool>,
    ) -> SaleWorker {
        SaleWorker {
            config,
            store,
            copy,
            copies,
            sku: copy.sku,
            stop,
            mode: Mode::Recover,
            backoff_ms: 0,
            attempts: HashMap::new(),
            format_waits: 0,
            reader: None,
            settle_checked: None,
            retired: false,
            retired_flag: Arc::default(),
        }
    }

    /// Persists the copy's stream until `shutdown` fires or the sale is settled; true when
    /// it retired the sale.
    pub(super) async fn run(self, shutdown: broadcast::Receiver<()>) -> bool {
        let retired = Arc::clone(&self.retired_flag);
        let _ = crate::runner::run(Box::new(self), shutdown).await;
        retired.load(Ordering::SeqCst)
    }

    /// Connects the reader; a failure waits 500 ms (or until told to stop).
    async fn connect(&mut self) {
        let c = &self.config;
        match StreamReader::connect(&c.redis_url, &c.prefix, &c.consumer).await {
            Ok(r) => self.reader = Some(r),
            Err(e) => {
                tracing::warn!(sku = %self.sku, error = %e, "persister cannot reach Redis; retrying");
                self.pause(500).await;
            }
        }
    }
}

#[async_trait::async_trait]
impl Worker for SaleWorker {
    fn name(&self) -> &'static str {
        "persister-stream"
    }

    /// One step (a failed one backs off here, within the step), or a try to connect.
    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        let Some(reader) = self.reader.take() else {
            self.connect().await;
            return Ok(WorkerState::Busy);
        };
        if let Err(e) = self.step(&reader).await {
            self.fail(&e).await;
        }
        self.reader = Some(reader);
        Ok(match self.retired {
            true => WorkerState::Done,
            false => WorkerState::Busy,
        })
    }

    /// Never idle: a step that found nothing waited in its blocking read.
    async fn wait_for_work(&mut self) -> WorkerState {
        WorkerState::Busy
    }

    /// Gives the lease up, so that another instance takes the copy over at once.
    async fn stop(&mut self) {
        if let Some(reader) = &self.reader {
            let _ = reader.release_lease(self.copy, &self.config.consumer).await;
        }
        if self.retired {
            tracing::info!(sku = %self.sku, "sale settled: its persister retires");
            self.retired_flag.store(true, Ordering::SeqCst);
        }
    }
}

impl SaleWorker {
    async fn step(&mut self, reader: &StreamReader) -> Result<(), PersistError> {
        let (sku, owner) = (self.sku, self.config.consumer.clone());
        if !reader
            .hold(self.copy, &owner, self.config.bounds.lease_ttl_ms)
            .await?
        {
            self.mode = Mode::Recover;
            self.pause(self.config.bounds.lease_ttl_ms / 3).await;
            return Ok(());
        }
        if matches!(self.mode, Mode::Recover | Mode::Parked) {
            self.mode = match self.store.stream_paused(sku).await? {
                true => Mode::Parked,
                false if self.mode == Mode::Parked => Mode::Recover,
                false => self.mode,
            };
        }
        let entries = match self.mode {
            Mode::Parked => {
                self.pause(self.config.bounds.lease_ttl_ms / 3).await;
                return Ok(());
            }
            Mode::Recover => self.recover(reader).await?,
            Mode::Claim => self.claim(reader).await?,
            Mode::Tail => self.read_filled(reader).await?,
        };
        if !entries.is_empty() {
            self.persist(reader, entries).await?;
        } else if self.mode == Mode::Tail {
            self.retired = self.settled(reader).await?;
        }
        self.backoff_ms = 0;
        Ok(())
    }

    /// New entries; a read that found a few is topped up once after the settings'
    /// `fill_wait_ms`, so that under load one transaction (and one round of lease, ack and trim
    /// commands) carries many events rather than the few that arrived since the last.
    async fn read_filled(&self, reader: &StreamReader) -> Result<Vec<Entry>, PersistError> {
        let count = self.config.bounds.batch_max;
        let mut entries = reader
            .read_new(self.copy, count, self.config.bounds.block_ms)
            .await?;
        let fill_wait_ms = self.config.bounds.fill_wait_ms;
        if !entries.is_empty() && entries.len() < FILL_ENTRIES && fill_wait_ms > 0 {
            tokio::time::sleep(Duration::from_millis(fill_wait_ms)).await;
            // A failed top-up still applies what the first read took (now pending on us).
            if let Ok(more) = reader.read_new(self.copy, count, 0).await {
                entries.extend(more);
            }
        }
        Ok(entries)
    }

    /// Own pending entries first, then entries idle with other consumers; when neither has
    /// any, recovery is over.
    async fn recover(&mut self, reader: &StreamReader) -> Result<Vec<Entry>, PersistError> {
        let own = reader
            .read_own_pending(self.copy, self.config.bounds.batch_max)
            .await?;
        if !own.is_empty() {
            return Ok(own);
        }
        self.claim(reader).await
    }

    /// Entries idle with other consumers; when none are pending elsewhere, back to recovery
    /// (own pending, then new entries).
    async fn claim(&mut self, reader: &StreamReader) -> Result<Vec<Entry>, PersistError> {
        let claimed = reader
            .autoclaim(
                self.copy,
                self.config.bounds.claim_idle_ms,
                self.config.bounds.batch_max,
            )
            .await?;
        if claimed.entries.is_empty() {
            let summary = reader.pending_summary(self.copy).await?;
            let mine = |(name, _): &(String, u64)| *name == self.config.consumer;
            let others_pending = summary.consumers.iter().filter(|c| !mine(c)).count();
            if others_pending == 0 {
                self.mode = if summary.count == 0 {
                    // Nothing pending anywhere: no entry of a newer format waits either.
                    self.clear_format_alarm();
                    Mode::Tail
                } else {
                    Mode::Recover
                };
            } else {
                // Entries of a consumer not yet idle long enough: wait for them to be.
                self.pause(self.config.bounds.claim_idle_ms / 4).await;
            }
        }
        Ok(claimed.entries)
    }

    async fn persist(
        &mut self,
        reader: &StreamReader,
        entries: Vec<Entry>,
    ) -> Result<(), PersistError> {
        let started = Instant::now();
        let entries = self.drop_deleted(reader, entries).await?;
        if entries.is_empty() {
            return Ok(());
        }
        let first_id = entries[0].0.clone();
        let (items, bad) = split(entries.iter());
        let mut entries = entries;
        match bad {
            // Persist what parses before the bad entry; the bad one comes first next time,
            // from our own pending entries (a read of new ones would never see it again).
            Some(_) if !items.is_empty() => {
                entries.truncate(items.len());
                self.mode = Mode::Recover;
            }
            Some((id, EntryError::NewerFormat(version))) => {
                return self.wait_for_newer_reader(reader, &id, version).await
            }
            Some((id, why)) => {
                let bad = Some((id, why.to_string()));
                return self.count_failure(&first_id, &entries, bad).await;
            }
            None => {}
        }
        let mut read = Read::of(items);
        read.events.sort_by_key(|e| e.seq);
        let events = &read.events;
        let (report, stored_ins) = match self.apply_read(&read).await {
            Ok(applied) => applied,
            Err(StoreError::Gap {
                applied_seq,
                first_seq,
            }) => {
                tracing::info!(sku = %self.sku, applied_seq, first_seq, "earlier events pending elsewhere; claiming");
                self.mode = Mode::Claim;
                self.pause(self.config.bounds.claim_idle_ms / 4).await;
                return Ok(());
            }
            Err(StoreError::Unavailable(m)) => return Err(StoreError::Unavailable(m).into()),
            Err(e) => {
                tracing::warn!(sku = %self.sku, error = %e, "batch refused");
                return self.count_failure(&first_id, &entries, None).await;
            }
        };
        // One id per stream entry (a batch entry's events share theirs), in stream order.
        let mut ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
        ids.dedup();
        let outs = self.stored_outs(&stored_ins);
        reader.commit(self.copy, &ids, &outs).await?;
        if let Some(persisted) = events.last().map(|e| e.seq) {
            // Events, not entries (a batch entry holds many): hot seq minus the last applied.
            let hot = reader.hot_seq(self.copy).await?.unwrap_or(persisted);
            let lag = hot.saturating_sub(persisted);
            metrics::gauge!(flashsale_core::metric_names::STREAM_LAG, "sku" => self.sku_label())
                .set(lag as f64);
        }
        self.attempts.remove(&first_id);
        self.record(&report, events.len(), started);
        self.clear_format_alarm();
        Ok(())
    }

    /// One read applied: the transfer sides that bring stock in first, then the events at
    /// most [`EVENTS_PER_APPLY_MAX`] per transaction in seq order, then the sides that take
    /// stock out. Ins early and outs late never leave the bucket with fewer units at any
    /// point than the stream's own order did, so the guard refuses nothing the hot copy
    /// accepted; the end state is the same. A failure midway leaves the entries
    /// unacknowledged: their redelivery finds the applied part as duplicates (exactly once
    /// still holds).
    /// Also answers the ins it stored (not fenced): their sources may forget them.
    async fn apply_read<'r>(
        &self,
        read: &'r Read,
    ) -> Result<(flashsale_core::ApplyReport, Vec<&'r TransferEvent>), StoreError> {
        let stored_ins = self.apply_transfers(&read.ins).await?;
        let mut total = flashsale_core::ApplyReport::default();
        for chunk in read.events.chunks(EVENTS_PER_APPLY_MAX) {
            let report = self.store.apply_events(self.sku, chunk).await?;
            total.applied += report.applied;
            total.duplicates += report.duplicates;
            total.rejected.extend(report.rejected);
            total.fenced.extend(report.fenced);
        }
        self.apply_transfers(&read.outs).await?;
        Ok((total, stored_ins))
    }

    /// Each side in one transaction of its own, exactly once; answers those stored (now or
    /// before). A side written by a copy of another epoch than its bucket's in the database
    /// is kept there, not applied, and alerted like a fenced event.
    async fn apply_transfers<'r>(
        &self,
        sides: &'r [TransferEvent],
    ) -> Result<Vec<&'r TransferEvent>, StoreError> {
        let mut stored = Vec::with_capacity(sides.len());
        for side in sides {
            if self.store.apply_transfer(side).await? == TransferApplied::Fenced {
                metrics::counter!(flashsale_core::metric_names::FENCED_EVENTS, "sku" => self.sku.to_string())
                    .increment(1);
                tracing::error!(sku = %self.sku, transfer = %side.id, side = side.side.as_str(),
                    epoch = side.epoch, "transfer side refused by the epoch fence");
            } else {
                stored.push(side);
            }
        }
        Ok(stored)
    }

    /// The pending records to forget at their sources, one per transfer whose in side was
    /// stored here: a record lives until its in is stored in the database (not until Redis
    /// took it in), so a destination that loses the in before this point is rebuilt without
    /// it and the record still there carries the units home again.
    fn stored_outs<'t>(&self, ins: &[&'t TransferEvent]) -> Vec<(CopyTag, &'t str)> {
        (ins.iter())
            .filter_map(|t| Some((*self.copies.get(usize::from(t.from))?, t.id.as_str())))
            .collect()
    }

    /// Acknowledges pending entries that no longer exist (trimmed below an acknowledged
    /// entry, so applied) and returns the rest.
    async fn drop_deleted(
        &self,
        reader: &StreamReader,
        entries: Vec<Entry>,
    ) -> Result<Vec<Entry>, PersistError> {
        let (gone, kept): (Vec<Entry>, Vec<Entry>) = entries
            .into_iter()
            .partition(|(_, e)| matches!(e, Err(EntryError::Deleted)));
        if !gone.is_empty() {
            let ids: Vec<String> = gone.into_iter().map(|(id, _)| id).collect();
            tracing::warn!(sku = %self.sku, entries = ?ids, "pending entries were trimmed; acknowledged");
            reader.ack(self.copy, &ids).await?;
        }
        Ok(kept)
    }

    /// The entry `id` is of a format newer than this binary reads: alarm, give the lease up
    /// for a newer instance, and try again after a backoff (see the module's docs). The entry
    /// stays pending, unacknowledged, for whoever can read it.
    async fn wait_for_newer_reader(
        &mut self,
        reader: &StreamReader,
        id: &str,
        version: u64,
    ) -> Result<(), PersistError> {
        let sku = self.sku;
        metrics::gauge!(flashsale_core::metric_names::STREAM_UNKNOWN_FORMAT, "sku" => sku.to_string())
            .set(version as f64);
        let wait_ms = (self.config.bounds.lease_ttl_ms << self.format_waits.min(16)).min(
            self.config
                .bounds
                .format_wait_ms_max
                .max(self.config.bounds.lease_ttl_ms),
        );
        self.format_waits = self.format_waits.saturating_add(1);
        tracing::error!(%sku, entry = %id, version, known = flashsale_redis::FORMAT_VERSION, wait_ms,
            "stream entry of a newer format: sale stopped on this instance until a newer one reads it");
        reader
            .release_lease(self.copy, &self.config.consumer)
            .await?;
        self.mode = Mode::Recover;
        self.pause(wait_ms).await;
        Ok(())
    }

    /// A read applied again after a stop on a newer format: the alarm goes off.
    fn clear_format_alarm(&mut self) {
        if self.format_waits == 0 {
            return;
        }
        self.format_waits = 0;
        metrics::gauge!(flashsale_core::metric_names::STREAM_UNKNOWN_FORMAT, "sku" => self.sku.to_string())
            .set(0.0);
        tracing::info!(sku = %self.sku, "stream readable again; the sale goes on");
    }

    /// Counts a failed try of the batch starting at `first_id`; parks the stream after
    /// `attempts_max` tries.
    async fn count_failure(
        &mut self,
        first_id: &str,
        entries: &[Entry],
        bad: Option<(String, String)>,
    ) -> Result<(), PersistError> {
        let tries = self.attempts.entry(first_id.to_owned()).or_default();
        *tries += 1;
        let tries = *tries;
        if tries < self.config.bounds.attempts_max {
            self.mode = Mode::Recover;
            self.pause(50 << tries.min(6)).await;
            return Ok(());
        }
        let (entry_id, error) =
            bad.unwrap_or_else(|| (first_id.to_owned(), "the store refused this batch".into()));
        let item = entries
            .iter()
            .find(|(id, _)| *id == entry_id)
            .and_then(|(_, e)| e.as_ref().ok());
        let letter = DeadLetter {
            sku_id: self.sku,
            entry_id: self.entry_name(&entry_id),
            seq: item.and_then(Item::event).map(|e| e.seq),
            payload: item.map(|e| format!("{e:?}")).unwrap_or_default(),
            error,
            attempts: tries,
        };
        self.store.record_dead_letter(&letter).await?;
        metrics::counter!(flashsale_core::metric_names::DEAD_LETTERS, "sku" => self.sku.to_string())
            .increment(1);
        tracing::error!(sku = %self.sku, entry = %letter.entry_id, "stream parked: entry moved to dead_letters");
        self.mode = Mode::Parked;
        Ok(())
    }

    /// A stream entry's name in `dead_letters`: its id, after `b<bucket>:` for buckets past 0
    /// (each bucket has its own stream, whose ids may repeat another's).
    fn entry_name(&self, id: &str) -> String {
        match self.copy.bucket {
            0 => id.to_owned(),
            b => format!("b{b}:{id}"),
        }
    }

    fn record(&self, report: &flashsale_core::ApplyReport, events: usize, started: Instant) {
        let sku = self.sku.to_string();
        metrics::histogram!(flashsale_core::metric_names::PERSIST_BATCH)
            .record(started.elapsed().as_secs_f64());
        metrics::counter!(flashsale_core::metric_names::PERSISTED_EVENTS, "sku" => sku.clone())
            .increment(report.applied as u64);
        if !report.fenced.is_empty() {
            metrics::counter!(flashsale_core::metric_names::FENCED_EVENTS, "sku" => sku.clone())
                .increment(report.fenced.len() as u64);
        }
        if !report.rejected.is_empty() {
            metrics::counter!(flashsale_core::metric_names::GUARD_REJECTIONS, "sku" => sku)
                .increment(report.rejected.len() as u64);
            tracing::error!(sku = %self.sku, rejected = ?report.rejected, "database guard REJECTED accepted orders");
        }
        tracing::debug!(sku = %self.sku, events, applied = report.applied, dup = report.duplicates, "batch persisted");
    }

    /// The `sku` label of this copy's gauges: the sku, and `/<bucket>` for buckets past 0.
    fn sku_label(&self) -> String {
        match self.copy.bucket {
            0 => self.sku.to_string(),
            b => format!("{}/{b}", self.sku),
        }
    }

    /// Nothing can reach the stream any more and everything in it is applied: ended in the
    /// database and in the hot copy (which then accepts no purchase), no unit reserved (no
    /// payment, cancellation or expiry can come), the database at the copy's `seq`, nothing
    /// pending. Looked at most once per discovery interval, after an empty read.
    async fn settled(&mut self, reader: &StreamReader) -> Result<bool, PersistError> {
        if self
            .settle_checked
            .is_some_and(|t| t.elapsed() < self.config.bounds.discover_every)
        {
            return Ok(false);
        }
        self.settle_checked = Some(Instant::now());
        let Some(db) = self.store.sale(self.sku).await? else {
            return Ok(false);
        };
        let hot = reader.hot_state(self.copy).await?;
        let Some(counters) = self.db_counters(&db).await? else {
            return Ok(false);
        };
        if !flashsale_core::sale::settled(db.sale.state, &counters, hot) {
            return Ok(false);
        }
        // With no hot copy, its stream must be gone too (or fully trimmed).
        let stream_empty = hot.is_some() || reader.backlog(self.copy).await? == 0;
        Ok(stream_empty && reader.pending_summary(self.copy).await?.count == 0)
    }

    /// The database's counters of this copy: the sale's, or its bucket's row (`None` when
    /// the row is missing).
    async fn db_counters(
        &self,
        db: &flashsale_core::StoredSale,
    ) -> Result<Option<flashsale_core::Counters>, PersistError> {
        if db.sale.buckets <= 1 {
            return Ok(Some(db.counters));
        }
        let rows = self.store.buckets(self.sku).await?;
        let row = rows.iter().find(|r| r.bucket == self.copy.bucket);
        Ok(row.map(|r| r.counters))
    }

    async fn fail(&mut self, e: &PersistError) {
        self.mode = if self.mode == Mode::Parked {
            Mode::Parked
        } else {
            Mode::Recover
        };
        self.backoff_ms = (self.backoff_ms * 2).clamp(50, self.config.bounds.backoff_ms_max);
        tracing::warn!(sku = %self.sku, error = %e, backoff_ms = self.backoff_ms, "persist failed; will retry");
        self.pause(self.backoff_ms).await;
    }

    /// Sleeps `ms` unless told to stop; true when told to stop.
    async fn pause(&mut self, ms: u64) -> bool {
        let sleep = tokio::time::sleep(Duration::from_millis(ms));
        tokio::select! {
            _ = sleep => *self.stop.borrow(),
            _ = self.stop.changed() => true,
        }
    }
}

/// Parsed items, and the first entry that did not parse.
fn split<'a>(
    entries: impl Iterator<Item = &'a Entry>,
) -> (Vec<Item>, Option<(String, EntryError)>) {
    let mut items = Vec::new();
    for (id, parsed) in entries {
        match parsed {
            Ok(item) => items.push(item.clone()),
            Err(why) => return (items, Some((id.clone(), why.clone()))),
        }
    }
    (items, None)
}

/// One read's items by how they are applied (see `SaleWorker::apply_read`).
#[derive(Debug, Default)]
struct Read {
    ins: Vec<TransferEvent>,
    events: Vec<Event>,
    outs: Vec<TransferEvent>,
}

impl Read {
    fn of(items: Vec<Item>) -> Read {
        let mut read = Read::default();
        for item in items {
            match item {
                Item::Event(e) => read.events.push(e),
                Item::Transfer(t) if t.side == TransferSide::In => read.ins.push(t),
                Item::Transfer(t) => read.outs.push(t),
            }
        }
        read
    }
}
