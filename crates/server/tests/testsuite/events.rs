//! Order events through the whole service: `serve` configured with a webhook runs the relay,
//! purchases over HTTP reach a real receiver signed and once each, `GET /api/v1/admin/events`
//! shows the sink caught up, and the operator routes refuse bad input with a 4xx that changes
//! nothing.

use std::time::Duration;

use flashsale_core::events::CloudEvent;
use flashsale_engine::relay::nats::NatsSettings;
use flashsale_engine::relay::webhook::{self, WebhookSettings};
use flashsale_engine::relay::{self};
use flashsale_testkit::events::check_exactly_once;
use flashsale_testkit::webhook_receiver::WebhookReceiver;
use flashsale_testkit::{nats_server, wait};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{code, order_no, Stack};

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
        .is_some_and(|o| o.order.status.as_str() == "CREATED")));
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

/// Every message of a JetStream stream, in stream order, each checked to carry its event id
/// as `Nats-Msg-Id`.
async fn consumed(url: &str, stream: &str) -> Vec<CloudEvent> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let Ok(mut stream) = js.get_stream(stream).await else {
        return Vec::new();
    };
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let msg = stream.get_raw_message(seq).await.unwrap();
        let event: CloudEvent = serde_json::from_slice(&msg.payload).unwrap();
        let id = msg.headers.get(async_nats::header::NATS_MESSAGE_ID);
        assert_eq!(id.map(|v| v.as_str()), Some(event.id.as_str()));
        out.push(event);
    }
    out
}

/// The Redis ledger's whole path: purchases, payments and cancellations answered by Redis,
/// holds left to expire, all persisted into MariaDB by the running persister (and the expiry
/// worker), and the relay that `serve` runs delivers each created, paid, cancelled and
/// expired transition once to a real nats-server, in order per order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_transitions_persisted_by_the_running_persister_reach_nats_once() {
    let (subject, stream) = nats_server::unique_names();
    let nats = NatsSettings {
        url: nats_server::shared_url(),
        subject,
        stream: stream.clone(),
    };
    let stack = Stack::redis_mysql_with(|c| c.engine.events.nats = Some(nats)).await;
    stack
        .live_sale_with(json!({"sku_id": 502, "name": "t", "total_stock": 40,
            "per_user_limit": 1, "mode": "reserve", "payment_timeout_ms": 1_500}))
        .await;
    let mut orders = Vec::new();
    for user in 1..=30 {
        orders.push(order_no(
            &stack.buy_ok(user, 502, &format!("r{user}"), 1).await,
        ));
    }
    for (user, no) in (1..=20).zip(&orders) {
        let action = if user <= 10 { "pay" } else { "cancel" };
        let path = format!("/api/v1/orders/{no}/{action}");
        let (s, b) = stack
            .call("POST", &path, Some(&stack.token(user)), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{action} {no}: {b}");
    }
    // Users 21–30 never pay: their holds expire. Done when the stream holds every
    // transition the database stored and the database stored all 60.
    let log = stack.store().event_log().unwrap();
    let nats_url = nats_server::shared_url();
    let (stored, delivered) = wait::until(
        "60 transitions stored and delivered",
        Duration::from_secs(60),
        || async {
            let delivered = consumed(&nats_url, &stream).await;
            let stored = relay::stored_events(log.as_ref()).await.ok()?;
            (stored.len() == 60 && check_exactly_once(&stored, &delivered).is_ok())
                .then_some((stored, delivered))
        },
    )
    .await;
    let count = |suffix: &str| stored.iter().filter(|e| e.suffix() == suffix).count();
    assert_eq!(
        [
            count("order.created"),
            count("order.paid"),
            count("order.cancelled"),
            count("order.expired")
        ],
        [30, 10, 10, 10]
    );
    assert_eq!(delivered.len(), 60, "Nats-Msg-Id kept every event once");
}
