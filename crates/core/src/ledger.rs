//! The traits that backends implement. A hot ledger is four capabilities, asked for by what
//! a caller needs: [`HotPurchases`] (the purchase: a batch judged atomically), [`HotLedger`]
//! (the rest of the hot path, and reads), [`HotCopies`] (loading and replacing a sale's hot
//! copy: the rebuild and the reconciler) and [`SoldOutSupport`] (the local sold-out flag);
//! [`Ledger`] is all four, what the service holds. [`OrderStore`] is the
//! system of record.

use std::ops::RangeInclusive;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, LedgerError, StoreError};
use crate::ids::{OrderNo, RequestId, RequestKey, SkuId, UserId};
use crate::order::{Event, HotOrder, OrderStatus, PurchaseOutcome, TransferEvent};
use crate::sale::{Counters, Sale, SaleState};

/// One purchase attempt, already validated by the service (the ledger checks again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurchaseRequest {
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub request_id: RequestId,
    pub quantity: u32,
}

impl PurchaseRequest {
    /// Its idempotency key within the sale.
    pub fn key(&self) -> RequestKey {
        RequestKey::new(self.user_id, self.request_id.clone())
    }
}

/// What every ledger checks of a batch before it runs it: at most
/// [`BATCH_LEN_MAX`](crate::limits::BATCH_LEN_MAX) requests, all for sale `sku`.
pub fn check_batch(sku: SkuId, reqs: &[PurchaseRequest]) -> Result<(), LedgerError> {
    let len_max = crate::limits::BATCH_LEN_MAX;
    if reqs.len() > len_max {
        let len = reqs.len();
        return Err(LedgerError::Internal(format!(
            "batch of {len} requests, at most {len_max}"
        )));
    }
    match reqs.iter().find(|r| r.sku_id != sku) {
        Some(other) => Err(LedgerError::Internal(format!(
            "request for sale {} in a batch of sale {sku}",
            other.sku_id
        ))),
        None => Ok(()),
    }
}

/// Whether a conditional change took place (`set_state_if`), or why it could not be tried.
pub type Changed = Result<bool, LedgerError>;

/// Result of pay or cancel: the order after the change, or why nothing changed.
pub type Resolution = Result<HotOrder, ErrorCode>;

/// When an accepted purchase is durable in the system of record, relative to its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Committed before the answer (the embedded ledger's group commit).
    BeforeAnswer,
    /// In the hot ledger's stream; the persister stores it after the answer (Redis).
    Streamed,
}

impl Durability {
    /// The status an answer shows for an order the hot ledger holds (one rule for every
    /// route): a streamed order not yet resolved is `PENDING` until the persister stores it.
    pub fn as_answered(self, status: OrderStatus) -> OrderStatus {
        match (self, status) {
            (Durability::Streamed, OrderStatus::Created | OrderStatus::Reserved) => {
                OrderStatus::Pending
            }
            _ => status,
        }
    }
}

/// A sale's purchases: the hot path's one call. Two implementations (Redis, embedded) pass
/// one conformance suite.
#[async_trait]
pub trait HotPurchases: Send + Sync + 'static {
    /// Judges a batch of purchases of one sale atomically, in order; one outcome per request.
    async fn purchase_batch(
        &self,
        sku: SkuId,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError>;

    /// The batch lane of `user`'s purchases of `sku`: its home bucket when this ledger keeps
    /// the sale's buckets apart and knows their count without a round trip, else 0. Batches
    /// formed per lane reach one bucket's copy each, whole, instead of being split by home.
    fn lane(&self, sku: SkuId, user: UserId) -> u16 {
        let _ = (sku, user);
        0
    }
}

/// The rest of a sale's hot path (states, pay, cancel, expiry) and its reads.

#[async_trait]
pub trait HotLedger: Send + Sync + 'static {
    /// "redis" or "embedded": a name for logs, metrics and health answers. Behaviour is
    /// asked by capability ([`HotLedger::durability`]), never by name.
    fn kind(&self) -> &'static str;

    /// When an accepted purchase is durable, relative to its answer.
    fn durability(&self) -> Durability;

    /// The most buckets a sale on this ledger may have ([`Sale::buckets`]). A ledger with
    /// no shards runs a bucketed sale as one book and takes up to
    /// [`BUCKETS_MAX`](crate::buckets::BUCKETS_MAX); one that places buckets on shards takes
    /// what it can place. The service refuses a sale with more, before storing it.
    fn buckets_max(&self) -> u16;

    /// Whether this ledger can hold `sale`'s buckets, or why not: the one check the service
    /// makes before it stores a sale and a ledger makes again before it loads a copy.
    fn check_buckets(&self, sale: &Sale) -> Result<(), String> {
        let max = self.buckets_max();
        if sale.buckets <= max {
            return Ok(());
        }
        Err(format!(
            "buckets must be 1..={max} on the {} ledger, this sale has {}",
            self.kind(),
            sale.buckets
        ))
    }

    /// Sets the operator state (live, paused, ended) of an open sale.
    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), LedgerError>;

    /// Sets the operator state only when it is `from` now (back-pressure's auto-pause must
    /// never reopen a sale that an operator paused or ended meanwhile). True when it did.
    async fn set_state_if(&self, sku: SkuId, from: SaleState, to: SaleState) -> Changed;

    /// Pays a reservation. Like [`HotLedger::cancel`], answers the order after the change.
    async fn pay(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError>;

    async fn cancel(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError>;

    /// Expires at most `max` due holds of a sale; returns how many it expired.
    async fn expire_due(&self, sku: SkuId, max: usize) -> Result<usize, LedgerError>;

    /// The hot counters of a sale, `None` when it is not warm.
    async fn counters(&self, sku: SkuId) -> Result<Option<Counters>, LedgerError>;

    /// An order as the hot ledger knows it (also while PENDING).
    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, LedgerError>;

    /// Cheap reachability check for /readyz and the breaker.
    async fn ping(&self) -> Result<(), LedgerError>;

    /// Whether this ledger runs `sku`'s buckets as copies of their own (each with its epoch,
    /// seq and stream, so the database keeps a row per bucket), rather than as one book.
    fn keeps_buckets(&self, sku: SkuId) -> bool {
        let _ = sku;
        false
    }

    /// Whether `sale` is kept in buckets here: more than one, on a ledger that keeps them
    /// apart (then the database holds a row per bucket and everything goes per bucket).
    fn kept_in_buckets(&self, sale: &Sale) -> bool {
        sale.buckets > 1 && self.keeps_buckets(sale.sku_id)
    }

    /// A bucketed sale's hot buckets, each with its own counters, and the units in flight
    /// between them. `None` for a sale of one bucket, an unknown sale, or a ledger that runs a
    /// bucketed sale as one book (the embedded one).
    async fn hot_buckets(&self, sku: SkuId) -> Result<Option<HotBuckets>, LedgerError> {
        let _ = sku;
        Ok(None)
    }
}

/// The transfers of one bucket a rebuild puts back into its copy
/// ([`HotCopies::load_bucket`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketTransfers {
    /// Ids of the transfers this bucket took in.
    pub ins: Vec<String>,
    /// Its outs whose in is not stored: (id, destination, units).
    pub pending: Vec<(String, u16, u64)>,
}

/// A sale's hot copy as loaded at `epoch` (of a bucketed sale: the bucket whose epoch it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyAt {
    pub sku: SkuId,
    pub epoch: u64,
}

/// One bucket's copy to load ([`HotCopies::load_bucket`]): the sale, the bucket, its row's
/// counters at `epoch`, and the transfers it is part of as the database holds them.
#[derive(Debug, Clone, Copy)]
pub struct BucketLoad<'a> {
    pub sale: &'a Sale,
    pub bucket: u16,
    pub counters: &'a Counters,
    pub epoch: u64,
    pub transfers: &'a BucketTransfers,
}

impl BucketTransfers {
    /// `bucket`'s part of a sale's stored, unfenced transfer sides.
    pub fn of(bucket: u16, sides: &[TransferEvent]) -> BucketTransfers {
        let arrived: std::collections::HashSet<&str> = (sides.iter())
            .filter(|t| t.side == crate::order::TransferSide::In)
            .map(|t| t.id.as_str())
            .collect();
        let mut out = BucketTransfers::default();
        for t in sides {
            match t.side {
                crate::order::TransferSide::In if t.to == bucket => out.ins.push(t.id.clone()),
                crate::order::TransferSide::Out
                    if t.from == bucket && !arrived.contains(t.id.as_str()) =>
                {
                    out.pending.push((t.id.clone(), t.to, t.units))
                }
                _ => {}
            }
        }
        out
    }
}

/// A bucketed sale's hot buckets as [`HotLedger::hot_buckets`] reads them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotBuckets {
    /// By bucket: (bucket, its counters; `seq` is its own).
    pub buckets: Vec<(u16, Counters)>,
    /// Units that left one bucket and are not yet in another.
    pub in_flight_units: u64,
}

/// Loading and replacing a sale's hot copy (the rebuild, the reconciler): see
/// `reconcile::rebuild` in the server for the steps, and docs/DESIGN.md "A sale's hot copy".
#[async_trait]
pub trait HotCopies: Send + Sync + 'static {
    /// Loads a sale into the hot ledger from the system of record, as the copy of `epoch`
    /// (an epoch the caller has just taken in the database, see [`OrderStore::take_epoch`]),
    /// with `counters` at the database's `applied_seq`. The new copy starts **fenced**: it
    /// judges nothing until [`HotCopies::open`]. Replaces a copy of an older epoch (already
    /// fenced by the database); refuses (`AlreadyWarm`) when a copy of `epoch` or newer stands.
    async fn load(&self, sale: &Sale, counters: &Counters, epoch: u64) -> Result<(), LedgerError>;

    /// Loads and opens a copy in one call ([`HotCopies::load`] then [`HotCopies::open`] in
    /// `sale.state`): for a sale's first copy in tests and benches. The server loads sales
    /// through its rebuild, which takes the epoch in the database first.
    async fn warm(&self, sale: &Sale, counters: &Counters, epoch: u64) -> Result<(), LedgerError> {
        self.load(sale, counters, epoch).await?;
        self.open(sale.sku_id, epoch, sale.state).await
    }

    /// Stops every write to a sale's hot copy: purchases, pay, cancel and expiry answer
    /// `UNAVAILABLE` until a newer copy is loaded and opened. Idempotent; `Ok(false)` when the
    /// sale has no hot copy.
    async fn fence(&self, sku: SkuId) -> Result<bool, LedgerError>;

    /// Opens a loaded (fenced) copy in operator state `state`, when it is still the copy of
    /// `epoch`; `AlreadyWarm` when another copy replaced it meanwhile.
    async fn open(&self, sku: SkuId, epoch: u64, state: SaleState) -> Result<(), LedgerError>;

    /// For the reconciler and rebuilds: the hot counters at `seq`, the epoch, whether the copy
    /// is fenced, and every event still in the sale's stream, read in one atomic step; `None`
    /// when the sale has no hot copy.
    async fn hot_snapshot(&self, sku: SkuId) -> Result<Option<HotSnapshot>, LedgerError>;

    /// Where a sale kept in buckets lives: its buckets' salts, by bucket, as this ledger
    /// placed or read them; `None` for a sale of one bucket or one it does not hold.
    async fn bucket_salts(&self, sku: SkuId) -> Result<Option<Vec<u32>>, LedgerError> {
        let _ = sku;
        Ok(None)
    }

    /// Where a fresh sale kept in buckets would be placed: a salt per bucket, chosen without
    /// writing anything (and not kept as the sale's: the database keeps them first, and
    /// [`HotCopies::adopt_salts`] hands them back), so that a first load that fails midway
    /// leaves its placement behind; `None` for a ledger that keeps no buckets, or chooses
    /// them only as it loads.
    async fn place_buckets(&self, sale: &Sale) -> Result<Option<Vec<u32>>, LedgerError> {
        let _ = sale;
        Ok(None)
    }

    /// Takes `salts` (kept by the database since the first load) as where `sku`'s buckets
    /// live, unless this ledger already knows: so that a sale whose bucket 0, which names
    /// the others, was lost can still be rebuilt bucket by bucket.
    fn adopt_salts(&self, sku: SkuId, salts: &[u32]) {
        let _ = (sku, salts);
    }

    /// A rebuild of one bucket (a ledger that keeps buckets apart): fences that bucket's copy
    /// only; the others keep selling. True when it was there.
    async fn fence_bucket(&self, sku: SkuId, bucket: u16) -> Result<bool, LedgerError> {
        let _ = (sku, bucket);
        Err(LedgerError::Internal("this ledger keeps no buckets".into()))
    }

    /// Loads one bucket's copy (closed, until [`HotCopies::open_bucket`]) from its row's
    /// counters at `epoch`, with the transfers it is part of as the database holds them:
    /// the ids it took in (`ins`, so none is taken in twice) and its outs whose in is not
    /// stored (`pending`, finished like any out left in flight).
    async fn load_bucket(&self, load: BucketLoad<'_>) -> Result<(), LedgerError> {
        let _ = load;
        Err(LedgerError::Internal("this ledger keeps no buckets".into()))
    }

    /// Opens the bucket's copy that `load` loaded, in `state`; `AlreadyWarm` when the copy is
    /// no longer the one of the load's epoch.
    async fn open_bucket(&self, load: BucketLoad<'_>, state: SaleState) -> Result<(), LedgerError> {
        let _ = (load, state);
        Err(LedgerError::Internal("this ledger keeps no buckets".into()))
    }

    /// [`HotCopies::hot_snapshot`] of one bucket of a bucketed sale: its own counters, epoch
    /// and stream (order events and transfer sides). `None` for a ledger that runs a bucketed
    /// sale as one book, or a bucket with no hot copy.
    async fn bucket_snapshot(
        &self,
        sku: SkuId,
        bucket: u16,
    ) -> Result<Option<HotSnapshot>, LedgerError> {
        let _ = (sku, bucket);
        Ok(None)
    }

    /// Rebuild: puts orders read back from the system of record into the loaded (fenced)
    /// copy of `epoch`. Idempotent: orders already present are skipped. Returns how many
    /// orders were added; `AlreadyWarm` when the copy is no longer the one of `epoch`.
    async fn restore_orders(&self, at: CopyAt, orders: &[HotOrder]) -> Result<usize, LedgerError>;
}

/// What an instance's local sold-out flag needs from the ledger.
#[async_trait]
pub trait SoldOutSupport: Send + Sync + 'static {
    /// The keys of every accepted request of a sale, or `None` when the sale has more than
    /// `max` of them (or is not warm). With it an instance whose local sold-out flag is set
    /// still answers a retry of an accepted request with its first outcome.
    async fn accepted_keys(
        &self,
        sku: SkuId,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError>;

    /// Whether the sale's copy accepted this request (a purchase of it would be a replay), one
    /// key's lookup; `false` when the sale has no hot copy. Lets a check in front of the ledger
    /// (the shop's risk service) give a retry its first outcome instead of a new refusal. The
    /// default reads every key; backends answer from the one key.
    async fn is_accepted(&self, sku: SkuId, key: &RequestKey) -> Result<bool, LedgerError> {
        let keys = self.accepted_keys(sku, usize::MAX).await?;
        Ok(keys.is_some_and(|keys| keys.contains(key)))
    }

    /// The epoch of a sale's copy and how many accepted requests it remembers (cheap: no
    /// keys), so an instance reloads [`SoldOutSupport::accepted_keys`] only when they changed;
    /// `None` when the sale has no hot copy.
    async fn accepted_count(&self, sku: SkuId) -> Result<Option<(u64, usize)>, LedgerError>;

    /// Registers who to tell when a sale's stock comes back (cancel, expiry) on any instance,
    /// so that local sold-out flags clear. Called once at start; a later call replaces it.
    /// This instance's restocks are told at once; other instances' arrive through
    /// [`SoldOutSupport::restock_feeds`].
    fn on_restock(&self, listener: RestockListener);

    /// The tasks that hear the restocks of other instances (a subscription per Redis) and
    /// tell the listener of [`SoldOutSupport::on_restock`]; none for a ledger that lives in
    /// one process. Each runs until dropped: the service runs them as workers and drops
    /// them at shutdown.
    fn restock_feeds(&self) -> Vec<RestockFeed> {
        Vec::new()
    }
}

/// A whole hot ledger: the purchase, the rest of the hot path and reads, its copies'
/// lifecycle, and what the sold-out flag needs. Every backend implements the four; the
/// service holds `dyn Ledger`.
pub trait Ledger: HotPurchases + HotLedger + HotCopies + SoldOutSupport {}

impl<T: HotPurchases + HotLedger + HotCopies + SoldOutSupport> Ledger for T {}

/// What [`HotCopies::hot_snapshot`] reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotSnapshot {
    pub counters: Counters,
    pub epoch: u64,
    /// Events still in the stream (not yet trimmed), in seq order; empty for a ledger that
    /// commits before it answers.
    pub events: Vec<Event>,
    /// Transfer sides still in the stream (bucketed sales), in stream order.
    pub transfers: Vec<TransferEvent>,
    /// Stream entries that are not events: (entry id, why).
    pub bad_entries: Vec<(String, String)>,
    /// How long the copy has been fenced (a rebuild under way, or one that died midway);
    /// `None` when it is open.
    pub fenced_ms: Option<u64>,
    /// The copy's operator state (what its scripts judge by).
    pub state: crate::SaleState,
}

/// Told the sku whose stock came back.
pub type RestockListener = std::sync::Arc<dyn Fn(SkuId) + Send + Sync>;

/// A task that hears other instances' restocks ([`SoldOutSupport::restock_feeds`]).
pub type RestockFeed = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A sale as the system of record holds it: counters are at `counters.seq == applied_seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSale {
    pub sale: Sale,
    pub counters: Counters,
    /// The last epoch handed out to a hot copy (0: never loaded). The fencing token.
    pub epoch: u64,
    /// When that epoch was taken (ms since the Unix epoch, the taker's clock).
    pub epoch_at_ms: i64,
}

/// A stream entry the persister could not apply after repeated tries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub sku_id: SkuId,
    /// The stream entry id.
    pub entry_id: String,
    /// The event's seq, when the entry could be parsed at all.
    pub seq: Option<u64>,
    /// The entry's fields as `k=v` pairs, for an operator to read.
    pub payload: String,
    pub error: String,
    pub attempts: u32,
}

/// What one `apply_events` call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Events newly applied.
    pub applied: usize,
    /// Events that were already applied (a redelivery): skipped, effect exactly once.
    pub duplicates: usize,
    /// Accepted orders the database's guard refused: stored as REJECTED, counted, alerted.
    pub rejected: Vec<OrderNo>,
    /// Events refused by the fence: written by a hot copy of an older epoch, or naming an
    /// `(epoch, seq)` that the database holds for another event. Kept in `fenced_events`
    /// (never applied) for the reconciler's loss report.
    pub fenced: Vec<Event>,
}

/// The system of record (MySQL/MariaDB in production, SQLite embedded).
#[async_trait]
pub trait OrderStore: Send + Sync + 'static {
    /// The ordered event log the order-event relay reads (`None`: this store has none).
    fn event_log(&self) -> Option<std::sync::Arc<dyn crate::events::EventLog>> {
        None
    }

    async fn create_sale(&self, sale: &Sale) -> Result<StoredSale, StoreError>;

    async fn sale(&self, sku: SkuId) -> Result<Option<StoredSale>, StoreError>;

    async fn sales(&self) -> Result<Vec<StoredSale>, StoreError>;

    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), StoreError>;

    /// Takes the next epoch for a new hot copy when the stored epoch is still `current`
    /// (compare and set: of two racing rebuilds one wins); returns it, or `None` when another
    /// caller took one first. From then on `apply_events` refuses events of older epochs.
    async fn take_epoch(&self, sku: SkuId, current: u64) -> Result<Option<u64>, StoreError>;

    /// Fenced events of a sale not yet reported by a reconciler run, oldest first (at most
    /// `max`).
    async fn unreported_fenced(&self, sku: SkuId, max: usize) -> Result<Vec<Event>, StoreError>;

    /// Marks fenced events as reported, by `(epoch, seq)`.
    async fn mark_fenced_reported(&self, sku: SkuId, keys: &[(u64, u64)])
        -> Result<(), StoreError>;

    /// Whether a dead letter has stopped the sale's stream (an operator resumes it).
    async fn stream_paused(&self, sku: SkuId) -> Result<bool, StoreError>;

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, StoreError>;

    /// Orders of a sale (recovery, reconciliation, invariant checks).
    async fn orders(&self, sku: SkuId) -> Result<Vec<HotOrder>, StoreError>;

    /// Events of a sale in `seq` order (the audit log), for checks and reconciliation.
    async fn events(&self, sku: SkuId) -> Result<Vec<Event>, StoreError>;

    /// Events of a sale with a `seq` in `seqs`, in `seq` order.
    async fn events_between(
        &self,
        sku: SkuId,
        seqs: RangeInclusive<u64>,
    ) -> Result<Vec<Event>, StoreError>;

    /// Parks an entry that keeps failing, and pauses the sale's stream (it is never skipped).
    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError>;

    async fn dead_letters(&self, sku: SkuId) -> Result<Vec<DeadLetter>, StoreError>;

    /// Applies events of one sale, in one transaction, exactly once. Events must start at
    /// `applied_seq + 1` (or repeat already-applied ones) and be contiguous.
    async fn apply_events(&self, sku: SkuId, events: &[Event]) -> Result<ApplyReport, StoreError>;

    /// Applies one side of a transfer of a bucketed sale, exactly once (keyed by
    /// `(sku, id, side)`), in one transaction: its bucket's total and available move by
    /// [`TransferEvent::units_delta`]; the sale row does not change.
    async fn apply_transfer(&self, transfer: &TransferEvent)
        -> Result<TransferApplied, StoreError>;

    /// A bucketed sale's bucket rows, by bucket; empty for a sale of one bucket or one run
    /// as one book.
    async fn buckets(&self, sku: SkuId) -> Result<Vec<BucketRow>, StoreError>;

    /// Gives a bucketed sale its bucket rows (its stock split by `buckets::split_stock`),
    /// before its first hot copy is loaded by a ledger that keeps buckets apart
    /// ([`HotLedger::keeps_buckets`]). From then on its events and transfers are applied per
    /// bucket. Idempotent; refused for a sale that has sold without rows (it was run as one
    /// book) or of one bucket.
    async fn split_buckets(&self, sku: SkuId) -> Result<(), StoreError>;

    /// The salts of a sale kept in buckets' hash tags, by bucket, as its first load placed
    /// them; `None` until every bucket has one.
    async fn bucket_salts(&self, sku: SkuId) -> Result<Option<Vec<u32>>, StoreError>;

    /// Keeps the salts the first load placed (each bucket's once: a salt already kept is
    /// never changed), so that a bucket lost with its Redis is rebuilt under the same tag.
    async fn keep_bucket_salts(&self, sku: SkuId, salts: &[u32]) -> Result<(), StoreError>;

    /// A rebuild of one bucket of a bucketed sale kept per bucket: moves the epoch of the
    /// bucket of `row` (its row as the rebuild read it) from the row's epoch to the next of
    /// its own (`buckets::next_epoch`: `epoch + n`, so it stays `≡ bucket (mod n)` and apart
    /// from every other bucket's), the fence of its events and transfer sides. `None` when its
    /// epoch is no longer the row's (another rebuild took one meanwhile).
    async fn take_bucket_epoch(
        &self,
        sku: SkuId,
        row: &BucketRow,
    ) -> Result<Option<u64>, StoreError>;

    async fn ping(&self) -> Result<(), StoreError>;

    /// The sale, its orders and its events read in one transaction (one consistent view, so
    /// invariants can be checked while the persister writes).
    async fn audit(&self, sku: SkuId) -> Result<Option<SaleAudit>, StoreError>;

    /// Stores one reconciler run (or repair); returns its id.
    async fn record_reconcile_run(&self, run: &ReconcileRun) -> Result<u64, StoreError>;

    /// The latest stored runs, newest first, of one sale or of all.
    async fn reconcile_runs(
        &self,
        sku: Option<SkuId>,
        limit: usize,
    ) -> Result<Vec<ReconcileRun>, StoreError>;
}

/// A consistent view of one sale in the system of record.
#[derive(Debug, Clone)]
pub struct SaleAudit {
    pub sale: StoredSale,
    pub orders: Vec<HotOrder>,
    pub events: Vec<Event>,
    /// A bucketed sale's bucket rows, by bucket; empty for a sale of one bucket.
    pub buckets: Vec<BucketRow>,
    /// A bucketed sale's applied transfer sides, by id then side; empty otherwise.
    pub transfers: Vec<TransferEvent>,
}

/// One bucket of a bucketed sale in the system of record (`sale_buckets`): its own fencing
/// epoch (`E·n + bucket` for the sale's epoch E), its own `applied_seq` (`counters.seq`) and
/// counters. The sale row's available, reserved and sold are the sum over its buckets; the
/// sale's total is the sum of the bucket totals and the units in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketRow {
    pub bucket: u16,
    pub epoch: u64,
    /// When that epoch was taken (ms since the Unix epoch, the taker's clock).
    pub epoch_at_ms: i64,
    pub counters: Counters,
}

/// What the store did with one transfer side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferApplied {
    /// Stored now: its bucket's total and available moved.
    Applied,
    /// This side of this id was stored before: nothing changed (a redelivery).
    Duplicate,
    /// Written by a copy of another epoch than its bucket's: not applied, logged.
    Fenced,
}

/// One stored reconciler run of one sale (`reconcile_runs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileRun {
    /// 0 until stored.
    pub id: u64,
    pub sku_id: SkuId,
    pub at_ms: i64,
    /// "worker", "cli", "admin" …
    pub trigger: String,
    /// Whether repairs were asked for.
    pub repair: bool,
    /// No violation, no diff, nothing lost.
    pub ok: bool,
    pub violations: u32,
    /// Repairs done, as short lines.
    pub repairs: Vec<String>,
    /// Order numbers accepted by the hot ledger and lost with it.
    pub lost_orders: Vec<String>,
    /// Payments and cancellations answered 200 and lost with the hot ledger, as
    /// `"<order_no> <kind>"`.
    pub lost_resolutions: Vec<String>,
    /// The whole report, JSON.
    pub report: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_order_is_pending_until_resolved_and_a_committed_one_says_its_status() {
        use OrderStatus::*;
        for s in [Created, Reserved] {
            assert_eq!(Durability::Streamed.as_answered(s), Pending);
            assert_eq!(Durability::BeforeAnswer.as_answered(s), s);
        }
        for s in [Paid, Cancelled, Expired] {
            assert_eq!(Durability::Streamed.as_answered(s), s);
        }
    }
}
