//! flashsale-core: the domain of a flash sale, with no I/O.
//!
//! Map of the crate:
//! - [`ids`]: `SkuId`, `UserId`, `RequestId`, `RequestKey`, `OrderNo`: validation and text forms.
//! - [`sale`]: a sale's definition, mode, state and counters.
//! - [`admission`]: who may buy a queue or draw sale: the seeded pre-queue shuffle, the draw,
//!   the seed's commitment, the wave size, the admission pass (all recomputable by anyone).
//! - [`buckets`]: a sale's stock split over several hot copies: bounds, a buyer's home bucket,
//!   the initial split, epochs per bucket and the transfer plan. (Placement on Redis is the
//!   redis crate's; the reference model of a bucketed sale is the testkit's.)
//! - [`order`]: order status, hot orders, events and the counter delta of each event.
//! - [`events`]: order events for the shop's other systems: the CloudEvents form of a stored
//!   transition, and the `EventLog` (ordered log, positions, sink leases) the relay reads.
//! - [`error`]: the error codes of the HTTP contract and the errors of ledgers and stores.
//! - [`rules`]: `SaleBook`, the reference state machine of one sale. The embedded ledger
//!   runs it; the Lua scripts mirror it; tests compare both ledgers against it.
//! - [`ledger`]: the traits backends implement: a hot ledger is `HotPurchases` (the purchase),
//!   `HotLedger` (the rest of the hot path, and reads), `HotCopies` (loading and replacing a
//!   sale's hot copy) and `SoldOutSupport` (what the local sold-out flag needs), together
//!   `Ledger`; the system of record is `OrderStore`.
//! - [`invariants`]: checks I1–I7 over plain rows, shared by tests, bench and reconciler.
//! - [`metric_names`]: the name of every metric; [`clock`]: the wall clock, read in one place.
//! - [`limits`]: the bounds of the domain (stock, per-user limit, batch length, name length).
//!
//! May depend on serde, serde_json, thiserror, async-trait, and sha2 and hmac (pure hashing,
//! for the admission's published algorithms); never on tokio, redis or sqlx. Every other crate may depend on it.

pub mod admission;
pub mod buckets;
pub mod clock;
pub mod error;
pub mod events;
pub mod ids;
pub mod invariants;
pub mod ledger;
pub mod metric_names;
pub mod order;
pub mod rules;
pub mod sale;

pub use admission::{Admission, AdmissionMode};
pub use error::{ErrorCode, LedgerError, StoreError};
pub use ids::{OrderNo, RequestId, RequestKey, SkuId, UserId};
pub use ledger::{
    ApplyReport, BucketLoad, BucketRow, BucketTransfers, CopyAt, DeadLetter, Durability,
    HotBuckets, HotCopies, HotLedger, HotPurchases, HotSnapshot, Ledger, OrderStore,
    PurchaseRequest, ReconcileRun, Resolution, SaleAudit, SoldOutSupport, StoredSale,
    TransferApplied,
};
pub use order::{
    Event, EventKind, HotOrder, OrderStatus, PurchaseOutcome, TransferEvent, TransferSide,
};
pub use rules::SaleBook;
pub use sale::{Counters, Sale, SaleMode, SaleState};

/// Hard limits that every layer enforces (TigerBeetle style: a bound on everything).
pub mod limits {
    /// Largest stock one sale may hold.
    pub const TOTAL_STOCK_MAX: u64 = 1_000_000_000;
    /// Largest per-user limit, and so the largest quantity of one purchase.
    pub const PER_USER_LIMIT_MAX: u32 = 1_000;
    /// Longest request id, in bytes.
    pub const REQUEST_ID_LEN_MAX: usize = 64;
    /// Longest sale name, in bytes.
    pub const SALE_NAME_LEN_MAX: usize = 200;
    /// Most requests one ledger call may carry.
    pub const BATCH_LEN_MAX: usize = 1_024;
    /// Longest payment timeout of a reserve-mode sale.
    pub const PAYMENT_TIMEOUT_MS_MAX: u64 = 7 * 24 * 3_600_000;
    /// Largest sku id and sale time (ms): the Redis scripts hold numbers as Lua doubles,
    /// exact up to 2^53 − 1, so both ledgers take the same sales.
    pub const SCRIPT_INT_MAX: u64 = (1 << 53) - 1;
}
