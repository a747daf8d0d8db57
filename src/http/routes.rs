//! The HTTP routes of CONTRACT §3. Each handler authenticates, validates the run id (after
//! percent-decoding), reads a bounded body, then calls the registry or the store; every
//! failure is an [`ApiError`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use actix_web::http::header::{self, ContentType, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError, Route};
use futures::StreamExt;
use percent_encoding::percent_decode_str;
use serde_json::json;

use super::auth::authorize;
use super::error::ApiError;
use super::{AppState, WorkerRegistry};
use crate::actors::{ReleaseError, StartRelease};
use crate::domain::audit::CancelSource;
use crate::domain::request::{parse_release, validate_run_id, RequestError};
use crate::telemetry;

/// The run id segment of `/v1/runs/{run_id}/...`, percent-decoded once and validated.
/// It is read from the raw path so that nothing is decoded twice.
fn run_id(request: &HttpRequest) -> Result<String, ApiError> {
    let raw = request.uri().path().split('/').nth(3).unwrap_or_default();
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| ApiError::BadRequest(RequestError::InvalidRunId))?;
    validate_run_id(&decoded)?;
    Ok(decoded.into_owned())
}

/// Reads the body up to `limit` bytes within `timeout`.
async fn read_body(
    request: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
    timeout: Duration,
) -> Result<web::Bytes, ApiError> {
    let declared = request
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let read = async {
        let mut body = web::BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::BadRequest(RequestError::Malformed(e.to_string())))?;
            if body.len() + chunk.len() > limit {
                return Err(ApiError::PayloadTooLarge { limit });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| ApiError::RequestTimeout)?
}

/// The `{run_id}` path parameter of every `/v1` route, as [`run_id`] checks it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct RunIdParam {
    /// 1 to 128 characters of `[A-Za-z0-9._:-]`, percent-decoded once; anything else is a
    /// 400 `invalid_run_id`. An unknown run is an empty run, not an error.
    #[param(
        pattern = "^[A-Za-z0-9._:-]{1,128}$",
        example = "r-order-api-timeout-success"
    )]
    run_id: String,
}

/// The 404 of a `/v1` route whose path matches no route at all.
const NO_SUCH_ROUTE: &str = "`not_found`: no such route (the run id segment is empty or holds a `/`, or the client removed a `.`/`..` segment)";

fn json_body(text: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(ContentType::json())
        .body(text)
}

/// `POST /v1/runs/{run_id}/release`: releases the run and answers its result (200),
/// whatever the outcome.
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/release",
    tag = "releases",
    params(RunIdParam),
    request_body(content = super::openapi::ReleaseBodyDoc, description = "query, draft (object or raw text), stop_reason"),
    responses(
        (status = 200, description = "The release result, whatever the outcome (SUCCESS, FALLBACK, CANCELLED)", body = super::openapi::ReleaseResultDoc),
        (status = 400, description = "Malformed body or run id", body = super::openapi::ErrorDoc),
        (status = 401, description = "Missing or wrong bearer token", body = super::openapi::ErrorDoc),
        (status = 404, description = NO_SUCH_ROUTE, body = super::openapi::ErrorDoc),
        (status = 408, description = "The body did not arrive in time", body = super::openapi::ErrorDoc),
        (status = 409, description = "`release_in_flight`: a release of this run holds its lock on some replica (the message names it); `lock_lost`: this release lost its lease before it could store. Both carry Retry-After (whole seconds, at least 1)", body = super::openapi::ErrorDoc),
        (status = 413, description = "Body over server.max_body_bytes", body = super::openapi::ErrorDoc),
        (status = 503, description = "`store_unavailable`: Redis unavailable, nothing released or stored; `store_outcome_unknown`: the commit was sent and may have run; `shutting_down`; `overloaded`: the replica has server.max_in_flight releases in flight, nothing was done (with Retry-After, whole seconds, at least 1). A retry is safe and answers the stored result if there is one", body = super::openapi::ErrorDoc),
    ),
    security(("bearer" = []))
)]
pub async fn release(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    registry: web::Data<WorkerRegistry>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state.config.server.api_token)?;
    let run_id = run_id(&request)?;
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::ShuttingDown);
    }
    // A full replica decides at the door, without reading the body.
    if state.admission.is_full() {
        return replay_or_shed(&state, &run_id).await;
    }
    // The body's bytes are let go once parsed: a release waiting on the model holds only
    // what the run needs, not the request it came in.
    let release_request = {
        let body = read_body(
            &request,
            payload,
            state.config.server.max_body_bytes,
            Duration::from_millis(state.config.server.client_request_timeout_ms),
        )
        .await?;
        parse_release(&run_id, &body)?
    };
    tracing::info!(run_id = %run_id, stop_reason = ?release_request.stop_reason, "release requested");
    let released = match registry.0.send(StartRelease(release_request)).await {
        Ok(Ok(released)) => released,
        Ok(Err(e @ ReleaseError::Overloaded { .. })) => {
            // Full since the door's check: still nothing was done.
            telemetry::shed("overloaded");
            return Err(e.into());
        }
        Ok(Err(e)) => return Err(e.into()),
        Err(e) => return Err(ApiError::Internal(e.to_string())),
    };
    tracing::info!(
        run_id = %run_id,
        outcome = released.result.outcome.as_str(),
        fallback_type = released.result.fallback_type.map(|f| f.as_str()).unwrap_or("none"),
        replayed = released.replayed,
        "release answered"
    );
    Ok(json_body(released.json))
}

/// A release arriving at a full replica: the run's stored result if it has one (one Redis
/// read; a release of it would only answer that), else `503 overloaded` with `Retry-After`.
/// Nothing else is done: no lock, script or model call. A read that fails is a shed too,
/// never a store error answer: the replica is full either way.
async fn replay_or_shed(state: &AppState, run_id: &str) -> Result<HttpResponse, ApiError> {
    if let Ok(Some(json)) = state.store.get_result(run_id).await {
        tracing::info!(run_id = %run_id, "release answered from the store while full");
        return Ok(json_body(json));
    }
    telemetry::shed("overloaded");
    Err(ApiError::Overloaded {
        retry_after_secs: state.config.server.overloaded_retry_after_s.max(1),
    })
}

/// `GET /v1/runs/{run_id}/release`: the stored result, or 404.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}/release",
    tag = "releases",
    params(RunIdParam),
    responses(
        (status = 200, description = "The stored release result", body = super::openapi::ReleaseResultDoc),
        (status = 400, description = "Malformed run id", body = super::openapi::ErrorDoc),
        (status = 401, description = "Missing or wrong bearer token", body = super::openapi::ErrorDoc),
        (status = 404, description = "`not_found`: no release stored for this run, or no such route (the run id segment is empty or holds a `/`, or the client removed a `.`/`..` segment)", body = super::openapi::ErrorDoc),
        (status = 503, description = "Redis unavailable", body = super::openapi::ErrorDoc),
    ),
    security(("bearer" = []))
)]
pub async fn get_release(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state.config.server.api_token)?;
    let run_id = run_id(&request)?;
    match state.store.get_result(&run_id).await? {
        Some(json) => Ok(json_body(json)),
        None => Err(ApiError::NotFound("no release is stored for this run")),
    }
}

/// `GET /v1/runs/{run_id}/audit`: the audit record, or 404.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}/audit",
    tag = "releases",
    params(RunIdParam),
    responses(
        (status = 200, description = "The audit record: violations, repair, model attempts, verdict and reason, budget, timings", body = super::openapi::AuditDoc),
        (status = 400, description = "Malformed run id", body = super::openapi::ErrorDoc),
        (status = 401, description = "Missing or wrong bearer token", body = super::openapi::ErrorDoc),
        (status = 404, description = "`not_found`: no audit record for this run, or no such route (the run id segment is empty or holds a `/`, or the client removed a `.`/`..` segment)", body = super::openapi::ErrorDoc),
        (status = 503, description = "Redis unavailable", body = super::openapi::ErrorDoc),
    ),
    security(("bearer" = []))
)]
pub async fn get_audit(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state.config.server.api_token)?;
    let run_id = run_id(&request)?;
    match state.store.get_audit(&run_id).await? {
        Some(json) => Ok(json_body(json)),
        None => Err(ApiError::NotFound("no audit record is stored for this run")),
    }
}

/// `POST /v1/runs/{run_id}/cancel`: cancels the run here at once, then sets the durable
/// marker and publishes the run id so that the replica running it aborts too (202).
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/cancel",
    tag = "releases",
    params(RunIdParam),
    responses(
        (status = 202, description = "The run is marked cancelled; its release is aborted on whichever replica runs it", body = super::openapi::CancelDoc),
        (status = 400, description = "Malformed run id", body = super::openapi::ErrorDoc),
        (status = 401, description = "Missing or wrong bearer token", body = super::openapi::ErrorDoc),
        (status = 404, description = NO_SUCH_ROUTE, body = super::openapi::ErrorDoc),
        (status = 503, description = "Redis unavailable (the marker could not be set)", body = super::openapi::ErrorDoc),
    ),
    security(("bearer" = []))
)]
pub async fn cancel(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state.config.server.api_token)?;
    let run_id = run_id(&request)?;
    let running_here = state.shards.cancel(&run_id, CancelSource::Http).await;
    state.store.cancel(&run_id).await?;
    tracing::info!(run_id = %run_id, running_here, "cancel requested");
    Ok(HttpResponse::Accepted().json(json!({"run_id": run_id, "cancelled": true})))
}

/// `GET /healthz`: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "The process is up: `{\"status\": \"ok\"}`", body = super::openapi::StatusDoc)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// `GET /readyz`: Redis answers, on the shared connection and on every worker's own, and
/// the process is not draining.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready, Redis reachable: `{\"status\": \"ready\"}`", body = super::openapi::StatusDoc),
        (status = 503, description = "Not ready: Redis unreachable, or shutting down", body = super::openapi::ErrorDoc),
    )
)]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if state.draining.load(Ordering::SeqCst) {
        telemetry::ready(false);
        return Err(ApiError::ShuttingDown);
    }
    let ping = super::redis_answers(&state.store, &state.shards).await;
    telemetry::ready(ping.is_ok());
    ping?;
    Ok(HttpResponse::Ok().json(json!({"status": "ready"})))
}

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain")))]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    state.gate.publish();
    let text = state
        .metrics
        .as_ref()
        .map(|h| h.render())
        .unwrap_or_default();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(text)
}

/// `GET /openapi.json`: this API's OpenAPI 3 document.
pub async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type(ContentType::json())
        .body(super::openapi::document())
}

/// Every other path.
pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound("no such route"))
}

/// A known path with a method it has no route for: the JSON 405, with the `Allow` header
/// that RFC 9110 requires (`allow` lists the path's methods).
pub fn method_not_allowed(allow: &'static str) -> Route {
    web::to(move || async move {
        let mut response = ApiError::MethodNotAllowed.error_response();
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
        response
    })
}
