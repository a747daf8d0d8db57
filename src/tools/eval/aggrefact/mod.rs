//! `release-harness eval --format aggrefact FILE`: the configured judge on rows of the public
//! LLM-AggreFact benchmark (`dataset`, `doc`, `claim`, `label`), through the harness's own
//! release path, so that its figure can stand beside the leaderboard's.
//!
//! Each row becomes a run bundle released exactly as `check` releases one (the actor tree,
//! EvidenceGuard, the snapshot, request building, verdict parsing, limits, budgets,
//! timeouts and retries of `serve`, over an in-memory store): one `rag_search` call whose
//! hits are the document split into excerpts the snapshot keeps whole
//! ([`SnapshotLimits::split_excerpts`]), and a Draft whose one NORMAL analysis and
//! conclusion are the claim. A document that needs more hits than the snapshot keeps is
//! over budget and never sent; one whose request is over the judge's input limit is denied
//! by the harness itself (SEMANTIC_UNAVAILABLE in `serve`) and reported as over budget too:
//! a document is never cut.
//!
//! Entry points: [`rows::load_rows`], [`select`], [`run_aggrefact`], [`write_report`].

pub mod report;
pub mod rows;

use std::path::Path;

use serde_json::{json, Value};

use crate::check::{run_check, RunBundle};
use crate::config::Config;
use crate::domain::audit::is_over_input_limit;
use crate::domain::release::FallbackType;
use crate::domain::snapshot::SnapshotLimits;
use crate::tools::eval::{
    attempt_summaries, bounded_reason, progress_bar, write_files, EvalError, Progress,
};
use report::{AggreFactReport, RowJudged, RowResult, Selection};
use rows::{stratified_sample, AggreFactRow, LoadedRows};

/// The operator question of every row's release.
pub const QUERY: &str = "Is the claim supported by the source document?";
/// The one tool call of every row's run: a name no claim or document holds as a token.
pub const CALL_ID: &str = "aggrefact-source-document";
/// The analysis that states the claim.
const ANALYSIS_ID: &str = "A1";

/// Which rows of the file are judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowChoice {
    /// The first N rows, in file order.
    pub limit: Option<usize>,
    /// A stratified sample of N rows (by dataset and label) with this seed.
    pub sample: Option<(usize, u64)>,
}

/// The rows `choice` selects, and how they were selected.
pub fn select(
    loaded: LoadedRows,
    choice: RowChoice,
) -> (Vec<AggreFactRow>, Selection, Vec<String>) {
    let LoadedRows {
        mut rows,
        ignored_columns,
    } = loaded;
    let file_rows = rows.len();
    if let Some(limit) = choice.limit {
        rows.truncate(limit);
    }
    if let Some((n, seed)) = choice.sample {
        rows = stratified_sample(rows, n, seed);
    }
    let selection = Selection {
        file_rows,
        limit: choice.limit,
        sample: choice.sample.map(|(n, _)| n),
        seed: choice.sample.map(|(_, seed)| seed),
    };
    (rows, selection, ignored_columns)
}

/// A row's run bundle, or why its document cannot reach the judge whole.
pub struct RowBundle {
    pub bundle: RunBundle,
    pub excerpts: usize,
}

/// The run bundle of row `number` (1-based): the document as one RAG call's hits, the claim
/// as the analysis and the conclusion. `Err` with the reason when the document needs more
/// hits than the snapshot keeps per call (`snapshot.max_entries_per_call`).
pub fn row_bundle(
    row: &AggreFactRow,
    number: usize,
    limits: &SnapshotLimits,
) -> Result<RowBundle, (String, usize)> {
    let pieces = limits.split_excerpts(&row.doc);
    if pieces.len() > limits.max_entries_per_call {
        return Err((
            format!(
                "the document ({} bytes) needs {} excerpts of at most {} bytes; the snapshot \
                 keeps {} per call (snapshot.max_entries_per_call)",
                row.doc.len(),
                pieces.len(),
                limits.max_excerpt_bytes,
                limits.max_entries_per_call
            ),
            pieces.len(),
        ));
    }
    let parts = pieces.len();
    let hits: Vec<Value> = pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            let mut hit = json!({"doc_id": "source-document", "excerpt": piece});
            if parts > 1 {
                hit["title"] = json!(format!("part {} of {parts}", i + 1));
            }
            hit
        })
        .collect();
    let projection = json!({
        "tool": "rag_search",
        "tool_call_id": CALL_ID,
        "evidence_status": "EVIDENCE_FOUND",
        "scope": {"query": "the source document of the claim", "top_k": parts},
        "hits": hits,
    });
    let run_id = format!("aggrefact-{number}");
    let bundle = json!({
        "run_id": run_id,
        "query": QUERY,
        "stop_reason": "FINAL_ANSWER",
        "draft": {
            "conclusion": {"text": row.claim, "analysis_refs": [ANALYSIS_ID]},
            "analyses": [{"id": ANALYSIS_ID, "kind": "NORMAL", "text": row.claim,
                          "tool_call_ids": [CALL_ID]}],
        },
        "invocations": [{
            "run_id": run_id, "tool_call_id": CALL_ID, "tool_name": "rag_search",
            "lifecycle": "READY", "evidence_status": "EVIDENCE_FOUND",
            "agent_result": projection.to_string(),
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z",
        }],
    });
    let bundle = RunBundle::parse(&bundle.to_string()).map_err(|e| (e.to_string(), parts))?;
    Ok(RowBundle {
        bundle,
        excerpts: parts,
    })
}

/// Rules by which a record is refused for its size: the document does not fit.
const SIZE_RULES: [&str; 2] = ["record_too_large", "record_over_budget"];

/// What the release of a row decided, from its audit record.
fn judged_from_audit(audit: &Value, fallback: Option<FallbackType>) -> (RowJudged, Option<String>) {
    let rules: Vec<&str> = audit["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["rule"].as_str())
        .collect();
    if let Some(rule) = rules.iter().find(|r| SIZE_RULES.contains(r)) {
        let why = format!("the document's record is refused for its size ({rule}, evidence.*)");
        return (RowJudged::OverBudget(why.clone()), Some(why));
    }
    if !rules.is_empty() {
        let why = format!("the Draft failed EvidenceGuard ({})", rules.join(", "));
        return (RowJudged::NotJudged(why.clone()), Some(why));
    }
    match (audit["verdict"]["verdict"].as_str(), fallback) {
        (Some("SUPPORTED"), _) => (RowJudged::Supported, None),
        (Some("UNSUPPORTED"), _) => (RowJudged::Unsupported, None),
        (_, Some(FallbackType::SemanticUnavailable)) => {
            // Denied before it was sent: the first attempt did not fit a limit or budget.
            let first = audit["model_attempts"]
                .as_array()
                .and_then(|a| a.iter().find(|a| a["role"] == "semantic"));
            match first {
                Some(a) if a["outcome"] == "budget_denied" => {
                    let detail = a["detail"].as_str().unwrap_or("denied by a budget");
                    let why = if is_over_input_limit(detail) {
                        detail.to_string()
                    } else {
                        format!("the run's model budget: {detail}")
                    };
                    (RowJudged::OverBudget(why.clone()), Some(why))
                }
                _ => (RowJudged::TechnicalFailure, None),
            }
        }
        (_, other) => {
            let why = format!(
                "the row did not reach the judge ({})",
                other.map(FallbackType::as_str).unwrap_or("no fallback")
            );
            (RowJudged::NotJudged(why.clone()), Some(why))
        }
    }
}

/// Judges every row, one at a time (each its own release: in-memory store, fresh actor
/// tree), and returns the report. Must run inside an actix System.
pub async fn run_aggrefact(
    config: &Config,
    source: &Path,
    rows: &[AggreFactRow],
    selection: Selection,
    ignored_columns: Vec<String>,
    progress: Progress,
) -> Result<AggreFactReport, EvalError> {
    if !config.model_configured() {
        return Err(EvalError::NoModel);
    }
    let limits = config.release_policy().snapshot;
    let bar = progress_bar(rows.len(), progress, "rows");
    let started = std::time::Instant::now();
    let mut results = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        bar.set_message(row.id.clone());
        let mut result = RowResult {
            id: row.id.clone(),
            dataset: row.dataset.clone(),
            label: row.label(),
            judged: RowJudged::NotJudged(String::new()),
            why: None,
            reason: None,
            doc_bytes: row.doc.len(),
            excerpts: 0,
            attempts: Vec::new(),
        };
        match row_bundle(row, i + 1, &limits) {
            Err((why, excerpts)) => {
                result.excerpts = excerpts;
                result.judged = RowJudged::OverBudget(why.clone());
                result.why = Some(why);
            }
            Ok(RowBundle { bundle, excerpts }) => {
                result.excerpts = excerpts;
                match run_check(config.clone(), &bundle).await {
                    Ok(output) => {
                        let (judged, why) =
                            judged_from_audit(&output.audit, output.result.fallback_type);
                        result.judged = judged;
                        result.why = why;
                        result.reason = bounded_reason(&output.audit);
                        result.attempts = attempt_summaries(&output.audit);
                    }
                    Err(e) => {
                        let why = format!("the release failed: {e}");
                        result.judged = RowJudged::NotJudged(why.clone());
                        result.why = Some(why);
                    }
                }
            }
        }
        results.push(result);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(AggreFactReport::build(
        source.display().to_string(),
        selection,
        ignored_columns,
        config,
        started.elapsed(),
        results,
    ))
}

/// Writes `report.json` and `report.md` into `dir` (created if needed).
pub fn write_report(report: &AggreFactReport, dir: &Path) -> Result<(), EvalError> {
    write_files(dir, report, &report.markdown())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(doc: &str) -> AggreFactRow {
        AggreFactRow {
            id: "A#1".into(),
            dataset: "A".into(),
            doc: doc.into(),
            claim: "The pump failed at 10:04.".into(),
            supported: true,
        }
    }

    #[test]
    fn a_row_becomes_one_rag_call_cited_by_the_claim() {
        let limits = SnapshotLimits {
            max_excerpt_bytes: 16,
            max_excerpt_chars: 100,
            ..SnapshotLimits::default()
        };
        let doc = "The pump failed at 10:04. It was restarted at 10:30.";
        let made = row_bundle(&row(doc), 3, &limits).unwrap();
        assert_eq!(made.excerpts, limits.split_excerpts(doc).len());
        assert!(made.excerpts > 1);
        let request = made.bundle.request().unwrap();
        assert_eq!(request.run_id, "aggrefact-3");
        let records = made.bundle.agent_records().unwrap();
        assert_eq!(records.records.len(), 1);
        let projection: Value =
            serde_json::from_str(&records.records[0].fields["agent_result"]).unwrap();
        let hits = projection["hits"].as_array().unwrap();
        let joined: String = hits
            .iter()
            .map(|h| h["excerpt"].as_str().unwrap())
            .collect();
        assert_eq!(joined, doc, "the document, whole, in order");
        assert_eq!(hits[0]["title"], format!("part 1 of {}", made.excerpts));
    }

    #[test]
    fn a_document_past_the_hits_the_snapshot_keeps_is_over_budget() {
        let limits = SnapshotLimits {
            max_excerpt_bytes: 10,
            max_entries_per_call: 2,
            ..SnapshotLimits::default()
        };
        let (why, excerpts) = row_bundle(&row(&"word ".repeat(10)), 1, &limits)
            .err()
            .unwrap();
        assert_eq!(excerpts, 5);
        assert!(why.contains("snapshot.max_entries_per_call"), "{why}");
    }

    #[test]
    fn the_audit_tells_a_verdict_a_technical_failure_and_an_over_budget_row_apart() {
        let unavailable = Some(FallbackType::SemanticUnavailable);
        let verdict =
            json!({"violations": [], "verdict": {"verdict": "UNSUPPORTED", "reason": "r"}});
        assert_eq!(
            judged_from_audit(&verdict, Some(FallbackType::SemanticUnsupported)).0,
            RowJudged::Unsupported
        );
        let timeouts = json!({"violations": [], "model_attempts": [
            {"role": "semantic", "outcome": "timeout"}, {"role": "semantic", "outcome": "timeout"}]});
        assert_eq!(
            judged_from_audit(&timeouts, unavailable).0,
            RowJudged::TechnicalFailure
        );
        let detail = crate::domain::audit::over_input_limit(
            crate::domain::audit::ModelRole::Semantic,
            70000,
            65536,
        );
        let denied = json!({"violations": [], "model_attempts": [
            {"role": "semantic", "outcome": "budget_denied", "detail": detail}]});
        let (judged, why) = judged_from_audit(&denied, unavailable);
        assert!(matches!(judged, RowJudged::OverBudget(_)));
        assert!(why.unwrap().contains("65536-byte input limit"));
        let too_large = json!({"violations": [{"rule": "record_too_large"}]});
        assert!(matches!(
            judged_from_audit(&too_large, Some(FallbackType::EvidenceValidationFailed)).0,
            RowJudged::OverBudget(_)
        ));
        let other = json!({"violations": [{"rule": "draft_names_identifier"}]});
        assert!(matches!(
            judged_from_audit(&other, Some(FallbackType::EvidenceValidationFailed)).0,
            RowJudged::NotJudged(_)
        ));
    }
}
