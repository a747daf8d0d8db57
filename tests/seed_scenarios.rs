//! One test per scenario of `seed-spec.md`, named after it, each driving a whole release
//! through the actor tree (in-memory store, the `check` path) with the model as a real
//! HTTP server speaking the OpenAI protocol (wiremock). Whether the model was called, and
//! with what, is read from what the server received.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use common::*;
use serde_json::{json, Value};
use wiremock::{MockServer, ResponseTemplate};

async fn model() -> MockServer {
    MockServer::start().await
}

fn semantic_requests(requests: &[wiremock::Request]) -> Vec<&wiremock::Request> {
    requests.iter().filter(|r| is_semantic(r)).collect()
}

/// A repair model that hands the Draft back unchanged (it cannot fix anything).
async fn echo_repair(server: &MockServer, draft: &Value) {
    on_repair(server, content(&draft.to_string())).await;
}

fn user_message(request: &wiremock::Request) -> String {
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    body["messages"][1]["content"].as_str().unwrap().to_string()
}

// ---- Requirement: Deterministic Draft and evidence validation ----

#[actix_rt::test]
async fn scenario_duplicate_or_missing_analysis_id_in_concluded_draft() {
    for (id, rule) in [("A1", "analysis_id_duplicate"), ("  ", "analysis_id_blank")] {
        let server = model().await;
        let run = unique_run("dup-id");
        let mut draft = good_draft();
        draft["analyses"][1]["id"] = json!(id);
        echo_repair(&server, &draft).await;
        on_semantic(
            &server,
            verdict("SUPPORTED", "The report is fine against the evidence."),
        )
        .await;
        let out = release(
            config(Some(&server.uri())),
            &bundle(&run, draft, standard_invocations(&run)),
        )
        .await;
        assert!(
            audit_rules(&out.audit).contains(&rule.to_string()),
            "{}",
            out.audit
        );
        assert_eq!(
            out.result.fallback_type.map(|f| f.as_str()),
            Some("EVIDENCE_VALIDATION_FAILED")
        );
        assert!(
            semantic_requests(&requests(&server).await).is_empty(),
            "SemanticGuard must not be invoked"
        );
    }
}

#[actix_rt::test]
async fn scenario_broken_report_reference_in_concluded_draft() {
    let server = model().await;
    let run = unique_run("broken-ref");
    let mut draft = good_draft();
    draft["conclusion"]["analysis_refs"] = json!([]);
    draft["action_plan"][0]["analysis_refs"] = json!(["A9"]);
    draft["recommendations"][0]["analysis_refs"] = json!([""]);
    echo_repair(&server, &draft).await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "The report is fine against the evidence."),
    )
    .await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, standard_invocations(&run)),
    )
    .await;
    let violations = &out.audit["violations"];
    let at: Vec<(&str, &str)> = violations
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["rule"].as_str().unwrap(), v["at"].as_str().unwrap()))
        .collect();
    assert_eq!(
        at,
        vec![
            ("reference_empty", "conclusion"),
            ("reference_unknown", "action_plan[0]"),
            ("reference_unknown", "recommendations[0]")
        ]
    );
    assert!(semantic_requests(&requests(&server).await).is_empty());
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
}

#[actix_rt::test]
async fn scenario_no_conclusion_draft_has_valid_negative_observation() {
    let server = model().await;
    let run = unique_run("no-conclusion-negative");
    let draft = json!({"conclusion": null, "analyses": [
        {"id": "A1", "kind": "NEGATIVE_OBSERVATION", "text": "No slow queries over 500 ms.", "tool_call_ids": ["call-sql-01"]}]});
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, vec![mysql_none(&run, "call-sql-01")]),
    )
    .await;
    assert!(
        requests(&server).await.is_empty(),
        "no repair and no SemanticGuard call"
    );
    assert_eq!(
        out.audit["excluded_references"],
        json!([]),
        "the reference is accepted as authentic"
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("INSUFFICIENT_EVIDENCE")
    );
    assert_eq!(
        out.result.observed_facts[0].summary,
        "mysql_query on orders-db, slow_queries_by_table, 10:00–11:00: 0 rows"
    );
}

#[actix_rt::test]
async fn scenario_no_conclusion_draft_fabricates_a_tool_reference() {
    let server = model().await;
    let run = unique_run("no-conclusion-fabricated");
    let mut cross_run = log_found("another-run", "call-cross");
    cross_run["stored_under"] = json!(run);
    let mut projecting = log_none(&run, "call-projecting");
    projecting["lifecycle"] = json!("PROJECTING");
    projecting.as_object_mut().unwrap().remove("agent_result");
    projecting
        .as_object_mut()
        .unwrap()
        .remove("evidence_status");
    let mut errored = mysql_none(&run, "call-error");
    errored["lifecycle"] = json!("ERROR");
    errored["evidence_status"] = json!("ERROR");
    let draft = json!({"conclusion": null, "analyses": [
        {"id": "A1", "kind": "NORMAL", "text": "Pool errors.", "tool_call_ids": ["call-ghost", "call-cross"]},
        {"id": "A2", "kind": "NEGATIVE_OBSERVATION", "text": "Nothing.", "tool_call_ids": ["call-projecting", "call-error", "call-sql-01"]}]});
    let invocations = vec![
        cross_run,
        projecting,
        errored,
        mysql_none(&run, "call-sql-01"),
    ];
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, invocations),
    )
    .await;
    let excluded: Vec<(&str, &str)> = out.audit["excluded_references"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["tool_call_id"].as_str().unwrap(),
                e["rule"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        excluded,
        vec![
            ("call-ghost", "call_missing"),
            ("call-cross", "call_other_run"),
            ("call-projecting", "call_not_ready"),
            ("call-error", "call_not_ready")
        ]
    );
    assert_eq!(
        out.result.observed_facts.len(),
        1,
        "only the real completed check is a fact"
    );
    assert_eq!(
        out.result.observed_facts[0].scope["datasource"],
        "orders-db"
    );
    assert!(
        !out.json.contains("order-api"),
        "the cross-run call's content is not published"
    );
    assert!(requests(&server).await.is_empty());
}

// ---- Requirement: Current Run canonical invocation ownership ----

#[actix_rt::test]
async fn scenario_fabricated_or_cross_run_tool_call() {
    let server = model().await;
    let run = unique_run("fabricated-call");
    let mut cross = rag_found("run-of-someone-else", "call-rag-01");
    cross["stored_under"] = json!(run);
    cross["agent_result"] = json!(cross["agent_result"]
        .as_str()
        .unwrap()
        .replace("Connection pool exhaustion", "CROSS-RUN-CANARY"));
    let invocations = vec![
        log_found(&run, "call-log-01"),
        cross,
        mysql_none(&run, "call-sql-01"),
    ];
    let mut draft = good_draft();
    draft["analyses"][0]["tool_call_ids"] = json!(["call-log-01", "call-fabricated"]);
    echo_repair(&server, &draft).await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "The report is fine against the evidence."),
    )
    .await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, invocations),
    )
    .await;
    let rules = audit_rules(&out.audit);
    assert!(
        rules.contains(&"call_missing".to_string())
            && rules.contains(&"call_other_run".to_string()),
        "{rules:?}"
    );
    let seen = requests(&server).await;
    assert!(semantic_requests(&seen).is_empty());
    for r in &seen {
        assert!(
            !String::from_utf8_lossy(&r.body).contains("CROSS-RUN-CANARY"),
            "no record content is exposed"
        );
    }
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
}

#[actix_rt::test]
async fn scenario_failed_or_incomplete_invocation() {
    let server = model().await;
    let run = unique_run("incomplete");
    let mut projecting = log_found(&run, "call-a");
    projecting["lifecycle"] = json!("PROJECTING");
    let mut failed = log_found(&run, "call-b");
    failed["lifecycle"] = json!("ERROR");
    let mut no_result = log_found(&run, "call-c");
    no_result.as_object_mut().unwrap().remove("agent_result");
    let mut error_status = log_found(&run, "call-d");
    error_status["evidence_status"] = json!("ERROR");
    let mut draft = good_draft();
    draft["analyses"][0]["tool_call_ids"] = json!(["call-a", "call-b", "call-c", "call-d"]);
    let mut invocations = standard_invocations(&run);
    invocations.extend([projecting, failed, no_result, error_status]);
    echo_repair(&server, &draft).await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, invocations),
    )
    .await;
    assert_eq!(
        audit_rules(&out.audit),
        vec![
            "call_not_ready",
            "call_not_ready",
            "call_no_agent_result",
            "call_evidence_error"
        ]
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
    assert!(semantic_requests(&requests(&server).await).is_empty());
}

// ---- Requirement: Analysis kind matches evidence semantics ----

#[actix_rt::test]
async fn scenario_valid_negative_observation() {
    let server = model().await;
    let run = unique_run("valid-negative");
    on_semantic(&server, verdict("SUPPORTED", "Claims match the evidence.")).await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert!(
        out.audit["violations"].as_array().unwrap().is_empty(),
        "the binding is accepted"
    );
    let seen = requests(&server).await;
    let prompt = user_message(semantic_requests(&seen)[0]);
    let block = prompt
        .split("analysis=\"A3\" kind=NEGATIVE_OBSERVATION>>>")
        .nth(1)
        .unwrap();
    assert!(
        block.contains("\"row_count\":0") && block.contains("\"slow_queries_by_table\""),
        "scope and zero-match data"
    );
    let body: Value = serde_json::from_slice(&semantic_requests(&seen)[0].body).unwrap();
    let rubric = body["messages"][0]["content"].as_str().unwrap();
    assert!(
        rubric.contains("not proof that a system is healthy"),
        "not read as proof of health"
    );
}

#[actix_rt::test]
async fn scenario_positive_claim_uses_no_evidence_result() {
    let server = model().await;
    let run = unique_run("positive-no-evidence");
    let mut draft = good_draft();
    draft["analyses"][0]["tool_call_ids"] = json!(["call-sql-01"]);
    echo_repair(&server, &draft).await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, standard_invocations(&run)),
    )
    .await;
    assert_eq!(audit_rules(&out.audit), vec!["kind_evidence_mismatch"]);
    assert!(semantic_requests(&requests(&server).await).is_empty());
}

// ---- Requirement: Verified evidence snapshot is minimal and deterministic ----

#[actix_rt::test]
async fn scenario_supported_rag_log_and_mysql_projections() {
    let server = model().await;
    let run = unique_run("projections");
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let mut draft = good_draft();
    draft["analyses"][2] = json!({"id": "A3", "kind": "NORMAL", "text": "412 slow queries on orders.", "tool_call_ids": ["call-sql-02"]});
    let mut invocations = standard_invocations(&run);
    invocations.push(mysql_found(&run, "call-sql-02"));
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, invocations),
    )
    .await;
    assert_eq!(out.result.outcome.as_str(), "SUCCESS");
    let prompt = user_message(semantic_requests(&requests(&server).await)[0]);
    let block = |id: &str| {
        prompt
            .split(&format!("analysis=\"{id}\""))
            .nth(1)
            .and_then(|rest| rest.split("<<<END").next())
            .unwrap()
            .to_string()
    };
    let log = block("A1");
    assert!(log.contains("\"source\":\"order-api\"") && log.contains("\"total_matches\":132"));
    assert!(
        log.contains("\"observed_at\":\"2026-12-01T10:05:01Z\"")
            && log.contains("\"from\":\"2026-12-01T10:00:00Z\"")
    );
    assert!(
        log.contains("HikariPool-1 - Connection is not available, request timed out after 3000ms")
    );
    let rag = block("A2");
    assert!(rag.contains("\"source\":\"kb-123\""));
    assert!(rag.contains("Connection pool exhaustion in order-api surfaces as 504s; raise maximumPoolSize or kill long transactions."));
    let sql = block("A3");
    assert!(
        sql.contains("\"source\":\"orders-db\"")
            && sql.contains("\"orders\",")
            && sql.contains("412")
    );
    let sources: Vec<(&str, &str)> = out
        .result
        .verified_sources
        .iter()
        .map(|s| (s.tool.as_str(), s.source.as_str()))
        .collect();
    assert_eq!(
        sources,
        vec![
            ("log_search", "order-api"),
            ("rag_search", "kb-123"),
            ("mysql_query", "orders-db")
        ]
    );
}

#[actix_rt::test]
async fn scenario_projection_contract_mismatch() {
    let server = model().await;
    let run = unique_run("mismatch");
    let mut unknown_tool = log_found(&run, "call-a");
    unknown_tool["tool_name"] = json!("kubectl_exec");
    let mut invalid_json = log_found(&run, "call-b");
    invalid_json["agent_result"] = json!("{\"tool\": \"log_search\", ");
    let mut wrong_id = log_found(&run, "call-c");
    wrong_id["agent_result"] = json!(wrong_id["agent_result"]
        .as_str()
        .unwrap()
        .replace("\"call-c\"", "\"call-z\""));
    let mut wrong_status = log_found(&run, "call-d");
    wrong_status["evidence_status"] = json!("NO_EVIDENCE");
    let mut draft = good_draft();
    draft["analyses"][0]["tool_call_ids"] = json!(["call-a", "call-b", "call-c", "call-d"]);
    let mut invocations = standard_invocations(&run);
    invocations.extend([unknown_tool, invalid_json, wrong_id, wrong_status]);
    echo_repair(&server, &draft).await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, invocations),
    )
    .await;
    assert_eq!(
        audit_rules(&out.audit),
        vec![
            "tool_unsupported",
            "projection_invalid",
            "projection_call_id_mismatch",
            "projection_status_mismatch"
        ]
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
    assert!(
        semantic_requests(&requests(&server).await).is_empty(),
        "fails closed before review"
    );
}

// ---- Requirement: Evidence repair is single-turn and semantics-preserving ----

#[actix_rt::test]
async fn scenario_structural_repair_succeeds() {
    let server = model().await;
    let run = unique_run("repair-ok");
    let mut typo = good_draft();
    typo["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
    on_repair(&server, content(&good_draft().to_string())).await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, typo, standard_invocations(&run)),
    )
    .await;
    let seen = requests(&server).await;
    assert_eq!(seen.len(), 2);
    assert!(
        is_repair(&seen[0]) && is_semantic(&seen[1]),
        "repair first, then SemanticGuard"
    );
    assert_eq!(out.audit["repair"]["accepted"], true);
    assert_eq!(out.result.outcome.as_str(), "SUCCESS");
    let repair_body: Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert!(repair_body.get("tools").is_none(), "a direct no-tool call");
    assert_eq!(
        repair_body["messages"].as_array().unwrap().len(),
        2,
        "single turn"
    );
}

#[actix_rt::test]
async fn scenario_repair_changes_report_text() {
    type Edit = Box<dyn Fn(&mut Value)>;
    let edits: Vec<(&str, Edit)> = vec![
        (
            "conclusion",
            Box::new(|d| d["conclusion"]["text"] = json!("A bad deploy caused it.")),
        ),
        (
            "analysis",
            Box::new(|d| d["analyses"][0]["text"] = json!("Only a few errors.")),
        ),
        (
            "action plan",
            Box::new(|d| d["action_plan"][0]["text"] = json!("Restart orders-db now.")),
        ),
        (
            "recommendation",
            Box::new(|d| d["recommendations"][0]["text"] = json!("Ignore it.")),
        ),
        (
            "limitation",
            Box::new(|d| d["limitations"][0] = json!("None.")),
        ),
        (
            "kind",
            Box::new(|d| d["analyses"][2]["kind"] = json!("NORMAL")),
        ),
        (
            "order",
            Box::new(|d| {
                let a = d["analyses"][0].clone();
                d["analyses"][0] = d["analyses"][1].clone();
                d["analyses"][1] = a;
            }),
        ),
        (
            "flag",
            Box::new(|d| d["action_plan"][0]["requires_human_confirmation"] = json!(false)),
        ),
    ];
    for (what, edit) in edits {
        let server = model().await;
        let run = unique_run("repair-text");
        let mut typo = good_draft();
        typo["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
        let mut candidate = good_draft();
        edit(&mut candidate);
        on_repair(&server, content(&candidate.to_string())).await;
        on_semantic(
            &server,
            verdict("SUPPORTED", "Every claim matches the evidence."),
        )
        .await;
        let out = release(
            config(Some(&server.uri())),
            &bundle(&run, typo, standard_invocations(&run)),
        )
        .await;
        assert_eq!(
            out.result.fallback_type.map(|f| f.as_str()),
            Some("EVIDENCE_VALIDATION_FAILED"),
            "{what}"
        );
        assert_eq!(out.audit["repair"]["accepted"], false, "{what}");
        assert!(
            semantic_requests(&requests(&server).await).is_empty(),
            "{what}"
        );
    }
}

#[actix_rt::test]
async fn scenario_second_validation_fails() {
    let server = model().await;
    let run = unique_run("second-guard");
    let mut typo = good_draft();
    typo["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
    let mut still_wrong = good_draft();
    still_wrong["analyses"][0]["tool_call_ids"] = json!(["call-log-99"]);
    on_repair(&server, content(&still_wrong.to_string())).await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, typo, standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
    assert!(out.result.verified_sources.is_empty());
    assert_eq!(
        out.audit["repair"]["violations_after"][0]["rule"],
        "call_missing"
    );
    assert!(semantic_requests(&requests(&server).await).is_empty());
}

// ---- Requirement: Isolated single-turn SemanticGuard ----

#[actix_rt::test]
async fn scenario_semantic_input_isolation() {
    let server = model().await;
    let run = unique_run("isolation");
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let mut uncited = log_found(&run, "call-uncited");
    uncited["agent_result"] = json!(uncited["agent_result"]
        .as_str()
        .unwrap()
        .replace("upstream timeout calling orders-db", "UNCITED-CANARY"));
    let mut invocations = standard_invocations(&run);
    invocations.push(uncited);
    let draft = good_draft();
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft.clone(), invocations),
    )
    .await;
    assert_eq!(out.result.outcome.as_str(), "SUCCESS");
    let seen = requests(&server).await;
    let request = semantic_requests(&seen)[0];
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    let text = body.to_string();
    assert!(
        body.get("tools").is_none() && body.get("tool_choice").is_none(),
        "no tool definition"
    );
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        2,
        "a fresh single turn: system rubric and one user message, no history"
    );
    let user = messages[1]["content"].as_str().unwrap();
    assert!(user.contains(QUERY));
    for section in [
        &draft["conclusion"]["text"],
        &draft["analyses"][0]["text"],
        &draft["analyses"][1]["text"],
        &draft["analyses"][2]["text"],
        &draft["action_plan"][0]["text"],
        &draft["recommendations"][0]["text"],
        &draft["limitations"][0],
    ] {
        assert!(
            user.contains(section.as_str().unwrap()),
            "missing report section {section}"
        );
    }
    for canary in [
        "call-log-01",
        "call-rag-01",
        "call-sql-01",
        "call-log-02",
        "call-uncited",
        "tool_call_id",
        "RAW-RESPONSE-CANARY",
        "UNCITED-CANARY",
        "aiops:",
        ":run:{",
        &run,
    ] {
        assert!(
            !text.contains(canary),
            "{canary} must not reach SemanticGuard"
        );
    }
}

#[actix_rt::test]
async fn scenario_binary_review_output() {
    // A valid verdict is exactly a verdict and a reason.
    let server = model().await;
    let run = unique_run("binary");
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the logs and the runbook."),
    )
    .await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        out.audit["verdict"],
        json!({"verdict": "SUPPORTED", "reason": "Every claim matches the logs and the runbook."})
    );
    // A judge that returns a corrected report is not a verdict: it is never used.
    let server = model().await;
    let run = unique_run("binary-corrected");
    let corrected = json!({"verdict": "SUPPORTED", "reason": "fixed it", "report": {"conclusion": "something else"}});
    on_semantic(&server, content(&corrected.to_string())).await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNAVAILABLE")
    );
    assert!(!out.json.contains("something else"));
    let outcomes: Vec<&str> = out.audit["model_attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["schema", "schema"]);
}

// ---- Requirement: Semantic model budgets timeout cancellation and retry ----

#[actix_rt::test]
async fn scenario_technical_failure_then_success() {
    for first in [
        ResponseTemplate::new(503).set_body_string("upstream overloaded"),
        content("I think it is SUPPORTED."),
        verdict("SUPPORTED", "Every claim matches the evidence.")
            .set_delay(std::time::Duration::from_secs(10)),
    ] {
        let server = model().await;
        let run = unique_run("retry");
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .respond_with(first)
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&server)
            .await;
        on_semantic(
            &server,
            verdict("UNSUPPORTED", "The second verdict controls."),
        )
        .await;
        let mut cfg = config(Some(&server.uri()));
        cfg.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(500).unwrap();
        let out = release(cfg, &bundle(&run, good_draft(), standard_invocations(&run))).await;
        let attempts = out.audit["model_attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "exactly two attempts are recorded");
        assert!(
            ["transport", "parse", "timeout"].contains(&attempts[0]["outcome"].as_str().unwrap())
        );
        assert_eq!(attempts[1]["outcome"], "ok");
        assert_eq!(
            out.result.fallback_type.map(|f| f.as_str()),
            Some("SEMANTIC_UNSUPPORTED"),
            "the second verdict controls"
        );
        let seen = requests(&server).await;
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen[0].body, seen[1].body,
            "both attempts send byte-identical requests"
        );
    }
}

#[actix_rt::test]
async fn scenario_unsupported_is_not_retried() {
    let server = model().await;
    let run = unique_run("unsupported");
    on_semantic(
        &server,
        verdict(
            "UNSUPPORTED",
            "REASON-CANARY: no evidence of pool exhaustion",
        ),
    )
    .await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(requests(&server).await.len(), 1);
    assert_eq!(out.audit["model_attempts"].as_array().unwrap().len(), 1);
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNSUPPORTED")
    );
    assert!(
        !out.json.contains("REASON-CANARY"),
        "the guard's reason stays in the audit"
    );
}

#[actix_rt::test]
async fn scenario_run_cancellation_during_model_call() {
    use release_harness::actors::{CancelRun, StartRelease};
    use release_harness::domain::audit::CancelSource;
    let mut hanging = HangingModel::start();
    let run = unique_run("cancel-scenario");
    let (registry, store, request) = start_registry(
        config(Some(&hanging.url)),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    );
    let pending = actix_rt::spawn(registry.send(StartRelease(request)));
    let wait = std::time::Duration::from_secs(5);
    assert_eq!(
        hanging.next(wait).await,
        Some(Event::Received),
        "the guard call is pending"
    );
    registry.do_send(CancelRun {
        run_id: run.clone(),
        source: CancelSource::Http,
    });
    let released = pending.await.unwrap().unwrap().unwrap();
    assert_eq!(
        released.result.outcome.as_str(),
        "CANCELLED",
        "not converted into a fallback"
    );
    assert_eq!(released.result.fallback_type, None);
    assert_eq!(
        hanging.next(wait).await,
        Some(Event::Closed),
        "the Future was dropped: connection closed"
    );
    let stored: Value =
        serde_json::from_str(&store.get_result(&run).await.unwrap().unwrap()).unwrap();
    assert_eq!(
        stored["outcome"], "CANCELLED",
        "no late model result is released"
    );
}

// ---- Requirement: Fail-closed release policy ----

#[actix_rt::test]
async fn scenario_supported_report_release() {
    let server = model().await;
    let run = unique_run("supported");
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let draft = good_draft();
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft.clone(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(out.result.outcome.as_str(), "SUCCESS");
    let mut expected = draft;
    for a in expected["analyses"].as_array_mut().unwrap() {
        a.as_object_mut().unwrap().remove("tool_call_ids");
    }
    let released: Value = serde_json::from_str(&out.json).unwrap();
    assert_eq!(
        released["report"], expected,
        "the same Draft, unchanged, without tool call ids"
    );
    assert_eq!(released["message"], Value::Null);
    assert_eq!(released["fallback_type"], Value::Null);
}

#[actix_rt::test]
async fn scenario_unsupported_report_fallback() {
    let server = model().await;
    let run = unique_run("unsupported-fallback");
    on_semantic(
        &server,
        verdict("UNSUPPORTED", "The conclusion overreaches the evidence."),
    )
    .await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    let released: Value = serde_json::from_str(&out.json).unwrap();
    assert_eq!(released["outcome"], "FALLBACK");
    assert_eq!(released["fallback_type"], "SEMANTIC_UNSUPPORTED");
    assert_eq!(released["report"], Value::Null);
    let sources: Vec<&str> = released["verified_sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["source"].as_str().unwrap())
        .collect();
    assert_eq!(
        sources,
        vec!["order-api", "kb-123", "orders-db"],
        "only the cited, verified evidence, in citation order"
    );
    assert!(
        !out.json.contains("payment-gateway"),
        "an uncited call is not a source"
    );
}

#[actix_rt::test]
async fn scenario_semantic_review_remains_unavailable() {
    let server = model().await;
    let run = unique_run("unavailable");
    on_semantic(
        &server,
        ResponseTemplate::new(500).set_body_string("INTERNAL-FAILURE-CANARY"),
    )
    .await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        requests(&server).await.len(),
        2,
        "the configured two attempts, no hidden client retries"
    );
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("SEMANTIC_UNAVAILABLE")
    );
    assert!(out.result.report.is_none());
    for leak in [
        "INTERNAL-FAILURE-CANARY",
        "HTTP 500",
        "HikariPool",
        "transport",
    ] {
        assert!(!out.json.contains(leak), "{leak} leaked into the result");
    }
}

#[actix_rt::test]
async fn scenario_evidence_validation_fallback_sources() {
    let server = model().await;
    let run = unique_run("evf-sources");
    let mut typo = good_draft();
    typo["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
    on_repair(&server, ResponseTemplate::new(500)).await;
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, typo, standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
    assert!(out.result.verified_sources.is_empty() && out.result.observed_facts.is_empty());
    assert_eq!(
        requests(&server).await.len(),
        1,
        "exactly one repair attempt"
    );
}

#[actix_rt::test]
async fn scenario_missing_context_ends_without_tool_calls() {
    let server = model().await;
    let run = unique_run("missing-context");
    let draft = json!({"conclusion": null, "analyses": [], "missing_context": ["Which deployment window?", "Which region?"]});
    let out = release(config(Some(&server.uri())), &bundle(&run, draft, vec![])).await;
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("MISSING_REQUIRED_CONTEXT")
    );
    assert_eq!(
        out.result.missing_context,
        vec!["Which deployment window?", "Which region?"]
    );
    assert!(requests(&server).await.is_empty(), "no guard model call");
}

#[actix_rt::test]
async fn scenario_finite_checks_do_not_support_a_conclusion() {
    let run = unique_run("finite");
    let mut projecting = log_found(&run, "call-late");
    projecting["lifecycle"] = json!("PROJECTING");
    let mut invocations = standard_invocations(&run);
    invocations.push(projecting);
    let expected = vec![
        "log_search in order-api, level:ERROR AND timeout, 10:00–11:00: 132 matches",
        "rag_search in runbooks, order-api timeout runbook: 1 hit (kb-123)",
        "log_search in payment-gateway, level:ERROR, 10:00–11:00: 0 matches",
        "mysql_query on orders-db, slow_queries_by_table, 10:00–11:00: 0 rows",
    ];
    let no_conclusion = json!({"conclusion": null, "analyses": [
        {"id": "A1", "kind": "NORMAL", "text": "Errors seen.", "tool_call_ids": ["call-log-01"]}]});
    for (stop, draft) in [
        ("FINAL_ANSWER", no_conclusion),
        ("INFORMATION_SATURATION", json!("ignored")),
        ("BUDGET_EXHAUSTED", Value::Null),
    ] {
        let server = model().await;
        let mut b = bundle(&run, draft, invocations.clone());
        b["stop_reason"] = json!(stop);
        let out = release(config(Some(&server.uri())), &b).await;
        assert_eq!(
            out.result.fallback_type.map(|f| f.as_str()),
            Some("INSUFFICIENT_EVIDENCE"),
            "{stop}"
        );
        let summaries: Vec<&str> = out
            .result
            .observed_facts
            .iter()
            .map(|f| f.summary.as_str())
            .collect();
        assert_eq!(summaries, expected, "{stop}: only actual completed checks");
        assert!(
            requests(&server).await.is_empty(),
            "{stop}: deterministic, no model call"
        );
    }
}

#[actix_rt::test]
async fn scenario_invalid_draft_has_publishable_progress() {
    let server = model().await;
    let run = unique_run("invalid-draft");
    let raw = format!(
        "Here is the report:\n```json\n{}\n```",
        json!({"conclusion": {"text": "DRAFT-CANARY deploy broke it", "analysis_refs": ["A1"]},
        "analyses": [{"id": "A1", "kind": "NORMAL", "text": "DRAFT-CANARY", "tool_call_ids": ["call-fake"]}]})
    );
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, json!(raw), standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("INSUFFICIENT_EVIDENCE")
    );
    assert_eq!(out.result.observed_facts.len(), 4);
    assert!(
        !out.json.contains("DRAFT-CANARY") && !out.json.contains("call-fake"),
        "nothing of the invalid Draft"
    );
    assert!(requests(&server).await.is_empty());
}
