//! One model exchange read after it ended: what the send gave back within its timeout
//! becomes one [`Exchange`] (outcome, detail, answer, token counts, response bytes, the HTTP
//! status and the gate's signal). Entry point: [`read`], a pure function used by the
//! release path (`actors::attempt`) and by `probe-model` (`tools::probe`), so the probe
//! reports what a release would make of the same answer; [`content_excerpt`] gives the
//! probe the start of what the model said.

use std::time::Duration;

use super::client::SendFailure;
use super::envelope::Envelope;
use super::gate::Sent;
use super::verdict::{check_usage, excerpt, read_completion, usage, AnswerError};
use crate::domain::audit::AttemptOutcome;

/// The bounds one request was sent under, as [`read`] judges its answer by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The timeout the send was given (named in a timeout's detail).
    pub timeout: Duration,
    /// The request's body size: a prompt token count beyond it is implausible.
    pub request_bytes: u64,
    /// The request's `max_tokens`: a completion token count beyond it is implausible.
    pub max_output_tokens: u32,
    /// The largest content accepted.
    pub max_output_bytes: u64,
}

/// How one exchange ended. `outcome` is `Ok` exactly when `answer` is `Some`, and then
/// `detail` is `None`; every other outcome has a detail.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange<T> {
    pub outcome: AttemptOutcome,
    pub detail: Option<String>,
    /// The parsed answer.
    pub answer: Option<T>,
    /// The server's counts; `None` when it reported none, or when the counts are
    /// implausible for the request (they never reach a budget or a counter).
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Bytes of the content, when the completion was readable (finished, within
    /// `max_output_bytes`), parsed or not; else 0.
    pub response_bytes: u64,
    /// The HTTP status of a failed send, when the server answered one.
    pub http_status: Option<u16>,
    /// What the model gate learns from the exchange.
    pub signal: Sent,
}

/// Reads what a send gave back: `None` when no answer came within `bounds.timeout`, else
/// the client's result. A failed send keeps its class, detail and status; an envelope
/// with implausible token counts is a `schema` failure with the counts dropped; otherwise
/// the completion is read (finish reason, refusal, size) and its content handed to
/// `parse`, whose error's class and detail become the outcome.
pub fn read<T>(
    sent: Option<Result<Envelope, SendFailure>>,
    bounds: &Bounds,
    parse: impl FnOnce(&str) -> Result<T, AnswerError>,
) -> Exchange<T> {
    let envelope = match sent {
        None => {
            return failed(
                AttemptOutcome::Timeout,
                format!("no answer within {} ms", bounds.timeout.as_millis()),
                Sent::TimedOut,
            )
        }
        Some(Err(failure)) => {
            return Exchange {
                http_status: failure.status,
                ..failed(failure.class, failure.detail, failure.signal)
            }
        }
        Some(Ok(envelope)) => envelope,
    };
    let mut exchange = Exchange {
        outcome: AttemptOutcome::Ok,
        detail: None,
        answer: None,
        prompt_tokens: None,
        completion_tokens: None,
        response_bytes: 0,
        http_status: None,
        signal: Sent::Answered,
    };
    let tokens = usage(&envelope);
    if let Err(e) = check_usage(tokens, bounds.request_bytes, bounds.max_output_tokens) {
        return Exchange {
            outcome: e.class,
            detail: Some(e.detail),
            ..exchange
        };
    }
    (exchange.prompt_tokens, exchange.completion_tokens) = tokens;
    let read = read_completion(&envelope, bounds.max_output_bytes).and_then(|completion| {
        exchange.response_bytes = completion.content.len() as u64;
        parse(&completion.content)
    });
    match read {
        Ok(answer) => exchange.answer = Some(answer),
        Err(e) => {
            exchange.outcome = e.class;
            exchange.detail = Some(e.detail);
        }
    }
    exchange
}

/// The start of the message content the send gave back, at most
/// [`ERROR_EXCERPT_CHARS`](super::client::ERROR_EXCERPT_CHARS) characters (and `…` when
/// cut), whenever an envelope with text content came back, readable or not: what
/// `probe-model` shows. Not part of [`Exchange`], so the release path never writes it.
pub fn content_excerpt(sent: &Option<Result<Envelope, SendFailure>>) -> Option<String> {
    match sent {
        Some(Ok(envelope)) => envelope.content().map(excerpt),
        _ => None,
    }
}

/// An exchange that ended with no answer and nothing counted.
fn failed<T>(outcome: AttemptOutcome, detail: String, signal: Sent) -> Exchange<T> {
    Exchange {
        outcome,
        detail: Some(detail),
        answer: None,
        prompt_tokens: None,
        completion_tokens: None,
        response_bytes: 0,
        http_status: None,
        signal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::client::ERROR_EXCERPT_CHARS;
    use crate::model::verdict::{parse_verdict, Verdict};
    use serde_json::{json, Value};

    const BOUNDS: Bounds = Bounds {
        timeout: Duration::from_millis(1500),
        request_bytes: 2000,
        max_output_tokens: 64,
        max_output_bytes: 200,
    };

    fn envelope(content: &str, prompt_tokens: u64, completion_tokens: u64) -> Envelope {
        let json: Value = json!({"choices": [{"index": 0,
            "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}});
        serde_json::from_str(&json.to_string()).unwrap()
    }

    const VERDICT: &str =
        r#"{"verdict": "SUPPORTED", "reason": "The log search shows the errors."}"#;

    fn exchange(sent: Option<Result<Envelope, SendFailure>>) -> Exchange<Verdict> {
        read(sent, &BOUNDS, parse_verdict)
    }

    #[test]
    fn no_answer_in_time_is_a_timeout_naming_the_timeout() {
        let e = exchange(None);
        assert_eq!(e.outcome, AttemptOutcome::Timeout);
        assert_eq!(e.detail.as_deref(), Some("no answer within 1500 ms"));
        assert_eq!(e.signal, Sent::TimedOut);
        assert_eq!(
            (e.answer, e.prompt_tokens, e.response_bytes),
            (None, None, 0)
        );
    }

    #[test]
    fn a_failed_send_keeps_its_class_detail_status_and_signal() {
        for (class, status, signal) in [
            (AttemptOutcome::Transport, None, Sent::ConnectionFailed),
            (
                AttemptOutcome::Transport,
                Some(503),
                Sent::ComeBackIn(Duration::from_secs(2)),
            ),
            (AttemptOutcome::Rejected, Some(400), Sent::Answered),
            (AttemptOutcome::Parse, None, Sent::Answered),
            (AttemptOutcome::Timeout, None, Sent::TimedOut),
        ] {
            let failure = SendFailure {
                class,
                detail: format!("{class:?} happened"),
                signal,
                status,
            };
            let e = exchange(Some(Err(failure)));
            assert_eq!(e.outcome, class);
            assert_eq!(e.detail, Some(format!("{class:?} happened")));
            assert_eq!(e.http_status, status);
            assert_eq!(e.signal, signal);
            assert_eq!(e.answer, None);
        }
    }

    #[test]
    fn implausible_usage_is_a_schema_failure_that_counts_nothing() {
        // More prompt tokens than request bytes (plus a template's slack).
        let sent = Some(Ok(envelope(VERDICT, 2000 + 4097, 10)));
        // The server answered: the probe sees what it said.
        assert_eq!(content_excerpt(&sent).as_deref(), Some(VERDICT));
        let e = exchange(sent);
        assert_eq!(e.outcome, AttemptOutcome::Schema);
        assert_eq!(
            e.detail.as_deref(),
            Some("the model reports 6097 prompt tokens for a 2000-byte request")
        );
        assert_eq!((e.prompt_tokens, e.completion_tokens), (None, None));
        assert_eq!((e.answer, e.response_bytes), (None, 0));
        // The server answered: the gate hears that.
        assert_eq!(e.signal, Sent::Answered);
        // A completion past max_tokens (plus the end token's slack).
        let e = exchange(Some(Ok(envelope(VERDICT, 100, 64 + 17))));
        assert_eq!(e.outcome, AttemptOutcome::Schema);
        assert!(e
            .detail
            .unwrap()
            .contains("over the request's max_tokens 64"));
        assert_eq!((e.prompt_tokens, e.completion_tokens), (None, None));
    }

    #[test]
    fn content_over_the_limit_is_a_parse_failure_with_its_tokens_and_a_bounded_excerpt() {
        let long = "x".repeat(1000);
        let sent = Some(Ok(envelope(&long, 100, 50)));
        let excerpt = content_excerpt(&sent).unwrap();
        assert_eq!(excerpt.chars().count(), ERROR_EXCERPT_CHARS + 1);
        assert!(excerpt.ends_with('…'));
        let e = exchange(sent);
        assert_eq!(e.outcome, AttemptOutcome::Parse);
        assert_eq!(
            e.detail.as_deref(),
            Some("the output is 1000 bytes, over the 200-byte limit")
        );
        assert_eq!(
            (e.prompt_tokens, e.completion_tokens),
            (Some(100), Some(50))
        );
        assert_eq!(e.response_bytes, 0);
    }

    #[test]
    fn a_parse_error_keeps_its_class_and_detail_and_the_bytes_read() {
        let e = exchange(Some(Ok(envelope("not json", 100, 5))));
        assert_eq!(e.outcome, AttemptOutcome::Parse);
        assert_eq!(
            e.detail.as_deref(),
            Some("the output is not a single JSON object")
        );
        assert_eq!(e.response_bytes, 8);
        let e = exchange(Some(Ok(envelope(
            r#"{"verdict": "MAYBE", "reason": "a b c d"}"#,
            100,
            5,
        ))));
        assert_eq!(e.outcome, AttemptOutcome::Schema);
        assert_eq!(
            e.detail.as_deref(),
            Some("verdict is neither SUPPORTED nor UNSUPPORTED")
        );
        assert_eq!(e.answer, None);
    }

    #[test]
    fn a_valid_answer_comes_with_its_tokens_and_bytes() {
        let e = exchange(Some(Ok(envelope(VERDICT, 900, 30))));
        assert_eq!(e.outcome, AttemptOutcome::Ok);
        assert_eq!(e.detail, None);
        assert!(e.answer.unwrap().supported);
        assert_eq!(
            (e.prompt_tokens, e.completion_tokens),
            (Some(900), Some(30))
        );
        assert_eq!(e.response_bytes, VERDICT.len() as u64);
        assert_eq!(e.http_status, None);
        assert_eq!(e.signal, Sent::Answered);
    }
}
