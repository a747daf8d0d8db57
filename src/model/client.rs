//! The OpenAI-compatible chat-completions client (async-openai over reqwest).
//!
//! Entry point: [`ModelClient::send`] posts a [`PreparedRequest`]'s exact bytes to
//! `{model.base_url}/chat/completions` once and classifies what went wrong as transport,
//! parse or rejected. It never retries by itself (async-openai's default retry layer is
//! replaced by [`StatusService`], a bare reqwest service that also reads error bodies, and
//! reqwest's own retries are off) nor follows a redirect (a 3xx is a `transport` failure), and
//! has no timeout of its own: callers wrap it, and dropping the future drops the request,
//! which closes its connection.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_openai::Client;
use serde_json::Value;

use super::capped::{self, AnswerBodyError, ReadAnswerError};
use super::envelope::Envelope;
use super::gate::{parse_retry_after, Sent};
use super::prompts::{PreparedRequest, RequestBody};
use crate::config::ModelConfig;
use crate::domain::audit::AttemptOutcome;

/// Why a call produced no envelope: `Transport` (connect, reset, a server fault),
/// `Rejected` (the server refused the request as invalid: not worth sending again) or
/// `Parse` (the body is not JSON), with a short detail (for an HTTP error: the status and
/// a bounded excerpt of the server's message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    pub class: AttemptOutcome,
    pub detail: String,
    /// What the model gate learns from it ([`super::gate`]): the server's pause, or that no
    /// HTTP answer came at all.
    pub signal: Sent,
    /// The HTTP status, when the server answered one (`probe-model` tells a wrong URL, 404
    /// or 405, from a refused request).
    pub status: Option<u16>,
}

#[derive(Clone)]
pub struct ModelClient {
    /// Shared: a clone (one per run that calls the model, and per pending call) copies no
    /// configuration.
    client: Arc<Client<OpenAIConfig>>,
}

impl std::fmt::Debug for ModelClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelClient").finish_non_exhaustive()
    }
}

/// The model's HTTP client could not be built (its TLS set-up failed).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client: {0}")]
pub struct ClientError(#[from] reqwest::Error);

impl ModelClient {
    /// Builds the client from configuration; every field is set explicitly so that no
    /// `OPENAI_*` environment variable can override the harness's own settings.
    pub fn new(config: &ModelConfig) -> Result<ModelClient, ClientError> {
        // One request per attempt, to the configured server only: no redirect is followed
        // (it would send the evidence again, wherever `Location` points) and reqwest's own
        // retries are off (the SemanticGuard's attempts are the only ones).
        let mut http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms.get()))
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(IDLE_CONNECTIONS)
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never());
        if config.http2_prior_knowledge {
            http = http.http2_prior_knowledge();
        }
        let http = http.build()?;
        let openai = OpenAIConfig::default()
            .with_api_base(config.base_url.clone())
            .with_api_key(config.api_key.clone())
            .with_org_id("")
            .with_project_id("");
        let client = Client::build(http.clone(), openai).with_http_service(StatusService { http });
        Ok(ModelClient {
            client: Arc::new(client),
        })
    }

    /// One POST of the prepared bytes; the parts of the chat-completion envelope that are
    /// read, taken from the answer's bytes in one pass. The request is given up: its bytes
    /// are let go as they are written, so a call waiting on the model holds none of them.
    pub async fn send(&self, request: PreparedRequest) -> Result<Envelope, SendFailure> {
        self.send_capped(request, DEFAULT_MAX_OUTPUT_BYTES).await
    }

    /// [`ModelClient::send`] for an answer whose content may hold `max_output_bytes`: its
    /// body is read up to [`capped::answer_cap`] of that and fails as `parse` past it.
    pub async fn send_capped(
        &self,
        request: PreparedRequest,
        max_output_bytes: u64,
    ) -> Result<Envelope, SendFailure> {
        let chat = self.client.chat();
        let call = chat.create_byot::<Placeholder, Envelope>(Placeholder);
        let call = SENDING.scope(Cell::new(Some(request.into_body())), call);
        ANSWER_CAP
            .scope(capped::answer_cap(max_output_bytes), call)
            .await
            .map_err(classify)
    }
}

/// The content limit of a [`ModelClient::send`] that names none (the probe's canary).
const DEFAULT_MAX_OUTPUT_BYTES: u64 = 64 * 1024;

tokio::task_local! {
    /// How many bytes of the answer's body [`StatusService`] reads on this task.
    static ANSWER_CAP: usize;
}

tokio::task_local! {
    /// The body of the call [`ModelClient::send`] is making on this task, until
    /// [`StatusService`] takes it to send it in place of async-openai's [`Placeholder`].
    static SENDING: Cell<Option<RequestBody>>;
}

/// What async-openai is given as the request and serializes as the body: `null`
/// ([`PLACEHOLDER`]). [`StatusService`] sends the prepared body in its place, and sends
/// nothing if the request it is given does not carry exactly this placeholder. async-openai
/// keeps its request for retries of its own (the harness has none): before, that was a copy
/// of the whole body (6 kB for a judge request).
#[derive(Debug, Clone, Copy)]
pub struct Placeholder;

/// The bytes [`Placeholder`] serializes as.
pub const PLACEHOLDER: &[u8] = b"null";

impl serde::Serialize for Placeholder {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit()
    }
}

/// HTTP/1.1 connections to the model a client (one per HTTP worker) keeps open while idle,
/// for 30 s at most. After a burst of calls waiting on the model together, the rest are
/// closed as their calls end: neither the harness nor the model server holds a socket (and
/// the harness its buffers, about 30 kB each) per call of the burst. With
/// `model.http2_prior_knowledge` all calls share one connection anyway.
pub const IDLE_CONNECTIONS: usize = 16;

/// The HTTP service under async-openai: one request, no retry. A non-2xx answer becomes
/// an [`HttpStatusError`] holding the status and the start of the body, so that the
/// classification sees the server's words whatever shape its error body has (async-openai
/// itself turns a 4xx body that is not OpenAI's `{"error": {...}}` into a parse error).
#[derive(Clone)]
struct StatusService {
    http: reqwest::Client,
}

type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<reqwest::Response, OpenAIError>> + Send + 'static>>;

impl tower::Service<HttpRequestFactory> for StatusService {
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = ServiceFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Self::Future {
        let http = self.http.clone();
        let prepared = SENDING.try_with(Cell::take).ok().flatten();
        let cap = ANSWER_CAP
            .try_with(|cap| *cap)
            .unwrap_or_else(|_| capped::answer_cap(DEFAULT_MAX_OUTPUT_BYTES));
        Box::pin(async move {
            let mut request = factory.build().await?;
            drop(factory);
            // async-openai wrote the placeholder; anything else (a request not made by
            // `ModelClient::send`, or an async-openai that builds bodies differently) is
            // not sent.
            match prepared {
                Some(body)
                    if request.body().and_then(reqwest::Body::as_bytes) == Some(PLACEHOLDER) =>
                {
                    *request.body_mut() = Some(body.into_http_body());
                }
                _ => {
                    return Err(OpenAIError::InvalidArgument(
                        "the request body is not a prepared request's".into(),
                    ))
                }
            }
            // What a server's message may quote and no excerpt may hold.
            let authorization = credentials(&request);
            let mut response = http.execute(request).await?;
            let status = response.status();
            if status.is_success() {
                return capped::read_answer(response, cap)
                    .await
                    .map_err(|e| match e {
                        ReadAnswerError::Body(body) => OpenAIError::Boxed(Box::new(body)),
                        ReadAnswerError::Transport(e) => OpenAIError::Reqwest(e),
                    });
            }
            let retry_after = come_back_in(&response);
            // Read at most ERROR_BODY_BYTES of the error body: a hostile or broken server
            // cannot make the harness buffer more than that.
            let mut body = Vec::new();
            while body.len() < ERROR_BODY_BYTES {
                match response.chunk().await {
                    Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                    Ok(None) | Err(_) => break,
                }
            }
            body.truncate(ERROR_BODY_BYTES);
            let secrets: Vec<&str> = authorization.iter().map(String::as_str).collect();
            Err(OpenAIError::Boxed(Box::new(HttpStatusError {
                status: status.as_u16(),
                body: capped::redact(&String::from_utf8_lossy(&body), &secrets),
                retry_after,
            })))
        })
    }
}

/// The request's `Authorization` value and the token in it (the configured API key):
/// redacted from a server's message before it is kept anywhere.
fn credentials(request: &reqwest::Request) -> Vec<String> {
    let Some(value) = request
        .headers()
        .get(reqwest::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Vec::new();
    };
    let mut secrets = vec![value.to_string()];
    if let Some(token) = value.strip_prefix("Bearer ") {
        secrets.push(token.trim().to_string());
    }
    secrets
}

/// How much of an error body is read.
const ERROR_BODY_BYTES: usize = 8 * 1024;
/// How much of the server's message goes into the audit.
pub const ERROR_EXCERPT_CHARS: usize = 240;

/// A non-2xx answer of the model server.
#[derive(Debug, thiserror::Error)]
#[error("HTTP {status}")]
pub struct HttpStatusError {
    pub status: u16,
    /// The start of the body (at most [`ERROR_BODY_BYTES`]).
    pub body: String,
    /// A `429`/`503`'s `Retry-After`, as a duration from now.
    pub retry_after: Option<Duration>,
}

/// The `Retry-After` of a `429` or `503` answer (seconds or an HTTP date); other statuses'
/// are not a request to pause. async-openai does not show response headers, so they are
/// read here, under it.
fn come_back_in(response: &reqwest::Response) -> Option<Duration> {
    if !matches!(response.status().as_u16(), 429 | 503) {
        return None;
    }
    let value = response.headers().get(reqwest::header::RETRY_AFTER)?;
    parse_retry_after(value.to_str().ok()?, std::time::SystemTime::now())
}

/// Words by which a server says that the request itself is invalid. llama-cpp-python
/// answers a `response_format` it does not know with HTTP 500 and a pydantic message
/// ("Input should be 'text' or 'json_object'"); others use 400 or 422.
const INVALID_REQUEST_MARKERS: [&str; 10] = [
    "invalid",
    "input should be",
    "validation error",
    "unprocessable",
    "not supported",
    "unsupported",
    "bad request",
    "unknown field",
    "extra inputs are not permitted",
    "failed to parse grammar",
];

/// Whether an HTTP error status and body mean "this request is invalid" (never worth
/// sending again) rather than a fault of the server or the network. 408 (timeout) and
/// 429 (rate limit) are the 4xx that a later attempt can get past.
pub fn is_rejection(status: u16, body: &str) -> bool {
    match status {
        408 | 429 => false,
        400..=499 => true,
        500..=599 => {
            let lower = body.to_lowercase();
            INVALID_REQUEST_MARKERS.iter().any(|m| lower.contains(m))
        }
        _ => false,
    }
}

/// The server's message, bounded and on one line, for the audit: the JSON error's
/// `message`/`detail` when there is one, else the body's start.
pub fn error_excerpt(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        [
            v.pointer("/error/message"),
            v.pointer("/message"),
            v.pointer("/detail/0/msg"),
            v.pointer("/detail"),
            v.pointer("/error"),
        ]
        .into_iter()
        .flatten()
        .find_map(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        })
    });
    let text = message.unwrap_or_else(|| body.to_string());
    let mut out = String::new();
    let mut last_space = false;
    for c in text.chars() {
        let c = if c.is_control() || c.is_whitespace() {
            ' '
        } else {
            c
        };
        if c == ' ' && (last_space || out.is_empty()) {
            continue;
        }
        last_space = c == ' ';
        if out.chars().count() >= ERROR_EXCERPT_CHARS {
            out.push('…');
            break;
        }
        out.push(c);
    }
    out.trim_end().to_string()
}

fn classify(error: OpenAIError) -> SendFailure {
    let signal = match &error {
        OpenAIError::Boxed(inner) => match inner.downcast_ref::<HttpStatusError>() {
            Some(HttpStatusError {
                retry_after: Some(after),
                ..
            }) => Sent::ComeBackIn(*after),
            Some(_) => Sent::Answered,
            None => Sent::ConnectionFailed,
        },
        OpenAIError::ApiError(_) | OpenAIError::JSONDeserialize(_, _) => Sent::Answered,
        OpenAIError::Reqwest(e) if e.is_timeout() => Sent::TimedOut,
        _ => Sent::ConnectionFailed,
    };
    let status = match &error {
        OpenAIError::Boxed(inner) => inner.downcast_ref::<HttpStatusError>().map(|h| h.status),
        OpenAIError::ApiError(api) => Some(api.status_code.as_u16()),
        _ => None,
    };
    let (class, detail) = match &error {
        OpenAIError::Boxed(inner) if inner.is::<AnswerBodyError>() => {
            (AttemptOutcome::Parse, inner.to_string())
        }
        OpenAIError::Boxed(inner) => match inner.downcast_ref::<HttpStatusError>() {
            Some(http) => {
                let excerpt = error_excerpt(&http.body);
                let class = if is_rejection(http.status, &http.body) {
                    AttemptOutcome::Rejected
                } else {
                    AttemptOutcome::Transport
                };
                let detail = if excerpt.is_empty() {
                    format!("HTTP {}", http.status)
                } else {
                    format!("HTTP {}: {excerpt}", http.status)
                };
                (class, detail)
            }
            None => (
                AttemptOutcome::Transport,
                "the request could not be completed".to_string(),
            ),
        },
        OpenAIError::ApiError(api) => {
            let message = api.api_error.message.as_str();
            let class = if is_rejection(api.status_code.as_u16(), message) {
                AttemptOutcome::Rejected
            } else {
                AttemptOutcome::Transport
            };
            (
                class,
                format!(
                    "HTTP {}: {}",
                    api.status_code.as_u16(),
                    error_excerpt(message)
                ),
            )
        }
        OpenAIError::JSONDeserialize(_, _) => (
            AttemptOutcome::Parse,
            "the response body is not a JSON chat completion".to_string(),
        ),
        OpenAIError::Reqwest(e) if e.is_timeout() => (
            AttemptOutcome::Timeout,
            "the HTTP client timed out".to_string(),
        ),
        OpenAIError::Reqwest(e) if e.is_connect() => {
            (AttemptOutcome::Transport, "connection failed".to_string())
        }
        OpenAIError::Reqwest(_) => (
            AttemptOutcome::Transport,
            "the connection failed or was reset".to_string(),
        ),
        _ => (
            AttemptOutcome::Transport,
            "the request could not be completed".to_string(),
        ),
    };
    SendFailure {
        class,
        detail,
        signal,
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_openai_serializes_only_the_placeholder() {
        // What async-openai does with the request: `serde_json::to_vec` of it.
        assert_eq!(serde_json::to_vec(&Placeholder).unwrap(), PLACEHOLDER);
    }

    /// A request that is not `ModelClient::send`'s (no prepared body on the task, or a body
    /// that is not the placeholder) never reaches the server.
    #[tokio::test]
    async fn only_a_prepared_body_is_sent() {
        let server = wiremock::MockServer::start().await;
        let mut config = crate::config::Config::defaults().model;
        config.base_url = server.uri();
        let client = ModelClient::new(&config).unwrap();
        let other = client
            .client
            .chat()
            .create_byot::<Value, Envelope>(serde_json::json!({"model": "m", "messages": []}))
            .await;
        assert!(matches!(other, Err(OpenAIError::InvalidArgument(_))));
        let unprepared = client
            .client
            .chat()
            .create_byot::<Placeholder, Envelope>(Placeholder)
            .await;
        assert!(matches!(unprepared, Err(OpenAIError::InvalidArgument(_))));
        assert!(server
            .received_requests()
            .await
            .unwrap_or_default()
            .is_empty());
    }

    #[test]
    fn invalid_requests_are_rejections_and_faults_are_not() {
        assert!(is_rejection(400, ""));
        assert!(is_rejection(422, "{}"));
        assert!(!is_rejection(429, "rate limited"));
        assert!(!is_rejection(408, ""));
        assert!(is_rejection(
            500,
            r#"{"detail":[{"type":"literal_error","msg":"Input should be 'text' or 'json_object'"}]}"#
        ));
        assert!(!is_rejection(500, "internal error"));
        assert!(!is_rejection(503, "overloaded"));
    }

    #[test]
    fn excerpts_are_bounded_one_line_messages() {
        assert_eq!(
            error_excerpt(r#"{"error": {"message": "bad\nformat", "code": 400}}"#),
            "bad format"
        );
        assert_eq!(
            error_excerpt(r#"{"detail":[{"msg":"Input should be 'text' or 'json_object'"}]}"#),
            "Input should be 'text' or 'json_object'"
        );
        assert_eq!(error_excerpt("plain\n\n text "), "plain text");
        let long = error_excerpt(&"x".repeat(10_000));
        assert_eq!(long.chars().count(), ERROR_EXCERPT_CHARS + 1);
        assert!(long.ends_with('…'));
    }
}
