//! Soak and load tooling: realistic run data ([`fixtures`]), a fake OpenAI-compatible
//! model ([`fake_model`]), the scenario mix with expected outcomes ([`scenarios`]), the
//! `release-harness soak` driver ([`run`]) and its report ([`report`]).

pub mod fake_model;
pub mod fixtures;
pub mod report;
pub mod run;
pub mod scenarios;

pub use run::{run, SoakArgs};
