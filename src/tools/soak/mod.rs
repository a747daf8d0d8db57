//! Soak and load tooling: the scenario mix with expected outcomes ([`scenarios`]), the
//! `release-harness soak` driver ([`run`]), its report ([`report`]) and the integrity checks
//! after a run under injected faults ([`chaos`]). Its run data is [`super::fixtures`], its
//! model [`super::fake_model`].

pub mod chaos;
pub mod report;
pub mod run;
pub mod scenarios;

pub use run::{run, SoakArgs, SoakError};
