//! Order events through the whole service: `serve` configured with a webhook runs the relay,
//! purchases over HTTP reach a real receiver signed and once each, `GET /api/v1/admin/events`
//! shows the sink caught up, and the operator routes refuse bad input with a 4xx that changes
//! nothing.

use std::time::Duration;

use flashsale_core::events::CloudEvent;
use flashsale_engine::relay::webhook::{self, WebhookSettings};
use flashsale_testkit::events::check_exactly_once;
use flashsale_testkit::wait;
use flashsale_testkit::webhook_receiver::WebhookReceiver;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{code, Stack};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn webhook_of(body: &Value) -> &Value {
    body["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sink"] == "webhook")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_relays_orders_to_a_signed_webhook_and_shows_its_position() {
    let receiver = WebhookReceiver::spawn().await;
    let url = receiver.url();
    let stack = Stack::embedded_with(|c| {
        c.engine.events.webhook = Some(WebhookSettings::new(&url, SECRET));
    })
    .await;
    stack.live_sale(501, 100, 1).await;
    for user in 1..=20 {
        stack.buy_ok(user, 501, &format!("r{user}"), 1).await;
    }
    let body = wait::until(
        "the webhook to catch up",
        Duration::from_secs(30),
        || async {
            let (status, body) = stack.admin("GET", "/api/v1/admin/events", None).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            (webhook_of(&body)["lag_events"] == 0 && receiver.received().len() == 20)
                .then_some(body)
        },
    )
    .await;
    let sink = webhook_of(&body);
    assert_eq!(sink["paused"], false);
    assert_eq!(sink["streams"][0]["position"], 20);
    assert_eq!(sink["streams"][0]["head"], 20);
    let key = webhook::secret_key(SECRET).unwrap();
    let delivered: Vec<CloudEvent> = receiver
        .received()
        .iter()
        .map(|r| {
            let h = &r.headers;
            let ts = h["webhook-timestamp"].parse().unwrap();
            assert!(webhook::verify(
                &key,
                &h["webhook-id"],
                ts,
                &r.body,
                &h["webhook-signature"]
            ));
            serde_json::from_slice(&r.body).unwrap()
        })
        .collect();
    let log = stack.store().event_log().unwrap();
    let stream = log.event_streams().await.unwrap()[0].stream;
    let stored: Vec<CloudEvent> = log
        .logged_events(stream, 0, 100)
        .await
        .unwrap()
        .iter()
        .filter_map(CloudEvent::of)
        .collect();
    check_exactly_once(&stored, &delivered).unwrap();
    assert!(delivered.iter().all(|e| e
        .data
        .order()
        .is_some_and(|o| o.status.as_str() == "CREATED")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_routes_refuse_bad_input_with_a_4xx() {
    let stack = Stack::embedded().await;
    stack.live_sale(502, 10, 1).await;
    let (before_status, before) = stack.admin("GET", "/api/v1/admin/events", None).await;
    assert_eq!(before_status, StatusCode::OK);
    let cases = [
        (
            "/api/v1/admin/events/kafka/resume",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/nats/redeliver",
            Some(json!({"sku_id": 502, "from_seq": 0})),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/nats/redeliver",
            Some(json!({"sku_id": 502, "bucket": 3, "from_seq": 1})),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/nats/redeliver",
            Some(json!({"sku_id": 999, "from_seq": 1})),
            StatusCode::NOT_FOUND,
            "SALE_NOT_FOUND",
        ),
        (
            "/api/v1/admin/events/nats/redeliver",
            Some(json!({"sku_id": 502, "from_seq": 1, "extra": true})),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/nats/redeliver",
            Some(json!({"sku_id": -1, "from_seq": 1})),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
    ];
    for (path, body, status, want) in cases {
        let (got, answer) = stack.admin("POST", path, body.clone()).await;
        assert_eq!(
            (got, code(&answer)),
            (status, want),
            "{path} {body:?}: {answer}"
        );
    }
    let user = stack.token(7);
    let (got, _) = stack
        .call("GET", "/api/v1/admin/events", Some(&user), None)
        .await;
    assert_eq!(got, StatusCode::FORBIDDEN);
    let (_, after) = stack.admin("GET", "/api/v1/admin/events", None).await;
    assert_eq!(
        before["sinks"], after["sinks"],
        "a refused call changed nothing"
    );
    // A good one: re-delivery from the start sets the position and answers the sinks.
    let (got, answer) = stack
        .admin(
            "POST",
            "/api/v1/admin/events/nats/redeliver",
            Some(json!({"sku_id": 502, "from_seq": 1})),
        )
        .await;
    assert_eq!(got, StatusCode::OK, "{answer}");
}
