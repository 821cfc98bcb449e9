//! What the reconciler's unit tests build their cases from.

use flashsale_core::{Event, EventKind, OrderNo, RequestId, SkuId, UserId};

/// Sale 1's deduction `seq` of `epoch`: one unit, to user `seq`.
pub(crate) fn deducted(epoch: u64, seq: u64) -> Event {
    Event {
        sku_id: SkuId(1),
        epoch,
        seq,
        kind: EventKind::Deducted,
        order_no: OrderNo::new(SkuId(1), epoch, seq),
        request_id: RequestId::parse("r").unwrap(),
        user_id: UserId(seq),
        quantity: 1,
        at_ms: 10,
        deadline_ms: 0,
    }
}
