//! The life of a sale's hot copy: `absent → live(e) → lost → rebuilt(e+1)`, and the one way
//! a copy is (re)loaded: [`rebuild`].
//!
//! | step | writes first | why |
//! |---|---|---|
//! | 1 fence the old copy | Redis: `fenced_at_ms` | no write of epoch `e` after this (purchases, pay, cancel, expiry answer UNAVAILABLE) |
//! | 2 drain its stream | database: the events of `e` above `applied_seq` | nothing the old copy accepted is lost when it is readable |
//! | 3 take epoch `e+1` | database: `sales.epoch` (compare and set) | the fencing token: the database refuses `e`'s events from now on; of two racing rebuilds one wins |
//! | 4 load the new copy | Redis: the sale hash at the database's counters, fenced | replaces only an older copy |
//! | 5 restore orders | Redis: orders, request replays, buyer units, holds | retries of persisted requests get their first outcome |
//! | 6 open | Redis: the operator state, fence lifted | only the copy of `e+1` |
//!
//! A sale kept in buckets ([`rebuild_bucket`]) goes through the same steps for one bucket:
//! its copy fenced, its stream drained (order events and transfer sides), its own next epoch
//! taken (`OrderStore::take_bucket_epoch`), its copy loaded from its row with the transfers
//! it is part of, its orders restored, and opened; the other buckets keep selling.
//!
//! Every step is idempotent and checks the epoch it works on. A rebuild that dies midway
//! leaves a fenced copy or a copy older than the database's epoch: the reconciler sees either
//! as behind and rebuilds again (a fenced copy once it has been fenced for
//! [`REBUILD_STALL_MS`]), so a rebuild cannot be left half done.

use std::collections::HashSet;

use flashsale_core::buckets::bucket_of_epoch;
use flashsale_core::{
    BucketLoad, BucketRow, BucketTransfers, CopyAt, Event, EventKind, HotSnapshot, Ledger,
    LedgerError, OrderStatus, OrderStore, SaleMode, SaleState, SkuId, StoreError, StoredSale,
    TransferApplied, TransferEvent, TransferSide,
};

/// A copy fenced this long is taken for a rebuild that died midway and rebuilt again.
pub const REBUILD_STALL_MS: u64 = 5_000;

/// What a rebuild did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    pub epoch: u64,
    /// Events of the old copy applied from its stream before the epoch moved.
    pub drained: usize,
    /// Orders put back into the new copy.
    pub restored: usize,
    pub applied_seq: u64,
    pub state: SaleState,
}

impl std::fmt::Display for Rebuilt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "epoch {}, {} events drained, counters at seq {}, {} orders restored, state {}",
            self.epoch,
            self.drained,
            self.applied_seq,
            self.restored,
            self.state.as_str()
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// Another rebuild took the epoch or replaced the copy first; it finishes the job.
    #[error("another rebuild of sale {0} won the race")]
    Raced(SkuId),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The copy a warm looks at: the sale's own, or for a sale kept in buckets its bucket 0,
/// whose epoch is given as the sale's when it is its row's (the copy is current), else as 0.
/// `None` when there is no copy to keep, or a bucketed sale's bucket 0 is missing while its
/// placement is kept (a first load that failed midway): such a sale is rebuilt, never read as
/// a copy of one bucket.
pub async fn warm_snapshot(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    stored: &StoredSale,
) -> Result<Option<HotSnapshot>, RebuildError> {
    let sku = stored.sale.sku_id;
    if ledger.kept_in_buckets(&stored.sale) {
        if let Some(mut snap) = ledger.bucket_snapshot(sku, 0).await? {
            let rows = store.buckets(sku).await?;
            let current = rows.first().is_some_and(|r| r.epoch == snap.epoch);
            snap.epoch = if current { stored.epoch } else { 0 };
            return Ok(Some(snap));
        }
        if ledger.bucket_salts(sku).await?.is_some() {
            return Ok(None);
        }
    }
    Ok(ledger.hot_snapshot(sku).await?)
}

/// Replaces a sale's hot copy with one loaded from the database in a new epoch (see the
/// module doc for the steps).
pub async fn rebuild(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    sku: SkuId,
) -> Result<Rebuilt, RebuildError> {
    let first = stored(store, sku).await?;
    let bucketed = ledger.kept_in_buckets(&first.sale);
    if bucketed && first.epoch > 0 {
        // Checked before the fence: a fence that no rebuild lifts would stop the sale.
        return Err(RebuildError::Ledger(LedgerError::Internal(format!(
            "sale {sku}: a bucketed sale's copies are loaded once; rebuilding them is not built"
        ))));
    }
    // The epoch this rebuild may replace is read before its fence: a rebuild that overtakes
    // this one (its epoch taken, its copy loaded and opened, selling) moves it, and this
    // one's compare and set then fails ("raced"). Read after the drain, it would be the
    // overtaking copy's epoch, and this rebuild would load over a copy it never fenced nor
    // drained, losing what that copy sold since.
    let epoch_before = first.epoch;
    ledger.fence(sku).await?;
    let drained = drain(ledger, store, sku).await?;
    let before = stored(store, sku).await?;
    if bucketed {
        store.split_buckets(sku).await?;
        place(ledger, store, &before.sale).await?;
    }
    let epoch = store
        .take_epoch(sku, epoch_before)
        .await?
        .ok_or(RebuildError::Raced(sku))?;
    let after = stored(store, sku).await?;
    let raced = raced(sku);
    ledger
        .load(&after.sale, &after.counters, epoch)
        .await
        .map_err(raced)?;
    if bucketed {
        // Where the buckets were placed, when the ledger chose as it loaded ([`place`] kept
        // them already otherwise; the database keeps the first salts it is given).
        if let Some(salts) = ledger.bucket_salts(sku).await? {
            store.keep_bucket_salts(sku, &salts).await?;
        }
    }
    let orders = store.orders(sku).await?;
    let restored = ledger
        .restore_orders(CopyAt { sku, epoch }, &orders)
        .await
        .map_err(raced)?;
    // The operator's word as it is now (it may have changed during the rebuild).
    let state = stored(store, sku).await?.sale.state;
    ledger.open(sku, epoch, state).await.map_err(raced)?;
    let applied_seq = after.counters.seq;
    if epoch_before == 0 {
        tracing::info!(%sku, epoch, "hot copy loaded for the first time");
    } else {
        tracing::warn!(%sku, epoch, drained, restored, applied_seq, "hot copy rebuilt from the database");
    }
    Ok(Rebuilt {
        epoch,
        drained,
        restored,
        applied_seq: after.counters.seq,
        state,
    })
}

/// A rebuild of the whole sale: [`rebuild`], or for a sale kept in buckets that has been
/// loaded, [`rebuild_bucket`] of each bucket in turn (the others sell meanwhile). Returns
/// the last rebuild's report.
pub async fn rebuild_all(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    sku: SkuId,
) -> Result<Rebuilt, RebuildError> {
    let sale = stored(store, sku).await?;
    if !(ledger.kept_in_buckets(&sale.sale) && sale.epoch > 0) {
        return rebuild(ledger, store, sku).await;
    }
    let mut last = None;
    for bucket in 0..sale.sale.buckets {
        last = Some(rebuild_bucket(ledger, store, sku, bucket).await?);
    }
    Ok(last.expect("a sale kept in buckets has two or more"))
}

/// Replaces bucket `bucket`'s copy of a sale kept in buckets with one loaded from its row in
/// the bucket's next epoch (see the module doc).
pub async fn rebuild_bucket(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    sku: SkuId,
    bucket: u16,
) -> Result<Rebuilt, RebuildError> {
    adopt_salts(ledger, store, sku).await?;
    // The epoch is read before the fence: see `rebuild`.
    let before = bucket_row(store, sku, bucket).await?;
    ledger.fence_bucket(sku, bucket).await?;
    let drained = drain_bucket(ledger, store, sku, bucket).await?;
    let completed = complete_transfers(ledger, store, sku, bucket).await?;
    let epoch = store
        .take_bucket_epoch(sku, &before)
        .await?
        .ok_or(RebuildError::Raced(sku))?;
    // One snapshot: the row at its new epoch (nothing of the old one applies any more), the
    // transfers and the orders.
    let audit = store.audit(sku).await?.ok_or(StoreError::SaleNotFound)?;
    let row =
        (audit.buckets.iter().find(|r| r.bucket == bucket)).ok_or(StoreError::SaleNotFound)?;
    let raced = raced(sku);
    let transfers = BucketTransfers::of(bucket, &audit.transfers);
    let sale = &audit.sale.sale;
    let load = BucketLoad {
        sale,
        bucket,
        counters: &row.counters,
        epoch,
        transfers: &transfers,
    };
    (ledger.load_bucket(load).await).map_err(raced)?;
    let restored = (ledger
        .restore_orders(CopyAt { sku, epoch }, &audit.orders)
        .await)
        .map_err(raced)?;
    let state = stored(store, sku).await?.sale.state;
    (ledger.open_bucket(load, state).await).map_err(raced)?;
    tracing::warn!(%sku, bucket, epoch, drained, restored, applied_seq = row.counters.seq,
        completed_transfers = completed, pending_transfers = transfers.pending.len(), "bucket's hot copy rebuilt from the database");
    Ok(Rebuilt {
        epoch,
        drained,
        restored,
        applied_seq: row.counters.seq,
        state,
    })
}

/// Where a sale kept in buckets is loaded, settled before its first epoch is taken: the
/// salts the database keeps (a first load tried before), or the ledger's choice, kept by the
/// database first and then read back (of two instances loading at once, the first one's).
/// A first load that fails midway (a timeout, a node lost, a slot moving) then leaves an
/// epoch whose buckets can be found: a forced warm or the reconciler rebuilds each bucket
/// from its row ([`rebuild_all`]), the missing bucket 0 included.
async fn place(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    sale: &flashsale_core::Sale,
) -> Result<(), RebuildError> {
    let sku = sale.sku_id;
    if store.bucket_salts(sku).await?.is_none() {
        if let Some(salts) = ledger.place_buckets(sale).await? {
            store.keep_bucket_salts(sku, &salts).await?;
        }
    }
    adopt_salts(ledger, store, sku).await?;
    Ok(())
}

/// Tells the ledger where `sku`'s buckets live as the database keeps it (a ledger that
/// knows already keeps what it knows).
pub(crate) async fn adopt_salts(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    sku: SkuId,
) -> Result<(), StoreError> {
    if let Some(salts) = store.bucket_salts(sku).await? {
        ledger.adopt_salts(sku, &salts);
    }
    Ok(())
}

async fn bucket_row(
    store: &dyn OrderStore,
    sku: SkuId,
    bucket: u16,
) -> Result<BucketRow, StoreError> {
    let rows = store.buckets(sku).await?;
    rows.into_iter()
        .find(|r| r.bucket == bucket)
        .ok_or(StoreError::SaleNotFound)
}

/// [`drain`] of one bucket: its stream's transfer sides that bring units in, the contiguous
/// run of its events above its row's seq, then the sides that take units out (the
/// persister's order), when the fenced copy is the one of the row's epoch.
async fn drain_bucket(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    sku: SkuId,
    bucket: u16,
) -> Result<usize, RebuildError> {
    let Some(snap) = ledger.bucket_snapshot(sku, bucket).await? else {
        return Ok(0);
    };
    let row = bucket_row(store, sku, bucket).await?;
    if snap.epoch != row.epoch {
        return Ok(0);
    }
    let sides = |side: TransferSide| snap.transfers.iter().filter(move |t| t.side == side);
    for t in sides(TransferSide::In) {
        store.apply_transfer(t).await?;
    }
    let run = (&snap.events[..], snap.epoch);
    let applied = drain_events(store, sku, bucket, run, row.counters.seq).await?;
    // Whatever the events did: an out not stored now is lost with the copy, and the copy
    // would be loaded with units its destination may hold already (a created unit).
    for t in sides(TransferSide::Out) {
        store.apply_transfer(t).await?;
    }
    Ok(applied)
}

/// Tries the drain's run of events this many times when the store finds a gap.
const DRAIN_TRIES: usize = 3;

/// The contiguous run of the copy's events (of its `epoch`) above its row's seq, applied; on a gap (the row
/// moved meanwhile) the run is taken again from the row as it is now. A gap that stays leaves
/// the events in the stream (the reconciler reports what never reaches the database), but
/// never stops the drain before the bucket's outs.
async fn drain_events(
    store: &dyn OrderStore,
    sku: SkuId,
    bucket: u16,
    (events, epoch): (&[Event], u64),
    mut applied_seq: u64,
) -> Result<usize, RebuildError> {
    for _ in 0..DRAIN_TRIES {
        let run = contiguous_above(events, epoch, applied_seq);
        if run.is_empty() {
            return Ok(0);
        }
        match store.apply_events(sku, &run).await {
            Ok(report) => return Ok(report.applied),
            Err(StoreError::Gap { .. }) => {
                applied_seq = bucket_row(store, sku, bucket).await?.counters.seq;
            }
            Err(e) => return Err(e.into()),
        }
    }
    tracing::warn!(%sku, bucket, applied_seq, "a rebuild's drain met a gap: its events stay in the stream");
    Ok(0)
}

/// The other side of `bucket`'s transfers, stored by its rebuild (after the drain, before the
/// epoch moves, so at the row's epoch) where the bucket's own side is missing for good: what
/// its fenced, drained copy does not hold, no copy of its epoch ever will.
/// - As a destination: an out to it is stored and its in is not. The in was lost with the
///   copy (or never came): stored now, so the copy is loaded with the units and the id (a
///   later in of that id counts nothing, and drops the source's pending record).
/// - As a source: an in from it is stored, or waits in another bucket's stream, and its out
///   is not stored. The out was lost with the copy while its in reached the destination:
///   stored now, so the copy is not loaded with units the destination holds (a created
///   unit). An in that reaches a destination after this read is reported by the reconciler,
///   by transfer id, and counted by the next rebuild of this bucket.
///
/// Returns how many sides it stored.
async fn complete_transfers(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    sku: SkuId,
    bucket: u16,
) -> Result<usize, RebuildError> {
    let audit = store.audit(sku).await?.ok_or(StoreError::SaleNotFound)?;
    let row =
        (audit.buckets.iter().find(|r| r.bucket == bucket)).ok_or(StoreError::SaleNotFound)?;
    let mut ins: Vec<TransferEvent> = audit.transfers.clone();
    for other in (0..audit.sale.sale.buckets).filter(|&b| b != bucket) {
        ins.extend(streamed_ins(ledger, sku, other).await);
    }
    let missing = sides_missing(bucket, row.epoch, &audit.transfers, &ins);
    // Only a copy that is gone lost its expiries: a copy still there holds its events above
    // the row's seq, and expiries written at those seqs would fence them.
    let copy_lost = matches!(ledger.bucket_snapshot(sku, bucket).await, Ok(None));
    let mut stored = 0;
    for side in &missing {
        stored += usize::from(store_missing_side(store, bucket, side, copy_lost).await?);
    }
    Ok(stored)
}

/// Stores one side [`complete_transfers`] found missing; true when it was applied. An out
/// whose units the row does not hold may carry units the lost copy got back from holds past
/// their deadline, their expiries lost with it (a copy that is gone): the row's due holds are
/// expired first (as the new copy would expire them once loaded) and the out is tried again.
/// An out the bucket still cannot hold (its units were sold) is left to the reconciler, which
/// reports it by transfer id; the rebuild goes on.
async fn store_missing_side(
    store: &dyn OrderStore,
    bucket: u16,
    side: &TransferEvent,
    copy_lost: bool,
) -> Result<bool, RebuildError> {
    let sku = side.sku_id;
    let mut refused = match store.apply_transfer(side).await {
        Ok(applied) => return Ok(applied == TransferApplied::Applied),
        Err(StoreError::Internal(why)) => why,
        Err(e) => return Err(e.into()),
    };
    let out = side.side == TransferSide::Out;
    if out && copy_lost && expire_due_holds(store, sku, bucket).await? > 0 {
        refused = match store.apply_transfer(side).await {
            Ok(applied) => return Ok(applied == TransferApplied::Applied),
            Err(StoreError::Internal(why)) => why,
            Err(e) => return Err(e.into()),
        };
    }
    tracing::error!(%sku, bucket, transfer = %side.id, side = side.side.as_str(), why = %refused,
        "a transfer side its rebuild cannot store");
    Ok(false)
}

/// Stores an expiry, at the bucket row's epoch, of each of the bucket's holds still RESERVED
/// in the database whose deadline has passed; returns how many it applied.
async fn expire_due_holds(
    store: &dyn OrderStore,
    sku: SkuId,
    bucket: u16,
) -> Result<usize, RebuildError> {
    let audit = store.audit(sku).await?.ok_or(StoreError::SaleNotFound)?;
    let sale = &audit.sale.sale;
    let row =
        (audit.buckets.iter().find(|r| r.bucket == bucket)).ok_or(StoreError::SaleNotFound)?;
    let now = flashsale_core::clock::now_ms();
    let due = (audit.orders.iter()).filter(|o| {
        o.status == OrderStatus::Reserved
            && o.deadline_ms > 0
            && o.deadline_ms <= now
            && bucket_of_epoch(o.order_no.epoch(), sale.buckets) == bucket
    });
    let events: Vec<Event> = (row.counters.seq + 1..)
        .zip(due)
        .map(|(seq, o)| Event {
            sku_id: sku,
            epoch: row.epoch,
            seq,
            kind: EventKind::Expired,
            order_no: o.order_no,
            request_id: o.request_id.clone(),
            user_id: o.user_id,
            quantity: o.quantity,
            at_ms: now,
            deadline_ms: o.deadline_ms,
        })
        .collect();
    if sale.mode != SaleMode::Reserve || events.is_empty() {
        return Ok(0);
    }
    let report = match store.apply_events(sku, &events).await {
        Ok(report) => report,
        // The row moved meanwhile: nothing expired here.
        Err(StoreError::Gap { .. }) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    tracing::warn!(%sku, bucket, expired = report.applied - report.rejected.len(),
        "holds past their deadline expired by a rebuild, for an out its copy lost");
    Ok(report.applied - report.rejected.len())
}

/// The in sides waiting in bucket `other`'s stream. A bucket that cannot be read now gives
/// none: one lost bucket must not keep another from being rebuilt (a unit its in created
/// is then reported by the reconciler once it reads every bucket again).
async fn streamed_ins(ledger: &dyn Ledger, sku: SkuId, other: u16) -> Vec<TransferEvent> {
    match ledger.bucket_snapshot(sku, other).await {
        Ok(Some(snap)) => (snap.transfers.into_iter())
            .filter(|t| t.side == TransferSide::In)
            .collect(),
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::warn!(%sku, bucket = other, error = %e, "bucket unreadable: its stream's ins not counted");
            Vec::new()
        }
    }
}

/// The sides `bucket` (its row at `epoch`) must store: an in for each stored out to it
/// without one, an out for each in from it (of `ins`, stored or not) without one.
fn sides_missing(
    bucket: u16,
    epoch: u64,
    stored: &[TransferEvent],
    ins: &[TransferEvent],
) -> Vec<TransferEvent> {
    let has: HashSet<(&str, TransferSide)> =
        (stored.iter()).map(|t| (t.id.as_str(), t.side)).collect();
    let side_of = |t: &TransferEvent, side: TransferSide| TransferEvent {
        epoch,
        side,
        ..t.clone()
    };
    let mut missing: Vec<TransferEvent> = (stored.iter())
        .filter(|t| t.side == TransferSide::Out && t.to == bucket)
        .filter(|t| !has.contains(&(t.id.as_str(), TransferSide::In)))
        .map(|t| side_of(t, TransferSide::In))
        .collect();
    let mut seen: HashSet<&str> = HashSet::new();
    for t in ins
        .iter()
        .filter(|t| t.side == TransferSide::In && t.from == bucket)
    {
        if !has.contains(&(t.id.as_str(), TransferSide::Out)) && seen.insert(t.id.as_str()) {
            missing.push(side_of(t, TransferSide::Out));
        }
    }
    missing
}

/// A ledger's refusal of a copy that is no longer the one being rebuilt: another rebuild won.
fn raced(sku: SkuId) -> impl Fn(LedgerError) -> RebuildError + Copy {
    move |e| match e {
        LedgerError::AlreadyWarm => RebuildError::Raced(sku),
        e => RebuildError::Ledger(e),
    }
}

async fn stored(
    store: &dyn OrderStore,
    sku: SkuId,
) -> Result<flashsale_core::StoredSale, StoreError> {
    store.sale(sku).await?.ok_or(StoreError::SaleNotFound)
}

/// Applies the fenced copy's events the database lacks, when the copy is the one of the
/// database's epoch (an older one is refused already): the contiguous run above
/// `applied_seq`. Events past a hole (lost with a failover) stay in the stream; after the
/// epoch moves the persister keeps them as fenced, and the reconciler reports them.
async fn drain(
    ledger: &dyn Ledger,
    store: &dyn OrderStore,
    sku: SkuId,
) -> Result<usize, RebuildError> {
    let Some(snap) = ledger.hot_snapshot(sku).await? else {
        return Ok(0);
    };
    let db = stored(store, sku).await?;
    if snap.epoch != db.epoch {
        return Ok(0);
    }
    let run = contiguous_above(&snap.events, snap.epoch, db.counters.seq);
    if run.is_empty() {
        return Ok(0);
    }
    match store.apply_events(sku, &run).await {
        Ok(report) => Ok(report.applied),
        // The persister applied some meanwhile: what is left is applied on the next try.
        Err(StoreError::Gap { .. }) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// The events of `epoch` that continue `applied_seq` without a hole, in seq order.
pub(crate) fn contiguous_above(events: &[Event], epoch: u64, applied_seq: u64) -> Vec<Event> {
    let mut mine: Vec<&Event> = events
        .iter()
        .filter(|e| e.epoch == epoch && e.seq > applied_seq)
        .collect();
    mine.sort_by_key(|e| e.seq);
    mine.into_iter()
        .enumerate()
        .take_while(|(i, e)| e.seq == applied_seq + 1 + *i as u64)
        .map(|(_, e)| e.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::fixtures::deducted as ev;

    fn side(id: &str, side: TransferSide, (from, to): (u16, u16), epoch: u64) -> TransferEvent {
        TransferEvent {
            sku_id: SkuId(1),
            epoch,
            id: id.into(),
            side,
            from,
            to,
            units: 2,
            at_ms: 7,
        }
    }

    /// Bucket 1 of 3 rebuilt at epoch 4: "3.1" (0 → 1) has its out stored and lost its in;
    /// "4.1" (1 → 2) reached bucket 2 (stored) and "4.2" (1 → 0) waits in bucket 0's stream,
    /// both outs lost; "4.3" (1 → 0) is whole; "5.1" (2 → 0) is none of bucket 1's business.
    #[test]
    fn a_rebuild_stores_the_missing_side_of_its_own_transfers_only() {
        use TransferSide::{In, Out};
        let stored = [
            side("3.1", Out, (0, 1), 3),
            side("4.1", In, (1, 2), 5),
            side("4.3", Out, (1, 0), 4),
            side("4.3", In, (1, 0), 3),
            side("5.1", Out, (2, 0), 5),
        ];
        let streamed = [side("4.2", In, (1, 0), 3), side("4.1", In, (1, 2), 5)];
        let ins: Vec<TransferEvent> = stored.iter().chain(&streamed).cloned().collect();
        let missing = sides_missing(1, 4, &stored, &ins);
        let got: Vec<(&str, TransferSide, u64)> = missing
            .iter()
            .map(|t| (t.id.as_str(), t.side, t.epoch))
            .collect();
        assert_eq!(got, [("3.1", In, 4), ("4.1", Out, 4), ("4.2", Out, 4)]);
        assert!(
            missing.iter().all(|t| t.at_ms == 7 && t.units == 2),
            "the other side's"
        );
        assert!(sides_missing(2, 5, &stored, &stored).is_empty());
        let to_zero = sides_missing(0, 3, &stored, &stored);
        assert_eq!(to_zero.len(), 1);
        assert_eq!((to_zero[0].id.as_str(), to_zero[0].side), ("5.1", In));
    }

    #[test]
    fn a_drain_takes_the_run_of_its_epoch_up_to_the_first_hole() {
        let events = [ev(1, 2), ev(2, 3), ev(2, 5), ev(2, 4), ev(2, 7)];
        let seqs: Vec<u64> = contiguous_above(&events, 2, 2)
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        assert!(contiguous_above(&events, 2, 5).is_empty());
    }
}
