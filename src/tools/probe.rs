//! `release-harness probe-model`: is the configured model server set up so that the
//! guards can work? Three small requests with the configured settings:
//!
//! 1. a canary request: the system message holds a probe word the model must echo, so a
//!    chat template that drops the system message (the rubric would never reach the
//!    model) shows up, as does a prompt-token count too small for the text sent;
//! 2. a tiny SemanticGuard request, built by [`semantic_request`] exactly as `serve` builds
//!    it, read by the same strict verdict parser;
//! 3. a tiny repair request, built by [`repair_request`], read by the same Draft parser.
//!
//! Each finding is written in plain words with the configuration to change. When the
//! configured `structured_output` is refused or not honoured, the other modes are tried
//! with the canary request, so the report can name one that works. Entry point:
//! [`probe`]; [`ProbeReport::render`] for people, JSON for scripts. `serve` logs the same
//! report at start-up without waiting for it.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::config::{Config, StructuredOutput};
use crate::domain::draft::{AnalysisKind, Draft, DraftParseError};
use crate::domain::evidence_guard::{Rule, Violation};
use crate::domain::invocation::{EvidenceStatus, ToolName};
use crate::domain::snapshot::{
    AnalysisEvidence, EvidenceData, EvidenceItem, SnapshotLogEntry, VerifiedSnapshot,
};
use crate::model::exchange::{self, Bounds};
use crate::model::prompts::{
    new_nonce, repair_request, response_format_json, semantic_request, verdict_schema,
    PreparedRequest, PromptError, RequestShape, UsableCallRef,
};
use crate::model::verdict::{parse_repaired_draft, parse_verdict};
use crate::model::ModelClient;

/// How one probe request went.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeCall {
    /// `canary`, `judge` or `repair`.
    pub name: &'static str,
    pub structured_output: &'static str,
    /// `ok`, or the attempt outcome (`rejected`, `transport`, `timeout`, `parse`, `schema`).
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub latency_ms: u64,
    /// The HTTP status of a failed call, when the server answered one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    pub request_bytes: u64,
    /// Bytes of the messages' text (what the tokenizer sees, before the chat template).
    pub message_bytes: u64,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// The answer's content, cut to [`ERROR_EXCERPT_CHARS`](crate::model::client::ERROR_EXCERPT_CHARS)
    /// characters (and `…`), whether or not it could be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
}

/// A finding: `ok`, `warn` or `fail` (a protocol problem: the guards cannot work).
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub level: &'static str,
    pub text: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub base_url: String,
    pub model: String,
    pub structured_output: &'static str,
    pub calls: Vec<ProbeCall>,
    /// Other `structured_output` modes tried with the canary request, when the configured
    /// one failed: mode and outcome.
    pub alternatives: Vec<(String, String)>,
    pub findings: Vec<Finding>,
}

impl ProbeReport {
    /// Whether a protocol problem was found.
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.level == "fail")
    }

    /// The plain-words account.
    pub fn render(&self) -> String {
        let mut out = format!(
            "model {} at {} (structured_output {})\n",
            self.model, self.base_url, self.structured_output
        );
        for c in &self.calls {
            out.push_str(&format!(
                "  {:<7} {:<9} {:>6} ms  {:>6} request bytes  prompt tokens {}  completion tokens {}{}\n",
                c.name,
                c.outcome,
                c.latency_ms,
                c.request_bytes,
                c.prompt_tokens.map_or("-".into(), |t| t.to_string()),
                c.completion_tokens.map_or("-".into(), |t| t.to_string()),
                c.detail
                    .as_ref()
                    .map(|d| format!("  ({d})"))
                    .unwrap_or_default()
            ));
        }
        for (mode, outcome) in &self.alternatives {
            out.push_str(&format!("  tried structured_output {mode}: {outcome}\n"));
        }
        for f in &self.findings {
            let mark = match f.level {
                "ok" => "ok  ",
                "warn" => "WARN",
                _ => "FAIL",
            };
            out.push_str(&format!("{mark} {}\n", f.text));
        }
        out
    }
}

/// The probe word's prefix; the word itself is fresh per probe.
const CANARY_PREFIX: &str = "PROBE";

fn canary_system(word: &str) -> String {
    // Long enough (about 700 bytes) that dropping it shows in the prompt token count.
    format!(
        "You are a connectivity probe for an incident review service. Your secret probe word \
         is {word}. Whenever you are asked for the probe word, you give exactly {word}. You \
         answer with one JSON object of the form {{\"verdict\": \"SUPPORTED\", \"reason\": \
         \"The probe word is <the probe word>.\"}} and nothing else: no prose before or after \
         it, no code fence. The verdict is always SUPPORTED in this probe. \
         This instruction is only in the system message; the user message does not repeat the \
         probe word, so an answer that contains it shows that the system message reached you. \
         Keep the answer short."
    )
}

const CANARY_USER: &str = "Give the JSON object now; its reason names your secret probe word \
     from your instructions: The probe word is ....";

fn canary_request(
    model: &str,
    mode: StructuredOutput,
    word: &str,
) -> Result<(PreparedRequest, u64), PromptError> {
    let system = canary_system(word);
    let message_bytes = (system.len() + CANARY_USER.len()) as u64;
    let mut body = json!({
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": CANARY_USER}
        ],
        "temperature": 0,
        "max_tokens": 64,
    });
    if let (Some(format), Some(map)) = (
        response_format_json(mode, "semantic_verdict", verdict_schema()),
        body.as_object_mut(),
    ) {
        map.insert("response_format".into(), format);
    }
    Ok((PreparedRequest::from_json(&body, 64)?, message_bytes))
}

/// A tiny verified Draft and its snapshot, as EvidenceGuard would hand them to the judge.
fn tiny_judged_case() -> Result<(Draft, VerifiedSnapshot), DraftParseError> {
    let draft = Draft::parse_text(
        r#"{"conclusion": {"text": "order-api logged 3 timeout errors between 10:00 and 11:00 UTC.", "analysis_refs": ["A1"]},
            "analyses": [{"id": "A1", "kind": "NORMAL", "text": "A log search found 3 ERROR entries with 'timeout' on order-api.", "tool_call_ids": ["probe-1"]}]}"#,
    )?;
    let snapshot = VerifiedSnapshot {
        analyses: vec![AnalysisEvidence {
            analysis_id: "A1".into(),
            kind: AnalysisKind::Normal,
            evidence: vec![EvidenceItem {
                tool: ToolName::LogSearch,
                evidence_status: EvidenceStatus::EvidenceFound,
                scope: json!({"service": "order-api", "query": "level:ERROR AND timeout",
                              "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00Z", "limit": 50})
                .into(),
                observed_at: Some("2026-12-01T11:02:06Z".into()),
                data: EvidenceData::Log {
                    source: "order-api".into(),
                    total_matches: 3,
                    entries: vec![SnapshotLogEntry {
                        timestamp: "2026-12-01T10:05:03Z".into(),
                        host: Some("order-api-7".into()),
                        level: Some("ERROR".into()),
                        message: "upstream timeout after 3000ms".into(),
                        message_truncated: false,
                    }],
                    entries_omitted: 0,
                },
            }],
        }],
    };
    Ok((draft, snapshot))
}

/// Sums the text of every message of a request body (what is tokenized).
fn message_bytes(request: &PreparedRequest) -> u64 {
    serde_json::from_str::<Value>(&request.body().to_text())
        .ok()
        .and_then(|v| {
            v["messages"].as_array().map(|m| {
                m.iter()
                    .filter_map(|msg| msg["content"].as_str())
                    .map(|c| c.len() as u64)
                    .sum()
            })
        })
        .unwrap_or(0)
}

/// Sends one request and reads it with `parse`, as a release would read the answer
/// ([`exchange::read`]); the answer's content is kept (bounded).
async fn call<T>(
    client: &ModelClient,
    name: &'static str,
    mode: StructuredOutput,
    request: PreparedRequest,
    message_bytes: u64,
    (timeout, max_output_bytes): (Duration, u64),
    parse: impl Fn(&str) -> Result<T, crate::model::verdict::AnswerError>,
) -> (ProbeCall, Option<T>) {
    let bounds = Bounds {
        timeout,
        request_bytes: request.len_bytes(),
        max_output_tokens: request.max_output_tokens,
        max_output_bytes,
    };
    let began = Instant::now();
    let sent = tokio::time::timeout(timeout, client.send_capped(request, max_output_bytes))
        .await
        .ok();
    let latency_ms = began.elapsed().as_millis() as u64;
    let answer = exchange::content_excerpt(&sent);
    let exchange = exchange::read(sent, &bounds, parse);
    let probe = ProbeCall {
        name,
        structured_output: mode.as_str(),
        outcome: exchange.outcome.as_str(),
        detail: exchange.detail,
        latency_ms,
        http_status: exchange.http_status,
        request_bytes: bounds.request_bytes,
        message_bytes,
        prompt_tokens: exchange.prompt_tokens,
        completion_tokens: exchange.completion_tokens,
        answer,
    };
    (probe, exchange.answer)
}

/// Runs the probe against the configured model. Never fails: every problem is a finding.
pub async fn probe(config: &Config) -> ProbeReport {
    let mode = config.model.structured_output;
    let mut report = ProbeReport {
        base_url: config.model.base_url.clone(),
        model: config.model.name.clone(),
        structured_output: mode.as_str(),
        calls: Vec::new(),
        alternatives: Vec::new(),
        findings: Vec::new(),
    };
    if !config.model_configured() {
        report.findings.push(finding(
            "fail",
            "no model is configured: set model.base_url (HARNESS__MODEL__BASE_URL)".into(),
        ));
        return report;
    }
    let client = match ModelClient::new(&config.model) {
        Ok(c) => c,
        Err(e) => {
            report.findings.push(finding("fail", e.to_string()));
            return report;
        }
    };
    let judge_timeout = Duration::from_millis(config.semantic_guard.attempt_timeout_ms.get());
    let word = format!("{CANARY_PREFIX}{:08X}", rand::random::<u32>());
    let mut findings = Vec::new();

    // 1. The canary.
    let canary = match canary_request(&config.model.name, mode, &word) {
        Ok((request, bytes)) => {
            let (probe, verdict) = call(
                &client,
                "canary",
                mode,
                request,
                bytes,
                (judge_timeout, config.semantic_guard.max_output_bytes),
                parse_verdict,
            )
            .await;
            Some((probe, verdict))
        }
        Err(e) => {
            findings.push(finding(
                "fail",
                format!("cannot build the canary request: {e}"),
            ));
            None
        }
    };
    // A 404 or 405 is the URL, not the request: no mode advice, no further requests.
    if let Some(status) = canary
        .as_ref()
        .and_then(|(probe, _)| probe.http_status)
        .filter(|status| matches!(status, 404 | 405))
    {
        findings.push(finding("fail", no_endpoint(&config.model.base_url, status)));
        if let Some((probe, _)) = canary {
            report.calls.push(probe);
        }
        report.findings = findings;
        return report;
    }
    if let Some((probe, verdict)) = canary {
        let echoed = probe.answer.as_deref().is_some_and(|a| a.contains(&word));
        match (&verdict, echoed) {
            (_, true) => findings.push(finding(
                "ok",
                "the system prompt reaches the model: it echoed the probe word that only the system message holds".into(),
            )),
            (Some(_), false) => findings.push(finding(
                "warn",
                "the model answered but did not echo the probe word of the system message: the chat template may drop the system message (then the rubric never reaches the model), or the model is too weak to follow it. Check the server's chat template (llama.cpp: --jinja, or --chat-template for a GGUF without one).".into(),
            )),
            (None, false) => {}
        }
        if let Some(tokens) = probe.prompt_tokens {
            let expected = probe.message_bytes as f64 / 4.0;
            let ratio = tokens as f64 / expected;
            let system_share = canary_system(&word).len() as f64 / probe.message_bytes as f64;
            if ratio < (1.0 - system_share) * 1.3 {
                findings.push(finding(
                    "warn",
                    format!("the server counted {tokens} prompt tokens for {} bytes of messages (about {expected:.0} expected): too few to include the system message; the chat template probably drops it", probe.message_bytes),
                ));
            } else {
                findings.push(finding(
                    "ok",
                    format!("prompt tokens are plausible: {tokens} for {} bytes of messages (bytes/4 = {expected:.0})", probe.message_bytes),
                ));
            }
        } else if probe.outcome == "ok" {
            findings.push(finding(
                "warn",
                "the server reports no token usage: the run budget settles on estimates (request bytes / 4 + max_tokens)".into(),
            ));
        }
        report.calls.push(probe);
    }

    // 2. The judge, as serve builds it.
    let shape = RequestShape {
        model: &config.model.name,
        structured_output: mode,
        max_output_tokens: config.semantic_guard.max_output_tokens.get(),
    };
    match tiny_judged_case() {
        Ok((draft, snapshot)) => match semantic_request(
            &shape,
            "How many timeout errors did order-api log between 10:00 and 11:00?",
            &draft,
            &snapshot,
            &new_nonce(),
        ) {
            Ok(request) => {
                let bytes = message_bytes(&request);
                let (probe, verdict) = call(
                    &client,
                    "judge",
                    mode,
                    request,
                    bytes,
                    (judge_timeout, config.semantic_guard.max_output_bytes),
                    parse_verdict,
                )
                .await;
                match verdict {
                    Some(v) => findings.push(finding(
                        "ok",
                        format!(
                            "the judge answered a valid verdict ({}) in {} ms",
                            if v.supported {
                                "SUPPORTED"
                            } else {
                                "UNSUPPORTED"
                            },
                            probe.latency_ms
                        ),
                    )),
                    None => findings.push(judge_problem(&probe, mode)),
                }
                report.calls.push(probe);
            }
            Err(e) => findings.push(finding(
                "fail",
                format!("cannot build the judge request: {e}"),
            )),
        },
        Err(e) => findings.push(finding(
            "fail",
            format!("the probe Draft does not parse: {e:?}"),
        )),
    }

    // 3. The repair, as serve builds it.
    let repair_shape = RequestShape {
        model: &config.model.name,
        structured_output: mode,
        max_output_tokens: config.repair.max_output_tokens.get(),
    };
    if let Ok((draft, _)) = tiny_judged_case() {
        let violations = [Violation {
            rule: Rule::CallMissing,
            at: "analyses[0]".into(),
            tool_call_id: Some("probe-1".into()),
            detail: "no record of this call in the run".into(),
        }];
        let usable = [UsableCallRef {
            tool_call_id: "probe-01".into(),
            tool: ToolName::LogSearch,
            evidence_status: EvidenceStatus::EvidenceFound,
        }];
        match repair_request(&repair_shape, &draft, &violations, &usable, &new_nonce()) {
            Ok(request) => {
                let bytes = message_bytes(&request);
                let (probe, repaired) = call(
                    &client,
                    "repair",
                    mode,
                    request,
                    bytes,
                    (
                        Duration::from_millis(config.repair.timeout_ms.get()),
                        config.repair.max_output_bytes,
                    ),
                    parse_repaired_draft,
                )
                .await;
                match repaired {
                    Some(_) => findings.push(finding(
                        "ok",
                        format!(
                            "the repair answered a whole Draft in {} ms",
                            probe.latency_ms
                        ),
                    )),
                    None => findings.push(repair_problem(&probe, mode)),
                }
                report.calls.push(probe);
            }
            Err(e) => findings.push(finding(
                "fail",
                format!("cannot build the repair request: {e}"),
            )),
        }
    }

    findings.extend(latency_findings(&report.calls, config));

    // When the configured mode is refused or not honoured, find one that works.
    let refused = report.calls.iter().any(|c| {
        matches!(c.outcome, "rejected")
            || (mode.enforces_schema()
                && matches!(c.outcome, "parse" | "schema")
                && !c
                    .detail
                    .as_deref()
                    .unwrap_or_default()
                    .contains("max_tokens"))
    });
    if refused {
        let mut working = None;
        for other in [
            StructuredOutput::JsonSchema,
            StructuredOutput::JsonObjectSchema,
            StructuredOutput::JsonObject,
        ] {
            if other == mode {
                continue;
            }
            let Ok((request, bytes)) = canary_request(&config.model.name, other, &word) else {
                continue;
            };
            let (probe, verdict) = call(
                &client,
                "canary",
                other,
                request,
                bytes,
                (judge_timeout, config.semantic_guard.max_output_bytes),
                parse_verdict,
            )
            .await;
            let outcome = match &probe.detail {
                Some(d) => format!("{} ({d})", probe.outcome),
                None => probe.outcome.to_string(),
            };
            report
                .alternatives
                .push((other.as_str().to_string(), outcome));
            if verdict.is_some() && working.is_none() {
                working = Some(other);
            }
        }
        if let Some(w) = working {
            findings.push(finding(
                "fail",
                format!("set model.structured_output = \"{}\" (HARNESS__MODEL__STRUCTURED_OUTPUT={}): this server accepts it and answered valid JSON", w.as_str(), w.as_str()),
            ));
        }
    }
    report.findings = findings;
    report
}

fn finding(level: &'static str, text: String) -> Finding {
    Finding { level, text }
}

/// The finding for a server that has no chat completions route at `base_url`.
fn no_endpoint(base_url: &str, status: u16) -> String {
    match base_url.ends_with("/v1") {
        false => format!("no chat/completions endpoint at this URL (HTTP {status}); does `model.base_url` need `/v1`? (POST {base_url}/chat/completions was not found; OpenAI-compatible servers serve it under /v1)"),
        true => format!("no chat/completions endpoint at this URL (HTTP {status}): POST {base_url}/chat/completions was not found; check `model.base_url`"),
    }
}

/// Each answered call's latency against the timeout `serve` would give it; a warning past
/// half of it (a real Draft is larger than the probe's).
fn latency_findings(calls: &[ProbeCall], config: &Config) -> Vec<Finding> {
    calls
        .iter()
        .filter(|c| c.http_status.is_none() && c.outcome != "transport")
        .filter_map(|c| {
            let (timeout, key) = match c.name {
                "judge" => (
                    config.semantic_guard.attempt_timeout_ms,
                    "semantic_guard.attempt_timeout_ms",
                ),
                "repair" => (config.repair.timeout_ms, "repair.timeout_ms"),
                _ => return None,
            };
            let share = c.latency_ms as f64 * 100.0 / timeout.get() as f64;
            let text = format!(
                "latency: the {} request took {} ms, {share:.0} % of {key} ({timeout} ms){}",
                c.name,
                c.latency_ms,
                match c.name {
                    "judge" => format!(
                        "; all attempts together have semantic_guard.total_timeout_ms ({} ms)",
                        config.semantic_guard.total_timeout_ms
                    ),
                    _ => String::new(),
                }
            );
            Some(match c.latency_ms * 2 > timeout.get() {
                true => finding("warn", format!("{text}: over half of it for a tiny request, so a real Draft will time out; raise {key} or use a faster server")),
                false => finding("ok", text),
            })
        })
        .collect()
}

fn judge_problem(probe: &ProbeCall, mode: StructuredOutput) -> Finding {
    let detail = probe.detail.clone().unwrap_or_default();
    // The model's own weakness (too slow, a token or copied reason, an answer cut at
    // max_tokens) is a warning; the protocol failing is a failure.
    if probe.outcome == "timeout"
        || detail.starts_with("the reason")
        || detail.contains("cut at max_tokens")
    {
        return Finding {
            level: "warn",
            text: format!(
                "the judge gave no usable verdict ({}: {detail}): the model is too slow or too weak for the rubric",
                probe.outcome
            ),
        };
    }
    let text = match probe.outcome {
        "rejected" => format!("the server refused the judge request as invalid ({detail}): it does not accept response_format {}; see the modes below and the README's table", mode.as_str()),
        "transport" => format!("the judge request failed in transport ({detail}): check model.base_url and that the server runs"),
        "timeout" => format!("the judge request timed out ({detail}): raise semantic_guard.attempt_timeout_ms or use a faster server"),
        _ if mode.enforces_schema() => format!("the judge answered, but not the schema it was given ({detail}): the server does not enforce response_format {}", mode.as_str()),
        _ => format!("the judge's answer is not a valid verdict ({detail}); with structured_output {} nothing enforces the shape: use json_schema or json_object_schema if the server supports one", mode.as_str()),
    };
    Finding {
        level: "fail",
        text,
    }
}

fn repair_problem(probe: &ProbeCall, mode: StructuredOutput) -> Finding {
    let detail = probe.detail.clone().unwrap_or_default();
    let wrapped = probe
        .answer
        .as_deref()
        .is_some_and(|a| a.trim_start().starts_with("{\"draft\""));
    let text = if wrapped {
        format!("the repair answer wrapped the Draft in {{\"draft\": …}}, mirroring the input ({detail}); a schema-enforcing mode (json_schema or json_object_schema) prevents it, {} does not", mode.as_str())
    } else if detail.contains("max_tokens") {
        format!("the repair ran to max_tokens ({} tokens): the model loops; a schema-enforcing mode and a smaller repair.max_output_tokens bound it", probe.completion_tokens.unwrap_or(0))
    } else {
        format!(
            "the repair did not answer a valid Draft ({}: {detail})",
            probe.outcome
        )
    };
    // A weak model's bad repair is not a protocol problem; a refused or failed call is.
    let level = if matches!(probe.outcome, "rejected" | "transport") {
        "fail"
    } else {
        "warn"
    };
    Finding { level, text }
}
