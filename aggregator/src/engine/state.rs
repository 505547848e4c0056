//! The collection state machine: task assignment, round closing (PrivIncr pruning,
//! SamPrivSyn re-weighting, `auto`'s structure selection) and finalization.
//!
//! Everything here is a pure function of the [`Engine`] (built from the public collection
//! config), the serializable [`CollectionState`] and the [`Tables`] of sufficient statistics:
//! the HTTP service stores the state in its database in the same transaction as the report
//! that caused a transition, and any process can recompute the same transition from the same
//! tables.
//!
//! Protocols (defaults in `ldpsyn::protocol`):
//! - `privincr`: phase 1 = Algorithm 1 of PrivIncr over `rounds` rounds of
//!   `⌊omega·N/rounds⌋` accepted reports; every task is a remaining edge drawn with probability
//!   `∝ |Ω_i|·|Ω_j|` (line 5) reported with VOUE (OUE over the pair's product domain); after
//!   each round every remaining edge whose MI (eq. 14, on Norm-Sub'd accumulated estimates)
//!   is below `ℓ = τ − ΔI(η)` (eq. 15, eq. 18) is pruned; its data is kept and still used.
//!   After the last round: junction tree + Algorithm 2 ([`super::plan`]), and phase 2 hands out
//!   the planned factors (VOUE) with probability `∝` their domain size.
//! - `noincremental`: the same with one phase-1 round (T = 1).
//! - `samprivsyn`: Algorithm 1 of SamPrivSyn: each task is a pair drawn `∝` its current
//!   weight, reported with two GRRs at ε/2; every `batch_size` accepted reports the weights
//!   become the MI of each pair's Kronecker-inverse + Norm-Sub estimate, plus a floor of
//!   5% of the mean weight so no pair starves. Uniform at the start.
//! - `independence`: each task is one attribute, uniformly, with the lower-variance oracle
//!   (`MechanismKind::choose`).
//! - `auto`: see [`AUTO_PHASE1_SHARE`] and [`Engine::close_round`]: one structure-learning
//!   round on all pairs with the lower-variance oracle per pair, noise-aware edge selection,
//!   a maximum spanning forest of significant edges, then phase 2 measures the chosen pairs
//!   and every attribute alone, allocated to minimize the expected total error.

use std::collections::BTreeSet;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::{Mechanism, MechanismKind, norm_sub};
use ldpsyn::protocol::{CollectionConfig, PrivIncrParams, Protocol};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use serde::{Deserialize, Serialize};

use super::EngineError;
use super::estimate::{
    MAX_CLIQUE_CELLS, PairGain, fit_model, one_way_estimates, pair_gain, select_model_graph,
};
use super::graph::{Edge, edge};
use super::info::{mutual_information, relaxed_threshold, tau};
use super::model::{EdgeGain, FittedJoint, Model};
use super::pgm::FitOptions;
use super::plan::{Structure, build_structure};
use super::tables::{Measurements, TableKey, Tables};

/// Share of the users `auto` spends on structure learning (phase 1), chosen on the Adult
/// benchmark with `bench-utility`'s `LDPSYN_AUTO_SHARE` override (those tuning runs are not
/// committed); `omega` of the config is ignored by `auto`.
pub const AUTO_PHASE1_SHARE: f64 = 0.3;

/// `auto` keeps an edge only if the pair's dependence is significant against LDP noise and
/// sampling: `X = Σ_cells (f̂_ab − f0)² / (V(f0) + f0 (1 − f0)(1 − n/N)/n)` with `f0 = f̂_a f̂_b`
/// and `V(f0)` the mechanism's exact variance at `f0` for the pair's `n` reports (Pearson's
/// form: evaluated at the null, not at the noisy cell), χ² with `df = |Ω_a||Ω_b| − 1` under
/// independence, turned into a standard normal `z` by the Wilson–Hilferty cube root, and
/// `z > AUTO_Z`. One-sided α ≈ 0.6% per pair: about 0.4 false edges among the 66 pairs of
/// the `sim` network (the planted-structure test), 0.7 among Adult's 105. Lower thresholds
/// helped Adult at 45k–100k users (dense true structure) and hurt `sim` (sparse), measured
/// with `bench-utility` and `LDPSYN_AUTO_Z` (runs not committed; the committed results use
/// this default).
pub const AUTO_Z: f64 = 2.5;

/// `auto` learns a structure only when the phase-1 signal-to-noise budget
/// `ρ = share·N / Σ_pairs |Ω_a||Ω_b|·Var0(pair)` reaches this value (roughly: phase-1
/// reports per cell of the pair tables, in units of one report's variance). Below it the
/// pair tables cannot beat their own noise and `auto` runs as `independence`.
pub const AUTO_MIN_RHO: f64 = 20.0;

/// `auto` also needs this many phase-1 reports per pair on average: ρ only counts the
/// mechanism's noise, and with a few dozen reports per pair sampling error alone defeats the
/// structure (Adult at 10k users and ε = 8 lost to independence without this rule).
pub const AUTO_MIN_PAIR_REPORTS: f64 = 100.0;

/// `auto` grows the spanning forest with further significant edges while every clique of the
/// junction tree has at most `AUTO_CLIQUE_TVD · sqrt(n_f / Var0)` cells, `n_f` the phase-2
/// reports a factor can expect: the cell count at which a clique's expected noise TVD
/// (≈ 0.4·cells·sqrt(Var0/n_f)) stays near 0.05.
pub const AUTO_CLIQUE_TVD: f64 = 0.125;

/// Multiplier of the phase-2 task weight of `auto`'s 1-way factors: the 1-way marginals are
/// fitted into every conditional and enter every pair's error (chosen on Adult with
/// `LDPSYN_AUTO_ONE_WAY_BOOST`, runs not committed: 3 lowered the 2-way TVD at ε = 4 and 8
/// against 1).
pub const AUTO_ONE_WAY_BOOST: f64 = 3.0;

/// Floor of every SamPrivSyn pair weight, as a fraction of the mean weight.
pub const SAMPRIVSYN_WEIGHT_FLOOR: f64 = 0.05;

/// Where a collection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// PrivIncr/auto phase 1: pairs are measured and pruned round by round.
    GraphConstruction,
    /// PrivIncr/auto phase 2: the planned factors are measured (last round, no quota).
    CliqueMeasurement,
    /// SamPrivSyn: MI-weighted pair sampling, re-weighted every batch.
    PairSampling,
    /// Independence: single attributes.
    OneWay,
    /// Finalized: no more tasks.
    Finalized,
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
    /// `auto`: noise-corrected MI (observed minus the MI noise alone gives).
    pub score: Option<f64>,
    /// `auto`: significance z of the dependence (see [`AUTO_Z`]).
    pub z: Option<f64>,
}

/// A factor measured in phase 2, its mechanism and its share of phase-2 tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedFactor {
    /// Attributes in report order.
    pub factor: Vec<usize>,
    /// Mechanism.
    pub mechanism: MechanismKind,
    /// Relative task weight (tasks drawn with probability ∝ weight).
    pub weight: f64,
}

/// The phase-2 plan: the model structure and the factors to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase2Plan {
    /// Dependency graph, junction tree and conditionals.
    pub structure: Structure,
    /// Factors measured in phase 2.
    pub factors: Vec<PlannedFactor>,
}

/// Every decision taken so far for a collection (serde JSON; stored by the service).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectionState {
    /// Protocol name.
    pub protocol: String,
    /// Phase.
    pub phase: Phase,
    /// Current round (PrivIncr/auto: phase-1 rounds `0..T`, phase 2 is round `T`;
    /// SamPrivSyn: batch index).
    pub round: u32,
    /// Accepted reports of the current round after which it closes (`None`: never closes by
    /// itself; the operator finalizes).
    pub round_quota: Option<u64>,
    /// All `d(d−1)/2` pairs (PrivIncr/auto), lexicographic.
    pub edges: Vec<EdgeState>,
    /// Phase-2 plan once phase 1 is over.
    pub plan: Option<Phase2Plan>,
    /// SamPrivSyn pair weights (lexicographic pairs).
    pub pair_weights: Vec<f64>,
}

/// A task to hand out: which factor, with which mechanism, for which round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Round (or SamPrivSyn batch) the task belongs to; the service counts accepted reports
    /// per round with it.
    pub round: u32,
    /// Factor: attribute indices in report order.
    pub factor: Vec<usize>,
    /// Mechanism.
    pub mechanism: MechanismKind,
}

/// What a call to [`Engine::close_round`] did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "transition", rename_all = "snake_case")]
pub enum Transition {
    /// A phase-1 round closed; these edges were pruned; the next round is open.
    RoundClosed {
        /// The round that closed.
        round: u32,
        /// Edges pruned after it.
        pruned: Vec<Edge>,
    },
    /// Phase 1 is over; phase 2 measures the planned factors.
    EnteredCliqueMeasurement {
        /// Edges pruned after the last phase-1 round.
        pruned: Vec<Edge>,
        /// Number of phase-2 factors.
        factors: usize,
    },
    /// SamPrivSyn weights recomputed; a new batch is open.
    Reweighted {
        /// The new batch index.
        batch: u32,
    },
    /// Nothing to close in this phase.
    Nothing,
}

/// Options of the engine that are not part of the public collection config.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EngineOptions {
    /// SamPrivSyn: synthesize as the paper does (pair distributions by LASSO, eq. 7 of
    /// SamPrivSyn, linfa-elasticnet, with this L1 penalty; 1-ways by eq. 11; Algorithm 2)
    /// instead of from the graphical model fitted to every measurement.
    pub samprivsyn_lasso: Option<f64>,
    /// Cap on the cells of one clique of the final model graph (default
    /// [`MAX_CLIQUE_CELLS`]).
    pub max_clique_cells: Option<u64>,
    /// `auto`: share of users in phase 1 (default [`AUTO_PHASE1_SHARE`]).
    pub auto_phase1_share: Option<f64>,
    /// `auto`: significance threshold (default [`AUTO_Z`]).
    pub auto_z: Option<f64>,
    /// `auto`: multiplier of the phase-2 task weight of 1-way factors (default
    /// [`AUTO_ONE_WAY_BOOST`]).
    pub auto_one_way_boost: Option<f64>,
    /// `auto`: minimum ρ to learn a structure (default [`AUTO_MIN_RHO`]).
    pub auto_min_rho: Option<f64>,
    /// `auto`: clique-size constant (default [`AUTO_CLIQUE_TVD`]; 0 keeps the forest).
    pub auto_clique_tvd: Option<f64>,
}

/// The engine of one collection: its config, resolved. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine {
    dims: Vec<usize>,
    epsilon: Epsilon,
    target_users: u64,
    protocol: Protocol,
    options: EngineOptions,
}

fn pairs(d: usize) -> Vec<Edge> {
    let mut v = Vec::new();
    for a in 0..d {
        for b in a + 1..d {
            v.push((a, b));
        }
    }
    v
}

/// Draws an index with probability ∝ `weights` (all ≥ 0, not all 0).
fn draw_weighted<R: Rng + ?Sized>(
    weights: impl Iterator<Item = f64> + Clone,
    rng: &mut R,
) -> usize {
    let total: f64 = weights.clone().sum();
    let mut u = rng.random::<f64>() * total;
    let mut last = 0;
    for (i, w) in weights.enumerate() {
        if w > 0.0 {
            last = i;
            if u < w {
                return i;
            }
            u -= w;
        }
    }
    last
}

impl Engine {
    /// The engine of a collection. Errors: a schema attribute of fewer than 2 values, or
    /// invalid protocol parameters (omega ∉ (0,1), rounds = 0, alpha ∉ (0,1], phi ≤ 0,
    /// batch size 0).
    pub fn new(config: &CollectionConfig) -> Result<Self, EngineError> {
        Self::with_options(config, EngineOptions::default())
    }

    /// As [`Engine::new`] with [`EngineOptions`].
    pub fn with_options(
        config: &CollectionConfig,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        Self::from_parts(
            config.schema.domain_sizes(),
            config.epsilon,
            config.target_users,
            config.protocol.clone(),
            options,
        )
    }

    /// The engine from its parts (domain sizes instead of a schema).
    pub fn from_parts(
        dims: Vec<usize>,
        epsilon: Epsilon,
        target_users: u64,
        protocol: Protocol,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        if dims.is_empty() || dims.iter().any(|&k| k < 2) {
            return Err(EngineError::InvalidConfig(
                "every attribute needs ≥ 2 values".into(),
            ));
        }
        match &protocol {
            Protocol::Privincr(p) | Protocol::Noincremental(p) | Protocol::Auto(p) => {
                if !(p.omega > 0.0 && p.omega < 1.0) {
                    return Err(EngineError::InvalidConfig("omega must be in (0, 1)".into()));
                }
                if p.rounds == 0 {
                    return Err(EngineError::InvalidConfig("rounds must be ≥ 1".into()));
                }
                let valid = p.alpha > 0.0 && p.alpha <= 1.0 && p.phi > 0.0 && p.sigma >= 2;
                if !valid {
                    return Err(EngineError::InvalidConfig(
                        "alpha ∈ (0, 1], phi > 0, sigma ≥ 2 required".into(),
                    ));
                }
            }
            Protocol::Samprivsyn(s) => {
                if s.batch_size == 0 {
                    return Err(EngineError::InvalidConfig("batch_size must be ≥ 1".into()));
                }
            }
            Protocol::Independence {} => {}
        }
        Ok(Self {
            dims,
            epsilon,
            target_users,
            protocol,
            options,
        })
    }

    /// Domain sizes of the schema.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }
    /// ε of every report.
    pub fn epsilon(&self) -> Epsilon {
        self.epsilon
    }
    /// The protocol.
    pub fn protocol(&self) -> &Protocol {
        &self.protocol
    }
    /// Target number of users N.
    pub fn target_users(&self) -> u64 {
        self.target_users
    }
    /// Engine options.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    fn cells(&self, factor: &[usize]) -> usize {
        factor.iter().map(|&a| self.dims[a]).product()
    }

    /// PrivIncr parameters with the protocol's round count (T = 1 for noincremental; auto
    /// uses one structure round and its own phase-1 share).
    fn privincr(&self) -> Option<(PrivIncrParams, u32, f64)> {
        match &self.protocol {
            Protocol::Privincr(p) => Some((p.clone(), p.rounds, p.omega)),
            Protocol::Noincremental(p) => Some((p.clone(), 1, p.omega)),
            Protocol::Auto(p) => Some((
                p.clone(),
                1,
                self.options.auto_phase1_share.unwrap_or(AUTO_PHASE1_SHARE),
            )),
            _ => None,
        }
    }

    /// `auto`'s ρ (see [`AUTO_MIN_RHO`]).
    pub fn auto_rho(&self) -> f64 {
        let share = self.options.auto_phase1_share.unwrap_or(AUTO_PHASE1_SHARE);
        let denom: f64 = pairs(self.dims.len())
            .iter()
            .map(|&(a, b)| {
                let f = [a, b];
                let dims = [self.dims[a], self.dims[b]];
                self.cells(&f) as f64 * self.best_oracle(&f).approx_variance(self.epsilon, &dims)
            })
            .sum();
        share * self.target_users as f64 / denom.max(1e-300)
    }

    fn auto_learns_structure(&self) -> bool {
        let d = self.dims.len();
        let share = self.options.auto_phase1_share.unwrap_or(AUTO_PHASE1_SHARE);
        let per_pair =
            share * self.target_users as f64 / (d * d.saturating_sub(1) / 2).max(1) as f64;
        d >= 2
            && per_pair >= AUTO_MIN_PAIR_REPORTS
            && self.auto_rho() >= self.options.auto_min_rho.unwrap_or(AUTO_MIN_RHO)
    }

    /// The mechanism `auto`/independence use for a factor: the lower-variance oracle.
    fn best_oracle(&self, factor: &[usize]) -> MechanismKind {
        MechanismKind::choose(self.epsilon, self.cells(factor))
    }

    /// The phase-1 mechanism of a pair.
    fn phase1_mechanism(&self, factor: &[usize]) -> MechanismKind {
        match self.protocol {
            Protocol::Auto(_) => self.best_oracle(factor),
            _ => MechanismKind::Oue,
        }
    }

    /// The state of a new collection.
    pub fn initial_state(&self) -> CollectionState {
        let d = self.dims.len();
        let n = self.target_users;
        if matches!(self.protocol, Protocol::Auto(_)) && !self.auto_learns_structure() {
            // Falls back to independence from the start (see [`AUTO_MIN_RHO`]).
            return CollectionState {
                protocol: self.protocol.name().into(),
                phase: Phase::OneWay,
                round: 0,
                round_quota: None,
                edges: Vec::new(),
                plan: None,
                pair_weights: Vec::new(),
            };
        }
        match (&self.protocol, self.privincr()) {
            (_, Some((p, rounds, share))) => CollectionState {
                protocol: self.protocol.name().into(),
                phase: Phase::GraphConstruction,
                round: 0,
                // ⌊ω·N/T⌋, at least one report so a round can close.
                round_quota: Some(((share * n as f64 / rounds as f64).floor() as u64).max(1)),
                edges: pairs(d)
                    .into_iter()
                    .map(|(a, b)| EdgeState {
                        a,
                        b,
                        active: true,
                        pruned_in: None,
                        mi: None,
                        tau: tau(self.dims[a], self.dims[b], p.phi),
                        ell: None,
                        reports: 0,
                        score: None,
                        z: None,
                    })
                    .collect(),
                plan: None,
                pair_weights: Vec::new(),
            },
            (Protocol::Samprivsyn(s), None) => {
                let m = d * (d - 1) / 2;
                CollectionState {
                    protocol: self.protocol.name().into(),
                    phase: if m == 0 {
                        Phase::OneWay
                    } else {
                        Phase::PairSampling
                    },
                    round: 0,
                    round_quota: Some(s.batch_size),
                    edges: Vec::new(),
                    plan: None,
                    // Algorithm 1 line 4: every pair starts with weight 2/(d(d−1)).
                    pair_weights: vec![1.0 / m.max(1) as f64; m],
                }
            }
            _ => CollectionState {
                protocol: self.protocol.name().into(),
                phase: Phase::OneWay,
                round: 0,
                round_quota: None,
                edges: Vec::new(),
                plan: None,
                pair_weights: Vec::new(),
            },
        }
    }

    /// Draws the next task: a pure function of the state and `rng`, never of anyone's data.
    /// Errors: [`EngineError::Finalized`] once finalized.
    pub fn draw_task<R: Rng + ?Sized>(
        &self,
        state: &CollectionState,
        rng: &mut R,
    ) -> Result<TaskSpec, EngineError> {
        let d = self.dims.len();
        let one_way = |rng: &mut R| {
            let a = rng.random_range(0..d);
            TaskSpec {
                round: state.round,
                factor: vec![a],
                mechanism: self.best_oracle(&[a]),
            }
        };
        match state.phase {
            Phase::Finalized => Err(EngineError::Finalized),
            Phase::GraphConstruction => {
                let active: Vec<&EdgeState> = state.edges.iter().filter(|e| e.active).collect();
                if active.is_empty() {
                    // Every edge pruned (or d = 1): spend the rest of the round on 1-ways.
                    return Ok(one_way(rng));
                }
                // Line 5 of Algorithm 1: Ñ_{t,e} ∝ |Ω_i|·|Ω_j|.
                let i = draw_weighted(
                    active
                        .iter()
                        .map(|e| (self.dims[e.a] * self.dims[e.b]) as f64),
                    rng,
                );
                let factor = vec![active[i].a, active[i].b];
                Ok(TaskSpec {
                    round: state.round,
                    mechanism: self.phase1_mechanism(&factor),
                    factor,
                })
            }
            Phase::CliqueMeasurement => {
                let plan = state
                    .plan
                    .as_ref()
                    .ok_or_else(|| EngineError::InvalidState("phase 2 without a plan".into()))?;
                if plan.factors.is_empty() {
                    return Ok(one_way(rng));
                }
                let i = draw_weighted(plan.factors.iter().map(|f| f.weight), rng);
                Ok(TaskSpec {
                    round: state.round,
                    factor: plan.factors[i].factor.clone(),
                    mechanism: plan.factors[i].mechanism,
                })
            }
            Phase::PairSampling => {
                let i = draw_weighted(state.pair_weights.iter().copied(), rng);
                let (a, b) = pairs(d)[i];
                Ok(TaskSpec {
                    round: state.round,
                    factor: vec![a, b],
                    mechanism: MechanismKind::GrrPair,
                })
            }
            Phase::OneWay => Ok(one_way(rng)),
        }
    }

    /// The table a report answering `task` is counted in. SamPrivSyn and independence pool
    /// all batches in round 0 (same mechanism and ε, so pooling is exact by eq. 5 of
    /// PrivIncr); PrivIncr/auto keep one table per round.
    pub fn table_key(&self, task: &TaskSpec) -> TableKey {
        let round = match self.protocol {
            Protocol::Samprivsyn(_) | Protocol::Independence {} => 0,
            _ => task.round,
        };
        TableKey {
            round,
            factor: task.factor.clone(),
            mechanism: task.mechanism,
        }
    }

    /// The mechanism of a table (to validate and accumulate reports).
    /// Errors: an invalid factor for the schema.
    pub fn mechanism(&self, key: &TableKey) -> Result<Mechanism, EngineError> {
        if key.factor.iter().any(|&a| a >= self.dims.len()) {
            return Err(EngineError::InvalidState(format!(
                "factor {:?} outside the schema",
                key.factor
            )));
        }
        let dims: Vec<usize> = key.factor.iter().map(|&a| self.dims[a]).collect();
        Ok(Mechanism::new(key.mechanism, self.epsilon, &dims)?)
    }

    /// Whether the current round (batch) should close now that it has
    /// `accepted_in_current_round` accepted reports (reports whose task round is
    /// `state.round`).
    pub fn should_close(&self, state: &CollectionState, accepted_in_current_round: u64) -> bool {
        match (state.phase, state.round_quota) {
            (Phase::GraphConstruction | Phase::PairSampling, Some(q)) => {
                accepted_in_current_round >= q
            }
            _ => false,
        }
    }

    /// Closes the current round: PrivIncr pruning (and, after the last round, the phase-2
    /// plan), `auto`'s structure selection, or SamPrivSyn re-weighting. Deterministic given
    /// the tables (only tables of rounds ≤ the current round are read). Also the operator's
    /// "close round now". Errors: tables that do not fit their mechanisms.
    pub fn close_round(
        &self,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        match state.phase {
            Phase::GraphConstruction => self.close_phase1_round(state, tables),
            Phase::PairSampling => {
                state.pair_weights = self.samprivsyn_weights(state, tables)?;
                state.round += 1;
                Ok(Transition::Reweighted { batch: state.round })
            }
            _ => Ok(Transition::Nothing),
        }
    }

    fn close_phase1_round(
        &self,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        let (params, rounds, _) = self
            .privincr()
            .ok_or_else(|| EngineError::InvalidState("not a PrivIncr protocol".into()))?;
        let t = state.round;
        let ms = Measurements::filtered(self.epsilon, &self.dims, tables, |k| k.round <= t)?;
        let is_auto = matches!(self.protocol, Protocol::Auto(_));
        let mut pruned = Vec::new();
        if is_auto {
            pruned = self.auto_select(state, &ms);
        } else {
            for e in state.edges.iter_mut().filter(|e| e.active) {
                let Some(c) = ms.combined(&[e.a, e.b]) else {
                    continue;
                };
                let (ka, kb) = (self.dims[e.a], self.dims[e.b]);
                let mi = mutual_information(&norm_sub(&c.frequencies), ka, kb);
                let ell = relaxed_threshold(ka, kb, c.reports, params.phi, params.alpha);
                e.mi = Some(mi);
                e.ell = Some(ell);
                e.reports = c.reports;
                // Line 14 of Algorithm 1.
                if mi < ell {
                    e.active = false;
                    e.pruned_in = Some(t);
                    pruned.push((e.a, e.b));
                }
            }
        }
        if t + 1 < rounds {
            state.round += 1;
            return Ok(Transition::RoundClosed { round: t, pruned });
        }
        let plan = self.plan_phase2(state, &params);
        let factors = plan.factors.len();
        state.plan = Some(plan);
        state.phase = Phase::CliqueMeasurement;
        state.round = rounds;
        state.round_quota = None;
        Ok(Transition::EnteredCliqueMeasurement { pruned, factors })
    }

    /// Phase-1 MI matrix (nats) from the recorded edge states (0 where unknown).
    fn mi_matrix(&self, state: &CollectionState, use_score: bool) -> Vec<Vec<f64>> {
        let d = self.dims.len();
        let mut mi = vec![vec![0.0; d]; d];
        for e in &state.edges {
            let v = if use_score { e.score } else { e.mi }
                .unwrap_or(0.0)
                .max(0.0);
            mi[e.a][e.b] = v;
            mi[e.b][e.a] = v;
        }
        mi
    }

    /// The structure from the current active edges, and the phase-2 factors.
    fn plan_phase2(&self, state: &CollectionState, params: &PrivIncrParams) -> Phase2Plan {
        let is_auto = matches!(self.protocol, Protocol::Auto(_));
        let edges: BTreeSet<Edge> = state
            .edges
            .iter()
            .filter(|e| e.active)
            .map(|e| edge(e.a, e.b))
            .collect();
        let mi = self.mi_matrix(state, is_auto);
        let structure = build_structure(&self.dims, &edges, &mi, params.sigma);
        let mut scopes: Vec<Vec<usize>> = Vec::new();
        for c in &structure.conditionals {
            let s = c.scope();
            if !scopes.contains(&s) {
                scopes.push(s);
            }
        }
        let factors = if is_auto {
            // Every attribute alone too: the 1-way marginals are what every conditional is
            // fitted to, and a pair table marginalized to one attribute is |Ω_other| times
            // noisier than a direct 1-way report (OUE).
            for a in 0..self.dims.len() {
                if !scopes.contains(&vec![a]) {
                    scopes.push(vec![a]);
                }
            }
            // Expected total L1 error Σ_f cells_f·sqrt(V0_f/n_f) is minimized, under
            // Σ n_f = N₂, by n_f ∝ (cells_f·sqrt(V0_f))^{2/3}.
            scopes
                .into_iter()
                .map(|f| {
                    let mech = self.best_oracle(&f);
                    let dims: Vec<usize> = f.iter().map(|&a| self.dims[a]).collect();
                    let v0 = mech.approx_variance(self.epsilon, &dims);
                    let boost = if f.len() == 1 {
                        self.options
                            .auto_one_way_boost
                            .unwrap_or(AUTO_ONE_WAY_BOOST)
                    } else {
                        1.0
                    };
                    let w = boost * (self.cells(&f) as f64 * v0.sqrt()).powf(2.0 / 3.0);
                    PlannedFactor {
                        factor: f,
                        mechanism: mech,
                        weight: w,
                    }
                })
                .collect()
        } else {
            // PrivIncr: VOUE, users ∝ the factor's domain size (as line 5 of Algorithm 1).
            scopes
                .into_iter()
                .map(|f| PlannedFactor {
                    weight: self.cells(&f) as f64,
                    factor: f,
                    mechanism: MechanismKind::Oue,
                })
                .collect()
        };
        Phase2Plan { structure, factors }
    }

    /// `auto`'s noise-aware edge selection: significance test against LDP noise and sampling, noise-
    /// corrected MI, maximum spanning forest of the significant edges. Returns pruned edges.
    fn auto_select(&self, state: &mut CollectionState, ms: &Measurements) -> Vec<Edge> {
        let d = self.dims.len();
        let one: Vec<Vec<f64>> = (0..d)
            .map(|a| match ms.combined(&[a]) {
                Some(c) => norm_sub(&c.frequencies),
                None => vec![1.0 / self.dims[a] as f64; self.dims[a]],
            })
            .collect();
        let z_threshold = self.options.auto_z.unwrap_or(AUTO_Z);
        let mut candidates: Vec<(f64, usize)> = Vec::new();
        for (i, e) in state.edges.iter_mut().enumerate() {
            let Some(c) = ms.combined(&[e.a, e.b]) else {
                continue;
            };
            let (ka, kb) = (self.dims[e.a], self.dims[e.b]);
            let indep: Vec<f64> = (0..ka * kb)
                .map(|v| one[e.a][v / kb] * one[e.b][v % kb])
                .collect();
            // A cell's error has two parts: the randomizer's (the estimate's standard error,
            // over the coins for the reporting users) and sampling (which users were asked to
            // report this pair: a share f of n draws, finite-population corrected). At ε = 4
            // sampling is the larger part; leaving it out inflated X about 2.5-fold, so that
            // most independent pairs had z ≈ 3 and a few passed 6.
            // Both are evaluated at the independence fit (Pearson's form): variances
            // plugged in from the noisy cells themselves grow with upward noise, which
            // shrank X below df wherever noise exceeds the cell frequencies (Adult at 100k
            // users: most pairs had z < 0).
            let n = c.reports.max(1) as f64;
            let fpc = (1.0 - n / self.target_users.max(1) as f64).max(0.0);
            let null: Vec<f64> = indep.iter().map(|i| i.clamp(0.0, 1.0)).collect();
            let randomizer =
                match Mechanism::new(self.phase1_mechanism(&[e.a, e.b]), self.epsilon, &[ka, kb]) {
                    Ok(m) => m.frequency_variances(&null, c.reports.max(1)),
                    Err(_) => c.std_errors.iter().map(|s| s * s).collect(),
                };
            let x: f64 = c
                .frequencies
                .iter()
                .zip(&randomizer)
                .zip(&null)
                .map(|((f, r), i)| (f - i).powi(2) / (r + i * (1.0 - i) / n * fpc).max(1e-300))
                .sum();
            // The estimated cells sum to 1, so one degree of freedom less than cells; the
            // Wilson–Hilferty cube root makes a χ²(df) variable near standard normal even
            // for the few cells of small pairs, where (X − df)/sqrt(2 df) has a heavy tail.
            let df = (ka * kb - 1).max(1) as f64;
            let h = 2.0 / (9.0 * df);
            let z = ((x / df).cbrt() - (1.0 - h)) / h.sqrt();
            let mi = mutual_information(&norm_sub(&c.frequencies), ka, kb);
            // MI that noise alone produces around the independence fit: a seeded parametric
            // bootstrap (deterministic: the seed is the pair and round).
            let mut rng = ChaCha12Rng::seed_from_u64(
                ((e.a as u64) << 32) ^ (e.b as u64) ^ ((state.round as u64) << 48),
            );
            let reps = 16;
            let nulls: Vec<f64> = (0..reps)
                .map(|_| {
                    let noisy: Vec<f64> = (0..ka * kb)
                        .map(|v| indep[v] + c.std_errors[v] * standard_normal(&mut rng))
                        .collect();
                    mutual_information(&norm_sub(&noisy), ka, kb)
                })
                .collect();
            // Only the mean is used (as the noise bias of the MI score); significance comes
            // from the chi-square statistic, whose null distribution is known (a bootstrap
            // z from 16 replicates had false positives on the planted-structure test).
            let null = nulls.iter().sum::<f64>() / reps as f64;
            e.mi = Some(mi);
            e.score = Some(mi - null);
            e.z = Some(z);
            e.reports = c.reports;
            if z > z_threshold && mi - null > 0.0 {
                candidates.push((mi - null, i));
            }
        }
        // Maximum spanning forest (Kruskal) over significant edges by corrected MI.
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut comp: Vec<usize> = (0..d).collect();
        fn find(p: &mut [usize], x: usize) -> usize {
            let mut r = x;
            while p[r] != r {
                r = p[r];
            }
            p[x] = r;
            r
        }
        let mut keep = vec![false; state.edges.len()];
        for &(_, i) in &candidates {
            let (a, b) = (state.edges[i].a, state.edges[i].b);
            let (ra, rb) = (find(&mut comp, a), find(&mut comp, b));
            if ra != rb {
                comp[ra] = rb;
                keep[i] = true;
            }
        }
        // Grow the forest into a junction tree with small cliques (see [`AUTO_CLIQUE_TVD`]).
        let cap = self.auto_clique_cap(keep.iter().filter(|&&k| k).count());
        let mut chosen: BTreeSet<Edge> = state
            .edges
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(e, _)| edge(e.a, e.b))
            .collect();
        for &(_, i) in &candidates {
            if keep[i] {
                continue;
            }
            let e = edge(state.edges[i].a, state.edges[i].b);
            chosen.insert(e);
            let jt = super::graph::build_junction_tree(d, &chosen);
            let max_cells = jt
                .cliques
                .iter()
                .map(|c| c.iter().map(|&a| self.dims[a] as f64).product::<f64>())
                .fold(0.0, f64::max);
            if max_cells <= cap {
                keep[i] = true;
            } else {
                chosen.remove(&e);
            }
        }
        let mut pruned = Vec::new();
        for (i, e) in state.edges.iter_mut().enumerate() {
            if e.active && !keep[i] {
                e.active = false;
                e.pruned_in = Some(state.round);
                pruned.push((e.a, e.b));
            }
        }
        pruned
    }

    /// Largest clique (cells) `auto` accepts when growing the forest.
    fn auto_clique_cap(&self, forest_edges: usize) -> f64 {
        let c = self.options.auto_clique_tvd.unwrap_or(AUTO_CLIQUE_TVD);
        let share = self.options.auto_phase1_share.unwrap_or(AUTO_PHASE1_SHARE);
        let factors = (self.dims.len() + forest_edges).max(1) as f64;
        let n_f = (1.0 - share) * self.target_users as f64 / factors;
        let v0 = MechanismKind::choose(self.epsilon, 256).approx_variance(self.epsilon, &[256]);
        c * (n_f / v0).sqrt()
    }

    /// SamPrivSyn weights from the pooled pair tables (Kronecker inverse + Norm-Sub + MI),
    /// with the floor; pairs without reports keep the mean weight.
    fn samprivsyn_weights(
        &self,
        state: &CollectionState,
        tables: &Tables,
    ) -> Result<Vec<f64>, EngineError> {
        let ms = Measurements::new(self.epsilon, &self.dims, tables)?;
        let ps = pairs(self.dims.len());
        let mi: Vec<Option<f64>> = ps
            .iter()
            .map(|&(a, b)| {
                ms.combined_where(&[a, b], |k| {
                    k.mechanism == MechanismKind::GrrPair && k.factor.len() == 2
                })
                .map(|c| mutual_information(&norm_sub(&c.frequencies), self.dims[a], self.dims[b]))
            })
            .collect();
        let known: Vec<f64> = mi.iter().flatten().copied().collect();
        if known.is_empty() {
            return Ok(state.pair_weights.clone());
        }
        let mean = known.iter().sum::<f64>() / known.len() as f64;
        let floor = SAMPRIVSYN_WEIGHT_FLOOR * mean.max(1e-12);
        Ok(mi
            .iter()
            .map(|m| m.unwrap_or(mean).max(0.0) + floor)
            .collect())
    }

    /// Marks the state finalized (no more tasks).
    pub fn mark_finalized(&self, state: &mut CollectionState) {
        state.phase = Phase::Finalized;
        state.round_quota = None;
    }

    /// Pairs the model graph may keep: PrivIncr/NoIncremental's active (unpruned) edges,
    /// every pair for the other protocols (only measured pairs can score).
    fn model_candidates(&self, state: &CollectionState) -> Vec<Edge> {
        match &self.protocol {
            Protocol::Privincr(_) | Protocol::Noincremental(_) => state
                .edges
                .iter()
                .filter(|e| e.active)
                .map(|e| edge(e.a, e.b))
                .collect(),
            Protocol::Independence {} => Vec::new(),
            Protocol::Auto(_) | Protocol::Samprivsyn(_) => pairs(self.dims.len()),
        }
    }

    /// Builds the model from everything collected: every table becomes a measurement, the
    /// model graph keeps the candidate pairs with positive expected gain within the clique
    /// cap, and one graphical model is fitted to all measurements ([`super::estimate`]).
    /// SamPrivSyn with `samprivsyn_lasso` set keeps the paper's own estimator and data
    /// generation (eq. 7, eq. 11, Algorithm 2) for its synthetic rows.
    /// Deterministic given `(state, tables)`. Errors: tables that do not fit their
    /// mechanisms; [`EngineError::NoData`] when there are no reports at all.
    pub fn finalize(&self, state: &CollectionState, tables: &Tables) -> Result<Model, EngineError> {
        let ms =
            Measurements::new(self.epsilon, &self.dims, tables)?.with_population(self.target_users);
        if ms.items().is_empty() {
            return Err(EngineError::NoData);
        }
        let one_way = one_way_estimates(&ms);
        let gains: Vec<(Edge, PairGain)> = self
            .model_candidates(state)
            .into_iter()
            .filter_map(|(a, b)| pair_gain(&ms, &one_way, a, b).map(|g| ((a, b), g)))
            .collect();
        let cap = self.options.max_clique_cells.unwrap_or(MAX_CLIQUE_CELLS);
        let edges = select_model_graph(&self.dims, &gains, cap);
        let fitted = fit_model(&ms, &edges, &FitOptions::default())?;
        // Cliques are within the cap: one conditional per clique (no Algorithm 2 split).
        let structure = build_structure(&self.dims, &edges, &[], u64::MAX);
        let source = FittedJoint::new(ms, fitted);
        let gains = gains
            .into_iter()
            .map(|((a, b), g)| EdgeGain {
                a,
                b,
                observed_l1: g.observed_l1,
                noise_l1: g.noise_l1,
                kept: edges.contains(&(a, b)),
            })
            .collect();
        let model = match (&self.protocol, self.options.samprivsyn_lasso) {
            (Protocol::Samprivsyn(_), Some(lambda)) => {
                super::samprivsyn::build_model(self, source, lambda)?
            }
            _ => Model::graphical(
                self.protocol.name(),
                self.dims.clone(),
                state.edges.clone(),
                structure,
                source,
            ),
        };
        Ok(model.with_gains(gains))
    }
}

/// A standard normal draw (Box–Muller), for the deterministic noise bootstrap.
pub(crate) fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}
