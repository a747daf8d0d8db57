//! The `release-harness` binary: `serve` runs the service, `check` releases one run bundle
//! offline. Exit codes of `check`: 0 SUCCESS, 1 FALLBACK or CANCELLED, 2 bad bundle or
//! configuration.

#![forbid(unsafe_code)]
// The command-line front end: the one place that prints to stdout.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use release_harness::check::{describe, run_check, RunBundle};
use release_harness::tools::seed::seed_redis;
use release_harness::config::Config;
use release_harness::http::{Application, StartError};
use release_harness::tools::fake_model::{FakeModel, FakeModelOptions};
use release_harness::tools::soak::SoakArgs;
use release_harness::telemetry;

// jemalloc, not glibc's malloc: about a fifth fewer instructions per release, less memory per
// parked release, and (with its background thread) the memory of finished releases goes back
// to the system within seconds, where glibc's per-thread arenas keep it (README, "Speed and
// memory"). Feature `jemalloc`, on by default.
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
        bundle: std::path::PathBuf,
        /// Print the bundle's API request body on stdout (for curl -d @-).
        #[arg(long)]
        print_body: bool,
    },
    /// Release one run offline from a run bundle (query, Draft, stop reason, records).
    Check {
        /// The run bundle (JSON).
        bundle: std::path::PathBuf,
    },
    /// Measure the configured judge on a labelled corpus (run bundles with a label):
    /// confusion matrix, false-release, false-block, technical-failure and injection
    /// success rates, latency and tokens. Exits 1 above --max-false-release (or
    /// --max-protocol-failures, or when a case never reached the judge), 2 for a bad
    /// corpus or configuration.
    Eval(EvalArgs),
    /// Check the configured model server: one canary, one tiny judge and one tiny repair
    /// request with the configured settings. Says in plain words whether structured output
    /// is honoured, whether the system prompt reaches the model, whether the prompt token
    /// count is plausible, the latency, and what to change. Exits 1 on a protocol problem.
    ProbeModel {
        /// Also write the report as JSON to this file.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
}

#[derive(clap::Args)]
struct EvalArgs {
    /// A directory of labelled cases (*.json), e.g. eval/corpus.
    corpus: std::path::PathBuf,
    /// Where report.json and report.md go (default eval-reports/<UTC time>).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Exit 1 when the false-release rate is above this (0.0 to 1.0).
    #[arg(long)]
    max_false_release: Option<f64>,
    /// Exit 1 when more model attempts than this failed for a protocol reason.
    #[arg(long)]
    max_protocol_failures: Option<usize>,
    /// Run only the first N cases (in file-name order).
    #[arg(long)]
    limit: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve => serve(),
        Command::Check { bundle } => check(&bundle),
        Command::Soak(args) => soak(args),
        Command::Seed { bundle, print_body } => seed(&bundle, print_body),
        Command::FakeModel { listen, verdict } => fake_model(&listen, &verdict),
        Command::Eval(args) => eval(args),
        Command::ProbeModel { json } => probe_model(json.as_deref()),
    }
}

fn serve() -> ExitCode {
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("release-harness serve: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init_tracing(config.server.log_format);
    let probe_config = config.clone();
    let system = actix::System::new();
    system.block_on(async move {
        let app = match Application::build(config).await {
            Ok(app) => app,
            Err(e @ StartError::NoTokenOffLoopback(_)) => {
                tracing::error!("{e}");
                eprintln!("release-harness serve: {e}");
                return ExitCode::from(2);
            }
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("release-harness serve: {e}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(port = app.port(), "release-harness listening");
        // The model set-up check runs beside the service and never delays readiness; its
        // handle is owned here and aborted when the service stops.
        let probe = actix_rt::spawn(log_probe(probe_config));
        let stopped = app.run_until_stopped().await;
        probe.abort();
        match stopped {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = %e, "server error");
                ExitCode::FAILURE
            }
        }
    })
}

fn soak(args: SoakArgs) -> ExitCode {
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("release-harness soak: {e}");
            return ExitCode::from(2);
        }
    };
    let system = actix::System::new();
    match system.block_on(release_harness::tools::soak::run(args, config)) {
        Ok(report) => {
            // The summary on stdout; the RSS series is in report.json and the plot.
            let mut summary = serde_json::to_value(&report).unwrap_or_default();
            if let Some(fields) = summary.as_object_mut() {
                fields.remove("rss_series");
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&summary).unwrap_or_default()
            );
            if report.violations.is_empty() {
                eprintln!("soak passed: every invariant held");
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "soak FAILED: {} invariant violation(s)",
                    report.violations.len()
                );
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("release-harness soak: {e}");
            ExitCode::from(2)
        }
    }
}

fn seed(path: &std::path::Path, print_body: bool) -> ExitCode {
    let bad = |message: String| {
        eprintln!("release-harness seed: {message}");
        ExitCode::from(2)
    };
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => return bad(e.to_string()),
    };
    let bundle = match std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
        .and_then(|text| RunBundle::parse(&text).map_err(|e| e.to_string()))
    {
        Ok(b) => b,
        Err(e) => return bad(e),
    };
    let system = actix::System::new();
    match system.block_on(seed_redis(&config, &bundle)) {
        Ok(n) => {
            eprintln!(
                "seeded {n} record(s) of run {} under prefix {:?}",
                bundle.run_id(),
                config.redis.key_prefix
            );
            if print_body {
                println!("{}", bundle.release_body());
            }
            ExitCode::SUCCESS
        }
        Err(e) => bad(e.to_string()),
    }
}

fn fake_model(listen: &str, verdict: &str) -> ExitCode {
    let system = actix::System::new();
    system.block_on(async {
        let options = FakeModelOptions {
            default_verdict: verdict.to_string(),
            ..FakeModelOptions::default()
        };
        match FakeModel::start(listen, options) {
            Ok(model) => {
                println!("{}", model.url);
                let _ = tokio::signal::ctrl_c().await;
                model.stop().await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("release-harness fake-model: {e}");
                ExitCode::from(2)
            }
        }
    })
}

fn check(path: &std::path::Path) -> ExitCode {
    let bad = |message: String| {
        eprintln!("release-harness check: {message}");
        ExitCode::from(2)
    };
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => return bad(e.to_string()),
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return bad(format!("cannot read {}: {e}", path.display())),
    };
    let bundle = match RunBundle::parse(&text) {
        Ok(b) => b,
        Err(e) => return bad(e.to_string()),
    };
    if let Err(e) = bundle.request() {
        return bad(e.to_string());
    }
    let model_configured = config.model_configured();
    let system = actix::System::new();
    let output = match system.block_on(run_check(config, &bundle)) {
        Ok(output) => output,
        Err(e) => return bad(e),
    };
    eprintln!("{}", describe(&output.audit, model_configured));
    let pretty = serde_json::from_str::<serde_json::Value>(&output.json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or(output.json.clone());
    println!("{pretty}");
    ExitCode::from(output.exit_code() as u8)
}

fn eval(args: EvalArgs) -> ExitCode {
    use release_harness::tools::eval::{load_corpus, run_eval, write_report, Progress};
    let bad = |message: String| {
        eprintln!("release-harness eval: {message}");
        ExitCode::from(2)
    };
    if let Some(r) = args.max_false_release {
        if !(0.0..=1.0).contains(&r) {
            return bad(format!("--max-false-release must be within 0..=1, not {r}"));
        }
    }
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => return bad(e.to_string()),
    };
    let mut cases = match load_corpus(&args.corpus) {
        Ok(c) => c,
        Err(e) => return bad(e.to_string()),
    };
    if let Some(limit) = args.limit {
        cases.truncate(limit);
    }
    let progress = if args.quiet {
        Progress::Hidden
    } else {
        Progress::Bar
    };
    let system = actix::System::new();
    let report = match system.block_on(run_eval(&config, &args.corpus, &cases, progress)) {
        Ok(r) => r,
        Err(e) => return bad(e.to_string()),
    };
    let out = args.out.unwrap_or_else(|| {
        std::path::PathBuf::from("eval-reports")
            .join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string())
    });
    if let Err(e) = write_report(&report, &out) {
        return bad(e.to_string());
    }
    println!("{}", report.table());
    eprintln!(
        "report: {}/report.json, {}/report.md",
        out.display(),
        out.display()
    );
    let mut failed = Vec::new();
    if let (Some(max), Some(rate)) = (args.max_false_release, report.false_release_rate) {
        if rate > max {
            failed.push(format!(
                "false-release rate {:.3} is above --max-false-release {max}",
                rate
            ));
        }
    }
    if let Some(max) = args.max_protocol_failures {
        if report.protocol_failures > max {
            failed.push(format!(
                "{} protocol failure(s), more than --max-protocol-failures {max}",
                report.protocol_failures
            ));
        }
    }
    if report.not_judged > 0 {
        failed.push(format!(
            "{} case(s) never reached the judge (see report.md)",
            report.not_judged
        ));
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in failed {
            eprintln!("release-harness eval: {f}");
        }
        ExitCode::FAILURE
    }
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
    let report = release_harness::tools::probe::probe(&config).await;
    for finding in &report.findings {
        match finding.level {
            "ok" => tracing::info!(target: "model_probe", "{}", finding.text),
            "warn" => tracing::warn!(target: "model_probe", "{}", finding.text),
            _ => tracing::error!(target: "model_probe", "{}", finding.text),
        }
    }
}

fn probe_model(json: Option<&std::path::Path>) -> ExitCode {
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("release-harness probe-model: {e}");
            return ExitCode::from(2);
        }
    };
    let system = actix::System::new();
    let report = system.block_on(release_harness::tools::probe::probe(&config));
    print!("{}", report.render());
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!(
                "release-harness probe-model: cannot write {}: {e}",
                path.display()
            );
            return ExitCode::from(2);
        }
    }
    if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
