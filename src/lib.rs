//! release-harness decides whether an AI diagnosis agent's report may be shown to people.
//!
//! - [`domain`]: pure rules: Draft parsing, EvidenceGuard, snapshots, repair comparison,
//!   the release decision, budgets and the audit record.
//! - [`store`]: Redis and in-memory stores (key schema, records, results, locks, cancels).
//! - [`config`]: typed, layered, validated configuration.
//! - [`telemetry`]: metric names, the Prometheus recorder, tracing.
//! - [`eval`]: `release-harness eval`: the judge measured on a labelled corpus.
//! - [`fuzzing`]: the parsers of untrusted input on raw bytes, for `cargo fuzz` and the
//!   corpus replay test.

#![forbid(unsafe_code)]

pub mod actors;
pub mod check;
pub mod config;
pub mod domain;
pub mod eval;
pub mod fuzzing;
pub mod http;
pub mod model;
pub mod soak;
pub mod store;
pub mod telemetry;
