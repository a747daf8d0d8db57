//! Soak and load tooling: realistic run data ([`fixtures`]), a fake OpenAI-compatible
//! model ([`fake_model`]), and the `release-harness soak` command ([`run`]) that drives
//! a harness with a realistic mix of runs and checks its invariants.

pub mod fake_model;
pub mod fixtures;
