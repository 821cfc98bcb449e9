//! `HotPurchases` on Redis: a purchase batch, top-down. The sale's layout decides the path:
//! a sale of one bucket is one `purchase.lua` call on its copy; a bucketed sale's batch is
//! split by home bucket, each home judged by one call, and the requests a home answers
//! SOLD_OUT while the other buckets hold stock are judged again once it is brought home
//! (`bucketed`), for at most [`ROUNDS_MAX`] rounds. One call: the copy's keys, the script
//! run as a write (`call`: deadline, NOSCRIPT, the replicas' WAIT), its answer parsed.

use async_trait::async_trait;
use flashsale_core::buckets;
use flashsale_core::{
    ErrorCode, HotPurchases, LedgerError, OrderNo, PurchaseOutcome, PurchaseRequest, SkuId, UserId,
};

use super::bucketed::sold_out;
use super::call::evalsha;
use super::layout::Layout;
use super::setup::RedisLedger;
use crate::codec::decode_order;
use crate::keys::CopyTag;

/// Most rounds of "bring stock home, judge again" for one batch at one home bucket. Each
/// round moves the whole shortfall the others can cover, so a second round is needed only
/// when another caller took the units meanwhile.
pub const ROUNDS_MAX: usize = 4;

#[async_trait]
impl HotPurchases for RedisLedger {
    async fn purchase_batch(
        &self,
        sku: SkuId,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        flashsale_core::ledger::check_batch(sku, reqs)?;
        let layout = self.layout(sku).await?;
        if layout.is_single() {
            return self.purchase_copy(sku.into(), reqs).await;
        }
        self.purchase_bucketed(&layout, reqs).await
    }

    fn lane(&self, sku: SkuId, user: UserId) -> u16 {
        self.buckets
            .as_ref()
            .and_then(|table| table.known(sku))
            .map_or(0, |layout| layout.home(user).bucket)
    }
}

impl RedisLedger {
    /// Judges a batch of a bucketed sale: each buyer at home, all homes at once, answers in
    /// the batch's order. When a home fails, what the other homes accepted is still named
    /// ([`promised`]): the loss journal must hear of every purchase a call wrote.
    async fn purchase_bucketed(
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

    /// One purchase script call on one hot copy (a sale's own, or one of its buckets).
    async fn purchase_copy(
        &self,
        copy: CopyTag,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        let keys = [
            self.keys.sale(copy),
            self.keys.buyers(copy),
            self.keys.requests(copy),
            self.keys.orders(copy),
            self.keys.holds(copy),
            self.keys.events(copy),
        ];
        let mut cmd = evalsha(&self.scripts.purchase, &keys);
        cmd.arg(reqs.len());
        for r in reqs {
            cmd.arg(r.user_id.0)
                .arg(r.request_id.as_str())
                .arg(r.quantity);
        }
        let (reply, acked) = self
            .run_write("purchase", copy, crate::scripts::PURCHASE, &cmd)
            .await?;
        // One flat array, three fields per request (see purchase.lua).
        let flat: Vec<String> = redis::from_redis_value(&reply).map_err(crate::conn::map_err)?;
        if flat.len() != 3 * reqs.len() {
            return Err(LedgerError::Internal(format!(
                "{} result fields for {} requests",
                flat.len(),
                reqs.len()
            )));
        }
        let outcomes = flat
            .chunks_exact(3)
            .map(outcome_of)
            .collect::<Result<Vec<_>, _>>()?;
        let written = accepted_orders(&outcomes);
        if !written.is_empty() {
            self.confirmed(acked, written)?;
        }
        Ok(outcomes)
    }
}

/// One request's `[tag, order_no | code, encoded | ""]` of the purchase reply.
fn outcome_of(entry: &[String]) -> Result<PurchaseOutcome, LedgerError> {
    let bad = || LedgerError::Internal(format!("unexpected purchase result {entry:?}"));
    match entry {
        [tag, order_no, encoded] if tag == "A" || tag == "R" => {
            let order = decode_order(order_no, encoded).map_err(LedgerError::Internal)?;
            Ok(PurchaseOutcome::Accepted {
                order,
                replayed: tag == "R",
            })
        }
        [tag, code, empty] if tag == "X" && empty.is_empty() => ErrorCode::parse(code)
            .map(PurchaseOutcome::Rejected)
            .ok_or_else(bad),
        _ => Err(bad()),
    }
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
