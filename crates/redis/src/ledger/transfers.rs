//! Stock moved between the buckets of a sale: out at its source (`transfer_out.lua`), then in
//! at its destination (`transfer_in.lua`). A transfer whose in side did not happen (a crash,
//! a fenced destination, a write the replicas did not confirm) stays pending at its source;
//! [`RedisLedger::finish_transfers`] finishes it: the purchase that finds the sale short
//! calls it first, and so does the expiry worker.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use flashsale_core::buckets::Transfer;
use flashsale_core::limits::BATCH_LEN_MAX;
use flashsale_core::metric_names as names;
use flashsale_core::{BucketTransfers, LedgerError, SkuId};

use super::call::evalsha;
use super::layout::Layout;
use super::setup::RedisLedger;
use crate::codec::as_string;
use crate::conn::{bounded, Timeouts};
use crate::keys::CopyTag;

/// A transfer out that is pending at its source: (source, id, destination, units).
pub(super) type Pending = (CopyTag, String, u16, u64);

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
    /// One transfer: out at its source, then (once the out is confirmed) in at its
    /// destination, then the pending record dropped. Units moved, 0 when the source no
    /// longer had them. Left pending (for [`RedisLedger::finish_transfers`]) when the in
    /// could not be done now.
    pub(super) async fn transfer(&self, layout: &Layout, t: Transfer) -> Result<u64, LedgerError> {
        let src = layout.copy(t.from);
        let keys = self.keys().transfer_out_side(src);
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
        let keys = self.keys().transfer_in_side(dst);
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
            let mut conn = self.conn(src.sku);
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
    pub(super) async fn pending_transfers(
        &self,
        layout: &Layout,
    ) -> Result<Vec<Pending>, LedgerError> {
        let mut pending = Vec::new();
        if layout.is_single() {
            return Ok(pending);
        }
        for src in layout.copies() {
            let mut conn = self.conn(src.sku);
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

    /// Puts a rebuilt bucket's transfers back (its copy was loaded with none): the ids it
    /// took in, and its outs still pending, which `finish_transfers` then carries home.
    pub(super) async fn restore_transfers(
        &self,
        copy: CopyTag,
        transfers: &BucketTransfers,
    ) -> Result<(), LedgerError> {
        if transfers.ins.is_empty() && transfers.pending.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for chunk in transfers.ins.chunks(BATCH_LEN_MAX) {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(self.keys.transfers_in(copy));
            for id in chunk {
                cmd.arg(id).arg("restored");
            }
            pipe.add_command(cmd).ignore();
        }
        for chunk in transfers.pending.chunks(BATCH_LEN_MAX) {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(self.keys.transfers_out(copy));
            for (id, to, units) in chunk {
                cmd.arg(id).arg(format!("{to}:{units}"));
            }
            pipe.add_command(cmd).ignore();
        }
        let mut conn = self.conn(copy.sku);
        bounded(Timeouts::HOT.call, pipe.query_async::<()>(&mut conn)).await
    }
}
