//! The purchase decision of one admitted request (its body understood, the gateway passed):
//! refusals this instance decides alone ([`refuse_early`]: the sale's sold-out flag, its
//! breaker), then the hot ledger through the batcher ([`ask_ledger`]), with the breaker's
//! accounting and a nudge to the reconcile worker when the sale's copy is fenced or missing.
//! The HTTP handler runs the shop's risk check between the two steps, and turns the outcome
//! into an answer.

use flashsale_core::{ErrorCode, LedgerError, PurchaseOutcome, PurchaseRequest, SaleState};

use crate::batcher::Batcher;
use crate::breaker::Breaker;
use crate::reconcile::Nudges;

/// What the ledger is not asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyRefusal {
    /// The sale's local flag: sold out, and this is not a retry of an accepted request.
    SoldOut,
    /// The sale's breaker is open: its hot ledger failed just now.
    LedgerDown,
}

/// The refusal decided here without asking anyone, if any.
pub fn refuse_early(
    batcher: &Batcher,
    breaker: &Breaker,
    req: &PurchaseRequest,
) -> Option<EarlyRefusal> {
    if batcher.sold_out_here(req) {
        return Some(EarlyRefusal::SoldOut);
    }
    (!breaker.allows(req.sku_id)).then_some(EarlyRefusal::LedgerDown)
}

/// The hot ledger's outcome of `req`, on a sale in `state`. A SOLD_OUT answer sets the sale's
/// local flag (inside the batcher); the breaker counts the ledger's own faults; a copy that is
/// fenced (a failover moved it) or missing is nudged to be rebuilt now, not at the next pass,
/// and a missing one answers "retry" unless the sale has not started.
pub async fn ask_ledger(
    batcher: &Batcher,
    breaker: &Breaker,
    nudges: &Nudges,
    req: PurchaseRequest,
    state: SaleState,
) -> Result<PurchaseOutcome, LedgerError> {
    let sku = req.sku_id;
    let outcome = batcher.purchase(req).await;
    // A missing copy is not a fault of the ledger's: Redis answered.
    match &outcome {
        Err(e) if e.is_unavailable() => breaker.failure(sku),
        Ok(_) => breaker.success(sku),
        Err(_) => {}
    }
    match outcome {
        Err(LedgerError::NotWarmed) => {
            if state != SaleState::Scheduled {
                nudges.nudge(sku);
            }
            Err(copy_missing(state))
        }
        Ok(PurchaseOutcome::Rejected(ErrorCode::Unavailable)) => {
            nudges.nudge(sku);
            outcome
        }
        other => other,
    }
}

/// A sale past `scheduled` whose hot copy is missing lost it (Redis restarted empty, a
/// failover): a rebuild puts it back, so the client retries (503); it is not "not started".
fn copy_missing(state: SaleState) -> LedgerError {
    match state {
        SaleState::Scheduled => LedgerError::NotWarmed,
        _ => LedgerError::Unavailable(
            "the sale's hot copy is being restored; retry with the same request_id".into(),
        ),
    }
}
