//! Canonical invocation records and their tool projections (CONTRACT §1).
//!
//! Entry point: [`resolve_call`], which turns the HASH fields stored under
//! `P:run:{RUN}:call:CALL` into a [`UsableCall`] or a [`CallRejection`] naming the first
//! rule the record breaks. A record is usable only when it belongs to the run, is READY,
//! and its `agent_result` parses strictly as the projection of its tool and agrees with
//! the record and with its own data.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::evidence_guard::Rule;
use super::scope::Scope;
pub use super::scope::Scoped;

/// The only fields of a record the harness reads (never `raw_response`).
pub const RECORD_FIELDS: [&str; 7] = [
    "run_id",
    "tool_call_id",
    "tool_name",
    "lifecycle",
    "evidence_status",
    "agent_result",
    "finished_at",
];

/// The HASH fields of one canonical invocation record that the guard reads, as stored
/// (decoded as UTF-8 by the store; a record that is not is unusable before it gets here).
///
/// One slot per name of [`RECORD_FIELDS`]: any other field (`raw_response`,
/// `started_at`, ...) cannot be held, so nothing downstream can show it. A store fills the
/// slots by position ([`RawRecord::set`]); tests and fixtures by name. The fields' text is
/// kept in one `String` (one allocation per record, not one per field); a field set again
/// leaves its earlier text behind, unread.
#[derive(Clone, Default)]
pub struct RawRecord {
    text: String,
    /// Where each field's text is in `text`, if it is set.
    fields: [Option<Range<usize>>; RECORD_FIELDS.len()],
}

impl RawRecord {
    pub fn new() -> Self {
        RawRecord::default()
    }

    /// A record whose fields will take about `bytes` bytes.
    pub fn with_capacity(bytes: usize) -> Self {
        RawRecord {
            text: String::with_capacity(bytes),
            ..RawRecord::default()
        }
    }

    /// The position of `name` in [`RECORD_FIELDS`], if the harness reads it.
    fn slot(name: &str) -> Option<usize> {
        RECORD_FIELDS.iter().position(|f| *f == name)
    }

    /// Sets the field at position `index` of [`RECORD_FIELDS`] (ignored past the end).
    pub fn set(&mut self, index: usize, value: &str) {
        if let Some(slot) = self.fields.get_mut(index) {
            let start = self.text.len();
            self.text.push_str(value);
            *slot = Some(start..self.text.len());
        }
    }

    /// The text of the field in `slot`, if it is set.
    fn field(&self, slot: &Option<Range<usize>>) -> Option<&str> {
        slot.clone().and_then(|range| self.text.get(range))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.field(&self.fields[Self::slot(name)?])
    }

    /// Sets `name` and answers its earlier value; a field the harness does not read is
    /// dropped.
    pub fn insert(&mut self, name: &str, value: impl Into<String>) -> Option<String> {
        let slot = Self::slot(name)?;
        let earlier = self.remove(name);
        self.set(slot, &value.into());
        earlier
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        let slot = Self::slot(name)?;
        let earlier = self.field(&self.fields[slot]).map(str::to_string);
        self.fields[slot] = None;
        earlier
    }

    /// No field is set (a missing record reads so).
    pub fn is_empty(&self) -> bool {
        self.fields.iter().all(Option::is_none)
    }

    /// The fields that are set, with their names, in [`RECORD_FIELDS`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        RECORD_FIELDS
            .iter()
            .zip(&self.fields)
            .filter_map(|(name, slot)| Some((*name, self.field(slot)?)))
    }

    /// Bytes of the fields that are set (what a record weighs against the read budgets).
    pub fn len_bytes(&self) -> u64 {
        self.iter().map(|(_, v)| v.len() as u64).sum()
    }
}

/// Records are equal when their fields are (not the text a field set again left behind).
impl PartialEq for RawRecord {
    fn eq(&self, other: &RawRecord) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for RawRecord {}

impl std::fmt::Debug for RawRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: AsRef<str>, V: Into<String>> FromIterator<(K, V)> for RawRecord {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut record = RawRecord::new();
        for (name, value) in iter {
            record.insert(name.as_ref(), value);
        }
        record
    }
}

/// Longest call id the harness looks up or reads from a calls list, in bytes; longer ones
/// cannot name a record (run ids are at most 128 characters; call ids get the same room
/// twice over).
pub const MAX_CALL_ID_BYTES: usize = 256;

/// The tools whose projections the harness understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolName {
    RagSearch,
    LogSearch,
    MysqlQuery,
}

impl ToolName {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolName::RagSearch => "rag_search",
            ToolName::LogSearch => "log_search",
            ToolName::MysqlQuery => "mysql_query",
        }
    }

    pub fn parse(raw: &str) -> Option<ToolName> {
        match raw {
            "rag_search" => Some(ToolName::RagSearch),
            "log_search" => Some(ToolName::LogSearch),
            "mysql_query" => Some(ToolName::MysqlQuery),
            _ => None,
        }
    }
}

/// A record's evidence status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EvidenceStatus {
    EvidenceFound,
    NoEvidence,
    Error,
}

impl EvidenceStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceStatus::EvidenceFound => "EVIDENCE_FOUND",
            EvidenceStatus::NoEvidence => "NO_EVIDENCE",
            EvidenceStatus::Error => "ERROR",
        }
    }

    pub fn parse(raw: &str) -> Option<EvidenceStatus> {
        match raw {
            "EVIDENCE_FOUND" => Some(EvidenceStatus::EvidenceFound),
            "NO_EVIDENCE" => Some(EvidenceStatus::NoEvidence),
            "ERROR" => Some(EvidenceStatus::Error),
            _ => None,
        }
    }
}

/// `rag_search` projection.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RagProjection {
    pub tool: String,
    pub tool_call_id: String,
    pub evidence_status: EvidenceStatus,
    pub scope: Scoped<RagScope>,
    pub hits: Vec<RagHit>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RagScope {
    pub query: String,
    #[serde(default)]
    pub index: Option<String>,
    pub top_k: u32,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RagHit {
    pub doc_id: String,
    #[serde(default)]
    pub title: Option<String>,
    pub excerpt: String,
    #[serde(default)]
    pub updated_at: Option<String>,
    #[serde(default)]
    pub score: Option<f64>,
}

/// `log_search` projection.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogProjection {
    pub tool: String,
    pub tool_call_id: String,
    pub evidence_status: EvidenceStatus,
    pub scope: Scoped<LogScope>,
    pub total_matches: u64,
    pub entries: Vec<LogEntry>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogScope {
    pub service: String,
    pub query: String,
    pub from: String,
    pub to: String,
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogEntry {
    pub timestamp: String,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub level: Option<String>,
    pub message: String,
}

/// `mysql_query` projection.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlProjection {
    pub tool: String,
    pub tool_call_id: String,
    pub evidence_status: EvidenceStatus,
    pub scope: Scoped<MysqlScope>,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
    pub row_count: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlScope {
    pub datasource: String,
    pub statement: String,
    /// Only checked to be an object: its entries are the raw scope's (nothing reads them
    /// typed, so no second map of them is built).
    #[serde(default)]
    pub params: Option<AnObject>,
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub to: Option<String>,
    pub max_rows: u32,
}

/// A JSON object whose entries are not kept: read where a value must be an object and
/// what it holds is read elsewhere. Its entries are skipped without building anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnObject;

impl<'de> Deserialize<'de> for AnObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = AnObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // What serde_json's `Map` says, which this replaced.
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<AnObject, A::Error> {
                use serde::de::IgnoredAny;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(AnObject)
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// A strictly parsed projection.
#[derive(Debug, Clone, PartialEq)]
pub enum Projection {
    Rag(RagProjection),
    Log(LogProjection),
    Mysql(MysqlProjection),
}

impl Projection {
    /// The call's sources: each RAG hit's `doc_id`, the log `service`, the MySQL `datasource`.
    pub fn sources(&self) -> Vec<&str> {
        match self {
            Projection::Rag(p) => p.hits.iter().map(|h| h.doc_id.as_str()).collect(),
            Projection::Log(p) => vec![p.scope.service.as_str()],
            Projection::Mysql(p) => vec![p.scope.datasource.as_str()],
        }
    }

    /// The three fields every projection shares: tool, tool_call_id, evidence_status.
    fn header(&self) -> (&str, &str, &str) {
        match self {
            Projection::Rag(p) => (&p.tool, &p.tool_call_id, p.evidence_status.as_str()),
            Projection::Log(p) => (&p.tool, &p.tool_call_id, p.evidence_status.as_str()),
            Projection::Mysql(p) => (&p.tool, &p.tool_call_id, p.evidence_status.as_str()),
        }
    }

    /// Whether the data shows evidence: at least one item and a positive count.
    /// `None` when the data is self-contradictory (items without a count or the reverse).
    fn data_shows_evidence(&self) -> Option<bool> {
        let (items, count) = match self {
            Projection::Rag(p) => (p.hits.len(), p.hits.len() as u64),
            Projection::Log(p) => (p.entries.len(), p.total_matches),
            Projection::Mysql(p) => (p.rows.len(), p.row_count),
        };
        match (items > 0, count > 0) {
            (true, true) => Some(true),
            (false, false) => Some(false),
            _ => None,
        }
    }
}

/// A referenced call that passed every rule of CONTRACT §1.
#[derive(Debug, Clone, PartialEq)]
pub struct UsableCall {
    pub tool_call_id: String,
    pub tool: ToolName,
    pub evidence_status: EvidenceStatus,
    pub projection: Projection,
    pub finished_at: Option<String>,
}

impl UsableCall {
    /// The projection's `scope`, unchanged (key order and number forms as the agent wrote
    /// them), to share.
    pub fn scope(&self) -> &Scope {
        match &self.projection {
            Projection::Rag(p) => &p.scope.raw,
            Projection::Log(p) => &p.scope.raw,
            Projection::Mysql(p) => &p.scope.raw,
        }
    }
}

/// Why a call is not usable: the rule it breaks and a detail that never quotes raw data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRejection {
    pub rule: Rule,
    pub detail: String,
}

impl CallRejection {
    pub fn new(rule: Rule, detail: impl Into<String>) -> Self {
        CallRejection {
            rule,
            detail: detail.into(),
        }
    }
}

/// Resolves the record stored under `P:run:{run_id}:call:{call_id}` (None or empty = absent).
pub fn resolve_call(
    run_id: &str,
    call_id: &str,
    record: Option<&RawRecord>,
) -> Result<UsableCall, CallRejection> {
    let record = match record {
        Some(r) if !r.is_empty() => r,
        _ => {
            return Err(CallRejection::new(
                Rule::CallMissing,
                "no record under this run",
            ))
        }
    };
    let field = |name: &str| record.get(name);
    if field("run_id") != Some(run_id) || field("tool_call_id") != Some(call_id) {
        return Err(CallRejection::new(
            Rule::CallOtherRun,
            "the record's run_id or tool_call_id differs from its key",
        ));
    }
    let tool = match field("tool_name").and_then(ToolName::parse) {
        Some(t) => t,
        None => {
            return Err(CallRejection::new(
                Rule::ToolUnsupported,
                "tool_name is not rag_search, log_search or mysql_query",
            ))
        }
    };
    match field("lifecycle") {
        Some("READY") => {}
        Some(other @ ("PROJECTING" | "ERROR")) => {
            return Err(CallRejection::new(
                Rule::CallNotReady,
                format!("lifecycle is {other}"),
            ))
        }
        _ => {
            return Err(CallRejection::new(
                Rule::CallNotReady,
                "lifecycle is absent or unknown",
            ))
        }
    }
    let agent_result = match field("agent_result") {
        Some(text) if !text.trim().is_empty() => text,
        _ => {
            return Err(CallRejection::new(
                Rule::CallNoAgentResult,
                "agent_result is absent or empty",
            ))
        }
    };
    let status = match field("evidence_status").and_then(EvidenceStatus::parse) {
        Some(EvidenceStatus::Error) => {
            return Err(CallRejection::new(
                Rule::CallEvidenceError,
                "evidence_status is ERROR",
            ))
        }
        Some(s) => s,
        None => {
            return Err(CallRejection::new(
                Rule::CallEvidenceError,
                "evidence_status is absent or unknown",
            ))
        }
    };
    // The whole projection in one pass; only when that fails is the header read, so that a
    // projection of another tool or call is named as such rather than as a schema failure.
    let projection = parse_projection(tool, agent_result)
        .map_err(|reason| unparsed_projection(tool, call_id, status, agent_result, &reason))?;
    let (p_tool, p_call, p_status) = projection.header();
    check_header(
        tool,
        call_id,
        status,
        Some(p_tool),
        Some(p_call),
        Some(p_status),
    )?;
    let shows_evidence = projection.data_shows_evidence();
    let consistent = match status {
        EvidenceStatus::EvidenceFound => shows_evidence == Some(true),
        EvidenceStatus::NoEvidence => shows_evidence == Some(false),
        EvidenceStatus::Error => false,
    };
    if !consistent {
        return Err(CallRejection::new(
            Rule::EvidenceStatusInconsistent,
            format!("{} disagrees with the projection's data", status.as_str()),
        ));
    }
    Ok(UsableCall {
        tool_call_id: call_id.to_string(),
        tool,
        evidence_status: status,
        projection,
        finished_at: field("finished_at").map(str::to_string),
    })
}

/// Why an `agent_result` is not the strict projection of its tool: the `reason` in a
/// [`Rule::ProjectionInvalid`] rejection's detail. serde's messages may quote a value (the
/// audit may hold it); only their first line is kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ProjectionError {
    /// The field at fault, by its path (`hits[0].score`), and serde's message about it.
    #[error("{path}: {message}")]
    Field { path: String, message: String },
    /// serde's message when no path narrows it (not JSON, or the whole value).
    #[error("{0}")]
    Whole(String),
    #[error("a row's length differs from the number of columns")]
    RowLength,
}

/// A strict parse; its error names the field at fault (`hits[0].score: invalid type: ...`).
/// The path is found by parsing again, on the error path only: the release path parses
/// with serde_json alone.
fn strict<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ProjectionError> {
    let first_line =
        |e: &dyn std::fmt::Display| e.to_string().lines().next().unwrap_or("").to_string();
    serde_json::from_str(text).map_err(|e| {
        let mut json = serde_json::Deserializer::from_str(text);
        match serde_path_to_error::deserialize::<_, T>(&mut json) {
            Err(traced) if traced.path().to_string() != "." => ProjectionError::Field {
                path: traced.path().to_string(),
                message: first_line(traced.inner()),
            },
            _ => ProjectionError::Whole(first_line(&e)),
        }
    })
}

/// Why an `agent_result` that is not the strict projection of `tool` is rejected: not JSON,
/// a header naming another tool, call or status, or else the schema failure `reason`.
fn unparsed_projection(
    tool: ToolName,
    call_id: &str,
    status: EvidenceStatus,
    agent_result: &str,
    reason: &ProjectionError,
) -> CallRejection {
    let header: ProjectionHeader = match serde_json::from_str(agent_result) {
        Ok(h) => h,
        Err(e) if e.classify() == serde_json::error::Category::Data => ProjectionHeader::default(),
        Err(_) => {
            return CallRejection::new(Rule::ProjectionInvalid, "agent_result is not valid JSON")
        }
    };
    let named = check_header(
        tool,
        call_id,
        status,
        header.tool.as_deref(),
        header.tool_call_id.as_deref(),
        header.evidence_status.as_deref(),
    );
    named.err().unwrap_or_else(|| {
        CallRejection::new(
            Rule::ProjectionInvalid,
            format!(
                "agent_result does not match the {} projection: {reason}",
                tool.as_str()
            ),
        )
    })
}

/// The projection must name the record's tool, call and evidence status.
fn check_header(
    tool: ToolName,
    call_id: &str,
    status: EvidenceStatus,
    p_tool: Option<&str>,
    p_call: Option<&str>,
    p_status: Option<&str>,
) -> Result<(), CallRejection> {
    if p_tool != Some(tool.as_str()) {
        return Err(CallRejection::new(
            Rule::ProjectionToolMismatch,
            "the projection's tool differs from the record's tool_name",
        ));
    }
    if p_call != Some(call_id) {
        return Err(CallRejection::new(
            Rule::ProjectionCallIdMismatch,
            "the projection's tool_call_id differs from the record's",
        ));
    }
    if p_status != Some(status.as_str()) {
        return Err(CallRejection::new(
            Rule::ProjectionStatusMismatch,
            "the projection's evidence_status differs from the record's",
        ));
    }
    Ok(())
}

/// The three fields every projection shares, read leniently (other fields are skipped).
#[derive(Debug, Default, Deserialize)]
struct ProjectionHeader {
    tool: Option<String>,
    tool_call_id: Option<String>,
    evidence_status: Option<String>,
}

/// Strict parse of an `agent_result` as the projection of `tool`. The error names the
/// field at fault (serde's message, which may quote a value: the audit may hold it).
fn parse_projection(tool: ToolName, text: &str) -> Result<Projection, ProjectionError> {
    let projection = match tool {
        ToolName::RagSearch => Projection::Rag(strict::<RagProjection>(text)?),
        ToolName::LogSearch => Projection::Log(strict::<LogProjection>(text)?),
        ToolName::MysqlQuery => {
            let p: MysqlProjection = strict(text)?;
            if p.rows.iter().any(|row| row.len() != p.columns.len()) {
                return Err(ProjectionError::RowLength);
            }
            Projection::Mysql(p)
        }
    };
    Ok(projection)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn log_found(run: &str, call: &str) -> RawRecord {
        record(
            run,
            call,
            "log_search",
            "EVIDENCE_FOUND",
            json!({"tool": "log_search", "tool_call_id": call, "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"service": "order-api", "query": "level:ERROR AND timeout",
                             "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00Z", "limit": 50},
                   "total_matches": 132,
                   "entries": [{"timestamp": "2026-12-01T10:05:03Z", "host": "order-api-7", "level": "ERROR",
                                "message": "upstream timeout after 3000ms calling orders-db"}]}),
        )
    }

    pub(crate) fn mysql_none(run: &str, call: &str) -> RawRecord {
        record(
            run,
            call,
            "mysql_query",
            "NO_EVIDENCE",
            json!({"tool": "mysql_query", "tool_call_id": call, "evidence_status": "NO_EVIDENCE",
                   "scope": {"datasource": "orders-db", "statement": "slow_queries_by_table",
                             "params": {"min_ms": 500}, "from": "2026-12-01T10:00:00Z",
                             "to": "2026-12-01T11:00:00Z", "max_rows": 100},
                   "columns": ["table", "count"], "rows": [], "row_count": 0}),
        )
    }

    pub(crate) fn rag_found(run: &str, call: &str) -> RawRecord {
        record(
            run,
            call,
            "rag_search",
            "EVIDENCE_FOUND",
            json!({"tool": "rag_search", "tool_call_id": call, "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"query": "order-api timeout runbook", "index": "runbooks", "top_k": 5},
                   "hits": [{"doc_id": "kb-123", "title": "Order API timeouts",
                             "excerpt": "Pool exhaustion causes 504s.", "updated_at": "2026-11-01T00:00:00Z",
                             "score": 0.82}]}),
        )
    }

    pub(crate) fn record(
        run: &str,
        call: &str,
        tool: &str,
        status: &str,
        projection: Value,
    ) -> RawRecord {
        [
            ("run_id", run.to_string()),
            ("tool_call_id", call.to_string()),
            ("tool_name", tool.to_string()),
            ("lifecycle", "READY".to_string()),
            ("evidence_status", status.to_string()),
            ("agent_result", projection.to_string()),
            ("raw_response", format!("RAW-{call}-CANARY")),
            ("started_at", "2026-12-01T10:05:00Z".to_string()),
            ("finished_at", "2026-12-01T10:05:01Z".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn rule_of(run: &str, call: &str, record: &RawRecord) -> Rule {
        resolve_call(run, call, Some(record)).unwrap_err().rule
    }

    fn edit_projection(record: &mut RawRecord, edit: impl FnOnce(&mut Value)) {
        let mut value: Value = serde_json::from_str(record.get("agent_result").unwrap()).unwrap();
        edit(&mut value);
        record.insert("agent_result", value.to_string());
    }

    #[test]
    fn supported_projections_resolve_with_scope_unchanged() {
        for rec in [
            log_found("r", "c"),
            mysql_none("r", "c"),
            rag_found("r", "c"),
        ] {
            let call = resolve_call("r", "c", Some(&rec)).unwrap();
            let original: Value = serde_json::from_str(rec.get("agent_result").unwrap()).unwrap();
            assert_eq!(call.scope(), &original["scope"]);
        }
        let rag = resolve_call("r", "c", Some(&rag_found("r", "c"))).unwrap();
        assert_eq!(rag.projection.sources(), vec!["kb-123"]);
    }

    #[test]
    fn a_projection_that_does_not_parse_is_rejected_naming_the_field_path() {
        let mut rec = rag_found("r", "c");
        edit_projection(&mut rec, |p| p["hits"][0]["score"] = json!("high"));
        let rejection = resolve_call("r", "c", Some(&rec)).unwrap_err();
        assert_eq!(rejection.rule, Rule::ProjectionInvalid);
        assert!(
            rejection.detail.starts_with(
                "agent_result does not match the rag_search projection: hits[0].score: invalid type"
            ),
            "{}",
            rejection.detail
        );
    }

    #[test]
    fn a_raw_record_holds_only_the_fields_the_harness_reads() {
        let mut rec: RawRecord = [
            ("raw_response", "RAW-CANARY"),
            ("lifecycle", "READY"),
            ("started_at", "2026-12-01T10:05:00Z"),
            ("run_id", "r"),
        ]
        .into_iter()
        .collect();
        assert_eq!(rec.get("raw_response"), None);
        assert_eq!(rec.insert("started_at", "x"), None);
        // In RECORD_FIELDS order, whatever order they were given in.
        assert_eq!(
            rec.iter().collect::<Vec<_>>(),
            [("run_id", "r"), ("lifecycle", "READY")]
        );
        assert_eq!(rec.len_bytes(), 6);
        assert_eq!(rec.insert("lifecycle", "ERROR"), Some("READY".to_string()));
        rec.set(5, "{}");
        assert_eq!(rec.get("agent_result"), Some("{}"));
        rec.set(RECORD_FIELDS.len(), "past the end");
        assert_eq!(rec.len_bytes(), 8);
        // The text a field set again left behind plays no part.
        let same: RawRecord = [
            ("run_id", "r"),
            ("lifecycle", "ERROR"),
            ("agent_result", "{}"),
        ]
        .into_iter()
        .collect();
        assert_eq!(rec, same);
        assert_eq!(format!("{rec:?}"), format!("{same:?}"));
        assert_eq!(
            format!("{same:?}"),
            r#"{"run_id": "r", "lifecycle": "ERROR", "agent_result": "{}"}"#
        );
        for name in ["run_id", "lifecycle", "agent_result"] {
            assert!(rec.remove(name).is_some());
        }
        assert!(rec.is_empty());
    }

    #[test]
    fn missing_and_empty_records_are_missing() {
        assert_eq!(
            resolve_call("r", "c", None).unwrap_err().rule,
            Rule::CallMissing
        );
        assert_eq!(rule_of("r", "c", &RawRecord::new()), Rule::CallMissing);
    }

    #[test]
    fn a_record_of_another_run_is_rejected() {
        assert_eq!(
            rule_of("r-42", "c", &log_found("r-41", "c")),
            Rule::CallOtherRun
        );
        assert_eq!(
            rule_of("r", "c", &log_found("r", "c-other")),
            Rule::CallOtherRun
        );
        let mut no_run = log_found("r", "c");
        no_run.remove("run_id");
        assert_eq!(rule_of("r", "c", &no_run), Rule::CallOtherRun);
    }

    #[test]
    fn unknown_tools_are_unsupported() {
        let mut rec = log_found("r", "c");
        rec.insert("tool_name", "shell_exec");
        assert_eq!(rule_of("r", "c", &rec), Rule::ToolUnsupported);
    }

    #[test]
    fn projecting_error_and_unknown_lifecycles_are_not_ready() {
        for lifecycle in ["PROJECTING", "ERROR", "DONE"] {
            let mut rec = log_found("r", "c");
            rec.insert("lifecycle", lifecycle);
            assert_eq!(rule_of("r", "c", &rec), Rule::CallNotReady, "{lifecycle}");
        }
    }

    #[test]
    fn missing_agent_result_is_rejected() {
        let mut rec = log_found("r", "c");
        rec.remove("agent_result");
        assert_eq!(rule_of("r", "c", &rec), Rule::CallNoAgentResult);
        rec.insert("agent_result", "  ");
        assert_eq!(rule_of("r", "c", &rec), Rule::CallNoAgentResult);
    }

    #[test]
    fn error_absent_or_unknown_evidence_status_is_rejected() {
        for status in [Some("ERROR"), None, Some("MAYBE")] {
            let mut rec = log_found("r", "c");
            match status {
                Some(s) => rec.insert("evidence_status", s),
                None => rec.remove("evidence_status"),
            };
            assert_eq!(rule_of("r", "c", &rec), Rule::CallEvidenceError);
        }
    }

    #[test]
    fn invalid_json_or_schema_is_a_projection_mismatch() {
        let mut rec = log_found("r", "c");
        rec.insert("agent_result", "{not json");
        assert_eq!(rule_of("r", "c", &rec), Rule::ProjectionInvalid);

        let mut extra = log_found("r", "c");
        edit_projection(&mut extra, |v| v["raw"] = json!("x"));
        assert_eq!(rule_of("r", "c", &extra), Rule::ProjectionInvalid);

        let mut wrong_type = log_found("r", "c");
        edit_projection(&mut wrong_type, |v| v["total_matches"] = json!("132"));
        assert_eq!(rule_of("r", "c", &wrong_type), Rule::ProjectionInvalid);

        let mut nested_extra = rag_found("r", "c");
        edit_projection(&mut nested_extra, |v| {
            v["hits"][0]["url"] = json!("http://x")
        });
        assert_eq!(rule_of("r", "c", &nested_extra), Rule::ProjectionInvalid);

        let mut ragged = mysql_none("r", "c");
        edit_projection(&mut ragged, |v| {
            v["rows"] = json!([["orders"]]);
            v["row_count"] = json!(1);
            v["evidence_status"] = json!("NO_EVIDENCE");
        });
        let rejection = resolve_call("r", "c", Some(&ragged)).unwrap_err();
        assert_eq!(rejection.rule, Rule::ProjectionInvalid);
        assert_eq!(
            rejection.detail,
            "agent_result does not match the mysql_query projection: \
             a row's length differs from the number of columns"
        );
    }

    #[test]
    fn mysql_params_must_be_an_object_if_given() {
        for (params, usable) in [
            (json!({"min_ms": 500, "tables": ["a", {"b": null}]}), true),
            (json!({}), true),
            (Value::Null, true),
            (json!([1]), false),
            (json!("min_ms=500"), false),
            (json!(500), false),
        ] {
            let mut rec = mysql_none("r", "c");
            edit_projection(&mut rec, |v| v["scope"]["params"] = params.clone());
            let resolved = resolve_call("r", "c", Some(&rec));
            assert_eq!(resolved.is_ok(), usable, "{params}");
            if let Ok(call) = resolved {
                // Kept as written, for what the harness shows.
                assert_eq!(call.scope()["params"], params);
            }
        }
        // The detail names the field as serde_json's map did.
        let mut rec = mysql_none("r", "c");
        edit_projection(&mut rec, |v| v["scope"]["params"] = json!([1]));
        let detail = resolve_call("r", "c", Some(&rec)).unwrap_err().detail;
        assert!(detail.contains("expected a map"), "{detail}");
    }

    #[test]
    fn a_scope_writing_a_key_twice_is_projection_invalid() {
        let rec = log_found("r", "c");
        let text = rec.get("agent_result").unwrap();
        assert!(text.contains(r#""limit":50"#), "{text}");
        let mut twice = rec.clone();
        twice.insert(
            "agent_result",
            text.replacen(r#""limit":50"#, r#""limit":50,"limit":10"#, 1),
        );
        let rejected = resolve_call("r", "c", Some(&twice)).unwrap_err();
        assert_eq!(rejected.rule, Rule::ProjectionInvalid);
        assert!(
            rejected.detail.contains("duplicate field"),
            "{}",
            rejected.detail
        );
        let mut array = rec.clone();
        edit_projection(&mut array, |v| {
            v["scope"] = json!([
                "order-api",
                "q",
                "2026-12-01T10:00:00Z",
                "2026-12-01T11:00:00Z",
                50
            ])
        });
        assert_eq!(rule_of("r", "c", &array), Rule::ProjectionInvalid);
    }

    #[test]
    fn projection_must_agree_with_its_record() {
        let mut tool = log_found("r", "c");
        edit_projection(&mut tool, |v| v["tool"] = json!("rag_search"));
        assert_eq!(rule_of("r", "c", &tool), Rule::ProjectionToolMismatch);

        let mut id = log_found("r", "c");
        edit_projection(&mut id, |v| v["tool_call_id"] = json!("c-9"));
        assert_eq!(rule_of("r", "c", &id), Rule::ProjectionCallIdMismatch);

        let mut status = log_found("r", "c");
        edit_projection(&mut status, |v| v["evidence_status"] = json!("NO_EVIDENCE"));
        assert_eq!(rule_of("r", "c", &status), Rule::ProjectionStatusMismatch);
    }

    #[test]
    fn evidence_status_must_agree_with_the_data() {
        // found with no entries
        let mut empty = log_found("r", "c");
        edit_projection(&mut empty, |v| {
            v["entries"] = json!([]);
            v["total_matches"] = json!(0)
        });
        assert_eq!(rule_of("r", "c", &empty), Rule::EvidenceStatusInconsistent);
        // found with entries but a zero count
        let mut zero = log_found("r", "c");
        edit_projection(&mut zero, |v| v["total_matches"] = json!(0));
        assert_eq!(rule_of("r", "c", &zero), Rule::EvidenceStatusInconsistent);
        // no evidence with rows
        let mut rows = mysql_none("r", "c");
        edit_projection(&mut rows, |v| {
            v["rows"] = json!([["orders", 4]]);
            v["row_count"] = json!(1)
        });
        assert_eq!(rule_of("r", "c", &rows), Rule::EvidenceStatusInconsistent);
        // rag found without hits
        let mut rag = rag_found("r", "c");
        edit_projection(&mut rag, |v| v["hits"] = json!([]));
        assert_eq!(rule_of("r", "c", &rag), Rule::EvidenceStatusInconsistent);
    }

    #[test]
    fn optional_fields_may_be_left_out() {
        let rec = record(
            "r",
            "c",
            "rag_search",
            "EVIDENCE_FOUND",
            json!({"tool": "rag_search", "tool_call_id": "c", "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"query": "q", "top_k": 1}, "hits": [{"doc_id": "d", "excerpt": "e"}]}),
        );
        assert!(resolve_call("r", "c", Some(&rec)).is_ok());
        let log = record(
            "r",
            "c",
            "log_search",
            "NO_EVIDENCE",
            json!({"tool": "log_search", "tool_call_id": "c", "evidence_status": "NO_EVIDENCE",
                   "scope": {"service": "s", "query": "q", "from": "a", "to": "b", "limit": 1},
                   "total_matches": 0, "entries": []}),
        );
        assert!(resolve_call("r", "c", Some(&log)).is_ok());
    }
}
