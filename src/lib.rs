//! release-harness decides whether an AI diagnosis agent's report may be shown to people.
//!
//! - [`domain`]: pure rules: Draft parsing, EvidenceGuard, snapshots, repair comparison,
//!   the release decision, budgets and the audit record.
//! - [`store`]: Redis and in-memory stores (key schema, records, results, locks, cancels).
//! - [`config`]: typed, layered, validated configuration.
//! - [`telemetry`]: metric names, the Prometheus recorder, tracing.
//! - [`tools`]: soak, fake model, eval, probe report, seed and fuzz entry points; never
//!   imported by the modules above.

#![forbid(unsafe_code)]

pub mod actors;
pub mod check;
pub mod config;
pub mod domain;
pub mod http;
pub mod model;
pub mod store;
pub mod telemetry;
pub mod tools;
