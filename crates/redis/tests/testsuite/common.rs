//! Shared by the integration tests: a ledger on the shared Redis under a prefix of its own,
//! removed when the test is done.
#![allow(dead_code)]

use flashsale_core::Ledger;
use std::sync::Arc;

use flashsale_redis::RedisLedger;
use flashsale_testkit::redis_server::{shared_url, unique_prefix};

/// A ledger on the shared server with its own key prefix.
pub struct TestLedger {
    pub ledger: Arc<RedisLedger>,
    pub prefix: String,
}

impl TestLedger {
    pub async fn new() -> TestLedger {
        let prefix = unique_prefix();
        let ledger = RedisLedger::connect(&shared_url(), &prefix)
            .await
            .expect("connect to the shared redis (is it running? see scripts/services.sh)");
        TestLedger {
            ledger: Arc::new(ledger),
            prefix,
        }
    }

    /// A ledger that takes sales of several buckets.
    pub async fn with_buckets() -> TestLedger {
        let prefix = unique_prefix();
        let ledger = RedisLedger::connect(&shared_url(), &prefix)
            .await
            .expect("connect to the shared redis")
            .with_buckets();
        TestLedger {
            ledger: Arc::new(ledger),
            prefix,
        }
    }

    /// A ledger that loads copies in layout 2 (one record per buyer).
    pub async fn with_records() -> TestLedger {
        let t = TestLedger::new().await;
        let ledger = RedisLedger::connect(&shared_url(), &t.prefix)
            .await
            .expect("connect to the shared redis")
            .with_records();
        TestLedger {
            ledger: Arc::new(ledger),
            prefix: t.prefix,
        }
    }

    /// A ledger that takes sales of several buckets and loads them in layout 2.
    pub async fn with_buckets_and_records() -> TestLedger {
        let t = TestLedger::with_records().await;
        let ledger = RedisLedger::connect(&shared_url(), &t.prefix)
            .await
            .expect("connect to the shared redis")
            .with_records()
            .with_buckets();
        TestLedger {
            ledger: Arc::new(ledger),
            prefix: t.prefix,
        }
    }

    pub fn dyn_ledger(&self) -> Arc<dyn Ledger> {
        self.ledger.clone()
    }

    /// Deletes every key under the prefix.
    pub async fn cleanup(self) {
        let mut conn = raw().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .expect("DEL");
        }
    }
}

/// A plain connection to the shared server.
pub async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(shared_url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// The events of stream entries that all parse, checked to be the ones at `seqs`, in order.
pub fn events_in_seq(
    entries: &[flashsale_redis::Entry],
    seqs: &[u64],
) -> Vec<flashsale_core::Event> {
    let events: Vec<_> = entries
        .iter()
        .filter_map(|(_, e)| e.clone().unwrap().event().cloned())
        .collect();
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), seqs);
    events
}
