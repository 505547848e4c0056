//! The finalized model: estimated conditionals (or SamPrivSyn pair tables), marginals with
//! standard errors, streaming synthesis, and a serializable description.
//!
//! **Clique estimation.** The joint table of each conditional's scope is the marginal of
//! the graphical model fitted to every measurement ([`super::estimate`], [`super::pgm`]):
//! conditionals that share attributes agree on them by construction.
//!
//! **Sampling** is forward (ancestral) sampling through the conditionals in junction-tree
//! order (Algorithm 3 line 8 of PrivIncr): the root clique, then each clique's new attributes
//! given its separator. Rows stream in constant memory; the same model and seed give the same
//! rows (ChaCha12).

use std::sync::Arc;

use ldpsyn::mechanism::MechanismKind;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::{Deserialize, Serialize};

use super::EngineError;
use super::drift::DriftReport;
use super::estimate::{FitResiduals, outer};
use super::graph::EdgeState;
use super::pgm::GraphicalModel;
use super::plan::{Conditional, Structure};
use super::samprivsyn::SamPrivSynModel;
use super::space::{POINT_MASS_Z, Space, cell_range};
use super::tables::{Measurements, TableKey, coarsen_map, projection_map};

/// Where joint tables of attribute sets come from.
pub trait JointSource: Send + Sync + std::fmt::Debug {
    /// A distribution over the product domain of `scope` (row-major in `scope` order,
    /// non-negative, sums to 1). Models call it for scopes inside one clique of their
    /// structure.
    fn joint(&self, scope: &[usize]) -> Vec<f64>;
    /// Standard errors of the marginal of `attrs` whose model estimate is `frequencies`, if
    /// the source can tell.
    fn std_errors(&self, attrs: &[usize], frequencies: &[f64]) -> Option<Vec<f64>> {
        let _ = (attrs, frequencies);
        None
    }
}

/// The graphical model fitted to every measurement ([`super::estimate::fit_model`]), with
/// the measurements kept for standard errors.
#[derive(Debug, Clone)]
pub struct FittedJoint {
    ms: Measurements,
    model: GraphicalModel,
    shared_records: bool,
}

impl FittedJoint {
    /// Wraps a fit and the measurements it was fitted to, each table of its own users.
    pub fn new(ms: Measurements, model: GraphicalModel) -> Self {
        Self {
            ms,
            model,
            shared_records: false,
        }
    }

    /// The same, for tables that all count reports of the same records (a vertical
    /// collection): a 1-way and every pair containing it are then one estimate, not
    /// independent ones, and a marginal's standard errors are those of the table over
    /// exactly its attributes.
    pub fn with_shared_records(mut self, shared: bool) -> Self {
        self.shared_records = shared;
        self
    }

    /// The measurements.
    pub fn measurements(&self) -> &Measurements {
        &self.ms
    }

    /// The fitted model.
    pub fn model(&self) -> &GraphicalModel {
        &self.model
    }
}

/// `model`'s marginal of `scope` (row-major in `scope` order) when a clique holds it, else the
/// maximum-entropy completion of its 1-ways (the models built here only ask for scopes inside
/// cliques).
pub(crate) fn clique_joint(model: &GraphicalModel, scope: &[usize]) -> Vec<f64> {
    model.marginal_in_clique(scope).unwrap_or_else(|| {
        scope.iter().fold(vec![1.0], |acc, &a| {
            let one = model
                .marginal_in_clique(&[a])
                .expect("every attribute lies in a clique");
            acc.iter()
                .flat_map(|x| one.iter().map(move |y| x * y))
                .collect()
        })
    })
}

impl JointSource for FittedJoint {
    fn joint(&self, scope: &[usize]) -> Vec<f64> {
        clique_joint(&self.model, scope)
    }

    /// The standard errors of the inverse-variance combination of every table containing
    /// `attrs` (the one variance model at the model's `frequencies`): the model's estimate
    /// pools at least those tables, so they bound its error where the model holds. With
    /// shared records ([`FittedJoint::with_shared_records`]) only the table over exactly
    /// `attrs` counts: the others hold the same reports.
    fn std_errors(&self, attrs: &[usize], frequencies: &[f64]) -> Option<Vec<f64>> {
        let exact = |k: &TableKey| {
            k.factor.len() == attrs.len() && attrs.iter().all(|a| k.factor.contains(a))
        };
        self.ms
            .combined_at(
                attrs,
                |m| !self.shared_records || exact(m),
                Some(frequencies),
            )
            .map(|c| c.std_errors)
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
    /// Standard errors of the cells where some table measured all of `attrs` (the one
    /// variance model at the model's frequencies); `None` otherwise.
    pub std_errors: Option<Vec<f64>>,
}

/// One candidate pair of the model graph and its expected gain
/// ([`super::estimate::PairGain`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeGain {
    /// First attribute.
    pub a: usize,
    /// Second attribute.
    pub b: usize,
    /// L1 distance between the pair's projected estimate and the product of its 1-ways.
    pub observed_l1: f64,
    /// L1 error of the pair's projected estimate (what keeping it costs).
    pub noise_l1: f64,
    /// Estimated dependence (L1 distance from independence, debiased for noise).
    pub dependence: f64,
    /// Standard deviation of the dependence estimate for an independent pair.
    #[serde(default)]
    pub dependence_sd: f64,
    /// In the model graph.
    pub kept: bool,
}

/// One factor a round measured (for `GET /model`): its table and the reports it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredFactor {
    /// Attributes in report order.
    pub factor: Vec<usize>,
    /// Mechanism of the reports.
    pub mechanism: MechanismKind,
    /// Bin maps of the factor's attributes over schema codes (empty: full resolution).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
    /// Reports (users) in the table.
    pub reports: u64,
    /// A pair's score where the protocol selected pairs by one (`auto`: estimated dependence,
    /// L1; PrivIncr: MI), from the round that decided on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

/// What one round (SamPrivSyn: batch) measured, from the tables at finalize.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundSummary {
    /// Round index (the tasks' round).
    pub round: u32,
    /// Reports in the round.
    pub reports: u64,
    /// Its tables, most reports first.
    pub factors: Vec<MeasuredFactor>,
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
    /// Every measured candidate pair of the model graph with its expected gain.
    #[serde(default)]
    pub model_graph: Vec<EdgeGain>,
    /// Per round, what was measured and with how many reports.
    #[serde(default)]
    pub rounds: Vec<RoundSummary>,
    /// Per attribute, the cuts of the working bins the model was fitted in over its schema
    /// codes (`[]`: every code a bin): a `bins: "auto"` attribute's grid in its working bins,
    /// with the point masses `auto`'s (or PrivIncr's numeric) round 0 found as bins of their
    /// own ([`crate::space`]).
    #[serde(default)]
    pub working_bins: Vec<Vec<u32>>,
    /// Whether the rounds measured different populations, per attribute
    /// ([`crate::drift`]); `None` for a model of one round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftReport>,
    /// The fit checked against its measurements (graphical models;
    /// [`crate::estimate::fit_residuals`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residuals: Option<FitResiduals>,
    /// Vertical collections: ε spent on one person over every party (Σ of the attributes'
    /// ε; the parties' reports are joined by record id, so they compose). `None` otherwise,
    /// and from [`Model::describe`], which does not know the collection's parties.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composed_epsilon: Option<f64>,
}

#[derive(Debug, Clone)]
enum ModelKind {
    Graphical {
        structure: Structure,
        factors: Arc<Vec<EstimatedConditional>>,
    },
    SamPrivSyn(Arc<SamPrivSynModel>),
}

/// How a synthetic row's working bin becomes a schema code ([`crate::space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expansion {
    /// In proportion to the attribute's 1-way estimated on its codes (VertiMRF §6.1's
    /// histogram recovery); uniform within a bin where there is none or it has no mass.
    #[default]
    Recover,
    /// Uniform over the bin's codes.
    Uniform,
    /// The bin's middle code.
    Midpoint,
}

/// Working bins → schema codes, for synthesis and marginals of a model fitted in a working
/// space that is not the identity ([`crate::space`]).
#[derive(Debug, Clone)]
pub struct Recovery {
    space: Space,
    /// Per attribute with working bins, the probability of each code within its bin (each
    /// bin sums to 1), from [`Measurements::sub_bin_distribution`] shrunk towards the
    /// frequency polygon of the working bins ([`frequency_polygon`]) after being made
    /// consistent with the bin's mass ([`consistent_with`]), a point mass found in it
    /// keeping its share ([`within_bin_shape_with_points`]); the polygon alone where no
    /// sub-bins were measured.
    within: Vec<Option<Vec<f64>>>,
}

impl Recovery {
    /// The recovery of `space` from the sub-bin 1-ways in `ms` (measurements in that space);
    /// `None` for the identity space.
    pub fn new(space: &Space, ms: &Measurements) -> Option<Self> {
        if space.is_identity() {
            return None;
        }
        let within = (0..space.dims().len())
            .map(|a| {
                if space.cuts(a).is_empty() {
                    return None;
                }
                let k = space.code_dims()[a];
                // The polygon within each bin unless sub-bins were measured.
                let measured = ms.combined_at(&[a], |_| true, None).map(|c| c.frequencies);
                let ones = vec![1.0; space.dims()[a]];
                let prior = frequency_polygon(space, a, measured.as_deref().unwrap_or(&ones));
                let mut w = prior.clone();
                if let Some((cuts, f, se)) = ms.sub_bin_distribution(a) {
                    let cell_of = |c: u32| ldpsyn::factor::bin_of(c, &cuts) as usize;
                    let cell_size = |i: usize| cell_range(&cuts, k, i).len() as u32;
                    // Point masses the pooled sub-bins resolve though round 0's did not
                    // (the same test, on every round's reports).
                    let points: Vec<usize> = space
                        .point_masses(a, &cuts, &f, &se)
                        .iter()
                        .map(|r| cell_of(r.start))
                        .collect();
                    for bin in 0..space.dims()[a] {
                        // The bin's estimated mass (NaN: none, and nothing is adjusted to it).
                        let mass = measured.as_ref().map_or(f64::NAN, |m| m[bin]);
                        let r = space.code_range(a, bin);
                        let cells = cell_of(r.start)..cell_of(r.end - 1) + 1;
                        // The polygon's share of each sub-bin cell of this bin.
                        let mut prior_cells = vec![0.0; cells.len()];
                        for c in r.clone() {
                            prior_cells[cell_of(c) - cells.start] += prior[c as usize];
                        }
                        let local: Vec<usize> = points
                            .iter()
                            .filter(|i| cells.contains(i))
                            .map(|i| i - cells.start)
                            .collect();
                        // The bin's mass pools every report of the attribute: the cells
                        // are made to sum to it before they shape the bin.
                        let x = consistent_with(&f[cells.clone()], &se[cells.clone()], mass);
                        let shape = within_bin_shape_with_points(
                            &x,
                            &se[cells.clone()],
                            &prior_cells,
                            &local,
                            mass,
                        );
                        for c in r {
                            let i = cell_of(c) - cells.start;
                            // Within a cell, the codes as the polygon spreads them.
                            w[c as usize] = if prior_cells[i] > 0.0 {
                                shape[i] * prior[c as usize] / prior_cells[i]
                            } else {
                                shape[i] / f64::from(cell_size(i + cells.start))
                            };
                        }
                    }
                }
                Some(w)
            })
            .collect();
        Some(Self {
            space: space.clone(),
            within,
        })
    }

    /// The code of attribute `a` for working bin `bin`, drawn per `how` with `u ∈ [0, 1)`.
    fn code(&self, a: usize, bin: u32, how: Expansion, u: f64) -> u32 {
        let Some(w) = &self.within[a] else {
            return bin;
        };
        let r = self.space.code_range(a, bin as usize);
        match how {
            Expansion::Midpoint => r.start + (r.end - r.start - 1) / 2,
            Expansion::Uniform => {
                r.start + ((u * f64::from(r.end - r.start)) as u32).min(r.end - r.start - 1)
            }
            Expansion::Recover => {
                let mut acc = 0.0;
                for c in r.clone() {
                    acc += w[c as usize];
                    if u < acc {
                        return c;
                    }
                }
                r.end - 1
            }
        }
    }

    /// A marginal over working bins (row-major over `attrs`) spread over schema codes in
    /// proportion to the within-bin probabilities; also used for its standard errors.
    fn expand(&self, attrs: &[usize], working: &[f64]) -> Vec<f64> {
        let code_dims: Vec<usize> = attrs.iter().map(|&a| self.space.code_dims()[a]).collect();
        let cuts: Vec<Vec<u32>> = attrs.iter().map(|&a| self.space.cuts(a).to_vec()).collect();
        let (bin_of_cell, _) = coarsen_map(&code_dims, &cuts);
        // Each code's share of its bin: the product of its attributes' within-bin shares.
        let shares = attrs
            .iter()
            .zip(&code_dims)
            .fold(vec![1.0], |acc, (&a, &k)| {
                outer(&acc, self.within[a].as_deref().unwrap_or(&vec![1.0; k]))
            });
        bin_of_cell
            .iter()
            .zip(&shares)
            .map(|(&bin, &share)| working[bin] * share)
            .collect()
    }
}

/// The shape of a distribution within one working bin from unbiased cell estimates `x`
/// with standard errors `se`, given a prior shape `prior` (the cells' shares of the bin,
/// summing to 1): the cells' deviations from the prior's expectation `e_c = prior_c·Σx`
/// shrunk by the positive-part James–Stein factor `λ = max(0, 1 − E/O)`, with
/// `O = Σ(x_c − e_c)²` the observed squared deviation and `E = (k−1)/k·Σσ_c²` what noise
/// alone would give, then clipped at 0 and normalized. Pure noise gives the prior; a strong
/// peak (weekly hours at 40) survives. The squared deviation shrinks noise harder than the
/// L1 share used before (`benchmarks/sweeps/point-masses.md`: temporal-match2's largest KS
/// at ε = 1 0.161 → 0.101, Adult within ±0.002). Sums to 1.
fn within_bin_shape(x: &[f64], se: &[f64], prior: &[f64]) -> Vec<f64> {
    let k = x.len() as f64;
    let total_x = x.iter().sum::<f64>().max(0.0);
    let expected: Vec<f64> = prior.iter().map(|p| p * total_x).collect();
    let observed: f64 = x.iter().zip(&expected).map(|(v, e)| (v - e).powi(2)).sum();
    let noise = (k - 1.0) / k * se.iter().map(|s| s * s).sum::<f64>();
    let lambda = if observed > 0.0 {
        (1.0 - noise / observed).max(0.0)
    } else {
        0.0
    };
    let shrunk: Vec<f64> = x
        .iter()
        .zip(&expected)
        .map(|(v, e)| (e + lambda * (v - e)).max(0.0))
        .collect();
    let total: f64 = shrunk.iter().sum();
    if total > 0.0 {
        shrunk.iter().map(|v| v / total).collect()
    } else {
        let p: f64 = prior.iter().sum();
        if p > 0.0 {
            prior.iter().map(|v| v / p).collect()
        } else {
            vec![1.0 / k; x.len()]
        }
    }
}

/// [`within_bin_shape`] for a bin holding point masses: cells `points` (indices into `x`)
/// found by [`crate::space::Space::point_masses`] in the bin's unbiased cell estimates `x`,
/// and `bin_mass` the bin's estimated mass. Each point mass takes its estimated share of the
/// bin, `x_p / bin_mass` (at most 1 for all of them), when it is [`POINT_MASS_Z`] standard
/// errors above what the prior expects of it (`prior_p·Σx`), and the other cells share the rest
/// by [`within_bin_shape`] over them. Why: the shrinkage towards a smooth prior weighs a
/// spike against the noise of the whole bin, and a spike of most of the bin (temporal-match2's
/// DEPARTS, 45% of the people at 0 in a bin of 6 codes at ε = 1) came back at a third of
/// its height, the rest smeared over codes that hold almost nobody. Without points, or
/// without a positive `bin_mass`, it is [`within_bin_shape`]. Sums to 1.
fn within_bin_shape_with_points(
    x: &[f64],
    se: &[f64],
    prior: &[f64],
    points: &[usize],
    bin_mass: f64,
) -> Vec<f64> {
    // Only a spike the smooth prior cannot hold: a heavy cell of a smooth density (a common
    // age among its neighbours) keeps the shrinkage's precision.
    let total_x: f64 = x.iter().sum::<f64>().max(0.0);
    let points: Vec<usize> = points
        .iter()
        .copied()
        .filter(|&p| x[p] - prior[p] * total_x >= POINT_MASS_Z * se[p])
        .collect();
    if points.is_empty() || bin_mass <= 0.0 || !bin_mass.is_finite() {
        return within_bin_shape(x, se, prior);
    }
    let mut shape = vec![0.0; x.len()];
    let mut taken = 0.0;
    for &p in &points {
        shape[p] = (x[p] / bin_mass).clamp(0.0, 1.0);
        taken += shape[p];
    }
    let rest: Vec<usize> = (0..x.len()).filter(|i| !points.contains(i)).collect();
    if taken <= 0.0 {
        return within_bin_shape(x, se, prior);
    }
    if taken >= 1.0 || rest.is_empty() {
        return shape.iter().map(|v| v / taken).collect();
    }
    let pick = |v: &[f64]| rest.iter().map(|&i| v[i]).collect::<Vec<f64>>();
    let prior_rest = pick(prior);
    let prior_sum: f64 = prior_rest.iter().sum();
    let prior_rest: Vec<f64> = if prior_sum > 0.0 {
        prior_rest.iter().map(|v| v / prior_sum).collect()
    } else {
        vec![1.0 / rest.len() as f64; rest.len()]
    };
    let others = within_bin_shape(&pick(x), &pick(se), &prior_rest);
    for (&i, v) in rest.iter().zip(others) {
        shape[i] = (1.0 - taken) * v;
    }
    shape
}

/// Unbiased cell estimates `x` of one working bin (standard errors `se`) made consistent
/// with `total`, an estimate of their sum far more precise than `Σx` (the bin's mass, which
/// pools the working-bin reports with the sub-bin ones): the least-squares correction
/// `x_c + (total − Σx)·σ_c²/Σσ²` (Hay et al., PVLDB 2010, "Boosting the accuracy of
/// differentially private histograms through consistency", §3, with the parent taken as
/// exact). A bin of n sub-cells sums n cells of noise, so its raw `Σx` is off by √n of them
/// and the shrinkage would read that as shape. `x` unchanged when `total` is not positive
/// (or NaN: no estimate of the bin).
fn consistent_with(x: &[f64], se: &[f64], total: f64) -> Vec<f64> {
    let var: f64 = se.iter().map(|s| s * s).sum();
    if total.is_nan() || total <= 0.0 || var.is_nan() || var <= 0.0 {
        return x.to_vec();
    }
    let gap = total - x.iter().sum::<f64>();
    x.iter()
        .zip(se)
        .map(|(v, s)| v + gap * s * s / var)
        .collect()
}

/// The frequency polygon of attribute `a`'s working bins (VertiMRF §6.1's recovery when
/// nothing finer was measured): each code's share of its bin, from the density
/// `max(0, m_b)/width_b` of the bins' masses `bins` interpolated linearly between bin
/// centres over the ordered grid ([`Space::grid_cells`]; flat beyond the outer centres).
/// Bins past the grid (point masses, "missing") hold one code each, share 1. A smooth
/// density is then not drawn as steps at the bin edges.
fn frequency_polygon(space: &Space, a: usize, bins: &[f64]) -> Vec<f64> {
    let k = space.code_dims()[a];
    let grid = space.grid_cells(a) as u32;
    let ordered: Vec<(f64, f64)> = (0..bins.len())
        .map(|b| (b, space.code_range(a, b)))
        .filter(|(_, r)| r.end <= grid)
        .map(|(b, r)| {
            let width = f64::from(r.end - r.start);
            (f64::from(r.start + r.end) / 2.0, bins[b].max(0.0) / width)
        })
        .collect();
    let density = |x: f64| -> f64 {
        let i = ordered.partition_point(|&(centre, _)| centre <= x);
        match (i.checked_sub(1).map(|j| ordered[j]), ordered.get(i)) {
            (Some((x0, d0)), Some(&(x1, d1))) => d0 + (d1 - d0) * (x - x0) / (x1 - x0),
            (Some((_, d)), None) | (None, Some(&(_, d))) => d,
            (None, None) => 1.0,
        }
    };
    let mut w = vec![0.0; k];
    for b in 0..space.dims()[a] {
        let r = space.code_range(a, b);
        let raw: Vec<f64> = r.clone().map(|c| density(f64::from(c) + 0.5)).collect();
        let total: f64 = raw.iter().sum();
        for (c, v) in r.clone().zip(&raw) {
            w[c as usize] = if total > 0.0 {
                v / total
            } else {
                1.0 / raw.len() as f64
            };
        }
    }
    w
}

/// A finalized model. Cheap to clone (shared tables).
#[derive(Debug, Clone)]
pub struct Model {
    protocol: String,
    dims: Vec<usize>,
    /// Working bins → schema codes (`None`: the working space is the schema's).
    recovery: Option<Arc<Recovery>>,
    edges: Vec<EdgeState>,
    gains: Vec<EdgeGain>,
    rounds: Vec<RoundSummary>,
    drift: Option<DriftReport>,
    residuals: Option<FitResiduals>,
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
            recovery: None,
            edges,
            gains: Vec::new(),
            rounds: Vec::new(),
            drift: None,
            residuals: None,
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
            recovery: None,
            edges: Vec::new(),
            gains: Vec::new(),
            rounds: Vec::new(),
            drift: None,
            residuals: None,
            kind: ModelKind::SamPrivSyn(Arc::new(model)),
            source: Arc::new(source),
        }
    }

    /// The model with the model graph's candidate pairs and their gains (for
    /// [`Model::describe`]).
    pub fn with_gains(mut self, gains: Vec<EdgeGain>) -> Self {
        self.gains = gains;
        self
    }

    /// The model with its per-round summary (for [`Model::describe`]).
    pub fn with_rounds(mut self, rounds: Vec<RoundSummary>) -> Self {
        self.rounds = rounds;
        self
    }

    /// The model with the heterogeneity of its rounds (for [`Model::describe`]; `None` for
    /// one round).
    pub fn with_drift(mut self, drift: Option<DriftReport>) -> Self {
        self.drift = drift;
        self
    }

    /// The model with its fit's residuals (for [`Model::describe`]).
    pub fn with_residuals(mut self, residuals: Option<FitResiduals>) -> Self {
        self.residuals = residuals;
        self
    }

    /// The fit checked against its measurements ([`crate::estimate::fit_residuals`]).
    pub fn residuals(&self) -> Option<&FitResiduals> {
        self.residuals.as_ref()
    }

    /// The heterogeneity of the rounds the model was fitted to ([`crate::drift`]).
    pub fn drift(&self) -> Option<&DriftReport> {
        self.drift.as_ref()
    }

    /// The model with the way back from its working bins to schema codes (see
    /// [`Recovery`]; `None` keeps the model's codes).
    pub fn with_recovery(mut self, recovery: Option<Recovery>) -> Self {
        self.recovery = recovery.map(Arc::new);
        self
    }

    /// Working domain sizes (the model's; [`crate::space`]).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Schema domain sizes: of the codes [`Model::synthesize`] and [`Model::marginal`] give.
    pub fn schema_dims(&self) -> &[usize] {
        self.recovery
            .as_ref()
            .map_or(&self.dims, |r| r.space.code_dims())
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
            model_graph: self.gains.clone(),
            rounds: self.rounds.clone(),
            working_bins: (0..self.dims.len())
                .map(|a| {
                    self.recovery
                        .as_ref()
                        .map_or_else(Vec::new, |r| r.space.cuts(a).to_vec())
                })
                .collect(),
            drift: self.drift.clone(),
            residuals: self.residuals.clone(),
            composed_epsilon: None,
        }
    }

    /// The marginal of `attrs` (distinct attribute indices, cells row-major in this order)
    /// under the model (exact variable elimination over the conditionals), with standard
    /// errors where some table contains all of `attrs` ([`JointSource::std_errors`]).
    /// Errors: empty, repeated or unknown attributes; more than 2^22 cells; an elimination
    /// that would build a table of more than [`MAX_ELIMINATION_CELLS`] cells on the way.
    pub fn marginal(&self, attrs: &[usize]) -> Result<MarginalEstimate, EngineError> {
        let d = self.dims.len();
        if attrs.is_empty()
            || attrs.iter().any(|&a| a >= d)
            || (1..attrs.len()).any(|i| attrs[..i].contains(&attrs[i]))
        {
            return Err(EngineError::BadAttributes(format!("{attrs:?}")));
        }
        let dims: Vec<usize> = attrs.iter().map(|&a| self.schema_dims()[a]).collect();
        let cells = dims.iter().try_fold(1usize, |acc, &k| acc.checked_mul(k));
        if cells.is_none_or(|c| c > 1 << 22) {
            return Err(EngineError::BadAttributes("marginal too large".into()));
        }
        let frequencies = match &self.kind {
            ModelKind::Graphical { factors, .. } => {
                infer(&self.dims, factors, attrs, MAX_ELIMINATION_CELLS)?
            }
            ModelKind::SamPrivSyn(_) => self.source.joint(attrs),
        };
        let std_errors = self.source.std_errors(attrs, &frequencies);
        let (frequencies, std_errors) = match &self.recovery {
            // Within a working bin, shares follow the code distribution: the bin's standard
            // error is split the same way (the recovery's own error is not in it).
            Some(r) => (
                r.expand(attrs, &frequencies),
                std_errors.map(|s| r.expand(attrs, &s)),
            ),
            None => (frequencies, std_errors),
        };
        Ok(MarginalEstimate {
            std_errors,
            attrs: attrs.to_vec(),
            dims,
            frequencies,
        })
    }

    /// Streams `rows` synthetic records (schema codes, one per attribute) from `seed`, each
    /// working bin recovered as [`Expansion::Recover`]. Graphical models use constant memory;
    /// SamPrivSyn builds its table in chunks of [`SAMPRIVSYN_CHUNK_ROWS`] rows (the eq. 12
    /// updating needs a table), so its memory is bounded too. The same model and seed give
    /// the same rows.
    pub fn synthesize(&self, rows: u64, seed: u64) -> Synthesizer {
        self.synthesize_with(rows, seed, Expansion::Recover)
    }

    /// As [`Model::synthesize`], with working bins turned into codes per `how`.
    pub fn synthesize_with(&self, rows: u64, seed: u64, how: Expansion) -> Synthesizer {
        let expand = self.recovery.as_ref().map(|r| {
            // Its own stream, so rows over identity spaces are exactly as before.
            let rng = ChaCha12Rng::seed_from_u64(seed ^ 0x05EE_D0FC_0DE5);
            (Arc::clone(r), how, Box::new(rng))
        });
        let mut s = self.synthesize_working(rows, seed);
        s.expand = expand;
        s
    }

    fn synthesize_working(&self, rows: u64, seed: u64) -> Synthesizer {
        match &self.kind {
            ModelKind::Graphical { factors, .. } => Synthesizer {
                inner: SynthInner::Forward {
                    factors: compile(factors),
                    rng: Box::new(ChaCha12Rng::seed_from_u64(seed)),
                },
                d: self.dims.len(),
                remaining: rows,
                expand: None,
            },
            ModelKind::SamPrivSyn(m) => Synthesizer {
                inner: SynthInner::Table {
                    model: Arc::clone(m),
                    seed,
                    chunk: 0,
                    left: rows,
                    table: Vec::new(),
                    next: 0,
                },
                d: self.dims.len(),
                remaining: rows,
                expand: None,
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
    /// SamPrivSyn's eq. 12 updating needs a whole table: built chunk by chunk
    /// ([`SAMPRIVSYN_CHUNK_ROWS`] rows each, its own seed), so memory stays bounded.
    Table {
        model: Arc<SamPrivSynModel>,
        seed: u64,
        chunk: u64,
        /// Rows not yet built into a chunk.
        left: u64,
        table: Vec<u32>,
        next: usize,
    },
}

/// Rows of one SamPrivSyn synthesis chunk (Algorithm 2 of SamPrivSyn on each): each chunk
/// matches the estimated 1- and 2-way distributions on its own, so their concatenation does
/// too; a download of any size holds one chunk (≈ 4·d bytes per row) at a time.
pub const SAMPRIVSYN_CHUNK_ROWS: u64 = 1 << 20;

/// Iterator of synthetic rows (codes, one per attribute); see [`Model::synthesize`].
#[derive(Debug)]
pub struct Synthesizer {
    inner: SynthInner,
    d: usize,
    remaining: u64,
    expand: Option<(Arc<Recovery>, Expansion, Box<ChaCha12Rng>)>,
}

impl Iterator for Synthesizer {
    type Item = Vec<u32>;

    fn next(&mut self) -> Option<Vec<u32>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let d = self.d;
        let mut row = self.next_working(d);
        if let Some((r, how, rng)) = &mut self.expand {
            for (a, c) in row.iter_mut().enumerate() {
                if r.within[a].is_some() {
                    *c = r.code(a, *c, *how, rng.random::<f64>());
                }
            }
        }
        Some(row)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let r = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (r, Some(r))
    }
}

impl Synthesizer {
    fn next_working(&mut self, d: usize) -> Vec<u32> {
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
                row
            }
            SynthInner::Table {
                model,
                seed,
                chunk,
                left,
                table,
                next,
            } => {
                if *next * d >= table.len() {
                    let rows = (*left).min(SAMPRIVSYN_CHUNK_ROWS);
                    // Chunk 0 keeps the seed itself: downloads within one chunk are as before.
                    let chunk_seed = seed.wrapping_add(chunk.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    *table = model.synthesize_table(rows as usize, chunk_seed);
                    *left -= rows;
                    *chunk += 1;
                    *next = 0;
                }
                let row = table[*next * d..(*next + 1) * d].to_vec();
                *next += 1;
                row
            }
        }
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

/// Most cells of a table built while eliminating variables for a marginal query (2^24 f64,
/// 128 MiB). The answer's own size is bounded separately; this bounds the way to it, whose
/// tables can be far larger than the answer when the query's attributes are linked through
/// wide parts of the model.
pub const MAX_ELIMINATION_CELLS: usize = 1 << 24;

/// Exact marginal of `query` by variable elimination over the ancestors of `query`.
/// Errors: a table of more than `max_cells` cells would be built (nothing that large is
/// allocated).
fn infer(
    dims: &[usize],
    factors: &[EstimatedConditional],
    query: &[usize],
    max_cells: usize,
) -> Result<Vec<f64>, EngineError> {
    // The variables a product of factors spans.
    let union = |fs: &mut dyn Iterator<Item = &Factor>| {
        let mut vars: Vec<usize> = fs.flat_map(|f| f.vars.iter().copied()).collect();
        vars.sort_unstable();
        vars.dedup();
        vars
    };
    let too_large = |vars: Vec<usize>| {
        let cells = vars
            .iter()
            .try_fold(1usize, |acc, &x| acc.checked_mul(dims[x]));
        match cells {
            Some(c) if c <= max_cells => Ok(()),
            _ => Err(EngineError::BadAttributes(format!(
                "answering this marginal under the model needs an intermediate table of {} \
                 cells, above the bound of {max_cells}; ask for fewer attributes at a time, or \
                 for attributes the model links more directly",
                cells.map_or_else(|| "more than 2^64".to_owned(), |c| c.to_string())
            ))),
        }
    };
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
                let vars = union(&mut used.iter().filter(|f| f.vars.contains(&v)));
                (i, vars.iter().map(|&x| dims[x] as f64).product::<f64>())
            })
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
            .expect("non-empty");
        let v = eliminate.remove(pos);
        let (with, without): (Vec<Factor>, Vec<Factor>) =
            used.into_iter().partition(|f| f.vars.contains(&v));
        used = without;
        // The product of `with` spans the union of their variables: checked before building.
        too_large(union(&mut with.iter()))?;
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
    too_large(union(&mut used.iter()))?;
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
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{
        EstimatedConditional, consistent_with, frequency_polygon, infer, within_bin_shape,
        within_bin_shape_with_points,
    };
    use crate::plan::Conditional;

    /// A → H → B with H of 50 values: the marginal of (A, B) has 4 cells, but eliminating H
    /// builds a table over (A, H, B) of 200. Under a bound of 100 the query is refused
    /// before that table exists; under 200 it is answered, and correctly.
    #[test]
    fn elimination_refuses_an_intermediate_table_above_the_bound() {
        let dims = [2, 50, 2];
        let factor = |targets: Vec<usize>, parents: Vec<usize>, table: Vec<f64>| {
            let conditional = Conditional { targets, parents };
            let scope_dims = conditional.scope().iter().map(|&a| dims[a]).collect();
            EstimatedConditional {
                conditional,
                scope_dims,
                joint: Vec::new(),
                conditional_table: table,
            }
        };
        // Pr(A) = (0.3, 0.7); H is uniform over the codes of A's parity; B is H's parity, so
        // B copies A.
        let pa = factor(vec![0], vec![], vec![0.3, 0.7]);
        let ph = factor(
            vec![1],
            vec![0],
            (0..100)
                .map(|i| {
                    if (i % 50) % 2 == i / 50 {
                        1.0 / 25.0
                    } else {
                        0.0
                    }
                })
                .collect(),
        );
        let pb = factor(
            vec![2],
            vec![1],
            (0..100)
                .map(|i| if (i / 2) % 2 == i % 2 { 1.0 } else { 0.0 })
                .collect(),
        );
        let factors = [pa, ph, pb];
        let e = infer(&dims, &factors, &[0, 2], 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("200 cells") && e.contains("bound of 100"), "{e}");
        let m = infer(&dims, &factors, &[0, 2], 200).unwrap();
        let want = [0.3, 0.0, 0.0, 0.7];
        assert!(
            m.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{m:?}"
        );
    }
    use crate::space::Space;

    /// The polygon spreads a bin's codes along the line between its neighbours' densities,
    /// is flat at the outer bins, and leaves a bin past the grid (a point mass) whole.
    #[test]
    fn frequency_polygon_interpolates_between_bin_centres() {
        // 12 codes: grid bins [0,4) [4,8) [8,11), then code 11 (a point mass) alone.
        let mut space = Space::new(vec![12], vec![vec![4, 8, 11]]).unwrap();
        space.set_grid_cells(0, 11);
        let w = frequency_polygon(&space, 0, &[0.1, 0.3, 0.3, 0.3]);
        for bin in [0..4, 4..8, 8..11] {
            let s: f64 = w[bin].iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
        assert_eq!(w[11], 1.0);
        // Rising from bin 0 to bin 1: inside bin 1 the left codes (towards bin 0's lower
        // density) weigh less than the right ones; bin 0 is flat left of its centre.
        assert!(w[4] < w[5] && w[5] < w[6]);
        assert!((w[0] - w[1]).abs() < 1e-12 && w[2] < w[3]);
        // Equal densities: uniform.
        let w = frequency_polygon(&space, 0, &[0.4, 0.4, 0.3, 0.2]);
        assert!(w[..4].iter().all(|&x| (x - 0.25).abs() < 1e-12), "{w:?}");
    }

    #[test]
    fn within_bin_shape_keeps_signal_and_drops_noise() {
        let uniform = [0.25; 4];
        // Deviations well inside the noise: the prior.
        let s = within_bin_shape(&[0.010, 0.013, 0.008, 0.009], &[0.01; 4], &uniform);
        assert!(s.iter().all(|&x| (x - 0.25).abs() < 1e-12), "{s:?}");
        let sloped = [0.1, 0.2, 0.3, 0.4];
        let s = within_bin_shape(&[0.010, 0.013, 0.008, 0.009], &[0.01; 4], &sloped);
        assert!(
            s.iter().zip(sloped).all(|(x, p)| (x - p).abs() < 1e-12),
            "{s:?}"
        );
        // A peak far above the noise keeps most of its height whatever the prior.
        for prior in [uniform, sloped] {
            let s = within_bin_shape(&[0.30, 0.01, 0.02, 0.0], &[0.005; 4], &prior);
            assert!(
                s[0] > 0.85 && (s.iter().sum::<f64>() - 1.0).abs() < 1e-12,
                "{s:?}"
            );
        }
        // A bin with no estimated mass: the prior.
        let s = within_bin_shape(&[-0.01, -0.02], &[0.01; 2], &[0.5, 0.5]);
        assert_eq!(s, vec![0.5, 0.5]);
    }

    /// The cells move to the bin's mass in proportion to their variances, and sum to it.
    #[test]
    fn consistent_cells_sum_to_the_bins_mass() {
        let x = consistent_with(&[0.878, 0.285], &[0.08, 0.08], 0.994);
        assert!(
            (x[0] - 0.7935).abs() < 1e-12 && (x[1] - 0.2005).abs() < 1e-12,
            "{x:?}"
        );
        let x = consistent_with(&[0.3, 0.1, 0.2], &[0.1, 0.2, 0.0], 0.5);
        // Gap −0.1 split 1:4:0 by variance.
        let want = [0.28, 0.02, 0.2];
        assert!(
            x.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{x:?}"
        );
        assert_eq!(
            consistent_with(&[0.3, 0.1], &[0.1, 0.1], 0.0),
            vec![0.3, 0.1]
        );
        assert_eq!(
            consistent_with(&[0.3, 0.1], &[0.0, 0.0], 0.5),
            vec![0.3, 0.1]
        );
    }

    /// A point mass holding most of a bin keeps its estimated share; the shrinkage alone
    /// gives it a fraction (temporal-match2's DEPARTS at ε = 1: 45% of the people at code 0,
    /// its bin of 6 codes measured at a standard error of 0.06 per code). A heavy cell the
    /// smooth prior expects, and a bin without points, are left to the shrinkage.
    #[test]
    fn point_masses_keep_their_share_of_a_bin() {
        let x = [0.445, 0.091, -0.031, 0.016, 0.091, 0.025];
        let se = [0.068, 0.063, 0.063, 0.063, 0.063, 0.063];
        let prior = [0.174, 0.174, 0.174, 0.169, 0.159, 0.150];
        let shrunk = within_bin_shape(&x, &se, &prior);
        assert!(shrunk[0] < 0.7, "{shrunk:?}");
        let s = within_bin_shape_with_points(&x, &se, &prior, &[0], 0.474);
        assert!((s[0] - 0.445 / 0.474).abs() < 1e-12, "{s:?}");
        assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{s:?}");
        assert!(s.iter().all(|&v| v >= 0.0), "{s:?}");
        // The other cells share the rest as the shrinkage shapes them.
        let rest = within_bin_shape(&x[1..], &se[1..], &{
            let p: f64 = prior[1..].iter().sum();
            prior[1..].iter().map(|v| v / p).collect::<Vec<_>>()
        });
        for (a, b) in s[1..].iter().zip(&rest) {
            assert!((a - (1.0 - s[0]) * b).abs() < 1e-12, "{s:?}");
        }
        // A point mass estimated above the bin's mass takes the whole bin.
        let s = within_bin_shape_with_points(&x, &se, &prior, &[0], 0.40);
        assert_eq!(s[0], 1.0);
        // No points, no bin mass, or a heavy cell within the prior's reach: the shrinkage.
        assert_eq!(
            within_bin_shape_with_points(&x, &se, &prior, &[], 0.474),
            shrunk
        );
        assert_eq!(
            within_bin_shape_with_points(&x, &se, &prior, &[0], 0.0),
            shrunk
        );
        let smooth = [0.20, 0.21, 0.19];
        let flat = [1.0 / 3.0; 3];
        assert_eq!(
            within_bin_shape_with_points(&smooth, &[0.005; 3], &flat, &[1], 0.6),
            within_bin_shape(&smooth, &[0.005; 3], &flat)
        );
    }
}
