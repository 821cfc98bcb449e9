//! Where a sale's buckets live, and what a ledger keeps of bucketed sales (docs/DESIGN.md,
//! "Stock buckets"): each bucket is a hot copy of its own, with its own hash tag (placed on
//! its own primary), epoch, stream and scripts; a sale of one bucket is its own copy.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use flashsale_core::buckets;
use flashsale_core::{LedgerError, OrderNo, SkuId, UserId};

use crate::keys::CopyTag;

/// Most sales whose layout one ledger keeps; past it the table starts over (a layout is
/// read again with one round trip).
pub const LAYOUTS_MAX: usize = 100_000;

/// Where a sale's buckets live: one salt per bucket, bucket 0's always 0. `None`: a sale of
/// one bucket (its own copy, today's keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub(super) sku: SkuId,
    salts: Option<Arc<[u32]>>,
}

impl Layout {
    pub fn single(sku: SkuId) -> Layout {
        Layout { sku, salts: None }
    }

    pub fn many(sku: SkuId, salts: Vec<u32>) -> Layout {
        Layout {
            sku,
            salts: (salts.len() > 1).then(|| salts.into()),
        }
    }

    /// The bucket count stored with a copy (`buckets`, `salts`), `None` when malformed.
    pub(crate) fn parse(sku: SkuId, buckets: &str, salts: &str) -> Option<Layout> {
        let n: u16 = buckets.parse().ok()?;
        let salts: Vec<u32> = salts
            .split(',')
            .map(|s| s.parse().ok())
            .collect::<Option<_>>()?;
        (buckets::valid_count(n) && salts.len() == usize::from(n) && salts[0] == 0)
            .then(|| Layout::many(sku, salts))
    }

    pub fn n(&self) -> u16 {
        self.salts.as_ref().map_or(1, |s| s.len() as u16)
    }

    pub fn is_single(&self) -> bool {
        self.salts.is_none()
    }

    pub fn copy(&self, bucket: u16) -> CopyTag {
        let salt = self.salts.as_ref().map_or(0, |s| s[usize::from(bucket)]);
        CopyTag::new(self.sku, bucket, salt)
    }

    /// Bucket `bucket`'s copy of a sale of several buckets; `None` for a sale of one, or
    /// past its last bucket.
    pub fn bucket(&self, bucket: u16) -> Option<CopyTag> {
        (!self.is_single() && bucket < self.n()).then(|| self.copy(bucket))
    }

    /// Every bucket's copy, bucket 0 first.
    pub fn copies(&self) -> Vec<CopyTag> {
        (0..self.n()).map(|b| self.copy(b)).collect()
    }

    /// The bucket where `user` buys.
    pub fn home(&self, user: UserId) -> CopyTag {
        self.copy(buckets::home_bucket(user, self.n()))
    }

    /// The bucket that sold `order_no`: its epoch names it.
    pub fn copy_of_order(&self, order_no: &OrderNo) -> CopyTag {
        self.copy(buckets::bucket_of_epoch(order_no.epoch(), self.n()))
    }

    /// The epoch of `bucket`'s copy when the sale's copy is loaded as `sale_epoch`:
    /// `sale_epoch · n + bucket`, so a bucket's epochs are `≡ bucket (mod n)` (no two buckets
    /// share one: order numbers stay unique, I8) and grow with the sale's. With one bucket
    /// it is the sale's epoch.
    pub fn epoch_of(&self, bucket: u16, sale_epoch: u64) -> u64 {
        sale_epoch * u64::from(self.n()) + u64::from(bucket)
    }

    /// Refuses what only a sale of one bucket supports yet.
    pub fn single_only(&self, what: &str) -> Result<(), LedgerError> {
        match self.is_single() {
            true => Ok(()),
            false => Err(LedgerError::Internal(format!(
                "{what} of sale {} ({} buckets): per-bucket copies are read by bucket",
                self.sku,
                self.n()
            ))),
        }
    }

    pub(crate) fn salts_text(&self) -> String {
        let salts = self.salts.as_deref().unwrap_or(&[0]);
        salts
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What a ledger keeps of bucketed sales: their layouts, and one mover lock per home bucket
/// (the batches of one home wait for one another's transfers instead of each moving stock).
#[derive(Default)]
pub(crate) struct BucketTable {
    layouts: RwLock<HashMap<SkuId, Layout>>,
    movers: Mutex<HashMap<CopyTag, Arc<tokio::sync::Mutex<()>>>>,
    pub(super) transfers: AtomicU64,
    pub(super) false_sold_outs: AtomicU64,
}

impl BucketTable {
    pub(super) fn mover(&self, home: CopyTag) -> Arc<tokio::sync::Mutex<()>> {
        let mut movers = self.movers.lock().expect("movers lock");
        if movers.len() >= LAYOUTS_MAX {
            movers.clear();
        }
        movers.entry(home).or_default().clone()
    }

    /// The layout of `sku` if it was read before (no round trip).
    pub(crate) fn known(&self, sku: SkuId) -> Option<Layout> {
        self.layouts
            .read()
            .expect("layouts lock")
            .get(&sku)
            .cloned()
    }

    pub(crate) fn keep(&self, layout: &Layout) {
        let mut layouts = self.layouts.write().expect("layouts lock");
        if layouts.len() >= LAYOUTS_MAX {
            layouts.clear();
        }
        layouts.insert(layout.sku, layout.clone());
    }
}

/// One number for a sale's bucket epochs, by bucket, that changes when any of them does (a
/// splitmix64 fold: equal for two lists only by a 2⁻⁶⁴ chance), so the sold-out flag reloads
/// its keys after any bucket's rebuild.
pub(crate) fn epochs_version(epochs: &[u64]) -> u64 {
    epochs
        .iter()
        .fold(0x9E37_79B9_7F4A_7C15, |acc: u64, &epoch| {
            let mut z = (acc ^ epoch).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_names_each_bucket_and_the_bucket_of_each_order() {
        let sku = SkuId(42);
        let one = Layout::single(sku);
        assert!(one.is_single());
        assert_eq!(one.copies(), vec![CopyTag::from(sku)]);
        assert_eq!(one.epoch_of(0, 7), 7);
        let three = Layout::parse(sku, "3", "0,5,9").expect("a layout");
        assert_eq!(three.n(), 3);
        assert_eq!(three.copy(2).to_string(), "42.2.9");
        assert_eq!(three.copy(0).to_string(), "42");
        for bucket in 0..3 {
            let epoch = three.epoch_of(bucket, 1);
            assert_eq!(
                three.copy_of_order(&OrderNo::new(sku, epoch, 1)).bucket,
                bucket
            );
        }
        assert_eq!(three.salts_text(), "0,5,9");
        assert_eq!(Layout::parse(sku, "3", "0,5"), None, "a salt short");
        assert_eq!(
            Layout::parse(sku, "3", "1,5,9"),
            None,
            "bucket 0 is unsalted"
        );
        assert_eq!(Layout::parse(sku, "65", "0"), None);
    }

    #[test]
    fn the_epochs_version_moves_with_any_bucket() {
        let base = epochs_version(&[3, 4, 5]);
        assert_eq!(base, epochs_version(&[3, 4, 5]));
        // A rebuild of bucket 1 (its epoch + n) and another moved down: the sum stays.
        assert_ne!(base, epochs_version(&[3, 7, 2]));
        assert_ne!(base, epochs_version(&[3, 4, 8]));
        assert_ne!(base, epochs_version(&[4, 3, 5]), "by bucket");
    }
}
