//! The release decision (ARCHITECTURE's table) and the release result (CONTRACT §3).
//!
//! Entry points: [`begin`] decides what a release does first (a deterministic result, a
//! repair, or a semantic review), [`after_repair`] and [`after_judgement`] finish the
//! concluded path. Each records what it decided in the [`Audit`]. Results are built only
//! through the constructors of [`ReleaseResult`], so a fallback can never carry a Draft.

use serde::{Deserialize, Serialize};

use super::audit::{Audit, ReleasePath, RepairAudit, VerdictAudit};
use super::draft::{Draft, DraftParseError, UserVisibleDraft};
use super::evidence_guard::{check_concluded, review_references, RunEvidence, Violation};
use super::repair_check;
use super::snapshot::{
    ObservedFact, ProgressSnapshot, SnapshotLimits, VerifiedSnapshot, VerifiedSource,
};

/// Why the agent stopped (`stop_reason` of the API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StopReason {
    /// The agent wrote a final Draft.
    #[default]
    FinalAnswer,
    /// Controlled stop: more tool calls would not add information.
    InformationSaturation,
    /// Controlled stop: the agent's own budget ran out.
    BudgetExhausted,
}

impl StopReason {
    pub fn parse(raw: &str) -> Option<StopReason> {
        match raw {
            "FINAL_ANSWER" => Some(StopReason::FinalAnswer),
            "INFORMATION_SATURATION" => Some(StopReason::InformationSaturation),
            "BUDGET_EXHAUSTED" => Some(StopReason::BudgetExhausted),
            _ => None,
        }
    }

    pub fn is_controlled_stop(self) -> bool {
        !matches!(self, StopReason::FinalAnswer)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Success,
    Fallback,
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "SUCCESS",
            Outcome::Fallback => "FALLBACK",
            Outcome::Cancelled => "CANCELLED",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FallbackType {
    EvidenceValidationFailed,
    SemanticUnsupported,
    SemanticUnavailable,
    MissingRequiredContext,
    InsufficientEvidence,
}

impl FallbackType {
    pub const ALL: [FallbackType; 5] = [
        FallbackType::EvidenceValidationFailed,
        FallbackType::SemanticUnsupported,
        FallbackType::SemanticUnavailable,
        FallbackType::MissingRequiredContext,
        FallbackType::InsufficientEvidence,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FallbackType::EvidenceValidationFailed => "EVIDENCE_VALIDATION_FAILED",
            FallbackType::SemanticUnsupported => "SEMANTIC_UNSUPPORTED",
            FallbackType::SemanticUnavailable => "SEMANTIC_UNAVAILABLE",
            FallbackType::MissingRequiredContext => "MISSING_REQUIRED_CONTEXT",
            FallbackType::InsufficientEvidence => "INSUFFICIENT_EVIDENCE",
        }
    }

    /// The fixed SafeFallback text shown to people. It names no data of the run.
    pub fn message(self) -> &'static str {
        match self {
            FallbackType::EvidenceValidationFailed => {
                "The diagnosis was withheld because the evidence it cites could not be verified. \
                 No conclusion is shown; review the investigation or run it again."
            }
            FallbackType::SemanticUnsupported => {
                "The diagnosis was withheld because a review found that the verified evidence does \
                 not support it. The verified sources that were reviewed are listed."
            }
            FallbackType::SemanticUnavailable => {
                "The diagnosis was withheld because its review could not be completed. The verified \
                 sources are listed; try again later or review them yourself."
            }
            FallbackType::MissingRequiredContext => {
                "The investigation could not start because required context is missing. Provide \
                 the information listed and ask again."
            }
            FallbackType::InsufficientEvidence => {
                "The investigation ended without enough evidence for a conclusion. The checks that \
                 were completed are listed as observed facts."
            }
        }
    }
}

/// The release result: always exactly these eight keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseResult {
    pub run_id: String,
    pub outcome: Outcome,
    pub fallback_type: Option<FallbackType>,
    pub message: Option<String>,
    pub report: Option<UserVisibleDraft>,
    pub verified_sources: Vec<VerifiedSource>,
    pub observed_facts: Vec<ObservedFact>,
    pub missing_context: Vec<String>,
}

impl ReleaseResult {
    fn fallback(run_id: &str, kind: FallbackType) -> ReleaseResult {
        ReleaseResult {
            run_id: run_id.to_string(),
            outcome: Outcome::Fallback,
            fallback_type: Some(kind),
            message: Some(kind.message().to_string()),
            report: None,
            verified_sources: Vec::new(),
            observed_facts: Vec::new(),
            missing_context: Vec::new(),
        }
    }

    /// SUCCESS: the verified Draft, unchanged, without tool call ids.
    pub fn success(run_id: &str, draft: &Draft, snapshot: &VerifiedSnapshot) -> ReleaseResult {
        ReleaseResult {
            run_id: run_id.to_string(),
            outcome: Outcome::Success,
            fallback_type: None,
            message: None,
            report: Some(draft.user_visible()),
            verified_sources: snapshot.verified_sources(),
            observed_facts: Vec::new(),
            missing_context: Vec::new(),
        }
    }

    pub fn evidence_validation_failed(run_id: &str) -> ReleaseResult {
        ReleaseResult::fallback(run_id, FallbackType::EvidenceValidationFailed)
    }

    pub fn semantic_unsupported(run_id: &str, snapshot: &VerifiedSnapshot) -> ReleaseResult {
        ReleaseResult {
            verified_sources: snapshot.verified_sources(),
            ..ReleaseResult::fallback(run_id, FallbackType::SemanticUnsupported)
        }
    }

    pub fn semantic_unavailable(run_id: &str, snapshot: &VerifiedSnapshot) -> ReleaseResult {
        ReleaseResult {
            verified_sources: snapshot.verified_sources(),
            ..ReleaseResult::fallback(run_id, FallbackType::SemanticUnavailable)
        }
    }

    pub fn missing_required_context(run_id: &str, missing: &[String]) -> ReleaseResult {
        ReleaseResult {
            missing_context: missing.to_vec(),
            ..ReleaseResult::fallback(run_id, FallbackType::MissingRequiredContext)
        }
    }

    pub fn insufficient_evidence(run_id: &str, progress: ProgressSnapshot) -> ReleaseResult {
        ReleaseResult {
            observed_facts: progress.facts,
            verified_sources: progress.verified_sources,
            ..ReleaseResult::fallback(run_id, FallbackType::InsufficientEvidence)
        }
    }

    pub fn cancelled(run_id: &str) -> ReleaseResult {
        ReleaseResult {
            run_id: run_id.to_string(),
            outcome: Outcome::Cancelled,
            fallback_type: None,
            message: None,
            report: None,
            verified_sources: Vec::new(),
            observed_facts: Vec::new(),
            missing_context: Vec::new(),
        }
    }
}

/// Bounds the release decision needs (from configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleasePolicy {
    pub snapshot: SnapshotLimits,
    pub max_facts: usize,
}

/// The Draft as submitted: absent (controlled stop), parsed, or unparseable.
#[derive(Debug, Clone, PartialEq)]
pub enum DraftInput {
    Absent,
    Parsed(Draft),
    Unparseable(DraftParseError),
}

/// A concluded Draft that passed EvidenceGuard, with its verified snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgeable {
    pub draft: Draft,
    pub snapshot: VerifiedSnapshot,
}

/// What a release does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A deterministic result; no (further) model call.
    Finish(ReleaseResult),
    /// EvidenceGuard failed a concluded Draft for the first time: one repair may run.
    Repair {
        draft: Draft,
        violations: Vec<Violation>,
    },
    /// EvidenceGuard passed: SemanticGuard reviews the Draft against the snapshot.
    Judge(Box<Judgeable>),
}

/// The first decision of a release. `evidence` holds the calls list and the records of
/// every call the Draft cites.
pub fn begin(
    stop: StopReason,
    draft: DraftInput,
    evidence: &RunEvidence,
    policy: &ReleasePolicy,
    audit: &mut Audit,
) -> Step {
    let run_id = evidence.run_id.as_str();
    let progress = |run: &super::evidence_guard::ResolvedRun| {
        ReleaseResult::insufficient_evidence(run_id, ProgressSnapshot::build(run, policy.max_facts))
    };
    if stop.is_controlled_stop() {
        audit.path = Some(ReleasePath::ControlledStop);
        return Step::Finish(progress(&evidence.resolve(&[])));
    }
    let draft = match draft {
        DraftInput::Parsed(d) => d,
        DraftInput::Absent => {
            audit.path = Some(ReleasePath::DraftUnparseable);
            audit.draft_error = Some("no draft was given".into());
            return Step::Finish(progress(&evidence.resolve(&[])));
        }
        DraftInput::Unparseable(e) => {
            audit.path = Some(ReleasePath::DraftUnparseable);
            audit.draft_error = Some(e.to_string());
            return Step::Finish(progress(&evidence.resolve(&[])));
        }
    };
    let cited = draft.cited_call_ids();
    let run = evidence.resolve(&cited);
    if draft.conclusion.is_none() {
        if !draft.missing_context.is_empty()
            && draft.analyses.iter().all(|a| a.tool_call_ids.is_empty())
            && evidence.calls.is_empty()
        {
            audit.path = Some(ReleasePath::MissingContext);
            return Step::Finish(ReleaseResult::missing_required_context(
                run_id,
                &draft.missing_context,
            ));
        }
        audit.path = Some(ReleasePath::NoConclusion);
        audit.excluded_references = review_references(&draft, &run);
        return Step::Finish(progress(&run));
    }
    audit.path = Some(ReleasePath::Concluded);
    match check_concluded(&draft, &run) {
        Ok(()) => Step::Judge(Box::new(Judgeable {
            snapshot: VerifiedSnapshot::build(&draft, &run, &policy.snapshot),
            draft,
        })),
        Err(violations) => {
            audit.violations = violations.clone();
            Step::Repair { draft, violations }
        }
    }
}

/// Why no usable repair candidate came back (timeout, budget, not a strict Draft, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairFailure(pub String);

/// Finishes the repair: the candidate must change only ids/references and then pass
/// EvidenceGuard, or the release ends EVIDENCE_VALIDATION_FAILED.
pub fn after_repair(
    original: &Draft,
    candidate: Result<Draft, RepairFailure>,
    evidence: &RunEvidence,
    policy: &ReleasePolicy,
    audit: &mut Audit,
) -> Step {
    let run_id = evidence.run_id.as_str();
    let candidate = match candidate {
        Ok(c) => c,
        Err(RepairFailure(reason)) => {
            audit.repair = Some(RepairAudit::rejected(reason, Vec::new()));
            return Step::Finish(ReleaseResult::evidence_validation_failed(run_id));
        }
    };
    if let Err(change) = repair_check::compare(original, &candidate) {
        audit.repair = Some(RepairAudit::rejected(
            format!("the repair changed the report: {change}"),
            Vec::new(),
        ));
        return Step::Finish(ReleaseResult::evidence_validation_failed(run_id));
    }
    let run = evidence.resolve(&candidate.cited_call_ids());
    match check_concluded(&candidate, &run) {
        Ok(()) => {
            audit.repair = Some(RepairAudit::accepted());
            Step::Judge(Box::new(Judgeable {
                snapshot: VerifiedSnapshot::build(&candidate, &run, &policy.snapshot),
                draft: candidate,
            }))
        }
        Err(violations) => {
            audit.repair = Some(RepairAudit::rejected(
                "the repaired draft still fails EvidenceGuard".into(),
                violations,
            ));
            Step::Finish(ReleaseResult::evidence_validation_failed(run_id))
        }
    }
}

/// What SemanticGuard concluded, after all permitted attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    Supported {
        reason: String,
    },
    Unsupported {
        reason: String,
    },
    /// Every permitted attempt failed technically, or a limit or budget denied the call.
    Unavailable,
}

/// The release result of a reviewed Draft.
pub fn after_judgement(
    run_id: &str,
    judgement: Judgement,
    judged: &Judgeable,
    audit: &mut Audit,
) -> ReleaseResult {
    match judgement {
        Judgement::Supported { reason } => {
            audit.verdict = Some(VerdictAudit::supported(reason));
            ReleaseResult::success(run_id, &judged.draft, &judged.snapshot)
        }
        Judgement::Unsupported { reason } => {
            audit.verdict = Some(VerdictAudit::unsupported(reason));
            ReleaseResult::semantic_unsupported(run_id, &judged.snapshot)
        }
        Judgement::Unavailable => ReleaseResult::semantic_unavailable(run_id, &judged.snapshot),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::evidence_guard::tests::{good_draft, run_evidence};
    use crate::domain::evidence_guard::Rule;
    use crate::domain::invocation::tests::{log_found, mysql_none};
    use serde_json::json;

    fn policy() -> ReleasePolicy {
        ReleasePolicy {
            snapshot: SnapshotLimits::default(),
            max_facts: 20,
        }
    }

    fn start(stop: StopReason, draft: DraftInput, evidence: &RunEvidence) -> (Step, Audit) {
        let mut audit = Audit::new(&evidence.run_id, stop);
        let step = begin(stop, draft, evidence, &policy(), &mut audit);
        (step, audit)
    }

    fn finished(step: Step) -> ReleaseResult {
        match step {
            Step::Finish(r) => r,
            other => panic!("expected a deterministic result, got {other:?}"),
        }
    }

    fn parsed(value: serde_json::Value) -> DraftInput {
        DraftInput::Parsed(Draft::parse_submitted(&value.to_string()).unwrap())
    }

    #[test]
    fn result_always_has_exactly_eight_keys() {
        let snap = VerifiedSnapshot { analyses: vec![] };
        for result in [
            ReleaseResult::success("r", &good_draft(), &snap),
            ReleaseResult::evidence_validation_failed("r"),
            ReleaseResult::semantic_unsupported("r", &snap),
            ReleaseResult::semantic_unavailable("r", &snap),
            ReleaseResult::missing_required_context("r", &["x".into()]),
            ReleaseResult::cancelled("r"),
        ] {
            let value = serde_json::to_value(&result).unwrap();
            let keys: Vec<_> = value.as_object().unwrap().keys().cloned().collect();
            assert_eq!(
                keys,
                [
                    "run_id",
                    "outcome",
                    "fallback_type",
                    "message",
                    "report",
                    "verified_sources",
                    "observed_facts",
                    "missing_context"
                ]
            );
        }
    }

    #[test]
    fn fallback_messages_are_fixed_and_distinct() {
        let texts: std::collections::HashSet<_> =
            FallbackType::ALL.iter().map(|t| t.message()).collect();
        assert_eq!(texts.len(), 5);
        let r = ReleaseResult::evidence_validation_failed("r");
        assert_eq!(
            r.message.as_deref(),
            Some(FallbackType::EvidenceValidationFailed.message())
        );
        assert!(r.report.is_none() && r.verified_sources.is_empty());
    }

    #[test]
    fn a_passing_concluded_draft_goes_to_semantic_review() {
        let (step, audit) = start(
            StopReason::FinalAnswer,
            DraftInput::Parsed(good_draft()),
            &run_evidence(),
        );
        assert!(matches!(step, Step::Judge(_)));
        assert!(audit.violations.is_empty());
    }

    #[test]
    fn a_failing_concluded_draft_goes_to_repair_with_its_violations() {
        let mut draft = good_draft();
        draft.analyses[0].tool_call_ids = vec!["c-ghost".into()];
        let (step, audit) = start(
            StopReason::FinalAnswer,
            DraftInput::Parsed(draft),
            &run_evidence(),
        );
        match step {
            Step::Repair { violations, .. } => assert_eq!(violations[0].rule, Rule::CallMissing),
            other => panic!("{other:?}"),
        }
        assert_eq!(audit.violations.len(), 1);
    }

    #[test]
    fn controlled_stop_releases_progress_without_the_draft() {
        for stop in [
            StopReason::InformationSaturation,
            StopReason::BudgetExhausted,
        ] {
            let (step, _) = start(stop, DraftInput::Parsed(good_draft()), &run_evidence());
            let result = finished(step);
            assert_eq!(
                result.fallback_type,
                Some(FallbackType::InsufficientEvidence)
            );
            assert_eq!(result.observed_facts.len(), 3);
            assert!(result.report.is_none());
        }
    }

    #[test]
    fn an_unparseable_draft_publishes_only_the_progress_snapshot() {
        let err = Draft::parse_text("The pool is exhausted, trust me. call c-ghost").unwrap_err();
        let (step, audit) = start(
            StopReason::FinalAnswer,
            DraftInput::Unparseable(err),
            &run_evidence(),
        );
        let result = finished(step);
        assert_eq!(
            result.fallback_type,
            Some(FallbackType::InsufficientEvidence)
        );
        let text = serde_json::to_string(&result).unwrap();
        assert!(!text.contains("trust me") && !text.contains("c-ghost"));
        assert_eq!(result.observed_facts.len(), 3);
        assert!(audit.draft_error.is_some());
    }

    #[test]
    fn missing_context_needs_no_calls_anywhere() {
        let draft =
            json!({"conclusion": null, "analyses": [], "missing_context": ["Which cluster?"]});
        let empty = RunEvidence {
            run_id: "r".into(),
            ..RunEvidence::default()
        };
        let result = finished(start(StopReason::FinalAnswer, parsed(draft.clone()), &empty).0);
        assert_eq!(
            result.fallback_type,
            Some(FallbackType::MissingRequiredContext)
        );
        assert_eq!(result.missing_context, vec!["Which cluster?"]);
        // the run made calls: insufficient evidence instead
        let result = finished(start(StopReason::FinalAnswer, parsed(draft), &run_evidence()).0);
        assert_eq!(
            result.fallback_type,
            Some(FallbackType::InsufficientEvidence)
        );
        assert!(result.missing_context.is_empty());
    }

    #[test]
    fn no_conclusion_with_nothing_is_insufficient_evidence_with_no_facts() {
        let empty = RunEvidence {
            run_id: "r".into(),
            ..RunEvidence::default()
        };
        let draft = json!({"conclusion": null, "analyses": []});
        let result = finished(start(StopReason::FinalAnswer, parsed(draft), &empty).0);
        assert_eq!(
            result.fallback_type,
            Some(FallbackType::InsufficientEvidence)
        );
        assert!(result.observed_facts.is_empty() && result.verified_sources.is_empty());
    }

    #[test]
    fn repair_that_changes_text_is_rejected() {
        let original = good_draft();
        let mut candidate = original.clone();
        candidate.conclusion.as_mut().unwrap().text = "Something else".into();
        let mut audit = Audit::new("r", StopReason::FinalAnswer);
        let step = after_repair(
            &original,
            Ok(candidate),
            &run_evidence(),
            &policy(),
            &mut audit,
        );
        assert_eq!(
            finished(step).fallback_type,
            Some(FallbackType::EvidenceValidationFailed)
        );
        assert!(!audit.repair.unwrap().accepted);
    }

    #[test]
    fn repair_that_fixes_ids_proceeds_to_review() {
        let mut original = good_draft();
        original.analyses[0].tool_call_ids = vec!["c-lg".into()];
        let mut audit = Audit::new("r", StopReason::FinalAnswer);
        let step = after_repair(
            &original,
            Ok(good_draft()),
            &run_evidence(),
            &policy(),
            &mut audit,
        );
        assert!(matches!(step, Step::Judge(_)));
        assert!(audit.repair.unwrap().accepted);
    }

    #[test]
    fn second_guard_failure_is_evidence_validation_failed_with_no_sources() {
        let mut original = good_draft();
        original.analyses[0].tool_call_ids = vec!["c-lg".into()];
        let mut evidence = run_evidence();
        evidence
            .records
            .insert("c-log".into(), mysql_none("r", "c-log"));
        let mut audit = Audit::new("r", StopReason::FinalAnswer);
        let step = after_repair(
            &original,
            Ok(good_draft()),
            &evidence,
            &policy(),
            &mut audit,
        );
        let result = finished(step);
        assert_eq!(
            result.fallback_type,
            Some(FallbackType::EvidenceValidationFailed)
        );
        assert!(result.verified_sources.is_empty());
        assert_eq!(
            audit.repair.unwrap().violations_after[0].rule,
            Rule::KindEvidenceMismatch
        );
        let _ = log_found("r", "x");
    }

    #[test]
    fn judgements_map_to_outcomes() {
        let judged = Judgeable {
            snapshot: VerifiedSnapshot::build(
                &good_draft(),
                &run_evidence().resolve(&good_draft().cited_call_ids()),
                &SnapshotLimits::default(),
            ),
            draft: good_draft(),
        };
        let mut audit = Audit::new("r", StopReason::FinalAnswer);
        let ok = after_judgement(
            "r",
            Judgement::Supported {
                reason: "fits".into(),
            },
            &judged,
            &mut audit,
        );
        assert_eq!(ok.outcome, Outcome::Success);
        assert_eq!(ok.report, Some(good_draft().user_visible()));
        let no = after_judgement(
            "r",
            Judgement::Unsupported {
                reason: "SECRET-REASON".into(),
            },
            &judged,
            &mut audit,
        );
        assert_eq!(no.fallback_type, Some(FallbackType::SemanticUnsupported));
        assert!(!serde_json::to_string(&no)
            .unwrap()
            .contains("SECRET-REASON"));
        assert_eq!(no.verified_sources.len(), 3);
        let down = after_judgement("r", Judgement::Unavailable, &judged, &mut audit);
        assert_eq!(down.fallback_type, Some(FallbackType::SemanticUnavailable));
        assert!(down.report.is_none());
    }
}
