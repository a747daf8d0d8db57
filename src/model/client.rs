//! The OpenAI-compatible chat-completions client (async-openai over reqwest).
//!
//! Entry point: [`ModelClient::send`] posts a [`PreparedRequest`]'s exact bytes to
//! `{model.base_url}/chat/completions` once and classifies what went wrong as transport
//! or parse. It never retries by itself (async-openai's default retry layer is replaced
//! by a bare reqwest service) and has no timeout of its own: callers wrap it, and
//! dropping the future drops the request, which closes its connection.

use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::ReqwestService;
use async_openai::Client;
use serde_json::Value;

use super::prompts::PreparedRequest;
use crate::config::ModelConfig;
use crate::domain::audit::AttemptOutcome;

/// Why a call produced no envelope: `Transport` (connect, reset, HTTP error status) or
/// `Parse` (the body is not JSON), with a data-free detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    pub class: AttemptOutcome,
    pub detail: String,
}

#[derive(Clone)]
pub struct ModelClient {
    client: Client<OpenAIConfig>,
}

impl std::fmt::Debug for ModelClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelClient").finish_non_exhaustive()
    }
}

impl ModelClient {
    /// Builds the client from configuration; every field is set explicitly so that no
    /// `OPENAI_*` environment variable can override the harness's own settings.
    pub fn new(config: &ModelConfig) -> Result<ModelClient, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let openai = OpenAIConfig::default()
            .with_api_base(config.base_url.clone())
            .with_api_key(config.api_key.clone())
            .with_org_id("")
            .with_project_id("");
        let client =
            Client::build(http.clone(), openai).with_http_service(ReqwestService::new(http));
        Ok(ModelClient { client })
    }

    /// One POST of the prepared bytes; the chat-completion envelope as JSON.
    pub async fn send(&self, request: &PreparedRequest) -> Result<Value, SendFailure> {
        self.client
            .chat()
            .create_byot::<&serde_json::value::RawValue, Value>(request.body())
            .await
            .map_err(classify)
    }
}

fn classify(error: OpenAIError) -> SendFailure {
    let (class, detail) = match &error {
        OpenAIError::ApiError(api) => (
            AttemptOutcome::Transport,
            format!("HTTP {}", api.status_code.as_u16()),
        ),
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
    SendFailure { class, detail }
}
