//! The binary's command line (CONTRACT §6): `check` exit codes and its account on stderr,
//! configuration errors, and `serve` refusing to listen off loopback without a token.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::process::{Command, Output};

use common::*;
use serde_json::Value;
use wiremock::MockServer;

fn harness(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_release-harness"));
    command.args(args).env_remove("HARNESS_CONFIG");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("the binary runs")
}

fn example(name: &str) -> String {
    format!("{}/examples/runs/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn check_without_a_model_fails_closed_with_exit_1_and_explains_why() {
    let out = harness(
        &["check", &example("success-supported.json")],
        &[("HARNESS__MODEL__BASE_URL", "")],
    );
    assert_eq!(out.status.code(), Some(1));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["fallback_type"], "SEMANTIC_UNAVAILABLE");
    let account = String::from_utf8_lossy(&out.stderr);
    assert!(account.contains("EvidenceGuard passed"), "{account}");
    assert!(account.contains("no model is configured"), "{account}");

    let out = harness(
        &["check", &example("evidence-incomplete-call.json")],
        &[("HARNESS__MODEL__BASE_URL", "")],
    );
    assert_eq!(out.status.code(), Some(1));
    let account = String::from_utf8_lossy(&out.stderr);
    assert!(
        account.contains("call_not_ready at analyses[2] call call-sql-01: lifecycle is PROJECTING"),
        "{account}"
    );
    assert!(
        account.contains("repair not run: no model is configured"),
        "{account}"
    );
}

#[actix_rt::test]
async fn check_with_a_supporting_model_exits_0() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let uri = server.uri();
    let out = tokio::task::spawn_blocking(move || {
        harness(
            &["check", &example("success-supported.json")],
            &[("HARNESS__MODEL__BASE_URL", &uri)],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["outcome"], "SUCCESS");
    assert!(String::from_utf8_lossy(&out.stderr).contains("SemanticGuard: SUPPORTED"));
}

#[actix_rt::test]
async fn check_of_a_draft_naming_a_call_id_fails_closed_without_any_model_call() {
    let server = MockServer::start().await;
    on_repair(&server, content("{}")).await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let uri = server.uri();
    let out = tokio::task::spawn_blocking(move || {
        harness(
            &["check", &example("evidence-draft-names-call-id.json")],
            &[("HARNESS__MODEL__BASE_URL", &uri)],
        )
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["fallback_type"], "EVIDENCE_VALIDATION_FAILED");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("call-log-01"));
    let account = String::from_utf8_lossy(&out.stderr);
    assert!(
        account.contains("draft_names_identifier at limitations[0] call call-log-01"),
        "{account}"
    );
    assert!(requests(&server).await.is_empty(), "no repair, no judge");
}

#[test]
fn bad_bundles_files_and_configuration_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let not_json = dir.path().join("not.json");
    std::fs::write(&not_json, "{ this is not json").unwrap();
    let bad_run = dir.path().join("bad-run.json");
    std::fs::write(&bad_run, r#"{"run_id": "r/1", "query": "q", "draft": "x"}"#).unwrap();
    for (args, env) in [
        (
            vec![
                "check".to_string(),
                example("bad-bundle-unknown-stop-reason.json"),
            ],
            vec![],
        ),
        (vec!["check".into(), not_json.display().to_string()], vec![]),
        (vec!["check".into(), bad_run.display().to_string()], vec![]),
        (
            vec![
                "check".into(),
                dir.path().join("missing.json").display().to_string(),
            ],
            vec![],
        ),
        (
            vec!["check".into(), example("success-supported.json")],
            vec![("HARNESS__SEMANTIC_GUARD__MAX_ATTEMPTS", "0")],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = harness(&args, &env);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout.is_empty(),
            "no result is printed for a bad bundle"
        );
        assert!(!out.stderr.is_empty(), "the reason is printed");
    }
}

#[test]
fn serve_refuses_a_non_loopback_address_without_a_token() {
    let out = harness(
        &["serve"],
        &[
            ("HARNESS__SERVER__LISTEN", "0.0.0.0:0"),
            ("HARNESS__SERVER__API_TOKEN", ""),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("without server.api_token"), "{message}");
}
