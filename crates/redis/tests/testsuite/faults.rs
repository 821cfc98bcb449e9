//! Faults on a throwaway redis-server: killed and restarted, scripts flushed, out of memory.

use std::time::{Duration, Instant};

use flashsale_core::{HotLedger, HotPurchases, LedgerError, SaleMode, SkuId};
use flashsale_redis::RedisLedger;
use flashsale_testkit::conformance::{buy, buy_ok, live_sale, req, stock, warm};
use flashsale_testkit::redis_server::RedisServer;
use flashsale_testkit::wait;
use redis::RedisResult;

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

#[tokio::test]
async fn a_dead_server_is_unavailable_quickly_and_a_restarted_one_serves_again() {
    let mut server = RedisServer::spawn().await;
    let ledger = RedisLedger::connect(&server.url(), "fs").await.unwrap();
    let sale = live_sale(SaleMode::Direct, 10, 1);
    let sku = warm(&ledger, &sale).await;
    buy_ok(&ledger, sku, 1, "a", 1).await;

    server.kill();
    for _ in 0..3 {
        let started = Instant::now();
        let r = ledger.purchase_batch(sku, &[req(sku, 2, "b", 1)]).await;
        assert!(matches!(r, Err(LedgerError::Unavailable(_))), "{r:?}");
        let ping = ledger.ping().await;
        assert!(matches!(ping, Err(LedgerError::Unavailable(_))), "{ping:?}");
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1_000), "took {took:?}");
    }

    server.start().await;
    wait::until(
        "the ledger to reconnect",
        Duration::from_secs(10),
        || async { ledger.ping().await.ok() },
    )
    .await;
    // No persistence: the sale is gone, and says so.
    let lost = ledger.counters(sku).await.unwrap();
    assert_eq!(lost, None);
    let r = ledger.purchase_batch(sku, &[req(sku, 2, "b", 1)]).await;
    assert!(matches!(r, Err(LedgerError::NotWarmed)), "{r:?}");
    warm(&ledger, &sale).await;
    buy_ok(&ledger, sku, 2, "b", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_is_unavailable_after_the_response_timeout() {
    let server = RedisServer::spawn_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--enable-debug-command",
        "yes",
    ])
    .await;
    let ledger = RedisLedger::connect(&server.url(), "fs").await.unwrap();
    let sku = warm(&ledger, &live_sale(SaleMode::Direct, 10, 1)).await;
    let mut sleeper = raw(&server).await;
    let mut probe = raw(&server).await;
    let stall = tokio::spawn(async move {
        let slept: RedisResult<()> = redis::cmd("DEBUG")
            .arg(&["SLEEP", "2"])
            .query_async(&mut sleeper)
            .await;
        slept.expect("DEBUG SLEEP");
    });
    wait::until("the server to stall", Duration::from_secs(5), || {
        let mut probe = probe.clone();
        async move {
            let cmd = redis::cmd("PING");
            let ping = cmd.query_async::<String>(&mut probe);
            let stalled = tokio::time::timeout(Duration::from_millis(50), ping).await;
            stalled.is_err().then_some(())
        }
    })
    .await;
    let started = Instant::now();
    let r = ledger.purchase_batch(sku, &[req(sku, 1, "a", 1)]).await;
    assert!(matches!(r, Err(LedgerError::Unavailable(_))), "{r:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(1_900),
        "{took:?}"
    );
    stall.await.unwrap();
    let _: String = redis::cmd("PING").query_async(&mut probe).await.unwrap();
    wait::until(
        "the ledger to answer again",
        Duration::from_secs(5),
        || async { ledger.ping().await.ok() },
    )
    .await;
    // The timed-out purchase may or may not have run; a retry answers its outcome either way.
    let again = buy(&ledger, sku, 1, "a", 1).await;
    assert!(again.code().is_none(), "{again:?}");
    assert_eq!(stock(&ledger, sku).await, (9, 0, 1, 1));
}

#[tokio::test]
async fn connecting_to_nothing_is_unavailable_quickly() {
    let port = flashsale_testkit::free_port();
    let started = Instant::now();
    let r = RedisLedger::connect(&format!("redis://127.0.0.1:{port}"), "fs").await;
    assert!(
        matches!(r, Err(LedgerError::Unavailable(_))),
        "{:?}",
        r.err()
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn script_flush_between_calls_is_recovered() {
    let (_server, ledger, mut conn, sku) = sale_on_own_server(SaleMode::Reserve).await;
    let mut orders = Vec::new();
    for user in 1..=3u64 {
        command(&mut conn, &["SCRIPT", "FLUSH"]).await;
        orders.push(buy_ok(&ledger, sku, user, "a", 1).await);
    }
    command(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let (paid, cancelled) = (&orders[0], &orders[1]);
    let resolution = ledger.pay(&paid.order_no, paid.user_id).await.unwrap();
    assert!(resolution.is_ok());
    command(&mut conn, &["SCRIPT", "FLUSH"]).await;
    let resolution = ledger.cancel(&cancelled.order_no, cancelled.user_id);
    assert!(resolution.await.unwrap().is_ok());
    command(&mut conn, &["SCRIPT", "FLUSH"]).await;
    assert_eq!(ledger.expire_due(sku, 10).await.unwrap(), 0);
    assert_eq!(stock(&ledger, sku).await, (8, 1, 1, 5));
}

/// A sale of 10 units (limit 1) warmed on a ledger on a server of its own, and a raw
/// connection to that server.
async fn sale_on_own_server(
    mode: SaleMode,
) -> (
    RedisServer,
    RedisLedger,
    redis::aio::MultiplexedConnection,
    SkuId,
) {
    let server = RedisServer::spawn().await;
    let ledger = RedisLedger::connect(&server.url(), "fs").await.unwrap();
    let conn = raw(&server).await;
    let sku = warm(&ledger, &live_sale(mode, 10, 1)).await;
    (server, ledger, conn, sku)
}

/// One command (`SCRIPT FLUSH`, `CONFIG SET …`) that must succeed.
async fn command(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) {
    let _: () = redis::cmd(args[0])
        .arg(&args[1..])
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn out_of_memory_refuses_scripts_before_any_write() {
    let (_server, ledger, mut conn, sku) = sale_on_own_server(SaleMode::Direct).await;
    buy_ok(&ledger, sku, 1, "a", 1).await;
    let ballast = "x".repeat(4 << 20);
    command(&mut conn, &["SET", "ballast", &ballast]).await;
    command(
        &mut conn,
        &[
            "CONFIG",
            "SET",
            "maxmemory",
            "2mb",
            "maxmemory-policy",
            "noeviction",
        ],
    )
    .await;
    let r = buy_refused_by_oom(&ledger, sku).await;
    assert!(matches!(r, Err(LedgerError::Unavailable(_))), "{r:?}");
    assert_eq!(stock(&ledger, sku).await, (9, 0, 1, 1));
    command(&mut conn, &["CONFIG", "SET", "maxmemory", "0"]).await;
    buy_ok(&ledger, sku, 2, "b", 1).await;
}

async fn buy_refused_by_oom(
    ledger: &RedisLedger,
    sku: flashsale_core::SkuId,
) -> Result<(), LedgerError> {
    let req = req(sku, 2, "b", 1);
    ledger.purchase_batch(sku, &[req]).await.map(|_| ())
}
