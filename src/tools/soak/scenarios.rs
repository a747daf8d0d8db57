//! The soak mix: every kind of run the harness meets in production, each with the one
//! outcome it must give. Directives for the fake model ride in the operator question.

use std::time::Duration;

use serde_json::{json, Value};

use crate::tools::fixtures::{good_draft, log_found, standard_invocations, QUERY};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    Supported,
    Unsupported,
    Unavailable,
    FlakyThenSupported,
    Repaired,
    RepairRewritesText,
    DuplicateAnalysisId,
    KindMismatch,
    CrossRunCall,
    BrokenReference,
    NoConclusion,
    MissingContext,
    ControlledStop,
    InvalidDraft,
    CancelledMidCall,
    /// The agent's tool layer set the cancel marker before the release was asked for (no
    /// publish): the release must be CANCELLED, never SUCCESS.
    CancelledBefore,
    JudgeTimesOut,
}

/// Scenarios and their relative weights in the mix.
pub const MIX: [(Scenario, u32); 17] = [
    (Scenario::Supported, 25),
    (Scenario::Unsupported, 8),
    (Scenario::Unavailable, 5),
    (Scenario::FlakyThenSupported, 5),
    (Scenario::Repaired, 8),
    (Scenario::RepairRewritesText, 4),
    (Scenario::DuplicateAnalysisId, 5),
    (Scenario::KindMismatch, 5),
    (Scenario::CrossRunCall, 4),
    (Scenario::BrokenReference, 4),
    (Scenario::NoConclusion, 6),
    (Scenario::MissingContext, 4),
    (Scenario::ControlledStop, 6),
    (Scenario::InvalidDraft, 4),
    (Scenario::CancelledMidCall, 4),
    (Scenario::CancelledBefore, 3),
    (Scenario::JudgeTimesOut, 2),
];

/// Strings that must never appear in a release result.
pub const CANARIES: [&str; 8] = [
    "call-log-01",
    "call-rag-01",
    "call-log-02",
    "call-sql-01",
    "RAW-RESPONSE-CANARY",
    ":run:{",
    "Every claim is backed",
    "The conclusion names a cause",
];

/// One run to play: records to seed, the request body, an optional cancel, the expectation.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub scenario: Scenario,
    pub invocations: Vec<Value>,
    pub body: Value,
    pub cancel_after: Option<Duration>,
    /// Set the run's cancel marker directly in Redis (no publish) before the request.
    pub marker_before: bool,
    /// `outcome` and `fallback_type` (None for SUCCESS and CANCELLED).
    pub expected: (&'static str, Option<&'static str>),
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Supported => "supported",
            Scenario::Unsupported => "unsupported",
            Scenario::Unavailable => "unavailable",
            Scenario::FlakyThenSupported => "flaky_then_supported",
            Scenario::Repaired => "repaired",
            Scenario::RepairRewritesText => "repair_rewrites_text",
            Scenario::DuplicateAnalysisId => "duplicate_analysis_id",
            Scenario::KindMismatch => "kind_mismatch",
            Scenario::CrossRunCall => "cross_run_call",
            Scenario::BrokenReference => "broken_reference",
            Scenario::NoConclusion => "no_conclusion",
            Scenario::MissingContext => "missing_context",
            Scenario::ControlledStop => "controlled_stop",
            Scenario::InvalidDraft => "invalid_draft",
            Scenario::CancelledMidCall => "cancelled_mid_call",
            Scenario::CancelledBefore => "cancelled_before",
            Scenario::JudgeTimesOut => "judge_times_out",
        }
    }

    pub fn by_name(name: &str) -> Option<Scenario> {
        MIX.iter().map(|(s, _)| *s).find(|s| s.name() == name)
    }

    /// Picks a scenario from a uniform number in `0..total_weight()`.
    pub fn pick(roll: u32) -> Scenario {
        let mut left = roll % total_weight();
        for (scenario, weight) in MIX {
            if left < weight {
                return scenario;
            }
            left -= weight;
        }
        Scenario::Supported
    }

    pub fn plan(self, run: &str) -> RunPlan {
        const SUCCESS: (&str, Option<&str>) = ("SUCCESS", None);
        const EVF: (&str, Option<&str>) = ("FALLBACK", Some("EVIDENCE_VALIDATION_FAILED"));
        const INSUFFICIENT: (&str, Option<&str>) = ("FALLBACK", Some("INSUFFICIENT_EVIDENCE"));
        let with = |directive: &str| format!("{QUERY} {directive}");
        let release = |query: String, draft: Value| json!({"query": query, "draft": draft, "stop_reason": "FINAL_ANSWER"});
        let mut draft = good_draft();
        let mut invocations = standard_invocations(run);
        let mut cancel_after = None;
        let (body, expected) = match self {
            Scenario::Supported => (release(QUERY.into(), draft), SUCCESS),
            Scenario::Unsupported => (
                release(with("[judge:UNSUPPORTED]"), draft),
                ("FALLBACK", Some("SEMANTIC_UNSUPPORTED")),
            ),
            Scenario::Unavailable => (
                release(with("[judge:error]"), draft),
                ("FALLBACK", Some("SEMANTIC_UNAVAILABLE")),
            ),
            Scenario::FlakyThenSupported => (
                release(with(&format!("[judge:flaky] {run}")), draft),
                SUCCESS,
            ),
            Scenario::Repaired => {
                draft["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
                (release(QUERY.into(), draft), SUCCESS)
            }
            Scenario::RepairRewritesText => {
                // The repair request carries the Draft, not the question: the directive
                // rides in a limitation.
                draft["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
                draft["limitations"] = json!(["Only one hour was searched. [repair:rewrite]"]);
                (release(QUERY.into(), draft), EVF)
            }
            Scenario::DuplicateAnalysisId => {
                draft["analyses"][1]["id"] = json!("A1");
                (release(QUERY.into(), draft), EVF)
            }
            Scenario::KindMismatch => {
                draft["analyses"][0]["tool_call_ids"] = json!(["call-sql-01"]);
                (release(QUERY.into(), draft), EVF)
            }
            Scenario::CrossRunCall => {
                let mut foreign = log_found("some-other-run", "call-log-03");
                foreign["stored_under"] = json!(run);
                invocations.push(foreign);
                draft["analyses"][0]["tool_call_ids"] = json!(["call-log-03"]);
                (release(QUERY.into(), draft), EVF)
            }
            Scenario::BrokenReference => {
                draft["action_plan"][0]["analysis_refs"] = json!(["A9"]);
                (release(QUERY.into(), draft), EVF)
            }
            Scenario::NoConclusion => {
                draft["conclusion"] = Value::Null;
                (release(QUERY.into(), draft), INSUFFICIENT)
            }
            Scenario::MissingContext => {
                invocations.clear();
                let d = json!({"conclusion": null, "analyses": [], "missing_context": ["Which deployment window?"]});
                (
                    release(QUERY.into(), d),
                    ("FALLBACK", Some("MISSING_REQUIRED_CONTEXT")),
                )
            }
            Scenario::ControlledStop => (
                json!({"query": QUERY, "stop_reason": "INFORMATION_SATURATION"}),
                INSUFFICIENT,
            ),
            Scenario::InvalidDraft => (
                release(QUERY.into(), json!(format!("```json\n{draft}\n```"))),
                INSUFFICIENT,
            ),
            Scenario::CancelledMidCall => {
                cancel_after = Some(Duration::from_millis(300));
                (release(with("[judge:hang]"), draft), ("CANCELLED", None))
            }
            Scenario::CancelledBefore => (release(QUERY.into(), draft), ("CANCELLED", None)),
            Scenario::JudgeTimesOut => (
                release(with("[judge:hang]"), draft),
                ("FALLBACK", Some("SEMANTIC_UNAVAILABLE")),
            ),
        };
        RunPlan {
            scenario: self,
            invocations,
            body,
            cancel_after,
            marker_before: self == Scenario::CancelledBefore,
            expected,
        }
    }
}

pub fn total_weight() -> u32 {
    MIX.iter().map(|(_, w)| w).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_can_be_picked() {
        let picked: std::collections::BTreeSet<_> =
            (0..total_weight()).map(Scenario::pick).collect();
        assert_eq!(picked.len(), MIX.len());
        for (s, _) in MIX {
            assert_eq!(Scenario::by_name(s.name()), Some(s));
        }
    }
}
