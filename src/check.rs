//! `release-harness check BUNDLE.json`: one release, offline, from a run bundle
//! (CONTRACT §6), through the same actor tree as the service, over an in-memory store.
//!
//! Entry points: [`RunBundle::parse`] (strict; a bad bundle is exit 2), [`run_check`]
//! (the release, with its audit record) and [`describe`] (the readable account on stderr).

use std::collections::BTreeMap;

use actix::Actor;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::actors::{Harness, HarnessError, ReleaseError, RunRegistry, StartRelease};
use crate::config::Config;
use crate::domain::release::ReleaseResult;
use crate::domain::request::{release_request, ReleaseRequest, RequestError};
use crate::store::agent_records::AgentRecords;
use crate::store::{MemoryStore, Store, StoreError};

/// One canonical invocation record of a bundle: the HASH fields, all strings, any absent.
pub use crate::store::agent_records::Invocation as BundleInvocation;

/// A run bundle: the release request and the run's invocation records.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunBundle {
    run_id: String,
    query: Option<String>,
    stop_reason: Option<String>,
    draft: Option<Box<RawValue>>,
    #[serde(default)]
    invocations: Vec<BundleInvocation>,
    /// Explicit calls lists by run id (else: the run's invocations in bundle order).
    #[serde(default)]
    calls: BTreeMap<String, Vec<String>>,
}

/// Why a bundle cannot be released (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    File(Box<crate::input_file::InputError>),
    #[error("the bundle is not valid: {0}")]
    Invalid(String),
    #[error("the bundle is not valid: {0}")]
    Records(#[from] crate::store::agent_records::RecordsError),
    #[error(transparent)]
    Request(#[from] RequestError),
}

impl RunBundle {
    /// Reads and parses the bundle file at `path` (a regular file of at most
    /// [`DEFAULT_MAX_BUNDLE_BYTES`](crate::input_file::DEFAULT_MAX_BUNDLE_BYTES)).
    pub fn read(path: &std::path::Path) -> Result<RunBundle, BundleError> {
        RunBundle::read_bounded(path, crate::input_file::DEFAULT_MAX_BUNDLE_BYTES)
    }

    /// Reads and parses the bundle file at `path`: a regular file of at most `max_bytes`
    /// ([`crate::input_file::read_bounded`]).
    pub fn read_bounded(path: &std::path::Path, max_bytes: u64) -> Result<RunBundle, BundleError> {
        let text = crate::input_file::read_bounded(path, max_bytes)
            .map_err(|e| BundleError::File(Box::new(e)))?;
        RunBundle::parse(&text)
    }

    pub fn parse(text: &str) -> Result<RunBundle, BundleError> {
        if !text.trim_start().starts_with('{') {
            return Err(BundleError::Invalid("a bundle is a JSON object".into()));
        }
        // The error names the field at fault: `invocations[0].agent_result: invalid type: map,
        // expected a JSON string holding the projection ...`.
        let mut json = serde_json::Deserializer::from_str(text);
        let bundle: RunBundle = serde_path_to_error::deserialize(&mut json)
            .map_err(|e| BundleError::Invalid(with_path(&e)))?;
        json.end()
            .map_err(|e| BundleError::Invalid(e.to_string()))?;
        Ok(bundle)
    }

    /// The bundle with its run id replaced (`seed --run-id`): every record of the bundle's
    /// own run, and its calls list, move to the new run, so that a recorded run can be
    /// released again under a fresh id. Records stored under another run stay there.
    pub fn with_run_id(mut self, run_id: &str) -> RunBundle {
        let old = std::mem::replace(&mut self.run_id, run_id.to_string());
        for inv in &mut self.invocations {
            if inv.run_id.as_deref() == Some(old.as_str()) {
                inv.run_id = Some(run_id.to_string());
            }
            if inv.stored_under.as_deref() == Some(old.as_str()) {
                inv.stored_under = Some(run_id.to_string());
            }
        }
        if let Some(calls) = self.calls.remove(&old) {
            self.calls.insert(run_id.to_string(), calls);
        }
        self
    }

    /// The request, validated as the API validates it.
    pub fn request(&self) -> Result<ReleaseRequest, BundleError> {
        Ok(release_request(
            &self.run_id,
            self.query.as_deref(),
            self.stop_reason.as_deref(),
            self.draft.as_deref().map(RawValue::get),
        )?)
    }

    /// The bundle's records (each under the run it is stored under) and each run's calls
    /// list: its records in bundle order, unless `calls` names it.
    pub fn agent_records(&self) -> Result<AgentRecords, BundleError> {
        Ok(AgentRecords::new(
            &self.invocations,
            &self.run_id,
            &self.calls,
        )?)
    }

    /// The API request body of this bundle (for replaying it against a service).
    pub fn release_body(&self) -> Value {
        let draft = self
            .draft
            .as_deref()
            .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
            .unwrap_or(Value::Null);
        serde_json::json!({"query": self.query, "draft": draft, "stop_reason": self.stop_reason})
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// An in-memory store holding the bundle's records and calls lists.
    pub fn store(&self) -> Result<MemoryStore, BundleError> {
        let store = MemoryStore::new();
        self.agent_records()?.write_memory(&store);
        Ok(store)
    }
}

/// A serde error with the path of the field at fault in front (`invocations[0].agent_result:
/// ...`), or the error alone at the top level.
fn with_path(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    match e.path().to_string().as_str() {
        "." => e.inner().to_string(),
        path => format!("{path}: {}", e.inner()),
    }
}

/// What `check` prints: the result, its JSON, and the audit record.
pub struct CheckOutput {
    pub result: ReleaseResult,
    pub json: String,
    pub audit: Value,
}

/// Why a bundle's release produced no result.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("the release's actors are gone: {0}")]
    Mailbox(#[from] actix::MailboxError),
    #[error(transparent)]
    Release(#[from] ReleaseError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Releases the bundle's run through the actor tree. Must run inside an actix System.
pub async fn run_check(config: Config, bundle: &RunBundle) -> Result<CheckOutput, CheckError> {
    let request = bundle.request()?;
    let store = Store::Memory(bundle.store()?);
    let harness = Harness::new(config, store.clone())?;
    let registry = RunRegistry::new(harness).start();
    let run_id = request.run_id.clone();
    let released = registry.send(StartRelease(request)).await??;
    let audit = store
        .get_audit(&run_id)
        .await?
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null);
    Ok(CheckOutput {
        result: released.result,
        json: released.json,
        audit,
    })
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// A readable account of the release, step by step, from its audit record.
pub fn describe(audit: &Value, model_configured: bool) -> String {
    let mut out = Vec::new();
    out.push(format!(
        "run {}: stop reason {}",
        text(&audit["run_id"]),
        text(&audit["stop_reason"])
    ));
    match audit["path"].as_str() {
        Some("controlled_stop") => out.push("- controlled stop: released deterministically from the ProgressSnapshot; no model call".into()),
        Some("draft_unparseable") => out.push(format!(
            "- the Draft was rejected by strict parsing ({}); only the ProgressSnapshot is used, nothing of the Draft",
            text(&audit["draft_error"])
        )),
        Some("missing_context") => out.push("- no conclusion, no tool calls, missing context named: asking for it; no model call".into()),
        Some("no_conclusion") => out.push("- no conclusion: released from the ProgressSnapshot; no repair, no semantic review".into()),
        Some("concluded") => out.push("- concluded Draft: EvidenceGuard checks structure, references and every cited call".into()),
        _ => {}
    }
    if let Some(excluded) = audit["excluded_references"]
        .as_array()
        .filter(|e| !e.is_empty())
    {
        out.push(format!(
            "- {} cited call(s) excluded, never published:",
            excluded.len()
        ));
        for e in excluded {
            out.push(format!(
                "    {} cites {}: {} ({})",
                text(&e["analysis"]),
                text(&e["tool_call_id"]),
                text(&e["rule"]),
                text(&e["detail"])
            ));
        }
    }
    let violations = audit["violations"].as_array().cloned().unwrap_or_default();
    if audit["path"] == "concluded" {
        if violations.is_empty() {
            out.push("- EvidenceGuard passed".into());
        } else {
            out.push(format!(
                "- EvidenceGuard failed with {} violation(s):",
                violations.len()
            ));
            for v in &violations {
                let call = v
                    .get("tool_call_id")
                    .map(|c| format!(" call {}", text(c)))
                    .unwrap_or_default();
                out.push(format!(
                    "    {} at {}{call}: {}",
                    text(&v["rule"]),
                    text(&v["at"]),
                    text(&v["detail"])
                ));
            }
        }
    }
    if let Some(repair) = audit.get("repair").filter(|r| !r.is_null()) {
        let verdict = if repair["accepted"] == true {
            "accepted"
        } else {
            "rejected"
        };
        if repair["ran"] == true {
            out.push(format!("- repair {verdict}: {}", text(&repair["reason"])));
        } else {
            out.push(format!("- repair not run: {}", text(&repair["reason"])));
        }
        for v in repair["violations_after"].as_array().into_iter().flatten() {
            out.push(format!(
                "    still {} at {}: {}",
                text(&v["rule"]),
                text(&v["at"]),
                text(&v["detail"])
            ));
        }
    }
    for a in audit["model_attempts"].as_array().into_iter().flatten() {
        let detail = a
            .get("detail")
            .map(|d| format!(" ({})", text(d)))
            .unwrap_or_default();
        out.push(format!(
            "- model {} attempt {}: {}{detail}, {} ms, {} request bytes, tokens {}/{}",
            text(&a["role"]),
            text(&a["attempt"]),
            text(&a["outcome"]),
            text(&a["latency_ms"]),
            text(&a["request_bytes"]),
            text(&a["prompt_tokens"]),
            text(&a["completion_tokens"])
        ));
    }
    if let Some(verdict) = audit.get("verdict").filter(|v| !v.is_null()) {
        out.push(format!(
            "- SemanticGuard: {} ({})",
            text(&verdict["verdict"]),
            text(&verdict["reason"])
        ));
    } else if audit["fallback_type"] == "SEMANTIC_UNAVAILABLE" {
        if model_configured {
            out.push(
                "- SemanticGuard unavailable: no permitted attempt gave a valid verdict".into(),
            );
        } else {
            out.push("- SemanticGuard unavailable: no model is configured (model.base_url is empty), so the release fails closed".into());
        }
    }
    let b = &audit["budget"];
    out.push(format!(
        "- budget: {}/{} calls, {}/{} tokens, {}/{} bytes",
        text(&b["model_calls"]),
        text(&b["max_model_calls"]),
        text(&b["tokens"]),
        text(&b["max_tokens"]),
        text(&b["bytes"]),
        text(&b["max_bytes"])
    ));
    let fallback = audit["fallback_type"]
        .as_str()
        .map(|f| format!(" {f}"))
        .unwrap_or_default();
    out.push(format!(
        "=> {}{fallback} in {} ms ({} ms waiting on the model)",
        text(&audit["outcome"]),
        text(&audit["timings"]["total_ms"]),
        text(&audit["timings"]["model_wait_ms"])
    ));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(json: &str) -> RunBundle {
        RunBundle::parse(json).unwrap()
    }

    #[test]
    fn records_go_under_their_own_run_or_stored_under() {
        let b = bundle(
            r#"{"run_id": "r1", "query": "q", "draft": {"conclusion": null, "analyses": []},
                "invocations": [
                  {"run_id": "r1", "tool_call_id": "a", "lifecycle": "READY"},
                  {"run_id": "r0", "tool_call_id": "b"},
                  {"run_id": "r0", "tool_call_id": "c", "stored_under": "r1"}]}"#,
        );
        let store = b.store().unwrap();
        assert_eq!(store_calls(&store, "r1"), vec!["a", "c"]);
        assert_eq!(store_calls(&store, "r0"), vec!["b"]);
    }

    #[test]
    fn a_bundle_replayed_under_a_fresh_run_id_moves_its_own_run_only() {
        let b = bundle(
            r#"{"run_id": "r1", "query": "q", "draft": "x", "calls": {"r1": ["a", "c"]},
                "invocations": [
                  {"run_id": "r1", "tool_call_id": "a"},
                  {"run_id": "r0", "tool_call_id": "b"},
                  {"run_id": "r0", "tool_call_id": "c", "stored_under": "r1"}]}"#,
        )
        .with_run_id("r2");
        assert_eq!(b.run_id(), "r2");
        let store = b.store().unwrap();
        assert_eq!(store_calls(&store, "r2"), vec!["a", "c"]);
        assert!(store_calls(&store, "r1").is_empty());
        assert_eq!(
            store_calls(&store, "r0"),
            vec!["b"],
            "another run's record stays"
        );
        assert_eq!(b.request().unwrap().run_id, "r2");
    }

    #[test]
    fn bundle_errors_name_the_field() {
        let err = RunBundle::parse(
            r#"{"run_id": "r1", "invocations": [{"tool_call_id": "a", "agent_result": {"tool": "log_search"}}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("invocations[0].agent_result: invalid type: map, expected a JSON string holding the projection"),
            "{err}"
        );
        let err = RunBundle::parse(r#"{"run_id": "r1", "invocations": [{}, {"tool_call_id": 5}]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invocations[1].tool_call_id: invalid type"),
            "{err}"
        );
    }

    #[test]
    fn explicit_calls_lists_win() {
        let b = bundle(
            r#"{"run_id": "r1", "query": "q", "draft": "x", "calls": {"r1": ["z", "a"]},
                "invocations": [{"run_id": "r1", "tool_call_id": "a"}]}"#,
        );
        assert_eq!(store_calls(&b.store().unwrap(), "r1"), vec!["z", "a"]);
    }

    #[test]
    fn bad_bundles_are_errors() {
        assert!(RunBundle::parse(r#"{"run_id": "r1", "extra": 1}"#).is_err());
        assert!(
            RunBundle::parse(r#"{"run_id": "r1", "invocations": [{"tool_call_id": 5}]}"#).is_err()
        );
        let no_id = bundle(
            r#"{"run_id": "r1", "query": "q", "draft": "x", "invocations": [{"run_id": "r1"}]}"#,
        );
        assert!(no_id.store().is_err());
        let bad_run = bundle(r#"{"run_id": "r 1", "query": "q", "draft": "x"}"#);
        assert!(matches!(
            bad_run.request(),
            Err(BundleError::Request(RequestError::InvalidRunId))
        ));
        let bad_stop =
            bundle(r#"{"run_id": "r1", "query": "q", "draft": "x", "stop_reason": "NOPE"}"#);
        assert!(bad_stop.request().is_err());
    }

    fn store_calls(store: &MemoryStore, run: &str) -> Vec<String> {
        let s = Store::Memory(store.clone());
        let reading = crate::store::Reading {
            cited: &[],
            max_calls: 100,
            limits: crate::actors::record_limits(&crate::config::Config::defaults()),
        };
        let begin = s.begin(run, "reader/1", std::time::Duration::from_secs(1), reading);
        match futures::executor::block_on(begin).unwrap() {
            crate::store::Begin::Taken(evidence) => evidence.calls,
            _ => panic!("the reader did not take the lock"),
        }
    }
}
