//! Strict reading of model answers: the chat-completion envelope, the SemanticGuard
//! verdict and the repaired Draft. Pure functions; each failure is classified as a parse
//! failure (not JSON, empty, truncated, too large) or a schema failure (valid JSON of the
//! wrong shape, a refusal, an unexpected finish reason).

use serde::Deserialize;

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

/// The parts of a chat-completion envelope the harness reads, taken from the answer's bytes
/// in one pass (everything else is skipped unread, no JSON tree is built). Each part is
/// read as leniently as a lookup in the parsed JSON would be: a value of another type
/// counts as absent (a `choices` that is no array, a non-string `finish_reason`, a negative
/// or fractional token count), a key written twice counts as its last value, and an answer
/// that is not an object has none of the parts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envelope {
    /// The first element of `choices`, if that is a non-empty array.
    choice: Option<Choice>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// The first choice (its parts only when it is an object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Choice {
    /// Present when the key is, whatever its value (`null` included).
    message: Option<Message>,
    finish_reason: Option<String>,
}

/// The first choice's message (its parts only when it is an object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Message {
    content: Option<String>,
    refusal: Option<String>,
}

impl Envelope {
    /// The first choice's message content, if it is a string.
    pub fn content(&self) -> Option<&str> {
        self.choice
            .as_ref()
            .and_then(|c| c.message.as_ref())
            .and_then(|m| m.content.as_deref())
    }
}

/// Token usage, if the envelope reports it (even when the content is unusable).
pub fn usage(envelope: &Envelope) -> (Option<u64>, Option<u64>) {
    (envelope.prompt_tokens, envelope.completion_tokens)
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
                "finish_reason is {other:?}, not \"stop\""
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

/// Reading the envelope: one visitor per level, each taking the keys it knows from an
/// object and skipping everything else; any other JSON type at a level reads as empty.
mod envelope_de {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{Deserialize, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::{Choice, Envelope, Message};

    /// Visitor methods that read each listed JSON type as `$value`, skipping its contents.
    macro_rules! read_as {
        ($value:expr; $($kind:ident)*) => { $( read_as!(@ $kind $value); )* };
        (@ map $v:expr) => {
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok($v)
            }
        };
        (@ seq $v:expr) => {
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok($v)
            }
        };
        (@ unit $v:expr) => {
            fn visit_unit<E: Error>(self) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ bool $v:expr) => {
            fn visit_bool<E: Error>(self, _: bool) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ i64 $v:expr) => {
            fn visit_i64<E: Error>(self, _: i64) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ u64 $v:expr) => {
            fn visit_u64<E: Error>(self, _: u64) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ f64 $v:expr) => {
            fn visit_f64<E: Error>(self, _: f64) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ str $v:expr) => {
            fn visit_str<E: Error>(self, _: &str) -> Result<Self::Value, E> { Ok($v) }
        };
    }

    /// A level read from an object's keys (each offered once per time it is written, so the
    /// last one counts).
    trait FromObject: Default {
        /// Reads the value of `key` if this level reads that key; answers whether it did
        /// (the caller skips any other value).
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error>;
    }

    /// A value read as `T` when it is an object, else as `T::default()`.
    struct Object<T>(T);

    impl<'de, T: FromObject> Deserialize<'de> for Object<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<T>(PhantomData<T>);
            impl<'de, T: FromObject> Visitor<'de> for V<T> {
                type Value = Object<T>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<T>, A::Error> {
                    let mut value = T::default();
                    while let Some(key) = map.next_key::<Key>()? {
                        if !value.entry(key.0, &mut map)? {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                    Ok(Object(value))
                }
                read_as!(Object(T::default()); seq unit bool i64 u64 f64 str);
            }
            d.deserialize_any(V(PhantomData))
        }
    }

    /// An object key: one of the few read here, or "" for any other (nothing is copied).
    struct Key(&'static str);

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Key;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an object key")
                }
                fn visit_str<E: Error>(self, key: &str) -> Result<Key, E> {
                    const READ: [&str; 8] = [
                        "choices",
                        "usage",
                        "message",
                        "finish_reason",
                        "content",
                        "refusal",
                        "prompt_tokens",
                        "completion_tokens",
                    ];
                    Ok(Key(READ.into_iter().find(|k| *k == key).unwrap_or("")))
                }
            }
            d.deserialize_str(V)
        }
    }

    /// A string, or `None` for any other JSON value.
    struct MaybeString(Option<String>);

    impl<'de> Deserialize<'de> for MaybeString {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = MaybeString;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_str<E: Error>(self, s: &str) -> Result<MaybeString, E> {
                    Ok(MaybeString(Some(s.to_string())))
                }
                fn visit_string<E: Error>(self, s: String) -> Result<MaybeString, E> {
                    Ok(MaybeString(Some(s)))
                }
                read_as!(MaybeString(None); map seq unit bool i64 u64 f64);
            }
            d.deserialize_any(V)
        }
    }

    /// A count as `serde_json::Value::as_u64` reads one: a non-negative integer that fits a
    /// `u64`; `None` for anything else (a fraction, a float, a string).
    struct MaybeCount(Option<u64>);

    impl<'de> Deserialize<'de> for MaybeCount {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = MaybeCount;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_u64<E: Error>(self, n: u64) -> Result<MaybeCount, E> {
                    Ok(MaybeCount(Some(n)))
                }
                fn visit_i64<E: Error>(self, n: i64) -> Result<MaybeCount, E> {
                    Ok(MaybeCount(u64::try_from(n).ok()))
                }
                read_as!(MaybeCount(None); map seq unit bool f64 str);
            }
            d.deserialize_any(V)
        }
    }

    /// `choices`: its first element when it is a non-empty array (the rest skipped).
    struct FirstChoice(Option<Choice>);

    impl<'de> Deserialize<'de> for FirstChoice {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = FirstChoice;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<FirstChoice, A::Error> {
                    let first = s.next_element::<Object<Choice>>()?.map(|c| c.0);
                    while s.next_element::<IgnoredAny>()?.is_some() {}
                    Ok(FirstChoice(first))
                }
                read_as!(FirstChoice(None); map unit bool i64 u64 f64 str);
            }
            d.deserialize_any(V)
        }
    }

    /// `usage`: the two counts.
    #[derive(Default)]
    struct Usage {
        prompt_tokens: Option<u64>,
        completion_tokens: Option<u64>,
    }

    impl FromObject for Envelope {
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                "choices" => self.choice = map.next_value::<FirstChoice>()?.0,
                "usage" => {
                    let usage = map.next_value::<Object<Usage>>()?.0;
                    self.prompt_tokens = usage.prompt_tokens;
                    self.completion_tokens = usage.completion_tokens;
                }
                _ => return Ok(false),
            }
            Ok(true)
        }
    }

    impl FromObject for Choice {
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                "message" => self.message = Some(map.next_value::<Object<Message>>()?.0),
                "finish_reason" => self.finish_reason = map.next_value::<MaybeString>()?.0,
                _ => return Ok(false),
            }
            Ok(true)
        }
    }

    impl FromObject for Message {
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                "content" => self.content = map.next_value::<MaybeString>()?.0,
                "refusal" => self.refusal = map.next_value::<MaybeString>()?.0,
                _ => return Ok(false),
            }
            Ok(true)
        }
    }

    impl FromObject for Usage {
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                "prompt_tokens" => self.prompt_tokens = map.next_value::<MaybeCount>()?.0,
                "completion_tokens" => self.completion_tokens = map.next_value::<MaybeCount>()?.0,
                _ => return Ok(false),
            }
            Ok(true)
        }
    }

    impl<'de> Deserialize<'de> for Envelope {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            Ok(Object::<Envelope>::deserialize(d)?.0)
        }
    }
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
