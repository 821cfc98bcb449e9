//! Where each hot copy of the run's sales lives, and whether a transfer of a bucketed sale is
//! in flight: what the cluster nemesis asks before a fault lands on a bucket. Read straight
//! from the cluster and MariaDB (the salts the first load stored, the pending outs in Redis,
//! the transfer sides in `stock_transfers`), never through the service.

use std::collections::HashMap;
use std::time::Duration;

use flashsale_core::SkuId;
use flashsale_redis::{slot, CopyTag, Keys};
use redis::cluster_async::ClusterConnection;
use sqlx::{Connection, MySqlConnection, Row};

/// How long one look at Redis may take: a cut or killed node must not stall the nemesis.
const LOOK_LIMIT: Duration = Duration::from_millis(300);
/// How often the nemesis looks for a transfer in flight before a fault on a bucket.
const LOOK_EVERY: Duration = Duration::from_millis(5);

pub struct Copies {
    /// Each bucketed sale's salts, bucket 0 first (0 for bucket 0).
    salts: HashMap<u64, Vec<u32>>,
    keys: Keys,
    redis: Option<ClusterConnection>,
    db: MySqlConnection,
}

impl Copies {
    /// Reads the salts of every bucketed sale (stored by its first load, so after the warm)
    /// and connects to the cluster (`urls`: every node, comma-separated) and to MariaDB.
    pub async fn connect(urls: &str, db_url: &str) -> Copies {
        let mut db = MySqlConnection::connect(db_url)
            .await
            .expect("connect to MariaDB to place the buckets");
        let sql = "SELECT sku_id, bucket, salt FROM sale_buckets ORDER BY sku_id, bucket";
        let rows = sqlx::query(sql)
            .fetch_all(&mut db)
            .await
            .expect("read sale_buckets");
        let mut salts: HashMap<u64, Vec<u32>> = HashMap::new();
        for row in rows {
            let salt: Option<u32> = row.get("salt");
            let sku: u64 = row.get("sku_id");
            salts
                .entry(sku)
                .or_default()
                .push(salt.expect("a warm bucket's salt"));
        }
        let nodes: Vec<String> = urls.split(',').map(str::to_owned).collect();
        let client = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(LOOK_LIMIT)
            .response_timeout(LOOK_LIMIT)
            .retries(1)
            .build()
            .expect("a cluster client");
        let redis = tokio::time::timeout(Duration::from_secs(5), client.get_async_connection())
            .await
            .ok()
            .and_then(Result::ok);
        Copies {
            salts,
            keys: Keys::default(),
            redis,
            db,
        }
    }

    fn copy(&self, sku: u64, bucket: u16) -> CopyTag {
        let salt = self.salts.get(&sku).map_or(0, |s| s[usize::from(bucket)]);
        CopyTag::new(SkuId(sku), bucket, salt)
    }

    /// The cluster slot of a hot copy's keys.
    pub fn slot(&self, sku: u64, bucket: u16) -> u16 {
        slot(&self.keys.sale(self.copy(sku, bucket)))
    }

    /// Looks every few ms, for at most `limit`, for a transfer of `sku` in flight to or from
    /// `bucket`; says which, or `None` when none was seen.
    pub async fn wait_in_flight(
        &mut self,
        sku: u64,
        bucket: u16,
        limit: Duration,
    ) -> Option<String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(seen) = self.in_flight(sku, bucket).await {
                return Some(seen);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            // A poll's period, not synchronisation: the fault lands either way.
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// A transfer to or from `bucket` that is half done: an out recorded pending at its
    /// source in Redis (its in not known done), or one side stored in the database without
    /// the other.
    async fn in_flight(&mut self, sku: u64, bucket: u16) -> Option<String> {
        if let Some(seen) = self.pending_out(sku, bucket).await {
            return Some(seen);
        }
        self.half_stored(sku, bucket).await
    }

    async fn pending_out(&mut self, sku: u64, bucket: u16) -> Option<String> {
        let n = self.salts.get(&sku)?.len() as u16;
        for from in 0..n {
            let key = self.keys.transfers_out(self.copy(sku, from));
            let conn = self.redis.as_mut()?;
            let mut cmd = redis::cmd("HGETALL");
            cmd.arg(&key);
            let read = cmd.query_async(conn);
            let outs: HashMap<String, String> = match tokio::time::timeout(LOOK_LIMIT, read).await {
                Ok(Ok(outs)) => outs,
                _ => continue,
            };
            for (id, record) in outs {
                let to = record.split_once(':').and_then(|(to, _)| to.parse().ok());
                if from == bucket || to == Some(bucket) {
                    return Some(format!(
                        "transfer {id} pending out at bucket {from} ({record})"
                    ));
                }
            }
        }
        None
    }

    async fn half_stored(&mut self, sku: u64, bucket: u16) -> Option<String> {
        let sql = "SELECT transfer_id, MIN(side) AS side, from_bucket, to_bucket \
                   FROM stock_transfers WHERE sku_id = ? AND NOT fenced \
                   AND (from_bucket = ? OR to_bucket = ?) \
                   GROUP BY transfer_id, from_bucket, to_bucket HAVING COUNT(*) = 1 LIMIT 1";
        let row = sqlx::query(sql)
            .bind(sku)
            .bind(bucket)
            .bind(bucket)
            .fetch_optional(&mut self.db)
            .await
            .ok()??;
        let id: String = row.try_get_unchecked("transfer_id").ok()?;
        let side: String = row.try_get_unchecked("side").ok()?;
        let (from, to): (u32, u32) = (row.get("from_bucket"), row.get("to_bucket"));
        Some(format!(
            "transfer {id} (bucket {from} → {to}) stored {side} only"
        ))
    }
}
