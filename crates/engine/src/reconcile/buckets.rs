//! A bucketed sale's hot copies against its rows in the database, bucket by bucket (I6 per
//! bucket). Each bucket is a copy of its own: its counters at its own `s`, its stream of order
//! events and transfer sides, its row at its own `a`. A bucket is folded as a sale of one
//! bucket is (its events in `(a, s]` undone from the hot counters), and so are the transfer
//! sides still in its stream that the database has not stored: the diff must be 0 in every
//! bucket, not only in their sum.

use std::collections::HashSet;

use flashsale_core::{
    BucketRow, Counters, Event, EventKind, HotSnapshot, SaleAudit, SaleMode, TransferEvent,
    TransferSide,
};

use super::{Diff, SaleReport};

/// One bucket folded: its hot counters with what the database lacks undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Folded {
    pub hot: Counters,
    pub folded: Counters,
    /// Order events in the stream above the row's applied seq.
    pub in_flight: u64,
    /// Of those, deductions older than the lag bound.
    pub stale: usize,
}

/// Compares every bucket and fills the sale's report with the sums; a bucket that cannot be
/// compared, or differs, is a finding.
pub(crate) fn compare(
    report: &mut SaleReport,
    snaps: &[Option<HotSnapshot>],
    audit: &SaleAudit,
    stale_before_ms: i64,
    stall_ms: u64,
) {
    let stored: HashSet<(&str, TransferSide)> = (audit.transfers.iter())
        .map(|t| (t.id.as_str(), t.side))
        .collect();
    let mode = audit.sale.sale.mode;
    let (mut hot, mut folded, mut db) = (
        Counters::default(),
        Counters::default(),
        Counters::default(),
    );
    let mut compared = 0;
    for row in &audit.buckets {
        let snap = snaps.get(usize::from(row.bucket)).and_then(Option::as_ref);
        if let Some(why) = behind(snap, row, stall_ms) {
            report
                .findings
                .push(format!("bucket {}: {why}", row.bucket));
            report.buckets_behind.push(row.bucket);
            continue;
        }
        let Some(snap) = snap.filter(|s| s.fenced_ms.is_none()) else {
            let b = row.bucket;
            report.findings.push(format!(
                "bucket {b}: hot copy fenced: a rebuild is under way"
            ));
            continue;
        };
        match fold(snap, row, &stored, mode, stale_before_ms) {
            Ok(f) => {
                let diff = Diff::between(&f.folded, &row.counters);
                if !diff.is_zero() {
                    report
                        .findings
                        .push(format!("bucket {}: diff {diff:?}", row.bucket));
                }
                (hot, folded, db) = (
                    hot.plus(&f.hot),
                    folded.plus(&f.folded),
                    db.plus(&row.counters),
                );
                report.in_flight += f.in_flight;
                report.stale_pending += f.stale;
                compared += 1;
            }
            Err(why) => report
                .findings
                .push(format!("bucket {}: {why}", row.bucket)),
        }
    }
    if compared == audit.buckets.len() && compared > 0 {
        report.hot = Some(hot);
        report.folded = Some(folded);
        report.diff = Some(Diff::between(&folded, &db));
    }
}

/// The transfers with one side stored (ids, sorted), and the buckets whose rebuild stores the
/// other side: an out's destination, an in's source.
pub(crate) fn unbalanced(sides: &[TransferEvent]) -> (Vec<String>, Vec<u16>) {
    let stored: HashSet<(&str, TransferSide)> =
        sides.iter().map(|t| (t.id.as_str(), t.side)).collect();
    let mut ids = Vec::new();
    let mut buckets = Vec::new();
    for t in sides {
        let other = match t.side {
            TransferSide::Out => TransferSide::In,
            TransferSide::In => TransferSide::Out,
        };
        if stored.contains(&(t.id.as_str(), other)) {
            continue;
        }
        ids.push(format!(
            "{} ({} only, {} → {}, {} units)",
            t.id,
            t.side.as_str(),
            t.from,
            t.to,
            t.units
        ));
        let rebuilt = match t.side {
            TransferSide::Out => t.to,
            TransferSide::In => t.from,
        };
        if !buckets.contains(&rebuilt) {
            buckets.push(rebuilt);
        }
    }
    ids.sort();
    buckets.sort_unstable();
    (ids, buckets)
}

/// Why `row`'s bucket must be rebuilt: its copy gone, of an older epoch, behind the row's
/// seq, or fenced by a rebuild that stalled.
fn behind(snap: Option<&HotSnapshot>, row: &BucketRow, stall_ms: u64) -> Option<String> {
    let Some(snap) = snap else {
        return Some("hot copy missing".into());
    };
    let (s, a) = (snap.counters.seq, row.counters.seq);
    if snap.epoch < row.epoch || s < a {
        return Some(format!(
            "hot copy behind the database: epoch {} seq {s} vs epoch {} seq {a}",
            snap.epoch, row.epoch
        ));
    }
    (snap.fenced_ms.is_some_and(|ms| ms >= stall_ms)).then(|| {
        format!(
            "hot copy fenced for {:?} ms: a rebuild stalled",
            snap.fenced_ms
        )
    })
}

/// `row`'s bucket: its hot counters with the stream's order events above the row's seq and
/// its transfer sides the database lacks undone.
pub(crate) fn fold(
    snap: &HotSnapshot,
    row: &BucketRow,
    stored: &HashSet<(&str, TransferSide)>,
    mode: SaleMode,
    stale_before_ms: i64,
) -> Result<Folded, String> {
    let (s, a) = (snap.counters.seq, row.counters.seq);
    if snap.epoch != row.epoch {
        return Err(format!(
            "hot epoch {} but the database's {}",
            snap.epoch, row.epoch
        ));
    }
    if s < a {
        return Err(format!("hot seq {s} behind the database's {a}"));
    }
    let undo: Vec<&Event> = snap
        .events
        .iter()
        .filter(|e| e.seq > a && e.seq <= s)
        .collect();
    let contiguous = undo
        .iter()
        .enumerate()
        .all(|(i, e)| e.seq == a + 1 + i as u64);
    if undo.len() as u64 != s - a || !contiguous {
        return Err(format!(
            "events ({a}, {s}] are not all there to fold: {} found",
            undo.len()
        ));
    }
    let pending: Vec<&TransferEvent> = (snap.transfers.iter())
        .filter(|t| t.bucket() == row.bucket && !stored.contains(&(t.id.as_str(), t.side)))
        .collect();
    let c = undo_all(snap.counters, &undo, &pending, mode, a)?;
    let stale = (undo.iter())
        .filter(|e| e.kind == EventKind::Deducted && e.at_ms < stale_before_ms)
        .count();
    Ok(Folded {
        hot: snap.counters,
        folded: c,
        in_flight: undo.len() as u64,
        stale,
    })
}

/// `c` at seq `a`: with the changes of `events` and of the transfer `sides` taken back, summed
/// as signed numbers, and only the result checked for a counter below 0. Undoing is a sum, the
/// same in any order, but only the stream's own order taken backwards passes through states
/// the copy was in; undone by kind (the events, then the sides) it may pass through one the
/// copy never was in and fail there: a cancel whose unit an out then took, undone cancel
/// first, takes available below 0. The snapshot keeps events and sides apart, not their order
/// in the stream, so nothing between is checked; the result is the row's counters, which a
/// consistent copy never has below 0.
fn undo_all(
    c: Counters,
    events: &[&Event],
    sides: &[&TransferEvent],
    mode: SaleMode,
    a: u64,
) -> Result<Counters, String> {
    // total, available, reserved, sold.
    let mut d = [0i128; 4];
    for e in events {
        let x = e.delta(mode);
        d[1] += i128::from(x.available);
        d[2] += i128::from(x.reserved);
        d[3] += i128::from(x.sold);
    }
    for t in sides {
        let u = i128::from(t.units_delta());
        d[0] += u;
        d[1] += u;
    }
    let back = |v: u64, d: i128| u64::try_from(i128::from(v) - d).ok();
    let folded = (|| {
        Some(Counters {
            total: back(c.total, d[0])?,
            available: back(c.available, d[1])?,
            reserved: back(c.reserved, d[2])?,
            sold: back(c.sold, d[3])?,
            seq: a,
        })
    })();
    folded.ok_or_else(|| {
        format!(
            "{} events and {} transfer sides cannot be undone from {c:?}: \
             they moved total, available, reserved, sold by {d:?}",
            events.len(),
            sides.len()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::fixtures::deducted;
    use flashsale_core::{SaleState, SkuId};
    use flashsale_testkit::bucketed::direct_counters as counters;

    fn out(units: u64) -> TransferEvent {
        TransferEvent {
            sku_id: SkuId(1),
            epoch: 4,
            id: "4.1".into(),
            side: TransferSide::Out,
            from: 1,
            to: 0,
            units,
            at_ms: 10,
        }
    }

    fn snap(c: Counters, events: Vec<Event>, transfers: Vec<TransferEvent>) -> HotSnapshot {
        HotSnapshot {
            counters: c,
            epoch: 4,
            events,
            transfers,
            bad_entries: Vec::new(),
            fenced_ms: None,
            state: SaleState::Live,
        }
    }

    /// The transfers with one side stored, and the buckets whose rebuild counts the other.
    #[test]
    fn unbalanced_transfers_name_the_bucket_that_counts_their_other_side() {
        let whole = [
            out(1),
            TransferEvent {
                side: TransferSide::In,
                epoch: 6,
                ..out(1)
            },
        ];
        assert_eq!(unbalanced(&whole), (vec![], vec![]));
        let created = TransferEvent {
            id: "4.2".into(),
            side: TransferSide::In,
            ..out(3)
        };
        let (ids, buckets) = unbalanced(&[out(1), created]);
        assert_eq!(ids.len(), 2, "{ids:?}");
        assert!(ids[0].starts_with("4.1 (out only") && ids[1].starts_with("4.2 (in only"));
        assert_eq!(buckets, [0, 1], "the out's destination, the in's source");
    }

    fn row(bucket: u16, c: Counters) -> BucketRow {
        BucketRow {
            bucket,
            epoch: 4,
            epoch_at_ms: 0,
            counters: c,
        }
    }

    fn side(id: &str, side: TransferSide, from: u16, to: u16, units: u64) -> TransferEvent {
        TransferEvent {
            id: id.into(),
            side,
            from,
            to,
            ..out(units)
        }
    }

    /// A hold of bucket 1, cancelled, whose unit an out then carried away, none of it stored:
    /// undoing the cancel before the out takes available below 0 (the copy was never there).
    #[test]
    fn a_cancel_whose_unit_went_out_is_undone() {
        let row = row(
            1,
            Counters {
                total: 15,
                available: 1,
                reserved: 0,
                sold: 14,
                seq: 52,
            },
        );
        let hold = deducted(4, 53);
        let cancel = Event {
            kind: EventKind::Cancelled,
            seq: 54,
            ..hold.clone()
        };
        let hot = Counters {
            total: 14,
            available: 0,
            reserved: 0,
            sold: 14,
            seq: 54,
        };
        let gone = side("4.7", TransferSide::Out, 1, 0, 1);
        let hot = snap(hot, vec![hold, cancel], vec![gone]);
        let f = fold(&hot, &row, &HashSet::new(), SaleMode::Reserve, 0).unwrap();
        assert_eq!(f.folded, row.counters);
        assert_eq!(f.in_flight, 2);
    }

    /// Bucket 0 took 3 units in and sent them on out, neither stored: undoing the in first
    /// takes available below 0.
    #[test]
    fn an_in_sent_on_out_is_undone() {
        let row = row(0, counters(10, 0, 10, 10));
        let came = side("7.1", TransferSide::In, 1, 0, 3);
        let went = side("4.2", TransferSide::Out, 0, 2, 3);
        let hot = snap(counters(10, 0, 10, 10), vec![], vec![came, went]);
        let f = fold(&hot, &row, &HashSet::new(), SaleMode::Direct, 0).unwrap();
        assert_eq!(f.folded, row.counters);
    }

    /// What the database lacks is undone whatever order it has, but a result below 0 (the
    /// copy holds less than the stream says it took in) is still a finding.
    #[test]
    fn a_fold_below_zero_is_refused() {
        let row = row(0, counters(10, 0, 10, 10));
        let came = side("7.1", TransferSide::In, 1, 0, 3);
        let hot = snap(counters(12, 2, 10, 10), vec![], vec![came]);
        let why = fold(&hot, &row, &HashSet::new(), SaleMode::Direct, 0).unwrap_err();
        assert!(why.contains("cannot be undone"), "{why}");
    }

    /// Bucket 1 of 3 at epoch 4: sold 2 (one persisted), then sent 5 units out (not stored).
    #[test]
    fn a_bucket_folds_its_unstored_events_and_transfer_sides() {
        let row = BucketRow {
            bucket: 1,
            epoch: 4,
            epoch_at_ms: 0,
            counters: counters(10, 9, 1, 1),
        };
        let hot = snap(
            counters(5, 3, 2, 2),
            vec![deducted(4, 1), deducted(4, 2)],
            vec![out(5)],
        );
        let none = HashSet::new();
        let f = fold(&hot, &row, &none, SaleMode::Direct, 0).unwrap();
        assert_eq!(f.folded, row.counters);
        assert_eq!(f.in_flight, 1);
        // Once the out is stored, its units are the database's business: a diff of 5.
        let stored: HashSet<(&str, TransferSide)> = [("4.1", TransferSide::Out)].into();
        let f = fold(&hot, &row, &stored, SaleMode::Direct, 0).unwrap();
        assert_eq!(Diff::between(&f.folded, &row.counters).total, -5);
        // Stale: the deduction in flight is older than the bound.
        assert_eq!(
            fold(&hot, &row, &none, SaleMode::Direct, 11).unwrap().stale,
            1
        );
        let mut old = hot.clone();
        old.epoch = 1;
        assert!(fold(&old, &row, &none, SaleMode::Direct, 0).is_err());
        let gap = snap(counters(5, 3, 2, 2), vec![deducted(4, 1)], vec![out(5)]);
        assert!(fold(&gap, &row, &none, SaleMode::Direct, 0).is_err());
    }
}
