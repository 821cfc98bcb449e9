//! flashsale-testkit: what the tests of every crate share.
//!
//! - [`redis_server`]: a throwaway `redis-server` on a free port in a temp dir (for tests that
//!   kill, restart or reconfigure Redis), and a unique key prefix on the shared one.
//! - [`redis_cluster`]: a throwaway six-node Redis Cluster (three primaries, three replicas);
//!   killing, restarting and failing over nodes.
//! - [`netns`]: network namespaces on a bridge (198.18.0.0/15), partitions between two
//!   addresses, everything removed on drop.
//! - [`redis_cluster_ns`]: the six-node cluster with each node in a namespace of its own.
//! - [`mariadb`]: a throwaway `mariadbd` in a temp dir, and a fresh database of its own on the
//!   shared server.
//! - [`postgres`]: a fresh database of its own on the shared PostgreSQL server.
//! - [`nats_server`]: a throwaway `nats-server -js` on a free port with its own store dir (for
//!   tests that kill or restart it), and unique subjects and stream names on the shared one.
//! - [`events`]: a sale stored live with the book its hot copy runs (what a relay test stores
//!   transitions from), and the check of delivered order events against the stored
//!   transitions.
//! - [`webhook_receiver`]: a real HTTP receiver of webhooks that answers as the test says
//!   (accept, a status, hang, drop the connection).
//! - [`bucket_model`]: the reference model of a sale over stock buckets, and its property
//!   tests.
//! - [`conformance`]: the one suite both hot ledgers must pass; [`bucketed`]: its checks of
//!   sales of several buckets, for ledgers that hold them, and a bucket's counters.
//! - [`wait`]: polling with a deadline, the only way tests wait (`until` panics at the
//!   deadline; `within` gives up with `None`).
//! - [`process`]: a child process killed with SIGKILL and restarted alike, killed on drop; the
//!   kill, pause and resume every throwaway server has.
//!
//! Depends on flashsale-core and client libraries only; never on a backend crate.

pub mod bucket_model;
pub mod bucketed;
pub mod conformance;
pub mod events;
pub mod mariadb;
pub mod model;
pub mod nats_server;
pub mod netns;
pub mod postgres;
pub mod process;
pub mod prometheus;
pub mod redis_cluster;
pub mod redis_cluster_ns;
pub mod redis_server;
pub mod wait;
pub mod webhook_receiver;

use std::net::TcpListener;

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// A short random lowercase name, unique enough to keep parallel tests apart.
pub fn unique_name(prefix: &str) -> String {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    format!("{prefix}_{n:016x}")
}

/// Runs `work` to the end on a thread of its own with a runtime of its own: what a `Drop`
/// that must talk to a server does, since it may run inside a runtime or outside any.
pub(crate) fn block_on_thread(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            rt.block_on(work);
        }
    })
    .join();
}

/// Runs `sql` (a CREATE or DROP DATABASE) over a connection of its own to the server at `url`.
pub(crate) async fn execute_once<C>(url: &str, sql: &str) -> Result<(), sqlx::Error>
where
    C: sqlx::Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    use sqlx::Executor as _;
    let mut conn = C::connect(url).await?;
    (&mut conn).execute(sql).await?;
    Ok(())
}

/// [`execute_once`] from a `Drop` (on a thread of its own, see [`block_on_thread`]), a failure
/// ignored: a test database's guard dropping its database.
pub(crate) fn execute_on_drop<C>(url: &str, sql: &str)
where
    C: sqlx::Connection + 'static,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let (url, sql) = (url.to_owned(), sql.to_owned());
    block_on_thread(async move {
        let _ = execute_once::<C>(&url, &sql).await;
    });
}
