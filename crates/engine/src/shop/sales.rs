//! Sales: create, warm, pause / resume / end, and a sale's view (counters from the cache,
//! the hot ledger or the database; a bucketed sale's buckets).

use flashsale_core::ledger::StoredSale;
use flashsale_core::{Counters, ErrorCode, LedgerError, Sale, SaleState, SkuId};

use super::buckets::Buckets;
use super::{Shop, ShopError};
use crate::reconcile::{rebuild_all, warm_snapshot, RebuildError};

/// A sale as it stands: its counters (the whole sale's) and, in its public view, a bucketed
/// sale's buckets.
#[derive(Debug, Clone)]
pub struct SaleNow {
    pub sale: Sale,
    pub counters: Counters,
    pub buckets: Buckets,
}

impl SaleNow {
    fn new(sale: Sale, counters: Counters) -> SaleNow {
        SaleNow {
            sale,
            counters,
            buckets: Buckets::None,
        }
    }
}

impl Shop {
    /// Stores a new sale (scheduled). Refused before anything is stored when the ledger
    /// could not load the sale's copy.
    pub async fn create_sale(&self, sale: Sale) -> Result<SaleNow, ShopError> {
        self.ledger
            .check_buckets(&sale)
            .map_err(ShopError::invalid)?;
        let stored = self.store.create_sale(&sale).await?;
        self.sales.forget(sale.sku_id);
        Ok(SaleNow::new(stored.sale, stored.counters))
    }

    /// A sale's public view: its counters may be a cache lifetime old.
    pub async fn sale_now(&self, sku: SkuId) -> Result<SaleNow, ShopError> {
        let stored = self.sale(sku).await?;
        let counters = match self.sales.counters(sku) {
            Some(c) => c,
            None => self.hot_or_stored_counters(&stored).await,
        };
        let buckets = self.buckets_of(&stored).await;
        Ok(SaleNow {
            sale: stored.sale.clone(),
            counters,
            buckets,
        })
    }

    /// A bucketed sale's buckets (cached), else none.
    pub(super) async fn buckets_of(&self, stored: &StoredSale) -> Buckets {
        let (ledger, store) = (self.ledger.as_ref(), self.store.as_ref());
        self.buckets.read(ledger, store, stored).await
    }

    /// Loads a sale into the hot ledger. A sale whose hot copy is intact (open, of the
    /// database's epoch) and has sold is refused unless `force`; an intact copy that has not
    /// sold only takes the database's state; everything else — the first load, a copy that
    /// is gone or older than the database, a forced warm — is a rebuild: the old copy is
    /// fenced and drained, the next epoch is taken in the database, and the new copy is
    /// loaded with the database's orders (see `reconcile::rebuild`). No order number is ever
    /// handed out twice, and nothing the old copy accepted is lost while it is readable.
    pub async fn warm(&self, sku: SkuId, force: bool) -> Result<SaleNow, ShopError> {
        let stored = self.stored_sale(sku).await?;
        if stored.sale.state == SaleState::Ended {
            return Err(ShopError::Code(ErrorCode::Ended));
        }
        if stored.sale.state == SaleState::Scheduled {
            // The database first: a rebuild opens the copy in the database's state.
            self.store.set_state(sku, SaleState::Live).await?;
        }
        let (ledger, store) = (self.ledger.as_ref(), self.store.as_ref());
        let snap = warm_snapshot(ledger, store, &stored)
            .await
            .map_err(rebuild_error)?;
        let intact = snap
            .as_ref()
            .filter(|s| s.epoch == stored.epoch && s.fenced_ms.is_none());
        match intact {
            Some(s) if s.counters.seq > 0 && !force => {
                let why = format!(
                    "sale {sku} is warm and has sold; ?force=true rebuilds it from the database \
                     in a new epoch (its stream is drained first: nothing accepted is lost)"
                );
                return Err(ShopError::refused(ErrorCode::SaleExists, why));
            }
            Some(_) if !force => {
                let state = self.stored_sale(sku).await?.sale.state;
                self.ledger.set_state(sku, state).await?;
            }
            _ => {
                rebuild_all(ledger, store, sku)
                    .await
                    .map_err(rebuild_error)?;
            }
        }
        self.forget(sku);
        let stored = self.stored_sale(sku).await?;
        let hot = self.ledger.counters(sku).await.ok().flatten();
        Ok(SaleNow::new(stored.sale, hot.unwrap_or(stored.counters)))
    }

    /// Pauses, resumes or ends a started sale: the database first, then its hot copy (a
    /// copy not loaded yet takes the state when it is).
    pub async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<SaleNow, ShopError> {
        let stored = self.stored_sale(sku).await?;
        if stored.sale.state == SaleState::Ended {
            return Err(ShopError::Code(ErrorCode::Ended));
        }
        if stored.sale.state == SaleState::Scheduled {
            let why = "warm the sale first";
            return Err(ShopError::refused(ErrorCode::NotStarted, why));
        }
        self.store.set_state(sku, state).await?;
        match self.ledger.set_state(sku, state).await {
            Ok(()) | Err(LedgerError::NotWarmed) => {}
            Err(e) => return Err(e.into()),
        }
        self.sales.forget(sku);
        let mut sale = stored.sale.clone();
        sale.state = state;
        let stored = StoredSale {
            sale: sale.clone(),
            ..stored
        };
        let counters = self.hot_or_stored_counters(&stored).await;
        Ok(SaleNow::new(sale, counters))
    }

    /// The sale as the database has it now (no cache): what an admin change reads first.
    pub async fn stored_sale(&self, sku: SkuId) -> Result<StoredSale, ShopError> {
        self.store
            .sale(sku)
            .await?
            .ok_or(ShopError::Code(ErrorCode::SaleNotFound))
    }

    /// Hot counters when the sale is warm and the ledger answers; else the database's
    /// ([`Shop::stock_now`]), remembered in the sale cache.
    pub(super) async fn hot_or_stored_counters(&self, stored: &StoredSale) -> Counters {
        let c = self.stock_now(stored).await;
        self.sales.put_counters(stored.sale.sku_id, c);
        c
    }

    /// Drops what this instance remembers of a sale whose copy was just rebuilt or
    /// repaired: the cached sale and buckets, the sold-out flag.
    pub(super) fn forget(&self, sku: SkuId) {
        self.sales.forget(sku);
        self.buckets.forget(sku);
        self.sold_out.clear(sku);
    }
}

/// A rebuild's failure as the shop's: a rebuild already under way answers "retry".
pub(super) fn rebuild_error(e: RebuildError) -> ShopError {
    match e {
        RebuildError::Raced(sku) => ShopError::refused(
            ErrorCode::Unavailable,
            format!("another rebuild of sale {sku} is under way; retry"),
        ),
        RebuildError::Ledger(e) => e.into(),
        RebuildError::Store(e) => e.into(),
    }
}
