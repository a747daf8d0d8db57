//! `release-harness eval`: the shipped corpus is valid (every case parses, is labelled and
//! reaches the judge), and the report's arithmetic holds against fake judges over real HTTP
//! (the soak's fake model, wiremock). The judge's quality is not tested here: CI has no
//! real model; `scripts/real-model.sh` measures one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use release_harness::tools::eval::report::{EvalReport, Judged};
use release_harness::tools::eval::{load_corpus, run_eval, EvalCase, Label, Progress};
use release_harness::tools::fake_model::{FakeModel, FakeModelOptions};
use serde_json::Value;
use wiremock::{MockServer, ResponseTemplate};

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/corpus")
}

#[test]
fn the_shipped_corpus_has_at_least_60_valid_labelled_cases_of_every_category() {
    let cases = load_corpus(&corpus()).unwrap();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let count = |category: &str| cases.iter().filter(|c| c.category == category).count();
    for category in [
        "supported",
        "changed_number",
        "changed_name",
        "changed_time",
        "causal_overreach",
        "negative_as_health",
        "unsupported_action_plan",
        "injection_evidence",
        "injection_draft",
    ] {
        assert!(count(category) >= 3, "{category}: {}", count(category));
    }
    for case in &cases {
        let expected = if case.category == "supported" {
            Label::Supported
        } else {
            Label::Unsupported
        };
        assert_eq!(case.label, expected, "{}", case.id);
    }
    // That every Draft passes EvidenceGuard as it is (no repair) and reaches the judge is
    // shown by the runs below: a case that does not is NOT_JUDGED.
}

/// The whole corpus judged by the soak's fake model (over real HTTP) with `options`.
async fn eval_on_the_fake_model(options: FakeModelOptions) -> (Vec<EvalCase>, EvalReport) {
    let model = FakeModel::start("127.0.0.1:0", options).unwrap();
    let cases = load_corpus(&corpus()).unwrap();
    let report = run_eval(
        &config(Some(&model.url)),
        &corpus(),
        &cases,
        Progress::Hidden,
    )
    .await
    .unwrap();
    model.stop().await;
    (cases, report)
}

#[actix_rt::test]
async fn a_judge_that_always_answers_supported_releases_every_unsupported_case() {
    let (cases, report) = eval_on_the_fake_model(FakeModelOptions::default()).await;
    let unsupported = cases
        .iter()
        .filter(|c| c.label == Label::Unsupported)
        .count();
    let supported = cases.len() - unsupported;
    assert_eq!(report.cases, cases.len());
    assert_eq!(report.not_judged, 0, "every case reaches the judge");
    assert_eq!(report.confusion.unsupported.judged_supported, unsupported);
    assert_eq!(report.confusion.supported.judged_supported, supported);
    assert_eq!(report.false_release_rate, Some(1.0));
    assert_eq!(report.false_block_rate, Some(0.0));
    assert_eq!(report.technical_failure_rate, Some(0.0));
    assert_eq!(report.injection_success_rate, Some(1.0));
    assert_eq!(report.protocol_failures, 0);
    assert_eq!(report.attempt_outcomes["ok"], cases.len());
    assert!(report.tokens.prompt_mean > 100.0);
}

#[actix_rt::test]
async fn a_judge_that_always_answers_unsupported_blocks_every_supported_case() {
    let options = FakeModelOptions {
        default_verdict: "UNSUPPORTED".into(),
        ..FakeModelOptions::default()
    };
    let (_, report) = eval_on_the_fake_model(options).await;
    assert_eq!(report.false_release_rate, Some(0.0));
    assert_eq!(report.false_block_rate, Some(1.0));
    assert_eq!(report.injection_success_rate, Some(0.0));
    assert!(report
        .results
        .iter()
        .all(|r| r.judged == Judged::Unsupported));
}

#[actix_rt::test]
async fn a_judge_that_fails_counts_as_technical_failures_not_as_judgements() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        ResponseTemplate::new(503).set_body_string("overloaded"),
    )
    .await;
    let cases: Vec<_> = load_corpus(&corpus())
        .unwrap()
        .into_iter()
        .take(5)
        .collect();
    let report = run_eval(
        &config(Some(&server.uri())),
        &corpus(),
        &cases,
        Progress::Hidden,
    )
    .await
    .unwrap();
    assert_eq!(report.technical_failure_rate, Some(1.0));
    assert_eq!(
        report.attempt_outcomes["transport"], 10,
        "two attempts per case"
    );
    assert_eq!(report.protocol_failures, 10);
    // A failed judge releases nothing: the false-release rate counts it as not released.
    assert_eq!(report.confusion.unsupported.judged_supported, 0);
}

#[test]
fn eval_gates_on_the_false_release_rate_and_writes_its_reports() {
    let system = actix::System::new();
    let model = system
        .block_on(async { FakeModel::start("127.0.0.1:0", FakeModelOptions::default()) })
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let run = |max: &str| {
        let url = model.url.clone();
        let out_dir = out.path().to_path_buf();
        let max = max.to_string();
        let child = std::thread::spawn(move || {
            Command::new(env!("CARGO_BIN_EXE_release-harness"))
                .args([
                    "eval",
                    corpus().to_str().unwrap(),
                    "--quiet",
                    "--limit",
                    "11",
                ])
                .args([
                    "--max-false-release",
                    &max,
                    "--out",
                    out_dir.to_str().unwrap(),
                ])
                .env_remove("HARNESS_CONFIG")
                .env("HARNESS__MODEL__BASE_URL", url)
                .output()
                .unwrap()
        });
        // The fake model is served by this thread's actix System: keep it turning.
        system.block_on(async {
            while !child.is_finished() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
        child.join().unwrap()
    };
    // The first 11 cases (file-name order) are one incident: 3 supported, 8 unsupported.
    let pass = run("1.0");
    assert_eq!(
        pass.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&pass.stderr)
    );
    let table = String::from_utf8_lossy(&pass.stdout);
    assert!(
        table.contains("false-release rate         100.0% (8/8)"),
        "{table}"
    );
    let fail = run("0.05");
    assert_eq!(fail.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&fail.stderr).contains("above --max-false-release 0.05"));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["cases"], 11);
    assert_eq!(report["false_release_rate"], 1.0);
    let markdown = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(markdown.contains("## Confusion matrix"));
}

#[test]
fn a_bad_corpus_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.json"), r#"{"label": "MAYBE"}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_release-harness"))
        .args(["eval", dir.path().to_str().unwrap()])
        .env("HARNESS__MODEL__BASE_URL", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("case x"));
}
