//! The gateway's storage: the blacklist of users and client IPs, the sales that require a
//! purchase token, the risk check's lists (users the fallback rule `allowlist` admits, and
//! sales with a fallback rule of their own), used purchase tokens and `Idempotency-Key`
//! bindings, behind [`BlacklistStore`].
//!
//! Redis sets for the Redis ledger ([`RedisBlacklist`]: `<prefix>:blacklist` holds user ids,
//! `<prefix>:blacklist:ip` addresses, `<prefix>:token_sales` skus; never touched by a script;
//! `<prefix>:risk_allow` and the hash `<prefix>:risk_fallback` for the risk check), the
//! database for the embedded ledger ([`SqliteBlacklist`]: `blacklist`, `sale_guards`,
//! `risk_allowlist`), memory for tests ([`MemoryBlacklist`]). The server keeps a copy per
//! instance and answers HTTP from it; this module does no HTTP.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use flashsale_core::clock::now_ms;
use flashsale_core::{RequestKey, SkuId, UserId};
use flashsale_redis::conn::{Conn, Timeouts};
use flashsale_store::SqliteStore;

/// Most entries of each set loaded into the cache.
pub const ENTRIES_MAX: usize = 1_000_000;

/// What the gateway checks without I/O.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlacklistSnapshot {
    pub users: HashSet<u64>,
    pub ips: HashSet<IpAddr>,
    pub token_sales: HashSet<u64>,
    /// Users the risk fallback rule `allowlist` admits.
    pub risk_allow: HashSet<u64>,
    /// Sales with a risk fallback rule of their own, as stored (the rule's text; the
    /// server reads it as its risk check's fallback rule and skips what it cannot read).
    pub risk_fallback: HashMap<u64, String>,
}

/// Where the blacklist, the token-sale flags and the risk lists live, and where used purchase
/// tokens are remembered ([`BlacklistStore::once`]).
#[async_trait]
pub trait BlacklistStore: Send + Sync + 'static {
    async fn load(&self) -> Result<BlacklistSnapshot, String>;
    async fn set_user(&self, user: UserId, blocked: bool) -> Result<(), String>;
    async fn set_ip(&self, ip: IpAddr, blocked: bool) -> Result<(), String>;
    async fn set_token_sale(&self, sku: SkuId, on: bool) -> Result<(), String>;
    /// Puts a user on the risk allowlist (`on`) or takes it off.
    async fn set_risk_allowed(&self, user: UserId, on: bool) -> Result<(), String>;
    /// Sets a sale's own risk fallback rule, or drops it (`None`: the instance's rule).
    async fn set_risk_fallback(&self, sku: SkuId, rule: Option<&str>) -> Result<(), String>;
    /// Where used purchase tokens and `Idempotency-Key` bindings are remembered: with the
    /// lists for a store every instance shares (Redis), in this process otherwise.
    fn once(&self) -> &dyn OnceStore;
}

/// What must be remembered once for every instance that answers a sale: used purchase
/// tokens and `Idempotency-Key` bindings.
#[async_trait]
pub trait OnceStore: Send + Sync {
    /// Marks a purchase token used by request `key`; true when it was unused, or used by
    /// this same request (a retry). Remembered for `ttl` (the token's remaining life).
    async fn consume_token(&self, jti: &str, key: &str, ttl: Duration) -> Result<bool, String>;
    /// Binds an `Idempotency-Key` to the sale it is first used on (`to.sku`), for `to.ttl`,
    /// unless its user holds `to.per_user` live bindings already (the server answers what it
    /// gets).
    async fn bind_key(&self, key: &RequestKey, to: KeyBind) -> Result<Binding, String>;
}

/// Where an `Idempotency-Key` is bound: its sale, for how long, and how many live bindings
/// one user may hold.
#[derive(Debug, Clone, Copy)]
pub struct KeyBind {
    pub sku: SkuId,
    pub ttl: Duration,
    pub per_user: usize,
}

/// Used tokens and key bindings in this process's memory: where one instance answers every
/// request (the embedded deployment, tests).
#[derive(Default)]
pub struct LocalOnce {
    tokens: UsedTokens,
    keys: MemoryBindings,
}

#[async_trait]
impl OnceStore for LocalOnce {
    async fn consume_token(&self, jti: &str, key: &str, ttl: Duration) -> Result<bool, String> {
        Ok(self.tokens.consume(jti, key, ttl))
    }
    async fn bind_key(&self, key: &RequestKey, to: KeyBind) -> Result<Binding, String> {
        Ok(self.keys.bind(key, to.sku, to.ttl, to.per_user))
    }
}

/// Used purchase tokens held in memory (one instance owns them all: embedded, tests).
#[derive(Default)]
pub struct UsedTokens {
    used: Mutex<HashMap<String, (String, Instant)>>,
}

/// Used tokens remembered at most; expired ones are swept first when full.
const USED_MAX: usize = 1_000_000;

impl UsedTokens {
    pub fn consume(&self, jti: &str, request_key: &str, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut used = self.used.lock().expect("used tokens lock");
        if used.len() >= USED_MAX {
            used.retain(|_, (_, until)| *until > now);
            if used.len() >= USED_MAX {
                return false;
            }
        }
        match used.get(jti) {
            Some((key, until)) if *until > now => key == request_key,
            _ => {
                used.insert(jti.to_owned(), (request_key.to_owned(), now + ttl));
                true
            }
        }
    }
}

/// In memory only: the default of the server's state and of unit tests.
#[derive(Default)]
pub struct MemoryBlacklist {
    snapshot: Mutex<BlacklistSnapshot>,
    once: LocalOnce,
}

impl MemoryBlacklist {
    /// Changes the snapshot under its lock.
    fn edit(&self, change: impl FnOnce(&mut BlacklistSnapshot)) -> Result<(), String> {
        change(&mut self.snapshot.lock().expect("blacklist lock"));
        Ok(())
    }
}

#[async_trait]
impl BlacklistStore for MemoryBlacklist {
    async fn load(&self) -> Result<BlacklistSnapshot, String> {
        Ok(self.snapshot.lock().expect("blacklist lock").clone())
    }
    async fn set_user(&self, user: UserId, blocked: bool) -> Result<(), String> {
        self.edit(|s| toggle(&mut s.users, user.0, blocked))
    }
    async fn set_ip(&self, ip: IpAddr, blocked: bool) -> Result<(), String> {
        self.edit(|s| toggle(&mut s.ips, ip, blocked))
    }
    async fn set_token_sale(&self, sku: SkuId, on: bool) -> Result<(), String> {
        self.edit(|s| toggle(&mut s.token_sales, sku.0, on))
    }
    async fn set_risk_allowed(&self, user: UserId, on: bool) -> Result<(), String> {
        self.edit(|s| toggle(&mut s.risk_allow, user.0, on))
    }
    async fn set_risk_fallback(&self, sku: SkuId, rule: Option<&str>) -> Result<(), String> {
        self.edit(|s| match rule {
            Some(rule) => _ = s.risk_fallback.insert(sku.0, rule.to_owned()),
            None => _ = s.risk_fallback.remove(&sku.0),
        })
    }
    fn once(&self) -> &dyn OnceStore {
        &self.once
    }
}

fn toggle<T: std::hash::Hash + Eq>(set: &mut HashSet<T>, v: T, on: bool) {
    if on {
        set.insert(v);
    } else {
        set.remove(&v);
    }
}

/// The embedded deployment: the SQLite system of record.
pub struct SqliteBlacklist {
    pub store: Arc<SqliteStore>,
    once: LocalOnce,
}

impl SqliteBlacklist {
    pub fn new(store: Arc<SqliteStore>) -> SqliteBlacklist {
        SqliteBlacklist {
            store,
            once: LocalOnce::default(),
        }
    }
}

#[async_trait]
impl BlacklistStore for SqliteBlacklist {
    async fn load(&self) -> Result<BlacklistSnapshot, String> {
        let mut s = BlacklistSnapshot::default();
        for (kind, value) in self.store.blacklist().await.map_err(|e| e.to_string())? {
            match kind.as_str() {
                "user" => {
                    if let Ok(u) = value.parse() {
                        s.users.insert(u);
                    }
                }
                _ => {
                    if let Ok(ip) = value.parse() {
                        s.ips.insert(ip);
                    }
                }
            }
        }
        for sku in self.store.token_sales().await.map_err(|e| e.to_string())? {
            s.token_sales.insert(sku.0);
        }
        for user in self
            .store
            .risk_allowlist()
            .await
            .map_err(|e| e.to_string())?
        {
            s.risk_allow.insert(user.0);
        }
        for (sku, rule) in self
            .store
            .risk_fallbacks()
            .await
            .map_err(|e| e.to_string())?
        {
            s.risk_fallback.insert(sku.0, rule);
        }
        Ok(s)
    }
    async fn set_user(&self, user: UserId, blocked: bool) -> Result<(), String> {
        self.store
            .set_blacklisted("user", &user.0.to_string(), blocked, now_ms())
            .await
            .map_err(|e| e.to_string())
    }
    async fn set_ip(&self, ip: IpAddr, blocked: bool) -> Result<(), String> {
        self.store
            .set_blacklisted("ip", &ip.to_string(), blocked, now_ms())
            .await
            .map_err(|e| e.to_string())
    }
    async fn set_token_sale(&self, sku: SkuId, on: bool) -> Result<(), String> {
        self.store
            .set_token_sale(sku, on)
            .await
            .map_err(|e| e.to_string())
    }
    async fn set_risk_allowed(&self, user: UserId, on: bool) -> Result<(), String> {
        self.store
            .set_risk_allowed(user, on, now_ms())
            .await
            .map_err(|e| e.to_string())
    }
    async fn set_risk_fallback(&self, sku: SkuId, rule: Option<&str>) -> Result<(), String> {
        self.store
            .set_risk_fallback(sku, rule)
            .await
            .map_err(|e| e.to_string())
    }
    fn once(&self) -> &dyn OnceStore {
        &self.once
    }
}

/// The Redis deployment: plain sets beside the sales' keys, shared by every instance.
pub struct RedisBlacklist {
    conn: Conn,
    prefix: String,
}

impl RedisBlacklist {
    /// Connects on first use (a service starts while Redis is down).
    pub fn connect(url: &str, prefix: &str) -> RedisBlacklist {
        let conn = Conn::lazy(url, Timeouts::HOT);
        RedisBlacklist {
            conn,
            prefix: prefix.to_owned(),
        }
    }

    /// `<prefix>:blacklist` (user ids; the key schema is flashsale-redis's `Keys`).
    fn users_key(&self) -> String {
        flashsale_redis::Keys::new(&self.prefix)
            .map(|k| k.blacklist())
            .unwrap_or_else(|_| format!("{}:blacklist", self.prefix))
    }
    fn ips_key(&self) -> String {
        format!("{}:ip", self.users_key())
    }
    fn token_sales_key(&self) -> String {
        format!("{}:token_sales", self.prefix)
    }
    fn risk_allow_key(&self) -> String {
        format!("{}:risk_allow", self.prefix)
    }
    fn risk_fallback_key(&self) -> String {
        format!("{}:risk_fallback", self.prefix)
    }

    /// The sales' own risk fallback rules (a hash sku → rule), bounded like the sets.
    async fn risk_fallbacks(&self) -> Result<HashMap<u64, String>, String> {
        let key = self.risk_fallback_key();
        let all: HashMap<String, String> = self.read_bounded("HLEN", "HGETALL", &key).await?;
        Ok(all
            .into_iter()
            .filter_map(|(sku, rule)| Some((sku.parse().ok()?, rule)))
            .collect())
    }

    async fn members(&self, key: String) -> Result<Vec<String>, String> {
        self.read_bounded("SCARD", "SMEMBERS", &key).await
    }

    /// `read` of `key` (SMEMBERS, HGETALL) once `count` (SCARD, HLEN) says it holds at most
    /// `ENTRIES_MAX` entries.
    async fn read_bounded<T: redis::FromRedisValue>(
        &self,
        count: &str,
        read: &str,
        key: &str,
    ) -> Result<T, String> {
        let mut conn = self.conn.clone();
        let n: usize = redis::cmd(count)
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if n > ENTRIES_MAX {
            return Err(format!("{key} holds {n} entries, more than {ENTRIES_MAX}"));
        }
        redis::cmd(read)
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }

    async fn toggle(&self, key: String, member: String, on: bool) -> Result<(), String> {
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd(if on { "SADD" } else { "SREM" })
            .arg(key)
            .arg(member)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[async_trait]
impl BlacklistStore for RedisBlacklist {
    async fn load(&self) -> Result<BlacklistSnapshot, String> {
        let users = self.members(self.users_key()).await?;
        let ips = self.members(self.ips_key()).await?;
        let skus = self.members(self.token_sales_key()).await?;
        let risk_allow = self.members(self.risk_allow_key()).await?;
        Ok(BlacklistSnapshot {
            users: users.iter().filter_map(|u| u.parse().ok()).collect(),
            ips: ips.iter().filter_map(|u| u.parse().ok()).collect(),
            token_sales: skus.iter().filter_map(|u| u.parse().ok()).collect(),
            risk_allow: risk_allow.iter().filter_map(|u| u.parse().ok()).collect(),
            risk_fallback: self.risk_fallbacks().await?,
        })
    }
    async fn set_user(&self, user: UserId, blocked: bool) -> Result<(), String> {
        self.toggle(self.users_key(), user.0.to_string(), blocked)
            .await
    }
    async fn set_ip(&self, ip: IpAddr, blocked: bool) -> Result<(), String> {
        self.toggle(self.ips_key(), ip.to_string(), blocked).await
    }
    async fn set_token_sale(&self, sku: SkuId, on: bool) -> Result<(), String> {
        self.toggle(self.token_sales_key(), sku.0.to_string(), on)
            .await
    }
    async fn set_risk_allowed(&self, user: UserId, on: bool) -> Result<(), String> {
        self.toggle(self.risk_allow_key(), user.0.to_string(), on)
            .await
    }
    async fn set_risk_fallback(&self, sku: SkuId, rule: Option<&str>) -> Result<(), String> {
        let cmd = match rule {
            Some(rule) => redis::cmd("HSET")
                .arg(self.risk_fallback_key())
                .arg(sku.0)
                .arg(rule)
                .clone(),
            None => redis::cmd("HDEL")
                .arg(self.risk_fallback_key())
                .arg(sku.0)
                .clone(),
        };
        let mut conn = self.conn.clone();
        let _: i64 = cmd
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
    fn once(&self) -> &dyn OnceStore {
        self
    }
}

#[async_trait]
impl OnceStore for RedisBlacklist {
    async fn consume_token(&self, jti: &str, key: &str, ttl: Duration) -> Result<bool, String> {
        let token_key = format!("{}:ptok:{jti}", self.prefix);
        let mut conn = self.conn.clone();
        let ms = ttl.as_millis().clamp(1, u64::MAX as u128) as u64;
        let set: Option<String> = redis::cmd("SET")
            .arg(&token_key)
            .arg(key)
            .arg("NX")
            .arg("PX")
            .arg(ms)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if set.is_some() {
            return Ok(true);
        }
        let holder: Option<String> = redis::cmd("GET")
            .arg(&token_key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(holder.as_deref() == Some(key))
    }
    /// A place among the user's live keys first (a sorted set per user, scored by expiry,
    /// bounded by `per_user`: [`CLAIM_KEY`]), then the key's binding as a used token (`SET
    /// NX PX`), so a user past its bound writes nothing.
    async fn bind_key(&self, key: &RequestKey, to: KeyBind) -> Result<Binding, String> {
        let ms = to.ttl.as_millis().clamp(1, u64::MAX as u128) as u64;
        let mut conn = self.conn.clone();
        let claimed: i64 = redis::Script::new(CLAIM_KEY)
            .key(format!("{}:ptok:idemkeys:{}", self.prefix, key.user.0))
            .arg(key.request_id.as_str())
            .arg(ms)
            .arg(to.per_user)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if claimed == 0 {
            return Ok(Binding::Full);
        }
        let bound = self
            .consume_token(&format!("idem:{key}"), &to.sku.0.to_string(), to.ttl)
            .await?;
        Ok(if bound {
            Binding::Bound
        } else {
            Binding::OtherSale
        })
    }
}

/// A place for an `Idempotency-Key` among its user's live keys (KEYS[1]: the user's sorted
/// set, member → expiry ms; ARGV: key, ttl ms, bound). 1: the key holds a place (now or
/// before), 0: the user holds its bound. Expired places are dropped first; the set lives as
/// long as its newest place.
const CLAIM_KEY: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 1
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

/// Key bindings held in memory at most, over all users (embedded); past it, after expired
/// ones are swept, a new key is refused like a user past its own bound.
pub const BINDINGS_MAX: usize = 1_000_000;

/// What a store answered to a key's binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Bound to this sale now, or before (a retry).
    Bound,
    /// Bound to another sale.
    OtherSale,
    /// Not bound: the user holds its bound of live keys (or the shared table is full).
    Full,
}

/// Key bindings in memory (the embedded deployment, tests), apart from used purchase tokens
/// so that keys never crowd tokens out: per user, each key's sale and expiry.
#[derive(Default)]
pub struct MemoryBindings {
    users: Mutex<Users>,
}

#[derive(Default)]
struct Users {
    keys: HashMap<u64, HashMap<String, (SkuId, Instant)>>,
    /// Bindings over all users (expired ones included until swept).
    len: usize,
}

impl MemoryBindings {
    pub fn bind(&self, key: &RequestKey, sku: SkuId, ttl: Duration, per_user: usize) -> Binding {
        self.bind_at(key, sku, ttl, per_user, BINDINGS_MAX, Instant::now())
    }

    fn bind_at(
        &self,
        key: &RequestKey,
        sku: SkuId,
        ttl: Duration,
        per_user: usize,
        max: usize,
        now: Instant,
    ) -> Binding {
        let mut users = self.users.lock().expect("key bindings lock");
        let (user, id) = (key.user.0, key.request_id.as_str());
        users.expire(user, now);
        let mine = users.keys.get(&user);
        match mine.and_then(|keys| keys.get(id)) {
            Some((first, _)) if *first == sku => return Binding::Bound,
            Some(_) => return Binding::OtherSale,
            None if mine.map_or(0, HashMap::len) >= per_user => return Binding::Full,
            None => {}
        }
        if users.len >= max {
            users.sweep(now);
            if users.len >= max {
                return Binding::Full;
            }
        }
        let mine = users.keys.entry(user).or_default();
        mine.insert(id.to_owned(), (sku, now + ttl));
        users.len += 1;
        Binding::Bound
    }
}

impl Users {
    /// Drops `user`'s expired bindings.
    fn expire(&mut self, user: u64, now: Instant) {
        let Some(mine) = self.keys.get_mut(&user) else {
            return;
        };
        let before = mine.len();
        mine.retain(|_, (_, until)| *until > now);
        self.len -= before - mine.len();
        if mine.is_empty() {
            self.keys.remove(&user);
        }
    }

    /// Drops every expired binding (the table is full; a new key may fit then).
    fn sweep(&mut self, now: Instant) {
        for keys in self.keys.values_mut() {
            keys.retain(|_, (_, until)| *until > now);
        }
        self.keys.retain(|_, keys| !keys.is_empty());
        self.len = self.keys.values().map(HashMap::len).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::RequestId;

    fn key(user: u64, id: &str) -> RequestKey {
        RequestKey::new(UserId(user), RequestId::parse(id).unwrap())
    }

    #[test]
    fn the_shared_table_is_bounded_and_expired_bindings_make_room() {
        let table = MemoryBindings::default();
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        let bind = |user, id: &str, at| table.bind_at(&key(user, id), SkuId(1), ttl, 2, 4, at);
        for user in 0..2 {
            assert_eq!(bind(user, "a", now), Binding::Bound);
            assert_eq!(bind(user, "b", now), Binding::Bound);
        }
        assert_eq!(bind(9, "a", now), Binding::Full, "the table holds 4");
        assert_eq!(bind(0, "a", now), Binding::Bound, "a retry needs no room");
        let later = now + ttl + Duration::from_secs(1);
        assert_eq!(
            bind(9, "a", later),
            Binding::Bound,
            "expired ones swept for room"
        );
        assert_eq!(bind(0, "c", later), Binding::Bound, "user 0's keys expired");
    }
}
