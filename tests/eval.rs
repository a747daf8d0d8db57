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

// ------------------------------------------------------------ eval --format aggrefact

mod aggrefact {
    use super::*;
    use release_harness::tools::eval::aggrefact::report::{AggreFactReport, RowJudged};
    use release_harness::tools::eval::aggrefact::rows::{
        load_rows as load_rows_within, AggreFactRow, DEFAULT_MAX_ROWS_BYTES,
    };
    use release_harness::tools::eval::aggrefact::{run_aggrefact, select, RowChoice};

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/aggrefact/fixture.jsonl")
    }

    fn load_rows(
        path: &std::path::Path,
    ) -> Result<
        release_harness::tools::eval::aggrefact::rows::LoadedRows,
        release_harness::tools::eval::EvalError,
    > {
        load_rows_within(path, DEFAULT_MAX_ROWS_BYTES)
    }

    #[test]
    fn a_benchmark_file_that_is_not_a_regular_file_or_over_the_limit_is_refused_unread() {
        let dir = std::env::temp_dir().join(format!("aggrefact-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_a_file = load_rows(&dir).unwrap_err().to_string();
        assert!(not_a_file.contains("is not a regular file"), "{not_a_file}");
        let size = std::fs::metadata(fixture()).unwrap().len();
        let too_large = load_rows_within(&fixture(), size - 1)
            .unwrap_err()
            .to_string();
        assert!(too_large.contains("--max-bundle-bytes"), "{too_large}");
        assert!(load_rows_within(&fixture(), size).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    async fn judge(
        config: release_harness::config::Config,
        file: &std::path::Path,
    ) -> AggreFactReport {
        let (rows, selection, ignored) = select(load_rows(file).unwrap(), RowChoice::default());
        run_aggrefact(&config, file, &rows, selection, ignored, Progress::Hidden)
            .await
            .unwrap()
    }

    #[test]
    fn the_fixture_has_40_rows_of_3_datasets_both_labels_and_long_and_short_documents() {
        let rows: Vec<AggreFactRow> = load_rows(&fixture()).unwrap().rows;
        assert!(rows.len() >= 40, "{} rows", rows.len());
        let datasets: std::collections::BTreeSet<&str> =
            rows.iter().map(|r| r.dataset.as_str()).collect();
        assert!(datasets.len() >= 3, "{datasets:?}");
        for dataset in &datasets {
            for label in [true, false] {
                assert!(
                    rows.iter()
                        .any(|r| r.dataset == *dataset && r.supported == label),
                    "{dataset} has no row labelled {label}"
                );
            }
        }
        let limits = config(None).release_policy().snapshot;
        let excerpts = |r: &AggreFactRow| limits.split_excerpts(&r.doc).len();
        assert!(rows.iter().any(|r| r.doc.len() < 400), "short documents");
        assert!(
            rows.iter()
                .any(|r| excerpts(r) > 1 && excerpts(r) <= limits.max_entries_per_call),
            "long documents that still fit"
        );
        assert!(
            rows.iter()
                .any(|r| excerpts(r) > limits.max_entries_per_call),
            "a document over the judge's input budget"
        );
    }

    #[actix_rt::test]
    async fn a_judge_that_always_answers_supported_has_a_balanced_accuracy_of_one_half() {
        let model = FakeModel::start("127.0.0.1:0", FakeModelOptions::default()).unwrap();
        let report = judge(config(Some(&model.url)), &fixture()).await;
        model.stop().await;
        let rows = load_rows(&fixture()).unwrap().rows;
        assert_eq!(report.overall.rows, rows.len());
        assert_eq!(
            report.overall.not_judged, 0,
            "every row reaches the judge or is over budget"
        );
        assert_eq!(
            report.overall.over_budget, 2,
            "the sensor appendix, never cut"
        );
        assert_eq!(report.overall.protocol_failures, 0);
        for (name, figures) in &report.datasets {
            assert_eq!(figures.balanced_accuracy, Some(0.5), "{name}");
            assert_eq!(figures.false_release_rate, Some(1.0), "{name}");
            assert_eq!(figures.false_block_rate, Some(0.0), "{name}");
        }
        assert_eq!(report.balanced_accuracy_dataset_mean, Some(0.5));
        // Fail closed, the two over-budget rows (labels 1 and 0) count as not released:
        // postmortems' label-1 rows are released 6 of 7 times, its label-0 rows blocked 1
        // of 6 times: (6/7 + 1/6) / 2.
        let fail_closed = report.datasets["postmortems"]
            .balanced_accuracy_fail_closed
            .unwrap();
        assert!((fail_closed - (6.0 / 7.0 + 1.0 / 6.0) / 2.0).abs() < 1e-12);
        // The long documents reached the judge whole, in several excerpts.
        let long = report
            .results
            .iter()
            .find(|r| r.excerpts > 1 && r.judged == RowJudged::Supported)
            .unwrap();
        assert!(long.attempts[0].request_bytes as usize > long.doc_bytes);
        let over = report
            .results
            .iter()
            .find(|r| matches!(r.judged, RowJudged::OverBudget(_)))
            .unwrap();
        assert!(over.attempts.is_empty(), "never sent");
        assert!(over
            .why
            .as_deref()
            .unwrap()
            .contains("max_entries_per_call"));
        assert!(report
            .table()
            .contains("rows over the judge's input budget"));
    }

    /// A row in JSON Lines form; `steer` is a fake-model directive put in the claim.
    fn line(dataset: &str, label: u8, steer: &str, doc: &str) -> String {
        serde_json::json!({"dataset": dataset, "doc": doc,
                           "claim": format!("The valve was replaced on 23 July. {steer}"),
                           "label": label})
        .to_string()
    }

    #[actix_rt::test]
    async fn balanced_accuracy_by_hand_through_the_release_path() {
        // A: label 1 -> S, S, U (TPR 2/3); label 0 -> U, S (TNR 1/2): BA 7/12.
        // B: label 1 -> S, technical failure (TPR 1/2); label 0 -> U, U (TNR 1): BA 3/4.
        // C: a document the judge's input limit cannot hold (denied by the harness).
        // Pooled: label 1 released 3/5, label 0 blocked 3/4: BA 27/40.
        let doc = "The cooling loop valve V35 stuck and was replaced on 23 July.";
        let big = "The loop pressure rose above its alarm limit again. ".repeat(150);
        let (s, u) = ("[judge:SUPPORTED]", "[judge:UNSUPPORTED]");
        let lines = [
            line("A", 1, s, doc),
            line("A", 1, s, doc),
            line("A", 1, u, doc),
            line("A", 0, u, doc),
            line("A", 0, s, doc),
            line("B", 1, s, doc),
            line("B", 1, "[judge:error]", doc),
            line("B", 0, u, doc),
            line("B", 0, u, doc),
            line("C", 1, s, &big),
        ];
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rows.jsonl");
        std::fs::write(&file, lines.join("\n")).unwrap();
        let model = FakeModel::start("127.0.0.1:0", FakeModelOptions::default()).unwrap();
        let mut config = config(Some(&model.url));
        // 7.6 kB of document: two excerpts, over a 6 kB judge input.
        config.semantic_guard.max_input_bytes = 6_000;
        config.snapshot.max_excerpt_bytes = std::num::NonZero::new(4_096).unwrap();
        let report = judge(config, &file).await;
        model.stop().await;
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert!(close(report.datasets["A"].balanced_accuracy, 7.0 / 12.0));
        assert!(close(report.datasets["B"].balanced_accuracy, 0.75));
        assert!(close(report.overall.balanced_accuracy, 27.0 / 40.0));
        assert!(close(report.overall.false_release_rate, 1.0 / 4.0));
        assert!(close(report.overall.false_block_rate, 1.0 / 5.0));
        assert_eq!(report.overall.label_1.technical_failure, 1);
        assert_eq!(
            report.attempt_outcomes["transport"], 2,
            "two attempts, both failed"
        );
        let c = &report.datasets["C"];
        assert_eq!(c.over_budget, 1);
        assert_eq!(c.balanced_accuracy, None, "no row of C reached the judge");
        let denied = &report.results[9];
        assert!(matches!(denied.judged, RowJudged::OverBudget(_)));
        assert_eq!(denied.excerpts, 2);
        assert_eq!(denied.attempts[0].outcome, "budget_denied");
        let why = denied.why.as_deref().unwrap();
        assert!(why.contains("over the 6000-byte input limit"), "{why}");
        // C has no balanced accuracy, so the mean of datasets is not defined.
        assert_eq!(report.balanced_accuracy_dataset_mean, None);
    }

    #[test]
    fn eval_aggrefact_samples_gates_and_reads_csv() {
        let system = actix::System::new();
        let model = system
            .block_on(async { FakeModel::start("127.0.0.1:0", FakeModelOptions::default()) })
            .unwrap();
        let out = tempfile::tempdir().unwrap();
        let csv = out.path().join("rows.csv");
        std::fs::write(
            &csv,
            "dataset,doc,claim,label,contamination_identifier\n\
             X,\"The plant, line 3, stopped at 04:10.\",Line 3 stopped at 04:10.,1,abc\n\
             X,The plant stopped.,Line 2 stopped.,0,def\n",
        )
        .unwrap();
        let run = |args: Vec<String>| {
            let url = model.url.clone();
            let child = std::thread::spawn(move || {
                Command::new(env!("CARGO_BIN_EXE_release-harness"))
                    .args(["eval", "--format", "aggrefact", "--quiet"])
                    .args(args)
                    .env_remove("HARNESS_CONFIG")
                    .env("HARNESS__MODEL__BASE_URL", url)
                    .output()
                    .unwrap()
            });
            system.block_on(async {
                while !child.is_finished() {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            });
            child.join().unwrap()
        };
        let sampled = out.path().join("sampled");
        let result = run(vec![
            fixture().to_str().unwrap().into(),
            "--sample".into(),
            "9".into(),
            "--seed".into(),
            "3".into(),
            "--max-false-release".into(),
            "0.5".into(),
            "--out".into(),
            sampled.to_str().unwrap().into(),
        ]);
        assert_eq!(
            result.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
        assert!(String::from_utf8_lossy(&result.stderr).contains("above --max-false-release 0.5"));
        let table = String::from_utf8_lossy(&result.stdout);
        assert!(
            table.contains("balanced accuracy, mean of datasets"),
            "{table}"
        );
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(sampled.join("report.json")).unwrap())
                .unwrap();
        assert_eq!(report["format"], "aggrefact");
        assert_eq!(report["overall"]["rows"], 9);
        assert_eq!(report["selection"]["seed"], 3);
        assert_eq!(report["selection"]["file_rows"], 42);
        assert!(std::fs::read_to_string(sampled.join("report.md"))
            .unwrap()
            .contains("## By dataset"));

        let from_csv = out.path().join("csv");
        let result = run(vec![
            csv.to_str().unwrap().into(),
            "--out".into(),
            from_csv.to_str().unwrap().into(),
        ]);
        assert_eq!(result.status.code(), Some(0));
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(from_csv.join("report.json")).unwrap())
                .unwrap();
        assert_eq!(report["overall"]["rows"], 2);
        assert_eq!(report["ignored_columns"][0], "contamination_identifier");

        std::fs::write(&csv, "dataset,doc,claim,label\nX,d,c,2\n").unwrap();
        let result = run(vec![csv.to_str().unwrap().into()]);
        assert_eq!(result.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&result.stderr).contains("record 1"));
    }
}
