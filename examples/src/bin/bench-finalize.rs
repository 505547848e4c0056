//! What a finalize costs the other clients of a running aggregator (127.0.0.1 only): upload
//! and `/healthz` latency while a wide collection's model is fit, against the same load
//! without a finalize.
//!
//! `cargo run --release -p ldpsyn-examples --bin bench-finalize -- --url http://127.0.0.1:8080
//!  [--attributes 35] [--reports 200000] [--workers 4] [--baseline-seconds 5]`
//! (`LDPSYN_ADMIN_TOKEN` set, the server started with `--rate-limit-per-ip 0`).
//!
//! Creates collection A (`auto`, `--attributes` categorical attributes of `--labels` labels, each a
//! noisy copy of the one before, so the model keeps many pairs) and feeds it `--reports`
//! randomized records; creates a small collection B. Then `--workers` streams post one
//! report each per request to B and one prober polls `/healthz`, first for
//! `--baseline-seconds`, then while `POST …/A/finalize` runs. Prints p50/p99/max of both in
//! both windows, and the finalize's duration. Figures, not a test: nothing is asserted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use ldpsyn::submission::randomize_task;
use ldpsyn::upload::{Piece, published_limits, split_reports};
use ldpsyn::wire::{CollectionConfig, ReportAnswer, Task, UploadLimits};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use uuid::Uuid;

/// Finalize-under-load benchmark (127.0.0.1 only).
#[derive(Debug, Parser)]
struct Args {
    /// Aggregator base URL (127.0.0.1 or localhost).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Admin token.
    #[arg(long, env = "LDPSYN_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    /// Attributes of the finalized collection.
    #[arg(long, default_value_t = 35)]
    attributes: usize,
    /// Labels of each attribute of the finalized collection.
    #[arg(long, default_value_t = 12)]
    labels: u32,
    /// Reports fed to the finalized collection before the measurement.
    #[arg(long, default_value_t = 200_000)]
    reports: usize,
    /// Concurrent upload streams to the other collection.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Length of the window without a finalize, seconds.
    #[arg(long, default_value_t = 5)]
    baseline_seconds: u64,
    /// Seed of the records and the randomization (not private: a benchmark).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Creates a collection; returns its id, config and the server's upload limits.
async fn create(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    body: Value,
) -> anyhow::Result<(Uuid, CollectionConfig, UploadLimits)> {
    let v: Value = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let id: Uuid = v["id"].as_str().context("id")?.parse()?;
    let view: Value = http
        .get(format!("{base}/v1/collections/{id}"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let limits = published_limits(&view)?;
    Ok((id, serde_json::from_value(view)?, limits))
}

async fn tasks(
    http: &reqwest::Client,
    base: &str,
    id: Uuid,
    n: usize,
) -> anyhow::Result<Vec<Task>> {
    Ok(http
        .get(format!("{base}/v1/collections/{id}/task?count={n}"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// A record of `k` attributes of `labels` codes: each a copy of the previous one with
/// probability 0.7, else uniform.
fn chain_record(k: usize, labels: u32, rng: &mut impl Rng) -> Vec<u32> {
    let mut codes = Vec::with_capacity(k);
    let mut prev = rng.random_range(0..labels);
    for _ in 0..k {
        if rng.random::<f64>() >= 0.7 {
            prev = rng.random_range(0..labels);
        }
        codes.push(prev);
    }
    codes
}

/// Feeds `n` chain records to collection `id` (tasks 1,000 at a time, uploads within the
/// server's limits).
async fn feed(
    http: &reqwest::Client,
    base: &str,
    id: Uuid,
    config: &CollectionConfig,
    limits: &UploadLimits,
    n: usize,
    rng: &mut impl Rng,
) -> anyhow::Result<()> {
    let k = config.schema.len();
    let mut sent = 0;
    while sent < n {
        let batch = tasks(http, base, id, (n - sent).min(1000)).await?;
        let mut reports = Vec::with_capacity(batch.len());
        for t in &batch {
            let labels = config.schema.domain_sizes()[0] as u32;
            let record = config.schema.encoded(chain_record(k, labels, rng))?;
            reports.push(randomize_task(config, config.epsilon, t, &record, rng)?);
        }
        for piece in split_reports(&reports, limits)? {
            let Piece::Body { body, .. } = piece else {
                bail!("a report larger than the server's body limit");
            };
            http.post(format!("{base}/v1/collections/{id}/reports"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?
                .error_for_status()?;
        }
        sent += batch.len();
    }
    Ok(())
}

/// One stream of single-report uploads to `id` until `stop`; latencies in µs.
async fn uploads(
    http: reqwest::Client,
    base: String,
    id: Uuid,
    config: Arc<CollectionConfig>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> anyhow::Result<Vec<u64>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut lat = Vec::new();
    let url = format!("{base}/v1/collections/{id}/reports");
    while !stop.load(Relaxed) {
        for t in tasks(&http, &base, id, 200).await? {
            if stop.load(Relaxed) {
                break;
            }
            let codes = (0..config.schema.len())
                .map(|_| rng.random_range(0..2))
                .collect();
            let record = config.schema.encoded(codes)?;
            let report = randomize_task(&config, config.epsilon, &t, &record, &mut rng)?;
            let body = serde_json::to_vec(&[report])?;
            let start = Instant::now();
            let answers: Vec<ReportAnswer> = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            lat.push(start.elapsed().as_micros() as u64);
            anyhow::ensure!(answers.len() == 1, "one answer per report");
        }
    }
    Ok(lat)
}

/// `/healthz` polled back to back until `stop`; latencies in µs.
async fn health(http: reqwest::Client, base: String, stop: Arc<AtomicBool>) -> Vec<u64> {
    let mut lat = Vec::new();
    while !stop.load(Relaxed) {
        let start = Instant::now();
        let ok = http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            lat.push(start.elapsed().as_micros() as u64);
        }
    }
    lat
}

/// Runs the upload streams and the prober until `until` resolves; returns its output with
/// the upload and `/healthz` latencies.
async fn under_load<T>(
    args: &Args,
    http: &reqwest::Client,
    base: &str,
    (id, config): (Uuid, Arc<CollectionConfig>),
    until: impl std::future::Future<Output = T>,
) -> anyhow::Result<(T, Vec<u64>, Vec<u64>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let streams: Vec<_> = (0..args.workers)
        .map(|w| {
            tokio::spawn(uploads(
                http.clone(),
                base.to_owned(),
                id,
                config.clone(),
                stop.clone(),
                args.seed * 1000 + w as u64,
            ))
        })
        .collect();
    let prober = tokio::spawn(health(http.clone(), base.to_owned(), stop.clone()));
    let out = until.await;
    stop.store(true, Relaxed);
    let mut up = Vec::new();
    for s in streams {
        up.extend(s.await??);
    }
    Ok((out, up, prober.await?))
}

fn summary(name: &str, mut lat: Vec<u64>) -> String {
    if lat.is_empty() {
        return format!("{name}: no samples");
    }
    lat.sort_unstable();
    let at = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    format!(
        "{name}: n {}, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        lat.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let url = reqwest::Url::parse(&args.url).context("--url")?;
    match url.host_str() {
        Some("127.0.0.1") | Some("localhost") => {}
        other => bail!("bench-finalize only targets 127.0.0.1 (got {other:?})"),
    }
    let base = args.url.trim_end_matches('/').to_owned();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(600))
        .build()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let labels: Vec<String> = (0..args.labels).map(|i| format!("v{i}")).collect();
    let wide = json!({"attributes": (0..args.attributes)
        .map(|i| json!({"name": format!("x{i}"), "type": "categorical", "labels": labels}))
        .collect::<Vec<_>>()});
    let (a, config_a, limits) = create(
        &http,
        &base,
        &args.admin_token,
        // Finalized by this benchmark while it measures, not by the last report's commit.
        json!({"schema": wide, "protocol": "auto", "epsilon": 2.0,
               "target_users": args.reports, "auto_finalize_at_target": false}),
    )
    .await?;
    let t = Instant::now();
    feed(&http, &base, a, &config_a, &limits, args.reports, &mut rng).await?;
    let status: Value = http
        .get(format!("{base}/v1/collections/{a}"))
        .send()
        .await?
        .json()
        .await?;
    println!(
        "fed {} reports to a {}-attribute auto collection in {:.1} s (phase {}, round {})",
        args.reports,
        args.attributes,
        t.elapsed().as_secs_f64(),
        status["status"]["phase"],
        status["status"]["round"]
    );
    let small = json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": ["n", "y"]},
        {"name": "b", "type": "categorical", "labels": ["n", "y"]}]});
    let (b, config_b, _) = create(
        &http,
        &base,
        &args.admin_token,
        json!({"schema": small, "protocol": "independence", "epsilon": 2.0,
               "target_users": 1_000_000_000u64}),
    )
    .await?;
    let target = (b, Arc::new(config_b));

    let ((), up, hz) = under_load(
        &args,
        &http,
        &base,
        target.clone(),
        tokio::time::sleep(Duration::from_secs(args.baseline_seconds)),
    )
    .await?;
    println!("without a finalize ({} s):", args.baseline_seconds);
    println!("  {}", summary("upload (1 report)", up));
    println!("  {}", summary("/healthz", hz));

    // Until the model is built: the finalize answers 202 when the fit outlasts its wait.
    let finalize = async {
        let t = Instant::now();
        let mut r = http
            .post(format!("{base}/v1/collections/{a}/finalize"))
            .bearer_auth(&args.admin_token)
            .send()
            .await;
        while matches!(&r, Ok(resp) if resp.status() == reqwest::StatusCode::ACCEPTED
            || resp.status() == reqwest::StatusCode::CONFLICT)
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
            r = http
                .get(format!("{base}/v1/collections/{a}/model"))
                .bearer_auth(&args.admin_token)
                .send()
                .await;
        }
        (r.map(|r| r.status()), t.elapsed())
    };
    let ((status, took), up, hz) = under_load(&args, &http, &base, target, finalize).await?;
    println!(
        "during the finalize ({:.2} s, HTTP {}):",
        took.as_secs_f64(),
        status?.as_u16()
    );
    println!("  {}", summary("upload (1 report)", up));
    println!("  {}", summary("/healthz", hz));
    Ok(())
}
