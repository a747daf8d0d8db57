//! The release decision (ARCHITECTURE's table) and the release result (CONTRACT §3).
//!
//! Entry points: [`begin`] decides what a release does first (a deterministic result, a
//! repair, or a semantic review), [`after_repair`] and [`after_judgement`] finish the
//! concluded path. Each records what it decided in the [`Audit`]. Results are built only
//! through the constructors of [`ReleaseResult`], so a fallback can never carry a Draft.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::audit::{Audit, ReleasePath, RepairAudit, VerdictAudit};
use super::bounded::{CopyLimits, Redactor};
use super::draft::{Draft, DraftParseError, UserVisibleDraft};
use super::evidence_guard::{
    check_concluded, review_references, ResolvedRun, Rule, RunEvidence, Violation,
};
use super::identifiers::{draft_names_identifier, RunIdentifiers};
pub use super::outcome::{FallbackType, Outcome, StopReason};
use super::repair_check;
use super::snapshot::{
    ObservedFact, ProgressSnapshot, SnapshotLimits, VerifiedSnapshot, VerifiedSource,
};

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
        ReleaseResult::success_of(run_id, draft.user_visible(), snapshot)
    }

    /// [`ReleaseResult::success`] with the report already taken from its Draft.
    fn success_of(
        run_id: &str,
        report: UserVisibleDraft,
        snapshot: &VerifiedSnapshot,
    ) -> ReleaseResult {
        ReleaseResult {
            run_id: run_id.to_string(),
            outcome: Outcome::Success,
            fallback_type: None,
            message: None,
            report: Some(report),
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasePolicy {
    pub snapshot: SnapshotLimits,
    pub max_facts: usize,
    /// Bounds of every string and scope copied from records (`evidence.*`).
    pub copy: CopyLimits,
    /// `redis.key_prefix`: text naming a key of this prefix is masked in copies and breaks
    /// EvidenceGuard in a Draft.
    pub key_prefix: String,
    /// `evidence.max_cited_calls`: distinct call ids one Draft may cite.
    pub max_cited_calls: usize,
}

impl ReleasePolicy {
    /// The defaults of `config/default.toml` (tests and benches).
    pub fn defaults() -> ReleasePolicy {
        ReleasePolicy {
            snapshot: SnapshotLimits::default(),
            max_facts: 20,
            copy: CopyLimits::default(),
            key_prefix: "aiops".into(),
            max_cited_calls: 64,
        }
    }
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
        /// The run as EvidenceGuard judged it for this Draft: the repair's check takes
        /// these calls from it rather than parsing their records again.
        run: Box<ResolvedRun>,
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
    if stop.is_controlled_stop() {
        audit.path = Some(ReleasePath::ControlledStop);
        return Step::Finish(insufficient_evidence(&evidence.resolve(&[]), policy, audit));
    }
    let draft = match draft {
        DraftInput::Parsed(d) => d,
        DraftInput::Absent => {
            audit.path = Some(ReleasePath::DraftUnparseable);
            audit.draft_error = Some("no draft was given".into());
            return Step::Finish(insufficient_evidence(&evidence.resolve(&[]), policy, audit));
        }
        DraftInput::Unparseable(e) => {
            audit.path = Some(ReleasePath::DraftUnparseable);
            audit.draft_error = Some(e.to_string());
            return Step::Finish(insufficient_evidence(&evidence.resolve(&[]), policy, audit));
        }
    };
    let cited = draft.cited_call_ids();
    if let Some(too_many) = too_many_cited_calls(cited.len(), policy) {
        // None of these ids was read (the release sends none of them to the store), and a
        // repair would have to rewrite the citations whole: no repair, no judge.
        audit.path = Some(ReleasePath::Concluded);
        audit.violations = vec![too_many];
        audit.repair = Some(RepairAudit::not_run(
            "the draft cites more calls than evidence.max_cited_calls".into(),
        ));
        return Step::Finish(ReleaseResult::evidence_validation_failed(run_id));
    }
    if draft.conclusion.is_none() {
        let run = evidence.resolve(&cited);
        let ids = RunIdentifiers::of_run(&run, &policy.key_prefix);
        if !draft.missing_context.is_empty()
            && draft.analyses.iter().all(|a| a.tool_call_ids.is_empty())
            && evidence.calls.is_empty()
        {
            audit.path = Some(ReleasePath::MissingContext);
            // The run has no call, but the text may still name one of its Redis keys.
            let missing: Vec<String> = draft.missing_context.iter().map(|m| ids.mask(m)).collect();
            return Step::Finish(ReleaseResult::missing_required_context(run_id, &missing));
        }
        audit.path = Some(ReleasePath::NoConclusion);
        audit.excluded_references = review_references(&draft, &run);
        return Step::Finish(insufficient_evidence_masking(&run, &ids, policy, audit));
    }
    audit.path = Some(ReleasePath::Concluded);
    // The checks and the snapshot read the cited calls alone: the other calls' records
    // are parsed only if a repair needs the run's usable calls. The identifiers are the
    // same either way (the calls list's ids and the cited ones).
    let run = evidence.resolve_cited(&cited);
    let ids = RunIdentifiers::of_run(&run, &policy.key_prefix);
    let checked = check_concluded(&draft, &run);
    let named = draft_names_identifier(&draft, &ids);
    if !named.is_empty() {
        // A repair may not change text, so it could not remove the identifier: no repair
        // call, and the judge never sees the text.
        let mut violations = checked.err().unwrap_or_default();
        violations.extend(named);
        audit.violations = violations;
        audit.repair = Some(RepairAudit::not_run(
            "the draft's text names a tool call id or Redis key of this run, and a repair may not change text".into(),
        ));
        return Step::Finish(ReleaseResult::evidence_validation_failed(run_id));
    }
    match checked {
        Ok(()) => match judgeable(draft, &run, &ids, policy) {
            Ok(judged) => Step::Judge(Box::new(judged)),
            Err(too_large) => {
                audit.violations = vec![too_large];
                audit.repair = Some(RepairAudit::not_run(
                    "the verified sources are over evidence.max_written_bytes, which a repair cannot change".into(),
                ));
                Step::Finish(ReleaseResult::evidence_validation_failed(run_id))
            }
        },
        Err(violations) => {
            audit.violations = violations.clone();
            Step::Repair {
                draft,
                violations,
                run: Box::new(evidence.resolve_reusing(&cited, run)),
            }
        }
    }
}

/// EvidenceGuard rule `too_many_cited_calls`: a Draft cites at most
/// `evidence.max_cited_calls` distinct ids. Checked on the Draft alone, before any of its ids
/// is sent to the store ([`cites_too_many`]).
fn too_many_cited_calls(cited: usize, policy: &ReleasePolicy) -> Option<Violation> {
    (cited > policy.max_cited_calls).then(|| Violation {
        rule: Rule::TooManyCitedCalls,
        at: "analyses".into(),
        tool_call_id: None,
        detail: format!(
            "the draft cites {cited} distinct calls, over evidence.max_cited_calls ({})",
            policy.max_cited_calls
        ),
    })
}

/// Whether a Draft citing `cited` distinct ids breaks `too_many_cited_calls`: its ids are
/// then not read from the store at all.
pub fn cites_too_many(cited: usize, max_cited_calls: usize) -> bool {
    cited > max_cited_calls
}

/// INSUFFICIENT_EVIDENCE with the ProgressSnapshot of `run`.
fn insufficient_evidence(
    run: &ResolvedRun,
    policy: &ReleasePolicy,
    audit: &mut Audit,
) -> ReleaseResult {
    let ids = RunIdentifiers::of_run(run, &policy.key_prefix);
    insufficient_evidence_masking(run, &ids, policy, audit)
}

/// [`insufficient_evidence`], masking the identifiers `ids` (those of `run`).
fn insufficient_evidence_masking(
    run: &ResolvedRun,
    ids: &RunIdentifiers,
    policy: &ReleasePolicy,
    audit: &mut Audit,
) -> ReleaseResult {
    let progress = ProgressSnapshot::build(run, policy.max_facts, &Redactor::new(ids, policy.copy));
    audit.facts_dropped = progress.facts_dropped;
    ReleaseResult::insufficient_evidence(&run.run_id, progress)
}

/// A Draft that passed EvidenceGuard with its verified snapshot, or the `sources_too_large`
/// violation when the result's `verified_sources` would be over `evidence.max_written_bytes`
/// (the release then fails closed before the judge).
fn judgeable(
    draft: Draft,
    run: &ResolvedRun,
    ids: &RunIdentifiers,
    policy: &ReleasePolicy,
) -> Result<Judgeable, Violation> {
    let redact = Redactor::new(ids, policy.copy);
    let snapshot = VerifiedSnapshot::build(&draft, run, &policy.snapshot, &redact);
    let max = policy.copy.max_written_bytes;
    match snapshot.verified_sources_fit(max) {
        Ok(()) => Ok(Judgeable { draft, snapshot }),
        Err(size) => Err(Violation {
            rule: Rule::SourcesTooLarge,
            at: "verified_sources".into(),
            tool_call_id: None,
            detail: format!(
                "the verified sources take over {max} bytes of JSON (evidence.max_written_bytes): {size} bytes before the count stopped"
            ),
        }),
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
    after_repair_reusing(
        original,
        candidate,
        evidence,
        ResolvedRun::default(),
        policy,
        audit,
    )
}

/// [`after_repair`], taking the calls that `before` (the run as [`begin`] judged it, in
/// [`Step::Repair`]) already judged rather than parsing their records again.
pub fn after_repair_reusing(
    original: &Draft,
    candidate: Result<Draft, RepairFailure>,
    evidence: &RunEvidence,
    before: ResolvedRun,
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
    let cited = candidate.cited_call_ids();
    if let Some(too_many) = too_many_cited_calls(cited.len(), policy) {
        audit.repair = Some(RepairAudit::rejected(
            "the repaired draft still fails EvidenceGuard".into(),
            vec![too_many],
        ));
        return Step::Finish(ReleaseResult::evidence_validation_failed(run_id));
    }
    let run = evidence.resolve_reusing(&cited, before);
    // The candidate may cite calls the original did not, whose ids its text may name.
    let ids = RunIdentifiers::of_run(&run, &policy.key_prefix);
    let mut violations = check_concluded(&candidate, &run).err().unwrap_or_default();
    violations.extend(draft_names_identifier(&candidate, &ids));
    if !violations.is_empty() {
        audit.repair = Some(RepairAudit::rejected(
            "the repaired draft still fails EvidenceGuard".into(),
            violations,
        ));
        return Step::Finish(ReleaseResult::evidence_validation_failed(run_id));
    }
    match judgeable(candidate, &run, &ids, policy) {
        Ok(judged) => {
            audit.repair = Some(RepairAudit::accepted());
            Step::Judge(Box::new(judged))
        }
        Err(too_large) => {
            audit.repair = Some(RepairAudit::rejected(
                "the repaired draft's verified sources are over evidence.max_written_bytes".into(),
                vec![too_large],
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
///
/// `judged` is shared with the SemanticGuard until it answers: when nothing else holds it
/// by then (as in a release), the released report takes the Draft's texts instead of a copy.
pub fn after_judgement(
    run_id: &str,
    judgement: Judgement,
    judged: Arc<Judgeable>,
    audit: &mut Audit,
) -> ReleaseResult {
    match judgement {
        Judgement::Supported { reason } => {
            audit.verdict = Some(VerdictAudit::supported(reason));
            match Arc::try_unwrap(judged) {
                Ok(Judgeable { draft, snapshot }) => {
                    ReleaseResult::success_of(run_id, draft.into_user_visible(), &snapshot)
                }
                Err(shared) => ReleaseResult::success(run_id, &shared.draft, &shared.snapshot),
            }
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
    use crate::domain::evidence_guard::tests::{
        good_draft, run_evidence, run_evidence_with_an_uncited_call,
    };
    use crate::domain::evidence_guard::Rule;
    use crate::domain::invocation::tests::{log_found, mysql_none};
    use serde_json::json;

    fn policy() -> ReleasePolicy {
        ReleasePolicy::defaults()
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
            // What is stored and answered is written by `json`, byte for byte as serde_json.
            assert_eq!(
                crate::domain::json::to_string(&result).unwrap(),
                serde_json::to_string(&result).unwrap()
            );
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

    /// A repair gets the whole run, with the calls the Draft does not cite, as resolving
    /// it from scratch gives it (the checks before it read the cited calls alone).
    #[test]
    fn a_repair_gets_the_whole_run_with_the_calls_not_cited() {
        let evidence = run_evidence_with_an_uncited_call();
        let mut draft = good_draft();
        draft.analyses[0].tool_call_ids = vec!["c-ghost".into()];
        let cited = draft.cited_call_ids();
        let (step, _) = start(
            StopReason::FinalAnswer,
            DraftInput::Parsed(draft),
            &evidence,
        );
        match step {
            Step::Repair { run, .. } => {
                assert!(run.usable.contains_key("c-extra"));
                assert_eq!(*run, evidence.resolve(&cited));
            }
            other => panic!("{other:?}"),
        }
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
    fn a_draft_naming_a_call_id_or_key_ends_without_repair_or_review() {
        for text in ["As c-sql showed.", "See aiops:run:{r}:call:c-sql."] {
            let mut draft = good_draft();
            draft.recommendations[0].text = text.into();
            draft.analyses[1].tool_call_ids = vec!["c-ghost".into()];
            let (step, audit) = start(
                StopReason::FinalAnswer,
                DraftInput::Parsed(draft),
                &run_evidence(),
            );
            let result = finished(step);
            assert_eq!(
                result.fallback_type,
                Some(FallbackType::EvidenceValidationFailed)
            );
            let rules: Vec<_> = audit.violations.iter().map(|v| v.rule).collect();
            assert_eq!(
                rules,
                vec![Rule::CallMissing, Rule::DraftNamesIdentifier],
                "every violation is reported"
            );
            let repair = audit.repair.unwrap();
            assert!(!repair.ran && repair.reason.contains("may not change text"));
        }
    }

    #[test]
    fn a_fabricated_id_named_in_the_text_is_not_the_runs() {
        let mut draft = good_draft();
        draft.limitations = vec!["c-ghost was never run".into()];
        let (step, _) = start(
            StopReason::FinalAnswer,
            DraftInput::Parsed(draft),
            &run_evidence(),
        );
        assert!(matches!(step, Step::Judge(_)));
    }

    #[test]
    fn a_repair_whose_text_names_a_newly_cited_call_is_rejected() {
        // c-extra has a record under the run but is neither listed nor cited by the
        // original: only the candidate's citation makes it one of the run's ids.
        let mut evidence = run_evidence();
        evidence
            .records
            .insert("c-extra".into(), log_found("r", "c-extra"));
        let mut original = good_draft();
        original.analyses[0].tool_call_ids = vec!["c-lg".into()];
        original.limitations = vec!["c-extra is not shown.".into()];
        let mut candidate = original.clone();
        candidate.analyses[0].tool_call_ids = vec!["c-extra".into()];
        let mut audit = Audit::new("r", StopReason::FinalAnswer);
        let step = after_repair(&original, Ok(candidate), &evidence, &policy(), &mut audit);
        assert_eq!(
            finished(step).fallback_type,
            Some(FallbackType::EvidenceValidationFailed)
        );
        let repair = audit.repair.unwrap();
        assert_eq!(repair.violations_after[0].rule, Rule::DraftNamesIdentifier);
    }

    #[test]
    fn sources_over_the_written_limit_fail_closed_before_review() {
        let tight = ReleasePolicy {
            copy: CopyLimits {
                max_written_bytes: 100,
                ..CopyLimits::default()
            },
            ..policy()
        };
        let mut audit = Audit::new("r", StopReason::FinalAnswer);
        let step = begin(
            StopReason::FinalAnswer,
            DraftInput::Parsed(good_draft()),
            &run_evidence(),
            &tight,
            &mut audit,
        );
        let result = finished(step);
        assert_eq!(
            result.fallback_type,
            Some(FallbackType::EvidenceValidationFailed)
        );
        assert!(result.verified_sources.is_empty());
        assert_eq!(audit.violations[0].rule, Rule::SourcesTooLarge);
        assert!(!audit.repair.unwrap().ran);
        // The same limit on the progress path drops facts instead.
        let mut audit = Audit::new("r", StopReason::BudgetExhausted);
        let step = begin(
            StopReason::BudgetExhausted,
            DraftInput::Absent,
            &run_evidence(),
            &tight,
            &mut audit,
        );
        let result = finished(step);
        assert!(result.observed_facts.is_empty());
        assert_eq!(audit.facts_dropped, 3);
    }

    #[test]
    fn missing_context_never_shows_a_redis_key() {
        let draft = json!({"conclusion": null, "analyses": [],
                           "missing_context": ["Which run? aiops:run:{r}:calls is empty."]});
        let empty = RunEvidence {
            run_id: "r".into(),
            ..RunEvidence::default()
        };
        let result = finished(start(StopReason::FinalAnswer, parsed(draft), &empty).0);
        assert_eq!(
            result.missing_context,
            vec!["Which run? [redis key] is empty."]
        );
    }

    #[test]
    fn judgements_map_to_outcomes() {
        let run = run_evidence().resolve(&good_draft().cited_call_ids());
        let ids = RunIdentifiers::of_run(&run, "aiops");
        let judged = Arc::new(judgeable(good_draft(), &run, &ids, &policy()).unwrap());
        let mut audit = Audit::new("r", StopReason::FinalAnswer);
        let supported = || Judgement::Supported {
            reason: "fits".into(),
        };
        // Shared (the Draft is copied) and held by nobody else (its texts are moved): the
        // same result.
        let ok = after_judgement("r", supported(), judged.clone(), &mut audit);
        assert_eq!(ok.outcome, Outcome::Success);
        assert_eq!(ok.report, Some(good_draft().user_visible()));
        let only = judgeable(good_draft(), &run, &ids, &policy()).unwrap();
        assert_eq!(
            after_judgement("r", supported(), Arc::new(only), &mut audit),
            ok
        );
        let no = after_judgement(
            "r",
            Judgement::Unsupported {
                reason: "SECRET-REASON".into(),
            },
            judged.clone(),
            &mut audit,
        );
        assert_eq!(no.fallback_type, Some(FallbackType::SemanticUnsupported));
        assert!(!serde_json::to_string(&no)
            .unwrap()
            .contains("SECRET-REASON"));
        assert_eq!(no.verified_sources.len(), 3);
        let down = after_judgement("r", Judgement::Unavailable, judged, &mut audit);
        assert_eq!(down.fallback_type, Some(FallbackType::SemanticUnavailable));
        assert!(down.report.is_none());
    }
}
