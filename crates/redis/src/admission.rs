//! A sale's admission state in Redis, in the sale's slot (`Keys::admission`: every key carries
//! `{<sku>}`), so it lives, survives and fails over with the sale's hot copy. Every change is
//! one call of `scripts/admission.lua`.

use async_trait::async_trait;
use flashsale_core::admission::{
    hex, seed_from_hex, AdmissionBook, Entered, Entry, EntryWindow, GroupJoin, QueueCounts, Seed,
    Ticket,
};
use flashsale_core::{LedgerError, SkuId, StoreError, UserId};
use redis::{FromRedisValue, Script, Value};

use crate::conn::{bounded, Conn};
use crate::keys::Keys;
use crate::scripts::ADMISSION;

/// Bound on one call: admission is not the purchase path (whose calls fail fast so its breaker
/// opens); a buyer polling its place may wait a little longer, and a slow answer beats a
/// retry that asks again.
const BOOK_CALL: std::time::Duration = std::time::Duration::from_secs(5);
/// Bound on reading a whole pre-queue or entry list.
const BULK_CALL: std::time::Duration = std::time::Duration::from_secs(30);
/// Items per read of a whole list.
const PAGE: usize = 10_000;

/// The admission book of the sales a Redis ledger holds.
#[derive(Clone)]
pub struct RedisAdmission {
    conn: Conn,
    keys: Keys,
    script: std::sync::Arc<Script>,
}

fn store_error(e: LedgerError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn ticket(text: &str) -> Result<Ticket, StoreError> {
    let bad = || StoreError::Internal(format!("admission ticket {text:?}"));
    let (kind, n) = text.split_once(':').ok_or_else(bad)?;
    let n = n.parse().map_err(|_| bad())?;
    match kind {
        "p" => Ok(Ticket { pre: true, n }),
        "a" => Ok(Ticket { pre: false, n }),
        _ => Err(bad()),
    }
}

/// A join's answer: its ticket, or `None` for a full queue.
fn joined(text: &str) -> Result<Option<Ticket>, StoreError> {
    match text {
        "FULL" => Ok(None),
        t => ticket(t).map(Some),
    }
}

impl RedisAdmission {
    pub fn new(conn: Conn, keys: Keys) -> RedisAdmission {
        RedisAdmission {
            conn,
            keys,
            script: std::sync::Arc::new(Script::new(ADMISSION)),
        }
    }

    async fn call<T: FromRedisValue>(
        &self,
        sku: SkuId,
        op: &str,
        args: &[String],
    ) -> Result<T, StoreError> {
        let mut inv = self.script.prepare_invoke();
        for key in self.keys.admission(sku) {
            inv.key(key);
        }
        inv.arg(op);
        for a in args {
            inv.arg(a);
        }
        let mut conn = self.conn.clone();
        bounded(BOOK_CALL, inv.invoke_async(&mut conn))
            .await
            .map_err(store_error)
    }

    async fn cmd<T: FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        self.cmd_within(BOOK_CALL, cmd).await
    }

    async fn cmd_within<T: FromRedisValue>(
        &self,
        limit: std::time::Duration,
        cmd: redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        bounded(limit, cmd.query_async(&mut conn))
            .await
            .map_err(store_error)
    }

    /// A whole list of user ids (the pre-queue, the entries; up to a million, read once per
    /// sale and instance, when it no longer grows) in pages: one answer of a million items
    /// would outlast the connection's response timeout, and hold Redis's one thread while
    /// it is written.
    async fn whole_list(&self, key: String) -> Result<Vec<u64>, StoreError> {
        let read = async {
            let mut all: Vec<u64> = Vec::new();
            loop {
                let from = all.len();
                let cmd = redis::cmd("LRANGE")
                    .arg(&key)
                    .arg(from)
                    .arg(from + PAGE - 1)
                    .clone();
                let page: Vec<u64> = self.cmd(cmd).await?;
                let last = page.len() < PAGE;
                all.extend(page);
                if last {
                    return Ok(all);
                }
            }
        };
        tokio::time::timeout(BULK_CALL, read).await.map_err(|_| {
            StoreError::Unavailable(format!("reading {key} took over {BULK_CALL:?}"))
        })?
    }

    fn key(&self, sku: SkuId, i: usize) -> String {
        self.keys.admission(sku)[i].clone()
    }
}

#[async_trait]
impl AdmissionBook for RedisAdmission {
    async fn commit_seed(&self, sku: SkuId, seed: &Seed) -> Result<Seed, StoreError> {
        let text: String = self.call(sku, "commit_seed", &[hex(seed)]).await?;
        seed_from_hex(&text).ok_or_else(|| StoreError::Internal("stored seed".into()))
    }

    async fn seed(&self, sku: SkuId) -> Result<Option<Seed>, StoreError> {
        let cmd = redis::cmd("HGET").arg(self.key(sku, 0)).arg("seed").clone();
        let text: Option<String> = self.cmd(cmd).await?;
        Ok(text.as_deref().and_then(seed_from_hex))
    }

    /// One script call per run of joins that share a start and a bound (all of a group, but
    /// for a sale changed while its joins queued).
    async fn join_group(
        &self,
        sku: SkuId,
        joins: &[GroupJoin],
    ) -> Result<Vec<Option<Ticket>>, StoreError> {
        let alike = |a: &GroupJoin, b: &GroupJoin| {
            (a.starts_at_ms, a.len_max) == (b.starts_at_ms, b.len_max)
        };
        let mut answers = Vec::with_capacity(joins.len());
        for run in joins.chunk_by(alike) {
            let mut args = Vec::with_capacity(run.len() + 2);
            args.push(run[0].starts_at_ms.max(0).to_string());
            args.push(run[0].len_max.to_string());
            args.extend(run.iter().map(|j| j.user.0.to_string()));
            let texts: Vec<String> = self.call(sku, "join_many", &args).await?;
            for t in &texts {
                answers.push(joined(t)?);
            }
        }
        Ok(answers)
    }

    async fn ticket(&self, sku: SkuId, user: UserId) -> Result<Option<Ticket>, StoreError> {
        let cmd = redis::cmd("HGET").arg(self.key(sku, 1)).arg(user.0).clone();
        let text: Option<String> = self.cmd(cmd).await?;
        text.as_deref().map(ticket).transpose()
    }

    async fn seal(&self, sku: SkuId, starts_at_ms: i64) -> Result<Option<u64>, StoreError> {
        let args = [starts_at_ms.max(0).to_string()];
        let n: i64 = self.call(sku, "seal", &args).await?;
        Ok(u64::try_from(n).ok())
    }

    async fn prequeue(&self, sku: SkuId) -> Result<Vec<UserId>, StoreError> {
        let users = self.whole_list(self.key(sku, 2)).await?;
        Ok(users.into_iter().map(UserId).collect())
    }

    async fn counts(&self, sku: SkuId, lapse_before_ms: i64) -> Result<QueueCounts, StoreError> {
        let args = [lapse_before_ms.max(0).to_string()];
        let v: Vec<u64> = self.call(sku, "counts", &args).await?;
        let [sealed, prequeue, joined_after, cursor, bought, lapsed_through, bought_through] =
            v[..]
        else {
            return Err(StoreError::Internal(format!("admission counts {v:?}")));
        };
        Ok(QueueCounts {
            sealed: sealed == 1,
            prequeue,
            joined_after,
            cursor,
            bought,
            lapsed_through,
            bought_through,
        })
    }

    async fn advance(&self, sku: SkuId, from: u64, to: u64) -> Result<bool, StoreError> {
        let moved: i64 = self
            .call(sku, "advance", &[from.to_string(), to.to_string()])
            .await?;
        Ok(moved == 1)
    }

    async fn admitted_at(&self, sku: SkuId, place: u64) -> Result<(Option<i64>, i64), StoreError> {
        let (at, now): (i64, i64) = self.call(sku, "admitted_at", &[place.to_string()]).await?;
        Ok(((at >= 0).then_some(at), now))
    }

    async fn mark_bought(&self, sku: SkuId, user: UserId, place: u64) -> Result<(), StoreError> {
        let _: i64 = self
            .call(sku, "mark_bought", &[user.0.to_string(), place.to_string()])
            .await?;
        Ok(())
    }

    async fn enter(&self, sku: SkuId, e: Entry, w: EntryWindow) -> Result<Entered, StoreError> {
        let args = [
            e.user_id.0,
            u64::from(e.quantity),
            w.opens_at_ms.max(0) as u64,
            w.closes_at_ms.max(0) as u64,
            w.len_max,
        ]
        .map(|v| v.to_string());
        let v: Value = self.call(sku, "enter", &args).await?;
        entered(e.user_id, v)
    }

    async fn entries(&self, sku: SkuId) -> Result<Vec<Entry>, StoreError> {
        let users = self.whole_list(self.key(sku, 7)).await?;
        let mut entries = Vec::with_capacity(users.len());
        for page in users.chunks(PAGE) {
            let cmd = redis::cmd("HMGET").arg(self.key(sku, 6)).arg(page).clone();
            let quantities: Vec<Option<u32>> = self.cmd(cmd).await?;
            for (&u, q) in page.iter().zip(quantities) {
                let q = q.ok_or_else(|| StoreError::Internal(format!("entry of user {u}")))?;
                entries.push(Entry {
                    user_id: UserId(u),
                    quantity: q,
                });
            }
        }
        Ok(entries)
    }

    async fn entry(&self, sku: SkuId, user: UserId) -> Result<Option<Entry>, StoreError> {
        let cmd = redis::cmd("HGET").arg(self.key(sku, 6)).arg(user.0).clone();
        let quantity: Option<u32> = self.cmd(cmd).await?;
        Ok(quantity.map(|quantity| Entry {
            user_id: user,
            quantity,
        }))
    }

    async fn draw_pos(&self, sku: SkuId) -> Result<u64, StoreError> {
        let cmd = redis::cmd("HGET")
            .arg(self.key(sku, 0))
            .arg("draw_pos")
            .clone();
        let pos: Option<u64> = self.cmd(cmd).await?;
        Ok(pos.unwrap_or(0))
    }

    async fn advance_draw(&self, sku: SkuId, from: u64, to: u64) -> Result<bool, StoreError> {
        let moved: i64 = self
            .call(sku, "advance_draw", &[from.to_string(), to.to_string()])
            .await?;
        Ok(moved == 1)
    }
}

/// The script's answer to `enter`.
fn entered(user: UserId, v: Value) -> Result<Entered, StoreError> {
    let bad = |v: &Value| StoreError::Internal(format!("admission enter: {v:?}"));
    if let Ok(text) = String::from_redis_value(&v) {
        return match text.as_str() {
            "NOT_OPEN" => Ok(Entered::NotOpen),
            "CLOSED" => Ok(Entered::Closed),
            "FULL" => Ok(Entered::Full),
            _ => Err(bad(&v)),
        };
    }
    let (kind, n): (String, u64) = FromRedisValue::from_redis_value(&v).map_err(|_| bad(&v))?;
    match kind.as_str() {
        "N" => Ok(Entered::New(n)),
        "A" => Ok(Entered::Already(Entry {
            user_id: user,
            quantity: n as u32,
        })),
        _ => Err(bad(&v)),
    }
}

impl crate::RedisLedger {
    /// The admission book of this ledger's sales (the main Redis's connection, the same key
    /// prefix).
    pub fn admission(&self) -> RedisAdmission {
        RedisAdmission::new(self.main_conn(), self.keys().clone())
    }
}
