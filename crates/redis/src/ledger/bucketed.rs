//! What a purchase on a sale of several buckets asks of its buckets (docs/DESIGN.md, "Stock
//! buckets"), below the purchase itself (`purchase`): whether the sale may still serve a
//! request its home answered SOLD_OUT, the buyers already at their limit, stock brought home
//! (`transfers`), and the SOLD_OUT answers given while the buckets held stock. Also what the
//! buckets hold ([`BucketsView`]) and what this ledger's transfers did ([`BucketStats`]).

use std::sync::atomic::Ordering;

use flashsale_core::buckets;
use flashsale_core::metric_names as names;
use flashsale_core::{Counters, ErrorCode, LedgerError, PurchaseOutcome, PurchaseRequest, SkuId};

use super::layout::Layout;
use super::setup::RedisLedger;
use crate::conn::{bounded, Timeouts};
use crate::keys::CopyTag;

/// What this ledger's transfers did since it was made (also exported as metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketStats {
    /// Transfers this ledger took in at their destination.
    pub transfers: u64,
    /// SOLD_OUT answers given while the sale's buckets together held the quantity.
    pub false_sold_outs: u64,
}

/// One bucket as [`RedisLedger::bucket_view`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketState {
    pub bucket: u16,
    /// The hash tag of its keys.
    pub tag: String,
    pub counters: Counters,
}

/// A bucketed sale's buckets, and the units that left one and are not yet in another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketsView {
    pub buckets: Vec<BucketState>,
    pub in_flight_units: u64,
}

impl BucketsView {
    /// The sale's units: every bucket's total and the units in flight (I2 over buckets).
    pub fn total_units(&self) -> u64 {
        self.buckets.iter().map(|b| b.counters.total).sum::<u64>() + self.in_flight_units
    }
}

impl RedisLedger {
    /// Answers LIMIT_EXCEEDED, without moving stock, to the requests answered SOLD_OUT whose
    /// buyer already holds the limit (one read of the home's limit and buyers): with the
    /// sale's stock in one copy they would have passed the stock check and failed this one,
    /// and stock moved for them would only churn between buckets.
    pub(super) async fn judge_limits(
        &self,
        home: CopyTag,
        reqs: &[PurchaseRequest],
        out: &mut [PurchaseOutcome],
    ) -> Result<(), LedgerError> {
        let short: Vec<usize> = sold_out(out).collect();
        let mut pipe = redis::pipe();
        pipe.cmd("HGET").arg(self.keys().sale(home)).arg("limit");
        // Layout 1 keeps a buyer's units in the buyers hash, layout 2 in its record: a copy
        // holds one of the two, so a buyer's units are their sum.
        for key in [self.keys().buyers(home), self.keys().records(home)] {
            pipe.cmd("HMGET").arg(key);
            for &i in &short {
                pipe.arg(reqs[i].user_id.0);
            }
        }
        let mut conn = self.conn(home.sku);
        let (limit, held, records): (Option<u64>, Vec<Option<u64>>, Vec<Option<String>>) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        let limit = limit.unwrap_or(u64::MAX);
        for ((&i, held), record) in short.iter().zip(held).zip(records) {
            let in_record = match record {
                Some(r) => crate::codec::record_held(&r).map_err(LedgerError::Internal)?,
                None => 0,
            };
            if held.unwrap_or(0) + in_record + u64::from(reqs[i].quantity) > limit {
                out[i] = PurchaseOutcome::Rejected(ErrorCode::LimitExceeded);
            }
        }
        Ok(())
    }

    /// Whether the sale may still serve a request `out` answered SOLD_OUT: its buckets hold
    /// the smallest such quantity, or do once the transfers left in flight (a carrier that
    /// died, a destination fenced for a moment) are finished. Read before any lock, so a
    /// sale sold out answers at the cost of one read per bucket (the service's local
    /// sold-out flag answers before the ledger is asked at all).
    pub(super) async fn may_serve(
        &self,
        layout: &Layout,
        reqs: &[PurchaseRequest],
        out: &[PurchaseOutcome],
    ) -> Result<bool, LedgerError> {
        let least_units = sold_out(out)
            .map(|i| u64::from(reqs[i].quantity))
            .min()
            .unwrap_or(u64::MAX);
        let all_units: u64 = self.availables(layout).await?.iter().sum();
        if all_units >= least_units {
            return Ok(true);
        }
        if self.finish_transfers(layout.sku).await? == 0 {
            return Ok(false);
        }
        let all_units: u64 = self.availables(layout).await?.iter().sum();
        Ok(all_units >= least_units)
    }

    /// Moves to `home` the units `short` asks for, or what the other buckets hold when that
    /// is less. False when the whole sale cannot serve the smallest of them (a true sold
    /// out: nothing to judge again).
    pub(super) async fn bring_home(
        &self,
        layout: &Layout,
        home: CopyTag,
        short: &[PurchaseRequest],
    ) -> Result<bool, LedgerError> {
        let available = self.availables(layout).await?;
        let all_units: u64 = available.iter().sum();
        let least_units = short
            .iter()
            .map(|r| u64::from(r.quantity))
            .min()
            .unwrap_or(0);
        if all_units < least_units.max(1) {
            return Ok(false);
        }
        if available[usize::from(home.bucket)] >= least_units {
            // Another caller brought stock home meanwhile: judge again first.
            return Ok(true);
        }
        let want_units: u64 = short.iter().map(|r| u64::from(r.quantity)).sum();
        let home_units = self.move_home(layout, home, available, want_units).await;
        // Nothing came (every source fenced, lost or emptied meanwhile): judging again
        // would only repeat the answer.
        Ok(home_units >= least_units)
    }

    /// Carries out transfer plans until home holds `want_units` or what the others hold. A
    /// source that gives less than planned (fenced, its primary lost, emptied by another
    /// caller) counts as empty for the rest of the call and the plan is made again without
    /// it, so one lost bucket never keeps the others' stock from the buyers. At most `n`
    /// plans (each drops at least one source). Returns the units home holds then, as far
    /// as this call knows.
    async fn move_home(
        &self,
        layout: &Layout,
        home: CopyTag,
        mut available: Vec<u64>,
        want_units: u64,
    ) -> u64 {
        let at_home = usize::from(home.bucket);
        for _ in 0..layout.n() {
            let all_units: u64 = available.iter().sum();
            // A batch's worth more than asked, so the next buyers here need no transfer;
            // small as stock runs low, so the last units gather where the buyers are.
            let refill_units = (all_units / (2 * u64::from(layout.n()))).max(1);
            let want = want_units.min(all_units);
            let plan = buckets::plan_transfers(&available, home.bucket, want, refill_units, 0);
            if plan.is_empty() {
                break;
            }
            let mut complete = true;
            for t in plan {
                let moved_units = match self.transfer(layout, t).await {
                    Ok(units) => units,
                    Err(e) => {
                        tracing::warn!(sku = %layout.sku, from = t.from, error = %e, "transfer failed");
                        0
                    }
                };
                available[at_home] += moved_units;
                available[usize::from(t.from)] -= moved_units.min(available[usize::from(t.from)]);
                if moved_units < t.units {
                    available[usize::from(t.from)] = 0;
                    complete = false;
                }
            }
            if complete {
                break;
            }
        }
        available[at_home]
    }

    /// Each bucket's available units, bucket 0 first (0 for a bucket not warm, fenced, or
    /// whose primary does not answer now: it can be no source of stock).
    async fn availables(&self, layout: &Layout) -> Result<Vec<u64>, LedgerError> {
        let reads = layout.copies().into_iter().map(|copy| async move {
            let mut conn = self.conn(copy.sku);
            let cmd = redis::cmd("HMGET")
                .arg(self.keys().sale(copy))
                .arg(&["available", "fenced_at_ms"])
                .clone();
            let read = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await;
            let (available, fenced): (Option<u64>, Option<String>) =
                read.unwrap_or_else(|e: LedgerError| {
                    tracing::warn!(tag = %copy, error = %e, "bucket unreadable, counted empty");
                    (None, None)
                });
            match fenced {
                Some(_) => 0,
                None => available.unwrap_or(0),
            }
        });
        let available = futures::future::join_all(reads).await;
        for (bucket, &units) in available.iter().enumerate() {
            gauge_available(layout.sku, bucket as u16, units);
        }
        Ok(available)
    }

    /// What this ledger's transfers did so far.
    pub fn bucket_stats(&self) -> BucketStats {
        let Some(table) = &self.buckets else {
            return BucketStats::default();
        };
        BucketStats {
            transfers: table.transfers.load(Ordering::Relaxed),
            false_sold_outs: table.false_sold_outs.load(Ordering::Relaxed),
        }
    }

    /// A bucketed sale's buckets and its units in flight; `None` when it is not warm.
    pub async fn bucket_view(&self, sku: SkuId) -> Result<Option<BucketsView>, LedgerError> {
        let layout = self.layout(sku).await?;
        let mut buckets = Vec::new();
        for copy in layout.copies() {
            let Some(counters) = self.counters_copy(copy).await? else {
                return Ok(None);
            };
            gauge_available(sku, copy.bucket, counters.available);
            buckets.push(BucketState {
                bucket: copy.bucket,
                tag: copy.to_string(),
                counters,
            });
        }
        let mut in_flight_units = 0;
        for (_, id, to, units) in self.pending_transfers(&layout).await? {
            let mut conn = self.conn(sku);
            let cmd = redis::cmd("HEXISTS")
                .arg(self.keys().transfers_in(layout.copy(to)))
                .arg(&id)
                .clone();
            let arrived: bool = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
            in_flight_units += if arrived { 0 } else { units };
        }
        Ok(Some(BucketsView {
            buckets,
            in_flight_units,
        }))
    }

    /// Counts the SOLD_OUT answers given while the sale's buckets together held the
    /// quantity (read after the answer: an upper bound, since a cancel may also have brought
    /// units back meanwhile).
    pub(super) async fn count_false_sold_outs(
        &self,
        layout: &Layout,
        reqs: &[PurchaseRequest],
        out: &[PurchaseOutcome],
    ) -> Result<(), LedgerError> {
        let short: Vec<usize> = sold_out(out).collect();
        if short.is_empty() {
            return Ok(());
        }
        let all_units: u64 = self.availables(layout).await?.iter().sum();
        let false_ones = short
            .iter()
            .filter(|&&i| u64::from(reqs[i].quantity) <= all_units)
            .count();
        if false_ones > 0 {
            if let Some(table) = &self.buckets {
                table
                    .false_sold_outs
                    .fetch_add(false_ones as u64, Ordering::Relaxed);
            }
            metrics::counter!(names::FALSE_SOLD_OUT).increment(false_ones as u64);
            tracing::warn!(sku = %layout.sku, false_ones, all_units, "SOLD_OUT while buckets held stock");
        }
        Ok(())
    }
}

fn gauge_available(sku: SkuId, bucket: u16, units: u64) {
    metrics::gauge!(names::BUCKET_AVAILABLE, "sku" => sku.to_string(), "bucket" => bucket.to_string())
        .set(units as f64);
}

/// The indices of the answers that are SOLD_OUT.
pub(super) fn sold_out(out: &[PurchaseOutcome]) -> impl Iterator<Item = usize> + '_ {
    out.iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, PurchaseOutcome::Rejected(ErrorCode::SoldOut)))
        .map(|(i, _)| i)
}
