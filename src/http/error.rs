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
    #[error("a release of this run is already in flight{}; retry after {} s", .holder.as_deref().map(|h| format!(" on replica {h}")).unwrap_or_default(), .retry_after_secs)]
    Conflict {
        holder: Option<String>,
        retry_after_secs: u64,
    },
    #[error("this release lost its lock before it could store a result (its lease ran out or was taken over), so it stored nothing; retry: the retry answers the stored result, if another release stored one")]
    LockLost,
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the request body did not arrive in time")]
    RequestTimeout,
    #[error("the store is unavailable; nothing was released or stored, and a retry is safe")]
    StoreUnavailable(#[source] StoreError),
    #[error("a store write was sent and then failed: it may or may not have taken effect; a retry is safe and answers the stored result if there is one")]
    StoreOutcomeUnknown(#[source] StoreError),
    #[error("the service is shutting down")]
    ShuttingDown,
    #[error("this replica has as many releases in flight as it admits (server.max_in_flight); nothing was done: retry after {retry_after_secs} s, on any replica")]
    Overloaded { retry_after_secs: u64 },
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
            ApiError::Conflict { .. } => "release_in_flight",
            ApiError::LockLost => "lock_lost",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::StoreUnavailable(_) => "store_unavailable",
            ApiError::StoreOutcomeUnknown(_) => "store_outcome_unknown",
            ApiError::ShuttingDown => "shutting_down",
            ApiError::Overloaded { .. } => "overloaded",
            ApiError::Internal(_) => "internal",
        }
    }

    fn log(&self) {
        match self {
            ApiError::Unauthorized
            | ApiError::BadRequest(_)
            | ApiError::NotFound(_)
            | ApiError::MethodNotAllowed
            | ApiError::Conflict { .. }
            | ApiError::PayloadTooLarge { .. }
            | ApiError::RequestTimeout
            | ApiError::ShuttingDown
            | ApiError::Overloaded { .. } => {
                tracing::debug!(code = self.code(), "request refused: {self}")
            }
            // The store adapter reports an outage once per interval, naming Redis
            // (store::outage); a line per refused request would bury it.
            ApiError::StoreUnavailable(e) => {
                tracing::debug!(code = self.code(), error = %e, "store unavailable")
            }
            ApiError::StoreOutcomeUnknown(e) => {
                tracing::warn!(code = self.code(), error = %e, "store outcome unknown")
            }
            ApiError::LockLost => tracing::warn!(code = self.code(), "release lost its lock"),
            ApiError::Internal(detail) => {
                tracing::error!(code = self.code(), detail, "internal error")
            }
        }
    }
}

impl From<ReleaseError> for ApiError {
    fn from(e: ReleaseError) -> Self {
        match e {
            ReleaseError::InFlight {
                holder,
                retry_after,
            } => ApiError::Conflict {
                holder,
                retry_after_secs: retry_after.as_millis().div_ceil(1000).max(1) as u64,
            },
            ReleaseError::LockLost => ApiError::LockLost,
            ReleaseError::Store(e) => e.into(),
            ReleaseError::ShuttingDown => ApiError::ShuttingDown,
            ReleaseError::Overloaded { retry_after } => ApiError::Overloaded {
                retry_after_secs: retry_after.as_secs().max(1),
            },
            ReleaseError::StoredResultUnreadable(detail) | ReleaseError::Internal(detail) => {
                ApiError::Internal(detail)
            }
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.outcome_unknown {
            ApiError::StoreOutcomeUnknown(e)
        } else {
            ApiError::StoreUnavailable(e)
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict { .. } | ApiError::LockLost => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::StoreUnavailable(_)
            | ApiError::StoreOutcomeUnknown(_)
            | ApiError::ShuttingDown
            | ApiError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        self.log();
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::Unauthorized => {
                response.insert_header(("WWW-Authenticate", "Bearer"));
            }
            ApiError::Conflict {
                retry_after_secs, ..
            } => {
                response.insert_header(("Retry-After", retry_after_secs.to_string()));
            }
            ApiError::LockLost => {
                response.insert_header(("Retry-After", "1"));
            }
            ApiError::Overloaded { retry_after_secs } => {
                response.insert_header(("Retry-After", retry_after_secs.to_string()));
            }
            _ => {}
        }
        response.json(json!({"error": {"code": self.code(), "message": self.to_string()}}))
    }
}
