//! The `release-harness` binary: a table of subcommands. `serve` runs the service and
//! `check` releases one run bundle offline; the others are tooling (`src/tools/`). Every
//! failure is a [`CliError`], whose [`CliError::exit_code`] is the one exit-code table:
//! 0 success, 1 the command ran and its answer is "no" (a FALLBACK or CANCELLED release, a
//! broken soak invariant, an eval past its limits, a model server the guards cannot work
//! with, a server that stopped with an error), 2 bad input or configuration.

#![forbid(unsafe_code)]
// The command-line front end: the one place that prints to stdout.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use release_harness::check::{describe, run_check, CheckError, RunBundle};
use release_harness::config::{Config, ConfigError};
use release_harness::domain::release::Outcome;
use release_harness::http::{Application, StartError};
use release_harness::telemetry;
use release_harness::tools::eval::{
    load_corpus_with, run_eval, write_report, EvalError, Gate, Progress,
};
use release_harness::tools::fake_model::{FakeModel, FakeModelOptions};
use release_harness::tools::probe::probe;
use release_harness::tools::seed::{seed_redis, SeedError};
use release_harness::tools::soak::{SoakArgs, SoakError};

// jemalloc, not glibc's malloc: about a fifth fewer instructions per release, less memory per
// parked release, and (with its background thread) the memory of finished releases goes back
// to the system within seconds, where glibc's per-thread arenas keep it (docs/performance.md).
// Feature `jemalloc`, on by default.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "release-harness",
    version,
    about = "Decides whether an AI diagnosis agent's report may be released."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP service (CONTRACT §3) on Redis, with the configured model.
    Serve,
    /// Drive a harness with a realistic mix of runs at a fixed rate, check its invariants
    /// and write a report (JSON and an SVG plot). Exits 1 if an invariant broke.
    Soak(SoakArgs),
    /// Serve a fake OpenAI-compatible model (for demos and load tests).
    ///
    /// It prints its base URL (use it as model.base_url) and serves POST /chat/completions
    /// and /v1/chat/completions until Ctrl-C. It judges and repairs deterministically: the
    /// verdict is --verdict unless a directive in the operator's question or in the Draft's
    /// text (anything the judge is shown) says otherwise:
    ///
    ///   [judge:SUPPORTED]    answer the verdict SUPPORTED
    ///   [judge:UNSUPPORTED]  answer the verdict UNSUPPORTED
    ///   [judge:error]        answer HTTP 500 (a technical failure: retried once)
    ///   [judge:garbage]      answer prose instead of JSON (a parse failure)
    ///   [judge:flaky]        answer 503 to the first attempt, the verdict to its retry
    ///   [judge:hang]         answer nothing for 120 s, then 504: a release waits on it
    ///                        until its timeout, or until it is cancelled (the cancel demo)
    ///   [repair:rewrite]     the repair changes the conclusion's text (which the harness
    ///                        must reject)
    ///
    /// A repair request is answered with the Draft whose unknown call ids are replaced by the
    /// nearest usable ones. probe-model's canary word is echoed.
    #[command(verbatim_doc_comment)]
    FakeModel {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Verdict when no directive says otherwise: SUPPORTED or UNSUPPORTED.
        #[arg(long, default_value = "SUPPORTED")]
        verdict: String,
    },
    /// Write a run bundle's invocation records into the configured Redis, as the agent's
    /// tool layer would, to replay a recorded run against a running service.
    Seed {
        /// The run bundle (JSON).
        bundle: PathBuf,
        /// Print the bundle's API request body on stdout (for curl -d @-).
        #[arg(long)]
        print_body: bool,
        /// Write the records under this run id instead of the bundle's own, to release a
        /// recorded run again (a released run id answers its stored result).
        #[arg(long)]
        run_id: Option<String>,
    },
    /// Release one run offline from a run bundle (query, Draft, stop reason, records).
    Check {
        /// The run bundle (JSON).
        bundle: PathBuf,
        /// Refuse (exit 2) a bundle larger than this, in bytes, or one that is not a
        /// regular file.
        #[arg(long, default_value_t = release_harness::input_file::DEFAULT_MAX_BUNDLE_BYTES)]
        max_bundle_bytes: u64,
    },
    /// Measure the configured judge on a labelled corpus (run bundles with a label):
    /// confusion matrix, false-release, false-block, technical-failure and injection
    /// success rates, latency and tokens. With --format aggrefact, on rows of the
    /// LLM-AggreFact benchmark (JSON Lines or CSV: dataset, doc, claim, label 0/1):
    /// balanced accuracy per dataset beside those rates. Exits 1 above --max-false-release
    /// (or --max-protocol-failures, or when a case never reached the judge), 2 for a bad
    /// corpus or configuration.
    Eval(EvalArgs),
    /// Check the configured model server: one canary, one tiny judge and one tiny repair
    /// request with the configured settings. Says in plain words whether structured output
    /// is honoured, whether the system prompt reaches the model, whether the prompt token
    /// count is plausible, the latency, and what to change. Exits 1 on a protocol problem.
    ProbeModel {
        /// Also write the report as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct EvalArgs {
    /// A directory of labelled cases (*.json), e.g. eval/corpus; with --format aggrefact a
    /// JSON Lines or CSV file of rows, e.g. eval/aggrefact/fixture.jsonl.
    corpus: PathBuf,
    /// `corpus` (labelled run bundles) or `aggrefact` (LLM-AggreFact rows).
    #[arg(long, value_enum, default_value_t = EvalFormat::Corpus)]
    format: EvalFormat,
    /// --format aggrefact: judge a sample of N rows, stratified by dataset and label.
    #[arg(long, conflicts_with = "limit")]
    sample: Option<usize>,
    /// The seed of --sample (the same seed, the same rows).
    #[arg(long, default_value_t = 0, requires = "sample")]
    seed: u64,
    /// Where report.json and report.md go (default eval-reports/<UTC time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Exit 1 when the false-release rate is above this (0.0 to 1.0).
    #[arg(long, value_parser = rate)]
    max_false_release: Option<f64>,
    /// Exit 1 when more model attempts than this failed for a protocol reason.
    #[arg(long)]
    max_protocol_failures: Option<usize>,
    /// Run only the first N cases (in file-name order; rows in file order); of a corpus,
    /// only they are read.
    #[arg(long)]
    limit: Option<usize>,
    /// Refuse (exit 2) a case file larger than this, in bytes, or one that is not a
    /// regular file [default: 8 MiB per case file; 512 MiB for an --format aggrefact file].
    #[arg(long)]
    max_bundle_bytes: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum EvalFormat {
    Corpus,
    Aggrefact,
}

/// A rate within 0..=1 (clap refuses anything else with exit 2).
fn rate(text: &str) -> Result<f64, NotARate> {
    match text.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(NotARate(text.to_string())),
    }
}

/// An argument that is not a rate within 0..=1.
#[derive(Debug, thiserror::Error)]
#[error("must be within 0..=1, not {0}")]
struct NotARate(String);

/// Why a subcommand did not succeed.
#[derive(Debug, thiserror::Error)]
enum CliError {
    /// The command ran and its answer is "no"; what it found is printed already.
    #[error("{0}")]
    No(No),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("server error: {0}")]
    Server(std::io::Error),
    #[error(transparent)]
    Check(#[from] CheckError),
    #[error(transparent)]
    Seed(#[from] SeedError),
    #[error(transparent)]
    Soak(#[from] SoakError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error("cannot listen on {listen}: {source}")]
    Listen {
        listen: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The answers "no" of the commands that judge something.
#[derive(Debug, thiserror::Error)]
enum No {
    /// `check`: the release is a FALLBACK or CANCELLED (its result is on stdout).
    #[error("")]
    NotReleased,
    #[error("FAILED: {0} invariant violation(s)")]
    SoakViolations(usize),
    #[error("{}", .0.join("; "))]
    EvalLimits(Vec<String>),
    #[error("the model server has a protocol problem (see the report)")]
    ProbeFailed,
}

impl CliError {
    /// The exit code of each failure: the binary's one table.
    fn exit_code(&self) -> u8 {
        match self {
            CliError::No(_) | CliError::Server(_) => 1,
            CliError::Start(StartError::NoTokenOffLoopback(_)) => 2,
            CliError::Start(
                StartError::Bind { .. }
                | StartError::Metrics(_)
                | StartError::Store(_)
                | StartError::Harness(_),
            ) => 1,
            CliError::Config(_)
            | CliError::Check(_)
            | CliError::Seed(_)
            | CliError::Soak(_)
            | CliError::Eval(_)
            | CliError::Listen { .. }
            | CliError::Write { .. } => 2,
        }
    }
}

impl Command {
    fn name(&self) -> &'static str {
        match self {
            Command::Serve => "serve",
            Command::Soak(_) => "soak",
            Command::FakeModel { .. } => "fake-model",
            Command::Seed { .. } => "seed",
            Command::Check { .. } => "check",
            Command::Eval(_) => "eval",
            Command::ProbeModel { .. } => "probe-model",
        }
    }

    fn run(self) -> Result<(), CliError> {
        let system = actix::System::new();
        match self {
            Command::Serve => system.block_on(serve(Config::load()?)),
            Command::Check {
                bundle,
                max_bundle_bytes,
            } => system.block_on(check(Config::load()?, &bundle, max_bundle_bytes)),
            Command::Soak(args) => system.block_on(soak(args, Config::load()?)),
            Command::Seed {
                bundle,
                print_body,
                run_id,
            } => system.block_on(seed(
                Config::load()?,
                &bundle,
                print_body,
                run_id.as_deref(),
            )),
            Command::FakeModel { listen, verdict } => system.block_on(fake_model(listen, verdict)),
            Command::Eval(args) => system.block_on(eval(args, Config::load()?)),
            Command::ProbeModel { json } => {
                system.block_on(probe_model(Config::load()?, json.as_deref()))
            }
        }
    }
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    let name = command.name();
    match command.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let message = e.to_string();
            if !message.is_empty() {
                say(&format!("release-harness {name}: {message}"));
            }
            ExitCode::from(e.exit_code())
        }
    }
}

/// One line on stderr; a closed stderr is no reason to fail (`eprintln!` would panic).
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

async fn serve(config: Config) -> Result<(), CliError> {
    let logs = telemetry::init_tracing(config.server.log_format);
    let served = serve_until_stopped(config).await;
    // The last lines, if stderr still takes them; bounded, so a stuck pipe cannot hold the
    // exit (README: SIGTERM exits within server.shutdown_drain_ms + 1 s).
    if let Some(logs) = logs {
        logs.flush(std::time::Duration::from_millis(500));
    }
    served
}

async fn serve_until_stopped(config: Config) -> Result<(), CliError> {
    // Build logs the line naming the listen address, Redis, key prefix and model.
    let app = Application::build(config.clone()).await?;
    // The model set-up check runs beside the service and never delays readiness; its
    // handle is owned here and aborted when the service stops.
    let probe = actix_rt::spawn(log_probe(config));
    let stopped = app.run_until_stopped().await;
    probe.abort();
    stopped.map_err(CliError::Server)?;
    tracing::info!("stopped");
    Ok(())
}

/// `serve`'s start-up check of the model: the probe's findings as log lines.
async fn log_probe(config: Config) {
    if !config.model.probe_on_start {
        return;
    }
    if !config.model_configured() {
        tracing::warn!(
            "no model is configured (model.base_url is empty): every judged release fails closed"
        );
        return;
    }
    let report = probe(&config).await;
    for finding in &report.findings {
        match finding.level {
            "ok" => tracing::info!(target: "model_probe", "{}", finding.text),
            "warn" => tracing::warn!(target: "model_probe", "{}", finding.text),
            _ => tracing::error!(target: "model_probe", "{}", finding.text),
        }
    }
}

async fn check(config: Config, path: &Path, max_bundle_bytes: u64) -> Result<(), CliError> {
    let bundle = RunBundle::read_bounded(path, max_bundle_bytes).map_err(CheckError::from)?;
    bundle.request().map_err(CheckError::from)?;
    let model_configured = config.model_configured();
    let output = run_check(config, &bundle).await?;
    eprintln!("{}", describe(&output.audit, model_configured));
    let pretty = serde_json::from_str::<serde_json::Value>(&output.json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or(output.json.clone());
    println!("{pretty}");
    match output.result.outcome {
        Outcome::Success => Ok(()),
        Outcome::Fallback | Outcome::Cancelled => Err(CliError::No(No::NotReleased)),
    }
}

async fn soak(args: SoakArgs, config: Config) -> Result<(), CliError> {
    let report = release_harness::tools::soak::run(args, config).await?;
    // The summary on stdout; the RSS series is in report.json and the plot.
    let mut summary = serde_json::to_value(&report).unwrap_or_default();
    if let Some(fields) = summary.as_object_mut() {
        fields.remove("rss_series");
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&summary).unwrap_or_default()
    );
    if !report.violations.is_empty() {
        return Err(CliError::No(No::SoakViolations(report.violations.len())));
    }
    eprintln!("soak passed: every invariant held");
    Ok(())
}

async fn seed(
    config: Config,
    path: &Path,
    print_body: bool,
    run_id: Option<&str>,
) -> Result<(), CliError> {
    let mut bundle = RunBundle::read(path).map_err(SeedError::from)?;
    if let Some(id) = run_id {
        release_harness::domain::request::validate_run_id(id)
            .map_err(|e| SeedError::from(release_harness::check::BundleError::from(e)))?;
        bundle = bundle.with_run_id(id);
    }
    let n = seed_redis(&config, &bundle).await?;
    eprintln!(
        "seeded {n} record(s) of run {} under prefix {:?}",
        bundle.run_id(),
        config.redis.key_prefix
    );
    if print_body {
        println!("{}", bundle.release_body());
    }
    Ok(())
}

async fn fake_model(listen: String, verdict: String) -> Result<(), CliError> {
    let options = FakeModelOptions {
        default_verdict: verdict,
        ..FakeModelOptions::default()
    };
    let model =
        FakeModel::start(&listen, options).map_err(|source| CliError::Listen { listen, source })?;
    println!("{}", model.url);
    let _ = tokio::signal::ctrl_c().await;
    model.stop().await;
    Ok(())
}

async fn eval(args: EvalArgs, config: Config) -> Result<(), CliError> {
    match (args.format, args.sample) {
        (EvalFormat::Aggrefact, _) => return eval_aggrefact(args, config).await,
        (EvalFormat::Corpus, Some(_)) => return Err(EvalError::SampleOfCorpus.into()),
        (EvalFormat::Corpus, None) => {}
    }
    let max_bytes = args
        .max_bundle_bytes
        .unwrap_or(release_harness::input_file::DEFAULT_MAX_BUNDLE_BYTES);
    let cases = load_corpus_with(&args.corpus, args.limit, max_bytes)?;
    let progress = if args.quiet {
        Progress::Hidden
    } else {
        Progress::Bar
    };
    let report = run_eval(&config, &args.corpus, &cases, progress).await?;
    let out = args.out.unwrap_or_else(|| {
        PathBuf::from("eval-reports").join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string())
    });
    write_report(&report, &out)?;
    println!("{}", report.table());
    eprintln!(
        "report: {}/report.json, {}/report.md",
        out.display(),
        out.display()
    );
    let gate = Gate {
        max_false_release: args.max_false_release,
        max_protocol_failures: args.max_protocol_failures,
    };
    let failed = gate.failures(&report);
    if !failed.is_empty() {
        return Err(CliError::No(No::EvalLimits(failed)));
    }
    Ok(())
}

/// `eval --format aggrefact FILE`: the judge on LLM-AggreFact rows.
async fn eval_aggrefact(args: EvalArgs, config: Config) -> Result<(), CliError> {
    use release_harness::tools::eval::aggrefact::rows::{load_rows, DEFAULT_MAX_ROWS_BYTES};
    use release_harness::tools::eval::aggrefact::{self, RowChoice};
    let choice = RowChoice {
        limit: args.limit,
        sample: args.sample.map(|n| (n, args.seed)),
    };
    let max_bytes = args.max_bundle_bytes.unwrap_or(DEFAULT_MAX_ROWS_BYTES);
    let (rows, selection, ignored) = aggrefact::select(load_rows(&args.corpus, max_bytes)?, choice);
    let progress = if args.quiet {
        Progress::Hidden
    } else {
        Progress::Bar
    };
    let report =
        aggrefact::run_aggrefact(&config, &args.corpus, &rows, selection, ignored, progress)
            .await?;
    let out = args.out.unwrap_or_else(|| {
        PathBuf::from("eval-reports").join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string())
    });
    aggrefact::write_report(&report, &out)?;
    println!("{}", report.table());
    eprintln!("report: {0}/report.json, {0}/report.md", out.display());
    let failed = report.failures(args.max_false_release, args.max_protocol_failures);
    if !failed.is_empty() {
        return Err(CliError::No(No::EvalLimits(failed)));
    }
    Ok(())
}

async fn probe_model(config: Config, json: Option<&Path>) -> Result<(), CliError> {
    let report = probe(&config).await;
    print!("{}", report.render());
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        std::fs::write(path, text).map_err(|source| CliError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    }
    if report.failed() {
        return Err(CliError::No(No::ProbeFailed));
    }
    Ok(())
}
