//! One hot copy's scripts but the purchase (a sale's own copy, or one bucket of a sale of
//! several): pay or cancel, hold expiry, load, state, counters.

use flashsale_core::{Counters, ErrorCode, LedgerError, OrderNo, Resolution, Sale, UserId};
use redis::{ScriptInvocation, Value};

use super::call::evalsha;
use super::setup::RedisLedger;
use crate::codec::{as_int, as_string, decode_order, unexpected};
use crate::conn::{bounded, Timeouts};
use crate::keys::CopyTag;

/// Most holds one `expire_due` call may expire (the script's own bound).
pub const EXPIRE_MAX: usize = 10_000;

impl RedisLedger {
    /// Expires at most `max` due holds of one copy: how many, and whether stock came back.
    pub(super) async fn expire_copy(
        &self,
        copy: CopyTag,
        max: usize,
    ) -> Result<(usize, bool), LedgerError> {
        let mut inv = self.scripts.expire_due.prepare_invoke();
        self.resolve_keys(&mut inv, copy);
        inv.arg(max.min(EXPIRE_MAX));
        let reply: Vec<i64> = self.run("expire_due", &inv).await?;
        let [expired, restocked] = reply[..] else {
            return Err(LedgerError::Internal(format!(
                "unexpected expire_due reply {reply:?}"
            )));
        };
        let expired =
            usize::try_from(expired).map_err(|_| LedgerError::Internal("negative count".into()))?;
        Ok((expired, restocked == 1))
    }

    /// The counters of one copy, `None` when it is not warm.
    pub(crate) async fn counters_copy(
        &self,
        copy: CopyTag,
    ) -> Result<Option<Counters>, LedgerError> {
        let sku = copy.sku;
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("HMGET")
            .arg(self.keys.sale(copy))
            .arg(&["total", "available", "reserved", "sold", "seq"])
            .clone();
        let v: Vec<Option<u64>> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        match v[..] {
            [None, ..] => Ok(None),
            [Some(total), Some(available), Some(reserved), Some(sold), Some(seq)] => {
                Ok(Some(Counters {
                    total,
                    available,
                    reserved,
                    sold,
                    seq,
                }))
            }
            _ => Err(LedgerError::Internal(format!(
                "sale {sku}: incomplete counters {v:?}"
            ))),
        }
    }

    /// Loads one copy: a sale's own, or one bucket of a sale of several (`layout`: the
    /// sale's bucket count and salts, stored with every bucket).
    pub(crate) async fn load_copy(
        &self,
        copy: CopyTag,
        sale: &Sale,
        counters: &Counters,
        epoch: u64,
        layout: Option<(u16, &str)>,
    ) -> Result<(), LedgerError> {
        let sku = sale.sku_id;
        let mut inv = self.scripts.load.prepare_invoke();
        for key in self.keys.copy_state(copy) {
            inv.key(key);
        }
        if layout.is_some() {
            // A bucket's transfers belong to its copy: a new copy starts with none.
            inv.key(self.keys.transfers_out(copy))
                .key(self.keys.transfers_in(copy));
        }
        inv.arg(sku.0)
            .arg(counters.total)
            .arg(counters.available)
            .arg(counters.reserved)
            .arg(counters.sold)
            .arg(counters.seq)
            .arg(epoch)
            .arg(sale.per_user_limit)
            .arg(sale.mode.as_str())
            .arg(sale.payment_timeout_ms)
            .arg(sale.starts_at_ms)
            .arg(sale.ends_at_ms)
            .arg(sale.state.as_str());
        if let Some((buckets, salts)) = layout {
            inv.arg(buckets).arg(salts);
        }
        let answer: String = self.run("load", &inv).await?;
        if answer == "ALREADY_WARM" {
            return Err(LedgerError::AlreadyWarm);
        }
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("SADD").arg(self.keys.sales()).arg(sku.0).clone();
        let _: i64 = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        Ok(())
    }

    fn resolve_keys<'a>(&self, inv: &mut ScriptInvocation<'a>, copy: CopyTag) {
        for key in self.resolve_key_list(copy) {
            inv.key(key);
        }
    }

    fn resolve_key_list(&self, copy: CopyTag) -> [String; 5] {
        [
            self.keys.sale(copy),
            self.keys.buyers(copy),
            self.keys.orders(copy),
            self.keys.holds(copy),
            self.keys.events(copy),
        ]
    }

    /// Pay (`kind` "paid") or cancel ("cancelled"); `name` labels the script's latency.
    pub(super) async fn resolve(
        &self,
        name: &'static str,
        kind: &'static str,
        order_no: &OrderNo,
        user: UserId,
    ) -> Result<Resolution, LedgerError> {
        let sku = order_no.sku();
        let copy = self.layout(sku).await?.copy_of_order(order_no);
        let mut cmd = evalsha(&self.scripts.resolve, &self.resolve_key_list(copy));
        cmd.arg(order_no.to_string()).arg(user.0).arg(kind);
        let (reply, acked) = self
            .run_write(name, copy, crate::scripts::RESOLVE, &cmd)
            .await?;
        let reply: Vec<Value> = redis::from_redis_value(&reply).map_err(crate::conn::map_err)?;
        let head = reply.first().and_then(as_string);
        match head.as_deref() {
            Some("OK" | "R") => {
                let encoded = reply.get(1).and_then(as_string).unwrap_or_default();
                let order =
                    decode_order(&order_no.to_string(), &encoded).map_err(LedgerError::Internal)?;
                self.confirmed(acked, vec![*order_no])?;
                if reply.get(2).and_then(as_int) == Some(1) {
                    self.announce_restock(sku).await;
                }
                Ok(Ok(order))
            }
            Some("X") => Ok(Err(code_of(reply.get(1))?)),
            _ => Err(unexpected(name, &Value::Array(reply))),
        }
    }

    /// `set_state.lua`'s answer: applied or skipped; a fenced copy is `Unavailable` (its
    /// rebuild opens it in the database's state).
    pub(super) async fn state_answer(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<bool, LedgerError> {
        match self.run::<String>("set_state", inv).await?.as_str() {
            "OK" => Ok(true),
            "SKIPPED" => Ok(false),
            other => Err(LedgerError::Unavailable(format!(
                "the sale's hot copy is {other}: a rebuild is under way"
            ))),
        }
    }
}

fn code_of(v: Option<&Value>) -> Result<ErrorCode, LedgerError> {
    let text = v.and_then(as_string).unwrap_or_default();
    ErrorCode::parse(&text)
        .ok_or_else(|| LedgerError::Internal(format!("script answered unknown code {text:?}")))
}
