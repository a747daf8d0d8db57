//! EvidenceGuard: the deterministic check of a Draft against the run's canonical records.
//!
//! Entry points: [`RunEvidence::resolve`] (every loaded record judged once against
//! CONTRACT §1), [`check_concluded`] (the full rule set for a Draft with a conclusion; all
//! violations, each with a [`Rule`]) and [`review_references`] (the no-conclusion path:
//! cited calls that are not usable are excluded, never errors).

use std::collections::BTreeMap;

use foldhash::HashSet;

use serde::Serialize;

use super::draft::{AnalysisKind, Draft};
use super::invocation::{resolve_call, CallRejection, EvidenceStatus, RawRecord, UsableCall};

labels! {
    /// Every rule EvidenceGuard enforces. The label is the metric label and the word
    /// operators see in the audit.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
    pub enum Rule {
        AnalysisIdBlank = "analysis_id_blank",
        AnalysisIdDuplicate = "analysis_id_duplicate",
        AnalysisKindUnsupported = "analysis_kind_unsupported",
        AnalysisTextBlank = "analysis_text_blank",
        AnalysisWithoutCalls = "analysis_without_calls",
        ReportTextBlank = "report_text_blank",
        ReferenceEmpty = "reference_empty",
        ReferenceUnknown = "reference_unknown",
        CallIdBlank = "call_id_blank",
        CallMissing = "call_missing",
        CallOtherRun = "call_other_run",
        ToolUnsupported = "tool_unsupported",
        CallNotReady = "call_not_ready",
        CallNoAgentResult = "call_no_agent_result",
        CallEvidenceError = "call_evidence_error",
        ProjectionInvalid = "projection_invalid",
        ProjectionToolMismatch = "projection_tool_mismatch",
        ProjectionCallIdMismatch = "projection_call_id_mismatch",
        ProjectionStatusMismatch = "projection_status_mismatch",
        EvidenceStatusInconsistent = "evidence_status_inconsistent",
        KindEvidenceMismatch = "kind_evidence_mismatch",
        RecordNotUtf8 = "record_not_utf8",
        RecordWrongType = "record_wrong_type",
        RecordTooLarge = "record_too_large",
        RecordOverBudget = "record_over_budget",
        CallsWrongType = "calls_wrong_type",
        /// The calls list takes more than `evidence.max_calls_list_bytes` in Redis: not read.
        CallsTooLarge = "calls_too_large",
        DraftNamesIdentifier = "draft_names_identifier",
        SourcesTooLarge = "sources_too_large",
        /// The Draft cites more than `evidence.max_cited_calls` distinct ids.
        TooManyCitedCalls = "too_many_cited_calls",
    }
}

/// One broken rule, for the audit record (operators may see call ids, never raw data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub rule: Rule,
    /// Where in the Draft: `conclusion`, `analyses[1]`, `action_plan[0]`, ...
    pub at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    pub detail: String,
}

/// What the store loaded for one run: its calls list and every record fetched for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunEvidence {
    pub run_id: String,
    /// `P:run:{RUN}:calls`, in the order the calls started.
    pub calls: Vec<String>,
    /// Records by call id (the calls list and every id the Draft cites); absent = no record.
    pub records: foldhash::HashMap<String, RawRecord>,
    /// Records the store found but could not read as fields (wrong Redis type, not UTF-8,
    /// over a size limit): each is an unusable call with its rule.
    pub unreadable: foldhash::HashMap<String, CallRejection>,
    /// The calls list itself is unusable (not a LIST): every call of the run is unusable.
    pub calls_unreadable: Option<CallRejection>,
    /// Bytes of record fields loaded so far (bounded by `evidence.max_release_bytes`).
    pub loaded_bytes: u64,
}

/// Every loaded record judged once: usable calls and rejections by call id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResolvedRun {
    pub run_id: String,
    pub calls: Vec<String>,
    pub usable: foldhash::HashMap<String, UsableCall>,
    pub rejected: foldhash::HashMap<String, CallRejection>,
}

impl RunEvidence {
    /// Judges the calls list and the cited ids; a cited id with no record is "missing".
    pub fn resolve(&self, cited: &[String]) -> ResolvedRun {
        self.resolve_reusing(cited, ResolvedRun::default())
    }

    /// [`RunEvidence::resolve`], taking each call that `before` (an earlier resolution of
    /// this evidence, e.g. of the Draft before its repair) already judged instead of
    /// parsing its record again. A call judged missing is looked up again: its record may
    /// have been loaded since.
    pub fn resolve_reusing(&self, cited: &[String], before: ResolvedRun) -> ResolvedRun {
        self.resolve_ids(self.calls.iter().chain(cited), before)
    }

    /// The cited ids judged alone: the calls list is kept (the run's identifiers are its
    /// ids), but no record of a call the Draft does not cite is parsed. That is all
    /// EvidenceGuard's checks of a concluded Draft and its verified snapshot read;
    /// [`RunEvidence::resolve_reusing`] completes it into [`RunEvidence::resolve`]'s
    /// answer, parsing only the calls left.
    pub fn resolve_cited(&self, cited: &[String]) -> ResolvedRun {
        self.resolve_ids(cited.iter(), ResolvedRun::default())
    }

    fn resolve_ids<'a>(
        &self,
        ids: impl Iterator<Item = &'a String>,
        mut before: ResolvedRun,
    ) -> ResolvedRun {
        let mut resolved = ResolvedRun {
            run_id: self.run_id.clone(),
            calls: self.calls.clone(),
            ..ResolvedRun::default()
        };
        for id in ids {
            if id.trim().is_empty()
                || resolved.usable.contains_key(id)
                || resolved.rejected.contains_key(id)
            {
                continue;
            }
            if let Some((id, call)) = before.usable.remove_entry(id) {
                resolved.usable.insert(id, call);
                continue;
            }
            if let Some((id, rejection)) = before.rejected.remove_entry(id) {
                if rejection.rule != Rule::CallMissing {
                    resolved.rejected.insert(id, rejection);
                    continue;
                }
            }
            let unreadable = self
                .calls_unreadable
                .as_ref()
                .or_else(|| self.unreadable.get(id));
            if let Some(rejection) = unreadable {
                resolved.rejected.insert(id.clone(), rejection.clone());
                continue;
            }
            match resolve_call(&self.run_id, id, self.records.get(id)) {
                Ok(call) => {
                    resolved.usable.insert(id.clone(), call);
                }
                Err(rejection) => {
                    resolved.rejected.insert(id.clone(), rejection);
                }
            }
        }
        resolved
    }
}

impl ResolvedRun {
    /// The usable call behind `id`, or why it is not usable.
    pub fn lookup(&self, id: &str) -> Result<&UsableCall, CallRejection> {
        if id.trim().is_empty() {
            return Err(CallRejection {
                rule: Rule::CallIdBlank,
                detail: "a tool call id is blank".into(),
            });
        }
        if let Some(call) = self.usable.get(id) {
            return Ok(call);
        }
        Err(self.rejected.get(id).cloned().unwrap_or(CallRejection {
            rule: Rule::CallMissing,
            detail: "no record under this run".into(),
        }))
    }

    /// The run's usable calls in call order (the ProgressSnapshot's raw material).
    pub fn usable_in_call_order(&self) -> Vec<&UsableCall> {
        let mut seen = HashSet::default();
        self.calls
            .iter()
            .filter(|id| seen.insert(id.as_str()))
            .filter_map(|id| self.usable.get(id))
            .collect()
    }
}

/// Whether an Analysis kind may cite a call with this evidence status.
pub fn kind_fits(kind: &AnalysisKind, status: EvidenceStatus) -> bool {
    matches!(
        (kind, status),
        (AnalysisKind::Normal, EvidenceStatus::EvidenceFound)
            | (
                AnalysisKind::NegativeObservation,
                EvidenceStatus::NoEvidence
            )
    )
}

/// The full rule set for a Draft with a conclusion. `Ok` means EvidenceGuard passes.
pub fn check_concluded(draft: &Draft, run: &ResolvedRun) -> Result<(), Vec<Violation>> {
    let mut violations = Vec::new();
    let mut push = |rule: Rule, at: String, call: Option<&str>, detail: String| {
        violations.push(Violation {
            rule,
            at,
            tool_call_id: call.map(str::to_string),
            detail,
        })
    };

    let mut id_counts: BTreeMap<&str, usize> = BTreeMap::new();
    for analysis in &draft.analyses {
        *id_counts.entry(analysis.id.as_str()).or_default() += 1;
    }
    for (i, analysis) in draft.analyses.iter().enumerate() {
        // Written only for a violation.
        let at = || format!("analyses[{i}]");
        if analysis.id.trim().is_empty() {
            push(
                Rule::AnalysisIdBlank,
                at(),
                None,
                "the analysis id is blank".into(),
            );
        } else if id_counts[analysis.id.as_str()] > 1 {
            push(
                Rule::AnalysisIdDuplicate,
                at(),
                None,
                format!("analysis id {:?} is used more than once", analysis.id),
            );
        }
        if let AnalysisKind::Unsupported(kind) = &analysis.kind {
            push(
                Rule::AnalysisKindUnsupported,
                at(),
                None,
                format!("kind {kind:?} is neither NORMAL nor NEGATIVE_OBSERVATION"),
            );
        }
        if analysis.text.trim().is_empty() {
            push(
                Rule::AnalysisTextBlank,
                at(),
                None,
                "the analysis text is blank".into(),
            );
        }
        if analysis.tool_call_ids.is_empty() {
            push(
                Rule::AnalysisWithoutCalls,
                at(),
                None,
                "the analysis cites no tool call".into(),
            );
        }
        for call_id in &analysis.tool_call_ids {
            match run.lookup(call_id) {
                Err(rejection) => push(rejection.rule, at(), Some(call_id), rejection.detail),
                Ok(call) => {
                    let unsupported_kind = matches!(analysis.kind, AnalysisKind::Unsupported(_));
                    if !unsupported_kind && !kind_fits(&analysis.kind, call.evidence_status) {
                        push(
                            Rule::KindEvidenceMismatch,
                            at(),
                            Some(call_id),
                            format!(
                                "a {} analysis cites a {} call",
                                analysis.kind.as_str(),
                                call.evidence_status.as_str()
                            ),
                        );
                    }
                }
            }
        }
    }

    let known: HashSet<&str> = draft
        .analyses
        .iter()
        .map(|a| a.id.as_str())
        .filter(|id| !id.trim().is_empty())
        .collect();
    // The section's path is written only for a violation.
    let conclusion = draft
        .conclusion
        .iter()
        .map(|c| (Section::Conclusion, &c.text, &c.analysis_refs));
    let plan = draft.action_plan.iter().enumerate();
    let plan = plan.map(|(i, item)| (Section::ActionPlan(i), &item.text, &item.analysis_refs));
    let recommendations = draft.recommendations.iter().enumerate();
    let recommendations = recommendations
        .map(|(i, item)| (Section::Recommendation(i), &item.text, &item.analysis_refs));
    for (section, text, refs) in conclusion.chain(plan).chain(recommendations) {
        if text.trim().is_empty() {
            push(
                Rule::ReportTextBlank,
                section.path(),
                None,
                "the text is blank".into(),
            );
        }
        if refs.is_empty() {
            push(
                Rule::ReferenceEmpty,
                section.path(),
                None,
                "it references no analysis".into(),
            );
        }
        for reference in refs {
            if !known.contains(reference.as_str()) {
                push(
                    Rule::ReferenceUnknown,
                    section.path(),
                    None,
                    format!("it references unknown analysis {reference:?}"),
                );
            }
        }
    }

    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
    }
}

/// A section of the report that references analyses.
#[derive(Clone, Copy)]
enum Section {
    Conclusion,
    ActionPlan(usize),
    Recommendation(usize),
}

impl Section {
    /// Its path in the Draft, as a violation names it (e.g. `action_plan[0]`).
    fn path(self) -> String {
        match self {
            Section::Conclusion => "conclusion".into(),
            Section::ActionPlan(i) => format!("action_plan[{i}]"),
            Section::Recommendation(i) => format!("recommendations[{i}]"),
        }
    }
}

/// A cited call that the no-conclusion path excluded, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExcludedReference {
    pub analysis: String,
    pub tool_call_id: String,
    pub rule: Rule,
    pub detail: String,
}

/// The no-conclusion path: no structure rules, but every cited call must be a usable
/// current-run call whose status fits the analysis kind; the others are excluded.
pub fn review_references(draft: &Draft, run: &ResolvedRun) -> Vec<ExcludedReference> {
    let mut excluded = Vec::new();
    for analysis in &draft.analyses {
        for call_id in &analysis.tool_call_ids {
            let problem = match run.lookup(call_id) {
                Err(rejection) => Some((rejection.rule, rejection.detail)),
                Ok(call) if !kind_fits(&analysis.kind, call.evidence_status) => Some((
                    Rule::KindEvidenceMismatch,
                    format!(
                        "a {} analysis cites a {} call",
                        analysis.kind.as_str(),
                        call.evidence_status.as_str()
                    ),
                )),
                Ok(_) => None,
            };
            if let Some((rule, detail)) = problem {
                excluded.push(ExcludedReference {
                    analysis: analysis.id.clone(),
                    tool_call_id: call_id.clone(),
                    rule,
                    detail,
                });
            }
        }
    }
    excluded
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::identifiers::RunIdentifiers;
    use crate::domain::invocation::tests::{log_found, mysql_none, rag_found, record};
    use crate::domain::scope::Scope;
    use serde_json::json;

    /// A run "r" with a found log call, a no-evidence mysql call and a found rag call.
    pub(crate) fn run_evidence() -> RunEvidence {
        let mut records = foldhash::HashMap::default();
        records.insert("c-log".to_string(), log_found("r", "c-log"));
        records.insert("c-sql".to_string(), mysql_none("r", "c-sql"));
        records.insert("c-rag".to_string(), rag_found("r", "c-rag"));
        RunEvidence {
            run_id: "r".into(),
            calls: vec!["c-log".into(), "c-sql".into(), "c-rag".into()],
            records,
            ..RunEvidence::default()
        }
    }

    #[test]
    fn a_resolution_reused_after_a_repair_is_the_resolution_from_scratch() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut evidence = run_evidence();
        // Cited by the original only: usable, rejected (another run's record), missing.
        evidence
            .records
            .insert("c-old".into(), log_found("r", "c-old"));
        evidence
            .records
            .insert("c-foreign".into(), log_found("other", "c-foreign"));
        let original = ids(&["c-log", "c-old", "c-foreign", "c-late", " "]);
        let before = evidence.resolve(&original);
        assert_eq!(before.rejected["c-late"].rule, Rule::CallMissing);
        let log_scope = before.usable["c-log"].scope().clone();
        // The repair's candidate cites others; "c-late" was written meanwhile and is
        // loaded with the candidate's records.
        evidence
            .records
            .insert("c-late".into(), log_found("r", "c-late"));
        let candidate = ids(&["c-log", "c-foreign", "c-late", "c-new"]);
        let reused = evidence.resolve_reusing(&candidate, before);
        assert_eq!(reused, evidence.resolve(&candidate));
        assert!(reused.usable.contains_key("c-late") && !reused.usable.contains_key("c-old"));
        // Taken over, not parsed again: the very scope of the first resolution.
        assert!(Scope::ptr_eq(reused.usable["c-log"].scope(), &log_scope));
    }

    /// [`run_evidence`] with a fourth call, "c-extra" (found logs), which
    /// [`good_draft`] does not cite.
    pub(crate) fn run_evidence_with_an_uncited_call() -> RunEvidence {
        let mut evidence = run_evidence();
        evidence.calls.push("c-extra".into());
        evidence
            .records
            .insert("c-extra".into(), log_found("r", "c-extra"));
        evidence
    }

    #[test]
    fn the_cited_calls_resolved_alone_complete_into_the_whole_resolution() {
        let evidence = run_evidence_with_an_uncited_call();
        let cited: Vec<String> = ["c-log", "c-ghost", " "].map(String::from).to_vec();
        let alone = evidence.resolve_cited(&cited);
        let mut judged: Vec<&str> = alone
            .usable
            .keys()
            .chain(alone.rejected.keys())
            .map(String::as_str)
            .collect();
        judged.sort_unstable();
        assert_eq!(
            judged,
            ["c-ghost", "c-log"],
            "no call the Draft does not cite"
        );
        assert_eq!(alone.calls, evidence.calls);
        // The run's identifiers are the same: the calls list's ids and the cited ones.
        let whole = evidence.resolve(&cited);
        let (few, all) = (
            RunIdentifiers::of_run(&alone, "aiops"),
            RunIdentifiers::of_run(&whole, "aiops"),
        );
        for id in ["c-log", "c-sql", "c-rag", "c-extra", "c-ghost", "c-other"] {
            assert_eq!(few.is_call_id(id), all.is_call_id(id), "{id}");
        }
        // Completed, it is the whole resolution, the cited calls taken over unparsed.
        let log_scope = alone.usable["c-log"].scope().clone();
        let completed = evidence.resolve_reusing(&cited, alone);
        assert_eq!(completed, whole);
        assert!(Scope::ptr_eq(completed.usable["c-log"].scope(), &log_scope));
    }

    pub(crate) fn good_draft() -> Draft {
        Draft::parse_submitted(
            &json!({
                "conclusion": {"text": "The orders-db pool is exhausted.", "analysis_refs": ["A1", "A2"]},
                "analyses": [
                    {"id": "A1", "kind": "NORMAL", "text": "132 timeout errors in order-api.", "tool_call_ids": ["c-log", "c-rag"]},
                    {"id": "A2", "kind": "NEGATIVE_OBSERVATION", "text": "No slow queries over 500 ms.", "tool_call_ids": ["c-sql"]}
                ],
                "action_plan": [{"text": "Raise the pool size.", "analysis_refs": ["A1"], "requires_human_confirmation": true}],
                "recommendations": [{"text": "Alert on pool saturation.", "analysis_refs": ["A1", "A2"]}],
                "limitations": ["Only 10:00-11:00 was searched."],
                "missing_context": []
            })
            .to_string(),
        )
        .unwrap()
    }

    fn rules(draft: &Draft, evidence: &RunEvidence) -> Vec<Rule> {
        let run = evidence.resolve(&draft.cited_call_ids());
        match check_concluded(draft, &run) {
            Ok(()) => vec![],
            Err(v) => v.into_iter().map(|v| v.rule).collect(),
        }
    }

    #[test]
    fn a_well_formed_draft_with_usable_calls_passes() {
        assert_eq!(rules(&good_draft(), &run_evidence()), vec![]);
    }

    #[test]
    fn blank_and_duplicate_analysis_ids_are_violations() {
        let mut draft = good_draft();
        draft.analyses[1].id = "A1".into();
        assert!(rules(&draft, &run_evidence()).contains(&Rule::AnalysisIdDuplicate));
        draft.analyses[1].id = "  ".into();
        let found = rules(&draft, &run_evidence());
        assert!(found.contains(&Rule::AnalysisIdBlank));
        assert!(
            found.contains(&Rule::ReferenceUnknown),
            "A2 no longer exists"
        );
    }

    #[test]
    fn unsupported_kind_blank_text_and_no_calls_are_violations() {
        let mut draft = good_draft();
        draft.analyses[0].kind = AnalysisKind::Unsupported("HYPOTHESIS".into());
        draft.analyses[1].text = " ".into();
        draft.analyses[1].tool_call_ids.clear();
        let found = rules(&draft, &run_evidence());
        assert_eq!(
            found,
            vec![
                Rule::AnalysisKindUnsupported,
                Rule::AnalysisTextBlank,
                Rule::AnalysisWithoutCalls
            ]
        );
    }

    #[test]
    fn empty_or_unknown_references_are_violations_in_every_section() {
        let mut draft = good_draft();
        draft.conclusion.as_mut().unwrap().analysis_refs.clear();
        draft.action_plan[0].analysis_refs = vec!["A9".into()];
        draft.recommendations[0].analysis_refs = vec!["".into()];
        let run = run_evidence().resolve(&draft.cited_call_ids());
        let violations = check_concluded(&draft, &run).unwrap_err();
        let got: Vec<_> = violations.iter().map(|v| (v.rule, v.at.as_str())).collect();
        assert_eq!(
            got,
            vec![
                (Rule::ReferenceEmpty, "conclusion"),
                (Rule::ReferenceUnknown, "action_plan[0]"),
                (Rule::ReferenceUnknown, "recommendations[0]"),
            ]
        );
    }

    #[test]
    fn reference_lists_left_out_parse_empty_and_are_violations() {
        let draft = Draft::parse_submitted(
            &json!({
                "conclusion": {"text": "Pool exhausted."},
                "analyses": [{"id": "A1", "kind": "NORMAL", "text": "Errors."}],
                "action_plan": [{"text": "Raise the pool."}]
            })
            .to_string(),
        )
        .unwrap();
        assert_eq!(
            rules(&draft, &run_evidence()),
            vec![
                Rule::AnalysisWithoutCalls,
                Rule::ReferenceEmpty,
                Rule::ReferenceEmpty
            ]
        );
    }

    #[test]
    fn blank_report_text_is_a_violation() {
        let mut draft = good_draft();
        draft.recommendations[0].text = "".into();
        assert_eq!(rules(&draft, &run_evidence()), vec![Rule::ReportTextBlank]);
    }

    #[test]
    fn fabricated_blank_and_cross_run_calls_are_violations() {
        let mut evidence = run_evidence();
        evidence
            .records
            .insert("c-x".into(), log_found("other-run", "c-x"));
        let mut draft = good_draft();
        draft.analyses[0].tool_call_ids = vec!["c-ghost".into(), "c-x".into(), "".into()];
        assert_eq!(
            rules(&draft, &evidence),
            vec![Rule::CallMissing, Rule::CallOtherRun, Rule::CallIdBlank]
        );
    }

    #[test]
    fn kind_must_match_evidence_status() {
        let mut draft = good_draft();
        draft.analyses[0].tool_call_ids = vec!["c-sql".into()];
        draft.analyses[1].tool_call_ids = vec!["c-log".into()];
        assert_eq!(
            rules(&draft, &run_evidence()),
            vec![Rule::KindEvidenceMismatch, Rule::KindEvidenceMismatch]
        );
    }

    #[test]
    fn every_violation_is_reported_not_just_the_first() {
        let mut draft = good_draft();
        draft.analyses[0].id = "".into();
        draft.analyses[1].tool_call_ids = vec!["missing".into()];
        draft.action_plan[0].analysis_refs.clear();
        let found = rules(&draft, &run_evidence());
        assert!(found.len() >= 4, "{found:?}");
    }

    #[test]
    fn usable_calls_keep_call_order_and_skip_unusable() {
        let mut evidence = run_evidence();
        let mut projecting = record("r", "c-p", "log_search", "NO_EVIDENCE", json!({}));
        projecting.insert("lifecycle", "PROJECTING");
        evidence.records.insert("c-p".into(), projecting);
        evidence.calls.insert(1, "c-p".into());
        evidence.calls.push("c-log".into());
        let run = evidence.resolve(&[]);
        let order: Vec<_> = run
            .usable_in_call_order()
            .iter()
            .map(|c| c.tool_call_id.as_str())
            .collect();
        assert_eq!(order, vec!["c-log", "c-sql", "c-rag"]);
        assert_eq!(run.rejected["c-p"].rule, Rule::CallNotReady);
    }

    #[test]
    fn rule_names_are_unique_snake_case() {
        let names: HashSet<_> = Rule::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Rule::ALL.len());
        for rule in Rule::ALL {
            assert_eq!(serde_json::to_value(rule).unwrap(), rule.as_str());
        }
    }
}
