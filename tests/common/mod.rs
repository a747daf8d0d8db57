//! Shared test support: realistic invocation records, Drafts and bundles (CONTRACT §1-§2,
//! §6), a configuration pointed at a model server, wiremock responders that speak the
//! OpenAI chat-completions protocol, and the private Redis of `scripts/test.sh`.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use release_harness::check::{run_check, CheckOutput, RunBundle};
use release_harness::config::Config;
use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

pub const QUERY: &str = "Why are order-api requests timing out since 10:00?";

/// A record as a bundle invocation: every field a string.
pub fn invocation(run: &str, call: &str, tool: &str, status: &str, projection: Value) -> Value {
    json!({
        "run_id": run, "tool_call_id": call, "tool_name": tool, "lifecycle": "READY",
        "evidence_status": status, "agent_result": projection.to_string(),
        "raw_response": format!("RAW-RESPONSE-CANARY-{call}"),
        "started_at": "2026-12-01T10:05:00Z", "finished_at": "2026-12-01T10:05:01Z"
    })
}

/// order-api ERROR logs: 132 timeouts (EVIDENCE_FOUND).
pub fn log_found(run: &str, call: &str) -> Value {
    invocation(
        run,
        call,
        "log_search",
        "EVIDENCE_FOUND",
        json!({
        "tool": "log_search", "tool_call_id": call, "evidence_status": "EVIDENCE_FOUND",
        "scope": {"service": "order-api", "query": "level:ERROR AND timeout",
                  "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00Z", "limit": 50},
        "total_matches": 132,
        "entries": [
            {"timestamp": "2026-12-01T10:05:03Z", "host": "order-api-7", "level": "ERROR",
             "message": "HikariPool-1 - Connection is not available, request timed out after 3000ms"},
            {"timestamp": "2026-12-01T10:07:41Z", "host": "order-api-3", "level": "ERROR",
             "message": "upstream timeout calling orders-db after 3000ms"}
        ]}),
    )
}

/// payment-gateway logs: nothing (NO_EVIDENCE).
pub fn log_none(run: &str, call: &str) -> Value {
    invocation(
        run,
        call,
        "log_search",
        "NO_EVIDENCE",
        json!({
        "tool": "log_search", "tool_call_id": call, "evidence_status": "NO_EVIDENCE",
        "scope": {"service": "payment-gateway", "query": "level:ERROR",
                  "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00Z", "limit": 50},
        "total_matches": 0, "entries": []}),
    )
}

/// The runbook hit (EVIDENCE_FOUND).
pub fn rag_found(run: &str, call: &str) -> Value {
    invocation(
        run,
        call,
        "rag_search",
        "EVIDENCE_FOUND",
        json!({
        "tool": "rag_search", "tool_call_id": call, "evidence_status": "EVIDENCE_FOUND",
        "scope": {"query": "order-api timeout runbook", "index": "runbooks", "top_k": 5},
        "hits": [{"doc_id": "kb-123", "title": "Order API timeouts",
                  "excerpt": "Connection pool exhaustion in order-api surfaces as 504s; raise maximumPoolSize or kill long transactions.",
                  "updated_at": "2026-11-01T00:00:00Z", "score": 0.82}]}),
    )
}

/// Slow queries on orders-db: none over 500 ms (NO_EVIDENCE).
pub fn mysql_none(run: &str, call: &str) -> Value {
    invocation(
        run,
        call,
        "mysql_query",
        "NO_EVIDENCE",
        json!({
        "tool": "mysql_query", "tool_call_id": call, "evidence_status": "NO_EVIDENCE",
        "scope": {"datasource": "orders-db", "statement": "slow_queries_by_table",
                  "params": {"min_ms": 500}, "from": "2026-12-01T10:00:00Z",
                  "to": "2026-12-01T11:00:00Z", "max_rows": 100},
        "columns": ["table", "count"], "rows": [], "row_count": 0}),
    )
}

/// Slow queries on orders-db: found (EVIDENCE_FOUND).
pub fn mysql_found(run: &str, call: &str) -> Value {
    invocation(
        run,
        call,
        "mysql_query",
        "EVIDENCE_FOUND",
        json!({
        "tool": "mysql_query", "tool_call_id": call, "evidence_status": "EVIDENCE_FOUND",
        "scope": {"datasource": "orders-db", "statement": "slow_queries_by_table",
                  "params": {"min_ms": 500}, "max_rows": 100},
        "columns": ["table", "count"], "rows": [["orders", 412]], "row_count": 1}),
    )
}

/// The standard run: log (found), runbook (found), payment logs (none), slow queries (none).
pub fn standard_invocations(run: &str) -> Vec<Value> {
    vec![
        log_found(run, "call-log-01"),
        rag_found(run, "call-rag-01"),
        log_none(run, "call-log-02"),
        mysql_none(run, "call-sql-01"),
    ]
}

/// A concluded Draft that passes EvidenceGuard on the standard run.
pub fn good_draft() -> Value {
    json!({
        "conclusion": {"text": "order-api times out because the HikariPool-1 connection pool to orders-db is exhausted.",
                       "analysis_refs": ["A1", "A2", "A3"]},
        "analyses": [
            {"id": "A1", "kind": "NORMAL", "text": "132 ERROR timeouts in order-api between 10:00 and 11:00, HikariPool-1 connection not available.",
             "tool_call_ids": ["call-log-01"]},
            {"id": "A2", "kind": "NORMAL", "text": "The runbook says pool exhaustion surfaces as 504s.",
             "tool_call_ids": ["call-rag-01"]},
            {"id": "A3", "kind": "NEGATIVE_OBSERVATION", "text": "No slow queries over 500 ms on orders-db in the window.",
             "tool_call_ids": ["call-sql-01"]}
        ],
        "action_plan": [{"text": "Raise maximumPoolSize of HikariPool-1 after checking orders-db capacity.",
                         "analysis_refs": ["A1", "A2"], "requires_human_confirmation": true}],
        "recommendations": [{"text": "Alert on pool wait time.", "analysis_refs": ["A1"]}],
        "limitations": ["Only 10:00-11:00 UTC was searched."],
        "missing_context": []
    })
}

pub fn bundle(run: &str, draft: Value, invocations: Vec<Value>) -> Value {
    json!({"run_id": run, "query": QUERY, "stop_reason": "FINAL_ANSWER", "draft": draft, "invocations": invocations})
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A run id unique in this process (tests share stores only through Redis prefixes).
pub fn unique_run(name: &str) -> String {
    format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Defaults with the model (if any) at `model_url`, and short timeouts for tests.
pub fn config(model_url: Option<&str>) -> Config {
    let mut c = Config::defaults();
    if let Some(url) = model_url {
        c.model.base_url = url.to_string();
        c.model.name = "judge-test".into();
    }
    c.semantic_guard.attempt_timeout_ms = 2_000;
    c.semantic_guard.total_timeout_ms = 5_000;
    c.repair.timeout_ms = 2_000;
    c
}

/// Runs `check`'s release path (actor tree, in-memory store) on a bundle.
pub async fn release(config: Config, bundle: &Value) -> CheckOutput {
    let bundle = RunBundle::parse(&bundle.to_string()).expect("test bundle parses");
    run_check(config, &bundle).await.expect("release runs")
}

/// A chat-completion envelope whose message content is `content`.
pub fn completion(content: &str) -> Value {
    json!({
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1764583200, "model": "judge-test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 25, "total_tokens": 1225}
    })
}

pub fn verdict(verdict: &str, reason: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(completion(
        &json!({"verdict": verdict, "reason": reason}).to_string(),
    ))
}

pub fn content(text: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(completion(text))
}

/// Whether a recorded request is a SemanticGuard (not a repair) request.
pub fn is_semantic(request: &wiremock::Request) -> bool {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
    body["response_format"]["json_schema"]["name"] == "semantic_verdict"
}

pub fn is_repair(request: &wiremock::Request) -> bool {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
    body["response_format"]["json_schema"]["name"] == "evidence_repair"
}

/// Mounts a responder for SemanticGuard requests only.
pub async fn on_semantic(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .and(|r: &wiremock::Request| is_semantic(r))
        .respond_with(response)
        .mount(server)
        .await;
}

/// Mounts a responder for repair requests only.
pub async fn on_repair(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .and(|r: &wiremock::Request| is_repair(r))
        .respond_with(response)
        .mount(server)
        .await;
}

pub async fn requests(server: &MockServer) -> Vec<wiremock::Request> {
    server.received_requests().await.unwrap_or_default()
}

pub fn audit_rules(audit: &Value) -> Vec<String> {
    audit["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v["rule"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The private Redis of `scripts/test.sh`. Tests that need Redis fail loudly without it.
pub fn redis_url() -> String {
    std::env::var("HARNESS_TEST_REDIS_URL").expect(
        "HARNESS_TEST_REDIS_URL is not set: run the suite with scripts/test.sh (it starts a private redis-server)",
    )
}

/// A key prefix no other test uses.
pub fn unique_prefix(name: &str) -> String {
    format!("t-{name}-{}-{:x}", std::process::id(), rand_u64())
}

pub fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(NEXT.fetch_add(1, Ordering::SeqCst));
    h.finish()
}

/// A model endpoint that accepts a connection, reads the request, never answers, and
/// reports when the client closes the connection (what wiremock cannot observe).
pub struct HangingModel {
    pub url: String,
    received: tokio::sync::mpsc::UnboundedReceiver<Event>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Received,
    Closed,
}

impl HangingModel {
    pub fn start() -> HangingModel {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, received) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8192];
                    let mut seen = Vec::new();
                    let mut announced = false;
                    loop {
                        match stream.read(&mut buf) {
                            Ok(0) | Err(_) => {
                                let _ = tx.send(Event::Closed);
                                return;
                            }
                            Ok(n) => {
                                seen.extend_from_slice(&buf[..n]);
                                if !announced && seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                    announced = true;
                                    let _ = tx.send(Event::Received);
                                }
                            }
                        }
                    }
                });
            }
        });
        HangingModel { url, received }
    }

    /// Waits (in real time) for the next event.
    pub async fn next(&mut self, within: std::time::Duration) -> Option<Event> {
        let deadline = std::time::Instant::now() + within;
        loop {
            match self.received.try_recv() {
                Ok(event) => return Some(event),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return None,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {}
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            // Real-time polling: works whether or not the test paused tokio's clock.
            std::thread::sleep(std::time::Duration::from_millis(5));
            tokio::task::yield_now().await;
        }
    }
}

/// A registry over an in-memory store filled from `bundle`, for tests that need to send
/// cancels while a release runs.
pub fn start_registry(
    config: Config,
    bundle: &Value,
) -> (
    actix::Addr<release_harness::actors::RunRegistry>,
    release_harness::store::Store,
    release_harness::domain::request::ReleaseRequest,
) {
    use actix::Actor;
    let bundle = RunBundle::parse(&bundle.to_string()).expect("bundle");
    let store = release_harness::store::Store::Memory(bundle.store().expect("store"));
    let harness = release_harness::actors::Harness::new(config, store.clone()).expect("harness");
    let registry = release_harness::actors::RunRegistry::new(harness).start();
    (registry, store, bundle.request().expect("request"))
}
