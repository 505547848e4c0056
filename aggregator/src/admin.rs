//! `ldpsyn-aggregator collections …`: the operator's command line over the HTTP API of a
//! running aggregator (`create`, `list`, `status`, `close-round`, `finalize`, `download`,
//! `delete`).
//! The admin token comes from `LDPSYN_ADMIN_TOKEN` (never a flag: it would show in the
//! process list). Output is a human-readable summary, or the server's JSON with `--json`; a
//! refusal prints the server's problem document (type, title, detail) and fails.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};

/// `collections` options.
#[derive(Debug, Clone, Args)]
pub struct AdminConfig {
    /// Base URL of the aggregator.
    #[arg(
        long,
        env = "LDPSYN_SERVER",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub server: String,
    /// Print the server's JSON instead of a summary.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// The `collections` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// Create a collection from a schema file; prints its id.
    Create {
        /// Schema JSON file.
        #[arg(long)]
        schema: PathBuf,
        /// ε of every report; a vertical collection leaves it out (the server takes the
        /// largest party total, e.g. from `--param 'budget={"epsilon": 3.2}'`).
        #[arg(long)]
        epsilon: Option<f64>,
        /// Number of users N the collection aims at.
        #[arg(long)]
        target_users: u64,
        /// Protocol: auto, privincr, noincremental, samprivsyn, independence or vertical.
        #[arg(long, default_value = "auto")]
        protocol: String,
        /// A protocol parameter as KEY=VALUE (JSON value; repeat), e.g. `rounds=3`, or for a
        /// vertical collection `parties=[…]` and `budget={"epsilon": 3.2}`.
        #[arg(long = "param", value_parser = parse_param)]
        params: Vec<(String, Value)>,
        /// A name for people, shown by `list` and `status` (at most 100 characters).
        #[arg(long)]
        name: Option<String>,
        /// What the collection is for, shown by `status` (at most 2,000 characters).
        #[arg(long)]
        description: Option<String>,
        /// Do not finalize by itself once `--target-users` reports are accepted (the default
        /// for a device collection is to finalize there).
        #[arg(long)]
        no_auto_finalize: bool,
        /// Reports past the target: `refuse` (the default for a device collection) or
        /// `accept` (taken while the collection is open).
        #[arg(long)]
        past_target: Option<String>,
        /// Delete the raw reports this many days after finalize (tables and model are kept).
        #[arg(long)]
        retain_reports_days: Option<u32>,
        /// An attribute the data is collected to predict (a label column; repeat for
        /// several): the design and the model favour its pairs, and the model's fitness
        /// report says how much of it the model explains.
        #[arg(long)]
        target: Vec<String>,
    },
    /// List every collection with its progress.
    List,
    /// A collection's config and progress.
    Status {
        /// Collection id.
        id: String,
    },
    /// Close the current round (or batch) now. Rounds close by themselves at their quota;
    /// a round with no reports is refused unless `--force`.
    CloseRound {
        /// Collection id.
        id: String,
        /// Close the round even when it has no reports (its pairs are then judged on no
        /// data).
        #[arg(long)]
        force: bool,
    },
    /// Finalize: no more reports; waits while the model is built (a spinner on stderr when
    /// the fit outlasts the server's wait).
    Finalize {
        /// Collection id.
        id: String,
        /// No spinner.
        #[arg(long)]
        quiet: bool,
    },
    /// Delete a collection with its reports, tables, state and model. Cannot be undone.
    Delete {
        /// Collection id.
        id: String,
    },
    /// Download synthetic rows to a file, with a progress bar.
    Download(DownloadArgs),
}

/// `collections download` options.
#[derive(Debug, Clone, Args)]
pub struct DownloadArgs {
    /// Collection id.
    pub id: String,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
    /// Rows (default: the collection's target users).
    #[arg(long)]
    pub rows: Option<u64>,
    /// Seed: the same seed and model give the same bytes.
    #[arg(long)]
    pub seed: Option<u64>,
    /// csv, ndjson or parquet (typed columns, for pandas/pyarrow and other analysis tools).
    #[arg(long, default_value = "csv")]
    pub format: String,
    /// Numeric values: recover, uniform or midpoint.
    #[arg(long)]
    pub numeric: Option<String>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

fn parse_param(s: &str) -> Result<(String, Value), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected KEY=VALUE"))?;
    let v = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned()));
    Ok((k.trim().to_owned(), v))
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No admin token in the environment.
    #[error("set LDPSYN_ADMIN_TOKEN to the aggregator's admin token")]
    NoToken,
    /// The server refused: its problem document.
    #[error("HTTP {status} {kind}: {title}{}", detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        /// HTTP status.
        status: u16,
        /// Problem type (without the `urn:ldpsyn:problem:` prefix).
        kind: String,
        /// Problem title.
        title: String,
        /// Problem detail.
        detail: Option<String>,
    },
    /// The server could not be reached or answered something unreadable; the message names
    /// the URL, and asks whether `serve` runs there when nothing answered.
    #[error("{}", http_message(.0))]
    Http(#[from] reqwest::Error),
    /// A local file could not be read or written.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The schema file is not valid JSON.
    #[error("{} is not valid JSON: {source}", path.display())]
    SchemaJson {
        /// The file.
        path: PathBuf,
        /// Where and why.
        source: serde_json::Error,
    },
    /// The output (stdout) could not be written.
    #[error("cannot write the output: {0}")]
    Io(#[from] std::io::Error),
    /// An answer could not be printed as JSON.
    #[error("cannot print the answer as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// A reqwest error in words: the URL, the innermost cause (reqwest's own message says
/// only "error sending request"), and for a connection that failed whether `serve` runs.
fn http_message(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let url = e.url().map_or_else(String::new, ToString::to_string);
    if e.is_connect() {
        let server = e
            .url()
            .map_or_else(String::new, |u| u.origin().ascii_serialization());
        format!("cannot connect to {url} ({cause}): is `serve` running at {server}?")
    } else if e.is_timeout() {
        format!("{url}: no answer in time ({cause})")
    } else if url.is_empty() {
        format!("HTTP: {cause}")
    } else {
        format!("{url}: {cause}")
    }
}

/// Maps an I/O error on `path` to [`AdminError::File`].
fn file_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> AdminError + '_ {
    move |source| AdminError::File {
        path: path.to_owned(),
        source,
    }
}

/// Turns a command's JSON answer into its human-readable summary.
type Summary = Box<dyn Fn(&Value) -> String>;

/// Runs one command against `cfg.server` with the admin `token`, writing its output to
/// `out`. Errors: [`AdminError`].
pub async fn run(
    cfg: &AdminConfig,
    token: Option<&str>,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let token = token.ok_or(AdminError::NoToken)?;
    let base = cfg.server.trim_end_matches('/');
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str| {
        http.request(method, format!("{base}{path}"))
            .bearer_auth(token)
    };
    // Every command but `download`: one request, its JSON answer printed as it is or
    // summarized.
    let (request, summarize): (reqwest::RequestBuilder, Summary) = match &cfg.command {
        AdminCommand::Create {
            schema,
            epsilon,
            target_users,
            protocol,
            params,
            name,
            description,
            no_auto_finalize,
            past_target,
            retain_reports_days,
            target,
        } => {
            let text = std::fs::read_to_string(schema).map_err(file_error(schema))?;
            let schema: Value =
                serde_json::from_str(&text).map_err(|source| AdminError::SchemaJson {
                    path: schema.clone(),
                    source,
                })?;
            let mut body = Map::new();
            body.insert("schema".into(), schema);
            if let Some(epsilon) = epsilon {
                body.insert("epsilon".into(), json!(epsilon));
            }
            body.insert("target_users".into(), json!(target_users));
            body.insert("protocol".into(), json!(protocol));
            if let Some(name) = name {
                body.insert("name".into(), json!(name));
            }
            if let Some(description) = description {
                body.insert("description".into(), json!(description));
            }
            if *no_auto_finalize {
                body.insert("auto_finalize_at_target".into(), json!(false));
            }
            if let Some(p) = past_target {
                body.insert("past_target".into(), json!(p));
            }
            if let Some(d) = retain_reports_days {
                body.insert("retain_reports_days".into(), json!(d));
            }
            if !target.is_empty() {
                body.insert("target".into(), json!(target));
            }
            body.extend(params.iter().cloned());
            // A client-chosen id makes the create safe to retry: a retry of a request whose
            // answer was lost names the same collection instead of making a second one.
            body.entry("id")
                .or_insert_with(|| json!(uuid::Uuid::new_v4()));
            let v = create_with_retries(&call, &body).await?;
            if cfg.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                writeln!(out, "{}", v["id"].as_str().unwrap_or(""))?;
            }
            return Ok(());
        }
        AdminCommand::List => (
            call(reqwest::Method::GET, "/v1/collections"),
            Box::new(|v| {
                let all = v.as_array().cloned().unwrap_or_default();
                if all.is_empty() {
                    return "no collections\n".into();
                }
                all.iter().map(|c| one_line(c) + "\n").collect()
            }),
        ),
        AdminCommand::Status { id } => (
            call(reqwest::Method::GET, &format!("/v1/collections/{id}")),
            Box::new(summary),
        ),
        AdminCommand::CloseRound { id, force } => {
            let mut request = call(
                reqwest::Method::POST,
                &format!("/v1/collections/{id}/close-round"),
            );
            if *force {
                request = request.query(&[("force", "true")]);
            }
            let id = id.clone();
            (request, Box::new(move |v| closed_summary(&id, v)))
        }
        AdminCommand::Finalize { id, quiet } => {
            return finalize(id, cfg.json, *quiet, &call, out).await;
        }
        AdminCommand::Delete { id } => (
            call(reqwest::Method::DELETE, &format!("/v1/collections/{id}")),
            Box::new(|v| {
                format!(
                    "{}: deleted with its {} reports\n",
                    v["id"].as_str().unwrap_or(""),
                    v["reports_deleted"]
                )
            }),
        ),
        AdminCommand::Download(args) => return download(args, cfg.json, &call, out).await,
    };
    let v = json_of(request.send().await?).await?;
    if cfg.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        write!(out, "{}", summarize(&v))?;
        // What the model cannot answer, where a model is asked about.
        if let AdminCommand::Status { id } = &cfg.command
            && v["status"]["model_ready"] == json!(true)
        {
            for w in fitness_warnings(&call, id).await {
                writeln!(out, "warning: {w}")?;
            }
        }
    }
    Ok(())
}

/// The fitness report's warnings of collection `id`'s model (`GET …/model`), for people;
/// none when the model cannot be read (the command's own answer already said why).
async fn fitness_warnings(
    call: &impl Fn(reqwest::Method, &str) -> reqwest::RequestBuilder,
    id: &str,
) -> Vec<String> {
    let Ok(resp) = call(reqwest::Method::GET, &format!("/v1/collections/{id}/model"))
        .send()
        .await
    else {
        return Vec::new();
    };
    let Ok(v) = json_of(resp).await else {
        return Vec::new();
    };
    v["fitness"]["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["message"].as_str().map(str::to_owned))
        .collect()
}

/// How often `finalize` asks whether a model that outlasted the server's wait is built.
const MODEL_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// `finalize`: finalizes collection `id` and waits for its model. A finalize answered 202
/// (the fit outlasted the server's wait) is followed by a poll of the collection's
/// `status.model` every [`MODEL_POLL`], with a spinner on stderr unless `quiet`, until it is
/// `ready` (then the model is read) or `failed`. Prints what the finalize answers once the
/// model is built (`--json`: `{status, model}`), else a line and the fitness warnings.
/// Errors: the server's refusal; a failed fit as [`AdminError::Refused`] with its reason.
async fn finalize(
    id: &str,
    json_out: bool,
    quiet: bool,
    call: &impl Fn(reqwest::Method, &str) -> reqwest::RequestBuilder,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let resp = call(
        reqwest::Method::POST,
        &format!("/v1/collections/{id}/finalize"),
    )
    .send()
    .await?;
    let building = resp.status() == reqwest::StatusCode::ACCEPTED;
    let mut answer = json_of(resp).await?;
    if building {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("building the model {spinner} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            bar
        };
        let status = loop {
            tokio::time::sleep(MODEL_POLL).await;
            let c = json_of(
                call(reqwest::Method::GET, &format!("/v1/collections/{id}"))
                    .send()
                    .await?,
            )
            .await?;
            if c["status"]["model"] != json!("building") {
                break c["status"].clone();
            }
        };
        bar.finish_and_clear();
        if status["model"] != json!("ready") {
            return Err(AdminError::Refused {
                status: 500,
                kind: "model-fit-failed".into(),
                title: "the collection is finalized but fitting its model failed".into(),
                detail: status["model_error"].as_str().map(str::to_owned),
            });
        }
        let model = json_of(
            call(reqwest::Method::GET, &format!("/v1/collections/{id}/model"))
                .send()
                .await?,
        )
        .await?;
        answer = json!({"status": status, "model": model["model"]});
    }
    if json_out {
        writeln!(out, "{}", serde_json::to_string_pretty(&answer)?)?;
    } else {
        writeln!(out, "{id}: finalized")?;
        for w in fitness_warnings(call, id).await {
            writeln!(out, "warning: {w}")?;
        }
    }
    Ok(())
}

/// `download`: the synthetic rows streamed to a file, with a progress bar.
async fn download(
    args: &DownloadArgs,
    json_out: bool,
    call: &impl Fn(reqwest::Method, &str) -> reqwest::RequestBuilder,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let DownloadArgs {
        id,
        out: path,
        rows,
        seed,
        format,
        numeric,
        quiet,
    } = args;
    // The server needs a row count: by default as many rows as the collection has people.
    let rows = match rows {
        Some(r) => *r,
        None => {
            let c = json_of(
                call(reqwest::Method::GET, &format!("/v1/collections/{id}"))
                    .send()
                    .await?,
            )
            .await?;
            c["target_users"].as_u64().unwrap_or(1).max(1)
        }
    };
    let mut query = vec![("format", format.clone()), ("rows", rows.to_string())];
    query.extend(seed.map(|s| ("seed", s.to_string())));
    query.extend(numeric.clone().map(|n| ("numeric", n)));
    let mut resp = call(
        reqwest::Method::GET,
        &format!("/v1/collections/{id}/synthetic"),
    )
    .query(&query)
    .send()
    .await?;
    if !resp.status().is_success() {
        return Err(refusal(resp).await);
    }
    // A Parquet file has no lines to count: its progress is in bytes, and it holds the rows
    // asked for (the server writes them all or stops the stream, which fails below).
    let parquet = format == "parquet";
    let bar = if *quiet {
        ProgressBar::hidden()
    } else if parquet {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("download {spinner} {binary_bytes} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar
    } else {
        let bar = ProgressBar::new(rows);
        bar.set_style(
            ProgressStyle::with_template(
                "download {bar:40} {human_pos}/{human_len} rows {per_sec} {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    };
    let header = u64::from(format == "csv");
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(file_error(path))?);
    let mut lines = 0u64;
    let mut bytes = 0u64;
    while let Some(chunk) = resp.chunk().await? {
        file.write_all(&chunk).map_err(file_error(path))?;
        bytes += chunk.len() as u64;
        if parquet {
            bar.set_position(bytes);
        } else {
            lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
            bar.set_position(lines.saturating_sub(header));
        }
    }
    file.flush().map_err(file_error(path))?;
    bar.finish_and_clear();
    let rows_written = if parquet {
        rows
    } else {
        lines.saturating_sub(header)
    };
    if json_out {
        let v = json!({"id": id, "rows": rows_written, "out": path.display().to_string()});
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{rows_written} rows written to {}", path.display())?;
        for w in fitness_warnings(call, id).await {
            writeln!(out, "warning: {w}")?;
        }
    }
    Ok(())
}

/// The body of a 2xx answer as JSON, or the server's problem as an error.
/// Attempts of a create before its error is reported.
const CREATE_ATTEMPTS: u32 = 4;

/// `POST /v1/collections` with `body` (which names its `id`), sent again after a connection
/// error or a 5xx, 1, 2, 4 s apart: safe because the id makes the server answer a repeat with
/// the collection it stored. Errors: the last attempt's.
async fn create_with_retries(
    call: &impl Fn(reqwest::Method, &str) -> reqwest::RequestBuilder,
    body: &Map<String, Value>,
) -> Result<Value, AdminError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let last = attempt >= CREATE_ATTEMPTS;
        match call(reqwest::Method::POST, "/v1/collections")
            .json(body)
            .send()
            .await
        {
            Ok(resp) if resp.status().is_server_error() && !last => {}
            Ok(resp) => return json_of(resp).await,
            Err(e) if last || !(e.is_connect() || e.is_timeout() || e.is_request()) => {
                return Err(e.into());
            }
            Err(_) => {}
        }
        tokio::time::sleep(std::time::Duration::from_secs(1 << (attempt - 1))).await;
    }
}

async fn json_of(resp: reqwest::Response) -> Result<Value, AdminError> {
    if !resp.status().is_success() {
        return Err(refusal(resp).await);
    }
    Ok(resp.json().await?)
}

async fn refusal(resp: reqwest::Response) -> AdminError {
    let status = resp.status().as_u16();
    let problem: Value = resp.json().await.unwrap_or(Value::Null);
    let text = |k: &str| problem.get(k).and_then(Value::as_str).map(str::to_owned);
    AdminError::Refused {
        status,
        kind: text("type")
            .map(|t| {
                t.trim_start_matches(ldpsyn::wire::PROBLEM_TYPE_PREFIX)
                    .to_owned()
            })
            .unwrap_or_else(|| "unknown".into()),
        title: text("title").unwrap_or_default(),
        detail: text("detail"),
    }
}

/// What a close-round answer says was done: one line per transition ("round 0 closed, 3
/// pairs pruned", …), or "nothing changed" with why.
fn closed_summary(id: &str, v: &Value) -> String {
    let pairs = |t: &Value| t["pruned"].as_array().map_or(0, Vec::len);
    let plural = |n: usize, one: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {one}s")
        }
    };
    let lines: Vec<String> = v["transitions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|t| match t["transition"].as_str()? {
            "round_closed" => Some(format!(
                "round {} closed, {} pruned",
                t["round"],
                plural(pairs(t), "pair")
            )),
            "entered_clique_measurement" => Some(format!(
                "entered phase 2 (clique measurement) with {}, {} pruned",
                plural(t["factors"].as_u64().unwrap_or(0) as usize, "factor"),
                plural(pairs(t), "pair")
            )),
            "reweighted" => Some(format!(
                "batch closed, pairs re-weighted; batch {} open",
                t["batch"]
            )),
            _ => None,
        })
        .collect();
    if lines.is_empty() {
        let phase = v["status"]["phase"].as_str().unwrap_or("");
        return format!(
            "{id}: nothing changed: phase {phase} has no round to close (rounds belong to \
             phase 1 of privincr/auto and to samprivsyn's batches)\n"
        );
    }
    lines.iter().map(|l| format!("{id}: {l}\n")).collect()
}

/// `accepted/target (percent)` of a collection document.
fn progress(c: &Value) -> String {
    let accepted = c["status"]["reports_accepted"].as_u64().unwrap_or(0);
    let target = c["target_users"].as_u64().unwrap_or(0).max(1);
    format!(
        "{accepted}/{target} ({:.1}%)",
        100.0 * accepted as f64 / target as f64
    )
}

fn one_line(c: &Value) -> String {
    let line = format!(
        "{}  {:<13} ε={:<5} {:<20} {}",
        c["id"].as_str().unwrap_or(""),
        c["protocol"].as_str().unwrap_or(""),
        c["epsilon"],
        c["status"]["phase"].as_str().unwrap_or(""),
        progress(c)
    );
    match c["name"].as_str() {
        Some(name) => format!("{line}  {name}"),
        None => line,
    }
}

/// The `rounds` line of a status (PrivIncr, NoIncremental, `auto`): each round's kind,
/// state and reports, and the pairs it dropped; empty for protocols without rounds.
fn rounds(s: &Value) -> String {
    let Some(rounds) = s["rounds"].as_array().filter(|r| !r.is_empty()) else {
        return String::new();
    };
    let parts: Vec<String> = rounds
        .iter()
        .map(|r| {
            let kind = match r["kind"].as_str() {
                Some("one_ways") => "1-ways",
                Some("phase2") => "phase 2",
                Some(other) => other,
                None => "",
            };
            let mut part = format!(
                "{} {kind} {} ({} reports",
                r["round"],
                r["state"].as_str().unwrap_or(""),
                r["reports"]
            );
            match (r["kind"].as_str(), r["pruned"].as_u64()) {
                (_, None | Some(0)) => {}
                (Some("screening"), Some(k)) => part += &format!(", {k} pairs not selected"),
                (_, Some(k)) => part += &format!(", {k} pairs pruned"),
            }
            part + ")"
        })
        .collect();
    format!("rounds      {}\n", parts.join(" · "))
}

fn summary(c: &Value) -> String {
    let s = &c["status"];
    let attrs: Vec<&str> = c["schema"]["attributes"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["name"].as_str()).collect())
        .unwrap_or_default();
    let round = match (s["round_quota"].as_u64(), s["round_accepted"].as_u64()) {
        (Some(q), Some(a)) => format!("round {} ({a}/{q} reports)", s["round"]),
        _ => format!("round {}", s["round"]),
    };
    let mut about = String::new();
    if let Some(name) = c["name"].as_str() {
        about += &format!("name        {name}\n");
    }
    if let Some(description) = c["description"].as_str() {
        // Continuation lines aligned under the first.
        about += &format!(
            "about       {}\n",
            description
                .lines()
                .collect::<Vec<_>>()
                .join("\n            ")
        );
    }
    let mut at_target = Vec::new();
    if c["auto_finalize_at_target"].as_bool() == Some(true) {
        at_target.push("finalize".to_owned());
    }
    at_target.push(match c["past_target"].as_str() {
        Some("refuse") => "refuse further reports".to_owned(),
        _ => "accept further reports while open".to_owned(),
    });
    about += &format!("at target   {}\n", at_target.join(", "));
    if let Some(days) = c["retain_reports_days"].as_u64() {
        about += &format!("retention   raw reports deleted {days} days after finalize\n");
    }
    format!(
        "collection  {}\n{about}protocol    {} at ε = {}\nattributes  {} ({})\nphase       {}, {round}\n{}reports     {}\nmodel       {}\n",
        c["id"].as_str().unwrap_or(""),
        c["protocol"].as_str().unwrap_or(""),
        c["epsilon"],
        attrs.len(),
        attrs.join(", "),
        s["phase"].as_str().unwrap_or(""),
        rounds(s),
        progress(c),
        if s["model_ready"].as_bool() == Some(true) {
            "ready"
        } else {
            "not built"
        },
    )
}
