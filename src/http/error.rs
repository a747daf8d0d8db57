//! The API's one error type. Its HTTP status, JSON code and log level come from exhaustive
//! matches here, and it becomes `{"error": {"code", "message"}}` in one place.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::actors::ReleaseError;
use crate::domain::request::RequestError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    BadRequest(#[from] RequestError),
    #[error("{0}")]
    NotFound(&'static str),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("a release of this run is already in flight")]
    Conflict,
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the request body did not arrive in time")]
    RequestTimeout,
    #[error("the store is unavailable; nothing was released or stored")]
    StoreUnavailable(#[source] StoreError),
    #[error("the service is shutting down")]
    ShuttingDown,
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::BadRequest(RequestError::InvalidRunId) => "invalid_run_id",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Conflict => "release_in_flight",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::StoreUnavailable(_) => "store_unavailable",
            ApiError::ShuttingDown => "shutting_down",
            ApiError::Internal(_) => "internal",
        }
    }

    fn log(&self) {
        match self {
            ApiError::Unauthorized
            | ApiError::BadRequest(_)
            | ApiError::NotFound(_)
            | ApiError::MethodNotAllowed
            | ApiError::Conflict
            | ApiError::PayloadTooLarge { .. }
            | ApiError::RequestTimeout
            | ApiError::ShuttingDown => {
                tracing::debug!(code = self.code(), "request refused: {self}")
            }
            ApiError::StoreUnavailable(e) => {
                tracing::warn!(code = self.code(), error = %e, "store unavailable")
            }
            ApiError::Internal(detail) => {
                tracing::error!(code = self.code(), detail, "internal error")
            }
        }
    }
}

impl From<ReleaseError> for ApiError {
    fn from(e: ReleaseError) -> Self {
        match e {
            ReleaseError::InFlight => ApiError::Conflict,
            ReleaseError::Store(e) => ApiError::StoreUnavailable(e),
            ReleaseError::ShuttingDown => ApiError::ShuttingDown,
            ReleaseError::StoredResultUnreadable(detail) | ReleaseError::Internal(detail) => {
                ApiError::Internal(detail)
            }
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::StoreUnavailable(e)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::StoreUnavailable(_) | ApiError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        self.log();
        let mut response = HttpResponse::build(self.status_code());
        if matches!(self, ApiError::Unauthorized) {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        response.json(json!({"error": {"code": self.code(), "message": self.to_string()}}))
    }
}
