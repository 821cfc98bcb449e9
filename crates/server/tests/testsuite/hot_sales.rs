//! Hot sales on their own Redis: a sale named in the hot-sale settings lives on that Redis
//! (its keys, orders, pay and cancel, its persister), the others on the main one, and the
//! replica `WAIT` applies to both.

use std::time::Duration;

use crate::common::{self, code, Stack};
use flashsale_testkit::mariadb::TestDatabase;
use flashsale_testkit::redis_server::RedisServer;
use reqwest::StatusCode;
use serde_json::json;

/// Redis `main` for every sale but `hot_sku`, which lives on Redis `hot`.
fn hot_sale_config(
    main: &RedisServer,
    hot: &RedisServer,
    db: &TestDatabase,
    hot_sku: u64,
) -> flashsale_server::Config {
    let mut config = common::config(Some(main.url()), db.url.clone());
    config.engine.ledger.hot_sales.redis_url = Some(hot.url());
    config.engine.ledger.hot_sales.skus = vec![hot_sku];
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_sales_go_to_their_own_redis() {
    let (main, hot) = (RedisServer::spawn().await, RedisServer::spawn().await);
    let db = TestDatabase::create().await;
    let config = hot_sale_config(&main, &hot, &db, 91);
    let stack = Stack::start(config.clone(), Some(db), None).await;
    stack.live_sale(91, 50, 1).await;
    stack.live_sale(92, 50, 1).await;
    for user in 1..=20 {
        stack.buy_ok(user, 91, "a", 1).await;
        stack.buy_ok(user, 92, "a", 1).await;
    }
    let sold = |url: String, sku: u64| {
        let prefix = config.engine.ledger.redis_prefix.clone();
        async move {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let v: Option<u64> = redis::cmd("HGET")
                .arg(format!("{prefix}:{{{sku}}}:sale"))
                .arg("sold")
                .query_async(&mut conn)
                .await
                .unwrap();
            v
        }
    };
    assert_eq!(sold(hot.url(), 91).await, Some(20));
    assert_eq!(
        sold(main.url(), 91).await,
        None,
        "the hot sale is not on the main Redis"
    );
    assert_eq!(sold(main.url(), 92).await, Some(20));
    assert_eq!(sold(hot.url(), 92).await, None);
    // Orders, pay/cancel and the persisters route the same way.
    let (_, order) = stack.buy(30, 91, "a", json!(1)).await;
    let no = order["order_no"].as_str().unwrap();
    let (s, b) = stack.order(30, no).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    stack.drain(91).await;
    stack.drain(92).await;
    common::assert_invariants(stack.store().as_ref(), 91).await;
    common::assert_invariants(stack.store().as_ref(), 92).await;
}

/// `WAIT` applies to the hot-sale Redis as to the main one: with no replica on either, an
/// accepted purchase of either sale is not confirmed (503), never 202.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_sale_redis_waits_for_replicas_too() {
    let (main, hot) = (RedisServer::spawn().await, RedisServer::spawn().await);
    let db = TestDatabase::create().await;
    let mut config = hot_sale_config(&main, &hot, &db, 94);
    config.engine.ledger.replication = Some(flashsale_redis::Replication {
        replicas: 1,
        timeout: Duration::from_millis(50),
    });
    let stack = Stack::start(config, Some(db), None).await;
    for sku in [93, 94] {
        stack.live_sale(sku, 10, 1).await;
        let (s, b) = stack.buy(1, sku, "a", json!(1)).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
            "sale {sku}: {b}"
        );
    }
}
