//! Typed configuration (CONTRACT §5), layered and validated once at start-up.
//!
//! Entry point: [`Config::load`]: the compiled-in `config/default.toml`, then the TOML file
//! named in `HARNESS_CONFIG`, then `HARNESS__SECTION__KEY` environment variables. Nothing
//! else in the crate reads the environment or a config file. A value that must be positive
//! has a `NonZero*` type: a zero fails as it is read, naming its key and where it was set;
//! [`Config::validate`] checks the rules between keys.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Deserialize;

use crate::domain::bounded::CopyLimits;
use crate::domain::budget::BudgetLimits;
use crate::domain::release::ReleasePolicy;
use crate::domain::snapshot::SnapshotLimits;

/// Keys whose values are text, however they look.
const STRING_KEYS: [&str; 8] = [
    "server.listen",
    "server.replica_name",
    "server.api_token",
    "redis.url",
    "redis.key_prefix",
    "model.base_url",
    "model.name",
    "model.api_key",
];

/// The documented defaults, compiled in.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// The name of [`CompiledDefaults`], by which a value is known to be a default rather than
/// something the operator set.
const DEFAULTS_NAME: &str = "release-harness compiled-in defaults";

/// `config/default.toml` as a figment provider under a name of its own, so that
/// [`Config::from_figment`] can tell a default `redis.url` from one the operator set.
struct CompiledDefaults;

impl Provider for CompiledDefaults {
    fn metadata(&self) -> Metadata {
        Metadata::named(DEFAULTS_NAME)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Toml::string(DEFAULT_TOML).data()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub redis: RedisConfig,
    pub model: ModelConfig,
    pub semantic_guard: SemanticGuardConfig,
    pub repair: RepairConfig,
    pub budget: BudgetConfig,
    pub progress: ProgressConfig,
    pub snapshot: SnapshotConfig,
    pub cancel: CancelConfig,
    pub evidence: EvidenceConfig,
    pub decisions: DecisionsConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address and port to listen on.
    pub listen: String,
    /// Bearer token of every /v1 route; empty only on loopback.
    pub api_token: String,
    /// Largest request body (413 above).
    pub max_body_bytes: NonZeroUsize,
    /// Time a client has to send its request head and body (408 after).
    pub client_request_timeout_ms: NonZeroU64,
    /// Drain time for in-flight releases on SIGTERM.
    pub shutdown_drain_ms: u64,
    /// HTTP workers; 0 = one per core.
    pub workers: usize,
    /// "text" or "json".
    pub log_format: LogFormat,
    /// This replica's name in lock tokens and 409 answers; empty = host name and pid.
    pub replica_name: String,
    /// Also accept HTTP/2 without TLS (h2c with prior knowledge) on `listen`, beside
    /// HTTP/1.1, through the bounded front door (`http::front_door`): a connection must
    /// send its first bytes within `client_request_timeout_ms`.
    pub accept_h2c: bool,
    /// Releases admitted at once on this replica; beyond it a release is answered `503
    /// overloaded` at the door (a stored result is still replayed).
    pub max_in_flight: NonZeroUsize,
    /// The `Retry-After` (whole seconds, at least 1) of a `503 overloaded`.
    pub overloaded_retry_after_s: NonZeroU64,
    /// Streams one HTTP/2 connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS,
    /// announced); more are refused by the client's h2 stack or reset.
    pub h2_max_concurrent_streams: NonZeroU32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// redis:// URL of a single node; empty when `cluster_nodes` selects Redis Cluster.
    pub url: String,
    /// Seed nodes (`redis://host:port`) of a Redis Cluster; non-empty selects cluster mode
    /// (then `url` must be empty). In the environment, a comma-separated list:
    /// `HARNESS__REDIS__CLUSTER_NODES=redis://h1:7000,redis://h2:7000`.
    #[serde(deserialize_with = "node_list")]
    pub cluster_nodes: Vec<String>,
    /// Replicas that must acknowledge a commit (`WAIT`) before its result is answered;
    /// 0 = none (Redis replicates asynchronously, a master lost before replicating loses it).
    pub min_replicas_ack: u32,
    /// How long the commit waits for those replicas; past it the release answers 503
    /// `store_outcome_unknown`. Less than `response_timeout_ms`.
    pub min_replicas_ack_timeout_ms: u64,
    /// Prefix P of every key.
    pub key_prefix: String,
    /// Per-command response timeout.
    pub response_timeout_ms: NonZeroU64,
    /// (Re)connection timeout.
    pub connection_timeout_ms: NonZeroU64,
    /// TTL of stored results, audit records and harness-set cancel markers.
    pub result_ttl_seconds: NonZeroU64,
    /// Lease of the in-flight lock: renewed by its holder every third of it while the
    /// release runs; a dead replica's runs are free again within one lease.
    pub lock_lease_ms: NonZeroU64,
}

impl RedisConfig {
    /// The store as a log line may name it: the single node's URL or the cluster's seeds,
    /// each without its password.
    pub fn target(&self) -> String {
        match self.cluster_nodes.is_empty() {
            true => without_password(&self.url),
            false => format!(
                "cluster {}",
                self.cluster_nodes
                    .iter()
                    .map(|node| without_password(node))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

/// A list of nodes, written as a list (TOML) or as one comma-separated string (the
/// environment, where figment reads a value as text).
fn node_list<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Nodes {
        List(Vec<String>),
        Text(String),
    }
    let nodes = match Nodes::deserialize(deserializer)? {
        Nodes::List(list) => list,
        Nodes::Text(text) => text.split(',').map(str::to_string).collect(),
    };
    Ok(nodes
        .iter()
        .map(|node| node.trim())
        .filter(|node| !node.is_empty())
        .map(str::to_string)
        .collect())
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelConfig {
    /// How often a replica checks the cancel markers of its runs in flight (one pipelined
    /// command per tick for all of them), so a cancel without a publish is still noticed.
    pub poll_interval_ms: NonZeroU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// `{"type": "json_schema", "json_schema": {"name", "strict": true, "schema"}}`
    /// (OpenAI, vLLM, Ollama, llama.cpp's `llama-server`).
    JsonSchema,
    /// `{"type": "json_object", "schema": {...}}`: llama-cpp-python's server, which
    /// enforces a schema only in this form and refuses `json_schema`.
    JsonObjectSchema,
    /// `{"type": "json_object"}`: any JSON, the schema only in the prompt.
    JsonObject,
    /// No `response_format`.
    None,
}

impl StructuredOutput {
    pub fn as_str(self) -> &'static str {
        match self {
            StructuredOutput::JsonSchema => "json_schema",
            StructuredOutput::JsonObjectSchema => "json_object_schema",
            StructuredOutput::JsonObject => "json_object",
            StructuredOutput::None => "none",
        }
    }

    /// Whether the server is asked to enforce the answer's schema.
    pub fn enforces_schema(self) -> bool {
        matches!(
            self,
            StructuredOutput::JsonSchema | StructuredOutput::JsonObjectSchema
        )
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// OpenAI-compatible base URL without trailing slash; empty = no model configured.
    pub base_url: String,
    /// Model name of every request.
    pub name: String,
    /// API key; empty sends none.
    pub api_key: String,
    /// How `response_format` is set.
    pub structured_output: StructuredOutput,
    /// TCP connect timeout.
    pub connect_timeout_ms: NonZeroU64,
    /// Whether `serve` probes the model at start-up (three small requests, logged; never
    /// delays readiness).
    pub probe_on_start: bool,
    /// Speak HTTP/2 without TLS negotiation (h2c, "prior knowledge") to `base_url`: every
    /// pending call of a worker shares one connection instead of holding one each. Only
    /// for a server or gateway known to accept h2c; off by default (HTTP/1.1).
    pub http2_prior_knowledge: bool,
    /// Model requests open at once on this replica (judge and repair alike); the others
    /// wait for a slot in arrival order, spending their role's total deadline.
    pub max_concurrent_calls: NonZeroUsize,
    /// Connection failures in a row (no HTTP answer) that open the circuit; 0 = no circuit.
    pub circuit_failures: u32,
    /// How long an open circuit fails attempts at once before one probe is let through.
    pub circuit_open_ms: NonZeroU64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SemanticGuardConfig {
    /// One attempt's timeout.
    pub attempt_timeout_ms: NonZeroU64,
    /// All attempts together.
    pub total_timeout_ms: NonZeroU64,
    /// Attempts in all (technical failures only are retried).
    pub max_attempts: NonZeroU32,
    /// Largest request body sent.
    pub max_input_bytes: u64,
    /// Largest accepted verdict content.
    pub max_output_bytes: u64,
    /// `max_tokens` of the request.
    pub max_output_tokens: NonZeroU32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairConfig {
    /// The one repair call's timeout.
    pub timeout_ms: NonZeroU64,
    /// Largest request body sent.
    pub max_input_bytes: u64,
    /// Cap on the accepted repaired Draft's bytes (the limit derives from the Draft's size).
    pub max_output_bytes: u64,
    /// Cap on `max_tokens` of the request (which derives from the Draft's size).
    pub max_output_tokens: NonZeroU32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Model calls per run.
    pub max_model_calls: NonZeroU32,
    /// Tokens per run.
    pub max_tokens: u64,
    /// Bytes per run.
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressConfig {
    /// Observed facts shown at most.
    pub max_facts: usize,
    /// Most recent calls of a run read at most.
    pub max_calls: NonZeroUsize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    /// Longest excerpt, message or cell, in characters.
    pub max_excerpt_chars: NonZeroUsize,
    /// Longest excerpt, message or cell, in bytes once JSON-escaped: the judge's view of the
    /// evidence, sized against `semantic_guard.max_input_bytes` (not
    /// `evidence.max_string_bytes`, the cap on strings copied into results).
    pub max_excerpt_bytes: NonZeroUsize,
    /// RAG hits and log entries per call.
    pub max_entries_per_call: NonZeroUsize,
    /// MySQL rows per call.
    pub max_rows_per_call: NonZeroUsize,
}

/// Limits on the agent's records (untrusted input) and on what the harness copies from them
/// into a result. Every limit fails closed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceConfig {
    /// Largest total of the guard's fields of one record, in bytes; larger = unusable call.
    pub max_record_bytes: NonZeroU64,
    /// Largest total of record fields loaded for one release, in bytes (cited records first,
    /// then the most recent calls); records past it are unusable calls.
    pub max_release_bytes: NonZeroU64,
    /// Longest string copied from a record into a result or the snapshot, in bytes once
    /// written as JSON; the run's call ids and Redis keys are masked first, then longer
    /// strings are cut at a char boundary and marked `…[truncated]`.
    pub max_string_bytes: NonZeroUsize,
    /// Most entries kept of one array or object inside a scope (then a `…` entry with the
    /// count left out); scopes also keep at most four levels of nesting.
    pub max_scope_items: NonZeroUsize,
    /// Largest JSON size of `verified_sources`, and of `observed_facts`, in one result:
    /// sources past it fail the release closed (`sources_too_large`), facts past it are
    /// dropped oldest first.
    pub max_written_bytes: NonZeroUsize,
    /// Distinct call ids one Draft may cite; a Draft citing more breaks EvidenceGuard
    /// (`too_many_cited_calls`) before any of its ids reaches Redis.
    pub max_cited_calls: NonZeroUsize,
    /// Largest calls list a release reads, in bytes as Redis holds it (`MEMORY USAGE`); a
    /// larger list makes every call of the run unusable (`calls_too_large`).
    pub max_calls_list_bytes: NonZeroU64,
}

/// The decision stream `P:decisions` (CONTRACT §1): one entry per committed release.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionsConfig {
    /// About how many entries the stream keeps (`XADD … MAXLEN ~ max_len`); older ones are
    /// trimmed by Redis in whole macro nodes, so it may hold a few more.
    pub max_len: NonZeroU64,
}

/// A configuration that cannot be used, with the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Values of the wrong type and other errors of reading the layers, one line each, each
    /// naming its key (`server.listen`, not figment's `default.server.listen`) and where it
    /// was set.
    #[error("configuration: {}", .0.join("\n  "))]
    Load(Vec<String>),
    /// Every key no section knows, each with where it was set and the section's keys.
    #[error("configuration: {}", .0.join("\n  "))]
    UnknownKeys(Vec<String>),
    #[error("configuration: HARNESS_CONFIG names {path:?}, which cannot be read: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("configuration key {key}: {problem}")]
    Invalid { key: &'static str, problem: String },
}

/// The variable naming the configuration file.
const CONFIG_FILE_VAR: &str = "HARNESS_CONFIG";

/// Where a key's value came from, in the words an operator would use to find it.
fn set_by(figment: &Figment, path: &[&str]) -> String {
    let Some(metadata) = figment.find_metadata(&path.join(".")) else {
        return String::new();
    };
    match &metadata.source {
        Some(figment::Source::File(file)) => format!(" (in {})", file.display()),
        _ if metadata.name.contains("environment") => format!(
            " (environment variable HARNESS__{})",
            path.join("__").to_uppercase()
        ),
        _ => String::new(),
    }
}

/// Every key of the layered configuration that `config/default.toml` (which holds every
/// key) does not have: all of them, not only the first serde would report.
fn unknown_keys(figment: &Figment) -> Vec<String> {
    use figment::value::{Dict, Value};
    let known: Dict = Figment::from(Toml::string(DEFAULT_TOML))
        .extract()
        .unwrap_or_default();
    let Ok(given) = figment.extract::<Dict>() else {
        return Vec::new();
    };
    let sections = known.keys().cloned().collect::<Vec<_>>().join(", ");
    let mut unknown = Vec::new();
    for (section, value) in &given {
        let Some(Value::Dict(_, known_keys)) = known.get(section) else {
            unknown.push(format!(
                "unknown section {section}{}; the sections are: {sections}",
                set_by(figment, &[section.as_str()])
            ));
            continue;
        };
        let Value::Dict(_, keys) = value else {
            continue;
        };
        for key in keys.keys().filter(|k| !known_keys.contains_key(*k)) {
            unknown.push(format!(
                "unknown key {section}.{key}{}; the keys of [{section}] are: {}",
                set_by(figment, &[section.as_str(), key.as_str()]),
                known_keys.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    unknown
}

/// figment's errors, one line each, with the key as written in config/default.toml.
fn load_errors(figment: &Figment, error: figment::Error) -> Vec<String> {
    error
        .into_iter()
        .map(|e| {
            let path: Vec<&str> = e.path.iter().map(String::as_str).collect();
            match path.is_empty() {
                true => e.kind.to_string(),
                false => format!("{}: {}{}", path.join("."), e.kind, set_by(figment, &path)),
            }
        })
        .collect()
}

impl Config {
    /// Defaults, then `HARNESS_CONFIG`, then `HARNESS__*` variables; validated.
    pub fn load() -> Result<Config, ConfigError> {
        if let Ok(path) = std::env::var(CONFIG_FILE_VAR) {
            if !path.is_empty() {
                if let Err(source) = std::fs::metadata(&path) {
                    return Err(ConfigError::File { path, source });
                }
            }
        }
        Config::from_figment(Config::figment())
    }

    /// The layered sources, for callers (tests) that want to add their own on top.
    pub fn figment() -> Figment {
        let mut figment = Figment::from(CompiledDefaults);
        if let Ok(path) = std::env::var(CONFIG_FILE_VAR) {
            if !path.is_empty() {
                figment = figment.merge(Toml::file_exact(path));
            }
        }
        figment = figment.merge(Env::prefixed("HARNESS__").split("__"));
        // figment types environment values by their look ("012345" becomes the number
        // 12345); string keys take the variable's text exactly.
        for key in STRING_KEYS {
            let var = format!("HARNESS__{}", key.replace('.', "__").to_uppercase());
            if let Ok(text) = std::env::var(var) {
                figment = figment.merge(Serialized::default(key, text));
            }
        }
        figment
    }

    pub fn from_figment(figment: Figment) -> Result<Config, ConfigError> {
        let unknown = unknown_keys(&figment);
        if !unknown.is_empty() {
            return Err(ConfigError::UnknownKeys(unknown));
        }
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Load(load_errors(&figment, e)))?;
        // Non-empty `redis.cluster_nodes` selects Redis Cluster (CONTRACT §5): the compiled-in
        // `redis.url` then does not count. One the operator set beside it is refused.
        if !config.redis.cluster_nodes.is_empty() && !config.redis.url.is_empty() {
            let url_is_default = figment
                .find_metadata("redis.url")
                .is_some_and(|m| m.name == DEFAULTS_NAME);
            if !url_is_default {
                return Err(ConfigError::Invalid {
                    key: "redis.url",
                    problem: format!(
                        "is set ({}) beside redis.cluster_nodes, which selects Redis Cluster: set only one of redis.url and redis.cluster_nodes",
                        describe_source(figment.find_metadata("redis.url"))
                    ),
                });
            }
            config.redis.url.clear();
        }
        config.validate()?;
        Ok(config)
    }

    /// The defaults alone (tests and benches start from here).
    pub fn defaults() -> Config {
        match Config::from_figment(Figment::from(CompiledDefaults)) {
            Ok(config) => config,
            Err(e) => panic!("config/default.toml is invalid: {e}"),
        }
    }

    /// Checks every cross-key rule once, so nothing later has to (zeros where a value must
    /// be positive are refused earlier, by the fields' `NonZero*` types).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, problem: &str| {
            Err(ConfigError::Invalid {
                key,
                problem: problem.to_string(),
            })
        };
        if self.listen_addr().is_err() {
            return invalid(
                "server.listen",
                "must be an address:port such as 127.0.0.1:8080",
            );
        }
        if self.server.api_token.trim() != self.server.api_token {
            return invalid(
                "server.api_token",
                "must not begin or end with whitespace (a blank token is no token: leave it empty, which only a loopback server.listen allows)",
            );
        }
        if self.redis.key_prefix.is_empty() {
            return invalid("redis.key_prefix", "must not be empty");
        }
        // Exactly one of the two selects the store: one node, or a Redis Cluster.
        match (
            self.redis.url.is_empty(),
            self.redis.cluster_nodes.is_empty(),
        ) {
            (true, true) => {
                return invalid(
                    "redis.url",
                    "set redis.url (one node) or redis.cluster_nodes (Redis Cluster)",
                )
            }
            (false, false) => {
                return invalid(
                    "redis.cluster_nodes",
                    "selects Redis Cluster: set redis.url to \"\" (HARNESS__REDIS__URL=) with it",
                )
            }
            (false, true) => {
                if !self.redis.url.starts_with("redis://")
                    && !self.redis.url.starts_with("rediss://")
                    && !self.redis.url.starts_with("unix://")
                {
                    return invalid(
                        "redis.url",
                        "must start with redis://, rediss:// or unix://",
                    );
                }
            }
            (true, false) => {
                if let Some(node) =
                    self.redis.cluster_nodes.iter().find(|node| {
                        !node.starts_with("redis://") && !node.starts_with("rediss://")
                    })
                {
                    return Err(ConfigError::Invalid {
                        key: "redis.cluster_nodes",
                        problem: format!("{node:?} must start with redis:// or rediss://"),
                    });
                }
            }
        }
        if self.redis.min_replicas_ack > 0
            && (self.redis.min_replicas_ack_timeout_ms == 0
                || self.redis.min_replicas_ack_timeout_ms >= self.redis.response_timeout_ms.get())
        {
            return invalid(
                "redis.min_replicas_ack_timeout_ms",
                "must be positive and below redis.response_timeout_ms when redis.min_replicas_ack > 0",
            );
        }
        if self.model.base_url.ends_with('/') {
            return invalid(
                "model.base_url",
                "must not end with '/' (\"/chat/completions\" is appended)",
            );
        }
        if !self.model.base_url.is_empty()
            && !self.model.base_url.starts_with("http://")
            && !self.model.base_url.starts_with("https://")
        {
            return invalid(
                "model.base_url",
                "must be an http:// or https:// URL, or empty",
            );
        }
        if !self.model.api_key.bytes().all(|b| b.is_ascii_graphic()) {
            return invalid("model.api_key", "must be printable ASCII without spaces");
        }
        let sg = &self.semantic_guard;
        // An excerpt the judge's whole input could not hold would fail every release that
        // cites it; one call's excerpts may still exceed it (that release fails closed).
        if self.snapshot.max_excerpt_bytes.get() as u64 > sg.max_input_bytes {
            return invalid(
                "snapshot.max_excerpt_bytes",
                "must be at most semantic_guard.max_input_bytes (the judge's whole input)",
            );
        }
        if self.redis.lock_lease_ms.get() < 3 * self.cancel.poll_interval_ms.get().max(100) {
            return invalid(
                "redis.lock_lease_ms",
                "must be at least three poll intervals (cancel.poll_interval_ms) and 300 ms: the lease is renewed on the poll tick",
            );
        }
        Ok(())
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, std::net::AddrParseError> {
        self.server.listen.parse()
    }

    /// The store as a log line may name it ([`RedisConfig::target`]).
    pub fn redis_target(&self) -> String {
        self.redis.target()
    }

    pub fn model_configured(&self) -> bool {
        !self.model.base_url.is_empty()
    }

    pub fn release_policy(&self) -> ReleasePolicy {
        ReleasePolicy {
            snapshot: SnapshotLimits {
                max_excerpt_chars: self.snapshot.max_excerpt_chars.get(),
                max_excerpt_bytes: self.snapshot.max_excerpt_bytes.get(),
                max_entries_per_call: self.snapshot.max_entries_per_call.get(),
                max_rows_per_call: self.snapshot.max_rows_per_call.get(),
            },
            max_facts: self.progress.max_facts,
            copy: CopyLimits {
                max_string_bytes: self.evidence.max_string_bytes.get(),
                max_scope_items: self.evidence.max_scope_items.get(),
                max_written_bytes: self.evidence.max_written_bytes.get(),
            },
            key_prefix: self.redis.key_prefix.clone(),
            max_cited_calls: self.evidence.max_cited_calls.get(),
        }
    }

    pub fn budget_limits(&self) -> BudgetLimits {
        BudgetLimits {
            max_model_calls: self.budget.max_model_calls.get(),
            max_tokens: self.budget.max_tokens,
            max_bytes: self.budget.max_bytes,
        }
    }

    /// The in-flight lock's lease; its holder renews it every third of it.
    pub fn lock_lease(&self) -> Duration {
        Duration::from_millis(self.redis.lock_lease_ms.get())
    }

    /// How often the holder renews its leases: a third of the lease, so two renewals can
    /// fail (a slow Redis) before the lease runs out.
    pub fn lock_renew_every(&self) -> Duration {
        self.lock_lease() / 3
    }

    pub fn cancel_poll_interval(&self) -> Duration {
        Duration::from_millis(self.cancel.poll_interval_ms.get())
    }
}

/// Where a value came from, for an error message: the file, or the environment.
fn describe_source(metadata: Option<&Metadata>) -> String {
    match metadata {
        Some(m) => match &m.source {
            Some(source) => format!("in {source}"),
            None => format!("by {}", m.name),
        },
        None => "explicitly".to_string(),
    }
}

/// `redis://user:secret@host:6379/0` as `redis://user:***@host:6379/0`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split_once(':').map_or("", |(user, _)| user);
            match credentials.contains(':') {
                true => format!("{scheme}://{user}:***@{host}{path}"),
                // A lone userinfo may be a password too: hidden as well.
                false => format!("{scheme}://***@{host}{path}"),
            }
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::defaults();
        assert_eq!(c.semantic_guard.attempt_timeout_ms.get(), 20000);
        assert_eq!(c.semantic_guard.total_timeout_ms.get(), 45000);
        assert_eq!(c.semantic_guard.max_attempts.get(), 2);
        assert_eq!(c.semantic_guard.max_input_bytes, 65536);
        assert_eq!(c.semantic_guard.max_output_bytes, 4096);
        assert_eq!(c.semantic_guard.max_output_tokens.get(), 512);
        assert_eq!(c.repair.timeout_ms.get(), 20000);
        assert_eq!(c.budget.max_model_calls.get(), 3);
        assert_eq!(c.budget.max_tokens, 32000);
        assert_eq!(c.budget.max_bytes, 262144);
        assert_eq!(c.progress.max_facts, 20);
        assert_eq!(c.redis.key_prefix, "aiops");
        assert_eq!(c.model.structured_output, StructuredOutput::JsonSchema);
        assert!(!c.model_configured());
    }

    #[test]
    fn the_release_policy_carries_the_evidence_limits_and_the_key_prefix() {
        let mut c = Config::defaults();
        assert_eq!(c.release_policy(), ReleasePolicy::defaults());
        c.redis.key_prefix = "svc".into();
        c.evidence.max_string_bytes = NonZeroUsize::new(64).unwrap();
        let policy = c.release_policy();
        assert_eq!(policy.key_prefix, "svc");
        assert_eq!(policy.copy.max_string_bytes, 64);
        assert_eq!(policy.copy.max_scope_items, 8);
        assert_eq!(policy.copy.max_written_bytes, 98304);
    }

    #[test]
    fn file_then_environment_override_the_defaults() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "override.toml",
                "[semantic_guard]\nattempt_timeout_ms = 700\n[server]\napi_token = \"from-file\"\n",
            )?;
            jail.set_env("HARNESS_CONFIG", "override.toml");
            jail.set_env("HARNESS__SEMANTIC_GUARD__TOTAL_TIMEOUT_MS", "900");
            jail.set_env("HARNESS__SERVER__API_TOKEN", "012345");
            jail.set_env("HARNESS__MODEL__STRUCTURED_OUTPUT", "json_object");
            let c = Config::load().map_err(|e| e.to_string())?;
            assert_eq!(c.semantic_guard.attempt_timeout_ms.get(), 700);
            assert_eq!(c.semantic_guard.total_timeout_ms.get(), 900);
            assert_eq!(
                c.server.api_token, "012345",
                "a numeric token stays the same string"
            );
            assert_eq!(c.model.structured_output, StructuredOutput::JsonObject);
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__SEMANTIC_GUARD__ATEMPT_TIMEOUT_MS", "5");
            assert!(Config::load().is_err(), "a typo is an error");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__MODEL__BASE_URL", "http://localhost:8000/v1/");
            let err = Config::load().unwrap_err().to_string();
            assert!(err.contains("model.base_url"), "{err}");
            Ok(())
        });
        for (var, key) in [
            (
                "HARNESS__SEMANTIC_GUARD__MAX_ATTEMPTS",
                "semantic_guard.max_attempts",
            ),
            ("HARNESS__REPAIR__TIMEOUT_MS", "repair.timeout_ms"),
            (
                "HARNESS__REDIS__CONNECTION_TIMEOUT_MS",
                "redis.connection_timeout_ms",
            ),
            ("HARNESS__PROGRESS__MAX_CALLS", "progress.max_calls"),
        ] {
            Jail::expect_with(|jail| {
                jail.set_env(var, "0");
                let err = Config::load().unwrap_err().to_string();
                // The key, and where the zero was set.
                assert!(err.contains(key) && err.contains(var), "{err}");
                Ok(())
            });
        }
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__SEMANTIC_GUARD__MAX_INPUT_BYTES", "8192");
            jail.set_env("HARNESS__SNAPSHOT__MAX_EXCERPT_BYTES", "8193");
            let err = Config::load().unwrap_err().to_string();
            assert!(err.contains("snapshot.max_excerpt_bytes"), "{err}");
            jail.set_env("HARNESS__SNAPSHOT__MAX_EXCERPT_BYTES", "8192");
            assert!(
                Config::load().is_ok(),
                "the judge's whole input is the limit"
            );
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__MODEL__API_KEY", "sk-abc\ndef");
            assert!(Config::load()
                .unwrap_err()
                .to_string()
                .contains("model.api_key"));
            Ok(())
        });
    }

    #[test]
    fn every_unknown_key_is_reported_by_its_own_name_and_where_it_was_set() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "typo.toml",
                "[server]\nlisen = \"127.0.0.1:1\"\n[modle]\nname = \"x\"\n",
            )?;
            jail.set_env("HARNESS_CONFIG", "typo.toml");
            jail.set_env("HARNESS__SERVER__API_TOKN", "s3cret");
            jail.set_env("HARNESS__SEMANTIC_GUARD__ATEMPT_TIMEOUT_MS", "5");
            let err = Config::load().unwrap_err().to_string();
            assert!(
                !err.contains("default."),
                "no figment profile in the names: {err}"
            );
            assert!(
                err.contains(
                    "unknown key server.api_tokn (environment variable HARNESS__SERVER__API_TOKN)"
                ),
                "{err}"
            );
            assert!(
                err.contains("unknown key semantic_guard.atempt_timeout_ms"),
                "{err}"
            );
            assert!(err.contains("unknown key server.lisen (in "), "{err}");
            assert!(err.contains("typo.toml"), "{err}");
            assert!(err.contains("unknown section modle"), "{err}");
            assert!(err.contains("the keys of [server] are: "), "{err}");
            assert!(
                err.contains("api_token"),
                "the valid keys are listed: {err}"
            );
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__SEMANTIC_GUARD__ATTEMPT_TIMEOUT_MS", "soon");
            let err = Config::load().unwrap_err().to_string();
            assert!(
                err.contains("semantic_guard.attempt_timeout_ms: invalid type"),
                "{err}"
            );
            assert!(
                err.contains("HARNESS__SEMANTIC_GUARD__ATTEMPT_TIMEOUT_MS"),
                "{err}"
            );
            assert!(!err.contains("default."), "{err}");
            Ok(())
        });
    }

    #[test]
    fn a_missing_config_file_names_the_variable() {
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS_CONFIG", "nowhere/harness.toml");
            let err = Config::load().unwrap_err().to_string();
            assert!(
                err.contains("HARNESS_CONFIG names \"nowhere/harness.toml\""),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn a_blank_or_padded_token_is_refused() {
        for token in [" ", "\t", "s3cret ", " s3cret"] {
            Jail::expect_with(|jail| {
                jail.set_env("HARNESS__SERVER__API_TOKEN", token);
                let err = Config::load().unwrap_err().to_string();
                assert!(err.contains("server.api_token"), "{token:?}: {err}");
                Ok(())
            });
        }
    }

    #[test]
    fn the_store_is_named_without_its_password() {
        let mut c = Config::defaults();
        c.redis.url = "redis://app:s3cret@10.0.0.5:6379/2".into();
        assert_eq!(c.redis_target(), "redis://app:***@10.0.0.5:6379/2");
        c.redis.url = "redis://:s3cret@h:6379".into();
        assert_eq!(c.redis_target(), "redis://:***@h:6379");
        c.redis.url = "redis://127.0.0.1:6379".into();
        assert_eq!(c.redis_target(), "redis://127.0.0.1:6379");
        c.redis.url = String::new();
        c.redis.cluster_nodes = vec!["redis://u:p@h1:7000".into(), "redis://h2:7000".into()];
        assert_eq!(
            c.redis_target(),
            "cluster redis://u:***@h1:7000,redis://h2:7000"
        );
    }

    #[test]
    fn cluster_nodes_select_redis_cluster_from_a_file_or_the_environment() {
        let c = Config::defaults();
        assert!(c.redis.cluster_nodes.is_empty(), "one node by default");
        assert_eq!(c.redis.min_replicas_ack, 0);
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__REDIS__URL", "");
            jail.set_env(
                "HARNESS__REDIS__CLUSTER_NODES",
                "redis://10.0.0.1:7000, redis://10.0.0.2:7000,redis://10.0.0.3:7000",
            );
            jail.set_env("HARNESS__REDIS__MIN_REPLICAS_ACK", "1");
            let c = Config::load().map_err(|e| e.to_string())?;
            assert_eq!(
                c.redis.cluster_nodes,
                [
                    "redis://10.0.0.1:7000",
                    "redis://10.0.0.2:7000",
                    "redis://10.0.0.3:7000"
                ]
            );
            assert_eq!(c.redis.min_replicas_ack, 1);
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__REDIS__URL", "");
            jail.set_env(
                "HARNESS__REDIS__CLUSTER_NODES",
                "[\"redis://10.0.0.1:7000\", \"redis://10.0.0.2:7000\"]",
            );
            let c = Config::load().map_err(|e| e.to_string())?;
            assert_eq!(c.redis.cluster_nodes.len(), 2, "the list form works too");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.create_file(
                "cluster.toml",
                "[redis]\nurl = \"\"\ncluster_nodes = [\"redis://h1:7000\", \"redis://h2:7000\"]\n",
            )?;
            jail.set_env("HARNESS_CONFIG", "cluster.toml");
            let c = Config::load().map_err(|e| e.to_string())?;
            assert_eq!(
                c.redis.cluster_nodes,
                ["redis://h1:7000", "redis://h2:7000"]
            );
            Ok(())
        });
    }

    /// Item 8 of issue 31, as a new user would try it: a file with only `cluster_nodes`.
    #[test]
    fn cluster_nodes_alone_select_redis_cluster_beside_the_default_url() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "cluster.toml",
                "[redis]\ncluster_nodes = [\"redis://h1:7000\", \"redis://h2:7000\"]\n",
            )?;
            jail.set_env("HARNESS_CONFIG", "cluster.toml");
            let c = Config::load().map_err(|e| e.to_string())?;
            assert_eq!(c.redis.cluster_nodes.len(), 2);
            assert_eq!(c.redis.url, "", "the compiled-in url is ignored");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__REDIS__CLUSTER_NODES", "redis://h1:7000");
            let c = Config::load().map_err(|e| e.to_string())?;
            assert_eq!(c.redis.cluster_nodes, ["redis://h1:7000"]);
            assert_eq!(c.redis.url, "");
            Ok(())
        });
        for url in ["redis://10.0.0.9:6379", "redis://127.0.0.1:6379"] {
            Jail::expect_with(|jail| {
                jail.create_file(
                    "both.toml",
                    &format!("[redis]\nurl = \"{url}\"\ncluster_nodes = [\"redis://h1:7000\"]\n"),
                )?;
                jail.set_env("HARNESS_CONFIG", "both.toml");
                let err = Config::load().unwrap_err().to_string();
                assert!(
                    err.contains("redis.url") && err.contains("redis.cluster_nodes"),
                    "an explicit url beside cluster_nodes names both keys: {err}"
                );
                Ok(())
            });
        }
    }

    #[test]
    fn exactly_one_of_url_and_cluster_nodes_selects_the_store() {
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__REDIS__URL", "redis://10.0.0.9:6379");
            jail.set_env("HARNESS__REDIS__CLUSTER_NODES", "redis://h1:7000");
            let err = Config::load().unwrap_err().to_string();
            assert!(err.contains("redis.cluster_nodes"), "both set: {err}");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__REDIS__URL", "");
            let err = Config::load().unwrap_err().to_string();
            assert!(err.contains("redis.url"), "neither set: {err}");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__REDIS__URL", "");
            jail.set_env("HARNESS__REDIS__CLUSTER_NODES", "h1:7000");
            let err = Config::load().unwrap_err().to_string();
            assert!(err.contains("redis.cluster_nodes"), "{err}");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__REDIS__MIN_REPLICAS_ACK", "1");
            jail.set_env("HARNESS__REDIS__MIN_REPLICAS_ACK_TIMEOUT_MS", "5000");
            let err = Config::load().unwrap_err().to_string();
            assert!(err.contains("redis.min_replicas_ack_timeout_ms"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_lease_is_renewed_well_within_itself_and_polled_more_often() {
        let c = Config::defaults();
        assert_eq!(c.redis.lock_lease_ms.get(), 5000);
        assert_eq!(c.cancel.poll_interval_ms.get(), 250);
        assert!(c.lock_renew_every() * 3 <= c.lock_lease());
        assert!(c.cancel_poll_interval() < c.lock_renew_every());
        Jail::expect_with(|jail| {
            jail.set_env("HARNESS__REDIS__LOCK_LEASE_MS", "500");
            let err = Config::load().unwrap_err().to_string();
            assert!(err.contains("redis.lock_lease_ms"), "{err}");
            Ok(())
        });
    }
}
