//! Benchmarks of the harness's own share of a release: the deterministic decision and the
//! SemanticGuard request bytes, on a realistic Draft (20 analyses citing 40 calls, 2 each,
//! a mix of log searches with 10 entries, RAG searches with 3 hits and MySQL queries).
//!
//! - `evidence_guard_snapshot_decision`: `release::begin` (which runs
//!   `RunEvidence::resolve` and EvidenceGuard, then builds the verified snapshot) up to
//!   `Step::Judge`, `verified_sources`, `after_judgement` with SUPPORTED, and the result
//!   serialized to JSON.
//! - `run_evidence_resolve`: `RunEvidence::resolve` alone, the part of the above spent
//!   parsing the 40 records strictly (about 48 KB of projection JSON).
//! - `guard_snapshot_decision_resolved`: the same decision on records already parsed:
//!   EvidenceGuard's rules, the verified snapshot, `verified_sources`, the result and its
//!   JSON, without the strict parsing.
//! - `semantic_request_build`: the SemanticGuard request for the same Draft and snapshot.
//!
//! Run with `cargo bench --bench release_path`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};

use release_harness::config::StructuredOutput;
use release_harness::domain::audit::Audit;
use release_harness::domain::bounded::Redactor;
use release_harness::domain::draft::{
    ActionItem, Analysis, AnalysisKind, Conclusion, Draft, Recommendation,
};
use release_harness::domain::evidence_guard::{check_concluded, RunEvidence};
use release_harness::domain::identifiers::RunIdentifiers;
use release_harness::domain::invocation::RawRecord;
use release_harness::domain::release::{
    self, after_judgement, DraftInput, Judgeable, Judgement, ReleasePolicy, ReleaseResult, Step,
    StopReason,
};
use release_harness::domain::snapshot::VerifiedSnapshot;
use release_harness::model::prompts::{semantic_request, RequestShape};

const RUN: &str = "r-bench";
const ANALYSES: usize = 20;
const CALLS_PER_ANALYSIS: usize = 2;

fn policy() -> ReleasePolicy {
    ReleasePolicy::defaults()
}

fn log_projection(call: &str, shard: usize, found: bool) -> Value {
    let entries: Vec<Value> = (0..if found { 10 } else { 0 })
        .map(|k| {
            json!({"timestamp": format!("2026-12-01T10:{:02}:03Z", 5 + k), "host": format!("order-api-{k}"),
                   "level": "ERROR",
                   "message": format!("upstream timeout after 3000ms calling orders-db (attempt {k}, pool 50/50 busy, request id 7f3a{k:04})")})
        })
        .collect();
    json!({"tool": "log_search", "tool_call_id": call,
           "evidence_status": if found { "EVIDENCE_FOUND" } else { "NO_EVIDENCE" },
           "scope": {"service": "order-api", "query": format!("level:ERROR AND timeout AND shard:{shard}"),
                     "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00Z", "limit": 50},
           "total_matches": if found { 132 } else { 0 }, "entries": entries})
}

fn rag_projection(call: &str, shard: usize, found: bool) -> Value {
    let hits: Vec<Value> = (0..if found { 3 } else { 0 })
        .map(|k| {
            json!({"doc_id": format!("kb-{shard}-{k}"), "title": "Order API timeouts",
                   "excerpt": "When the orders-db connection pool is exhausted, order-api requests queue \
                               until the 3 s client timeout and the gateway answers 504. Raise the pool \
                               size or shed load; check slow queries first.",
                   "updated_at": "2026-11-01T00:00:00Z", "score": 0.82 - k as f64 / 10.0})
        })
        .collect();
    json!({"tool": "rag_search", "tool_call_id": call,
           "evidence_status": if found { "EVIDENCE_FOUND" } else { "NO_EVIDENCE" },
           "scope": {"query": format!("order-api timeout runbook, shard {shard}"), "index": "runbooks", "top_k": 5},
           "hits": hits})
}

fn mysql_projection(call: &str, shard: usize, found: bool) -> Value {
    let rows: Vec<Value> = (0..if found { 4 } else { 0 })
        .map(|k| json!([format!("orders_{k}"), 40 + k, 812.5]))
        .collect();
    json!({"tool": "mysql_query", "tool_call_id": call,
           "evidence_status": if found { "EVIDENCE_FOUND" } else { "NO_EVIDENCE" },
           "scope": {"datasource": "orders-db", "statement": "slow_queries_by_table",
                     "params": {"min_ms": 500, "shard": shard}, "from": "2026-12-01T10:00:00Z",
                     "to": "2026-12-01T11:00:00Z", "max_rows": 100},
           "columns": ["table", "count", "avg_ms"], "rows": rows, "row_count": rows.len()})
}

fn record(call: &str, tool: &str, found: bool, projection: Value) -> RawRecord {
    [
        ("run_id", RUN.to_string()),
        ("tool_call_id", call.to_string()),
        ("tool_name", tool.to_string()),
        ("lifecycle", "READY".to_string()),
        (
            "evidence_status",
            if found {
                "EVIDENCE_FOUND"
            } else {
                "NO_EVIDENCE"
            }
            .to_string(),
        ),
        ("agent_result", projection.to_string()),
        ("raw_response", "x".repeat(4096)),
        ("started_at", "2026-12-01T10:05:00Z".to_string()),
        ("finished_at", "2026-12-01T10:05:01Z".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The Draft and its run: every fifth analysis is a NEGATIVE_OBSERVATION over two
/// NO_EVIDENCE calls; the others are NORMAL over EVIDENCE_FOUND calls.
fn fixture() -> (Draft, RunEvidence) {
    let mut records = foldhash::HashMap::default();
    let mut calls = Vec::new();
    let mut analyses = Vec::new();
    for a in 0..ANALYSES {
        let negative = a % 5 == 4;
        let mut cited = Vec::new();
        for j in 0..CALLS_PER_ANALYSIS {
            let n = a * CALLS_PER_ANALYSIS + j;
            let call = format!("c-{n}");
            let found = !negative;
            let (tool, projection) = match n % 3 {
                0 => ("log_search", log_projection(&call, n, found)),
                1 => ("rag_search", rag_projection(&call, n, found)),
                _ => ("mysql_query", mysql_projection(&call, n, found)),
            };
            records.insert(call.clone(), record(&call, tool, found, projection));
            calls.push(call.clone());
            cited.push(call);
        }
        analyses.push(Analysis {
            id: format!("A{}", a + 1),
            kind: if negative {
                AnalysisKind::NegativeObservation
            } else {
                AnalysisKind::Normal
            },
            text: format!(
                "Finding {}: order-api logged 132 upstream timeouts calling orders-db between \
                 10:00 and 11:00, and the runbook ties them to pool exhaustion.",
                a + 1
            ),
            tool_call_ids: cited,
        });
    }
    let refs = |ids: &[usize]| ids.iter().map(|i| format!("A{i}")).collect::<Vec<_>>();
    let draft = Draft {
        conclusion: Some(Conclusion {
            text: "order-api times out because the orders-db connection pool is exhausted.".into(),
            analysis_refs: refs(&[1, 2, 3, 5, 8, 13]),
        }),
        analyses,
        action_plan: vec![
            ActionItem {
                text: "Raise the orders-db pool size from 50 to 80.".into(),
                analysis_refs: refs(&[1, 2]),
                requires_human_confirmation: true,
            },
            ActionItem {
                text: "Shed load on the checkout path until the pool recovers.".into(),
                analysis_refs: refs(&[3]),
                requires_human_confirmation: true,
            },
            ActionItem {
                text: "Page the database on-call.".into(),
                analysis_refs: refs(&[5]),
                requires_human_confirmation: false,
            },
        ],
        recommendations: vec![
            Recommendation {
                text: "Alert on pool saturation above 90 % for 5 minutes.".into(),
                analysis_refs: refs(&[1, 5]),
            },
            Recommendation {
                text: "Add a circuit breaker around orders-db calls.".into(),
                analysis_refs: refs(&[2]),
            },
        ],
        limitations: vec!["Only 10:00-11:00 was searched.".into()],
        missing_context: vec![],
    };
    let evidence = RunEvidence {
        run_id: RUN.into(),
        calls,
        records,
        ..RunEvidence::default()
    };
    (draft, evidence)
}

fn judge(draft: Draft, evidence: &RunEvidence) -> Box<Judgeable> {
    let mut audit = Audit::new(RUN, StopReason::FinalAnswer);
    match release::begin(
        StopReason::FinalAnswer,
        DraftInput::Parsed(draft),
        evidence,
        &policy(),
        &mut audit,
    ) {
        Step::Judge(judged) => judged,
        other => panic!("the bench Draft must pass EvidenceGuard, got {other:?}"),
    }
}

fn evidence_guard_snapshot_decision(c: &mut Criterion) {
    let (draft, evidence) = fixture();
    let policy = policy();
    c.bench_function("evidence_guard_snapshot_decision", |b| {
        b.iter(|| {
            let mut audit = Audit::new(RUN, StopReason::FinalAnswer);
            let step = release::begin(
                StopReason::FinalAnswer,
                DraftInput::Parsed(draft.clone()),
                black_box(&evidence),
                &policy,
                &mut audit,
            );
            let Step::Judge(judged) = step else {
                panic!("the bench Draft must pass EvidenceGuard");
            };
            let sources = judged.snapshot.verified_sources();
            let result = after_judgement(
                RUN,
                Judgement::Supported {
                    reason: "fits".into(),
                },
                std::sync::Arc::new(*judged),
                &mut audit,
            );
            let bytes = serde_json::to_vec(&result).expect("a release result serializes");
            black_box((sources, bytes))
        })
    });
    let cited = draft.cited_call_ids();
    c.bench_function("run_evidence_resolve", |b| {
        b.iter(|| black_box(black_box(&evidence).resolve(&cited)))
    });
    let run = evidence.resolve(&cited);
    c.bench_function("guard_snapshot_decision_resolved", |b| {
        b.iter(|| {
            let draft = black_box(&draft);
            check_concluded(draft, &run).expect("the bench Draft passes EvidenceGuard");
            let ids = RunIdentifiers::of_run(&run, &policy.key_prefix);
            let redact = Redactor::new(&ids, policy.copy);
            let snapshot = VerifiedSnapshot::build(draft, &run, &policy.snapshot, &redact);
            let sources = snapshot.verified_sources();
            let result = ReleaseResult::success(RUN, draft, &snapshot);
            let bytes = serde_json::to_vec(&result).expect("a release result serializes");
            black_box((sources, bytes))
        })
    });
}

fn semantic_request_build(c: &mut Criterion) {
    let (draft, evidence) = fixture();
    let judged = judge(draft, &evidence);
    let shape = RequestShape {
        model: "m",
        structured_output: StructuredOutput::JsonSchema,
        max_output_tokens: 512,
    };
    let query = "Why are order-api requests timing out since 10:00?";
    let bytes = semantic_request(&shape, query, &judged.draft, &judged.snapshot, "n0nce")
        .expect("the request builds")
        .len_bytes();
    println!("semantic_request_build: request body is {bytes} bytes");
    c.bench_function("semantic_request_build", |b| {
        b.iter(|| {
            semantic_request(
                &shape,
                black_box(query),
                &judged.draft,
                &judged.snapshot,
                "0123456789abcdef0123456789abcdef",
            )
            .expect("the request builds")
        })
    });
}

criterion_group!(
    benches,
    evidence_guard_snapshot_decision,
    semantic_request_build
);
criterion_main!(benches);
