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
use crate::fit::pgm::{FitOptions, GraphicalModel, Observation, fit};
use crate::graph::{Edge, JunctionTree, build_junction_tree};
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
    let dims = ms.domain_sizes();
    let mut out = Vec::new();
    for m in ms.items() {
        for part in fitting_parts(&m.key.factor, tree) {
            let bins: Vec<Vec<u32>> = if m.key.bins.is_empty() {
                Vec::new()
            } else {
                part.iter().map(|&a| m.key.bins_of(a).to_vec()).collect()
            };
            let pdims: Vec<usize> = part.iter().map(|&a| dims[a]).collect();
            let at = coarsen(&model_marginal(&part), &pdims, &bins);
            let variances = m.fit_variances(&part, &at, ms.population());
            out.push(Observation {
                values: m.marginalized(&part),
                variances,
                attrs: part,
                bins,
            });
        }
    }
    out
}

/// Fits the graphical model over the junction tree of `edges` to every measurement (module
/// docs). Errors: [`EngineError::NoData`] without measurements.
pub fn fit_model(
    ms: &Measurements,
    edges: &BTreeSet<Edge>,
    options: &FitOptions,
) -> Result<GraphicalModel, EngineError> {
    if ms.items().is_empty() {
        return Err(EngineError::NoData);
    }
    let dims = ms.domain_sizes();
    let tree = build_junction_tree(dims.len(), edges);
    let one_way = one_way_estimates(ms);
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
        .map(|c| vec![0.0; c.iter().map(|&a| dims[a]).product()])
        .collect();
    for (a, marg) in one_way.iter().enumerate() {
        let Some(ci) = tree.cliques.iter().position(|c| c.contains(&a)) else {
            continue;
        };
        let clique = &tree.cliques[ci];
        let cdims: Vec<usize> = clique.iter().map(|&x| dims[x]).collect();
        let map = crate::numeric::index::projection_map(clique, &cdims, &[a]);
        for (t, &v) in start[ci].iter_mut().zip(&map) {
            *t += marg[v].max(1e-9).ln();
        }
    }
    let pilot = FitOptions {
        max_iters: PILOT_ITERS.min(options.max_iters),
        ..options.clone()
    };
    let first = fit(
        dims,
        &tree,
        &observations(ms, &tree, &independent),
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
        dims,
        &tree,
        &observations(ms, &tree, &at_model),
        Some(first.potentials().to_vec()),
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
