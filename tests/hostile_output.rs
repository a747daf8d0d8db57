//! Hostile tool data, the output side (CONTRACT §1, §3): what a release copies from the
//! agent's records is masked and bounded, and a Draft whose text names one of the run's
//! call ids or Redis keys never reaches a model. Each test drives a whole release through
//! the actor tree (in-memory store, the `check` path) with wiremock as the model.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use common::*;
use serde_json::{json, Value};
use wiremock::MockServer;

/// A model that would answer both roles, so that any call it gets is visible, not an error.
async fn willing_model() -> MockServer {
    let server = MockServer::start().await;
    on_repair(&server, content(&good_draft().to_string())).await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "The claims fit the cited evidence."),
    )
    .await;
    server
}

/// Replaces the projection of a bundle invocation through `edit`.
fn edit_projection(invocation: &mut Value, edit: impl FnOnce(&mut Value)) {
    let mut projection: Value =
        serde_json::from_str(invocation["agent_result"].as_str().unwrap()).unwrap();
    edit(&mut projection);
    invocation["agent_result"] = json!(projection.to_string());
}

fn semantic_bodies(requests: &[wiremock::Request]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| is_semantic(r))
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect()
}

/// Records larger than the store's default record limit are allowed here: these tests are
/// about what is copied out of a record, not about whether it is read.
fn roomy_config(server: &MockServer) -> release_harness::config::Config {
    let mut c = config(Some(&server.uri()));
    c.evidence.max_record_bytes = std::num::NonZero::new(4 * 1024 * 1024).unwrap();
    c.evidence.max_release_bytes = std::num::NonZero::new(16 * 1024 * 1024).unwrap();
    c
}

#[actix_rt::test]
async fn a_draft_naming_a_run_call_id_fails_evidence_validation_with_no_model_call() {
    let server = willing_model().await;
    let run = unique_run("names-call-id");
    let mut draft = good_draft();
    draft["analyses"][0]["text"] = json!("132 ERROR timeouts (see call-log-01).");
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
    assert_eq!(audit_rules(&out.audit), ["draft_names_identifier"]);
    let violation = &out.audit["violations"][0];
    assert_eq!(violation["at"], "analyses[0]");
    assert_eq!(violation["tool_call_id"], "call-log-01");
    assert_eq!(out.audit["repair"]["ran"], false, "{}", out.audit);
    assert!(
        requests(&server).await.is_empty(),
        "neither a repair nor SemanticGuard is called"
    );
    assert!(!out.json.contains("call-log-01"));
    // A longer word that merely starts like a call id is not one.
    let mut draft = good_draft();
    draft["analyses"][0]["text"] = json!("132 ERROR timeouts, as in call-log-012.");
    let run = unique_run("longer-word");
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, standard_invocations(&run)),
    )
    .await;
    assert_eq!(out.result.outcome.as_str(), "SUCCESS", "{}", out.audit);
}

#[actix_rt::test]
async fn a_draft_naming_a_redis_key_fails_evidence_validation_with_no_model_call() {
    let server = willing_model().await;
    let run = unique_run("names-key");
    let mut draft = good_draft();
    draft["limitations"] = json!([format!("Read from aiops:run:{{{run}}}:call:c-1 only.")]);
    draft["action_plan"][0]["text"] = json!("Clear aiops:release:{r} and retry.");
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, draft, standard_invocations(&run)),
    )
    .await;
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
    let at: Vec<&str> = out.audit["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["at"].as_str().unwrap())
        .collect();
    assert_eq!(at, ["action_plan[0]", "limitations[0]"]);
    assert!(
        !out.audit.to_string().contains(":call:c-1"),
        "the audit names the field, never quotes the text"
    );
    assert!(requests(&server).await.is_empty());
    assert!(!out.json.contains("aiops:"));
}

#[actix_rt::test]
async fn call_ids_and_redis_keys_in_a_scope_are_masked_in_sources_and_in_the_judges_request() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "The claims fit the cited evidence."),
    )
    .await;
    let run = unique_run("masked-scope");
    let mut invocations = standard_invocations(&run);
    let key = format!("aiops:run:{{{run}}}:call:call-rag-01");
    edit_projection(&mut invocations[0], |p| {
        p["scope"]["query"] = json!(format!("level:ERROR AND (call-rag-01 OR \"{key}\")"));
        p["entries"][0]["message"] = json!(format!("retrying call-sql-01 via {key}"));
    });
    let out = release(
        config(Some(&server.uri())),
        &bundle(&run, good_draft(), invocations),
    )
    .await;
    assert_eq!(out.result.outcome.as_str(), "SUCCESS", "{}", out.audit);
    let log = &out.result.verified_sources[0];
    assert_eq!(log.source, "order-api");
    assert_eq!(
        log.scope["query"],
        "level:ERROR AND ([call id] OR \"[redis key]\")"
    );
    let bodies = semantic_bodies(&requests(&server).await);
    assert_eq!(bodies.len(), 1);
    for text in [&out.json, &bodies[0]] {
        for leaked in ["call-rag-01", "call-sql-01", "call-log-01", "aiops:run:"] {
            assert!(!text.contains(leaked), "{leaked} leaked");
        }
    }
    assert!(bodies[0].contains("retrying [call id] via [redis key]"));
    assert!(bodies[0].contains("[call id] OR"));
}

#[actix_rt::test]
async fn a_one_megabyte_scope_query_is_cut_and_the_result_stays_small() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "The claims fit the cited evidence."),
    )
    .await;
    let huge = |run: &str| {
        let mut invocations = standard_invocations(run);
        edit_projection(&mut invocations[0], |p| {
            p["scope"]["query"] = json!("q".repeat(1024 * 1024));
        });
        invocations
    };
    let run = unique_run("huge-query");
    let out = release(
        roomy_config(&server),
        &bundle(&run, good_draft(), huge(&run)),
    )
    .await;
    assert_eq!(out.result.outcome.as_str(), "SUCCESS", "{}", out.audit);
    let query = out.result.verified_sources[0].scope["query"]
        .as_str()
        .unwrap();
    assert_eq!(query, format!("{}…[truncated]", "q".repeat(256)));
    assert!(out.json.len() < 8 * 1024, "{} bytes", out.json.len());
    let bodies = semantic_bodies(&requests(&server).await);
    assert!(
        bodies[0].len() < 16 * 1024,
        "judge request {} bytes",
        bodies[0].len()
    );

    // The same record as an observed fact: scope and summary are cut the same way.
    let no_conclusion = json!({"conclusion": null, "analyses": []});
    let run = unique_run("huge-query-facts");
    let out = release(
        roomy_config(&server),
        &bundle(&run, no_conclusion, huge(&run)),
    )
    .await;
    let fact = &out.result.observed_facts[0];
    assert_eq!(fact.scope["query"], query);
    assert_eq!(
        fact.summary,
        format!("log_search in order-api, {query}, 10:00–11:00: 132 matches")
    );
    assert!(out.json.len() < 8 * 1024, "{} bytes", out.json.len());
}

#[actix_rt::test]
async fn many_item_params_are_bounded_with_a_count_of_what_was_left_out() {
    let server = MockServer::start().await;
    let run = unique_run("many-params");
    let mut sql = mysql_none(&run, "call-sql-01");
    edit_projection(&mut sql, |p| {
        let params: serde_json::Map<String, Value> =
            (0..100).map(|i| (format!("p{i:03}"), json!(i))).collect();
        p["scope"]["params"] = Value::Object(params);
        p["scope"]["params"]["p000"] = json!((0..50).collect::<Vec<_>>());
        p["scope"]["params"]["p001"] = json!({"a": {"b": {"c": {"d": 1}}}});
    });
    let draft = json!({"conclusion": null, "analyses": [
        {"id": "A1", "kind": "NEGATIVE_OBSERVATION", "text": "No slow queries.", "tool_call_ids": ["call-sql-01"]}]});
    let out = release(config(Some(&server.uri())), &bundle(&run, draft, vec![sql])).await;
    assert_eq!(
        out.result.fallback_type.map(|f| f.as_str()),
        Some("INSUFFICIENT_EVIDENCE")
    );
    let params = &out.result.observed_facts[0].scope["params"];
    let keys: Vec<&str> = params
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        ["p000", "p001", "p002", "p003", "p004", "p005", "p006", "p007", "…"],
        "the first eight in written order, then the count"
    );
    assert_eq!(params["…"], "92 more");
    assert_eq!(params["p000"], json!([0, 1, 2, 3, 4, 5, 6, 7, "… 42 more"]));
    assert_eq!(
        params["p001"],
        json!({"a": "…"}),
        "scope, params, p001: a container on the fourth level is left out"
    );
    assert_eq!(
        out.result.verified_sources[0].scope,
        out.result.observed_facts[0].scope
    );
    assert!(requests(&server).await.is_empty());
}
