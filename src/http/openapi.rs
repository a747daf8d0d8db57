//! The OpenAPI 3 document of the HTTP API, generated from the route annotations in
//! `routes.rs` (utoipa) and served at `/openapi.json`. The schema types below describe the
//! JSON bodies of CONTRACT §3; they exist for documentation only.

use std::sync::OnceLock;

use serde_json::Value;
use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, AnyOfBuilder, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::{Modify, OpenApi, ToSchema};

/// Body of `POST /v1/runs/{run_id}/release`: no other fields; FINAL_ANSWER needs a draft
/// (see [`ReleaseBodyRules`]).
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(example = json!({
    "query": "Why are order-api requests timing out since 10:00?",
    "draft": {
        "conclusion": {"text": "order-api exhausts its connection pool to orders-db.", "analysis_refs": ["A1"]},
        "analyses": [{"id": "A1", "kind": "NORMAL", "text": "order-api logged 132 timeouts.", "tool_call_ids": ["call-log-01"]}]
    },
    "stop_reason": "FINAL_ANSWER"
}))]
pub struct ReleaseBodyDoc {
    /// The operator's question; required, non-blank (at least one non-whitespace character).
    #[schema(pattern = r"\S")]
    query: String,
    /// The Draft: a JSON object, or the agent's raw text as a string, parsed strictly. Any
    /// other JSON value is an unparseable Draft, which is a release outcome (200), not an
    /// error. Required for FINAL_ANSWER; ignored for controlled stops. `null` = no draft.
    #[schema(schema_with = draft_schema)]
    draft: Option<Value>,
    /// FINAL_ANSWER (default), INFORMATION_SATURATION or BUDGET_EXHAUSTED; `null` = default.
    stop_reason: Option<StopReasonDoc>,
}

/// `draft` takes any JSON value.
fn draft_schema() -> impl Into<RefOr<Schema>> {
    ObjectBuilder::new().schema_type(SchemaType::AnyValue)
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
    outcome: OutcomeDoc,
    /// For FALLBACK its type; else null.
    #[schema(required = true)]
    fallback_type: Option<FallbackTypeDoc>,
    /// The fixed SafeFallback text of the fallback type; else null.
    #[schema(required = true)]
    message: Option<String>,
    /// SUCCESS only: the user-visible Draft, unchanged, without tool call ids.
    #[schema(value_type = Option<Object>, required = true)]
    report: Option<Value>,
    verified_sources: Vec<VerifiedSourceDoc>,
    observed_facts: Vec<ObservedFactDoc>,
    missing_context: Vec<String>,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub enum OutcomeDoc {
    #[schema(rename = "SUCCESS")]
    Success,
    #[schema(rename = "FALLBACK")]
    Fallback,
    #[schema(rename = "CANCELLED")]
    Cancelled,
}

#[derive(ToSchema)]
#[allow(dead_code, clippy::enum_variant_names)]
pub enum FallbackTypeDoc {
    #[schema(rename = "EVIDENCE_VALIDATION_FAILED")]
    EvidenceValidationFailed,
    #[schema(rename = "SEMANTIC_UNSUPPORTED")]
    SemanticUnsupported,
    #[schema(rename = "SEMANTIC_UNAVAILABLE")]
    SemanticUnavailable,
    #[schema(rename = "MISSING_REQUIRED_CONTEXT")]
    MissingRequiredContext,
    #[schema(rename = "INSUFFICIENT_EVIDENCE")]
    InsufficientEvidence,
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
    /// Always true: the run is marked cancelled.
    cancelled: bool,
}

/// The answer to a cancel of a run whose result is already stored: nothing was done (a
/// stored result never changes).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct CancelStoredDoc {
    run_id: String,
    /// Whether the stored result is CANCELLED (an earlier cancel); false for every other
    /// outcome: this cancel changed nothing.
    cancelled: bool,
    /// The stored result's outcome.
    outcome: OutcomeDoc,
    #[schema(required = true)]
    fallback_type: Option<FallbackTypeDoc>,
    /// Says that the result is stored and was not changed.
    message: String,
}

/// The audit record (CONTRACT §4), the operators' view of one release. The nested
/// objects are described in README.md.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct AuditDoc {
    run_id: String,
    stop_reason: StopReasonDoc,
    /// The branch of the release decision, e.g. `controlled_stop`; null if none was taken.
    #[schema(required = true)]
    path: Option<String>,
    /// Why the Draft could not be parsed (a schema position, never its content).
    #[schema(required = true)]
    draft_error: Option<String>,
    #[schema(value_type = Vec<Object>)]
    violations: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    excluded_references: Vec<Value>,
    #[schema(value_type = Option<Object>, required = true)]
    repair: Option<Value>,
    #[schema(value_type = Vec<Object>)]
    model_attempts: Vec<Value>,
    #[schema(value_type = Option<Object>, required = true)]
    verdict: Option<Value>,
    #[schema(value_type = Object)]
    budget: Value,
    #[schema(value_type = Object)]
    timings: Value,
    outcome: OutcomeDoc,
    #[schema(required = true)]
    fallback_type: Option<FallbackTypeDoc>,
    /// `http`, `pubsub` or `marker` for CANCELLED; else null.
    #[schema(required = true)]
    cancelled_by: Option<String>,
    /// Only when the commit found the cancel marker: what had been decided.
    #[schema(value_type = Option<Object>)]
    superseded: Option<Value>,
    /// What the console shows of the run (bounded, at most 40 KB): `query`, `draft` (as
    /// submitted, with its citations), `repaired_draft` (an accepted repair), `evidence`
    /// (the verified snapshot the judge read, by analysis), and `omitted` (parts left out
    /// to stay within the bound). Absent when the release stopped before reading the run.
    #[schema(value_type = Option<Object>)]
    view: Option<Value>,
}

/// A page of `GET /v1/decisions`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DecisionPageDoc {
    /// Newest first.
    decisions: Vec<DecisionDoc>,
    /// Pass as `before` for the next page; null when nothing older is left.
    #[schema(required = true)]
    next_before: Option<String>,
}

/// One entry of the decision stream `P:decisions`: a committed release.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DecisionDoc {
    /// The stream entry id, `MS-SEQ` (MS: when it was appended, Unix ms).
    id: String,
    run_id: String,
    /// SUCCESS, FALLBACK or CANCELLED (any text, for entries not written by the harness).
    outcome: String,
    #[schema(required = true)]
    fallback_type: Option<String>,
    /// The replica that released the run.
    replica: String,
    /// When the release began (RFC 3339).
    time: String,
    #[schema(required = true)]
    total_ms: Option<f64>,
    /// The harness's own time: total less the time spent waiting on the model.
    #[schema(required = true)]
    overhead_ms: Option<f64>,
    /// SemanticGuard's verdict, if it gave one.
    #[schema(required = true)]
    verdict: Option<String>,
    #[schema(required = true)]
    model_attempts: Option<u64>,
}

/// Decisions per outcome in a time window.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct OutcomeCountsDoc {
    #[schema(rename = "SUCCESS")]
    success: u64,
    #[schema(rename = "FALLBACK")]
    fallback: u64,
    #[schema(rename = "CANCELLED")]
    cancelled: u64,
}

/// A release in flight on the answering replica.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct RunInFlightDoc {
    run_id: String,
    running_ms: u64,
    /// Whether it holds the run's lock yet.
    lock_held: bool,
}

/// The console's header: `GET /v1/overview`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct OverviewDoc {
    /// The replica that answered (the releases in flight are its own).
    replica: String,
    last_5m: OutcomeCountsDoc,
    last_60m: OutcomeCountsDoc,
    /// False when the last hour held more decisions than were read.
    complete: bool,
    in_flight: Vec<RunInFlightDoc>,
}

/// The body of `/healthz` (`ok`) and `/readyz` (`ready`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct StatusDoc {
    status: String,
}

/// What the derive cannot say about the release body: it has no other fields, and
/// FINAL_ANSWER (also the default) needs a non-null draft. The derived object becomes the
/// first half of an `allOf`; the second half is an `anyOf` of the two ways to be valid.
struct ReleaseBodyRules;

impl Modify for ReleaseBodyRules {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let Some(schemas) = openapi.components.as_mut().map(|c| &mut c.schemas) else {
            return;
        };
        let Some(RefOr::T(Schema::Object(mut body))) = schemas.remove("ReleaseBodyDoc") else {
            return;
        };
        body.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
        let example = body.example.take();
        let controlled_stop = ObjectBuilder::new()
            .property(
                "stop_reason",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["INFORMATION_SATURATION", "BUDGET_EXHAUSTED"])),
            )
            .required("stop_reason");
        let with_draft = ObjectBuilder::new()
            .property(
                "draft",
                ObjectBuilder::new().schema_type(SchemaType::from_iter([
                    Type::Object,
                    Type::String,
                    Type::Array,
                    Type::Number,
                    Type::Boolean,
                ])),
            )
            .required("draft");
        let rules = AllOfBuilder::new()
            .description(body.description.take())
            .examples(example)
            .item(body)
            .item(AnyOfBuilder::new().item(controlled_stop).item(with_draft));
        schemas.insert("ReleaseBodyDoc".to_string(), rules.into());
    }
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
        super::routes::decisions,
        super::routes::overview,
        super::routes::healthz,
        super::routes::readyz,
        super::routes::metrics
    ),
    components(schemas(
        ReleaseBodyDoc,
        StopReasonDoc,
        ReleaseResultDoc,
        OutcomeDoc,
        FallbackTypeDoc,
        VerifiedSourceDoc,
        ObservedFactDoc,
        ErrorDoc,
        ErrorDetailDoc,
        CancelDoc,
        CancelStoredDoc,
        AuditDoc,
        StatusDoc,
        DecisionPageDoc,
        DecisionDoc,
        OutcomeCountsDoc,
        RunInFlightDoc,
        OverviewDoc
    )),
    modifiers(&BearerAuth, &ReleaseBodyRules)
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
