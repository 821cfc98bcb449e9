//! Invariants I1–I7 over rows read from the system of record. Tests, the bench, the demo and
//! the reconciler all call these, so every verdict means the same thing everywhere.

use std::collections::{HashMap, HashSet};

/// The checks' maps and sets: aHash, keyed at random per map. A reconciler pass runs these
/// over every order of a sale, five look-ups an order, and std's SipHash over the order
/// numbers and request ids was a tenth of the pass.
type Map<K, V> = HashMap<K, V, ahash::RandomState>;
type Set<T> = HashSet<T, ahash::RandomState>;

use serde::Serialize;

use crate::ids::{OrderNo, RequestId, UserId};
use crate::ledger::BucketRow;
use crate::order::{Event, EventKind, HotOrder, OrderStatus, TransferEvent, TransferSide};
use crate::sale::{Counters, Sale};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// "I1" … "I7".
    pub invariant: &'static str,
    pub detail: String,
}

/// Verdicts per invariant; empty `violations` means all held.
#[derive(Debug, Clone, Default, Serialize)]
pub struct InvariantReport {
    pub violations: Vec<Violation>,
}

impl InvariantReport {
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Whether the named invariant held.
    pub fn held(&self, invariant: &str) -> bool {
        !self.violations.iter().any(|v| v.invariant == invariant)
    }

    fn fail(&mut self, invariant: &'static str, detail: String) {
        // Bounded: a broken run must not print a million lines.
        if self
            .violations
            .iter()
            .filter(|v| v.invariant == invariant)
            .count()
            < 20
        {
            self.violations.push(Violation { invariant, detail });
        }
    }
}

/// Checks I1–I5 and I7 of one sale from its stored counters, orders and events.
/// `drained` says the persister has caught up, so PENDING orders are a loss (I5).
pub fn check_sale(
    sale: &Sale,
    counters: &Counters,
    orders: &[HotOrder],
    events: &[Event],
    drained: bool,
) -> InvariantReport {
    let mut report = check_orders(sale, counters, orders, drained);
    check_events(counters, orders, events, &mut report);
    report
}

/// What a sale of one bucket and a bucketed one check alike: I1, I2 (the sale row), I3, I4
/// and I5's PENDING orders.
fn check_orders(
    sale: &Sale,
    counters: &Counters,
    orders: &[HotOrder],
    drained: bool,
) -> InvariantReport {
    let mut report = InvariantReport::default();
    check_counters(sale, counters, orders, &mut report);
    check_per_user(sale, orders, &mut report);
    check_idempotency(orders, &mut report);
    check_persisted(orders, drained, &mut report);
    report
}

/// [`check_sale`] of a bucketed sale from its sale row (`counters`), bucket rows and applied
/// transfer sides: I1–I4 and I7 over the whole sale as there; I5 per bucket (its events
/// gap-free from 1 to the bucket's applied seq, each of its orders deducted once in it); and
/// I2 over the buckets: each row holds its total (available + reserved + sold), their
/// reserved and sold sum to the sale row's, and their available and their totals, each with
/// the units in flight (an out stored without its in, less an in stored before its out), to
/// the sale row's available and the sale's stock; the two sides of a transfer name the same
/// buckets and units. `drained` (every stream persisted) makes I2 exact: no unit in flight,
/// every transfer's out and in both stored, once. Without it one side may be stored before
/// the other, so a created unit (an in whose out is never stored) or a stranded one (an out
/// whose in is never stored) looks like a unit in flight: only a drained check sees them.
pub fn check_bucketed_sale(
    sale: &Sale,
    counters: &Counters,
    rows: &[BucketRow],
    transfers: &[TransferEvent],
    orders: &[HotOrder],
    events: &[Event],
    drained: bool,
) -> InvariantReport {
    let mut report = check_orders(sale, counters, orders, drained);
    for row in rows {
        let mine = |epoch: u64| crate::buckets::bucket_of_epoch(epoch, sale.buckets) == row.bucket;
        let its_orders: Vec<HotOrder> = (orders.iter())
            .filter(|o| mine(o.order_no.epoch()))
            .cloned()
            .collect();
        let its_events: Vec<Event> = events.iter().filter(|e| mine(e.epoch)).cloned().collect();
        check_events(&row.counters, &its_orders, &its_events, &mut report);
        if !row.counters.conserved() {
            let b = row.bucket;
            report.fail(
                "I2",
                format!(
                    "bucket {b}: available+reserved+sold != total: {:?}",
                    row.counters
                ),
            );
        }
    }
    check_transfer_pairs(sale, transfers, drained, &mut report);
    check_bucket_sums(sale, counters, rows, transfers, &mut report);
    report
}

/// Each transfer's sides: at most one of each, an id that names its source bucket (`<source
/// epoch>.<n>`), the out and the in agreeing on buckets and units, and, `drained`, both
/// stored: an in alone is a created unit, an out alone a stranded one.
fn check_transfer_pairs(
    sale: &Sale,
    transfers: &[TransferEvent],
    drained: bool,
    report: &mut InvariantReport,
) {
    let mut by_id: Map<&str, (Vec<&TransferEvent>, Vec<&TransferEvent>)> = Map::default();
    for t in transfers {
        let sides = by_id.entry(t.id.as_str()).or_default();
        match t.side {
            TransferSide::Out => sides.0.push(t),
            TransferSide::In => sides.1.push(t),
        }
    }
    let mut ids: Vec<&str> = by_id.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let (outs, ins) = &by_id[id];
        if outs.len() > 1 || ins.len() > 1 {
            let (o, i) = (outs.len(), ins.len());
            report.fail("I2", format!("transfer {id}: {o} outs and {i} ins stored"));
        }
        let all = outs.iter().chain(ins.iter());
        if let Some(t) = all.clone().find(|t| !names_its_source(sale, t)) {
            report.fail(
                "I2",
                format!(
                    "transfer {id}: its id does not name its source bucket {}",
                    t.from
                ),
            );
        }
        let mut shapes: Vec<(u16, u16, u64)> = all.map(|t| (t.from, t.to, t.units)).collect();
        shapes.dedup();
        if shapes.len() > 1 {
            report.fail(
                "I2",
                format!("transfer {id}: its sides disagree on (from, to, units): {shapes:?}"),
            );
        }
        match (outs.first(), ins.first()) {
            (Some(o), None) if drained => report.fail(
                "I2",
                format!("transfer {id}: a stranded unit: out of bucket {} stored, its in never ({} units)", o.from, o.units),
            ),
            (None, Some(i)) if drained => report.fail(
                "I2",
                format!("transfer {id}: a created unit: in to bucket {} stored, its out never ({} units)", i.to, i.units),
            ),
            _ => {}
        }
    }
}

/// Whether a side's id, `<source epoch>.<n>`, names its source: the epoch of bucket `from`.
fn names_its_source(sale: &Sale, t: &TransferEvent) -> bool {
    let epoch =
        t.id.split_once('.')
            .and_then(|(e, _)| e.parse::<u64>().ok());
    epoch.is_some_and(|e| crate::buckets::bucket_of_epoch(e, sale.buckets) == t.from)
}

/// Units that left a bucket by a stored out whose in is not stored, less those that came in
/// by a stored in whose out is not stored yet (the two sides are persisted apart).
pub fn units_in_flight(transfers: &[TransferEvent]) -> i64 {
    let sides: Set<(&str, TransferSide)> =
        transfers.iter().map(|t| (t.id.as_str(), t.side)).collect();
    let other = |t: &TransferEvent| match t.side {
        TransferSide::Out => TransferSide::In,
        TransferSide::In => TransferSide::Out,
    };
    transfers
        .iter()
        .filter(|t| !sides.contains(&(t.id.as_str(), other(t))))
        .map(|t| -t.units_delta())
        .sum()
}

fn check_bucket_sums(
    sale: &Sale,
    c: &Counters,
    rows: &[BucketRow],
    transfers: &[TransferEvent],
    report: &mut InvariantReport,
) {
    if rows.len() != usize::from(sale.buckets) {
        let n = rows.len();
        report.fail(
            "I2",
            format!("{n} bucket rows for {} buckets", sale.buckets),
        );
    }
    let sum =
        |f: fn(&Counters) -> u64| i128::from(rows.iter().map(|r| f(&r.counters)).sum::<u64>());
    let in_flight = i128::from(units_in_flight(transfers));
    // Transfers move no counter of the sale row: its available holds the units in flight.
    let summed = (
        sum(|c| c.available) + in_flight,
        sum(|c| c.reserved),
        sum(|c| c.sold),
    );
    let sale_row = (
        i128::from(c.available),
        i128::from(c.reserved),
        i128::from(c.sold),
    );
    if summed != sale_row {
        report.fail(
            "I2",
            format!("buckets (and units in flight) sum to (available, reserved, sold) {summed:?}, the sale to {c:?}"),
        );
    }
    let held = sum(|c| c.total) + in_flight;
    if held != i128::from(sale.total_stock) {
        report.fail(
            "I2",
            format!(
                "bucket totals and units in flight make {held}, the stock is {}",
                sale.total_stock
            ),
        );
    }
}

fn units(orders: &[HotOrder], pred: impl Fn(OrderStatus) -> bool) -> u64 {
    orders
        .iter()
        .filter(|o| pred(o.status))
        .map(|o| u64::from(o.quantity))
        .sum()
}

fn check_counters(sale: &Sale, c: &Counters, orders: &[HotOrder], report: &mut InvariantReport) {
    let live = units(orders, OrderStatus::is_live);
    if live > sale.total_stock {
        report.fail(
            "I1",
            format!("{live} units in live orders > total {}", sale.total_stock),
        );
    }
    if c.total != sale.total_stock {
        report.fail(
            "I2",
            format!(
                "counter total {} != sale total {}",
                c.total, sale.total_stock
            ),
        );
    }
    if !c.conserved() {
        report.fail("I2", format!("available+reserved+sold != total: {c:?}"));
    }
    let sold = units(orders, |s| {
        matches!(s, OrderStatus::Created | OrderStatus::Paid)
    });
    let reserved = units(orders, |s| s == OrderStatus::Reserved);
    if (sold, reserved) != (c.sold, c.reserved) {
        report.fail(
            "I2",
            format!("orders hold sold={sold} reserved={reserved}, counters say {c:?}"),
        );
    }
}

fn check_per_user(sale: &Sale, orders: &[HotOrder], report: &mut InvariantReport) {
    let mut held: Map<UserId, u64> = Map::default();
    for o in orders.iter().filter(|o| o.status.is_live()) {
        *held.entry(o.user_id).or_default() += u64::from(o.quantity);
    }
    for (user, units) in held {
        if units > u64::from(sale.per_user_limit) {
            let limit = sale.per_user_limit;
            report.fail("I3", format!("user {user} holds {units} > limit {limit}"));
        }
    }
}

fn check_idempotency(orders: &[HotOrder], report: &mut InvariantReport) {
    let mut requests: Set<(UserId, &RequestId)> = Set::default();
    let mut numbers: Set<&OrderNo> = Set::default();
    for o in orders {
        if !requests.insert((o.user_id, &o.request_id)) {
            report.fail(
                "I4",
                format!(
                    "request {} of user {} has two orders",
                    o.request_id, o.user_id
                ),
            );
        }
        if !numbers.insert(&o.order_no) {
            report.fail("I4", format!("order_no {} appears twice", o.order_no));
        }
    }
}

fn check_persisted(orders: &[HotOrder], drained: bool, report: &mut InvariantReport) {
    for o in orders {
        if o.status == OrderStatus::Rejected {
            report.fail(
                "I5",
                format!("order {} was REJECTED by the database guard", o.order_no),
            );
        }
        if drained && o.status == OrderStatus::Pending {
            report.fail(
                "I5",
                format!("order {} still PENDING after drain", o.order_no),
            );
        }
    }
}

/// Gap-free events, one deduction per order, at most one resolution per reservation (I7).
fn check_events(c: &Counters, orders: &[HotOrder], events: &[Event], report: &mut InvariantReport) {
    let mut seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    seqs.sort_unstable();
    let gap_free = seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1);
    if !gap_free || seqs.len() as u64 != c.seq {
        report.fail(
            "I5",
            format!("events not gap-free 1..={}: {} events", c.seq, seqs.len()),
        );
    }
    let mut deducted: Map<&OrderNo, usize> = Map::default();
    let mut resolved: Map<&OrderNo, usize> = Map::default();
    for e in events {
        let map = if e.kind == EventKind::Deducted {
            &mut deducted
        } else {
            &mut resolved
        };
        *map.entry(&e.order_no).or_default() += 1;
    }
    for o in orders {
        if deducted.get(&o.order_no).copied().unwrap_or(0) != 1 && o.status != OrderStatus::Pending
        {
            report.fail(
                "I5",
                format!("order {} has no single deducted event", o.order_no),
            );
        }
        if resolved.get(&o.order_no).copied().unwrap_or(0) > 1 {
            report.fail(
                "I7",
                format!("order {} resolved more than once", o.order_no),
            );
        }
    }
    if deducted.len()
        != orders
            .iter()
            .filter(|o| o.status != OrderStatus::Pending)
            .count()
    {
        report.fail(
            "I5",
            format!(
                "{} deducted events for {} orders",
                deducted.len(),
                orders.len()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SkuId;
    use crate::ledger::PurchaseRequest;
    use crate::rules::SaleBook;

    fn book(total: u64, limit: u32) -> SaleBook {
        let sale = Sale {
            per_user_limit: limit,
            ..Sale::always_open(SkuId(9), total)
        };
        let c = sale.fresh_counters();
        SaleBook::new(sale, c, 1)
    }

    fn buy(b: &mut SaleBook, user: u64, rid: &str, q: u32) -> (Vec<HotOrder>, Vec<Event>) {
        let req = PurchaseRequest {
            sku_id: SkuId(9),
            user_id: UserId(user),
            request_id: RequestId::parse(rid).unwrap(),
            quantity: q,
        };
        let (outcome, event) = b.purchase(&req, 10);
        match outcome {
            crate::order::PurchaseOutcome::Accepted { order, .. } => {
                (vec![order], event.into_iter().collect())
            }
            _ => (vec![], vec![]),
        }
    }

    #[test]
    fn a_clean_book_passes_and_each_breakage_is_named() {
        let mut b = book(3, 2);
        let (mut orders, mut events) = buy(&mut b, 1, "a", 2);
        let (o2, e2) = buy(&mut b, 2, "b", 1);
        orders.extend(o2);
        events.extend(e2);
        let sale = b.sale.clone();
        assert!(check_sale(&sale, &b.counters, &orders, &events, true).is_ok());

        let mut oversold = orders.clone();
        let mut extra = oversold[1].clone();
        extra.order_no = OrderNo::new(SkuId(9), 1, 99);
        extra.request_id = RequestId::parse("c").unwrap();
        oversold.push(extra);
        let r = check_sale(&sale, &b.counters, &oversold, &events, true);
        assert!(!r.held("I1") && !r.held("I2"));

        let mut dup = orders.clone();
        dup[1].request_id = orders[0].request_id.clone();
        dup[1].user_id = orders[0].user_id;
        let r = check_sale(&sale, &b.counters, &dup, &events, true);
        assert!(!r.held("I3") && !r.held("I4"));

        let mut pending = orders.clone();
        pending[0].status = OrderStatus::Pending;
        assert!(!check_sale(&sale, &b.counters, &pending, &events, true).held("I5"));
    }

    /// Two buckets of a 6-unit sale (epochs 2 and 3 of n = 2), each selling on its own seq;
    /// bucket 1 sent 2 units to bucket 0. Stored sides in flight count toward the stock.
    #[test]
    fn a_bucketed_sale_checks_i5_per_bucket_and_i2_over_buckets() {
        let sale = Sale {
            buckets: 2,
            per_user_limit: 1,
            ..Sale::always_open(SkuId(9), 6)
        };
        let mut b0 = SaleBook::new(sale.clone(), sale.fresh_counters(), 2);
        let mut b1 = SaleBook::new(sale.clone(), sale.fresh_counters(), 3);
        let (mut orders, mut events) = buy(&mut b0, 1, "a", 1);
        let (o, e) = buy(&mut b1, 2, "a", 1);
        orders.extend(o);
        events.extend(e);
        let row = |bucket: u16, epoch: u64, total: u64, sold: u64| BucketRow {
            bucket,
            epoch,
            epoch_at_ms: 0,
            counters: Counters {
                total,
                available: total - sold,
                reserved: 0,
                sold,
                seq: 1,
            },
        };
        let side = |side: TransferSide| TransferEvent {
            sku_id: SkuId(9),
            epoch: if side == TransferSide::Out { 3 } else { 2 },
            id: "3.1".into(),
            side,
            from: 1,
            to: 0,
            units: 2,
            at_ms: 1,
        };
        let sums = Counters {
            total: 6,
            available: 4,
            reserved: 0,
            sold: 2,
            seq: 0,
        };
        let both = [side(TransferSide::Out), side(TransferSide::In)];
        let rows = [row(0, 2, 5, 1), row(1, 3, 1, 1)];
        let check_at = |rows: &[BucketRow], sides: &[TransferEvent], drained: bool| {
            check_bucketed_sale(&sale, &sums, rows, sides, &orders, &events, drained)
        };
        let check = |rows: &[BucketRow], sides: &[TransferEvent]| check_at(rows, sides, true);
        assert!(check(&rows, &both).is_ok(), "{:?}", check(&rows, &both));
        // Only the out stored: 2 units in flight, bucket 0 not yet raised. Fine while the
        // streams are not drained; drained, the in never comes: a stranded unit.
        let out_only = [row(0, 2, 3, 1), row(1, 3, 1, 1)];
        assert!(check_at(&out_only, &both[..1], false).is_ok());
        let stranded = check(&out_only, &both[..1]);
        assert!(!stranded.held("I2"), "{stranded:?}");
        assert!(stranded.violations[0].detail.contains("3.1"), "named by id");
        // Only the in stored (bucket 1 lost its out and was rebuilt with the units): the sums
        // hold with -2 in flight, as an in persisted before its out; drained, a created unit.
        let in_only = [row(0, 2, 5, 1), row(1, 3, 3, 1)];
        assert!(check_at(&in_only, &both[1..], false).is_ok());
        let created = check(&in_only, &both[1..]);
        assert!(!created.held("I2"), "{created:?}");
        assert!(created.violations[0].detail.contains("created"));
        // An in counted as if it had arrived twice.
        assert!(!check_at(&rows, &both[1..], false).held("I2"));
        // Sides that disagree, an id that names another source, a row that loses a unit.
        let mut other = both.clone();
        other[1].units = 3;
        assert!(!check(&rows, &other).held("I2"));
        let mut misnamed = both.clone();
        misnamed.iter_mut().for_each(|t| t.id = "2.1".into());
        assert!(!check(&rows, &misnamed).held("I2"));
        let mut leaky = rows;
        leaky[0].counters.available -= 1;
        assert!(!check_at(&leaky, &both, false).held("I2"));
        // A bucket's events must run 1..=seq on its own.
        let mut ahead = rows;
        ahead[1].counters.seq = 2;
        assert!(!check(&ahead, &both).held("I5"));
        assert!(!check(&rows[..1], &both).held("I2"));
    }
}
