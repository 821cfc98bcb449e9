//! Running a script: under the call deadline, with its latency recorded; a write script
//! loaded again on NOSCRIPT and, with replication, followed by WAIT in one pipeline. Also the
//! restock announcement.

use std::time::Instant;

use flashsale_core::{LedgerError, OrderNo, SkuId};
use redis::{Cmd, FromRedisValue, RedisError, ScriptInvocation, Value};

use super::setup::RedisLedger;
use crate::conn::{bounded, Timeouts};
use crate::keys::CopyTag;

impl RedisLedger {
    /// Runs a script on `copy`'s Redis under the call deadline and records its latency.
    pub(super) async fn run<T: FromRedisValue>(
        &self,
        name: &'static str,
        copy: CopyTag,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, LedgerError> {
        let started = Instant::now();
        let mut conn = self.conn(copy.sku);
        let result = bounded(Timeouts::HOT.call, inv.invoke_async(&mut conn)).await;
        metrics::histogram!(flashsale_core::metric_names::SCRIPT_LATENCY, "script" => name)
            .record(started.elapsed().as_secs_f64());
        result
    }

    /// Runs a write script (`cmd`, its EVALSHA). With [`Replication`] set, the script, a bump
    /// of the sale's wait mark and `WAIT` go in one pipeline: over one connection to one
    /// node, in that order, so the WAIT counts the replicas of the node that ran the script
    /// and covers its writes (a replay writes nothing of its own: the mark is the write the
    /// WAIT waits for). A WAIT sent apart may reach another node: once a primary dies, the
    /// cluster client sends a command whose node it has no connection to over a random
    /// one, whose replicas would then confirm a write they never saw. Returns the script's
    /// reply and, with replication, how many replicas acknowledged. Loads `source` (the
    /// script's text) once on NOSCRIPT (a restart, a failover, SCRIPT FLUSH) and tries again.
    pub(crate) async fn run_write(
        &self,
        name: &'static str,
        copy: CopyTag,
        source: &'static str,
        cmd: &Cmd,
    ) -> Result<(Value, Option<i64>), LedgerError> {
        let started = Instant::now();
        let mut result = self.send_write(copy, cmd).await;
        if matches!(&result, Err(e) if e.kind() == redis::ErrorKind::NoScriptError) {
            // To every primary (the cluster client's routing of SCRIPT LOAD): a slot map that
            // is a failover behind would send a load for one slot to a node that is no longer
            // its primary.
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(source);
            let mut conn = self.conn(copy.sku);
            bounded::<String>(Timeouts::HOT.call, load.query_async(&mut conn)).await?;
            result = self.send_write(copy, cmd).await;
        }
        let elapsed_s = started.elapsed().as_secs_f64();
        metrics::histogram!(flashsale_core::metric_names::SCRIPT_LATENCY, "script" => name)
            .record(elapsed_s);
        // Still NOSCRIPT after a load: the slot moved meanwhile (a failover); retry later.
        let (reply, acked) = result.map_err(|e| match e.kind() {
            redis::ErrorKind::NoScriptError => LedgerError::Unavailable(e.to_string()),
            _ => crate::conn::map_err(e),
        })?;
        if acked.is_some() {
            metrics::histogram!(flashsale_core::metric_names::REDIS_WAIT_SECONDS).record(elapsed_s);
        }
        Ok((reply, acked))
    }

    /// One try of [`RedisLedger::run_write`].
    async fn send_write(
        &self,
        copy: CopyTag,
        cmd: &Cmd,
    ) -> Result<(Value, Option<i64>), RedisError> {
        let mut conn = self.conn(copy.sku);
        let call = async {
            let Some(want) = self.replication else {
                let reply: Value = cmd.query_async(&mut conn).await?;
                return Ok((reply, None));
            };
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone())
                .cmd("INCR")
                .arg(self.keys.wait_mark(copy))
                .ignore()
                .cmd("WAIT")
                .arg(want.replicas)
                .arg(want.timeout.as_millis() as u64);
            let (reply, acked): (Value, i64) = pipe.query_async(&mut conn).await?;
            Ok((reply, Some(acked)))
        };
        match tokio::time::timeout(Timeouts::HOT.call, call).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from((
                redis::ErrorKind::IoError,
                "redis did not answer in time",
            ))),
        }
    }

    /// With [`Replication`] set (`acked` is the WAIT's count): confirms that `written`
    /// (accepted purchases or a resolved order) reached the replicas, or answers
    /// [`LedgerError::Unconfirmed`] naming them: the loss journal keeps them and the client
    /// retries with the same request id (and gets the first outcome).
    pub(super) fn confirmed(
        &self,
        acked: Option<i64>,
        written: Vec<OrderNo>,
    ) -> Result<(), LedgerError> {
        let (Some(want), Some(acked)) = (self.replication, acked) else {
            return Ok(());
        };
        if acked >= i64::from(want.replicas) {
            return Ok(());
        }
        metrics::counter!(flashsale_core::metric_names::REDIS_WAIT_TIMEOUTS).increment(1);
        Err(LedgerError::Unconfirmed {
            written,
            why: format!(
                "written to the primary but acknowledged by {acked} of {} replicas within {:?}; \
                 retry with the same request_id",
                want.replicas, want.timeout
            ),
        })
    }

    /// [`RedisLedger::confirmed`] of a write that names no order (a transfer).
    pub(crate) fn confirmed_write(&self, acked: Option<i64>) -> Result<(), LedgerError> {
        self.confirmed(acked, Vec::new())
    }

    /// Tells this instance's listener at once, and every instance through the channel of
    /// the Redis that holds the sale.
    pub(crate) async fn announce_restock(&self, sku: SkuId) {
        let server = self.server(sku);
        if let Some(listener) = server.restock.listener() {
            listener(sku);
        }
        let mut conn = server.conn.clone();
        let cmd = redis::cmd("PUBLISH")
            .arg(&server.restock.channel)
            .arg(sku.0)
            .clone();
        let sent: Result<i64, _> = bounded(Timeouts::HOT.call, cmd.query_async(&mut conn)).await;
        if let Err(e) = sent {
            tracing::warn!(%sku, error = %e, "could not publish a restock");
        }
    }
}

/// `EVALSHA <script> <numkeys> <keys…>`; the script's arguments follow.
pub(crate) fn evalsha(script: &redis::Script, keys: &[String]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}
