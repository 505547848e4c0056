//! `ldpsyn-aggregator demo`: the main job end to end. Starts the aggregator in-process on an
//! embedded SQLite database, creates a collection, simulates N people, each a separate
//! `ldpsyn` client identity with its own budget ledger, talking to the aggregator over real
//! HTTP; then finalizes, downloads synthetic rows over HTTP and writes a fidelity report
//! (mean TVD over all 1- and 2-way marginals and a seeded sample of 3-way ones against the
//! simulated population). With `--vertical` the people's columns are held by parties of a
//! vertical collection under any encoding (`--encoding`), each party uploading its records
//! and, under `fo+locmrf` and `sampled+locmrf`, its local model as `party upload` does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::schema::{AttributeKind, Schema};
use ldpsyn::vertical::{
    DEFAULT_LOCMRF_SHARE, DEFAULT_SKETCH_LOCMRF_SHARE, sampled_party_budget, sketch_party_budget,
    split_party_budget,
};
use ldpsyn::wire::{LocMrfBudget, Party, PartyAttribute, VerticalEncoding};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use uuid::Uuid;

use crate::api_client::{AdminClient, ApiClientError};
use crate::devices::Tally;
use crate::engine::DriftReport;
use crate::eval::{MarginalCounts, NumericFidelity, Regrid, evaluation_schema, numeric_fidelity};
use crate::service::Server;
use crate::service::config::ServeConfig;
use crate::sim::{
    BayesNet, NumericColumn, Population, load_csv, numeric_attributes, read_csv_from,
};

/// 1-D range queries per numeric attribute in the report.
const RANGE_QUERIES: usize = 1000;

/// Synthetic rows whose numeric values the raw-value fidelity reads, a seeded uniform sample
/// when the download has more (those scores keep and sort the values; the binned TVDs count
/// every row).
const NUMERIC_SAMPLE_ROWS: usize = 1_000_000;

/// A uniform sample of at most `cap` rows' numeric values, seeded (reservoir sampling,
/// Vitter's algorithm R): the first `cap` rows, then row `t` replaces a kept one with
/// probability `cap / t`.
struct NumericSample {
    width: usize,
    cap: usize,
    seen: usize,
    /// `cap × width` values, row-major.
    rows: Vec<Option<f64>>,
    rng: rand_chacha::ChaCha12Rng,
}

impl NumericSample {
    fn new(width: usize, cap: usize, seed: u64) -> Self {
        Self {
            width,
            cap,
            seen: 0,
            rows: Vec::new(),
            rng: rand_chacha::ChaCha12Rng::seed_from_u64(seed ^ 0x6e75_6d5f_7361_6d70),
        }
    }

    /// Offers one row's values (`width` of them).
    fn offer(&mut self, values: &[Option<f64>]) {
        self.seen += 1;
        if self.width == 0 {
            return;
        }
        if self.seen <= self.cap {
            self.rows.extend_from_slice(values);
        } else {
            let j = self.rng.random_range(0..self.seen);
            if j < self.cap {
                self.rows[j * self.width..(j + 1) * self.width].copy_from_slice(values);
            }
        }
    }

    /// Column `j`'s kept values (missing ones left out).
    fn column(&self, j: usize) -> Vec<f64> {
        self.rows
            .chunks(self.width.max(1))
            .filter_map(|r| r[j])
            .collect()
    }
}

/// The bytes of a download as they arrive over a channel, as a reader for a blocking
/// thread (end of input once the sender is dropped).
struct Arriving {
    chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl Arriving {
    fn new(chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> Self {
        Self {
            chunks,
            current: bytes::Bytes::new(),
        }
    }
}

impl std::io::Read for Arriving {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// `demo` options.
#[derive(Debug, Clone, Parser)]
pub struct DemoConfig {
    /// CSV file of real records (header row); default: the built-in simulated population.
    #[arg(long, requires = "schema")]
    pub data: Option<PathBuf>,
    /// Schema JSON of `--data`.
    #[arg(long, requires = "data")]
    pub schema: Option<PathBuf>,
    /// Simulated people N (default: the file's kept rows, or 100,000 without `--data`);
    /// more than the file holds resamples rows with replacement (seeded), fewer subsamples.
    #[arg(long)]
    pub users: Option<usize>,
    /// Synthetic rows to download (default: N).
    #[arg(long)]
    pub rows: Option<u64>,
    /// ε of every report.
    #[arg(long, default_value_t = 4.0)]
    pub epsilon: f64,
    /// Protocol: auto, privincr, noincremental, samprivsyn or independence.
    #[arg(long, default_value = "auto")]
    pub protocol: String,
    /// An attribute the data is collected to predict (repeat for several): the collection
    /// declares it as its `target` (device collections).
    #[arg(long)]
    pub target: Vec<String>,
    /// Seed of the population, the simulated devices, the tasks and the synthetic download:
    /// two runs with one seed write the same synthetic file and report figures.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write the synthetic CSV.
    #[arg(long, default_value = "synthetic.csv")]
    pub out: PathBuf,
    /// Where to write the JSON fidelity report (it is printed either way).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Concurrent simulated upload streams (each prepares batches of 1,000 people and posts
    /// them in uploads within the server's published limits).
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Hide progress bars, the loading line and informational logs (warnings, errors and
    /// the report still print; `LDPSYN_LOG` overrides the log level).
    #[arg(long)]
    pub quiet: bool,
    /// Order in which the people of `--data` arrive: `shuffled` (a random order seeded by
    /// `--seed`; a file's row order is rarely an arrival order) or `file` (the rows' order: a
    /// file sorted by date or group then simulates a collection whose population changes
    /// while it runs) or `drift` (a seeded order that drifts smoothly along `--drift-column`:
    /// early people mostly hold its low codes, late ones its high codes,
    /// [`crate::sim::Population::drifted`]).
    #[arg(long, value_enum, default_value = "shuffled")]
    pub arrival: Arrival,
    /// The attribute that `--arrival drift` drifts along (default: the schema's first).
    #[arg(long)]
    pub drift_column: Option<String>,
    /// A vertical collection instead (VertiMRF): a JSON file with its `parties` and optionally
    /// its `encoding`. Either each party lists its attributes by name only (e.g.
    /// `examples/adult/parties-names.json`): the server splits `--epsilon`, the budget per
    /// person over every party, with δ = 1/people (the create request's `budget`); or with
    /// their ε (e.g. `examples/adult/parties.json`): `--epsilon` is ignored. Each party
    /// uploads as `party upload` does: its local model, and its sketch report (`sketch+locmrf`)
    /// or its records randomized under a pseudonymous record id. `--protocol` is ignored.
    #[arg(long)]
    pub vertical: Option<PathBuf>,
    /// Encoding of the `--vertical` collection: `sketch+locmrf`, `fo`, `fo+locmrf` or
    /// `sampled+locmrf` (default: the file's `"encoding"`, else `sampled+locmrf`; a different
    /// one in the file is refused).
    /// When the file gives every attribute's ε but no party a `locmrf` budget and the
    /// encoding needs local models, each party's ε (the sum of its attributes') is split as
    /// `party upload` users split it (`ldpsyn::vertical::sketch_party_budget`,
    /// `split_party_budget` or `sampled_party_budget`, `--locmrf-share` to the local model,
    /// δ = 1/(people × parties)), so every encoding runs at the same ε per party.
    #[arg(long, requires = "vertical", value_parser = parse_encoding)]
    pub encoding: Option<VerticalEncoding>,
    /// Share of a party's ε given to its local model when the budget is split (by the demo or,
    /// for parties named without ε, by the server). Default: 0.5 under `sketch+locmrf`
    /// (`ldpsyn::vertical::DEFAULT_SKETCH_LOCMRF_SHARE`), else 0.2 (`DEFAULT_LOCMRF_SHARE`).
    #[arg(long, requires = "vertical")]
    pub locmrf_share: Option<f64>,
}

/// An encoding by its config name (`fo`, `fo+locmrf`, `sampled+locmrf`, `sketch+locmrf`).
fn parse_encoding(name: &str) -> Result<VerticalEncoding, String> {
    serde_json::from_value(serde_json::Value::from(name)).map_err(|_| {
        format!("`{name}` is not an encoding: fo, fo+locmrf, sampled+locmrf or sketch+locmrf")
    })
}

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Bad options or input files (before anything starts).
    #[error("{0}")]
    Input(String),
    /// The aggregator failed.
    #[error("aggregator: {0}")]
    Service(String),
    /// An HTTP call failed.
    #[error("HTTP: {0}")]
    Http(String),
    /// Writing an output failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Order in which a file's people arrive ([`DemoConfig::arrival`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arrival {
    /// A seeded random order.
    Shuffled,
    /// The file's row order.
    File,
    /// A seeded order drifting along one attribute ([`DemoConfig::drift_column`]).
    Drift,
}

/// Index of the attribute `--arrival drift` drifts along: `name`, or the first attribute.
/// Errors: `name` is not an attribute of `schema`.
pub fn drift_column(schema: &Schema, name: Option<&str>) -> Result<usize, String> {
    let Some(name) = name else { return Ok(0) };
    schema
        .attributes()
        .iter()
        .position(|a| a.name == name)
        .ok_or_else(|| {
            format!("--drift-column {name:?} is not an attribute of the schema; use one of its attribute names")
        })
}

/// The fidelity report (printed and written to `--report`).
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// Simulated people.
    pub users: usize,
    /// Rows of `--data` the schema rejected (skipped).
    pub rows_skipped: usize,
    /// Device collections: ε per person (each person sends one report). Absent for vertical
    /// collections, where `max_party_epsilon` and `composed_epsilon` say what is spent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// Vertical collections: the largest ε one party spends on one person (the
    /// collection's `epsilon` in its config); the whole is `composed_epsilon`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_party_epsilon: Option<f64>,
    /// Protocol.
    pub protocol: String,
    /// Mean TVD over all 1-way marginals, synthetic vs the simulated population (on the
    /// schema's codes, `bins: "auto"` attributes in their working bins:
    /// [`crate::eval::evaluation_schema`]).
    pub tvd1: f64,
    /// Mean TVD over all 2-way marginals.
    pub tvd2: f64,
    /// Mean TVD over 3-way marginals (all, or `eval::MAX_SCORED_SUBSETS` of them drawn by a
    /// fixed seed).
    pub tvd3: f64,
    /// Vertical collections: mean TVD over the 2-way marginals of attributes held by
    /// different parties.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross_party_tvd2: Option<f64>,
    /// Vertical collections: each party's ε per person (its reports' ε plus its local
    /// model's, as the server states it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub party_epsilon: Option<serde_json::Value>,
    /// Vertical collections: the encoding (`fo`, `fo+locmrf`, `sampled+locmrf` or
    /// `sketch+locmrf`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// Vertical collections: each party's budget in its parts, by party name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub party_budgets: Option<std::collections::BTreeMap<String, PartyBudget>>,
    /// Vertical collections: ε spent on one person over every party (the sum of
    /// `party_epsilon`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub composed_epsilon: Option<f64>,
    /// Vertical collections with local models: δ of the composed guarantee.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub composed_delta: Option<f64>,
    /// Raw-value fidelity of every numeric attribute of `--data` (KS, W1/(max − min), 1-D
    /// range queries, the real mode's share), against the file's kept rows; read from a
    /// seeded uniform sample of at most 1,000,000 synthetic rows.
    pub numeric: Vec<NumericFidelity>,
    /// The learned dependency graph, as pairs of attribute names.
    pub edges: Vec<[String; 2]>,
    /// The model's warning when the people of different rounds differed beyond noise (the
    /// population changed while collecting; [`crate::engine::DriftReport`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift_warning: Option<String>,
    /// The fit against its own measurements: squared standardized residuals over their
    /// degrees of freedom (about 1 within noise) and the tables beyond noise
    /// ([`crate::engine::FitResiduals`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit_residual_ratio: Option<f64>,
    /// What the synthetic data can answer (`GET …/model`'s `fitness`): per pair, per
    /// declared target (its neighbours, the share of its entropy the model explains), and
    /// warnings naming the columns.
    pub fitness: serde_json::Value,
    /// Tables the fit disagrees with beyond noise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit_tables_beyond_noise: Option<u64>,
    /// Synthetic rows downloaded.
    pub synthetic_rows: u64,
    /// Reports the aggregator accepted.
    pub reports_accepted: u64,
    /// Wall-clock seconds, total.
    pub seconds_total: f64,
    /// Wall-clock seconds per phase: `load`, `start`, `upload`, `finalize`, `download` (which
    /// includes reading the rows back and counting them as they arrive) and `evaluate` (what
    /// is left after the last byte).
    pub seconds_by_phase: std::collections::BTreeMap<String, f64>,
    /// Peak resident memory of this process (the aggregator runs in it), bytes.
    pub peak_rss_bytes: u64,
}

/// One party's budget per person in a vertical demo, in its parts.
#[derive(Debug, Clone, Serialize)]
pub struct PartyBudget {
    /// Each attribute's GRR ε (party order).
    pub attributes: Vec<PartyAttribute>,
    /// ε of the party's reports about one person: the sum of `attributes`' ε, or under
    /// `sampled+locmrf` one attribute's ([`Party::report_epsilon`]).
    pub report_epsilon: f64,
    /// The local model's central (ε, δ) budget, if the party has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locmrf: Option<LocMrfBudget>,
    /// Noisy marginals in the local model the party uploaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_model_measurements: Option<usize>,
    /// `report_epsilon` plus the local model's ε ([`Party::composed_epsilon`]).
    pub composed_epsilon: f64,
}

/// A `--vertical` file: its parties and the encoding it names, if any.
struct VerticalFile {
    parties: VerticalParties,
    encoding: Option<VerticalEncoding>,
}

/// The parties of a `--vertical` file.
enum VerticalParties {
    /// Attributes with their ε.
    Split(Vec<Party>),
    /// Attributes by name only (`{"name", "attributes": [names]}` as JSON): the server splits
    /// the demo's budget.
    Named(serde_json::Value),
}

/// Reads a `--vertical` file: `{"parties": [...], "encoding": ...}` or the bare list.
fn read_vertical(path: &Path) -> Result<VerticalFile, DemoError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| DemoError::Input(format!("cannot read {}: {e}", path.display())))?;
    let bad = |e: serde_json::Error| DemoError::Input(format!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).map_err(bad)?;
    let encoding = v
        .get("encoding")
        .map(|e| serde_json::from_value(e.clone()).map_err(bad))
        .transpose()?;
    let list = v.get("parties").cloned().unwrap_or(v);
    let named = list.as_array().is_some_and(|ps| {
        ps.iter().all(|p| {
            p["attributes"]
                .as_array()
                .is_some_and(|a| a.iter().all(serde_json::Value::is_string))
        })
    });
    let parties = if named {
        VerticalParties::Named(list)
    } else {
        VerticalParties::Split(serde_json::from_value(list).map_err(bad)?)
    };
    Ok(VerticalFile { parties, encoding })
}

/// The encoding of the vertical demo and its parties: `flag` (`--encoding`) or the file's,
/// else `sketch+locmrf`. Parties named without ε are returned as they are (the server
/// splits the budget). Under an encoding with local models, when no party has a `locmrf`
/// budget, each party's ε (the sum of its attributes') is split between its reports and its
/// local model by the SDK's split for that encoding, `share` (default: the encoding's) to
/// the model with δ = 1/(`people` × parties); otherwise the parties are taken as written
/// (the server checks them).
/// Errors: the flag and the file disagree, an attribute is not in `schema`, or a budget
/// does not split.
fn vertical_parties(
    file: VerticalFile,
    flag: Option<VerticalEncoding>,
    schema: &Schema,
    people: usize,
    share: Option<f64>,
) -> Result<(VerticalEncoding, VerticalParties), DemoError> {
    let encoding = match (flag, file.encoding) {
        (Some(f), Some(g)) if f != g => {
            return Err(DemoError::Input(format!(
                "--encoding {} and the --vertical file's \"encoding\": \"{}\" differ; give one",
                f.name(),
                g.name()
            )));
        }
        (f, g) => f.or(g).unwrap_or_default(),
    };
    let share = share.unwrap_or(if encoding.is_sketch() {
        DEFAULT_SKETCH_LOCMRF_SHARE
    } else {
        DEFAULT_LOCMRF_SHARE
    });
    let mut parties = match file.parties {
        VerticalParties::Split(p) => p,
        named => return Ok((encoding, named)),
    };
    if !encoding.has_local_models() || parties.iter().any(|p| p.locmrf.is_some()) {
        return Ok((encoding, VerticalParties::Split(parties)));
    }
    let delta = 1.0 / (people.max(1) * parties.len().max(1)) as f64;
    let dims = schema.domain_sizes();
    for party in &mut parties {
        let k = party
            .attributes
            .iter()
            .map(|a| {
                schema.index_of(&a.name).map(|i| dims[i]).ok_or_else(|| {
                    DemoError::Input(format!(
                        "party `{}`: attribute `{}` is not in the schema",
                        party.name, a.name
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let total = party.epsilon();
        let split = if encoding.is_sketch() {
            sketch_party_budget(total, delta, k.len(), share)
        } else if encoding.is_sampled() {
            sampled_party_budget(total, delta, k.len(), share)
        } else {
            split_party_budget(total, delta, &k, share)
        };
        let (reports, model) = split.map_err(|e| {
            DemoError::Input(format!(
                "party `{}` (ε {total}) under {}: {e}",
                party.name,
                encoding.name()
            ))
        })?;
        for (a, e) in party.attributes.iter_mut().zip(reports) {
            a.epsilon = e;
        }
        party.locmrf = Some(model);
    }
    Ok((encoding, VerticalParties::Split(parties)))
}

struct Input {
    schema: Schema,
    people: People,
    rows_skipped: usize,
    /// Raw values of the file's numeric attributes (kept rows).
    numeric: Vec<NumericColumn>,
}

/// The simulated people: distinct records and the order they arrive in, row indices with
/// repeats where the file is resampled to more people. Holding the order (4 bytes a person)
/// instead of every person's codes keeps a run of ten million people small.
struct People {
    records: Population,
    /// `None`: the records in their own order.
    order: Option<Vec<u32>>,
}

impl People {
    fn len(&self) -> usize {
        self.order.as_ref().map_or(self.records.len(), Vec::len)
    }

    /// Person `i`'s codes (panics if `i ≥ len`).
    fn row(&self, i: usize) -> &[u32] {
        match &self.order {
            None => self.records.row(i),
            Some(order) => self.records.row(order[i] as usize),
        }
    }

    /// How many people hold each record (indexed as `records`).
    fn multiplicities(&self) -> Vec<u64> {
        match &self.order {
            None => vec![1; self.records.len()],
            Some(order) => {
                let mut m = vec![0; self.records.len()];
                order.iter().for_each(|&i| m[i as usize] += 1);
                m
            }
        }
    }
}

fn load_input(cfg: &DemoConfig) -> Result<Input, DemoError> {
    match (&cfg.data, &cfg.schema) {
        (Some(data), Some(schema_path)) => {
            let text = std::fs::read_to_string(schema_path).map_err(|e| {
                DemoError::Input(format!("cannot read schema {}: {e}", schema_path.display()))
            })?;
            let schema: Schema = serde_json::from_str(&text).map_err(|e| {
                DemoError::Input(format!("invalid schema {}: {e}", schema_path.display()))
            })?;
            let loaded = load_csv(data, &schema)
                .map_err(|e| DemoError::Input(format!("cannot load {}: {e}", data.display())))?;
            if !cfg.quiet {
                eprintln!(
                    "loaded {}: kept {} of {} rows ({} rejected by the schema)",
                    data.display(),
                    loaded.population.len(),
                    loaded.total_rows,
                    loaded.rejected_rows
                );
            }
            let records = loaded.population;
            if records.is_empty() {
                return Err(DemoError::Input("the schema rejected every row".into()));
            }
            if u32::try_from(records.len()).is_err() {
                return Err(DemoError::Input(
                    "the file holds 2³² rows or more; the demo takes fewer".into(),
                ));
            }
            let n = cfg.users.unwrap_or(records.len());
            let order = if n == records.len() {
                match cfg.arrival {
                    Arrival::Shuffled => Some(records.shuffled_order(cfg.seed)),
                    Arrival::File => None,
                    Arrival::Drift => {
                        let column = drift_column(&schema, cfg.drift_column.as_deref())
                            .map_err(DemoError::Input)?;
                        Some(records.drifted_order(column, cfg.seed))
                    }
                }
            } else if n > records.len() {
                Some(records.resample_order(n, cfg.seed))
            } else {
                let mut order = records.shuffled_order(cfg.seed);
                order.truncate(n);
                Some(order)
            };
            Ok(Input {
                schema,
                people: People { records, order },
                rows_skipped: loaded.rejected_rows,
                numeric: loaded.numeric,
            })
        }
        (None, None) => {
            let net = BayesNet::standard();
            let n = cfg.users.unwrap_or(100_000);
            Ok(Input {
                schema: net.schema(),
                people: People {
                    records: net.sample(n, cfg.seed),
                    order: None,
                },
                rows_skipped: 0,
                numeric: Vec::new(),
            })
        }
        _ => Err(DemoError::Input("--data and --schema go together".into())),
    }
}

fn progress(len: u64, what: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
            // The template is a constant known to parse.
            .expect("valid progress template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    bar
}

/// Peak resident set size of this process, bytes (`VmHWM`; 0 where /proc is unavailable).
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// People per task fetch and upload of one demo stream.
const CHUNK: usize = 1000;

/// Who takes a task next in the demo ([`run`], step 3).
struct Schedule {
    /// First person (arrival order) without a task.
    next: usize,
    /// People handed a task so far.
    issued: u64,
    /// Tasks of the open round still to hand out before its quota closes it (`None`: no
    /// quota; the round closes when the operator says).
    round_left: Option<u64>,
}

/// Reports the open round of `collection` still takes before its quota closes it (`None`
/// without a quota, or when the quota is reached but the round stayed open). A round closes
/// off the server's committer, after the upload that reached its quota is answered: while
/// the quota is reached this polls (up to [`CLOSE_WAIT`]) for the close to land, so that the
/// next people draw the next round's tasks.
async fn round_left(api: &AdminClient, collection: Uuid) -> Result<Option<u64>, DemoError> {
    let start = Instant::now();
    loop {
        let view = api
            .collection(&collection.to_string())
            .await
            .map_err(|e| DemoError::Service(e.to_string()))?;
        let status = &view["status"];
        let left = status["round_quota"]
            .as_u64()
            .map(|q| q.saturating_sub(status["round_accepted"].as_u64().unwrap_or(0)));
        match left {
            Some(0) if start.elapsed() < CLOSE_WAIT => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            _ => return Ok(left.filter(|&l| l > 0)),
        }
    }
}

/// How long [`round_left`] waits for a reached round to close.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Seed of the randomness of the demo's chunk of people starting at `first` (SplitMix64
/// finalizer of the pair: distinct chunks and distinct `--seed`s get unrelated streams).
fn chunk_seed(seed: u64, first: usize) -> u64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    mix(mix(seed).wrapping_add(first as u64))
}

/// Runs the demo. Errors: bad input (before the aggregator starts), aggregator or HTTP
/// failures, unwritable outputs.
pub async fn run(cfg: DemoConfig) -> Result<DemoReport, DemoError> {
    let started = Instant::now();
    let mut phases = std::collections::BTreeMap::new();
    let epsilon = Epsilon::new(cfg.epsilon).map_err(|e| DemoError::Input(e.to_string()))?;
    let vertical = cfg.vertical.as_deref().map(read_vertical).transpose()?;
    let input = load_input(&cfg)?;
    let n = input.people.len();
    let d = input.schema.attributes().len();
    let parties = vertical
        .map(|file| vertical_parties(file, cfg.encoding, &input.schema, n, cfg.locmrf_share))
        .transpose()?;
    phases.insert("load".to_owned(), started.elapsed().as_secs_f64());

    // 1. The aggregator, in-process, on SQLite in a temporary folder.
    let t = Instant::now();
    let dir = tempfile::tempdir()?;
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let admin: String = (0..32)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect();
    let db = format!("sqlite://{}", dir.path().join("demo.db").display());
    let serve = ServeConfig::try_parse_from([
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--database-url",
        &db,
        "--admin-token",
        &admin,
        "--rate-limit-per-ip",
        "0",
        // One client (this process) plays every device.
        "--max-in-flight-per-ip",
        "0",
        "--max-synthetic-rows",
        &u64::MAX.to_string(),
    ])
    .map_err(|e| DemoError::Service(e.to_string()))?;
    // Tasks in the order the people ask for them, seeded: a run reproduces (step 3).
    let serve = ServeConfig {
        task_seed: Some(cfg.seed),
        ..serve
    };
    let server = Server::start(serve)
        .await
        .map_err(|e| DemoError::Service(e.to_string()))?;
    let base = format!("http://{}", server.addr());
    let api = AdminClient::new(&base, &admin);

    // 2. The collection.
    let create = match &parties {
        Some((encoding, VerticalParties::Split(parties))) => serde_json::json!({
            "schema": input.schema, "protocol": "vertical", "parties": parties,
            "encoding": encoding.name(), "target_users": n,
        }),
        // δ is the server's default, 1/target_users.
        Some((encoding, VerticalParties::Named(parties))) => serde_json::json!({
            "schema": input.schema, "protocol": "vertical", "parties": parties,
            "encoding": encoding.name(), "target_users": n,
            "budget": {"epsilon": cfg.epsilon, "locmrf_share": cfg.locmrf_share},
        }),
        // Finalized by hand below, so that the report times the finalize as its own phase.
        None => serde_json::json!({
            "schema": input.schema, "protocol": cfg.protocol, "epsilon": cfg.epsilon,
            "target_users": n, "auto_finalize_at_target": false,
        }),
    };
    let mut create = create;
    if !cfg.target.is_empty() {
        create["target"] = serde_json::json!(cfg.target);
    }
    let created = api
        .create(&create)
        .await
        .map_err(|e| DemoError::Input(format!("collection refused: {e}")))?;
    let collection: Uuid = created["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| DemoError::Http("create answered no id".into()))?;
    phases.insert("start".to_owned(), t.elapsed().as_secs_f64());

    // 3. N people, each with their own client identity (report ids and randomness drawn per
    // chunk of people from a seed of the chunk's) and their own ledger, over real HTTP. The
    // people take their tasks in arrival order, chunk by chunk, in chunks that never cross
    // the open round's quota, and the server draws tasks from a stream seeded by `--seed`:
    // every person lands in the same round with the same task on every run, while the
    // uploads stay concurrent.
    let t = Instant::now();
    let people = Arc::new(input.people);
    let bar = progress(n as u64, "upload", cfg.quiet);
    let accepted = Arc::new(AtomicU64::new(0));
    // Every person's outcome, counted as `devices` counts its rows.
    let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
    let streams = if parties.is_some() {
        0
    } else {
        cfg.streams.clamp(1, 64)
    };
    let mut local_models = std::collections::BTreeMap::new();
    if parties.is_some() {
        let (uploaded, models) =
            upload_parties(&base, collection, &created, &people, cfg.seed, &bar).await?;
        accepted.fetch_add(uploaded, Ordering::Relaxed);
        local_models = models;
    }
    let schedule = Arc::new(tokio::sync::Mutex::new(Schedule {
        next: 0,
        issued: 0,
        round_left: round_left(&api, collection).await?,
    }));
    let answered = Arc::new(AtomicU64::new(0));
    let aborted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..streams {
        let (people, bar, accepted, base, api) = (
            people.clone(),
            bar.clone(),
            accepted.clone(),
            base.clone(),
            api.clone(),
        );
        let (schedule, answered, aborted) = (schedule.clone(), answered.clone(), aborted.clone());
        let tally = tally.clone();
        let schema = input.schema.clone();
        let mut options = ClientOptions::insecure_simulation(epsilon, cfg.seed);
        // Every simulated person has a fresh ledger and joins this one collection: no
        // device-wide cap (the default one would refuse a demo at ε above it).
        options.device_budget = None;
        let seed = cfg.seed;
        workers.push(tokio::spawn(async move {
            let work = async {
                let mut client =
                    Client::connect(&base, collection, options, MemoryLedger::default())
                        .await
                        .map_err(|e| DemoError::Http(e.to_string()))?;
                loop {
                    let mut turn = schedule.lock().await;
                    if turn.next >= people.len() {
                        return Ok::<(), DemoError>(());
                    }
                    if turn.round_left == Some(0) {
                        // The round closes once its last report is committed: once every
                        // handed-out report is answered and the close has landed
                        // (`round_left` waits for it), the next round is open.
                        while answered.load(Ordering::Acquire) < turn.issued {
                            if aborted.load(Ordering::Acquire) {
                                return Err(DemoError::Http("another upload stream failed".into()));
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                        }
                        turn.round_left = round_left(&api, collection).await?;
                    }
                    let size = CHUNK
                        .min(people.len() - turn.next)
                        .min(turn.round_left.map_or(usize::MAX, |l| l as usize));
                    let first = turn.next;
                    turn.next += size;
                    turn.issued += size as u64;
                    if let Some(left) = &mut turn.round_left {
                        *left -= size as u64;
                    }
                    let mut chunk: Vec<SimulatedPerson<MemoryLedger>> = (first..first + size)
                        .map(|i| {
                            Ok(SimulatedPerson {
                                record: schema
                                    .encoded(people.row(i).to_vec())
                                    .map_err(|e| DemoError::Input(e.to_string()))?,
                                ledger: MemoryLedger::default(),
                            })
                        })
                        .collect::<Result<_, DemoError>>()?;
                    client.reseed(chunk_seed(seed, first));
                    let prepared = client
                        .prepare_batch(&mut chunk)
                        .await
                        .map_err(|e| DemoError::Http(e.to_string()))?;
                    drop(turn);
                    let results = client
                        .send_batch(&mut chunk, prepared)
                        .await
                        .map_err(|e| DemoError::Http(e.to_string()))?;
                    let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
                    // A poisoned lock means another stream panicked; the run fails anyway.
                    if let Ok(mut t) = tally.lock() {
                        results.iter().for_each(|r| t.record(r));
                    }
                    accepted.fetch_add(ok, Ordering::Relaxed);
                    answered.fetch_add(size as u64, Ordering::Release);
                    bar.inc(size as u64);
                }
            };
            let result = work.await;
            if result.is_err() {
                aborted.store(true, Ordering::Release);
            }
            result
        }));
    }
    for w in workers {
        w.await.map_err(|e| DemoError::Service(e.to_string()))??;
    }
    bar.finish();
    phases.insert("upload".to_owned(), t.elapsed().as_secs_f64());
    if let Ok(mut t) = tally.lock()
        && t.refused_total() + t.invalid > 0
    {
        t.rows = n as u64;
        eprintln!("warning: simulated reports not accepted:\n{}", t.summary());
    }

    // 4. Finalize, then the model once built: a fit that outlasts the server's wait answers
    // 202 and the model route says `model-not-ready` until it is built.
    let t = Instant::now();
    let spinner = progress(1, "finalize", cfg.quiet);
    let service = |e: ApiClientError| DemoError::Service(e.to_string());
    // Built or not yet, the model route answers with the fitness report as well.
    api.finalize(&collection.to_string())
        .await
        .map_err(service)?;
    let (_, finalized) = api
        .wait_for_model(&collection.to_string())
        .await
        .map_err(service)?;
    spinner.finish();
    phases.insert("finalize".to_owned(), t.elapsed().as_secs_f64());
    let names: Vec<String> = input
        .schema
        .attributes()
        .iter()
        .map(|a| a.name.clone())
        .collect();
    let edges = model_edges(&finalized, &names);
    // The fitness report, as an analyst sees it at `GET …/model`.
    let fitness = finalized["fitness"].clone();
    if !cfg.quiet {
        for w in fitness["warnings"].as_array().into_iter().flatten() {
            eprintln!("warning: {}", w["message"].as_str().unwrap_or_default());
        }
    }
    let drift_warning = serde_json::from_value::<DriftReport>(finalized["model"]["drift"].clone())
        .ok()
        .and_then(|d| d.warning(|a| names.get(a).cloned().unwrap_or_else(|| a.to_string())));
    if let Some(w) = &drift_warning {
        eprintln!("warning: {w}");
    }

    // 5. The synthetic table over HTTP into `--out`, its rows read back through the schema
    // as they arrive (on a thread of their own) and, with the people (by their records'
    // multiplicities), counted into the scored marginals: memory does not grow with rows.
    let t = Instant::now();
    let rows = cfg.rows.unwrap_or(n as u64);
    let mut resp = api
        .synthetic(
            &collection.to_string(),
            &[
                ("rows", rows.to_string()),
                ("seed", cfg.seed.to_string()),
                ("format", "csv".into()),
            ],
        )
        .await
        .map_err(service)?;
    // Binned TVDs on the working bins of `bins: "auto"` attributes (their fine grids would
    // make every 3-way table huge and sparse), comparable with a fixed-count schema.
    let grid = evaluation_schema(&input.schema);
    let bad = |e: ldpsyn::schema::RecordError| DemoError::Service(e.to_string());
    let to_grid = Arc::new(Regrid::new(&input.schema, &grid).map_err(bad)?);
    let dims = grid.domain_sizes();
    let scored = || {
        (1..=d.min(3))
            .map(|k| MarginalCounts::scoring(&dims, k))
            .collect::<Vec<_>>()
    };
    let numeric_attrs: Vec<usize> = numeric_attributes(&input.schema).collect();
    let (chunks, arriving) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let counting = {
        let (schema, to_grid, mut synth) = (input.schema.clone(), to_grid.clone(), scored());
        let mut sample = NumericSample::new(numeric_attrs.len(), NUMERIC_SAMPLE_ROWS, cfg.seed);
        tokio::task::spawn_blocking(move || {
            let mut binned: Vec<u32> = Vec::new();
            let read = read_csv_from(Arriving::new(arriving), &schema, |row, values| {
                binned.clear();
                binned.extend(to_grid.row(row));
                synth.iter_mut().for_each(|c| c.add(&binned));
                sample.offer(values);
            });
            (read, synth, sample)
        })
    };
    let bar = progress(rows, "download", cfg.quiet);
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(&cfg.out)
            .map_err(|e| DemoError::Input(format!("cannot write {}: {e}", cfg.out.display())))?,
    );
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| DemoError::Http(e.to_string()))?
    {
        use std::io::Write as _;
        file.write_all(&chunk)?;
        // Line breaks only approximate rows for the bar (a quoted label may hold one); the
        // row count checked below is the CSV reader's.
        bar.inc(chunk.iter().filter(|&&b| b == b'\n').count() as u64);
        // A closed channel means the reader stopped on an error, reported below.
        let _ = chunks.send(chunk).await;
    }
    drop(chunks);
    std::io::Write::flush(&mut file)?;
    drop(file);
    bar.finish();
    phases.insert("download".to_owned(), t.elapsed().as_secs_f64());

    let t = Instant::now();
    let mut real = scored();
    let mut binned: Vec<u32> = Vec::with_capacity(d);
    for (i, m) in people.multiplicities().into_iter().enumerate() {
        if m > 0 {
            binned.clear();
            binned.extend(to_grid.row(people.records.row(i)));
            real.iter_mut().for_each(|c| c.add_weighted(&binned, m));
        }
    }
    let (read, synth, sample) = counting
        .await
        .map_err(|e| DemoError::Service(e.to_string()))?;
    let read = read.map_err(|e| DemoError::Service(format!("synthetic CSV unreadable: {e}")))?;
    let kept = (read.total_rows - read.rejected_rows) as u64;
    if read.rejected_rows > 0 || kept != rows {
        return Err(DemoError::Service(format!(
            "synthetic CSV has {kept} valid rows and {} invalid, {rows} asked",
            read.rejected_rows
        )));
    }
    let mut tvd = [0.0; 3];
    for (slot, (r, s)) in tvd.iter_mut().zip(real.iter().zip(&synth)) {
        *slot = r
            .mean_tvd(s)
            .map_err(|e| DemoError::Service(e.to_string()))?;
    }
    let cross_party_tvd2 = match &created["parties"] {
        serde_json::Value::Array(list) if d >= 2 => {
            let mut owner = vec![usize::MAX; d];
            for (p, party) in list.iter().enumerate() {
                for a in party["attributes"].as_array().into_iter().flatten() {
                    if let Some(i) = names
                        .iter()
                        .position(|n| Some(n.as_str()) == a["name"].as_str())
                    {
                        owner[i] = p;
                    }
                }
            }
            // The 2-way scoring counters hold every pair.
            real[1]
                .mean_tvd_where(&synth[1], |s| owner[s[0]] != owner[s[1]])
                .ok()
        }
        _ => None,
    };
    let mut numeric = Vec::new();
    for real in &input.numeric {
        let attr = &input.schema.attributes()[real.attribute];
        let AttributeKind::Numeric { min, max, .. } = attr.kind else {
            continue;
        };
        let Some(j) = numeric_attrs.iter().position(|&a| a == real.attribute) else {
            continue;
        };
        numeric.push(
            numeric_fidelity(
                &attr.name,
                &real.values,
                &sample.column(j),
                (min, max),
                RANGE_QUERIES,
                cfg.seed,
            )
            .map_err(|e| DemoError::Service(e.to_string()))?,
        );
    }
    phases.insert("evaluate".to_owned(), t.elapsed().as_secs_f64());

    let reports_accepted = accepted.load(Ordering::Relaxed);
    server
        .shutdown()
        .await
        .map_err(|e| DemoError::Service(e.to_string()))?;
    let report = DemoReport {
        users: n,
        rows_skipped: input.rows_skipped,
        epsilon: parties
            .is_none()
            .then(|| created["epsilon"].as_f64().unwrap_or(cfg.epsilon)),
        max_party_epsilon: parties.as_ref().and_then(|_| created["epsilon"].as_f64()),
        protocol: created["protocol"]
            .as_str()
            .unwrap_or(&cfg.protocol)
            .to_owned(),
        tvd1: tvd[0],
        tvd2: tvd[1],
        tvd3: tvd[2],
        cross_party_tvd2,
        party_epsilon: created.get("party_epsilon").cloned(),
        encoding: parties.as_ref().map(|_| {
            created["encoding"]
                .as_str()
                .unwrap_or(VerticalEncoding::Fo.name())
                .to_owned()
        }),
        party_budgets: party_budgets(&created, &local_models)?,
        composed_epsilon: created["composed_epsilon"].as_f64(),
        composed_delta: created["composed_delta"].as_f64(),
        numeric,
        edges,
        drift_warning,
        fitness,
        fit_residual_ratio: finalized["model"]["residuals"]["mean_ratio"].as_f64(),
        fit_tables_beyond_noise: finalized["model"]["residuals"]["beyond_noise"].as_u64(),
        synthetic_rows: rows,
        reports_accepted,
        seconds_total: started.elapsed().as_secs_f64(),
        seconds_by_phase: phases,
        peak_rss_bytes: peak_rss_bytes(),
    };
    if let Some(path) = &cfg.report {
        write_json(path, &report)?;
    }
    Ok(report)
}

/// Each party's budget in parts, from the collection the server created (`None` for a
/// device collection), with the measurements of the local model it uploaded.
fn party_budgets(
    created: &serde_json::Value,
    local_models: &std::collections::BTreeMap<String, usize>,
) -> Result<Option<std::collections::BTreeMap<String, PartyBudget>>, DemoError> {
    if created["protocol"] != "vertical" {
        return Ok(None);
    }
    let parties: Vec<Party> = serde_json::from_value(created["parties"].clone())
        .map_err(|e| DemoError::Service(format!("create answered unreadable parties: {e}")))?;
    let encoding: VerticalEncoding = match created.get("encoding") {
        Some(e) => serde_json::from_value(e.clone())
            .map_err(|e| DemoError::Service(format!("create answered an unknown encoding: {e}")))?,
        None => VerticalEncoding::Fo,
    };
    Ok(Some(
        parties
            .into_iter()
            .map(|p| {
                let budget = PartyBudget {
                    report_epsilon: p.report_epsilon(encoding),
                    composed_epsilon: p.composed_epsilon(encoding),
                    locmrf: p.locmrf,
                    local_model_measurements: local_models.get(&p.name).copied(),
                    attributes: p.attributes,
                };
                (p.name, budget)
            })
            .collect(),
    ))
}

/// The vertical demo's parties: each connects with its token from the create answer,
/// randomizes its columns of every person (one GRR per attribute, or under `sampled+locmrf`
/// one attribute drawn per record; seeded, as a simulation) and uploads them under record
/// ids derived with a key the aggregator never sees; a party with a `locmrf` budget then
/// measures its local model on its columns and uploads it, as `party upload` does (seeded
/// too); under `sketch+locmrf` a party uploads no record but its model and its sketch report
/// (seeded, under a sketch key derived as `party upload` derives it). Returns the records
/// accepted and each local model's measurement count.
async fn upload_parties(
    base: &str,
    collection: Uuid,
    created: &serde_json::Value,
    people: &People,
    seed: u64,
    bar: &ProgressBar,
) -> Result<(u64, std::collections::BTreeMap<String, usize>), DemoError> {
    use ldpsyn::vertical::{PartyClient, RecordIdKey};
    // The parties' shared secret. Seeded so that one seed reproduces the run (the record ids
    // and the sketches' hash functions follow from it); real parties use a random one.
    let mut key = vec![0u8; 32];
    rand_chacha::ChaCha12Rng::seed_from_u64(seed ^ PARTY_SECRET_STREAM).fill(&mut key[..]);
    // `sketch+locmrf`: the parties' sketch key, derived from the secret as `party upload`
    // does, but bound to the run rather than to the collection id, which the server draws
    // afresh on every run.
    let sketch_key = ldpsyn_engine::measure::sketch::SketchKey::derive(&key, b"ldpsyn demo")
        .map_err(|e| DemoError::Input(e.to_string()))?;
    let key = RecordIdKey::new(key).map_err(|e| DemoError::Input(e.to_string()))?;
    let tokens = created["party_tokens"]
        .as_object()
        .ok_or_else(|| DemoError::Service("create answered no party tokens".into()))?;
    bar.set_length((people.len() * tokens.len()) as u64);
    let mut accepted = 0;
    let mut models = std::collections::BTreeMap::new();
    for (p, (party, token)) in tokens.iter().enumerate() {
        let token = token.as_str().unwrap_or_default();
        let options = ClientOptions::new(
            Epsilon::new(ldpsyn::MAX_EPSILON).map_err(|e| DemoError::Input(e.to_string()))?,
        );
        let client = PartyClient::connect(base, collection, party, token, options)
            .await
            .map_err(|e| DemoError::Http(e.to_string()))?;
        // Not private: seeded so the demo reproduces (a real party uses an OS-seeded RNG).
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(
            seed.wrapping_mul(7_919).wrapping_add(p as u64),
        );
        let attrs = client.randomizer().attributes().to_vec();
        let sketched = client.randomizer().encoding().is_sketch();
        let ids: Vec<usize> = (0..people.len()).collect();
        // Under `sketch+locmrf` no party uploads records.
        for chunk in ids.chunks(5_000).filter(|_| !sketched) {
            let records = chunk
                .iter()
                .map(|&i| {
                    let row = people.row(i);
                    let codes: Vec<u32> = attrs.iter().map(|&a| row[a]).collect();
                    client
                        .randomizer()
                        .record_from_codes(key.record_id(&format!("person-{i}")), &codes, &mut rng)
                        .map_err(|e| DemoError::Input(e.to_string()))
                })
                .collect::<Result<Vec<_>, DemoError>>()?;
            let r = client
                .upload(&records)
                .await
                .map_err(|e| DemoError::Http(e.to_string()))?;
            accepted += r.accepted;
            bar.inc(chunk.len() as u64);
        }
        if client.randomizer().party().locmrf.is_some() {
            let codes: Vec<u32> = (0..people.len())
                .flat_map(|i| {
                    let row = people.row(i);
                    attrs.iter().map(move |&a| row[a])
                })
                .collect();
            // Its own stream: the model's noise is independent of the reports'.
            let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(
                seed.wrapping_mul(7_919).wrapping_add(p as u64) ^ LOCAL_MODEL_STREAM,
            );
            let model = crate::party::local_model_of_codes(
                client.randomizer(),
                &codes,
                crate::party::DEFAULT_MAX_MARGINAL as usize,
                &mut rng,
            )
            .map_err(|e| DemoError::Input(format!("party `{party}`: {e}")))?;
            let body = serde_json::to_vec(&model).map_err(|e| DemoError::Input(e.to_string()))?;
            crate::party::upload_once(base, collection, party, token, "local model", "model", body)
                .await
                .map_err(|e| DemoError::Http(format!("party `{party}`: {e}")))?;
            models.insert(party.clone(), model.measurements().len());
            if sketched {
                let person_ids: Vec<String> = ids.iter().map(|i| format!("person-{i}")).collect();
                let report = crate::party::sketch_report_of_codes(
                    client.randomizer(),
                    &sketch_key,
                    &person_ids,
                    &codes,
                    &mut rng,
                )
                .map_err(|e| DemoError::Input(format!("party `{party}`: {e}")))?;
                let body =
                    serde_json::to_vec(&report).map_err(|e| DemoError::Input(e.to_string()))?;
                crate::party::upload_once(
                    base,
                    collection,
                    party,
                    token,
                    "sketch report",
                    "sketch",
                    body,
                )
                .await
                .map_err(|e| DemoError::Http(format!("party `{party}`: {e}")))?;
                bar.inc(people.len() as u64);
            }
        }
    }
    Ok((accepted, models))
}

/// Mixed into the seed for the parties' shared secret.
const PARTY_SECRET_STREAM: u64 = 0x5ec2_e7c0_11ec_7104;

/// Mixed into a party's seed for its local model's randomness.
const LOCAL_MODEL_STREAM: u64 = 0x4C6F_634D_5246_0001;

fn write_json(path: &Path, report: &DemoReport) -> Result<(), DemoError> {
    let text = serde_json::to_string_pretty(report)
        .map_err(|e| DemoError::Io(std::io::Error::other(e)))?;
    std::fs::write(path, text + "\n")
        .map_err(|e| DemoError::Input(format!("cannot write {}: {e}", path.display())))?;
    Ok(())
}

/// The graph edges of a `finalize` answer, by attribute name.
fn model_edges(finalized: &serde_json::Value, names: &[String]) -> Vec<[String; 2]> {
    // Graphical models carry `structure.edges` ([a, b] pairs); SamPrivSyn and independence
    // learn no graph.
    let list = finalized["model"]["structure"]["edges"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    list.iter()
        .filter_map(|e| {
            let (a, b) = match e {
                serde_json::Value::Array(v) if v.len() == 2 => (v[0].as_u64()?, v[1].as_u64()?),
                _ => return None,
            };
            Some([
                names.get(a as usize)?.clone(),
                names.get(b as usize)?.clone(),
            ])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::{InferConfig, infer_schema};

    /// Under its cap the sample keeps every row in order; over it, a uniform sample of the
    /// rows of the given size (the mean kept row index near the middle), the same for a seed.
    #[test]
    fn numeric_sample_is_uniform_over_rows() {
        let mut small = NumericSample::new(2, 10, 1);
        for i in 0..5 {
            small.offer(&[Some(f64::from(i)), None]);
        }
        assert_eq!(small.column(0), vec![0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!(small.column(1).is_empty());
        let draw = |seed| {
            let mut s = NumericSample::new(1, 1_000, seed);
            (0..100_000).for_each(|i| s.offer(&[Some(f64::from(i))]));
            s.column(0)
        };
        let kept = draw(2);
        assert_eq!(kept.len(), 1_000);
        let mean = kept.iter().sum::<f64>() / 1_000.0;
        // Mean of 1,000 uniform draws from 0..100,000: sd ≈ 913.
        assert!((mean - 50_000.0).abs() < 4_000.0, "{mean}");
        assert!(kept.iter().filter(|&&x| x >= 50_000.0).count() > 400);
        assert_eq!(kept, draw(2));
    }

    /// People held as records and an order give the resampled rows, and the records'
    /// multiplicities count every person once.
    #[test]
    fn people_in_order_are_the_resampled_population() {
        let records =
            Population::from_rows(vec![4, 3], (0..20u32).map(|i| vec![i % 4, i % 3])).unwrap();
        let people = People {
            order: Some(records.resample_order(500, 3)),
            records: records.clone(),
        };
        let resampled = records.resample(500, 3);
        assert_eq!(people.len(), 500);
        assert!((0..500).all(|i| people.row(i) == resampled.row(i)));
        assert_eq!(people.multiplicities().iter().sum::<u64>(), 500);
    }

    /// A spreadsheet export as users bring them (a byte-order mark, CRLF line ends, quoted
    /// labels with a comma and a line break, a column with one value): `schema infer`
    /// proposes a schema, and the demo runs it end to end over HTTP and reads back every
    /// synthetic row (a label's line break is inside a row, not between rows).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn demo_runs_an_exported_csv_with_quoted_line_breaks() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("export.csv");
        let mut text = String::from("\u{feff}city,source,note,visits\r\n");
        for i in 0..400u32 {
            let city = ["\"New York, NY\"", "Köln", "東京"][i as usize % 3];
            let note = ["\"two\r\nlines\"", "ok", ""][i as usize % 3 / 2 + i as usize % 2];
            text.push_str(&format!("{city},web,{note},{}\r\n", i % 7 * 3));
        }
        std::fs::write(&data, text).unwrap();
        let infer = InferConfig::try_parse_from(["infer", "--data", "x"]).unwrap();
        let (schema, warnings) = infer_schema(&data, &infer).unwrap();
        assert!(
            warnings.iter().any(|w| w.contains("`source`")),
            "{warnings:?}"
        );
        let schema_path = dir.path().join("schema.json");
        std::fs::write(&schema_path, serde_json::to_string(&schema).unwrap()).unwrap();
        let mut cfg = DemoConfig::try_parse_from(["demo", "--quiet"]).unwrap();
        cfg.data = Some(data);
        cfg.schema = Some(schema_path);
        cfg.users = Some(2_000);
        cfg.out = dir.path().join("synthetic.csv");
        let report = run(cfg).await.unwrap();
        assert_eq!((report.synthetic_rows, report.rows_skipped), (2_000, 0));
        let synthetic = std::fs::read_to_string(dir.path().join("synthetic.csv")).unwrap();
        assert!(
            synthetic.contains("\"two\r\nlines\""),
            "no quoted line break written"
        );
    }
}
