//! `ldpsyn-aggregator`: thin binary over the library. `serve` runs the HTTP service.

use clap::{Parser, Subcommand};
use ldpsyn_aggregator::admin::{self, AdminConfig};
use ldpsyn_aggregator::demo::{self, DemoConfig};
use ldpsyn_aggregator::devices::{self, DevicesConfig};
use ldpsyn_aggregator::infer::{InferConfig, infer_schema};
use ldpsyn_aggregator::party::{self, PartyConfig};
use ldpsyn_aggregator::service::{self, config::ServeConfig};
use ldpsyn_aggregator::synthesize::{self, SynthesizeConfig};

/// mimalloc instead of glibc's allocator: an upload allocates and frees many small buffers
/// (request, JSON, report, answer) across threads, and glibc's `malloc`/`free` were 13% of
/// `serve`'s CPU under single-report uploads (benchmarks/results/profile-ingest.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// ldpsyn aggregator: collects LDP reports and serves models, marginals and synthetic data.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP API (SQLite by default, PostgreSQL with a postgres:// URL).
    Serve(ServeConfig),
    /// The main job end to end: simulated people → SDK → HTTP aggregator (in-process, SQLite)
    /// → finalize → synthetic CSV and a JSON fidelity report.
    Demo(DemoConfig),
    /// Send each row of a CSV file to a running aggregator's collection as one device would
    /// (the SDK client with its own ledger per row); prints accepted / duplicate / refused /
    /// invalid counts and fails when nothing was accepted.
    Devices(DevicesConfig),
    /// Schema tools.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Operate a running aggregator over HTTP: create, list, status, close-round, finalize,
    /// download, delete (admin token from `LDPSYN_ADMIN_TOKEN`).
    Collections(AdminConfig),
    /// A data party of a vertical collection: `keygen` (record-id key), `upload` (randomize
    /// and upload its records; token from `LDPSYN_PARTY_TOKEN`).
    Party(PartyConfig),
    /// A data curator's synthetic table under central (ε, δ)-differential privacy: the whole
    /// table is read here and only the synthetic table and a privacy report are written.
    Synthesize(SynthesizeConfig),
}

#[derive(Debug, Subcommand)]
enum SchemaCommand {
    /// Propose a schema (JSON on stdout) from a CSV file's header and values; warnings on
    /// stderr. Labels and bounds are public: edit them from domain knowledge.
    Infer(InferConfig),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // `demo --quiet` logs warnings and errors only (`LDPSYN_LOG` still overrides).
    let level = match &cli.command {
        Command::Demo(config) if config.quiet => "warn",
        _ => "info",
    };
    // Logs on stderr (colored only on a terminal): `demo` prints its JSON report on stdout.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LDPSYN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(config) => service::serve(config)
                .await
                .map_err(|e| format!("aggregator stopped: {e}")),
            Command::Demo(config) => demo::run(config)
                .await
                .map_err(|e| format!("demo failed: {e}"))
                .and_then(|report| {
                    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
                    println!("{json}");
                    Ok(())
                }),
            Command::Devices(config) => devices::run(&config, &mut std::io::stdout())
                .await
                .map_err(|e| format!("devices: {e}"))
                .and_then(|tally| match tally.accepted {
                    0 => Err(format!(
                        "devices: no row was accepted by collection {} at {}",
                        config.collection, config.server
                    )),
                    _ => Ok(()),
                }),
            Command::Collections(config) => {
                let token = std::env::var("LDPSYN_ADMIN_TOKEN").ok();
                admin::run(&config, token.as_deref(), &mut std::io::stdout())
                    .await
                    .map_err(|e| e.to_string())
            }
            Command::Party(config) => {
                let token = std::env::var("LDPSYN_PARTY_TOKEN").ok();
                party::run(&config, token.as_deref(), &mut std::io::stdout())
                    .await
                    .map_err(|e| e.to_string())
            }
            Command::Synthesize(config) => synthesize::run(&config, &mut std::io::stdout())
                .map(|_| ())
                .map_err(|e| format!("synthesize: {e}")),
            Command::Schema(SchemaCommand::Infer(config)) => infer_schema(&config.data, &config)
                .map_err(|e| e.to_string())
                .and_then(|(schema, warnings)| {
                    for w in warnings {
                        eprintln!("warning: {w}");
                    }
                    let json = serde_json::to_string_pretty(&schema).map_err(|e| e.to_string())?;
                    println!("{json}");
                    Ok(())
                }),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Once, in words (a tracing line as well printed every error twice).
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
