//! `release-harness eval CORPUS_DIR`: the judge's quality as numbers.
//!
//! Entry points: [`load_corpus`] (labelled run bundles, strict), [`run_eval`] (each case
//! through the same actor tree, request building and verdict parsing as `serve`, against
//! the configured model) and [`report::EvalReport`] (the arithmetic and its renderings).
//! [`aggrefact`] does the same for rows of the public LLM-AggreFact benchmark
//! (`eval --format aggrefact FILE`).

pub mod aggrefact;
pub mod report;

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::check::{run_check, RunBundle};
use crate::config::Config;
use crate::domain::release::FallbackType;
use report::{CaseResult, EvalReport, Judged};

/// What a careful reviewer answers for a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Label {
    Supported,
    Unsupported,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Supported => "SUPPORTED",
            Label::Unsupported => "UNSUPPORTED",
        }
    }
}

/// One labelled case: a run bundle plus its label, category and a note.
#[derive(Debug)]
pub struct EvalCase {
    /// The file name without `.json`.
    pub id: String,
    pub label: Label,
    /// e.g. `supported`, `changed_number`, `injection_evidence`.
    pub category: String,
    pub note: String,
    pub bundle: RunBundle,
}

impl EvalCase {
    /// Whether the case carries a prompt injection (its category starts with `injection`).
    pub fn is_injection(&self) -> bool {
        self.category.starts_with("injection")
    }

    /// Parses a case: the bundle's fields plus `label`, `category` and `note`.
    pub fn parse(id: &str, text: &str) -> Result<EvalCase, EvalError> {
        let bad = |why: String| EvalError::Case {
            case: id.to_string(),
            why,
        };
        let mut fields: serde_json::Map<String, Value> =
            serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
        let label = fields
            .remove("label")
            .ok_or_else(|| bad("no label".into()))
            .and_then(|v| {
                serde_json::from_value::<Label>(v)
                    .map_err(|_| bad("label must be SUPPORTED or UNSUPPORTED".into()))
            })?;
        let category = match fields.remove("category") {
            Some(Value::String(c)) if !c.trim().is_empty() => c,
            _ => return Err(bad("category must be a non-blank string".into())),
        };
        if label == Label::Supported && category != "supported" {
            return Err(bad(format!(
                "a SUPPORTED case has the category {category:?}, not \"supported\""
            )));
        }
        let note = match fields.remove("note") {
            Some(Value::String(n)) => n,
            None => String::new(),
            Some(_) => return Err(bad("note must be a string".into())),
        };
        let bundle_text = serde_json::to_string(&fields).map_err(|e| bad(e.to_string()))?;
        let bundle = RunBundle::parse(&bundle_text).map_err(|e| bad(e.to_string()))?;
        bundle.request().map_err(|e| bad(e.to_string()))?;
        Ok(EvalCase {
            id: id.to_string(),
            label,
            category,
            note,
            bundle,
        })
    }
}

/// A corpus or configuration that cannot be evaluated (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Input(Box<crate::input_file::InputError>),
    #[error("case {case}: {why}")]
    Case { case: String, why: String },
    #[error("the corpus {0} holds no case (*.json)")]
    Empty(PathBuf),
    #[error("{0} holds no row")]
    NoRows(PathBuf),
    #[error("--sample applies to --format aggrefact only")]
    SampleOfCorpus,
    #[error("no model is configured (model.base_url is empty): eval measures a model")]
    NoModel,
    #[error("cannot write the report into {dir}: {source}")]
    Write {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Every `*.json` of `dir`, in file-name order, parsed strictly.
pub fn load_corpus(dir: &Path) -> Result<Vec<EvalCase>, EvalError> {
    load_corpus_with(dir, None, crate::input_file::DEFAULT_MAX_BUNDLE_BYTES)
}

/// The first `limit` (all without one) `*.json` of `dir`, in file-name order, parsed
/// strictly: only those files are read, each a regular file of at most `max_bytes`.
pub fn load_corpus_with(
    dir: &Path,
    limit: Option<usize>,
    max_bytes: u64,
) -> Result<Vec<EvalCase>, EvalError> {
    let read_err = |source| EvalError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(EvalError::Empty(dir.to_path_buf()));
    }
    paths.truncate(limit.unwrap_or(usize::MAX));
    paths
        .iter()
        .map(|path| {
            let text = crate::input_file::read_bounded(path, max_bytes)
                .map_err(|e| EvalError::Input(Box::new(e)))?;
            let id = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            EvalCase::parse(&id, &text)
        })
        .collect()
}

/// How an eval run is shown while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A progress bar on stderr.
    Bar,
    Hidden,
}

/// Runs every case through the release path and returns the report. Must run inside an
/// actix System. Each case is its own release (in-memory store, fresh actor tree), one at a
/// time, so latency is the model's for that case alone.
pub async fn run_eval(
    config: &Config,
    corpus: &Path,
    cases: &[EvalCase],
    progress: Progress,
) -> Result<EvalReport, EvalError> {
    if !config.model_configured() {
        return Err(EvalError::NoModel);
    }
    let bar = progress_bar(cases.len(), progress, "cases");
    let started = std::time::Instant::now();
    let mut results = Vec::with_capacity(cases.len());
    for case in cases {
        bar.set_message(case.id.clone());
        let result = match run_check(config.clone(), &case.bundle).await {
            Ok(output) => case_result(case, &output.audit, output.result.fallback_type),
            Err(e) => CaseResult::not_judged(case, format!("the release failed: {e}")),
        };
        results.push(result);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(EvalReport::build(
        corpus.display().to_string(),
        config,
        started.elapsed(),
        results,
    ))
}

/// The model attempts of a release, from its audit record.
pub(crate) fn attempt_summaries(audit: &Value) -> Vec<report::AttemptSummary> {
    audit["model_attempts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| report::AttemptSummary {
            role: a["role"].as_str().unwrap_or_default().to_string(),
            outcome: a["outcome"].as_str().unwrap_or_default().to_string(),
            detail: a["detail"].as_str().map(str::to_string),
            latency_ms: a["latency_ms"].as_f64().unwrap_or(0.0),
            prompt_tokens: a["prompt_tokens"].as_u64(),
            completion_tokens: a["completion_tokens"].as_u64(),
            request_bytes: a["request_bytes"].as_u64().unwrap_or(0),
        })
        .collect()
}

/// The judge's reason from an audit record, at most 200 characters.
pub(crate) fn bounded_reason(audit: &Value) -> Option<String> {
    audit["verdict"]["reason"].as_str().map(|full| {
        let mut r: String = full.chars().take(200).collect();
        if r.len() < full.len() {
            r.push('…');
        }
        r
    })
}

/// Reads what the judge decided from the release's audit record.
fn case_result(case: &EvalCase, audit: &Value, fallback: Option<FallbackType>) -> CaseResult {
    let attempts = attempt_summaries(audit);
    let verdict = audit["verdict"]["verdict"].as_str();
    let violations = audit["violations"].as_array().map_or(0, Vec::len);
    let judged = match (verdict, fallback) {
        // A case must reach the judge as it is: a Draft that needed a repair measures the
        // repair, not the judge.
        _ if violations > 0 => Judged::NotJudged(format!(
            "the Draft failed EvidenceGuard ({violations} violation(s))"
        )),
        (Some("SUPPORTED"), _) => Judged::Supported,
        (Some("UNSUPPORTED"), _) => Judged::Unsupported,
        (_, Some(FallbackType::SemanticUnavailable)) => Judged::TechnicalFailure,
        (_, other) => Judged::NotJudged(format!(
            "the case did not reach the judge ({})",
            other.map(FallbackType::as_str).unwrap_or("no fallback")
        )),
    };
    CaseResult {
        id: case.id.clone(),
        category: case.category.clone(),
        label: case.label,
        injection: case.is_injection(),
        judged,
        reason: bounded_reason(audit),
        attempts,
    }
}

/// The limits a run of `eval` is held to (its `--max-*` flags).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gate {
    pub max_false_release: Option<f64>,
    pub max_protocol_failures: Option<usize>,
}

impl Gate {
    /// What the report breaks of these limits (empty: the eval passes). A case that never
    /// reached the judge always fails it: the corpus did not measure what it claims to.
    pub fn failures(&self, report: &EvalReport) -> Vec<String> {
        let mut failed = Vec::new();
        if let (Some(max), Some(rate)) = (self.max_false_release, report.false_release_rate) {
            if rate > max {
                failed.push(format!(
                    "false-release rate {rate:.3} is above --max-false-release {max}"
                ));
            }
        }
        if let Some(max) = self.max_protocol_failures {
            if report.protocol_failures > max {
                failed.push(format!(
                    "{} protocol failure(s), more than --max-protocol-failures {max}",
                    report.protocol_failures
                ));
            }
        }
        if report.not_judged > 0 {
            failed.push(format!(
                "{} case(s) never reached the judge (see report.md)",
                report.not_judged
            ));
        }
        failed
    }
}

/// A progress bar on stderr over `len` items called `unit`, or a hidden one.
pub(crate) fn progress_bar(len: usize, progress: Progress, unit: &str) -> ProgressBar {
    let bar = match progress {
        Progress::Bar => {
            ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr())
        }
        Progress::Hidden => ProgressBar::hidden(),
    };
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Writes `report.json` (`report` as JSON) and `report.md` into `dir` (created if needed).
pub(crate) fn write_files<T: serde::Serialize>(
    dir: &Path,
    report: &T,
    markdown: &str,
) -> Result<(), EvalError> {
    let failed = |source| EvalError::Write {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    let json = serde_json::to_string_pretty(report).map_err(|e| failed(e.into()))?;
    std::fs::write(dir.join("report.json"), json).map_err(failed)?;
    std::fs::write(dir.join("report.md"), markdown).map_err(failed)?;
    Ok(())
}

/// Writes `report.json` and `report.md` into `dir` (created if needed).
pub fn write_report(report: &EvalReport, dir: &Path) -> Result<(), EvalError> {
    write_files(dir, report, &report.markdown())
}
