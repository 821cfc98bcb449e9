//! Sales of several buckets on Redis (docs/DESIGN.md, "Stock buckets"): each bucket is a hot
//! copy of its own, with its own hash tag (placed on its own primary), epoch, stream and
//! scripts; the sale's stock is split over them and moves between them by transfers.
//!
//! - [`Layout`]: where a sale's buckets live (one salt per bucket), read once from bucket 0's
//!   hash and kept by the ledger ([`BucketTable`]); a sale of one bucket is its own copy.
//! - Purchases go to the buyer's home bucket (`buckets::home_bucket`), so the per-user limit
//!   and replays are decided by one script. Requests the home answers SOLD_OUT while the
//!   other buckets hold stock bring it home (`transfer_out.lua` at the source, then
//!   `transfer_in.lua` at home) and are judged again, for at most [`ROUNDS_MAX`] rounds.
//! - A transfer whose in side did not happen (a crash, a fenced destination, a write the
//!   replicas did not confirm) stays pending at its source; [`RedisLedger::finish_transfers`]
//!   finishes it: the purchase that finds the sale short calls it first, and so does the
//!   expiry worker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use flashsale_core::buckets::{self, Transfer};
use flashsale_core::metric_names as names;
use flashsale_core::{
    Counters, ErrorCode, LedgerError, OrderNo, PurchaseOutcome, PurchaseRequest, Sale, SkuId,
    UserId,
};
use redis::Value;

use crate::codec::as_string;
use crate::conn::{bounded, Timeouts};
use crate::keys::{slot, CopyTag};
use crate::ledger::{evalsha, RedisLedger};
use crate::placement;

/// Most sales whose layout one ledger keeps; past it the table starts over (a layout is
/// read again with one round trip).
pub const LAYOUTS_MAX: usize = 100_000;

/// Most rounds of "bring stock home, judge again" for one batch at one home bucket. Each
/// round moves the whole shortfall the others can cover, so a second round is needed only
/// when another caller took the units meanwhile.
pub const ROUNDS_MAX: usize = 4;

/// Where a sale's buckets live: one salt per bucket, bucket 0's always 0. `None`: a sale of
/// one bucket (its own copy, today's keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    sku: SkuId,
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
    transfers: AtomicU64,
    false_sold_outs: AtomicU64,
}

/// What this ledger's transfers did since it was made (also exported as metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketStats {
    /// Transfers this ledger took in at their destination.
    pub transfers: u64,
    /// SOLD_OUT answers given while the sale's buckets together held the quantity.
    pub false_sold_outs: u64,
}

impl BucketTable {
    fn mover(&self, home: CopyTag) -> Arc<tokio::sync::Mutex<()>> {
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

/// A transfer out that is pending at its source: (source, id, destination, units).
type Pending = (CopyTag, String, u16, u64);

/// What an in did at its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// Taken in now.
    New,
    /// Taken in before (its pending record waits for the database to store it).
    Before,
    /// Taken in and stored in the database before (the copy was loaded with it): its
    /// pending record is dropped.
    Stored,
    /// Not now: the destination is fenced or its write is not confirmed.
    NotNow,
}

impl RedisLedger {
    /// Where `sku`'s buckets live. Without [`RedisLedger::with_buckets`] every sale is of one
    /// bucket, with no round trip. Otherwise read once from bucket 0's hash (and kept): a
    /// sale not warm yet is taken as one bucket and asked again next time.
    pub async fn layout(&self, sku: SkuId) -> Result<Layout, LedgerError> {
        let Some(table) = &self.buckets else {
            return Ok(Layout::single(sku));
        };
        if let Some(layout) = table.layouts.read().expect("layouts lock").get(&sku) {
            return Ok(layout.clone());
        }
        let cmd = redis::cmd("HMGET")
            .arg(self.keys().sale(sku))
            .arg(&["epoch", "buckets", "salts"])
            .clone();
        let mut conn = self.conn.clone();
        let got: Vec<Option<String>> =
            bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        let layout = match &got[..] {
            [None, ..] => return Ok(Layout::single(sku)),
            [Some(_), Some(n), Some(salts)] => Layout::parse(sku, n, salts).ok_or_else(|| {
                LedgerError::Internal(format!("sale {sku}: bad buckets {n:?} {salts:?}"))
            })?,
            _ => Layout::single(sku),
        };
        table.keep(&layout);
        Ok(layout)
    }

    /// Loads a fresh sale of several buckets: its stock split evenly
    /// (`buckets::split_stock`), each bucket on the primary `placement::place` picks, bucket 0
    /// last (its hash names the others). A sale that has sold is rebuilt bucket by bucket
    /// from its per-bucket rows in the database, which are not kept yet: refused.
    pub(crate) async fn load_bucketed(
        &self,
        sale: &Sale,
        counters: &Counters,
        epoch: u64,
    ) -> Result<(), LedgerError> {
        let sku = sale.sku_id;
        if *counters != sale.fresh_counters() {
            return Err(LedgerError::Internal(format!(
                "sale {sku} of {} buckets has sold: a bucketed copy is loaded fresh only",
                sale.buckets
            )));
        }
        let salts = match self.layout(sku).await? {
            known if known.n() == sale.buckets => {
                (0..sale.buckets).map(|b| known.copy(b).salt).collect()
            }
            _ => self.place(sku, sale.buckets).await?,
        };
        let layout = Layout::many(sku, salts);
        let text = layout.salts_text();
        let shares = buckets::split_stock(sale.total_stock, sale.buckets);
        for bucket in (0..sale.buckets).rev() {
            let units = shares[usize::from(bucket)];
            let share = Counters {
                total: units,
                available: units,
                ..Counters::default()
            };
            let epoch = layout.epoch_of(bucket, epoch);
            let at = Some((sale.buckets, text.as_str()));
            self.load_copy(layout.copy(bucket), sale, &share, epoch, at)
                .await?;
        }
        if let Some(table) = &self.buckets {
            table.keep(&layout);
        }
        Ok(())
    }

    /// A salt per bucket putting `n` buckets of `sku` on distinct primaries (one Redis: all
    /// on it).
    pub(crate) async fn place(&self, sku: SkuId, n: u16) -> Result<Vec<u32>, LedgerError> {
        let slots = self.primary_slots().await?;
        let primaries = slots.iter().map(|s| s.2).max().map_or(1, |m| m + 1);
        let primary_of = |tag: &str| {
            let s = slot(&format!("{{{tag}}}"));
            slots
                .iter()
                .find(|&&(lo, hi, _)| lo <= s && s <= hi)
                .map_or(0, |r| r.2)
        };
        Ok(placement::place(sku, n, primaries, primary_of))
    }

    /// The cluster's slot ranges with the index of their primary (`CLUSTER SLOTS`); empty on
    /// one Redis.
    async fn primary_slots(&self) -> Result<Vec<(u16, u16, usize)>, LedgerError> {
        if !self.is_cluster() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let reply: Value = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        parse_slots(&reply).ok_or_else(|| {
            LedgerError::Internal(format!("unexpected CLUSTER SLOTS reply {reply:?}"))
        })
    }

    /// Judges a batch of a bucketed sale: each buyer at home, all homes at once, answers in
    /// the batch's order. When a home fails, what the other homes accepted is still named
    /// ([`promised`]): the loss journal must hear of every purchase a call wrote.
    pub(crate) async fn purchase_bucketed(
        &self,
        layout: &Layout,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        let mut by_home: Vec<Vec<usize>> = vec![Vec::new(); usize::from(layout.n())];
        for (i, r) in reqs.iter().enumerate() {
            by_home[usize::from(buckets::home_bucket(r.user_id, layout.n()))].push(i);
        }
        let homes = by_home
            .iter()
            .enumerate()
            .filter(|(_, idx)| !idx.is_empty());
        let calls = homes.map(|(bucket, idx)| {
            let group: Vec<PurchaseRequest> = idx.iter().map(|&i| reqs[i].clone()).collect();
            async move {
                let home = layout.copy(bucket as u16);
                (idx, self.purchase_home(layout, home, group).await)
            }
        });
        let mut out: Vec<Option<PurchaseOutcome>> = vec![None; reqs.len()];
        let mut failed = None;
        for (idx, answers) in futures::future::join_all(calls).await {
            match answers {
                Ok(answers) => {
                    for (&i, answer) in idx.iter().zip(answers) {
                        out[i] = Some(answer);
                    }
                }
                // The first failure is the batch's answer; a later one's writes still count.
                Err(e) => {
                    failed = Some(match failed {
                        None => e,
                        Some(first) => promised(first, &written_by(e)),
                    })
                }
            }
        }
        if let Some(e) = failed {
            let answered: Vec<PurchaseOutcome> = out.into_iter().flatten().collect();
            return Err(promised(e, &accepted_orders(&answered)));
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every request answered"))
            .collect())
    }

    /// One home's requests: judged there; those answered SOLD_OUT while the sale holds stock
    /// elsewhere are judged again once it is brought home. A failure after the first round
    /// still names what the earlier rounds accepted.
    async fn purchase_home(
        &self,
        layout: &Layout,
        home: CopyTag,
        reqs: Vec<PurchaseRequest>,
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        let mut out = self.purchase_copy(home, &reqs).await?;
        match self.serve_short(layout, home, &reqs, &mut out).await {
            Ok(()) => Ok(out),
            Err(e) => Err(promised(e, &accepted_orders(&out))),
        }
    }

    /// The rounds after the first at one home: bring stock home for the requests answered
    /// SOLD_OUT and judge them again, updating `out` as answers come.
    async fn serve_short(
        &self,
        layout: &Layout,
        home: CopyTag,
        reqs: &[PurchaseRequest],
        out: &mut [PurchaseOutcome],
    ) -> Result<(), LedgerError> {
        if sold_out(out).next().is_none() || !self.may_serve(layout, reqs, out).await? {
            return Ok(());
        }
        let mover = self.buckets.as_ref().map(|t| t.mover(home));
        let _turn = match &mover {
            Some(m) => Some(m.lock().await),
            None => None,
        };
        self.judge_limits(home, reqs, out).await?;
        for _ in 0..ROUNDS_MAX {
            let short: Vec<usize> = sold_out(out).collect();
            if short.is_empty() {
                break;
            }
            let again: Vec<PurchaseRequest> = short.iter().map(|&i| reqs[i].clone()).collect();
            if !self.bring_home(layout, home, &again).await? {
                // The sale holds less than any of them: a true sold out, nothing to count.
                return Ok(());
            }
            for (&i, answer) in short.iter().zip(self.purchase_copy(home, &again).await?) {
                out[i] = answer;
            }
        }
        // A metric only: a failed read must not fail purchases already decided.
        if let Err(e) = self.count_false_sold_outs(layout, reqs, out).await {
            tracing::warn!(sku = %layout.sku, error = %e, "could not count false sold-outs");
        }
        Ok(())
    }

    /// Answers LIMIT_EXCEEDED, without moving stock, to the requests answered SOLD_OUT whose
    /// buyer already holds the limit (one read of the home's limit and buyers): with the
    /// sale's stock in one copy they would have passed the stock check and failed this one,
    /// and stock moved for them would only churn between buckets.
    async fn judge_limits(
        &self,
        home: CopyTag,
        reqs: &[PurchaseRequest],
        out: &mut [PurchaseOutcome],
    ) -> Result<(), LedgerError> {
        let short: Vec<usize> = sold_out(out).collect();
        let mut pipe = redis::pipe();
        pipe.cmd("HGET").arg(self.keys().sale(home)).arg("limit");
        pipe.cmd("HMGET").arg(self.keys().buyers(home));
        for &i in &short {
            pipe.arg(reqs[i].user_id.0);
        }
        let mut conn = self.conn.clone();
        let (limit, held): (Option<u64>, Vec<Option<u64>>) =
            bounded(Timeouts::HOT.call, pipe.query_async(&mut conn)).await?;
        let limit = limit.unwrap_or(u64::MAX);
        for (&i, held) in short.iter().zip(held) {
            if held.unwrap_or(0) + u64::from(reqs[i].quantity) > limit {
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
    async fn may_serve(
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
    async fn bring_home(
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
            let mut conn = self.conn.clone();
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

    /// One transfer: out at its source, then (once the out is confirmed) in at its
    /// destination, then the pending record dropped. Units moved, 0 when the source no
    /// longer had them. Left pending (for [`RedisLedger::finish_transfers`]) when the in
    /// could not be done now.
    async fn transfer(&self, layout: &Layout, t: Transfer) -> Result<u64, LedgerError> {
        let src = layout.copy(t.from);
        let keys = [
            self.keys().sale(src),
            self.keys().events(src),
            self.keys().transfers_out(src),
        ];
        let mut cmd = evalsha(&self.scripts.transfer_out, &keys);
        cmd.arg(t.to).arg(t.units);
        let (reply, acked) = self
            .run_write("transfer_out", src, crate::scripts::TRANSFER_OUT, &cmd)
            .await?;
        let reply: Vec<String> = redis::from_redis_value(&reply).map_err(crate::conn::map_err)?;
        let id = match &reply[..] {
            [ok, id] if ok == "OK" => id.clone(),
            [x, _] if x == "X" => return Ok(0),
            _ => {
                return Err(LedgerError::Internal(format!(
                    "transfer_out answered {reply:?}"
                )))
            }
        };
        metrics::counter!(names::BUCKET_TRANSFERS, "side" => "out").increment(1);
        // Unconfirmed, the out may be undone by a failover: an in now could create units.
        if self.confirmed_write(acked).is_err() {
            return Ok(0);
        }
        let arrival = self.transfer_in(layout, (src, id, t.to, t.units)).await?;
        Ok(if arrival == Arrival::NotNow {
            0
        } else {
            t.units
        })
    }

    /// The in side of a pending transfer. Its pending record stays until the in is stored
    /// in the database (the destination's persister drops it then): a destination that
    /// loses the in before that is rebuilt without it, and the record carries the units
    /// there again. A destination loaded with the in from the database answers so, and the
    /// record is dropped here.
    async fn transfer_in(&self, layout: &Layout, pending: Pending) -> Result<Arrival, LedgerError> {
        let (src, id, to, units) = pending;
        let dst = layout.copy(to);
        let keys = [
            self.keys().sale(dst),
            self.keys().events(dst),
            self.keys().transfers_in(dst),
        ];
        let mut cmd = evalsha(&self.scripts.transfer_in, &keys);
        cmd.arg(&id).arg(src.bucket).arg(units);
        let (reply, acked) = self
            .run_write("transfer_in", dst, crate::scripts::TRANSFER_IN, &cmd)
            .await?;
        let reply = as_string(&reply).unwrap_or_default();
        let arrival = match reply.as_str() {
            "OK" => {
                if let Some(table) = &self.buckets {
                    table.transfers.fetch_add(1, Ordering::Relaxed);
                }
                metrics::counter!(names::BUCKET_TRANSFERS, "side" => "in").increment(1);
                metrics::counter!(names::BUCKET_TRANSFER_UNITS).increment(units);
                Arrival::New
            }
            "R" => Arrival::Before,
            "S" => Arrival::Stored,
            "UNAVAILABLE" => return Ok(Arrival::NotNow),
            _ => {
                return Err(LedgerError::Internal(format!(
                    "transfer_in answered {reply:?}"
                )))
            }
        };
        if self.confirmed_write(acked).is_err() {
            return Ok(Arrival::NotNow);
        }
        if arrival == Arrival::Stored {
            let mut conn = self.conn.clone();
            let cmd = redis::cmd("HDEL")
                .arg(self.keys().transfers_out(src))
                .arg(&id)
                .clone();
            let _: i64 = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        }
        Ok(arrival)
    }

    /// Finishes every transfer of `sku` whose out is done and whose in is not known done (a
    /// carrier that died midway, a destination that was fenced or lost the in before it was
    /// stored). Idempotent: an in applied before counts once. Returns how many it took in
    /// now.
    pub async fn finish_transfers(&self, sku: SkuId) -> Result<usize, LedgerError> {
        let layout = self.layout(sku).await?;
        let mut finished = 0;
        for pending in self.pending_transfers(&layout).await? {
            if self.out_confirmed(&pending).await? {
                let arrival = self.transfer_in(&layout, pending).await?;
                finished += usize::from(arrival == Arrival::New);
            }
        }
        Ok(finished)
    }

    /// Whether a pending out is still recorded at its source and, with replication, on its
    /// replicas (the record read and a `WAIT` in one pipeline): an out a failover could undo
    /// must not be taken in, or the in would create its units.
    async fn out_confirmed(&self, pending: &Pending) -> Result<bool, LedgerError> {
        let (src, id, _, _) = pending;
        let mut cmd = redis::cmd("HEXISTS");
        cmd.arg(self.keys().transfers_out(*src)).arg(id);
        let (reply, acked) = self.run_write("transfer_confirm", *src, "", &cmd).await?;
        let present: bool = redis::from_redis_value(&reply).map_err(crate::conn::map_err)?;
        Ok(present && self.confirmed_write(acked).is_ok())
    }

    /// Every transfer pending at the sale's buckets.
    async fn pending_transfers(&self, layout: &Layout) -> Result<Vec<Pending>, LedgerError> {
        let mut pending = Vec::new();
        if layout.is_single() {
            return Ok(pending);
        }
        for src in layout.copies() {
            let mut conn = self.conn.clone();
            let cmd = redis::cmd("HGETALL")
                .arg(self.keys().transfers_out(src))
                .clone();
            let outs: HashMap<String, String> =
                bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
            for (id, record) in outs {
                let parsed = record
                    .split_once(':')
                    .and_then(|(to, units)| Some((to.parse().ok()?, units.parse().ok()?)))
                    .filter(|&(to, _): &(u16, u64)| to < layout.n());
                let Some((to, units)) = parsed else {
                    return Err(LedgerError::Internal(format!(
                        "sale {}: bad pending transfer {id} {record:?}",
                        layout.sku
                    )));
                };
                pending.push((src, id, to, units));
            }
        }
        Ok(pending)
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
            let mut conn = self.conn.clone();
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
    async fn count_false_sold_outs(
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

/// The order numbers of the accepted answers (new or replayed: a replay may be the first
/// answer its buyer hears).
fn accepted_orders(out: &[PurchaseOutcome]) -> Vec<OrderNo> {
    out.iter()
        .filter_map(|o| match o {
            PurchaseOutcome::Accepted { order, .. } => Some(order.order_no),
            PurchaseOutcome::Rejected(_) => None,
        })
        .collect()
}

/// What a failed call wrote, as far as its error says.
fn written_by(e: LedgerError) -> Vec<OrderNo> {
    match e {
        LedgerError::Unconfirmed { written, .. } => written,
        _ => Vec::new(),
    }
}

/// A call that failed after `written` were accepted: [`LedgerError::Unconfirmed`] naming
/// them with what the error wrote itself (answered 503, so each buyer retries and hears the
/// replay, and the loss journal keeps them), or the error as it was when nothing was
/// written.
fn promised(e: LedgerError, written: &[OrderNo]) -> LedgerError {
    if written.is_empty() {
        return e;
    }
    match e {
        LedgerError::Unconfirmed {
            written: mut more,
            why,
        } => {
            more.extend_from_slice(written);
            LedgerError::Unconfirmed { written: more, why }
        }
        e => LedgerError::Unconfirmed {
            written: written.to_vec(),
            why: e.to_string(),
        },
    }
}

/// The indices of the answers that are SOLD_OUT.
fn sold_out(out: &[PurchaseOutcome]) -> impl Iterator<Item = usize> + '_ {
    out.iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, PurchaseOutcome::Rejected(ErrorCode::SoldOut)))
        .map(|(i, _)| i)
}

/// `CLUSTER SLOTS`: `[[start, end, [ip, port, id…], replicas…]…]` as (start, end, primary
/// index), primaries numbered in order of first appearance.
fn parse_slots(reply: &Value) -> Option<Vec<(u16, u16, usize)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut primaries: Vec<(String, i64)> = Vec::new();
    let mut out = Vec::new();
    for range in ranges {
        let Value::Array(f) = range else { return None };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(node))) =
            (f.first(), f.get(1), f.get(2))
        else {
            return None;
        };
        let (Some(host), Some(Value::Int(port))) = (node.first().and_then(as_string), node.get(1))
        else {
            return None;
        };
        let key = (host, *port);
        let index = match primaries.iter().position(|p| *p == key) {
            Some(i) => i,
            None => {
                primaries.push(key);
                primaries.len() - 1
            }
        };
        out.push((u16::try_from(*lo).ok()?, u16::try_from(*hi).ok()?, index));
    }
    Some(out)
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

    #[test]
    fn cluster_slots_name_each_primary_once() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
            ])
        };
        let range = |lo: i64, hi: i64, port: i64| {
            Value::Array(vec![
                Value::Int(lo),
                Value::Int(hi),
                node(port),
                node(port + 3),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16000, 7002),
            range(16001, 16383, 7000),
        ]);
        let slots = parse_slots(&reply).expect("parsed");
        assert_eq!(
            slots,
            vec![
                (0, 5460, 0),
                (5461, 10922, 1),
                (10923, 16000, 2),
                (16001, 16383, 0)
            ]
        );
        assert_eq!(parse_slots(&Value::Nil), None);
    }
}
