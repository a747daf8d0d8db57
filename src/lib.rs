//! release-harness decides whether an AI diagnosis agent's report may be shown to people.
//!
//! The layout, lowest layer first; a module imports only from the layers above it in this
//! list (`scripts/imports.py` prints the import graph), and nothing of the service imports
//! [`tools`].
//!
//! ```text
//! domain/            pure rules: no actix, Redis, HTTP or clock
//!   draft            the Draft and its strict parser
//!   invocation       canonical invocation records and tool projections
//!   scope            a projection's scope, as parsed and as shown
//!   evidence_guard   EvidenceGuard's rules; the run's evidence as loaded
//!   text             text as people read it (invisible controls dropped, NFKC)
//!   identifiers      the run's call ids and Redis keys, found and masked in text
//!   bounded          what is copied from records, masked and bounded
//!   snapshot         the verified snapshot, the ProgressSnapshot, verified sources
//!   repair_check     the comparison a repaired Draft must pass
//!   request          a release request and its validation
//!   outcome          stop reasons, outcomes, fallback types (label enums)
//!   release          the release decision and the release result
//!   budget           the per-run model budget
//!   audit            the operators' audit record
//!   json             the JSON text the harness writes
//! input_file         bounded reads of the files `check` and the tools take (regular
//!                    files only)
//! config             typed, layered configuration, validated once at start-up
//! telemetry          every metric name, the Prometheus recorder, tracing set-up
//! log_writer         stderr behind a bounded queue: logging never blocks or fails a caller
//! store/             where records are read and results kept: redis/ (connection,
//!                    scripts/*.lua and their typed arguments, answer reader, operations)
//!                    or memory; agent_records writes records as the agent's tool layer
//!                    would
//! model/             the model adapter: prompts (request bytes), body (JSON writing),
//!                    client (async-openai), capped (a model answer's body read
//!                    bounded), gate (the replica's model queue, cooldown,
//!                    circuit), envelope, verdict (strict answers), exchange (one
//!                    exchange read to its outcome: release path and probe-model)
//! actors/            the per-run actor tree: admission (the replica's in-flight bound),
//!                    registry (one per HTTP worker), shards,
//!                    supervisor/ (the run's state machine: steps, commit), repair,
//!                    semantic_guard, budget, attempt (one model attempt),
//!                    cancel_listener (P:cancel)
//! http/              the service: Application::build, front_door (the bounded h2c and
//!                    HTTP/1.1 front door), routes, auth, error (ApiError), openapi
//! check              `check`: one release offline from a run bundle
//! tools/             tooling, never imported by the service: soak/, fake_model,
//!                    fixtures, eval/, probe (probe-model), seed, fuzzing
//! ```

#![forbid(unsafe_code)]

pub mod actors;
pub mod check;
pub mod config;
pub mod domain;
pub mod http;
pub mod input_file;
pub mod log_writer;
pub mod model;
pub mod store;
pub mod telemetry;
pub mod tools;
