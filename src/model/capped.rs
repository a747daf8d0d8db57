//! What the model server sends, bounded as it is read: the answer's body is read up to a
//! cap and must be JSON before anything else sees it, and every excerpt of a server's
//! words is cleared of the request's credentials.
//!
//! Entry points: [`answer_cap`] (the cap for an answer of at most `max_output_bytes` of
//! content), [`read_answer`] (the body, capped and checked, given back as a response) and
//! [`redact`]. [`super::client`]'s HTTP service calls them, so that async-openai (which
//! would buffer any body whole and log one that is not JSON whole, at ERROR) only ever reads
//! a body that is bounded and parses.

use bytes::{Bytes, BytesMut};

/// What an answer's envelope may hold around its content: ids, the role, the finish
/// reason, usage, a model name, a reasoning text some servers add, whitespace.
pub const ENVELOPE_ALLOWANCE: usize = 64 * 1024;

/// The largest answer body read for a message content of at most `max_output_bytes`:
/// the content written as a JSON string (at most 6 bytes per byte, `\u0000`) plus
/// [`ENVELOPE_ALLOWANCE`]. A body that would be longer fails the attempt as `parse` the
/// moment its bytes pass the cap.
pub fn answer_cap(max_output_bytes: u64) -> usize {
    usize::try_from(max_output_bytes)
        .unwrap_or(usize::MAX)
        .saturating_mul(6)
        .saturating_add(ENVELOPE_ALLOWANCE)
}

/// Why an answer's body was not handed on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerBodyError {
    #[error("the answer's body is over {cap} bytes (model output limit + envelope allowance)")]
    TooLarge { cap: usize },
    #[error("the response body is not a JSON chat completion")]
    NotJson,
}

/// Reads `response`'s body, at most `cap` bytes of it (a longer body is given up at once:
/// its connection is closed), checks that it is one JSON document, and gives it back as a
/// response with the same status and headers.
pub async fn read_answer(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<reqwest::Response, ReadAnswerError> {
    if response
        .content_length()
        .is_some_and(|len| len > cap as u64)
    {
        return Err(ReadAnswerError::Body(AnswerBodyError::TooLarge { cap }));
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadAnswerError::Transport)? {
        if chunk.len() > cap - body.len() {
            return Err(ReadAnswerError::Body(AnswerBodyError::TooLarge { cap }));
        }
        body.extend_from_slice(&chunk);
    }
    let body: Bytes = body.freeze();
    if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err() {
        return Err(ReadAnswerError::Body(AnswerBodyError::NotJson));
    }
    let mut rebuilt = http::Response::new(body);
    *rebuilt.status_mut() = response.status();
    *rebuilt.version_mut() = response.version();
    *rebuilt.headers_mut() = std::mem::take(response.headers_mut());
    Ok(reqwest::Response::from(rebuilt))
}

/// How [`read_answer`] failed: the body itself, or the connection while it was read.
#[derive(Debug)]
pub enum ReadAnswerError {
    Body(AnswerBodyError),
    Transport(reqwest::Error),
}

/// `text` with every occurrence of each secret (of at least 4 bytes) replaced by
/// `[redacted]`: the configured API key and the `Authorization` value a request carried,
/// which a server's error message may quote.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        if out.contains(secret) {
            out = out.replace(secret, "[redacted]");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_short_strings_are_not_secrets() {
        let key = "sk-live-0123456789";
        let text = format!("invalid api key {key}; header Bearer {key}");
        let redacted = redact(&text, &[&format!("Bearer {key}"), key]);
        assert!(!redacted.contains(key), "{redacted}");
        assert_eq!(redacted, "invalid api key [redacted]; header [redacted]");
        assert_eq!(redact("a b c", &["", "b"]), "a b c");
    }

    #[test]
    fn the_cap_allows_the_content_escaped_and_the_envelope() {
        assert_eq!(answer_cap(4096), 6 * 4096 + ENVELOPE_ALLOWANCE);
        assert_eq!(answer_cap(u64::MAX), usize::MAX);
    }
}
