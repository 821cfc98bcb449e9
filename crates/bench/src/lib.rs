//! flashsale-bench: load that tells the truth about a flash sale.
//!
//! - [`closed`]: a closed-loop driver for comparing endpoints under the same load.
//! - [`load`]: fires buyers at a sale over HTTP: open-loop spike arrivals (every buyer within
//!   `ramp_ms`) or closed-loop concurrency, keep-alive connections, timeouts and retries with the
//!   same request id. Latency counts from the scheduled arrival, so a stalled server is not
//!   hidden by the client waiting politely (coordinated omission).
//! - [`summary`]: outcomes, latency percentiles (hdrhistogram) and a timeline from the records.
//! - [`series`]: answers by outcome and latency percentiles over time, a latency histogram.
//! - [`procs`]: CPU time per process (`/proc/<pid>/stat`) for µs per answer per process.
//! - [`lifecycle`]: a reserve-mode sale's holds over time (reserved, paid, cancelled,
//!   expired, resold), from the database's events.
//! - [`report`]: the JSON and the self-contained HTML of a run; [`charts`]: its inline SVG.
//! - [`harness`]: the measurements `flashsale bench` runs (release mode), in-process against
//!   the service's own ledgers, store, engine and server, or over HTTP.
//!
//! The load modules depend on core (for ids) and client libraries only; the harness may
//! depend on every crate of the workspace but the binary.

pub mod charts;
pub mod closed;
pub mod harness;
pub mod lifecycle;
pub mod load;
pub mod procs;
pub mod report;
pub mod series;
pub mod summary;
