//! Invariants I1–I7 over rows read from the system of record. Tests, the bench, the demo and
//! the reconciler all call these, so every verdict means the same thing everywhere.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::ids::{OrderNo, RequestId, UserId};
use crate::order::{Event, EventKind, HotOrder, OrderStatus};
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
    let mut report = InvariantReport::default();
    check_counters(sale, counters, orders, &mut report);
    check_per_user(sale, orders, &mut report);
    check_idempotency(orders, &mut report);
    check_persisted(orders, drained, &mut report);
    check_events(counters, orders, events, &mut report);
    report
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
    let mut held: HashMap<UserId, u64> = HashMap::new();
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
    let mut requests: HashSet<(UserId, &RequestId)> = HashSet::new();
    let mut numbers: HashSet<&OrderNo> = HashSet::new();
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
    let mut deducted: HashMap<&OrderNo, usize> = HashMap::new();
    let mut resolved: HashMap<&OrderNo, usize> = HashMap::new();
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
}
