//! Pieces the benchmark binaries share: a simulated collection of a CSV with raw numeric
//! columns, scored on raw values (`bench-numeric`, and `bench-utility --suite`'s numeric
//! rows), the upload load of `loadgen` and `bench-ingest` ([`load`]), and the rendering of
//! `docs/results.md`'s tables ([`report`]).

pub mod load;

use ldpsyn::Epsilon;
use ldpsyn::schema::{AttributeKind, DecodedValue, NumericDecoding, Schema};
use ldpsyn::wire::{CollectionConfig, PROTOCOL_VERSION, Protocol};
use ldpsyn_aggregator::engine::{Engine, EngineOptions, Expansion};
use ldpsyn_aggregator::eval::{
    MarginalCounts, NumericFidelity, evaluation_schema, numeric_fidelity, regrid,
};
use ldpsyn_aggregator::sim::{LoadedCsv, Population, Simulation};
use rand::SeedableRng;
use serde_json::{Value, json};

pub mod report;

/// Boxed error of the benchmark binaries.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// 1-D range queries per numeric column.
pub const RANGE_QUERIES: usize = 1000;

/// The outcome of one simulated collection of a CSV with raw numeric columns.
#[derive(Debug, Clone)]
pub struct NumericRun {
    /// Mean TVD over 1-way marginals on the evaluation grid
    /// ([`ldpsyn_aggregator::eval::evaluation_schema`]: `bins: "auto"` attributes at their
    /// working bins), synthetic vs the CSV's kept rows.
    pub tvd1: f64,
    /// Mean TVD over 2-way marginals on the evaluation grid.
    pub tvd2: f64,
    /// Edges of the learned model.
    pub edges: usize,
    /// Raw-value fidelity of every numeric attribute, in schema order.
    pub numeric: Vec<NumericFidelity>,
}

/// Engine options with sweep overrides from the environment (unset in committed results):
/// every knob of the engine's tuning registry ([`ldpsyn_aggregator::engine::tuning::KNOBS`]) whose
/// environment variable is set, e.g. `LDPSYN_AUTO_SHARE` for `auto`'s screening share.
/// Panics on a variable that is not a number, naming it (a sweep must not silently run the
/// defaults).
pub fn engine_options() -> EngineOptions {
    EngineOptions::from_overrides(|k| std::env::var(k).ok()).unwrap_or_else(|e| panic!("{e}"))
}

/// The protocol `name` with its default parameters, read as the service reads a create
/// request. Errors: an unknown name.
pub fn protocol(name: &str) -> Result<Protocol, Error> {
    Ok(serde_json::from_value(json!({ "protocol": name }))?)
}

/// Simulates one collection of `loaded` (read under `schema`) at `eps` with `seed` through
/// the in-process simulator (bucketed OUE), synthesizes as many rows with `numeric=recover`
/// decoding, and scores them: binned TVDs on the evaluation grid of `grid` (`None`:
/// `schema`'s; a schema of the same attributes whose bins are unions of `schema`'s cells) and
/// [`NumericFidelity`] per numeric attribute ([`RANGE_QUERIES`] range queries). Errors: an
/// invalid configuration, a failed simulation, an empty numeric column.
pub fn simulate_numeric(
    schema: &Schema,
    loaded: &LoadedCsv,
    eps: f64,
    seed: u64,
    protocol: Protocol,
    options: EngineOptions,
    grid: Option<&Schema>,
) -> Result<NumericRun, Error> {
    let pop = &loaded.population;
    let config = CollectionConfig {
        auto_finalize_at_target: false,
        past_target: ldpsyn::wire::PastTarget::Accept,
        retain_reports_days: None,
        target: Vec::new(),
        name: None,
        description: None,
        version: PROTOCOL_VERSION,
        id: uuid::Uuid::nil(),
        schema: schema.clone(),
        epsilon: Epsilon::new(eps)?,
        target_users: pop.len() as u64,
        protocol,
    };
    let engine = Engine::with_options(&config, options)?;
    let model = Simulation::new(&engine, pop)
        .seed(seed)
        .bucketed(true)
        .run()?
        .model;
    let rows: Vec<Vec<u32>> = model
        .synthesize_with(pop.len() as u64, seed ^ 0x5eed, Expansion::Recover)
        .collect();
    let synthetic = Population::from_rows(schema.domain_sizes(), rows.iter().cloned())?;
    let grid = evaluation_schema(grid.unwrap_or(schema));
    let real_binned = regrid(pop, schema, &grid)?;
    let synth_binned = regrid(&synthetic, schema, &grid)?;
    let tvd = |k: usize| -> Result<f64, Error> {
        let real = MarginalCounts::of_population(&real_binned, k);
        Ok(real.mean_tvd(&MarginalCounts::of_population(&synth_binned, k))?)
    };
    // Recovered codes are fine cells: a value uniform within one.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xdec0de);
    let mut numeric = Vec::new();
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
        numeric.push(numeric_fidelity(
            &attr.name,
            &real.values,
            &values,
            (min, max),
            RANGE_QUERIES,
            seed,
        )?);
    }
    Ok(NumericRun {
        tvd1: tvd(1)?,
        tvd2: tvd(2)?,
        edges: model.graph_edges().len(),
        numeric,
    })
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (mut sum, mut n) = (0.0, 0usize);
    for x in v {
        sum += x;
        n += 1;
    }
    sum / n.max(1) as f64
}

/// Per-column means over `runs` (same schema): `[{attribute, ks, w1, range_query_error,
/// mode_share_gap}]`, the gap being |real − synthetic share of the real column's mode|.
pub fn column_means(runs: &[NumericRun]) -> Vec<Value> {
    let columns = runs.first().map_or(0, |r| r.numeric.len());
    (0..columns)
        .map(|i| {
            let avg =
                |f: &dyn Fn(&NumericFidelity) -> f64| mean(runs.iter().map(|r| f(&r.numeric[i])));
            json!({
                "attribute": runs[0].numeric[i].attribute,
                "ks": avg(&|c| c.ks),
                "w1": avg(&|c| c.w1),
                "range_query_error": avg(&|c| c.range_query_error),
                "mode_share_gap": avg(&|c| (c.mode_share_real - c.mode_share_synthetic).abs()),
            })
        })
        .collect()
}

/// Mean over `runs` of the figure `f` picks.
pub fn run_mean(runs: &[NumericRun], f: impl Fn(&NumericRun) -> f64) -> f64 {
    mean(runs.iter().map(f))
}
