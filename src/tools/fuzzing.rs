//! Fuzzing entry points: one function per parser of untrusted input, each taking raw bytes.
//! The `cargo fuzz` targets in `fuzz/` call them, and `tests/fuzz_corpus.rs` replays the
//! committed corpus through the same functions on the stable toolchain. See [`TARGETS`].
//!
//! A parser may reject anything; what these functions check is that it never panics and
//! that what it accepts is consistent (a parsed Draft serializes and parses back equal). A
//! broken invariant panics on purpose, which is how the fuzzer reports it.

use serde::Deserialize;

use crate::domain::draft::Draft;
use crate::domain::invocation::{resolve_call, RawRecord, ToolName};
use crate::domain::release::DraftInput;
use crate::domain::request::{in_two_steps, parse_release};
use crate::model::verdict::{parse_repaired_draft, parse_verdict};

/// A fuzz target: its name (also its file `fuzz/fuzz_targets/NAME.rs` and its corpus
/// directory `fuzz/corpus/NAME/`) and the function it runs on each input.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target.
pub const TARGETS: [Target; 7] = [
    ("draft", draft),
    ("projection_rag", projection_rag),
    ("projection_log", projection_log),
    ("projection_mysql", projection_mysql),
    ("verdict", verdict),
    ("repair_answer", repair_answer),
    ("request_body", request_body),
];

/// The run every fuzzed record belongs to.
const RUN_ID: &str = "r-fuzz";

/// The agent's Draft, as a request's `draft` field or a bundle's (an object or a string
/// holding raw text) and as raw text.
pub fn draft(data: &[u8]) {
    // The Draft parsers take text: every caller has already decoded UTF-8 (or rejected it).
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for parsed in [Draft::parse_submitted(text), Draft::parse_text(text)]
        .into_iter()
        .flatten()
    {
        assert_round_trip(&parsed);
    }
}

pub fn projection_rag(data: &[u8]) {
    projection(ToolName::RagSearch, data);
}

pub fn projection_log(data: &[u8]) {
    projection(ToolName::LogSearch, data);
}

pub fn projection_mysql(data: &[u8]) {
    projection(ToolName::MysqlQuery, data);
}

/// A SemanticGuard answer (the message content, after the envelope is read).
pub fn verdict(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(verdict) = parse_verdict(text) {
        assert!(
            !verdict.reason.trim().is_empty(),
            "an accepted verdict has a reason"
        );
    }
}

/// A repair model's answer: a whole Draft, accepted exactly when the strict parser accepts it.
pub fn repair_answer(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let repaired = parse_repaired_draft(text);
    assert_eq!(repaired.is_ok(), Draft::parse_text(text).is_ok());
    if let Ok(draft) = repaired {
        assert_round_trip(&draft);
    }
}

/// The body of `POST /v1/runs/{run_id}/release`, as the route reads it.
pub fn request_body(data: &[u8]) {
    let two_steps = in_two_steps(RUN_ID, data);
    assert_eq!(
        parse_release(RUN_ID, data),
        two_steps,
        "the one-pass parse answers what the two steps answer"
    );
    if let Ok(request) = two_steps {
        assert!(
            !request.query.trim().is_empty(),
            "an accepted query is not blank"
        );
        if let DraftInput::Parsed(draft) = &request.draft {
            assert_round_trip(draft);
        }
    }
}

/// An `agent_result` of `tool`, in an otherwise well-formed READY record. The record takes
/// the call id and evidence status the projection names (when it names them as strings), so
/// that inputs reach the data checks behind the header checks.
fn projection(tool: ToolName, data: &[u8]) {
    let Ok(agent_result) = std::str::from_utf8(data) else {
        return;
    };
    #[derive(Default, Deserialize)]
    struct Header {
        tool_call_id: Option<String>,
        evidence_status: Option<String>,
    }
    let header: Header = serde_json::from_str(agent_result).unwrap_or_default();
    let call_id = header.tool_call_id.unwrap_or_else(|| "call-fuzz".into());
    let status = header
        .evidence_status
        .unwrap_or_else(|| "EVIDENCE_FOUND".into());
    let record: RawRecord = [
        ("run_id", RUN_ID),
        ("tool_call_id", call_id.as_str()),
        ("tool_name", tool.as_str()),
        ("lifecycle", "READY"),
        ("evidence_status", status.as_str()),
        ("agent_result", agent_result),
    ]
    .into_iter()
    .collect();
    if let Ok(call) = resolve_call(RUN_ID, &call_id, Some(&record)) {
        assert_eq!(call.tool, tool);
        assert_eq!(call.tool_call_id, call_id);
        assert_eq!(call.evidence_status.as_str(), status);
        let _ = call.projection.sources();
    }
}

/// A Draft the harness accepted must serialize and parse back to itself.
fn assert_round_trip(draft: &Draft) {
    let text = match serde_json::to_string(draft) {
        Ok(text) => text,
        Err(e) => panic!("a parsed Draft does not serialize: {e}"),
    };
    assert_eq!(Draft::parse_text(&text).as_ref(), Ok(draft));
    let _ = serde_json::to_string(&draft.user_visible());
}
