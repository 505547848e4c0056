//! Numeric fidelity benchmark: a CSV with raw numeric columns under one or more schemas,
//! through the in-process simulator (seeded, deterministic), at several ε and seeds. For
//! each run: per numeric column the Kolmogorov–Smirnov distance, W1/(max − min), the mean
//! 1-D range-query error and the share of the column's mode (a point mass such as 0 or 40
//! hours), real vs synthetic values (`numeric=recover` decoding); and the binned 1- and
//! 2-way TVDs on the evaluation grid (`bins: "auto"` attributes at their working bins,
//! [`ldpsyn_aggregator::eval::evaluation_schema`]), so schemas that bin the same columns
//! differently compare on one grid.
//!
//! ```text
//! bench-numeric --data examples/adult/adult.csv \
//!     --schema examples/adult/schema-points.json --schema examples/adult/schema-auto.json \
//!     [--epsilon E]… [--seeds S] [--protocol auto] [--out results.json] [--grid SCHEMA]
//! ```
//! The environment overrides engine options for sweeps ([`ldpsyn_examples::engine_options`];
//! unset in committed results).

use std::path::PathBuf;

use clap::Parser;
use ldpsyn::schema::Schema;
use ldpsyn_aggregator::sim::load_csv;
use ldpsyn_examples::{
    Error, NumericRun, column_means, engine_options, protocol, run_mean, simulate_numeric,
};
use serde_json::json;

/// Numeric fidelity benchmark (module docs).
#[derive(Debug, Parser)]
struct Args {
    /// CSV with a header row.
    #[arg(long)]
    data: PathBuf,
    /// Schemas to compare (repeat the flag).
    #[arg(long = "schema", required = true)]
    schemas: Vec<PathBuf>,
    /// ε values (repeat the flag; default 1 and 4).
    #[arg(long = "epsilon")]
    epsilons: Vec<f64>,
    /// Seeds per cell.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Protocol: auto, privincr, noincremental, samprivsyn or independence.
    #[arg(long, default_value = "auto")]
    protocol: String,
    /// Write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Take the binned TVDs on this schema's evaluation grid instead of each schema's own
    /// (to compare schemas whose working bins differ, e.g. other `max_bins`).
    #[arg(long)]
    grid: Option<PathBuf>,
}

fn main() -> Result<(), Error> {
    let mut args = Args::parse();
    if args.epsilons.is_empty() {
        args.epsilons = vec![1.0, 4.0];
    }
    let grid: Option<Schema> = match &args.grid {
        Some(p) => Some(serde_json::from_str(&std::fs::read_to_string(p)?)?),
        None => None,
    };
    let mut results = Vec::new();
    for path in &args.schemas {
        let schema: Schema = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        let loaded = load_csv(&args.data, &schema)?;
        for &eps in &args.epsilons {
            let runs: Vec<NumericRun> = (0..args.seeds)
                .map(|s| {
                    let protocol = protocol(&args.protocol)?;
                    simulate_numeric(
                        &schema,
                        &loaded,
                        eps,
                        1000 * s + 7,
                        protocol,
                        engine_options(),
                        grid.as_ref(),
                    )
                })
                .collect::<Result<_, _>>()?;
            let tvd2: Vec<f64> = runs.iter().map(|r| r.tvd2).collect();
            let columns = column_means(&runs);
            let row = json!({
                "schema": path.display().to_string(), "protocol": args.protocol, "epsilon": eps,
                "seeds": args.seeds, "users": loaded.population.len(),
                "tvd1_mean": run_mean(&runs, |r| r.tvd1),
                "tvd2_mean": run_mean(&runs, |r| r.tvd2), "tvd2_runs": tvd2, "numeric": columns,
            });
            println!(
                "{} ε={eps}: tvd1 {:.4} tvd2 {:.4}",
                path.display(),
                row["tvd1_mean"].as_f64().unwrap_or(f64::NAN),
                row["tvd2_mean"].as_f64().unwrap_or(f64::NAN)
            );
            for c in &columns {
                println!(
                    "    {:<16} KS {:.3}  W1 {:.4}  range {:.4}  mode gap {:.3}",
                    c["attribute"].as_str().unwrap_or(""),
                    c["ks"].as_f64().unwrap_or(f64::NAN),
                    c["w1"].as_f64().unwrap_or(f64::NAN),
                    c["range_query_error"].as_f64().unwrap_or(f64::NAN),
                    c["mode_share_gap"].as_f64().unwrap_or(f64::NAN)
                );
            }
            results.push(row);
        }
    }
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&results)? + "\n")?;
    }
    Ok(())
}
