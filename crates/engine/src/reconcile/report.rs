//! What a run is (its trigger), what it found and did ([`SaleReport`]), the kinds of repair,
//! and the reconciler's tunables.

use std::time::Duration;

use flashsale_core::clock::now_ms;
use flashsale_core::invariants::Violation;
use flashsale_core::{Counters, SaleState, SkuId};
use serde::Serialize;

use super::diff::Diff;
use super::rebuild::REBUILD_STALL_MS;

/// What started a run (stored with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    Worker,
    /// A request found the sale's copy fenced or missing (see [`Nudges`]).
    Nudge,
    Cli,
    Admin,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Worker => "worker",
            Trigger::Nudge => "nudge",
            Trigger::Cli => "cli",
            Trigger::Admin => "admin",
        }
    }
}

/// The kinds of repair (the `kind` label of `flashsale_reconcile_repairs_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    Replay,
    Rebuild,
    Expire,
}

impl Repair {
    pub fn as_str(self) -> &'static str {
        match self {
            Repair::Replay => "replay",
            Repair::Rebuild => "rebuild",
            Repair::Expire => "expire",
        }
    }
}

/// What one run found (and did) for one sale.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SaleReport {
    pub sku_id: u64,
    pub at_ms: i64,
    pub trigger: String,
    pub repair: bool,
    /// Every check passed and nothing is lost.
    pub ok: bool,
    pub state: String,
    pub db: Counters,
    pub db_epoch: u64,
    pub hot: Option<Counters>,
    pub hot_epoch: Option<u64>,
    /// The hot copy's operator state.
    pub hot_state: Option<String>,
    /// Events in the stream above the database's `applied_seq`.
    pub in_flight: u64,
    /// Hot counters with in-flight events folded out (or database counters folded back).
    pub folded: Option<Counters>,
    /// `None` when there is nothing to compare (hot sale missing or behind).
    pub diff: Option<Diff>,
    /// The hot sale is gone or behind the database: it needs a rebuild.
    pub hot_behind: bool,
    /// A sale kept in buckets: the buckets whose copy is gone or behind (each rebuilt by
    /// itself).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buckets_behind: Vec<u16>,
    /// A sale kept in buckets whose hot copies hold another number of units than its stock
    /// (a unit created or stranded by a lost transfer side): the transfers with one side
    /// stored, by id, and the buckets a repair rebuilds to count their other side.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub transfers_unbalanced: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buckets_unbalanced: Vec<u16>,
    pub violations: Vec<Violation>,
    /// Stream or fold problems (missing in-flight events, malformed entries …).
    pub findings: Vec<String>,
    pub overdue_holds: usize,
    /// Accepted purchases waiting in the stream longer than the lag bound.
    pub stale_pending: usize,
    /// Accepted purchases the hot ledger lost before the database got them.
    pub lost_orders: Vec<String>,
    /// Payments and cancellations answered 200 and lost, as `"<order_no> <kind>"`.
    pub lost_resolutions: Vec<String>,
    /// False when this instance's journal overflowed (loss reporting may be incomplete).
    pub journal_complete: bool,
    pub repairs: Vec<String>,
    pub run_id: u64,
    /// The state after repairs, when any were made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Box<SaleReport>>,
}

/// Tunables of the reconciler.
#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    /// An accepted purchase in flight longer than this is stale.
    pub lag_bound: Duration,
    /// A hold this long past its deadline, still RESERVED in the database, is overdue.
    pub hold_grace: Duration,
    /// A copy fenced this long is a rebuild that died midway: rebuilt again.
    pub rebuild_stall: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> ReconcileConfig {
        ReconcileConfig {
            lag_bound: Duration::from_secs(10),
            hold_grace: Duration::from_secs(5),
            rebuild_stall: Duration::from_millis(REBUILD_STALL_MS),
        }
    }
}

impl SaleReport {
    /// A run that could not finish (the sale is reported as not reconciled).
    pub(super) fn failed(
        sku: SkuId,
        trigger: Trigger,
        repair: bool,
        e: &anyhow::Error,
    ) -> SaleReport {
        SaleReport {
            sku_id: sku.0,
            at_ms: now_ms(),
            trigger: trigger.as_str().to_owned(),
            repair,
            findings: vec![format!("run failed: {e:#}")],
            ..SaleReport::default()
        }
    }
}

impl SaleReport {
    /// Nothing can change the sale any more, and nothing is left to reconcile: ended in the
    /// database and in its hot copy (which then accepts nothing), no hold left to pay, cancel
    /// or expire, nothing in flight, and this run found everything in order. The worker's
    /// passes skip a settled sale (its persister retires too); `flashsale reconcile --sku`
    /// and the admin API still run it.
    pub fn settled(&self) -> bool {
        let hot_state = self.hot_state.as_deref().and_then(SaleState::parse);
        let (Some(state), Some(hot)) = (SaleState::parse(&self.state), hot_state.zip(self.hot))
        else {
            return false;
        };
        self.ok
            && self.in_flight == 0
            && flashsale_core::sale::settled(state, &self.db, Some((hot.0, hot.1.seq)))
    }
}
