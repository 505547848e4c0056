//! What a finalize costs at scale (issue 34 item 5): the suite's widest real tables and a
//! generated 100-attribute one are collected through the in-process simulator (file order,
//! seeded), then `Engine::finalize` is timed on the same state and tables `--repeats` times.
//! The figure is the finalize alone (measure, select, fit, smooth, structure), not the
//! simulation: what an operator waits for after `POST …/finalize`.
//!
//! ```text
//! bench-fit [--shared ../shared/datasets] [--datasets temporal-match2,nist-taxi,generated-100]
//!     [--epsilon 8]… [--protocol auto] [--repeats 3] [--seed 1] [--out F.json]
//! ```
//!
//! Per dataset × ε: attributes, people, model edges, cliques and clique cells of the fitted
//! junction tree (working domain), the median and minimum finalize seconds (wall), the median
//! CPU seconds (the process's, which another load on the machine disturbs less than wall
//! time; the finalize is single-threaded), and the median wall seconds per million clique
//! cells. `generated-N` is `BayesNet::random(N, Sparse, 7)` with
//! 200,000 people (a random forest of 2–6-valued attributes); `dense-N` the same with
//! `Dense` (a hidden class every attribute copies: every pair depends). Figures, not a test: nothing is
//! asserted; compare runs of the same build on the same machine.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use ldpsyn::Epsilon;
use ldpsyn::schema::Schema;
use ldpsyn_aggregator::engine::Engine;
use ldpsyn_aggregator::sim::{BayesNet, Dependence, Population, Simulation, load_csv};
use ldpsyn_examples::load::cpu_seconds;
use ldpsyn_examples::{Error, engine_options, protocol};
use serde_json::{Value, json};

/// Finalize benchmark (module docs).
#[derive(Debug, Parser)]
struct Args {
    /// Folder of the suite's data sets (`NAME/NAME.csv`, `NAME/NAME-schema.json`).
    #[arg(long, default_value = "../shared/datasets")]
    shared: PathBuf,
    /// Data sets: suite names, or `generated-N` (`dense-N`) for a random sparse (dense)
    /// N-attribute network.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "temporal-match2,generated-100"
    )]
    datasets: Vec<String>,
    /// ε of the collection (repeat).
    #[arg(long = "epsilon")]
    epsilons: Vec<f64>,
    /// Protocol (its default parameters).
    #[arg(long, default_value = "auto")]
    protocol: String,
    /// Timed finalizes per cell.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Seed of the simulated collection.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the rows as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// People of a generated data set.
const GENERATED_PEOPLE: usize = 200_000;

fn population(args: &Args, name: &str) -> Result<Population, Error> {
    let generated = [
        ("generated-", Dependence::Sparse),
        ("dense-", Dependence::Dense),
    ];
    for (prefix, dependence) in generated {
        if let Some(d) = name.strip_prefix(prefix) {
            let d: usize = d.parse().map_err(|_| format!("bad data set {name}"))?;
            let net = BayesNet::random(d, dependence, 7);
            return Ok(net.sample(GENERATED_PEOPLE, 11));
        }
    }
    let dir = args.shared.join(name);
    let schema: Schema = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}-schema.json")))
            .map_err(|e| format!("{}: {e}", dir.display()))?,
    )?;
    Ok(load_csv(&dir.join(format!("{name}.csv")), &schema)?.population)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Error> {
    let mut args = Args::parse();
    if args.epsilons.is_empty() {
        args.epsilons = vec![8.0];
    }
    let mut rows: Vec<Value> = Vec::new();
    println!(
        "| data set | attributes | people | ε | edges | cliques | clique cells | finalize s (median) | min s | CPU s (median) | s per M cells |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for name in &args.datasets {
        let pop = population(&args, name)?;
        for &eps in &args.epsilons {
            let engine = Engine::from_parts(
                pop.dims().to_vec(),
                Epsilon::new(eps)?,
                pop.len() as u64,
                protocol(&args.protocol)?,
                engine_options(),
            )?;
            let run = Simulation::new(&engine, &pop)
                .seed(args.seed)
                .bucketed(true)
                .run()?;
            let mut seconds = Vec::with_capacity(args.repeats);
            let mut cpu = Vec::with_capacity(args.repeats);
            let mut model = run.model;
            for _ in 0..args.repeats.max(1) {
                let (start, cpu_start) = (Instant::now(), cpu_seconds("self"));
                model = engine.finalize(&run.state, &run.tables)?;
                seconds.push(start.elapsed().as_secs_f64());
                if let (Some(a), Some(b)) = (cpu_start, cpu_seconds("self")) {
                    cpu.push(b - a);
                }
            }
            let cpu_med = if cpu.is_empty() {
                f64::NAN
            } else {
                median(&mut cpu)
            };
            let desc = model.describe();
            let dims = model.dims();
            let (cliques, cells) = desc.structure.as_ref().map_or((0, 0u64), |s| {
                let cliques = &s.junction_tree.cliques;
                let cells = cliques
                    .iter()
                    .map(|c| c.iter().map(|&a| dims[a] as u64).product::<u64>())
                    .sum();
                (cliques.len(), cells)
            });
            let min = seconds.iter().copied().fold(f64::INFINITY, f64::min);
            let med = median(&mut seconds);
            let per_m = med / (cells.max(1) as f64 / 1e6);
            println!(
                "| {name} | {} | {} | {eps} | {} | {cliques} | {cells} | {med:.3} | {min:.3} | {cpu_med:.2} | {per_m:.3} |",
                dims.len(),
                pop.len(),
                model.graph_edges().len(),
            );
            rows.push(json!({
                "dataset": name, "attributes": dims.len(), "people": pop.len(),
                "epsilon": eps, "protocol": args.protocol, "edges": model.graph_edges().len(),
                "cliques": cliques, "clique_cells": cells, "finalize_seconds": seconds,
                "finalize_seconds_median": med, "cpu_seconds": cpu, "cpu_seconds_median": cpu_med,
                "seconds_per_million_cells": per_m,
            }));
        }
    }
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&rows)? + "\n")?;
    }
    Ok(())
}
