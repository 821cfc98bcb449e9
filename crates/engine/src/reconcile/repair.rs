//! A run's repairs, each idempotent: replay the stream's events the database lacks, rebuild
//! the hot copy, expire overdue holds.

use flashsale_core::{LedgerError, SaleMode, SaleState, SkuId, StoreError};

use super::rebuild::{self, rebuild};
use super::report::{Repair, SaleReport, Trigger};
use super::Reconciler;

/// Holds one expiry call of a repair expires at most, and calls per repair.
const EXPIRE_PER_CALL: usize = 1_024;
const EXPIRE_CALLS_MAX: usize = 64;

impl Reconciler {
    /// Idempotent repairs; returns what was done, one line each.
    pub(super) async fn repair(
        &self,
        sku: SkuId,
        report: &SaleReport,
    ) -> anyhow::Result<Vec<(Repair, String)>> {
        let mut done = Vec::new();
        // 1. Events still in the stream the database lacks (a stuck or dead persister). The
        // worker leaves fresh ones to the persister; on demand, everything is replayed.
        let replay = report.trigger != Trigger::Worker.as_str() || report.stale_pending > 0;
        // A bucketed sale's streams are each their own persister's: no replay from here.
        let stored = self.store.sale(sku).await?;
        let bucketed = stored.is_some_and(|s| self.ledger.kept_in_buckets(&s.sale));
        if replay && !report.hot_behind && !bucketed {
            if let Some(line) = self.replay(sku).await? {
                done.push((Repair::Replay, line));
            }
        }
        // 2. Rebuild the hot copy when it is gone, behind, or fenced by a stalled rebuild; of
        // a sale kept in buckets, each such bucket by itself.
        // A bucket whose transfer lost a side is rebuilt too: its rebuild stores the other
        // side of its transfers (`rebuild::rebuild_bucket`), so the unit is counted once.
        let mut rebuilt_buckets = report.buckets_behind.clone();
        for &bucket in &report.buckets_unbalanced {
            if !rebuilt_buckets.contains(&bucket) {
                rebuilt_buckets.push(bucket);
            }
        }
        for bucket in rebuilt_buckets {
            let (ledger, store) = (self.ledger.as_ref(), self.store.as_ref());
            let rebuilt = rebuild::rebuild_bucket(ledger, store, sku, bucket).await?;
            done.push((Repair::Rebuild, format!("bucket {bucket}: {rebuilt}")));
        }
        if report.hot_behind {
            let rebuilt = rebuild(self.ledger.as_ref(), self.store.as_ref(), sku).await?;
            done.push((Repair::Rebuild, rebuilt.to_string()));
        }
        // 3. Overdue holds.
        if let Some(line) = self.expire_overdue(sku).await? {
            done.push((Repair::Expire, line));
        }
        Ok(done)
    }

    pub(super) async fn replay(&self, sku: SkuId) -> anyhow::Result<Option<String>> {
        let Some(snap) = self.ledger.hot_snapshot(sku).await? else {
            return Ok(None);
        };
        let stored = self
            .store
            .sale(sku)
            .await?
            .ok_or(StoreError::SaleNotFound)?;
        let a = stored.counters.seq;
        let missing = rebuild::contiguous_above(&snap.events, stored.epoch, a);
        if missing.is_empty() {
            return Ok(None);
        }
        match self.store.apply_events(sku, &missing).await {
            Ok(r) if r.applied > 0 => Ok(Some(format!(
                "applied {} events ({} already there) from seq {}",
                r.applied,
                r.duplicates,
                a + 1
            ))),
            Ok(_) => Ok(None),
            Err(StoreError::Gap { .. }) => Ok(None), // the persister moved on meanwhile
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn expire_overdue(&self, sku: SkuId) -> anyhow::Result<Option<String>> {
        let stored = self
            .store
            .sale(sku)
            .await?
            .ok_or(StoreError::SaleNotFound)?;
        if stored.sale.mode != SaleMode::Reserve || stored.sale.state == SaleState::Scheduled {
            return Ok(None);
        }
        let mut expired = 0;
        for _ in 0..EXPIRE_CALLS_MAX {
            let n = match self.ledger.expire_due(sku, EXPIRE_PER_CALL).await {
                Ok(n) => n,
                // A copy being rebuilt: its replacement expires them.
                Err(LedgerError::NotWarmed) => 0,
                Err(e) => return Err(e.into()),
            };
            expired += n;
            if n < EXPIRE_PER_CALL {
                break;
            }
        }
        Ok((expired > 0).then(|| format!("{expired} overdue holds expired")))
    }
}
