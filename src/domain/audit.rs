//! The audit record (CONTRACT §4): the operators' account of one release.
//!
//! It may name call ids, rules and the guard's reason, and (in its bounded [`RunView`]) the
//! operator's question, the Draft and the verified evidence the judge read: never raw
//! responses. The domain fills in what it decides; the actors add model attempts, budget use,
//! timings and how a cancel arrived. Entry point: [`Audit::new`].

use serde::Serialize;

use super::evidence_guard::{ExcludedReference, Rule, Violation};
use super::json;
use super::outcome::{FallbackType, Outcome, StopReason};

/// Which branch of the release decision was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleasePath {
    ControlledStop,
    DraftUnparseable,
    MissingContext,
    NoConclusion,
    Concluded,
}

labels! {
    /// Who asked for a model call; the metric label `role`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
    pub enum ModelRole {
        Repair = "repair",
        Semantic = "semantic",
    }
}

labels! {
    /// How one model attempt ended; the metric label `result`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
    pub enum AttemptOutcome {
        Ok = "ok",
        Timeout = "timeout",
        Transport = "transport",
        Parse = "parse",
        Schema = "schema",
        /// The server refused the request itself as invalid (a 4xx other than 408 and 429,
        /// or a 5xx whose body says the request is invalid): sending it again cannot help,
        /// so it is never retried. Usually a `model.structured_output` the server does not
        /// accept.
        Rejected = "rejected",
        Cancelled = "cancelled",
        BudgetDenied = "budget_denied",
    }
}

impl AttemptOutcome {
    /// Technical failures: the only outcomes SemanticGuard retries (`Rejected` is not one:
    /// the same bytes would be refused again).
    pub fn is_technical_failure(self) -> bool {
        matches!(
            self,
            AttemptOutcome::Timeout
                | AttemptOutcome::Transport
                | AttemptOutcome::Parse
                | AttemptOutcome::Schema
        )
    }
}

/// What every attempt denied for its size says (see [`over_input_limit`]).
pub const OVER_INPUT_LIMIT: &str = "-byte input limit";

/// The audit detail of an attempt not sent because its request is over its role's input
/// limit (`semantic_guard.max_input_bytes`, `repair.max_input_bytes`): for the judge, the
/// Draft and its evidence do not fit what the judge may read, and the release fails closed.
pub fn over_input_limit(role: ModelRole, request_bytes: u64, max_input_bytes: u64) -> String {
    let (what, key) = match role {
        ModelRole::Semantic => (
            "the Draft and its verified evidence",
            "semantic_guard.max_input_bytes",
        ),
        ModelRole::Repair => ("the Draft and its violations", "repair.max_input_bytes"),
    };
    format!(
        "the request is {request_bytes} bytes, over the {max_input_bytes}{OVER_INPUT_LIMIT} \
         ({key}): {what} do not fit"
    )
}

/// Whether an attempt's detail says it was denied by [`over_input_limit`].
pub fn is_over_input_limit(detail: &str) -> bool {
    detail.contains(OVER_INPUT_LIMIT)
}

/// One model attempt (sent or denied before sending).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelAttempt {
    pub role: ModelRole,
    /// 1-based attempt number within its role.
    pub attempt: u32,
    pub outcome: AttemptOutcome,
    /// A short, data-free account of a failure (e.g. "HTTP 503", "extra key").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Milliseconds, to the microsecond.
    pub latency_ms: f64,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// Milliseconds the attempt waited for a model slot (or for a server's cooldown) before
    /// it was sent or refused: time spent waiting on the model, beside `latency_ms`, whose
    /// clock starts when the request is sent. Left out when zero.
    #[serde(skip_serializing_if = "is_zero_ms")]
    pub queued_ms: f64,
}

fn is_zero_ms(ms: &f64) -> bool {
    *ms == 0.0
}

/// Whether the one repair ran and why its candidate was accepted or rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepairAudit {
    pub ran: bool,
    pub accepted: bool,
    pub reason: String,
    /// EvidenceGuard's violations on the repaired Draft, when it still failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub violations_after: Vec<Violation>,
}

impl RepairAudit {
    pub fn accepted() -> Self {
        RepairAudit {
            ran: true,
            accepted: true,
            reason: "only ids and references changed and EvidenceGuard passed".into(),
            violations_after: Vec::new(),
        }
    }

    pub fn rejected(reason: String, violations_after: Vec<Violation>) -> Self {
        RepairAudit {
            ran: true,
            accepted: false,
            reason,
            violations_after,
        }
    }

    /// No repair call was made (no model configured, budget, cancellation).
    pub fn not_run(reason: String) -> Self {
        RepairAudit {
            ran: false,
            accepted: false,
            reason,
            violations_after: Vec::new(),
        }
    }
}

/// SemanticGuard's verdict and its reason (the reason never reaches a release result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerdictAudit {
    pub verdict: &'static str,
    pub reason: String,
}

impl VerdictAudit {
    pub fn supported(reason: String) -> Self {
        VerdictAudit {
            verdict: "SUPPORTED",
            reason,
        }
    }
    pub fn unsupported(reason: String) -> Self {
        VerdictAudit {
            verdict: "UNSUPPORTED",
            reason,
        }
    }
}

/// What the run's model budget allowed and what was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct BudgetUse {
    pub model_calls: u32,
    pub tokens: u64,
    pub bytes: u64,
    pub max_model_calls: u32,
    pub max_tokens: u64,
    pub max_bytes: u64,
}

labels! {
    /// How a cancel reached the release; the metric label `source`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
    pub enum CancelSource {
        /// `POST .../cancel` on this replica.
        Http = "http",
        /// A run id published on `P:cancel` (usually by another replica).
        Pubsub = "pubsub",
        /// The durable `P:run:{RUN}:cancelled` marker: seen at the start, before a model
        /// call, by the replica's marker poll, or inside the fenced commit.
        Marker = "marker",
    }
}

/// Wall-clock account of the release, in milliseconds to the microsecond.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Timings {
    pub started_at: String,
    pub total_ms: f64,
    /// Time spent waiting on the model (the attempts' latencies).
    pub model_wait_ms: f64,
    /// The harness's own time: total minus model wait.
    pub overhead_ms: f64,
}

/// A duration in milliseconds, rounded to the microsecond.
pub fn millis(d: std::time::Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// The audit record of one release.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Audit {
    pub run_id: String,
    pub stop_reason: StopReason,
    pub path: Option<ReleasePath>,
    /// Why the Draft could not be parsed (schema position, never its content).
    pub draft_error: Option<String>,
    /// EvidenceGuard's violations on the submitted Draft.
    pub violations: Vec<Violation>,
    /// No-conclusion path: cited calls left out, and why.
    pub excluded_references: Vec<ExcludedReference>,
    pub repair: Option<RepairAudit>,
    pub model_attempts: Vec<ModelAttempt>,
    pub verdict: Option<VerdictAudit>,
    pub budget: BudgetUse,
    pub timings: Timings,
    /// Observed facts left out, oldest first, so that facts and sources fit
    /// `evidence.max_written_bytes`.
    #[serde(skip_serializing_if = "is_zero")]
    pub facts_dropped: usize,
    /// Entries left out of the lists above so that the record stays within
    /// [`MAX_AUDIT_BYTES`] (set only when the record is written).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted: Option<Omitted>,
    /// What the console shows of the run (written as the record's `view` key, bounded).
    #[serde(skip)]
    pub view: RunView,
}

/// Most bytes of JSON the `view` of an audit record holds (its parts together): the whole
/// record stays within the contract's 64 KB.
pub const MAX_VIEW_BYTES: usize = 40 * 1024;

/// Longest operator question kept in the view, in bytes (cut at a character boundary and
/// marked `…[truncated]`).
pub const MAX_VIEW_QUERY_BYTES: usize = 2048;

/// The run as the operator reads it beside the decision (the console's run page): the
/// question, the Draft as submitted (with its citations), the repaired Draft when a repair
/// was accepted, and the verified evidence SemanticGuard read, grouped by analysis. Each
/// part is JSON text written once; a part that would take the view past
/// [`MAX_VIEW_BYTES`] is left out and named in `omitted`. Like the rest of the record it
/// may name call ids, never raw responses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunView {
    query: Option<String>,
    draft: Option<String>,
    repaired_draft: Option<String>,
    evidence: Option<String>,
    omitted: Vec<&'static str>,
    used: usize,
}

/// A part of the [`RunView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewPart {
    Draft,
    RepairedDraft,
    Evidence,
}

impl ViewPart {
    fn name(self) -> &'static str {
        match self {
            ViewPart::Draft => "draft",
            ViewPart::RepairedDraft => "repaired_draft",
            ViewPart::Evidence => "evidence",
        }
    }
}

impl RunView {
    /// The operator's question, cut to [`MAX_VIEW_QUERY_BYTES`].
    pub fn set_query(&mut self, query: &str) {
        let mut end = query.len().min(MAX_VIEW_QUERY_BYTES);
        while !query.is_char_boundary(end) {
            end -= 1;
        }
        let mut kept = query[..end].to_string();
        if end < query.len() {
            kept.push_str("…[truncated]");
        }
        let json = json::to_string(&kept).unwrap_or_else(|_| "null".into());
        self.used += json.len();
        self.query = Some(json);
    }

    /// Keeps `json` (the part's JSON text) if it fits in what is left.
    pub fn put(&mut self, part: ViewPart, json: String) {
        if self.used + json.len() > MAX_VIEW_BYTES {
            self.omitted.push(part.name());
            return;
        }
        self.used += json.len();
        let slot = match part {
            ViewPart::Draft => &mut self.draft,
            ViewPart::RepairedDraft => &mut self.repaired_draft,
            ViewPart::Evidence => &mut self.evidence,
        };
        *slot = Some(json);
    }

    /// Appends the record's `"view":{…},` key to `out`, unless nothing was put in the view.
    /// Written straight into the record: the view is its largest part.
    fn write_key(&self, out: &mut String) {
        let Some(query) = self.query.as_deref() else {
            return;
        };
        out.reserve(self.used + 96);
        out.push_str("\"view\":{\"query\":");
        out.push_str(query);
        for (name, part) in [
            ("draft", &self.draft),
            ("repaired_draft", &self.repaired_draft),
            ("evidence", &self.evidence),
        ] {
            out.push_str(",\"");
            out.push_str(name);
            out.push_str("\":");
            out.push_str(part.as_deref().unwrap_or("null"));
        }
        out.push_str(",\"omitted\":");
        out.push_str(&json::to_string(&self.omitted).unwrap_or_else(|_| "[]".into()));
        out.push_str("},");
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The largest audit record stored, in bytes (CONTRACT §4): a longer record keeps the
/// first entries of its lists and counts the others in `omitted`.
pub const MAX_AUDIT_BYTES: usize = 64 * 1024;

/// How many entries of each list a summarised audit record left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Omitted {
    pub violations: usize,
    pub excluded_references: usize,
    pub repair_violations_after: usize,
    pub model_attempts: usize,
}

/// How the release ended: the last keys of the audit record. The fenced commit chooses
/// between two of these (the decided one, and CANCELLED if the marker is set by then), so
/// they are serialized apart from the rest ([`Audit::commit_json`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEnd {
    pub outcome: Outcome,
    pub fallback_type: Option<FallbackType>,
    /// What the release had decided when the cancel marker was found at the commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded: Option<Superseded>,
    /// Last: the commit rewrites it to `http` when it finds the cancel route's marker
    /// (`store::cancelled_by_http`).
    pub cancelled_by: Option<CancelSource>,
}

/// A decided outcome that a cancel replaced at the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Superseded {
    pub outcome: Outcome,
    pub fallback_type: Option<FallbackType>,
}

impl AuditEnd {
    /// The end of a release that stored `outcome` (with `cancelled_by` for CANCELLED).
    pub fn of(
        outcome: Outcome,
        fallback_type: Option<FallbackType>,
        cancelled_by: Option<CancelSource>,
    ) -> AuditEnd {
        AuditEnd {
            outcome,
            fallback_type,
            cancelled_by,
            superseded: None,
        }
    }

    /// The end when the marker is found at the commit, replacing this one.
    pub fn cancelled_at_commit(&self) -> AuditEnd {
        if self.outcome == Outcome::Cancelled {
            return self.clone();
        }
        AuditEnd {
            outcome: Outcome::Cancelled,
            fallback_type: None,
            cancelled_by: Some(CancelSource::Marker),
            superseded: Some(Superseded {
                outcome: self.outcome,
                fallback_type: self.fallback_type,
            }),
        }
    }
}

/// The audit record as the fenced commit writes it: the record's keys up to its end, with
/// the console's view (`head`, `{…,"view":…,`), written once, and the two ends the commit
/// chooses between (`decided`, and `cancelled` for a cancel marker found at the commit),
/// each the end's keys and the closing brace (`"outcome":…,"cancelled_by":…}`). A stored
/// record is `head` followed by one end, so the record's bulk is sent to Redis once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditJson {
    pub head: String,
    pub decided: String,
    pub cancelled: String,
}

impl AuditJson {
    /// The whole record stored when the decided result is.
    pub fn decided_record(&self) -> String {
        [self.head.as_str(), &self.decided].concat()
    }

    /// The whole record stored when the commit finds the cancel marker.
    pub fn cancelled_record(&self) -> String {
        [self.head.as_str(), &self.cancelled].concat()
    }
}

/// An end's keys as they close a record: `"outcome":…,"cancelled_by":…}` (its JSON object
/// without the opening brace; `cancelled_by` is always there, so it is never empty).
fn end_json(end: &AuditEnd) -> String {
    let json = json::to_string_sized(end, 128).unwrap_or_else(|_| "{}".into());
    json[1..].to_string()
}

impl Audit {
    pub fn new(run_id: &str, stop_reason: StopReason) -> Self {
        Audit {
            run_id: run_id.to_string(),
            stop_reason,
            path: None,
            draft_error: None,
            violations: Vec::new(),
            excluded_references: Vec::new(),
            repair: None,
            model_attempts: Vec::new(),
            verdict: None,
            budget: BudgetUse::default(),
            timings: Timings::default(),
            facts_dropped: 0,
            view: RunView::default(),
            omitted: None,
        }
    }

    /// The JSON object of this record followed by `end`'s keys, at most
    /// [`MAX_AUDIT_BYTES`]: a longer record keeps the first entries of each list (as many as
    /// fit, the same number for each) and counts the others in `omitted`.
    pub fn to_json(&self, end: &AuditEnd) -> String {
        let end = end_json(end);
        let mut json = self.bounded_head(&self.view, end.len());
        json.push_str(&end);
        json
    }

    /// The record's keys before its end, with the console's `view` last: `{…,"view":…,`.
    /// Each key is followed by a comma, so that an end's keys complete it.
    fn head(&self, view: &RunView) -> String {
        let Ok(mut json) = json::to_string_sized(self, 1024 + view.used) else {
            return "{".into();
        };
        // An object with keys (`run_id`): `{…}` becomes `{…,`.
        json.pop();
        json.push(',');
        view.write_key(&mut json);
        json
    }

    /// [`Self::head`], such that with an end of `end_len` bytes the record is at most
    /// [`MAX_AUDIT_BYTES`] (the view takes at most [`MAX_VIEW_BYTES`] of them).
    fn bounded_head(&self, view: &RunView, end_len: usize) -> String {
        let whole = self.head(view);
        if whole.len() + end_len <= MAX_AUDIT_BYTES {
            return whole;
        }
        let mut keep = 64;
        loop {
            let json = self.keeping(keep).head(view);
            if json.len() + end_len <= MAX_AUDIT_BYTES || keep == 0 {
                return json;
            }
            keep /= 2;
        }
    }

    /// This record with at most `keep` entries in each list, the others counted.
    fn keeping(&self, keep: usize) -> Audit {
        fn cut<T: Clone>(list: &[T], keep: usize) -> (Vec<T>, usize) {
            let kept = list.len().min(keep);
            (list[..kept].to_vec(), list.len() - kept)
        }
        let mut summary = Audit {
            violations: Vec::new(),
            excluded_references: Vec::new(),
            model_attempts: Vec::new(),
            repair: None,
            view: RunView::default(),
            ..self.clone()
        };
        let mut omitted = Omitted::default();
        (summary.violations, omitted.violations) = cut(&self.violations, keep);
        (summary.excluded_references, omitted.excluded_references) =
            cut(&self.excluded_references, keep);
        (summary.model_attempts, omitted.model_attempts) = cut(&self.model_attempts, keep);
        summary.repair = self.repair.as_ref().map(|repair| {
            let (violations_after, left) = cut(&repair.violations_after, keep);
            omitted.repair_violations_after = left;
            RepairAudit {
                violations_after,
                ..repair.clone()
            }
        });
        summary.omitted = Some(omitted);
        summary
    }

    /// The record the fenced commit writes: its head once, and the two ends it chooses
    /// between (`end`, and the end of a cancel found at the commit). Bounded as
    /// [`Self::to_json`], with room for the longer end.
    pub fn commit_json(&self, end: &AuditEnd) -> AuditJson {
        let decided = end_json(end);
        let cancelled = end_json(&end.cancelled_at_commit());
        let head = self.bounded_head(&self.view, decided.len().max(cancelled.len()));
        AuditJson {
            head,
            decided,
            cancelled,
        }
    }

    /// Takes what a domain decision wrote into a scratch audit of the same run.
    pub fn absorb(&mut self, notes: Audit) {
        if notes.path.is_some() {
            self.path = notes.path;
        }
        if notes.draft_error.is_some() {
            self.draft_error = notes.draft_error;
        }
        self.violations.extend(notes.violations);
        self.excluded_references.extend(notes.excluded_references);
        if notes.repair.is_some() {
            self.repair = notes.repair;
        }
        if notes.verdict.is_some() {
            self.verdict = notes.verdict;
        }
        if notes.facts_dropped > 0 {
            self.facts_dropped = notes.facts_dropped;
        }
    }

    /// Closes the record when the release has decided, `total` after it began: the
    /// timings (total, model wait, overhead) are filled in and the record is serialized for
    /// the fenced commit with `end` (and the CANCELLED end the commit may choose instead).
    /// Answers the JSON and the harness's own time (total minus model wait).
    pub fn finish(
        &mut self,
        total: std::time::Duration,
        end: &AuditEnd,
    ) -> (AuditJson, std::time::Duration) {
        // Sums of milliseconds read best rounded to the microsecond, as each term is.
        let micros = |ms: f64| (ms * 1000.0).round() / 1000.0;
        let model_wait = micros(self.model_wait_ms());
        self.timings.total_ms = millis(total);
        self.timings.model_wait_ms = model_wait;
        self.timings.overhead_ms = micros((millis(total) - model_wait).max(0.0));
        let overhead =
            total.saturating_sub(std::time::Duration::from_secs_f64(model_wait / 1000.0));
        (self.commit_json(end), overhead)
    }

    /// The rule of every violation the record holds (the submitted Draft's, the references
    /// a no-conclusion Draft lost, the repaired Draft's), for the violations metric.
    pub fn violation_rules(&self) -> impl Iterator<Item = Rule> + '_ {
        let repaired = self.repair.iter().flat_map(|r| r.violations_after.iter());
        self.violations
            .iter()
            .map(|v| v.rule)
            .chain(self.excluded_references.iter().map(|e| e.rule))
            .chain(repaired.map(|v| v.rule))
    }

    /// Time spent waiting on the model, summed over attempts.
    pub fn model_wait_ms(&self) -> f64 {
        // Not `.sum()`: an empty f64 sum is -0.0, which would print as "-0.0 ms".
        self.model_attempts
            .iter()
            .fold(0.0, |wait, a| wait + a.latency_ms + a.queued_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_model_attempt_is_a_wait_of_zero_not_minus_zero() {
        let mut audit = Audit::new("r-1", StopReason::FinalAnswer);
        let end = AuditEnd::of(Outcome::Success, None, None);
        let (parts, _) = audit.finish(std::time::Duration::from_millis(2), &end);
        assert!(audit.timings.model_wait_ms.is_sign_positive());
        assert!(!parts.decided_record().contains("-0.0"));
    }

    #[test]
    fn the_commit_holds_the_whole_record_for_either_ending() {
        let mut audit = Audit::new("r-1", StopReason::FinalAnswer);
        audit.verdict = Some(VerdictAudit::supported("fine".into()));
        let end = AuditEnd::of(Outcome::Success, None, None);
        let parts = audit.commit_json(&end);
        let decided: serde_json::Value = serde_json::from_str(&parts.decided_record()).unwrap();
        assert_eq!(decided["outcome"], "SUCCESS");
        assert_eq!(decided["cancelled_by"], serde_json::Value::Null);
        assert!(decided.get("superseded").is_none());
        assert_eq!(decided["verdict"]["verdict"], "SUPPORTED");
        assert_eq!(parts.decided_record(), audit.to_json(&end));
        // Written by `json`, byte for byte as serde_json writes it (timings are floats).
        audit.timings.total_ms = 1.38;
        audit.timings.model_wait_ms = -0.0;
        let mut whole = serde_json::to_string(&audit).unwrap();
        whole.pop();
        whole.push_str(&serde_json::to_string(&end).unwrap().replacen('{', ",", 1));
        assert_eq!(audit.to_json(&end), whole);

        let cancelled: serde_json::Value = serde_json::from_str(&parts.cancelled_record()).unwrap();
        assert_eq!(cancelled["outcome"], "CANCELLED");
        assert_eq!(cancelled["fallback_type"], serde_json::Value::Null);
        assert_eq!(cancelled["cancelled_by"], "marker");
        assert_eq!(cancelled["superseded"]["outcome"], "SUCCESS");
        assert_eq!(cancelled["run_id"], "r-1");
    }

    #[test]
    fn the_view_is_written_whole_and_bounded() {
        let mut audit = Audit::new("r-1", StopReason::FinalAnswer);
        let end = AuditEnd::of(Outcome::Success, None, None);
        let plain: serde_json::Value = serde_json::from_str(&audit.to_json(&end)).unwrap();
        assert!(plain.get("view").is_none());
        audit.view.set_query("why <script>alert(1)</script>?");
        audit.view.put(
            ViewPart::Draft,
            r#"{"conclusion":null,"analyses":[]}"#.into(),
        );
        audit
            .view
            .put(ViewPart::Evidence, "x".repeat(MAX_VIEW_BYTES));
        let record: serde_json::Value = serde_json::from_str(&audit.to_json(&end)).unwrap();
        let view = &record["view"];
        assert_eq!(view["query"], "why <script>alert(1)</script>?");
        assert_eq!(view["draft"]["conclusion"], serde_json::Value::Null);
        assert_eq!(view["evidence"], serde_json::Value::Null);
        assert_eq!(view["omitted"], serde_json::json!(["evidence"]));
        assert_eq!(record["outcome"], "SUCCESS");
        // The end's keys stay last, `cancelled_by` the very last (the commit rewrites it).
        let cancelled = audit.commit_json(&end).cancelled_record();
        assert!(
            cancelled.ends_with(",\"cancelled_by\":\"marker\"}"),
            "{cancelled}"
        );
        let cancelled: serde_json::Value = serde_json::from_str(&cancelled).unwrap();
        assert_eq!(cancelled["view"], record["view"]);
        assert_eq!(cancelled["superseded"]["outcome"], "SUCCESS");

        let mut long = RunView::default();
        long.set_query(&"é".repeat(MAX_VIEW_QUERY_BYTES));
        let query: String = serde_json::from_str(long.query.as_deref().unwrap()).unwrap();
        assert!(query.ends_with("…[truncated]"));
        assert!(query.len() <= MAX_VIEW_QUERY_BYTES + "…[truncated]".len());
    }

    #[test]
    fn a_record_of_90000_violations_is_summarised_within_64_kb() {
        let mut audit = Audit::new("r-1", StopReason::FinalAnswer);
        let violation = |i: usize| Violation {
            rule: Rule::CallMissing,
            at: format!("analyses[{i}]"),
            tool_call_id: Some(format!("c-{i}-{}", "x".repeat(200))),
            detail: "no record of this call exists in the run".into(),
        };
        audit.violations = (0..90_000).map(violation).collect();
        audit.repair = Some(RepairAudit::rejected(
            "still fails".into(),
            (0..1_000).map(violation).collect(),
        ));
        let end = AuditEnd::of(Outcome::Fallback, None, None);
        let json = audit.to_json(&end);
        assert!(json.len() <= MAX_AUDIT_BYTES, "{} bytes", json.len());
        let read: serde_json::Value = serde_json::from_str(&json).unwrap();
        let kept = read["violations"].as_array().unwrap().len();
        assert!(kept > 0);
        assert_eq!(read["omitted"]["violations"], 90_000 - kept);
        assert_eq!(
            read["omitted"]["repair_violations_after"],
            1_000 - read["repair"]["violations_after"].as_array().unwrap().len()
        );
        assert_eq!(read["violations"][0]["at"], "analyses[0]");
        assert_eq!(read["outcome"], "FALLBACK");
        // The commit's head leaves room for the longer end: either stored record fits.
        let parts = audit.commit_json(&end);
        assert_eq!(parts.decided_record(), json);
        for record in [parts.decided_record(), parts.cancelled_record()] {
            assert!(record.len() <= MAX_AUDIT_BYTES, "{} bytes", record.len());
            let read: serde_json::Value = serde_json::from_str(&record).unwrap();
            assert_eq!(read["violations"].as_array().unwrap().len(), kept);
        }
        // A record within the bound is written whole, with no `omitted`.
        audit.violations.truncate(3);
        audit.repair = None;
        let read: serde_json::Value = serde_json::from_str(&audit.to_json(&end)).unwrap();
        assert_eq!(read["violations"].as_array().unwrap().len(), 3);
        assert!(read.get("omitted").is_none());
    }

    #[test]
    fn a_cancelled_end_stays_as_it_is_at_the_commit() {
        let end = AuditEnd::of(Outcome::Cancelled, None, Some(CancelSource::Http));
        assert_eq!(end.cancelled_at_commit(), end);
    }
}
