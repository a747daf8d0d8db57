//! What may be shown of the evidence: the verified snapshot and the ProgressSnapshot.
//!
//! Entry points: [`VerifiedSnapshot::build`] (only the cited evidence of a Draft that
//! passed EvidenceGuard, grouped by analysis id, bounded, with no tool call id, Redis key,
//! raw response or uncited call), [`ProgressSnapshot::build`] (the run's usable calls as
//! observed facts with summaries written by the harness) and the `verified_sources` lists
//! of CONTRACT §3. Every string they copy from a record goes through a [`Redactor`]:
//! masked and bounded (`evidence.*`), so the shown scope is not the record's scope verbatim.

use foldhash::HashMap;

use serde::Serialize;
use serde_json::Value;

use super::bounded::{json_len, str_json_len_bound, Redactor};
use super::draft::{AnalysisKind, Draft};
use super::evidence_guard::ResolvedRun;
use super::invocation::{EvidenceStatus, Projection, ToolName, UsableCall};
use super::scope::Scope;

/// Bounds of the verified snapshot (config section `snapshot`). Excerpts have their own
/// limits, sized against the judge's input budget (`semantic_guard.max_input_bytes`), not
/// the record-string cap `evidence.max_string_bytes`: the judge must see enough of the
/// evidence to judge, and evidence past its input budget fails the release closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// Longest excerpt, log message or string cell, in characters.
    pub max_excerpt_chars: usize,
    /// Longest excerpt, log message or string cell, in bytes of its JSON-escaped form.
    pub max_excerpt_bytes: usize,
    /// RAG hits and log entries kept per call.
    pub max_entries_per_call: usize,
    /// MySQL rows kept per call.
    pub max_rows_per_call: usize,
}

impl Default for SnapshotLimits {
    fn default() -> Self {
        SnapshotLimits {
            max_excerpt_chars: 4096,
            max_excerpt_bytes: 4096,
            max_entries_per_call: 10,
            max_rows_per_call: 20,
        }
    }
}

impl SnapshotLimits {
    /// `text` split into consecutive pieces that the snapshot keeps whole: each within
    /// `max_excerpt_chars` characters and `max_excerpt_bytes` JSON-escaped bytes, cut after
    /// the last line break (else the last whitespace) in the second half of a full piece,
    /// else at a character boundary. The pieces joined give `text` back. How a long document
    /// becomes a RAG call's hits without a cut (`eval --format aggrefact`); whether the
    /// snapshot keeps them all is `max_entries_per_call`'s to say.
    pub fn split_excerpts<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let max_chars = self.max_excerpt_chars.max(1);
        let max_bytes = self.max_excerpt_bytes.max(6);
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // The longest prefix within both limits.
            let (mut chars, mut bytes, mut end) = (0usize, 0usize, rest.len());
            for (at, c) in rest.char_indices() {
                let width = super::bounded::escaped_len(c);
                if chars == max_chars || bytes + width > max_bytes {
                    end = at;
                    break;
                }
                chars += 1;
                bytes += width;
            }
            if end < rest.len() {
                let window = &rest[..end];
                let half = end / 2;
                let after = |at: Option<usize>| at.filter(|&at| at >= half).map(|at| at + 1);
                end = after(window.rfind('\n'))
                    .or_else(|| after(window.rfind([' ', '\t'])))
                    .unwrap_or(end);
            }
            let (piece, tail) = rest.split_at(end);
            pieces.push(piece);
            rest = tail;
        }
        pieces
    }
}

/// One `verified_sources` entry of a release result.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifiedSource {
    pub tool: ToolName,
    pub source: String,
    pub scope: Scope,
}

/// The evidence SemanticGuard reads, grouped by analysis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifiedSnapshot {
    pub analyses: Vec<AnalysisEvidence>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnalysisEvidence {
    pub analysis_id: String,
    pub kind: AnalysisKind,
    pub evidence: Vec<EvidenceItem>,
}

/// One cited call, reduced to what supports or refutes the claim.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvidenceItem {
    pub tool: ToolName,
    pub evidence_status: EvidenceStatus,
    pub scope: Scope,
    /// When the tool call finished (the record's `finished_at`), if recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<String>,
    #[serde(flatten)]
    pub data: EvidenceData,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum EvidenceData {
    Rag {
        hits: Vec<SnapshotHit>,
        #[serde(skip_serializing_if = "is_zero")]
        hits_omitted: usize,
    },
    Log {
        source: String,
        total_matches: u64,
        entries: Vec<SnapshotLogEntry>,
        #[serde(skip_serializing_if = "is_zero")]
        entries_omitted: usize,
    },
    Mysql {
        source: String,
        columns: Vec<String>,
        rows: Vec<Vec<Value>>,
        row_count: u64,
        #[serde(skip_serializing_if = "is_zero")]
        rows_omitted: usize,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotHit {
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub excerpt: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub excerpt_truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotLogEntry {
    pub timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    pub message: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub message_truncated: bool,
}

impl EvidenceItem {
    fn from_call(call: &UsableCall, limits: &SnapshotLimits, redact: &Redactor) -> EvidenceItem {
        let text = |s: &str| redact.text(s);
        let optional = |s: &Option<String>| s.as_deref().map(text);
        let data = match &call.projection {
            Projection::Rag(p) => EvidenceData::Rag {
                hits: p
                    .hits
                    .iter()
                    .take(limits.max_entries_per_call)
                    .map(|h| {
                        let (excerpt, excerpt_truncated) = redact.excerpt(
                            &h.excerpt,
                            limits.max_excerpt_chars,
                            limits.max_excerpt_bytes,
                        );
                        SnapshotHit {
                            source: text(&h.doc_id),
                            title: optional(&h.title),
                            excerpt,
                            excerpt_truncated,
                            updated_at: optional(&h.updated_at),
                            score: h.score,
                        }
                    })
                    .collect(),
                hits_omitted: p.hits.len().saturating_sub(limits.max_entries_per_call),
            },
            Projection::Log(p) => EvidenceData::Log {
                source: text(&p.scope.service),
                total_matches: p.total_matches,
                entries: p
                    .entries
                    .iter()
                    .take(limits.max_entries_per_call)
                    .map(|e| {
                        let (message, message_truncated) = redact.excerpt(
                            &e.message,
                            limits.max_excerpt_chars,
                            limits.max_excerpt_bytes,
                        );
                        SnapshotLogEntry {
                            timestamp: text(&e.timestamp),
                            host: optional(&e.host),
                            level: optional(&e.level),
                            message,
                            message_truncated,
                        }
                    })
                    .collect(),
                entries_omitted: p.entries.len().saturating_sub(limits.max_entries_per_call),
            },
            Projection::Mysql(p) => EvidenceData::Mysql {
                source: text(&p.scope.datasource),
                columns: p.columns.iter().map(|c| text(c)).collect(),
                rows: p
                    .rows
                    .iter()
                    .take(limits.max_rows_per_call)
                    .map(|row| {
                        row.iter()
                            .map(|c| {
                                redact.cell(c, limits.max_excerpt_chars, limits.max_excerpt_bytes)
                            })
                            .collect()
                    })
                    .collect(),
                row_count: p.row_count,
                rows_omitted: p.rows.len().saturating_sub(limits.max_rows_per_call),
            },
        };
        EvidenceItem {
            tool: call.tool,
            evidence_status: call.evidence_status,
            scope: redact.shared_scope(call.scope()),
            observed_at: optional(&call.finished_at),
            data,
        }
    }

    /// The item's sources as shown in the snapshot (bounded hits only).
    fn sources(&self) -> Vec<&str> {
        match &self.data {
            EvidenceData::Rag { hits, .. } => hits.iter().map(|h| h.source.as_str()).collect(),
            EvidenceData::Log { source, .. } | EvidenceData::Mysql { source, .. } => {
                vec![source.as_str()]
            }
        }
    }
}

impl VerifiedSnapshot {
    /// Builds the snapshot of a Draft that passed EvidenceGuard. Calls that are not usable
    /// (impossible after a pass, but never trusted) are left out.
    pub fn build(
        draft: &Draft,
        run: &ResolvedRun,
        limits: &SnapshotLimits,
        redact: &Redactor,
    ) -> VerifiedSnapshot {
        VerifiedSnapshot {
            analyses: draft
                .analyses
                .iter()
                .map(|analysis| AnalysisEvidence {
                    analysis_id: analysis.id.clone(),
                    kind: analysis.kind.clone(),
                    evidence: analysis
                        .tool_call_ids
                        .iter()
                        .filter_map(|id| run.usable.get(id))
                        .map(|call| EvidenceItem::from_call(call, limits, redact))
                        .collect(),
                })
                .collect(),
        }
    }

    /// `verified_sources` in citation order, one per distinct (tool, source, scope).
    pub fn verified_sources(&self) -> Vec<VerifiedSource> {
        self.source_refs(usize::MAX)
            .map(SourceRef::to_owned_all)
            .unwrap_or_default()
    }

    /// [`VerifiedSnapshot::verified_sources`] if their JSON takes at most `max_bytes`;
    /// else how many bytes it took to find out it does not.
    pub fn verified_sources_within(&self, max_bytes: usize) -> Result<Vec<VerifiedSource>, usize> {
        self.source_refs(max_bytes).map(SourceRef::to_owned_all)
    }

    /// Whether [`VerifiedSnapshot::verified_sources`] takes at most `max_bytes` of JSON;
    /// else how many bytes it took to find out it does not. Nothing is copied.
    pub fn verified_sources_fit(&self, max_bytes: usize) -> Result<(), usize> {
        // Nearly always far within the limit: bounded from lengths, nothing is written.
        let bound = sources_len_bound(self.source_candidates());
        if bound <= max_bytes {
            return Ok(());
        }
        self.source_refs(max_bytes).map(|_| ())
    }

    /// Every (tool, source, scope) the sources are taken from, in citation order.
    fn source_candidates(&self) -> impl Iterator<Item = (ToolName, &str, &Scope)> {
        self.analyses
            .iter()
            .flat_map(|a| a.evidence.iter())
            .flat_map(|item| {
                item.sources()
                    .into_iter()
                    .map(move |s| (item.tool, s, &item.scope))
            })
    }

    fn source_refs(&self, max_bytes: usize) -> Result<Vec<SourceRef<'_>>, usize> {
        distinct_source_refs(self.source_candidates(), max_bytes)
    }
}

/// Keys, quotes, colons, commas and braces around the fields of a [`VerifiedSource`] or
/// an [`ObservedFact`] (fewer than this many bytes).
const ENTRY_FRAME_BOUND: usize = 64;

/// At least the JSON size of the verified sources taken from `candidates` (each counted,
/// distinct or not), from lengths alone.
fn sources_len_bound<'a>(
    candidates: impl Iterator<Item = (ToolName, &'a str, &'a Scope)>,
) -> usize {
    candidates.fold(2usize, |size, (tool, source, scope)| {
        size.saturating_add(ENTRY_FRAME_BOUND + tool.as_str().len())
            .saturating_add(str_json_len_bound(source))
            .saturating_add(scope.json_len_bound())
            .saturating_add(1)
    })
}

/// The (tool, source, scope) of the sources of `shown` facts, in order.
fn fact_sources(
    shown: &[(ObservedFact, Vec<String>)],
) -> impl Iterator<Item = (ToolName, &str, &Scope)> {
    shown.iter().flat_map(|(fact, sources)| {
        sources
            .iter()
            .map(move |s| (fact.tool, s.as_str(), &fact.scope))
    })
}

impl ObservedFact {
    /// At least the fact's JSON size, from lengths alone.
    fn json_len_bound(&self) -> usize {
        (ENTRY_FRAME_BOUND + self.tool.as_str().len() + self.evidence_status.as_str().len())
            .saturating_add(self.scope.json_len_bound())
            .saturating_add(str_json_len_bound(&self.summary))
    }
}

/// A [`VerifiedSource`] borrowed from what it is taken from: the same JSON, no copy.
#[derive(Serialize)]
struct SourceRef<'a> {
    tool: ToolName,
    source: &'a str,
    scope: &'a Scope,
}

impl SourceRef<'_> {
    fn to_owned(&self) -> VerifiedSource {
        VerifiedSource {
            tool: self.tool,
            source: self.source.to_string(),
            scope: self.scope.clone(),
        }
    }

    fn to_owned_all(sources: Vec<SourceRef<'_>>) -> Vec<VerifiedSource> {
        sources.iter().map(SourceRef::to_owned).collect()
    }
}

/// The distinct (tool, source, scope) candidates in order, while their JSON array takes at
/// most `max_bytes`; past that, `Err` with the size reached (and no more work done).
#[cfg(test)]
fn distinct_sources<'a>(
    candidates: impl Iterator<Item = (ToolName, &'a str, &'a Scope)>,
    max_bytes: usize,
) -> Result<Vec<VerifiedSource>, usize> {
    distinct_source_refs(candidates, max_bytes).map(SourceRef::to_owned_all)
}

/// The distinct (tool, source, scope) candidates in order, borrowed, while their JSON
/// array takes at most `max_bytes` (not measured when that is `usize::MAX`); past that,
/// `Err` with the size reached (and no more work done).
fn distinct_source_refs<'a>(
    candidates: impl Iterator<Item = (ToolName, &'a str, &'a Scope)>,
    max_bytes: usize,
) -> Result<Vec<SourceRef<'a>>, usize> {
    // Scopes are compared as JSON objects (they have no Hash): per (tool, source), the
    // scopes already taken.
    let mut seen: HashMap<(ToolName, &str), Vec<&Scope>> = HashMap::default();
    let mut out = Vec::new();
    let mut size = 2usize; // []
    for (tool, source, scope) in candidates {
        let scopes = seen.entry((tool, source)).or_default();
        // A call's hits share one scope: the comparison starts with a pointer test.
        if !scopes.contains(&scope) {
            scopes.push(scope);
            let entry = SourceRef {
                tool,
                source,
                scope,
            };
            if max_bytes != usize::MAX {
                size = size.saturating_add(json_len(&entry) + usize::from(!out.is_empty()));
                if size > max_bytes {
                    return Err(size);
                }
            }
            out.push(entry);
        }
    }
    Ok(out)
}

/// One observed fact of an INSUFFICIENT_EVIDENCE result.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservedFact {
    pub tool: ToolName,
    pub evidence_status: EvidenceStatus,
    pub scope: Scope,
    pub summary: String,
}

/// The run's completed, verified checks: the most recent `max_facts` usable calls, fewer if
/// their facts or sources would take more than `evidence.max_written_bytes` of JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressSnapshot {
    pub facts: Vec<ObservedFact>,
    pub verified_sources: Vec<VerifiedSource>,
    /// The oldest facts left out so that facts and sources fit (for the audit).
    pub facts_dropped: usize,
}

impl ProgressSnapshot {
    pub fn build(run: &ResolvedRun, max_facts: usize, redact: &Redactor) -> ProgressSnapshot {
        let usable = run.usable_in_call_order();
        let recent = &usable[usable.len().saturating_sub(max_facts)..];
        // Each call bounded once: its fact, and its sources with the same bounded scope.
        let mut shown: Vec<(ObservedFact, Vec<String>)> = recent
            .iter()
            .map(|call| {
                let fact = ObservedFact {
                    tool: call.tool,
                    evidence_status: call.evidence_status,
                    scope: redact.shared_scope(call.scope()),
                    summary: summarize(call, redact),
                };
                let sources = call
                    .projection
                    .sources()
                    .into_iter()
                    .map(|s| redact.text(s))
                    .collect();
                (fact, sources)
            })
            .collect();
        let max_bytes = redact.limits.max_written_bytes;
        // Nearly always everything is far within the limit: bounded from lengths, nothing
        // is measured and nothing dropped.
        let facts_bound = shown.iter().fold(2usize, |size, (fact, _)| {
            size.saturating_add(fact.json_len_bound()).saturating_add(1)
        });
        if facts_bound <= max_bytes && sources_len_bound(fact_sources(&shown)) <= max_bytes {
            let sources = distinct_source_refs(fact_sources(&shown), usize::MAX);
            let verified_sources = sources.map(SourceRef::to_owned_all).unwrap_or_default();
            return ProgressSnapshot {
                facts: shown.into_iter().map(|(fact, _)| fact).collect(),
                verified_sources,
                facts_dropped: 0,
            };
        }
        let fact_sizes: Vec<usize> = shown.iter().map(|(fact, _)| json_len(fact)).collect();
        // The oldest facts go first until facts and sources both fit.
        for start in 0..=shown.len() {
            let kept = &shown[start..];
            let facts_size =
                2 + fact_sizes[start..].iter().sum::<usize>() + kept.len().saturating_sub(1);
            if facts_size > max_bytes {
                continue;
            }
            let sources = distinct_source_refs(fact_sources(kept), max_bytes);
            if let Ok(sources) = sources {
                let verified_sources = SourceRef::to_owned_all(sources);
                return ProgressSnapshot {
                    facts: shown.drain(start..).map(|(fact, _)| fact).collect(),
                    verified_sources,
                    facts_dropped: start,
                };
            }
        }
        ProgressSnapshot {
            facts: Vec::new(),
            verified_sources: Vec::new(),
            facts_dropped: shown.len(),
        }
    }
}

/// A one-line account of a completed check, written from the record alone, e.g.
/// `log_search in order-api, level:ERROR AND timeout, 10:00–11:00: 132 matches`. Every part
/// taken from the record is masked and bounded on its own.
pub fn summarize(call: &UsableCall, redact: &Redactor) -> String {
    // Written piece by piece into one String: no String per part.
    let mut out = String::with_capacity(128);
    let text = |out: &mut String, s: &str| redact.push_text(out, s);
    match &call.projection {
        Projection::Log(p) => {
            out.push_str("log_search in ");
            text(&mut out, &p.scope.service);
            out.push_str(", ");
            text(&mut out, &p.scope.query);
            out.push_str(", ");
            push_window(&mut out, &p.scope.from, &p.scope.to, redact);
            out.push_str(": ");
            push_count(&mut out, p.total_matches, "match", "matches");
        }
        Projection::Rag(p) => {
            out.push_str("rag_search");
            if let Some(index) = &p.scope.index {
                out.push_str(" in ");
                text(&mut out, index);
            }
            out.push_str(", ");
            text(&mut out, &p.scope.query);
            out.push_str(": ");
            push_count(&mut out, p.hits.len() as u64, "hit", "hits");
            for (i, hit) in p.hits.iter().take(5).enumerate() {
                out.push_str(if i == 0 { " (" } else { ", " });
                text(&mut out, &hit.doc_id);
            }
            if !p.hits.is_empty() {
                out.push(')');
            }
        }
        Projection::Mysql(p) => {
            out.push_str("mysql_query on ");
            text(&mut out, &p.scope.datasource);
            out.push_str(", ");
            text(&mut out, &p.scope.statement);
            if let (Some(from), Some(to)) = (&p.scope.from, &p.scope.to) {
                out.push_str(", ");
                push_window(&mut out, from, to, redact);
            }
            out.push_str(": ");
            push_count(&mut out, p.row_count, "row", "rows");
        }
    }
    out
}

/// `132 matches`, `1 match`.
fn push_count(out: &mut String, n: u64, one: &str, many: &str) {
    out.push_str(itoa::Buffer::new().format(n));
    out.push(' ');
    out.push_str(if n == 1 { one } else { many });
}

/// `10:00–11:00` within one UTC day, full dates otherwise, the (bounded) text if unparseable.
fn push_window(out: &mut String, from: &str, to: &str, redact: &Redactor) {
    use chrono::{DateTime, Datelike, Timelike, Utc};
    let parse = |s: &str| DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc));
    // Digits written by hand, two at a time: chrono's `format` parses its pattern on every
    // call. RFC 3339 years have four digits, so two pairs write what `%Y` would.
    let clock = |out: &mut String, t: &DateTime<Utc>| {
        push_two_digits(out, t.hour());
        out.push(':');
        push_two_digits(out, t.minute());
        if t.second() != 0 {
            out.push(':');
            push_two_digits(out, t.second());
        }
    };
    let date = |out: &mut String, t: &DateTime<Utc>| {
        let year = t.year().unsigned_abs();
        push_two_digits(out, year / 100);
        push_two_digits(out, year);
        out.push('-');
        push_two_digits(out, t.month());
        out.push('-');
        push_two_digits(out, t.day());
        out.push(' ');
    };
    match (parse(from), parse(to)) {
        (Ok(a), Ok(b)) => {
            let same_day = a.date_naive() == b.date_naive();
            if !same_day {
                date(out, &a);
            }
            clock(out, &a);
            out.push('–');
            if !same_day {
                date(out, &b);
            }
            clock(out, &b);
        }
        _ => {
            redact.push_text(out, from);
            out.push('–');
            redact.push_text(out, to);
        }
    }
}

/// The last two decimal digits of `n` (`%02d` of a number below 100).
fn push_two_digits(out: &mut String, n: u32) {
    let digit = |d: u32| char::from_digit(d % 10, 10).unwrap_or('0');
    out.push(digit(n / 10));
    out.push(digit(n));
}

/// [`push_window`] into a String of its own.
#[cfg(test)]
fn window(from: &str, to: &str, redact: &Redactor) -> String {
    let mut out = String::new();
    push_window(&mut out, from, to, redact);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::bounded::tests::scope_strategy;
    use crate::domain::bounded::CopyLimits;
    use crate::domain::evidence_guard::tests::{good_draft, run_evidence};
    use crate::domain::identifiers::RunIdentifiers;
    use crate::domain::invocation::tests::record;
    use proptest::prelude::*;
    use serde_json::json;

    /// The snapshot of `draft` on `run` with the default limits and the run's identifiers.
    fn build(draft: &Draft, run: &ResolvedRun, limits: &SnapshotLimits) -> VerifiedSnapshot {
        let ids = RunIdentifiers::of_run(run, "aiops");
        VerifiedSnapshot::build(
            draft,
            run,
            limits,
            &Redactor::new(&ids, CopyLimits::default()),
        )
    }

    fn progress(run: &ResolvedRun, max_facts: usize, limits: CopyLimits) -> ProgressSnapshot {
        let ids = RunIdentifiers::of_run(run, "aiops");
        ProgressSnapshot::build(run, max_facts, &Redactor::new(&ids, limits))
    }

    fn snapshot() -> VerifiedSnapshot {
        let draft = good_draft();
        let run = run_evidence().resolve(&draft.cited_call_ids());
        build(&draft, &run, &SnapshotLimits::default())
    }

    #[test]
    fn snapshot_groups_cited_evidence_by_analysis() {
        let snap = snapshot();
        assert_eq!(snap.analyses.len(), 2);
        assert_eq!(snap.analyses[0].analysis_id, "A1");
        assert_eq!(snap.analyses[0].evidence.len(), 2);
        assert_eq!(snap.analyses[0].evidence[0].tool, ToolName::LogSearch);
        assert_eq!(snap.analyses[0].evidence[1].tool, ToolName::RagSearch);
        assert_eq!(snap.analyses[1].evidence[0].tool, ToolName::MysqlQuery);
    }

    #[test]
    fn snapshot_has_source_scope_timestamp_and_exact_excerpt() {
        let text = serde_json::to_value(snapshot()).unwrap();
        let log = &text["analyses"][0]["evidence"][0];
        assert_eq!(log["source"], "order-api");
        assert_eq!(log["scope"]["query"], "level:ERROR AND timeout");
        assert_eq!(log["observed_at"], "2026-12-01T10:05:01Z");
        assert_eq!(log["total_matches"], 132);
        assert_eq!(
            log["entries"][0]["message"],
            "upstream timeout after 3000ms calling orders-db"
        );
        let rag = &text["analyses"][0]["evidence"][1];
        assert_eq!(rag["hits"][0]["source"], "kb-123");
        assert_eq!(rag["hits"][0]["excerpt"], "Pool exhaustion causes 504s.");
        let sql = &text["analyses"][1]["evidence"][0];
        assert_eq!(sql["source"], "orders-db");
        assert_eq!(sql["row_count"], 0);
        assert_eq!(sql["scope"]["params"]["min_ms"], 500);
    }

    #[test]
    fn snapshot_has_no_ids_keys_raw_responses_or_uncited_calls() {
        let mut evidence = run_evidence();
        evidence.calls.push("c-uncited".into());
        evidence.records.insert(
            "c-uncited".into(),
            record("r", "c-uncited", "log_search", "NO_EVIDENCE", json!({})),
        );
        let draft = good_draft();
        let run = evidence.resolve(&draft.cited_call_ids());
        let text = serde_json::to_string(&build(&draft, &run, &SnapshotLimits::default())).unwrap();
        for canary in [
            "c-log",
            "c-sql",
            "c-rag",
            "c-uncited",
            "RAW-",
            "run:{",
            "tool_call_id",
        ] {
            assert!(!text.contains(canary), "{canary} leaked into {text}");
        }
    }

    #[test]
    fn snapshot_is_bounded() {
        let entries: Vec<_> = (0..30)
            .map(|i| json!({"timestamp": "2026-12-01T10:00:00Z", "message": format!("{i}{}", "x".repeat(2000))}))
            .collect();
        let rec = record(
            "r",
            "c",
            "log_search",
            "EVIDENCE_FOUND",
            json!({"tool": "log_search", "tool_call_id": "c", "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"service": "s", "query": "q", "from": "a", "to": "b", "limit": 30},
                   "total_matches": 30, "entries": entries}),
        );
        let mut evidence = run_evidence();
        evidence.records.insert("c".into(), rec);
        let mut draft = good_draft();
        draft.analyses[0].tool_call_ids = vec!["c".into()];
        let run = evidence.resolve(&draft.cited_call_ids());
        let limits = SnapshotLimits {
            max_excerpt_chars: 100,
            max_excerpt_bytes: 4096,
            max_entries_per_call: 3,
            max_rows_per_call: 2,
        };
        let snap = serde_json::to_value(build(&draft, &run, &limits)).unwrap();
        let item = &snap["analyses"][0]["evidence"][0];
        assert_eq!(item["entries"].as_array().unwrap().len(), 3);
        assert_eq!(item["entries_omitted"], 27);
        assert_eq!(
            item["entries"][0]["message"],
            format!("0{}…[truncated]", "x".repeat(99))
        );
        assert_eq!(item["entries"][0]["message_truncated"], true);
    }

    #[test]
    fn excerpts_reach_the_judge_past_the_record_string_cap() {
        // 3000 bytes: far over evidence.max_string_bytes (256), within the excerpt limits.
        let long = "The replica lag grew to 41 s. ".repeat(100);
        let rec = record(
            "r",
            "c",
            "rag_search",
            "EVIDENCE_FOUND",
            json!({"tool": "rag_search", "tool_call_id": "c", "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"query": "q", "top_k": 1},
                   "hits": [{"doc_id": "kb-1", "excerpt": long}]}),
        );
        let mut evidence = run_evidence();
        evidence.records.insert("c".into(), rec);
        let mut draft = good_draft();
        draft.analyses[0].tool_call_ids = vec!["c".into()];
        let run = evidence.resolve(&draft.cited_call_ids());
        let snap = serde_json::to_value(build(&draft, &run, &SnapshotLimits::default())).unwrap();
        let hit = &snap["analyses"][0]["evidence"][0]["hits"][0];
        assert_eq!(hit["excerpt"], long.as_str());
        assert!(hit.get("excerpt_truncated").is_none());
        // Past the excerpt's own byte limit it is cut, with the marker.
        let tight = SnapshotLimits {
            max_excerpt_bytes: 1000,
            ..SnapshotLimits::default()
        };
        let snap = serde_json::to_value(build(&draft, &run, &tight)).unwrap();
        let hit = &snap["analyses"][0]["evidence"][0]["hits"][0];
        assert_eq!(hit["excerpt"], format!("{}…[truncated]", &long[..1000]));
        assert_eq!(hit["excerpt_truncated"], true);
    }

    #[test]
    fn a_document_splits_into_whole_excerpts_at_line_breaks_then_spaces() {
        let limits = SnapshotLimits {
            max_excerpt_chars: 20,
            max_excerpt_bytes: 20,
            ..SnapshotLimits::default()
        };
        assert_eq!(
            limits.split_excerpts("first line\nsecond line here and more"),
            vec!["first line\n", "second line here ", "and more"]
        );
        // No break in the second half: cut at the limit.
        assert_eq!(
            limits.split_excerpts(&"x".repeat(45)),
            vec!["x".repeat(20), "x".repeat(20), "x".repeat(5)]
        );
        // Escapes count: a quote takes two bytes, so ten fit.
        assert_eq!(limits.split_excerpts(&"\"".repeat(12))[0], "\"".repeat(10));
        assert!(limits.split_excerpts("").is_empty());
        assert_eq!(
            SnapshotLimits::default().split_excerpts("short"),
            vec!["short"]
        );
    }

    proptest! {
        #[test]
        fn split_excerpts_give_the_text_back_in_pieces_the_snapshot_keeps_whole(
            text in "[a-z \\n\"é\\u{1}]{0,300}",
            max_chars in 1usize..40,
            max_bytes in 6usize..60,
        ) {
            let limits = SnapshotLimits { max_excerpt_chars: max_chars, max_excerpt_bytes: max_bytes, ..SnapshotLimits::default() };
            let pieces = limits.split_excerpts(&text);
            prop_assert_eq!(pieces.concat(), text.clone());
            let ids = RunIdentifiers::new(["c-1"], "aiops");
            let redact = Redactor::new(&ids, CopyLimits::default());
            for piece in pieces {
                prop_assert!(!piece.is_empty());
                let (copied, cut) = redact.excerpt(piece, max_chars, max_bytes);
                prop_assert!(!cut, "{:?} was cut", piece);
                prop_assert_eq!(copied, piece);
            }
        }
    }

    #[test]
    fn verified_sources_follow_citation_order_and_are_distinct() {
        let mut draft = good_draft();
        draft.analyses[1].tool_call_ids = vec!["c-sql".into()];
        draft.analyses[0].tool_call_ids = vec!["c-rag".into(), "c-log".into(), "c-rag".into()];
        let run = run_evidence().resolve(&draft.cited_call_ids());
        let sources = build(&draft, &run, &SnapshotLimits::default()).verified_sources();
        let got: Vec<_> = sources
            .iter()
            .map(|s| (s.tool.as_str(), s.source.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("rag_search", "kb-123"),
                ("log_search", "order-api"),
                ("mysql_query", "orders-db")
            ]
        );
        let keys: Vec<_> = serde_json::to_value(&sources[0])
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(keys, ["tool", "source", "scope"]);
    }

    #[test]
    fn a_source_is_distinct_by_tool_source_and_scope_value() {
        let a = Scope::of(serde_json::json!({"service": "order-api", "limit": 50}));
        let same_reordered = Scope::of(serde_json::json!({"limit": 50, "service": "order-api"}));
        let other = Scope::of(serde_json::json!({"service": "order-api", "limit": 10}));
        let sources = distinct_sources(
            [
                (ToolName::LogSearch, "order-api", &a),
                (ToolName::LogSearch, "order-api", &same_reordered),
                (ToolName::LogSearch, "order-api", &other),
                (ToolName::RagSearch, "order-api", &a),
                (ToolName::LogSearch, "order-api", &a),
            ]
            .into_iter(),
            usize::MAX,
        )
        .unwrap();
        let got: Vec<_> = sources
            .iter()
            .map(|s| (s.tool, s.source.as_str(), s.scope["limit"].as_u64()))
            .collect();
        assert_eq!(
            got,
            vec![
                (ToolName::LogSearch, "order-api", Some(50)),
                (ToolName::LogSearch, "order-api", Some(10)),
                (ToolName::RagSearch, "order-api", Some(50)),
            ]
        );
    }

    #[test]
    fn progress_snapshot_keeps_the_most_recent_usable_calls_with_summaries() {
        let run = run_evidence().resolve(&[]);
        let recent = progress(&run, 2, CopyLimits::default());
        let summaries: Vec<_> = recent.facts.iter().map(|f| f.summary.as_str()).collect();
        assert_eq!(
            summaries,
            vec![
                "mysql_query on orders-db, slow_queries_by_table, 10:00–11:00: 0 rows",
                "rag_search in runbooks, order-api timeout runbook: 1 hit (kb-123)",
            ]
        );
        let all = progress(&run, 20, CopyLimits::default());
        assert_eq!(
            all.facts[0].summary,
            "log_search in order-api, level:ERROR AND timeout, 10:00–11:00: 132 matches"
        );
        let sources: Vec<_> = all
            .verified_sources
            .iter()
            .map(|s| s.source.as_str())
            .collect();
        assert_eq!(sources, vec!["order-api", "orders-db", "kb-123"]);
    }

    #[test]
    fn rag_summaries_list_up_to_five_sources() {
        use crate::domain::invocation::resolve_call;
        let ids = RunIdentifiers::new(["c-1"], "aiops");
        let redact = Redactor::new(&ids, CopyLimits::default());
        let summary = |status: &str, scope: Value, docs: &[&str]| {
            let hits: Vec<Value> = docs
                .iter()
                .map(|d| json!({"doc_id": d, "excerpt": "e"}))
                .collect();
            let projection = json!({"tool": "rag_search", "tool_call_id": "c-1",
                "evidence_status": status, "scope": scope, "hits": hits});
            let record = record("r", "c-1", "rag_search", status, projection);
            summarize(&resolve_call("r", "c-1", Some(&record)).unwrap(), &redact)
        };
        let scope = json!({"query": "q", "top_k": 9});
        assert_eq!(
            summary(
                "EVIDENCE_FOUND",
                scope.clone(),
                &["a", "b", "c", "d", "e", "f"]
            ),
            "rag_search, q: 6 hits (a, b, c, d, e)"
        );
        assert_eq!(summary("NO_EVIDENCE", scope, &[]), "rag_search, q: 0 hits");
    }

    #[test]
    fn what_the_snapshot_copies_is_masked_and_bounded() {
        let long = "h".repeat(1000);
        let log = record(
            "r",
            "c-new",
            "log_search",
            "EVIDENCE_FOUND",
            json!({"tool": "log_search", "tool_call_id": "c-new", "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"service": "svc c-sql", "query": "aiops:run:{r}:call:c-log", "from": "a",
                             "to": "b", "limit": 1},
                   "total_matches": 1,
                   "entries": [{"timestamp": "c-rag", "host": long, "message": "see c-log"}]}),
        );
        let sql = record(
            "r",
            "c-sql2",
            "mysql_query",
            "EVIDENCE_FOUND",
            json!({"tool": "mysql_query", "tool_call_id": "c-sql2", "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"datasource": "db", "statement": "s", "max_rows": 1},
                   "columns": ["c-log", "x"], "rows": [["aiops:release:{r}", {"k": "c-new"}]],
                   "row_count": 1}),
        );
        let mut evidence = run_evidence();
        evidence.records.insert("c-new".into(), log);
        evidence.records.insert("c-sql2".into(), sql);
        let mut draft = good_draft();
        draft.analyses[0].tool_call_ids = vec!["c-new".into(), "c-sql2".into()];
        let run = evidence.resolve(&draft.cited_call_ids());
        let snap = serde_json::to_value(build(&draft, &run, &SnapshotLimits::default())).unwrap();
        let item = &snap["analyses"][0]["evidence"][0];
        assert_eq!(item["source"], "svc [call id]");
        assert_eq!(item["scope"]["query"], "[redis key]");
        assert_eq!(item["entries"][0]["timestamp"], "[call id]");
        assert_eq!(
            item["entries"][0]["host"],
            format!("{}…[truncated]", "h".repeat(256))
        );
        assert_eq!(item["entries"][0]["message"], "see [call id]");
        let sql = &snap["analyses"][0]["evidence"][1];
        assert_eq!(sql["columns"], json!(["[call id]", "x"]));
        assert_eq!(
            sql["rows"],
            json!([["[redis key]", "{\"k\":\"[call id]\"}"]])
        );
        let text = snap.to_string();
        for id in ["c-log", "c-sql", "c-rag", "c-new", "aiops:"] {
            assert!(!text.contains(id), "{id} in {text}");
        }
    }

    #[test]
    fn sources_past_the_written_limit_are_refused() {
        let snap = snapshot();
        let all = snap.verified_sources();
        assert_eq!(
            snap.verified_sources_within(json_len(&all)),
            Ok(all.clone())
        );
        assert!(snap.verified_sources_within(json_len(&all) - 1).is_err());
    }

    #[test]
    fn progress_drops_the_oldest_facts_until_facts_and_sources_fit() {
        let run = run_evidence().resolve(&[]);
        let all = progress(&run, 20, CopyLimits::default());
        assert_eq!(all.facts_dropped, 0);
        let sizes: Vec<usize> = all.facts.iter().map(json_len).collect();
        let room_for_two = CopyLimits {
            max_written_bytes: 2 + sizes[1] + 1 + sizes[2],
            ..CopyLimits::default()
        };
        let limited = progress(&run, 20, room_for_two);
        assert_eq!(limited.facts, all.facts[1..]);
        assert_eq!(limited.facts_dropped, 1);
        let sources: Vec<_> = limited
            .verified_sources
            .iter()
            .map(|s| s.source.as_str())
            .collect();
        assert_eq!(
            sources,
            ["orders-db", "kb-123"],
            "the sources of the facts kept"
        );
        let no_room = CopyLimits {
            max_written_bytes: 10,
            ..CopyLimits::default()
        };
        let none = progress(&run, 20, no_room);
        assert!(none.facts.is_empty() && none.verified_sources.is_empty());
        assert_eq!(none.facts_dropped, 3);
    }

    #[test]
    fn summaries_are_written_from_masked_and_bounded_parts() {
        let rec = record(
            "r",
            "c-new",
            "log_search",
            "NO_EVIDENCE",
            json!({"tool": "log_search", "tool_call_id": "c-new", "evidence_status": "NO_EVIDENCE",
                   "scope": {"service": "svc", "query": format!("c-log {}", "q".repeat(300)),
                             "from": "aiops:run:{r}:calls", "to": "now", "limit": 1},
                   "total_matches": 0, "entries": []}),
        );
        let mut evidence = run_evidence();
        evidence.records.insert("c-new".into(), rec);
        evidence.calls.push("c-new".into());
        let facts = progress(&evidence.resolve(&[]), 20, CopyLimits::default()).facts;
        assert_eq!(
            facts[3].summary,
            format!(
                "log_search in svc, [call id] {}…[truncated], [redis key]–now: 0 matches",
                "q".repeat(246)
            )
        );
    }

    #[test]
    fn windows_across_days_show_dates() {
        let ids = RunIdentifiers::new(["c-1"], "aiops");
        let redact = Redactor::new(&ids, CopyLimits::default());
        assert_eq!(
            window("2026-12-01T23:00:00Z", "2026-12-02T01:30:15Z", &redact),
            "2026-12-01 23:00–2026-12-02 01:30:15"
        );
        assert_eq!(window("yesterday", "now", &redact), "yesterday–now");
        assert_eq!(window("after c-1", "now", &redact), "after [call id]–now");
    }

    proptest! {
        /// Windows read as chrono's own formatting writes them, at any instant and offset
        /// RFC 3339 can write.
        #[test]
        fn windows_are_written_as_chrono_formats_them(
            a in 0i64..253_402_000_000,
            span in prop_oneof![0i64..86_400, 0i64..10_000_000_000],
            offsets in (-86_340i32..86_340, -86_340i32..86_340),
            whole_minutes in any::<bool>(),
        ) {
            use chrono::{DateTime, FixedOffset, Utc};
            let a = if whole_minutes { a - a % 60 } else { a };
            let b = (a + span).min(253_402_000_000);
            let at = |secs: i64, offset: i32| {
                let zone = FixedOffset::east_opt(offset - offset % 60).unwrap();
                DateTime::from_timestamp(secs, 0).unwrap().with_timezone(&zone)
            };
            let (from, to) = (at(a, offsets.0), at(b, offsets.1));
            let (ua, ub) = (from.with_timezone(&Utc), to.with_timezone(&Utc));
            let clock = |t: &DateTime<Utc>| {
                t.format(if t.format("%S").to_string() == "00" { "%H:%M" } else { "%H:%M:%S" })
                    .to_string()
            };
            let expected = if ua.date_naive() == ub.date_naive() {
                format!("{}–{}", clock(&ua), clock(&ub))
            } else {
                format!("{} {}–{} {}", ua.format("%Y-%m-%d"), clock(&ua), ub.format("%Y-%m-%d"), clock(&ub))
            };
            let ids = RunIdentifiers::new(["c-1"], "aiops");
            let redact = Redactor::new(&ids, CopyLimits::default());
            prop_assert_eq!(window(&from.to_rfc3339(), &to.to_rfc3339(), &redact), expected);
        }
        /// The bounds that spare measuring facts and sources are never below their size.
        #[test]
        fn fact_and_source_bounds_are_never_below_their_json_size(
            scope in scope_strategy(),
            summary in "[a-z\"\\\\\u{1}é ]{0,40}",
            source in "[a-z\"\u{1}é-]{0,20}",
            found in any::<bool>(),
        ) {
            let scope = match scope {
                Value::Object(_) => Scope::of(scope),
                other => Scope::of(serde_json::json!({"params": other, "query": "q"})),
            };
            let (tool, evidence_status) = if found {
                (ToolName::MysqlQuery, EvidenceStatus::EvidenceFound)
            } else {
                (ToolName::RagSearch, EvidenceStatus::NoEvidence)
            };
            let fact = ObservedFact { tool, evidence_status, scope: scope.clone(), summary };
            prop_assert!(fact.json_len_bound() >= json_len(&fact));
            let sources = vec![
                VerifiedSource { tool, source: source.clone(), scope: scope.clone() },
                VerifiedSource { tool, source: "x".into(), scope: scope.clone() },
            ];
            let bound = sources_len_bound(
                [(tool, source.as_str(), &scope), (tool, "x", &scope)].into_iter(),
            );
            prop_assert!(bound >= json_len(&sources));
        }
    }
}
