//! Dependency graphs → junction trees: min-fill triangulation, maximal cliques of the chordal
//! graph, and a maximum spanning tree of the cliques on separator size (step 3 of
//! Algorithm 3 of PrivIncr). Disconnected graphs give a junction *forest*: one tree per
//! connected component (cliques of different components share nothing).
//!
//! Everything iterates in index order with index tie-breaks, so the result depends only on
//! the edge set.

use std::collections::BTreeSet;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

/// A set of attributes whose joint table the model keeps (a maximal clique of the
/// triangulated dependency graph, or a part of one): attribute indices, sorted and without
/// repeats. Its table is row-major over the attributes in this order; it reads as the sorted
/// slice of its attributes (`Deref<Target = [usize]>`) and is stored as that list.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(from = "Vec<usize>", into = "Vec<usize>")]
pub struct Clique(Vec<usize>);

impl Clique {
    /// The clique of `attrs` (sorted, repeats dropped).
    pub fn new(attrs: impl IntoIterator<Item = usize>) -> Self {
        let mut v: Vec<usize> = attrs.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self(v)
    }

    /// The attributes, sorted.
    pub fn attrs(&self) -> &[usize] {
        &self.0
    }
}

impl Deref for Clique {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        &self.0
    }
}

impl From<Vec<usize>> for Clique {
    /// Sorts and drops repeats ([`Clique::new`]): a stored list is a clique whatever its order.
    fn from(attrs: Vec<usize>) -> Self {
        Self::new(attrs)
    }
}

impl From<Clique> for Vec<usize> {
    fn from(c: Clique) -> Self {
        c.0
    }
}

/// One attribute pair and what phase 1 decided about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeState {
    /// First attribute (lower index).
    pub a: usize,
    /// Second attribute.
    pub b: usize,
    /// Still in the dependency graph.
    pub active: bool,
    /// Round after which the edge was pruned (`None` while active).
    pub pruned_in: Option<u32>,
    /// Last MI (eq. 14, nats) of the accumulated Norm-Sub'd estimate.
    pub mi: Option<f64>,
    /// τ of eq. 15 (nats).
    pub tau: f64,
    /// Last relaxed threshold ℓ of eq. 18 (nats; privincr).
    pub ell: Option<f64>,
    /// Reports of tables containing the pair when last evaluated.
    pub reports: u64,
    /// `auto`: estimated dependence `D̂` (L1 distance from independence: the larger of its
    /// estimate debiased for the screening noise and its pooled posterior; see
    /// [`crate::select::gain::PairGain`]).
    pub score: Option<f64>,
    /// `auto`: bin maps `[map of a, map of b]` the pair is measured under (`[]` for full
    /// resolution; empty: neither binned).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
}

/// An undirected edge `(a, b)` with `a < b`.
pub type Edge = (usize, usize);

/// Normalizes an edge to `(min, max)`.
pub fn edge(a: usize, b: usize) -> Edge {
    (a.min(b), a.max(b))
}

/// Adjacency sets of `d` vertices.
fn adjacency(d: usize, edges: &BTreeSet<Edge>) -> Vec<BTreeSet<usize>> {
    let mut adj = vec![BTreeSet::new(); d];
    for &(a, b) in edges {
        adj[a].insert(b);
        adj[b].insert(a);
    }
    adj
}

/// Min-fill triangulation of the graph on `d` vertices: repeatedly eliminate the vertex
/// whose elimination adds the fewest fill edges (ties: fewer neighbours, then lowest index),
/// connecting its remaining neighbours. Returns the chordal supergraph's edges and the
/// elimination order.
pub(crate) fn triangulate(d: usize, edges: &BTreeSet<Edge>) -> (BTreeSet<Edge>, Vec<usize>) {
    let mut adj = adjacency(d, edges);
    let mut chordal = edges.clone();
    let mut eliminated = vec![false; d];
    let mut order = Vec::with_capacity(d);
    for _ in 0..d {
        let mut best: Option<(usize, usize, usize)> = None;
        for v in 0..d {
            if eliminated[v] {
                continue;
            }
            let nb: Vec<usize> = adj[v].iter().copied().collect();
            let mut fill = 0;
            for (i, &x) in nb.iter().enumerate() {
                for &y in &nb[i + 1..] {
                    if !adj[x].contains(&y) {
                        fill += 1;
                    }
                }
            }
            let cand = (fill, nb.len(), v);
            if best.is_none_or(|b| cand < b) {
                best = Some(cand);
            }
        }
        let Some((_, _, v)) = best else { break };
        let nb: Vec<usize> = adj[v].iter().copied().collect();
        for (i, &x) in nb.iter().enumerate() {
            for &y in &nb[i + 1..] {
                if adj[x].insert(y) {
                    adj[y].insert(x);
                    chordal.insert(edge(x, y));
                }
            }
        }
        for &x in &nb {
            adj[x].remove(&v);
        }
        adj[v].clear();
        eliminated[v] = true;
        order.push(v);
    }
    (chordal, order)
}

/// Maximal cliques of a chordal graph given a perfect elimination order (as returned by
/// [`triangulate`]): each vertex with its neighbours eliminated after it, minus the
/// non-maximal ones, in sorted order.
pub(crate) fn maximal_cliques(d: usize, chordal: &BTreeSet<Edge>, order: &[usize]) -> Vec<Clique> {
    let adj = adjacency(d, chordal);
    let mut pos = vec![0usize; d];
    for (i, &v) in order.iter().enumerate() {
        pos[v] = i;
    }
    let mut candidates: Vec<BTreeSet<usize>> = order
        .iter()
        .map(|&v| {
            let mut c: BTreeSet<usize> = adj[v]
                .iter()
                .copied()
                .filter(|&u| pos[u] > pos[v])
                .collect();
            c.insert(v);
            c
        })
        .collect();
    candidates.sort_by_key(|c| std::cmp::Reverse(c.len()));
    let mut out: Vec<BTreeSet<usize>> = Vec::new();
    for c in candidates {
        if !out.iter().any(|o| c.is_subset(o)) {
            out.push(c);
        }
    }
    let mut cliques: Vec<Clique> = out.into_iter().map(Clique::new).collect();
    cliques.sort();
    cliques
}

/// A junction tree (forest) over cliques.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JunctionTree {
    /// Maximal cliques.
    pub cliques: Vec<Clique>,
    /// Tree edges between clique indices `(i, j)`, `i < j`, each with a non-empty separator.
    pub edges: Vec<(usize, usize)>,
}

impl JunctionTree {
    /// The separator (sorted shared attributes) of cliques `i` and `j`.
    pub fn separator(&self, i: usize, j: usize) -> Vec<usize> {
        self.cliques[i]
            .iter()
            .copied()
            .filter(|a| self.cliques[j].contains(a))
            .collect()
    }

    /// Cliques in breadth-first order from each component's root (the lowest clique index of
    /// the component), with each clique's parent (`None` for roots).
    pub(crate) fn traversal(&self) -> Vec<(usize, Option<usize>)> {
        let k = self.cliques.len();
        let mut nb = vec![Vec::new(); k];
        for &(a, b) in &self.edges {
            nb[a].push(b);
            nb[b].push(a);
        }
        nb.iter_mut().for_each(|v| v.sort_unstable());
        let mut seen = vec![false; k];
        let mut out = Vec::with_capacity(k);
        for root in 0..k {
            if seen[root] {
                continue;
            }
            seen[root] = true;
            let mut queue = std::collections::VecDeque::from([(root, None)]);
            while let Some((c, parent)) = queue.pop_front() {
                out.push((c, parent));
                for &n in &nb[c] {
                    if !seen[n] {
                        seen[n] = true;
                        queue.push_back((n, Some(c)));
                    }
                }
            }
        }
        out
    }

    /// Whether the running-intersection property holds: for every attribute, the cliques
    /// containing it form a connected subtree (tests).
    #[cfg(test)]
    pub(crate) fn has_running_intersection(&self) -> bool {
        let attrs: BTreeSet<usize> = self
            .cliques
            .iter()
            .flat_map(|c| c.iter())
            .copied()
            .collect();
        for a in attrs {
            let holders: Vec<usize> = (0..self.cliques.len())
                .filter(|&i| self.cliques[i].contains(&a))
                .collect();
            // BFS within holders over tree edges.
            let mut seen = BTreeSet::from([holders[0]]);
            let mut stack = vec![holders[0]];
            while let Some(c) = stack.pop() {
                for &(x, y) in &self.edges {
                    let other = if x == c {
                        y
                    } else if y == c {
                        x
                    } else {
                        continue;
                    };
                    if holders.contains(&other) && seen.insert(other) {
                        stack.push(other);
                    }
                }
            }
            if seen.len() != holders.len() {
                return false;
            }
        }
        true
    }
}

/// Junction tree of the cliques: Kruskal's maximum spanning forest on separator size
/// (candidate edges with an empty separator are never used; ties by clique indices).
pub fn junction_tree(cliques: Vec<Clique>) -> JunctionTree {
    let k = cliques.len();
    let mut cand = Vec::new();
    for i in 0..k {
        for j in i + 1..k {
            let s = cliques[i].iter().filter(|a| cliques[j].contains(a)).count();
            if s > 0 {
                cand.push((std::cmp::Reverse(s), i, j));
            }
        }
    }
    cand.sort();
    let mut forest = UnionFind::new(k);
    let mut edges = Vec::new();
    for (_, i, j) in cand {
        if forest.union(i, j) {
            edges.push((i, j));
        }
    }
    edges.sort_unstable();
    JunctionTree { cliques, edges }
}

/// Disjoint sets over `0..n` (path halving), for Kruskal's spanning forests.
#[derive(Debug, Clone)]
pub struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    /// `n` singletons.
    pub fn new(n: usize) -> Self {
        Self {
            parent: (0..n).collect(),
        }
    }

    /// The representative of `x`'s set. Panics if `x ≥ n`.
    pub fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    /// Merges the sets of `a` and `b`; false if they were one already.
    pub fn union(&mut self, a: usize, b: usize) -> bool {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra == rb {
            return false;
        }
        self.parent[ra] = rb;
        true
    }
}

/// Kruskal's maximum spanning forest over `d` vertices: `weighted` edges `(weight, a, b)`
/// taken by decreasing weight (ties by `(a, b)`), each kept when it joins two components.
pub fn maximum_spanning_forest(d: usize, mut weighted: Vec<(f64, usize, usize)>) -> BTreeSet<Edge> {
    weighted.sort_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2).cmp(&(y.1, y.2))));
    let mut forest = UnionFind::new(d);
    weighted
        .into_iter()
        .filter(|&(_, a, b)| forest.union(a, b))
        .map(|(_, a, b)| edge(a, b))
        .collect()
}

/// Triangulates the graph and builds its junction tree (forest).
pub(crate) fn build_junction_tree(d: usize, edges: &BTreeSet<Edge>) -> JunctionTree {
    let (chordal, order) = triangulate(d, edges);
    junction_tree(maximal_cliques(d, &chordal, &order))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha12Rng;

    fn is_chordal_via_order(d: usize, chordal: &BTreeSet<Edge>, order: &[usize]) -> bool {
        // Perfect elimination: later neighbours of each vertex form a clique.
        let adj = adjacency(d, chordal);
        let mut pos = vec![0; d];
        for (i, &v) in order.iter().enumerate() {
            pos[v] = i;
        }
        order.iter().all(|&v| {
            let later: Vec<usize> = adj[v]
                .iter()
                .copied()
                .filter(|&u| pos[u] > pos[v])
                .collect();
            later
                .iter()
                .enumerate()
                .all(|(i, &x)| later[i + 1..].iter().all(|&y| adj[x].contains(&y)))
        })
    }

    #[test]
    fn running_intersection_on_random_graphs() {
        let mut rng = ChaCha12Rng::seed_from_u64(11);
        for trial in 0..300 {
            let d = rng.random_range(1..14);
            let p = rng.random_range(0.0..0.6);
            let mut edges = BTreeSet::new();
            for a in 0..d {
                for b in a + 1..d {
                    if rng.random_bool(p) {
                        edges.insert((a, b));
                    }
                }
            }
            let (chordal, order) = triangulate(d, &edges);
            assert!(edges.is_subset(&chordal));
            assert!(is_chordal_via_order(d, &chordal, &order), "trial {trial}");
            let jt = junction_tree(maximal_cliques(d, &chordal, &order));
            assert!(jt.has_running_intersection(), "trial {trial}: {jt:?}");
            // Every vertex and every chordal edge is inside some clique.
            for v in 0..d {
                assert!(jt.cliques.iter().any(|c| c.contains(&v)));
            }
            for &(a, b) in &chordal {
                assert!(jt.cliques.iter().any(|c| c.contains(&a) && c.contains(&b)));
            }
            // Forest: #edges = #cliques − #components.
            assert!(jt.edges.len() < jt.cliques.len().max(1));
            assert_eq!(jt.traversal().len(), jt.cliques.len());
        }
    }

    #[test]
    fn cycle_is_triangulated() {
        let edges: BTreeSet<Edge> = [(0, 1), (1, 2), (2, 3), (0, 3)].into_iter().collect();
        let jt = build_junction_tree(4, &edges);
        assert_eq!(jt.cliques.len(), 2);
        assert!(jt.cliques.iter().all(|c| c.len() == 3));
        assert_eq!(jt.edges.len(), 1);
        let empty = build_junction_tree(3, &BTreeSet::new());
        assert_eq!(empty.cliques, [0, 1, 2].map(|a| Clique::new([a])));
        assert!(empty.edges.is_empty());
    }

    /// A junction tree is stored with its cliques as plain lists (the states and model
    /// descriptions written before `Clique` load), and a stored list is read as a clique.
    #[test]
    fn cliques_are_stored_as_lists() {
        let jt = build_junction_tree(3, &[(0, 1), (1, 2)].into_iter().collect());
        let text = serde_json::to_string(&jt).unwrap();
        assert_eq!(text, r#"{"cliques":[[0,1],[1,2]],"edges":[[0,1]]}"#);
        assert_eq!(serde_json::from_str::<JunctionTree>(&text).unwrap(), jt);
        let unsorted: Clique = serde_json::from_str("[2, 0, 2]").unwrap();
        assert_eq!(unsorted.attrs(), &[0, 2]);
    }
}
