//! `flashsale bench strategies`: one hot SKU, many buyers, one strategy after another, in one
//! process against real MariaDB and real Redis. Units sold, oversell and duplicate buyers are
//! counted from the database and Redis state afterwards, never from the bench's own counters.
//!
//! - `db-row-lock`: the first seed's Stage 1, a conditional UPDATE plus the order INSERT in one
//!   transaction per purchase.
//! - `redis-naive`: GET, check, DECRBY as separate commands (it oversells).
//! - `redis-lock`: the second seed's SET NX PX lock around check and HINCRBY.
//! - `redis-lua`: the first seed's production script as written, one EVALSHA per purchase.
//! - `flashsale-redis`: ours, batched script, persister into MariaDB.
//! - `flashsale-embedded`: ours, the embedded ledger over SQLite.
//!
//! Ours go through the server's hot path (`Batcher`: local sold-out flag, then batched ledger
//! calls), minus HTTP and the gateway, so once a sale is sold out its requests are answered
//! without the ledger, as in production.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::procs::{Meter, PhaseCpu};
use async_trait::async_trait;
use flashsale_core::{
    Ledger, OrderStore, PurchaseOutcome, PurchaseRequest, RequestId, Sale, SkuId, UserId,
};
use flashsale_engine::shop::Batcher;
use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;
use serde::Serialize;
use sqlx::{Executor, MySqlPool, Row};

const SKU: u64 = 1001;

/// What the state says after a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Audit {
    pub units_sold: i64,
    pub oversold: i64,
    pub duplicate_buyers: i64,
    /// Orders in a relational database (None: the strategy keeps none).
    pub orders_in_db: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StrategyRow {
    pub strategy: String,
    pub buyers: u64,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
    /// Redis main-thread CPU µs per buyer (INFO cpu).
    pub redis_usec_per_request: Option<f64>,
    /// Command µs per buyer as INFO commandstats counts them (a script's nested commands twice).
    pub redis_cmd_usec_per_request: Option<f64>,
    /// Per command (INFO commandstats): calls and µs per buyer, the costliest first.
    pub redis_by_command: Vec<CommandCost>,
    /// CPU of each process of the path (`/proc/<pid>/stat`), run and drain, µs per buyer.
    pub cpu_per_buyer: PhaseCpu,
    /// The same, µs per accepted purchase (units sold).
    pub cpu_per_accepted: PhaseCpu,
    pub audit: Audit,
}

#[async_trait]
pub trait Strategy: Send + Sync {
    fn name(&self) -> &'static str;
    /// True when accepted; an Err is a failed attempt (counted, not retried).
    async fn purchase(&self, user: u64) -> anyhow::Result<bool>;
    /// Waits for anything asynchronous (a persister) to finish its work of the run.
    async fn settle(&self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Reads the state after [`Strategy::settle`].
    async fn audit(&self, total: u64) -> anyhow::Result<Audit>;
    fn uses_redis(&self) -> bool {
        true
    }
}

/// One command's share of a run, per buyer (INFO commandstats: a script's nested commands
/// are counted both on their own and inside the EVALSHA that called them).
#[derive(Debug, Clone, Serialize)]
pub struct CommandCost {
    pub command: String,
    pub calls_per_buyer: f64,
    pub usec_per_buyer: f64,
}

pub struct Workload {
    pub units: u64,
    pub users: u64,
    pub concurrency: usize,
}

/// Runs one strategy over the workload. Redis's and each process's CPU are counted over the
/// run and the drain of what it left behind (a persister's writes), the answers per second
/// over the run alone.
pub async fn measure(
    s: Arc<dyn Strategy>,
    w: &Workload,
    redis: &mut MultiplexedConnection,
    meter: &Meter,
) -> anyhow::Result<StrategyRow> {
    let cpu_before = meter.sample();
    let before = if s.uses_redis() {
        Some(RedisUsec::read(redis).await?)
    } else {
        None
    };
    let next = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let tasks: Vec<_> = (0..w.concurrency)
        .map(|_| {
            let (s, next, users) = (s.clone(), next.clone(), w.users);
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("bounds");
                let mut errors = 0u64;
                loop {
                    let user = next.fetch_add(1, Ordering::Relaxed);
                    if user > users {
                        break;
                    }
                    let t = Instant::now();
                    errors += u64::from(s.purchase(user).await.is_err());
                    h.saturating_record(t.elapsed().as_micros().max(1) as u64);
                }
                (h, errors)
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await?;
        all.add(h)?;
        errors += e;
    }
    let secs = started.elapsed().as_secs_f64();
    s.settle().await?;
    let wall = started.elapsed().as_secs_f64();
    let cpu_after = meter.sample();
    let usec = match before {
        Some(b) => Some(RedisUsec::read(redis).await?.since(&b, w.users)),
        None => None,
    };
    let audit = s.audit(w.units).await?;
    let sold = audit.units_sold.max(0) as u64;
    Ok(StrategyRow {
        strategy: s.name().into(),
        buyers: w.users,
        per_s: w.users as f64 / secs,
        p50_ms: all.value_at_quantile(0.5) as f64 / 1e3,
        p99_ms: all.value_at_quantile(0.99) as f64 / 1e3,
        errors,
        redis_usec_per_request: usec.as_ref().map(|u| u.cpu),
        redis_cmd_usec_per_request: usec.as_ref().map(|u| u.commands),
        redis_by_command: usec.map(|u| u.by_command).unwrap_or_default(),
        cpu_per_buyer: meter.phase(&cpu_before, &cpu_after, w.users, wall),
        cpu_per_accepted: meter.phase(&cpu_before, &cpu_after, sold, wall),
        audit,
    })
}

/// Two views of what Redis spent, in µs. `cpu`: its main thread's CPU time (INFO cpu, user +
/// sys), everything a strategy costs Redis, reading requests and writing replies included.
/// `commands`: the sum of INFO commandstats `usec`, the measure the issue names; it counts the
/// commands a script calls twice (inside EVALSHA and on their own) and leaves out I/O.
#[derive(Debug, Clone)]
struct RedisUsec {
    cpu: f64,
    commands: f64,
    /// Per command: (calls, usec), as INFO commandstats counts them.
    by_command: Vec<CommandCost>,
}

impl RedisUsec {
    async fn read(conn: &mut MultiplexedConnection) -> anyhow::Result<RedisUsec> {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        let by_command: Vec<CommandCost> = info.lines().filter_map(command_stat).collect();
        Ok(RedisUsec {
            cpu: main_thread_cpu_us(&info),
            commands: by_command.iter().map(|c| c.usec_per_buyer).sum(),
            by_command,
        })
    }

    /// Per buyer since `before`, the costliest command first.
    fn since(&self, before: &RedisUsec, buyers: u64) -> RedisUsec {
        let per = buyers.max(1) as f64;
        let mut by_command: Vec<CommandCost> = self
            .by_command
            .iter()
            .map(|c| {
                let b = before.by_command.iter().find(|b| b.command == c.command);
                CommandCost {
                    command: c.command.clone(),
                    calls_per_buyer: (c.calls_per_buyer - b.map_or(0.0, |b| b.calls_per_buyer))
                        / per,
                    usec_per_buyer: (c.usec_per_buyer - b.map_or(0.0, |b| b.usec_per_buyer)) / per,
                }
            })
            .filter(|c| c.calls_per_buyer > 0.0)
            .collect();
        by_command.sort_by(|a, b| b.usec_per_buyer.total_cmp(&a.usec_per_buyer));
        RedisUsec {
            cpu: (self.cpu - before.cpu) / per,
            commands: (self.commands - before.commands) / per,
            by_command,
        }
    }
}

/// The main thread's CPU time so far in an `INFO cpu` answer (user + sys), µs.
pub fn main_thread_cpu_us(info: &str) -> f64 {
    let cpu_s: f64 = info
        .lines()
        .filter(|l| {
            l.starts_with("used_cpu_user_main_thread:")
                || l.starts_with("used_cpu_sys_main_thread:")
        })
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum();
    cpu_s * 1e6
}

/// `cmdstat_evalsha:calls=3,usec=41,usec_per_call=…` as totals (calls, usec) of one command.
fn command_stat(line: &str) -> Option<CommandCost> {
    let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
    let field = |key: &str| -> Option<f64> {
        rest.split(',')
            .find_map(|kv| kv.strip_prefix(key))?
            .parse()
            .ok()
    };
    Some(CommandCost {
        command: name.to_string(),
        calls_per_buyer: field("calls=")?,
        usec_per_buyer: field("usec=")?,
    })
}

// ---- db-row-lock ------------------------------------------------------------------------

pub struct DbRowLock {
    pub pool: MySqlPool,
}

impl DbRowLock {
    pub async fn new(pool: MySqlPool, units: u64) -> anyhow::Result<DbRowLock> {
        pool.execute(
            "CREATE TABLE seckill_stock (sku_id BIGINT PRIMARY KEY, available_stock INT NOT NULL)",
        )
        .await?;
        pool.execute("CREATE TABLE seckill_order (id BIGINT PRIMARY KEY AUTO_INCREMENT, order_no VARCHAR(32) NOT NULL UNIQUE, \
            sku_id BIGINT NOT NULL, user_id BIGINT NOT NULL, status VARCHAR(16) NOT NULL)").await?;
        sqlx::query("INSERT INTO seckill_stock VALUES (?, ?)")
            .bind(SKU)
            .bind(units)
            .execute(&pool)
            .await?;
        Ok(DbRowLock { pool })
    }
}

#[async_trait]
impl Strategy for DbRowLock {
    fn name(&self) -> &'static str {
        "db-row-lock"
    }
    fn uses_redis(&self) -> bool {
        false
    }
    async fn purchase(&self, user: u64) -> anyhow::Result<bool> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query("UPDATE seckill_stock SET available_stock = available_stock - 1 WHERE sku_id = ? AND available_stock >= 1")
            .bind(SKU)
            .execute(&mut *tx)
            .await?;
        // The WHERE names the condition, so a found row is a changed row here.
        if updated.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query("INSERT INTO seckill_order (order_no, sku_id, user_id, status) VALUES (?, ?, ?, 'INIT')")
            .bind(format!("o{user}"))
            .bind(SKU)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
    async fn audit(&self, total: u64) -> anyhow::Result<Audit> {
        let row =
            sqlx::query("SELECT COUNT(*) AS n, COUNT(DISTINCT user_id) AS d FROM seckill_order")
                .fetch_one(&self.pool)
                .await?;
        let (n, d): (i64, i64) = (row.get("n"), row.get("d"));
        Ok(Audit {
            units_sold: n,
            oversold: (n - total as i64).max(0),
            duplicate_buyers: n - d,
            orders_in_db: Some(n),
        })
    }
}

// ---- redis-naive, redis-lock, redis-lua --------------------------------------------------

pub struct RedisNaive {
    pub conn: MultiplexedConnection,
    pub prefix: String,
}

/// The list of the Redis-only strategies' orders (user ids).
fn orders_key(prefix: &str) -> String {
    format!("{prefix}:orders:{{{SKU}}}")
}

/// Appends an order of `user` to the Redis-only strategies' list.
async fn push_order(c: &mut MultiplexedConnection, prefix: &str, user: u64) -> anyhow::Result<()> {
    let _: i64 = redis::cmd("RPUSH")
        .arg(orders_key(prefix))
        .arg(user)
        .query_async(c)
        .await?;
    Ok(())
}

/// Orders of the Redis-only strategies, as a list of user ids (audited from Redis).
async fn audit_list(conn: &MultiplexedConnection, key: &str, total: u64) -> anyhow::Result<Audit> {
    let mut conn = conn.clone();
    let users: Vec<u64> = redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await?;
    let distinct: std::collections::HashSet<u64> = users.iter().copied().collect();
    let n = users.len() as i64;
    Ok(Audit {
        units_sold: n,
        oversold: (n - total as i64).max(0),
        duplicate_buyers: n - distinct.len() as i64,
        orders_in_db: None,
    })
}

#[async_trait]
impl Strategy for RedisNaive {
    fn name(&self) -> &'static str {
        "redis-naive"
    }
    async fn purchase(&self, user: u64) -> anyhow::Result<bool> {
        let mut c = self.conn.clone();
        let stock_key = format!("{}:stock:{{{SKU}}}", self.prefix);
        let stock: i64 = redis::cmd("GET")
            .arg(&stock_key)
            .query_async(&mut c)
            .await?;
        if stock < 1 {
            return Ok(false);
        }
        let _: i64 = redis::cmd("DECRBY")
            .arg(&stock_key)
            .arg(1)
            .query_async(&mut c)
            .await?;
        push_order(&mut c, &self.prefix, user).await?;
        Ok(true)
    }
    async fn audit(&self, total: u64) -> anyhow::Result<Audit> {
        audit_list(&self.conn, &orders_key(&self.prefix), total).await
    }
}

pub struct RedisLock {
    pub conn: MultiplexedConnection,
    pub prefix: String,
}

const UNLOCK: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[async_trait]
impl Strategy for RedisLock {
    fn name(&self) -> &'static str {
        "redis-lock"
    }
    async fn purchase(&self, user: u64) -> anyhow::Result<bool> {
        let mut c = self.conn.clone();
        let (lock, item) = (
            format!("{}:lock:{{{SKU}}}", self.prefix),
            format!("{}:item:{{{SKU}}}", self.prefix),
        );
        let me = user.to_string();
        // Retry the lock a bounded number of times, as a client of the seed would.
        for attempt in 0..200u32 {
            let got: Option<String> = redis::cmd("SET")
                .arg(&lock)
                .arg(&me)
                .arg("NX")
                .arg("PX")
                .arg(100)
                .query_async(&mut c)
                .await?;
            if got.is_some() {
                let (total, ordered): (i64, i64) = redis::cmd("HMGET")
                    .arg(&item)
                    .arg("total")
                    .arg("ordered")
                    .query_async(&mut c)
                    .await?;
                let ok = ordered < total; // the seed: ordered + k <= total, k = 1
                if ok {
                    let _: i64 = redis::cmd("HINCRBY")
                        .arg(&item)
                        .arg("ordered")
                        .arg(1)
                        .query_async(&mut c)
                        .await?;
                    push_order(&mut c, &self.prefix, user).await?;
                }
                let _: i64 = redis::Script::new(UNLOCK)
                    .key(&lock)
                    .arg(&me)
                    .invoke_async(&mut c)
                    .await?;
                return Ok(ok);
            }
            tokio::time::sleep(Duration::from_micros(200 * u64::from(attempt.min(10) + 1))).await;
        }
        anyhow::bail!("lock not acquired")
    }
    async fn audit(&self, total: u64) -> anyhow::Result<Audit> {
        audit_list(&self.conn, &orders_key(&self.prefix), total).await
    }
}

/// The first seed's production script, keys tagged so it could run on a cluster.
pub const SEED_LUA: &str = r#"
local stockKey = KEYS[1]
local buyersKey = KEYS[2]
local streamKey = KEYS[3]
local userId = ARGV[1]
local orderNo = ARGV[2]
local skuId = ARGV[3]
local quantity = tonumber(ARGV[4])
local requestId = ARGV[5]
if redis.call('SISMEMBER', buyersKey, userId) == 1 then
  return 2
end
local stock = tonumber(redis.call('GET', stockKey) or '0')
if stock < quantity then
  return 1
end
redis.call('DECRBY', stockKey, quantity)
redis.call('SADD', buyersKey, userId)
redis.call('XADD', streamKey, '*', 'requestId', requestId, 'orderNo', orderNo, 'skuId', skuId, 'userId', userId, 'quantity', tostring(quantity))
return 0
"#;

pub struct RedisLua {
    pub conn: MultiplexedConnection,
    pub prefix: String,
    pub script: redis::Script,
}

#[async_trait]
impl Strategy for RedisLua {
    fn name(&self) -> &'static str {
        "redis-lua"
    }
    async fn purchase(&self, user: u64) -> anyhow::Result<bool> {
        let mut c = self.conn.clone();
        let p = &self.prefix;
        let code: i64 = self
            .script
            .key(format!("{p}:stock:{{{SKU}}}"))
            .key(format!("{p}:buyers:{{{SKU}}}"))
            .key(format!("{p}:stream:{{{SKU}}}"))
            .arg(user)
            .arg(format!("o{user}"))
            .arg(SKU)
            .arg(1)
            .arg(format!("r{user}"))
            .invoke_async(&mut c)
            .await?;
        Ok(code == 0)
    }
    async fn audit(&self, total: u64) -> anyhow::Result<Audit> {
        let mut c = self.conn.clone();
        let stream = format!("{}:stream:{{{SKU}}}", self.prefix);
        let n: i64 = redis::cmd("XLEN").arg(&stream).query_async(&mut c).await?;
        let buyers: i64 = redis::cmd("SCARD")
            .arg(format!("{}:buyers:{{{SKU}}}", self.prefix))
            .query_async(&mut c)
            .await?;
        Ok(Audit {
            units_sold: n,
            oversold: (n - total as i64).max(0),
            duplicate_buyers: n - buyers,
            orders_in_db: None,
        })
    }
}

// ---- ours ---------------------------------------------------------------------------------

/// A hot ledger behind the server's hot path (sold-out flag, batcher), audited from its
/// system of record.
pub struct Ours {
    pub name: &'static str,
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub batcher: Batcher,
}

#[async_trait]
impl Strategy for Ours {
    fn name(&self) -> &'static str {
        self.name
    }
    fn uses_redis(&self) -> bool {
        self.ledger.durability() == flashsale_core::Durability::Streamed
    }
    async fn purchase(&self, user: u64) -> anyhow::Result<bool> {
        let req = PurchaseRequest {
            sku_id: SkuId(SKU),
            user_id: UserId(user),
            request_id: RequestId::parse(&format!("r{user}")).expect("valid id"),
            quantity: 1,
        };
        // The server's hot path: the local sold-out flag first, as the route does.
        if self.batcher.sold_out_here(&req) {
            return Ok(false);
        }
        Ok(matches!(
            self.batcher.purchase(req).await?,
            PurchaseOutcome::Accepted { .. }
        ))
    }
    async fn settle(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let hot = self.ledger.counters(SkuId(SKU)).await?.map(|c| c.seq);
            let stored = self.store.sale(SkuId(SKU)).await?.map(|s| s.counters.seq);
            if hot == stored {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "persister did not drain");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    async fn audit(&self, total: u64) -> anyhow::Result<Audit> {
        self.settle().await?;
        let orders = self.store.orders(SkuId(SKU)).await?;
        let live: Vec<_> = orders.iter().filter(|o| o.status.is_live()).collect();
        let n: i64 = live.iter().map(|o| i64::from(o.quantity)).sum();
        let distinct: std::collections::HashSet<UserId> = live.iter().map(|o| o.user_id).collect();
        Ok(Audit {
            units_sold: n,
            oversold: (n - total as i64).max(0),
            duplicate_buyers: live.len() as i64 - distinct.len() as i64,
            orders_in_db: Some(orders.len() as i64),
        })
    }
}

/// The sale ours sell.
pub fn bench_sale(units: u64) -> Sale {
    // Live, direct, one unit per buyer, open until the latest time a Lua number holds.
    Sale {
        name: "hot".into(),
        ..Sale::always_open(SkuId(SKU), units)
    }
}

#[cfg(test)]
mod tests {
    use super::command_stat;

    #[test]
    fn command_stats_read_calls_and_usec_not_usec_per_call() {
        let c =
            command_stat("cmdstat_evalsha:calls=3,usec=41,usec_per_call=13.67,rejected_calls=0")
                .expect("a command line");
        assert_eq!(c.command, "evalsha");
        assert_eq!((c.calls_per_buyer, c.usec_per_buyer), (3.0, 41.0));
        assert!(command_stat("used_cpu_sys:1.0").is_none());
    }
}
