//! Polling with a deadline. Tests never sleep to synchronise; they poll a condition.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`until`] and [`within`] poll.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Polls `check` until it returns `Some`, or panics with `what` after `limit`.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match within(limit, check).await {
        Some(value) => value,
        None => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Polls `check` for at most `limit`: `Some` as soon as it holds, `None` when it never did.
/// For what must NOT happen within a bound (a flag that must stay unset), and for a harness
/// that reports a condition that never came as one finding among others.
pub async fn within<T, F, Fut>(limit: Duration, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within_every(limit, POLL_EVERY, check).await
}

/// Like [`within`], polling every `every`.
pub async fn within_every<T, F, Fut>(limit: Duration, every: Duration, mut check: F) -> Option<T>
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
        tokio::time::sleep(every).await;
    }
}
