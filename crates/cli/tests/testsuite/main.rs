//! The CLI's integration tests, one binary: the processes a user runs (`flashsale demo`,
//! `serve`, `worker`, behind HAProxy, killed with -9) and the seeded fault schedules.

mod demo;
mod fault_schedule;
mod haproxy;
mod kill9_serve;
mod relay_kill9;
mod secrets;
mod worker_http;
