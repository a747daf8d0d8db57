//! A release request as the API and run bundles give it, and its validation (CONTRACT §3):
//! the run id, a non-blank query, a known stop reason, and a draft when FINAL_ANSWER.
//!
//! Entry points: [`validate_run_id`] and [`ReleaseBody::into_request`]. What fails here is
//! a bad request (HTTP 400, `check` exit 2); an unparseable Draft is not: it becomes
//! [`DraftInput::Unparseable`] and a release outcome.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::draft::Draft;
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
        // serde would also build the struct from a JSON array; only an object is a body.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
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

/// Validates the fields of a release and parses its Draft (a parse failure is kept as a
/// release outcome). `draft_json` is the draft field's JSON text; `null` = no draft.
pub fn release_request(
    run_id: &str,
    query: Option<&str>,
    stop_reason: Option<&str>,
    draft_json: Option<&str>,
) -> Result<ReleaseRequest, RequestError> {
    validate_run_id(run_id)?;
    let query = query
        .filter(|q| !q.trim().is_empty())
        .ok_or(RequestError::QueryRequired)?;
    let stop_reason = match stop_reason {
        None => StopReason::FinalAnswer,
        Some(raw) => StopReason::parse(raw).ok_or(RequestError::InvalidStopReason)?,
    };
    let draft_json = draft_json.filter(|raw| raw.trim() != "null");
    let draft = match draft_json {
        None if stop_reason == StopReason::FinalAnswer => return Err(RequestError::DraftRequired),
        None => DraftInput::Absent,
        // A controlled stop is released from the ProgressSnapshot; its draft is ignored.
        Some(_) if stop_reason.is_controlled_stop() => DraftInput::Absent,
        Some(raw) => match Draft::parse_submitted(raw) {
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
        ReleaseBody::parse(json.as_bytes())?.into_request("r-42")
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

    #[test]
    fn controlled_stops_need_no_draft_and_ignore_one() {
        let r = body(r#"{"query": "q", "stop_reason": "BUDGET_EXHAUSTED"}"#).unwrap();
        assert_eq!(r.draft, DraftInput::Absent);
        let r = body(r#"{"query": "q", "stop_reason": "INFORMATION_SATURATION", "draft": "junk"}"#)
            .unwrap();
        assert_eq!(r.draft, DraftInput::Absent);
    }
}
