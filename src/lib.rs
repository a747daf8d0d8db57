//! release-harness decides whether an AI diagnosis agent's report may be shown to people.
//!
//! - [`domain`]: pure rules: Draft parsing, EvidenceGuard, snapshots, repair comparison,
//!   the release decision, budgets and the audit record.

pub mod domain;
