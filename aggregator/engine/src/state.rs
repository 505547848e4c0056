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
//! - `auto` (DESIGN.md "Adaptive rounds"): a screening round ([`AUTO_PHASE1_SHARE`] of the
//!   users) measures, uniformly, every pair that could ever pay for its reports, with the
//!   lower-variance oracle; at its close the pairs are selected greedily by predicted 2-way
//!   error (estimated dependence against the phase-2 noise they bring and the users they
//!   take from the 1-ways), and phase 2 measures the selected pairs and every attribute
//!   alone, allocated to minimize that prediction. With too few users nothing is selected
//!   (or nothing is screened) and the result is the independence model.
//!
//! Every protocol finalizes the same way ([`Engine::finalize`]): every table is a
//! measurement, the model graph keeps the candidate pairs with positive expected gain within
//! the clique cap, and one graphical model is fitted to all measurements
//! ([`super::estimate`], [`super::pgm`]). The protocols differ in what they collect.

use std::collections::BTreeSet;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::{Mechanism, MechanismKind, norm_sub};
use ldpsyn::protocol::{CollectionConfig, PrivIncrParams, Protocol};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::EngineError;
use super::estimate::{
    MAX_CLIQUE_CELLS, PairGain, fit_model, largest_clique_cells, one_way_estimates, pair_gain,
    projected_noise_l1, select_model_graph,
};
use super::graph::{Edge, edge};
use super::info::{mutual_information, relaxed_threshold, tau};
use super::model::{EdgeGain, FittedJoint, Model};
use super::pgm::FitOptions;
use super::plan::{Structure, build_structure};
use super::tables::{Measurements, TableKey, Tables};

/// Share of the users `auto` spends on its screening round (every screened pair measured
/// alike); `omega` of the config is ignored by `auto`. Chosen by a sweep over adult,
/// nist-taxi, temporal-match2 and the built-in network at ε ∈ {1, 2, 4, 8}
/// (`benchmarks/sweeps/auto-screening-share.md`): shares 0.1–0.5 are within 1.5% of each
/// other on average, 0.3 among the best.
pub const AUTO_PHASE1_SHARE: f64 = 0.3;

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
    /// `auto`: estimated dependence `D̂` (L1 distance from independence, debiased for the
    /// screening noise; see [`PairGain`]).
    pub score: Option<f64>,
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

    /// Whether `auto` screens pair `(a, b)`: only if measuring it with the users of a
    /// tree-sized phase 2 (`N₂/d` reports: about `d − 1` pairs and `d` 1-ways share it) could
    /// give less L1 noise than the largest dependence any pair can show (2: an L1 distance
    /// between two distributions). Other pairs can never pay for their reports.
    fn auto_screens(&self, a: usize, b: usize) -> bool {
        let (ka, kb) = (self.dims[a], self.dims[b]);
        let uniform = vec![1.0 / (ka * kb) as f64; ka * kb];
        let n_ref = self.auto_phase2_users() / self.dims.len() as f64;
        self.expected_noise_l1(&[a, b], &uniform, n_ref) < 2.0
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
        let is_auto = matches!(self.protocol, Protocol::Auto(_));
        if is_auto && !pairs(d).into_iter().any(|(a, b)| self.auto_screens(a, b)) {
            // No pair could ever pay for its reports: the independence model, at no cost.
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
                    .map(|(a, b)| {
                        let screened = !is_auto || self.auto_screens(a, b);
                        EdgeState {
                            a,
                            b,
                            active: screened,
                            pruned_in: (!screened).then_some(0),
                            mi: None,
                            tau: tau(self.dims[a], self.dims[b], p.phi),
                            ell: None,
                            reports: 0,
                            score: None,
                        }
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
                // Line 5 of Algorithm 1: Ñ_{t,e} ∝ |Ω_i|·|Ω_j|; `auto` screens every pair
                // alike (each needs its own dependence estimate).
                let i = if matches!(self.protocol, Protocol::Auto(_)) {
                    rng.random_range(0..active.len())
                } else {
                    draw_weighted(
                        active
                            .iter()
                            .map(|e| (self.dims[e.a] * self.dims[e.b]) as f64),
                        rng,
                    )
                };
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
        let mut auto_factors = None;
        if is_auto {
            let (p, f) = self.auto_select(state, &ms);
            pruned = p;
            auto_factors = Some(f);
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
        let mut plan = self.plan_phase2(state, &params);
        if let Some(f) = auto_factors {
            plan.factors = f;
        }
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
        // PrivIncr: VOUE, users ∝ the factor's domain size (as line 5 of Algorithm 1); `auto`
        // replaces these with its own allocation ([`Engine::auto_select`]).
        let factors = scopes
            .into_iter()
            .map(|f| PlannedFactor {
                weight: self.cells(&f) as f64,
                factor: f,
                mechanism: MechanismKind::Oue,
            })
            .collect();
        Phase2Plan { structure, factors }
    }

    /// Standard error of every cell of factor `f` measured by `n` reports with its best
    /// oracle, when its marginal is `at` (one variance model: randomizer + sampling).
    fn cell_std_errors(&self, f: &[usize], at: &[f64], n: f64) -> Vec<f64> {
        let dims: Vec<usize> = f.iter().map(|&a| self.dims[a]).collect();
        let n = n.max(1.0);
        let Ok(m) = Mechanism::new(self.best_oracle(f), self.epsilon, &dims) else {
            return vec![f64::INFINITY; at.len()];
        };
        // Exact randomizer variances are linear in 1/n: evaluate at one report and scale.
        m.frequency_variances(at, 1)
            .iter()
            .zip(at)
            .map(|(r, &x)| {
                let x = x.clamp(0.0, 1.0);
                ((r.max(0.0) + x * (1.0 - x)) / n).sqrt()
            })
            .collect()
    }

    /// Expected L1 error `√(2/π)·Σ_cells σ` of factor `f` measured by `n` reports with its
    /// best oracle, when its marginal is `at` (before any projection).
    fn expected_noise_l1(&self, f: &[usize], at: &[f64], n: f64) -> f64 {
        (2.0 / std::f64::consts::PI).sqrt() * self.cell_std_errors(f, at, n).iter().sum::<f64>()
    }

    /// `auto`'s selection after its screening round (DESIGN.md "Adaptive rounds"; PPSyn
    /// Alg. 2's contribution per budget). Each screened pair's dependence `D̂` (its L1
    /// distance from independence, debiased for the screening noise: [`PairGain`]) is
    /// estimated from the screening tables. A factor f measured by n reports has expected L1 noise `K_f/√n`
    /// (randomizer and sampling variances are both ∝ 1/n; `K_f` at the screening estimate,
    /// for a pair scaled by the share of noise its simplex projection keeps at a tree-sized
    /// allocation `N₂/d`, [`projected_noise_l1`]).
    /// Phase 2 measures every attribute alone and the selected pairs S; its 2-way error is
    /// predicted as `Σ_{p∉S} D̂_p + Σ_f w_f K_f/√n_f`, with `w_f` the number of 2-way
    /// marginals a factor's error enters (1 for a pair, `d − 1` for a 1-way). Under
    /// `Σ n_f = N₂` the allocation `n_f ∝ a_f = (w_f K_f)^{2/3}` minimizes the noise part to
    /// `A^{3/2}/√N₂` with `A = Σ_f a_f`. Pairs are added greedily, each time the one that
    /// lowers the prediction most, within the clique cap, until none does. With too few users
    /// nothing is selected and `auto` is the independence model. Returns the pairs not
    /// selected (pruned) and the phase-2 factors with their task weights `a_f`.
    fn auto_select(
        &self,
        state: &mut CollectionState,
        ms: &Measurements,
    ) -> (Vec<Edge>, Vec<PlannedFactor>) {
        let d = self.dims.len();
        let one = one_way_estimates(ms);
        let n2 = self.auto_phase2_users().max(1.0);
        let allocation = |f: &[usize], at: &[f64], w: f64| {
            (w * self.expected_noise_l1(f, at, 1.0)).powf(2.0 / 3.0)
        };
        let mut factors: Vec<PlannedFactor> = (0..d)
            .map(|a| PlannedFactor {
                factor: vec![a],
                mechanism: self.best_oracle(&[a]),
                weight: allocation(&[a], &one[a], (d - 1).max(1) as f64),
            })
            .collect();
        // (pair index, D̂, a_p) of every screened pair with positive dependence.
        let mut candidates: Vec<(usize, f64, f64)> = Vec::new();
        for (i, e) in state.edges.iter_mut().enumerate() {
            if !e.active {
                continue;
            }
            let Some(g) = pair_gain(ms, &one, e.a, e.b) else {
                continue;
            };
            e.reports = ms.combined(&[e.a, e.b]).map_or(0, |c| c.reports);
            e.mi = Some(mutual_information(
                &g.projected,
                self.dims[e.a],
                self.dims[e.b],
            ));
            let dependence = g.dependence;
            e.score = Some(dependence);
            if dependence > 0.0 {
                // Noise scale K at the screening estimate, times the share of it that the
                // simplex projection leaves at a tree-sized phase-2 allocation (sparse
                // tables lose much of their noise to it).
                let f = [e.a, e.b];
                let at = &g.projected;
                let k = self.expected_noise_l1(&f, at, 1.0);
                let n_ref = (n2 / d as f64).max(1.0);
                let sigma = self.cell_std_errors(&f, at, n_ref);
                let raw = (2.0 / std::f64::consts::PI).sqrt() * sigma.iter().sum::<f64>();
                let kept = projected_noise_l1(at, &sigma, i as u64);
                let shrink = if raw > 0.0 {
                    (kept / raw).min(1.0)
                } else {
                    1.0
                };
                candidates.push((i, dependence, (shrink * k).powf(2.0 / 3.0)));
            }
        }
        let cap = self.options.max_clique_cells.unwrap_or(MAX_CLIQUE_CELLS);
        let mut a_total: f64 = factors.iter().map(|f| f.weight).sum();
        let noise = |a: f64| a.powf(1.5) / n2.sqrt();
        let mut graph = BTreeSet::new();
        let mut keep = BTreeSet::new();
        loop {
            // The candidate whose addition lowers the predicted error most (ties: index).
            let best = candidates
                .iter()
                .enumerate()
                .map(|(j, &(i, dep, a))| (dep - (noise(a_total + a) - noise(a_total)), j, i))
                .max_by(|x, y| x.0.total_cmp(&y.0).then(y.2.cmp(&x.2)));
            let Some((delta, j, _)) = best else { break };
            if delta <= 0.0 {
                break;
            }
            let (i, _, a) = candidates.remove(j);
            let e = edge(state.edges[i].a, state.edges[i].b);
            graph.insert(e);
            if largest_clique_cells(&self.dims, &graph) > cap {
                graph.remove(&e);
                continue;
            }
            keep.insert(i);
            a_total += a;
            factors.push(PlannedFactor {
                factor: vec![e.0, e.1],
                mechanism: self.best_oracle(&[e.0, e.1]),
                weight: a,
            });
        }
        let mut pruned = Vec::new();
        for (i, e) in state.edges.iter_mut().enumerate() {
            if e.active && !keep.contains(&i) {
                e.active = false;
                e.pruned_in = Some(state.round);
                pruned.push((e.a, e.b));
            }
        }
        (pruned, factors)
    }

    /// Users `auto` expects in phase 2.
    fn auto_phase2_users(&self) -> f64 {
        let share = self.options.auto_phase1_share.unwrap_or(AUTO_PHASE1_SHARE);
        (1.0 - share) * self.target_users as f64
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
                dependence: g.dependence,
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
