//! Realistic run data for soak runs, the demo and the tests: canonical invocation records
//! of an order-api timeout investigation (CONTRACT §1, in run-bundle form: every field a
//! string), and a concluded Draft that passes EvidenceGuard on them (CONTRACT §2).

use serde_json::{json, Value};

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
