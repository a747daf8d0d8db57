//! Strict reading of model answers: the chat-completion envelope, the SemanticGuard
//! verdict and the repaired Draft. Pure functions; each failure is classified as a parse
//! failure (not JSON, empty, truncated, too large) or a schema failure (valid JSON of the
//! wrong shape, a refusal, an unexpected finish reason).

use serde::Deserialize;
use serde_json::Value;

use crate::domain::audit::AttemptOutcome;
use crate::domain::draft::{Draft, DraftParseError};

/// A classified failure: `Parse` or `Schema`, with a data-free detail for the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerError {
    pub class: AttemptOutcome,
    pub detail: String,
}

fn parse_error(detail: impl Into<String>) -> AnswerError {
    AnswerError {
        class: AttemptOutcome::Parse,
        detail: detail.into(),
    }
}

fn schema_error(detail: impl Into<String>) -> AnswerError {
    AnswerError {
        class: AttemptOutcome::Schema,
        detail: detail.into(),
    }
}

/// The useful parts of a chat completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub content: String,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// Token usage, if the envelope reports it (even when the content is unusable).
pub fn usage(envelope: &Value) -> (Option<u64>, Option<u64>) {
    let usage = envelope.get("usage");
    (
        usage
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(Value::as_u64),
        usage
            .and_then(|u| u.get("completion_tokens"))
            .and_then(Value::as_u64),
    )
}

/// Reads the first choice's message: it must have finished with `stop`, carry no refusal,
/// and hold non-empty content of at most `max_bytes`.
pub fn read_completion(envelope: &Value, max_bytes: u64) -> Result<Completion, AnswerError> {
    let choice = envelope
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| parse_error("the response has no choices"))?;
    let message = choice
        .get("message")
        .ok_or_else(|| parse_error("the first choice has no message"))?;
    if let Some(refusal) = message.get("refusal").and_then(Value::as_str) {
        if !refusal.trim().is_empty() {
            return Err(schema_error("the model refused"));
        }
    }
    match choice.get("finish_reason").and_then(Value::as_str) {
        Some("stop") => {}
        Some("length") => return Err(parse_error("the output was cut at max_tokens")),
        Some(other) => {
            return Err(schema_error(format!(
                "finish_reason is {other:?}, not \"stop\""
            )))
        }
        None => return Err(schema_error("finish_reason is missing")),
    }
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .ok_or_else(|| parse_error("the message has no text content"))?;
    if content.len() as u64 > max_bytes {
        return Err(parse_error(format!(
            "the output is {} bytes, over the {max_bytes}-byte limit",
            content.len()
        )));
    }
    if content.trim().is_empty() {
        return Err(parse_error("the output is empty"));
    }
    let (prompt_tokens, completion_tokens) = usage(envelope);
    Ok(Completion {
        content: content.to_string(),
        prompt_tokens,
        completion_tokens,
    })
}

/// A valid SemanticGuard verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub supported: bool,
    pub reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVerdict {
    verdict: String,
    reason: String,
}

/// The placeholder the rubric shows where the reason goes. A model that copies the rubric
/// instead of judging answers it (or wraps it): that is not a verdict.
pub const REASON_PLACEHOLDER: &str =
    "<quote the decisive claim and name the evidence that supports or contradicts it>";

/// Placeholders of earlier rubrics, still recognised when a model answers one.
const OLD_PLACEHOLDERS: [&str; 1] = ["one or two sentences naming the decisive claim"];

/// A reason of fewer words names no claim and no evidence.
pub const MIN_REASON_WORDS: usize = 4;

fn core(text: &str) -> String {
    text.trim_matches(|c: char| c == '<' || c == '>' || c.is_whitespace())
        .to_lowercase()
}

/// Why a reason does not count as a judgement, if it does not.
fn weak_reason(reason: &str) -> Option<String> {
    let lower = reason.to_lowercase();
    let copied = std::iter::once(REASON_PLACEHOLDER)
        .chain(OLD_PLACEHOLDERS)
        .any(|p| lower.contains(&core(p)));
    if copied {
        return Some("the reason copies the rubric's placeholder".into());
    }
    let words = reason
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .count();
    if words < MIN_REASON_WORDS {
        return Some(format!(
            "the reason has {words} word(s), fewer than {MIN_REASON_WORDS}: it names no claim"
        ));
    }
    None
}

/// Exactly `{"verdict": "SUPPORTED"|"UNSUPPORTED", "reason": "<non-blank>"}`, where the
/// reason is the model's own: not the rubric's placeholder, and at least
/// [`MIN_REASON_WORDS`] words. A weak reason is a schema failure (technical, retried once
/// with the same bytes), never a verdict.
pub fn parse_verdict(content: &str) -> Result<Verdict, AnswerError> {
    let raw: RawVerdict = serde_json::from_str(content).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => schema_error(format!(
            "the verdict object has the wrong shape: {}",
            e.to_string().lines().next().unwrap_or_default()
        )),
        _ => parse_error("the output is not a single JSON object"),
    })?;
    let supported = match raw.verdict.as_str() {
        "SUPPORTED" => true,
        "UNSUPPORTED" => false,
        _ => return Err(schema_error("verdict is neither SUPPORTED nor UNSUPPORTED")),
    };
    if raw.reason.trim().is_empty() {
        return Err(schema_error("the reason is blank"));
    }
    if let Some(why) = weak_reason(&raw.reason) {
        return Err(schema_error(why));
    }
    Ok(Verdict {
        supported,
        reason: raw.reason,
    })
}

/// The repair model's answer: a whole Draft, parsed as strictly as the agent's.
pub fn parse_repaired_draft(content: &str) -> Result<Draft, AnswerError> {
    Draft::parse_text(content).map_err(|e| match e {
        DraftParseError::Schema(m) => {
            schema_error(format!("the repaired draft has the wrong shape: {m}"))
        }
        DraftParseError::InvalidJson(_) | DraftParseError::NotAnObject(_) => {
            parse_error("the output is not a single JSON object")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn envelope(content: Value, finish: &str) -> Value {
        json!({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 30, "total_tokens": 930}})
    }

    #[test]
    fn reads_a_well_formed_completion_with_usage() {
        let c = read_completion(&envelope(json!("{}"), "stop"), 100).unwrap();
        assert_eq!(
            (c.prompt_tokens, c.completion_tokens),
            (Some(900), Some(30))
        );
    }

    #[test]
    fn envelope_problems_are_classified() {
        let class = |e: Value| read_completion(&e, 20).unwrap_err().class;
        assert_eq!(class(json!({"choices": []})), AttemptOutcome::Parse);
        assert_eq!(
            class(envelope(json!("{}"), "length")),
            AttemptOutcome::Parse
        );
        assert_eq!(
            class(envelope(json!("{}"), "content_filter")),
            AttemptOutcome::Schema
        );
        assert_eq!(class(envelope(json!(null), "stop")), AttemptOutcome::Parse);
        assert_eq!(class(envelope(json!("  "), "stop")), AttemptOutcome::Parse);
        assert_eq!(
            class(envelope(json!("x".repeat(21)), "stop")),
            AttemptOutcome::Parse
        );
        let mut refused = envelope(json!(null), "stop");
        refused["choices"][0]["message"]["refusal"] = json!("I can't help with that.");
        assert_eq!(class(refused), AttemptOutcome::Schema);
    }

    #[test]
    fn strict_verdicts_parse() {
        let v = parse_verdict(
            r#"{"verdict": "UNSUPPORTED", "reason": "No deploy appears in the evidence."}"#,
        )
        .unwrap();
        assert!(!v.supported);
        assert!(
            parse_verdict(
                " {\"verdict\":\"SUPPORTED\",\"reason\":\"The logs show 132 matches.\"}\n"
            )
            .unwrap()
            .supported
        );
    }

    #[test]
    fn a_copied_placeholder_or_a_token_reason_is_no_verdict() {
        let class = |reason: &str| {
            parse_verdict(
                &serde_json::json!({"verdict": "SUPPORTED", "reason": reason}).to_string(),
            )
            .unwrap_err()
        };
        for copied in [
            REASON_PLACEHOLDER.to_string(),
            REASON_PLACEHOLDER
                .trim_matches(|c| c == '<' || c == '>')
                .to_string(),
            format!("Verdict: {REASON_PLACEHOLDER}."),
            "one or two sentences naming the decisive claim".to_string(),
            "One or two sentences naming the decisive claim.".to_string(),
        ] {
            let e = class(&copied);
            assert_eq!(e.class, AttemptOutcome::Schema, "{copied}");
            assert!(e.detail.contains("placeholder"), "{copied}");
        }
        for short in ["ok", "Supported.", "all claims fine", "- - - yes"] {
            let e = class(short);
            assert_eq!(e.class, AttemptOutcome::Schema, "{short}");
            assert!(e.detail.contains("fewer than 4"), "{short}: {}", e.detail);
        }
        assert!(parse_verdict(
            r#"{"verdict":"SUPPORTED","reason":"The 132 log matches back A1."}"#
        )
        .is_ok());
    }

    #[test]
    fn anything_else_is_a_parse_or_schema_failure() {
        let class = |s: &str| parse_verdict(s).unwrap_err().class;
        assert_eq!(class("SUPPORTED"), AttemptOutcome::Parse);
        assert_eq!(
            class("```json\n{\"verdict\":\"SUPPORTED\",\"reason\":\"r\"}\n```"),
            AttemptOutcome::Parse
        );
        assert_eq!(
            class("Sure! {\"verdict\":\"SUPPORTED\",\"reason\":\"r\"}"),
            AttemptOutcome::Parse
        );
        assert_eq!(
            class("{\"verdict\":\"SUPPORTED\",\"reason\":\"r\",\"report\":{}}"),
            AttemptOutcome::Schema
        );
        assert_eq!(
            class("{\"verdict\":\"MOSTLY\",\"reason\":\"r\"}"),
            AttemptOutcome::Schema
        );
        assert_eq!(
            class("{\"verdict\":\"SUPPORTED\",\"reason\":\"  \"}"),
            AttemptOutcome::Schema
        );
        assert_eq!(class("{\"verdict\":\"SUPPORTED\"}"), AttemptOutcome::Schema);
        assert_eq!(
            class("{\"verdict\":true,\"reason\":\"r\"}"),
            AttemptOutcome::Schema
        );
    }

    #[test]
    fn repaired_drafts_parse_strictly() {
        assert!(parse_repaired_draft("{\"conclusion\": null, \"analyses\": []}").is_ok());
        assert_eq!(
            parse_repaired_draft("here you go").unwrap_err().class,
            AttemptOutcome::Parse
        );
        assert_eq!(
            parse_repaired_draft("{\"conclusion\": null, \"analyses\": [], \"note\": 1}")
                .unwrap_err()
                .class,
            AttemptOutcome::Schema
        );
    }
}
