//! The guarded model path against real HTTP servers speaking the OpenAI protocol:
//! timeouts (paused clock where it makes them exact), cancellation that closes the model
//! connection, the cancel marker before each call, budgets and limits that deny without
//! sending, strict output limits, and request settings from configuration.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::*;
use release_harness::actors::{CancelRun, ReleaseError, Released, RunRegistry, StartRelease};
use release_harness::config::StructuredOutput;
use release_harness::domain::audit::CancelSource;
use release_harness::model::{ModelClient, PreparedRequest};
use serde_json::{json, Value};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn outcomes(audit: &Value) -> Vec<String> {
    audit["model_attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            format!(
                "{}:{}",
                a["role"].as_str().unwrap(),
                a["outcome"].as_str().unwrap()
            )
        })
        .collect()
}

/// On the paused clock, elapsed time is exact up to tokio's 1 ms timer resolution per timer.
fn assert_virtual_elapsed(started: tokio::time::Instant, seconds: u64, what: &str) {
    let elapsed = started.elapsed();
    let expected = Duration::from_secs(seconds);
    assert!(
        elapsed >= expected && elapsed <= expected + Duration::from_millis(10),
        "{what}: {elapsed:?} on the paused clock"
    );
}

/// Cancels `run` (as `POST .../cancel` does) while its release is pending: it was running,
/// and its release answers CANCELLED within 2 s. Answers that release.
async fn cancel_pending(
    registry: &actix::Addr<RunRegistry>,
    run: &str,
    pending: actix_rt::task::JoinHandle<
        Result<Result<Released, ReleaseError>, actix::MailboxError>,
    >,
) -> Released {
    let was_running = registry
        .send(CancelRun {
            run_id: run.to_string(),
            source: CancelSource::Http,
        })
        .await
        .unwrap();
    assert!(was_running);
    let released = tokio::time::timeout(Duration::from_secs(2), pending)
        .await
        .expect("CANCELLED is answered promptly")
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(released.result.outcome.as_str(), "CANCELLED");
    released
}

fn typo_draft() -> Value {
    let mut d = good_draft();
    d["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
    d
}

#[actix_rt::test]
async fn a_hanging_model_is_cut_at_the_attempt_timeout() {
    tokio::time::pause();
    let hanging = HangingModel::start();
    let mut cfg = config(Some(&hanging.url));
    cfg.model.connect_timeout_ms = std::num::NonZero::new(3_600_000).unwrap();
    cfg.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(20_000).unwrap();
    cfg.semantic_guard.total_timeout_ms = std::num::NonZero::new(45_000).unwrap();
    let run = unique_run("hang-attempt");
    let started = tokio::time::Instant::now();
    let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
    assert_virtual_elapsed(started, 40, "two attempts of 20 s each");
    assert_eq!(
        outcomes(&out.audit),
        vec!["semantic:timeout", "semantic:timeout"]
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNAVAILABLE")
    );
}

#[actix_rt::test]
async fn a_hanging_model_is_cut_at_the_total_timeout() {
    tokio::time::pause();
    let hanging = HangingModel::start();
    let mut cfg = config(Some(&hanging.url));
    cfg.model.connect_timeout_ms = std::num::NonZero::new(3_600_000).unwrap();
    cfg.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(30_000).unwrap();
    cfg.semantic_guard.total_timeout_ms = std::num::NonZero::new(45_000).unwrap();
    let run = unique_run("hang-total");
    let started = tokio::time::Instant::now();
    let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
    assert_virtual_elapsed(
        started,
        45,
        "the second attempt gets only what is left of 45 s",
    );
    let attempts = out.audit["model_attempts"].as_array().unwrap();
    let second: u64 = attempts[1]["detail"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (14_990..=15_000).contains(&second),
        "the second attempt was cut at {second} ms"
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNAVAILABLE")
    );
}

#[actix_rt::test]
async fn a_hanging_repair_is_cut_at_the_repair_timeout() {
    tokio::time::pause();
    let hanging = HangingModel::start();
    let mut cfg = config(Some(&hanging.url));
    cfg.model.connect_timeout_ms = std::num::NonZero::new(3_600_000).unwrap();
    cfg.repair.timeout_ms = std::num::NonZero::new(20_000).unwrap();
    let run = unique_run("hang-repair");
    let started = tokio::time::Instant::now();
    let out = release(cfg, &bundle(&run, typo_draft(), standard_invocations(&run))).await;
    assert_virtual_elapsed(started, 20, "one repair attempt of 20 s");
    assert_eq!(outcomes(&out.audit), vec!["repair:timeout"]);
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
}

#[actix_rt::test]
async fn cancel_during_a_pending_semantic_call_answers_cancelled_and_closes_the_connection() {
    let mut hanging = HangingModel::start();
    let run = unique_run("cancel-semantic");
    let (registry, store, request) = start_registry(
        config(Some(&hanging.url)),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    );
    let pending = actix_rt::spawn(registry.send(StartRelease(request)));
    assert_eq!(
        hanging.next(Duration::from_secs(5)).await,
        Some(Event::Received),
        "the judge call is pending"
    );
    let released = cancel_pending(&registry, &run, pending).await;
    assert_eq!(
        released.result.fallback_type, None,
        "a cancel is not converted into a fallback"
    );
    hanging
        .expect_closed("the model connection is closed")
        .await;
    let audit: Value =
        serde_json::from_str(&store.get_audit(&run).await.unwrap().unwrap()).unwrap();
    assert_eq!(audit["cancelled_by"], "http");
    assert_eq!(outcomes(&audit), vec!["semantic:cancelled"]);
    let stored: Value =
        serde_json::from_str(&store.get_result(&run).await.unwrap().unwrap()).unwrap();
    assert_eq!(stored["outcome"], "CANCELLED");
}

/// With `model.http2_prior_knowledge` the judge is asked over HTTP/2 without TLS (a real
/// h2 server: its handshake fails on anything else), and a cancel still aborts the pending
/// call: the stream is reset at once (the connection, which a worker's calls share, stays
/// open) and the release answers CANCELLED.
#[actix_rt::test]
async fn over_h2c_the_judge_is_asked_in_http2_and_a_cancel_resets_its_stream() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<String>();
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut connection = h2::server::handshake(socket).await.unwrap();
        while let Some(accepted) = connection.accept().await {
            let (request, mut respond) = accepted.unwrap();
            tx.send(format!("{} {}", request.method(), request.uri().path()))
                .unwrap();
            let tx = tx.clone();
            // Never answers; reports the client's reset of the stream.
            tokio::spawn(async move {
                let reason = futures::future::poll_fn(|cx| respond.poll_reset(cx)).await;
                let _ = tx.send(format!("reset {reason:?}"));
            });
        }
        let _ = tx.send("connection closed".into());
    });
    let mut cfg = config(Some(&url));
    cfg.model.http2_prior_knowledge = true;
    let run = unique_run("h2c-cancel");
    let (registry, store, request) =
        start_registry(cfg, &bundle(&run, good_draft(), standard_invocations(&run)));
    let pending = actix_rt::spawn(registry.send(StartRelease(request)));
    let asked = tokio::time::timeout(Duration::from_secs(5), events.recv()).await;
    assert_eq!(
        asked.unwrap().as_deref(),
        Some("POST /chat/completions"),
        "the judge call arrived over HTTP/2"
    );
    cancel_pending(&registry, &run, pending).await;
    let reset = tokio::time::timeout(Duration::from_secs(2), events.recv()).await;
    assert_eq!(
        reset.unwrap().as_deref(),
        Some("reset Ok(CANCEL)"),
        "the pending call's stream is reset"
    );
    let audit: Value =
        serde_json::from_str(&store.get_audit(&run).await.unwrap().unwrap()).unwrap();
    assert_eq!(outcomes(&audit), vec!["semantic:cancelled"]);
    server.abort();
}

#[actix_rt::test]
async fn cancel_during_a_pending_repair_call_answers_cancelled() {
    let mut hanging = HangingModel::start();
    let run = unique_run("cancel-repair");
    let (registry, _store, request) = start_registry(
        config(Some(&hanging.url)),
        &bundle(&run, typo_draft(), standard_invocations(&run)),
    );
    let pending = actix_rt::spawn(registry.send(StartRelease(request)));
    assert_eq!(
        hanging.next(Duration::from_secs(5)).await,
        Some(Event::Received)
    );
    registry.do_send(CancelRun {
        run_id: run.clone(),
        source: CancelSource::Pubsub,
    });
    let released = tokio::time::timeout(Duration::from_secs(2), pending)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(released.result.outcome.as_str(), "CANCELLED");
    hanging
        .expect_closed("the pending model call was aborted")
        .await;
}

#[actix_rt::test]
async fn a_model_answer_after_cancel_is_never_released() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "This late answer is dropped.").set_delay(Duration::from_millis(400)),
    )
    .await;
    let run = unique_run("late-answer");
    let (registry, store, request) = start_registry(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    );
    let pending = actix_rt::spawn(registry.send(StartRelease(request.clone())));
    tokio::time::sleep(Duration::from_millis(100)).await;
    registry.do_send(CancelRun {
        run_id: run.clone(),
        source: CancelSource::Http,
    });
    let released = pending.await.unwrap().unwrap().unwrap();
    assert_eq!(released.result.outcome.as_str(), "CANCELLED");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let stored: Value =
        serde_json::from_str(&store.get_result(&run).await.unwrap().unwrap()).unwrap();
    assert_eq!(
        stored["outcome"], "CANCELLED",
        "the late SUPPORTED changed nothing"
    );
    let again = registry.send(StartRelease(request)).await.unwrap().unwrap();
    assert!(again.replayed && again.result.outcome.as_str() == "CANCELLED");
}

#[actix_rt::test]
async fn the_cancel_marker_is_checked_before_each_model_call() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        ResponseTemplate::new(503).set_delay(Duration::from_millis(300)),
    )
    .await;
    let run = unique_run("marker-between");
    let (registry, store, request) = start_registry(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    );
    let pending = actix_rt::spawn(registry.send(StartRelease(request)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The marker alone, as if set by the agent (any value but the cancel route's `http`).
    let release_harness::store::Store::Memory(memory) = &store else {
        unreachable!("start_registry uses the memory store")
    };
    memory.set_cancel_marker(&run, "1");
    let released = pending.await.unwrap().unwrap().unwrap();
    assert_eq!(released.result.outcome.as_str(), "CANCELLED");
    assert_eq!(requests(&server).await.len(), 1, "the retry was not sent");
    let audit: Value =
        serde_json::from_str(&store.get_audit(&run).await.unwrap().unwrap()).unwrap();
    assert_eq!(audit["cancelled_by"], "marker");
}

#[actix_rt::test]
async fn a_run_cancelled_before_release_makes_no_model_call() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let run = unique_run("marker-first");
    let (registry, store, request) = start_registry(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    );
    store.cancel(&run).await.unwrap();
    let released = registry.send(StartRelease(request)).await.unwrap().unwrap();
    assert_eq!(released.result.outcome.as_str(), "CANCELLED");
    assert!(requests(&server).await.is_empty());
    // The cancel route's marker: the release found it at its begin, and says who set it.
    let audit: Value =
        serde_json::from_str(&store.get_audit(&run).await.unwrap().unwrap()).unwrap();
    assert_eq!(audit["cancelled_by"], "http");
}

#[actix_rt::test]
async fn the_run_call_budget_denies_the_judge_after_a_repair() {
    let server = MockServer::start().await;
    on_repair(&server, content(&good_draft().to_string())).await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let mut cfg = config(Some(&server.uri()));
    cfg.budget.max_model_calls = std::num::NonZero::new(1).unwrap();
    let run = unique_run("budget-calls");
    let out = release(cfg, &bundle(&run, typo_draft(), standard_invocations(&run))).await;
    assert_eq!(
        outcomes(&out.audit),
        vec!["repair:ok", "semantic:budget_denied"]
    );
    assert_eq!(
        requests(&server).await.len(),
        1,
        "the denied call is not sent"
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNAVAILABLE")
    );
    assert_eq!(out.audit["budget"]["model_calls"], 1);
}

#[actix_rt::test]
async fn limits_and_budgets_deny_without_sending() {
    type Tweak = fn(&mut release_harness::config::Config);
    let cases: [(&str, bool, Tweak, &str); 4] = [
        (
            "input bytes",
            false,
            |c| c.semantic_guard.max_input_bytes = 200,
            "SEMANTIC_UNAVAILABLE",
        ),
        (
            "run tokens",
            false,
            |c| c.budget.max_tokens = 300,
            "SEMANTIC_UNAVAILABLE",
        ),
        (
            "run bytes",
            false,
            |c| c.budget.max_bytes = 1_000,
            "SEMANTIC_UNAVAILABLE",
        ),
        (
            "repair tokens",
            true,
            |c| c.budget.max_tokens = 300,
            "EVIDENCE_VALIDATION_FAILED",
        ),
    ];
    for (what, needs_repair, tweak, expected) in cases {
        let server = MockServer::start().await;
        on_repair(&server, content(&good_draft().to_string())).await;
        on_semantic(
            &server,
            verdict("SUPPORTED", "Every claim matches the evidence."),
        )
        .await;
        let mut cfg = config(Some(&server.uri()));
        tweak(&mut cfg);
        let run = unique_run("limits");
        let draft = if needs_repair {
            typo_draft()
        } else {
            good_draft()
        };
        let out = release(cfg, &bundle(&run, draft, standard_invocations(&run))).await;
        assert!(
            requests(&server).await.is_empty(),
            "{what}: nothing is sent"
        );
        assert_eq!(
            out.result.fallback_type.map(|f| f.as_str()),
            Some(expected),
            "{what}"
        );
        let attempts = outcomes(&out.audit);
        assert_eq!(attempts.len(), 1, "{what}");
        assert!(
            attempts[0].ends_with("budget_denied"),
            "{what}: {attempts:?}"
        );
        if what == "input bytes" {
            // The audit says why, in words an operator can act on.
            let detail = out.audit["model_attempts"][0]["detail"].as_str().unwrap();
            assert!(
                detail.contains("over the 200-byte input limit (semantic_guard.max_input_bytes)")
                    && detail.contains("verified evidence do not fit"),
                "{detail}"
            );
        }
    }
}

#[actix_rt::test]
async fn a_verdict_over_the_output_byte_limit_is_a_parse_failure() {
    let server = MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", &"long reason ".repeat(20))).await;
    let mut cfg = config(Some(&server.uri()));
    cfg.semantic_guard.max_output_bytes = 100;
    let run = unique_run("output-limit");
    let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
    assert_eq!(
        outcomes(&out.audit),
        vec!["semantic:parse", "semantic:parse"]
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNAVAILABLE")
    );
}

#[actix_rt::test]
async fn refusals_truncations_and_prose_are_technical_failures() {
    for (answer, class) in [
        (
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "refusal": "I can't."}, "finish_reason": "stop"}]}),
            "schema",
        ),
        (
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"verdict\": \"SUPP"}, "finish_reason": "length"}]}),
            "parse",
        ),
        (completion("The report looks SUPPORTED to me."), "parse"),
        (
            completion("{\"verdict\": \"SUPPORTED\", \"reason\": \"ok\", \"confidence\": 0.9}"),
            "schema",
        ),
        (json!({"error": "not a completion"}), "parse"),
    ] {
        let server = MockServer::start().await;
        on_semantic(&server, ResponseTemplate::new(200).set_body_json(answer)).await;
        let run = unique_run("garbage");
        let out = release(
            config(Some(&server.uri())),
            &bundle(&run, good_draft(), standard_invocations(&run)),
        )
        .await;
        assert_eq!(outcomes(&out.audit), vec![format!("semantic:{class}"); 2]);
        assert_eq!(
            out.result.fallback_type.map(|f| f.as_str()),
            Some("SEMANTIC_UNAVAILABLE")
        );
    }
}

#[actix_rt::test]
async fn rate_limits_and_server_errors_are_not_retried_by_the_client() {
    let server = MockServer::start().await;
    on_semantic(&server, ResponseTemplate::new(429).set_body_json(json!({"error": {"message": "slow down", "type": "rate_limit_error", "param": null, "code": null}}))).await;
    let mut cfg = config(Some(&server.uri()));
    cfg.semantic_guard.max_attempts = std::num::NonZero::new(1).unwrap();
    let run = unique_run("no-client-retry");
    let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
    assert_eq!(
        requests(&server).await.len(),
        1,
        "exactly one request for one attempt"
    );
    assert_eq!(outcomes(&out.audit), vec!["semantic:transport"]);
}

/// A redirect is not followed: following it would send the evidence a second time, to
/// wherever the `Location` points, beyond the attempts the configuration allows.
#[actix_rt::test]
async fn a_redirect_from_the_model_is_a_transport_failure_and_is_not_followed() {
    let server = MockServer::start().await;
    let elsewhere = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(
            ResponseTemplate::new(307)
                .insert_header("location", format!("{}/chat/completions", elsewhere.uri())),
        )
        .mount(&server)
        .await;
    on_semantic(
        &elsewhere,
        verdict("SUPPORTED", "The logs show 132 matches for A1."),
    )
    .await;
    let cfg = config(Some(&server.uri()));
    let run = unique_run("redirect");
    let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
    assert_eq!(requests(&server).await.len(), 2, "one request per attempt");
    assert!(
        requests(&elsewhere).await.is_empty(),
        "the redirect's target received the request"
    );
    assert_eq!(
        outcomes(&out.audit),
        vec!["semantic:transport", "semantic:transport"]
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNAVAILABLE")
    );
}

#[actix_rt::test]
async fn a_pending_call_sends_the_prepared_bytes_and_keeps_no_copy_of_them() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(
            verdict("SUPPORTED", "Every claim matches the evidence.")
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&server)
        .await;
    let client = ModelClient::new(&config(Some(&server.uri())).model).unwrap();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "é\"".repeat(2048)}]});
    let request = PreparedRequest::from_json(&body, 64).unwrap();
    let len = request.len_bytes();
    // The test's own handle on the bytes, to see who else holds them.
    let kept = request.body().clone();
    assert_eq!(kept.holders(), 2);
    // async-openai serializes (and keeps for its retries) only a placeholder, not a copy.
    assert_eq!(
        serde_json::to_vec(&release_harness::model::client::Placeholder).unwrap(),
        release_harness::model::client::PLACEHOLDER
    );
    let send = client.send(request);
    tokio::pin!(send);
    assert!(
        tokio::time::timeout(Duration::from_millis(700), &mut send)
            .await
            .is_err(),
        "the model answers after 1.5 s"
    );
    // While the model thinks, the body has been sent, and its frames (which shared the
    // prepared bytes) are let go: the call holds none of its request's bytes.
    assert_eq!(kept.holders(), 1, "the call in flight keeps its body");
    assert!(send.await.is_ok());
    assert_eq!(kept.holders(), 1, "nothing holds the body after the call");
    let received = requests(&server).await;
    assert_eq!(
        received[0].body,
        kept.to_text().as_bytes(),
        "the exact prepared bytes were sent"
    );
    assert_eq!(
        received[0].headers["content-length"],
        len.to_string().as_str(),
        "sent with its length, not in chunks"
    );
    assert!(!received[0].headers.contains_key("transfer-encoding"));
}

#[actix_rt::test]
async fn a_refused_connection_is_a_transport_failure() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let run = unique_run("refused");
    let out = release(
        config(Some(&format!("http://127.0.0.1:{port}"))),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        outcomes(&out.audit),
        vec!["semantic:transport", "semantic:transport"]
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNAVAILABLE")
    );
}

#[actix_rt::test]
async fn requests_carry_the_configured_model_key_and_format() {
    for (mode, format) in [
        (StructuredOutput::JsonSchema, json!("json_schema")),
        (StructuredOutput::JsonObjectSchema, json!("json_object")),
        (StructuredOutput::JsonObject, json!("json_object")),
        (StructuredOutput::None, Value::Null),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .and(header("authorization", "Bearer sk-test-key"))
            .respond_with(verdict("SUPPORTED", "Every claim matches the evidence."))
            .mount(&server)
            .await;
        let mut cfg = config(Some(&format!("{}/v1", server.uri())));
        cfg.model.api_key = "sk-test-key".into();
        cfg.model.name = "qwen2.5-7b-instruct".into();
        cfg.model.structured_output = mode;
        let run = unique_run("settings");
        let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
        assert_eq!(out.result.outcome.as_str(), "SUCCESS", "{mode:?}");
        let body: Value = serde_json::from_slice(&requests(&server).await[0].body).unwrap();
        assert_eq!(body["model"], "qwen2.5-7b-instruct");
        assert_eq!(body["temperature"], 0);
        assert_eq!(body["max_tokens"], 512);
        assert_eq!(body["response_format"]["type"], format);
    }
}

#[actix_rt::test]
async fn tokens_and_bytes_are_accounted_in_the_audit() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let run = unique_run("accounting");
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    let attempt = &out.audit["model_attempts"][0];
    assert_eq!(attempt["prompt_tokens"], 1200);
    assert_eq!(attempt["completion_tokens"], 25);
    let sent = requests(&server).await[0].body.len() as u64;
    assert_eq!(attempt["request_bytes"], sent);
    assert_eq!(out.audit["budget"]["tokens"], 1225);
    assert_eq!(out.audit["budget"]["model_calls"], 1);
}

#[actix_rt::test]
async fn a_request_the_server_rejects_as_invalid_is_not_retried_and_its_message_is_audited() {
    // llama-cpp-python's answer to a response_format it does not know: HTTP 500 with a
    // pydantic message.
    let body = json!({"detail": [{"type": "literal_error", "loc": ["body", "response_format", "type"],
        "msg": "Input should be 'text' or 'json_object'", "input": "json_schema"}]});
    for response in [
        ResponseTemplate::new(500).set_body_json(body.clone()),
        ResponseTemplate::new(400).set_body_json(json!({"error": {"code": 400, "message": "'response_format' of type 'json_schema' is not supported", "type": "invalid_request_error"}})),
        ResponseTemplate::new(422).set_body_string("Unprocessable Entity"),
        ResponseTemplate::new(400).set_body_json(json!({"object": "error", "message": "bad schema", "type": "BadRequestError", "code": 400})),
    ] {
        let server = MockServer::start().await;
        on_semantic(&server, response).await;
        let run = unique_run("rejected");
        let out = release(
            config(Some(&server.uri())),
            &bundle(&run, good_draft(), standard_invocations(&run)),
        )
        .await;
        assert_eq!(requests(&server).await.len(), 1, "a rejected request is sent once");
        assert_eq!(outcomes(&out.audit), vec!["semantic:rejected"]);
        let detail = out.audit["model_attempts"][0]["detail"].as_str().unwrap();
        assert!(detail.starts_with("HTTP 4") || detail.starts_with("HTTP 5"), "{detail}");
        assert!(detail.len() > "HTTP 400: ".len(), "the server's words are kept: {detail}");
        assert_eq!(
            out.result.fallback_type.map(|f| f.as_str()),
            Some("SEMANTIC_UNAVAILABLE")
        );
        assert!(!out.json.contains("Input should be"), "nothing of it in the result");
    }
}

#[actix_rt::test]
async fn a_server_fault_is_still_retried() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        ResponseTemplate::new(500).set_body_string("CUDA out of memory"),
    )
    .await;
    let run = unique_run("fault-retried");
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    let sent = requests(&server).await;
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0].body, sent[1].body,
        "the second attempt sends the same bytes (one nonce)"
    );
    assert_eq!(
        outcomes(&out.audit),
        vec!["semantic:transport", "semantic:transport"]
    );
    assert_eq!(
        out.audit["model_attempts"][0]["detail"],
        "HTTP 500: CUDA out of memory"
    );
}

#[actix_rt::test]
async fn the_repair_request_is_bounded_by_the_drafts_size() {
    let server = MockServer::start().await;
    on_repair(&server, ResponseTemplate::new(500)).await;
    let run = unique_run("repair-bounds");
    let draft = typo_draft();
    let draft_bytes = serde_json::to_vec(
        &release_harness::domain::draft::Draft::parse_text(&draft.to_string()).unwrap(),
    )
    .unwrap()
    .len() as u64;
    release(
        config(Some(&server.uri())),
        &bundle(&run, draft, standard_invocations(&run)),
    )
    .await;
    let sent = requests(&server).await;
    let body: Value = serde_json::from_slice(&sent[0].body).unwrap();
    let max_tokens = body["max_tokens"].as_u64().unwrap();
    assert_eq!(max_tokens, draft_bytes / 2 + 128);
    assert!(
        max_tokens < 4_096,
        "{max_tokens}: derived from the Draft, not the cap"
    );
}

/// A model server whose 200 answer never ends: it writes JSON-looking chunks of 64 kB for as
/// long as the connection is open. Answers its address and the bytes it wrote, known once the
/// harness closed the connection.
async fn endless_answer() -> (String, tokio::sync::oneshot::Receiver<usize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tell, written) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = vec![0u8; 64 * 1024];
        let _ = socket.read(&mut request).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        let mut written = 0usize;
        let mut ok = socket.write_all(head.as_bytes()).await.is_ok();
        let chunk = format!("{:x}\r\n{}\r\n", 65536, " ".repeat(65536));
        // Bounded: 64 MB at most, far past any cap.
        while ok && written < 64 * 1024 * 1024 {
            ok = socket.write_all(chunk.as_bytes()).await.is_ok();
            if ok {
                written += 65536;
            }
        }
        let _ = tell.send(written);
    });
    (url, written)
}

/// The answer's body is capped as it is read: a body that never ends fails the attempt as
/// `parse` once it passes 6 x semantic_guard.max_output_bytes + 64 KiB, long before the
/// attempt's timeout (before: buffered until the timeout, 537 MB per attempt).
#[actix_rt::test]
async fn an_answer_that_never_ends_is_cut_at_its_cap_as_a_parse_failure() {
    let (url, written) = endless_answer().await;
    let mut cfg = config(Some(&url));
    cfg.semantic_guard.max_attempts = std::num::NonZero::new(1).unwrap();
    cfg.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(20_000).unwrap();
    cfg.semantic_guard.total_timeout_ms = std::num::NonZero::new(20_000).unwrap();
    let run = unique_run("endless");
    let began = std::time::Instant::now();
    let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "cut before the timeout"
    );
    assert_eq!(outcomes(&out.audit), vec!["semantic:parse"]);
    let detail = out.audit["model_attempts"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("over"), "{detail}");
    let written = written.await.unwrap();
    // What the kernel buffers besides: a few MB at most.
    assert!(
        written < 16 * 1024 * 1024,
        "the server wrote {written} bytes"
    );
}

/// What a server sends never reaches the audit whole: an error that quotes the configured
/// API key (or the whole Authorization value) is kept with both redacted, and a body that
/// is not JSON is a parse failure with a fixed detail.
#[actix_rt::test]
async fn a_servers_words_are_kept_without_the_api_key_and_a_non_json_body_is_not_kept() {
    let key = "sk-test-0123456789abcdef";
    for body in [
        format!("{{\"error\": {{\"message\": \"Incorrect API key provided: {key}\"}}}}"),
        format!("unauthorized: Authorization: Bearer {key}"),
    ] {
        let server = MockServer::start().await;
        on_semantic(&server, ResponseTemplate::new(401).set_body_string(body)).await;
        let mut cfg = config(Some(&server.uri()));
        cfg.model.api_key = key.into();
        let run = unique_run("key-quoted");
        let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
        let audit = out.audit.to_string();
        assert!(!audit.contains(key), "{audit}");
        assert!(audit.contains("[redacted]"), "{audit}");
    }
    let server = MockServer::start().await;
    let prose = "not json ".repeat(100_000);
    on_semantic(&server, ResponseTemplate::new(200).set_body_string(prose)).await;
    let run = unique_run("not-json");
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        outcomes(&out.audit),
        vec!["semantic:parse", "semantic:parse"]
    );
    assert!(
        out.audit.to_string().len() < 8192,
        "nothing of the body is kept"
    );
}

/// Token counts the request makes impossible are a schema failure and are counted nowhere:
/// 2^64-1 prompt tokens no longer wraps the budget's sum.
#[actix_rt::test]
async fn impossible_token_counts_are_schema_failures_never_counted() {
    let server = MockServer::start().await;
    let mut answer = completion(
        &json!({"verdict": "SUPPORTED", "reason": "Every claim matches the evidence."}).to_string(),
    );
    answer["usage"] = json!({"prompt_tokens": u64::MAX, "completion_tokens": 25});
    on_semantic(
        &server,
        ResponseTemplate::new(200).set_body_json(answer.clone()),
    )
    .await;
    let run = unique_run("tokens-max");
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        outcomes(&out.audit),
        vec!["semantic:schema", "semantic:schema"]
    );
    let attempt = &out.audit["model_attempts"][0];
    assert_eq!(attempt["prompt_tokens"], Value::Null);
    assert!(attempt["detail"]
        .as_str()
        .unwrap()
        .contains("prompt tokens"));
    let tokens = out.audit["budget"]["tokens"].as_u64().unwrap();
    assert!(
        tokens > 1 && tokens <= 32_000,
        "the reservations stand: {tokens}"
    );
    // A completion past the request's max_tokens, likewise.
    let server = MockServer::start().await;
    answer["usage"] = json!({"prompt_tokens": 1200, "completion_tokens": 100_000});
    on_semantic(&server, ResponseTemplate::new(200).set_body_json(answer)).await;
    let run = unique_run("tokens-completion");
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        outcomes(&out.audit),
        vec!["semantic:schema", "semantic:schema"]
    );
}
