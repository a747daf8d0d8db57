//! Tooling around the service, compiled into the binary's subcommands, the tests and the
//! benches, and never imported by the service itself (`domain`, `store`, `model`, `actors`,
//! `http`, `config`, `telemetry`, `check`; the test below holds that line).
//!
//! - [`soak`]: `release-harness soak`, a load and invariant driver with its report;
//! - [`fake_model`]: `release-harness fake-model`, an OpenAI-compatible stand-in;
//! - [`fixtures`]: realistic run data (records, Drafts, bundles) for the soak, the benches
//!   and the tests' kit (`tests/common`);
//! - [`eval`]: `release-harness eval`, the judge measured on a labelled corpus;
//! - [`probe`]: `release-harness probe-model` and `serve`'s start-up check of the model;
//! - [`seed`]: `release-harness seed`, a bundle's records written into Redis;
//! - [`fuzzing`]: the parsers of untrusted input on raw bytes, for `cargo fuzz` and the
//!   corpus replay test.

pub mod eval;
pub mod fake_model;
pub mod fixtures;
pub mod fuzzing;
pub mod probe;
pub mod seed;
pub mod soak;

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every `.rs` file below `dir` (or `dir` itself when it is a file).
    fn sources(path: &Path, out: &mut Vec<std::path::PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                sources(&entry.unwrap().path(), out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
    }

    #[test]
    fn the_service_never_imports_the_tools() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for module in [
            "domain",
            "store",
            "model",
            "actors",
            "http",
            "config.rs",
            "telemetry.rs",
            "check.rs",
        ] {
            sources(&src.join(module), &mut files);
        }
        assert!(files.len() > 30, "the service's sources were not found");
        let offenders: Vec<_> = files
            .iter()
            .filter(|f| {
                let text = std::fs::read_to_string(f).unwrap();
                text.contains("crate::tools") || text.contains("release_harness::tools")
            })
            .collect();
        assert!(
            offenders.is_empty(),
            "service modules import tooling: {offenders:?}"
        );
    }
}
