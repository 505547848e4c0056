//! Central differential privacy: one data curator's synthesizer (select–measure–generate).
//!
//! The curator holds the whole table and releases only a synthetic table (and the privacy
//! report). The model is the same graphical model the LDP collections fit ([`crate::fit::pgm`]);
//! only the measurements differ: exact marginal counts plus discrete Gaussian noise instead
//! of randomized-response tables. Measurements are measurements: the fit sees values and
//! per-cell variances either way.
//!
//! **Algorithm** (PPSyn, "Partition-based differentially private synthetic data generation",
//! Algorithm 1, on AIM's loop: McKenna, Mullins, Sheldon, Miklau, "AIM: An Adaptive and
//! Iterative Mechanism for Differentially Private Synthetic Data", PVLDB 2022, Algorithm 2):
//! 1. Every 1-way, with [`ONE_WAY_SHARE`] of ρ split as `ρ_i ∝ c_i^{2/3}` (c_i = cells;
//!    PPSyn Alg. 1 line 1, which minimizes the summed expected L1 error).
//! 2. Rounds: the exponential mechanism picks the candidate marginal `w` (every pair, and
//!    every triple when [`CentralOptions::max_marginal_attrs`] is 3) of the largest
//!    `‖c_w(D) − n̂ p̂_w‖₁ − √(2/π) σ_t |w|` (AIM's score: the model's error on `w` minus the
//!    noise a measurement at σ_t would add; sensitivity 1), among candidates that keep every
//!    clique of the model within the cap; the Gaussian mechanism measures it (over a cell
//!    partition when [`CentralOptions::cell_merge`] > 0, below); the model is refitted from
//!    its last potentials.
//! 3. When a measurement moved the model's `w` by less than its expected noise, σ halves and
//!    the selection ε doubles (AIM's annealing: the model learns little at this noise). The
//!    last round spends what is left.
//!
//! PPSyn (Alg. 2) scores a candidate by its contribution per unit of a budget `ρ_w` computed
//! from the true marginal, and measures it with that `ρ_w`; a noise scale that depends on the
//! data is not covered by the exponential mechanism's guarantee, so here every round has a
//! fixed scale and the cost of noise enters the score instead (AIM's form).
//!
//! **Cell partitions** (PPSyn §4.2.2, Algorithms 3–4): a candidate's cells that can hold
//! fewer than `τ = c·σ_t` people by the model's 1-ways ([`CentralOptions::cell_merge`]) are
//! measured in groups of about `τ` such people ([`crate::measure::partition`]); the
//! partition depends on the model only, so it is post-processing. The score and the annealing
//! test count the groups, `‖Σ_G c_w(D) − n̂ Σ_G p̂_w‖₁ − √(2/π) σ_t |P_w|` (still of
//! sensitivity 1: one record moves one group's count by one), so a large marginal whose mass
//! sits in few cells costs what those cells cost. Off by default ([`CELL_MERGE_SIGMAS`]).
//!
//! **Privacy** is accounted in zero-concentrated DP (Bun & Steinke, TCC 2016): neighbours
//! differ by adding or removing one record, so a marginal's counts have L2 sensitivity 1; the
//! discrete Gaussian with variance σ² is `1/(2σ²)`-zCDP (Canonne, Kamath, Steinke, "The
//! Discrete Gaussian for Differential Privacy", NeurIPS 2020, Theorem 4); the exponential
//! mechanism at ε is `ε²/8`-zCDP (Cesar & Rogers, "Bounding, Concentrating, and Truncating",
//! ALT 2021; PPSyn Prop. 3); compositions add (PPSyn Theorem 1); ρ-zCDP is converted to
//! (ε, δ)-DP by Canonne–Kamath–Steinke's Corollary 13 ([`delta_for`], [`rho_for`]). The noise
//! comes from the caller's CSPRNG; seeds belong in tests and simulations only.

use std::collections::{BTreeMap, BTreeSet};

use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};

use crate::EngineError;
use crate::domain::sizes::Domain;
use crate::fit::joint::{JointSource, clique_joint};
use crate::fit::pgm::{FitOptions, GraphicalModel, Observation, fit};
use crate::graph::{Edge, EdgeState, JunctionTree, build_junction_tree, edge, triangulate};
use crate::measure::local_model::{LocalModel, LocalPrivacy};
use crate::measure::partition::{cell_partition, group_sums};
use crate::numeric::index::projection_map;
use crate::protocols::vertical::ResolvedParty;
use crate::select::model_graph::{MAX_CLIQUE_CELLS, largest_clique_cells};
use crate::select::structure::build_structure;
use crate::synth::model::Model;

/// Share of ρ spent on the 1-ways before the rounds (PPSyn Alg. 1 line 1).
pub(crate) const ONE_WAY_SHARE: f64 = 0.1;

/// Share of ρ spent on selecting marginals, over all rounds (PPSyn Alg. 1 line 4).
pub(crate) const SELECTION_SHARE: f64 = 0.1;

/// Planned rounds per attribute (AIM's `T = 16 d`): the scale of the first rounds; annealing
/// spends the budget faster when measurements stop teaching the model.
pub(crate) const ROUNDS_PER_ATTRIBUTE: usize = 16;

/// Most mirror-descent steps of the fit after each round (from the previous potentials); the
/// final fit runs [`FitOptions::default`].
pub(crate) const ROUND_FIT_ITERS: usize = 100;

/// Cell-merging threshold in noise standard deviations: a cell that can hold fewer than
/// `CELL_MERGE_SIGMAS · σ` people (by its rarest value) is measured in a group of such cells
/// ([`crate::measure::partition`]). 0, off: on the coded Adult and BR2000 (at most 16 values
/// per attribute) merging at 1 or 2 σ moved the 2- and 3-way TVD by less than their standard
/// deviations over seeds, and slowed each run (`benchmarks/sweeps/central-cell-merge.md`).
pub const CELL_MERGE_SIGMAS: f64 = 0.0;

/// Default of [`CentralOptions::max_memory_bytes`]: 2 GiB.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 2 << 30;

/// `f64` tables of a clique's size the loop holds at most at once, per clique: the fit's
/// potentials, marginals and gradient and its line search's trial copies (6), the previous
/// potentials carried over, the model that answers marginals outside the cliques and the
/// fitted model's copies (5), and a candidate's model marginal while it is scored (1).
const TABLES_PER_CLIQUE_CELL: u64 = 12;

/// Errors of the central synthesizer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CentralError {
    /// ε must be finite and > 0 and δ in (0, 1).
    #[error(
        "the privacy budget must have 0 < epsilon (got {epsilon}) and 0 < delta < 1 (got {delta})"
    )]
    Budget {
        /// Requested ε.
        epsilon: f64,
        /// Requested δ.
        delta: f64,
    },
    /// Codes do not fit the domain.
    #[error("{0}")]
    Data(String),
    /// Even the smallest design (cliques no larger than the largest attribute) needs more
    /// memory than [`CentralOptions::max_memory_bytes`] allows ([`plan_design`]).
    #[error(
        "the synthesizer needs about {needed_mib} MiB even with its smallest design (cliques \
         of at most {clique_cells} cells, the largest attribute alone: {candidates} pairs and \
         triples to measure, {rows} rows of {attributes} attributes), above the memory budget \
         of {budget_mib} MiB; raise the budget (`synthesize --max-memory`) or give the \
         schema's largest attributes fewer bins or labels"
    )]
    Memory {
        /// Estimated need of the smallest design, MiB (rounded up).
        needed_mib: u64,
        /// The budget, MiB (rounded down).
        budget_mib: u64,
        /// Clique cap of the smallest design, cells.
        clique_cells: u64,
        /// Candidate marginals of the smallest design.
        candidates: usize,
        /// Records of the table.
        rows: usize,
        /// Attributes of the table.
        attributes: usize,
    },
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub use crate::numeric::zcdp::delta_for;

/// The largest ρ whose ρ-zCDP implies (ε, δ)-DP ([`delta_for`];
/// [`crate::numeric::zcdp::rho_for`]).
/// Errors: [`CentralError::Budget`] unless ε > 0 is finite and 0 < δ < 1.
pub(crate) fn rho_for(epsilon: f64, delta: f64) -> Result<f64, CentralError> {
    crate::numeric::zcdp::rho_for(epsilon, delta).ok_or(CentralError::Budget { epsilon, delta })
}

/// One draw of the discrete Gaussian `N_Z(0, σ²)`, `Pr[x] ∝ exp(−x²/(2σ²))` over the
/// integers, by rejection from a discrete Laplace (Canonne, Kamath, Steinke, NeurIPS 2020,
/// Algorithm 3). The Bernoulli trials use `f64` probabilities (not exact rationals): the
/// output is an integer, so the low bits of a floating-point sample cannot leak the count.
/// `sigma` must be finite and > 0.
pub(crate) fn discrete_gaussian<R: Rng + CryptoRng + ?Sized>(sigma: f64, rng: &mut R) -> i64 {
    debug_assert!(sigma > 0.0 && sigma.is_finite());
    let s2 = sigma * sigma;
    let t = sigma.floor() + 1.0;
    let ti = t as u64;
    loop {
        let u = rng.random_range(0..ti);
        if !rng.random_bool((-(u as f64) / t).exp()) {
            continue;
        }
        // V ~ Geometric(1 − e^{−1}): failures before the first success.
        let mut v = 0u64;
        while rng.random_bool((-1.0f64).exp()) {
            v += 1;
        }
        let negative = rng.random_bool(0.5);
        if negative && u == 0 && v == 0 {
            continue;
        }
        let magnitude = (u + ti * v) as f64;
        let c = (-(magnitude - s2 / t).powi(2) / (2.0 * s2)).exp();
        if rng.random_bool(c.clamp(0.0, 1.0)) {
            let y = magnitude as i64;
            return if negative { -y } else { y };
        }
    }
}

/// The exponential mechanism's output distribution: `Pr[i] ∝ exp(ε s_i / (2Δ))` (McSherry &
/// Talwar, FOCS 2007) for scores `s` of sensitivity `Δ`. Its worst-case probability ratio
/// between neighbouring score vectors is `e^ε`; it is `ε²/8`-zCDP.
pub(crate) fn exponential_mechanism_probabilities(
    scores: &[f64],
    epsilon: f64,
    sensitivity: f64,
) -> Vec<f64> {
    let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores
        .iter()
        .map(|s| (epsilon * (s - top) / (2.0 * sensitivity)).exp())
        .collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(|x| x / total).collect()
}

/// One draw of the exponential mechanism ([`exponential_mechanism_probabilities`]).
pub(crate) fn exponential_mechanism<R: Rng + CryptoRng + ?Sized>(
    scores: &[f64],
    epsilon: f64,
    sensitivity: f64,
    rng: &mut R,
) -> usize {
    let p = exponential_mechanism_probabilities(scores, epsilon, sensitivity);
    let u: f64 = rng.random();
    let mut acc = 0.0;
    for (i, x) in p.iter().enumerate() {
        acc += x;
        if u < acc {
            return i;
        }
    }
    p.len() - 1
}

/// Options of [`synthesize_central`].
#[derive(Debug, Clone, PartialEq)]
pub struct CentralOptions {
    /// ε of the (ε, δ)-DP guarantee, > 0.
    pub epsilon: f64,
    /// δ, in (0, 1); 1/n or below is customary.
    pub delta: f64,
    /// Largest marginal the rounds may measure: 2 (pairs) or 3 (triples too); 1 spends the
    /// whole budget on the 1-ways (the independence model).
    pub max_marginal_attrs: usize,
    /// Cap on any clique's cells (default [`MAX_CLIQUE_CELLS`]); as in AIM, a round may use
    /// the share of it that equals the share of ρ spent so far.
    pub max_clique_cells: u64,
    /// Planned rounds (default [`ROUNDS_PER_ATTRIBUTE`] per attribute).
    pub rounds: Option<usize>,
    /// Cell merging: cells whose rarest value the model's 1-ways give fewer than
    /// `cell_merge · σ` people are measured in groups (module docs; default
    /// [`CELL_MERGE_SIGMAS`]; 0 measures every cell alone).
    pub cell_merge: f64,
    /// Declared targets (attribute indices): a candidate marginal holding one is scored with
    /// the weight of its pairs ([`crate::select::target_pair_weight`]), as AIM weighs its
    /// workload (§4); the exponential mechanism's sensitivity is the largest weight.
    pub targets: Vec<usize>,
    /// Memory budget of the run, bytes (default [`DEFAULT_MAX_MEMORY_BYTES`]): the clique
    /// cap is lowered until the design's estimate fits ([`plan_design`]), before anything is
    /// allocated; [`CentralError::Memory`] when even the smallest design does not.
    pub max_memory_bytes: u64,
}

impl CentralOptions {
    /// Defaults at (ε, δ): pairs and triples, the engine's clique cap, AIM's rounds.
    pub fn new(epsilon: f64, delta: f64) -> Self {
        Self {
            epsilon,
            delta,
            max_marginal_attrs: 3,
            max_clique_cells: MAX_CLIQUE_CELLS,
            rounds: None,
            cell_merge: CELL_MERGE_SIGMAS,
            targets: Vec::new(),
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
        }
    }
}

/// One released measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CentralMeasurement {
    /// Attributes of the marginal (sorted).
    pub attrs: Vec<usize>,
    /// Standard deviation of the discrete Gaussian noise on each count.
    pub sigma: f64,
    /// Noisy counts released: the marginal's cells, or its groups of cells when it was
    /// measured over a partition.
    #[serde(default)]
    pub counts: usize,
    /// ρ of the measurement (`1/(2σ²)`).
    pub rho_measure: f64,
    /// ρ of the exponential mechanism that chose it (0 for the initial 1-ways).
    pub rho_select: f64,
}

/// The privacy accounting of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CentralReport {
    /// Requested ε.
    pub epsilon: f64,
    /// Requested δ.
    pub delta: f64,
    /// ρ of the zCDP budget that implies (ε, δ) ([`rho_for`]).
    pub rho: f64,
    /// ρ spent (sum over [`CentralReport::measurements`]; ≤ `rho`).
    pub rho_spent: f64,
    /// Neighbouring relation of the guarantee.
    pub neighbours: String,
    /// Noisy record count used to turn counts into frequencies.
    pub noisy_records: f64,
    /// Every measurement in release order.
    pub measurements: Vec<CentralMeasurement>,
    /// Cap on any clique's cells the run used: [`CentralOptions::max_clique_cells`], or
    /// lower to fit [`CentralOptions::max_memory_bytes`] ([`plan_design`]).
    #[serde(default)]
    pub max_clique_cells: u64,
    /// The design's memory estimate, bytes ([`Design::bytes`]).
    #[serde(default)]
    pub memory_estimate_bytes: u64,
}

/// A fitted central-DP model and its privacy report.
#[derive(Debug, Clone)]
pub struct CentralFit {
    /// The model (marginals, synthesis) over the codes' domain.
    pub model: Model,
    /// The accounting.
    pub report: CentralReport,
}

/// The fitted graphical model as a [`JointSource`] (no standard errors).
#[derive(Debug, Clone)]
struct CentralJoint(GraphicalModel);

impl JointSource for CentralJoint {
    fn joint(&self, scope: &[usize]) -> Vec<f64> {
        clique_joint(&self.0, scope)
    }
}

/// Counts of the marginal over `attrs` (row-major in `attrs` order) of `codes` (`n × d`).
fn counts(codes: &[u32], d: usize, dims: &[usize], attrs: &[usize]) -> Vec<f64> {
    let cells: usize = attrs.iter().map(|&a| dims[a]).product();
    let mut out = vec![0.0; cells];
    for row in codes.chunks_exact(d) {
        let mut i = 0;
        for &a in attrs {
            i = i * dims[a] + row[a] as usize;
        }
        out[i] += 1.0;
    }
    out
}

/// State of the loop: measurements, the chordal graph they need, the current fit.
struct Fitting {
    dims: Domain,
    observations: Vec<Observation>,
    /// Chordal completion of every measured set (old cliques stay complete, so the last
    /// fit's potentials carry over to the next tree exactly).
    chordal: BTreeSet<Edge>,
    model: Option<GraphicalModel>,
}

impl Fitting {
    /// The chordal graph with a measured set's edges added (re-triangulated).
    fn with_edges(&self, attrs: &[usize]) -> BTreeSet<Edge> {
        let mut e = self.chordal.clone();
        for (i, &a) in attrs.iter().enumerate() {
            for &b in &attrs[i + 1..] {
                e.insert(edge(a, b));
            }
        }
        triangulate(self.dims.len(), &e).0
    }

    fn refit(&mut self, max_iters: usize) -> Result<(), CentralError> {
        let tree = build_junction_tree(self.dims.len(), &self.chordal);
        let start = self
            .model
            .as_ref()
            .map(|m| carry_potentials(&self.dims, m, &tree));
        let options = FitOptions {
            max_iters,
            ..FitOptions::default()
        };
        let m = fit(&self.dims, &tree, &self.observations, start, &options)
            .map_err(|e| EngineError::Estimation(e.to_string()))?;
        self.model = Some(m);
        Ok(())
    }

    /// The model's marginal of `attrs` (frequencies): inside a clique directly, else by
    /// variable elimination over a model built for the purpose.
    fn marginal(
        &self,
        attrs: &[usize],
        outside: &mut Option<Model>,
    ) -> Result<Vec<f64>, CentralError> {
        let m = self.model.as_ref().expect("fitted before scoring");
        if let Some(v) = m.marginal_in_clique(attrs) {
            return Ok(v);
        }
        if outside.is_none() {
            *outside = Some(self.as_model("central")?);
        }
        Ok(outside
            .as_ref()
            .expect("built")
            .marginal(attrs)?
            .frequencies)
    }

    fn as_model(&self, name: &str) -> Result<Model, CentralError> {
        let m = self.model.clone().expect("fitted");
        let structure = build_structure(&self.dims, &self.chordal, &[], u64::MAX);
        let edges = self
            .chordal
            .iter()
            .map(|&(a, b)| EdgeState {
                a,
                b,
                active: true,
                pruned_in: None,
                mi: None,
                tau: 0.0,
                ell: None,
                reports: 0,
                score: None,
                bins: Vec::new(),
            })
            .collect();
        Ok(Model::graphical(
            name,
            self.dims.clone(),
            edges,
            structure,
            CentralJoint(m),
        ))
    }
}

/// The potentials of `m` moved onto `tree`, whose cliques contain every clique of `m`'s tree:
/// each old clique's log-potential added to one new clique holding it (the same distribution).
fn carry_potentials(domain: &Domain, m: &GraphicalModel, tree: &JunctionTree) -> Vec<Vec<f64>> {
    let mut start: Vec<Vec<f64>> = tree
        .cliques
        .iter()
        .map(|c| vec![0.0; domain.table_len(c)])
        .collect();
    for (old, theta) in m.tree().cliques.iter().zip(m.potentials()) {
        let Some(c) = (0..tree.cliques.len())
            .filter(|&c| old.iter().all(|a| tree.cliques[c].contains(a)))
            .min_by_key(|&c| tree.cliques[c].len())
        else {
            continue;
        };
        let clique = &tree.cliques[c];
        let cdims = domain.project(clique);
        let map = projection_map(clique, &cdims, old);
        for (t, &i) in start[c].iter_mut().zip(&map) {
            *t += theta[i];
        }
    }
    start
}

/// Upper bounds on the counts of `attrs`'s cells (row-major): a cell holds at most as many
/// people as its rarest value, `n̂ · min_a p̂_a(x_a)` under the model's 1-ways (every 1-way
/// is measured first). The bound, not the model's estimate of the cell, decides what
/// [`cell_partition`] merges: the estimate of a cell the model has not yet learned is
/// independence's, which can miss a dependent cell's mass entirely (1.08× the 2-way TVD on
/// Adult at ε = 0.2, `benchmarks/sweeps/central-cell-merge.md`).
fn cell_bounds(
    state: &Fitting,
    attrs: &[usize],
    n_hat: f64,
    outside: &mut Option<Model>,
) -> Result<Vec<f64>, CentralError> {
    let ones: Vec<Vec<f64>> = attrs
        .iter()
        .map(|&a| state.marginal(&[a], outside))
        .collect::<Result<_, _>>()?;
    let sizes: Vec<usize> = ones.iter().map(Vec::len).collect();
    let cells: usize = sizes.iter().product();
    Ok((0..cells)
        .map(|mut i| {
            let mut m = f64::INFINITY;
            for (one, &k) in ones.iter().zip(&sizes).rev() {
                m = m.min(one[i % k]);
                i /= k;
            }
            n_hat * m
        })
        .collect())
}

/// What a run measures and fits within its memory budget ([`plan_design`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Design {
    /// Cap on any clique's cells: [`CentralOptions::max_clique_cells`] or lower, never below
    /// the largest attribute.
    pub max_clique_cells: u64,
    /// The marginals the rounds may measure (sorted attribute lists): every pair (and
    /// triple, under [`CentralOptions::max_marginal_attrs`] 3) of at most
    /// `max_clique_cells` cells; a larger one could never join the model.
    pub candidates: Vec<Vec<usize>>,
    /// Estimated peak of the run's tables, bytes: the codes (4 per value), each candidate's
    /// exact counts (8 per cell), its measurements (16 per cell of each distinct marginal:
    /// values and variances) and the model ([`TABLES_PER_CLIQUE_CELL`] tables of 8 bytes per
    /// cell of at most one clique per attribute, each within the cap).
    pub bytes: u64,
}

/// The design of a run over `rows` records of attributes of sizes `dims`: the largest clique
/// cap up to [`CentralOptions::max_clique_cells`] whose estimate ([`Design::bytes`]) fits
/// [`CentralOptions::max_memory_bytes`], computed from the sizes alone, before any table is
/// allocated. Errors: [`CentralError::Memory`] when even the smallest cap (the largest
/// attribute's size) does not fit; [`CentralError::Data`] without attributes.
pub fn plan_design(
    dims: &[usize],
    rows: usize,
    options: &CentralOptions,
) -> Result<Design, CentralError> {
    plan(dims, rows, options, false)
}

/// [`plan_design`]; with `keep_released` (a local model, [`measure_central`]) the estimate
/// also holds every round's release (8 bytes per cell of its largest candidate).
fn plan(
    dims: &[usize],
    rows: usize,
    options: &CentralOptions,
    keep_released: bool,
) -> Result<Design, CentralError> {
    let d = dims.len() as u64;
    let rounds = if keep_released {
        options
            .rounds
            .unwrap_or(ROUNDS_PER_ATTRIBUTE * dims.len())
            .max(1) as u64
    } else {
        0
    };
    let floor = dims.iter().copied().max().ok_or_else(|| {
        CentralError::Data("the table needs ≥ 1 attribute with ≥ 1 value each".into())
    })? as u64;
    let top = options.max_clique_cells.max(floor);
    let domain = Domain::from(dims);
    // Every candidate within the top cap with its cells, smallest first; none allocated yet.
    let mut sized: Vec<(u64, Vec<usize>)> = Vec::new();
    if options.max_marginal_attrs >= 2 {
        let n = dims.len();
        for a in 0..n {
            for b in a + 1..n {
                let cells = domain.cells(&[a, b]);
                if cells <= top {
                    sized.push((cells, vec![a, b]));
                }
                if options.max_marginal_attrs >= 3 && cells <= top {
                    for c in b + 1..n {
                        let cells = domain.cells(&[a, b, c]);
                        if cells <= top {
                            sized.push((cells, vec![a, b, c]));
                        }
                    }
                }
            }
        }
    }
    sized.sort_by_key(|(c, _)| *c);
    let fixed = 4u64
        .saturating_mul(rows as u64)
        .saturating_mul(d)
        .saturating_add(16u64.saturating_mul(dims.iter().map(|&k| k as u64).sum()));
    // Bytes at cap `cap` with the first `k` candidates (those within it).
    let bytes = |cap: u64, k: usize| -> u64 {
        let cells: u64 = sized[..k].iter().map(|(c, _)| *c).sum();
        let largest = k.checked_sub(1).map_or(0, |i| sized[i].0);
        fixed
            .saturating_add(24u64.saturating_mul(cells))
            .saturating_add((8 * rounds).saturating_mul(largest))
            .saturating_add(
                (8 * TABLES_PER_CLIQUE_CELL)
                    .saturating_mul(d)
                    .saturating_mul(cap),
            )
    };
    let within = |cap: u64| sized.partition_point(|(c, _)| *c <= cap);
    // Caps to try, largest first: the top cap, then each candidate size below it, then the
    // floor. The estimate grows with the cap, so the first that fits is the largest.
    let mut caps: Vec<u64> = std::iter::once(top)
        .chain(sized.iter().rev().map(|(c, _)| *c))
        .chain(std::iter::once(floor))
        .filter(|&c| c >= floor && c <= top)
        .collect();
    caps.dedup();
    for cap in caps {
        let k = within(cap);
        let b = bytes(cap, k);
        if b <= options.max_memory_bytes {
            sized.truncate(k);
            return Ok(Design {
                max_clique_cells: cap,
                candidates: sized.into_iter().map(|(_, w)| w).collect(),
                bytes: b,
            });
        }
    }
    let k = within(floor);
    Err(CentralError::Memory {
        needed_mib: bytes(floor, k).div_ceil(1 << 20),
        budget_mib: options.max_memory_bytes >> 20,
        clique_cells: floor,
        candidates: k,
        rows,
        attributes: dims.len(),
    })
}

/// Fits a central-DP graphical model to `codes` (`n × d` row-major, codes below `dims`) under
/// (ε, δ)-DP (module docs), noise from `rng` (a CSPRNG; seeded only in tests and
/// simulations). Errors: [`CentralError::Budget`], [`CentralError::Data`] for codes out of
/// the domain or no attributes, [`CentralError::Engine`] if the fit fails.
pub fn synthesize_central<R: Rng + CryptoRng + ?Sized>(
    dims: &[usize],
    codes: &[u32],
    options: &CentralOptions,
    rng: &mut R,
) -> Result<CentralFit, CentralError> {
    let (mut state, report, _) = select_and_measure(dims, codes, options, false, rng)?;
    state.refit(FitOptions::default().max_iters)?;
    Ok(CentralFit {
        model: state.as_model("central")?,
        report,
    })
}

/// One released measurement with its values: the noisy counts of the marginal over `attrs`
/// (row-major in `attrs` order, or one per group of `groups`) and the standard deviation
/// `sigma` of the discrete Gaussian noise on each count.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleasedMarginal {
    /// Attributes (sorted, indices into the table's columns).
    pub attrs: Vec<usize>,
    /// Noisy counts.
    pub counts: Vec<f64>,
    /// Noise standard deviation per count.
    pub sigma: f64,
    /// The group of each cell (empty: one count per cell; [`crate::measure::partition`]).
    pub groups: Vec<u32>,
}

/// The measurements [`synthesize_central`] fits, without the fit: every released marginal
/// (noisy counts and σ, in release order), the chordal graph they need (every measured set
/// complete, triangulated: the model's attribute graph) and the privacy accounting. The
/// party side of a vertical collection (LocMRF, [`crate::measure::local_model`]) uploads
/// these. Errors: as [`synthesize_central`].
pub(crate) fn measure_central<R: Rng + CryptoRng + ?Sized>(
    dims: &[usize],
    codes: &[u32],
    options: &CentralOptions,
    rng: &mut R,
) -> Result<(Vec<ReleasedMarginal>, BTreeSet<Edge>, CentralReport), CentralError> {
    let (state, report, released) = select_and_measure(dims, codes, options, true, rng)?;
    Ok((released, state.chordal, report))
}

/// The select–measure loop of [`synthesize_central`] (module docs): the fitting state after
/// the last round's refit, the accounting and every released marginal (the rounds' only
/// when `keep_released`; the 1-ways always).
fn select_and_measure<R: Rng + CryptoRng + ?Sized>(
    dims: &[usize],
    codes: &[u32],
    options: &CentralOptions,
    keep_released: bool,
    rng: &mut R,
) -> Result<(Fitting, CentralReport, Vec<ReleasedMarginal>), CentralError> {
    let d = dims.len();
    let rho = rho_for(options.epsilon, options.delta)?;
    if d == 0 || dims.contains(&0) || codes.len() % d != 0 {
        return Err(CentralError::Data(
            "the table needs ≥ 1 attribute with ≥ 1 value each".into(),
        ));
    }
    if let Some((i, _)) = codes
        .iter()
        .enumerate()
        .find(|&(i, &c)| c as usize >= dims[i % d])
    {
        return Err(CentralError::Data(format!(
            "record {} attribute {}: code out of the domain",
            i / d,
            i % d
        )));
    }
    // Sized before any table is allocated: the cap and candidates that fit the budget.
    let design = plan(dims, codes.len() / d, options, keep_released)?;
    let mut report = CentralReport {
        epsilon: options.epsilon,
        delta: options.delta,
        rho,
        rho_spent: 0.0,
        neighbours: "add or remove one record".into(),
        noisy_records: 0.0,
        measurements: Vec::new(),
        max_clique_cells: design.max_clique_cells,
        memory_estimate_bytes: design.bytes,
    };
    let mut released = Vec::new();
    let noisy = |attrs: &[usize], sigma: f64, rng: &mut R| -> Vec<f64> {
        counts(codes, d, dims, attrs)
            .into_iter()
            .map(|c| c + discrete_gaussian(sigma, rng) as f64)
            .collect()
    };

    // 1. The 1-ways, ρ_i ∝ c_i^{2/3}.
    let one_way_share = if options.max_marginal_attrs < 2 {
        1.0
    } else {
        ONE_WAY_SHARE
    };
    let weights: Vec<f64> = dims.iter().map(|&k| (k as f64).powf(2.0 / 3.0)).collect();
    let wsum: f64 = weights.iter().sum();
    let mut one_ways = Vec::with_capacity(d);
    for (a, w) in weights.iter().enumerate() {
        let r = one_way_share * rho * w / wsum;
        let sigma = (1.0 / (2.0 * r)).sqrt();
        let y = noisy(&[a], sigma, rng);
        released.push(ReleasedMarginal {
            attrs: vec![a],
            counts: y.clone(),
            sigma,
            groups: Vec::new(),
        });
        report.measurements.push(CentralMeasurement {
            attrs: vec![a],
            sigma,
            counts: y.len(),
            rho_measure: r,
            rho_select: 0.0,
        });
        one_ways.push((y, sigma));
    }
    // n̂: precision-weighted mean of the 1-ways' totals.
    let (num, den) = one_ways.iter().fold((0.0, 0.0), |(n, p), (y, s)| {
        let var = y.len() as f64 * s * s;
        (n + y.iter().sum::<f64>() / var, p + 1.0 / var)
    });
    let n_hat = (num / den).max(1.0);
    report.noisy_records = n_hat;
    let observation = |attrs: Vec<usize>, y: Vec<f64>, sigma: f64, groups: Vec<u32>| Observation {
        values: y.iter().map(|v| v / n_hat).collect(),
        variances: vec![(sigma / n_hat).powi(2); y.len()],
        attrs,
        bins: Vec::new(),
        groups,
    };
    let mut state = Fitting {
        dims: Domain::from(dims),
        observations: one_ways
            .into_iter()
            .enumerate()
            .map(|(a, (y, s))| observation(vec![a], y, s, Vec::new()))
            .collect(),
        chordal: BTreeSet::new(),
        model: None,
    };
    state.refit(FitOptions::default().max_iters)?;

    // 2. Rounds, over the design's candidates.
    let mut candidates = design.candidates;
    candidates.sort();
    let truth: BTreeMap<Vec<usize>, Vec<f64>> = candidates
        .iter()
        .map(|w| (w.clone(), counts(codes, d, dims, w)))
        .collect();
    let rounds = options.rounds.unwrap_or(ROUNDS_PER_ATTRIBUTE * d).max(1) as f64;
    // A candidate's weight: its heaviest pair's (1 without targets).
    let weight = |w: &[usize]| -> f64 {
        let mut most = 1.0f64;
        for (i, &a) in w.iter().enumerate() {
            for &b in &w[i + 1..] {
                most = most.max(crate::select::target_pair_weight(d, &options.targets, a, b));
            }
        }
        most
    };
    let mut rho_select = SELECTION_SHARE * rho / rounds;
    let mut rho_measure = (1.0 - ONE_WAY_SHARE - SELECTION_SHARE) * rho / rounds;
    let mut spent = one_way_share * rho;
    let mut measured: BTreeSet<Vec<usize>> = BTreeSet::new();
    while rho - spent > 1e-12 * rho {
        let left = rho - spent;
        if left < 2.0 * (rho_select + rho_measure) {
            let scale = left / (rho_select + rho_measure);
            rho_select *= scale;
            rho_measure *= scale;
        }
        let sigma = (1.0 / (2.0 * rho_measure)).sqrt();
        let eps_select = (8.0 * rho_select).sqrt();
        let cap = (design.max_clique_cells as f64 * (spent + rho_select + rho_measure) / rho)
            .max(dims.iter().copied().max().unwrap_or(1) as f64) as u64;
        let mut outside = None;
        let mut pool: Vec<(Vec<usize>, Vec<u32>)> = Vec::new();
        let mut scores = Vec::new();
        let noise_l1 = (2.0 / std::f64::consts::PI).sqrt() * sigma;
        // Marginals not yet measured first; once every one within the cap is, the measured
        // ones again (as AIM, whose candidates stay in its pool), so the budget is spent.
        for again in [false, true] {
            for w in &candidates {
                if measured.contains(w) != again {
                    continue;
                }
                if largest_clique_cells(&state.dims, &state.with_edges(w)) > cap {
                    continue;
                }
                let expected: Vec<f64> = state
                    .marginal(w, &mut outside)?
                    .iter()
                    .map(|q| n_hat * q)
                    .collect();
                let groups = if options.cell_merge > 0.0 {
                    let bound = cell_bounds(&state, w, n_hat, &mut outside)?;
                    cell_partition(&bound, options.cell_merge * sigma).unwrap_or_default()
                } else {
                    Vec::new()
                };
                let expected = group_sums(&expected, &groups);
                let err: f64 = group_sums(&truth[w], &groups)
                    .iter()
                    .zip(&expected)
                    .map(|(c, e)| (c - e).abs())
                    .sum();
                scores.push(weight(w) * (err - noise_l1 * expected.len() as f64));
                pool.push((w.clone(), groups));
            }
            if !pool.is_empty() {
                break;
            }
        }
        spent += rho_select + rho_measure;
        if pool.is_empty() {
            break;
        }
        // Each score is its weight times a count error of sensitivity 1.
        let sensitivity = pool.iter().map(|(w, _)| weight(w)).fold(1.0, f64::max);
        let (w, groups) =
            pool[exponential_mechanism(&scores, eps_select, sensitivity, rng)].clone();
        let before = group_sums(&state.marginal(&w, &mut outside)?, &groups);
        let y: Vec<f64> = group_sums(&truth[&w], &groups)
            .into_iter()
            .map(|c| c + discrete_gaussian(sigma, rng) as f64)
            .collect();
        report.measurements.push(CentralMeasurement {
            attrs: w.clone(),
            sigma,
            counts: y.len(),
            rho_measure,
            rho_select,
        });
        state.chordal = state.with_edges(&w);
        let seen = observation(w.clone(), y.clone(), sigma, groups.clone());
        if keep_released {
            released.push(ReleasedMarginal {
                attrs: w.clone(),
                counts: y.clone(),
                sigma,
                groups: groups.clone(),
            });
        }
        // A marginal measured again joins its earlier observation at the precision-weighted
        // mean (the fit pools them so anyway): the tables held grow with the distinct
        // marginals, which the design counts, not with the rounds.
        match state
            .observations
            .iter_mut()
            .find(|o| o.attrs == seen.attrs && o.groups == seen.groups)
        {
            Some(o) => {
                for ((v, var), (x, xvar)) in o
                    .values
                    .iter_mut()
                    .zip(o.variances.iter_mut())
                    .zip(seen.values.iter().zip(&seen.variances))
                {
                    let total = 1.0 / *var + 1.0 / xvar;
                    *v = (*v / *var + x / xvar) / total;
                    *var = 1.0 / total;
                }
            }
            None => state.observations.push(seen),
        }
        state.refit(ROUND_FIT_ITERS)?;
        measured.insert(w.clone());
        let after = group_sums(&state.marginal(&w, &mut None)?, &groups);
        let moved: f64 = before
            .iter()
            .zip(&after)
            .map(|(x, y)| (x - y).abs())
            .sum::<f64>()
            * n_hat;
        if moved <= noise_l1 * y.len() as f64 {
            rho_select *= 4.0;
            rho_measure *= 4.0;
        }
    }
    report.rho_spent = report
        .measurements
        .iter()
        .map(|m| m.rho_measure + m.rho_select)
        .sum();
    Ok((state, report, released))
}

/// Errors of [`measure_local_model`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LocalModelError {
    /// The party has no LocMRF budget in the config.
    #[error("{0}")]
    NoBudget(String),
    /// The central measurement failed (codes outside the domain, a bad budget).
    #[error(transparent)]
    Central(#[from] CentralError),
}

/// Measures party `p`'s local model (LocMRF, VertiMRF §4.1; [`crate::measure::local_model`])
/// of `codes` (`n × m` row-major: each record's schema
/// codes of the party's `m` attributes, in the party's order) within its LocMRF budget
/// (module docs), noise from `rng` (a CSPRNG seeded from the OS outside tests and
/// simulations). `schema_dims`: the schema's domain sizes. `max_marginal_attrs` is the
/// largest marginal measured (2 or 3). Errors: the party has no budget; codes outside their
/// domains.
pub fn measure_local_model<R: Rng + CryptoRng + ?Sized>(
    p: &ResolvedParty,
    schema_dims: &[usize],
    codes: &[u32],
    max_marginal_attrs: usize,
    rng: &mut R,
) -> Result<LocalModel, LocalModelError> {
    let budget = p.locmrf.ok_or_else(|| {
        LocalModelError::NoBudget(format!(
            "party `{}` has no `locmrf` budget in the collection's config",
            p.name
        ))
    })?;
    let dims: Vec<usize> = p.attributes.iter().map(|&a| schema_dims[a]).collect();
    // A party of one attribute spends its whole budget on its 1-way. No cell partitions:
    // the aggregator sums a local measurement down to the parts of it its cliques hold
    // (`crate::fit::observe::local_observations`), which a group of cells does not allow.
    let options = CentralOptions {
        max_marginal_attrs: max_marginal_attrs.min(dims.len()),
        cell_merge: 0.0,
        ..CentralOptions::new(budget.epsilon.get(), budget.delta)
    };
    let (released, chordal, report) = measure_central(&dims, codes, &options, rng)?;
    let to_schema = |i: usize| p.attributes[i];
    Ok(LocalModel::from_measured(
        p.name.clone(),
        released
            .into_iter()
            .map(|r| {
                debug_assert!(r.groups.is_empty(), "local models measure whole marginals");
                (
                    r.attrs.into_iter().map(to_schema).collect(),
                    r.counts,
                    r.sigma,
                )
            })
            .collect(),
        chordal
            .into_iter()
            .map(|(a, b)| {
                let (x, y) = (to_schema(a), to_schema(b));
                (x.min(y), x.max(y))
            })
            .collect::<BTreeSet<Edge>>()
            .into_iter()
            .collect(),
        LocalPrivacy {
            epsilon: report.epsilon,
            delta: report.delta,
            rho: report.rho,
            rho_spent: report.rho_spent,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha12Rng;

    /// Corollary 13 is tighter than Bun–Steinke's `δ = exp(−(ε−ρ)²/(4ρ))` (their Prop. 1.3)
    /// and `rho_for` inverts `delta_for`: at ε = 1, δ = 1e-9 the simple bound's ρ solves
    /// `ε = ρ + 2√(ρ ln 1/δ)` (ρ = 0.01180); Corollary 13 allows 0.01497.
    #[test]
    fn zcdp_conversion_is_tight_and_inverts() {
        for &(eps, delta) in &[(1.0, 1e-9), (0.2, 1e-6), (3.2, 1e-9), (8.0, 1e-5)] {
            let rho = rho_for(eps, delta).unwrap();
            let simple = {
                let l = (1.0f64 / delta).ln();
                let s = -l.sqrt() + (l + eps).sqrt();
                s * s
            };
            assert!(rho >= simple, "{eps} {delta}: {rho} < {simple}");
            assert!(delta_for(rho, eps) <= delta * (1.0 + 1e-6));
            assert!(
                delta_for(rho * 1.01, eps) > delta,
                "{eps} {delta}: not the largest ρ"
            );
            // Bun–Steinke's δ at the same ρ is never smaller.
            let bs = (-(eps - rho).powi(2) / (4.0 * rho)).exp();
            assert!(delta_for(rho, eps) <= bs);
        }
        // The same formula minimized with its closed-form derivative (a separate script):
        // ρ = 0.0149731 at (1, 1e-9) and 0.136083 at (3.2, 1e-9).
        assert!((rho_for(1.0, 1e-9).unwrap() - 0.014_973_06).abs() < 1e-7);
        assert!((rho_for(3.2, 1e-9).unwrap() - 0.136_082_74).abs() < 1e-6);
        assert!(rho_for(0.0, 1e-9).is_err() && rho_for(1.0, 1.0).is_err());
    }

    /// Exact Rényi divergence of `N_Z(0, σ²)` from `N_Z(1, σ²)` (sensitivity 1) at several
    /// orders α, summed over the support: ≤ α/(2σ²), the zCDP claim the accounting uses.
    #[test]
    fn discrete_gaussian_is_zcdp_exactly() {
        for &sigma in &[0.7, 1.5, 4.0, 20.0] {
            let s2: f64 = sigma * sigma;
            let range = (sigma * 40.0) as i64 + 10;
            // Log-pmf, so far tails neither underflow nor divide by zero.
            let log_pmf = |mu: f64| -> Vec<f64> {
                let e: Vec<f64> = (-range..=range)
                    .map(|x| -(x as f64 - mu).powi(2) / (2.0 * s2))
                    .collect();
                let top = e.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z = top + e.iter().map(|v| (v - top).exp()).sum::<f64>().ln();
                e.into_iter().map(|v| v - z).collect()
            };
            let (p, q) = (log_pmf(0.0), log_pmf(1.0));
            for &alpha in &[1.5, 2.0, 5.0, 10.0] {
                let sum: f64 = p
                    .iter()
                    .zip(&q)
                    .map(|(x, y)| (alpha * x + (1.0 - alpha) * y).exp())
                    .sum();
                let renyi = sum.ln() / (alpha - 1.0);
                assert!(
                    renyi <= alpha / (2.0 * s2) + 1e-12,
                    "σ {sigma} α {alpha}: {renyi}"
                );
            }
        }
    }

    /// The sampler's frequencies match the discrete Gaussian's pmf (χ² over the cells with
    /// expected count ≥ 5, tail pooled; fixed seed), and its mean is 0 (the noisy counts are
    /// unbiased): within 4 standard errors.
    #[test]
    fn discrete_gaussian_sampler_matches_its_pmf() {
        let mut rng = ChaCha12Rng::seed_from_u64(3);
        for &sigma in &[0.8, 3.0] {
            let n = 200_000;
            let draws: Vec<i64> = (0..n).map(|_| discrete_gaussian(sigma, &mut rng)).collect();
            let s2: f64 = sigma * sigma;
            let range = (sigma * 12.0) as i64 + 2;
            let w: Vec<f64> = (-range..=range)
                .map(|x| (-(x as f64).powi(2) / (2.0 * s2)).exp())
                .collect();
            let z: f64 = w.iter().sum();
            let mut observed = vec![0.0; w.len()];
            for &x in &draws {
                observed[(x.clamp(-range, range) + range) as usize] += 1.0;
            }
            let (mut chi2, mut df, mut pooled_o, mut pooled_e) = (0.0, 0usize, 0.0, 0.0);
            for (o, e) in observed.iter().zip(w.iter().map(|v| v / z * n as f64)) {
                if e >= 5.0 {
                    chi2 += (o - e).powi(2) / e;
                    df += 1;
                } else {
                    pooled_o += o;
                    pooled_e += e;
                }
            }
            if pooled_e > 0.0 {
                chi2 += (pooled_o - pooled_e).powi(2) / pooled_e.max(1e-9);
                df += 1;
            }
            df -= 1;
            // The 0.999 quantile of χ²(df) is below df + 3.1·√(2 df) + 10 for these df.
            let limit = df as f64 + 3.1 * (2.0 * df as f64).sqrt() + 10.0;
            assert!(chi2 < limit, "σ {sigma}: χ² {chi2} over {df} df");
            let mean = draws.iter().sum::<i64>() as f64 / n as f64;
            let var = draws
                .iter()
                .map(|&x| (x as f64 - mean).powi(2))
                .sum::<f64>()
                / n as f64;
            assert!(
                mean.abs() < 4.0 * (var / n as f64).sqrt(),
                "σ {sigma}: mean {mean}"
            );
        }
    }

    /// The exponential mechanism's worst-case ratio over neighbouring score vectors (each
    /// score moved by at most Δ) is ≤ e^ε, computed exactly over random vectors and the
    /// extreme shifts.
    #[test]
    fn exponential_mechanism_ratio_is_at_most_e_epsilon() {
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        for _ in 0..300 {
            let k = rng.random_range(2..12);
            let eps = rng.random_range(0.01..4.0);
            let delta_s = rng.random_range(0.5..3.0);
            let s: Vec<f64> = (0..k).map(|_| rng.random_range(-50.0..50.0)).collect();
            for pattern in 0..(1u32 << k.min(8)) {
                let t: Vec<f64> = s
                    .iter()
                    .enumerate()
                    .map(|(i, x)| {
                        if pattern >> (i % 8) & 1 == 1 {
                            x + delta_s
                        } else {
                            x - delta_s * 0.5
                        }
                    })
                    .collect();
                let p = exponential_mechanism_probabilities(&s, eps, delta_s);
                let q = exponential_mechanism_probabilities(&t, eps, delta_s);
                for (x, y) in p.iter().zip(&q) {
                    assert!(x / y <= eps.exp() * (1.0 + 1e-9) && y / x <= eps.exp() * (1.0 + 1e-9));
                }
            }
        }
    }

    /// A chain 0 → 1 → 2 → 3 of strongly dependent attributes: the synthesizer spends
    /// exactly its ρ, and its model's pairs beat the independence model's by far.
    /// On a table with rare values, at a small ε and `cell_merge = 1`, some marginals are
    /// released over cell groups: one noisy count per group, a group for every cell, groups formed only of cells
    /// whose rarest value's 1-way is below the threshold; with `cell_merge = 0` none is.
    #[test]
    fn rare_cells_are_measured_in_groups() {
        let dims = vec![8usize, 8, 2];
        let mut rng = ChaCha12Rng::seed_from_u64(3);
        let n = 5_000;
        let mut codes = Vec::with_capacity(n * 3);
        for _ in 0..n {
            // Values 0 and 1 hold ~94% of each of the first two attributes.
            let a = if rng.random_bool(0.94) {
                rng.random_range(0..2)
            } else {
                rng.random_range(2..8)
            };
            let b = if rng.random_bool(0.9) {
                a % 2
            } else {
                rng.random_range(0..8)
            };
            codes.extend([a, b, (a + b) % 2]);
        }
        let run = |cell_merge: f64| {
            let options = CentralOptions {
                cell_merge,
                ..CentralOptions::new(0.5, 1e-6)
            };
            let (released, _, report) =
                measure_central(&dims, &codes, &options, &mut ChaCha12Rng::seed_from_u64(4))
                    .unwrap();
            assert!((report.rho_spent - report.rho).abs() < 1e-9 * report.rho);
            (released, report)
        };
        let (released, report) = run(1.0);
        let grouped: Vec<&ReleasedMarginal> =
            released.iter().filter(|r| !r.groups.is_empty()).collect();
        assert!(!grouped.is_empty(), "no marginal was measured in groups");
        for r in &grouped {
            let cells: usize = r.attrs.iter().map(|&a| dims[a]).product();
            assert_eq!(r.groups.len(), cells);
            let k = *r.groups.iter().max().unwrap() as usize + 1;
            assert_eq!(r.counts.len(), k);
            assert!(k < cells);
            let m = report
                .measurements
                .iter()
                .find(|m| m.attrs == r.attrs && m.sigma == r.sigma)
                .unwrap();
            assert_eq!(m.counts, k);
        }
        // A cell whose every value is common (codes 0 and 1 of the first two attributes, and
        // both of the third, hold over 1,000 people each, far above any threshold here) is
        // never merged: only a rare value makes a cell's bound small.
        for r in &grouped {
            let attrs_dims: Vec<usize> = r.attrs.iter().map(|&a| dims[a]).collect();
            for (cell, &g) in r.groups.iter().enumerate() {
                let shared = r.groups.iter().filter(|&&x| x == g).count() > 1;
                let mut i = cell;
                let mut common = true;
                for (&a, &k) in r.attrs.iter().zip(&attrs_dims).rev() {
                    common &= a == 2 || i % k < 2;
                    i /= k;
                }
                assert!(!(shared && common), "{:?} cell {cell}", r.attrs);
            }
        }
        let (released, _) = run(0.0);
        assert!(released.iter().all(|r| r.groups.is_empty()));
    }

    #[test]
    fn learns_a_chain_and_spends_exactly_its_budget() {
        let dims = vec![4usize, 3, 5, 2, 3];
        let mut rng = ChaCha12Rng::seed_from_u64(8);
        let n = 20_000;
        let mut codes = Vec::with_capacity(n * dims.len());
        for _ in 0..n {
            let mut prev = rng.random_range(0..4u32);
            codes.push(prev);
            for &k in &dims[1..4] {
                let v = if rng.random_bool(0.8) {
                    prev % k as u32
                } else {
                    rng.random_range(0..k as u32)
                };
                codes.push(v);
                prev = v;
            }
            codes.push(rng.random_range(0..3));
        }
        let options = CentralOptions::new(1.0, 1e-6);
        let fitted =
            synthesize_central(&dims, &codes, &options, &mut ChaCha12Rng::seed_from_u64(9))
                .unwrap();
        let r = &fitted.report;
        assert!(
            (r.rho_spent - r.rho).abs() < 1e-9 * r.rho,
            "{} vs {}",
            r.rho_spent,
            r.rho
        );
        assert!(
            (r.noisy_records - n as f64).abs() < 200.0,
            "{}",
            r.noisy_records
        );
        let tvd = |attrs: &[usize], p: &[f64]| {
            let c = counts(&codes, dims.len(), &dims, attrs);
            c.iter()
                .zip(p)
                .map(|(x, y)| (x / n as f64 - y).abs())
                .sum::<f64>()
                / 2.0
        };
        for (a, b) in [(0, 1), (1, 2), (2, 3)] {
            let model = fitted.model.marginal(&[a, b]).unwrap().frequencies;
            let ia = counts(&codes, dims.len(), &dims, &[a]);
            let ib = counts(&codes, dims.len(), &dims, &[b]);
            let indep: Vec<f64> = ia
                .iter()
                .flat_map(|x| ib.iter().map(move |y| x * y / (n * n) as f64))
                .collect();
            assert!(
                tvd(&[a, b], &model) < 0.3 * tvd(&[a, b], &indep),
                "pair ({a}, {b})"
            );
        }
        let rows: Vec<Vec<u32>> = fitted.model.synthesize(10, 1).collect();
        assert!(
            rows.iter()
                .all(|r| r.iter().zip(&dims).all(|(&c, &k)| (c as usize) < k))
        );
    }

    /// Issue 67 item 2: three numeric columns on `schema infer`'s fine grid (1,024 codes)
    /// and two categorical ones. Every pair of grids (2^20 cells) and triple (2^30, 8 GiB of
    /// counts) exceeds the clique cap and never enters the design; the design fits the
    /// budget; a lower budget lowers the cap (and the estimate with it) and keeps only the
    /// marginals within it; below the smallest design (cap = the largest attribute) the
    /// error says what it needs and what was allowed.
    #[test]
    fn the_design_is_sized_to_the_memory_budget_before_allocating() {
        let dims = [1024usize, 1024, 1024, 4, 3];
        let options = CentralOptions::new(1.0, 1e-9);
        let full = plan_design(&dims, 30_000, &options).unwrap();
        assert_eq!(full.max_clique_cells, MAX_CLIQUE_CELLS);
        assert!(full.bytes <= DEFAULT_MAX_MEMORY_BYTES);
        let domain = Domain::from(&dims[..]);
        let cells = |w: &Vec<usize>| domain.cells(w);
        assert!(full.candidates.iter().all(|w| cells(w) <= MAX_CLIQUE_CELLS));
        // Of 10 pairs and 10 triples: the 6 grid × categorical pairs, the categorical pair
        // and the 3 grid × both categoricals triples (12,288 cells).
        assert!(full.candidates.contains(&vec![0, 3, 4]));
        assert!(!full.candidates.contains(&vec![0, 1]));
        assert_eq!(full.candidates.len(), 6 + 1 + 3);

        let small = CentralOptions {
            max_memory_bytes: full.bytes / 2,
            ..options.clone()
        };
        let shrunk = plan_design(&dims, 30_000, &small).unwrap();
        assert!(shrunk.max_clique_cells < full.max_clique_cells);
        assert!(
            shrunk.max_clique_cells >= 1024,
            "never below the largest attribute"
        );
        assert!(shrunk.bytes <= small.max_memory_bytes);
        assert!(
            shrunk
                .candidates
                .iter()
                .all(|w| cells(w) <= shrunk.max_clique_cells)
        );
        // Just above the smallest design (cap 1,024: the codes, 1-ways, the categorical
        // pair and five cliques of 1,024 cells, 1.14 MB): only the categorical pair is left.
        let smallest = CentralOptions {
            max_memory_bytes: 1_200_000,
            ..options.clone()
        };
        let floor = plan_design(&dims, 30_000, &smallest).unwrap();
        assert_eq!(floor.max_clique_cells, 1024);
        assert_eq!(floor.candidates, vec![vec![3, 4]]);

        let tiny = CentralOptions {
            max_memory_bytes: 1 << 20,
            ..options
        };
        match plan_design(&dims, 30_000, &tiny) {
            Err(CentralError::Memory {
                needed_mib,
                budget_mib,
                clique_cells,
                ..
            }) => {
                assert_eq!((budget_mib, clique_cells), (1, 1024));
                assert!(needed_mib > 1);
            }
            other => panic!("{other:?}"),
        }
        match synthesize_central(
            &dims,
            &vec![0; 30_000 * dims.len()],
            &tiny,
            &mut ChaCha12Rng::seed_from_u64(1),
        ) {
            Err(e) => assert!(e.to_string().contains("smallest design"), "{e}"),
            Ok(_) => panic!("30,000 rows fit 1 MiB"),
        }
    }

    /// Issue 67 item 2: a run over grids whose triples would need 4096³ counts (512 GiB, an
    /// allocation failure before the design was sized) measures only marginals within the
    /// cap; under a budget that lowers the cap every measured marginal and every clique of
    /// the model stays within the lowered cap, and the budget is still spent exactly.
    #[test]
    fn a_run_stays_within_its_design() {
        let dims = vec![4096usize, 4096, 4096, 3, 2];
        let mut rng = ChaCha12Rng::seed_from_u64(2);
        let n = 2_000;
        let mut codes = Vec::with_capacity(n * dims.len());
        for _ in 0..n {
            let a = rng.random_range(0..4096u32);
            let c = rng.random_range(0..3u32);
            codes.extend([a, rng.random_range(0..4096), a / 2, c, c % 2]);
        }
        for budget in [DEFAULT_MAX_MEMORY_BYTES, 8 << 20] {
            let options = CentralOptions {
                max_memory_bytes: budget,
                rounds: Some(20),
                ..CentralOptions::new(1.0, 1e-6)
            };
            let design = plan_design(&dims, n, &options).unwrap();
            let fitted =
                synthesize_central(&dims, &codes, &options, &mut ChaCha12Rng::seed_from_u64(3))
                    .unwrap();
            let r = &fitted.report;
            assert_eq!(r.max_clique_cells, design.max_clique_cells);
            assert!((r.rho_spent - r.rho).abs() < 1e-9 * r.rho);
            let domain = Domain::from(&dims[..]);
            for m in &r.measurements {
                assert!(domain.cells(&m.attrs) <= design.max_clique_cells, "{m:?}");
            }
            let cap = design.max_clique_cells as usize;
            let structure = fitted
                .model
                .describe()
                .structure
                .expect("a graphical model");
            for c in &structure.junction_tree.cliques {
                assert!(domain.cells(c) as usize <= cap, "{c:?}");
            }
        }
        assert!(
            plan_design(
                &dims,
                n,
                &CentralOptions {
                    max_memory_bytes: 8 << 20,
                    ..CentralOptions::new(1.0, 1e-6)
                }
            )
            .unwrap()
            .max_clique_cells
                < MAX_CLIQUE_CELLS
        );
    }

    #[test]
    fn refuses_codes_outside_the_domain() {
        let err = synthesize_central(
            &[2, 2],
            &[0, 1, 2, 0],
            &CentralOptions::new(1.0, 1e-6),
            &mut ChaCha12Rng::seed_from_u64(1),
        );
        assert!(matches!(err, Err(CentralError::Data(_))));
    }
}
