//! The CLI's integration tests, one binary: the processes a user runs (`flashsale demo`,
//! `serve`, `worker`, behind HAProxy, killed with -9), the seeded fault schedules, and (ignored
//! unless `scripts/upgrade-check.sh` names the previous release's binary) a rolling upgrade.

mod demo;
mod fault_schedule;
mod haproxy;
mod kill9_serve;
mod relay_kill9;
mod secrets;
mod upgrade;
mod worker_http;
