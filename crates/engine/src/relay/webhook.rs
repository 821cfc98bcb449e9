//! The webhook sink: one signed POST per event, in order, per Standard Webhooks
//! (<https://www.standardwebhooks.com>): headers `webhook-id` (the event id, which the
//! receiver deduplicates by), `webhook-timestamp` (Unix seconds) and `webhook-signature`
//! (`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` keyed by the secret's bytes, given
//! as `whsec_<base64>`); the body is the CloudEvent (structured mode). A 2xx acknowledges an
//! event; anything else (a status, a timeout, a dropped connection) stops the batch there, to
//! be retried from that event with backoff, so a sale's events arrive in order.

use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use flashsale_core::events::CloudEvent;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::time::Instant;

use super::Sink;

/// `FLASHSALE_WEBHOOK_*`.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    pub url: String,
    /// `whsec_<base64>`.
    pub secret: String,
    /// One request, at most.
    pub timeout: Duration,
    /// Failed tries in a row (each after a backoff) before the endpoint is paused.
    pub pause_after: u32,
}

impl std::fmt::Debug for WebhookSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSettings")
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .field("timeout", &self.timeout)
            .field("pause_after", &self.pause_after)
            .finish()
    }
}

impl WebhookSettings {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
    pub const DEFAULT_PAUSE_AFTER: u32 = 20;

    pub fn new(url: &str, secret: &str) -> WebhookSettings {
        WebhookSettings {
            url: url.to_owned(),
            secret: secret.to_owned(),
            timeout: Self::DEFAULT_TIMEOUT,
            pause_after: Self::DEFAULT_PAUSE_AFTER,
        }
    }
}

/// The key a `whsec_<base64>` secret stands for.
pub fn secret_key(secret: &str) -> anyhow::Result<Vec<u8>> {
    let b64 = secret
        .strip_prefix("whsec_")
        .context("FLASHSALE_WEBHOOK_SECRET must be whsec_<base64 of the key>")?;
    let key = B64
        .decode(b64)
        .context("FLASHSALE_WEBHOOK_SECRET: the part after whsec_ is not base64")?;
    anyhow::ensure!(
        key.len() >= 16,
        "FLASHSALE_WEBHOOK_SECRET: the key must be at least 16 bytes"
    );
    Ok(key)
}

/// The MAC of `body` sent as message `id` at `timestamp` (Unix seconds).
fn mac(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `webhook-signature` of `body` sent as message `id` at `timestamp` (Unix seconds).
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = mac(key, id, timestamp, body).finalize().into_bytes();
    format!("v1,{}", B64.encode(tag))
}

/// Whether `signature` (a `webhook-signature` header: space-separated `v1,<base64>`) signs
/// `body` as `id` at `timestamp`, compared in constant time: what a receiver checks (the
/// tests' and the demo's).
pub fn verify(key: &[u8], id: &str, timestamp: i64, body: &[u8], signature: &str) -> bool {
    signature
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|b64| B64.decode(b64).ok())
        .any(|tag| mac(key, id, timestamp, body).verify_slice(&tag).is_ok())
}

/// Posts events to one endpoint (see the module's doc).
pub struct WebhookSink {
    url: String,
    key: Vec<u8>,
    client: reqwest::Client,
    pause_after: u32,
}

impl WebhookSink {
    pub fn new(settings: &WebhookSettings) -> anyhow::Result<WebhookSink> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .build()?;
        Ok(WebhookSink {
            url: settings.url.clone(),
            key: secret_key(&settings.secret)?,
            client,
            pause_after: settings.pause_after.max(1),
        })
    }

    async fn post(&self, event: &CloudEvent) -> anyhow::Result<()> {
        let body = event.to_json();
        let timestamp = flashsale_core::clock::now_ms() / 1000;
        let signature = sign(&self.key, &event.id, timestamp, &body);
        let response = self
            .client
            .post(&self.url)
            .header("content-type", "application/cloudevents+json")
            .header("webhook-id", &event.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .with_context(|| format!("POST {}", self.url))?;
        let status = response.status();
        anyhow::ensure!(
            status.is_success(),
            "POST {} answered {status} for {}",
            self.url,
            event.id
        );
        Ok(())
    }
}

#[async_trait]
impl Sink for WebhookSink {
    fn name(&self) -> &'static str {
        "webhook"
    }

    async fn deliver(
        &mut self,
        events: &[CloudEvent],
        budget: Duration,
    ) -> (usize, Option<anyhow::Error>) {
        let deadline = Instant::now() + budget;
        for (i, event) in events.iter().enumerate() {
            if Instant::now() >= deadline {
                return (i, None);
            }
            if let Err(e) = self.post(event).await {
                return (i, Some(e));
            }
        }
        (events.len(), None)
    }

    fn pause_after(&self) -> Option<u32> {
        Some(self.pause_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's own example (its reference libraries' tests).
    #[test]
    fn signs_as_the_standard_webhooks_example() {
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(verify(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
            &sig
        ));
        assert!(!verify(&key, "msg_other", 1614265330, body, &sig));
    }

    #[test]
    fn a_secret_must_be_whsec_base64() {
        assert!(secret_key("plain").is_err());
        assert!(secret_key("whsec_%%%").is_err());
        assert!(secret_key("whsec_c2hvcnQ=").is_err());
    }
}
