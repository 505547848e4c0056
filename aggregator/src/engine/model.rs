//! The finalized model: estimated conditionals (or SamPrivSyn pair tables), marginals with
//! standard errors, streaming synthesis, and a serializable description.
//!
//! **Consistent clique estimation.** The joint table of each conditional's scope is fitted by
//! iterative proportional fitting (IPF) to every measured marginal inside the scope: the
//! largest measured subsets (each the inverse-variance combination of every table containing
//! it, Norm-Sub'd) and, last, every 1-way marginal (combined from *every* table containing the
//! attribute, the most precise figures there are). Starting from the product of the 1-way
//! marginals, IPF converges to the maximum-entropy table with those marginals when they agree,
//! and ends each sweep matching the 1-ways exactly; an unmeasured scope (e.g. a triangle of
//! pairs) gets the maximum-entropy completion of its measured pairs. Conditionals that share
//! attributes therefore agree on their 1-way marginals.
//!
//! **Sampling** is forward (ancestral) sampling through the conditionals in junction-tree
//! order (Algorithm 3 line 8 of PrivIncr): the root clique, then each clique's new attributes
//! given its separator. Rows stream in constant memory; the same model and seed give the same
//! rows (ChaCha12).

use std::sync::Arc;

use ldpsyn::mechanism::norm_sub;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::{Deserialize, Serialize};

use super::EngineError;
use super::plan::{Conditional, Structure};
use super::samprivsyn::SamPrivSynModel;
use super::state::EdgeState;
use super::tables::{Combined, Measurements, projection_map};

/// Where joint tables of attribute sets come from.
pub trait JointSource: Send + Sync + std::fmt::Debug {
    /// A distribution over the product domain of `scope` (row-major in `scope` order,
    /// non-negative, sums to 1).
    fn joint(&self, scope: &[usize]) -> Vec<f64>;
    /// A direct measurement of the marginal of `attrs`, if one exists (with standard errors).
    fn measured(&self, attrs: &[usize]) -> Option<Combined> {
        let _ = attrs;
        None
    }
}

/// Joint tables fitted by IPF to the combined measurements (module docs).
#[derive(Debug, Clone)]
pub struct ConsistentJoint {
    ms: Measurements,
    one_way: Vec<Vec<f64>>,
}

/// IPF sweeps per joint table.
const IPF_SWEEPS: usize = 10;

/// One IPF step: rescales `joint` (over `scope` with `dims`) so its marginal on `set`
/// equals `target`.
pub(crate) fn ipf_step(
    joint: &mut [f64],
    scope: &[usize],
    dims: &[usize],
    set: &[usize],
    target: &[f64],
) {
    let map = projection_map(scope, dims, set);
    let mut cur = vec![0.0; target.len()];
    let mut count = vec![0usize; target.len()];
    for (i, &t) in map.iter().enumerate() {
        cur[t] += joint[i];
        count[t] += 1;
    }
    for (i, &t) in map.iter().enumerate() {
        joint[i] = if cur[t] > 0.0 {
            joint[i] * target[t] / cur[t]
        } else {
            target[t] / count[t] as f64
        };
    }
}

impl ConsistentJoint {
    /// Wraps the measurements; precomputes the 1-way marginals (uniform where unmeasured).
    pub fn new(ms: Measurements) -> Self {
        let one_way = (0..ms.domain_sizes().len())
            .map(|a| match ms.combined(&[a]) {
                Some(c) => norm_sub(&c.frequencies),
                None => vec![1.0 / ms.domain_sizes()[a] as f64; ms.domain_sizes()[a]],
            })
            .collect();
        Self { ms, one_way }
    }

    /// The measurements.
    pub fn measurements(&self) -> &Measurements {
        &self.ms
    }

    /// The 1-way marginal of `a` (Norm-Sub'd combination of every table containing it).
    pub fn one_way(&self, a: usize) -> &[f64] {
        &self.one_way[a]
    }
}

impl JointSource for ConsistentJoint {
    fn joint(&self, scope: &[usize]) -> Vec<f64> {
        let dims: Vec<usize> = scope.iter().map(|&a| self.ms.domain_sizes()[a]).collect();
        if scope.len() == 1 {
            return self.one_way[scope[0]].clone();
        }
        // Largest measured subsets of the scope (intersections with measured factors).
        let mut sets: Vec<Vec<usize>> = Vec::new();
        for m in self.ms.measured_sets() {
            let inter: Vec<usize> = scope.iter().copied().filter(|a| m.contains(a)).collect();
            if inter.len() >= 2 && !sets.contains(&inter) {
                sets.push(inter);
            }
        }
        let maximal: Vec<Vec<usize>> = sets
            .iter()
            .filter(|s| {
                !sets
                    .iter()
                    .any(|o| o.len() > s.len() && s.iter().all(|a| o.contains(a)))
            })
            .cloned()
            .collect();
        let mut targets: Vec<(Vec<usize>, Vec<f64>)> = maximal
            .into_iter()
            .filter_map(|s| self.ms.combined(&s).map(|c| (s, norm_sub(&c.frequencies))))
            .collect();
        targets.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        // Start: product of the 1-ways.
        let cells: usize = dims.iter().product();
        let mut joint = vec![1.0; cells];
        for (pos, &a) in scope.iter().enumerate() {
            ipf_step(
                &mut joint,
                scope,
                &dims,
                &scope[pos..=pos],
                &self.one_way[a],
            );
        }
        let sweeps = if targets.is_empty() { 0 } else { IPF_SWEEPS };
        for _ in 0..sweeps {
            for (s, t) in &targets {
                ipf_step(&mut joint, scope, &dims, s, t);
            }
            for (pos, &a) in scope.iter().enumerate() {
                ipf_step(
                    &mut joint,
                    scope,
                    &dims,
                    &scope[pos..=pos],
                    &self.one_way[a],
                );
            }
        }
        let s: f64 = joint.iter().sum();
        if s > 0.0 {
            joint.iter_mut().for_each(|v| *v /= s);
        }
        joint
    }

    fn measured(&self, attrs: &[usize]) -> Option<Combined> {
        self.ms.combined(attrs)
    }
}

/// A conditional with its estimated tables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EstimatedConditional {
    /// Which conditional.
    pub conditional: Conditional,
    /// Domain sizes of its scope (`parents ++ targets`).
    pub scope_dims: Vec<usize>,
    /// The fitted joint over the scope (row-major, sums to 1).
    pub joint: Vec<f64>,
    /// `Pr(targets | parents)` (row-major over the scope; each parent block sums to 1).
    pub conditional_table: Vec<f64>,
}

impl EstimatedConditional {
    fn new(conditional: Conditional, dims: &[usize], source: &dyn JointSource) -> Self {
        let scope = conditional.scope();
        let scope_dims: Vec<usize> = scope.iter().map(|&a| dims[a]).collect();
        let joint = source.joint(&scope);
        let tc: usize = conditional.targets.iter().map(|&a| dims[a]).product();
        let pc = joint.len() / tc;
        // Marginal of the targets, for parent configurations with no mass.
        let mut tmarg = vec![0.0; tc];
        for (i, v) in joint.iter().enumerate() {
            tmarg[i % tc] += v;
        }
        let ts: f64 = tmarg.iter().sum();
        if ts > 0.0 {
            tmarg.iter_mut().for_each(|v| *v /= ts);
        } else {
            tmarg.iter_mut().for_each(|v| *v = 1.0 / tc as f64);
        }
        let mut cond = vec![0.0; joint.len()];
        for p in 0..pc {
            let block = &joint[p * tc..(p + 1) * tc];
            let s: f64 = block.iter().sum();
            for t in 0..tc {
                cond[p * tc + t] = if s > 0.0 { block[t] / s } else { tmarg[t] };
            }
        }
        Self {
            conditional,
            scope_dims,
            joint,
            conditional_table: cond,
        }
    }
}

/// A marginal served by [`Model::marginal`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MarginalEstimate {
    /// Attributes (as requested).
    pub attrs: Vec<usize>,
    /// Their domain sizes.
    pub dims: Vec<usize>,
    /// Frequencies, row-major in `attrs` order, non-negative, sum 1.
    pub frequencies: Vec<f64>,
    /// Standard errors of the unbiased combined estimate where the figure comes directly from
    /// measurements (the frequencies are then its Norm-Sub projection); `None` when the
    /// marginal is inferred from the model.
    pub std_errors: Option<Vec<f64>>,
}

/// Serializable description of a model (for `GET /model`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelDescription {
    /// Protocol name.
    pub protocol: String,
    /// Domain sizes.
    pub domain_sizes: Vec<usize>,
    /// Every pair evaluated in phase 1 with MI, thresholds and round pruned (PrivIncr/auto).
    pub edges: Vec<EdgeState>,
    /// Dependency graph, junction tree and conditionals (graphical models).
    pub structure: Option<Structure>,
    /// SamPrivSyn: pairs `(a, b, MI weight)`.
    pub pair_weights: Option<Vec<(usize, usize, f64)>>,
}

#[derive(Debug, Clone)]
enum ModelKind {
    Graphical {
        structure: Structure,
        factors: Arc<Vec<EstimatedConditional>>,
    },
    SamPrivSyn(Arc<SamPrivSynModel>),
}

/// A finalized model. Cheap to clone (shared tables).
#[derive(Debug, Clone)]
pub struct Model {
    protocol: String,
    dims: Vec<usize>,
    edges: Vec<EdgeState>,
    kind: ModelKind,
    source: Arc<dyn JointSource>,
}

impl Model {
    /// A graphical model: each conditional of `structure` estimated from `source`.
    pub fn graphical(
        protocol: &str,
        dims: Vec<usize>,
        edges: Vec<EdgeState>,
        structure: Structure,
        source: impl JointSource + 'static,
    ) -> Self {
        let factors = structure
            .conditionals
            .iter()
            .map(|c| EstimatedConditional::new(c.clone(), &dims, &source))
            .collect();
        Self {
            protocol: protocol.into(),
            dims,
            edges,
            kind: ModelKind::Graphical {
                structure,
                factors: Arc::new(factors),
            },
            source: Arc::new(source),
        }
    }

    pub(crate) fn samprivsyn(
        dims: Vec<usize>,
        model: SamPrivSynModel,
        source: impl JointSource + 'static,
    ) -> Self {
        Self {
            protocol: "samprivsyn".into(),
            dims,
            edges: Vec::new(),
            kind: ModelKind::SamPrivSyn(Arc::new(model)),
            source: Arc::new(source),
        }
    }

    /// Domain sizes.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The dependency-graph edges of the model (attribute pairs), sorted.
    pub fn graph_edges(&self) -> Vec<(usize, usize)> {
        match &self.kind {
            ModelKind::Graphical { structure, .. } => structure.edges.clone(),
            ModelKind::SamPrivSyn(_) => Vec::new(),
        }
    }

    /// The estimated conditionals (graphical models).
    pub fn conditionals(&self) -> Option<&[EstimatedConditional]> {
        match &self.kind {
            ModelKind::Graphical { factors, .. } => Some(factors),
            ModelKind::SamPrivSyn(_) => None,
        }
    }

    /// The serializable description.
    pub fn describe(&self) -> ModelDescription {
        ModelDescription {
            protocol: self.protocol.clone(),
            domain_sizes: self.dims.clone(),
            edges: self.edges.clone(),
            structure: match &self.kind {
                ModelKind::Graphical { structure, .. } => Some(structure.clone()),
                ModelKind::SamPrivSyn(_) => None,
            },
            pair_weights: match &self.kind {
                ModelKind::SamPrivSyn(m) => Some(m.pair_weights()),
                ModelKind::Graphical { .. } => None,
            },
        }
    }

    /// The marginal of `attrs` (distinct attribute indices, cells row-major in this order):
    /// from the measurements with standard errors when some table contains all of `attrs`,
    /// else inferred from the model (exact variable elimination over the conditionals;
    /// SamPrivSyn: IPF over its pair tables) without standard errors.
    /// Errors: empty, repeated or unknown attributes; more than 2^22 cells.
    pub fn marginal(&self, attrs: &[usize]) -> Result<MarginalEstimate, EngineError> {
        let d = self.dims.len();
        if attrs.is_empty()
            || attrs.iter().any(|&a| a >= d)
            || (1..attrs.len()).any(|i| attrs[..i].contains(&attrs[i]))
        {
            return Err(EngineError::BadAttributes(format!("{attrs:?}")));
        }
        let dims: Vec<usize> = attrs.iter().map(|&a| self.dims[a]).collect();
        let cells = dims.iter().try_fold(1usize, |acc, &k| acc.checked_mul(k));
        if cells.is_none_or(|c| c > 1 << 22) {
            return Err(EngineError::BadAttributes("marginal too large".into()));
        }
        if let Some(c) = self.source.measured(attrs) {
            return Ok(MarginalEstimate {
                attrs: attrs.to_vec(),
                dims,
                frequencies: norm_sub(&c.frequencies),
                std_errors: Some(c.std_errors),
            });
        }
        let frequencies = match &self.kind {
            ModelKind::Graphical { factors, .. } => infer(&self.dims, factors, attrs),
            ModelKind::SamPrivSyn(_) => self.source.joint(attrs),
        };
        Ok(MarginalEstimate {
            attrs: attrs.to_vec(),
            dims,
            frequencies,
            std_errors: None,
        })
    }

    /// Streams `rows` synthetic records (codes, one per attribute) from `seed`. Graphical
    /// models use constant memory; SamPrivSyn builds its table first (O(rows·d), the eq. 12
    /// updating needs it). The same model and seed give the same rows.
    pub fn synthesize(&self, rows: u64, seed: u64) -> Synthesizer {
        match &self.kind {
            ModelKind::Graphical { factors, .. } => Synthesizer {
                inner: SynthInner::Forward {
                    factors: compile(factors),
                    rng: Box::new(ChaCha12Rng::seed_from_u64(seed)),
                },
                d: self.dims.len(),
                remaining: rows,
            },
            ModelKind::SamPrivSyn(m) => Synthesizer {
                inner: SynthInner::Table {
                    table: m.synthesize_table(rows as usize, seed),
                    next: 0,
                },
                d: self.dims.len(),
                remaining: rows,
            },
        }
    }
}

#[derive(Debug, Clone)]
struct Compiled {
    parents: Vec<usize>,
    parent_dims: Vec<usize>,
    targets: Vec<usize>,
    target_dims: Vec<usize>,
    /// Target cells `Π target_dims`: the length of one block of `cdf`.
    target_cells: usize,
    /// Cumulative `Pr(target cell | parent cell)`, blocks of `target_cells`.
    cdf: Vec<f64>,
}

fn compile(factors: &[EstimatedConditional]) -> Arc<Vec<Compiled>> {
    Arc::new(
        factors
            .iter()
            .map(|f| {
                let np = f.conditional.parents.len();
                let target_dims = f.scope_dims[np..].to_vec();
                let tc: usize = target_dims.iter().product();
                let mut cdf = f.conditional_table.clone();
                for block in cdf.chunks_mut(tc) {
                    let mut acc = 0.0;
                    for v in block.iter_mut() {
                        acc += *v;
                        *v = acc;
                    }
                }
                Compiled {
                    parents: f.conditional.parents.clone(),
                    parent_dims: f.scope_dims[..np].to_vec(),
                    targets: f.conditional.targets.clone(),
                    target_dims,
                    target_cells: tc,
                    cdf,
                }
            })
            .collect(),
    )
}

#[derive(Debug)]
enum SynthInner {
    Forward {
        factors: Arc<Vec<Compiled>>,
        rng: Box<ChaCha12Rng>,
    },
    Table {
        table: Vec<u32>,
        next: usize,
    },
}

/// Iterator of synthetic rows (codes, one per attribute); see [`Model::synthesize`].
#[derive(Debug)]
pub struct Synthesizer {
    inner: SynthInner,
    d: usize,
    remaining: u64,
}

impl Iterator for Synthesizer {
    type Item = Vec<u32>;

    fn next(&mut self) -> Option<Vec<u32>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let d = self.d;
        match &mut self.inner {
            SynthInner::Forward { factors, rng } => {
                let mut row = vec![0u32; d];
                for f in factors.iter() {
                    let mut p = 0usize;
                    for (&a, &k) in f.parents.iter().zip(&f.parent_dims) {
                        p = p * k + row[a] as usize;
                    }
                    let tc = f.target_cells;
                    let block = &f.cdf[p * tc..(p + 1) * tc];
                    let u = rng.random::<f64>() * block[tc - 1];
                    let mut t = block.partition_point(|&c| c <= u).min(tc - 1);
                    for (&a, &k) in f.targets.iter().zip(&f.target_dims).rev() {
                        row[a] = (t % k) as u32;
                        t /= k;
                    }
                }
                Some(row)
            }
            SynthInner::Table { table, next } => {
                let row = table[*next * d..(*next + 1) * d].to_vec();
                *next += 1;
                Some(row)
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let r = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (r, Some(r))
    }
}

/// A factor over sorted variables, row-major.
#[derive(Debug, Clone)]
struct Factor {
    vars: Vec<usize>,
    dims: Vec<usize>,
    values: Vec<f64>,
}

impl Factor {
    fn from_scope(scope: &[usize], scope_dims: &[usize], values: &[f64]) -> Self {
        let mut order: Vec<usize> = (0..scope.len()).collect();
        order.sort_by_key(|&i| scope[i]);
        let vars: Vec<usize> = order.iter().map(|&i| scope[i]).collect();
        let dims: Vec<usize> = order.iter().map(|&i| scope_dims[i]).collect();
        let map = projection_map(scope, scope_dims, &vars);
        let mut out = vec![0.0; values.len()];
        for (i, &t) in map.iter().enumerate() {
            out[t] = values[i];
        }
        Self {
            vars,
            dims,
            values: out,
        }
    }

    fn strides_in(&self, vars: &[usize]) -> Vec<usize> {
        // Stride of each of `vars` in this factor (0 if absent).
        vars.iter()
            .map(|v| match self.vars.iter().position(|x| x == v) {
                Some(i) => self.dims[i + 1..].iter().product(),
                None => 0,
            })
            .collect()
    }

    fn product(&self, other: &Factor, dims_of: &[usize]) -> Factor {
        let mut vars: Vec<usize> = self.vars.iter().chain(&other.vars).copied().collect();
        vars.sort_unstable();
        vars.dedup();
        let dims: Vec<usize> = vars.iter().map(|&v| dims_of[v]).collect();
        let cells: usize = dims.iter().product();
        let (sa, sb) = (self.strides_in(&vars), other.strides_in(&vars));
        let mut values = Vec::with_capacity(cells);
        let mut codes = vec![0usize; vars.len()];
        let (mut ia, mut ib) = (0usize, 0usize);
        for _ in 0..cells {
            values.push(self.values[ia] * other.values[ib]);
            for i in (0..codes.len()).rev() {
                codes[i] += 1;
                ia += sa[i];
                ib += sb[i];
                if codes[i] < dims[i] {
                    break;
                }
                ia -= sa[i] * dims[i];
                ib -= sb[i] * dims[i];
                codes[i] = 0;
            }
        }
        Factor { vars, dims, values }
    }

    fn sum_out(&self, v: usize) -> Factor {
        let keep: Vec<usize> = self.vars.iter().copied().filter(|&x| x != v).collect();
        let map = projection_map(&self.vars, &self.dims, &keep);
        let dims: Vec<usize> = keep
            .iter()
            .map(|k| self.dims[self.vars.iter().position(|x| x == k).expect("kept var")])
            .collect();
        let mut values = vec![0.0; dims.iter().product()];
        for (i, &t) in map.iter().enumerate() {
            values[t] += self.values[i];
        }
        Factor {
            vars: keep,
            dims,
            values,
        }
    }
}

/// Exact marginal of `query` by variable elimination over the ancestors of `query`.
fn infer(dims: &[usize], factors: &[EstimatedConditional], query: &[usize]) -> Vec<f64> {
    let mut needed: Vec<bool> = vec![false; dims.len()];
    query.iter().for_each(|&a| needed[a] = true);
    let mut used = Vec::new();
    for f in factors.iter().rev() {
        if f.conditional.targets.iter().any(|&t| needed[t]) {
            f.conditional.parents.iter().for_each(|&p| needed[p] = true);
            f.conditional.targets.iter().for_each(|&t| needed[t] = true);
            used.push(Factor::from_scope(
                &f.conditional.scope(),
                &f.scope_dims,
                &f.conditional_table,
            ));
        }
    }
    let mut eliminate: Vec<usize> = (0..dims.len())
        .filter(|&a| needed[a] && !query.contains(&a))
        .collect();
    while !eliminate.is_empty() {
        // Greedy: the variable whose combined factor is smallest.
        let (pos, _) = eliminate
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let mut vars: Vec<usize> = used
                    .iter()
                    .filter(|f| f.vars.contains(&v))
                    .flat_map(|f| f.vars.iter().copied())
                    .collect();
                vars.sort_unstable();
                vars.dedup();
                (i, vars.iter().map(|&x| dims[x] as f64).product::<f64>())
            })
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
            .expect("non-empty");
        let v = eliminate.remove(pos);
        let (with, without): (Vec<Factor>, Vec<Factor>) =
            used.into_iter().partition(|f| f.vars.contains(&v));
        used = without;
        if let Some(first) = with.first() {
            let prod = with[1..]
                .iter()
                .fold(first.clone(), |acc, f| acc.product(f, dims));
            used.push(prod.sum_out(v));
        }
    }
    let unit = Factor {
        vars: Vec::new(),
        dims: Vec::new(),
        values: vec![1.0],
    };
    let joint = used.iter().fold(unit, |acc, f| acc.product(f, dims));
    // Reorder to the query order.
    let map = projection_map(&joint.vars, &joint.dims, query);
    let mut out = vec![0.0; joint.values.len()];
    for (i, &t) in map.iter().enumerate() {
        out[t] += joint.values[i];
    }
    let s: f64 = out.iter().sum();
    if s > 0.0 {
        out.iter_mut().for_each(|v| *v /= s);
    }
    out
}
