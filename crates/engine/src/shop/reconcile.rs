//! The reconciler as use cases: a fresh report (no repairs) and a repair of one sale.

use flashsale_core::{ErrorCode, LedgerError, SkuId, StoreError};

use super::{Shop, ShopError};
use crate::reconcile::{RebuildError, SaleReport, Trigger};

impl Shop {
    /// A fresh reconciler run without repairs, of every sale or one.
    pub async fn reconcile(&self, sku: Option<SkuId>) -> Result<Vec<SaleReport>, ShopError> {
        self.reconciler()
            .run(sku, false, Trigger::Admin)
            .await
            .map_err(run_error)
    }

    /// A reconciler run with repairs (replay, rebuild, expire) of one sale; what this
    /// instance remembers of the sale is dropped after it.
    pub async fn repair(&self, sku: SkuId) -> Result<SaleReport, ShopError> {
        if self.store.sale(sku).await?.is_none() {
            return Err(ShopError::Code(ErrorCode::SaleNotFound));
        }
        let report = self
            .reconciler()
            .run_sale(sku, true, Trigger::Admin)
            .await
            .map_err(run_error)?;
        self.forget(sku);
        Ok(report)
    }
}

/// A run's failure as the shop's: a rebuild under way answers "retry", a backend's error is
/// its own, anything else is unavailable.
fn run_error(e: anyhow::Error) -> ShopError {
    if let Some(RebuildError::Raced(sku)) = e.downcast_ref::<RebuildError>() {
        return super::sales::rebuild_error(RebuildError::Raced(*sku));
    }
    match e.downcast::<LedgerError>() {
        Ok(l) => l.into(),
        Err(e) => match e.downcast::<StoreError>() {
            Ok(s) => s.into(),
            Err(e) => ShopError::refused(ErrorCode::Unavailable, e.to_string()),
        },
    }
}
