//! `release-harness soak`: drives a harness at a fixed request rate with the scenario mix,
//! seeding each run's records in Redis and serving the model itself, then checks the
//! invariants and writes a report. By default it starts the harness in this process next
//! to the configured Redis; with `--target` it drives one or more that are already running
//! (which must use this command's fake model, see `--model-listen`). With `--chaos` (the
//! targets being killed, Redis paused and pub/sub cut by `scripts/chaos.sh`) every release
//! is retried across the targets until answered, and the store's integrity is checked at
//! the end ([`super::chaos`]).

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

use super::report::{
    open_fds, percentiles, plot, rss_kb, OverloadReport, PlotError, Report, RssPoint, Sample,
};
use super::scenarios::{RunPlan, Scenario, CANARIES};
use crate::config::Config;
use crate::http::{Application, StartError};
use crate::store::agent_records::{AgentRecords, CallsLists};
use crate::store::{Keys, StoreError};
use crate::tools::fake_model::{FakeModel, FakeModelOptions};

/// Why a soak could not run (exit 2), as opposed to the invariants it found broken.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    #[error("unknown scenario {0:?}; see src/tools/soak/scenarios.rs")]
    UnknownScenario(String),
    #[error("cannot start the fake model: {0}")]
    FakeModel(std::io::Error),
    #[error("cannot reach Redis at {target} (redis.url / redis.cluster_nodes): {detail}; the soak writes the agent's records there, so it did not start")]
    RedisUnreachable { target: String, detail: String },
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the soak's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("cannot draw the plot: {0}")]
    Plot(#[from] PlotError),
    #[error("cannot write the report into {dir}: {source}")]
    Write {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Why a run's records could not be seeded (a violation once retries are spent).
#[derive(Debug, thiserror::Error)]
enum SeedFailure {
    #[error("the scenario's records are invalid: {0}")]
    Records(#[from] crate::store::agent_records::RecordsError),
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
}

#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// How long to send requests, in seconds.
    #[arg(long, default_value_t = 30)]
    pub duration: u64,
    /// Requests per second (open loop: sent on schedule whatever the answers do).
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// At most this many releases in flight; a tick beyond it is counted as skipped.
    #[arg(long, default_value_t = 500)]
    pub max_in_flight: usize,
    /// Drive already running harness replicas at these base URLs (repeat the flag) instead
    /// of starting one; requests go round-robin.
    #[arg(long)]
    pub target: Vec<String>,
    /// Faults are being injected: retry every release (409 and 503 after Retry-After,
    /// transport errors on the next target) until answered, then check that every answer
    /// is what is stored, that no run cancelled before its request was released, and that
    /// no lock is left behind.
    #[arg(long)]
    pub chaos: bool,
    /// With `--chaos`: how long one release may take, retries included, before it counts
    /// as lost.
    #[arg(long, default_value_t = 60)]
    pub retry_for: u64,
    /// Bearer token of the target harness.
    #[arg(long, default_value = "")]
    pub token: String,
    /// Key prefix of the target harness (its redis.key_prefix).
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Process whose memory is sampled (default: this process).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Address of the in-process harness (use a fixed port for Prometheus to scrape).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Address of the fake model.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub model_listen: String,
    /// Latency the fake model adds to every answer, in ms.
    #[arg(long, default_value_t = 20)]
    pub model_latency_ms: u64,
    /// Share of model requests answered with HTTP 500 (on top of the scenario mix).
    #[arg(long, default_value_t = 0.0)]
    pub model_error_rate: f64,
    /// Play only this scenario (e.g. `supported` for a load test of judged releases).
    #[arg(long)]
    pub only: Option<String>,
    /// Where the report (report.json, plot.svg) is written.
    #[arg(long, default_value = "soak-reports")]
    pub report_dir: PathBuf,
    /// Do not fetch each run's audit after its release (the report then has no
    /// `overhead_ms`): the harness serves the releases alone, as `scripts/instructions.sh`
    /// measures them.
    #[arg(long)]
    pub no_audit: bool,
    /// Send the releases over HTTP/2 without TLS (h2c with prior knowledge), multiplexed on
    /// a few connections, instead of HTTP/1.1 (one connection per release in flight). The
    /// fake model accepts both; an in-process harness then also asks it over h2c.
    #[arg(long)]
    pub http2: bool,
    /// With `--http2`: the releases are spread over this many connections, as a fleet of
    /// agents would open them (a harness allows `server.h2_max_concurrent_streams` streams
    /// on each; one connection would queue every release past that in this client).
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// The harness is being driven past its capacity (`scripts/overload.sh`): a `503
    /// overloaded` with `Retry-After` is an expected answer (counted, not a violation), and
    /// an admitted judged release may end `SEMANTIC_UNAVAILABLE` (its deadline passed in the
    /// model queue). The report gains an `overload` section.
    #[arg(long)]
    pub overload: bool,
    /// With `--only`: the records of every run the schedule can send (`--rate` x
    /// `--duration`, at most 500,000) are written before the clock starts, so that the
    /// driver's time goes to the releases alone (`scripts/overload.sh`: past saturation,
    /// most runs are shed, and seeding each as it is sent took the cores the harness shares).
    #[arg(long)]
    pub preseed: bool,
}

/// What the request tasks share.
pub(super) struct Shared {
    /// One client per connection (`--connections` with `--http2`, else one pooled client).
    pub(super) clients: Vec<reqwest::Client>,
    /// The harness replicas' base URLs (one unless `--target` is repeated).
    pub(super) targets: Vec<String>,
    chaos: bool,
    /// Whether each run's audit is fetched for its `overhead_ms` (not with `--no-audit`).
    fetch_audit: bool,
    /// `--overload`: shed answers are expected.
    overload: bool,
    /// Runs 1 to this were seeded before the clock started (`--preseed`).
    preseeded: u64,
    shed: AtomicU64,
    shed_without_retry_after: AtomicU64,
    shed_latencies: Mutex<Vec<f64>>,
    store_errors: AtomicU64,
    other_errors: AtomicU64,
    retry_for: Duration,
    pub(super) token: String,
    pub(super) prefix: String,
    /// Part of every run id, so that two soaks against one harness never share a run.
    session: String,
    pub(super) redis: crate::store::RedisConnection,
    /// The seeded records and calls lists expire with the results (`redis.result_ttl_seconds`),
    /// so a soak leaves nothing behind for longer than its results.
    pub(super) records_ttl_seconds: u64,
    started: Instant,
    sent: AtomicU64,
    answered: AtomicU64,
    failures: AtomicU64,
    /// Requests sent again (chaos): after a 409, a 503 or a transport error.
    retries: AtomicU64,
    /// Every 200 answer (chaos), checked against the store at the end.
    pub(super) answers: Mutex<Vec<super::chaos::Answered>>,
    samples: Mutex<Vec<Sample>>,
    outcomes: Mutex<BTreeMap<String, u64>>,
    scenarios: Mutex<BTreeMap<String, u64>>,
    violations: Mutex<Vec<String>>,
}

impl Shared {
    pub(super) fn violation(&self, text: String) {
        self.failures.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut v) = self.violations.lock() {
            if v.len() < 200 {
                v.push(text);
            }
        }
    }
}

async fn seed(shared: &Shared, run: &str, plan: &RunPlan) -> Result<(), SeedFailure> {
    let mut conn = shared.redis.clone();
    seed_records(
        &mut conn,
        &shared.prefix,
        shared.records_ttl_seconds,
        run,
        plan,
    )
    .await
}

/// Writes a run's records (and its cancel marker, if its plan sets one before the release)
/// as the agent's tool layer would.
async fn seed_records(
    conn: &mut crate::store::RedisConnection,
    prefix: &str,
    ttl_seconds: u64,
    run: &str,
    plan: &RunPlan,
) -> Result<(), SeedFailure> {
    if plan.invocations.is_empty() && !plan.marker_before {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    if plan.marker_before {
        pipe.set_ex(format!("{prefix}:run:{{{run}}}:cancelled"), "1", 3600)
            .ignore();
    }
    let records = AgentRecords::from_json(&plan.invocations, run)?;
    let keys = Keys::new(prefix);
    records.write_redis(&mut pipe, &keys, CallsLists::Append);
    records.expire_redis(&mut pipe, &keys, ttl_seconds);
    Ok(pipe.query_async::<()>(conn).await?)
}

/// The id of the soak's `number`th run: every soak session's runs are its own.
fn run_id(session: &str, number: u64) -> String {
    format!("soak-{session}-{number}")
}

/// `--preseed`: the records of runs 1 to `count` of `scenario`, written before the clock
/// starts, 64 runs at a time. Answers how many were written (all, or up to the first
/// failure: the rest are seeded as they are sent).
async fn preseed(
    redis: &crate::store::RedisConnection,
    prefix: &str,
    ttl_seconds: u64,
    session: &str,
    scenario: Scenario,
    count: u64,
) -> u64 {
    let mut seeded = 0;
    let mut from = 1;
    while from <= count {
        let to = (from + 63).min(count);
        let mut batch = tokio::task::JoinSet::new();
        for number in from..=to {
            let (mut conn, prefix) = (redis.clone(), prefix.to_string());
            let run = run_id(session, number);
            batch.spawn(async move {
                let plan = scenario.plan(&run);
                seed_records(&mut conn, &prefix, ttl_seconds, &run, &plan).await
            });
        }
        let written = batch.join_all().await;
        if written.iter().any(Result::is_err) {
            return seeded;
        }
        seeded = to;
        from = to + 1;
    }
    seeded
}

async fn play(shared: Arc<Shared>, number: u64, scenario: Scenario) {
    let run = run_id(&shared.session, number);
    let plan = scenario.plan(&run);
    if let Ok(mut s) = shared.scenarios.lock() {
        *s.entry(scenario.name().into()).or_default() += 1;
    }
    // Under chaos Redis may be paused: the agent's tool layer would retry its writes too.
    let seeding = Instant::now();
    if number > shared.preseeded {
        while let Err(e) = seed(&shared, &run, &plan).await {
            if !shared.may_retry(seeding) {
                shared.violation(format!("{run}: seeding failed: {e}"));
                return;
            }
            shared.retries.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let began = Instant::now();
    let canceller = plan.cancel_after.map(|after| {
        let shared = shared.clone();
        let run = run.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            cancel(&shared, &run, number).await;
        })
    });
    let response = release(&shared, &run, number, &plan.body).await;
    let latency = began.elapsed();
    if let Some(c) = canceller {
        let _ = c.await;
    }
    let (status, text, retry_after) = match response {
        Ok(answer) => answer,
        Err(e) => {
            shared.other_errors.fetch_add(1, Ordering::SeqCst);
            shared.violation(format!("{run}: no answer: {e}"));
            return;
        }
    };
    shared.answered.fetch_add(1, Ordering::SeqCst);
    if shared.overload && status != 200 {
        let code = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|body| body["error"]["code"].as_str().map(str::to_string));
        match (status, code.as_deref()) {
            (503, Some("overloaded")) => {
                shared.shed.fetch_add(1, Ordering::SeqCst);
                if retry_after.is_none_or(|secs| secs < 1) {
                    shared
                        .shed_without_retry_after
                        .fetch_add(1, Ordering::SeqCst);
                }
                if let Ok(mut l) = shared.shed_latencies.lock() {
                    l.push(latency.as_secs_f64() * 1000.0);
                }
                return;
            }
            (503, Some("store_unavailable" | "store_outcome_unknown")) => {
                shared.store_errors.fetch_add(1, Ordering::SeqCst);
            }
            _ => {
                shared.other_errors.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    if status != 200 {
        shared.violation(format!(
            "{run} ({}): HTTP {status}: {text}",
            scenario.name()
        ));
        return;
    }
    let result: Value = serde_json::from_str(&text).unwrap_or_default();
    if shared.chaos {
        if let Ok(mut answers) = shared.answers.lock() {
            answers.push(super::chaos::Answered {
                run: run.clone(),
                answer: result.clone(),
                marker_before: plan.marker_before,
            });
        }
    }
    let outcome = result["outcome"].as_str().unwrap_or("?").to_string();
    let fallback = result["fallback_type"].as_str();
    let queued_out = shared.overload && fallback == Some("SEMANTIC_UNAVAILABLE");
    if (outcome.as_str(), fallback) != plan.expected && !queued_out {
        shared.violation(format!(
            "{run} ({}): expected {:?}, got {outcome} {fallback:?}",
            scenario.name(),
            plan.expected
        ));
    }
    for canary in CANARIES {
        if text.contains(canary) {
            shared.violation(format!("{run}: the result contains {canary:?}"));
        }
    }
    if let Ok(mut o) = shared.outcomes.lock() {
        let key = match fallback {
            Some(f) => format!("{outcome}/{f}"),
            None => outcome,
        };
        *o.entry(key).or_default() += 1;
    }
    let overhead_ms = if shared.fetch_audit {
        audit_overhead_ms(&shared, &run, number).await
    } else {
        None
    };
    if let Ok(mut s) = shared.samples.lock() {
        s.push(Sample {
            at: shared.started.elapsed().as_secs_f64(),
            latency_ms: latency.as_secs_f64() * 1000.0,
            overhead_ms,
        });
    }
}

impl Shared {
    /// The replica for request `number` (and its `attempt`-th retry).
    /// The client release `number` is sent with (round-robin over the connections).
    pub(super) fn client(&self, number: u64) -> &reqwest::Client {
        &self.clients[(number as usize) % self.clients.len()]
    }

    fn target(&self, number: u64) -> &str {
        &self.targets[(number as usize) % self.targets.len()]
    }

    /// Whether a release that began at `began` may still be retried.
    fn may_retry(&self, began: Instant) -> bool {
        self.chaos && began.elapsed() < self.retry_for
    }
}

/// The harness's `timings.overhead_ms` of `run`, from its audit.
async fn audit_overhead_ms(shared: &Shared, run: &str, number: u64) -> Option<f64> {
    let audit_url = format!("{}/v1/runs/{run}/audit", shared.target(number));
    let response = shared
        .client(number)
        .get(audit_url)
        .bearer_auth(&shared.token)
        .send()
        .await
        .ok()?;
    let audit = response.json::<Value>().await.ok()?;
    audit["timings"]["overhead_ms"].as_f64()
}

/// The answer's `Retry-After` in whole seconds, if it has one.
fn retry_after_secs(response: &reqwest::Response) -> Option<u64> {
    response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// How long to wait before a retry: the answer's Retry-After, else 200 ms.
fn retry_delay(response: &reqwest::Response) -> Duration {
    response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_millis(200))
}

/// Sends the release; with `--chaos`, again on the next replica after a transport error
/// and after Retry-After on a 409 or 503, until answered otherwise or out of time.
async fn release(
    shared: &Shared,
    run: &str,
    number: u64,
    body: &Value,
) -> Result<(u16, String, Option<u64>), reqwest::Error> {
    let began = Instant::now();
    let mut attempt = 0u64;
    loop {
        let url = format!("{}/v1/runs/{run}/release", shared.target(number + attempt));
        attempt += 1;
        let sent = shared
            .client(number)
            .post(&url)
            .bearer_auth(&shared.token)
            .json(body)
            .send()
            .await;
        let wait = match sent {
            Ok(r) if [409, 503].contains(&r.status().as_u16()) && shared.may_retry(began) => {
                retry_delay(&r)
            }
            Ok(r) => {
                let status = r.status().as_u16();
                let retry_after = retry_after_secs(&r);
                return Ok((status, r.text().await.unwrap_or_default(), retry_after));
            }
            Err(_) if shared.may_retry(began) => Duration::from_millis(200),
            Err(e) => return Err(e),
        };
        shared.retries.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(wait).await;
    }
}

/// Cancels the run; with `--chaos`, on the next replica until one answers 202.
async fn cancel(shared: &Shared, run: &str, number: u64) {
    let began = Instant::now();
    let mut attempt = 0u64;
    loop {
        let url = format!("{}/v1/runs/{run}/cancel", shared.target(number + attempt));
        attempt += 1;
        let sent = shared
            .client(number)
            .post(url)
            .bearer_auth(&shared.token)
            .send()
            .await;
        if matches!(&sent, Ok(r) if r.status().as_u16() == 202) || !shared.may_retry(began) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn runs_in_flight(client: &reqwest::Client, base: &str) -> Option<f64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with("harness_runs_in_flight "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A connection to the configured Redis that answered a PING, or why not, naming it.
async fn reachable_redis(config: &Config) -> Result<crate::store::RedisConnection, SoakError> {
    let unreachable = |detail: String| SoakError::RedisUnreachable {
        target: config.redis_target(),
        detail,
    };
    let mut conn = crate::store::RedisConnection::open(&config.redis)
        .map_err(|e| unreachable(e.to_string()))?;
    let within = Duration::from_millis(
        config.redis.connection_timeout_ms.get() + config.redis.response_timeout_ms.get(),
    );
    let ping = redis::cmd("PING");
    let answered = tokio::time::timeout(within, ping.query_async::<String>(&mut conn)).await;
    match answered {
        Ok(Ok(_)) => Ok(conn),
        Ok(Err(e)) => Err(unreachable(e.to_string())),
        Err(_) => Err(unreachable(format!(
            "no answer within {} ms",
            within.as_millis()
        ))),
    }
}

/// Runs the soak; returns the report (violations empty = every invariant held).
pub async fn run(args: SoakArgs, mut config: Config) -> Result<Report, SoakError> {
    let only = match &args.only {
        None => None,
        Some(name) => {
            Some(Scenario::by_name(name).ok_or_else(|| SoakError::UnknownScenario(name.clone()))?)
        }
    };
    // The records go to this Redis: without it every run would fail, one by one, for the
    // whole duration. Say so now, naming it.
    let redis = reachable_redis(&config).await?;
    let model = FakeModel::start(
        &args.model_listen,
        FakeModelOptions {
            latency: Duration::from_millis(args.model_latency_ms),
            error_rate: args.model_error_rate,
            // Well past the harness's timeouts (which the soak sets to 1 s / 2.5 s for an
            // in-process harness), short enough that aborted hangs do not pile up.
            hang: Duration::from_secs(10),
            ..FakeModelOptions::default()
        },
    )
    .map_err(SoakError::FakeModel)?;
    eprintln!("fake model at {}", model.url);

    let (targets, token, prefix, app_shutdown) = match args.target.is_empty() {
        false => {
            let prefix = args
                .key_prefix
                .clone()
                .unwrap_or_else(|| config.redis.key_prefix.clone());
            let targets = args
                .target
                .iter()
                .map(|t| t.trim_end_matches('/').to_string())
                .collect();
            (targets, args.token.clone(), prefix, None)
        }
        true => {
            let prefix = format!(
                "soak-{}-{}",
                std::process::id(),
                chrono::Utc::now().timestamp()
            );
            config.server.listen = args.listen.clone();
            config.server.api_token = "soak-token".into();
            config.redis.key_prefix = prefix.clone();
            config.redis.result_ttl_seconds = positive(3600);
            config.model.base_url = model.url.clone();
            config.model.http2_prior_knowledge = args.http2;
            config.server.accept_h2c = args.http2;
            config.semantic_guard.attempt_timeout_ms = positive(1_000);
            config.semantic_guard.total_timeout_ms = positive(2_500);
            config.repair.timeout_ms = positive(1_000);
            let app = Application::build(config.clone()).await?;
            let base = format!("http://127.0.0.1:{}", app.port());
            let shutdown = app.shutdown_handle();
            actix_rt::spawn(app.run_until_stopped());
            eprintln!("harness at {base} (key prefix {prefix})");
            (vec![base], "soak-token".to_string(), prefix, Some(shutdown))
        }
    };
    let connections = match args.http2 {
        true => args.connections.max(1),
        false => 1,
    };
    let clients = (0..connections)
        .map(|_| {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .pool_max_idle_per_host(64);
            match args.http2 {
                true => client.http2_prior_knowledge().build(),
                false => client.build(),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let client = clients[0].clone();
    let session = format!("{}-{}", std::process::id(), chrono::Utc::now().timestamp());
    let records_ttl_seconds = config.redis.result_ttl_seconds.get();
    let preseeded = match (args.preseed, only) {
        (true, Some(scenario)) => {
            let count = (args.rate * args.duration as f64)
                .ceil()
                .clamp(0.0, 500_000.0) as u64;
            let seeded = preseed(
                &redis,
                &prefix,
                records_ttl_seconds,
                &session,
                scenario,
                count,
            )
            .await;
            eprintln!("preseeded {seeded} of {count} runs");
            seeded
        }
        _ => 0,
    };
    let shared = Arc::new(Shared {
        clients,
        targets: targets.clone(),
        chaos: args.chaos,
        fetch_audit: !args.no_audit,
        overload: args.overload,
        shed: AtomicU64::new(0),
        shed_without_retry_after: AtomicU64::new(0),
        shed_latencies: Mutex::new(Vec::new()),
        store_errors: AtomicU64::new(0),
        other_errors: AtomicU64::new(0),
        retry_for: Duration::from_secs(args.retry_for),
        token,
        prefix,
        records_ttl_seconds,
        session,
        preseeded,
        redis,
        started: Instant::now(),
        sent: AtomicU64::new(0),
        answered: AtomicU64::new(0),
        failures: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        answers: Mutex::new(Vec::new()),
        samples: Mutex::new(Vec::new()),
        outcomes: Mutex::new(BTreeMap::new()),
        scenarios: Mutex::new(BTreeMap::new()),
        violations: Mutex::new(Vec::new()),
    });

    let pid = args.pid.unwrap_or_else(std::process::id);
    let rss_series = Arc::new(Mutex::new(vec![RssPoint {
        at: 0.0,
        rss_kb: rss_kb(pid).unwrap_or(0),
    }]));
    let fds_max = Arc::new(AtomicU64::new(open_fds(pid).unwrap_or(0)));
    let sampler = {
        let rss_series = rss_series.clone();
        let fds_max = fds_max.clone();
        let started = shared.started;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Some(fds) = open_fds(pid) {
                    fds_max.fetch_max(fds, Ordering::SeqCst);
                }
                if let (Some(kb), Ok(mut series)) = (rss_kb(pid), rss_series.lock()) {
                    series.push(RssPoint {
                        at: started.elapsed().as_secs_f64(),
                        rss_kb: kb,
                    });
                }
            }
        })
    };

    let bar = ProgressBar::with_draw_target(Some(args.duration), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len}s {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let quiet = bar.is_hidden();
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.001));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let deadline = Instant::now() + Duration::from_secs(args.duration);
    // The releases are played on a runtime of their own, a thread per core: on the
    // command's single-threaded runtime the driver (seeding, sending, reading answers) was
    // the limit past about 1,000 releases/s, and its own queueing was measured as the
    // harness's latency (`scripts/overload.sh`, scenario 2). The schedule stays here.
    let players = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
        .thread_name("soak-player")
        .enable_all()
        .build()
        .map_err(SoakError::Runtime)?;
    let mut tasks = tokio::task::JoinSet::new();
    let mut number = 0u64;
    let mut skipped = 0u64;
    let mut last_second = 0u64;
    while Instant::now() < deadline {
        ticker.tick().await;
        while tasks.try_join_next().is_some() {}
        if tasks.len() >= args.max_in_flight {
            skipped += 1;
            continue;
        }
        number += 1;
        shared.sent.fetch_add(1, Ordering::SeqCst);
        let scenario = only.unwrap_or_else(|| Scenario::pick(rand::random::<u32>()));
        tasks.spawn_on(play(shared.clone(), number, scenario), players.handle());
        let second = shared.started.elapsed().as_secs();
        if second != last_second {
            last_second = second;
            let answered = shared.answered.load(Ordering::SeqCst);
            let message = format!(
                "{:.1} req/s | answered {answered} | failures {} | retries {} | in flight {}",
                answered as f64 / shared.started.elapsed().as_secs_f64(),
                shared.failures.load(Ordering::SeqCst),
                shared.retries.load(Ordering::SeqCst),
                tasks.len()
            );
            bar.set_position(second.min(args.duration));
            bar.set_message(message.clone());
            if quiet && second.is_multiple_of(10) {
                eprintln!("[{second:>4}s] {message}");
            }
        }
    }
    bar.finish_with_message("sending done; waiting for the last answers");
    let drain = tokio::time::timeout(Duration::from_secs(60 + args.retry_for), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drain.is_err() {
        shared.violation(format!("{} releases never answered", tasks.len()));
    }
    tasks.abort_all();
    // Not dropped here: dropping a runtime blocks, which an async context may not.
    players.shutdown_background();
    let elapsed = shared.started.elapsed().as_secs_f64();

    let in_flight_everywhere = || async {
        let mut total = Some(0.0);
        for base in &targets {
            total = match (total, runs_in_flight(&client, base).await) {
                (Some(t), Some(n)) => Some(t + n),
                _ => None,
            };
        }
        total
    };
    let mut in_flight_after = in_flight_everywhere().await;
    for _ in 0..50 {
        if in_flight_after == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        in_flight_after = in_flight_everywhere().await;
    }
    if in_flight_after != Some(0.0) {
        shared.violation(format!(
            "runs in flight after the soak: {in_flight_after:?}"
        ));
    }
    let sent = shared.sent.load(Ordering::SeqCst);
    let answered = shared.answered.load(Ordering::SeqCst);
    if sent != answered {
        shared.violation(format!("{sent} requests sent but {answered} answered"));
    }
    let integrity = match args.chaos {
        true => Some(
            super::chaos::check(
                &shared,
                Duration::from_millis(config.redis.lock_lease_ms.get()),
            )
            .await,
        ),
        false => None,
    };
    sampler.abort();
    if let Some(rss) = rss_kb(pid) {
        if let Ok(mut series) = rss_series.lock() {
            series.push(RssPoint {
                at: elapsed,
                rss_kb: rss,
            });
        }
    }

    let samples = shared.samples.lock().map(|s| s.clone()).unwrap_or_default();
    let rss = rss_series.lock().map(|s| s.clone()).unwrap_or_default();
    let run_dir = args
        .report_dir
        .join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string());
    let unwritten = |source| SoakError::Write {
        dir: run_dir.clone(),
        source,
    };
    std::fs::create_dir_all(&run_dir).map_err(unwritten)?;
    let plot_path = run_dir.join("plot.svg");
    plot(&plot_path, &samples, &rss)?;
    let latencies: Vec<f64> = samples.iter().map(|s| s.latency_ms).collect();
    let overheads: Vec<f64> = samples.iter().filter_map(|s| s.overhead_ms).collect();
    let mut violations = shared
        .violations
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    if skipped > 0 {
        violations.push(format!(
            "{skipped} ticks skipped: more than {} releases in flight",
            args.max_in_flight
        ));
    }
    let report = Report {
        started_at: chrono::Utc::now().to_rfc3339(),
        duration_s: elapsed,
        target_rate_per_s: args.rate,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        sent,
        answered,
        throughput_per_s: answered as f64 / elapsed,
        latency_ms: percentiles(&latencies),
        overhead_ms: percentiles(&overheads),
        rss_start_kb: rss.first().map(|r| r.rss_kb).unwrap_or(0),
        rss_end_kb: rss.last().map(|r| r.rss_kb).unwrap_or(0),
        rss_max_kb: rss.iter().map(|r| r.rss_kb).max().unwrap_or(0),
        rss_series: rss,
        outcomes: shared
            .outcomes
            .lock()
            .map(|o| o.clone())
            .unwrap_or_default(),
        scenarios: shared
            .scenarios
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default(),
        violations,
        retries: shared.retries.load(Ordering::SeqCst),
        integrity,
        runs_in_flight_after: in_flight_after,
        plot: plot_path.display().to_string(),
        overload: args.overload.then(|| {
            let admitted = samples.len() as u64;
            let shed_latencies = shared
                .shed_latencies
                .lock()
                .map(|l| l.clone())
                .unwrap_or_default();
            OverloadReport {
                admitted,
                goodput_per_s: admitted as f64 / elapsed,
                shed: shared.shed.load(Ordering::SeqCst),
                shed_without_retry_after: shared.shed_without_retry_after.load(Ordering::SeqCst),
                shed_latency_ms: percentiles(&shed_latencies),
                store_errors: shared.store_errors.load(Ordering::SeqCst),
                other_errors: shared.other_errors.load(Ordering::SeqCst),
                fds_max: fds_max.load(Ordering::SeqCst),
            }
        }),
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| unwritten(e.into()))?;
    std::fs::write(run_dir.join("report.json"), &json).map_err(unwritten)?;
    if let Some(shutdown) = app_shutdown {
        shutdown.run().await;
    }
    model.stop().await;
    Ok(report)
}

/// A positive literal of the soak's own settings.
fn positive(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN)
}
