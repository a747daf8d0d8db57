//! Every metric name in one place (CONTRACT §7), their descriptions, the Prometheus
//! recorder, and tracing set-up.
//!
//! Entry points: [`install_metrics`] (once per process; later calls share the handle),
//! [`init_tracing`], and one small function per event the rest of the crate records.
//! No label ever holds a run id, call id or free text.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::{Config, LogFormat};
use crate::domain::audit::{AttemptOutcome, CancelSource, ModelRole};
use crate::domain::evidence_guard::Rule;
use crate::domain::release::{FallbackType, Outcome};

pub const RELEASES_TOTAL: &str = "harness_releases_total";
pub const RELEASE_DURATION_SECONDS: &str = "harness_release_duration_seconds";
pub const OVERHEAD_SECONDS: &str = "harness_overhead_seconds";
pub const MODEL_CALLS_TOTAL: &str = "harness_model_calls_total";
pub const MODEL_CALL_DURATION_SECONDS: &str = "harness_model_call_duration_seconds";
pub const MODEL_TOKENS_TOTAL: &str = "harness_model_tokens_total";
pub const GUARD_VIOLATIONS_TOTAL: &str = "harness_guard_violations_total";
pub const RUNS_IN_FLIGHT: &str = "harness_runs_in_flight";
pub const CANCELLATIONS_TOTAL: &str = "harness_cancellations_total";
pub const STORE_ERRORS_TOTAL: &str = "harness_store_errors_total";
pub const BAD_RECORDS_TOTAL: &str = "harness_bad_records_total";
pub const SHED_TOTAL: &str = "harness_shed_total";
pub const MODEL_CALLS_IN_FLIGHT: &str = "harness_model_calls_in_flight";
pub const MODEL_QUEUE_WAIT_SECONDS: &str = "harness_model_queue_wait_seconds";
pub const MODEL_COOLDOWN_SECONDS: &str = "harness_model_cooldown_seconds";
pub const MODEL_GATE_REFUSED_TOTAL: &str = "harness_model_gate_refused_total";
pub const MODEL_CIRCUIT_OPEN: &str = "harness_model_circuit_open";
pub const MODEL_CIRCUIT_OPENED_TOTAL: &str = "harness_model_circuit_opened_total";
pub const ADMISSION_LIMIT: &str = "harness_admission_limit";
pub const SEMANTIC_TOTAL_TIMEOUT_SECONDS: &str = "harness_semantic_total_timeout_seconds";

/// Every `reason` of `harness_shed_total`.
pub const SHED_REASONS: [&str; 1] = ["overloaded"];
/// Every `reason` of `harness_model_gate_refused_total` (see `model::gate::Refused`).
pub const GATE_REFUSALS: [&str; 3] = ["deadline", "cooldown", "circuit_open"];

/// Every `reason` of `harness_bad_records_total` (the agent's data, not Redis failures).
pub const BAD_RECORD_REASONS: [&str; 7] = [
    "not_utf8",
    "wrong_type",
    "too_large",
    "over_budget",
    "calls_wrong_type",
    "calls_too_large",
    "other",
];
pub const READY: &str = "harness_ready";
pub const LOG_LINES_DROPPED_TOTAL: &str = "harness_log_lines_dropped_total";
pub const HTTP_REQUESTS_TOTAL: &str = "harness_http_requests_total";

/// Every `op` label the stores use, so each series exists (at zero) from start-up.
pub const STORE_OPS: [&str; 14] = [
    "connect",
    "begin",
    "load",
    "load_records",
    "cancel_marker",
    "cancel",
    "get_result",
    "get_audit",
    "commit",
    "watch",
    "unlock",
    "ping",
    "append_decision",
    "read_decisions",
];
const STORE_OPS_SUBSCRIBE: &str = "subscribe";

/// Describes every metric and creates every known label set at zero.
pub fn describe_metrics() {
    describe_counter!(
        RELEASES_TOTAL,
        Unit::Count,
        "Releases finished, by outcome and fallback type."
    );
    describe_histogram!(
        RELEASE_DURATION_SECONDS,
        Unit::Seconds,
        "Release time from request to result, by outcome."
    );
    describe_histogram!(
        OVERHEAD_SECONDS,
        Unit::Seconds,
        "Release time minus time spent waiting on the model."
    );
    describe_counter!(
        MODEL_CALLS_TOTAL,
        Unit::Count,
        "Model attempts by role and result (denied ones included)."
    );
    describe_histogram!(
        MODEL_CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Model attempt latency, by role."
    );
    describe_counter!(
        MODEL_TOKENS_TOTAL,
        Unit::Count,
        "Tokens reported by the model, by role and kind."
    );
    describe_counter!(
        GUARD_VIOLATIONS_TOTAL,
        Unit::Count,
        "EvidenceGuard violations, by rule."
    );
    describe_gauge!(
        RUNS_IN_FLIGHT,
        Unit::Count,
        "Releases currently running on this replica."
    );
    describe_counter!(
        CANCELLATIONS_TOTAL,
        Unit::Count,
        "Releases that ended CANCELLED, by how the cancel arrived."
    );
    describe_counter!(
        STORE_ERRORS_TOTAL,
        Unit::Count,
        "Failed Redis operations, by operation."
    );
    describe_counter!(
        BAD_RECORDS_TOTAL,
        Unit::Count,
        "Agent records (or calls lists) that could not be used as stored: not UTF-8, wrong Redis type, over a size limit. The agent's data, not Redis failures."
    );
    describe_gauge!(
        READY,
        Unit::Count,
        "1 when this replica is ready (Redis reachable, not draining), else 0."
    );
    describe_counter!(
        LOG_LINES_DROPPED_TOTAL,
        Unit::Count,
        "Log lines dropped because stderr was full (nobody reading) or gone (a closed pipe): logging never blocks a release."
    );
    counter!(LOG_LINES_DROPPED_TOTAL).absolute(0);
    describe_counter!(
        HTTP_REQUESTS_TOTAL,
        Unit::Count,
        "HTTP requests answered, by route pattern and status."
    );

    for (outcome, fallback) in release_label_sets() {
        releases_counter(outcome, fallback).absolute(0);
    }
    for role in ROLES {
        for result in AttemptOutcome::ALL {
            model_calls_counter(role, result).absolute(0);
        }
        for kind in TOKEN_KINDS {
            tokens_counter(role, kind).absolute(0);
        }
    }
    for rule in Rule::ALL {
        counter!(GUARD_VIOLATIONS_TOTAL, "rule" => rule.as_str()).absolute(0);
    }
    for source in CancelSource::ALL {
        counter!(CANCELLATIONS_TOTAL, "source" => source.as_str()).absolute(0);
    }
    for op in STORE_OPS.iter().chain([&STORE_OPS_SUBSCRIBE]) {
        counter!(STORE_ERRORS_TOTAL, "op" => *op).absolute(0);
    }
    for reason in BAD_RECORD_REASONS {
        counter!(BAD_RECORDS_TOTAL, "reason" => reason).absolute(0);
    }
    describe_overload();
    gauge!(RUNS_IN_FLIGHT).set(0.0);
}

/// The capacity and overload metrics (admission, the model gate), at zero.
fn describe_overload() {
    describe_counter!(
        SHED_TOTAL,
        Unit::Count,
        "Releases refused at the door (503 overloaded, nothing done), by reason."
    );
    describe_gauge!(
        ADMISSION_LIMIT,
        Unit::Count,
        "server.max_in_flight: releases this replica admits at once."
    );
    describe_gauge!(
        SEMANTIC_TOTAL_TIMEOUT_SECONDS,
        Unit::Seconds,
        "semantic_guard.total_timeout_ms, for alerts on the model queue wait."
    );
    describe_gauge!(
        MODEL_CALLS_IN_FLIGHT,
        Unit::Count,
        "Model requests open on this replica (at most model.max_concurrent_calls)."
    );
    describe_histogram!(
        MODEL_QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time a model attempt waited for a slot (and for a server's cooldown) before it was sent or refused."
    );
    describe_gauge!(
        MODEL_COOLDOWN_SECONDS,
        Unit::Seconds,
        "Seconds left of the cooldown a model server's Retry-After imposed (0 = none)."
    );
    describe_counter!(
        MODEL_GATE_REFUSED_TOTAL,
        Unit::Count,
        "Model attempts the gate did not send, by reason (deadline, cooldown, circuit_open)."
    );
    describe_gauge!(
        MODEL_CIRCUIT_OPEN,
        Unit::Count,
        "1 while the model circuit is open after repeated connection failures, else 0."
    );
    describe_counter!(
        MODEL_CIRCUIT_OPENED_TOTAL,
        Unit::Count,
        "Times the model circuit opened."
    );
    for reason in SHED_REASONS {
        counter!(SHED_TOTAL, "reason" => reason).absolute(0);
    }
    for reason in GATE_REFUSALS {
        counter!(MODEL_GATE_REFUSED_TOTAL, "reason" => reason).absolute(0);
    }
    counter!(MODEL_CIRCUIT_OPENED_TOTAL).absolute(0);
    gauge!(MODEL_CALLS_IN_FLIGHT).set(0.0);
    gauge!(MODEL_COOLDOWN_SECONDS).set(0.0);
    gauge!(MODEL_CIRCUIT_OPEN).set(0.0);
}

/// Histogram buckets that include the configured timeouts, so a timeout shows as its own bucket.
fn latency_buckets(config: &Config) -> Vec<f64> {
    let mut buckets = vec![
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
        45.0, 60.0, 90.0,
    ];
    for ms in [
        config.semantic_guard.attempt_timeout_ms,
        config.semantic_guard.total_timeout_ms,
        config.repair.timeout_ms,
    ] {
        buckets.push(ms.get() as f64 / 1000.0);
    }
    buckets.sort_by(f64::total_cmp);
    buckets.dedup();
    buckets
}

const OVERHEAD_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The process's recorder handle; the lock also makes a second app starting on another
/// thread wait for the first one's handle instead of racing it to the global recorder.
static PROMETHEUS: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the global Prometheus recorder once per process and describes every metric.
/// Later calls (several apps in one test process) get the same handle.
pub fn install_metrics(config: &Config) -> Result<PrometheusHandle, BuildError> {
    let mut installed = PROMETHEUS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let latency = latency_buckets(config);
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(RELEASE_DURATION_SECONDS.into()), &latency)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(MODEL_CALL_DURATION_SECONDS.into()), &latency)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(MODEL_QUEUE_WAIT_SECONDS.into()), &latency)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(OVERHEAD_SECONDS.into()), &OVERHEAD_BUCKETS)
        })?;
    let handle = builder.install_recorder()?;
    *installed = Some(handle.clone());
    describe_metrics();
    gauge!(ADMISSION_LIMIT).set(config.server.max_in_flight.get() as f64);
    gauge!(SEMANTIC_TOTAL_TIMEOUT_SECONDS)
        .set(config.semantic_guard.total_timeout_ms.get() as f64 / 1000.0);
    let _ = RELEASE_METRICS.set(ReleaseMetrics::register());
    Ok(handle)
}

/// The series every release touches, registered once with the installed recorder, so that
/// a release does not build and look up their keys again (about 1 µs each). Until
/// [`install_metrics`] has run (unit tests, benchmarks) the macros are used as before.
static RELEASE_METRICS: OnceLock<ReleaseMetrics> = OnceLock::new();

const ROLES: [ModelRole; 2] = ModelRole::ALL;
const OUTCOMES: [Outcome; 3] = Outcome::ALL;
const TOKEN_KINDS: [&str; 2] = ["prompt", "completion"];

struct ReleaseMetrics {
    /// By [`releases_index`].
    releases: Vec<Counter>,
    /// By outcome, in [`OUTCOMES`] order.
    durations: Vec<Histogram>,
    overhead: Histogram,
    /// By role ([`ROLES`]), then [`AttemptOutcome::ALL`].
    model_calls: Vec<Vec<Counter>>,
    /// By role.
    model_durations: Vec<Histogram>,
    /// By role, then [`TOKEN_KINDS`].
    tokens: Vec<Vec<Counter>>,
    in_flight: Gauge,
    model_in_flight: Gauge,
    queue_wait: Histogram,
}

/// The position of a `harness_releases_total` label set: SUCCESS and CANCELLED have no
/// fallback type, FALLBACK one of [`FallbackType::ALL`]; any other pairing has none.
fn releases_index(outcome: Outcome, fallback: Option<FallbackType>) -> Option<usize> {
    match (outcome, fallback) {
        (Outcome::Success, None) => Some(0),
        (Outcome::Cancelled, None) => Some(1),
        (Outcome::Fallback, Some(kind)) => FallbackType::ALL
            .iter()
            .position(|k| *k == kind)
            .map(|i| i + 2),
        _ => None,
    }
}

/// Every `harness_releases_total` label set, in [`releases_index`] order.
fn release_label_sets() -> impl Iterator<Item = (Outcome, Option<FallbackType>)> {
    [(Outcome::Success, None), (Outcome::Cancelled, None)]
        .into_iter()
        .chain(FallbackType::ALL.map(|k| (Outcome::Fallback, Some(k))))
}

// The series of each label set a release touches, named and labelled in one place: to
// register them once ([`ReleaseMetrics`]), to create them at zero ([`describe_metrics`]) and
// to record on them before [`install_metrics`] has run.

fn releases_counter(outcome: Outcome, fallback: Option<FallbackType>) -> Counter {
    let fallback = fallback.map(FallbackType::as_str).unwrap_or("none");
    counter!(RELEASES_TOTAL, "outcome" => outcome.as_str(), "fallback_type" => fallback)
}

fn duration_histogram(outcome: Outcome) -> Histogram {
    histogram!(RELEASE_DURATION_SECONDS, "outcome" => outcome.as_str())
}

fn model_calls_counter(role: ModelRole, result: AttemptOutcome) -> Counter {
    counter!(MODEL_CALLS_TOTAL, "role" => role.as_str(), "result" => result.as_str())
}

fn model_duration_histogram(role: ModelRole) -> Histogram {
    histogram!(MODEL_CALL_DURATION_SECONDS, "role" => role.as_str())
}

fn tokens_counter(role: ModelRole, kind: &'static str) -> Counter {
    counter!(MODEL_TOKENS_TOTAL, "role" => role.as_str(), "kind" => kind)
}

impl ReleaseMetrics {
    fn register() -> Self {
        ReleaseMetrics {
            releases: release_label_sets()
                .map(|(outcome, fallback)| releases_counter(outcome, fallback))
                .collect(),
            durations: OUTCOMES.map(duration_histogram).to_vec(),
            overhead: histogram!(OVERHEAD_SECONDS),
            model_calls: ROLES
                .map(|role| {
                    AttemptOutcome::ALL
                        .map(|r| model_calls_counter(role, r))
                        .to_vec()
                })
                .to_vec(),
            model_durations: ROLES.map(model_duration_histogram).to_vec(),
            tokens: ROLES
                .map(|role| TOKEN_KINDS.map(|kind| tokens_counter(role, kind)).to_vec())
                .to_vec(),
            in_flight: gauge!(RUNS_IN_FLIGHT),
            model_in_flight: gauge!(MODEL_CALLS_IN_FLIGHT),
            queue_wait: histogram!(MODEL_QUEUE_WAIT_SECONDS),
        }
    }

    fn release(&self, outcome: Outcome, fallback: Option<FallbackType>) -> Option<&Counter> {
        self.releases.get(releases_index(outcome, fallback)?)
    }

    fn duration(&self, outcome: Outcome) -> Option<&Histogram> {
        self.durations
            .get(OUTCOMES.iter().position(|o| *o == outcome)?)
    }

    fn role(role: ModelRole) -> Option<usize> {
        ROLES.iter().position(|r| *r == role)
    }

    fn model_call(&self, role: ModelRole, outcome: AttemptOutcome) -> Option<&Counter> {
        let result = AttemptOutcome::ALL.iter().position(|r| *r == outcome)?;
        self.model_calls.get(Self::role(role)?)?.get(result)
    }

    fn model_duration(&self, role: ModelRole) -> Option<&Histogram> {
        self.model_durations.get(Self::role(role)?)
    }

    fn tokens(&self, role: ModelRole, kind: usize) -> Option<&Counter> {
        self.tokens.get(Self::role(role)?)?.get(kind)
    }
}

/// Starts logging: RUST_LOG (default `info`), text or JSON, to stderr through
/// [`log_writer`](crate::log_writer) (a log line never blocks or fails its caller; ANSI
/// colours only when stderr is a terminal). Answers the handle that flushes the queued lines
/// before the process exits; a second call is a no-op and answers `None`.
pub fn init_tracing(format: LogFormat) -> Option<crate::log_writer::LogFlush> {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, flush) = crate::log_writer::stderr(log_lines_dropped);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        // A failed write must not be reported with eprintln! (it panics on a closed stderr).
        .log_internal_errors(false)
        .with_writer(writer);
    let installed = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    installed.ok().map(|()| flush)
}

/// Log lines dropped because stderr was stuck or gone ([`crate::log_writer`]).
pub fn log_lines_dropped(lines: u64) {
    counter!(LOG_LINES_DROPPED_TOTAL).increment(lines);
}

pub fn release_finished(
    outcome: Outcome,
    fallback: Option<FallbackType>,
    total: Duration,
    overhead: Duration,
) {
    let hot = RELEASE_METRICS.get();
    match hot.and_then(|m| m.release(outcome, fallback)) {
        Some(c) => c.increment(1),
        None => releases_counter(outcome, fallback).increment(1),
    }
    match hot.and_then(|m| m.duration(outcome)) {
        Some(h) => h.record(total.as_secs_f64()),
        None => duration_histogram(outcome).record(total.as_secs_f64()),
    }
    match hot {
        Some(m) => m.overhead.record(overhead.as_secs_f64()),
        None => histogram!(OVERHEAD_SECONDS).record(overhead.as_secs_f64()),
    }
}

pub fn model_attempt(
    role: ModelRole,
    outcome: AttemptOutcome,
    latency: Duration,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
) {
    let hot = RELEASE_METRICS.get();
    match hot.and_then(|m| m.model_call(role, outcome)) {
        Some(c) => c.increment(1),
        None => model_calls_counter(role, outcome).increment(1),
    }
    if outcome != AttemptOutcome::BudgetDenied {
        match hot.and_then(|m| m.model_duration(role)) {
            Some(h) => h.record(latency.as_secs_f64()),
            None => model_duration_histogram(role).record(latency.as_secs_f64()),
        }
    }
    for (kind, tokens) in [prompt_tokens, completion_tokens].into_iter().enumerate() {
        let Some(n) = tokens else { continue };
        match hot.and_then(|m| m.tokens(role, kind)) {
            Some(c) => c.increment(n),
            None => tokens_counter(role, TOKEN_KINDS[kind]).increment(n),
        }
    }
}

pub fn guard_violation(rule: Rule) {
    counter!(GUARD_VIOLATIONS_TOTAL, "rule" => rule.as_str()).increment(1);
}

/// A release began or ended on one registry shard; the gauge is the sum over all shards.
pub fn run_started() {
    match RELEASE_METRICS.get() {
        Some(m) => m.in_flight.increment(1.0),
        None => gauge!(RUNS_IN_FLIGHT).increment(1.0),
    }
}

pub fn run_ended() {
    match RELEASE_METRICS.get() {
        Some(m) => m.in_flight.decrement(1.0),
        None => gauge!(RUNS_IN_FLIGHT).decrement(1.0),
    }
}

pub fn cancelled(source: CancelSource) {
    counter!(CANCELLATIONS_TOTAL, "source" => source.as_str()).increment(1);
}

pub fn store_error(op: &'static str) {
    counter!(STORE_ERRORS_TOTAL, "op" => op).increment(1);
}

pub fn bad_record(reason: &'static str) {
    counter!(BAD_RECORDS_TOTAL, "reason" => reason).increment(1);
}

/// A release refused at the door (`503 overloaded`).
pub fn shed(reason: &'static str) {
    counter!(SHED_TOTAL, "reason" => reason).increment(1);
}

/// A model attempt got a slot (and is about to be sent) / gave it back.
pub fn model_call_opened() {
    match RELEASE_METRICS.get() {
        Some(m) => m.model_in_flight.increment(1.0),
        None => gauge!(MODEL_CALLS_IN_FLIGHT).increment(1.0),
    }
}

pub fn model_call_closed() {
    match RELEASE_METRICS.get() {
        Some(m) => m.model_in_flight.decrement(1.0),
        None => gauge!(MODEL_CALLS_IN_FLIGHT).decrement(1.0),
    }
}

pub fn model_queue_wait(waited: Duration) {
    match RELEASE_METRICS.get() {
        Some(m) => m.queue_wait.record(waited.as_secs_f64()),
        None => histogram!(MODEL_QUEUE_WAIT_SECONDS).record(waited.as_secs_f64()),
    }
}

pub fn model_gate_refused(reason: &'static str) {
    counter!(MODEL_GATE_REFUSED_TOTAL, "reason" => reason).increment(1);
}

pub fn model_cooldown(remaining: Duration) {
    gauge!(MODEL_COOLDOWN_SECONDS).set(remaining.as_secs_f64());
}

/// The model circuit opened (true) or closed again (false).
pub fn model_circuit(open: bool) {
    if open {
        counter!(MODEL_CIRCUIT_OPENED_TOTAL).increment(1);
    }
    gauge!(MODEL_CIRCUIT_OPEN).set(if open { 1.0 } else { 0.0 });
}

pub fn ready(is_ready: bool) {
    gauge!(READY).set(if is_ready { 1.0 } else { 0.0 });
}

pub fn http_request(route: &'static str, status: u16) {
    // The statuses the API answers need no String of their own.
    let status: metrics::SharedString = match status {
        200 => "200".into(),
        202 => "202".into(),
        400 => "400".into(),
        401 => "401".into(),
        404 => "404".into(),
        409 => "409".into(),
        413 => "413".into(),
        503 => "503".into(),
        other => other.to_string().into(),
    };
    counter!(HTTP_REQUESTS_TOTAL, "route" => route, "status" => status).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU64;

    #[test]
    fn each_release_label_set_has_its_own_cached_counter() {
        let sets: Vec<_> = release_label_sets().collect();
        assert_eq!(sets.len(), 2 + FallbackType::ALL.len());
        for (i, (outcome, fallback)) in sets.into_iter().enumerate() {
            assert_eq!(releases_index(outcome, fallback), Some(i));
        }
        assert_eq!(
            releases_index(Outcome::Success, Some(FallbackType::ALL[0])),
            None
        );
        assert_eq!(releases_index(Outcome::Fallback, None), None);
    }

    #[test]
    fn latency_buckets_include_the_configured_timeouts() {
        let mut config = Config::defaults();
        config.semantic_guard.attempt_timeout_ms = NonZeroU64::new(1234).unwrap();
        let buckets = latency_buckets(&config);
        assert!(buckets.contains(&1.234));
        assert!(buckets.contains(&45.0) && buckets.contains(&20.0));
        assert!(buckets.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn every_known_series_exists_from_start_up() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, describe_metrics);
        let text = handle.render();
        for needle in [
            "harness_releases_total{outcome=\"FALLBACK\",fallback_type=\"SEMANTIC_UNAVAILABLE\"} 0",
            "harness_model_calls_total{role=\"semantic\",result=\"budget_denied\"} 0",
            "harness_guard_violations_total{rule=\"call_missing\"} 0",
            "harness_cancellations_total{source=\"pubsub\"} 0",
            "harness_store_errors_total{op=\"load_records\"} 0",
            "harness_runs_in_flight 0",
            "harness_shed_total{reason=\"overloaded\"} 0",
            "harness_model_calls_in_flight 0",
            "harness_model_cooldown_seconds 0",
            "harness_model_gate_refused_total{reason=\"circuit_open\"} 0",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
