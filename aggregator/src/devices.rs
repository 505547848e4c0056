//! `ldpsyn-aggregator devices`: try a running aggregator with one's own data. Reads a CSV
//! file, encodes each row with the collection's public schema, and sends each row as one
//! device would: the SDK's [`Client`] per simulated person, with its own [`FileLedger`] in
//! a temporary folder, the task the server assigns, randomization on the "device", retries,
//! and rate-limit back-off honouring `Retry-After`. Prints `accepted / duplicate / refused
//! (by problem type) / invalid` counts at the end.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use ldpsyn::client::{Client, ClientError, ClientOptions, Receipt};
use ldpsyn::ledger::FileLedger;
use ldpsyn::schema::{EncodedRecord, Schema};
use ldpsyn::wire::{CollectionConfig, Problem, ReportStatus};
use ldpsyn::{Epsilon, MAX_EPSILON};
use rand::SeedableRng;
use rand::rngs::StdRng;
use uuid::Uuid;

/// Invalid rows whose reasons are printed (the rest are only counted).
const SHOWN_INVALID: usize = 5;

/// Times a device starts its submission over after the SDK gave up on a rate-limited
/// server (each time after the SDK's own retries, which honour `Retry-After`).
const RATE_LIMITED_ROUNDS: u32 = 20;

/// `devices` options.
#[derive(Debug, Clone, Parser)]
pub struct DevicesConfig {
    /// Base URL of the aggregator.
    #[arg(long, env = "LDPSYN_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Collection to report to (its public config gives the schema).
    #[arg(long)]
    pub collection: Uuid,
    /// CSV file with a header row naming the schema's attributes; one row per person.
    #[arg(long)]
    pub data: PathBuf,
    /// Read only the first N data rows.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Devices reporting at once (1 to 256).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// **Simulations only**: seed every device's privacy RNG (device i from a seed of
    /// `(S, i)`), so anyone knowing S can undo the randomization. Default: each device seeds
    /// a CSPRNG from the operating system, as the SDK does for real people.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Errors of `devices`.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    /// Bad options or an unreadable data file.
    #[error("{0}")]
    Input(String),
    /// The aggregator could not be reached or refused the collection.
    #[error("{0}")]
    Server(String),
    /// The temporary ledger folder or the output failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// What happened to the rows: each row is exactly one of accepted, duplicate, refused,
/// invalid or not sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Data rows read.
    pub rows: u64,
    /// Reports answered `accepted`.
    pub accepted: u64,
    /// Reports answered `duplicate` (a resend found the report already committed).
    pub duplicate: u64,
    /// Devices whose report was refused or could not be sent, by problem type slug (e.g.
    /// `collection-target-reached`, `unavailable`).
    pub refused: BTreeMap<String, u64>,
    /// Rows that do not fit the schema (never sent).
    pub invalid: u64,
    /// Rows not sent because the run stopped early (the aggregator became unreachable).
    pub not_sent: u64,
}

impl Tally {
    /// Counts one device's submission outcome: a receipt by its status, an error by its
    /// problem type ([`ClientError::problem_type`]; an invalid record as `invalid`).
    pub fn record(&mut self, outcome: &Result<Receipt, ClientError>) {
        match outcome {
            Ok(r) if r.status == ReportStatus::Duplicate => self.duplicate += 1,
            Ok(_) => self.accepted += 1,
            Err(ClientError::Record(_)) => self.invalid += 1,
            Err(e) => {
                *self
                    .refused
                    .entry(e.problem_type().to_string())
                    .or_default() += 1
            }
        }
    }

    /// Devices refused, all problem types together.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    /// The counts, one `name: count` per line: `rows`, `accepted`, `duplicate`, `refused`
    /// (with its problem types in parentheses), `invalid`, and `not sent` when some were not.
    pub fn summary(&self) -> String {
        let by_type: Vec<String> = self
            .refused
            .iter()
            .map(|(t, n)| format!("{t}: {n}"))
            .collect();
        let mut s = format!(
            "rows: {}\naccepted: {}\nduplicate: {}\nrefused: {}{}\ninvalid: {}\n",
            self.rows,
            self.accepted,
            self.duplicate,
            self.refused_total(),
            if by_type.is_empty() {
                String::new()
            } else {
                format!(" ({})", by_type.join(", "))
            },
            self.invalid,
        );
        if self.not_sent > 0 {
            s.push_str(&format!("not sent: {}\n", self.not_sent));
        }
        s
    }
}

/// The rows of a CSV file encoded with a schema.
#[derive(Debug, Default)]
pub struct CsvRecords {
    /// Valid rows: (0-based data row index, record).
    pub records: Vec<(usize, EncodedRecord)>,
    /// Data rows read.
    pub rows: usize,
    /// Rows that do not fit the schema.
    pub invalid: usize,
    /// The first five reasons, each naming its line.
    pub reasons: Vec<String>,
}

/// Reads the first `limit` data rows of the CSV file at `path` (header row, then one row per
/// person) and encodes each with `schema`'s CSV encoder, as `demo` reads its `--data`
/// (`crate::sim::load_csv`): columns by header name, a flexible row length. An attribute's
/// `on_invalid: randomize` policy replaces an invalid value with a uniform draw from `rng`
/// (as a device does), so only rows the schema refuses are counted invalid.
///
/// Errors: the file cannot be opened or read, or its header lacks an attribute.
pub fn read_csv_records(
    path: &Path,
    schema: &Schema,
    limit: Option<usize>,
    rng: &mut StdRng,
) -> Result<CsvRecords, DevicesError> {
    let name = path.display();
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_path(path)
        .map_err(|e| DevicesError::Input(format!("cannot read {name}: {e}")))?;
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| DevicesError::Input(format!("cannot read the header of {name}: {e}")))?
        .iter()
        .map(str::to_owned)
        .collect();
    let encoder = schema.csv_encoder(&header).map_err(|e| {
        DevicesError::Input(format!("{name} does not fit the collection's schema: {e}"))
    })?;
    let mut out = CsvRecords::default();
    for (i, row) in reader.records().enumerate() {
        if limit.is_some_and(|l| i >= l) {
            break;
        }
        out.rows += 1;
        let result = match row {
            Ok(row) => {
                let line = row.position().map_or(0, |p| p.line());
                let fields: Vec<&str> = row.iter().collect();
                encoder
                    .encode_with(&fields, rng)
                    .map_err(|e| format!("line {line}: {e}"))
            }
            // An I/O error ends the read; a row that is not CSV (bad UTF-8) is invalid.
            Err(e) if e.is_io_error() => {
                return Err(DevicesError::Input(format!("cannot read {name}: {e}")));
            }
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(record) => out.records.push((i, record)),
            Err(reason) => {
                out.invalid += 1;
                if out.reasons.len() < SHOWN_INVALID {
                    out.reasons.push(reason);
                }
            }
        }
    }
    Ok(out)
}

/// The message for a request to `url` that failed with `e`, pointing at `serve` when nothing
/// answered at `server`.
fn unreachable(url: &str, server: &str, e: &reqwest::Error) -> String {
    // reqwest's own message repeats the URL; the innermost cause says what went wrong.
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    if e.is_connect() {
        format!("cannot connect to {url} ({cause}): is `serve` running at {server}?")
    } else if e.is_timeout() {
        format!("{url} did not answer in time ({cause}): is `serve` running at {server}?")
    } else {
        format!("request to {url} failed: {cause}")
    }
}

/// Fetches the collection's public config, waiting out rate limits (`Retry-After`).
async fn fetch_config(cfg: &DevicesConfig, base: &str) -> Result<CollectionConfig, DevicesError> {
    let url = format!("{base}/v1/collections/{}", cfg.collection);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| DevicesError::Server(e.to_string()))?;
    for _ in 0..RATE_LIMITED_ROUNDS {
        let resp = http
            .get(&url)
            .send()
            .await
            .map_err(|e| DevicesError::Server(unreachable(&url, base, &e)))?;
        let status = resp.status();
        if status.as_u16() == 429 {
            let wait = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(wait.clamp(1, 60))).await;
            continue;
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| DevicesError::Server(unreachable(&url, base, &e)))?;
        if !status.is_success() {
            let detail = serde_json::from_slice::<Problem>(&body).map_or_else(
                |_| String::from_utf8_lossy(&body).into_owned(),
                |p| format!("{}: {}", p.problem_type, p.detail),
            );
            return Err(DevicesError::Server(format!(
                "{url} answered {status}: {detail}"
            )));
        }
        return serde_json::from_slice(&body).map_err(|e| {
            DevicesError::Server(format!("{url} is not a collection's public config: {e}"))
        });
    }
    Err(DevicesError::Server(format!(
        "{url} kept answering 429 (rate limited); try again later or raise the server's \
         --rate-limit-per-ip"
    )))
}

/// Seed of device `i` under `--seed s` (SplitMix64 finalizer of the pair: unrelated streams).
fn device_seed(seed: u64, i: usize) -> u64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    mix(mix(seed).wrapping_add(i as u64))
}

/// The SDK options of one simulated device.
fn device_options(seed: Option<u64>, i: usize) -> Result<ClientOptions, ClientError> {
    // The operator tries their own server: accept whatever ε it asks (≤ the SDK's maximum).
    let max = Epsilon::new(MAX_EPSILON).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let mut options = match seed {
        Some(s) => ClientOptions::insecure_simulation(max, device_seed(s, i)),
        None => ClientOptions::new(max),
    };
    // A fresh ledger that serves this one collection: no device-wide cap (the default would
    // refuse a collection above ε = 10).
    options.device_budget = None;
    // Many devices share one address, so the server's per-client rate limit is met often:
    // more attempts and longer waits than an app's defaults.
    options.max_attempts = 8;
    options.max_backoff = Duration::from_secs(10);
    Ok(options)
}

/// Whether the SDK gave up on a server that kept answering 429 (rather than one that could
/// not be reached or kept failing).
fn rate_limited(e: &ClientError) -> bool {
    // The SDK names the last failure `HTTP <status>: …` (client::send_json).
    matches!(e, ClientError::Unavailable { last_error, .. } if last_error.starts_with("HTTP 429"))
}

/// One device: its own ledger at `ledger_path`, the SDK client connecting to the collection,
/// fetching a task, randomizing `record` and posting it. After the SDK's own retries, a
/// rate-limited device starts again (its ledger resends the same report if it had one).
/// The ledger files are removed afterwards.
pub async fn run_device(
    base: &str,
    collection: Uuid,
    options: ClientOptions,
    ledger_path: &Path,
    record: &EncodedRecord,
) -> Result<Receipt, ClientError> {
    let mut outcome = Err(ClientError::Protocol("never tried".into()));
    for round in 0..RATE_LIMITED_ROUNDS {
        if round > 0 {
            let jitter = rand::random_range(500..1500);
            tokio::time::sleep(Duration::from_millis(jitter)).await;
        }
        let ledger = FileLedger::open(ledger_path)?;
        outcome = match Client::connect(base, collection, options.clone(), ledger).await {
            Ok(mut client) => client.submit_encoded(record).await,
            Err(e) => Err(e),
        };
        match &outcome {
            Err(e) if rate_limited(e) => continue,
            _ => break,
        }
    }
    let mut lock = ledger_path.as_os_str().to_owned();
    lock.push(".lock");
    let _ = std::fs::remove_file(ledger_path);
    let _ = std::fs::remove_file(lock);
    outcome
}

/// Runs `devices`: fetches the collection's schema from the server, reads and encodes
/// `cfg.data`, and runs one SDK device per valid row, `cfg.concurrency` at a time. Prints the
/// invalid rows' first reasons on stderr and the [`Tally::summary`] on `out`.
///
/// Errors: the server unreachable (the message asks whether `serve` runs at the URL) or
/// refusing the collection, an unreadable data file, a header without the schema's
/// attributes, the server becoming unreachable during the run (with the counts so far).
pub async fn run(cfg: &DevicesConfig, out: &mut impl Write) -> Result<Tally, DevicesError> {
    let base = cfg.server.trim_end_matches('/').to_owned();
    let config = fetch_config(cfg, &base).await?;
    let mut rng = match cfg.seed {
        Some(s) => StdRng::seed_from_u64(device_seed(s, usize::MAX)),
        None => StdRng::from_os_rng(),
    };
    let csv = read_csv_records(&cfg.data, &config.schema, cfg.limit, &mut rng)?;
    if csv.invalid > 0 {
        eprintln!(
            "{}: {} of {} rows do not fit the schema (not sent); the first:",
            cfg.data.display(),
            csv.invalid,
            csv.rows
        );
        for r in &csv.reasons {
            eprintln!("  {r}");
        }
    }
    let tally = Tally {
        rows: csv.rows as u64,
        invalid: csv.invalid as u64,
        ..Tally::default()
    };
    let dir = tempfile::Builder::new()
        .prefix("ldpsyn-devices")
        .tempdir()?;
    let bar = if cfg.quiet {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(csv.records.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("devices [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
                // The template is a constant known to parse.
                .expect("valid progress template")
                .progress_chars("=> "),
        );
        bar
    };
    let records = Arc::new(csv.records);
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(std::sync::Mutex::new((tally, None::<String>)));
    let mut workers = Vec::new();
    for _ in 0..cfg.concurrency.clamp(1, 256) {
        let (records, next, done, stop, shared, bar) = (
            records.clone(),
            next.clone(),
            done.clone(),
            stop.clone(),
            shared.clone(),
            bar.clone(),
        );
        let (base, dir, seed, collection) = (
            base.clone(),
            dir.path().to_owned(),
            cfg.seed,
            cfg.collection,
        );
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some((row, record)) = records.get(k) else {
                    break;
                };
                let outcome = match device_options(seed, *row) {
                    Ok(options) => {
                        let ledger = dir.join(format!("device-{row}.json"));
                        run_device(&base, collection, options, &ledger, record).await
                    }
                    Err(e) => Err(e),
                };
                // A device that found nobody answering stops the run: the rest would too.
                let gone = matches!(&outcome, Err(ClientError::Unavailable { .. }))
                    && !outcome.as_ref().is_err_and(rate_limited);
                // A poisoned lock means a worker panicked; its counts are lost either way.
                if let Ok(mut guard) = shared.lock() {
                    guard.0.record(&outcome);
                    if gone && guard.1.is_none() {
                        if let Err(e) = &outcome {
                            guard.1 = Some(e.to_string());
                        }
                    }
                }
                if gone {
                    stop.store(true, Ordering::Release);
                }
                done.fetch_add(1, Ordering::Relaxed);
                bar.inc(1);
            }
        }));
    }
    for w in workers {
        w.await
            .map_err(|e| DevicesError::Io(std::io::Error::other(e)))?;
    }
    bar.finish_and_clear();
    let (mut tally, gone) = match Arc::try_unwrap(shared) {
        Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(shared) => shared
            .lock()
            .map(|g| g.clone())
            .unwrap_or_else(|p| p.into_inner().clone()),
    };
    tally.not_sent = (records.len() - done.load(Ordering::Relaxed)) as u64;
    out.write_all(tally.summary().as_bytes())?;
    if let Some(e) = gone {
        return Err(DevicesError::Server(format!(
            "stopped early: {e}; is `serve` running at {base}?"
        )));
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldpsyn::wire::ProblemType;

    /// A row refused by a `reject` attribute is invalid with its line; a bad value of a
    /// `randomize` attribute is replaced (a uniform draw) and the row is sent; `--limit`
    /// stops the read.
    #[test]
    fn csv_rows_are_encoded_or_counted_invalid() {
        let schema: Schema = serde_json::from_value(serde_json::json!({"attributes": [
            {"name": "sex", "type": "categorical", "labels": ["F", "M"],
             "on_invalid": "randomize"},
            {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 4}]}))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.csv");
        std::fs::write(&path, "age,sex\n30,F\n40,X\nold,M\n50,M\n").unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let read = read_csv_records(&path, &schema, None, &mut rng).unwrap();
        assert_eq!((read.rows, read.invalid, read.records.len()), (4, 1, 3));
        assert_eq!(
            read.records.iter().map(|r| r.0).collect::<Vec<_>>(),
            [0, 1, 3]
        );
        assert!(
            read.reasons[0].starts_with("line 4:") && read.reasons[0].contains("age"),
            "{:?}",
            read.reasons
        );
        let first_two = read_csv_records(&path, &schema, Some(2), &mut rng).unwrap();
        assert_eq!((first_two.rows, first_two.invalid), (2, 0));
        std::fs::write(&path, "sex\nF\n").unwrap();
        let e = read_csv_records(&path, &schema, None, &mut rng).unwrap_err();
        assert!(e.to_string().contains("age"), "{e}");
    }

    /// Outcomes are counted by receipt status and by problem type.
    #[test]
    fn the_tally_counts_by_problem_type() {
        let receipt = |status| Receipt {
            collection_id: Uuid::nil(),
            report_id: Uuid::nil(),
            status,
            epsilon_spent: 1.0,
        };
        let mut t = Tally {
            rows: 5,
            ..Tally::default()
        };
        t.record(&Ok(receipt(ReportStatus::Accepted)));
        t.record(&Ok(receipt(ReportStatus::Duplicate)));
        for _ in 0..2 {
            t.record(&Err(ClientError::Problem(Problem::new(
                ProblemType::CollectionTargetReached,
                "full",
            ))));
        }
        t.record(&Err(ClientError::Unavailable {
            attempts: 8,
            last_error: "HTTP 429 Too Many Requests: slow down".into(),
        }));
        assert_eq!((t.accepted, t.duplicate, t.refused_total()), (1, 1, 3));
        assert_eq!(
            t.summary(),
            "rows: 5\naccepted: 1\nduplicate: 1\n\
             refused: 3 (collection-target-reached: 2, unavailable: 1)\ninvalid: 0\n"
        );
        assert!(rate_limited(&ClientError::Unavailable {
            attempts: 8,
            last_error: "HTTP 429 Too Many Requests: slow down".into(),
        }));
    }
}
