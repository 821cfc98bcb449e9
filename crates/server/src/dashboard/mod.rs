//! The live dashboard: the page at `/` (one HTML answer with its CSS, its JS and the vendored
//! uPlot chart library inlined, all compiled into the binary: it works with no network), and
//! the JSON it polls every second.
//!
//! - `GET /api/v1/dashboard`: public: every sale, its state and stock ([`view::public`]).
//! - `GET /api/v1/admin/dashboard`: admin: per sale answers per second, latency, stream lag,
//!   backlog, flags and the last reconciliation; breakers (the risk service's too, when one is
//!   configured) and script latency ([`view::admin`]).
//! - [`live`]: per-sale answers and latency of this instance, fed by the purchase handler.
//! - [`prom`]: reads back the numbers the process's Prometheus recorder exports.
//! - [`history`]: every sale's series from its start, sampled by the server each second
//!   (`GET /api/v1/dashboard/history/{sku}`, and the admin one with answers and latency).
//!
//! This module holds what the dashboard keeps between requests ([`Dashboard`], part of the
//! shared state); its routes (`routes::dashboard`: the page and the two JSON routes) read the
//! state.

pub mod history;
pub mod live;
pub mod prom;
pub mod view;

use std::time::Instant;

/// What the dashboard keeps between requests.
#[derive(Default)]
pub struct Dashboard {
    pub live: live::Live,
    pub history: history::History,
    pub scripts: view::ScriptReadings,
    /// The last public view and when it was made: anyone may poll it, during a sale too, so
    /// it is computed at most once per `routes::PUBLIC_TTL` whatever the number of pages open.
    pub(crate) public: tokio::sync::Mutex<Option<(Instant, view::PublicView)>>,
}
