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
    assert_eq!(
        message.matches("refusing").count(),
        1,
        "the refusal is said once: {message}"
    );
    // A blank token is no token: refused too, whatever the address.
    for listen in ["0.0.0.0:0", "127.0.0.1:0"] {
        let out = harness(
            &["serve"],
            &[
                ("HARNESS__SERVER__LISTEN", listen),
                ("HARNESS__SERVER__API_TOKEN", "  "),
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{listen}");
        let message = String::from_utf8_lossy(&out.stderr);
        assert!(message.contains("server.api_token"), "{message}");
        assert!(
            !message.contains('\u{1b}'),
            "no colour codes off a terminal"
        );
    }
}

#[test]
fn a_bundle_error_names_the_field_path() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("object-projection.json");
    std::fs::write(
        &bundle,
        r#"{"run_id": "r-1", "query": "q", "draft": "x",
            "invocations": [{"run_id": "r-1", "tool_call_id": "c-1",
                             "agent_result": {"tool": "log_search"}}]}"#,
    )
    .unwrap();
    let out = harness(&["check", &bundle.display().to_string()], &[]);
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.contains(
            "invocations[0].agent_result: invalid type: map, expected a JSON string holding the projection"
        ),
        "{message}"
    );
}

#[test]
fn check_prints_no_negative_zero() {
    let out = harness(
        &["check", &example("controlled-stop-saturation.json")],
        &[("HARNESS__MODEL__BASE_URL", "")],
    );
    let account = String::from_utf8_lossy(&out.stderr);
    assert!(account.contains("ms waiting on the model"), "{account}");
    assert!(!account.contains("-0.0"), "{account}");
}

#[test]
fn fake_model_help_lists_its_directives() {
    let out = harness(&["fake-model", "--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for directive in [
        "[judge:SUPPORTED]",
        "[judge:UNSUPPORTED]",
        "[judge:error]",
        "[judge:garbage]",
        "[judge:flaky]",
        "[judge:hang]",
        "[repair:rewrite]",
    ] {
        assert!(help.contains(directive), "{directive}: {help}");
    }
}

#[test]
fn soak_without_redis_fails_at_once_naming_it() {
    // A port nothing listens on: the soak must say so before it starts, not after its run.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let out = harness(
        &[
            "soak",
            "--duration",
            "600",
            "--report-dir",
            &dir.path().display().to_string(),
        ],
        &[
            ("HARNESS__REDIS__URL", &url),
            ("HARNESS__REDIS__CONNECTION_TIMEOUT_MS", "500"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("cannot reach Redis at"), "{message}");
    assert!(message.contains(&url), "names it: {message}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "no report: nothing was sent"
    );
}

#[test]
fn the_minimal_bundle_of_the_interface_reference_passes_evidence_guard() {
    let doc = std::fs::read_to_string(format!("{}/docs/interface.md", env!("CARGO_MANIFEST_DIR")))
        .unwrap();
    let (_, after) = doc
        .split_once("<!-- minimal-bundle -->\n```json\n")
        .unwrap();
    let (bundle, _) = after.split_once("\n```").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("minimal.json");
    std::fs::write(&path, bundle).unwrap();
    let out = harness(
        &["check", &path.display().to_string()],
        &[("HARNESS__MODEL__BASE_URL", "")],
    );
    let account = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{account}");
    assert!(account.contains("EvidenceGuard passed"), "{account}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["fallback_type"], "SEMANTIC_UNAVAILABLE");
}

/// `check` and `eval` read only regular files within `--max-bundle-bytes`: a FIFO, a
/// symlink to /dev/zero and an oversized bundle exit 2 at once with a clear message, and
/// `eval --limit 1` reads only the case it runs (a FIFO after it would block for ever).
#[test]
fn offline_tools_refuse_special_and_oversized_files_with_exit_2() {
    let dir = std::env::temp_dir().join(format!("cli-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo.json");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let zero = dir.join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let no_model = [("HARNESS__MODEL__BASE_URL", "")];
    for (path, says) in [(&fifo, "not a regular file"), (&zero, "not a regular file")] {
        let out = harness(&["check", path.to_str().unwrap()], &no_model);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
    let bundle = example("success-supported.json");
    let out = harness(&["check", &bundle, "--max-bundle-bytes", "100"], &no_model);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("more than 100 bytes"), "{stderr}");

    // A corpus whose second case (in name order) is a FIFO: --limit 1 never opens it, so
    // eval gets as far as the model (none is configured: exit 2 for that reason).
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let case = format!(
        "{}/eval/corpus/auth-5xx-causal-overreach.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::copy(&case, corpus.join("a.json")).unwrap();
    assert!(Command::new("mkfifo")
        .arg(corpus.join("b.json"))
        .status()
        .unwrap()
        .success());
    let corpus_arg = corpus.to_str().unwrap();
    let out = harness(&["eval", corpus_arg, "--limit", "1", "--quiet"], &no_model);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no model is configured"), "{stderr}");
    let out = harness(&["eval", corpus_arg, "--quiet"], &no_model);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a regular file"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// GET /healthz over a plain socket: the status line, or None.
fn healthz(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(3)))
        .ok()?;
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().map(str::to_string)
}

/// With `server.accept_h2c` and a descriptor limit of 256 (`prlimit --nofile`), 512 clients
/// that connect and send nothing do not stop the service: each is closed after
/// `server.client_request_timeout_ms`, and `/healthz` is answered (before: actix-web's h2c
/// detection held them for ever and 1,000 of them stopped every new client under 1,024).
#[test]
fn with_h2c_healthz_is_served_under_a_descriptor_limit_with_twice_as_many_idle_clients() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let limit = 256;
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile={limit}:{limit}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_release-harness"))
        .arg("serve")
        .env_remove("HARNESS_CONFIG")
        .env("HARNESS__SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env("HARNESS__SERVER__ACCEPT_H2C", "true")
        .env("HARNESS__SERVER__CLIENT_REQUEST_TIMEOUT_MS", "500")
        .env("HARNESS__SERVER__WORKERS", "1")
        .env("HARNESS__REDIS__URL", "redis://127.0.0.1:9")
        .env("HARNESS__MODEL__BASE_URL", "")
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut up = false;
    while !up && std::time::Instant::now() < deadline {
        up = healthz(port).is_some_and(|line| line.contains(" 200"));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(up, "the service started");
    let idle: Vec<std::net::TcpStream> = (0..2 * limit)
        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert!(idle.len() > limit, "{} idle clients connected", idle.len());
    let mut served = None;
    while served.is_none() && std::time::Instant::now() < deadline {
        served = healthz(port).filter(|line| line.contains(" 200"));
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(idle);
    assert!(
        served.is_some(),
        "/healthz answered with {} idle clients",
        2 * limit
    );
}

#[test]
fn a_preseeded_soak_releases_every_run_from_the_records_written_before_its_clock() {
    // `--preseed` writes runs 1..=rate x duration first, and a played run then skips its own
    // seeding: a run seeded under another id, or one skipped but never seeded, would end
    // FALLBACK (its cited calls missing) and fail the soak with a violation.
    let dir = tempfile::tempdir().unwrap();
    let out = harness(
        &[
            "soak",
            "--only",
            "supported",
            "--preseed",
            "--rate",
            "10",
            "--duration",
            "2",
            "--model-latency-ms",
            "0",
            "--no-audit",
            "--report-dir",
            &dir.path().display().to_string(),
        ],
        &[("HARNESS__REDIS__URL", &redis_url())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("preseeded 20 of 20 runs"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sent = report["sent"].as_u64().unwrap();
    // The schedule's first tick is at once, so a 21st run is usually sent: it is not among
    // the preseeded ones and is seeded as it is sent.
    assert!(sent >= 20, "{report}");
    assert_eq!(
        report["outcomes"]["SUCCESS"].as_u64(),
        Some(sent),
        "{report}"
    );
}
