//! Orders, the events that change a sale, and the outcome of a purchase.

use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;
use crate::ids::{OrderNo, RequestId, SkuId, UserId};
use crate::sale::{Delta, SaleMode};

/// Where an order is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    /// Accepted by the hot ledger, not yet in the system of record.
    Pending,
    /// Direct mode: sold.
    Created,
    /// Reserve mode: held, waiting for payment.
    Reserved,
    Paid,
    Cancelled,
    Expired,
    /// The system of record's guard refused an accepted order. Must never happen.
    Rejected,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "PENDING",
            OrderStatus::Created => "CREATED",
            OrderStatus::Reserved => "RESERVED",
            OrderStatus::Paid => "PAID",
            OrderStatus::Cancelled => "CANCELLED",
            OrderStatus::Expired => "EXPIRED",
            OrderStatus::Rejected => "REJECTED",
        }
    }

    pub fn parse(s: &str) -> Option<OrderStatus> {
        [
            OrderStatus::Pending,
            OrderStatus::Created,
            OrderStatus::Reserved,
            OrderStatus::Paid,
            OrderStatus::Cancelled,
            OrderStatus::Expired,
            OrderStatus::Rejected,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Live orders hold units (I1, I3).
    pub fn is_live(self) -> bool {
        matches!(
            self,
            OrderStatus::Pending | OrderStatus::Created | OrderStatus::Reserved | OrderStatus::Paid
        )
    }
}

/// What changed a sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Deducted,
    Paid,
    Cancelled,
    Expired,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Deducted => "deducted",
            EventKind::Paid => "paid",
            EventKind::Cancelled => "cancelled",
            EventKind::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<EventKind> {
        match s {
            "deducted" => Some(EventKind::Deducted),
            "paid" => Some(EventKind::Paid),
            "cancelled" => Some(EventKind::Cancelled),
            "expired" => Some(EventKind::Expired),
            _ => None,
        }
    }

    /// The order status this event leaves behind.
    pub fn status_after(self, mode: SaleMode) -> OrderStatus {
        match (self, mode) {
            (EventKind::Deducted, SaleMode::Direct) => OrderStatus::Created,
            (EventKind::Deducted, SaleMode::Reserve) => OrderStatus::Reserved,
            (EventKind::Paid, _) => OrderStatus::Paid,
            (EventKind::Cancelled, _) => OrderStatus::Cancelled,
            (EventKind::Expired, _) => OrderStatus::Expired,
        }
    }
}

/// Which side of a transfer of stock between two buckets of a sale a stream entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransferSide {
    /// Written by the source: its total and available fell by `units`.
    Out,
    /// Written by the destination: its total and available rose by `units`.
    In,
}

impl TransferSide {
    pub fn as_str(self) -> &'static str {
        match self {
            TransferSide::Out => "out",
            TransferSide::In => "in",
        }
    }

    pub fn parse(s: &str) -> Option<TransferSide> {
        match s {
            "out" => Some(TransferSide::Out),
            "in" => Some(TransferSide::In),
            _ => None,
        }
    }
}

/// One side of a transfer of stock between two buckets of a bucketed sale, as its stream
/// entry records it. A transfer takes no `seq` (seqs number order events); it is named by
/// `id` = `<source epoch>.<n>`, unique in the sale because no two buckets share an epoch.
/// Each side moves its own bucket's `total` and `available`, never the sale's counters: units
/// whose out is applied and whose in is not are in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferEvent {
    pub sku_id: SkuId,
    /// The epoch of the copy whose stream holds this side (the source's for an out, the
    /// destination's for an in): its bucket is `epoch % buckets`.
    pub epoch: u64,
    pub id: String,
    pub side: TransferSide,
    pub from: u16,
    pub to: u16,
    pub units: u64,
    pub at_ms: i64,
}

impl TransferEvent {
    /// The bucket whose counters this side moves.
    pub fn bucket(&self) -> u16 {
        match self.side {
            TransferSide::Out => self.from,
            TransferSide::In => self.to,
        }
    }

    /// How this side moves its bucket's total and available: minus for an out.
    pub fn units_delta(&self) -> i64 {
        let u = i64::try_from(self.units).unwrap_or(i64::MAX);
        match self.side {
            TransferSide::Out => -u,
            TransferSide::In => u,
        }
    }
}

/// One change of one sale; `seq` is gap-free from 1 per sale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub sku_id: SkuId,
    /// The epoch of the hot copy that wrote the event: the database refuses events of an
    /// epoch older than the one it has handed out last (the fencing token).
    pub epoch: u64,
    pub seq: u64,
    pub kind: EventKind,
    pub order_no: OrderNo,
    pub request_id: RequestId,
    pub user_id: UserId,
    pub quantity: u32,
    pub at_ms: i64,
    /// Reserve-mode deductions: the payment deadline of the hold; 0 otherwise.
    pub deadline_ms: i64,
}

impl Event {
    /// How this event moves the counters of a sale in `mode`.
    pub fn delta(&self, mode: SaleMode) -> Delta {
        let q = i64::from(self.quantity);
        match (self.kind, mode) {
            (EventKind::Deducted, SaleMode::Direct) => Delta {
                available: -q,
                reserved: 0,
                sold: q,
            },
            (EventKind::Deducted, SaleMode::Reserve) => Delta {
                available: -q,
                reserved: q,
                sold: 0,
            },
            (EventKind::Paid, _) => Delta {
                available: 0,
                reserved: -q,
                sold: q,
            },
            (EventKind::Cancelled | EventKind::Expired, _) => Delta {
                available: q,
                reserved: -q,
                sold: 0,
            },
        }
    }
}

/// An order as a hot ledger knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotOrder {
    pub order_no: OrderNo,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub request_id: RequestId,
    pub quantity: u32,
    pub status: OrderStatus,
    /// Reserve mode: payment deadline (epoch ms); 0 in direct mode.
    pub deadline_ms: i64,
    pub created_at_ms: i64,
}

/// The answer to one purchase request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PurchaseOutcome {
    Accepted {
        order: HotOrder,
        /// True when this answers a retry of an earlier accepted request.
        replayed: bool,
    },
    Rejected(ErrorCode),
}

impl PurchaseOutcome {
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            PurchaseOutcome::Accepted { .. } => None,
            PurchaseOutcome::Rejected(code) => Some(*code),
        }
    }

    /// The outcome label used in metrics and reports.
    pub fn label(&self) -> &'static str {
        match self {
            PurchaseOutcome::Accepted {
                replayed: false, ..
            } => "accepted",
            PurchaseOutcome::Accepted { replayed: true, .. } => "replayed",
            PurchaseOutcome::Rejected(code) => code.as_str(),
        }
    }
}
