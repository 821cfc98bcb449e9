//! The pure part of `apply_events`, shared by every backend: split a batch into duplicates
//! and new events, then fold the new events over the locked counters into a plan of writes.
//! No I/O here (`store` reads what the fold needs, calls it, and writes the plan; the SQL
//! text is in `sql`).

use std::collections::{HashMap, HashSet};

use flashsale_core::buckets::bucket_of_epoch;
use flashsale_core::{
    ApplyReport, Counters, Event, EventKind, OrderNo, OrderStatus, SaleMode, SkuId, StoreError,
};

/// Most rows one multi-row statement carries (and most values in one `IN (...)` list).
pub(crate) const CHUNK_ROWS: usize = 500;

/// The locked sale row, as `apply_events` reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    pub counters: Counters,
    pub mode: SaleMode,
}

/// An order already in the database that the batch names (by order_no or request key).
#[derive(Debug, Clone)]
pub(crate) struct KnownOrder {
    pub sku_id: SkuId,
    pub order_no: String,
    pub user_id: u64,
    pub request_id: String,
    pub quantity: u32,
    pub status: OrderStatus,
}

/// An order row to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewOrder {
    pub order_no: String,
    pub user_id: u64,
    pub request_id: String,
    pub quantity: u32,
    pub status: OrderStatus,
    pub deadline_ms: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The seq and epoch of the `deducted` event that creates it.
    pub seq: u64,
    pub epoch: u64,
}

/// A status change of orders that were already in the database. Changes with the same status
/// and time are grouped into one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatusUpdate {
    pub status: OrderStatus,
    pub at_ms: i64,
    pub order_nos: Vec<String>,
}

/// What one batch writes.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// Every new event, with whether the guard rejected it (a rejected event is stored too).
    pub events: Vec<(&'a Event, bool)>,
    pub new_orders: Vec<NewOrder>,
    pub updates: Vec<StatusUpdate>,
    /// The counters after the batch; `seq` is the new applied_seq.
    pub after: Counters,
    pub report: ApplyReport,
}

/// The identity of an applied event, as stored: enough to tell a redelivery of it from a
/// different event that names the same seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredEvent {
    pub seq: u64,
    /// 0 for rows written before events carried their epoch.
    pub epoch: u64,
    pub kind: EventKind,
    pub order_no: OrderNo,
}

impl StoredEvent {
    fn is(&self, e: &Event) -> bool {
        (self.epoch == 0 || self.epoch == e.epoch)
            && self.kind == e.kind
            && self.order_no == e.order_no
    }
}

/// A batch sorted by what the store does with each event.
#[derive(Debug, Default)]
pub(crate) struct Split<'a> {
    /// To apply, in seq order from `applied_seq + 1`.
    pub fresh: Vec<&'a Event>,
    /// Redeliveries of applied events: skipped (exactly once).
    pub duplicates: usize,
    /// Refused by the fence: of another epoch than the sale's, or naming an applied seq that
    /// the database holds for a different event. Kept, never applied.
    pub fenced: Vec<&'a Event>,
}

/// Seqs of the batch at or below `applied_seq`: their stored events must be read to tell a
/// redelivery from a different event.
pub(crate) fn applied_seqs(applied_seq: u64, events: &[Event]) -> Vec<u64> {
    let mut seqs: Vec<u64> = events
        .iter()
        .filter(|e| e.seq <= applied_seq)
        .map(|e| e.seq)
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    seqs
}

/// Refuses a batch of a bucketed sale (of `n` buckets) that holds an event of another bucket
/// than `bucket`: each bucket has its own stream, seqs and epoch, so such a batch is a
/// caller's bug, and nothing of it may be written.
pub(crate) fn one_bucket(events: &[Event], n: u16, bucket: u16) -> Result<(), StoreError> {
    match events
        .iter()
        .find(|e| bucket_of_epoch(e.epoch, n) != bucket)
    {
        None => Ok(()),
        Some(e) => Err(StoreError::Internal(format!(
            "event epoch {} seq {} of bucket {} in a batch of bucket {bucket} (of {n}) of sku {}",
            e.epoch,
            e.seq,
            bucket_of_epoch(e.epoch, n),
            e.sku_id
        ))),
    }
}

/// Sorts a batch: an event at or below `applied_seq` is a duplicate only when the stored
/// event at its seq is the same event; an event above it is applied only when it is of the
/// sale's current `epoch` (the fencing token), and the applied ones must continue the
/// sequence without a gap.
pub(crate) fn split<'a>(
    sku: SkuId,
    epoch: u64,
    applied_seq: u64,
    events: &'a [Event],
    stored: &[StoredEvent],
) -> Result<Split<'a>, StoreError> {
    if let Some(e) = events.iter().find(|e| e.sku_id != sku) {
        return Err(StoreError::Internal(format!(
            "event seq {} of sku {} in a batch of sku {sku}",
            e.seq, e.sku_id
        )));
    }
    let mut split = Split::default();
    for e in events {
        if e.seq <= applied_seq {
            match stored.iter().find(|s| s.seq == e.seq) {
                Some(s) if s.is(e) => split.duplicates += 1,
                _ => split.fenced.push(e),
            }
        } else if e.epoch == epoch {
            split.fresh.push(e);
        } else {
            split.fenced.push(e);
        }
    }
    split.fresh.sort_by_key(|e| e.seq);
    let contiguous = split
        .fresh
        .iter()
        .enumerate()
        .all(|(i, e)| e.seq == applied_seq + 1 + i as u64);
    if !contiguous {
        return Err(StoreError::Gap {
            applied_seq,
            first_seq: split.fresh.first().map(|e| e.seq).unwrap_or(0),
        });
    }
    Ok(split)
}

/// Order numbers (all kinds) and request keys `(user, request_id)` (deductions) the fold
/// must know about. Keys, not users: a user's other orders cannot collide, and a buyer with
/// many orders would otherwise make every batch read all of them.
pub(crate) fn lookups(fresh: &[&Event]) -> (Vec<String>, Vec<(u64, String)>) {
    let mut nos: Vec<String> = fresh.iter().map(|e| e.order_no.to_string()).collect();
    nos.sort_unstable();
    nos.dedup();
    let mut keys: Vec<(u64, String)> = fresh
        .iter()
        .filter(|e| e.kind == EventKind::Deducted)
        .map(|e| (e.user_id.0, e.request_id.to_string()))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    (nos, keys)
}

enum Place {
    /// Index into `Plan::new_orders`.
    New(usize),
    /// Already in the database, with its current status (as changed by this batch).
    Stored { status: OrderStatus },
}

struct Tracked {
    sku_id: SkuId,
    user_id: u64,
    quantity: u32,
    place: Place,
}

/// Folds the new events over the locked counters. A deduction that would drive a counter
/// negative, or that repeats an order number or request key, and a resolution of an order
/// that is not RESERVED (in the database or earlier in the batch) are rejected: stored, but
/// they move no counter; a rejected deduction's order is stored as REJECTED when it can be.
pub(crate) fn fold<'a>(
    sku: SkuId,
    head: Head,
    fresh: &[&'a Event],
    known: Vec<KnownOrder>,
) -> Plan<'a> {
    let mut tracked: HashMap<String, Tracked> = HashMap::new();
    let mut request_keys: HashSet<(u64, String)> = HashSet::new();
    for k in known {
        if k.sku_id == sku {
            request_keys.insert((k.user_id, k.request_id.clone()));
        }
        tracked.insert(
            k.order_no,
            Tracked {
                sku_id: k.sku_id,
                user_id: k.user_id,
                quantity: k.quantity,
                place: Place::Stored { status: k.status },
            },
        );
    }

    let mut c = head.counters;
    let mut plan = Plan {
        events: Vec::with_capacity(fresh.len()),
        new_orders: Vec::new(),
        updates: Vec::new(),
        after: c,
        report: ApplyReport {
            applied: fresh.len(),
            ..ApplyReport::default()
        },
    };
    // Final status of stored orders changed by this batch, in first-change order.
    let mut changed: Vec<(String, OrderStatus, i64)> = Vec::new();

    for &e in fresh {
        let no_text = e.order_no.to_string();
        let no = no_text.as_str();
        let next = c.apply(e.delta(head.mode));
        let accepted = match e.kind {
            EventKind::Deducted => {
                let key = (e.user_id.0, e.request_id.to_string());
                let repeated = tracked.contains_key(no) || request_keys.contains(&key);
                match (repeated, next) {
                    (false, Some(n)) => {
                        c = n;
                        push_order(&mut plan, &mut tracked, e, e.kind.status_after(head.mode));
                        request_keys.insert(key);
                        true
                    }
                    (false, None) => {
                        // The oversell guard: the order is kept, as REJECTED.
                        push_order(&mut plan, &mut tracked, e, OrderStatus::Rejected);
                        request_keys.insert(key);
                        false
                    }
                    // Would break a unique key: the event is the only record.
                    (true, _) => false,
                }
            }
            EventKind::Paid | EventKind::Cancelled | EventKind::Expired => {
                let status = e.kind.status_after(head.mode);
                match (tracked.get_mut(no), next) {
                    (Some(t), Some(n))
                        if t.sku_id == sku
                            && t.user_id == e.user_id.0
                            && t.quantity == e.quantity =>
                    {
                        let current = match &t.place {
                            Place::New(i) => plan.new_orders[*i].status,
                            Place::Stored { status } => *status,
                        };
                        if current == OrderStatus::Reserved {
                            c = n;
                            match &mut t.place {
                                Place::New(i) => {
                                    plan.new_orders[*i].status = status;
                                    plan.new_orders[*i].updated_at_ms = e.at_ms;
                                }
                                Place::Stored { status: s } => {
                                    *s = status;
                                    match changed.iter_mut().find(|(n, _, _)| n == no) {
                                        Some(entry) => *entry = (no.to_owned(), status, e.at_ms),
                                        None => changed.push((no.to_owned(), status, e.at_ms)),
                                    }
                                }
                            }
                            true
                        } else {
                            false
                        }
                    }
                    _ => false,
                }
            }
        };
        if !accepted {
            c.seq += 1;
            plan.report.rejected.push(e.order_no);
        }
        debug_assert_eq!(c.seq, e.seq);
        plan.events.push((e, !accepted));
    }

    plan.updates = group_updates(changed);
    plan.after = c;
    plan
}

fn push_order(
    plan: &mut Plan<'_>,
    tracked: &mut HashMap<String, Tracked>,
    e: &Event,
    status: OrderStatus,
) {
    tracked.insert(
        e.order_no.to_string(),
        Tracked {
            sku_id: e.sku_id,
            user_id: e.user_id.0,
            quantity: e.quantity,
            place: Place::New(plan.new_orders.len()),
        },
    );
    plan.new_orders.push(NewOrder {
        order_no: e.order_no.to_string(),
        user_id: e.user_id.0,
        request_id: e.request_id.to_string(),
        quantity: e.quantity,
        status,
        deadline_ms: e.deadline_ms,
        created_at_ms: e.at_ms,
        updated_at_ms: e.at_ms,
        seq: e.seq,
        epoch: e.epoch,
    });
}

fn group_updates(changed: Vec<(String, OrderStatus, i64)>) -> Vec<StatusUpdate> {
    let mut groups: Vec<StatusUpdate> = Vec::new();
    for (no, status, at_ms) in changed {
        match groups
            .iter_mut()
            .find(|g| g.status == status && g.at_ms == at_ms && g.order_nos.len() < CHUNK_ROWS)
        {
            Some(g) => g.order_nos.push(no),
            None => groups.push(StatusUpdate {
                status,
                at_ms,
                order_nos: vec![no],
            }),
        }
    }
    groups
}

/// Logs what the fence refused: events of a replaced hot copy the database never got (lost
/// with it) or that collide with applied ones. The reconciler reports them by order number.
/// Fenced events named in one log line (all are kept in `fenced_events`).
const FENCED_LOGGED_MAX: usize = 10;

pub(crate) fn alert_fenced(sku: SkuId, fenced: &[&Event]) {
    if fenced.is_empty() {
        return;
    }
    // Bounded: a whole stale stream must not become one line of a megabyte.
    let first: Vec<String> = fenced
        .iter()
        .take(FENCED_LOGGED_MAX)
        .map(|e| {
            format!(
                "{} {} (epoch {} seq {})",
                e.order_no,
                e.kind.as_str(),
                e.epoch,
                e.seq
            )
        })
        .collect();
    tracing::error!(%sku, refused = fenced.len(), ?first, "events refused by the epoch fence: kept in fenced_events");
}

/// Logs what the guard refused: must never happen in a healthy system. The caller (the
/// persister, the embedded ledger) counts it in `flashsale_db_guard_rejections_total`.
pub(crate) fn alert(sku: SkuId, report: &ApplyReport) {
    if report.rejected.is_empty() {
        return;
    }
    tracing::error!(
        %sku,
        rejected = ?report.rejected,
        "the database guard rejected events: hot ledger and system of record disagree"
    );
}

/// Parses the strings of a stored row, naming what was wrong.
pub(crate) fn parse<T>(
    what: &str,
    value: &str,
    f: impl Fn(&str) -> Option<T>,
) -> Result<T, StoreError> {
    f(value).ok_or_else(|| StoreError::Internal(format!("bad {what} in the database: {value:?}")))
}

pub(crate) fn order_no(value: &str) -> Result<OrderNo, StoreError> {
    parse("order_no", value, OrderNo::parse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::{RequestId, UserId};

    fn ev(seq: u64, kind: EventKind, order: u64, user: u64, q: u32) -> Event {
        Event {
            sku_id: SkuId(1),
            epoch: 1,
            seq,
            kind,
            order_no: OrderNo::new(SkuId(1), 1, order),
            request_id: RequestId::parse(&format!("r{order}")).unwrap(),
            user_id: UserId(user),
            quantity: q,
            at_ms: seq as i64,
            deadline_ms: 0,
        }
    }

    fn head(total: u64, mode: SaleMode) -> Head {
        Head {
            counters: Counters {
                total,
                available: total,
                reserved: 0,
                sold: 0,
                seq: 0,
            },
            mode,
        }
    }

    fn stored(events: &[Event]) -> Vec<StoredEvent> {
        events
            .iter()
            .map(|e| StoredEvent {
                seq: e.seq,
                epoch: e.epoch,
                kind: e.kind,
                order_no: e.order_no,
            })
            .collect()
    }

    #[test]
    fn split_skips_duplicates_and_finds_gaps() {
        let events: Vec<Event> = (1..=4)
            .map(|s| ev(s, EventKind::Deducted, s, s, 1))
            .collect();
        let split = split(SkuId(1), 1, 2, &events, &stored(&events[..2])).unwrap();
        assert_eq!((split.fresh.len(), split.duplicates), (2, 2));
        assert!(split.fenced.is_empty());
        assert!(matches!(
            super::split(SkuId(1), 1, 0, &events[1..], &[]),
            Err(StoreError::Gap {
                applied_seq: 0,
                first_seq: 2
            })
        ));
        assert!(super::split(SkuId(2), 1, 0, &events, &[]).is_err());
    }

    /// A forced re-warm once handed seq 1–3 out again: a different event at an applied seq
    /// is no duplicate, and an event of another epoch is never applied.
    #[test]
    fn split_fences_other_epochs_and_other_events_at_an_applied_seq() {
        let applied: Vec<Event> = (1..=3)
            .map(|s| ev(s, EventKind::Deducted, s, s, 1))
            .collect();
        let mut other = ev(2, EventKind::Deducted, 2, 9, 1);
        other.order_no = OrderNo::new(SkuId(1), 2, 2);
        other.epoch = 2;
        let mut old_epoch = ev(4, EventKind::Deducted, 4, 4, 1);
        old_epoch.epoch = 1;
        let mut fresh = ev(4, EventKind::Deducted, 4, 5, 1);
        fresh.epoch = 2;
        fresh.order_no = OrderNo::new(SkuId(1), 2, 4);
        let batch = vec![applied[0].clone(), other.clone(), old_epoch.clone(), fresh];
        let split = split(SkuId(1), 2, 3, &batch, &stored(&applied)).unwrap();
        assert_eq!(split.duplicates, 1);
        assert_eq!(split.fenced, vec![&other, &old_epoch]);
        assert_eq!(split.fresh.len(), 1);
        assert_eq!(split.fresh[0].order_no.to_string(), "1-2-4");
    }

    #[test]
    fn a_batch_of_two_buckets_is_refused() {
        let mut events: Vec<Event> = (1..=2)
            .map(|s| ev(s, EventKind::Deducted, s, s, 1))
            .collect();
        assert!(one_bucket(&events, 3, 1).is_ok());
        events[1].epoch = 5;
        assert!(matches!(
            one_bucket(&events, 3, 1),
            Err(StoreError::Internal(_))
        ));
    }

    /// A reserve-mode sale of 3 at seq 1 whose one order, 1-1-1 of user 1, holds one unit.
    fn one_stored_hold() -> (Head, Vec<KnownOrder>) {
        let known = vec![KnownOrder {
            sku_id: SkuId(1),
            order_no: OrderNo::new(SkuId(1), 1, 1).to_string(),
            user_id: 1,
            request_id: "r1".into(),
            quantity: 1,
            status: OrderStatus::Reserved,
        }];
        let mut h = head(3, SaleMode::Reserve);
        h.counters.available = 2;
        h.counters.reserved = 1;
        h.counters.seq = 1;
        (h, known)
    }

    #[test]
    fn fold_refuses_a_resolution_by_another_user() {
        let (h, known) = one_stored_hold();
        let events = [ev(2, EventKind::Paid, 1, 7, 1)];
        let fresh: Vec<&Event> = events.iter().collect();
        let plan = fold(SkuId(1), h, &fresh, known);
        assert_eq!(plan.report.rejected.len(), 1);
        assert!(plan.updates.is_empty());
        assert_eq!(plan.after.reserved, 1);
    }

    #[test]
    fn fold_guards_oversell_and_resolutions() {
        let events = [
            ev(1, EventKind::Deducted, 1, 1, 2),
            ev(2, EventKind::Deducted, 2, 2, 2), // only 1 left: rejected
            ev(3, EventKind::Paid, 1, 1, 2),
            ev(4, EventKind::Cancelled, 1, 1, 2), // already paid: rejected
            ev(5, EventKind::Deducted, 5, 1, 1),
        ];
        let fresh: Vec<&Event> = events.iter().collect();
        let plan = fold(SkuId(1), head(3, SaleMode::Reserve), &fresh, vec![]);
        assert_eq!(
            (
                plan.after.available,
                plan.after.reserved,
                plan.after.sold,
                plan.after.seq
            ),
            (0, 1, 2, 5)
        );
        assert_eq!(
            plan.report.rejected,
            vec![events[1].order_no, events[3].order_no]
        );
        let statuses: Vec<OrderStatus> = plan.new_orders.iter().map(|o| o.status).collect();
        assert_eq!(
            statuses,
            vec![
                OrderStatus::Paid,
                OrderStatus::Rejected,
                OrderStatus::Reserved
            ]
        );
        assert!(plan.updates.is_empty());
        let flags: Vec<bool> = plan.events.iter().map(|(_, r)| *r).collect();
        assert_eq!(flags, vec![false, true, false, true, false]);
    }

    #[test]
    fn fold_updates_stored_orders_and_refuses_repeats() {
        let (c, known) = one_stored_hold();
        let events = [
            ev(2, EventKind::Expired, 1, 1, 1),
            ev(3, EventKind::Deducted, 1, 9, 1), // order_no taken: rejected
        ];
        let fresh: Vec<&Event> = events.iter().collect();
        let plan = fold(SkuId(1), c, &fresh, known);
        assert_eq!(plan.after.available, 3);
        assert_eq!(plan.after.seq, 3);
        assert!(plan.new_orders.is_empty());
        assert_eq!(plan.updates.len(), 1);
        assert_eq!(plan.updates[0].status, OrderStatus::Expired);
        assert_eq!(plan.report.rejected.len(), 1);
    }
}
