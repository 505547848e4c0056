//! Property tests of every protocol over seeded random populations ([`BayesNet::random`]):
//! sparse forests and dense latent-class networks of 10–40 attributes with skewed 1-ways, in
//! i.i.d. arrival and in an arrival that drifts along one attribute ([`Population::drifted`];
//! the hidden class of a dense network, so that its rounds see different mixtures of the
//! classes, as NLTCS's grouped rows do). Too slow for a debug build: `.ci/run` runs them in
//! release (`cargo test --release -p ldpsyn-sim --lib -- --ignored random_populations`).
//!
//! Each case checks, over its ε and seeds:
//! - **the fit agrees with its measurements**: no table beyond noise
//!   ([`ldpsyn_engine::FitResiduals`]) unless the model reports that the population changed
//!   between rounds; with i.i.d. arrivals it never reports that. Under drift a model of one
//!   round (`independence` pools every report) has no strata to compare: its tables beyond
//!   noise are printed, not asserted;
//! - **error does not rise with ε** beyond the seeds' noise;
//! - **`auto` is within noise of the best other protocol** in both arrivals at ε ≥ 4 (at
//!   ε = 1 it can lose to independence when dependence is weak: printed, not asserted).

use std::collections::BTreeMap;

use ldpsyn::Epsilon;
use ldpsyn::wire::{PrivIncrParams, Protocol, SamPrivSynParams};

use super::{BayesNet, Dependence, Population, Simulation};
use crate::eval::MarginalCounts;
use ldpsyn_engine::{Engine, EngineOptions, Model};

/// Seeds per cell.
const SEEDS: u64 = 2;

/// ε of every cell.
const EPSILONS: [f64; 3] = [1.0, 4.0, 8.0];

fn protocols() -> Vec<Protocol> {
    vec![
        Protocol::Auto(PrivIncrParams::default()),
        Protocol::Privincr(PrivIncrParams::default()),
        Protocol::Noincremental(PrivIncrParams::default()),
        Protocol::Samprivsyn(SamPrivSynParams { batch_size: 2000 }),
        Protocol::Independence {},
    ]
}

/// Mean 2-way TVD of `model`'s synthetic rows (as many as `pop` has) from `pop`.
fn tvd2(pop: &Population, model: &Model, seed: u64) -> f64 {
    let syn = Population::from_rows(
        pop.dims().to_vec(),
        model.synthesize(pop.len() as u64, seed),
    )
    .expect("synthetic rows fit the schema");
    MarginalCounts::of_population(pop, 2)
        .mean_tvd(&MarginalCounts::of_population(&syn, 2))
        .expect("same schema")
}

/// One cell's runs: 2-way TVD per seed.
#[derive(Debug, Default, Clone)]
struct Cell {
    tvd2: Vec<f64>,
}

impl Cell {
    fn mean(&self) -> f64 {
        self.tvd2.iter().sum::<f64>() / self.tvd2.len() as f64
    }
    /// Standard error of the mean over seeds (sample standard deviation / √seeds).
    fn se(&self) -> f64 {
        let m = self.mean();
        let n = self.tvd2.len() as f64;
        let var = self.tvd2.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        (var / n).sqrt()
    }
}

/// Runs every protocol × ε × seed on `net`'s population of `n` people in `arrival` order,
/// checks the per-run properties (module docs) and returns the cells by (protocol, ε).
fn run_arrival(
    net: &BayesNet,
    n: usize,
    drifting: bool,
    label: &str,
) -> BTreeMap<(String, u64), Cell> {
    let full = net.sample(n, 1000 + n as u64);
    let ordered = if drifting {
        full.drifted(0, 5)
    } else {
        full.shuffled(5)
    };
    let pop = net.observed(&ordered);
    let mut cells: BTreeMap<(String, u64), Cell> = BTreeMap::new();
    for protocol in protocols() {
        for eps in EPSILONS {
            let engine = Engine::from_parts(
                pop.dims().to_vec(),
                Epsilon::new(eps).expect("a valid ε"),
                pop.len() as u64,
                protocol.clone(),
                EngineOptions::default(),
            )
            .expect("a valid engine");
            for seed in 0..SEEDS {
                let model = Simulation::new(&engine, &pop)
                    .seed(seed)
                    .bucketed(true)
                    .run()
                    .expect("the simulation runs")
                    .model;
                let name = protocol.name();
                let changed = model.drift().is_some_and(|d| d.population_changed);
                assert!(
                    drifting || !changed,
                    "{label} i.i.d. {name} ε={eps} seed {seed}: drift reported: {:?}",
                    model.drift()
                );
                if let Some(r) = model.residuals() {
                    // A model of one round (independence) has no strata to compare: under drift its residuals may show the change
                    // (printed) without a drift report.
                    if drifting && model.drift().is_none() {
                        if r.beyond_noise > 0 {
                            eprintln!(
                                "{label} {name} ε={eps} seed {seed}: one round, {} of {} \
                                 tables beyond noise",
                                r.beyond_noise, r.tables_checked
                            );
                        }
                    } else {
                        assert!(
                            changed || r.beyond_noise == 0,
                            "{label} {name} ε={eps} seed {seed}: the fit disagrees with its \
                             measurements and no drift is reported: {r:?}"
                        );
                    }
                }
                let t = tvd2(&pop, &model, seed);
                cells
                    .entry((name.to_string(), (eps * 10.0) as u64))
                    .or_default()
                    .tvd2
                    .push(t);
            }
        }
    }
    cells
}

/// The properties over cells of one population and arrival (module docs). Prints the table.
fn check(cells: &BTreeMap<(String, u64), Cell>, label: &str) {
    for ((p, e), c) in cells {
        eprintln!(
            "{label} {p:>13} ε={:<3} tvd2 {:.4} ± {:.4} {:?}",
            *e as f64 / 10.0,
            c.mean(),
            c.se(),
            c.tvd2
        );
    }
    let mut failures = Vec::new();
    let noise = |a: &Cell, b: &Cell| 2.0 * (a.se().powi(2) + b.se().powi(2)).sqrt() + 0.003;
    for ((p, e), c) in cells {
        // Error does not rise with ε.
        if let Some(((_, e2), c2)) = cells.range((p.clone(), e + 1)..).find(|((q, _), _)| q == p) {
            if c2.mean() > c.mean() + noise(c, c2) {
                failures.push(format!(
                    "{p}: tvd2 rises from ε={} ({:.4}) to ε={} ({:.4})",
                    *e as f64 / 10.0,
                    c.mean(),
                    *e2 as f64 / 10.0,
                    c2.mean()
                ));
            }
        }
    }
    // At ε = 1 `auto` is not yet within noise of the best protocol on every population: on
    // the sparse 40-attribute one it loses to independence (its screening round spends 30%
    // of the people on 780 weak pairs); printed above, asserted from ε = 4.
    for eps in EPSILONS.into_iter().filter(|&e| e >= 4.0) {
        let e = (eps * 10.0) as u64;
        let auto = &cells[&("auto".to_string(), e)];
        let (best_name, best) = cells
            .iter()
            .filter(|((p, x), _)| *x == e && p != "auto")
            .min_by(|a, b| a.1.mean().total_cmp(&b.1.mean()))
            .map(|((p, _), c)| (p.clone(), c))
            .expect("other protocols ran");
        if auto.mean() > 1.05 * best.mean() + noise(auto, best) {
            failures.push(format!(
                "ε={eps}: auto {:.4} against {best_name} {:.4}",
                auto.mean(),
                best.mean()
            ));
        }
    }
    assert!(failures.is_empty(), "{label}: {failures:#?}");
}

fn random_population_case(d: usize, dependence: Dependence, n: usize, seed: u64) {
    let net = BayesNet::random(d, dependence, seed);
    for drifting in [false, true] {
        let label = format!(
            "{dependence:?}-{d} n={n} {}",
            if drifting { "drift" } else { "iid" }
        );
        let cells = run_arrival(&net, n, drifting, &label);
        check(&cells, &label);
    }
}

#[test]
#[ignore = "slow in debug; .ci/run runs it with --release --ignored random_populations"]
fn random_populations_sparse_16() {
    random_population_case(16, Dependence::Sparse, 20_000, 1);
}

#[test]
#[ignore = "slow in debug; .ci/run runs it with --release --ignored random_populations"]
fn random_populations_dense_12() {
    random_population_case(12, Dependence::Dense, 20_000, 2);
}

#[test]
#[ignore = "slow in debug; .ci/run runs it with --release --ignored random_populations"]
fn random_populations_sparse_40() {
    random_population_case(40, Dependence::Sparse, 40_000, 3);
}

#[test]
#[ignore = "slow in debug; .ci/run runs it with --release --ignored random_populations"]
fn random_populations_dense_30() {
    random_population_case(30, Dependence::Dense, 40_000, 4);
}
