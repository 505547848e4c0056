//! Load generator for the aggregator's upload path (127.0.0.1 only).
//!
//! `cargo run --release -p ldpsyn-examples --bin loadgen -- --url http://127.0.0.1:8080
//!  --mode single|batch --seconds 20 [--server-pid PID] [--admin-token T | --collection ID]`
//!
//! Workers fetch tasks 1000 at a time (timed and counted separately), randomize a random
//! record for each with the task's mechanism, and upload: one report per request (`single`)
//! or up to `--batch-size` reports per request (`batch`), fewer when the server's published
//! body limit needs it (large OUE reports). Every upload is answered only after a
//! durable commit. Prints requests/s, reports/s, p50/p99 upload latency, failed requests and
//! refused reports by cause (transport error, or HTTP status and problem type, e.g.
//! `upload: HTTP 429 rate-limited`) and the server's RSS (from `/proc/<pid>/status`).
//! `--collection ID` loads an existing collection (e.g. one made with `collections create`);
//! without it one is created with the admin token.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use ldpsyn::upload::published_limits;
use ldpsyn::wire::CollectionConfig;
use ldpsyn_examples::load::{self, Load, Mode, cpu_seconds, rss};
use uuid::Uuid;

/// Upload load generator (127.0.0.1 only).
#[derive(Debug, Parser)]
struct Args {
    /// Aggregator base URL (must be on 127.0.0.1 or localhost).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// single or batch.
    #[arg(long, value_enum, default_value = "single")]
    mode: Mode,
    /// Duration of the measurement, seconds (at most 600).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent workers (default: 64 single, 4 batch).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Most reports per upload in batch mode (the server's limits may cut an upload smaller).
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
    /// Collection to upload to; else one is created with the admin token.
    #[arg(long)]
    collection: Option<Uuid>,
    /// Admin token (to create the collection).
    #[arg(long, env = "LDPSYN_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// PID of the server, to report its RSS.
    #[arg(long)]
    server_pid: Option<u32>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let url = reqwest::Url::parse(&args.url).context("--url")?;
    match url.host_str() {
        Some("127.0.0.1") | Some("localhost") => {}
        other => bail!("loadgen only targets 127.0.0.1 (got {other:?})"),
    }
    if args.seconds == 0 || args.seconds > 600 {
        bail!("--seconds must be in 1..=600");
    }
    let base = args.url.trim_end_matches('/').to_owned();
    let http = load::client()?;
    let id = match args.collection {
        Some(id) => id,
        None => {
            let token = args.admin_token.as_deref().context(
                "--admin-token (or LDPSYN_ADMIN_TOKEN) is needed to create a collection",
            )?;
            load::create_collection(&http, &base, token).await?
        }
    };
    let view: serde_json::Value = http
        .get(format!("{base}/v1/collections/{id}"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let limits = published_limits(&view).context("the server's upload_limits")?;
    let config: Arc<CollectionConfig> =
        Arc::new(serde_json::from_value(view).context("the collection's config")?);
    let concurrency = args
        .concurrency
        .unwrap_or(if args.mode == Mode::Single { 64 } else { 4 });
    if let Some(pid) = args.server_pid {
        println!("server RSS before: {}", rss(pid));
    }
    let server_cpu0 = args.server_pid.and_then(|p| cpu_seconds(&p.to_string()));
    let own_cpu0 = cpu_seconds("self");
    let outcome = load::run(
        &http,
        Load {
            bases: vec![base.clone()],
            collection: id,
            config,
            limits,
            mode: args.mode,
            batch_size: args.batch_size,
            concurrency,
            duration: Duration::from_secs(args.seconds),
        },
        0,
    )
    .await;
    let elapsed = outcome.elapsed;
    let pct = |p: f64| outcome.latency_ms(p);
    let (req, rep, tr) = (outcome.requests, outcome.accepted, outcome.task_requests);
    println!(
        "mode {:?}, {concurrency} workers, {elapsed:.1} s (wall time includes task fetching)",
        args.mode
    );
    println!(
        "uploads: {:.0} requests/s, {:.0} accepted reports/s, p50 {:.2} ms, p99 {:.2} ms, {} refused, {} errors, {} too large to send",
        req as f64 / elapsed,
        rep as f64 / elapsed,
        pct(0.5),
        pct(0.99),
        outcome.refused,
        outcome.errors,
        outcome.too_large
    );
    if !outcome.failures.is_empty() {
        println!("failures and refusals by cause:");
        for (why, n) in &outcome.failures {
            println!("  {why}: {n}");
        }
    }
    println!(
        "task fetches (1000 tasks each, counted separately): {tr} requests, mean {:.2} ms",
        if tr == 0 {
            0.0
        } else {
            outcome.task_micros as f64 / tr as f64 / 1000.0
        }
    );
    // Server and generator share this machine's cores, so the CPU each used says what the
    // server alone would sustain.
    let cpu = |c0: Option<f64>, pid: &str| Some(cpu_seconds(pid)? - c0?);
    if let (Some(pid), Some(server)) = (
        args.server_pid,
        args.server_pid
            .and_then(|p| cpu(server_cpu0, &p.to_string())),
    ) {
        let per_report = if rep == 0 { 0.0 } else { server / rep as f64 };
        println!(
            "server CPU: {server:.1} s ({:.2} cores) = {:.1} µs per accepted report (tasks included) \
             -> {:.0} reports/s per server core; load generator CPU: {:.1} s",
            server / elapsed,
            per_report * 1e6,
            if per_report > 0.0 {
                1.0 / per_report
            } else {
                0.0
            },
            cpu(own_cpu0, "self").unwrap_or(f64::NAN)
        );
        println!("server RSS after: {}", rss(pid));
    }
    Ok(())
}
