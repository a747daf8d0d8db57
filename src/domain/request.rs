//! A release request as the API and run bundles give it, and its validation (CONTRACT §3):
//! the run id, a non-blank query, a known stop reason, and a draft when FINAL_ANSWER.
//!
//! Entry points: [`validate_run_id`], [`parse_release`] (a body's bytes) and
//! [`release_request`] (a run bundle's fields). What fails here is
//! a bad request (HTTP 400, `check` exit 2); an unparseable Draft is not: it becomes
//! [`DraftInput::Unparseable`] and a release outcome.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::draft::{Draft, DraftParseError};
use super::release::{DraftInput, StopReason};

/// A request that cannot be released at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("run id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -")]
    InvalidRunId,
    #[error("query is required and must not be blank")]
    QueryRequired,
    #[error("stop_reason must be FINAL_ANSWER, INFORMATION_SATURATION or BUDGET_EXHAUSTED")]
    InvalidStopReason,
    #[error("draft is required when stop_reason is FINAL_ANSWER")]
    DraftRequired,
    #[error("malformed request body: {0}")]
    Malformed(String),
    #[error("query parameter {name}: {problem}")]
    InvalidParameter {
        name: &'static str,
        problem: &'static str,
    },
}

/// Checks a (percent-decoded) run id: 1 to 128 characters of `[A-Za-z0-9._:-]`.
pub fn validate_run_id(run_id: &str) -> Result<(), RequestError> {
    let ok = (1..=128).contains(&run_id.len())
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(RequestError::InvalidRunId)
    }
}

/// One release as asked for, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleaseRequest {
    pub run_id: String,
    pub query: String,
    pub stop_reason: StopReason,
    pub draft: DraftInput,
}

/// The body of `POST /v1/runs/{run_id}/release`, borrowed from its bytes where it can be
/// (the Draft's text always is: it is parsed once more, into the Draft).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody<'a> {
    #[serde(default, borrow)]
    pub query: Option<Cow<'a, str>>,
    /// The Draft's JSON text as sent (an object, or a string of raw agent text).
    #[serde(default, borrow)]
    pub draft: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub stop_reason: Option<Cow<'a, str>>,
}

impl<'a> ReleaseBody<'a> {
    /// Parses a request body strictly (unknown fields and wrong types are malformed).
    pub fn parse(bytes: &'a [u8]) -> Result<ReleaseBody<'a>, RequestError> {
        if !starts_an_object(bytes) {
            return Err(RequestError::Malformed(
                "the body must be a JSON object".into(),
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| {
            RequestError::Malformed(e.to_string().lines().next().unwrap_or_default().to_string())
        })
    }

    pub fn into_request(self, run_id: &str) -> Result<ReleaseRequest, RequestError> {
        release_request(
            run_id,
            self.query.as_deref(),
            self.stop_reason.as_deref(),
            self.draft.map(RawValue::get),
        )
    }
}

/// serde would also build a body struct from a JSON array; only an object is a body.
fn starts_an_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// The request a body's bytes ask for: the same answer as [`ReleaseBody::parse`] followed
/// by [`ReleaseBody::into_request`], in one pass over the bytes when the body is well
/// formed and its Draft an object that parses (nearly every body). Otherwise (a Draft
/// given as raw text, one that does not parse, a malformed body) it takes those two steps,
/// which find where the Draft's text is first and parse it after, so that a Draft that
/// does not parse is a release outcome and not a bad request.
pub fn parse_release(run_id: &str, bytes: &[u8]) -> Result<ReleaseRequest, RequestError> {
    one_pass(run_id, bytes).unwrap_or_else(|| in_two_steps(run_id, bytes))
}

/// [`ReleaseBody::parse`], then [`ReleaseBody::into_request`]: any body's answer, and what
/// the one pass must answer too.
pub fn in_two_steps(run_id: &str, bytes: &[u8]) -> Result<ReleaseRequest, RequestError> {
    ReleaseBody::parse(bytes)?.into_request(run_id)
}

/// The request of a well-formed body whose Draft is an object that parses (or `null`, or
/// absent); None for any other body.
fn one_pass(run_id: &str, bytes: &[u8]) -> Option<Result<ReleaseRequest, RequestError>> {
    if !starts_an_object(bytes) {
        return None;
    }
    // Checked as UTF-8 once, as a whole (a body that is not takes the two steps, which
    // name where): parsing bytes would check every string on its own.
    let text = std::str::from_utf8(bytes).ok()?;
    let body = serde_json::from_str::<OnePassBody<'_>>(text).ok()?;
    let draft = body.draft.map(|ObjectDraft(draft)| || Ok(draft));
    Some(request_of(
        run_id,
        body.query.as_deref(),
        body.stop_reason.as_deref(),
        draft,
    ))
}

/// [`ReleaseBody`] with its Draft parsed in place: only when that Draft is an object
/// (`null` is no Draft, as it is there).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OnePassBody<'a> {
    #[serde(default, borrow)]
    query: Option<Cow<'a, str>>,
    #[serde(default)]
    draft: Option<ObjectDraft>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

/// A Draft read from a JSON object in place, with the Draft's own `Deserialize`: what
/// [`Draft::parse_text`] reads from the object's text. Anything but an object is an error.
struct ObjectDraft(Draft);

impl<'de> Deserialize<'de> for ObjectDraft {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectOnly;
        impl<'de> serde::de::Visitor<'de> for ObjectOnly {
            type Value = ObjectDraft;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Draft object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ObjectDraft, A::Error> {
                Draft::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ObjectDraft)
            }
        }
        deserializer.deserialize_map(ObjectOnly)
    }
}

/// Validates the fields of a release and parses its Draft (a parse failure is kept as a
/// release outcome). `draft_json` is the draft field's JSON text; `null` = no draft.
pub fn release_request(
    run_id: &str,
    query: Option<&str>,
    stop_reason: Option<&str>,
    draft_json: Option<&str>,
) -> Result<ReleaseRequest, RequestError> {
    let draft_json = draft_json.filter(|raw| raw.trim() != "null");
    let draft = draft_json.map(|raw| move || Draft::parse_submitted(raw));
    request_of(run_id, query, stop_reason, draft)
}

/// Validates the fields of a release; `draft` parses its Draft (None: no draft), and is
/// only called when the Draft counts (not for a controlled stop).
fn request_of(
    run_id: &str,
    query: Option<&str>,
    stop_reason: Option<&str>,
    draft: Option<impl FnOnce() -> Result<Draft, DraftParseError>>,
) -> Result<ReleaseRequest, RequestError> {
    validate_run_id(run_id)?;
    let query = query
        .filter(|q| !q.trim().is_empty())
        .ok_or(RequestError::QueryRequired)?;
    let stop_reason = match stop_reason {
        None => StopReason::FinalAnswer,
        Some(raw) => StopReason::parse(raw).ok_or(RequestError::InvalidStopReason)?,
    };
    let draft = match draft {
        None if stop_reason == StopReason::FinalAnswer => return Err(RequestError::DraftRequired),
        None => DraftInput::Absent,
        // A controlled stop is released from the ProgressSnapshot; its draft is ignored.
        Some(_) if stop_reason.is_controlled_stop() => DraftInput::Absent,
        Some(parse) => match parse() {
            Ok(d) => DraftInput::Parsed(d),
            Err(e) => DraftInput::Unparseable(e),
        },
    };
    Ok(ReleaseRequest {
        run_id: run_id.to_string(),
        query: query.to_string(),
        stop_reason,
        draft,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> Result<ReleaseRequest, RequestError> {
        in_two_steps("r-42", json.as_bytes())
    }

    #[test]
    fn run_ids_are_checked() {
        for ok in ["r-42", "a", "A.b_c:d-e", &"x".repeat(128)] {
            assert!(validate_run_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "r/42", "r 42", "r{42}", "ü", &"x".repeat(129), "r%2F42"] {
            assert_eq!(
                validate_run_id(bad),
                Err(RequestError::InvalidRunId),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_valid_body_becomes_a_request() {
        let r =
            body(r#"{"query": "why?", "draft": {"conclusion": null, "analyses": []}}"#).unwrap();
        assert_eq!(r.stop_reason, StopReason::FinalAnswer);
        assert!(matches!(r.draft, DraftInput::Parsed(_)));
        let r = body(r#"{"query": "why?", "draft": "not json", "stop_reason": null}"#).unwrap();
        assert!(matches!(r.draft, DraftInput::Unparseable(_)));
    }

    #[test]
    fn bad_bodies_are_rejected_with_a_reason() {
        assert_eq!(body(r#"{"draft": {}}"#), Err(RequestError::QueryRequired));
        assert_eq!(
            body(r#"{"query": "  ", "draft": {}}"#),
            Err(RequestError::QueryRequired)
        );
        assert_eq!(
            body(r#"{"query": "q", "draft": {}, "stop_reason": "GAVE_UP"}"#),
            Err(RequestError::InvalidStopReason)
        );
        assert_eq!(body(r#"{"query": "q"}"#), Err(RequestError::DraftRequired));
        assert_eq!(
            body(r#"{"query": "q", "draft": null}"#),
            Err(RequestError::DraftRequired)
        );
        assert!(matches!(body("{not json"), Err(RequestError::Malformed(_))));
        assert!(matches!(
            body(r#"{"query": 5, "draft": {}}"#),
            Err(RequestError::Malformed(_))
        ));
        assert!(matches!(
            body(r#"{"query": "q", "draft": {}, "x": 1}"#),
            Err(RequestError::Malformed(_))
        ));
        assert!(matches!(body("[]"), Err(RequestError::Malformed(_))));
    }

    /// The one pass and the two steps, on bodies that take each way.
    #[test]
    fn the_one_pass_parse_answers_what_the_two_steps_answer() {
        let bodies = [
            // One pass: a Draft object that parses.
            r#"{"query": "why?", "draft": {"conclusion": null, "analyses": []}}"#,
            r#" {"draft": {"conclusion": null, "analyses": []}, "query": "q", "stop_reason": "BUDGET_EXHAUSTED"}"#,
            r#"{"query": "why?", "draft": null}"#,
            r#"{"query": "why?", "draft": null, "stop_reason": "INFORMATION_SATURATION"}"#,
            // Two steps: raw text, a Draft that does not parse, a bad body.
            r#"{"query": "why?", "draft": "{"conclusion": null, "analyses": []}"}"#,
            r#"{"query": "why?", "draft": "not json"}"#,
            r#"{"query": "why?", "draft": {"conclusion": 5}}"#,
            r#"{"query": "why?", "draft": {"conclusion": null, "analyses": [], "extra": 1}}"#,
            r#"{"query": "why?", "draft": [null, []]}"#,
            r#"{"query": "q", "stop_reason": "BUDGET_EXHAUSTED", "draft": {"conclusion": 5}}"#,
            r#"{"query": "q", "draft": {}, "x": 1}"#,
            r#"["why?", {"conclusion": null, "analyses": []}]"#,
            r#"{"query": "q", "query": "q", "draft": {"conclusion": null, "analyses": []}}"#,
            "{not json",
        ];
        for (i, body) in bodies.iter().enumerate() {
            assert_eq!(
                one_pass("r-42", body.as_bytes()).is_some(),
                i < 4,
                "one pass only for a Draft object that parses: {body}"
            );
            let two_steps = in_two_steps("r-42", body.as_bytes());
            assert_eq!(parse_release("r-42", body.as_bytes()), two_steps, "{body}");
        }
        assert!(matches!(
            parse_release("r-42", bodies[0].as_bytes()).unwrap().draft,
            DraftInput::Parsed(_)
        ));
        assert!(matches!(
            parse_release("r-42", bodies[6].as_bytes()).unwrap().draft,
            DraftInput::Unparseable(_)
        ));
        assert_eq!(
            parse_release("bad run", bodies[0].as_bytes()),
            Err(RequestError::InvalidRunId)
        );
        // Not UTF-8: the two steps, which name where.
        let bytes = b"{\"query\": \"\xff\", \"draft\": {\"conclusion\": null, \"analyses\": []}}";
        assert!(one_pass("r-42", bytes).is_none());
        let two_steps = in_two_steps("r-42", bytes);
        assert!(matches!(two_steps, Err(RequestError::Malformed(_))));
        assert_eq!(parse_release("r-42", bytes), two_steps);
    }

    #[test]
    fn controlled_stops_need_no_draft_and_ignore_one() {
        let r = body(r#"{"query": "q", "stop_reason": "BUDGET_EXHAUSTED"}"#).unwrap();
        assert_eq!(r.draft, DraftInput::Absent);
        let r = body(r#"{"query": "q", "stop_reason": "INFORMATION_SATURATION", "draft": "junk"}"#)
            .unwrap();
        assert_eq!(r.draft, DraftInput::Absent);
    }
}
