//! One connection type over a single Redis node (`ConnectionManager`, reconnects by itself) or
//! a Redis Cluster (`cluster_async`), and the mapping of redis errors to `LedgerError`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flashsale_core::LedgerError;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::OnceCell;

/// Cluster nodes asked whether the cluster is ok before saying it is not.
const READY_TRIES: usize = 3;

/// Timeouts of one connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Bound on opening a TCP connection.
    pub connect: Duration,
    /// Bound on one command's answer (longer than any BLOCK sent on the connection).
    pub response: Duration,
    /// Bound on a whole call, reconnecting included.
    pub call: Duration,
}

impl Timeouts {
    /// The purchase path: fail fast, so the breaker can open.
    pub const HOT: Timeouts = Timeouts {
        connect: Duration::from_millis(300),
        response: Duration::from_secs(1),
        call: Duration::from_millis(1_500),
    };
}

/// A connection to one node or to a cluster. Cheap to clone (both are multiplexed). Opened
/// on first use when made with [`Conn::lazy`], so a service can start while Redis is down
/// (its calls fail as `Unavailable` until Redis answers, and the breaker opens).
#[derive(Clone)]
pub struct Conn {
    link: Arc<OnceCell<Link>>,
    nodes: Arc<Vec<String>>,
    t: Timeouts,
}

#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// `url` is `redis://…`, or a comma-separated list of cluster nodes; connects now.
    pub async fn connect(url: &str, t: Timeouts) -> Result<Conn, LedgerError> {
        let conn = Conn::lazy(url, t);
        bounded(t.call * 2, conn.link()).await?;
        Ok(conn)
    }

    /// Like [`Conn::connect`], connecting on first use (and again on each use until it
    /// succeeds).
    pub fn lazy(url: &str, t: Timeouts) -> Conn {
        Conn {
            link: Arc::new(OnceCell::new()),
            nodes: Arc::new(split_urls(url)),
            t,
        }
    }

    /// A cluster: named by more than one node, or one node that has cluster mode on (known
    /// once connected).
    pub fn is_cluster(&self) -> bool {
        self.nodes.len() > 1 || matches!(self.link.get(), Some(Link::Cluster(_)))
    }

    /// Whether the ledger can serve: a single node answers PING; a cluster node (any) answers
    /// `cluster_state:ok`. One shard failing over does not make a cluster unready (with
    /// `cluster-require-full-coverage no` the other shards serve on); a cluster that lost its
    /// majority, or no node answering, does.
    pub async fn ready(&self) -> Result<(), RedisError> {
        match self.link().await? {
            Link::Single(mut c) => {
                let _: String = redis::cmd("PING").query_async(&mut c).await?;
                Ok(())
            }
            Link::Cluster(mut c) => {
                // A random node may be the one that just died: ask up to three.
                let mut last = None;
                for _ in 0..READY_TRIES {
                    let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                    match c.route_command(redis::cmd("CLUSTER").arg("INFO"), to).await {
                        Ok(info) => {
                            let info: String = redis::from_redis_value(&info)?;
                            if info.contains("cluster_state:ok") {
                                return Ok(());
                            }
                            last = Some(RedisError::from((
                                ErrorKind::ClusterDown,
                                "cluster_state is not ok",
                            )));
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.expect("at least one try"))
            }
        }
    }

    async fn link(&self) -> Result<Link, RedisError> {
        self.link
            .get_or_try_init(|| open(&self.nodes, self.t))
            .await
            .cloned()
    }
}

async fn open(nodes: &[String], t: Timeouts) -> Result<Link, RedisError> {
    // One URL may name a node of a cluster (a seed): run it as the cluster it is, or every
    // sale on another primary would answer MOVED.
    if nodes.len() > 1 || cluster_enabled(&nodes[0], t).await? {
        let client = ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(t.connect)
            .response_timeout(t.response)
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()?;
        Ok(Link::Cluster(client.get_async_connection().await?))
    } else {
        let client = redis::Client::open(nodes[0].as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(t.connect)
            .set_response_timeout(t.response)
            .set_number_of_retries(0)
            .set_factor(50)
            .set_max_delay(100);
        Ok(Link::Single(
            ConnectionManager::new_with_config(client, config).await?,
        ))
    }
}

/// Whether the node at `url` runs in cluster mode (`INFO cluster`).
async fn cluster_enabled(url: &str, t: Timeouts) -> Result<bool, RedisError> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(t.connect)
        .set_response_timeout(t.response);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut conn)
        .await?;
    Ok(info.contains("cluster_enabled:1"))
}

/// Splits a comma-separated URL list; more than one node names a cluster (one node may too:
/// see [`Conn::is_cluster`]).
pub fn split_urls(url: &str) -> Vec<String> {
    let nodes: Vec<String> = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.contains("://") {
                s.to_owned()
            } else {
                format!("redis://{s}")
            }
        })
        .collect();
    if nodes.is_empty() {
        vec![url.to_owned()]
    } else {
        nodes
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.link().await? {
                Link::Single(mut c) => c.req_packed_command(cmd).await,
                Link::Cluster(mut c) => c.req_packed_command(cmd).await,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self.link().await? {
                Link::Single(mut c) => c.req_packed_commands(cmd, offset, count).await,
                Link::Cluster(mut c) => c.req_packed_commands(cmd, offset, count).await,
            }
        })
    }

    fn get_db(&self) -> i64 {
        match self.link.get() {
            Some(Link::Single(c)) => c.get_db(),
            Some(Link::Cluster(c)) => c.get_db(),
            None => 0,
        }
    }
}

/// Runs a redis call under a deadline; a miss or a connection fault is `Unavailable`.
pub async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, LedgerError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result.map_err(map_err),
        Err(_) => Err(LedgerError::Unavailable(format!(
            "redis did not answer within {limit:?}"
        ))),
    }
}

/// Connection faults, timeouts and "cannot serve now" answers are `Unavailable` (503, the
/// breaker counts them); a script's `NOT_WARMED` is `NotWarmed`; the rest is `Internal`.
///
/// On a cluster the client follows MOVED/ASK and retries TRYAGAIN/CLUSTERDOWN itself (a bounded
/// number of times); one that still comes back means a slot is between owners (its primary
/// died and no replica has taken over yet): the sale is unavailable for now, not broken.
pub fn map_err(e: RedisError) -> LedgerError {
    if e.code() == Some("NOT_WARMED") {
        return LedgerError::NotWarmed;
    }
    let unavailable = matches!(
        e.kind(),
        ErrorKind::IoError
            | ErrorKind::BusyLoadingError
            | ErrorKind::TryAgain
            | ErrorKind::Moved
            | ErrorKind::Ask
            | ErrorKind::ClusterDown
            | ErrorKind::MasterDown
            | ErrorKind::ReadOnly
            | ErrorKind::ClusterConnectionNotFound
    ) || matches!(e.code(), Some("OOM" | "BUSY" | "NOREPLICAS"))
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal();
    if unavailable {
        LedgerError::Unavailable(e.to_string())
    } else {
        LedgerError::Internal(e.to_string())
    }
}
