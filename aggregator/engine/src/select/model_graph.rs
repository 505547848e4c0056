//! The model graph: pairs with positive expected gain ([`crate::select::gain`]) are added
//! greedily, best first, while the triangulated graph's largest clique stays within a cap on
//! cells (VertiMRF §5.1, CSTR2: add edges by estimated dependence while the junction tree
//! fits).

/// Default cap on the cells of one clique of the model graph: bounds the fit's memory and
/// time (belief propagation is linear in the cells of all cliques); the junction trees of
/// the field use 10⁵–10⁶. Not a utility constant: larger cliques are completed by maximum
/// entropy from the pairs they contain. A collection of fewer people caps its cliques at
/// their number ([`clique_cap`]).
pub const MAX_CLIQUE_CELLS: u64 = 100_000;
use std::collections::BTreeSet;

use crate::domain::sizes::Domain;
use crate::graph::{Edge, build_junction_tree, edge};
use crate::select::gain::PairGain;

/// Cap on the cells of one clique of the model graph of a collection of `people`: `option`
/// if set, else the smaller of [`MAX_CLIQUE_CELLS`] and `people`. A clique with more cells
/// than people has more free cells than the data has records, and the fit fills them from
/// noisy pairs alone: on NLTCS (21,574 people, 16 binary attributes) at ε = 8 every pair is
/// kept and the junction tree is one clique of 65,536 cells, 2-way TVD 0.0218 against 0.0181
/// at ε = 4; capped at the people, 0.0174 (the same rule as PrivBayes's θ-usefulness, Zhang et
/// al., "PrivBayes: Private Data Release via Bayesian Networks", TODS 42(4), 2017, §4.3: a
/// factor's cells bounded by the records that estimate it). No other suite table changes
/// (`benchmarks/sweeps/clique-cap.md`).
pub fn clique_cap(option: Option<u64>, people: u64) -> u64 {
    option.unwrap_or(MAX_CLIQUE_CELLS.min(people.max(1)))
}

/// Cells of the largest clique of the junction tree of `edges` over `domain` (saturating at
/// `u64::MAX`; 1 without attributes).
pub fn largest_clique_cells(domain: &Domain, edges: &BTreeSet<Edge>) -> u64 {
    build_junction_tree(domain.len(), edges)
        .cliques
        .iter()
        .map(|c| domain.cells(c))
        .max()
        .unwrap_or(1)
}

/// [`select_model_graph_from`] with no given edges (tests).
#[cfg(test)]
pub fn select_model_graph(
    domain: &Domain,
    candidates: &[(Edge, PairGain)],
    max_clique_cells: u64,
    margin: f64,
) -> BTreeSet<Edge> {
    select_model_graph_from(
        domain,
        &BTreeSet::new(),
        candidates,
        max_clique_cells,
        margin,
        |_, _| 1.0,
    )
}

/// The model graph (module docs) over the working `domain`: the edges `given` (kept whatever
/// their gain: the parties' local graphs of an `fo+locmrf` vertical collection, VertiMRF §5.1
/// GraphCom; none otherwise), then `candidates` (pairs with their gain) whose
/// [`PairGain::cautious_gain`] at `margin` is positive, added best first (by gain times the
/// pair's `weight`) while the largest clique has at most `max_clique_cells` cells
/// ([`largest_clique_cells`]), the cap raised to `given`'s own largest clique if that is
/// larger. A pair of weight above 1 (it holds a declared target) needs only a positive
/// expected gain, not the margin: its dependence is what the data is for, and an edge whose
/// expected gain is positive lowers the target's error in expectation. Ties by pair order, so
/// the result depends only on the inputs.
pub fn select_model_graph_from(
    domain: &Domain,
    given: &BTreeSet<Edge>,
    candidates: &[(Edge, PairGain)],
    max_clique_cells: u64,
    margin: f64,
    weight: impl Fn(usize, usize) -> f64,
) -> BTreeSet<Edge> {
    let max_clique_cells = max_clique_cells.max(largest_clique_cells(domain, given));
    let mut ranked: Vec<(f64, Edge)> = candidates
        .iter()
        .map(|(e, g)| {
            let w = weight(e.0, e.1);
            let m = if w > 1.0 { 0.0 } else { margin };
            (w * g.cautious_gain(m), edge(e.0, e.1))
        })
        .filter(|(gain, _)| *gain > 0.0)
        .collect();
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let mut chosen = given.clone();
    for (_, e) in ranked {
        if !chosen.insert(e) {
            continue;
        }
        if largest_clique_cells(domain, &chosen) > max_clique_cells {
            chosen.remove(&e);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_graph_respects_gain_and_cap() {
        let dims = Domain::from([10usize, 10, 10, 10]);
        let g = |o: f64| PairGain {
            observed_l1: o,
            noise_l1: 0.1,
            dependence: o - 0.1,
            dependence_sd: 0.05,
            projected: Vec::new(),
            interaction_share: 1.0,
            cells: Vec::new(),
        };
        let cands = [
            ((0, 1), g(0.5)),
            ((1, 2), g(0.4)),
            ((0, 2), g(0.3)),
            ((2, 3), g(0.15)),
        ];
        // Cap 100 cells: no triangle (1000 cells); (2, 3) has negative gain.
        let e = select_model_graph(&dims, &cands, 100, 0.0);
        assert_eq!(e, [(0, 1), (1, 2)].into_iter().collect());
        let e = select_model_graph(&dims, &cands, 1000, 0.0);
        assert_eq!(e, [(0, 1), (0, 2), (1, 2)].into_iter().collect());
        // A margin of 3 sd (0.15) drops (0, 2), whose gain 0.1 is within its noise.
        let e = select_model_graph(&dims, &cands, 1000, 3.0);
        assert_eq!(e, [(0, 1), (1, 2)].into_iter().collect());
        // Given edges stay whatever their gain; (0, 1) joins them as a path, and (1, 2) is
        // then refused by the cap of 100 (it would close the triangle 0-1-2).
        let given: BTreeSet<Edge> = [(2, 3), (0, 2)].into_iter().collect();
        let e = select_model_graph_from(&dims, &given, &cands, 100, 0.0, |_, _| 1.0);
        assert_eq!(e, [(0, 1), (0, 2), (2, 3)].into_iter().collect());
        // A given graph larger than the cap raises the cap to its own largest clique (the
        // triangle 0-2-3, 1000 cells): the triangle 0-1-2 then fits beside it.
        let given: BTreeSet<Edge> = [(0, 2), (2, 3), (0, 3)].into_iter().collect();
        let e = select_model_graph_from(&dims, &given, &cands, 100, 0.0, |_, _| 1.0);
        assert_eq!(
            e,
            [(0, 1), (0, 2), (0, 3), (1, 2), (2, 3)]
                .into_iter()
                .collect()
        );
    }
}
