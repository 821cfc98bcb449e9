//! Orders: a buyer's order as it stands, pay and cancel.

use flashsale_core::{
    ErrorCode, EventKind, HotOrder, LedgerError, OrderNo, OrderStatus, Resolution, UserId,
};

use super::{Shop, ShopError};

/// An order and the status to answer for it.
#[derive(Debug, Clone)]
pub struct OrderNow {
    pub order: HotOrder,
    pub status: OrderStatus,
}

impl Shop {
    /// `user`'s order `no`: the database's (its status) once stored, else the hot ledger's
    /// (the status its durability lets it promise). Someone else's order is no order.
    pub async fn order(&self, no: &OrderNo, user: UserId) -> Result<OrderNow, ShopError> {
        let found = match self.store.order(no).await {
            Ok(Some(order)) => {
                let status = order.status;
                Some(OrderNow { order, status })
            }
            Ok(None) => self.hot_order(no).await?,
            Err(e) => {
                tracing::warn!(error = %e, "database unreachable; answering from the hot ledger");
                self.hot_order(no).await?
            }
        };
        found
            .filter(|o| o.order.user_id == user)
            .ok_or(ShopError::Code(ErrorCode::OrderNotFound))
    }

    async fn hot_order(&self, no: &OrderNo) -> Result<Option<OrderNow>, ShopError> {
        let order = self.ledger.order(no).await?;
        Ok(order.map(|order| {
            let status = self.ledger.durability().as_answered(order.status);
            OrderNow { order, status }
        }))
    }

    /// Pays `user`'s order `no`.
    pub async fn pay(&self, no: &OrderNo, user: UserId) -> Result<HotOrder, ShopError> {
        let result = self.ledger.pay(no, user).await;
        self.resolved(no, EventKind::Paid, result)
    }

    /// Cancels `user`'s order `no`. It gives units back, so the sale's sold-out flag no
    /// longer holds.
    pub async fn cancel(&self, no: &OrderNo, user: UserId) -> Result<HotOrder, ShopError> {
        let result = self.ledger.cancel(no, user).await;
        let order = self.resolved(no, EventKind::Cancelled, result)?;
        self.sold_out.clear(no.sku());
        Ok(order)
    }

    /// The books of a pay or cancel: the breaker's accounting, a nudge when the sale's copy
    /// is fenced, and the loss journal for one that is answered as done, or written but not
    /// confirmed by the replicas (a hot ledger that loses it afterwards must not lose it
    /// silently).
    fn resolved(
        &self,
        no: &OrderNo,
        kind: EventKind,
        result: Result<Resolution, LedgerError>,
    ) -> Result<HotOrder, ShopError> {
        let sku = no.sku();
        self.count(sku, &result);
        if let Err(LedgerError::Unconfirmed { written, .. }) = &result {
            let at_ms = crate::now_ms();
            for no in written {
                self.journal.record_resolution(no, kind, at_ms);
            }
        }
        if matches!(result, Ok(Err(ErrorCode::Unavailable))) {
            self.nudges.nudge(sku);
        }
        let order = result?.map_err(ShopError::Code)?;
        self.journal
            .record_resolution(&order.order_no, kind, crate::now_ms());
        Ok(order)
    }
}
