//! `ldpsyn-aggregator party …`: a data party of a vertical collection (VertiMRF).
//!
//! - `keygen --out FILE`: a new 32-byte record-id key (hex), to share with the other
//!   parties and never with the aggregator.
//! - `upload`: reads the party's CSV, derives each row's record id from its customer id
//!   (HMAC-SHA256 under the key), randomizes the party's attributes (one GRR per attribute at
//!   its ε, OS-seeded CSPRNG; under encoding `sampled+locmrf` one attribute per row, drawn
//!   with the same CSPRNG, and its index), writes the randomized records to a **journal** (fsync'd,
//!   renamed into place) and only then uploads them in batches with a progress bar. A rerun
//!   with an existing journal resends the journal's records byte for byte (the server counts
//!   them as duplicates) instead of randomizing again: re-randomizing would let the noise be
//!   averaged away, and the server refuses other codes for a record id it holds. A row with
//!   a value the schema refuses (e.g. missing under `"missing": "reject"`) is not uploaded,
//!   as a device would not report it, and counted in a warning; an attribute with
//!   `"on_invalid": "randomize"` reports a uniform code instead.
//!
//!
//! Under encoding `fo+locmrf` (and `sampled+locmrf`, where every party has one), a party
//! with a `locmrf` budget also measures its **local
//! model** (LocMRF, VertiMRF §4.1; [`crate::engine::measure::local_model`]): noisy marginals
//! of its own attributes under central (ε, δ)-DP, its attribute graph and its accounting,
//! measured on this machine from the CSV's encoded values (OS-seeded CSPRNG), written to
//! `<data>.<party>.model.json` (fsync'd, renamed into place) and uploaded after the records.
//! A rerun resends the written model instead of measuring again (a second measurement would
//! spend the budget twice; the server refuses a different second model). The upload type is
//! the engine's [`LocalModel`]: no record, code or record id can be put in it.
//!
//! Under encoding `sketch+locmrf` (VertiMRF as published) a party uploads no record: it
//! measures its local model as above and makes its **sketch report** (VertiMRF Algorithm 3
//! with n̂; [`crate::engine::measure::sketch::encode_party`]): per value of each of its
//! attributes, in the collection's sketch bins, `t` DP Flajolet–Martin sketches of the set of
//! its people's customer ids, hashed under a sketch key derived from the key file and the
//! collection id (so the parties, sharing the file, share the key; the aggregator never sees
//! it), and a noisy count. It is written to `<data>.<party>.sketch.json` (fsync'd, renamed into
//! place) and uploaded after the model; a rerun resends it, as the model.
//!
//! The upload token comes from `LDPSYN_PARTY_TOKEN` (never a flag: it would show in the
//! process list).

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use ldpsyn::Epsilon;
use ldpsyn::client::{ClientError, ClientOptions};
use ldpsyn::ledger::DEFAULT_DEVICE_MAX_EPSILON;
use ldpsyn::schema::Value;
use ldpsyn::vertical::{PartyClient, PartyRandomizer, PartyRecord, RecordIdKey, VerticalError};
use ldpsyn_engine::central::measure_local_model;
use ldpsyn_engine::measure::local_model::LocalModel;
use ldpsyn_engine::measure::sketch::{SketchKey, encode_party};
use ldpsyn_engine::protocols::cross_party::SketchUpload;
use ldpsyn_engine::protocols::vertical::{ResolvedParty, Vertical};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `party` options.
#[derive(Debug, Clone, Args)]
pub struct PartyConfig {
    /// What to do.
    #[command(subcommand)]
    pub command: PartyCommand,
}

/// The `party` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum PartyCommand {
    /// Write a new random record-id key (64 hex digits) to a file (mode 0600).
    Keygen {
        /// The key file to create (refused if it exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// Randomize and upload this party's records to a vertical collection.
    Upload(Box<UploadArgs>),
}

/// `party upload` options.
#[derive(Debug, Clone, Args)]
pub struct UploadArgs {
    /// Base URL of the aggregator.
    #[arg(long, env = "LDPSYN_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// The vertical collection's id.
    #[arg(long)]
    pub collection: Uuid,
    /// This party's name in the collection.
    #[arg(long)]
    pub party: String,
    /// The party's CSV (header row; a column per party attribute, named as in the schema).
    #[arg(long)]
    pub data: PathBuf,
    /// The column holding the customer id the parties share.
    #[arg(long)]
    pub id_column: String,
    /// The record-id key file (from `party keygen`: hex; or ≥ 32 raw bytes).
    #[arg(long)]
    pub key_file: PathBuf,
    /// Optional: the party's schema file; checked against the collection's attributes.
    #[arg(long)]
    pub schema: Option<PathBuf>,
    /// Journal of randomized records (default: `<data>.<party>.journal.jsonl`).
    #[arg(long)]
    pub journal: Option<PathBuf>,
    /// Largest ε per person this party accepts to spend (its reports' ε, plus its local
    /// model's under `fo+locmrf` and `sampled+locmrf`). The collection's declared ε also
    /// bounds it. Default: devices' default cap
    /// ([`ldpsyn::ledger::DEFAULT_DEVICE_MAX_EPSILON`], 10), so a server declaring more
    /// (up to 20) is refused unless the party opts in.
    #[arg(long, default_value_t = DEFAULT_DEVICE_MAX_EPSILON)]
    pub max_epsilon: f64,
    /// Records per step of the upload (and of its progress bar); each step goes out in as
    /// many requests as the server's published limits need (at most 10,000 records and its
    /// body limit per request).
    #[arg(long, default_value_t = 5_000)]
    pub batch: usize,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The local model file (`fo+locmrf`; default: `<data>.<party>.model.json`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The sketch report file (`sketch+locmrf`; default: `<data>.<party>.sketch.json`).
    #[arg(long)]
    pub sketch: Option<PathBuf>,
    /// Largest marginal the local model measures: 2 (pairs) or 3 (pairs and triples).
    #[arg(long, default_value_t = DEFAULT_MAX_MARGINAL, value_parser = clap::value_parser!(u8).range(2..=3))]
    pub max_marginal: u8,
}

/// Largest marginal a local model measures by default (`party upload --max-marginal`; the
/// demo's parties use it too): pairs and triples.
pub(crate) const DEFAULT_MAX_MARGINAL: u8 = 3;

/// Why a `party` command failed.
#[derive(Debug, thiserror::Error)]
pub enum PartyError {
    /// No upload token in the environment.
    #[error("set LDPSYN_PARTY_TOKEN to this party's upload token")]
    NoToken,
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The input does not fit (CSV, key, schema, journal).
    #[error("{0}")]
    Input(String),
    /// The server or the SDK refused.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The collection asks this party for more ε per person than it accepts
    /// (`--max-epsilon`, or the collection's declared ε when lower); nothing was sent.
    #[error("{0}")]
    EpsilonCap(String),
    /// The server refused a one-time upload (local model, sketch report), or did not answer.
    #[error("{what} upload: {detail}")]
    OneTime {
        /// "local model" or "sketch report".
        what: &'static str,
        /// The server's problem detail, or why nothing answered.
        detail: String,
    },
    /// The server did not answer at all (every retry failed).
    #[error("{source}: is `serve` running at {server}?")]
    Unreachable {
        /// The `--server` URL.
        server: String,
        /// The SDK's error, with the last failure.
        source: ClientError,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PartyError + '_ {
    move |source| PartyError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The journal's first line: which collection and party its records belong to.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct JournalHeader {
    collection: Uuid,
    party: String,
    records: usize,
}

/// Runs a `party` command, writing its summary to `out`.
/// Errors: [`PartyError`].
pub async fn run(
    cfg: &PartyConfig,
    token: Option<&str>,
    out: &mut impl Write,
) -> Result<(), PartyError> {
    match &cfg.command {
        PartyCommand::Keygen { out: path } => {
            keygen(path)?;
            writeln!(out, "wrote a new record-id key to {}", path.display()).map_err(io(path))
        }
        PartyCommand::Upload(args) => {
            let token = token.ok_or(PartyError::NoToken)?;
            let done = upload(args, token).await.map_err(|e| match e {
                // Not an HTTP answer (the SDK writes those "HTTP <status>: …"): nothing
                // answered at that URL.
                PartyError::Client(ClientError::Unavailable {
                    attempts,
                    last_error,
                }) if !last_error.starts_with("HTTP ") => PartyError::Unreachable {
                    server: args.server.clone(),
                    source: ClientError::Unavailable {
                        attempts,
                        last_error,
                    },
                },
                e => e,
            })?;
            let held = |stored| if stored { "stored" } else { "already held" };
            let w = io(&args.data);
            if let Some((accepted, duplicate)) = done.records {
                writeln!(
                    out,
                    "{}: {accepted} records accepted, {duplicate} already held",
                    args.party
                )
                .map_err(w)?;
            }
            if let Some((measurements, stored)) = done.model {
                writeln!(
                    out,
                    "{}: local model of {measurements} noisy marginals {}",
                    args.party,
                    held(stored)
                )
                .map_err(io(&args.data))?;
            }
            if let Some((sketches, bytes, stored)) = done.sketch {
                writeln!(
                    out,
                    "{}: sketch report of {sketches} sketches ({bytes} bytes) {}",
                    args.party,
                    held(stored)
                )
                .map_err(io(&args.data))?;
            }
            Ok(())
        }
    }
}

/// What `party upload` sent.
struct Uploaded {
    /// Records accepted and already held (`None` under `sketch+locmrf`).
    records: Option<(u64, u64)>,
    /// The local model's measurements and whether this run stored it.
    model: Option<(usize, bool)>,
    /// The sketch report's sketch count, its JSON size and whether this run stored it.
    sketch: Option<(usize, usize, bool)>,
}

fn keygen(path: &Path) -> Result<(), PartyError> {
    use rand::TryRngCore;
    let mut key = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut key)
        .map_err(|e| PartyError::Input(format!("no OS randomness: {e}")))?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).map_err(io(path))?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(f, "{hex}").map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// The key in `path`: 64+ hex digits (keygen's format) or the raw bytes.
fn read_key(path: &Path) -> Result<RecordIdKey, PartyError> {
    RecordIdKey::new(read_key_bytes(path)?)
        .map_err(|e| PartyError::Input(format!("{}: {e}", path.display())))
}

/// The bytes of the key in `path` (hex decoded when it is keygen's format).
fn read_key_bytes(path: &Path) -> Result<Vec<u8>, PartyError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let text = String::from_utf8_lossy(&bytes);
    let t = text.trim();
    let raw = if t.len() >= 64 && t.len() % 2 == 0 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..t.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&t[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|e| PartyError::Input(e.to_string()))?
    } else {
        bytes
    };
    Ok(raw)
}

/// Uploads the records (but under `sketch+locmrf`), then, with a `locmrf` budget, the local
/// model, then under `sketch+locmrf` the sketch report.
async fn upload(args: &UploadArgs, token: &str) -> Result<Uploaded, PartyError> {
    // The SDK checks the party's composed ε against this and the declared ε on connect,
    // before anything is randomized or sent.
    let max = Epsilon::new(args.max_epsilon)
        .map_err(|e| PartyError::Input(format!("--max-epsilon {}: {e}", args.max_epsilon)))?;
    let client = PartyClient::connect(
        &args.server,
        args.collection,
        &args.party,
        token,
        ClientOptions::new(max),
    )
    .await
    .map_err(|e| match e {
        ClientError::EpsilonTooLarge { requested, max } => {
            let party = &args.party;
            PartyError::EpsilonCap(if max < args.max_epsilon {
                format!(
                    "the collection's config asks party `{party}` for epsilon {requested} per \
                     person, above the epsilon {max} the collection declares; a config that \
                     contradicts itself is not trusted. Nothing was randomized or sent"
                )
            } else {
                format!(
                    "the collection asks party `{party}` for epsilon {requested} per person, \
                     above this party's cap {max} (--max-epsilon; the default, {}, is \
                     devices' default cap). Nothing was randomized or sent; pass \
                     --max-epsilon {requested} to accept it",
                    DEFAULT_DEVICE_MAX_EPSILON
                )
            })
        }
        e => e.into(),
    })?;
    if let Some(schema) = &args.schema {
        check_schema(schema, &client)?;
    }
    let sketched = client.randomizer().encoding().is_sketch();
    let beside_data = |given: &Option<PathBuf>, suffix: &str| {
        given.clone().unwrap_or_else(|| {
            let mut p = args.data.clone().into_os_string();
            p.push(format!(".{}.{suffix}", args.party));
            PathBuf::from(p)
        })
    };
    let records = if sketched {
        Vec::new()
    } else {
        let journal = beside_data(&args.journal, "journal.jsonl");
        if journal.exists() {
            read_journal(&journal, args.collection, &args.party)?
        } else {
            let records = randomize_csv(args, &client)?;
            write_journal(&journal, args.collection, &args.party, &records)?;
            records
        }
    };
    // Made (or read back) before anything is sent: a failure here leaves the server as it was.
    // The CSV is read once for both, with one OS-seeded CSPRNG.
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut rows = None;
    let model = match client.randomizer().party().locmrf {
        None => None,
        Some(_) => {
            let path = beside_data(&args.model, "model.json");
            Some(if path.exists() {
                read_written(&path, &args.party, LocalModel::party)?
            } else {
                let (_, codes) = rows_once(&mut rows, args, &client, &mut rng)?;
                let r = client.randomizer();
                let m = local_model_of_codes(r, codes, args.max_marginal as usize, &mut rng)?;
                write_json(&path, &m)?;
                m
            })
        }
    };
    let sketch = if sketched {
        let path = beside_data(&args.sketch, "sketch.json");
        Some(if path.exists() {
            read_written(&path, &args.party, |s: &SketchUpload| &s.party)?
        } else {
            let (ids, codes) = rows_once(&mut rows, args, &client, &mut rng)?;
            let s = sketch_report(args, &client, ids, codes, &mut rng)?;
            write_json(&path, &s)?;
            s
        })
    } else {
        None
    };
    let mut done = Uploaded {
        records: None,
        model: None,
        sketch: None,
    };
    if !sketched {
        let bar = if args.quiet {
            ProgressBar::hidden()
        } else {
            let bar = ProgressBar::new(records.len() as u64);
            bar.set_style(
                ProgressStyle::with_template(
                    "upload {bar:40} {human_pos}/{human_len} records {per_sec} {elapsed}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        };
        let (mut accepted, mut duplicate) = (0, 0);
        for chunk in records.chunks(args.batch.max(1)) {
            let r = client.upload(chunk).await?;
            accepted += r.accepted;
            duplicate += r.duplicate;
            bar.inc(chunk.len() as u64);
        }
        bar.finish_and_clear();
        done.records = Some((accepted, duplicate));
    }
    let send = |what, route, body| {
        upload_once(
            &args.server,
            args.collection,
            &args.party,
            token,
            what,
            route,
            body,
        )
    };
    if let Some(m) = model {
        let body = serde_json::to_vec(&m).map_err(|e| PartyError::Input(e.to_string()))?;
        let stored = send("local model", "model", body).await?;
        done.model = Some((m.measurements().len(), stored));
    }
    if let Some(s) = sketch {
        let body = serde_json::to_vec(&s).map_err(|e| PartyError::Input(e.to_string()))?;
        let bytes = body.len();
        let stored = send("sketch report", "sketch", body).await?;
        done.sketch = Some((s.report.sketch_count(), bytes, stored));
    }
    Ok(done)
}

/// The party's rows of the CSV under the collection's schema: each row's customer id
/// (`--id-column`) and its attributes' schema codes (party order). A row with a value the
/// schema refuses is left out, as from the records; `on_invalid: "randomize"` draws from
/// `rng`. Errors: unreadable CSV, a missing column.
fn party_rows<R: rand::Rng + ?Sized>(
    args: &UploadArgs,
    r: &PartyRandomizer,
    rng: &mut R,
) -> Result<(Vec<String>, Vec<u32>), PartyError> {
    let schema = r.schema();
    let mut reader = csv::Reader::from_path(&args.data)
        .map_err(|e| PartyError::Input(format!("{}: {e}", args.data.display())))?;
    let header = reader
        .headers()
        .map_err(|e| PartyError::Input(format!("{}: {e}", args.data.display())))?
        .clone();
    let column = |name: &str| {
        header.iter().position(|h| h.trim() == name).ok_or_else(|| {
            PartyError::Input(format!("{} has no column `{name}`", args.data.display()))
        })
    };
    let id_col = column(&args.id_column)?;
    let cols = r
        .attributes()
        .iter()
        .map(|&a| column(&schema.attributes()[a].name))
        .collect::<Result<Vec<_>, _>>()?;
    let (mut ids, mut codes) = (Vec::new(), Vec::new());
    let mut row_codes = Vec::with_capacity(cols.len());
    for row in reader.records() {
        let row = row.map_err(|e| PartyError::Input(format!("{}: {e}", args.data.display())))?;
        row_codes.clear();
        for (&c, &a) in cols.iter().zip(r.attributes()) {
            let value = Value::from(row.get(c).unwrap_or_default());
            match schema.attributes()[a].encode_value_with(&value, rng) {
                Ok(code) => row_codes.push(code),
                Err(_) => break,
            }
        }
        if row_codes.len() == cols.len() {
            ids.push(row.get(id_col).unwrap_or_default().trim().to_owned());
            codes.extend_from_slice(&row_codes);
        }
    }
    Ok((ids, codes))
}

/// The CSV's rows ([`party_rows`]), read into `cache` on the first call.
fn rows_once<'a, R: rand::Rng + ?Sized>(
    cache: &'a mut Option<(Vec<String>, Vec<u32>)>,
    args: &UploadArgs,
    client: &PartyClient,
    rng: &mut R,
) -> Result<&'a (Vec<String>, Vec<u32>), PartyError> {
    if cache.is_none() {
        *cache = Some(party_rows(args, client.randomizer(), rng)?);
    }
    Ok(cache.as_ref().expect("filled above"))
}

/// The party's sketch report (`sketch+locmrf`) over its CSV's rows (`ids`, `codes` from
/// [`party_rows`]), customer ids hashed under the key derived from the key file and the
/// collection id ([`SketchKey::derive`]); phantoms and n̂'s noise from `rng`, an OS-seeded
/// CSPRNG. Errors: the key, no rows, a repeated customer id.
fn sketch_report<R: rand::Rng + rand::CryptoRng + ?Sized>(
    args: &UploadArgs,
    client: &PartyClient,
    ids: &[String],
    codes: &[u32],
    rng: &mut R,
) -> Result<SketchUpload, PartyError> {
    let key = SketchKey::derive(&read_key_bytes(&args.key_file)?, args.collection.as_bytes())
        .map_err(|e| PartyError::Input(format!("{}: {e}", args.key_file.display())))?;
    if ids.is_empty() {
        return Err(PartyError::Input(format!(
            "{} has no rows",
            args.data.display()
        )));
    }
    sketch_report_of_codes(client.randomizer(), &key, ids, codes, rng)
        .map_err(|e| PartyError::Input(format!("{}: {e}", args.data.display())))
}

/// The sketch report (VertiMRF Algorithm 3 with n̂) of party `r` over its people: `ids[i]`
/// (each person's id as the parties share it) and `codes`, its attributes' schema codes,
/// row-major in party order; each code goes into the collection's sketch bins. `rng` must be
/// OS-seeded outside simulations (the demo seeds it so that a run reproduces). Errors: not a
/// `sketch+locmrf` collection, a repeated id, a code outside its domain.
pub(crate) fn sketch_report_of_codes<R: rand::Rng + rand::CryptoRng + ?Sized>(
    r: &PartyRandomizer,
    key: &SketchKey,
    ids: &[impl AsRef<[u8]>],
    codes: &[u32],
    rng: &mut R,
) -> Result<SketchUpload, PartyError> {
    let ldpsyn::wire::Protocol::Vertical(params) = &r.config().protocol else {
        return Err(PartyError::Input("not a vertical collection".into()));
    };
    let v = Vertical::new(params, r.schema()).map_err(|e| PartyError::Input(e.to_string()))?;
    let name = &r.party().name;
    let p = v
        .party_index(name)
        .ok_or_else(|| PartyError::Input(format!("no party `{name}`")))?;
    let sketch_params = v.sketch_params(p).map_err(PartyError::Input)?;
    let attrs = r.attributes();
    let cuts: Vec<Vec<u32>> = attrs.iter().map(|&a| v.sketch_cuts(a)).collect();
    let sizes: Vec<u32> = attrs
        .iter()
        .map(|&a| v.sketch_bin_count(a) as u32)
        .collect();
    let rows = ids
        .iter()
        .zip(codes.chunks_exact(attrs.len()))
        .map(|(id, row)| {
            let binned: Vec<u32> = row
                .iter()
                .zip(&cuts)
                .map(|(&c, cut)| ldpsyn::factor::bin_of(c, cut))
                .collect();
            (id.as_ref(), binned)
        });
    let report = encode_party(&sketch_params, key, &sizes, rows, rng)
        .map_err(|e| PartyError::Input(e.to_string()))?;
    Ok(SketchUpload {
        party: name.clone(),
        report,
    })
}

/// The local model (LocMRF) of party `r` measured on `codes`: its attributes' schema codes,
/// row-major in party order, one row per person the party reports. `max_marginal`: 2 or 3
/// (the largest marginal measured). `rng` must be OS-seeded outside simulations (the demo
/// seeds it so that a run reproduces). Errors: no `locmrf` budget, or the measurement failed.
pub(crate) fn local_model_of_codes<R: rand::Rng + rand::CryptoRng + ?Sized>(
    r: &PartyRandomizer,
    codes: &[u32],
    max_marginal: usize,
    rng: &mut R,
) -> Result<LocalModel, PartyError> {
    let party = ResolvedParty {
        name: r.party().name.clone(),
        attributes: r.attributes().to_vec(),
        locmrf: r.party().locmrf,
    };
    measure_local_model(&party, &r.schema().domain_sizes(), codes, max_marginal, rng)
        .map_err(|e| PartyError::Input(e.to_string()))
}

/// Writes `value` as JSON next to `path`, fsyncs it and renames it into place.
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), PartyError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    let json = serde_json::to_vec(value).map_err(|e| PartyError::Input(e.to_string()))?;
    f.write_all(&json).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// A model or sketch report written by an earlier run (`party_of` names its party).
/// Errors: unreadable, or another party's.
fn read_written<T: serde::de::DeserializeOwned>(
    path: &Path,
    party: &str,
    party_of: impl Fn(&T) -> &str,
) -> Result<T, PartyError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let v: T = serde_json::from_str(&text)
        .map_err(|e| PartyError::Input(format!("{}: {e}", path.display())))?;
    if party_of(&v) != party {
        return Err(PartyError::Input(format!(
            "{} holds party `{}`'s upload, not `{party}`'s",
            path.display(),
            party_of(&v)
        )));
    }
    Ok(v)
}

/// Uploads a one-time `body` (`what`: "local model" or "sketch report") to
/// `POST …/parties/{party}/{route}`, retrying connection failures and 5xx up to 3 times with
/// identical bytes. `true` when stored, `false` when the server held the same upload.
/// Errors: [`PartyError::OneTime`] with the server's problem detail.
pub(crate) async fn upload_once(
    server: &str,
    collection: Uuid,
    party: &str,
    token: &str,
    what: &'static str,
    route: &str,
    body: Vec<u8>,
) -> Result<bool, PartyError> {
    let fail = |detail: String| PartyError::OneTime { what, detail };
    let url = format!(
        "{}/v1/collections/{collection}/parties/{party}/{route}",
        server.trim_end_matches('/'),
    );
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let mut last = String::new();
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(500 << attempt)).await;
        }
        let sent = http
            .post(&url)
            .bearer_auth(token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(resp) if resp.status().is_success() => {
                return Ok(resp.status() == reqwest::StatusCode::CREATED);
            }
            Ok(resp) if resp.status().is_server_error() => {
                last = format!("HTTP {}", resp.status());
            }
            Ok(resp) => {
                let status = resp.status();
                let detail = resp
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v["detail"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                return Err(fail(format!("HTTP {status}: {detail}")));
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(fail(format!(
        "no answer from {server} after 3 attempts: {last}"
    )))
}

/// Checks that `path`'s attributes are exactly the party's, each as the collection defines it.
fn check_schema(path: &Path, client: &PartyClient) -> Result<(), PartyError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let mine: ldpsyn::schema::Schema = serde_json::from_str(&text)
        .map_err(|e| PartyError::Input(format!("{}: {e}", path.display())))?;
    let r = client.randomizer();
    let theirs = r.schema().attributes();
    let names: Vec<&str> = r
        .attributes()
        .iter()
        .map(|&a| theirs[a].name.as_str())
        .collect();
    let given: Vec<&str> = mine.attributes().iter().map(|a| a.name.as_str()).collect();
    if given != names {
        return Err(PartyError::Input(format!(
            "{} lists attributes {given:?}; party `{}` holds {names:?} (in that order)",
            path.display(),
            r.party().name
        )));
    }
    for (a, &i) in mine.attributes().iter().zip(r.attributes()) {
        if *a != theirs[i] {
            return Err(PartyError::Input(format!(
                "{}: attribute `{}` differs from the collection's definition",
                path.display(),
                a.name
            )));
        }
    }
    Ok(())
}

/// Reads the CSV, derives record ids and randomizes each row (OS-seeded CSPRNG).
fn randomize_csv(args: &UploadArgs, client: &PartyClient) -> Result<Vec<PartyRecord>, PartyError> {
    let key = read_key(&args.key_file)?;
    let r = client.randomizer();
    let mut reader = csv::Reader::from_path(&args.data)
        .map_err(|e| PartyError::Input(format!("{}: {e}", args.data.display())))?;
    let header = reader
        .headers()
        .map_err(|e| PartyError::Input(format!("{}: {e}", args.data.display())))?
        .clone();
    let column = |name: &str| {
        header.iter().position(|h| h.trim() == name).ok_or_else(|| {
            PartyError::Input(format!("{} has no column `{name}`", args.data.display()))
        })
    };
    let id_col = column(&args.id_column)?;
    let schema = r.schema();
    let cols = r
        .attributes()
        .iter()
        .map(|&a| column(&schema.attributes()[a].name))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let (mut skipped, mut skipped_rows) = (Vec::new(), 0usize);
    for (line, row) in reader.records().enumerate() {
        let row = row.map_err(|e| PartyError::Input(format!("{}: {e}", args.data.display())))?;
        let customer = row.get(id_col).unwrap_or_default().trim();
        if !seen.insert(customer.to_owned()) {
            return Err(PartyError::Input(format!(
                "row {}: customer id `{customer}` appears twice",
                line + 2
            )));
        }
        let values: Vec<Value> = cols
            .iter()
            .map(|&c| Value::from(row.get(c).unwrap_or_default()))
            .collect();
        let record = match r.record(key.record_id(customer), &values, &mut rng) {
            Ok(record) => record,
            // A value the schema refuses: this party does not report the record, as a
            // device would not (the record's other parties still may).
            Err(VerticalError::Record { source, .. }) => {
                if skipped.len() < 3 {
                    skipped.push(format!("row {}: {source}", line + 2));
                }
                skipped_rows += 1;
                continue;
            }
            Err(e) => return Err(PartyError::Input(format!("row {}: {e}", line + 2))),
        };
        out.push(record);
    }
    if skipped_rows > 0 {
        eprintln!(
            "warning: {skipped_rows} rows not uploaded, a value refused by the schema ({}{}); \
             `\"on_invalid\": \"randomize\"` or `\"missing\": \"category\"` in the schema would report them",
            skipped.join("; "),
            if skipped_rows > skipped.len() {
                "; …"
            } else {
                ""
            }
        );
    }
    if out.is_empty() {
        return Err(PartyError::Input(format!(
            "{} has no rows",
            args.data.display()
        )));
    }
    Ok(out)
}

/// Writes the journal next to its final place, fsyncs it, renames it into place and fsyncs
/// the directory.
fn write_journal(
    path: &Path,
    collection: Uuid,
    party: &str,
    records: &[PartyRecord],
) -> Result<(), PartyError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io(&tmp))?);
    let header = JournalHeader {
        collection,
        party: party.to_owned(),
        records: records.len(),
    };
    let line = |v: serde_json::Result<String>| v.map_err(|e| PartyError::Input(e.to_string()));
    writeln!(f, "{}", line(serde_json::to_string(&header))?).map_err(io(&tmp))?;
    for r in records {
        writeln!(f, "{}", line(serde_json::to_string(r))?).map_err(io(&tmp))?;
    }
    let f = f.into_inner().map_err(|e| PartyError::Io {
        path: tmp.clone(),
        source: e.into_error(),
    })?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    // The rename is durable once the directory is: a crash must not leave records uploaded
    // whose journal entry vanished (a rerun would randomize them again, refused as
    // conflicts). Not every platform can open a directory.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = std::fs::File::open(dir) {
        d.sync_all().map_err(io(dir))?;
    }
    Ok(())
}

/// The journal's records, checked against the collection and party it was written for.
fn read_journal(
    path: &Path,
    collection: Uuid,
    party: &str,
) -> Result<Vec<PartyRecord>, PartyError> {
    let f = std::fs::File::open(path).map_err(io(path))?;
    let mut lines = std::io::BufReader::new(f).lines();
    let bad = |m: String| PartyError::Input(format!("journal {}: {m}", path.display()));
    let first = lines
        .next()
        .ok_or_else(|| bad("empty".into()))?
        .map_err(io(path))?;
    let header: JournalHeader = serde_json::from_str(&first).map_err(|e| bad(e.to_string()))?;
    if header.collection != collection || header.party != party {
        return Err(bad(format!(
            "written for collection {} party `{}`",
            header.collection, header.party
        )));
    }
    let records = lines
        .map(|l| {
            let l = l.map_err(io(path))?;
            serde_json::from_str(&l).map_err(|e| bad(e.to_string()))
        })
        .collect::<Result<Vec<PartyRecord>, _>>()?;
    if records.len() != header.records {
        return Err(bad(format!(
            "holds {} records, its header says {}",
            records.len(),
            header.records
        )));
    }
    Ok(records)
}
