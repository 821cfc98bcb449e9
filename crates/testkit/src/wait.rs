//! Polling with a deadline. Tests never sleep to synchronise; they poll a condition.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 20 ms until it returns `Some`, or panics with `what` after `limit`.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `check` every 20 ms for at most `limit`: `Some` as soon as it holds, `None` when it
/// never did. For what must NOT happen within a bound (a flag that must stay unset).
pub async fn within<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
