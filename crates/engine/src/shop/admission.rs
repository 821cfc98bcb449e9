//! Admission of queue and draw sales as use cases: join a queue and read one's place, enter
//! a draw and read one's result, read the published draw. Each reads the sale (through the
//! cache) and asks the engine's `Admission`.

use std::sync::Arc;

use flashsale_core::admission::Entry;
use flashsale_core::{Counters, ErrorCode, Sale, SaleState, SkuId, UserId};

use super::{Shop, ShopError};
use crate::admission::draw::{DrawView, EntryResult};
use crate::admission::{Admission, QueueStatus};

impl Shop {
    /// Joins `user` to the sale's queue (a second join keeps the first place), and their
    /// place, answered from the ticket the join got (no second read).
    pub async fn join_queue(&self, sku: SkuId, user: UserId) -> Result<QueueStatus, ShopError> {
        let admission = self.admission()?;
        let (sale, counters) = self.sale_and_counters(sku).await?;
        let ticket = admission.join(&sale, user, crate::now_ms()).await?;
        Ok(admission.status_of(&sale, user, ticket, &counters).await?)
    }

    /// `user`'s place in the sale's queue.
    pub async fn queue_status(&self, sku: SkuId, user: UserId) -> Result<QueueStatus, ShopError> {
        let admission = self.admission()?;
        let (sale, counters) = self.sale_and_counters(sku).await?;
        admission
            .status(&sale, user, &counters)
            .await?
            .ok_or_else(|| ShopError::invalid("not in this sale's queue: POST …/queue to join"))
    }

    /// Enters `user` in the sale's draw for `quantity` units: the entry, and whether it is
    /// new (one entry per user: a second answers the first).
    pub async fn enter_draw(
        &self,
        sku: SkuId,
        user: UserId,
        quantity: i64,
    ) -> Result<(Entry, bool), ShopError> {
        let admission = self.admission()?;
        let (sale, _) = self.sale_and_counters(sku).await?;
        let quantity = u32::try_from(quantity)
            .ok()
            .filter(|q| (1..=sale.per_user_limit).contains(q))
            .ok_or_else(|| {
                ShopError::invalid(format!("quantity must be 1..={}", sale.per_user_limit))
            })?;
        Ok(admission.enter(&sale, user, quantity).await?)
    }

    /// `user`'s draw entry and, after the draw, its result.
    pub async fn draw_entry(&self, sku: SkuId, user: UserId) -> Result<EntryResult, ShopError> {
        let admission = self.admission()?;
        let (sale, _) = self.sale_and_counters(sku).await?;
        self.walk(&admission, &sale).await?;
        admission
            .my_entry(&sale, user, self.ledger.as_ref())
            .await?
            .ok_or_else(|| ShopError::invalid("no entry of this user: POST …/entries first"))
    }

    /// The sale's published draw.
    pub async fn draw(&self, sku: SkuId) -> Result<DrawView, ShopError> {
        let admission = self.admission()?;
        let (sale, _) = self.sale_and_counters(sku).await?;
        self.walk(&admission, &sale).await?;
        Ok(admission.draw_view(&sale).await?)
    }

    fn admission(&self) -> Result<Arc<Admission>, ShopError> {
        self.admission.clone().ok_or_else(|| {
            ShopError::refused(
                ErrorCode::Unavailable,
                "this instance keeps no admission state",
            )
        })
    }

    /// The draw's reservations: walked when a reader asks, so a result read after the draw,
    /// or after a hold lapsed, already counts the reservations it leads to.
    async fn walk(&self, admission: &Admission, sale: &Sale) -> Result<(), ShopError> {
        if sale.state == SaleState::Live {
            admission.walk(sale, self.ledger.as_ref()).await?;
        }
        Ok(())
    }

    /// The sale and its counters (the cache's, at most its lifetime old).
    async fn sale_and_counters(&self, sku: SkuId) -> Result<(Sale, Counters), ShopError> {
        let stored = self.sale(sku).await?;
        let counters = match self.sales.counters(sku) {
            Some(c) => c,
            None => self.hot_or_stored_counters(&stored).await,
        };
        Ok((stored.sale.clone(), counters))
    }
}
