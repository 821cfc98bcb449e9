//! A copy's hash and every entry of its stream read in one atomic step (for the
//! reconciler), and orders read back from the database put into a rebuilt copy.

use std::collections::HashMap;

use flashsale_core::ledger::HotSnapshot;
use flashsale_core::limits::BATCH_LEN_MAX;
use flashsale_core::{CopyAt, Counters, HotOrder, LedgerError, SaleState};
use redis::Value;

use super::setup::RedisLedger;
use crate::codec::{as_int, as_string, parse_entries, unexpected, Entry, Item};
use crate::keys::CopyTag;

/// A sale's hash and every event of its stream, read in one atomic step (for the reconciler).
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub counters: Counters,
    pub epoch: u64,
    /// Every field of the sale hash, as stored.
    pub fields: HashMap<String, String>,
    /// Every entry of the events stream (not yet trimmed), in stream order.
    pub events: Vec<Entry>,
    /// How long the copy has been fenced; `None` when it is open.
    pub fenced_ms: Option<u64>,
}

impl RedisLedger {
    /// The sale hash and all events of its stream, atomically; `None` when not warm.
    pub async fn snapshot(
        &self,
        copy: impl Into<CopyTag>,
    ) -> Result<Option<Snapshot>, LedgerError> {
        let copy: CopyTag = copy.into();
        let sku = copy.sku;
        let mut inv = self.scripts.snapshot.prepare_invoke();
        inv.key(self.keys.sale(copy)).key(self.keys.events(copy));
        let reply: Vec<Value> = self.run("snapshot", copy, &inv).await?;
        let (Some(Value::Array(flat)), Some(events), Some(fenced)) =
            (reply.first(), reply.get(1), reply.get(2).and_then(as_int))
        else {
            return Err(unexpected("snapshot", &Value::Array(reply)));
        };
        if flat.is_empty() {
            return Ok(None);
        }
        let fields: HashMap<String, String> = flat
            .chunks(2)
            .filter_map(|kv| Some((as_string(kv.first()?)?, as_string(kv.get(1)?)?)))
            .collect();
        let num = |name: &str| -> Result<u64, LedgerError> {
            fields
                .get(name)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| LedgerError::Internal(format!("sale {sku}: bad field {name}")))
        };
        Ok(Some(Snapshot {
            counters: Counters {
                total: num("total")?,
                available: num("available")?,
                reserved: num("reserved")?,
                sold: num("sold")?,
                seq: num("seq")?,
            },
            epoch: num("epoch")?,
            events: parse_entries(copy, events)?,
            fields,
            fenced_ms: u64::try_from(fenced).ok(),
        }))
    }

    /// One copy's [`HotSnapshot`]: its entries sorted into events (by epoch and seq),
    /// transfer sides (stream order) and entries that are neither.
    pub(crate) async fn copy_snapshot(
        &self,
        copy: CopyTag,
    ) -> Result<Option<HotSnapshot>, LedgerError> {
        let Some(snap) = self.snapshot(copy).await? else {
            return Ok(None);
        };
        let (mut events, mut transfers, mut bad_entries) = (Vec::new(), Vec::new(), Vec::new());
        for (id, parsed) in snap.events {
            match parsed {
                Ok(Item::Event(e)) => events.push(e),
                Ok(Item::Transfer(t)) => transfers.push(t),
                Err(why) => bad_entries.push((id, why.to_string())),
            }
        }
        events.sort_by_key(|e| (e.epoch, e.seq));
        let state = snap
            .fields
            .get("state")
            .and_then(|s| SaleState::parse(s))
            .ok_or_else(|| LedgerError::Internal(format!("copy {copy}: bad field state")))?;
        Ok(Some(HotSnapshot {
            counters: snap.counters,
            epoch: snap.epoch,
            events,
            transfers,
            bad_entries,
            fenced_ms: snap.fenced_ms,
            state,
        }))
    }

    /// Rebuild: puts orders read back from the system of record into the loaded (fenced)
    /// copy of `epoch` (its order, request, buyer units and hold), in chunks of
    /// `BATCH_LEN_MAX`; orders already present are skipped, so it can be repeated. Counters
    /// are not touched. Returns how many orders were added.
    pub(crate) async fn restore_copy_orders(
        &self,
        at: CopyAt,
        orders: &[HotOrder],
    ) -> Result<usize, LedgerError> {
        let CopyAt { sku, epoch } = at;
        if let Some(other) = orders
            .iter()
            .find(|o| o.sku_id != sku || o.order_no.sku() != sku)
        {
            return Err(LedgerError::Internal(format!(
                "order {} is not of sale {sku}",
                other.order_no
            )));
        }
        // A bucketed sale's copies are restored one bucket at a time (its rebuild): the copy
        // of `epoch`, with the orders it sold.
        let layout = self.layout(sku).await?;
        let copy = layout.copy(flashsale_core::buckets::bucket_of_epoch(epoch, layout.n()));
        let orders: Vec<&HotOrder> = (orders.iter())
            .filter(|o| layout.copy_of_order(&o.order_no) == copy)
            .collect();
        let mut added = 0;
        for chunk in orders.chunks(BATCH_LEN_MAX) {
            let mut inv = self.scripts.restore_orders.prepare_invoke();
            for key in self.keys.copy_state(copy) {
                inv.key(key);
            }
            inv.arg(epoch).arg(chunk.len());
            for o in chunk {
                inv.arg(o.order_no.to_string())
                    .arg(o.user_id.0)
                    .arg(o.request_id.as_str())
                    .arg(o.quantity)
                    .arg(o.status.as_str())
                    .arg(o.deadline_ms)
                    .arg(o.created_at_ms);
            }
            let n: i64 = self.run("restore_orders", copy, &inv).await?;
            added += usize::try_from(n).map_err(|_| LedgerError::AlreadyWarm)?;
        }
        Ok(added)
    }
}
