//! Vertical-collection benchmark (VertiMRF): a CSV split between parties, each party's ε per
//! person split over its attributes (one GRR each) equally or by
//! [`ldpsyn::vertical::split_epsilon`] (`l1`), through the in-process simulator
//! (seeded; the tables the service counts from party uploads). Per party ε and seed it
//! reports the mean 2-way TVD over all pairs and over cross-party pairs only, and the 1-way
//! TVD, for:
//! - `vertical-equal`, `vertical-l1`: the vertical collection under either split;
//! - `vertical-l1-1way`: the `l1` split's reports with no pair kept (the clique cap at 1 cell): what
//!   the learned cross- and intra-party edges add;
//! - `vertical-l1-locmrf`: encoding `fo+locmrf` at the same ε per party, split by
//!   [`ldpsyn::vertical::split_party_budget`] (`--locmrf-share` of it, with δ = `--delta`, to
//!   each party's local model, the rest as `l1`);
//! - `vertical-sampled-locmrf`: encoding `sampled+locmrf` at the same ε per party, split by
//!   [`ldpsyn::vertical::sampled_party_budget`] (`--locmrf-share` to the local model as
//!   above, the rest to the one attribute each record reports);
//! - `vertical-sketch-locmrf`: encoding `sketch+locmrf` (VertiMRF as published: local model
//!   plus one DP Flajolet–Martin sketch report per party, cross-party pairs by CarEst) at the
//!   same ε per party, split by [`ldpsyn::vertical::sketch_party_budget`]
//!   (`--sketch-locmrf-share` to the local model, the rest to the sketch report, 10% of that
//!   to n̂), half of `--delta` for the model and half for the sketches (the same composed δ
//!   as the other encodings), `t = --repetitions`,
//!   `--sketch-bins` equal-width bins per attribute;
//! - `auto` and `independence`: a centralized device collection at the same total ε per
//!   person (the sum over the parties), each person reporting once;
//! - `central`: one curator holding the joined table, with the central-DP synthesizer of
//!   `synthesize` ([`ldpsyn_aggregator::engine::central::synthesize_central`]: PrivMRF-style
//!   select–measure–fit under zCDP) at the same total ε and the composed δ;
//! - `exact-independence`: the non-private product of the data's 1-ways.
//!
//! ```text
//! bench-vertical --data examples/adult/adult.csv --schema examples/adult/schema.json \
//!     --parties examples/adult/parties.json [--party-epsilon E]… [--seeds S] [--out F] \
//!     [--method M]… [--write-parties F] [--tvd3] [--delta D] [--locmrf-share S] \
//!     [--sketch-locmrf-share S] [--repetitions T] [--sketch-bins B]
//! ```
//!
//! `--tvd3` adds the mean 3-way TVD over every attribute triple. `LDPSYN_GAIN_MARGIN`
//! overrides the vertical protocol's gain margin (the sweep in
//! `benchmarks/sweeps/gain-margin.md`), `LDPSYN_LOCAL_PRECISION_RATIO` the fit's cap on a
//! local model's precision (`benchmarks/sweeps/local-precision-ratio.md`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use ldpsyn::Epsilon;
use ldpsyn::schema::Schema;
use ldpsyn::vertical::{
    DEFAULT_LOCMRF_SHARE, DEFAULT_SKETCH_LOCMRF_SHARE, sampled_party_budget, sketch_party_budget,
    split_epsilon, split_party_budget,
};
use ldpsyn::wire::{
    CollectionConfig, PROTOCOL_VERSION, Party, PartyAttribute, Protocol, VerticalParams,
};
use ldpsyn::wire::{SketchSettings, VerticalEncoding};
use ldpsyn_aggregator::engine::central::{CentralOptions, synthesize_central};
use ldpsyn_aggregator::engine::{Engine, EngineOptions, Model};
use ldpsyn_aggregator::eval::{MarginalCounts, exact_independence_model};
use ldpsyn_aggregator::sim::{Population, Simulation, load_csv};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Mixed into a seed for the `central` method's noise.
const CENTRAL_STREAM: u64 = 0xCE47_2A1D_0000_0001;

/// Vertical-collection benchmark (module docs).
#[derive(Debug, Parser)]
struct Args {
    /// CSV with a header row.
    #[arg(long)]
    data: PathBuf,
    /// Its schema.
    #[arg(long)]
    schema: PathBuf,
    /// The parties (`{"parties": [{"name", "attributes": [{"name", …}]}]}`); their
    /// attributes' ε are replaced by `--party-epsilon` split equally.
    #[arg(long)]
    parties: PathBuf,
    /// ε per person towards each party (repeat; default 4 and 8).
    #[arg(long = "party-epsilon")]
    party_epsilons: Vec<f64>,
    /// Seeds per cell.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only these methods (repeat; default all).
    #[arg(long = "method")]
    methods: Vec<String>,
    /// Write the parties with the `l1` split of the first `--party-epsilon` here (the file
    /// `examples/adult/parties.json` is made so).
    #[arg(long)]
    write_parties: Option<PathBuf>,
    /// Also report the mean 3-way TVD over every attribute triple.
    #[arg(long)]
    tvd3: bool,
    /// δ of each party's local model (`vertical-l1-locmrf`; default 1/(people × parties), so
    /// the composed δ per person is 1/people).
    #[arg(long)]
    delta: Option<f64>,
    /// Share of each party's ε for its local model (`vertical-l1-locmrf`).
    #[arg(long, default_value_t = DEFAULT_LOCMRF_SHARE)]
    locmrf_share: f64,
    /// Share of each party's ε for its local model under `vertical-sketch-locmrf`.
    #[arg(long, default_value_t = DEFAULT_SKETCH_LOCMRF_SHARE)]
    sketch_locmrf_share: f64,
    /// Sketches per attribute value `t` (`vertical-sketch-locmrf`).
    #[arg(long, default_value_t = SketchSettings::default().repetitions)]
    repetitions: u32,
    /// Most equal-width bins per attribute for the sketches (`vertical-sketch-locmrf`).
    #[arg(long, default_value_t = SketchSettings::default().bins)]
    sketch_bins: u32,
}

struct Scores {
    tvd1: f64,
    tvd2: f64,
    tvd3: Option<f64>,
    cross_tvd2: f64,
    edges: usize,
    cross_edges: usize,
}

fn score(
    model: &Model,
    pop: &Population,
    owner: &[usize],
    seed: u64,
    tvd3: bool,
) -> Result<Scores, Error> {
    let rows = model.synthesize(pop.len() as u64, seed ^ 0x5eed);
    let synthetic = Population::from_rows(pop.dims().to_vec(), rows)?;
    let tvd = |k: usize, cross: bool| -> Result<f64, Error> {
        let real = MarginalCounts::of_population(pop, k);
        let synth = MarginalCounts::of_population(&synthetic, k);
        Ok(real.mean_tvd_where(&synth, |s| !cross || owner[s[0]] != owner[s[1]])?)
    };
    let edges: Vec<(usize, usize)> = model
        .describe()
        .model_graph
        .iter()
        .filter(|g| g.kept)
        .map(|g| (g.a, g.b))
        .collect();
    Ok(Scores {
        tvd1: tvd(1, false)?,
        tvd2: tvd(2, false)?,
        tvd3: if tvd3 { Some(tvd(3, false)?) } else { None },
        cross_tvd2: tvd(2, true)?,
        cross_edges: edges.iter().filter(|&&(a, b)| owner[a] != owner[b]).count(),
        edges: edges.len(),
    })
}

fn config(
    schema: &Schema,
    n: usize,
    epsilon: f64,
    protocol: Protocol,
) -> Result<CollectionConfig, Error> {
    Ok(CollectionConfig {
        auto_finalize_at_target: false,
        past_target: ldpsyn::wire::PastTarget::Accept,
        retain_reports_days: None,
        target: Vec::new(),
        name: None,
        description: None,
        version: PROTOCOL_VERSION,
        id: uuid::Uuid::nil(),
        schema: schema.clone(),
        epsilon: Epsilon::new(epsilon)?,
        target_users: n as u64,
        protocol,
    })
}

fn main() -> Result<(), Error> {
    let mut args = Args::parse();
    if args.party_epsilons.is_empty() {
        args.party_epsilons = vec![4.0, 8.0];
    }
    let schema: Schema = serde_json::from_str(&std::fs::read_to_string(&args.schema)?)?;
    let pop = load_csv(&args.data, &schema)?.population;
    let n = pop.len();
    let parties: Value = serde_json::from_str(&std::fs::read_to_string(&args.parties)?)?;
    let names: Vec<Vec<String>> = parties["parties"]
        .as_array()
        .ok_or("no `parties` array")?
        .iter()
        .map(|p| {
            p["attributes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a["name"].as_str().map(str::to_owned))
                .collect()
        })
        .collect();
    let mut owner = vec![usize::MAX; schema.len()];
    for (p, attrs) in names.iter().enumerate() {
        for a in attrs {
            owner[schema
                .index_of(a)
                .ok_or_else(|| format!("unknown attribute {a}"))?] = p;
        }
    }
    let exact = score(
        &exact_independence_model(Arc::new(pop.clone())),
        &pop,
        &owner,
        1,
        args.tvd3,
    )?;
    let mut results = Vec::new();
    let dims = schema.domain_sizes();
    let delta = args.delta.unwrap_or(1.0 / (n as f64 * names.len() as f64));
    for &e in &args.party_epsilons {
        let params_with =
            |optimal: bool, encoding: VerticalEncoding| -> Result<VerticalParams, Error> {
                Ok(VerticalParams {
                    parties: names
                        .iter()
                        .enumerate()
                        .map(|(p, attrs)| {
                            let k: Vec<usize> = attrs
                                .iter()
                                .map(|a| schema.index_of(a).map_or(2, |i| dims[i]))
                                .collect();
                            let (split, budget) = if encoding == VerticalEncoding::SketchLocmrf {
                                // Half of δ to the model, half to the sketches: the same
                                // composed δ as the other encodings.
                                let (split, budget) = sketch_party_budget(
                                    e,
                                    delta / 2.0,
                                    k.len(),
                                    args.sketch_locmrf_share,
                                )?;
                                (split.iter().map(|x| x.get()).collect(), Some(budget))
                            } else if encoding == VerticalEncoding::SampledLocmrf {
                                let (split, budget) =
                                    sampled_party_budget(e, delta, k.len(), args.locmrf_share)?;
                                (split.iter().map(|x| x.get()).collect(), Some(budget))
                            } else if encoding == VerticalEncoding::FoLocmrf {
                                let (split, budget) =
                                    split_party_budget(e, delta, &k, args.locmrf_share)?;
                                (split.iter().map(|x| x.get()).collect(), Some(budget))
                            } else if optimal {
                                (split_epsilon(e, &k), None)
                            } else {
                                (vec![e / attrs.len() as f64; attrs.len()], None)
                            };
                            Ok(Party {
                                name: format!("party{p}"),
                                attributes: attrs
                                    .iter()
                                    .zip(split)
                                    .map(|(a, eps)| {
                                        Ok(PartyAttribute {
                                            name: a.clone(),
                                            epsilon: Epsilon::new(eps)?,
                                        })
                                    })
                                    .collect::<Result<_, Error>>()?,
                                locmrf: budget,
                            })
                        })
                        .collect::<Result<_, Error>>()?,
                    encoding,
                    sketch: (encoding == VerticalEncoding::SketchLocmrf).then(|| SketchSettings {
                        delta: Some(delta / 2.0),
                        repetitions: args.repetitions,
                        bins: args.sketch_bins,
                        ..SketchSettings::default()
                    }),
                    budget: None,
                })
            };
        let params = |optimal: bool| params_with(optimal, VerticalEncoding::Fo);
        if let Some(path) = args.write_parties.take() {
            let mut params = params(true)?;
            for (party, given) in params
                .parties
                .iter_mut()
                .zip(parties["parties"].as_array().into_iter().flatten())
            {
                if let Some(name) = given["name"].as_str() {
                    party.name = name.to_owned();
                }
                // Four decimals for people to read, the rounding put on the largest share so
                // the party's total stays `e`.
                let mut eps: Vec<f64> = party
                    .attributes
                    .iter()
                    .map(|a| (a.epsilon.get() * 1e4).round() / 1e4)
                    .collect();
                let largest = (0..eps.len()).max_by(|&i, &j| eps[i].total_cmp(&eps[j]));
                if let Some(i) = largest {
                    let rest: f64 = eps.iter().sum::<f64>() - eps[i];
                    eps[i] = ((e - rest) * 1e4).round() / 1e4;
                }
                for (a, v) in party.attributes.iter_mut().zip(eps) {
                    a.epsilon = Epsilon::new(v)?;
                }
            }
            std::fs::write(
                &path,
                serde_json::to_string_pretty(&json!({"parties": params.parties}))? + "\n",
            )?;
        }
        let wanted = |m: &str| args.methods.is_empty() || args.methods.iter().any(|w| w == m);
        let total = (e * names.len() as f64).min(ldpsyn::MAX_EPSILON);
        let mut rows: BTreeMap<&str, Vec<Scores>> = BTreeMap::new();
        for seed in 0..args.seeds {
            for (label, optimal, cap, encoding) in [
                ("vertical-equal", false, None, VerticalEncoding::Fo),
                ("vertical-l1", true, None, VerticalEncoding::Fo),
                ("vertical-l1-1way", true, Some(1), VerticalEncoding::Fo),
                ("vertical-l1-locmrf", true, None, VerticalEncoding::FoLocmrf),
                (
                    "vertical-sampled-locmrf",
                    true,
                    None,
                    VerticalEncoding::SampledLocmrf,
                ),
                (
                    "vertical-sketch-locmrf",
                    true,
                    None,
                    VerticalEncoding::SketchLocmrf,
                ),
            ] {
                if !wanted(label) {
                    continue;
                }
                let params = params_with(optimal, encoding)?;
                let eps = params
                    .parties
                    .iter()
                    .map(|p| p.composed_epsilon(encoding))
                    .fold(0.0, f64::max);
                let vertical = config(&schema, n, eps, Protocol::Vertical(params))?;
                let options = EngineOptions {
                    max_clique_cells: cap,
                    gain_margin: std::env::var("LDPSYN_GAIN_MARGIN")
                        .ok()
                        .and_then(|v| v.parse().ok()),
                    local_precision_ratio: std::env::var("LDPSYN_LOCAL_PRECISION_RATIO")
                        .ok()
                        .and_then(|v| v.parse().ok()),
                    ..EngineOptions::default()
                };
                let engine = Engine::with_options(&vertical, options)?;
                let model = Simulation::new(&engine, &pop).seed(seed).run()?.model;
                rows.entry(label)
                    .or_default()
                    .push(score(&model, &pop, &owner, seed, args.tvd3)?);
            }
            for (label, protocol) in [
                ("auto", json!({"protocol": "auto"})),
                ("independence", json!({"protocol": "independence"})),
            ] {
                if !wanted(label) {
                    continue;
                }
                let engine = Engine::new(&config(
                    &schema,
                    n,
                    total,
                    serde_json::from_value(protocol)?,
                )?)?;
                let model = Simulation::new(&engine, &pop)
                    .seed(seed)
                    .bucketed(true)
                    .run()?
                    .model;
                rows.entry(label)
                    .or_default()
                    .push(score(&model, &pop, &owner, seed, args.tvd3)?);
            }
            if wanted("central") {
                // The central-DP model of one curator holding the joined table, at the total
                // ε and the composed δ of the vertical modes.
                let options = CentralOptions::new(total, delta * names.len() as f64);
                let mut rng = ChaCha12Rng::seed_from_u64(seed ^ CENTRAL_STREAM);
                let fit = synthesize_central(pop.dims(), pop.codes(), &options, &mut rng)?;
                rows.entry("central")
                    .or_default()
                    .push(score(&fit.model, &pop, &owner, seed, args.tvd3)?);
            }
        }
        for (label, s) in rows {
            let mean = |f: &dyn Fn(&Scores) -> f64| s.iter().map(f).sum::<f64>() / s.len() as f64;
            let tvd2 = mean(&|x| x.tvd2);
            let tvd2_std = (s.iter().map(|x| (x.tvd2 - tvd2).powi(2)).sum::<f64>()
                / (s.len().max(2) - 1) as f64)
                .sqrt();
            let tvd3 = s.iter().all(|x| x.tvd3.is_some()).then(|| {
                let m = mean(&|x| x.tvd3.unwrap_or(f64::NAN));
                let sd = (s
                    .iter()
                    .map(|x| (x.tvd3.unwrap_or(f64::NAN) - m).powi(2))
                    .sum::<f64>()
                    / (s.len().max(2) - 1) as f64)
                    .sqrt();
                (m, sd)
            });
            let row = json!({
                "party_epsilon": e, "total_epsilon": total, "method": label, "seeds": s.len(),
                "tvd1": mean(&|x| x.tvd1), "tvd2": tvd2, "tvd2_std": tvd2_std,
                "tvd3": tvd3.map(|t| t.0), "tvd3_std": tvd3.map(|t| t.1),
                "cross_party_tvd2": mean(&|x| x.cross_tvd2),
                "edges": mean(&|x| x.edges as f64), "cross_party_edges": mean(&|x| x.cross_edges as f64),
            });
            eprintln!("{row}");
            results.push(row);
        }
    }
    let out = json!({
        "data": args.data, "people": n, "parties": names,
        "epsilon_split": "vertical-equal: equal over each party's attributes; vertical-l1: ldpsyn::vertical::split_epsilon",
        "exact_independence": {"tvd2": exact.tvd2, "tvd3": exact.tvd3, "cross_party_tvd2": exact.cross_tvd2},
        "locmrf": {"share": args.locmrf_share, "delta_per_party": delta},
        "sketch": {"locmrf_share": args.sketch_locmrf_share, "count_share": SketchSettings::default().count_share,
                   "repetitions": args.repetitions, "bins": args.sketch_bins,
                   "model_delta_per_party": delta / 2.0, "sketch_delta_per_party": delta / 2.0},
        "results": results,
    });
    let text = serde_json::to_string_pretty(&out)?;
    match &args.out {
        Some(p) => {
            std::fs::write(p, text + "\n")?;
            std::fs::write(p.with_extension("md"), markdown(&out))?;
        }
        None => println!("{text}"),
    }
    Ok(())
}

/// The results as a Markdown table (written beside `--out`).
fn markdown(out: &Value) -> String {
    let mut md = format!(
        "# Vertical collections: {} ({} people)\n\nGenerated by `bench-vertical` \
         (`examples/src/bin/bench-vertical.rs`). Parties: {}. Mean over seeds of the TVD \
         between the synthetic table (rows = people) and the data: over all 2-way marginals, \
         over cross-party pairs only, and over 1-ways; edges = pairs in the model graph \
         (cross-party ones in parentheses). `auto` and `independence` are centralized \
         collections (each person reports once to one aggregator) at the same total ε; \
         `central` is one curator's central-DP model of the joined table (`synthesize`'s) at \
         the same total ε and composed δ. \
         `vertical-l1-locmrf` spends the same ε per party, part of it on the party's local \
         central-DP model (encoding `fo+locmrf`; its δ in the JSON); \
         `vertical-sampled-locmrf` the same model budget, each record reporting one attribute \
         per party drawn at random, at the rest of the party's ε (encoding `sampled+locmrf`; its \
         edges count only pairs an LDP table measures: cross-party ones, the pairs within a \
         party coming from the local models' graphs). `vertical-sketch-locmrf` is VertiMRF as \
         published (encoding `sketch+locmrf`): the local model plus one DP Flajolet–Martin \
         sketch report per party at the rest of its ε (settings under `sketch` in the JSON; \
         the party's δ is split evenly between model and sketches, so every encoding has the \
         same composed δ), cross-party pairs from CarEst; \
         its edges count the cross-party pairs kept. 3-way TVD: over every \
         attribute triple, when run with `--tvd3`. \
         Non-private exact independence: 2-way TVD {:.4}, cross-party {:.4}.\n\n\
         | ε per party | total ε | method | seeds | 2-way TVD ± std | 3-way TVD ± std | cross-party 2-way | 1-way | edges (cross) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        out["data"].as_str().unwrap_or_default(),
        out["people"],
        out["parties"],
        out["exact_independence"]["tvd2"]
            .as_f64()
            .unwrap_or(f64::NAN),
        out["exact_independence"]["cross_party_tvd2"]
            .as_f64()
            .unwrap_or(f64::NAN),
    );
    for r in out["results"].as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        md += &format!(
            "| {} | {} | {} | {} | {:.4} ± {:.4} | {} | {:.4} | {:.4} | {:.1} ({:.1}) |\n",
            f("party_epsilon"),
            f("total_epsilon"),
            r["method"].as_str().unwrap_or_default(),
            r["seeds"],
            f("tvd2"),
            f("tvd2_std"),
            if r["tvd3"].is_number() {
                format!("{:.4} ± {:.4}", f("tvd3"), f("tvd3_std"))
            } else {
                "—".to_owned()
            },
            f("cross_party_tvd2"),
            f("tvd1"),
            f("edges"),
            f("cross_party_edges"),
        );
    }
    md
}
