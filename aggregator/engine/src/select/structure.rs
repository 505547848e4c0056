//! The model structure: a junction tree turned into an ordered list of conditionals, with
//! Algorithm 2 of PrivIncr (EDBT 2023) for cliques whose domain exceeds `sigma`.
//!
//! Each clique, visited root-first, contributes `Pr(new attributes | separator)`. A clique
//! with at most `sigma` cells does so in one conditional (estimated from its joint). A larger
//! clique is factorized as in Algorithm 2 (eq. 19): with `Q` the clique's remaining
//! attributes, while the domain of `Q` exceeds `sigma`, every candidate `A_j ∈ Q` that is not
//! in the separator gets a conditioning set `S_{A_j} ⊆ Q ∖ A_j` by mRMR redundancy
//! elimination (Peng et al. 2005) on the phase-1 MI matrix, and the `A_h` with the smallest
//! `|Ω_{S_h ∪ A_h}|` becomes the *last* factor `Pr(A_h | S_h)` and leaves `Q` (lines 6–11).
//! When `Q`'s domain is at most `sigma`, the rest is one factor
//! `Pr(Q ∖ separator | Q ∩ separator)` (lines 3–4; the paper picks one attribute at random,
//! which gives the same product). Separator attributes are never chosen as `A_h`: they are
//! already sampled from the parent clique.
//!
//! **mRMR stopping rule** (the paper leaves it open): starting from `S = ∅`, add the
//! candidate `c ∈ Q ∖ A_j` maximizing `I(A_j; c) − (1/|S|) Σ_{s∈S} I(c; s)` (relevance minus
//! mean redundancy; just `I(A_j; c)` for the first); stop when the best score is ≤ 0, when
//! adding it would make `|Ω_{S ∪ A_j}| > sigma`, or when no candidate is left.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::domain::sizes::Domain;
use crate::graph::{Clique, Edge, JunctionTree, build_junction_tree};

/// One factor of the model: `Pr(targets | parents)`. Its *scope* is `parents ++ targets`
/// (the order of the joint table it is estimated from, row-major, last fastest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conditional {
    /// Attributes sampled by this factor.
    pub targets: Vec<usize>,
    /// Attributes conditioned on (sampled earlier).
    pub parents: Vec<usize>,
}

impl Conditional {
    /// `parents ++ targets`.
    pub fn scope(&self) -> Vec<usize> {
        let mut s = self.parents.clone();
        s.extend(&self.targets);
        s
    }
}

/// Dependency graph, junction tree and the ordered conditionals sampled from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Structure {
    /// Number of attributes.
    pub d: usize,
    /// Edges of the dependency graph.
    pub edges: Vec<Edge>,
    /// Junction tree (forest) of the triangulated graph.
    pub junction_tree: JunctionTree,
    /// Factors in sampling order; every attribute is a target exactly once.
    pub conditionals: Vec<Conditional>,
}

/// mRMR redundancy elimination (see the module docs for the stopping rule).
/// `mi[a][b]` is the phase-1 MI matrix (nats). Returns `S` in selection order.
pub(crate) fn mrmr(
    target: usize,
    candidates: &[usize],
    mi: &[Vec<f64>],
    domain: &Domain,
    sigma: u64,
) -> Vec<usize> {
    let mut selected: Vec<usize> = Vec::new();
    let mut left: Vec<usize> = candidates.to_vec();
    loop {
        let mut best: Option<(f64, usize)> = None;
        for &c in &left {
            let relevance = mi[target][c];
            let redundancy = if selected.is_empty() {
                0.0
            } else {
                selected.iter().map(|&s| mi[c][s]).sum::<f64>() / selected.len() as f64
            };
            let score = relevance - redundancy;
            if best.is_none_or(|(b, bc)| score > b || (score == b && c < bc)) {
                best = Some((score, c));
            }
        }
        let Some((score, c)) = best else { break };
        let size = domain.cells_wide(selected.iter().copied().chain([target, c]));
        if score <= 0.0 || size > sigma as u128 {
            break;
        }
        selected.push(c);
        left.retain(|&x| x != c);
    }
    selected
}

/// Conditionals for one clique given its separator with the parent clique (Algorithm 2 when
/// the clique's domain exceeds `sigma`), in sampling order.
pub(crate) fn clique_conditionals(
    clique: &Clique,
    separator: &[usize],
    mi: &[Vec<f64>],
    domain: &Domain,
    sigma: u64,
) -> Vec<Conditional> {
    let mut q: Vec<usize> = clique.attrs().to_vec();
    let mut reversed = Vec::new();
    loop {
        let new: Vec<usize> = q
            .iter()
            .copied()
            .filter(|a| !separator.contains(a))
            .collect();
        if new.is_empty() {
            break;
        }
        if domain.cells_wide(q.iter().copied()) <= sigma as u128 || new.len() == 1 && q.len() == 1 {
            reversed.push(Conditional {
                targets: new,
                parents: q
                    .iter()
                    .copied()
                    .filter(|a| separator.contains(a))
                    .collect(),
            });
            break;
        }
        // Lines 6–9: the candidate with the smallest factor domain |S ∪ A_h|.
        let mut best: Option<(u128, usize, Vec<usize>)> = None;
        for &a in &new {
            let rest: Vec<usize> = q.iter().copied().filter(|&x| x != a).collect();
            let s = mrmr(a, &rest, mi, domain, sigma);
            let size = domain.cells_wide(s.iter().copied().chain([a]));
            if best
                .as_ref()
                .is_none_or(|(b, ba, _)| size < *b || (size == *b && a < *ba))
            {
                best = Some((size, a, s));
            }
        }
        let Some((_, a, mut s)) = best else { break };
        s.sort_unstable();
        reversed.push(Conditional {
            targets: vec![a],
            parents: s,
        });
        q.retain(|&x| x != a);
    }
    reversed.reverse();
    reversed
}

/// Builds the structure from a dependency graph over the working `domain`: junction tree of
/// `edges`, then the conditionals of each clique root-first (Algorithm 2 for cliques of more
/// than `sigma` cells, which reads `mi`, the `d × d` phase-1 MI matrix in nats; with
/// `sigma = u64::MAX` no clique is split and `mi` may be empty). Panics on an edge or MI
/// index outside the domain.
pub fn build_structure(
    domain: &Domain,
    edges: &BTreeSet<Edge>,
    mi: &[Vec<f64>],
    sigma: u64,
) -> Structure {
    let d = domain.len();
    let jt = build_junction_tree(d, edges);
    let mut conditionals = Vec::new();
    for (c, parent) in jt.traversal() {
        let sep = parent.map(|p| jt.separator(c, p)).unwrap_or_default();
        conditionals.extend(clique_conditionals(&jt.cliques[c], &sep, mi, domain, sigma));
    }
    Structure {
        d,
        edges: edges.iter().copied().collect(),
        junction_tree: jt,
        conditionals,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn every_attribute_sampled_once_after_its_parents() {
        let dims = vec![8usize; 6];
        // A 6-clique of 8^6 cells with sigma 600: Algorithm 2 must factorize it.
        let mut edges = BTreeSet::new();
        for a in 0..6 {
            for b in a + 1..6 {
                edges.insert((a, b));
            }
        }
        let mut mi = vec![vec![0.0; 6]; 6];
        for a in 0..6usize {
            for b in 0..6usize {
                if a != b {
                    mi[a][b] = 1.0 / (1.0 + a.abs_diff(b) as f64);
                }
            }
        }
        let s = build_structure(&dims.clone().into(), &edges, &mi, 600);
        let mut seen = BTreeSet::new();
        for c in &s.conditionals {
            assert!(c.parents.iter().all(|p| seen.contains(p)), "{c:?}");
            let scope_cells: usize = c.scope().iter().map(|&a| dims[a]).product();
            assert!(scope_cells <= 600, "{c:?}");
            for &t in &c.targets {
                assert!(seen.insert(t));
            }
        }
        assert_eq!(seen.len(), 6);
        assert!(s.conditionals.len() > 1);
    }

    #[test]
    fn mrmr_drops_redundant_features() {
        // 1 and 2 are copies of each other (high mutual MI); 3 is independent of both.
        let mut mi = vec![vec![0.0; 4]; 4];
        let set = |m: &mut Vec<Vec<f64>>, a: usize, b: usize, v: f64| {
            m[a][b] = v;
            m[b][a] = v;
        };
        set(&mut mi, 0, 1, 0.5);
        set(&mut mi, 0, 2, 0.49);
        set(&mut mi, 1, 2, 1.0);
        set(&mut mi, 0, 3, 0.2);
        let s = mrmr(0, &[1, 2, 3], &mi, &[4; 4].into(), 1 << 20);
        assert_eq!(s, vec![1, 3]);
    }
}
