//! A job queued on a sale (a purchase batch, a payment or cancellation, an expiry), and its
//! answer, held back until the group that ran it is committed.

use tokio::sync::oneshot;

use flashsale_core::{
    ErrorCode, EventKind, LedgerError, OrderNo, PurchaseOutcome, PurchaseRequest, Resolution,
    StoreError, UserId,
};

pub(crate) enum Job {
    Purchase {
        reqs: Vec<PurchaseRequest>,
        reply: oneshot::Sender<Result<Vec<PurchaseOutcome>, LedgerError>>,
    },
    Resolve {
        order_no: OrderNo,
        user: UserId,
        kind: EventKind,
        reply: oneshot::Sender<Result<Resolution, LedgerError>>,
    },
    Expire {
        max: usize,
        reply: oneshot::Sender<Result<usize, LedgerError>>,
    },
}

impl Job {
    pub(crate) fn weight(&self) -> usize {
        match self {
            Job::Purchase { reqs, .. } => reqs.len().max(1),
            _ => 1,
        }
    }

    /// The answer of a fenced book: UNAVAILABLE to every purchase and resolution, no expiry.
    pub(crate) fn fenced(self) {
        let unavailable = PurchaseOutcome::Rejected(ErrorCode::Unavailable);
        let _ = match self {
            Job::Purchase { reqs, reply } => {
                let outcomes = vec![unavailable; reqs.len()];
                reply.send(Ok(outcomes)).map_err(drop)
            }
            Job::Resolve { reply, .. } => reply.send(Ok(Err(ErrorCode::Unavailable))).map_err(drop),
            Job::Expire { reply, .. } => reply.send(Ok(0)).map_err(drop),
        };
    }

    pub(crate) fn fail(self, err: impl Fn() -> LedgerError) {
        // A caller that went away does not need the answer.
        let _ = match self {
            Job::Purchase { reply, .. } => reply.send(Err(err())).map_err(drop),
            Job::Resolve { reply, .. } => reply.send(Err(err())).map_err(drop),
            Job::Expire { reply, .. } => reply.send(Err(err())).map_err(drop),
        };
    }
}

/// A job's answer, held back until the group's commit.
pub(crate) enum Answer {
    Purchase(
        oneshot::Sender<Result<Vec<PurchaseOutcome>, LedgerError>>,
        Vec<PurchaseOutcome>,
    ),
    Resolve(oneshot::Sender<Result<Resolution, LedgerError>>, Resolution),
    Expire(oneshot::Sender<Result<usize, LedgerError>>, usize),
}

impl Answer {
    pub(crate) fn send(self) {
        let _ = match self {
            Answer::Purchase(tx, v) => tx.send(Ok(v)).map_err(drop),
            Answer::Resolve(tx, v) => tx.send(Ok(v)).map_err(drop),
            Answer::Expire(tx, v) => tx.send(Ok(v)).map_err(drop),
        };
    }

    pub(crate) fn fail(self, err: &LedgerError) {
        let e = || LedgerError::Unavailable(err.to_string());
        let _ = match self {
            Answer::Purchase(tx, _) => tx.send(Err(e())).map_err(drop),
            Answer::Resolve(tx, _) => tx.send(Err(e())).map_err(drop),
            Answer::Expire(tx, _) => tx.send(Err(e())).map_err(drop),
        };
    }
}

pub(crate) fn unavailable(e: StoreError) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}
