//! The words a release's ending is told in: why the agent stopped ([`StopReason`]), the
//! release's [`Outcome`] and its [`FallbackType`] with the fixed SafeFallback texts. Read by
//! the release decision and the audit record alike.

use serde::{Deserialize, Serialize};

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

labels! {
    /// A release's outcome; the metric label `outcome`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub enum Outcome {
        Success = "SUCCESS",
        Fallback = "FALLBACK",
        Cancelled = "CANCELLED",
    }
}

labels! {
    /// Which SafeFallback a release answered; the metric label `fallback_type`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub enum FallbackType {
        EvidenceValidationFailed = "EVIDENCE_VALIDATION_FAILED",
        SemanticUnsupported = "SEMANTIC_UNSUPPORTED",
        SemanticUnavailable = "SEMANTIC_UNAVAILABLE",
        MissingRequiredContext = "MISSING_REQUIRED_CONTEXT",
        InsufficientEvidence = "INSUFFICIENT_EVIDENCE",
    }
}

impl FallbackType {
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
