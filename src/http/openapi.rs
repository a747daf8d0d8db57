//! The OpenAPI 3 document of the HTTP API, generated from the route annotations in
//! `routes.rs` (utoipa) and served at `/openapi.json`. The schema types below describe the
//! JSON bodies of CONTRACT §3; they exist for documentation only.

use std::sync::OnceLock;

use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// Body of `POST /v1/runs/{run_id}/release`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ReleaseBodyDoc {
    /// The operator's question; required, non-blank.
    query: String,
    /// The Draft: a JSON object, or the agent's raw text (parsed strictly). Required for
    /// FINAL_ANSWER; ignored for controlled stops. `null` = no draft.
    #[schema(value_type = Option<Object>)]
    draft: Option<Value>,
    /// FINAL_ANSWER (default), INFORMATION_SATURATION or BUDGET_EXHAUSTED.
    stop_reason: Option<StopReasonDoc>,
}

#[derive(ToSchema)]
#[allow(dead_code, clippy::enum_variant_names)]
pub enum StopReasonDoc {
    #[schema(rename = "FINAL_ANSWER")]
    FinalAnswer,
    #[schema(rename = "INFORMATION_SATURATION")]
    InformationSaturation,
    #[schema(rename = "BUDGET_EXHAUSTED")]
    BudgetExhausted,
}

/// The release result: always exactly these eight keys.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ReleaseResultDoc {
    run_id: String,
    /// SUCCESS, FALLBACK or CANCELLED.
    outcome: String,
    /// For FALLBACK: EVIDENCE_VALIDATION_FAILED, SEMANTIC_UNSUPPORTED, SEMANTIC_UNAVAILABLE,
    /// MISSING_REQUIRED_CONTEXT or INSUFFICIENT_EVIDENCE; else null.
    fallback_type: Option<String>,
    /// The fixed SafeFallback text of the fallback type; else null.
    message: Option<String>,
    /// SUCCESS only: the user-visible Draft, unchanged, without tool call ids.
    #[schema(value_type = Option<Object>)]
    report: Option<Value>,
    verified_sources: Vec<VerifiedSourceDoc>,
    observed_facts: Vec<ObservedFactDoc>,
    missing_context: Vec<String>,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct VerifiedSourceDoc {
    /// rag_search, log_search or mysql_query.
    tool: String,
    /// RAG doc_id, log service, or MySQL datasource.
    source: String,
    /// The projection's scope, unchanged.
    #[schema(value_type = Object)]
    scope: Value,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ObservedFactDoc {
    tool: String,
    /// EVIDENCE_FOUND or NO_EVIDENCE.
    evidence_status: String,
    #[schema(value_type = Object)]
    scope: Value,
    /// Written by the harness from the record, never from the Draft.
    summary: String,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorDoc {
    error: ErrorDetailDoc,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorDetailDoc {
    /// A stable machine-readable code, e.g. invalid_run_id, unauthorized, release_in_flight.
    code: String,
    message: String,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct CancelDoc {
    run_id: String,
    cancelled: bool,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "release-harness",
        description = "Decides whether an AI diagnosis agent's report may be released: EvidenceGuard, repair, SemanticGuard, fail-closed SafeFallback."
    ),
    paths(
        super::routes::release,
        super::routes::get_release,
        super::routes::get_audit,
        super::routes::cancel,
        super::routes::healthz,
        super::routes::readyz,
        super::routes::metrics
    ),
    components(schemas(
        ReleaseBodyDoc,
        StopReasonDoc,
        ReleaseResultDoc,
        VerifiedSourceDoc,
        ObservedFactDoc,
        ErrorDoc,
        ErrorDetailDoc,
        CancelDoc
    )),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

/// The document as JSON text, built once.
pub fn document() -> String {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| {
            ApiDoc::openapi()
                .to_pretty_json()
                .unwrap_or_else(|_| "{}".into())
        })
        .clone()
}
