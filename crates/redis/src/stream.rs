//! Reading a sale's event stream, for the persister: consumer group, pending entries,
//! claim, ack, trim, and the per-sale lease that makes one persister the writer of a sale.
//!
//! A `StreamReader` has its own connection, never the one that serves purchases: a blocking
//! XREADGROUP holds its connection for up to `block_ms`, and the response timeout of this
//! connection is longer than the longest block. Commands sent on the same reader while a
//! blocking read is in flight wait for it; a persister that renews leases while it blocks
//! should keep `block_ms` well below the lease TTL (or use two readers).

use std::time::Duration;

use flashsale_core::{LedgerError, SaleState, SkuId};

use crate::ledger::Layout;
use redis::{Cmd, FromRedisValue, Script, Value};

use crate::codec::{as_int, as_string, parse_entries, unexpected, Entry};
use crate::conn::{bounded, Conn, Timeouts};
use crate::keys::{CopyTag, Keys};
use crate::scripts::{LEASE_ACQUIRE, LEASE_RELEASE};

/// The consumer group of the persisters.
pub const GROUP: &str = "persister";
/// Longest BLOCK of `read_new`.
pub const BLOCK_MAX_MS: u64 = 5_000;
/// Largest COUNT of one read or claim.
pub const COUNT_MAX: usize = 10_000;

const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_millis(300),
    response: Duration::from_millis(BLOCK_MAX_MS + 2_000),
    call: Duration::from_secs(2),
};

/// The pending entries of the group on one sale's stream (XPENDING summary form).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingSummary {
    pub count: u64,
    pub min_id: Option<String>,
    pub max_id: Option<String>,
    /// Consumer name and how many entries it holds.
    pub consumers: Vec<(String, u64)>,
}

/// What XAUTOCLAIM took over.
#[derive(Debug, Clone, Default)]
pub struct AutoClaimed {
    /// Cursor for the next call; "0-0" when the whole pending list was scanned.
    pub next: String,
    /// Entries now owned by this consumer (delivery count incremented).
    pub entries: Vec<Entry>,
    /// Ids that were pending but no longer exist in the stream (Redis drops them from the PEL).
    pub deleted: Vec<String>,
}

/// One consumer of the persister group, on a connection of its own.
pub struct StreamReader {
    conn: Conn,
    keys: Keys,
    consumer: String,
    lease_acquire: Script,
    lease_release: Script,
}

impl StreamReader {
    /// `consumer_name` names this instance in the group (stable across restarts of one
    /// instance, so it finds its own pending entries again).
    pub async fn connect(
        url: &str,
        prefix: &str,
        consumer_name: &str,
    ) -> Result<StreamReader, LedgerError> {
        let keys = Keys::new(prefix).map_err(LedgerError::Internal)?;
        if consumer_name.is_empty() || consumer_name.len() > 200 {
            return Err(LedgerError::Internal(
                "consumer name must be 1..=200 bytes".into(),
            ));
        }
        Ok(StreamReader {
            conn: Conn::connect(url, TIMEOUTS).await?,
            keys,
            consumer: consumer_name.to_owned(),
            lease_acquire: Script::new(LEASE_ACQUIRE),
            lease_release: Script::new(LEASE_RELEASE),
        })
    }

    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd, limit: Duration) -> Result<T, LedgerError> {
        let mut conn = self.conn.clone();
        bounded(limit, cmd.query_async(&mut conn)).await
    }

    /// Creates the group on the sale's stream (and the stream, MKSTREAM) reading from the
    /// start, so no event written before the group existed is missed; an existing group is
    /// left as it is.
    pub async fn ensure_group(&self, copy: impl Into<CopyTag>) -> Result<(), LedgerError> {
        let copy: CopyTag = copy.into();
        self.ensure_group_at(copy, "0").await
    }

    /// Like `ensure_group`, from `start_id` ("$" = only new entries, "0" = everything).
    pub async fn ensure_group_at(
        &self,
        copy: impl Into<CopyTag>,
        start_id: &str,
    ) -> Result<(), LedgerError> {
        let copy: CopyTag = copy.into();
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(self.keys.events(copy))
            .arg(GROUP)
            .arg(start_id)
            .arg("MKSTREAM");
        match self.query::<Value>(&cmd, TIMEOUTS.call).await {
            Ok(_) => Ok(()),
            Err(LedgerError::Internal(msg)) if msg.contains("BUSYGROUP") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Entries delivered to this consumer and not yet acknowledged (after a restart).
    pub async fn read_own_pending(
        &self,
        copy: impl Into<CopyTag>,
        count: usize,
    ) -> Result<Vec<Entry>, LedgerError> {
        self.read_group(copy.into(), count, None, "0").await
    }

    /// New entries for this consumer; waits up to `block_ms` (capped at `BLOCK_MAX_MS`, 0 =
    /// do not block) when there are none.
    pub async fn read_new(
        &self,
        copy: impl Into<CopyTag>,
        count: usize,
        block_ms: u64,
    ) -> Result<Vec<Entry>, LedgerError> {
        let block = (block_ms > 0).then(|| block_ms.min(BLOCK_MAX_MS));
        self.read_group(copy.into(), count, block, ">").await
    }

    async fn read_group(
        &self,
        copy: CopyTag,
        count: usize,
        block_ms: Option<u64>,
        from: &str,
    ) -> Result<Vec<Entry>, LedgerError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg(GROUP).arg(&self.consumer);
        cmd.arg("COUNT").arg(count.clamp(1, COUNT_MAX));
        if let Some(ms) = block_ms {
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS").arg(self.keys.events(copy)).arg(from);
        let limit = TIMEOUTS.call + Duration::from_millis(block_ms.unwrap_or(0));
        let reply = match self.query::<Value>(&cmd, limit).await {
            Err(LedgerError::Internal(msg)) if msg.contains("NOGROUP") => {
                self.ensure_group(copy).await?;
                self.query::<Value>(&cmd, limit).await?
            }
            other => other?,
        };
        // Nil (timed out) or [[key, entries]] (RESP2), or a map {key: entries} (RESP3).
        match &reply {
            Value::Nil => Ok(Vec::new()),
            Value::Array(streams) => match streams.first() {
                None => Ok(Vec::new()),
                Some(Value::Array(pair)) if pair.len() == 2 => parse_entries(copy, &pair[1]),
                Some(_) => Err(unexpected("XREADGROUP", &reply)),
            },
            Value::Map(streams) => match streams.first() {
                None => Ok(Vec::new()),
                Some((_, entries)) => parse_entries(copy, entries),
            },
            _ => Err(unexpected("XREADGROUP", &reply)),
        }
    }

    /// Takes over entries pending longer than `min_idle_ms` with any consumer (a persister
    /// that died), scanning from the start of the pending list.
    pub async fn autoclaim(
        &self,
        copy: impl Into<CopyTag>,
        min_idle_ms: u64,
        count: usize,
    ) -> Result<AutoClaimed, LedgerError> {
        let copy: CopyTag = copy.into();
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(self.keys.events(copy))
            .arg(GROUP)
            .arg(&self.consumer)
            .arg(min_idle_ms)
            .arg("0-0")
            .arg("COUNT")
            .arg(count.clamp(1, COUNT_MAX));
        let reply: Vec<Value> = self.query(&cmd, TIMEOUTS.call).await?;
        let next = reply.first().and_then(as_string);
        let (Some(next), Some(entries)) = (next, reply.get(1)) else {
            return Err(unexpected("XAUTOCLAIM", &Value::Array(reply)));
        };
        let deleted = match reply.get(2) {
            Some(Value::Array(ids)) => ids.iter().filter_map(as_string).collect(),
            _ => Vec::new(),
        };
        Ok(AutoClaimed {
            next,
            entries: parse_entries(copy, entries)?,
            deleted,
        })
    }

    /// A persister's turn on `copy`: takes or renews the lease for `ttl_ms` and, once held,
    /// makes sure the consumer group exists. True when `owner` holds the lease.
    pub async fn hold(
        &self,
        copy: impl Into<CopyTag>,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, LedgerError> {
        let copy: CopyTag = copy.into();
        if !self.acquire_lease(copy, owner, ttl_ms).await? {
            return Ok(false);
        }
        self.ensure_group(copy).await?;
        Ok(true)
    }

    /// Done with the entries `ids` of `copy` (stored in the database, in stream order):
    /// forgets the pending records of the transfers whose in sides were stored (`outs`: each
    /// one's source and id), then acknowledges the entries and trims the stream below the
    /// last. The records go first, so a failure leaves the entries pending and their
    /// redelivery does it all again.
    pub async fn commit(
        &self,
        copy: impl Into<CopyTag>,
        ids: &[String],
        outs: &[(CopyTag, &str)],
    ) -> Result<(), LedgerError> {
        let copy: CopyTag = copy.into();
        for &(source, id) in outs {
            self.drop_pending_out(source, id).await?;
        }
        self.ack(copy, ids).await?;
        if let Some(last) = ids.last() {
            self.trim_below(copy, last).await?;
        }
        Ok(())
    }

    /// Acknowledges entries (after their batch committed); returns how many were pending.
    pub async fn ack(&self, copy: impl Into<CopyTag>, ids: &[String]) -> Result<u64, LedgerError> {
        let copy: CopyTag = copy.into();
        if ids.is_empty() {
            return Ok(0);
        }
        let mut cmd = redis::cmd("XACK");
        cmd.arg(self.keys.events(copy)).arg(GROUP).arg(ids);
        self.query(&cmd, TIMEOUTS.call).await
    }

    /// Forgets a transfer's pending record at its source `copy` (its in is stored in the
    /// database); true when it was there.
    pub async fn drop_pending_out(
        &self,
        copy: impl Into<CopyTag>,
        id: &str,
    ) -> Result<bool, LedgerError> {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(self.keys.transfers_out(copy.into())).arg(id);
        Ok(self.query::<i64>(&cmd, TIMEOUTS.call).await? == 1)
    }

    /// Removes entries with ids below `min_id` (exact XTRIM MINID); returns how many. The
    /// caller passes an id every group has acknowledged.
    pub async fn trim_below(
        &self,
        copy: impl Into<CopyTag>,
        min_id: &str,
    ) -> Result<u64, LedgerError> {
        let copy: CopyTag = copy.into();
        let ok = min_id.split('-').count() <= 2
            && min_id
                .split('-')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !ok {
            return Err(LedgerError::Internal(format!("bad stream id {min_id:?}")));
        }
        let mut cmd = redis::cmd("XTRIM");
        cmd.arg(self.keys.events(copy)).arg("MINID").arg(min_id);
        self.query(&cmd, TIMEOUTS.call).await
    }

    /// How many entries are delivered and not acknowledged, and by whom.
    pub async fn pending_summary(
        &self,
        copy: impl Into<CopyTag>,
    ) -> Result<PendingSummary, LedgerError> {
        let copy: CopyTag = copy.into();
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(self.keys.events(copy)).arg(GROUP);
        let reply: Vec<Value> = self.query(&cmd, TIMEOUTS.call).await?;
        let count = reply.first().and_then(as_int);
        let Some(count) = count.and_then(|c| u64::try_from(c).ok()) else {
            return Err(unexpected("XPENDING", &Value::Array(reply)));
        };
        let consumers = match reply.get(3) {
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(|c| match c {
                    Value::Array(pair) => Some((
                        as_string(pair.first()?)?,
                        u64::try_from(as_int(pair.get(1)?)?).ok()?,
                    )),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Ok(PendingSummary {
            count,
            min_id: reply.get(1).and_then(as_string),
            max_id: reply.get(2).and_then(as_string),
            consumers,
        })
    }

    /// How many times a pending entry was delivered; `None` when it is not pending.
    pub async fn delivery_count(
        &self,
        copy: impl Into<CopyTag>,
        id: &str,
    ) -> Result<Option<u64>, LedgerError> {
        let copy: CopyTag = copy.into();
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(self.keys.events(copy))
            .arg(GROUP)
            .arg(id)
            .arg(id)
            .arg(1);
        let reply: Vec<Vec<Value>> = self.query(&cmd, TIMEOUTS.call).await?;
        Ok(reply
            .first()
            .and_then(|row| row.get(3))
            .and_then(as_int)
            .and_then(|n| u64::try_from(n).ok()))
    }

    /// Entries in the sale's stream (XLEN): written and not yet trimmed.
    pub async fn backlog(&self, copy: impl Into<CopyTag>) -> Result<u64, LedgerError> {
        let copy: CopyTag = copy.into();
        let mut cmd = redis::cmd("XLEN");
        cmd.arg(self.keys.events(copy));
        self.query(&cmd, TIMEOUTS.call).await
    }

    /// The hot copy's operator state and `seq`; None when the sale is not in Redis.
    pub async fn hot_state(
        &self,
        copy: impl Into<CopyTag>,
    ) -> Result<Option<(SaleState, u64)>, LedgerError> {
        let copy: CopyTag = copy.into();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.keys.sale(copy)).arg("state").arg("seq");
        let (state, seq): (Option<String>, Option<u64>) = self.query(&cmd, TIMEOUTS.call).await?;
        let Some((state, seq)) = state.zip(seq) else {
            return Ok(None);
        };
        let state = SaleState::parse(&state)
            .ok_or_else(|| LedgerError::Internal(format!("copy {copy}: bad state {state:?}")))?;
        Ok(Some((state, seq)))
    }

    /// The hot copy's `seq` (the sale hash's); None when the sale is not in Redis.
    pub async fn hot_seq(&self, copy: impl Into<CopyTag>) -> Result<Option<u64>, LedgerError> {
        let copy: CopyTag = copy.into();
        let mut cmd = redis::cmd("HGET");
        cmd.arg(self.keys.sale(copy)).arg("seq");
        let seq: Option<u64> = self.query(&cmd, TIMEOUTS.call).await?;
        Ok(seq)
    }

    /// Where `sku`'s buckets live, read from its bucket 0 copy (the sale's own): one bucket
    /// when the copy does not say otherwise; `None` when the sale has no hot copy.
    pub async fn layout(&self, sku: SkuId) -> Result<Option<Layout>, LedgerError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.keys.sale(sku))
            .arg("epoch")
            .arg("buckets")
            .arg("salts");
        let got: Vec<Option<String>> = self.query(&cmd, TIMEOUTS.call).await?;
        match &got[..] {
            [None, ..] => Ok(None),
            [Some(_), Some(n), Some(salts)] => Layout::parse(sku, n, salts)
                .map(Some)
                .ok_or_else(|| LedgerError::Internal(format!("sale {sku}: bad buckets {n:?}"))),
            _ => Ok(Some(Layout::single(sku))),
        }
    }

    /// Takes the sale's persister lease for `ttl_ms`, or renews it when `owner` holds it.
    /// True when `owner` holds the lease afterwards.
    pub async fn acquire_lease(
        &self,
        copy: CopyTag,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<bool, LedgerError> {
        let mut inv = self.lease_acquire.prepare_invoke();
        inv.key(self.keys.lease(copy)).arg(owner).arg(ttl_ms);
        let mut conn = self.conn.clone();
        let held: i64 = bounded(TIMEOUTS.call, inv.invoke_async(&mut conn)).await?;
        Ok(held == 1)
    }

    /// Gives the lease up when `owner` holds it; true when it did.
    pub async fn release_lease(&self, copy: CopyTag, owner: &str) -> Result<bool, LedgerError> {
        let mut inv = self.lease_release.prepare_invoke();
        inv.key(self.keys.lease(copy)).arg(owner);
        let mut conn = self.conn.clone();
        let released: i64 = bounded(TIMEOUTS.call, inv.invoke_async(&mut conn)).await?;
        Ok(released == 1)
    }
}
