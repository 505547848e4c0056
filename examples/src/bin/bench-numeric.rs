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
//!     [--epsilon E]… [--seeds S] [--protocol auto] [--out results.json]
//! ```
//! `LDPSYN_SUB_BIN_SHARE` and `LDPSYN_SUB_BINS` override the engine's sub-bin 1-ways, for
//! sweeps (unset in committed results).

use std::path::PathBuf;

use clap::Parser;
use ldpsyn::Epsilon;
use ldpsyn::protocol::{CollectionConfig, PROTOCOL_VERSION, Protocol};
use ldpsyn::schema::{AttributeKind, DecodedValue, NumericDecoding, Schema};
use ldpsyn_aggregator::engine::{Engine, EngineOptions, Expansion};
use ldpsyn_aggregator::eval::{MarginalCounts, evaluation_schema, numeric_fidelity, regrid};
use ldpsyn_aggregator::sim::{Population, Simulation, load_csv};
use rand::SeedableRng;
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// 1-D range queries per numeric column.
const RANGE_QUERIES: usize = 1000;

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
}

/// The protocol `name` with its default parameters, read as the service reads a create
/// request.
fn protocol(name: &str) -> Result<Protocol, Error> {
    Ok(serde_json::from_value(json!({ "protocol": name }))?)
}

fn options() -> EngineOptions {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
    EngineOptions {
        sub_bin_share: env("LDPSYN_SUB_BIN_SHARE"),
        sub_bins: std::env::var("LDPSYN_SUB_BINS")
            .ok()
            .and_then(|v| v.parse().ok()),
        ..EngineOptions::default()
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// One schema × ε × seed: the metrics as JSON.
fn run(
    schema: &Schema,
    loaded: &ldpsyn_aggregator::sim::LoadedCsv,
    eps: f64,
    seed: u64,
    proto: &str,
) -> Result<Value, Error> {
    let pop = &loaded.population;
    let config = CollectionConfig {
        version: PROTOCOL_VERSION,
        id: uuid::Uuid::nil(),
        schema: schema.clone(),
        epsilon: Epsilon::new(eps)?,
        target_users: pop.len() as u64,
        protocol: protocol(proto)?,
    };
    let engine = Engine::with_options(&config, options())?;
    let model = Simulation::new(&engine, pop)
        .seed(seed)
        .bucketed(true)
        .run()?
        .model;
    let rows: Vec<Vec<u32>> = model
        .synthesize_with(pop.len() as u64, seed ^ 0x5eed, Expansion::Recover)
        .collect();
    let synthetic = Population::from_rows(schema.domain_sizes(), rows.iter().cloned())?;
    let grid = evaluation_schema(schema);
    let real_binned = regrid(pop, schema, &grid)?;
    let synth_binned = regrid(&synthetic, schema, &grid)?;
    let tvd = |k: usize| -> Result<f64, Error> {
        let real = MarginalCounts::of_population(&real_binned, k);
        Ok(real.mean_tvd(&MarginalCounts::of_population(&synth_binned, k))?)
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xdec0de);
    let mut columns = Vec::new();
    for real in &loaded.numeric {
        let attr = &schema.attributes()[real.attribute];
        let AttributeKind::Numeric { min, max, .. } = attr.kind else {
            continue;
        };
        let values: Vec<f64> = rows
            .iter()
            .map(
                |r| match attr.decode(r[real.attribute], NumericDecoding::Uniform, &mut rng) {
                    DecodedValue::Number(x) => x,
                    _ => f64::NAN,
                },
            )
            .collect();
        let f = numeric_fidelity(
            &attr.name,
            &real.values,
            &values,
            (min, max),
            RANGE_QUERIES,
            seed,
        )?;
        columns.push(serde_json::to_value(f)?);
    }
    Ok(json!({"tvd1": tvd(1)?, "tvd2": tvd(2)?, "numeric": columns}))
}

fn main() -> Result<(), Error> {
    let mut args = Args::parse();
    if args.epsilons.is_empty() {
        args.epsilons = vec![1.0, 4.0];
    }
    let mut results = Vec::new();
    for path in &args.schemas {
        let schema: Schema = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        let loaded = load_csv(&args.data, &schema)?;
        for &eps in &args.epsilons {
            let runs: Vec<Value> = (0..args.seeds)
                .map(|s| run(&schema, &loaded, eps, 1000 * s + 7, &args.protocol))
                .collect::<Result<_, _>>()?;
            let avg = |f: &dyn Fn(&Value) -> f64| mean(&runs.iter().map(f).collect::<Vec<_>>());
            let tvd2: Vec<f64> = runs
                .iter()
                .map(|r| r["tvd2"].as_f64().unwrap_or(f64::NAN))
                .collect();
            let columns: Vec<Value> = (0..runs[0]["numeric"].as_array().map_or(0, Vec::len))
                .map(|i| {
                    let col =
                        |k: &str| avg(&|r: &Value| r["numeric"][i][k].as_f64().unwrap_or(f64::NAN));
                    let mode_gap = avg(&|r: &Value| {
                        let c = &r["numeric"][i];
                        (c["mode_share_real"].as_f64().unwrap_or(f64::NAN)
                            - c["mode_share_synthetic"].as_f64().unwrap_or(f64::NAN))
                        .abs()
                    });
                    json!({"attribute": runs[0]["numeric"][i]["attribute"], "ks": col("ks"),
                           "w1": col("w1"), "range_query_error": col("range_query_error"),
                           "mode_share_gap": mode_gap})
                })
                .collect();
            let row = json!({
                "schema": path.display().to_string(), "protocol": args.protocol, "epsilon": eps,
                "seeds": args.seeds, "users": loaded.population.len(),
                "tvd1_mean": avg(&|r: &Value| r["tvd1"].as_f64().unwrap_or(f64::NAN)),
                "tvd2_mean": mean(&tvd2), "tvd2_runs": tvd2, "numeric": columns,
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
