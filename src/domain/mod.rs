//! Pure domain logic: no actix, Redis, HTTP or clock in here.
//!
//! - [`draft`]: the Draft and its strict parser.
//! - [`invocation`]: canonical invocation records and tool projections.
//! - [`scope`]: a projection's scope, as parsed and as shown.
//! - [`evidence_guard`]: EvidenceGuard rules and the no-conclusion reference review.
//! - [`identifiers`]: the run's call ids and Redis keys, found and masked in text.
//! - [`bounded`]: what is copied from records, masked and bounded.
//! - [`snapshot`]: the verified snapshot, the ProgressSnapshot and verified sources.
//! - [`repair_check`]: the comparison a repaired Draft must pass.
//! - [`request`]: a release request and its validation.
//! - [`release`]: the release decision and the release result.
//! - [`budget`]: the per-run model budget.
//! - [`audit`]: the operators' audit record.
//! - [`json`]: the JSON text the harness writes (fast, byte-identical to `serde_json`).

pub mod audit;
pub mod bounded;
pub mod budget;
pub mod draft;
pub mod evidence_guard;
pub mod identifiers;
pub mod invocation;
pub mod json;
pub mod release;
pub mod repair_check;
pub mod request;
pub mod scope;
pub mod snapshot;
