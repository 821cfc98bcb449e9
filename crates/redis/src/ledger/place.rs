//! A salt per bucket, so that a sale's buckets land on distinct primaries of the cluster.

use flashsale_core::{LedgerError, SkuId};
use redis::Value;

use super::setup::RedisLedger;
use crate::codec::as_string;
use crate::conn::{bounded, Timeouts};
use crate::keys::slot;
use crate::placement;

impl RedisLedger {
    /// A salt per bucket putting `n` buckets of `sku` on distinct primaries (one Redis: all
    /// on it).
    pub(crate) async fn place(&self, sku: SkuId, n: u16) -> Result<Vec<u32>, LedgerError> {
        let slots = self.primary_slots(sku).await?;
        let primaries = slots.iter().map(|s| s.2).max().map_or(1, |m| m + 1);
        let primary_of = |tag: &str| {
            let s = slot(&format!("{{{tag}}}"));
            slots
                .iter()
                .find(|&&(lo, hi, _)| lo <= s && s <= hi)
                .map_or(0, |r| r.2)
        };
        Ok(placement::place(sku, n, primaries, primary_of))
    }

    /// The slot ranges of the cluster that holds `sku`, with the index of their primary
    /// (`CLUSTER SLOTS`); empty on one Redis.
    async fn primary_slots(&self, sku: SkuId) -> Result<Vec<(u16, u16, usize)>, LedgerError> {
        let mut conn = self.conn(sku);
        if !conn.is_cluster() {
            return Ok(Vec::new());
        }
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let reply: Value = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await?;
        parse_slots(&reply).ok_or_else(|| {
            LedgerError::Internal(format!("unexpected CLUSTER SLOTS reply {reply:?}"))
        })
    }
}

/// `CLUSTER SLOTS`: `[[start, end, [ip, port, id…], replicas…]…]` as (start, end, primary
/// index), primaries numbered in order of first appearance.
fn parse_slots(reply: &Value) -> Option<Vec<(u16, u16, usize)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut primaries: Vec<(String, i64)> = Vec::new();
    let mut out = Vec::new();
    for range in ranges {
        let Value::Array(f) = range else { return None };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(node))) =
            (f.first(), f.get(1), f.get(2))
        else {
            return None;
        };
        let (Some(host), Some(Value::Int(port))) = (node.first().and_then(as_string), node.get(1))
        else {
            return None;
        };
        let key = (host, *port);
        let index = match primaries.iter().position(|p| *p == key) {
            Some(i) => i,
            None => {
                primaries.push(key);
                primaries.len() - 1
            }
        };
        out.push((u16::try_from(*lo).ok()?, u16::try_from(*hi).ok()?, index));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_name_each_primary_once() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
            ])
        };
        let range = |lo: i64, hi: i64, port: i64| {
            Value::Array(vec![
                Value::Int(lo),
                Value::Int(hi),
                node(port),
                node(port + 3),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16000, 7002),
            range(16001, 16383, 7000),
        ]);
        let slots = parse_slots(&reply).expect("parsed");
        assert_eq!(
            slots,
            vec![
                (0, 5460, 0),
                (5461, 10922, 1),
                (10923, 16000, 2),
                (16001, 16383, 0)
            ]
        );
        assert_eq!(parse_slots(&Value::Nil), None);
    }
}
