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
use crate::domain::decision::{DecisionFilter, OutcomeCounts, StreamId};
use crate::domain::release::{FallbackType, Outcome};
use crate::domain::request::{parse_release, validate_run_id, RequestError};
use crate::store::{CancelAnswer, MAX_DECISIONS_SCANNED};
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
        (status = 200, description = "The release result, whatever the outcome (SUCCESS, FALLBACK, CANCELLED)", body = super::openapi::ReleaseResultDoc,
            headers(("Server-Timing" = String, description = "Where the release's time went, in ms: `evidence` (begin script and EvidenceGuard), `repair`, `judge` (SemanticGuard), `commit` (the fenced commit) and `harness` (the whole release less the time spent waiting on the model)"))),
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
            state.config.server.max_body_bytes.get(),
            Duration::from_millis(state.config.server.client_request_timeout_ms.get()),
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
    let mut response = json_body(released.json);
    if let Ok(timing) = HeaderValue::from_str(&released.times.header()) {
        response
            .headers_mut()
            .insert(header::HeaderName::from_static("server-timing"), timing);
    }
    Ok(response)
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
        retry_after_secs: state.config.server.overloaded_retry_after_s.get(),
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

/// `POST /v1/runs/{run_id}/cancel`: unless the run's result is stored, sets the durable
/// marker (one atomic step with that check), cancels the release here if it runs here,
/// and publishes the run id so that the replica running it aborts too (202). A run whose
/// result is stored is answered 200 with that result's outcome: a stored result never
/// changes, so nothing was cancelled. Not 409, which here always means "retry later".
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/cancel",
    tag = "releases",
    params(RunIdParam),
    responses(
        (status = 202, description = "The run is marked cancelled; its release is aborted on whichever replica runs it, and a release that starts later ends CANCELLED", body = super::openapi::CancelDoc),
        (status = 200, description = "The run's result is already stored and never changes: nothing was cancelled. `cancelled` is true only when the stored outcome is CANCELLED (an earlier cancel)", body = super::openapi::CancelStoredDoc),
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
    match state.store.cancel(&run_id).await? {
        CancelAnswer::Marked => {
            let running_here = state.shards.cancel(&run_id, CancelSource::Http).await;
            tracing::info!(run_id = %run_id, running_here, "cancel requested");
            Ok(HttpResponse::Accepted().json(json!({"run_id": run_id, "cancelled": true})))
        }
        CancelAnswer::AlreadyStored(stored) => {
            #[derive(serde::Deserialize)]
            struct Stored {
                outcome: Option<String>,
                fallback_type: Option<String>,
            }
            let stored: Stored = serde_json::from_str(&stored).unwrap_or(Stored {
                outcome: None,
                fallback_type: None,
            });
            let cancelled = stored.outcome.as_deref() == Some("CANCELLED");
            tracing::info!(run_id = %run_id, outcome = stored.outcome.as_deref().unwrap_or("-"), "cancel of a stored result: nothing to do");
            Ok(HttpResponse::Ok().json(json!({
                "run_id": run_id,
                "cancelled": cancelled,
                "outcome": stored.outcome,
                "fallback_type": stored.fallback_type,
                "message": "the run's result is already stored and never changes: this cancel changed nothing",
            })))
        }
    }
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

/// The query of `GET /v1/decisions`, as [`decisions`] checks it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct DecisionsParams {
    /// How many decisions at most (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// A stream entry id (`MS-SEQ`, the `next_before` of the previous page): only older
    /// decisions.
    #[param(pattern = "^[0-9]{1,19}-[0-9]{1,19}$", example = "1765100000000-0")]
    before: Option<String>,
    /// Only this outcome.
    outcome: Option<super::openapi::OutcomeDoc>,
    /// Only this fallback type.
    fallback_type: Option<super::openapi::FallbackTypeDoc>,
}

/// `DecisionsParams` read from the query string; unknown parameters are ignored.
fn decisions_params(
    request: &HttpRequest,
) -> Result<(usize, Option<StreamId>, DecisionFilter), ApiError> {
    let invalid =
        |name, problem| ApiError::BadRequest(RequestError::InvalidParameter { name, problem });
    let query = web::Query::<Vec<(String, String)>>::from_query(request.query_string())
        .map_err(|_| invalid("query", "not a valid query string"))?
        .into_inner();
    let mut limit = 50;
    let mut before = None;
    let mut filter = DecisionFilter::default();
    for (name, value) in &query {
        match name.as_str() {
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=200).contains(n))
                    .ok_or_else(|| invalid("limit", "must be a whole number from 1 to 200"))?
            }
            "before" => {
                let short = value
                    .split_once('-')
                    .is_some_and(|(ms, seq)| ms.len() <= 19 && seq.len() <= 19);
                before = Some(
                    StreamId::parse(value)
                        .filter(|_| short)
                        .ok_or_else(|| invalid("before", "must be a stream entry id MS-SEQ"))?,
                )
            }
            "outcome" => {
                filter.outcome = Some(
                    [Outcome::Success, Outcome::Fallback, Outcome::Cancelled]
                        .into_iter()
                        .find(|o| o.as_str() == value)
                        .ok_or_else(|| {
                            invalid("outcome", "must be SUCCESS, FALLBACK or CANCELLED")
                        })?,
                )
            }
            "fallback_type" => {
                filter.fallback_type = Some(
                    FallbackType::ALL
                        .into_iter()
                        .find(|f| f.as_str() == value)
                        .ok_or_else(|| invalid("fallback_type", "must be a fallback type"))?,
                )
            }
            _ => {}
        }
    }
    Ok((limit, before, filter))
}

/// `GET /v1/decisions`: the newest decisions first, from the stream `P:decisions`.
#[utoipa::path(
    get,
    path = "/v1/decisions",
    tag = "operations",
    params(DecisionsParams),
    responses(
        (status = 200, description = "The newest decisions first (at most `limit`), and the cursor of the next page: `next_before` (null: nothing older). A filter that matches little may answer fewer than `limit` with a cursor: at most 5,000 entries are read per page", body = super::openapi::DecisionPageDoc),
        (status = 400, description = "`bad_request`: a parameter out of range", body = super::openapi::ErrorDoc),
        (status = 401, description = "Missing or wrong bearer token", body = super::openapi::ErrorDoc),
        (status = 503, description = "Redis unavailable", body = super::openapi::ErrorDoc),
    ),
    security(("bearer" = []))
)]
pub async fn decisions(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state.config.server.api_token)?;
    let (limit, before, filter) = decisions_params(&request)?;
    let page = state.store.decisions(limit, before, filter).await?;
    Ok(with_page_headers(HttpResponse::Ok()).json(page))
}

/// `GET /v1/overview`: the console's header.
#[utoipa::path(
    get,
    path = "/v1/overview",
    tag = "operations",
    responses(
        (status = 200, description = "Decisions per outcome over the last 5 and 60 minutes (from `P:decisions`, all replicas; at most 5,000 read, `complete` false past that), and the releases in flight on the replica that answers", body = super::openapi::OverviewDoc),
        (status = 401, description = "Missing or wrong bearer token", body = super::openapi::ErrorDoc),
        (status = 503, description = "Redis unavailable", body = super::openapi::ErrorDoc),
    ),
    security(("bearer" = []))
)]
pub async fn overview(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&request, &state.config.server.api_token)?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let (hour, more) = state
        .store
        .decisions_since(now_ms.saturating_sub(3_600_000), MAX_DECISIONS_SCANNED)
        .await?;
    let (mut last_5m, mut last_60m) = (OutcomeCounts::default(), OutcomeCounts::default());
    let recent = now_ms.saturating_sub(300_000);
    for record in &hour {
        last_60m.add(&record.outcome);
        if StreamId::parse(&record.id).is_some_and(|id| id.ms >= recent) {
            last_5m.add(&record.outcome);
        }
    }
    let in_flight = state.shards.runs_in_flight(100).await;
    let body = json!({
        "replica": state.replica.as_ref(),
        "last_5m": last_5m,
        "last_60m": last_60m,
        "complete": !more,
        "in_flight": in_flight,
    });
    Ok(with_page_headers(HttpResponse::Ok()).json(body))
}

/// The headers of the console's answers (and of its JSON routes): no framing, no sniffing,
/// no referrer, and a policy that runs only the console's own script and styles (no inline
/// script, no `eval`, no other host).
fn with_page_headers(
    mut response: actix_web::HttpResponseBuilder,
) -> actix_web::HttpResponseBuilder {
    response
        .insert_header(("Content-Security-Policy", CONSOLE_CSP))
        .insert_header(("X-Frame-Options", "DENY"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .insert_header(("Cache-Control", "no-store"));
    response
}

/// The console's Content-Security-Policy.
pub const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const CONSOLE_HTML: &str = include_str!("console/index.html");
const CONSOLE_JS: &str = include_str!("console/console.js");
const CONSOLE_CSS: &str = include_str!("console/console.css");

/// `GET /console`: the operators' page (no token needed to load it: it holds no data; its
/// script asks for the token and calls the `/v1` routes with it).
pub async fn console_page() -> HttpResponse {
    with_page_headers(HttpResponse::Ok())
        .content_type("text/html; charset=utf-8")
        .body(CONSOLE_HTML)
}

/// `GET /console/console.js`.
pub async fn console_script() -> HttpResponse {
    with_page_headers(HttpResponse::Ok())
        .content_type("text/javascript; charset=utf-8")
        .body(CONSOLE_JS)
}

/// `GET /console/console.css`.
pub async fn console_style() -> HttpResponse {
    with_page_headers(HttpResponse::Ok())
        .content_type("text/css; charset=utf-8")
        .body(CONSOLE_CSS)
}
