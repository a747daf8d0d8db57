//! The supervisor's begin, cancel and commit steps, through a registry over the memory
//! store; the model, where one is needed, is a real HTTP server on loopback (wiremock, or a
//! listener that never answers).

use std::num::NonZeroU64;
use std::time::Duration;

use actix::{Actor, Addr};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::actors::{
    CancelRun, Harness, InFlight, ReleaseError, Released, RunRegistry, StartRelease,
};
use crate::config::Config;
use crate::domain::audit::CancelSource;
use crate::domain::release::{FallbackType, Outcome};
use crate::domain::request::release_request;
use crate::store::agent_records::AgentRecords;
use crate::store::{Begin, MemoryStore, Reading, Store};

/// A Draft that passes EvidenceGuard on the record of [`world`].
const DRAFT: &str = r#"{"conclusion": {"text": "order-api timed out on its database pool.", "analysis_refs": ["A1"]},
  "analyses": [{"id": "A1", "kind": "NORMAL", "text": "order-api logged pool timeouts.", "tool_call_ids": ["c-log"]}],
  "action_plan": [], "recommendations": [], "limitations": [], "missing_context": []}"#;

/// A memory store holding run `run`'s one log record, and a harness on it (the model at
/// `model`, if any; no marker poll unless `poll` is set).
pub(crate) fn world(run: &str, model: Option<&str>, poll: Option<u64>) -> (Harness, Store) {
    let mut config = Config::defaults();
    if let Some(url) = model {
        config.model.base_url = url.to_string();
        config.model.name = "judge-test".into();
    }
    let poll = poll.unwrap_or(60_000);
    config.cancel.poll_interval_ms = NonZeroU64::new(poll).unwrap();
    config.redis.lock_lease_ms = NonZeroU64::new(3 * poll.max(100)).unwrap();
    let projection = json!({
        "tool": "log_search", "tool_call_id": "c-log", "evidence_status": "EVIDENCE_FOUND",
        "scope": {"service": "order-api", "query": "timeout", "from": "2026-12-01T10:00:00Z",
                  "to": "2026-12-01T11:00:00Z", "limit": 50},
        "total_matches": 2,
        "entries": [{"timestamp": "2026-12-01T10:05:03Z", "host": "order-api-7", "level": "ERROR",
                     "message": "pool timeout after 3000ms"}]});
    let record = json!({
        "run_id": run, "tool_call_id": "c-log", "tool_name": "log_search", "lifecycle": "READY",
        "evidence_status": "EVIDENCE_FOUND", "agent_result": projection.to_string(),
        "raw_response": "raw", "started_at": "2026-12-01T10:05:00Z",
        "finished_at": "2026-12-01T10:05:01Z"});
    let memory = MemoryStore::new();
    AgentRecords::from_json(&[record], run)
        .unwrap()
        .write_memory(&memory);
    let store = Store::Memory(memory);
    (Harness::new(config, store.clone()).unwrap(), store)
}

pub(crate) fn release(run: &str, stop_reason: &str) -> StartRelease {
    StartRelease(release_request(run, Some("Why?"), Some(stop_reason), Some(DRAFT)).unwrap())
}

async fn audit(store: &Store, run: &str) -> Value {
    serde_json::from_str(&store.get_audit(run).await.unwrap().unwrap()).unwrap()
}

/// A model server that accepts connections and never answers; each connection is handed
/// to the receiver.
pub(crate) async fn hanging_model() -> (String, mpsc::UnboundedReceiver<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    actix_rt::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            if tx.send(stream).is_err() {
                return;
            }
        }
    });
    (url, rx)
}

/// Reads until the client closes the connection (bounded, so a broken test ends).
pub(crate) async fn closed(mut connection: TcpStream) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), connection.read_to_end(&mut sink))
        .await
        .is_ok()
}

fn started(
    registry: &Addr<RunRegistry>,
    msg: StartRelease,
) -> actix_rt::task::JoinHandle<Released> {
    let answer = registry.send(msg);
    actix_rt::spawn(async move { answer.await.unwrap().unwrap() })
}

#[actix_rt::test]
async fn begin_answers_a_stored_result_again_without_a_new_release() {
    let (harness, store) = world("r-stored", None, None);
    let registry = RunRegistry::new(harness).start();
    let first = registry
        .send(release("r-stored", "INFORMATION_SATURATION"))
        .await
        .unwrap()
        .unwrap();
    assert!(!first.replayed);
    assert_eq!(
        first.result.fallback_type,
        Some(FallbackType::InsufficientEvidence)
    );
    let again = registry
        .send(release("r-stored", "FINAL_ANSWER"))
        .await
        .unwrap()
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.json, first.json);
    assert_eq!(
        store.get_result("r-stored").await.unwrap(),
        Some(first.json)
    );
}

#[actix_rt::test]
async fn begin_refuses_a_run_whose_lock_another_release_holds() {
    let (harness, store) = world("r-locked", None, None);
    let reading = Reading {
        cited: &[],
        max_calls: 10,
        limits: crate::actors::record_limits(&harness.config),
    };
    let taken = store
        .begin("r-locked", "replica-b/1", Duration::from_secs(5), reading)
        .await
        .unwrap();
    assert!(matches!(taken, Begin::Taken(_)));
    let registry = RunRegistry::new(harness).start();
    let answer = registry
        .send(release("r-locked", "FINAL_ANSWER"))
        .await
        .unwrap();
    match answer {
        Err(ReleaseError::InFlight { holder, .. }) => {
            assert_eq!(holder.as_deref(), Some("replica-b"))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.get_result("r-locked").await.unwrap(),
        None,
        "nothing stored"
    );
}

#[actix_rt::test]
async fn begin_finds_the_cancel_marker_and_commits_cancelled() {
    let (harness, store) = world("r-marked", None, None);
    store.cancel("r-marked").await.unwrap();
    let registry = RunRegistry::new(harness).start();
    let answer = registry
        .send(release("r-marked", "FINAL_ANSWER"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.result.outcome, Outcome::Cancelled);
    // `store.cancel` is the HTTP API's cancel: its marker says so.
    assert_eq!(audit(&store, "r-marked").await["cancelled_by"], "http");
}

#[actix_rt::test]
async fn a_cancel_sent_with_the_release_waits_for_the_begin_script_then_cancels() {
    // The release needs no model: without the cancel it would be decided at once.
    let (harness, store) = world("r-early", None, None);
    let registry = RunRegistry::new(harness).start();
    let answer = registry.send(release("r-early", "INFORMATION_SATURATION"));
    registry.do_send(CancelRun {
        run_id: "r-early".into(),
        source: CancelSource::Http,
    });
    let answer = answer.await.unwrap().unwrap();
    assert_eq!(answer.result.outcome, Outcome::Cancelled);
    assert_eq!(audit(&store, "r-early").await["cancelled_by"], "http");
}

#[actix_rt::test]
async fn a_cancel_while_the_judge_is_pending_drops_its_request_and_commits_cancelled() {
    let (model, mut connections) = hanging_model().await;
    let (harness, store) = world("r-pending", Some(&model), None);
    let registry = RunRegistry::new(harness).start();
    let answer = started(&registry, release("r-pending", "FINAL_ANSWER"));
    let connection = connections.recv().await.unwrap();
    let cancelled = registry
        .send(CancelRun {
            run_id: "r-pending".into(),
            source: CancelSource::Http,
        })
        .await
        .unwrap();
    assert!(cancelled, "the run was in flight here");
    let answer = answer.await.unwrap();
    assert_eq!(answer.result.outcome, Outcome::Cancelled);
    assert!(
        closed(connection).await,
        "the model's connection was closed"
    );
    let audit = audit(&store, "r-pending").await;
    assert_eq!(audit["cancelled_by"], "http");
    assert_eq!(audit["model_attempts"][0]["role"], "semantic");
    assert_eq!(audit["model_attempts"][0]["outcome"], "cancelled");
    assert_eq!(
        registry.send(InFlight).await.unwrap(),
        0,
        "the run is forgotten"
    );
}

/// A chat completion whose verdict is SUPPORTED.
fn supported() -> ResponseTemplate {
    let verdict = json!({"verdict": "SUPPORTED", "reason": "The logs show the pool timeouts."});
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1764583200,
        "model": "judge-test",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": verdict.to_string()}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 20, "total_tokens": 920}
    }))
}

/// Sets the run's cancel marker while the judge's request is being answered, then answers
/// SUPPORTED: only the fenced commit can still see the cancel.
struct MarkerThenSupported(Store);

impl Respond for MarkerThenSupported {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        futures::executor::block_on(self.0.cancel("r-late")).unwrap();
        supported()
    }
}

#[actix_rt::test]
async fn the_commit_stores_cancelled_when_the_marker_arrived_after_the_decision() {
    let server = MockServer::start().await;
    let (harness, store) = world("r-late", Some(&server.uri()), None);
    Mock::given(wiremock::matchers::method("POST"))
        .respond_with(MarkerThenSupported(store.clone()))
        .mount(&server)
        .await;
    let registry = RunRegistry::new(harness).start();
    let answer = registry
        .send(release("r-late", "FINAL_ANSWER"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.result.outcome, Outcome::Cancelled);
    assert_eq!(store.get_result("r-late").await.unwrap(), Some(answer.json));
    let audit = audit(&store, "r-late").await;
    assert_eq!(audit["cancelled_by"], "http", "the HTTP API's marker");
    assert_eq!(
        audit["verdict"]["verdict"], "SUPPORTED",
        "the decision is audited"
    );
}

#[actix_rt::test]
async fn the_commit_stores_the_decided_result_with_its_audit() {
    let server = MockServer::start().await;
    let (harness, store) = world("r-decided", Some(&server.uri()), None);
    Mock::given(wiremock::matchers::method("POST"))
        .respond_with(supported())
        .expect(1)
        .mount(&server)
        .await;
    let registry = RunRegistry::new(harness).start();
    let answer = registry
        .send(release("r-decided", "FINAL_ANSWER"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.result.outcome, Outcome::Success);
    assert_eq!(
        store.get_result("r-decided").await.unwrap(),
        Some(answer.json)
    );
    let audit = audit(&store, "r-decided").await;
    assert_eq!(audit["outcome"], "SUCCESS");
    assert_eq!(audit["model_attempts"].as_array().map(Vec::len), Some(1));
    assert_eq!(audit["budget"]["model_calls"], 1);
}
