//! The `release-harness` binary: `serve` runs the service, `check` releases one run bundle
//! offline. Exit codes of `check`: 0 SUCCESS, 1 FALLBACK or CANCELLED, 2 bad bundle or
//! configuration.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use release_harness::check::{describe, run_check, RunBundle};
use release_harness::config::Config;
use release_harness::http::{Application, StartError};
use release_harness::telemetry;

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
    /// Release one run offline from a run bundle (query, Draft, stop reason, records).
    Check {
        /// The run bundle (JSON).
        bundle: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve => serve(),
        Command::Check { bundle } => check(&bundle),
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
        match app.run_until_stopped().await {
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
