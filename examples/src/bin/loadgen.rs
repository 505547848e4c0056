//! Load generator for the aggregator's upload path (127.0.0.1 only).
//!
//! `cargo run --release -p ldpsyn-examples --bin loadgen -- --url http://127.0.0.1:8080
//!  --mode single|batch --seconds 20 [--server-pid PID] [--admin-token T | --collection ID]`
//!
//! Workers fetch tasks 1000 at a time (timed and counted separately), randomize a random
//! record for each with the task's mechanism, and upload: one report per request (`single`)
//! or up to `--batch-size` reports per request (`batch`), fewer when the server's published
//! body limit needs it (large OUE reports). Every upload is answered only after a
//! durable commit. Prints requests/s, reports/s, p50/p99 upload latency and the server's RSS
//! (from `/proc/<pid>/status`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use ldpsyn::protocol::{CollectionConfig, Report, ReportAnswer, ReportStatus, Task, UploadLimits};
use ldpsyn::submission::randomize_task;
use ldpsyn::upload::{Piece, published_limits, split_reports};
use rand::{Rng, SeedableRng};
use serde_json::json;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// One report per request.
    Single,
    /// `--batch-size` reports per request.
    Batch,
}

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

#[derive(Default)]
struct Totals {
    requests: AtomicU64,
    reports: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    /// Reports too large for any upload under the server's body limit (never sent).
    too_large: AtomicU64,
    task_requests: AtomicU64,
    task_micros: AtomicU64,
}

fn rss(pid: u32) -> String {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return "unavailable".into();
    };
    let get = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .map(|l| l[k.len()..].trim().to_owned())
            .unwrap_or_default()
    };
    format!("VmRSS {} (peak VmHWM {})", get("VmRSS:"), get("VmHWM:"))
}

/// CPU seconds (user + system, all threads, exited ones included) of a process so far, from
/// `/proc/<pid>/stat`. Linux reports them in USER_HZ = 100 ticks per second on every
/// architecture's user ABI.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name (which may contain spaces).
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), i.e. 11 and 12 after `state`.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

async fn fetch_tasks(
    http: &reqwest::Client,
    base: &str,
    id: Uuid,
    totals: &Totals,
) -> anyhow::Result<Vec<Task>> {
    let t = Instant::now();
    let tasks: Vec<Task> = http
        .get(format!("{base}/v1/collections/{id}/task?count=1000"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    totals.task_requests.fetch_add(1, Relaxed);
    totals
        .task_micros
        .fetch_add(t.elapsed().as_micros() as u64, Relaxed);
    Ok(tasks)
}

/// One report per task for a random record, randomized as the SDK does it.
fn make_reports(config: &CollectionConfig, tasks: &[Task], rng: &mut impl Rng) -> Vec<Report> {
    let dims = config.schema.domain_sizes();
    tasks
        .iter()
        .filter_map(|t| {
            let codes = dims
                .iter()
                .map(|&k| rng.random_range(0..k as u32))
                .collect();
            let record = config.schema.encoded(codes).ok()?;
            randomize_task(config, config.epsilon, t, &record, rng).ok()
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn worker(
    http: reqwest::Client,
    base: String,
    id: Uuid,
    config: Arc<CollectionConfig>,
    limits: UploadLimits,
    mode: Mode,
    batch: usize,
    deadline: Instant,
    totals: Arc<Totals>,
    seed: u64,
) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut latencies = Vec::new();
    let url = format!("{base}/v1/collections/{id}/reports");
    'outer: while Instant::now() < deadline {
        let Ok(tasks) = fetch_tasks(&http, &base, id, &totals).await else {
            totals.errors.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let reports = make_reports(&config, &tasks, &mut rng);
        let size = if mode == Mode::Single { 1 } else { batch };
        let limits = UploadLimits {
            max_reports_per_upload: limits.max_reports_per_upload.min(size as u64),
            ..limits
        };
        let Ok(pieces) = split_reports(&reports, &limits) else {
            totals.errors.fetch_add(1, Relaxed);
            continue;
        };
        for piece in pieces {
            if Instant::now() >= deadline {
                break 'outer;
            }
            let body = match piece {
                Piece::Body { body, .. } => body,
                Piece::TooLarge { .. } => {
                    totals.too_large.fetch_add(1, Relaxed);
                    continue;
                }
            };
            let t = Instant::now();
            let r = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            let answers: Option<Vec<ReportAnswer>> = match r {
                Ok(r) if r.status().is_success() => r.json().await.ok(),
                _ => None,
            };
            latencies.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            totals.requests.fetch_add(1, Relaxed);
            match answers {
                Some(a) => {
                    let ok = a
                        .iter()
                        .filter(|x| x.status == ReportStatus::Accepted)
                        .count() as u64;
                    totals.reports.fetch_add(ok, Relaxed);
                    totals.refused.fetch_add(a.len() as u64 - ok, Relaxed);
                }
                None => {
                    totals.errors.fetch_add(1, Relaxed);
                }
            }
        }
    }
    latencies
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
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(60))
        .build()?;
    let id = match args.collection {
        Some(id) => id,
        None => {
            let token = args.admin_token.as_deref().context(
                "--admin-token (or LDPSYN_ADMIN_TOKEN) is needed to create a collection",
            )?;
            let v: serde_json::Value = http
                .post(format!("{base}/v1/collections"))
                .bearer_auth(token)
                .json(&json!({
                    "schema": {"attributes": [
                        {"name": "a", "type": "categorical", "labels": ["0","1","2","3"]},
                        {"name": "b", "type": "categorical", "labels": ["0","1","2"]},
                        {"name": "c", "type": "categorical", "labels": ["0","1"]},
                        {"name": "d", "type": "numeric", "min": 0, "max": 100, "bins": 8}
                    ]},
                    "protocol": "privincr", "epsilon": 2.0, "target_users": 1_000_000_000_000u64
                }))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            v["id"].as_str().context("id")?.parse()?
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
    let totals = Arc::new(Totals::default());
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.seconds);
    let mut handles = Vec::new();
    for w in 0..concurrency {
        handles.push(tokio::spawn(worker(
            http.clone(),
            base.clone(),
            id,
            config.clone(),
            limits,
            args.mode,
            args.batch_size,
            deadline,
            totals.clone(),
            w as u64,
        )));
    }
    let mut lat: Vec<u32> = Vec::new();
    for h in handles {
        lat.extend(h.await?);
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0
        }
    };
    let req = totals.requests.load(Relaxed);
    let rep = totals.reports.load(Relaxed);
    let tr = totals.task_requests.load(Relaxed);
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
        totals.refused.load(Relaxed),
        totals.errors.load(Relaxed),
        totals.too_large.load(Relaxed)
    );
    println!(
        "task fetches (1000 tasks each, counted separately): {tr} requests, mean {:.2} ms",
        if tr == 0 {
            0.0
        } else {
            totals.task_micros.load(Relaxed) as f64 / tr as f64 / 1000.0
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
