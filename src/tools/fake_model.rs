//! A fake OpenAI-compatible model for soak runs and the demo: a real HTTP server at
//! `/chat/completions` that judges and repairs deterministically, with configurable latency
//! and fault rates. Directives in the operator question or the report steer one run:
//! `[judge:SUPPORTED]`, `[judge:UNSUPPORTED]`, `[judge:error]` (HTTP 500),
//! `[judge:garbage]` (prose), `[judge:flaky]` (the first attempt of a request fails, the
//! byte-identical retry succeeds), `[judge:hang]` (answers 504 after `hang`),
//! `[repair:rewrite]` (the repair changes the conclusion's text, which the harness must
//! reject), `[judge:echo]TEXT[/judge:echo]` (the judge's reason quotes TEXT, as a model
//! that repeats what it read would: the console's hostile-text test).

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::{json, Value};

/// How the fake model behaves when no directive says otherwise.
#[derive(Debug, Clone)]
pub struct FakeModelOptions {
    /// SUPPORTED or UNSUPPORTED.
    pub default_verdict: String,
    /// Added to every answer.
    pub latency: Duration,
    /// Share of requests answered with HTTP 500 (0.0..=1.0).
    pub error_rate: f64,
    /// Share of requests answered with prose instead of JSON.
    pub garbage_rate: f64,
    /// How long `[judge:hang]` holds the request before it answers 504. Bounded because
    /// actix-web does not cancel a handler when its client goes away: an endless hang would
    /// keep every aborted request's connection in memory for the life of the process.
    pub hang: Duration,
}

impl Default for FakeModelOptions {
    fn default() -> Self {
        FakeModelOptions {
            default_verdict: "SUPPORTED".into(),
            latency: Duration::ZERO,
            error_rate: 0.0,
            garbage_rate: 0.0,
            hang: Duration::from_secs(120),
        }
    }
}

struct FakeState {
    options: FakeModelOptions,
    /// Bodies seen once, for `[judge:flaky]`.
    seen: Mutex<HashSet<u64>>,
}

/// A running fake model; dropping the handle does not stop it, `stop` does.
pub struct FakeModel {
    pub url: String,
    handle: actix_web::dev::ServerHandle,
}

impl FakeModel {
    /// Binds `listen` (port 0 for any) and serves on the current actix System.
    pub fn start(listen: &str, options: FakeModelOptions) -> std::io::Result<FakeModel> {
        let tcp = TcpListener::bind(listen)?;
        let url = format!("http://{}", tcp.local_addr()?);
        let state = web::Data::new(FakeState {
            options,
            seen: Mutex::new(HashSet::new()),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(web::PayloadConfig::new(16 * 1024 * 1024))
                .route("/chat/completions", web::post().to(complete))
                .route("/v1/chat/completions", web::post().to(complete))
        })
        // HTTP/1.1 and h2c (prior knowledge) alike, as the harness may speak either.
        .listen_auto_h2c(tcp)?
        .workers(2)
        .disable_signals()
        .run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Ok(FakeModel { url, handle })
    }

    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}

fn envelope(content: &str, prompt_bytes: usize) -> Value {
    json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake-judge",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_bytes / 4, "completion_tokens": content.len() / 4 + 1,
                  "total_tokens": prompt_bytes / 4 + content.len() / 4 + 1}
    })
}

fn body_hash(body: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    h.finish()
}

async fn complete(state: web::Data<FakeState>, body: web::Bytes) -> HttpResponse {
    let options = &state.options;
    if !options.latency.is_zero() {
        tokio::time::sleep(options.latency).await;
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            return HttpResponse::BadRequest().json(json!({"error": {"message": "bad json"}}))
        }
    };
    let system = request["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    let user = request["messages"][1]["content"]
        .as_str()
        .unwrap_or_default();
    let roll = rand::random::<f64>();
    if roll < options.error_rate {
        return HttpResponse::InternalServerError().body("fake model fault");
    }
    if roll < options.error_rate + options.garbage_rate {
        return HttpResponse::Ok().json(envelope("I believe the report is fine.", body.len()));
    }
    if system.starts_with("You repair") {
        return HttpResponse::Ok().json(envelope(&repair(user).to_string(), body.len()));
    }
    if user.contains("[judge:hang]") {
        // Hold nothing of the request while hanging.
        drop(request);
        drop(body);
        tokio::time::sleep(options.hang).await;
        return HttpResponse::GatewayTimeout().body("fake model hung");
    }
    if user.contains("[judge:error]") {
        return HttpResponse::InternalServerError().body("fake model fault");
    }
    if user.contains("[judge:garbage]") {
        return HttpResponse::Ok().json(envelope("Looks SUPPORTED to me!", body.len()));
    }
    if user.contains("[judge:flaky]") {
        let first_time = state
            .seen
            .lock()
            .map(|mut seen| {
                // Forget a body once its retry is answered, so the set stays small.
                let hash = body_hash(&body);
                seen.insert(hash) || !seen.remove(&hash)
            })
            .unwrap_or(false);
        if first_time {
            return HttpResponse::ServiceUnavailable().body("fake model overloaded");
        }
    }
    let verdict = if user.contains("[judge:UNSUPPORTED]") {
        "UNSUPPORTED"
    } else if user.contains("[judge:SUPPORTED]") {
        "SUPPORTED"
    } else {
        options.default_verdict.as_str()
    };
    // `probe-model`'s canary: a model that reads its system message echoes the probe word.
    if let Some(word) = system
        .split_once("Your secret probe word is ")
        .and_then(|(_, rest)| rest.split_once('.'))
        .map(|(word, _)| word)
    {
        let answer =
            json!({"verdict": "SUPPORTED", "reason": format!("The probe word is {word}.")})
                .to_string();
        return HttpResponse::Ok().json(envelope(&answer, body.len()));
    }
    let reason = if let Some(echo) = echoed(user) {
        format!("The report says this without support: {echo}")
    } else if verdict == "SUPPORTED" {
        "Every claim is backed by the evidence of the analysis it cites.".to_string()
    } else {
        "The conclusion names a cause that no cited evidence shows.".to_string()
    };
    let answer = json!({"verdict": verdict, "reason": reason}).to_string();
    HttpResponse::Ok().json(envelope(&answer, body.len()))
}

/// The text between `[judge:echo]` and `[/judge:echo]` in the judge's request (at most 300
/// bytes of it), as the prompt holds it.
fn echoed(user: &str) -> Option<&str> {
    let (_, rest) = user.split_once("[judge:echo]")?;
    let text = rest
        .split_once("[/judge:echo]")
        .map_or(rest, |(text, _)| text);
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(&text[..end])
}

/// Levenshtein distance, for picking the usable call id nearest to a wrong one.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            prev = here;
        }
    }
    row[b.len()]
}

/// The content of the labelled block `<<<BEGIN nonce NAME>>>\n...\n<<<END nonce>>>`.
fn block<'a>(user: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = user;
    while let Some(i) = rest.find("<<<BEGIN ") {
        let (header, body) = rest[i + "<<<BEGIN ".len()..].split_once(">>>\n")?;
        if header.split_whitespace().nth(1) == Some(name) {
            return body.split_once("\n<<<END ").map(|(content, _)| content);
        }
        rest = body;
    }
    None
}

/// The repair request's input: the Draft, violations and usable calls blocks.
fn repair_input(user: &str) -> Value {
    let parse = |name: &str| {
        block(user, name)
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .unwrap_or(Value::Null)
    };
    json!({"draft": parse("draft"), "violations": parse("violations"), "usable_calls": parse("usable_calls")})
}

/// The repair a careful model would make: each cited id that is not a usable call becomes
/// the nearest usable id whose evidence status fits the analysis kind.
fn repair(user: &str) -> Value {
    let input = repair_input(user);
    let mut draft = input["draft"].clone();
    // Only ids that do not exist are retargeted: a real call of another run or of the
    // wrong kind is not a typo, and a careful repair leaves it for EvidenceGuard to reject.
    let missing: Vec<&str> = input["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["rule"] == "call_missing")
        .filter_map(|v| v["tool_call_id"].as_str())
        .collect();
    let usable: Vec<(String, String)> = input["usable_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["tool_call_id"].as_str()?.to_string(),
                c["evidence_status"].as_str()?.to_string(),
            ))
        })
        .collect();
    if let Some(analyses) = draft["analyses"].as_array_mut() {
        for analysis in analyses {
            let wanted = match analysis["kind"].as_str() {
                Some("NEGATIVE_OBSERVATION") => "NO_EVIDENCE",
                _ => "EVIDENCE_FOUND",
            };
            if let Some(ids) = analysis["tool_call_ids"].as_array_mut() {
                for id in ids.iter_mut() {
                    let current = id.as_str().unwrap_or_default().to_string();
                    if !missing.contains(&current.as_str()) {
                        continue;
                    }
                    if let Some((best, _)) = usable
                        .iter()
                        .filter(|(_, s)| s == wanted)
                        .min_by_key(|(u, _)| distance(u, &current))
                    {
                        *id = json!(best);
                    }
                }
            }
        }
    }
    if user.contains("[repair:rewrite]") {
        if let Some(text) = draft["conclusion"]["text"].as_str() {
            draft["conclusion"]["text"] = json!(format!("{text} (rephrased for clarity)"));
        }
    }
    draft
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance() {
        assert_eq!(distance("call-log-1", "call-log-01"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn repair_picks_the_nearest_fitting_usable_id() {
        let input = json!({
            "draft": {"conclusion": {"text": "t", "analysis_refs": ["A1"]}, "analyses": [
                {"id": "A1", "kind": "NORMAL", "text": "x", "tool_call_ids": ["call-log-1"]},
                {"id": "A2", "kind": "NEGATIVE_OBSERVATION", "text": "y", "tool_call_ids": ["call-sql-01"]}]},
            "violations": [{"rule": "call_missing", "at": "analyses[0]", "tool_call_id": "call-log-1", "detail": "-"}],
            "usable_calls": [
                {"tool_call_id": "call-log-01", "tool": "log_search", "evidence_status": "EVIDENCE_FOUND"},
                {"tool_call_id": "call-sql-01", "tool": "mysql_query", "evidence_status": "NO_EVIDENCE"}]
        });
        let user = format!(
            "Repair.\n<<<BEGIN n draft>>>\n{}\n<<<END n>>>\n\n<<<BEGIN n violations>>>\n{}\n<<<END n>>>\n\n<<<BEGIN n usable_calls>>>\n{}\n<<<END n>>>\nAnswer with the whole Draft.",
            input["draft"], input["violations"], input["usable_calls"]
        );
        let repaired = repair(&user);
        assert_eq!(
            repaired["analyses"][0]["tool_call_ids"],
            json!(["call-log-01"])
        );
        assert_eq!(
            repaired["analyses"][1]["tool_call_ids"],
            json!(["call-sql-01"])
        );
        assert_eq!(repaired["conclusion"]["text"], "t");
    }
}
