//! Central-DP benchmark: the curator's synthesizer (`ldpsyn-aggregator synthesize`, the
//! engine's `central` module) over coded tables × ε × seeds, beside the independence model
//! at the same budget and any external synthetic tables (e.g. private-pgm's MST or AIM run on
//! the same CSV). Per cell: the mean TVD of all 2-way marginals and of 300 sampled 3-way
//! marginals (the same sample for every method) between the data and a synthetic table of
//! as many rows, with the standard deviation over seeds.
//!
//! ```text
//! bench-central [--shared ../shared/datasets] [--datasets adult,br2000] [--epsilon E]…
//!     [--delta 1e-9] [--seeds 5] [--method central|central-pairs|independence]…
//!     [--external NAME=DATASET:EPS:FILE.csv]… [--out F.json]
//! ```
//!
//! Seeds make the runs reproducible (a simulation); the `synthesize` command itself draws
//! its noise from the operating system.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use ldpsyn::schema::Schema;
use ldpsyn_aggregator::engine::central::{CentralOptions, synthesize_central};
use ldpsyn_aggregator::eval::MarginalCounts;
use ldpsyn_aggregator::sim::{Population, load_csv};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Method, ε and per run (2-way TVD, 3-way TVD, seconds).
type Cell = (String, f64, Vec<(f64, f64, f64)>);

/// Tables: name, CSV and schema (relative to `--shared`), or a private-pgm domain file
/// (`{"attr": size}`) for tables coded 0..size−1.
const TABLES: [(&str, &str, &str); 3] = [
    (
        "adult",
        "adult-privmrf/adult.csv",
        "adult-privmrf/adult-domain.json",
    ),
    ("br2000", "br2000/br2000.csv", "br2000/br2000-schema.json"),
    ("nltcs", "nltcs/nltcs.csv", "nltcs/nltcs-schema.json"),
];

/// Central-DP benchmark (module docs).
#[derive(Debug, Parser)]
struct Args {
    /// Folder of the shared datasets.
    #[arg(long, default_value = "../shared/datasets")]
    shared: PathBuf,
    /// Tables to run (default: adult, br2000).
    #[arg(long, value_delimiter = ',', default_values_t = ["adult".to_string(), "br2000".to_string()])]
    datasets: Vec<String>,
    /// ε (repeat; default 0.2, 0.4, 0.8, 1.6, 3.2).
    #[arg(long = "epsilon")]
    epsilons: Vec<f64>,
    /// δ of every run.
    #[arg(long, default_value_t = 1e-9)]
    delta: f64,
    /// Seeds per cell (0: only score the `--external` tables).
    #[arg(long, default_value_t = 5)]
    seeds: u64,
    /// Methods (repeat; default all): `central` (pairs and triples), `central-pairs`,
    /// `independence` (the 1-ways only, at the whole budget).
    #[arg(long = "method")]
    methods: Vec<String>,
    /// An external synthetic CSV (same header and codes as the table):
    /// `NAME=DATASET:EPSILON:PATH` (repeat; one per seed).
    #[arg(long = "external")]
    externals: Vec<String>,
    /// Planned rounds (`CentralOptions::rounds`; default 16 per attribute).
    #[arg(long)]
    rounds: Option<usize>,
    /// Clique cap in cells (`CentralOptions::max_clique_cells`; default the engine's).
    #[arg(long)]
    max_clique_cells: Option<u64>,
    /// Cell-merging threshold in noise SDs (`CentralOptions::cell_merge`; default the
    /// engine's `CELL_MERGE_SIGMAS`; 0: every cell measured alone).
    #[arg(long)]
    cell_merge: Option<f64>,
    /// Write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A table coded by a schema or a domain file (then an all-categorical schema is made).
fn load(shared: &std::path::Path, csv: &str, meta: &str) -> Result<(Schema, Population), Error> {
    let text = std::fs::read_to_string(shared.join(meta))?;
    let schema: Schema = if meta.ends_with("-domain.json") {
        let domain: serde_json::Map<String, Value> = serde_json::from_str(&text)?;
        let attributes: Vec<Value> = domain
            .iter()
            .map(|(name, size)| {
                let k = size.as_u64().unwrap_or(0);
                json!({"name": name, "type": "categorical",
                       "labels": (0..k).map(|c| c.to_string()).collect::<Vec<_>>()})
            })
            .collect();
        serde_json::from_value(json!({ "attributes": attributes }))?
    } else {
        serde_json::from_str(&text)?
    };
    let loaded = load_csv(&shared.join(csv), &schema)?;
    Ok((schema, loaded.population))
}

fn tvds(real: &[MarginalCounts; 2], synth: &Population) -> Result<(f64, f64), Error> {
    Ok((
        real[0].mean_tvd(&real[0].like(synth))?,
        real[1].mean_tvd(&real[1].like(synth))?,
    ))
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (m, var.sqrt())
}

fn main() -> Result<(), Error> {
    let args = Args::parse();
    let epsilons = if args.epsilons.is_empty() {
        vec![0.2, 0.4, 0.8, 1.6, 3.2]
    } else {
        args.epsilons.clone()
    };
    let methods: Vec<String> = if args.methods.is_empty() {
        ["central", "central-pairs", "independence"]
            .map(String::from)
            .to_vec()
    } else {
        args.methods.clone()
    };
    let mut results = Vec::new();
    for (name, csv, meta) in TABLES {
        if !args.datasets.iter().any(|d| d == name) {
            continue;
        }
        let (schema, pop) = load(&args.shared, csv, meta)?;
        let real = [
            MarginalCounts::for_scoring(&pop, 2),
            MarginalCounts::for_scoring(&pop, 3),
        ];
        eprintln!("{name}: {} rows, {} attributes", pop.len(), pop.d());
        let mut cells: Vec<Cell> = Vec::new();
        for &eps in &epsilons {
            for method in &methods {
                let mut runs = Vec::new();
                for seed in 0..args.seeds {
                    let mut options = CentralOptions::new(eps, args.delta);
                    options.rounds = args.rounds;
                    if let Some(cap) = args.max_clique_cells {
                        options.max_clique_cells = cap;
                    }
                    if let Some(c) = args.cell_merge {
                        options.cell_merge = c;
                    }
                    options.max_marginal_attrs = match method.as_str() {
                        "central" => 3,
                        "central-pairs" => 2,
                        "independence" => 1,
                        other => return Err(format!("unknown method {other}").into()),
                    };
                    let started = Instant::now();
                    let mut rng = ChaCha12Rng::seed_from_u64(1000 * seed + 17);
                    let fitted = synthesize_central(pop.dims(), pop.codes(), &options, &mut rng)?;
                    let rows: Vec<Vec<u32>> = fitted
                        .model
                        .synthesize(pop.len() as u64, seed ^ 0x5eed)
                        .collect();
                    let synth = Population::from_rows(pop.dims().to_vec(), rows)?;
                    let (t2, t3) = tvds(&real, &synth)?;
                    let secs = started.elapsed().as_secs_f64();
                    eprintln!(
                        "  {method} ε {eps} seed {seed}: tvd2 {t2:.4} tvd3 {t3:.4} ({secs:.1} s, {} measurements, {} counts)",
                        fitted.report.measurements.len(),
                        fitted
                            .report
                            .measurements
                            .iter()
                            .map(|m| m.counts)
                            .sum::<usize>()
                    );
                    runs.push((t2, t3, secs));
                }
                if !runs.is_empty() {
                    cells.push((method.clone(), eps, runs));
                }
            }
        }
        for ext in &args.externals {
            let (label, rest) = ext
                .split_once('=')
                .ok_or("--external NAME=DATASET:EPS:PATH")?;
            let mut parts = rest.splitn(3, ':');
            let (Some(ds), Some(eps), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err("--external NAME=DATASET:EPS:PATH".into());
            };
            if ds != name {
                continue;
            }
            let eps: f64 = eps.parse()?;
            let synth = load_csv(&PathBuf::from(path), &schema)?.population;
            let (t2, t3) = tvds(&real, &synth)?;
            eprintln!("  {label} ε {eps} {path}: tvd2 {t2:.4} tvd3 {t3:.4}");
            match cells.iter_mut().find(|(m, e, _)| m == label && *e == eps) {
                Some(cell) => cell.2.push((t2, t3, f64::NAN)),
                None => cells.push((label.to_string(), eps, vec![(t2, t3, f64::NAN)])),
            }
        }
        for (method, eps, runs) in cells {
            let (t2, t2sd) = mean_sd(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
            let (t3, t3sd) = mean_sd(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
            let secs = runs.iter().map(|r| r.2).sum::<f64>() / runs.len() as f64;
            println!(
                "{name:8} {method:14} ε {eps:4}: tvd2 {t2:.4} ± {t2sd:.4}  tvd3 {t3:.4} ± {t3sd:.4}  ({} runs, {secs:.1} s each)",
                runs.len()
            );
            results.push(json!({
                "dataset": name, "method": method, "epsilon": eps, "delta": args.delta,
                "cell_merge": args.cell_merge, "runs": runs.len(), "tvd2": t2, "tvd2_std": t2sd, "tvd3": t3, "tvd3_std": t3sd,
                "seconds": if secs.is_finite() { json!(secs) } else { Value::Null },
            }));
        }
    }
    if let Some(path) = &args.out {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)?;
    }
    Ok(())
}
