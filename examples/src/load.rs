//! The upload load of `loadgen` and `bench-ingest`: workers on one HTTP client fetch tasks
//! 1000 at a time, randomize a random record for each with the task's mechanism (as the SDK
//! does) and upload the reports, one per request or in batches, until a deadline.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ldpsyn::submission::randomize_task;
use ldpsyn::upload::{Piece, split_reports};
use ldpsyn::wire::{
    CollectionConfig, Problem, Report, ReportAnswer, ReportStatus, Task, UploadLimits,
};
use rand::{Rng, SeedableRng};
use uuid::Uuid;

/// How reports are uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One report per request.
    Single,
    /// Up to the batch size per request.
    Batch,
}

/// One load run against one server.
#[derive(Debug, Clone)]
pub struct Load {
    /// The servers' base URLs, `http://127.0.0.1:port`: worker `w` uses `bases[w % len]`
    /// for its tasks and uploads (several `serve` processes on one database).
    pub bases: Vec<String>,
    /// The collection uploaded to.
    pub collection: Uuid,
    /// Its config (to randomize for its schema and ε).
    pub config: Arc<CollectionConfig>,
    /// The server's published upload limits.
    pub limits: UploadLimits,
    /// Single or batch.
    pub mode: Mode,
    /// Most reports per upload in batch mode.
    pub batch_size: usize,
    /// Concurrent workers.
    pub concurrency: usize,
    /// How long to upload.
    pub duration: Duration,
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Wall time, seconds (task fetching included).
    pub elapsed: f64,
    /// Upload requests answered (any status).
    pub requests: u64,
    /// Reports answered `accepted`.
    pub accepted: u64,
    /// Reports answered `duplicate` or `rejected`.
    pub refused: u64,
    /// Failed requests (transport errors, non-2xx, unreadable answers, failed task fetches).
    pub errors: u64,
    /// Why: the failed requests and the refused reports by cause, e.g. `upload: HTTP 429
    /// rate-limited`, `task: HTTP 409 collection-target-reached`, `upload: connection`,
    /// `report: rejected token-reused`, `report: duplicate`.
    pub failures: BTreeMap<String, u64>,
    /// Reports too large for any upload under the server's body limit (never sent).
    pub too_large: u64,
    /// Task requests (1000 tasks each).
    pub task_requests: u64,
    /// Their total latency, microseconds.
    pub task_micros: u64,
    /// Upload latencies, microseconds, sorted.
    pub latencies: Vec<u32>,
}

impl Outcome {
    /// The `p`-quantile (0..=1) of the upload latencies, milliseconds (0 without uploads).
    pub fn latency_ms(&self, p: f64) -> f64 {
        let lat = &self.latencies;
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0
        }
    }
}

#[derive(Default)]
struct Totals {
    requests: AtomicU64,
    reports: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    too_large: AtomicU64,
    task_requests: AtomicU64,
    task_micros: AtomicU64,
    failures: Mutex<BTreeMap<String, u64>>,
}

impl Totals {
    /// Counts one failure or refusal under `cause`.
    fn fail(&self, cause: String) {
        // A poisoned lock (a worker panicked) loses the breakdown, never the counts.
        if let Ok(mut f) = self.failures.lock() {
            *f.entry(cause).or_default() += 1;
        }
    }
}

/// Why a request to `route` failed: its transport error, or its HTTP status with the problem
/// type of its body (when it is a problem document).
async fn cause(route: &str, r: Result<reqwest::Response, reqwest::Error>) -> String {
    match r {
        Err(e) if e.is_connect() => format!("{route}: connection"),
        Err(e) if e.is_timeout() => format!("{route}: timeout"),
        Err(_) => format!("{route}: transport"),
        Ok(resp) => {
            let status = resp.status().as_u16();
            let problem = resp
                .bytes()
                .await
                .ok()
                .and_then(|b| serde_json::from_slice::<Problem>(&b).ok())
                .map_or_else(String::new, |p| format!(" {}", p.problem_type));
            format!("{route}: HTTP {status}{problem}")
        }
    }
}

/// Creates the load generators' collection (4 attributes: three categorical, one numeric in
/// 8 bins; `privincr` at ε = 2, a target of 10¹² so it never stops) on `base` with the admin
/// `token`, and returns its id. Errors: the request failing or a non-2xx answer.
pub async fn create_collection(
    http: &reqwest::Client,
    base: &str,
    token: &str,
) -> anyhow::Result<Uuid> {
    use anyhow::Context;
    let v: serde_json::Value = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(token)
        .json(&serde_json::json!({
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
    Ok(v["id"].as_str().context("id")?.parse()?)
}

/// An HTTP client for many concurrent workers on one host.
pub fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(60))
        .build()
}

/// CPU seconds (user + system, all threads, exited ones included) of process `pid` (or
/// `"self"`) so far, from `/proc/<pid>/stat`. Linux reports them in USER_HZ = 100 ticks per
/// second on every architecture's user ABI, so the resolution is 10 ms.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name (which may contain spaces).
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), i.e. 11 and 12 after `state`.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// `VmRSS … (peak VmHWM …)` of process `pid`, from `/proc/<pid>/status`.
pub fn rss(pid: u32) -> String {
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

async fn fetch_tasks(
    http: &reqwest::Client,
    base: &str,
    id: Uuid,
    totals: &Totals,
) -> Result<Vec<Task>, String> {
    let t = Instant::now();
    let r = http
        .get(format!("{base}/v1/collections/{id}/task?count=1000"))
        .send()
        .await;
    let resp = match r {
        Ok(resp) if resp.status().is_success() => resp,
        other => return Err(cause("task", other).await),
    };
    let tasks: Vec<Task> = resp
        .json()
        .await
        .map_err(|_| "task: unreadable answer".to_owned())?;
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

async fn worker(
    http: reqwest::Client,
    load: Arc<Load>,
    deadline: Instant,
    totals: Arc<Totals>,
    base: String,
    seed: u64,
) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut latencies = Vec::new();
    let (base, id) = (&base, load.collection);
    let url = format!("{base}/v1/collections/{id}/reports");
    'outer: while Instant::now() < deadline {
        let tasks = match fetch_tasks(&http, base, id, &totals).await {
            Ok(tasks) => tasks,
            Err(why) => {
                totals.errors.fetch_add(1, Relaxed);
                totals.fail(why);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let reports = make_reports(&load.config, &tasks, &mut rng);
        let size = if load.mode == Mode::Single {
            1
        } else {
            load.batch_size
        };
        let limits = UploadLimits {
            max_reports_per_upload: load.limits.max_reports_per_upload.min(size as u64),
            ..load.limits
        };
        let Ok(pieces) = split_reports(&reports, &limits) else {
            totals.errors.fetch_add(1, Relaxed);
            totals.fail("a report does not serialize".into());
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
            let answers: Result<Vec<ReportAnswer>, String> = match r {
                Ok(r) if r.status().is_success() => r
                    .json()
                    .await
                    .map_err(|_| "upload: unreadable answer".to_owned()),
                other => Err(cause("upload", other).await),
            };
            latencies.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            totals.requests.fetch_add(1, Relaxed);
            match answers {
                Ok(a) => {
                    let ok = a
                        .iter()
                        .filter(|x| x.status == ReportStatus::Accepted)
                        .count() as u64;
                    totals.reports.fetch_add(ok, Relaxed);
                    totals.refused.fetch_add(a.len() as u64 - ok, Relaxed);
                    for x in a.iter().filter(|x| x.status != ReportStatus::Accepted) {
                        totals.fail(match (&x.status, &x.problem) {
                            (ReportStatus::Rejected, Some(p)) => {
                                format!("report: rejected {}", p.problem_type)
                            }
                            (status, _) => format!("report: {status:?}").to_lowercase(),
                        });
                    }
                }
                Err(why) => {
                    totals.errors.fetch_add(1, Relaxed);
                    totals.fail(why);
                }
            }
        }
    }
    latencies
}

/// Runs `load` with `http` until its duration has passed (uploads in flight finish). Worker
/// `w` seeds its records with `seed + w`. Panics if `load.bases` is empty.
pub async fn run(http: &reqwest::Client, load: Load, seed: u64) -> Outcome {
    let load = Arc::new(load);
    let totals = Arc::new(Totals::default());
    let start = Instant::now();
    let deadline = start + load.duration;
    let handles: Vec<_> = (0..load.concurrency)
        .map(|w| {
            tokio::spawn(worker(
                http.clone(),
                load.clone(),
                deadline,
                totals.clone(),
                load.bases[w % load.bases.len()].clone(),
                seed + w as u64,
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    for h in handles {
        // A worker that panicked loses its latencies; its counts are in `totals`.
        if let Ok(l) = h.await {
            latencies.extend(l);
        }
    }
    latencies.sort_unstable();
    Outcome {
        elapsed: start.elapsed().as_secs_f64(),
        requests: totals.requests.load(Relaxed),
        accepted: totals.reports.load(Relaxed),
        refused: totals.refused.load(Relaxed),
        errors: totals.errors.load(Relaxed),
        too_large: totals.too_large.load(Relaxed),
        failures: totals
            .failures
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default(),
        task_requests: totals.task_requests.load(Relaxed),
        task_micros: totals.task_micros.load(Relaxed),
        latencies,
    }
}
