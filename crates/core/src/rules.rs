//! `SaleBook`: the reference state machine of one sale.
//!
//! The embedded ledger runs it directly; `scripts/*.lua` in flashsale-redis mirror it check for
//! check, in the same order; the conformance suite holds both ledgers to it. The order of the
//! checks is part of the HTTP API (it decides which error a request gets):
//! replay → sale state and window → quantity → stock → per-user limit → accept.
//! Stock comes before the limit so that a sold-out sale answers SOLD_OUT to everyone, which is
//! what an instance's local sold-out flag answers without asking the ledger.

use std::collections::{BTreeSet, HashMap};

/// The book's maps: aHash (keyed at random per map, so request ids a client picks cannot
/// aim at one bucket) costs a fraction of std's SipHash per lookup, and a purchase makes four.
type Map<K, V> = HashMap<K, V, ahash::RandomState>;

/// Entries each map is sized for at first (a sale's stock, at most this), so a sale's first
/// few thousand orders cause no rehash. Not more: sized to a million-unit stock, the maps took
/// some 400 MB of address space that each insert touched at a fresh page, and the embedded
/// ledger's accepted purchase over HTTP cost 222 µs of server CPU instead of 142 (p99 388 ms
/// instead of 64; BENCHMARKS.md "The server alone").
const PRESIZE_MAX: u64 = 1 << 12;

fn presized<K, V>(n: usize) -> Map<K, V> {
    Map::with_capacity_and_hasher(n, ahash::RandomState::new())
}

use crate::error::ErrorCode;
use crate::ids::{OrderNo, RequestId, UserId};
use crate::ledger::PurchaseRequest;
use crate::order::{Event, EventKind, HotOrder, OrderStatus, PurchaseOutcome};
use crate::sale::{Counters, Sale, SaleMode, SaleState};

/// A payment's or a cancellation's outcome: the order, and the event when it changed.
pub type Resolved = Result<(HotOrder, Option<Event>), ErrorCode>;

/// All hot state of one sale.
#[derive(Debug, Clone)]
pub struct SaleBook {
    pub sale: Sale,
    pub counters: Counters,
    /// Grows each time hot state is rebuilt from the database; part of every order number.
    pub epoch: u64,
    buyers: Map<UserId, u32>,
    requests: Map<(UserId, RequestId), OrderNo>,
    orders: Map<OrderNo, HotOrder>,
    holds: BTreeSet<(i64, OrderNo)>,
}

impl SaleBook {
    pub fn new(sale: Sale, counters: Counters, epoch: u64) -> SaleBook {
        assert!(counters.conserved(), "counters not conserved: {counters:?}");
        let n = sale.total_stock.min(PRESIZE_MAX) as usize;
        SaleBook {
            sale,
            counters,
            epoch,
            buyers: presized(n),
            requests: presized(n),
            orders: presized(n),
            holds: BTreeSet::new(),
        }
    }

    /// Recovery: adds an order read back from the system of record.
    pub fn restore_order(&mut self, order: HotOrder) {
        if order.status.is_live() {
            *self.buyers.entry(order.user_id).or_default() += order.quantity;
        }
        if order.status == OrderStatus::Reserved {
            self.holds.insert((order.deadline_ms, order.order_no));
        }
        let key = (order.user_id, order.request_id.clone());
        self.requests.insert(key, order.order_no);
        self.orders.insert(order.order_no, order);
    }

    pub fn order(&self, order_no: &OrderNo) -> Option<&HotOrder> {
        self.orders.get(order_no)
    }

    /// Whether this book accepted the request (a purchase of it would be a replay).
    pub fn accepted(&self, user: UserId, request_id: &RequestId) -> bool {
        self.requests.contains_key(&(user, request_id.clone()))
    }

    pub fn units_held(&self, user: UserId) -> u32 {
        self.buyers.get(&user).copied().unwrap_or(0)
    }

    pub fn holds_len(&self) -> usize {
        self.holds.len()
    }

    /// Judges one purchase; on acceptance applies it and returns its event.
    pub fn purchase(
        &mut self,
        req: &PurchaseRequest,
        now_ms: i64,
    ) -> (PurchaseOutcome, Option<Event>) {
        match self.judge(req, now_ms) {
            Err(code) => (PurchaseOutcome::Rejected(code), None),
            Ok(Some(order_no)) => {
                let order = self.orders[&order_no].clone();
                (
                    PurchaseOutcome::Accepted {
                        order,
                        replayed: true,
                    },
                    None,
                )
            }
            Ok(None) => {
                let (order, event) = self.accept(req, now_ms);
                (
                    PurchaseOutcome::Accepted {
                        order,
                        replayed: false,
                    },
                    Some(event),
                )
            }
        }
    }

    /// Every check, no change. `Ok(Some(_))` is a replay of an accepted request.
    fn judge(&self, req: &PurchaseRequest, now_ms: i64) -> Result<Option<OrderNo>, ErrorCode> {
        if let Some(no) = self.requests.get(&(req.user_id, req.request_id.clone())) {
            return Ok(Some(*no));
        }
        self.judge_window(now_ms)?;
        if req.quantity == 0 || req.quantity > self.sale.per_user_limit {
            return Err(if req.quantity == 0 {
                ErrorCode::InvalidRequest
            } else {
                ErrorCode::LimitExceeded
            });
        }
        if self.counters.available < u64::from(req.quantity) {
            return Err(ErrorCode::SoldOut);
        }
        if self.units_held(req.user_id) + req.quantity > self.sale.per_user_limit {
            return Err(ErrorCode::LimitExceeded);
        }
        Ok(None)
    }

    fn judge_window(&self, now_ms: i64) -> Result<(), ErrorCode> {
        match self.sale.state {
            SaleState::Scheduled => Err(ErrorCode::NotStarted),
            SaleState::Paused => Err(ErrorCode::Paused),
            SaleState::Ended => Err(ErrorCode::Ended),
            SaleState::Live if now_ms < self.sale.starts_at_ms => Err(ErrorCode::NotStarted),
            SaleState::Live if now_ms >= self.sale.ends_at_ms => Err(ErrorCode::Ended),
            SaleState::Live => Ok(()),
        }
    }

    fn accept(&mut self, req: &PurchaseRequest, now_ms: i64) -> (HotOrder, Event) {
        let seq = self.counters.seq + 1;
        let reserve = self.sale.mode == SaleMode::Reserve;
        let deadline_ms = if reserve {
            now_ms + self.sale.payment_timeout_ms as i64
        } else {
            0
        };
        let order = HotOrder {
            order_no: OrderNo::new(self.sale.sku_id, self.epoch, seq),
            sku_id: self.sale.sku_id,
            user_id: req.user_id,
            request_id: req.request_id.clone(),
            quantity: req.quantity,
            status: EventKind::Deducted.status_after(self.sale.mode),
            deadline_ms,
            created_at_ms: now_ms,
        };
        let event = self.event_for(&order, EventKind::Deducted, now_ms);
        self.apply_event(&event);
        self.restore_order(order.clone());
        (order, event)
    }

    fn event_for(&self, order: &HotOrder, kind: EventKind, now_ms: i64) -> Event {
        Event {
            sku_id: self.sale.sku_id,
            epoch: self.epoch,
            seq: self.counters.seq + 1,
            kind,
            order_no: order.order_no,
            request_id: order.request_id.clone(),
            user_id: order.user_id,
            quantity: order.quantity,
            at_ms: now_ms,
            deadline_ms: if kind == EventKind::Deducted {
                order.deadline_ms
            } else {
                0
            },
        }
    }

    fn apply_event(&mut self, event: &Event) {
        assert_eq!(
            event.seq,
            self.counters.seq + 1,
            "events apply in seq order"
        );
        self.counters = self
            .counters
            .apply(event.delta(self.sale.mode))
            .expect("checked before the change: no counter goes negative");
        debug_assert!(self.counters.conserved());
    }

    /// Pays a reservation of `user`. A retry of a payment that went through answers the
    /// paid order again with no event (the first outcome).
    pub fn pay(&mut self, no: &OrderNo, user: UserId, now_ms: i64) -> Resolved {
        self.resolve(no, user, now_ms, EventKind::Paid)
    }

    /// Cancels a reservation of `user` and gives the units and the quota back. A retry of a
    /// cancellation that went through answers the cancelled order again with no event.
    pub fn cancel(&mut self, no: &OrderNo, user: UserId, now_ms: i64) -> Resolved {
        self.resolve(no, user, now_ms, EventKind::Cancelled)
    }

    fn resolve(&mut self, no: &OrderNo, user: UserId, now_ms: i64, kind: EventKind) -> Resolved {
        let order = match self.orders.get(no) {
            Some(order) if order.user_id == user => order,
            _ => return Err(ErrorCode::OrderNotFound),
        };
        match order.status {
            OrderStatus::Reserved if now_ms >= order.deadline_ms => Err(ErrorCode::HoldExpired),
            OrderStatus::Reserved => {
                let (order, event) = self.transition(no, kind, now_ms);
                Ok((order, Some(event)))
            }
            OrderStatus::Expired => Err(ErrorCode::HoldExpired),
            // The owner's retry of the same resolution: its first outcome (a reservation's
            // pay answered 503 may have gone through; its retry must not read as a conflict).
            status if status == kind.status_after(self.sale.mode) => Ok((order.clone(), None)),
            _ => Err(ErrorCode::AlreadyResolved),
        }
    }

    /// Expires at most `max` holds whose deadline is at or before `now_ms`, oldest first.
    pub fn expire_due(&mut self, now_ms: i64, max: usize) -> Vec<Event> {
        let due: Vec<OrderNo> = self
            .holds
            .iter()
            .take_while(|(deadline, _)| *deadline <= now_ms)
            .take(max)
            .map(|(_, no)| *no)
            .collect();
        due.iter()
            .map(|no| self.transition(no, EventKind::Expired, now_ms).1)
            .collect()
    }

    /// Moves a reserved order out of its hold. The caller checked that it is reserved.
    fn transition(&mut self, no: &OrderNo, kind: EventKind, now_ms: i64) -> (HotOrder, Event) {
        let order = self.orders[no].clone();
        assert_eq!(order.status, OrderStatus::Reserved);
        let event = self.event_for(&order, kind, now_ms);
        self.apply_event(&event);
        self.holds.remove(&(order.deadline_ms, *no));
        if kind != EventKind::Paid {
            let held = self
                .buyers
                .get_mut(&order.user_id)
                .expect("a reserved order has a buyer");
            *held -= order.quantity;
        }
        let stored = self.orders.get_mut(no).expect("present");
        stored.status = kind.status_after(self.sale.mode);
        (stored.clone(), event)
    }
}

#[cfg(test)]
mod tests;
