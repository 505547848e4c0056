//! Graphical-model estimation: one Markov random field fitted to every measurement.
//!
//! The model is `p_θ(x) ∝ exp Σ_C θ_C(x_C)` over the cliques `C` of a junction tree
//! ([`crate::graph`]); its clique marginals `μ = μ(θ)` come from belief propagation on the
//! tree (sum-product, log space), so they are consistent on every separator by construction.
//! The fit minimizes the variance-weighted squared error of every measurement
//!
//! `L(μ) = Σ_j Σ_cells (M_j μ − y_j)² / σ_j²`
//!
//! over the marginal polytope by entropic mirror descent on θ (`θ ← θ − α ∇_μ L(μ(θ))`,
//! step by backtracking line search), the estimation algorithm of private-pgm (McKenna,
//! Sheldon, Miklau, ICML 2019, Algorithm 1), as PrivMRF/VertiMRF (§5) and PPSyn (§3.3, Alg. 1)
//! use it. `M_j` sums a clique marginal down to measurement j's attributes; a measurement
//! must lie inside one clique (callers marginalize the others to the parts that fit). The
//! fit replaces per-table Norm-Sub and IPF: a 1-way borrows strength from every pair table
//! containing the attribute, and every table of every round counts.
//!
//! Everything iterates in a fixed order, so the same inputs give the same bits.

use crate::domain::binned::BinnedFactor;
use crate::domain::sizes::Domain;
use crate::graph::JunctionTree;
use crate::numeric::index::{coarsen_map, projection_map};

/// Largest difference of a cell of a 1-way from its target at which
/// [`GraphicalModel::with_one_way_targets`] stops: a numerical tolerance, far below any
/// estimate's noise (OUE's standard error of one cell at ε = 8 and 100,000 reports, before
/// sampling noise, is about 1e-4).
pub const RAKING_TOLERANCE: f64 = 1e-6;

/// Most sweeps of [`GraphicalModel::with_one_way_targets`] (each rakes every target not yet
/// met once): a bound on the work when a target cannot be met. `auto`'s targets on Adult
/// are met in at most 5; 20 and 50 give the same 2-way TVD within 2% where targets cannot
/// be met (`privincr` at ε = 1 on Adult and temporal-match2;
/// `benchmarks/sweeps/numeric-smoothing.md`).
pub const MAX_RAKING_SWEEPS: usize = 50;

/// One measurement as the fit sees it: attributes (a subset of one clique, any order),
/// values over their product domain (row-major in `attrs` order; unbiased estimates, may be
/// negative) and the variance of each cell (frequencies², > 0).
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// Attributes measured, in the order of the cells.
    pub attrs: Vec<usize>,
    /// Estimates, one per cell.
    pub values: Vec<f64>,
    /// Variance of each cell's estimate.
    pub variances: Vec<f64>,
    /// Bin maps of `attrs` (one per attribute, `[]` for full resolution; empty: none binned):
    /// the cells are then the product of the bins, and the model's marginal enters the loss
    /// summed within bins (cell merging, PPSyn §4.2.2; binned attributes, VertiMRF §6.1).
    pub bins: Vec<Vec<u32>>,
    /// Cell groups (empty: none): the group of each cell of the (binned) marginal, numbered
    /// `0..k`; `values` and `variances` then hold one entry per group, and the model's
    /// marginal enters the loss summed within groups (PPSyn's partitions, §4.2.2;
    /// [`crate::measure::partition`]).
    pub groups: Vec<u32>,
}

/// Options of [`fit`].
#[derive(Debug, Clone, PartialEq)]
pub struct FitOptions {
    /// Most mirror-descent steps (accepted or not). The default, 300, is where the 2-way TVD
    /// of `auto` stopped changing (±0.001) on adult, nist-taxi and temporal-match2 at ε = 4
    /// and 8 (`benchmarks/sweeps/fit-iterations.txt`); later steps refine the loss's tail
    /// without moving the synthetic data.
    pub max_iters: usize,
    /// Stop when the last [`FitOptions::window`] accepted steps lowered the loss by less
    /// than `tol` in all. The loss is a sum of squared standard scores, so a fall of 0.05
    /// over 25 steps changes no estimate by a meaningful fraction of its standard error.
    pub tol: f64,
    /// Accepted steps the stopping rule looks back over.
    pub window: usize,
}

impl Default for FitOptions {
    fn default() -> Self {
        Self {
            max_iters: 300,
            tol: 0.05,
            window: 25,
        }
    }
}

/// What observations pool by: clique, attributes, bin maps and cell groups.
type PoolKey = (usize, Vec<usize>, Vec<Vec<u32>>, Vec<u32>);

/// Observations of one clique, pooled by attribute set (the loss is a sum over cells, so
/// measurements of the same cells combine exactly by precision weighting, up to a constant).
#[derive(Debug, Clone)]
struct Pooled {
    clique: usize,
    /// Clique cell → observation cell (`u32`: half the memory the loss streams per step;
    /// an observation has far fewer than 2³² cells).
    map: Vec<u32>,
    /// Precision-weighted mean per cell.
    values: Vec<f64>,
    /// Summed precision per cell.
    precision: Vec<f64>,
}

/// A fitted model: junction tree, log-potentials θ and clique marginals μ(θ).
#[derive(Debug, Clone, PartialEq)]
pub struct GraphicalModel {
    domain: Domain,
    tree: JunctionTree,
    potentials: Vec<Vec<f64>>,
    marginals: Vec<Vec<f64>>,
    /// Loss after each accepted step (the first entry is the loss at the start).
    losses: Vec<f64>,
}

/// A clique's link to its parent. The maps are `u32`: belief propagation streams both twice
/// per pass, and a separator has far fewer than 2³² cells.
#[derive(Debug, Clone)]
struct Link {
    /// Clique cell → separator cell.
    cmap: Vec<u32>,
    /// Parent cell → separator cell.
    pmap: Vec<u32>,
    /// Separator cells.
    cells: usize,
    /// `cmap` and `pmap` as summing [`Blocks`] (trailing attributes outside the separator),
    /// when they have that shape.
    cblocks: Option<Blocks>,
    pblocks: Option<Blocks>,
}

impl Link {
    /// `cmap` with the clique's sizes `cdims` and `pmap` with the parent's `pdims`.
    fn new(cmap: Vec<u32>, pmap: Vec<u32>, cells: usize, cdims: &[usize], pdims: &[usize]) -> Self {
        let summing = |map: &[u32], dims: &[usize]| Blocks::find(map, dims).filter(|b| b.sums);
        Self {
            cblocks: summing(&cmap, cdims),
            pblocks: summing(&pmap, pdims),
            cmap,
            pmap,
            cells,
        }
    }
}

/// The maps of [`projection_map`] as `u32`.
fn map_u32(map: Vec<usize>) -> Vec<u32> {
    map.into_iter()
        .map(|t| u32::try_from(t).expect("separator cells < 2^32"))
        .collect()
}

/// Buffers of [`Schedule::marginals`], kept across the fit's steps so that a step allocates
/// nothing: per clique its log weights (then its marginal's buffer), per link the
/// separator's sums, and scratch of the largest separator's size.
#[derive(Debug, Default)]
struct Workspace {
    acc: Vec<Vec<f64>>,
    sums: Vec<Vec<f64>>,
    max: Vec<f64>,
    message: Vec<f64>,
    sep: Vec<f64>,
}

/// Precomputed belief propagation schedule of a junction forest.
#[derive(Debug, Clone)]
struct Schedule {
    /// Cliques root-first with their parent.
    order: Vec<(usize, Option<usize>)>,
    /// For a non-root clique c, its link to the parent.
    links: Vec<Option<Link>>,
    cells: Vec<usize>,
}

impl Schedule {
    fn new(domain: &Domain, tree: &JunctionTree) -> Self {
        let order = tree.traversal();
        let cdims = |c: usize| domain.project(&tree.cliques[c]);
        let mut links = vec![None; tree.cliques.len()];
        for &(c, parent) in &order {
            if let Some(p) = parent {
                let sep = tree.separator(c, p);
                let cells = domain.table_len(&sep);
                let (cd, pd) = (cdims(c), cdims(p));
                links[c] = Some(Link::new(
                    map_u32(projection_map(&tree.cliques[c], &cd, &sep)),
                    map_u32(projection_map(&tree.cliques[p], &pd, &sep)),
                    cells,
                    &cd,
                    &pd,
                ));
            }
        }
        let cells = (0..tree.cliques.len())
            .map(|c| cdims(c).iter().product())
            .collect();
        Self {
            order,
            links,
            cells,
        }
    }

    /// Clique marginals of `p_θ` ([`Schedule::marginals_into`] with fresh buffers).
    fn marginals(&self, theta: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let mut mu = Vec::new();
        self.marginals_into(theta, &mut mu, &mut Workspace::default());
        mu
    }

    /// Clique marginals of `p_θ` into `mu` (resized as needed): sum-product with an upward
    /// pass in log space (messages `log Σ exp` over the clique minus the separator, each
    /// group shifted by its own maximum) and a downward pass in probability space. The
    /// upward pass keeps each cell's shifted weight `e(x) = exp(acc(x) − max_s)` and each
    /// separator cell's sum `S(s) = Σ_{x∈s} e(x) ≥ 1`; a child's marginal is then
    /// `e(x) · μ_parent(s) / S(s)`, so each clique cell costs one `exp` per evaluation, and
    /// no ratio can overflow. `work` holds the buffers between calls (the result does not
    /// depend on what they held).
    fn marginals_into(&self, theta: &[Vec<f64>], mu: &mut Vec<Vec<f64>>, work: &mut Workspace) {
        let k = theta.len();
        mu.resize_with(k, Vec::new);
        work.acc.resize_with(k, Vec::new);
        work.sums.resize_with(k, Vec::new);
        // acc[c]: θ_c plus the messages from its children (log); after c's upward message,
        // its shifted weights e.
        for (a, t) in work.acc.iter_mut().zip(theta) {
            a.clear();
            a.extend_from_slice(t);
        }
        let Workspace {
            acc,
            sums,
            max,
            message,
            sep,
        } = work;
        for &(c, parent) in self.order.iter().rev() {
            if let (Some(p), Some(link)) = (parent, &self.links[c]) {
                shifted_sums(&mut acc[c], link, max, &mut sums[c], message);
                match &link.pblocks {
                    Some(b) => b.spread(message, &mut acc[p]),
                    None => {
                        for (v, &s) in acc[p].iter_mut().zip(&link.pmap) {
                            *v += message[s as usize];
                        }
                    }
                }
            }
        }
        for &(c, parent) in &self.order {
            // The clique's weights become its marginal; `mu[c]`'s old buffer is reused as
            // `acc[c]` on the next call.
            std::mem::swap(&mut acc[c], &mut mu[c]);
            if let (Some(p), Some(link)) = (parent, &self.links[c]) {
                sep.clear();
                sep.resize(link.cells, 0.0);
                match &link.pblocks {
                    Some(b) => b.project(&mu[p], sep),
                    None => {
                        for (v, &s) in mu[p].iter().zip(&link.pmap) {
                            sep[s as usize] += v;
                        }
                    }
                }
                for (s, total) in sep.iter_mut().zip(&sums[c]) {
                    *s /= total;
                }
                match &link.cblocks {
                    Some(b) => b.scale(sep, &mut mu[c]),
                    None => {
                        for (v, &s) in mu[c].iter_mut().zip(&link.cmap) {
                            *v *= sep[s as usize];
                        }
                    }
                }
            } else {
                let b = &mut mu[c];
                let max = b.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                b.iter_mut().for_each(|v| *v = (*v - max).exp());
            }
            let b = &mut mu[c];
            let total: f64 = b.iter().sum();
            b.iter_mut().for_each(|v| *v /= total);
        }
    }
}

/// For `values` (log weights of a clique's cells) grouped into the separator cells of
/// `link`: each group's `log Σ exp` into `message`, and its sum of `exp(v − max)` over the
/// group (`≥ 1`) into `sum`; `values` become those shifted weights `exp(v − max)`. `max` is
/// scratch.
fn shifted_sums(
    values: &mut [f64],
    link: &Link,
    max: &mut Vec<f64>,
    sum: &mut Vec<f64>,
    message: &mut Vec<f64>,
) {
    max.clear();
    max.resize(link.cells, f64::NEG_INFINITY);
    sum.clear();
    sum.resize(link.cells, 0.0);
    if let Some(b) = &link.cblocks {
        let len = b.offset.len();
        for (block, &t) in values.chunks_exact(len).zip(&b.base) {
            let m = block.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let slot = &mut max[t as usize];
            *slot = slot.max(m);
        }
        for (block, &t) in values.chunks_exact_mut(len).zip(&b.base) {
            let m = max[t as usize];
            block.iter_mut().for_each(|v| *v = (*v - m).exp());
            sum[t as usize] += block_sum(block);
        }
    } else {
        for (v, &t) in values.iter().zip(&link.cmap) {
            let m = &mut max[t as usize];
            if *v > *m {
                *m = *v;
            }
        }
        for (v, &t) in values.iter_mut().zip(&link.cmap) {
            *v = (*v - max[t as usize]).exp();
            sum[t as usize] += *v;
        }
    }
    message.clear();
    message.extend(sum.iter().zip(max.iter()).map(|(s, m)| m + s.ln()));
}

/// Where each observation's projection comes from in [`loss_and_gradient`]: the clique's
/// cells, or the cells of a larger observation of the same clique whose cells determine its
/// own (`sub[j]`: the observation's cell of the other's cell `j`), e.g. a 1-way inside a
/// pair of the same clique. A clique holding a pair and the 1-ways of its attributes is then
/// streamed once per step, not once per observation; the sums are the same up to rounding.
#[derive(Debug)]
struct Projections {
    /// Observation indices, larger observations first within each clique.
    order: Vec<usize>,
    /// Per observation: `None` (from the clique) or `(parent, sub)`.
    parent: Vec<Option<(usize, Vec<u32>)>>,
    /// Per observation read from its clique, its [`Blocks`] when its map has that shape.
    blocks: Vec<Option<Blocks>>,
}

/// An observation's map from its clique's cells read block by block: the clique's cells
/// split into consecutive blocks of one length, every block mapped by the same offsets from
/// its own base cell. With the clique's trailing attributes outside the observation, a block
/// is their cells and every offset 0 (the block sums into one cell); otherwise a block is the
/// last attribute's values. The loss then streams the clique without its map and without a
/// chain of additions into one cell through memory, the cost of the per-cell map.
#[derive(Debug, Clone)]
struct Blocks {
    /// Per block, the observation cell of its first clique cell.
    base: Vec<u32>,
    /// Per position in a block, its cell's offset from the base.
    offset: Vec<u32>,
    /// Whether every offset is 0.
    sums: bool,
}

impl Blocks {
    /// The blocks of `map` (a clique's cells → observation cells, clique sizes `cdims`):
    /// summing blocks of the most trailing attributes the map is constant over, else blocks
    /// of the last attribute; `None` if neither fits (bins or groups that cut across blocks)
    /// or blocks would be single cells.
    fn find(map: &[u32], cdims: &[usize]) -> Option<Self> {
        (1..cdims.len())
            .rev()
            .find_map(|t| Self::of(map, cdims, t).filter(|b| b.sums))
            .or_else(|| Self::of(map, cdims, 0))
    }

    /// The blocks of `map` of the clique's last `trailing` attributes (0: of the last one),
    /// if every block maps by the offsets of the first.
    fn of(map: &[u32], cdims: &[usize], trailing: usize) -> Option<Self> {
        let len: usize = match trailing {
            0 => *cdims.last()?,
            t => cdims[cdims.len() - t..].iter().product(),
        };
        if len < 2 || map.is_empty() || map.len() % len != 0 {
            return None;
        }
        let offset: Vec<u32> = map[..len].iter().map(|&t| t.wrapping_sub(map[0])).collect();
        let mut base = Vec::with_capacity(map.len() / len);
        for block in map.chunks_exact(len) {
            let b = block[0];
            if block
                .iter()
                .zip(&offset)
                .any(|(&t, &k)| t != b.wrapping_add(k))
            {
                return None;
            }
            base.push(b);
        }
        let sums = offset.iter().all(|&k| k == 0);
        Some(Self { base, offset, sums })
    }

    /// Adds `mu` (the clique's cells) into `out` (the observation's cells).
    fn project(&self, mu: &[f64], out: &mut [f64]) {
        let len = self.offset.len();
        if self.sums {
            for (block, &b) in mu.chunks_exact(len).zip(&self.base) {
                out[b as usize] += block_sum(block);
            }
        } else {
            for (block, &b) in mu.chunks_exact(len).zip(&self.base) {
                let out = &mut out[b as usize..];
                for (v, &k) in block.iter().zip(&self.offset) {
                    out[k as usize] += v;
                }
            }
        }
    }

    /// Multiplies each clique cell of `mu` by its cell of `by` (summing blocks only).
    fn scale(&self, by: &[f64], mu: &mut [f64]) {
        debug_assert!(self.sums);
        for (block, &b) in mu.chunks_exact_mut(self.offset.len()).zip(&self.base) {
            let f = by[b as usize];
            block.iter_mut().for_each(|v| *v *= f);
        }
    }

    /// Adds each clique cell's observation cell of `cells` into `grad` (the clique's cells).
    fn spread(&self, cells: &[f64], grad: &mut [f64]) {
        let len = self.offset.len();
        if self.sums {
            for (block, &b) in grad.chunks_exact_mut(len).zip(&self.base) {
                let v = cells[b as usize];
                block.iter_mut().for_each(|g| *g += v);
            }
        } else {
            for (block, &b) in grad.chunks_exact_mut(len).zip(&self.base) {
                let cells = &cells[b as usize..];
                for (g, &k) in block.iter_mut().zip(&self.offset) {
                    *g += cells[k as usize];
                }
            }
        }
    }
}

/// The sum of `x` in four interleaved partial sums (independent additions the compiler can
/// run side by side, where one running sum waits on each addition).
fn block_sum(x: &[f64]) -> f64 {
    let mut acc = [0.0; 4];
    let chunks = x.chunks_exact(4);
    let rest: f64 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + rest
}

impl Projections {
    /// For each observation, the smallest larger observation of its clique that determines
    /// it (checked cell by cell over the clique), if any; for the others their [`Blocks`]
    /// (`cdims(c)`: clique `c`'s sizes).
    fn new(pooled: &[Pooled], cdims: impl Fn(usize) -> Vec<usize>) -> Self {
        let mut order: Vec<usize> = (0..pooled.len()).collect();
        order.sort_by_key(|&i| {
            (
                pooled[i].clique,
                std::cmp::Reverse(pooled[i].values.len()),
                i,
            )
        });
        let mut parent: Vec<Option<(usize, Vec<u32>)>> = vec![None; pooled.len()];
        for (pos, &o) in order.iter().enumerate() {
            let child = &pooled[o];
            // Earlier entries of the same clique, smallest first.
            let found = order[..pos]
                .iter()
                .rev()
                .filter(|&&q| {
                    pooled[q].clique == child.clique && pooled[q].values.len() > child.values.len()
                })
                .find_map(|&q| Some((q, sub_map(&pooled[q], child)?)));
            parent[o] = found;
        }
        let blocks = (0..pooled.len())
            .map(|o| {
                parent[o]
                    .is_none()
                    .then(|| Blocks::find(&pooled[o].map, &cdims(pooled[o].clique)))?
            })
            .collect();
        Self {
            order,
            parent,
            blocks,
        }
    }
}

/// The map from `parent`'s cells to `child`'s when every clique cell in one parent cell
/// falls in one child cell (`None` otherwise).
fn sub_map(parent: &Pooled, child: &Pooled) -> Option<Vec<u32>> {
    let mut sub = vec![u32::MAX; parent.values.len()];
    for (&j, &t) in parent.map.iter().zip(&child.map) {
        let slot = &mut sub[j as usize];
        if *slot == u32::MAX {
            *slot = t;
        } else if *slot != t {
            return None;
        }
    }
    (!sub.contains(&u32::MAX)).then_some(sub)
}

/// Loss and gradient (per clique cell) at clique marginals `mu`, each observation projected
/// as `plan` says ([`Projections`]). `cells` (per observation) and `grad` (per clique) are
/// filled from scratch, their buffers reused.
fn loss_and_gradient(
    pooled: &[Pooled],
    plan: &Projections,
    mu: &[Vec<f64>],
    cells: &mut Vec<Vec<f64>>,
    grad: &mut Vec<Vec<f64>>,
) -> f64 {
    zeroed(cells, pooled.iter().map(|p| p.values.len()));
    zeroed(grad, mu.iter().map(Vec::len));
    for &o in &plan.order {
        match &plan.parent[o] {
            None => {
                let out = &mut cells[o];
                let mu = &mu[pooled[o].clique];
                match &plan.blocks[o] {
                    Some(blocks) => blocks.project(mu, out),
                    None => {
                        for (v, &t) in mu.iter().zip(&pooled[o].map) {
                            out[t as usize] += v;
                        }
                    }
                }
            }
            Some((q, sub)) => {
                let (from, out) = pair_mut(cells, *q, o);
                for (v, &t) in from.iter().zip(sub) {
                    out[t as usize] += v;
                }
            }
        }
    }
    // Loss in observation order; each observation's cells become its gradient.
    let mut loss = 0.0;
    for (p, cell) in pooled.iter().zip(cells.iter_mut()) {
        for ((x, value), precision) in cell.iter_mut().zip(&p.values).zip(&p.precision) {
            let r = *x - value;
            loss += precision * r * r;
            *x = 2.0 * precision * r;
        }
    }
    // Children's gradients into their parents (smallest first), the rest onto the cliques.
    for &o in plan.order.iter().rev() {
        match &plan.parent[o] {
            Some((q, sub)) => {
                let (into, from) = pair_mut(cells, *q, o);
                for (g, &t) in into.iter_mut().zip(sub) {
                    *g += from[t as usize];
                }
            }
            None => {
                let grad = &mut grad[pooled[o].clique];
                match &plan.blocks[o] {
                    Some(blocks) => blocks.spread(&cells[o], grad),
                    None => {
                        for (g, &t) in grad.iter_mut().zip(&pooled[o].map) {
                            *g += cells[o][t as usize];
                        }
                    }
                }
            }
        }
    }
    loss
}

/// `buffers` as one zeroed vector per length of `lens`, reusing their allocations.
fn zeroed(buffers: &mut Vec<Vec<f64>>, lens: impl ExactSizeIterator<Item = usize>) {
    buffers.resize_with(lens.len(), Vec::new);
    for (b, len) in buffers.iter_mut().zip(lens) {
        b.clear();
        b.resize(len, 0.0);
    }
}

/// Mutable `v[a]` and `v[b]`, `a ≠ b`.
fn pair_mut(v: &mut [Vec<f64>], a: usize, b: usize) -> (&mut Vec<f64>, &mut Vec<f64>) {
    assert_ne!(a, b, "an observation is not its own parent");
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&mut lo[a], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&mut hi[0], &mut lo[b])
    }
}

fn dot(a: &[Vec<f64>], b: &[Vec<f64>], c: &[Vec<f64>]) -> f64 {
    // Σ a · (b − c)
    a.iter()
        .zip(b.iter().zip(c))
        .map(|(x, (y, z))| {
            x.iter()
                .zip(y.iter().zip(z))
                .map(|(u, (v, w))| u * (v - w))
                .sum::<f64>()
        })
        .sum()
}

/// Solves every clique that is alone in its component (no tree edge) and observed only
/// whole exactly ([`weighted_simplex_projection`] of its precision-weighted mean), writes
/// its log-marginal into `theta`, and returns the loss at that solution with the pooled
/// observations left for mirror descent. The loss is separable by component, so this is the
/// minimizer mirror descent converges to.
fn solve_lone_cliques(
    tree: &JunctionTree,
    cells: &[usize],
    pooled: Vec<Pooled>,
    theta: &mut [Vec<f64>],
) -> (f64, Vec<Pooled>) {
    let k = tree.cliques.len();
    let mut lone = vec![true; k];
    for &(a, b) in &tree.edges {
        lone[a] = false;
        lone[b] = false;
    }
    for p in &pooled {
        if p.values.len() != cells[p.clique] {
            lone[p.clique] = false;
        }
    }
    let mut values: Vec<Vec<f64>> = cells.iter().map(|&c| vec![0.0; c]).collect();
    let mut precision: Vec<Vec<f64>> = cells.iter().map(|&c| vec![0.0; c]).collect();
    let mut rest = Vec::with_capacity(pooled.len());
    for p in pooled {
        if !lone[p.clique] {
            rest.push(p);
            continue;
        }
        let (v, w) = (&mut values[p.clique], &mut precision[p.clique]);
        for (cell, t) in p.map.iter().map(|&t| t as usize).enumerate() {
            let total = w[cell] + p.precision[t];
            v[cell] = (v[cell] * w[cell] + p.values[t] * p.precision[t]) / total;
            w[cell] = total;
        }
    }
    let mut loss = 0.0;
    for c in (0..k).filter(|&c| lone[c] && precision[c].iter().all(|w| *w > 0.0)) {
        let mu = weighted_simplex_projection(&values[c], &precision[c]);
        loss += mu
            .iter()
            .zip(&values[c])
            .zip(&precision[c])
            .map(|((m, v), w)| w * (m - v).powi(2))
            .sum::<f64>();
        theta[c] = mu.iter().map(|m| m.max(1e-300).ln()).collect();
    }
    (loss, rest)
}

/// `argmin_μ Σ_i w_i (μ_i − v_i)²` over the probability simplex (`w_i > 0`): the KKT
/// conditions give `μ_i = max(0, v_i − λ/(2w_i))` with one λ making the sum 1, found exactly
/// over the sorted breakpoints `2·w_i·v_i`. With equal weights this is Norm-Sub (the
/// Euclidean projection).
pub fn weighted_simplex_projection(v: &[f64], w: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    let breakpoint = |i: usize| 2.0 * w[i] * v[i];
    order.sort_by(|&a, &b| breakpoint(b).total_cmp(&breakpoint(a)));
    // Active set: the cells with the largest breakpoints; λ solves Σ_S v − λ Σ_S 1/(2w) = 1.
    let (mut sum_v, mut sum_inv) = (0.0, 0.0);
    let mut lambda = 0.0;
    for (k, &i) in order.iter().enumerate() {
        sum_v += v[i];
        sum_inv += 1.0 / (2.0 * w[i]);
        lambda = (sum_v - 1.0) / sum_inv;
        if order.get(k + 1).is_none_or(|&j| lambda >= breakpoint(j)) {
            break;
        }
    }
    v.iter()
        .zip(w)
        .map(|(x, wi)| (x - lambda / (2.0 * wi)).max(0.0))
        .collect()
}

/// Errors of [`fit`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    /// An observation's attributes lie in no clique of the tree.
    #[error("observation over {0:?} fits in no clique")]
    NoClique(Vec<usize>),
    /// An observation's lengths do not match its domain, or a variance is not positive.
    #[error("observation over {0:?} is malformed")]
    Malformed(Vec<usize>),
}

/// Fits the MRF over the cliques of `tree` (attribute sizes `domain`) to `observations` (module
/// docs). `start`: log-potentials to start from (one vector per clique, row-major over the
/// clique's sorted attributes), e.g. a previous fit's; uniform otherwise.
/// Errors: [`FitError`] for an observation outside every clique or malformed.
pub fn fit(
    domain: &Domain,
    tree: &JunctionTree,
    observations: &[Observation],
    start: Option<Vec<Vec<f64>>>,
    options: &FitOptions,
) -> Result<GraphicalModel, FitError> {
    let schedule = Schedule::new(domain, tree);
    let cdims = |c: usize| domain.project(&tree.cliques[c]);
    // Pool observations by (clique, attribute list).
    let mut pooled: Vec<Pooled> = Vec::new();
    let mut keys: Vec<PoolKey> = Vec::new();
    for o in observations {
        // Every attribute inside `domain` and valid bin maps (a list matching `attrs`).
        let bins_ok = BinnedFactor::new(&o.attrs, &o.bins)
            .sizes_in(domain.sizes())
            .is_some();
        if !bins_ok {
            return Err(FitError::Malformed(o.attrs.clone()));
        }
        let odims = domain.project(&o.attrs);
        let (mut coarse, mut cells) = coarsen_map(&odims, &o.bins);
        if !o.groups.is_empty() {
            let k = o.groups.iter().map(|&g| g as usize + 1).max().unwrap_or(0);
            let mut seen = vec![false; k];
            o.groups.iter().for_each(|&g| seen[g as usize] = true);
            if o.groups.len() != cells || seen.contains(&false) {
                return Err(FitError::Malformed(o.attrs.clone()));
            }
            coarse = coarse.iter().map(|&c| o.groups[c] as usize).collect();
            cells = k;
        }
        if o.values.len() != cells
            || o.variances.len() != cells
            || o.variances.iter().any(|v| !(*v > 0.0 && v.is_finite()))
            || o.values.iter().any(|v| !v.is_finite())
        {
            return Err(FitError::Malformed(o.attrs.clone()));
        }
        // The smallest clique holding the attributes.
        let clique = (0..tree.cliques.len())
            .filter(|&c| o.attrs.iter().all(|a| tree.cliques[c].contains(a)))
            .min_by_key(|&c| (schedule.cells[c], c))
            .ok_or_else(|| FitError::NoClique(o.attrs.clone()))?;
        let key = (clique, o.attrs.clone(), o.bins.clone(), o.groups.clone());
        let idx = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                keys.push(key);
                pooled.push(Pooled {
                    clique,
                    map: projection_map(&tree.cliques[clique], &cdims(clique), &o.attrs)
                        .into_iter()
                        .map(|t| u32::try_from(coarse[t]).expect("observation cells < 2^32"))
                        .collect(),
                    values: vec![0.0; cells],
                    precision: vec![0.0; cells],
                });
                pooled.len() - 1
            }
        };
        let p = &mut pooled[idx];
        for i in 0..cells {
            let w = 1.0 / o.variances[i];
            let total = p.precision[i] + w;
            p.values[i] = (p.values[i] * p.precision[i] + o.values[i] * w) / total;
            p.precision[i] = total;
        }
    }
    let mut theta: Vec<Vec<f64>> = match start {
        Some(t)
            if t.len() == tree.cliques.len()
                && t.iter().zip(&schedule.cells).all(|(v, &c)| v.len() == c) =>
        {
            t
        }
        _ => schedule.cells.iter().map(|&c| vec![0.0; c]).collect(),
    };
    // A clique alone in its component whose observations all cover it whole (an attribute
    // no kept pair touches) is its own least-squares problem over the simplex: solve it
    // exactly, as mirror descent only approaches the zero cells of the solution.
    let (exact_loss, pooled) = solve_lone_cliques(tree, &schedule.cells, pooled, &mut theta);
    let plan = Projections::new(&pooled, cdims);
    // Buffers for the whole loop: the current point (θ, μ, gradient) and the trial one,
    // swapped when a step is accepted.
    let mut work = Workspace::default();
    let mut cells = Vec::new();
    let (mut mu, mut grad) = (Vec::new(), Vec::new());
    let (mut next, mut next_mu, mut next_grad) = (Vec::new(), Vec::new(), Vec::new());
    schedule.marginals_into(&theta, &mut mu, &mut work);
    let mut loss = loss_and_gradient(&pooled, &plan, &mu, &mut cells, &mut grad) + exact_loss;
    let mut losses = vec![loss];
    // Step: the loss is 2·Σ precision-smooth in μ and ‖Δμ‖₁² ≤ 2 KL (Pinsker), so
    // 1/(4·largest clique precision) is a safe first step; it grows after accepted steps.
    let lipschitz = pooled
        .iter()
        .map(|p| p.precision.iter().copied().fold(0.0, f64::max))
        .fold(0.0, |a: f64, b| a.max(b))
        .max(1e-300);
    let mut alpha = 1.0 / (4.0 * lipschitz * pooled.len().max(1) as f64);
    for _ in 0..options.max_iters {
        if loss <= 0.0 || pooled.is_empty() {
            break;
        }
        next.resize_with(theta.len(), Vec::new);
        for ((n, t), g) in next.iter_mut().zip(&theta).zip(&grad) {
            n.clear();
            n.extend(t.iter().zip(g).map(|(a, b)| a - alpha * b));
        }
        schedule.marginals_into(&next, &mut next_mu, &mut work);
        let next_loss =
            loss_and_gradient(&pooled, &plan, &next_mu, &mut cells, &mut next_grad) + exact_loss;
        // Armijo: the loss must fall by half the first-order prediction.
        let predicted = dot(&grad, &mu, &next_mu);
        if next_loss.is_finite() && next_loss <= loss - 0.5 * predicted {
            std::mem::swap(&mut theta, &mut next);
            std::mem::swap(&mut mu, &mut next_mu);
            std::mem::swap(&mut grad, &mut next_grad);
            loss = next_loss;
            losses.push(loss);
            alpha *= 1.5;
            let w = options.window.max(1);
            if losses.len() > w && losses[losses.len() - 1 - w] - loss < options.tol {
                break;
            }
        } else {
            alpha *= 0.5;
            if alpha < 1e-300 {
                break;
            }
        }
    }
    Ok(GraphicalModel {
        domain: domain.clone(),
        tree: tree.clone(),
        potentials: theta,
        marginals: mu,
        losses,
    })
}

impl GraphicalModel {
    /// The attributes' domain sizes.
    pub fn domain(&self) -> &Domain {
        &self.domain
    }

    /// The junction tree the model is defined on.
    pub fn tree(&self) -> &JunctionTree {
        &self.tree
    }

    /// Clique marginals (one per clique of [`GraphicalModel::tree`], row-major over the
    /// clique's sorted attributes, each summing to 1).
    pub fn clique_marginals(&self) -> &[Vec<f64>] {
        &self.marginals
    }

    /// Log-potentials θ (same shapes as the clique marginals), to warm-start another fit.
    pub fn potentials(&self) -> &[Vec<f64>] {
        &self.potentials
    }

    /// The loss at the start and after every accepted step (non-increasing).
    pub fn losses(&self) -> &[f64] {
        &self.losses
    }

    /// The clique with the fewest cells holding every attribute of `attrs` (lowest index
    /// on ties); `None` if no clique holds them all.
    fn smallest_clique(&self, attrs: &[usize]) -> Option<usize> {
        (0..self.tree.cliques.len())
            .filter(|&c| attrs.iter().all(|a| self.tree.cliques[c].contains(a)))
            .min_by_key(|&c| (self.marginals[c].len(), c))
    }

    /// The model times `ratio(x_a)` (one non-negative factor per value of attribute `a`),
    /// normalized: its 1-way of `a` becomes `p_a · ratio` (normalized) and every
    /// conditional given `a` is kept (raking one margin). The factor enters the log-potential
    /// of the smallest clique holding `a`; marginals are recomputed by belief propagation.
    /// Unchanged if `a` is in no clique or `ratio` does not have `a`'s domain size.
    pub fn with_one_way_ratio(mut self, a: usize, ratio: &[f64]) -> Self {
        let Some(c) = self.smallest_clique(&[a]) else {
            return self;
        };
        if ratio.len() != self.domain[a] || ratio.iter().any(|r| !(*r >= 0.0 && r.is_finite())) {
            return self;
        }
        let clique = &self.tree.cliques[c];
        let cdims = self.domain.project(clique);
        let map = projection_map(clique, &cdims, &[a]);
        for (t, &v) in self.potentials[c].iter_mut().zip(&map) {
            // A zero factor: a cell the model gives (almost) nothing, as the fit's own zeros.
            *t += ratio[v].max(f64::MIN_POSITIVE).ln();
        }
        self.marginals = Schedule::new(&self.domain, &self.tree).marginals(&self.potentials);
        self
    }

    /// The model raked to several 1-way `targets` at once, `(attribute, target over its
    /// values)`, by iterative proportional fitting: [`GraphicalModel::with_one_way_ratio`]
    /// (target ÷ current 1-way) for each in turn, swept until no 1-way is farther than
    /// [`RAKING_TOLERANCE`] from its target (largest cell difference) or for
    /// [`MAX_RAKING_SWEEPS`] sweeps. Raking one attribute moves the 1-ways of the attributes
    /// that share a clique with it, so one pass in order would leave the earlier targets
    /// unmet. Each factor is a function of one attribute: every interaction of the model
    /// (its log-odds ratios) is kept. A target that puts mass where the model holds none
    /// cannot be met and is approached. Targets of unknown attributes or of the wrong length
    /// are ignored.
    pub fn with_one_way_targets(mut self, targets: &[(usize, Vec<f64>)]) -> Self {
        for _ in 0..MAX_RAKING_SWEEPS {
            let mut farthest: f64 = 0.0;
            for (a, target) in targets {
                let Some(now) = self.marginal_in_clique(&[*a]) else {
                    continue;
                };
                if now.len() != target.len() {
                    continue;
                }
                let off = target
                    .iter()
                    .zip(&now)
                    .map(|(t, q)| (t - q).abs())
                    .fold(0.0, f64::max);
                farthest = farthest.max(off);
                // A target already met is not raked again (each rake is a belief propagation).
                if off <= RAKING_TOLERANCE {
                    continue;
                }
                let ratio: Vec<f64> = target
                    .iter()
                    .zip(&now)
                    .map(|(t, q)| if *q > 0.0 { t / q } else { 1.0 })
                    .collect();
                self = self.with_one_way_ratio(*a, &ratio);
            }
            if farthest <= RAKING_TOLERANCE {
                break;
            }
        }
        self
    }

    /// The model's marginal of `attrs` (cells row-major in `attrs` order, sum 1) when all of
    /// `attrs` lie in one clique; `None` otherwise.
    pub fn marginal_in_clique(&self, attrs: &[usize]) -> Option<Vec<f64>> {
        let c = self.smallest_clique(attrs)?;
        let clique = &self.tree.cliques[c];
        let cdims = self.domain.project(clique);
        let map = projection_map(clique, &cdims, attrs);
        let cells = self.domain.table_len(attrs);
        let mut out = vec![0.0; cells];
        for (v, &t) in self.marginals[c].iter().zip(&map) {
            out[t] += v;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha12Rng;

    use crate::graph::build_junction_tree;

    /// Projections through a larger observation of the clique give the loss and gradient of
    /// one pass over the clique per observation: two pairs (from the clique), the 1-ways of
    /// their attributes (each from the smallest pair holding it) and a binned 1-way (from the
    /// full one).
    #[test]
    fn derived_projections_match_one_pass_per_observation() {
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        let cdims = [3usize, 4, 5];
        let clique = [0usize, 1, 2];
        let cells: usize = cdims.iter().product();
        let raw: Vec<f64> = (0..cells).map(|_| rng.random::<f64>()).collect();
        let total: f64 = raw.iter().sum();
        let mu = vec![raw.iter().map(|v| v / total).collect::<Vec<f64>>()];
        let mut pooled_of = |attrs: &[usize], bins: &[Vec<u32>]| {
            let odims: Vec<usize> = attrs.iter().map(|&a| cdims[a]).collect();
            let (coarse, k) = coarsen_map(&odims, bins);
            Pooled {
                clique: 0,
                map: projection_map(&clique, &cdims, attrs)
                    .into_iter()
                    .map(|t| coarse[t] as u32)
                    .collect(),
                values: (0..k).map(|_| rng.random::<f64>() / k as f64).collect(),
                precision: (0..k).map(|_| 1.0 + rng.random::<f64>()).collect(),
            }
        };
        let pooled = vec![
            pooled_of(&[0], &[]),
            pooled_of(&[0, 1], &[]),
            pooled_of(&[1], &[]),
            pooled_of(&[1], &[vec![2]]),
            pooled_of(&[2, 0], &[]),
            pooled_of(&[2], &[]),
        ];
        let plan = Projections::new(&pooled, |_| cdims.to_vec());
        // The 1-ways of 0 and 1 come from pair (0, 1) (12 cells, not (2, 0)'s 15), that of 2
        // from (2, 0), the binned 1-way from the 1-way of 1.
        let parents: Vec<Option<usize>> = plan
            .parent
            .iter()
            .map(|p| p.as_ref().map(|p| p.0))
            .collect();
        assert_eq!(parents, [Some(1), None, Some(1), Some(2), None, Some(4)]);
        // Read from the clique in blocks: (0, 1) sums blocks of attribute 2's five cells,
        // (2, 0) reads each block of attribute 2 at offsets 0, 3, 6, 9, 12.
        let shape = |o: usize| {
            let b = plan.blocks[o].as_ref().unwrap();
            (b.sums, b.offset.clone(), b.base.len())
        };
        assert_eq!(shape(1), (true, vec![0; 5], 12));
        assert_eq!(shape(4), (false, vec![0, 3, 6, 9, 12], 12));
        assert!(plan.blocks[0].is_none() && plan.blocks[2].is_none());
        // Buffers left over from other work (wrong sizes, stale values) change nothing.
        let (mut scratch, mut grad) = (vec![vec![9.0; 3]; 9], vec![vec![7.0; 2]]);
        let loss = loss_and_gradient(&pooled, &plan, &mu, &mut scratch, &mut grad);
        // One pass over the clique per observation.
        let mut want_loss = 0.0;
        let mut want_grad = vec![0.0; cells];
        for p in &pooled {
            let mut proj = vec![0.0; p.values.len()];
            for (v, &t) in mu[0].iter().zip(&p.map) {
                proj[t as usize] += v;
            }
            let g: Vec<f64> = (0..proj.len())
                .map(|i| {
                    let r = proj[i] - p.values[i];
                    want_loss += p.precision[i] * r * r;
                    2.0 * p.precision[i] * r
                })
                .collect();
            for (w, &t) in want_grad.iter_mut().zip(&p.map) {
                *w += g[t as usize];
            }
        }
        assert!(
            (loss - want_loss).abs() <= 1e-12 * want_loss,
            "{loss} vs {want_loss}"
        );
        for (g, w) in grad[0].iter().zip(&want_grad) {
            assert!((g - w).abs() <= 1e-12 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }

    /// A random distribution that factorizes over the chain 0 − 1 − 2 − 3 plus the triangle
    /// (1, 2, 4): cliques {0,1}, {1,2,4}, {2,3}.
    fn decomposable(dims: &[usize], seed: u64) -> Vec<f64> {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let mut table =
            |cells: usize| -> Vec<f64> { (0..cells).map(|_| rng.random::<f64>() + 0.05).collect() };
        let f01 = table(dims[0] * dims[1]);
        let f124 = table(dims[1] * dims[2] * dims[4]);
        let f23 = table(dims[2] * dims[3]);
        let cells: usize = dims.iter().product();
        let mut joint = vec![0.0; cells];
        for (i, v) in joint.iter_mut().enumerate() {
            let mut r = i;
            let mut x = [0; 5];
            for a in (0..5).rev() {
                x[a] = r % dims[a];
                r /= dims[a];
            }
            *v = f01[x[0] * dims[1] + x[1]]
                * f124[(x[1] * dims[2] + x[2]) * dims[4] + x[4]]
                * f23[x[2] * dims[3] + x[3]];
        }
        let s: f64 = joint.iter().sum();
        joint.iter_mut().for_each(|v| *v /= s);
        joint
    }

    fn marginal(joint: &[f64], dims: &[usize], attrs: &[usize]) -> Vec<f64> {
        let all: Vec<usize> = (0..dims.len()).collect();
        let map = projection_map(&all, dims, attrs);
        let mut out = vec![0.0; attrs.iter().map(|&a| dims[a]).product()];
        for (v, &t) in joint.iter().zip(&map) {
            out[t] += v;
        }
        out
    }

    /// Every clique of `tree` observed without error from `joint` (variance 1e-4 per cell).
    fn exact_clique_observations(
        joint: &[f64],
        dims: &[usize],
        tree: &JunctionTree,
    ) -> Vec<Observation> {
        tree.cliques
            .iter()
            .map(|c| Observation {
                bins: vec![],
                groups: Vec::new(),
                attrs: c.to_vec(),
                values: marginal(joint, dims, c),
                variances: vec![1e-4; c.iter().map(|&a| dims[a]).product()],
            })
            .collect()
    }

    /// The model fitted (default options) to the exact clique marginals of the
    /// decomposable distribution of `seed` over the tree of [`edges`].
    fn fitted_to_exact_cliques(dims: &[usize], seed: u64) -> GraphicalModel {
        let joint = decomposable(dims, seed);
        let tree = build_junction_tree(dims.len(), &edges());
        let obs = exact_clique_observations(&joint, dims, &tree);
        fit(&dims.into(), &tree, &obs, None, &FitOptions::default()).unwrap()
    }

    fn edges() -> BTreeSet<(usize, usize)> {
        [(0, 1), (1, 2), (2, 3), (1, 4), (2, 4)]
            .into_iter()
            .collect()
    }

    /// Belief propagation into reused buffers (left by another θ, as in the fit's loop) gives
    /// the same marginals, bit for bit, as into fresh ones.
    #[test]
    fn marginals_into_reused_buffers_are_the_fresh_ones() {
        let dims = [3usize, 4, 2, 5, 3];
        let tree = build_junction_tree(5, &edges());
        let domain: Domain = dims.into();
        let schedule = Schedule::new(&domain, &tree);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut theta = || -> Vec<Vec<f64>> {
            schedule
                .cells
                .iter()
                .map(|&c| (0..c).map(|_| 3.0 * rng.random::<f64>()).collect())
                .collect()
        };
        let (first, second) = (theta(), theta());
        let (mut mu, mut work) = (Vec::new(), Workspace::default());
        schedule.marginals_into(&first, &mut mu, &mut work);
        assert_eq!(mu, schedule.marginals(&first));
        schedule.marginals_into(&second, &mut mu, &mut work);
        assert_eq!(mu, schedule.marginals(&second));
        assert_ne!(mu, schedule.marginals(&first));
        // Summing blocks give the per-cell maps' marginals up to rounding.
        let mut cellwise = schedule.clone();
        let mut blocked = 0;
        for link in cellwise.links.iter_mut().flatten() {
            blocked += usize::from(link.cblocks.take().is_some());
            blocked += usize::from(link.pblocks.take().is_some());
        }
        assert!(blocked > 0, "the tree has no summing block to test");
        for (a, b) in mu
            .iter()
            .flatten()
            .zip(cellwise.marginals(&second).iter().flatten())
        {
            assert!((a - b).abs() <= 1e-14 * a.abs().max(1e-300), "{a} vs {b}");
        }
    }

    #[test]
    fn noiseless_clique_marginals_are_reproduced() {
        let dims = [3usize, 4, 2, 5, 3];
        let joint = decomposable(&dims, 3);
        let tree = build_junction_tree(5, &edges());
        let obs = exact_clique_observations(&joint, &dims, &tree);
        let exact = FitOptions {
            max_iters: 20_000,
            tol: 0.0,
            window: 1,
        };
        let m = fit(&dims.into(), &tree, &obs, None, &exact).unwrap();
        for c in &tree.cliques {
            let truth = marginal(&joint, &dims, c);
            let got = m.marginal_in_clique(c).unwrap();
            let tvd: f64 = truth
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .sum::<f64>()
                / 2.0;
            assert!(tvd < 1e-6, "clique {c:?}: TVD {tvd}");
        }
        // Loss never increases.
        assert!(m.losses().windows(2).all(|w| w[1] <= w[0]));
        // Separators agree.
        for &(i, j) in &tree.edges {
            let sep = tree.separator(i, j);
            let from = |c: usize| {
                let clique = &tree.cliques[c];
                let cd: Vec<usize> = clique.iter().map(|&a| dims[a]).collect();
                let map = projection_map(clique, &cd, &sep);
                let mut out = vec![0.0; sep.iter().map(|&a| dims[a]).product()];
                for (v, &t) in m.clique_marginals()[c].iter().zip(&map) {
                    out[t] += v;
                }
                out
            };
            for (a, b) in from(i).iter().zip(from(j)) {
                assert!((a - b).abs() < 1e-9);
            }
        }
    }

    /// Raking one attribute's 1-way ([`GraphicalModel::with_one_way_ratio`]) gives that
    /// 1-way exactly and keeps every clique's conditional given the attribute, also in a
    /// clique that does not hold it (attribute 1 is in {0,1} and {1,2,4}; 3 is far off).
    #[test]
    fn raking_one_way_sets_it_and_keeps_the_conditionals() {
        let dims = [3usize, 4, 2, 5, 3];
        let m = fitted_to_exact_cliques(&dims, 5);
        let before = m.marginal_in_clique(&[1]).unwrap();
        let target = [0.1, 0.2, 0.3, 0.4];
        let ratio: Vec<f64> = target.iter().zip(&before).map(|(t, p)| t / p).collect();
        let raked = m.clone().with_one_way_ratio(1, &ratio);
        for (a, b) in raked.marginal_in_clique(&[1]).unwrap().iter().zip(&target) {
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
        // P(x_2, x_3 | x_1) is unchanged: the joint of (1, 2, 3) divided by the 1-way of 1.
        let conditional = |g: &GraphicalModel| -> Vec<f64> {
            let p1 = g.marginal_in_clique(&[1]).unwrap();
            let p12 = g.marginal_in_clique(&[1, 2]).unwrap();
            let p23 = g.marginal_in_clique(&[2, 3]).unwrap();
            let p2: Vec<f64> = (0..dims[2])
                .map(|j| (0..dims[1]).map(|i| p12[i * dims[2] + j]).sum())
                .collect();
            let mut out = Vec::new();
            for i in 0..dims[1] {
                for j in 0..dims[2] {
                    for k in 0..dims[3] {
                        // 1 ⟂ 3 | 2 in the chain: P(2,3 | 1) = P(2 | 1)·P(3 | 2).
                        out.push(p12[i * dims[2] + j] / p1[i] * p23[j * dims[3] + k] / p2[j]);
                    }
                }
            }
            out
        };
        for (a, b) in conditional(&m).iter().zip(conditional(&raked)) {
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
        // A ratio of the wrong length changes nothing.
        let same = m.clone().with_one_way_ratio(1, &[2.0; 3]);
        assert_eq!(same.clique_marginals(), m.clique_marginals());
    }

    /// Raking to the 1-ways of two attributes that share a clique ({1, 2, 4}) and one that
    /// does not (3): all three are met together, where raking them one after the other
    /// leaves the first unmet, and every log-odds ratio of the clique of 1 and 2 is kept
    /// (the factors are functions of one attribute each).
    #[test]
    fn raking_several_one_ways_meets_them_all() {
        let dims = [3usize, 4, 2, 5, 3];
        let m = fitted_to_exact_cliques(&dims, 8);
        let targets = vec![
            (1, vec![0.1, 0.2, 0.3, 0.4]),
            (2, vec![0.8, 0.2]),
            (3, vec![0.3, 0.1, 0.2, 0.25, 0.15]),
        ];
        let miss = |g: &GraphicalModel| -> f64 {
            targets
                .iter()
                .flat_map(|(a, t)| {
                    let now = g.marginal_in_clique(&[*a]).unwrap();
                    t.iter()
                        .zip(now)
                        .map(|(x, y)| (x - y).abs())
                        .collect::<Vec<_>>()
                })
                .fold(0.0, f64::max)
        };
        let raked = m.clone().with_one_way_targets(&targets);
        assert!(miss(&raked) <= RAKING_TOLERANCE, "{}", miss(&raked));
        let mut once = m.clone();
        for (a, t) in &targets {
            let now = once.marginal_in_clique(&[*a]).unwrap();
            let ratio: Vec<f64> = t.iter().zip(&now).map(|(x, y)| x / y).collect();
            once = once.with_one_way_ratio(*a, &ratio);
        }
        assert!(miss(&once) > 1e-3, "one pass met them too: {}", miss(&once));
        // log p(i, j) − log p(i, 0) − log p(0, j) + log p(0, 0) over the 1 × 2 marginal.
        let log_odds = |g: &GraphicalModel| -> Vec<f64> {
            let p = g.marginal_in_clique(&[1, 2]).unwrap();
            let at = |i: usize, j: usize| p[i * dims[2] + j].ln();
            (1..dims[1])
                .flat_map(|i| (1..dims[2]).map(move |j| (i, j)))
                .map(|(i, j)| at(i, j) - at(i, 0) - at(0, j) + at(0, 0))
                .collect()
        };
        for (a, b) in log_odds(&m).iter().zip(log_odds(&raked)) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    /// In simulation, adding an unbiased measurement never raises the expected error, over
    /// 40 replicates with Gaussian noise of the stated variances (paired: the same base
    /// measurements with and without the extra one): (1) noisy 1-ways, plus a measurement of
    /// each clique: the mean TVD to the truth must not grow, clique by clique; (2) noisy
    /// cliques, plus a five times noisier second measurement of each clique: it must not grow
    /// beyond the Monte Carlo noise of 40 replicates (1%), summed over cliques.
    #[test]
    fn adding_an_unbiased_measurement_does_not_raise_the_error() {
        let dims = [3usize, 4, 2, 5, 3];
        let joint = decomposable(&dims, 9);
        let tree = build_junction_tree(5, &edges());
        let mut rng = ChaCha12Rng::seed_from_u64(21);
        let mut gauss = move || {
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random::<f64>();
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        };
        let mut noisy = |attrs: &[usize], sd: f64| {
            let truth = marginal(&joint, &dims, attrs);
            Observation {
                bins: vec![],
                groups: Vec::new(),
                attrs: attrs.to_vec(),
                values: truth.iter().map(|t| t + sd * gauss()).collect(),
                variances: vec![sd * sd; truth.len()],
            }
        };
        let k = tree.cliques.len();
        let (mut fewer, mut more) = (vec![0.0; k], vec![0.0; k]);
        let replicates = 40;
        for _ in 0..replicates {
            let ones: Vec<Observation> = (0..5).map(|a| noisy(&[a], 0.01)).collect();
            let mut all = ones.clone();
            all.extend(tree.cliques.iter().map(|c| noisy(c, 0.01)));
            let a = fit(&dims.into(), &tree, &ones, None, &FitOptions::default()).unwrap();
            let b = fit(&dims.into(), &tree, &all, None, &FitOptions::default()).unwrap();
            for (i, c) in tree.cliques.iter().enumerate() {
                let truth = marginal(&joint, &dims, c);
                let tvd = |m: &GraphicalModel| {
                    let got = m.marginal_in_clique(c).unwrap();
                    truth
                        .iter()
                        .zip(&got)
                        .map(|(x, y)| (x - y).abs())
                        .sum::<f64>()
                        / 2.0
                };
                fewer[i] += tvd(&a) / replicates as f64;
                more[i] += tvd(&b) / replicates as f64;
            }
        }
        for i in 0..k {
            assert!(
                more[i] <= fewer[i],
                "clique {:?}: {} with the extra measurement vs {} without",
                tree.cliques[i],
                more[i],
                fewer[i]
            );
        }
    }

    #[test]
    fn malformed_and_misplaced_observations_are_refused() {
        let tree = build_junction_tree(3, &[(0, 1)].into_iter().collect());
        let dims = [2usize, 2, 2];
        let bad = Observation {
            bins: vec![],
            groups: Vec::new(),
            attrs: vec![0, 2],
            values: vec![0.25; 4],
            variances: vec![1.0; 4],
        };
        assert_eq!(
            fit(&dims.into(), &tree, &[bad], None, &FitOptions::default()).unwrap_err(),
            FitError::NoClique(vec![0, 2])
        );
        let short = Observation {
            bins: vec![],
            groups: Vec::new(),
            attrs: vec![0],
            values: vec![0.5],
            variances: vec![1.0, 1.0],
        };
        assert!(matches!(
            fit(&dims.into(), &tree, &[short], None, &FitOptions::default()),
            Err(FitError::Malformed(_))
        ));
    }

    /// The junction tree of one clique over attributes 0 and 1.
    fn pair_tree() -> JunctionTree {
        build_junction_tree(2, &[(0, 1)].into_iter().collect())
    }

    /// Fit options that run a noiseless fit to convergence.
    fn exact_options() -> FitOptions {
        FitOptions {
            max_iters: 5000,
            tol: 1e-12,
            ..FitOptions::default()
        }
    }

    /// The 1-ways of a table `truth` over two attributes (row-major, sizes `dims`).
    fn one_ways(dims: [usize; 2], truth: &[f64]) -> [Vec<f64>; 2] {
        let mut m = [vec![0.0; dims[0]], vec![0.0; dims[1]]];
        for (i, t) in truth.iter().enumerate() {
            m[0][i / dims[1]] += t;
            m[1][i % dims[1]] += t;
        }
        m
    }

    /// Fits `pair` (an observation over attributes 0 and 1) with both exact 1-ways of `truth`
    /// ([`one_ways`], variance 1e-6) on [`pair_tree`]; the fitted pair marginal.
    fn fit_pair_with_one_ways(dims: [usize; 2], truth: &[f64], pair: Observation) -> Vec<f64> {
        let [a, b] = one_ways(dims, truth);
        let one = |attr: usize, values: Vec<f64>| Observation {
            variances: vec![1e-6; values.len()],
            attrs: vec![attr],
            values,
            bins: Vec::new(),
            groups: Vec::new(),
        };
        let observations = [pair, one(0, a), one(1, b)];
        fit(
            &dims.into(),
            &pair_tree(),
            &observations,
            None,
            &exact_options(),
        )
        .unwrap()
        .marginal_in_clique(&[0, 1])
        .unwrap()
    }

    /// A pair measured only over bins (2 × 3 bins of a 4 × 6 domain), with both 1-ways at
    /// full resolution, all noiseless: the fit matches every observation, and, started from
    /// the uniform model, lands on the maximum-entropy table with those sums, which is
    /// VertiMRF §6.1's histogram recovery `Pr[X, Y]·Pr[A | X]·Pr[B | Y]`.
    #[test]
    fn binned_pair_fit_is_histogram_recovery() {
        let dims = [4usize, 6];
        let bins = vec![vec![1u32], vec![2, 4]];
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        let mut truth: Vec<f64> = (0..24).map(|_| rng.random::<f64>() + 0.05).collect();
        let total: f64 = truth.iter().sum();
        truth.iter_mut().for_each(|t| *t /= total);
        let (coarse_map, coarse_cells) = coarsen_map(&dims, &bins);
        let mut coarse = vec![0.0; coarse_cells];
        for (t, &c) in truth.iter().zip(&coarse_map) {
            coarse[c] += t;
        }
        let obs = |values: Vec<f64>, bins: Vec<Vec<u32>>| Observation {
            variances: vec![1e-6; values.len()],
            attrs: vec![0, 1],
            values,
            bins,
            groups: Vec::new(),
        };
        let fitted = fit_pair_with_one_ways(dims, &truth, obs(coarse.clone(), bins.clone()));
        // Histogram recovery: the bin cell's mass spread by each attribute's within-bin share.
        let [a, b] = one_ways(dims, &truth);
        let bin_mass = |m: &[f64], cuts: &[u32], code: usize| -> f64 {
            let bin = ldpsyn::factor::bin_of(code as u32, cuts);
            (0..m.len())
                .filter(|&c| ldpsyn::factor::bin_of(c as u32, cuts) == bin)
                .map(|c| m[c])
                .sum()
        };
        for i in 0..4 {
            for j in 0..6 {
                let expected = coarse[coarse_map[i * 6 + j]] * a[i] / bin_mass(&a, &bins[0], i)
                    * b[j]
                    / bin_mass(&b, &bins[1], j);
                let got = fitted[i * 6 + j];
                assert!(
                    (got - expected).abs() < 1e-4,
                    "({i}, {j}): {got} vs {expected}"
                );
            }
        }
        // Malformed bin maps are refused.
        let bad = obs(coarse, vec![vec![4], vec![]]);
        assert!(matches!(
            fit(&dims.into(), &pair_tree(), &[bad], None, &exact_options()),
            Err(FitError::Malformed(_))
        ));
    }

    /// A pair measured over a partition of its cells (PPSyn's groups: two cells alone, the
    /// other ten in two groups), with both 1-ways, all noiseless: the fit meets every group
    /// sum and 1-way, and the cells alone come back exactly. Malformed group maps (a group
    /// with no cell, a map of the wrong length) are refused.
    #[test]
    fn grouped_pair_fit_meets_the_group_sums() {
        let dims = [3usize, 4];
        let mut rng = ChaCha12Rng::seed_from_u64(9);
        let mut truth: Vec<f64> = (0..12).map(|_| rng.random::<f64>() + 0.05).collect();
        truth[0] += 3.0;
        truth[7] += 2.0;
        let total: f64 = truth.iter().sum();
        truth.iter_mut().for_each(|t| *t /= total);
        let groups: Vec<u32> = vec![0, 1, 1, 2, 2, 1, 2, 3, 1, 2, 2, 1];
        let sums = crate::measure::partition::group_sums(&truth, &groups);
        let obs = |values: Vec<f64>, groups: Vec<u32>| Observation {
            variances: vec![1e-6; values.len()],
            attrs: vec![0, 1],
            values,
            bins: Vec::new(),
            groups,
        };
        let fitted = fit_pair_with_one_ways(dims, &truth, obs(sums.clone(), groups.clone()));
        let got = crate::measure::partition::group_sums(&fitted, &groups);
        for (g, (x, y)) in got.iter().zip(&sums).enumerate() {
            assert!((x - y).abs() < 1e-4, "group {g}: {x} vs {y}");
        }
        assert!((fitted[0] - truth[0]).abs() < 1e-4);
        assert!((fitted[7] - truth[7]).abs() < 1e-4);
        for bad in [
            obs(
                vec![0.5, 0.5, 0.0],
                vec![0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2],
            ),
            obs(vec![0.5, 0.5], vec![0, 1]),
        ] {
            assert!(matches!(
                fit(&dims.into(), &pair_tree(), &[bad], None, &exact_options()),
                Err(FitError::Malformed(_))
            ));
        }
    }

    /// The exact solve of lone cliques: Norm-Sub for equal weights, the KKT point otherwise
    /// (no feasible move along a pair of cells lowers the objective), and what `fit` returns
    /// for an attribute no pair touches.
    #[test]
    fn lone_cliques_are_solved_exactly() {
        let mut rng = ChaCha12Rng::seed_from_u64(11);
        for _ in 0..200 {
            let k = rng.random_range(1..12);
            let v: Vec<f64> = (0..k).map(|_| rng.random::<f64>() - 0.3).collect();
            let w: Vec<f64> = (0..k).map(|_| 0.1 + rng.random::<f64>() * 10.0).collect();
            let ns = ldpsyn::mechanism::norm_sub(&v);
            let eq = weighted_simplex_projection(&v, &vec![3.0; k]);
            for (a, b) in ns.iter().zip(&eq) {
                assert!((a - b).abs() < 1e-12, "{ns:?} vs {eq:?}");
            }
            let mu = weighted_simplex_projection(&v, &w);
            assert!((mu.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            assert!(mu.iter().all(|m| *m >= 0.0));
            let obj = |m: &[f64]| -> f64 {
                m.iter()
                    .zip(&v)
                    .zip(&w)
                    .map(|((x, y), wi)| wi * (x - y).powi(2))
                    .sum()
            };
            let best = obj(&mu);
            for i in 0..k {
                for j in 0..k {
                    let step = mu[i].min(1e-4);
                    if i == j || step <= 0.0 {
                        continue;
                    }
                    let mut m = mu.clone();
                    m[i] -= step;
                    m[j] += step;
                    assert!(obj(&m) >= best - 1e-15, "moving {step} from {i} to {j}");
                }
            }
        }
        // Attribute 2 is alone: its fitted 1-way is the projection of its pooled estimates.
        let dims = [2usize, 2, 4];
        let tree = build_junction_tree(3, &[(0, 1)].into_iter().collect());
        let pair = Observation {
            bins: vec![],
            groups: Vec::new(),
            attrs: vec![0, 1],
            values: vec![0.4, 0.1, 0.1, 0.4],
            variances: vec![1e-4; 4],
        };
        let lone = |values: Vec<f64>, variance: f64| Observation {
            bins: vec![],
            groups: Vec::new(),
            attrs: vec![2],
            values,
            variances: vec![variance; 4],
        };
        let obs = [
            pair,
            lone(vec![0.7, 0.35, -0.05, 0.0], 1e-4),
            lone(vec![0.5, 0.35, 0.1, 0.05], 3e-4),
        ];
        let model = fit(&dims.into(), &tree, &obs, None, &FitOptions::default()).unwrap();
        let mean: Vec<f64> = (0..4)
            .map(|i| (obs[1].values[i] * 3.0 + obs[2].values[i]) / 4.0)
            .collect();
        let expected = ldpsyn::mechanism::norm_sub(&mean);
        let got = model.marginal_in_clique(&[2]).unwrap();
        for (a, b) in got.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-9, "{got:?} vs {expected:?}");
        }
        assert!(got[2] < 1e-200, "the negative cell is empty: {got:?}");
    }
}
