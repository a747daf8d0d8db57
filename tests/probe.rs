//! `release-harness probe-model` against real HTTP servers (wiremock) that behave like the
//! servers people run: one that refuses `json_schema` the way llama-cpp-python does, one
//! whose chat template drops the system message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use common::*;
use release_harness::config::StructuredOutput;
use release_harness::tools::probe::probe;
use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

fn body(r: &Request) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_default()
}

fn canary_word(r: &Request) -> Option<String> {
    let system = body(r)["messages"][0]["content"].as_str()?.to_string();
    let (_, rest) = system.split_once("Your secret probe word is ")?;
    Some(rest.split_once('.')?.0.to_string())
}

/// Answers like a model that follows its instructions (canary echoed, verdict, Draft).
fn obedient(r: &Request, prompt_tokens: u64) -> ResponseTemplate {
    let request = body(r);
    let content = if let Some(word) = canary_word(r) {
        json!({"verdict": "SUPPORTED", "reason": format!("The probe word is {word}.")}).to_string()
    } else if request["response_format"]["json_schema"]["name"] == "evidence_repair"
        || request["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .starts_with("You repair")
    {
        json!({"conclusion": {"text": "order-api logged 3 timeout errors between 10:00 and 11:00 UTC.", "analysis_refs": ["A1"]},
               "analyses": [{"id": "A1", "kind": "NORMAL", "text": "A log search found 3 ERROR entries with 'timeout' on order-api.", "tool_call_ids": ["probe-01"]}],
               "action_plan": [], "recommendations": [], "limitations": [], "missing_context": []})
        .to_string()
    } else {
        json!({"verdict": "SUPPORTED", "reason": "The log search shows the three timeout errors the report names."}).to_string()
    };
    let mut envelope = completion(&content);
    envelope["usage"]["prompt_tokens"] = json!(prompt_tokens);
    ResponseTemplate::new(200).set_body_json(envelope)
}

#[actix_rt::test]
async fn a_server_that_refuses_json_schema_is_named_and_the_working_mode_suggested() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(|r: &Request| {
            let format = body(r)["response_format"].clone();
            if format["type"] == "json_schema" {
                ResponseTemplate::new(500).set_body_json(json!({"detail": [{"type": "literal_error",
                    "loc": ["body", "response_format", "type"], "msg": "Input should be 'text' or 'json_object'"}]}))
            } else {
                let bytes = r.body.len() as u64;
                obedient(r, bytes / 4)
            }
        })
        .mount(&server)
        .await;
    let report = probe(&config(Some(&server.uri()))).await;
    assert!(report.failed());
    let text = report.render();
    assert!(
        text.contains("refused the judge request as invalid"),
        "{text}"
    );
    assert!(
        text.contains("Input should be 'text' or 'json_object'"),
        "{text}"
    );
    assert!(
        text.contains("set model.structured_output = \"json_object_schema\""),
        "{text}"
    );
    // Rejected requests are not retried: one request per probe call, plus the alternatives.
    let judge_requests = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| canary_word(r).is_none() && body(r)["response_format"]["type"] == "json_schema")
        .count();
    assert_eq!(
        judge_requests, 2,
        "one judge and one repair request, no retry"
    );

    let mut fixed = config(Some(&server.uri()));
    fixed.model.structured_output = StructuredOutput::JsonObjectSchema;
    let report = probe(&fixed).await;
    assert!(!report.failed(), "{}", report.render());
}

#[actix_rt::test]
async fn a_template_that_drops_the_system_message_is_reported() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(|r: &Request| {
            // Counts only the user message, and so never sees the probe word.
            let request = body(r);
            let user = request["messages"][1]["content"]
                .as_str()
                .unwrap_or_default();
            let tokens = user.len() as u64 / 4;
            let content =
                json!({"verdict": "SUPPORTED", "reason": "I was not told any probe word at all."})
                    .to_string();
            let mut envelope = completion(&content);
            envelope["usage"]["prompt_tokens"] = json!(tokens);
            ResponseTemplate::new(200).set_body_json(envelope)
        })
        .mount(&server)
        .await;
    let report = probe(&config(Some(&server.uri()))).await;
    let text = report.render();
    assert!(text.contains("did not echo the probe word"), "{text}");
    assert!(
        text.contains("the chat template probably drops it"),
        "{text}"
    );
}

#[actix_rt::test]
async fn a_well_configured_server_passes_every_check() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(|r: &Request| {
            let bytes = r.body.len() as u64;
            obedient(r, bytes / 4)
        })
        .mount(&server)
        .await;
    let report = probe(&config(Some(&server.uri()))).await;
    assert!(!report.failed(), "{}", report.render());
    assert!(
        report.findings.iter().all(|f| f.level == "ok"),
        "{}",
        report.render()
    );
    assert_eq!(report.calls.len(), 3);
    // Latency is shown against the configured timeouts.
    let text = report.render();
    assert!(
        text.contains("of semantic_guard.attempt_timeout_ms (2000 ms)"),
        "{text}"
    );
    assert!(text.contains("of repair.timeout_ms (2000 ms)"), "{text}");
}

#[actix_rt::test]
async fn a_url_without_v1_is_named_before_any_mode_advice() {
    // A server whose chat completions live under /v1 only, as most do; the base URL lacks it.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(|r: &Request| {
            let bytes = r.body.len() as u64;
            obedient(r, bytes / 4)
        })
        .mount(&server)
        .await;
    let report = probe(&config(Some(&server.uri()))).await;
    assert!(report.failed());
    let text = report.render();
    let first = report
        .findings
        .first()
        .map(|f| f.text.as_str())
        .unwrap_or("");
    assert!(
        first.starts_with("no chat/completions endpoint at this URL (HTTP 404); does `model.base_url` need `/v1`?"),
        "{text}"
    );
    assert!(
        !text.contains("structured_output ="),
        "no mode advice: {text}"
    );
    assert!(!text.contains("response_format"), "no mode blamed: {text}");
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        1,
        "the canary only: nothing more is sent to a wrong URL"
    );
    // With /v1 the same server passes.
    let report = probe(&config(Some(&format!("{}/v1", server.uri())))).await;
    assert!(!report.failed(), "{}", report.render());
}

#[actix_rt::test]
async fn no_model_is_a_finding_not_a_crash() {
    let report = probe(&config(None)).await;
    assert!(report.failed());
    assert!(report.render().contains("no model is configured"));
}
