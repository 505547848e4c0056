//! From measurements to a fitted graphical model: the model graph (which dependencies the
//! model keeps), the observations the fit sees, and the fit itself ([`super::pgm`]).
//!
//! **Model graph.** Every measured pair `(a, b)` is scored by its expected gain
//! ([`pair_gain`]): its estimated dependence (the L1 distance between its combined estimate
//! and the product of the two 1-way estimates, debiased for noise: the independence model's
//! error on the pair) minus the L1 error noise gives its estimate (`√(2/π)·Σ_cells σ`: the
//! error the model takes on by keeping it). Positive gain means keeping the pair is expected
//! to lower the pair's error below the independence model's. Pairs with positive gain are added greedily, best first, while
//! the triangulated graph's largest clique stays within a cap on cells (VertiMRF §5.1, CSTR2:
//! add edges by estimated dependence while the junction tree fits).
//!
//! **Observations.** Every table of every round, factor and mechanism is one measurement. A
//! measurement whose factor lies in a clique is observed whole; otherwise it is summed down to
//! the maximal subsets of its factor that lie in some clique (a pruned pair still informs its
//! two 1-ways). Variances come from the one model of [`super::tables`], evaluated at the
//! current model: first at the independence model of the Norm-Sub'd 1-ways, then again at the
//! first fit's marginals, and the fit is repeated from there.

use std::collections::BTreeSet;

use ldpsyn::mechanism::norm_sub;

use super::EngineError;
use super::graph::{Edge, JunctionTree, build_junction_tree, edge};
use super::pgm::{FitOptions, GraphicalModel, Observation, fit};
use super::tables::Measurements;

/// Default cap on the cells of one clique of the model graph: bounds the fit's memory and
/// time (belief propagation is linear in the cells of all cliques); DESIGN.md suggests
/// 10⁵–10⁶. Not a utility constant: larger cliques are completed by maximum entropy from the
/// pairs they contain.
pub const MAX_CLIQUE_CELLS: u64 = 100_000;

/// `E[√max(z² − 1, 0)]` for a standard normal z: the mean of one cell's debiased
/// magnitude when the cell is pure noise (numerical integral).
const NULL_MAGNITUDE: f64 = 0.342_624;

/// The evidence for keeping one pair in the model graph.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairGain {
    /// `‖ŷ_ab − ŷ_a ⊗ ŷ_b‖₁` of the combined estimates.
    pub observed_l1: f64,
    /// `√(2/π)·Σ_cells σ`: the L1 error of the pair's estimate (σ at the independence fit).
    pub noise_l1: f64,
    /// The estimated dependence `D̂ = Σ_cells (√max(r² − σ², 0) − 0.3426·σ)`, `r` the cell's
    /// distance from independence: per cell, the magnitude with the noise's share removed
    /// in squares, centred so that a pure-noise cell contributes 0 on average. For a cell
    /// far from independence it is `|r|` less 0.34σ, where `observed_l1 − noise_l1` would
    /// subtract 0.8σ.
    pub dependence: f64,
}

impl PairGain {
    /// Expected reduction of the pair's L1 error from keeping it: the estimated dependence
    /// (the independence model's error) minus the noise the model takes on by keeping it.
    pub fn gain(&self) -> f64 {
        self.dependence - self.noise_l1
    }
}

/// Norm-Sub'd combination of every table containing each attribute (uniform if none).
pub fn one_way_estimates(ms: &Measurements) -> Vec<Vec<f64>> {
    let dims = ms.domain_sizes();
    (0..dims.len())
        .map(|a| match ms.combined(&[a]) {
            Some(c) => norm_sub(&c.frequencies),
            None => vec![1.0 / dims[a] as f64; dims[a]],
        })
        .collect()
}

/// The product of two 1-way distributions, row-major `a × b`.
fn outer(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .flat_map(|x| b.iter().map(move |y| x * y))
        .collect()
}

/// [`PairGain`] of `(a, b)` from every table containing both; `None` if none does.
pub fn pair_gain(ms: &Measurements, one_way: &[Vec<f64>], a: usize, b: usize) -> Option<PairGain> {
    let null = outer(&one_way[a], &one_way[b]);
    let c = ms.combined_at(&[a, b], |_| true, Some(&null))?;
    let noise_l1 = (2.0 / std::f64::consts::PI).sqrt() * c.std_errors.iter().sum::<f64>();
    let (mut observed_l1, mut dependence) = (0.0, 0.0);
    for ((y, x), s) in c.frequencies.iter().zip(&null).zip(&c.std_errors) {
        let r = y - x;
        observed_l1 += r.abs();
        dependence += (r * r - s * s).max(0.0).sqrt() - NULL_MAGNITUDE * s;
    }
    Some(PairGain {
        observed_l1,
        noise_l1,
        dependence,
    })
}

/// Largest clique (cells) of the junction tree of `edges`.
pub fn largest_clique_cells(dims: &[usize], edges: &BTreeSet<Edge>) -> u64 {
    build_junction_tree(dims.len(), edges)
        .cliques
        .iter()
        .map(|c| c.iter().map(|&a| dims[a] as u64).product::<u64>())
        .max()
        .unwrap_or(1)
}

/// The model graph (module docs): `candidates` (pairs with their gain) with positive gain,
/// added best first while the largest clique has at most `max_clique_cells` cells. Ties by
/// pair order, so the result depends only on the inputs.
pub fn select_model_graph(
    dims: &[usize],
    candidates: &[(Edge, PairGain)],
    max_clique_cells: u64,
) -> BTreeSet<Edge> {
    let mut ranked: Vec<(f64, Edge)> = candidates
        .iter()
        .filter(|(_, g)| g.gain() > 0.0)
        .map(|&(e, g)| (g.gain(), edge(e.0, e.1)))
        .collect();
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let mut chosen = BTreeSet::new();
    for (_, e) in ranked {
        chosen.insert(e);
        if largest_clique_cells(dims, &chosen) > max_clique_cells {
            chosen.remove(&e);
        }
    }
    chosen
}

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

/// The observations of every measurement on `tree`, with variances at `model_marginal`
/// (the current model's marginal of a part, row-major in the part's order).
fn observations(
    ms: &Measurements,
    tree: &JunctionTree,
    model_marginal: &dyn Fn(&[usize]) -> Vec<f64>,
) -> Vec<Observation> {
    let mut out = Vec::new();
    for m in ms.items() {
        for part in fitting_parts(&m.key.factor, tree) {
            let at = model_marginal(&part);
            let variances = m
                .cell_variances(&part, &at, ms.population())
                .into_iter()
                .map(|v| v.max(1e-300))
                .collect();
            out.push(Observation {
                values: m.marginalized(&part),
                variances,
                attrs: part,
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
        let map = super::tables::projection_map(clique, &cdims, &[a]);
        for (t, &v) in start[ci].iter_mut().zip(&map) {
            *t += marg[v].max(1e-9).ln();
        }
    }
    let err = |e: super::pgm::FitError| EngineError::Estimation(e.to_string());
    let first = fit(
        dims,
        &tree,
        &observations(ms, &tree, &independent),
        Some(start),
        options,
    )
    .map_err(err)?;
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
    .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn model_graph_respects_gain_and_cap() {
        let dims = [10usize, 10, 10, 10];
        let g = |o: f64| PairGain {
            observed_l1: o,
            noise_l1: 0.1,
            dependence: o - 0.1,
        };
        let cands = [
            ((0, 1), g(0.5)),
            ((1, 2), g(0.4)),
            ((0, 2), g(0.3)),
            ((2, 3), g(0.15)),
        ];
        // Cap 100 cells: no triangle (1000 cells); (2, 3) has negative gain.
        let e = select_model_graph(&dims, &cands, 100);
        assert_eq!(e, [(0, 1), (1, 2)].into_iter().collect());
        let e = select_model_graph(&dims, &cands, 1000);
        assert_eq!(e, [(0, 1), (0, 2), (1, 2)].into_iter().collect());
    }
}
