//! Polling with a deadline that gives up quietly: for a harness that must report a condition
//! that never came as one finding among others, not abort the run (`wait::until` panics).

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every `every` until it returns `Some`, or `None` once `limit` has passed.
pub async fn within<T, F, Fut>(limit: Duration, every: Duration, mut check: F) -> Option<T>
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
