//! The purchase use case: the sale a purchase names (with its admission), then one admitted
//! request's decision, in this order and in one function ([`Shop::purchase`]): the sale's
//! sold-out flag, its breaker, the caller's risk gate, the hot ledger through the batcher
//! (which journals what the ledger accepted and sets the flag on SOLD_OUT), then the
//! outcome's rules (a reused request id, the status the ledger's durability answers).

use std::sync::Arc;

use flashsale_core::ledger::StoredSale;
use flashsale_core::metric_names::RISK_REPLAYS;
use flashsale_core::{
    AdmissionMode, ErrorCode, HotOrder, LedgerError, OrderStatus, PurchaseOutcome, PurchaseRequest,
    Sale, SaleState, SkuId, UserId,
};

use super::{Shop, ShopError};

/// The shop's risk check of one purchase, asked after the local refusals and before the
/// ledger. The server's risk client implements it.
#[async_trait::async_trait]
pub trait RiskGate: Send + Sync {
    /// Whether `req` may go on to the ledger.
    async fn screen(&self, req: &PurchaseRequest) -> Screen;
    /// The ledger accepted `req` (first time or replay): a retry of it may skip the check.
    fn accepted(&self, req: &PurchaseRequest);
}

/// A risk gate's word on one purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screen {
    Pass,
    Refuse(RiskDenial),
}

/// Why a risk gate refused a purchase: who refused (`service`, `fallback`) and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RiskDenial {
    pub by: &'static str,
    pub message: String,
}

/// An accepted purchase (or the replay of the first one).
#[derive(Debug, Clone)]
pub struct Purchased {
    pub order: HotOrder,
    /// The status to answer: the ledger's, as its durability lets it be promised.
    pub status: OrderStatus,
    /// True when this repeats the request's first outcome.
    pub replayed: bool,
}

/// Why a purchase was not accepted.
#[derive(Debug)]
pub enum PurchaseRefusal {
    /// The sale's local flag: sold out, and this is not a retry of an accepted request (no
    /// one was asked).
    SoldOutHere,
    /// The risk gate refused, and the ledger had not accepted this request before.
    Risk(RiskDenial),
    /// Any other refusal or failure.
    Shop(ShopError),
}

impl From<ShopError> for PurchaseRefusal {
    fn from(e: ShopError) -> PurchaseRefusal {
        PurchaseRefusal::Shop(e)
    }
}

impl From<LedgerError> for PurchaseRefusal {
    fn from(e: LedgerError) -> PurchaseRefusal {
        PurchaseRefusal::Shop(e.into())
    }
}

impl Shop {
    /// The sale `user` asks to buy from: a queue or draw sale's purchase needs a valid
    /// admission pass for this user and sale (403 ADMISSION_REQUIRED without one), checked
    /// before anything else is spent on the request.
    pub async fn sale_to_buy(
        &self,
        sku: SkuId,
        user: UserId,
        pass: Option<&str>,
    ) -> Result<Arc<StoredSale>, ShopError> {
        let stored = self.sale(sku).await?;
        if stored.sale.admission.mode == AdmissionMode::Open {
            return Ok(stored);
        }
        let refused = || {
            ShopError::refused(
                ErrorCode::AdmissionRequired,
                "this sale admits buyers through its queue or draw",
            )
        };
        let admission = self.admission.as_ref().ok_or_else(refused)?;
        let now = crate::now_ms();
        admission.check_pass(&stored.sale, user, pass, now)?;
        Ok(stored)
    }

    /// One purchase of `sale` (from [`Shop::sale_to_buy`]): the sold-out flag, the breaker,
    /// `gate`, the ledger, and the rules of its outcome.
    pub async fn purchase(
        &self,
        req: PurchaseRequest,
        sale: &Sale,
        gate: &dyn RiskGate,
    ) -> Result<Purchased, PurchaseRefusal> {
        if self.batcher.sold_out_here(&req) {
            return Err(PurchaseRefusal::SoldOutHere);
        }
        if !self.breaker.allows(req.sku_id) {
            let why = "hot ledger unavailable; retry shortly";
            return Err(ShopError::refused(ErrorCode::Unavailable, why).into());
        }
        // After the sold-out flag and the ledger's breaker: a sale known sold out, or a
        // ledger known down, answers without asking the risk service.
        self.screen(&req, gate).await?;
        let quantity = req.quantity;
        let outcome = self.ask_ledger(req.clone(), sale.state).await;
        if matches!(outcome, Ok(PurchaseOutcome::Accepted { .. })) {
            gate.accepted(&req);
        }
        let purchased = match outcome? {
            PurchaseOutcome::Accepted { order, replayed } => {
                self.accepted(order, replayed, quantity)?
            }
            PurchaseOutcome::Rejected(code) => return Err(ShopError::Code(code).into()),
        };
        if !purchased.replayed {
            self.record_bought(sale, req.user_id);
        }
        Ok(purchased)
    }

    /// The gate's word; a refusal of a purchase the ledger already accepted yields to the
    /// ledger, so a retry always gets its first outcome. A refusal is not remembered: the
    /// next attempt is asked again.
    async fn screen(
        &self,
        req: &PurchaseRequest,
        gate: &dyn RiskGate,
    ) -> Result<(), PurchaseRefusal> {
        let Screen::Refuse(denial) = gate.screen(req).await else {
            return Ok(());
        };
        if self.ledger.is_accepted(req.sku_id, &req.key()).await? {
            metrics::counter!(RISK_REPLAYS).increment(1);
            return Ok(());
        }
        Err(PurchaseRefusal::Risk(denial))
    }

    /// An accepted outcome's rules: a retry must ask for what the first request asked for
    /// (the replayed order is the first request's, quantity included: both ledgers keep it
    /// with the replay), and the status is what the ledger's durability lets it promise.
    fn accepted(
        &self,
        order: HotOrder,
        replayed: bool,
        quantity: u32,
    ) -> Result<Purchased, ShopError> {
        if replayed && order.quantity != quantity {
            let why = format!(
                "this request id was first sent with quantity {}; a new attempt needs a new id",
                order.quantity
            );
            return Err(ShopError::refused(ErrorCode::IdempotencyKeyReused, why));
        }
        let status = self.ledger.durability().as_answered(order.status);
        Ok(Purchased {
            order,
            status,
            replayed,
        })
    }

    /// The hot ledger's outcome of `req`, on a sale in `state`, through the batcher. The
    /// breaker counts the ledger's own faults; a copy that is fenced (a failover moved it)
    /// or missing is nudged to be rebuilt now, not at the next pass, and a missing one
    /// answers "retry" unless the sale has not started.
    async fn ask_ledger(
        &self,
        req: PurchaseRequest,
        state: SaleState,
    ) -> Result<PurchaseOutcome, LedgerError> {
        let sku = req.sku_id;
        let outcome = self.batcher.purchase(req).await;
        self.count(sku, &outcome);
        match outcome {
            Err(LedgerError::NotWarmed) => {
                if state != SaleState::Scheduled {
                    self.nudges.nudge(sku);
                }
                Err(copy_missing(state))
            }
            Ok(PurchaseOutcome::Rejected(ErrorCode::Unavailable)) => {
                self.nudges.nudge(sku);
                outcome
            }
            other => other,
        }
    }

    /// The breaker's accounting of one ledger answer. A missing copy is not a fault of the
    /// ledger's: Redis answered.
    pub(super) fn count<T>(&self, sku: SkuId, outcome: &Result<T, LedgerError>) {
        match outcome {
            Err(e) if e.is_unavailable() => self.breaker.failure(sku),
            Ok(_) => self.breaker.success(sku),
            Err(_) => {}
        }
    }

    /// Counts an admitted buyer's purchase against its admission (the next wave may admit
    /// one more buyer), off the answer's path.
    fn record_bought(&self, sale: &Sale, user: UserId) {
        if sale.admission.mode != AdmissionMode::Queue {
            return;
        }
        let Some(admission) = self.admission.clone() else {
            return;
        };
        let sale = sale.clone();
        tokio::spawn(async move {
            if let Err(e) = admission.bought(&sale, user).await {
                tracing::warn!(sku = sale.sku_id.0, error = %e, "could not record an admitted purchase");
            }
        });
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
