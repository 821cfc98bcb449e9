//! The loss journal: what this instance promised that the database may not hold yet.
//!
//! When Redis restarts without persistence its stream goes with the counters, so nothing in
//! Redis or the database names the purchases accepted after `applied_seq`, nor the payments
//! and cancellations answered 200. Each instance therefore records, per sale, every newly
//! accepted purchase (by order number: `(epoch, seq)`) and every resolution it answered (with
//! the time it answered), in memory. A reconciler run forgets what the database holds and
//! reports what it never will: a purchase of an epoch older than the database's (the database
//! refuses that epoch now), a resolution answered before the sale's copy was replaced.
//!
//! A run takes its losses out of the journal but keeps them aside until the run that names
//! them is stored ([`Journal::forget_taken`]); a run that fails or is dropped before that
//! leaves them for the next run ([`Journal::restore_taken`]), so a loss is reported at least
//! once, never dropped with a failed run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use flashsale_core::{
    BucketRow, EventKind, HotOrder, OrderNo, OrderStatus, SaleMode, SkuId, StoredSale,
};

/// Most entries the journal keeps per sale (beyond it, the oldest go and the journal says it
/// is incomplete).
pub const JOURNAL_PER_SALE_MAX: usize = 262_144;

#[derive(Default)]
pub struct Journal {
    sales: Mutex<HashMap<SkuId, SaleJournal>>,
    /// One reconciler run at a time in this process (worker, admin API).
    pub(crate) running: tokio::sync::Mutex<()>,
    /// Sales a run found settled (`SaleReport::settled`): the worker's passes skip them.
    settled: Mutex<HashSet<SkuId>>,
}

#[derive(Default)]
struct SaleJournal {
    /// Accepted purchases by `(epoch, seq)` of their order number.
    purchases: BTreeMap<(u64, u64), OrderNo>,
    /// Payments and cancellations answered 200: order number → (kind, answered at ms).
    resolutions: BTreeMap<OrderNo, (EventKind, i64)>,
    /// Entries dropped because the journal was full.
    dropped: u64,
    /// Losses the running reconcile run took out: gone once its report is stored, back in
    /// the journal when the run fails.
    taken: Taken,
}

#[derive(Default)]
struct Taken {
    purchases: Vec<((u64, u64), OrderNo)>,
    resolutions: Vec<(OrderNo, (EventKind, i64))>,
}

/// What the journal could decide in one run.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Losses {
    pub orders: Vec<OrderNo>,
    /// `(order_no, kind)` of resolutions answered 200 that the database never got.
    pub resolutions: Vec<(OrderNo, EventKind)>,
    /// False when entries were dropped (the report may be incomplete).
    pub complete: bool,
}

impl Journal {
    /// Marks a sale settled: nothing can change it any more.
    pub fn settle_sale(&self, sku: SkuId) {
        self.settled.lock().expect("settled lock").insert(sku);
    }

    pub fn is_settled(&self, sku: SkuId) -> bool {
        self.settled.lock().expect("settled lock").contains(&sku)
    }

    /// Records accepted purchases of `sku` (replays too: recording one twice is a no-op).
    pub fn record_purchases(&self, sku: SkuId, orders: impl Iterator<Item = OrderNo>) {
        let mut sales = self.sales.lock().expect("journal lock");
        let journal = sales.entry(sku).or_default();
        for no in orders {
            journal.purchases.insert((no.epoch(), no.seq()), no);
            if journal.purchases.len() > JOURNAL_PER_SALE_MAX {
                journal.purchases.pop_first();
                journal.dropped += 1;
            }
        }
    }

    /// Records a payment or cancellation answered 200 at `at_ms` (this process's clock).
    pub fn record_resolution(&self, no: &OrderNo, kind: EventKind, at_ms: i64) {
        let mut sales = self.sales.lock().expect("journal lock");
        let journal = sales.entry(no.sku()).or_default();
        journal.resolutions.insert(*no, (kind, at_ms));
        if journal.resolutions.len() > JOURNAL_PER_SALE_MAX {
            journal.resolutions.pop_first();
            journal.dropped += 1;
        }
    }

    /// Forgets what the database holds and takes out what it never will (`stored`, `orders`
    /// and a sale kept in buckets' bucket rows `buckets` read in one transaction). An order
    /// of a bucketed sale is judged by its own bucket's epoch: its purchase is lost once that
    /// epoch moved past the order's, a resolution once that epoch was taken after it.
    pub fn settle(
        &self,
        stored: &StoredSale,
        orders: &[HotOrder],
        buckets: &[BucketRow],
    ) -> Losses {
        let sku = stored.sale.sku_id;
        let mut sales = self.sales.lock().expect("journal lock");
        let Some(j) = sales.get_mut(&sku) else {
            return Losses {
                complete: true,
                ..Losses::default()
            };
        };
        // Every stored order, once per run: aHash (std's SipHash over the order numbers was a
        // visible part of a pass over a large sale), and one map for both questions.
        let status: HashMap<&OrderNo, OrderStatus, ahash::RandomState> =
            orders.iter().map(|o| (&o.order_no, o.status)).collect();
        let held = |no: &OrderNo| status.contains_key(no);
        let mut losses = Losses {
            complete: j.dropped == 0,
            ..Losses::default()
        };
        // The epoch (and when it was taken) of the copy that sold an order of `epoch`: the
        // sale's, or its bucket's for a sale kept in buckets.
        let n = stored.sale.buckets.max(1);
        let row = |epoch: u64| {
            let bucket = flashsale_core::buckets::bucket_of_epoch(epoch, n);
            buckets.iter().find(|r| r.bucket == bucket)
        };
        let current = |epoch: u64| row(epoch).map_or(stored.epoch, |r| r.epoch);
        let taken_at_ms = |epoch: u64| row(epoch).map_or(stored.epoch_at_ms, |r| r.epoch_at_ms);
        let taken = &mut j.taken;
        j.purchases.retain(|&(epoch, seq), no| {
            let lost = !held(no) && epoch < current(epoch);
            if lost {
                losses.orders.push(*no);
                taken.purchases.push(((epoch, seq), *no));
            }
            !held(no) && !lost
        });
        j.resolutions.retain(|no, &mut (kind, at_ms)| {
            // Resolutions exist in reserve mode only.
            let done = status.get(no).copied() == Some(kind.status_after(SaleMode::Reserve));
            let lost = !done && taken_at_ms(no.epoch()) > at_ms;
            if lost {
                losses.resolutions.push((*no, kind));
                taken.resolutions.push((*no, (kind, at_ms)));
            }
            !done && !lost
        });
        losses
    }

    /// The losses taken out since the last stored run are reported: forget them.
    pub fn forget_taken(&self, sku: SkuId) {
        let mut sales = self.sales.lock().expect("journal lock");
        if let Some(j) = sales.get_mut(&sku) {
            j.taken = Taken::default();
        }
    }

    /// The run that took losses out did not store its report (it failed, or was dropped
    /// midway): they go back, for the next run to report.
    pub fn restore_taken(&self, sku: SkuId) {
        let mut sales = self.sales.lock().expect("journal lock");
        let Some(j) = sales.get_mut(&sku) else {
            return;
        };
        let taken = std::mem::take(&mut j.taken);
        j.purchases.extend(taken.purchases);
        j.resolutions.extend(taken.resolutions);
    }

    /// Entries kept for a sale (for tests and metrics).
    pub fn len(&self, sku: SkuId) -> usize {
        let sales = self.sales.lock().expect("journal lock");
        sales
            .get(&sku)
            .map_or(0, |j| j.purchases.len() + j.resolutions.len())
    }

    pub fn is_empty(&self, sku: SkuId) -> bool {
        self.len(sku) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::{Counters, RequestId, Sale, UserId};

    fn no(epoch: u64, seq: u64) -> OrderNo {
        OrderNo::new(SkuId(7), epoch, seq)
    }

    fn stored(epoch: u64, epoch_at_ms: i64) -> StoredSale {
        let sale = Sale {
            mode: SaleMode::Reserve,
            payment_timeout_ms: 1_000,
            ..Sale::always_open(SkuId(7), 100)
        };
        StoredSale {
            counters: Counters::default(),
            sale,
            epoch,
            epoch_at_ms,
        }
    }

    fn held(no: &OrderNo, status: OrderStatus) -> HotOrder {
        HotOrder {
            order_no: *no,
            sku_id: SkuId(7),
            user_id: UserId(1),
            request_id: RequestId::parse("r").unwrap(),
            quantity: 1,
            status,
            deadline_ms: 0,
            created_at_ms: 0,
        }
    }

    /// The database holding an order number is what settles it, never its seq alone.
    #[test]
    fn purchases_settle_by_order_number_and_older_epochs_not_held_are_lost() {
        let j = Journal::default();
        let sku = SkuId(7);
        j.record_purchases(sku, (1..=4).map(|s| no(1, s)));
        let orders = [held(&no(1, 1), OrderStatus::Reserved)];
        // Same epoch: 2–4 are still in flight.
        let l = j.settle(&stored(1, 0), &orders, &[]);
        assert!(l.orders.is_empty() && l.complete);
        assert_eq!(j.len(sku), 3);
        // Rebuilt in epoch 2 holding only seq 2 of the old numbers: 3 and 4 are lost.
        let orders = [held(&no(1, 2), OrderStatus::Reserved)];
        let l = j.settle(&stored(2, 0), &orders, &[]);
        assert_eq!(l.orders, vec![no(1, 3), no(1, 4)]);
        assert!(j.is_empty(sku));
    }

    /// A sale of two buckets (epochs 2 and 3 at its first load): bucket 0 rebuilt in epoch
    /// 4 loses what it sold in epoch 2 that the database lacks; bucket 1's are in flight.
    #[test]
    fn a_purchase_is_lost_when_its_own_bucket_moved_on() {
        let j = Journal::default();
        let sku = SkuId(7);
        j.record_purchases(sku, [no(2, 1), no(2, 2), no(3, 1)].into_iter());
        let mut sale = stored(1, 0);
        sale.sale.buckets = 2;
        let row = |bucket: u16, epoch: u64| BucketRow {
            bucket,
            epoch,
            epoch_at_ms: 0,
            counters: flashsale_core::Counters::default(),
        };
        let orders = [held(&no(2, 1), OrderStatus::Reserved)];
        let l = j.settle(&sale, &orders, &[row(0, 2), row(1, 3)]);
        assert!(l.orders.is_empty(), "{l:?}");
        let l = j.settle(&sale, &orders, &[row(0, 4), row(1, 3)]);
        assert_eq!(l.orders, vec![no(2, 2)]);
        assert_eq!(j.len(sku), 1, "bucket 1's order is still in flight");
        // Payments at 1,000 of an order of each bucket; bucket 1 rebuilt at 2,000 since.
        j.record_resolution(&no(2, 1), EventKind::Paid, 1_000);
        j.record_resolution(&no(3, 1), EventKind::Paid, 1_000);
        let mut rebuilt = row(1, 5);
        rebuilt.epoch_at_ms = 2_000;
        let l = j.settle(&sale, &orders, &[row(0, 4), rebuilt]);
        assert_eq!(l.resolutions, vec![(no(3, 1), EventKind::Paid)]);
    }

    /// A run that failed before storing its report gives its losses back; a stored one
    /// forgets them.
    #[test]
    fn losses_of_a_run_that_was_not_stored_are_reported_again() {
        let j = Journal::default();
        let sku = SkuId(7);
        j.record_purchases(sku, [no(1, 1)].into_iter());
        j.record_resolution(&no(1, 2), EventKind::Paid, 1_000);
        let rebuilt = stored(2, 2_000);
        let first = j.settle(&rebuilt, &[], &[]);
        assert_eq!(first.orders, vec![no(1, 1)]);
        assert!(j.settle(&rebuilt, &[], &[]).orders.is_empty(), "taken");
        j.restore_taken(sku);
        let again = j.settle(&rebuilt, &[], &[]);
        assert_eq!(
            (again.orders, again.resolutions),
            (first.orders, first.resolutions)
        );
        j.forget_taken(sku);
        j.restore_taken(sku);
        assert!(
            j.settle(&rebuilt, &[], &[]).orders.is_empty(),
            "reported once stored"
        );
        assert!(j.is_empty(sku));
    }

    #[test]
    fn a_payment_answered_before_a_rebuild_that_the_database_lacks_is_lost() {
        let j = Journal::default();
        j.record_resolution(&no(1, 1), EventKind::Paid, 1_000);
        j.record_resolution(&no(1, 2), EventKind::Paid, 1_000);
        j.record_resolution(&no(1, 3), EventKind::Cancelled, 3_000);
        let orders = [
            held(&no(1, 1), OrderStatus::Paid),
            held(&no(1, 2), OrderStatus::Reserved),
            held(&no(1, 3), OrderStatus::Reserved),
        ];
        // Rebuilt at 2,000: the payment of 1-2 never arrived; the cancel of 1-3 came after.
        let l = j.settle(&stored(2, 2_000), &orders, &[]);
        assert_eq!(l.resolutions, vec![(no(1, 2), EventKind::Paid)]);
        assert_eq!(j.len(SkuId(7)), 1);
    }
}
