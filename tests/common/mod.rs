//! Shared test support: realistic invocation records, Drafts and bundles (CONTRACT §1-§2,
//! §6), a configuration pointed at a model server, wiremock responders that speak the
//! OpenAI chat-completions protocol, and the private Redis of `scripts/test.sh`.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use release_harness::check::{run_check, CheckOutput, RunBundle};
use release_harness::config::Config;
use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[allow(unused_imports)]
pub use release_harness::tools::fixtures::*;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A run id unique in this process (tests share stores only through Redis prefixes).
pub fn unique_run(name: &str) -> String {
    format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Defaults with the model (if any) at `model_url`, and short timeouts for tests.
pub fn config(model_url: Option<&str>) -> Config {
    let mut c = Config::defaults();
    if let Some(url) = model_url {
        c.model.base_url = url.to_string();
        c.model.name = "judge-test".into();
    }
    c.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(2_000).unwrap();
    c.semantic_guard.total_timeout_ms = std::num::NonZero::new(5_000).unwrap();
    c.repair.timeout_ms = std::num::NonZero::new(2_000).unwrap();
    c
}

/// Runs `check`'s release path (actor tree, in-memory store) on a bundle.
pub async fn release(config: Config, bundle: &Value) -> CheckOutput {
    let bundle = RunBundle::parse(&bundle.to_string()).expect("test bundle parses");
    run_check(config, &bundle).await.expect("release runs")
}

/// A chat-completion envelope whose message content is `content`.
pub fn completion(content: &str) -> Value {
    json!({
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1764583200, "model": "judge-test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 25, "total_tokens": 1225}
    })
}

pub fn verdict(verdict: &str, reason: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(completion(
        &json!({"verdict": verdict, "reason": reason}).to_string(),
    ))
}

pub fn content(text: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(completion(text))
}

/// Whether a recorded request is a SemanticGuard (not a repair) request.
pub fn is_semantic(request: &wiremock::Request) -> bool {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
    body["response_format"]["json_schema"]["name"] == "semantic_verdict"
}

pub fn is_repair(request: &wiremock::Request) -> bool {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
    body["response_format"]["json_schema"]["name"] == "evidence_repair"
}

/// Mounts a responder for SemanticGuard requests only.
pub async fn on_semantic(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .and(|r: &wiremock::Request| is_semantic(r))
        .respond_with(response)
        .mount(server)
        .await;
}

/// Mounts a responder for repair requests only.
pub async fn on_repair(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .and(|r: &wiremock::Request| is_repair(r))
        .respond_with(response)
        .mount(server)
        .await;
}

pub async fn requests(server: &MockServer) -> Vec<wiremock::Request> {
    server.received_requests().await.unwrap_or_default()
}

pub fn audit_rules(audit: &Value) -> Vec<String> {
    audit["violations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v["rule"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The private store of `scripts/test.sh`: the seed nodes of its Redis Cluster,
/// comma-separated, when `HARNESS_TEST_REDIS_CLUSTER` is set (the API suite's cluster run),
/// else its single redis-server (`HARNESS_TEST_REDIS_URL`). Tests that need Redis fail
/// loudly without it. Pass it to [`use_store`], [`store_env`] or [`store_connection`].
pub fn redis_url() -> String {
    if let Ok(nodes) = std::env::var("HARNESS_TEST_REDIS_CLUSTER") {
        if !nodes.is_empty() {
            return nodes;
        }
    }
    std::env::var("HARNESS_TEST_REDIS_URL").expect(
        "HARNESS_TEST_REDIS_URL is not set: run the suite with scripts/test.sh (it starts a private redis-server)",
    )
}

/// Whether a store (as [`redis_url`] gives it) is a Redis Cluster: a list of seed nodes.
pub fn is_cluster(store: &str) -> bool {
    store.contains(',')
}

/// Points a configuration at a store: one node (`redis.url`) or a cluster's seeds.
pub fn use_store(config: &mut Config, store: &str) {
    if is_cluster(store) {
        config.redis.url = String::new();
        config.redis.cluster_nodes = store.split(',').map(str::to_string).collect();
    } else {
        config.redis.url = store.to_string();
        config.redis.cluster_nodes.clear();
    }
}

/// The environment that points the binary at a store.
pub fn store_env(store: &str) -> [(&'static str, String); 2] {
    if is_cluster(store) {
        [
            ("HARNESS__REDIS__URL", String::new()),
            ("HARNESS__REDIS__CLUSTER_NODES", store.to_string()),
        ]
    } else {
        [
            ("HARNESS__REDIS__URL", store.to_string()),
            ("HARNESS__REDIS__CLUSTER_NODES", String::new()),
        ]
    }
}

/// A connection to a store, routed by key on a cluster (connects on first use).
pub fn store_connection(store: &str) -> release_harness::store::RedisConnection {
    let mut config = Config::defaults();
    use_store(&mut config, store);
    release_harness::store::RedisConnection::open(&config.redis).expect("a valid store address")
}

/// A key prefix no other test uses.
pub fn unique_prefix(name: &str) -> String {
    format!("t-{name}-{}-{:x}", std::process::id(), rand_u64())
}

pub fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(NEXT.fetch_add(1, Ordering::SeqCst));
    h.finish()
}

/// A model endpoint that accepts a connection, reads the request, never answers, and
/// reports when the client closes the connection (what wiremock cannot observe).
pub struct HangingModel {
    pub url: String,
    received: tokio::sync::mpsc::UnboundedReceiver<Event>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Received,
    Closed,
}

impl HangingModel {
    pub fn start() -> HangingModel {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, received) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8192];
                    let mut seen = Vec::new();
                    let mut announced = false;
                    loop {
                        match stream.read(&mut buf) {
                            Ok(0) | Err(_) => {
                                let _ = tx.send(Event::Closed);
                                return;
                            }
                            Ok(n) => {
                                seen.extend_from_slice(&buf[..n]);
                                if !announced && seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                    announced = true;
                                    let _ = tx.send(Event::Received);
                                }
                            }
                        }
                    }
                });
            }
        });
        HangingModel { url, received }
    }

    /// Asserts that the harness closes the pending call's connection within 2 s: the model
    /// call was really aborted, not left running.
    pub async fn expect_closed(&mut self, why: &str) {
        assert_eq!(
            self.next(std::time::Duration::from_secs(2)).await,
            Some(Event::Closed),
            "{why}"
        );
    }

    /// Waits (in real time) for the next event.
    pub async fn next(&mut self, within: std::time::Duration) -> Option<Event> {
        let deadline = std::time::Instant::now() + within;
        loop {
            match self.received.try_recv() {
                Ok(event) => return Some(event),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return None,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {}
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            // Real-time polling: works whether or not the test paused tokio's clock.
            std::thread::sleep(std::time::Duration::from_millis(5));
            tokio::task::yield_now().await;
        }
    }
}

/// A registry over an in-memory store filled from `bundle`, for tests that need to send
/// cancels while a release runs.
pub fn start_registry(
    config: Config,
    bundle: &Value,
) -> (
    actix::Addr<release_harness::actors::RunRegistry>,
    release_harness::store::Store,
    release_harness::domain::request::ReleaseRequest,
) {
    use actix::Actor;
    let bundle = RunBundle::parse(&bundle.to_string()).expect("bundle");
    let store = release_harness::store::Store::Memory(bundle.store().expect("store"));
    let harness = release_harness::actors::Harness::new(config, store.clone()).expect("harness");
    let registry = release_harness::actors::RunRegistry::new(harness).start();
    (registry, store, bundle.request().expect("request"))
}
