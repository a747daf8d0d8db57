//! The Draft: the diagnosis agent's final answer (CONTRACT §2), parsed strictly.
//!
//! Entry points: [`Draft::parse_submitted`] and [`Draft::parse_text`] (unknown fields, wrong
//! types and non-JSON text are a [`DraftParseError`]), and [`Draft::user_visible`], the
//! Draft without any tool call id, which is what people and the SemanticGuard see.

use serde::{Deserialize, Deserializer, Serialize};

/// The kind of an Analysis. Any string parses; only the two known kinds pass EvidenceGuard.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AnalysisKind {
    /// A positive claim; may cite only `EVIDENCE_FOUND` calls.
    Normal,
    /// "We looked and found nothing"; may cite only `NO_EVIDENCE` calls.
    NegativeObservation,
    /// Any other kind string, kept verbatim so that a repair cannot silently change it.
    Unsupported(String),
}

impl AnalysisKind {
    pub fn as_str(&self) -> &str {
        match self {
            AnalysisKind::Normal => "NORMAL",
            AnalysisKind::NegativeObservation => "NEGATIVE_OBSERVATION",
            AnalysisKind::Unsupported(other) => other,
        }
    }
}

impl Serialize for AnalysisKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AnalysisKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Ok(match raw.as_str() {
            "NORMAL" => AnalysisKind::Normal,
            "NEGATIVE_OBSERVATION" => AnalysisKind::NegativeObservation,
            _ => AnalysisKind::Unsupported(raw),
        })
    }
}

/// The Draft's conclusion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conclusion {
    pub text: String,
    /// Analysis ids the conclusion rests on; empty is a guard violation, not a parse error.
    #[serde(default)]
    pub analysis_refs: Vec<String>,
}

/// One Analysis: a claim and the tool calls it rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Analysis {
    pub id: String,
    pub kind: AnalysisKind,
    pub text: String,
    /// Tool call ids; never shown to people or to the SemanticGuard.
    #[serde(default)]
    pub tool_call_ids: Vec<String>,
}

/// One Action Plan item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionItem {
    pub text: String,
    #[serde(default)]
    pub analysis_refs: Vec<String>,
    #[serde(default)]
    pub requires_human_confirmation: bool,
}

/// One Recommendation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recommendation {
    pub text: String,
    #[serde(default)]
    pub analysis_refs: Vec<String>,
}

/// The agent's final answer. `conclusion` must be present (it may be `null`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Draft {
    #[serde(deserialize_with = "required_nullable")]
    pub conclusion: Option<Conclusion>,
    pub analyses: Vec<Analysis>,
    #[serde(default)]
    pub action_plan: Vec<ActionItem>,
    #[serde(default)]
    pub recommendations: Vec<Recommendation>,
    #[serde(default)]
    pub limitations: Vec<String>,
    #[serde(default)]
    pub missing_context: Vec<String>,
}

/// With `deserialize_with` and no `default`, serde reports a missing field as an error,
/// which is what "required, may be null" means.
fn required_nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Conclusion>, D::Error> {
    Option::<Conclusion>::deserialize(d)
}

/// Why a Draft could not be parsed. It goes to the audit record only (serde may quote a
/// field name or a short value of the Draft), never into a release result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DraftParseError {
    #[error("the draft is not a JSON object or string (found {0})")]
    NotAnObject(&'static str),
    #[error("the draft text is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("the draft does not match the Draft schema: {0}")]
    Schema(String),
}

impl Draft {
    /// Parses the `draft` field of a request or bundle, given as its JSON text: an object,
    /// or a string holding the agent's raw text. Parsing the text (not a `Value`) keeps
    /// duplicate keys detectable.
    pub fn parse_submitted(json_text: &str) -> Result<Draft, DraftParseError> {
        let trimmed = json_text.trim_start();
        if trimmed.starts_with('"') {
            let text: String = serde_json::from_str(json_text)
                .map_err(|e| DraftParseError::InvalidJson(describe_serde_error(&e)))?;
            return Draft::parse_text(&text);
        }
        Draft::parse_text(json_text)
    }

    /// Parses the agent's raw text: exactly one JSON object, nothing around it but whitespace.
    pub fn parse_text(text: &str) -> Result<Draft, DraftParseError> {
        let kind = match text.trim_start().chars().next() {
            Some('{') => None,
            Some('[') => Some("an array"),
            Some('"') => Some("a string"),
            Some('n') if text.trim() == "null" => Some("null"),
            Some('t' | 'f') if matches!(text.trim(), "true" | "false") => Some("a boolean"),
            Some('-' | '0'..='9') if text.trim().parse::<f64>().is_ok() => Some("a number"),
            _ => None,
        };
        if let Some(kind) = kind {
            return Err(DraftParseError::NotAnObject(kind));
        }
        serde_json::from_str::<Draft>(text).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => DraftParseError::Schema(describe_serde_error(&e)),
            _ => DraftParseError::InvalidJson(describe_serde_error(&e)),
        })
    }

    /// The Draft without any tool call id: what is released and what the judge reads.
    pub fn user_visible(&self) -> UserVisibleDraft {
        UserVisibleDraft {
            conclusion: self.conclusion.clone(),
            analyses: self
                .analyses
                .iter()
                .map(|a| UserVisibleAnalysis {
                    id: a.id.clone(),
                    kind: a.kind.clone(),
                    text: a.text.clone(),
                })
                .collect(),
            action_plan: self.action_plan.clone(),
            recommendations: self.recommendations.clone(),
            limitations: self.limitations.clone(),
            missing_context: self.missing_context.clone(),
        }
    }

    /// [`Draft::user_visible`] of a Draft that is not needed any more: its texts are moved,
    /// not copied.
    pub fn into_user_visible(self) -> UserVisibleDraft {
        UserVisibleDraft {
            conclusion: self.conclusion,
            analyses: self
                .analyses
                .into_iter()
                .map(|a| UserVisibleAnalysis {
                    id: a.id,
                    kind: a.kind,
                    text: a.text,
                })
                .collect(),
            action_plan: self.action_plan,
            recommendations: self.recommendations,
            limitations: self.limitations,
            missing_context: self.missing_context,
        }
    }

    /// The user-visible Draft, borrowed: serializes exactly as [`Draft::user_visible`]
    /// without copying it (the judge's request is written from it).
    pub fn visible(&self) -> VisibleDraft<'_> {
        VisibleDraft {
            conclusion: &self.conclusion,
            analyses: &self.analyses,
            action_plan: &self.action_plan,
            recommendations: &self.recommendations,
            limitations: &self.limitations,
            missing_context: &self.missing_context,
        }
    }

    /// Every tool call id the Draft cites, in citation order, without repeats.
    pub fn cited_call_ids(&self) -> Vec<String> {
        let mut seen = foldhash::HashSet::default();
        self.analyses
            .iter()
            .flat_map(|a| a.tool_call_ids.iter())
            .filter(|id| seen.insert(id.as_str()))
            .cloned()
            .collect()
    }
}

/// The first line of serde's message (position and field; it may quote a short value).
fn describe_serde_error(e: &serde_json::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// An Analysis as people see it: no tool call ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserVisibleAnalysis {
    pub id: String,
    pub kind: AnalysisKind,
    pub text: String,
}

/// The released report: the Draft with every tool call id removed and all six fields present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserVisibleDraft {
    pub conclusion: Option<Conclusion>,
    pub analyses: Vec<UserVisibleAnalysis>,
    pub action_plan: Vec<ActionItem>,
    pub recommendations: Vec<Recommendation>,
    pub limitations: Vec<String>,
    pub missing_context: Vec<String>,
}

/// [`UserVisibleDraft`] borrowed from its Draft ([`Draft::visible`]).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct VisibleDraft<'a> {
    conclusion: &'a Option<Conclusion>,
    #[serde(serialize_with = "visible_analyses")]
    analyses: &'a [Analysis],
    action_plan: &'a [ActionItem],
    recommendations: &'a [Recommendation],
    limitations: &'a [String],
    missing_context: &'a [String],
}

#[derive(Serialize)]
struct VisibleAnalysis<'a> {
    id: &'a str,
    kind: &'a AnalysisKind,
    text: &'a str,
}

fn visible_analyses<S: serde::Serializer>(
    analyses: &&[Analysis],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(analyses.iter().map(|a| VisibleAnalysis {
        id: &a.id,
        kind: &a.kind,
        text: &a.text,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_borrowed_visible_draft_serializes_as_the_owned_one() {
        let draft = parse(&json!({
            "conclusion": {"text": "Pool \"exhausted\"", "analysis_refs": ["A1"]},
            "analyses": [{"id": "A1", "kind": "NORMAL", "text": "t\u{200B}", "tool_call_ids": ["c-1"]}],
            "action_plan": [{"text": "raise", "analysis_refs": ["A1"], "requires_human_confirmation": true}],
            "recommendations": [{"text": "alert", "analysis_refs": []}],
            "limitations": ["one hour"],
            "missing_context": ["none"]
        }))
        .unwrap();
        assert_eq!(
            serde_json::to_string(&draft.visible()).unwrap(),
            serde_json::to_string(&draft.user_visible()).unwrap()
        );
    }

    fn parse(value: &serde_json::Value) -> Result<Draft, DraftParseError> {
        Draft::parse_submitted(&value.to_string())
    }

    fn minimal() -> serde_json::Value {
        json!({"conclusion": null, "analyses": []})
    }

    #[test]
    fn parses_the_contract_example() {
        let draft = parse(&json!({
            "conclusion": {"text": "Pool exhaustion", "analysis_refs": ["A1", "A2"]},
            "analyses": [
                {"id": "A1", "kind": "NORMAL", "text": "errors", "tool_call_ids": ["c-2"]},
                {"id": "A2", "kind": "NEGATIVE_OBSERVATION", "text": "none", "tool_call_ids": ["c-3"]}
            ],
            "action_plan": [{"text": "raise pool", "analysis_refs": ["A1"], "requires_human_confirmation": true}],
            "recommendations": [{"text": "alert", "analysis_refs": ["A2"]}],
            "limitations": ["one hour only"],
            "missing_context": []
        }))
        .unwrap();
        assert_eq!(draft.analyses[1].kind, AnalysisKind::NegativeObservation);
        assert!(draft.action_plan[0].requires_human_confirmation);
        assert_eq!(draft.cited_call_ids(), vec!["c-2", "c-3"]);
    }

    #[test]
    fn optional_arrays_and_flags_default() {
        let draft = parse(&json!({
            "conclusion": null,
            "analyses": [],
            "action_plan": [{"text": "look", "analysis_refs": []}]
        }))
        .unwrap();
        assert!(!draft.action_plan[0].requires_human_confirmation);
        assert!(draft.limitations.is_empty() && draft.missing_context.is_empty());
    }

    #[test]
    fn conclusion_is_required_even_though_it_may_be_null() {
        let err = parse(&json!({"analyses": []})).unwrap_err();
        assert!(matches!(err, DraftParseError::Schema(m) if m.contains("conclusion")));
        assert!(parse(&minimal()).is_ok());
    }

    #[test]
    fn unknown_fields_anywhere_are_a_parse_failure() {
        let mut top = minimal();
        top["confidence"] = json!(0.9);
        assert!(parse(&top).is_err());
        let nested = json!({"conclusion": null, "analyses": [
            {"id": "A1", "kind": "NORMAL", "text": "t", "tool_call_ids": [], "score": 1}]});
        assert!(parse(&nested).is_err());
    }

    #[test]
    fn wrong_types_are_a_parse_failure() {
        for bad in [
            json!({"conclusion": "text", "analyses": []}),
            json!({"conclusion": null, "analyses": {}}),
            json!({"conclusion": null, "analyses": [], "limitations": "one"}),
            json!({"conclusion": null, "analyses": [], "action_plan": [{"text": "x", "requires_human_confirmation": "yes"}]}),
            json!({"conclusion": null, "analyses": [{"id": 1, "kind": "NORMAL", "text": "t"}]}),
        ] {
            assert!(parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_kind_strings_parse_and_are_kept_verbatim() {
        let draft = parse(&json!({"conclusion": null, "analyses": [
            {"id": "A1", "kind": "HYPOTHESIS", "text": "t", "tool_call_ids": []}]}))
        .unwrap();
        assert_eq!(
            draft.analyses[0].kind,
            AnalysisKind::Unsupported("HYPOTHESIS".into())
        );
        assert_eq!(
            serde_json::to_value(draft.user_visible()).unwrap()["analyses"][0]["kind"],
            "HYPOTHESIS"
        );
    }

    #[test]
    fn raw_text_must_be_exactly_one_json_object() {
        assert!(Draft::parse_text(" {\"conclusion\": null, \"analyses\": []}\n").is_ok());
        for bad in [
            "Here is my answer: {\"conclusion\": null, \"analyses\": []}",
            "```json\n{\"conclusion\": null, \"analyses\": []}\n```",
            "[]",
            "",
            "{\"conclusion\": null, \"analyses\": []} trailing",
        ] {
            assert!(Draft::parse_text(bad).is_err(), "{bad}");
        }
        assert!(parse(&json!("not json")).is_err());
        assert!(parse(&json!(42)).is_err());
        assert!(parse(&json!(null)).is_err());
        let wrapped = json!("{\"conclusion\": null, \"analyses\": []}");
        assert!(
            parse(&wrapped).is_ok(),
            "a string holding a strict Draft parses"
        );
    }

    #[test]
    fn duplicate_keys_are_a_parse_failure() {
        assert!(Draft::parse_text(
            "{\"conclusion\": null, \"conclusion\": null, \"analyses\": []}"
        )
        .is_err());
    }

    #[test]
    fn user_visible_draft_has_no_tool_call_ids_and_all_six_fields() {
        let draft = parse(&json!({"conclusion": null, "analyses": [
            {"id": "A1", "kind": "NORMAL", "text": "t", "tool_call_ids": ["secret-call"]}]}))
        .unwrap();
        let shown = serde_json::to_value(draft.user_visible()).unwrap();
        assert_eq!(
            shown,
            serde_json::to_value(draft.into_user_visible()).unwrap()
        );
        assert!(!shown.to_string().contains("secret-call"));
        let keys: Vec<_> = shown.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            [
                "conclusion",
                "analyses",
                "action_plan",
                "recommendations",
                "limitations",
                "missing_context"
            ]
        );
    }
}
