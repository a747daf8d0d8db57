//! Soak and load tooling: realistic run data ([`fixtures`]), a fake OpenAI-compatible
//! model ([`fake_model`]), the scenario mix with expected outcomes ([`scenarios`]), the
//! `release-harness soak` driver ([`run`]), its report ([`report`]) and the integrity checks
//! after a run under injected faults ([`chaos`]).

pub mod chaos;
pub mod fake_model;
pub mod fixtures;
pub mod report;
pub mod run;
pub mod scenarios;

pub use run::{run, SoakArgs};
