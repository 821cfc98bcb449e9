//! Each sale's public view as last answered, rendered: its JSON bytes and their `ETag`. A stock
//! read whose sale stands as it stood (the same definition, counters and buckets, all read
//! from the shop's caches) answers the same bytes without serialising or hashing again: in the
//! read-heavy minutes before a sale every buyer refreshes the same view.
//!
//! Bounded: at most [`SALES_MAX`] sales; past it the map is emptied (each view renders once
//! more) rather than kept in order.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use axum::body::Bytes;
use axum::http::HeaderValue;
use flashsale_core::SkuId;
use flashsale_engine::shop::SaleNow;

/// Sales whose last view is kept.
const SALES_MAX: usize = 4_096;

/// A view as answered: what it shows, its body and its tag.
pub struct Rendered {
    pub now: SaleNow,
    pub body: Bytes,
    pub etag: HeaderValue,
}

impl Rendered {
    /// Whether this rendering shows `now`.
    fn shows(&self, now: &SaleNow) -> bool {
        self.now.counters == now.counters
            && self.now.sale == now.sale
            && self.now.buckets == now.buckets
    }
}

/// The last view of each sale.
#[derive(Default)]
pub struct SaleViews {
    last: RwLock<HashMap<SkuId, Arc<Rendered>>>,
}

impl SaleViews {
    /// The rendering of `now`: the last one when it shows the same, else `render`'s, kept.
    pub fn get_or_render<E>(
        &self,
        now: SaleNow,
        render: impl FnOnce(&SaleNow) -> Result<(Bytes, HeaderValue), E>,
    ) -> Result<Arc<Rendered>, E> {
        let sku = now.sale.sku_id;
        let kept = self.last.read().expect("views lock").get(&sku).cloned();
        if let Some(r) = kept.filter(|r| r.shows(&now)) {
            return Ok(r);
        }
        let (body, etag) = render(&now)?;
        let r = Arc::new(Rendered { now, body, etag });
        let mut last = self.last.write().expect("views lock");
        if last.len() >= SALES_MAX && !last.contains_key(&sku) {
            last.clear();
        }
        last.insert(sku, r.clone());
        Ok(r)
    }

    /// Sales whose view is kept.
    pub fn len(&self) -> usize {
        self.last.read().expect("views lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use flashsale_core::{Counters, Sale};
    use flashsale_engine::shop::Buckets;

    use super::*;

    fn now(sold: u64) -> SaleNow {
        SaleNow {
            sale: Sale::always_open(SkuId(1), 10),
            counters: Counters {
                total: 10,
                available: 10 - sold,
                sold,
                ..Counters::default()
            },
            buckets: Buckets::None,
        }
    }

    fn render(n: &SaleNow) -> Result<(Bytes, HeaderValue), ()> {
        let tag = HeaderValue::try_from(n.counters.sold.to_string()).unwrap();
        Ok((Bytes::from(format!("sold {}", n.counters.sold)), tag))
    }

    /// The same sale renders once; a change of its counters renders again.
    #[test]
    fn a_view_renders_once_per_change() {
        let views = SaleViews::default();
        let first = views.get_or_render(now(0), render).unwrap();
        let again = views.get_or_render(now(0), |_| Err(())).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let changed = views.get_or_render(now(1), render).unwrap();
        assert_eq!(changed.body, "sold 1");
        assert_eq!(views.len(), 1);
    }
}
