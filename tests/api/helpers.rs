//! `spawn_app()`: the real service on port 0, on the suite's Redis with a unique key prefix,
//! its model pointed wherever the test says; request helpers; seeding of the agent's
//! records as the tool layer writes them.

use std::time::Duration;

use redis::AsyncCommands;
use release_harness::config::Config;
use release_harness::http::{Application, Shutdown};
use release_harness::store::agent_records::{AgentRecords, CallsLists};
use release_harness::store::Keys;
use serde_json::Value;

pub use crate::common::*;

pub const TOKEN: &str = "test-token-0123";

/// The metrics recorder is one per process and the suite's tests run in parallel in it, so a
/// test that asserts "no Redis error was counted" holds this for writing, and every test that
/// makes Redis fail (an outage, a pause, a killed connection, a lost lock) holds it for
/// reading: the fault tests still run beside each other, never beside that assertion.
pub static STORE_FAULTS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub struct TestApp {
    pub address: String,
    pub prefix: String,
    pub redis_url: String,
    pub client: reqwest::Client,
    pub shutdown: Shutdown,
    pub stopped: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub struct AppOptions {
    pub model: Option<String>,
    pub redis_url: Option<String>,
    pub prefix: Option<String>,
    pub tweak: Box<dyn FnOnce(&mut Config)>,
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions {
            model: None,
            redis_url: None,
            prefix: None,
            tweak: Box::new(|_| {}),
        }
    }
}

pub fn init_test_logs() {
    if std::env::var("TEST_LOG").is_ok() {
        release_harness::telemetry::init_tracing(release_harness::config::LogFormat::Text);
    }
}

pub async fn spawn_app(options: AppOptions) -> TestApp {
    init_test_logs();
    let mut config = crate::common::config(options.model.as_deref());
    let redis_url = options.redis_url.unwrap_or_else(redis_url);
    let prefix = options.prefix.unwrap_or_else(|| unique_prefix("api"));
    config.server.listen = "127.0.0.1:0".into();
    config.server.api_token = TOKEN.into();
    config.server.workers = 2;
    config.server.shutdown_drain_ms = 5_000;
    use_store(&mut config, &redis_url);
    config.redis.key_prefix = prefix.clone();
    config.redis.response_timeout_ms = std::num::NonZero::new(1_000).unwrap();
    config.redis.connection_timeout_ms = std::num::NonZero::new(500).unwrap();
    (options.tweak)(&mut config);
    let app = Application::build(config).await.expect("the app builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let shutdown = app.shutdown_handle();
    let stopped = tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        prefix,
        redis_url,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        shutdown,
        stopped,
    }
}

/// Seeds records for an app that is not a `TestApp` (the binary under test).
pub struct Seeder {
    prefix: String,
}

impl TestApp {
    pub fn seeder(prefix: &str) -> Seeder {
        Seeder {
            prefix: prefix.to_string(),
        }
    }
}

impl Seeder {
    pub async fn seed(&self, invocations: &[Value]) {
        seed_records(&redis_url(), &self.prefix, invocations).await;
    }
}

/// Writes invocation records (bundle form) as the agent's tool layer would: a HASH per
/// call under its own run (or `stored_under`), and each run's calls LIST.
pub async fn seed_records(redis_url: &str, prefix: &str, invocations: &[Value]) {
    let mut conn = store_connection(redis_url);
    let mut pipe = redis::pipe();
    AgentRecords::from_json(invocations, "")
        .expect("invocations in bundle form")
        .write_redis(&mut pipe, &Keys::new(prefix), CallsLists::Append);
    let _: () = pipe.query_async(&mut conn).await.unwrap();
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn post_release(&self, run: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/v1/runs/{run}/release")))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn cancel(&self, run: &str) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/v1/runs/{run}/cancel")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("request sent")
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("request sent")
            .text()
            .await
            .expect("a text body")
    }

    /// The status of an unauthenticated GET (`/readyz`, `/healthz`).
    pub async fn status(&self, path: &str) -> u16 {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request sent")
            .status()
            .as_u16()
    }

    /// A connection to the app's store (routed by key on a cluster).
    pub async fn redis(&self) -> release_harness::store::RedisConnection {
        store_connection(&self.redis_url)
    }

    pub async fn seed(&self, invocations: &[Value]) {
        seed_records(&self.redis_url, &self.prefix, invocations).await;
    }

    pub async fn stored(&self, key_suffix: &str) -> Option<String> {
        let mut conn = self.redis().await;
        conn.get(format!("{}:{key_suffix}", self.prefix))
            .await
            .unwrap()
    }
}

/// Failed Redis operations, all `op`s together, in a Prometheus text exposition.
pub fn store_errors(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("harness_store_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of one series in a Prometheus text exposition (0 if absent).
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// POSTs the standard Draft's release of `run` to `base` in the background (for tests that
/// act while it is pending).
pub fn release_in_background(
    client: &reqwest::Client,
    base: &str,
    run: &str,
) -> tokio::task::JoinHandle<reqwest::Response> {
    let (client, url) = (client.clone(), format!("{base}/v1/runs/{run}/release"));
    tokio::spawn(async move {
        client
            .post(url)
            .bearer_auth(TOKEN)
            .json(&release_body(good_draft()))
            .send()
            .await
            .expect("the release request was answered")
    })
}

pub fn release_body(draft: Value) -> Value {
    serde_json::json!({"query": QUERY, "draft": draft, "stop_reason": "FINAL_ANSWER"})
}

pub async fn json(response: reqwest::Response) -> Value {
    response.json().await.expect("a JSON body")
}

/// Asserts the JSON error shape and returns its code.
pub async fn error_code(response: reqwest::Response, status: u16) -> String {
    assert_eq!(response.status().as_u16(), status);
    let body = json(response).await;
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["code"].as_str().unwrap().to_string()
}

/// A redis-server owned by the test (killed on drop), separate from the suite's: for tests
/// that stop, pause or cut it.
pub struct OwnRedis {
    pub port: u16,
    child: std::process::Child,
}

impl OwnRedis {
    pub fn start(port: u16) -> OwnRedis {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test.sh installs it)");
        let redis = OwnRedis { port, child };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return redis;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start on {port}");
    }

    pub fn start_any() -> OwnRedis {
        OwnRedis::start(free_port())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP: the server keeps its connections and answers nothing until `resume`.
    pub fn pause(&self) {
        signal(self.child.id(), "-STOP");
    }

    pub fn resume(&self) {
        signal(self.child.id(), "-CONT");
    }

    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("redis reachable")
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a signal (`-STOP`, `-CONT`, `-TERM`, `-KILL`) to a process.
pub fn signal(pid: u32, which: &str) {
    let sent = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "kill {which} {pid}");
}

/// A TCP port that is free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The real binary, `release-harness serve`, as its own process (killed on drop).
pub struct Replica {
    pub base: String,
    pub child: std::process::Child,
}

impl Replica {
    /// Starts `serve` on a free port against `redis` and `model` with key `prefix`, plus
    /// `env` (HARNESS__... overrides), and waits until it is ready.
    pub async fn start(prefix: &str, redis: &str, model: &str, env: &[(&str, &str)]) -> Replica {
        Replica::start_with(prefix, redis, model, env, false).await
    }

    /// As [`Replica::start`], with stdout and stderr on pipes the test holds (`child.stderr`).
    pub async fn start_piped(
        prefix: &str,
        redis: &str,
        model: &str,
        env: &[(&str, &str)],
    ) -> Replica {
        Replica::start_with(prefix, redis, model, env, true).await
    }

    async fn start_with(
        prefix: &str,
        redis: &str,
        model: &str,
        env: &[(&str, &str)],
        piped: bool,
    ) -> Replica {
        let port = free_port();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_release-harness"));
        if piped {
            command
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
        }
        let child = command
            .arg("serve")
            .env("HARNESS__SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .env("HARNESS__SERVER__API_TOKEN", TOKEN)
            .env("HARNESS__SERVER__WORKERS", "1")
            .envs(store_env(redis))
            .env("HARNESS__REDIS__KEY_PREFIX", prefix)
            .env("HARNESS__MODEL__BASE_URL", model)
            // These tests count model requests: no start-up probe.
            .env("HARNESS__MODEL__PROBE_ON_START", "false")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .spawn()
            .expect("the binary starts");
        let replica = Replica {
            base: format!("http://127.0.0.1:{port}"),
            child,
        };
        let client = reqwest::Client::new();
        for _ in 0..400 {
            let ready = client
                .get(format!("{}/readyz", replica.base))
                .send()
                .await
                .map(|r| r.status().as_u16() == 200)
                .unwrap_or(false);
            if ready {
                return replica;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the replica never became ready");
    }

    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
