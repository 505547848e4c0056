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

use crate::api_client::{AdminClient, ApiClientError, Finalized};

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
    /// The server refused (its problem document), could not be reached, or the model fit
    /// failed.
    #[error(transparent)]
    Api(#[from] ApiClientError),
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

/// Maps an I/O error on `path` to [`AdminError::File`].
fn file_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> AdminError + '_ {
    move |source| AdminError::File {
        path: path.to_owned(),
        source,
    }
}

/// Runs one command against `cfg.server` with the admin `token`, writing its output to
/// `out`. Errors: [`AdminError`].
pub async fn run(
    cfg: &AdminConfig,
    token: Option<&str>,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let token = token.ok_or(AdminError::NoToken)?;
    let api = AdminClient::new(&cfg.server, token);
    // Every command but `finalize` and `download`: one call, its JSON answer printed as it
    // is or summarized.
    let (v, text) = match &cfg.command {
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
            let v = api.create(&Value::Object(body)).await?;
            let text = format!("{}\n", v["id"].as_str().unwrap_or(""));
            (v, text)
        }
        AdminCommand::List => {
            let v = api.list().await?;
            let all = v.as_array().cloned().unwrap_or_default();
            let text = if all.is_empty() {
                "no collections\n".into()
            } else {
                all.iter().map(|c| one_line(c) + "\n").collect()
            };
            (v, text)
        }
        AdminCommand::Status { id } => {
            let v = api.collection(id).await?;
            let mut text = summary(&v);
            // What the model cannot answer, once there is one.
            if v["status"]["model_ready"] == json!(true) {
                for w in fitness_warnings(&api, id).await {
                    text += &format!("warning: {w}\n");
                }
            }
            (v, text)
        }
        AdminCommand::CloseRound { id, force } => {
            let v = api.close_round(id, *force).await?;
            let text = closed_summary(id, &v);
            (v, text)
        }
        AdminCommand::Finalize { id, quiet } => {
            return finalize(&api, id, cfg.json, *quiet, out).await;
        }
        AdminCommand::Delete { id } => {
            let v = api.delete(id).await?;
            let text = format!(
                "{}: deleted with its {} reports\n",
                v["id"].as_str().unwrap_or(""),
                v["reports_deleted"]
            );
            (v, text)
        }
        AdminCommand::Download(args) => return download(&api, args, cfg.json, out).await,
    };
    if cfg.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        write!(out, "{text}")?;
    }
    Ok(())
}

/// The fitness report's warnings of collection `id`'s model (`GET …/model`), for people;
/// none when the model cannot be read (the command's own answer already said why).
async fn fitness_warnings(api: &AdminClient, id: &str) -> Vec<String> {
    let Ok(v) = api.model(id).await else {
        return Vec::new();
    };
    v["fitness"]["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["message"].as_str().map(str::to_owned))
        .collect()
}

/// `finalize`: finalizes collection `id` and waits for its model, with a spinner on stderr
/// unless `quiet` when the fit outlasts the server's wait. Prints what the finalize answers
/// once the model is built (`--json`: `{status, model}`), else a line and the fitness
/// warnings. Errors: the server's refusal, a failed fit.
async fn finalize(
    api: &AdminClient,
    id: &str,
    json_out: bool,
    quiet: bool,
    out: &mut impl Write,
) -> Result<(), AdminError> {
    let answer = match api.finalize(id).await? {
        Finalized::Built(v) => v,
        Finalized::Building => {
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
            let waited = api.wait_for_model(id).await;
            bar.finish_and_clear();
            let (status, model) = waited?;
            json!({"status": status, "model": model["model"]})
        }
    };
    if json_out {
        writeln!(out, "{}", serde_json::to_string_pretty(&answer)?)?;
    } else {
        writeln!(out, "{id}: finalized")?;
        for w in fitness_warnings(api, id).await {
            writeln!(out, "warning: {w}")?;
        }
    }
    Ok(())
}

/// `download`: the synthetic rows streamed to a file, with a progress bar.
async fn download(
    api: &AdminClient,
    args: &DownloadArgs,
    json_out: bool,
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
        None => api.collection(id).await?["target_users"]
            .as_u64()
            .unwrap_or(1)
            .max(1),
    };
    let mut query = vec![("format", format.clone()), ("rows", rows.to_string())];
    query.extend(seed.map(|s| ("seed", s.to_string())));
    query.extend(numeric.clone().map(|n| ("numeric", n)));
    let mut resp = api.synthetic(id, &query).await?;
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
    while let Some(chunk) = resp.chunk().await.map_err(ApiClientError::from)? {
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
        for w in fitness_warnings(api, id).await {
            writeln!(out, "warning: {w}")?;
        }
    }
    Ok(())
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
