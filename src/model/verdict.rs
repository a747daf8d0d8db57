//! Strict reading of model answers: the chat-completion envelope, the SemanticGuard
//! verdict and the repaired Draft. Pure functions; each failure is classified as a parse
//! failure (not JSON, empty, truncated, too large) or a schema failure (valid JSON of the
//! wrong shape, a refusal, an unexpected finish reason).

use serde::Deserialize;

use super::envelope::Envelope;
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
pub fn usage(envelope: &Envelope) -> (Option<u64>, Option<u64>) {
    (envelope.prompt_tokens, envelope.completion_tokens)
}

/// Tokens a prompt may count beyond its request's bytes: a chat template's own tokens.
const PROMPT_TOKENS_SLACK: u64 = 4096;
/// Tokens a completion may count beyond `max_tokens` (a server counting the end token).
const COMPLETION_TOKENS_SLACK: u64 = 16;

/// Token counts the request makes impossible: a prompt of more tokens than its
/// `request_bytes` (every token holds at least one byte) plus [`PROMPT_TOKENS_SLACK`], or a
/// completion past the request's `max_tokens` plus [`COMPLETION_TOKENS_SLACK`]. Such a
/// count is a `schema` failure: it is never added to a budget or a counter.
pub fn check_usage(
    (prompt, completion): (Option<u64>, Option<u64>),
    request_bytes: u64,
    max_output_tokens: u32,
) -> Result<(), AnswerError> {
    let max_prompt = request_bytes.saturating_add(PROMPT_TOKENS_SLACK);
    if let Some(prompt) = prompt.filter(|p| *p > max_prompt) {
        return Err(schema_error(format!(
            "the model reports {prompt} prompt tokens for a {request_bytes}-byte request"
        )));
    }
    let max_completion = u64::from(max_output_tokens).saturating_add(COMPLETION_TOKENS_SLACK);
    if let Some(completion) = completion.filter(|c| *c > max_completion) {
        return Err(schema_error(format!(
            "the model reports {completion} completion tokens, over the request's max_tokens {max_output_tokens}"
        )));
    }
    Ok(())
}

/// At most [`crate::model::client::ERROR_EXCERPT_CHARS`] characters of a value the model
/// chose (and `…` when cut), for a detail or a report.
pub(super) fn excerpt(text: &str) -> String {
    let limit = super::client::ERROR_EXCERPT_CHARS;
    match text.char_indices().nth(limit) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Reads the first choice's message: it must have finished with `stop`, carry no refusal,
/// and hold non-empty content of at most `max_bytes`.
pub fn read_completion(envelope: &Envelope, max_bytes: u64) -> Result<Completion, AnswerError> {
    let choice = envelope
        .choice
        .as_ref()
        .ok_or_else(|| parse_error("the response has no choices"))?;
    let message = choice
        .message
        .as_ref()
        .ok_or_else(|| parse_error("the first choice has no message"))?;
    if let Some(refusal) = &message.refusal {
        if !refusal.trim().is_empty() {
            return Err(schema_error("the model refused"));
        }
    }
    match choice.finish_reason.as_deref() {
        Some("stop") => {}
        Some("length") => return Err(parse_error("the output was cut at max_tokens")),
        Some(other) => {
            return Err(schema_error(format!(
                "finish_reason is {:?}, not \"stop\"",
                excerpt(other)
            )))
        }
        None => return Err(schema_error("finish_reason is missing")),
    }
    let content = message
        .content
        .as_deref()
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
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn envelope(content: Value, finish: &str) -> Value {
        json!({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 30, "total_tokens": 930}})
    }

    /// The envelope as the client reads it, from its JSON text.
    fn read(envelope: &Value) -> Envelope {
        serde_json::from_str(&envelope.to_string()).unwrap()
    }

    /// How the envelope was read before it had a type of its own: lookups in the parsed
    /// JSON. The typed reading must classify every envelope the same way.
    fn reference(
        envelope: &Value,
        max_bytes: u64,
    ) -> (Result<Completion, AnswerError>, (Option<u64>, Option<u64>)) {
        let usage = envelope.get("usage");
        let tokens = (
            usage
                .and_then(|u| u.get("prompt_tokens"))
                .and_then(Value::as_u64),
            usage
                .and_then(|u| u.get("completion_tokens"))
                .and_then(Value::as_u64),
        );
        let read = || {
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
            Ok(Completion {
                content: content.to_string(),
                prompt_tokens: tokens.0,
                completion_tokens: tokens.1,
            })
        };
        (read(), tokens)
    }

    /// Any JSON value, weighted towards the keys and values an envelope has.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            prop_oneof![
                Just("stop"),
                Just("length"),
                Just("tool_calls"),
                Just(""),
                Just("  "),
                Just("{\"verdict\":\"SUPPORTED\"}"),
                Just("I can't help.")
            ]
            .prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::from),
        ];
        let key = prop_oneof![
            Just("choices"),
            Just("usage"),
            Just("message"),
            Just("finish_reason"),
            Just("content"),
            Just("refusal"),
            Just("prompt_tokens"),
            Just("completion_tokens"),
            Just("index"),
            Just("role"),
            Just("x")
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::vec((key.clone(), inner), 0..6).prop_map(|entries| {
                    Value::Object(
                        entries
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect(),
                    )
                }),
            ]
        })
    }

    /// Envelopes close to well-formed: each part present, absent, or any JSON value instead.
    fn envelope_like() -> impl Strategy<Value = Value> {
        fn part(typical: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Option<Value>> {
            prop_oneof![
                4 => typical.prop_map(Some),
                1 => Just(None),
                1 => json_value().prop_map(Some),
            ]
            .boxed()
        }
        fn object(parts: Vec<(&'static str, Option<Value>)>) -> Value {
            Value::Object(
                parts
                    .into_iter()
                    .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
                    .collect(),
            )
        }
        let text = prop_oneof![
            Just(Value::from("{\"verdict\":\"SUPPORTED\",\"reason\":\"r\"}")),
            Just(Value::from("   ")),
            "\\PC{0,50}".prop_map(Value::from),
        ];
        let message = (
            part(text.clone()),
            part(prop_oneof![Just(Value::Null), text.clone()]),
        )
            .prop_map(|(content, refusal)| {
                object(vec![("content", content), ("refusal", refusal)])
            });
        let finish =
            prop_oneof![Just("stop"), Just("length"), Just("content_filter")].prop_map(Value::from);
        let choice = (part(message), part(finish))
            .prop_map(|(m, f)| object(vec![("message", m), ("finish_reason", f)]));
        let count = prop_oneof![
            any::<u32>().prop_map(Value::from),
            (-5i64..0).prop_map(Value::from),
            Just(Value::from(1.5)),
        ];
        let usage = (part(count.clone()), part(count))
            .prop_map(|(p, c)| object(vec![("prompt_tokens", p), ("completion_tokens", c)]));
        let choices = prop::collection::vec(choice, 0..3).prop_map(Value::from);
        (part(choices), part(usage))
            .prop_map(|(choices, usage)| object(vec![("choices", choices), ("usage", usage)]))
    }

    proptest! {
        #[test]
        fn the_typed_envelope_reads_as_the_json_lookups_did(
            value in prop_oneof![json_value(), envelope_like()],
            max_bytes in 0u64..40,
        ) {
            let typed = read(&value);
            let (completion, tokens) = reference(&value, max_bytes);
            prop_assert_eq!(read_completion(&typed, max_bytes), completion);
            prop_assert_eq!(usage(&typed), tokens);
            prop_assert_eq!(
                typed.content(),
                value.pointer("/choices/0/message/content").and_then(Value::as_str)
            );
        }
    }

    #[test]
    fn a_key_written_twice_counts_as_its_last_value() {
        let text = r#"{"choices": 1, "choices": [{"finish_reason": "length", "message": {"content": "a"},
            "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "prompt_tokens": 7}}"#;
        let envelope: Envelope = serde_json::from_str(text).unwrap();
        let c = read_completion(&envelope, 10).unwrap();
        assert_eq!((c.content.as_str(), c.prompt_tokens), ("a", Some(7)));
    }

    #[test]
    fn reads_a_well_formed_completion_with_usage() {
        let c = read_completion(&read(&envelope(json!("{}"), "stop")), 100).unwrap();
        assert_eq!(
            (c.prompt_tokens, c.completion_tokens),
            (Some(900), Some(30))
        );
    }

    #[test]
    fn envelope_problems_are_classified() {
        let class = |e: Value| read_completion(&read(&e), 20).unwrap_err().class;
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
