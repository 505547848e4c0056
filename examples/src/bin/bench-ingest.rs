//! Ingest benchmark: the aggregator's upload path against a bare echo server, alternately in
//! one run (issue 34 item 3), so that the ratio says what validation, the durable commit and
//! the statistics cost over HTTP and JSON alone on this very machine.
//!
//! ```sh
//! cargo build --release -p ldpsyn-aggregator -p ldpsyn-examples --bin bench-ingest
//! target/release/bench-ingest --postgres-url postgres://postgres@127.0.0.1:5432/ldpsyn_bench \
//!   --out benchmarks/results/ingest.json       # and ingest.md beside it
//! ```
//!
//! It starts, as child processes on 127.0.0.1: `ldpsyn-aggregator serve` on SQLite (in a
//! temporary folder), on PostgreSQL when `--postgres-url` is given, and the echo (this binary's
//! `echo` subcommand: a bare axum server that serves the collection's public view and 1000
//! tasks captured from the SQLite `serve`, and answers every uploaded JSON array with
//! `accepted` for each element after parsing it: no validation, no storage, no fsync). Then,
//! for each round and each mode (single report per request, batch of up to 1000), it runs
//! `loadgen`'s load ([`ldpsyn_examples::load`]) against each server in turn for `--seconds`
//! and records the accepted reports per second and the server process's CPU time per
//! accepted report (utime + stime from `/proc/<pid>/stat`; PostgreSQL's own backends are not
//! counted). With `--postgres-url` it also runs two `serve` processes on that one database,
//! the workers alternating between them (issue 34 item 6). Load generator and servers share
//! the machine's cores.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use ldpsyn::upload::published_limits;
use ldpsyn::wire::CollectionConfig;
use ldpsyn_examples::load::{self, Load, Mode, cpu_seconds};
use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

/// Ingest benchmark: `serve` (SQLite, PostgreSQL) against a bare echo, alternately.
#[derive(Debug, Parser)]
struct Args {
    #[command(subcommand)]
    echo: Option<Sub>,
    /// The `ldpsyn-aggregator` binary (default: beside this one, e.g. `target/release/`).
    #[arg(long)]
    aggregator: Option<PathBuf>,
    /// Also `serve` on this PostgreSQL database (its reports accumulate there).
    #[arg(long, env = "LDPSYN_BENCH_POSTGRES_URL", hide_env_values = true)]
    postgres_url: Option<String>,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds; each runs every mode against every server once, in turn.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Workers in single mode (loadgen's default).
    #[arg(long, default_value_t = 64)]
    single_concurrency: usize,
    /// Workers in batch mode (loadgen's default).
    #[arg(long, default_value_t = 4)]
    batch_concurrency: usize,
    /// Most reports per upload in batch mode.
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
    /// The JSON result; the markdown table goes beside it (`.md`).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Serve the echo (started by the benchmark itself).
    Echo {
        /// Address to listen on.
        #[arg(long)]
        bind: String,
        /// The collection's public view (JSON) served at `GET /v1/collections/{id}`.
        #[arg(long)]
        view: PathBuf,
        /// The tasks (a JSON array) served at `GET …/task` whatever `count` asks.
        #[arg(long)]
        tasks: PathBuf,
    },
}

const ADMIN: &str = "bench-ingest-admin-token";

/// A child process, killed when dropped.
struct Proc {
    child: Child,
    name: String,
    base: String,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn wait_healthy(http: &reqwest::Client, p: &mut Proc) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if let Some(status) = p.child.try_wait()? {
            bail!("{} exited while starting: {status}", p.name);
        }
        if let Ok(r) = http.get(format!("{}/healthz", p.base)).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{} not healthy within 60 s", p.name)
}

fn spawn_serve(
    bin: &Path,
    name: &str,
    database_url: &str,
    dir: Option<tempfile::TempDir>,
) -> anyhow::Result<Proc> {
    let addr = format!("127.0.0.1:{}", free_port()?);
    let child = Command::new(bin)
        .args(["serve", "--bind", &addr, "--database-url", database_url])
        // One client sends everything.
        .args(["--rate-limit-per-ip", "0"])
        .env("LDPSYN_ADMIN_TOKEN", ADMIN)
        .env("LDPSYN_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Proc {
        child,
        name: name.into(),
        base: format!("http://{addr}"),
        _dir: dir,
    })
}

async fn get_json(http: &reqwest::Client, url: String) -> anyhow::Result<Value> {
    Ok(http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// One server under load in the benchmark: one process, or two `serve` processes on one
/// PostgreSQL database sharing the load (workers alternate between them). The processes
/// themselves are kept alive (and killed at the end) by `main`.
struct Target {
    /// Base URLs of its processes.
    bases: Vec<String>,
    /// Their process ids (CPU time is summed over them).
    pids: Vec<u32>,
    /// `serve` or `echo`.
    server: &'static str,
    /// `sqlite`, `postgres`, `postgres-2` (two processes), or for the echo `none`.
    database: &'static str,
    collection: Uuid,
    config: Arc<CollectionConfig>,
    limits: ldpsyn::wire::UploadLimits,
}

/// One measured run.
#[derive(Debug, Serialize)]
struct Run {
    round: usize,
    mode: Mode,
    server: &'static str,
    database: &'static str,
    concurrency: usize,
    elapsed_s: f64,
    requests: u64,
    accepted: u64,
    refused: u64,
    errors: u64,
    requests_per_s: f64,
    reports_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    server_cpu_s: f64,
    server_cpu_us_per_report: f64,
    loadgen_cpu_s: f64,
}

/// Min and max over rounds.
#[derive(Debug, Serialize, Clone, Copy)]
struct Range {
    min: f64,
    max: f64,
}

impl Range {
    fn of(v: impl IntoIterator<Item = f64>) -> Option<Range> {
        v.into_iter().fold(None, |r, x| match r {
            None => Some(Range { min: x, max: x }),
            Some(r) => Some(Range {
                min: r.min.min(x),
                max: r.max.max(x),
            }),
        })
    }

    fn show(&self, decimals: usize) -> String {
        let f = |x: f64| {
            if decimals == 0 {
                ldpsyn_examples::report::thousands(x.round() as u64)
            } else {
                format!("{x:.decimals$}")
            }
        };
        if f(self.min) == f(self.max) {
            f(self.min)
        } else {
            format!("{}–{}", f(self.min), f(self.max))
        }
    }
}

/// Serve against echo for one database and mode, over the rounds.
#[derive(Debug, Serialize)]
struct Summary {
    database: &'static str,
    mode: Mode,
    serve_reports_per_s: Range,
    echo_reports_per_s: Range,
    /// Serve's reports/s over the echo's of the same round.
    ratio: Range,
    serve_cpu_us_per_report: Range,
    echo_cpu_us_per_report: Range,
}

fn summarize(runs: &[Run], database: &'static str, mode: Mode) -> Option<Summary> {
    let of = |server: &str, db: &str| -> Vec<&Run> {
        runs.iter()
            .filter(|r| r.mode == mode && r.server == server && r.database == db)
            .collect()
    };
    let (serve, echo) = (of("serve", database), of("echo", "none"));
    let ratio = serve.iter().filter_map(|s| {
        let e = echo.iter().find(|e| e.round == s.round)?;
        (e.reports_per_s > 0.0).then(|| s.reports_per_s / e.reports_per_s)
    });
    Some(Summary {
        database,
        mode,
        serve_reports_per_s: Range::of(serve.iter().map(|r| r.reports_per_s))?,
        echo_reports_per_s: Range::of(echo.iter().map(|r| r.reports_per_s))?,
        ratio: Range::of(ratio)?,
        serve_cpu_us_per_report: Range::of(serve.iter().map(|r| r.server_cpu_us_per_report))?,
        echo_cpu_us_per_report: Range::of(echo.iter().map(|r| r.server_cpu_us_per_report))?,
    })
}

/// The command line as run, with a database password replaced by `***`.
fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| match (a.find("://"), a.rfind('@')) {
            (Some(s), Some(at)) if at > s => {
                let auth = &a[s + 3..at];
                match auth.split_once(':') {
                    Some((user, _)) => format!("{}{user}:***{}", &a[..s + 3], &a[at..]),
                    None => a,
                }
            }
            _ => a,
        })
        .collect();
    format!(
        "cargo run --release -p ldpsyn-examples --bin bench-ingest -- {}",
        args.join(" ")
    )
}

/// The 1, 5 and 15-minute load averages of `/proc/loadavg`.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn database_name(database: &str) -> &'static str {
    match database {
        "sqlite" => "SQLite",
        "postgres" => "PostgreSQL",
        "postgres-2" => "PostgreSQL, 2 processes",
        _ => "none",
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Single => "single",
        Mode::Batch => "batch",
    }
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

async fn echo(bind: String, view: PathBuf, tasks: PathBuf) -> anyhow::Result<()> {
    use axum::routing::{get, post};
    let view: Arc<str> = std::fs::read_to_string(view)?.into();
    let tasks: Arc<str> = std::fs::read_to_string(tasks)?.into();
    let json = |body: Arc<str>| {
        (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
    };
    let app = axum::Router::new()
        .route(
            "/v1/collections/{id}",
            get(move || {
                let v = view.clone();
                async move { json(v) }
            }),
        )
        .route(
            "/v1/collections/{id}/task",
            get(move || {
                let t = tasks.clone();
                async move { json(t) }
            }),
        )
        .route(
            "/v1/collections/{id}/reports",
            post(|body: axum::body::Bytes| async move {
                use axum::response::IntoResponse;
                // Parsed like the aggregator parses it (into JSON values, not checked).
                let Ok(reports) = serde_json::from_slice::<Vec<Value>>(&body) else {
                    return axum::http::StatusCode::BAD_REQUEST.into_response();
                };
                let answers: Vec<Value> = reports
                    .iter()
                    .map(|r| json!({"id": r.get("id"), "status": "accepted"}))
                    .collect();
                axum::Json(answers).into_response()
            }),
        )
        .route("/healthz", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Sub::Echo { bind, view, tasks }) = args.echo {
        return echo(bind, view, tasks).await;
    }
    if args.rounds == 0 || args.seconds == 0 {
        bail!("--rounds and --seconds must be at least 1");
    }
    let me = std::env::current_exe()?;
    let aggregator = match args.aggregator.clone() {
        Some(p) => p,
        None => me.with_file_name("ldpsyn-aggregator"),
    };
    if !aggregator.exists() {
        bail!(
            "{} not found: build it (cargo build --release -p ldpsyn-aggregator) or pass \
             --aggregator",
            aggregator.display()
        );
    }
    let http = load::client()?;

    // The servers: SQLite serve, optional PostgreSQL serve, and the echo of SQLite's view.
    let dir = tempfile::tempdir()?;
    let sqlite_url = format!("sqlite://{}", dir.path().join("ingest.db").display());
    let mut serves = vec![(
        "sqlite",
        spawn_serve(&aggregator, "serve (SQLite)", &sqlite_url, Some(dir))?,
    )];
    if let Some(url) = &args.postgres_url {
        serves.push((
            "postgres",
            spawn_serve(&aggregator, "serve (PostgreSQL)", url, None)?,
        ));
    }
    let mut targets: Vec<Target> = Vec::new();
    let mut alive: Vec<Proc> = Vec::new();
    let mut captured = None;
    for (database, mut proc) in serves {
        wait_healthy(&http, &mut proc).await?;
        let id = load::create_collection(&http, &proc.base, ADMIN).await?;
        let view = get_json(&http, format!("{}/v1/collections/{id}", proc.base)).await?;
        if captured.is_none() {
            let tasks = get_json(
                &http,
                format!("{}/v1/collections/{id}/task?count=1000", proc.base),
            )
            .await?;
            captured = Some((id, view.clone(), tasks));
        }
        targets.push(Target {
            bases: vec![proc.base.clone()],
            pids: vec![proc.child.id()],
            server: "serve",
            database,
            collection: id,
            limits: published_limits(&view).context("upload_limits")?,
            config: Arc::new(serde_json::from_value(view)?),
        });
        alive.push(proc);
    }
    if let Some(url) = &args.postgres_url {
        // A second process on the same database joins the first on its collection: what an
        // operator gets by starting another `serve` behind a load balancer.
        let mut second = spawn_serve(&aggregator, "second serve (PostgreSQL)", url, None)?;
        wait_healthy(&http, &mut second).await?;
        let first = targets
            .iter()
            .position(|t| t.database == "postgres")
            .context("the PostgreSQL serve")?;
        let view = get_json(
            &http,
            format!(
                "{}/v1/collections/{}",
                second.base, targets[first].collection
            ),
        )
        .await
        .context("the second process reading the first's collection")?;
        let twin = Target {
            bases: vec![targets[first].bases[0].clone(), second.base.clone()],
            pids: vec![targets[first].pids[0], second.child.id()],
            server: "serve",
            database: "postgres-2",
            collection: targets[first].collection,
            limits: published_limits(&view).context("upload_limits")?,
            config: Arc::new(serde_json::from_value(view)?),
        };
        targets.push(twin);
        alive.push(second);
    }
    let (id, view, tasks) = captured.context("the SQLite serve's collection")?;
    let echo_dir = tempfile::tempdir()?;
    let (view_file, tasks_file) = (
        echo_dir.path().join("view.json"),
        echo_dir.path().join("tasks.json"),
    );
    std::fs::write(&view_file, view.to_string())?;
    std::fs::write(&tasks_file, tasks.to_string())?;
    let addr = format!("127.0.0.1:{}", free_port()?);
    let mut echo_proc = Proc {
        child: Command::new(&me)
            .args(["echo", "--bind", &addr])
            .arg("--view")
            .arg(&view_file)
            .arg("--tasks")
            .arg(&tasks_file)
            .stdout(Stdio::null())
            .spawn()?,
        name: "echo".into(),
        base: format!("http://{addr}"),
        _dir: Some(echo_dir),
    };
    wait_healthy(&http, &mut echo_proc).await?;
    // Echo second: each round goes SQLite serve, echo, PostgreSQL serve, two PostgreSQL serves.
    targets.insert(
        1,
        Target {
            bases: vec![echo_proc.base.clone()],
            pids: vec![echo_proc.child.id()],
            server: "echo",
            database: "none",
            collection: id,
            limits: published_limits(&view).context("upload_limits")?,
            config: Arc::new(serde_json::from_value(view)?),
        },
    );
    alive.push(echo_proc);

    let load_before = loadavg();
    let mut runs = Vec::new();
    for round in 1..=args.rounds {
        for mode in [Mode::Single, Mode::Batch] {
            for t in &targets {
                let concurrency = match mode {
                    Mode::Single => args.single_concurrency,
                    Mode::Batch => args.batch_concurrency,
                };
                let pids: Vec<String> = t.pids.iter().map(u32::to_string).collect();
                let server_cpu = || -> Option<f64> { pids.iter().map(|p| cpu_seconds(p)).sum() };
                let (cpu0, own0) = (server_cpu(), cpu_seconds("self"));
                let outcome = load::run(
                    &http,
                    Load {
                        bases: t.bases.clone(),
                        collection: t.collection,
                        config: t.config.clone(),
                        limits: t.limits,
                        mode,
                        batch_size: args.batch_size,
                        concurrency,
                        duration: Duration::from_secs(args.seconds),
                    },
                    round as u64 * 1000,
                )
                .await;
                let server_cpu = server_cpu().zip(cpu0).map_or(f64::NAN, |(a, b)| a - b);
                let own_cpu = cpu_seconds("self")
                    .zip(own0)
                    .map_or(f64::NAN, |(a, b)| a - b);
                let run = Run {
                    round,
                    mode,
                    server: t.server,
                    database: t.database,
                    concurrency,
                    elapsed_s: outcome.elapsed,
                    requests: outcome.requests,
                    accepted: outcome.accepted,
                    refused: outcome.refused,
                    errors: outcome.errors,
                    requests_per_s: outcome.requests as f64 / outcome.elapsed,
                    reports_per_s: outcome.accepted as f64 / outcome.elapsed,
                    p50_ms: outcome.latency_ms(0.5),
                    p99_ms: outcome.latency_ms(0.99),
                    server_cpu_s: server_cpu,
                    server_cpu_us_per_report: if outcome.accepted == 0 {
                        f64::NAN
                    } else {
                        server_cpu / outcome.accepted as f64 * 1e6
                    },
                    loadgen_cpu_s: own_cpu,
                };
                eprintln!(
                    "round {round} {mode:?} {} ({}): {:.0} reports/s, {:.0} requests/s, \
                     server CPU {:.1} µs per report, {} errors",
                    t.server,
                    t.database,
                    run.reports_per_s,
                    run.requests_per_s,
                    run.server_cpu_us_per_report,
                    run.errors
                );
                runs.push(run);
            }
        }
    }

    let load_after = loadavg();
    let mut summary = Vec::new();
    for t in targets.iter().filter(|t| t.server == "serve") {
        for mode in [Mode::Single, Mode::Batch] {
            summary.extend(summarize(&runs, t.database, mode));
        }
    }
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let date = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let command = command_line();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let machine = format!("{cpus} CPUs ({})", cpu_model());
    let result = json!({
        "command": command,
        "commit": commit,
        "dirty": dirty,
        "unix_time": date,
        "machine": machine,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "seconds_per_run": args.seconds,
        "rounds": args.rounds,
        "single_concurrency": args.single_concurrency,
        "batch_concurrency": args.batch_concurrency,
        "batch_size": args.batch_size,
        "summary": summary,
        "runs": runs,
    });

    let mut md = String::new();
    writeln!(md, "# Ingest: `serve` against a bare echo\n")?;
    writeln!(
        md,
        "Written by `bench-ingest` (`examples/src/bin/bench-ingest.rs`) at commit `{commit}`{} on {machine}; load generator and servers share it, with whatever else ran there (1/5/15-minute load average `{load_before}` before the runs, `{load_after}` after):\n\n```sh\n{command}\n```\n",
        if dirty {
            " (with uncommitted changes)"
        } else {
            ""
        }
    )?;
    writeln!(
        md,
        "Each round runs every mode against each server in turn for {} s ({} round{}): \
         single = one report per request, {} workers; batch = up to {} reports per request, {} \
         workers. The echo parses the same uploads and answers `accepted` without validating or \
         storing anything. Reports/s are accepted reports per second of wall time (task fetches \
         included); CPU per report is the server process's utime + stime over the run divided \
         by the reports it accepted (summed over both processes for two; PostgreSQL's own \
         processes not counted). Two processes: a second `serve` on the same PostgreSQL \
         database joins the first on its collection, and the workers alternate between them. Ranges are over \
         rounds; the ratio compares each round's `serve` with the echo of the same round.\n",
        args.seconds,
        args.rounds,
        if args.rounds == 1 { "" } else { "s" },
        args.single_concurrency,
        args.batch_size,
        args.batch_concurrency
    )?;
    writeln!(
        md,
        "| database | mode | `serve` reports/s | echo reports/s | serve / echo | `serve` CPU per report | echo CPU per report |\n|---|---|---|---|---|---|---|"
    )?;
    for s in &summary {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} µs | {} µs |",
            database_name(s.database),
            mode_name(s.mode),
            s.serve_reports_per_s.show(0),
            s.echo_reports_per_s.show(0),
            s.ratio.show(2),
            s.serve_cpu_us_per_report.show(1),
            s.echo_cpu_us_per_report.show(1),
        )?;
    }
    writeln!(
        md,
        "\nEvery run, in the order run:\n\n| round | mode | server | reports/s | requests/s | p50 / p99 ms | server CPU s | µs per report | errors |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    for r in &runs {
        writeln!(
            md,
            "| {} | {} | {}{} | {} | {} | {:.1} / {:.1} | {:.2} | {:.1} | {} |",
            r.round,
            mode_name(r.mode),
            r.server,
            if r.server == "serve" {
                format!(" ({})", r.database)
            } else {
                String::new()
            },
            ldpsyn_examples::report::thousands(r.reports_per_s.round() as u64),
            ldpsyn_examples::report::thousands(r.requests_per_s.round() as u64),
            r.p50_ms,
            r.p99_ms,
            r.server_cpu_s,
            r.server_cpu_us_per_report,
            r.errors
        )?;
    }
    print!("{md}");
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&result)? + "\n")?;
        std::fs::write(out.with_extension("md"), &md)?;
        eprintln!(
            "wrote {} and {}",
            out.display(),
            out.with_extension("md").display()
        );
    }
    Ok(())
}
