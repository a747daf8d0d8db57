//! End-to-end tests over HTTP: the app on port 0, the suite's real redis-server, the model
//! as a real HTTP server (wiremock, or a raw TCP peer that never answers). All API tests
//! live in this one binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../common/mod.rs"]
mod common;

mod cancel;
mod cluster;
mod conformance;
mod decisions;
mod faults;
mod helpers;
mod hostile;
mod operations;
mod overload;
mod redis_outage;
mod round_trips;
mod routes;
mod shutdown;
