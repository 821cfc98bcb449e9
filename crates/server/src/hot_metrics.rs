//! The request path's labelled metrics, through handles resolved once per thread. A labelled
//! `counter!` builds its key (owned label strings), hashes it and looks it up in the
//! recorder's registry at every call: a sold-out answer paid that three times, more than its
//! own work. A handle stays valid for the process (the recorder is global and installed
//! once), so each thread keeps the handles it has used, by label.

use std::cell::RefCell;
use std::collections::HashMap;

use flashsale_core::metric_names::{HTTP_REQUESTS, PURCHASES, PURCHASE_LATENCY, SOLD_OUT_LOCAL};
use metrics::{Counter, Histogram};

/// Label sets a thread keeps per metric (routes × statuses, outcomes); past it the thread's
/// map is emptied and refilled, so a flood of odd statuses cannot grow it.
const LABEL_SETS_MAX: usize = 1_024;

/// The maps of handles, hashed with aHash (looked up at every answer).
type ByLabel<K, V> = HashMap<K, V, ahash::RandomState>;

thread_local! {
    /// `http_requests_total` by status, then route template.
    static REQUESTS: RefCell<ByLabel<u16, ByLabel<Box<str>, Counter>>> = RefCell::default();
    /// The purchase latency histogram and counter by outcome.
    static PURCHASE: RefCell<ByLabel<&'static str, (Histogram, Counter)>> = RefCell::default();
    /// Purchases answered SOLD_OUT by the local flag.
    static SOLD_OUT_HERE: Counter = metrics::counter!(SOLD_OUT_LOCAL);
}

/// One purchase answered SOLD_OUT by the sale's local flag, without the ledger.
pub fn sold_out_local() {
    SOLD_OUT_HERE.with(|c| c.increment(1));
}

/// One answer of `route` (its template, or `unmatched`) with `status`.
pub fn http_request(route: &str, status: u16) {
    REQUESTS.with(|cell| {
        let mut by_status = cell.borrow_mut();
        if let Some(c) = by_status.get(&status).and_then(|r| r.get(route)) {
            c.increment(1);
            return;
        }
        if by_status.values().map(ByLabel::len).sum::<usize>() >= LABEL_SETS_MAX {
            by_status.clear();
        }
        let c = metrics::counter!(HTTP_REQUESTS, "route" => route.to_owned(),
            "status" => status.to_string());
        c.increment(1);
        by_status.entry(status).or_default().insert(route.into(), c);
    });
}

/// One purchase answered with `outcome` (`accepted`, `replayed` or an error code) after
/// `seconds`.
pub fn purchase(outcome: &'static str, seconds: f64) {
    PURCHASE.with(|cell| {
        let mut by_outcome = cell.borrow_mut();
        if by_outcome.len() >= LABEL_SETS_MAX && !by_outcome.contains_key(outcome) {
            by_outcome.clear();
        }
        let (latency, count) = by_outcome.entry(outcome).or_insert_with(|| {
            (
                metrics::histogram!(PURCHASE_LATENCY, "outcome" => outcome),
                metrics::counter!(PURCHASES, "outcome" => outcome),
            )
        });
        latency.record(seconds);
        count.increment(1);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_is_counted_once() {
        let handle = crate::metrics::handle();
        for _ in 0..3 {
            http_request("/hot-metrics-test", 418);
            purchase("HOT_METRICS_TEST", 0.001);
        }
        let text = handle.render();
        let line = |needle: &str| {
            text.lines()
                .find(|l| l.contains(needle) && !l.starts_with('#'))
                .map(str::to_owned)
        };
        let requests = line("route=\"/hot-metrics-test\"").expect("counted");
        assert!(requests.ends_with(" 3"), "{requests}");
        let purchases = line(&format!("{PURCHASES}{{outcome=\"HOT_METRICS_TEST\"}}"));
        assert!(purchases.expect("counted").ends_with(" 3"));
    }
}
