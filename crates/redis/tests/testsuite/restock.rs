//! Restocks reach every instance through the pub/sub channel, also after Redis restarts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashsale_core::{HotLedger, SaleMode, SkuId, SoldOutSupport};
use flashsale_redis::{Keys, RedisLedger};
use flashsale_testkit::conformance::{buy_ok, live_sale, warm};
use flashsale_testkit::redis_server::RedisServer;
use flashsale_testkit::wait;

async fn subscribers(server: &RedisServer) -> Option<i64> {
    let client = redis::Client::open(server.url()).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let channel = Keys::default().restock_channel();
    let reply: (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .ok()?;
    Some(reply.1)
}

/// Sells the one unit of a new reserve sale on `a`, cancels it, and waits for `heard` to
/// contain the sale.
async fn cancel_and_hear(a: &RedisLedger, heard: &Arc<Mutex<Vec<SkuId>>>) {
    let sku = warm(a, &live_sale(SaleMode::Reserve, 1, 1)).await;
    let order = buy_ok(a, sku, 1, "a", 1).await;
    a.cancel(&order.order_no, order.user_id)
        .await
        .unwrap()
        .unwrap();
    wait::until(
        "the other instance to hear",
        Duration::from_secs(5),
        || async { heard.lock().unwrap().contains(&sku).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_hears_restocks_also_after_a_restart() {
    let mut server = RedisServer::spawn().await;
    let a = RedisLedger::connect(&server.url(), "fs").await.unwrap();
    let b = RedisLedger::connect(&server.url(), "fs").await.unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = heard.clone();
    b.on_restock(Arc::new(move |sku| sink.lock().unwrap().push(sku)));
    let feeds: Vec<_> = b.restock_feeds().into_iter().map(tokio::spawn).collect();
    wait::until("b to subscribe", Duration::from_secs(5), || async {
        (subscribers(&server).await? == 1).then_some(())
    })
    .await;
    cancel_and_hear(&a, &heard).await;

    server.kill();
    server.start().await;
    wait::until("b to subscribe again", Duration::from_secs(10), || async {
        (subscribers(&server).await? == 1).then_some(())
    })
    .await;
    wait::until("a to reconnect", Duration::from_secs(10), || async {
        a.ping().await.ok()
    })
    .await;
    cancel_and_hear(&a, &heard).await;
    feeds.iter().for_each(|f| f.abort());
}
