//! Graceful shutdown mid-spike: `Server::shutdown` (what SIGTERM calls) stops accepting,
//! finishes in-flight purchases, and every purchase answered 202 is in the database or in the
//! sale's stream (Redis) afterwards.

use std::time::Duration;

use crate::common::Stack;
use flashsale_core::{OrderNo, OrderStore};
use futures::StreamExt;
use serde_json::{json, Value};

async fn spike_then_shutdown(mut stack: Stack) {
    const SKU: u64 = 95;
    stack.live_sale(SKU, 100_000, 1).await;
    let state = stack.server.as_ref().unwrap().state.clone();
    let base = stack.base.clone();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let tokens: Vec<String> = (1..=600u64).map(|u| stack.token(u)).collect();
    let server = stack.server.take().unwrap();
    let fire = futures::stream::iter(tokens.into_iter().enumerate())
        .map(|(i, token)| {
            let http = http.clone();
            let url = format!("{base}/api/v1/sales/{SKU}/purchases");
            async move {
                let resp = http
                    .post(url)
                    .bearer_auth(token)
                    .json(&json!({"request_id": format!("r{i}"), "quantity": 1}))
                    .send()
                    .await
                    .ok()?;
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.ok()?;
                Some((status, body))
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>();
    let stop = async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        server.shutdown().await
    };
    let (results, stopped) = tokio::join!(fire, stop);
    stopped.expect("clean shutdown");
    let accepted: Vec<String> = results
        .iter()
        .flatten()
        .filter(|(s, _)| *s == 202)
        .map(|(_, b)| b["order_no"].as_str().unwrap().to_owned())
        .collect();
    let refused = results.iter().flatten().filter(|(s, _)| *s >= 500).count();
    assert_eq!(refused, 0, "no 5xx while shutting down");
    assert!(
        !accepted.is_empty(),
        "the spike started before the shutdown"
    );
    assert!(
        results.iter().any(Option::is_none) || accepted.len() == 600,
        "some requests came after the listener closed, or all were answered"
    );
    // Every accepted purchase is persisted, or still in the Redis stream to be persisted.
    let store: std::sync::Arc<dyn OrderStore> = state.shop.store().clone();
    for no in &accepted {
        let no = OrderNo::parse(no).unwrap();
        let stored = store.order(&no).await.unwrap();
        if stored.is_some() {
            continue;
        }
        assert_eq!(
            state.shop.ledger().kind(),
            "redis",
            "embedded commits before it answers: {no}"
        );
        let hot = state.shop.ledger().order(&no).await.unwrap();
        assert!(hot.is_some(), "accepted order {no} is nowhere");
        let snapshot = state
            .shop
            .ledger()
            .hot_snapshot(no.sku())
            .await
            .unwrap()
            .unwrap();
        assert!(
            snapshot.events.iter().any(|e| e.order_no == no),
            "accepted order {no} is neither persisted nor in the stream"
        );
    }
    println!(
        "{} answered 202, {} not sent after the listener closed",
        accepted.len(),
        results.iter().filter(|r| r.is_none()).count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_spike_keeps_every_accepted_purchase_embedded() {
    spike_then_shutdown(Stack::embedded().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_spike_keeps_every_accepted_purchase_redis_mysql() {
    spike_then_shutdown(Stack::redis_mysql().await).await;
}
