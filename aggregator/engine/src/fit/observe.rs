//! Observations and the fit: every table of every round, factor and mechanism is one
//! measurement. A measurement whose factor lies in a clique is observed whole; otherwise it
//! is summed down to the maximal subsets of its factor that lie in some clique (a pruned pair
//! still informs its two 1-ways). Cells are weighted by
//! [`crate::measure::measurement::Measurement::fit_variances`] (the one variance model: each
//! table's mean randomizer variance plus each cell's sampling variance), evaluated at the
//! current model: a short pilot fit ([`PILOT_ITERS`] steps) with variances at the
//! independence model of the Norm-Sub'd 1-ways, then the fit with variances at the pilot's
//! marginals, started from it (`benchmarks/sweeps/fit-weights.md`). The fit itself is
//! [`crate::fit::pgm`].

/// Mirror-descent steps of the pilot fit whose marginals the final fit's variances are
/// evaluated at: 100 gave the same 2-way TVD as 300 (within seed noise, all cells of
/// `benchmarks/sweeps/fit-weights.md`, variants E and F) in 30% less time.
pub const PILOT_ITERS: usize = 100;
use std::collections::BTreeSet;

use crate::EngineError;
use crate::domain::sizes::Domain;
use crate::fit::pgm::{FitOptions, GraphicalModel, Observation, fit};
use crate::graph::{Edge, JunctionTree, build_junction_tree};
use crate::measure::local_model::LocalModel;
use crate::measure::one_way::one_way_estimates;
use crate::measure::tables::Measurements;
use crate::numeric::index::{coarsen, outer};

/// Maximal subsets of `factor` (in factor order) that lie inside some clique.
fn fitting_parts(factor: &[usize], tree: &JunctionTree) -> Vec<Vec<usize>> {
    let k = factor.len();
    let fits = |s: &[usize]| tree.cliques.iter().any(|c| s.iter().all(|a| c.contains(a)));
    let mut parts: Vec<Vec<usize>> = Vec::new();
    // Larger subsets first, so a subset of a kept one is skipped.
    let mut masks: Vec<u32> = (1..(1u32 << k)).collect();
    masks.sort_by_key(|m| (std::cmp::Reverse(m.count_ones()), *m));
    for m in masks {
        let s: Vec<usize> = (0..k)
            .filter(|i| m >> i & 1 == 1)
            .map(|i| factor[i])
            .collect();
        if fits(&s) && !parts.iter().any(|p| s.iter().all(|a| p.contains(a))) {
            parts.push(s);
        }
    }
    parts
}

/// The observations of every measurement on `tree`, with the fit's variances at
/// `model_marginal` (the current model's marginal of a part, row-major in the part's order;
/// module docs).
fn observations(
    ms: &Measurements,
    tree: &JunctionTree,
    model_marginal: &dyn Fn(&[usize]) -> Vec<f64>,
) -> Vec<Observation> {
    let domain = ms.domain();
    let mut out = Vec::new();
    for m in ms.items() {
        for part in fitting_parts(&m.key.factor, tree) {
            let bins: Vec<Vec<u32>> = if m.key.bins.is_empty() {
                Vec::new()
            } else {
                part.iter().map(|&a| m.key.bins_of(a).to_vec()).collect()
            };
            let pdims = domain.project(&part);
            let at = coarsen(&model_marginal(&part), &pdims, &bins);
            let variances = m.fit_variances(&part, &at, ms.population());
            out.push(Observation {
                values: m.marginalized(&part),
                variances,
                attrs: part,
                bins,
                groups: Vec::new(),
            });
        }
    }
    out
}

/// Cap on how much more precise a party's central-DP measurement (LocMRF) may be than the
/// most precise LDP table in the fit: a local cell's variance is at least the smallest mean
/// cell variance of the LDP observations divided by this ratio. The fit's mirror descent
/// takes one step size for every observation; with no cap the local marginals (a party's
/// Gaussian noise on its whole table, 10³–10⁴ times more precise than per-record GRR at a
/// small ε) set it, and the cross-party pairs, which only the LDP tables measure, barely move:
/// NLTCS 8 & 8's 3-way TVD stays at 0.14–0.15 from total ε 0.8 to 3.2. The cap also shifts
/// weight from the local marginals to the LDP tables, which helps where the cross-party
/// dependence is strong (NLTCS: best at 1–5) and hurts where the LDP tables are very noisy
/// (Adult at ε 0.8: best at 50–100). 10 has the smallest worst-case and mean ratio to the
/// best value of each of the six cells swept (1, 5, 10, 25, 50, 100, no cap; NLTCS and Adult
/// at total ε 0.8, 1.6, 3.2, 3 seeds): `benchmarks/sweeps/local-precision-ratio.md`.
pub const LOCAL_PRECISION_RATIO: f64 = 10.0;

/// [`LOCAL_PRECISION_RATIO`] under encoding `sampled+locmrf`, whose LDP tables are each
/// measured at the party's whole report ε and so more precise than `fo`'s: the same ratio
/// floors the local marginals lower. Of 1, 5, 10, 25, 100 and no cap (NLTCS and Adult at
/// total ε 0.8, 1.6, 3.2, 3 seeds; `benchmarks/sweeps/local-precision-ratio.md`, "Under
/// encoding `sampled+locmrf`"), 5 has the smallest mean and worst ratio to each cell's best
/// (1.05 and 1.14; 10 gave 1.16 and 1.47): NLTCS 8 & 8's 3-way TVD 0.126 / 0.059 / 0.035.
pub const SAMPLED_LOCAL_PRECISION_RATIO: f64 = 5.0;

/// [`LOCAL_PRECISION_RATIO`] under encoding `sketch+locmrf`, where the floor is taken over
/// the cross-party sketch tables (no LDP table exists; their cells are far noisier than any
/// local marginal). Of 1, 10, 100 and no cap, 10 gave the lowest 3-way TVD on NLTCS 8 & 8 at
/// total ε 0.8 (0.032 / 0.023 / 0.035 / 0.052) and on Adult 8 & 7 at 1.6 (0.097 / 0.093 /
/// 0.100 / 0.109), 3 seeds each (`benchmarks/results/vertical-sketch-{nltcs,adult}.md`).
pub const SKETCH_LOCAL_PRECISION_RATIO: f64 = LOCAL_PRECISION_RATIO;

/// The observations of the parties' local models on `tree` (module docs of
/// [`crate::measure::local_model`]): each noisy marginal as frequencies `counts / n̂` with
/// variance `σ² / n̂²` per cell, summed down to the maximal parts of its attributes that lie
/// in some clique (a sum of `c` cells has variance `c σ²`), each variance at least `floor`.
pub fn local_observations(
    local: &[LocalModel],
    tree: &JunctionTree,
    domain: &Domain,
    floor: f64,
) -> Vec<Observation> {
    let mut out = Vec::new();
    for model in local {
        let n = model.noisy_records();
        for m in model.measurements() {
            let mdims = domain.project(m.attrs());
            for part in fitting_parts(m.attrs(), tree) {
                let map = crate::numeric::index::projection_map(m.attrs(), &mdims, &part);
                let cells = domain.table_len(&part);
                let summed = m.counts().len() / cells;
                let mut values = vec![0.0; cells];
                for (i, &t) in map.iter().enumerate() {
                    values[t] += m.counts()[i] / n;
                }
                let var = (summed as f64 * m.sigma() * m.sigma() / (n * n)).max(floor);
                out.push(Observation {
                    values,
                    variances: vec![var; cells],
                    attrs: part,
                    bins: Vec::new(),
                    groups: Vec::new(),
                });
            }
        }
    }
    out
}

/// Fits the graphical model over the junction tree of `edges` to every measurement (module
/// docs), with the parties' local models (vertical collections with local models; none for
/// the others) as further observations ([`local_observations`]), their variances floored at
/// the smallest mean cell variance of the LDP observations (and of the `cross` ones) over
/// `precision_ratio` ([`LOCAL_PRECISION_RATIO`]; `f64::INFINITY`: no floor). `cross` are
/// observations made apart from the tables, with fixed variances: the cross-party sketch
/// tables of a `sketch+locmrf` collection ([`crate::protocols::cross_party`]; built by
/// `cross(tree)`, empty for every other collection). An attribute no table measures starts
/// at its local models' 1-way. Every measured set of a local model must be complete in
/// `edges` to be observed whole. Errors: [`EngineError::NoData`] without measurements,
/// local models or cross observations.
pub fn fit_model_with_local(
    ms: &Measurements,
    local: &[LocalModel],
    cross: &dyn Fn(&JunctionTree) -> Vec<Observation>,
    precision_ratio: f64,
    edges: &BTreeSet<Edge>,
    options: &FitOptions,
) -> Result<GraphicalModel, EngineError> {
    let domain = ms.domain();
    let tree = build_junction_tree(domain.len(), edges);
    let cross = cross(&tree);
    if ms.items().is_empty() && local.is_empty() && cross.is_empty() {
        return Err(EngineError::NoData);
    }
    let mut one_way = one_way_estimates(ms);
    for (a, w) in one_way.iter_mut().enumerate() {
        if ms.combined(&[a]).is_none()
            && let Some(f) = local_one_way(local, a)
        {
            *w = f;
        }
    }
    let independent = |attrs: &[usize]| -> Vec<f64> {
        attrs
            .iter()
            .fold(vec![1.0], |acc, &a| outer(&acc, &one_way[a]))
    };
    // Start at the independence model: each attribute's log 1-way in the first clique
    // holding it.
    let mut start: Vec<Vec<f64>> = tree
        .cliques
        .iter()
        .map(|c| vec![0.0; domain.table_len(c)])
        .collect();
    for (a, marg) in one_way.iter().enumerate() {
        let Some(ci) = tree.cliques.iter().position(|c| c.contains(&a)) else {
            continue;
        };
        let clique = &tree.cliques[ci];
        let cdims = domain.project(clique);
        let map = crate::numeric::index::projection_map(clique, &cdims, &[a]);
        for (t, &v) in start[ci].iter_mut().zip(&map) {
            *t += marg[v].max(1e-9).ln();
        }
    }
    let pilot = FitOptions {
        max_iters: PILOT_ITERS.min(options.max_iters),
        ..options.clone()
    };
    let with_local = |mut obs: Vec<Observation>| {
        obs.extend(cross.iter().cloned());
        if !local.is_empty() {
            let floor = obs
                .iter()
                .map(|o| o.variances.iter().sum::<f64>() / o.variances.len().max(1) as f64)
                .fold(f64::INFINITY, f64::min)
                / precision_ratio;
            let floor = if floor.is_finite() { floor } else { 0.0 };
            obs.extend(local_observations(local, &tree, domain, floor));
        }
        obs
    };
    let first = fit(
        domain,
        &tree,
        &with_local(observations(ms, &tree, &independent)),
        Some(start),
        &pilot,
    )
    .map_err(|e| EngineError::Estimation(e.to_string()))?;
    let at_model = |attrs: &[usize]| {
        first
            .marginal_in_clique(attrs)
            .unwrap_or_else(|| independent(attrs))
    };
    fit(
        domain,
        &tree,
        &with_local(observations(ms, &tree, &at_model)),
        Some(first.potentials().to_vec()),
        options,
    )
    .map_err(|e| EngineError::Estimation(e.to_string()))
}

/// Attribute `a`'s 1-way from the first local model measuring it, projected onto the simplex.
fn local_one_way(local: &[LocalModel], a: usize) -> Option<Vec<f64>> {
    local.iter().find_map(|model| {
        model
            .measurements()
            .iter()
            .find(|m| m.attrs() == [a])
            .map(|m| {
                ldpsyn::mechanism::norm_sub(
                    &m.counts()
                        .iter()
                        .map(|c| c / model.noisy_records())
                        .collect::<Vec<_>>(),
                )
            })
    })
}

/// `model` (fitted by [`fit_model_with_local`] without local models) fitted again to `ms`, a
/// replicate of the tables it was fitted to ([`crate::fit::bootstrap`]): the fit's variances
/// at `model`'s marginals, started from its potentials (no pilot: the start is the fit the
/// pilot led to). Errors: the fit failing.
pub(crate) fn refit(
    ms: &Measurements,
    model: &GraphicalModel,
    options: &FitOptions,
) -> Result<GraphicalModel, EngineError> {
    let tree = model.tree();
    let at = |part: &[usize]| {
        model
            .marginal_in_clique(part)
            .expect("observed parts lie in cliques")
    };
    fit(
        ms.domain(),
        tree,
        &observations(ms, tree, &at),
        Some(model.potentials().to_vec()),
        options,
    )
    .map_err(|e| EngineError::Estimation(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::graph::{Edge, build_junction_tree};

    #[test]
    fn parts_are_maximal_and_fit() {
        let edges: BTreeSet<Edge> = [(0, 1), (1, 2)].into_iter().collect();
        let tree = build_junction_tree(4, &edges);
        assert_eq!(fitting_parts(&[0, 1], &tree), vec![vec![0, 1]]);
        assert_eq!(fitting_parts(&[2, 0], &tree), vec![vec![2], vec![0]]);
        assert_eq!(
            fitting_parts(&[0, 1, 2], &tree),
            vec![vec![0, 1], vec![1, 2]]
        );
        assert_eq!(fitting_parts(&[3, 1], &tree), vec![vec![3], vec![1]]);
    }
}
