//! `synthesize`: a data curator's synthetic table under central differential privacy.
//!
//! The curator holds the whole table, so no randomized response is needed: the engine's
//! central synthesizer ([`crate::engine::central`]) measures marginals with discrete
//! Gaussian noise under one (ε, δ) budget, fits the graphical model every collection uses
//! and samples from it. Nothing leaves the machine but the synthetic table and the report
//! (privacy accounting and model structure, both functions of the noisy measurements only).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::Bytes;
use ldpsyn::schema::Schema;
use rand::{RngCore, SeedableRng};
use serde::Serialize;

use crate::engine::central::{CentralError, CentralOptions, CentralReport, synthesize_central};
use crate::engine::{Expansion, ModelDescription};
use crate::service::synthetic::{Format, write_synthetic};
use crate::sim::load_csv;

/// Output formats of `synthesize --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// CSV with a header row.
    Csv,
    /// Apache Parquet with typed columns.
    Parquet,
}

/// Arguments of `ldpsyn-aggregator synthesize`.
#[derive(Debug, Clone, clap::Args)]
pub struct SynthesizeConfig {
    /// The table (CSV with a header row naming the schema's attributes).
    #[arg(long)]
    pub data: PathBuf,
    /// The schema (JSON, as for collections; `schema infer` proposes one).
    #[arg(long)]
    pub schema: PathBuf,
    /// ε of the (ε, δ)-differential-privacy guarantee for each record of the table.
    #[arg(long)]
    pub epsilon: f64,
    /// δ of the guarantee (well below 1 / records).
    #[arg(long, default_value_t = 1e-9)]
    pub delta: f64,
    /// Where to write the synthetic table.
    #[arg(long)]
    pub out: PathBuf,
    /// Format of `--out`.
    #[arg(long, value_enum, default_value_t = OutputFormat::Csv)]
    pub format: OutputFormat,
    /// Rows to synthesize (default: the noisy record count).
    #[arg(long)]
    pub rows: Option<u64>,
    /// Where to write the JSON report (privacy accounting, model); stdout gets a summary.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Largest marginal measured: 2 (pairs) or 3 (pairs and triples).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=3))]
    pub max_marginal: u8,
    /// An attribute the table is synthesized to predict (repeat for several): marginals
    /// holding it are favoured when the rounds choose what to measure.
    #[arg(long)]
    pub target: Vec<String>,
    /// Memory budget of the fit, bytes or with a unit (`512M`, `2G`; K, M, G, T are powers
    /// of 1024). The clique cap is lowered until the design fits, before anything is
    /// allocated; a budget too small for even the smallest design is refused.
    #[arg(long, default_value = "2G", value_parser = parse_bytes)]
    pub max_memory: u64,
}

/// A byte count: digits, optionally followed by K, M, G or T (powers of 1024; `B`, `iB`
/// and lower case accepted). Errors: a message naming the accepted forms.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => u32::MAX,
    };
    number
        .parse::<u64>()
        .ok()
        .filter(|&n| n > 0 && shift != u32::MAX)
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| {
            format!(
                "`{text}` is not a memory size: give a whole number of bytes > 0, optionally \
                 with a unit K, M, G or T (powers of 1024), e.g. 512M or 2G"
            )
        })
}

/// What `synthesize` writes to `--report`: only functions of the noisy measurements.
#[derive(Debug, Clone, Serialize)]
pub struct SynthesizeReport {
    /// Attribute names, in schema order (indices below refer to them).
    pub attributes: Vec<String>,
    /// Synthetic rows written.
    pub rows: u64,
    /// The privacy accounting: budget, ρ, every measurement with its noise.
    pub privacy: CentralReport,
    /// The model's structure (graph, junction tree, conditionals).
    pub model: ModelDescription,
}

/// Errors of `synthesize`, written for the person at the terminal.
#[derive(Debug, thiserror::Error)]
pub enum SynthesizeError {
    /// An input file is missing or malformed.
    #[error("{0}")]
    Input(String),
    /// The budget or data do not fit the synthesizer.
    #[error(transparent)]
    Central(#[from] CentralError),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn output_error(path: &Path) -> impl Fn(std::io::Error) -> SynthesizeError + '_ {
    move |source| SynthesizeError::Output {
        path: path.to_path_buf(),
        source,
    }
}

/// Runs `synthesize`: reads `--data` through `--schema`, fits the central-DP model with
/// noise from the operating system's CSPRNG, writes `--out` (and `--report`) and a summary
/// to `out`. Errors: [`SynthesizeError`].
pub fn run(
    cfg: &SynthesizeConfig,
    out: &mut impl Write,
) -> Result<SynthesizeReport, SynthesizeError> {
    let started = Instant::now();
    let text = std::fs::read_to_string(&cfg.schema).map_err(|e| {
        SynthesizeError::Input(format!("cannot read schema {}: {e}", cfg.schema.display()))
    })?;
    let schema: Schema = serde_json::from_str(&text).map_err(|e| {
        SynthesizeError::Input(format!("invalid schema {}: {e}", cfg.schema.display()))
    })?;
    let loaded = load_csv(&cfg.data, &schema)
        .map_err(|e| SynthesizeError::Input(format!("cannot load {}: {e}", cfg.data.display())))?;
    if loaded.population.is_empty() {
        return Err(SynthesizeError::Input(format!(
            "the schema rejected every row of {}",
            cfg.data.display()
        )));
    }
    // Said to the curator only (the count is not protected): the report file leaves it out.
    eprintln!(
        "read {} rows of {}; {} rejected by the schema",
        loaded.total_rows,
        cfg.data.display(),
        loaded.rejected_rows
    );
    let mut options = CentralOptions::new(cfg.epsilon, cfg.delta);
    options.max_marginal_attrs = usize::from(cfg.max_marginal);
    for name in &cfg.target {
        let a = schema.index_of(name).ok_or_else(|| {
            SynthesizeError::Input(format!(
                "--target {name}: the schema has no attribute `{name}`"
            ))
        })?;
        if !options.targets.contains(&a) {
            options.targets.push(a);
        }
    }
    options.max_memory_bytes = cfg.max_memory;
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let fitted = synthesize_central(
        loaded.population.dims(),
        loaded.population.codes(),
        &options,
        &mut rng,
    )?;
    let rows = cfg
        .rows
        .unwrap_or(fitted.report.noisy_records.round().max(1.0) as u64);
    let file = std::fs::File::create(&cfg.out).map_err(output_error(&cfg.out))?;
    let mut writer = std::io::BufWriter::new(file);
    let mut failed = None;
    let format = match cfg.format {
        OutputFormat::Csv => Format::Csv,
        OutputFormat::Parquet => Format::Parquet,
    };
    write_synthetic(
        &fitted.model,
        &schema,
        rows,
        rng.next_u64(),
        format,
        Expansion::Recover,
        |chunk: Bytes| match writer.write_all(&chunk) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        },
    );
    if let Some(e) = failed {
        return Err(output_error(&cfg.out)(e));
    }
    writer.flush().map_err(output_error(&cfg.out))?;
    let report = SynthesizeReport {
        attributes: schema.attributes().iter().map(|a| a.name.clone()).collect(),
        rows,
        privacy: fitted.report,
        model: fitted.model.describe(),
    };
    if let Some(path) = &cfg.report {
        let json = serde_json::to_vec_pretty(&report).expect("the report serializes");
        std::fs::write(path, json).map_err(output_error(path))?;
    }
    let measured: Vec<String> = report
        .privacy
        .measurements
        .iter()
        .filter(|m| m.attrs.len() > 1)
        .map(|m| {
            m.attrs
                .iter()
                .map(|&a| report.attributes[a].as_str())
                .collect::<Vec<_>>()
                .join("×")
        })
        .collect();
    let capped = if report.privacy.max_clique_cells < options.max_clique_cells {
        format!(
            "; cliques capped at {} cells (not {}) to fit --max-memory {} MiB",
            report.privacy.max_clique_cells,
            options.max_clique_cells,
            cfg.max_memory >> 20
        )
    } else {
        String::new()
    };
    writeln!(
        out,
        "wrote {rows} synthetic rows to {} in {:.1} s: (ε = {}, δ = {:e})-DP (ρ = {:.5} zCDP, \
         spent {:.5}); {} marginals measured beyond the 1-ways: {}{capped}",
        cfg.out.display(),
        started.elapsed().as_secs_f64(),
        cfg.epsilon,
        cfg.delta,
        report.privacy.rho,
        report.privacy.rho_spent,
        measured.len(),
        measured.join(", ")
    )
    .map_err(output_error(Path::new("stdout")))?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn memory_sizes_parse_in_powers_of_1024() {
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("64 kb"), Ok(64 << 10));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        for bad in ["", "0", "2X", "-1G", "1.5G", "G", "99999999999T"] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.contains("not a memory size"), "{bad}: {e}");
        }
    }
}
