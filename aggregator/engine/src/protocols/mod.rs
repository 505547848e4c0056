//! Protocols as plug-ins: each protocol is one module behind [`CollectionProtocol`]: its
//! initial state, how it draws a task, which round a report's table belongs to, how it
//! closes a round, how it lays out its rounds, which pairs its final model graph may keep,
//! and (SamPrivSyn with its paper's estimator only) its own final model. A protocol sees its
//! collection through a [`context::Context`], never the engine; [`registry`] maps a config's
//! protocol to its rules, once, when [`crate::engine::Engine`] is built, and every engine call
//! delegates to them.
//!
//! - [`privincr`]: PrivIncr and NoIncremental (EDBT 2023, Algorithms 1–2).
//! - [`auto`]: 1-ways, a screening round of pairs binned by their estimated mass, then
//!   selection by predicted error (docs/design.md "Adaptive rounds").
//! - [`samprivsyn`]: SamPrivSyn's MI-weighted pair sampling (Sci China Inf Sci 2023,
//!   Algorithm 1).
//! - [`independence`]: every attribute alone.
//! - [`vertical`]: parties' per-attribute GRR reports joined by record id (VertiMRF), and
//!   under `sketch+locmrf` the cross-party tables of the parties' sketch reports
//!   ([`cross_party`]).
//!
//! The two-phase machinery PrivIncr and `auto` share (the phase-1 state, the phase-2 plan
//! and its tasks) lives here, the layout of their rounds in [`rounds`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use ldpsyn::mechanism::{Mechanism, MechanismError};
use ldpsyn::wire::PrivIncrParams;

use crate::EngineError;
use crate::domain::binned::BinnedFactor;
use crate::domain::key::TableKey;
use crate::domain::space::UNRESOLVED_BIN_Z;
use crate::domain::task::TaskSpec;
use crate::fit::joint::FittedJoint;
use crate::graph::{Edge, EdgeState, edge};
use crate::measure::tables::{Measurements, Tables};
use crate::numeric::info::tau;
use crate::protocols::context::Context;
use crate::protocols::rounds::RoundPlan;
use crate::select::gain::{Null, NullOneWays, PairGain, best_pair_gain};
use crate::select::structure::{Structure, build_structure};
use crate::state::{
    AdaptedBins, CollectionState, PairRounds, Phase, Phase2Plan, PlannedFactor, ProtocolState,
    Transition,
};
use crate::synth::model::Model;

pub(crate) mod auto;
pub(crate) mod context;
pub mod cross_party;
pub(crate) mod independence;
pub(crate) mod privincr;
pub(crate) mod registry;
pub(crate) mod rounds;
pub(crate) mod samprivsyn;
pub mod vertical;

/// The device protocols' gain margin ([`CollectionProtocol::gain_margin`]): 0, a pair
/// enters the model graph on its expected gain itself (`benchmarks/sweeps/gain-margin.md`).
pub const DEVICE_GAIN_MARGIN: f64 = 0.0;

/// One protocol's collection rules (module docs). Implementations are stateless beyond their
/// parameters: everything a collection has decided lives in its [`CollectionState`].
pub trait CollectionProtocol: Send + Sync + Debug {
    /// The state of a new collection.
    fn initial_state(&self, ctx: &Context) -> CollectionState;

    /// The distribution tasks are drawn from in `state` (working codes): a pure function of
    /// the state, never of anyone's data. Errors: [`EngineError::Finalized`] once
    /// finalized, [`EngineError::InvalidState`] for a state the protocol cannot be in.
    fn task_choices(
        &self,
        ctx: &Context,
        state: &CollectionState,
    ) -> Result<TaskChoices, EngineError>;

    /// The table round (stratum of the population) a report answering a task of `round` is
    /// counted in: by default its own round. Protocols whose mechanism and ε never change
    /// may pool rounds into one table per factor (eq. 5 of PrivIncr); the final fit treats
    /// the table rounds as strata ([`crate::measure::drift`]).
    fn stratum(&self, _ctx: &Context, round: u32) -> u32 {
        round
    }

    /// Closes the current round (deterministic given the tables of rounds ≤ the current
    /// one). Errors: tables that do not fit their mechanisms.
    fn close_round(
        &self,
        ctx: &Context,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError>;

    /// Pairs the final model graph may keep (only measured pairs can score).
    fn model_candidates(&self, ctx: &Context, state: &CollectionState) -> Vec<Edge>;

    /// The collection's rounds in `state`, in order: closed, open or planned, what each
    /// measures and the pairs its close dropped ([`rounds::two_phase_rounds`]). By default
    /// none: only protocols that run in rounds of their own describe them (SamPrivSyn's
    /// batches are counted in [`CollectionState::round`]).
    fn rounds(&self, _ctx: &Context, _state: &CollectionState) -> Vec<RoundPlan> {
        Vec::new()
    }

    /// The mechanism of a table over the (binned) domain sizes `dims` of its factor: by
    /// default its kind at the collection's ε. Errors: an invalid mechanism.
    fn table_mechanism(
        &self,
        ctx: &Context,
        key: &TableKey,
        dims: &[usize],
    ) -> Result<Mechanism, MechanismError> {
        Mechanism::new(key.mechanism, ctx.epsilon(), dims)
    }

    /// Every table (of rounds for which `keep` holds) as a measurement in the working space
    /// of `ctx`, each under its [`CollectionProtocol::table_mechanism`]
    /// ([`Measurements::filtered_in`]). Errors: a table that does not fit its mechanism.
    fn measurements(
        &self,
        ctx: &Context,
        tables: &Tables,
        keep: &dyn Fn(&TableKey) -> bool,
    ) -> Result<Measurements, EngineError> {
        Ok(Measurements::filtered_in(
            &|key: &TableKey, dims: &[usize]| self.table_mechanism(ctx, key, dims),
            ctx.space(),
            tables,
            keep,
        )?)
    }

    /// The evidence for keeping pair `(a, b)` in the final model graph of a collection in
    /// `state`, from the measurements and their 1-ways (`nulls`): by default
    /// [`best_pair_gain`] over every table (1-ways and pairs from different users), against
    /// the collection's 1-ways ([`Null::Collection`]; judging against the 1-ways of the
    /// pair's own rounds, as `auto` does, cost `noincremental` 7% on nist-taxi at ε = 8,
    /// `benchmarks/sweeps/arrival-order.md`).
    fn pair_gain(
        &self,
        _state: &CollectionState,
        nulls: &NullOneWays<'_>,
        a: usize,
        b: usize,
    ) -> Option<PairGain> {
        best_pair_gain(nulls, a, b, Null::Collection, |_| true).map(|(g, _)| g)
    }

    /// Adjusts the model graph's candidate gains jointly, once each pair's own is known
    /// ([`CollectionProtocol::pair_gain`]): by default nothing.
    fn pool_gains(
        &self,
        _ctx: &Context,
        _state: &CollectionState,
        _gains: &mut [(Edge, PairGain)],
    ) {
    }

    /// Standard deviations of its dependence estimate ([`PairGain::dependence_sd`]) a
    /// pair's expected gain must exceed to enter the model graph
    /// ([`PairGain::cautious_gain`]): by default [`DEVICE_GAIN_MARGIN`]. Device
    /// protocols measure pairs they screened or sampled; a margin there dropped pairs that
    /// are individually insignificant but collectively useful (nist-taxi, temporal-match2:
    /// `benchmarks/sweeps/gain-margin.md`).
    fn gain_margin(&self) -> f64 {
        DEVICE_GAIN_MARGIN
    }

    /// The fit's cap on how much more precise a party's local-model measurement may be than
    /// the LDP tables ([`crate::fit::observe::LOCAL_PRECISION_RATIO`]); only vertical
    /// collections with local models have any.
    fn local_precision_ratio(&self) -> f64 {
        crate::fit::observe::LOCAL_PRECISION_RATIO
    }

    /// Whether every table counts reports of the same records (a vertical collection), so
    /// that overlapping tables are one estimate rather than independent ones (standard
    /// errors: [`crate::fit::joint::FittedJoint::with_shared_records`]). By default `false`: each
    /// device report is in one table.
    fn tables_share_records(&self) -> bool {
        false
    }

    /// How many people reported to the measurements `ms` (the clique cap's bound): by
    /// default one report per person and table when tables do not share records (the sum of
    /// the tables' reports), else the largest table's reports.
    fn reporting_people(&self, ms: &Measurements) -> u64 {
        let reports = ms.items().iter().map(|m| m.estimate.n);
        if self.tables_share_records() {
            reports.max().unwrap_or(0)
        } else {
            reports.sum()
        }
    }

    /// Whether the final fit observes `key`'s table once the model graph `edges` is chosen:
    /// by default every table (each holds reports of its own users).
    fn fit_table(&self, _key: &TableKey, _edges: &BTreeSet<Edge>) -> bool {
        true
    }

    /// The final model from the graphical model fitted to every measurement: by default the
    /// fit itself, sampled through the conditionals of `structure`.
    /// Errors: a protocol's own estimator failing.
    fn final_model(
        &self,
        ctx: &Context,
        state: &CollectionState,
        structure: Structure,
        source: FittedJoint,
    ) -> Result<Model, EngineError> {
        Ok(Model::graphical(
            ctx.protocol().name(),
            ctx.domain().clone(),
            state.edges().to_vec(),
            structure,
            source,
        ))
    }
}

/// Every pair `(a, b)`, `a < b`, lexicographic.
pub(crate) fn pairs(d: usize) -> Vec<Edge> {
    let mut v = Vec::new();
    for a in 0..d {
        for b in a + 1..d {
            v.push((a, b));
        }
    }
    v
}

/// The tasks of one state and how likely each is: uniform, or `∝ weights` (≥ 0, not all 0).
/// Built once per state, drawn from many times ([`crate::engine::TaskSampler`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskChoices {
    /// The tasks (working codes).
    pub tasks: Vec<TaskSpec>,
    /// Their weights; `None`: uniform.
    pub weights: Option<Vec<f64>>,
    /// Share of the 1-ways of `bins: "auto"` attributes measured in sub-bins; `None`: the
    /// engine's ([`crate::domain::task::SUB_BIN_ONE_WAY_SHARE`]).
    pub sub_bin_share: Option<f64>,
}

/// A state with no round structure: every task is one attribute.
pub(crate) fn one_way_state(ctx: &Context) -> CollectionState {
    CollectionState {
        phase: Phase::OneWay,
        round: 0,
        round_quota: None,
        working_bins: Default::default(),
        protocol: ProtocolState::new(ctx.protocol(), PairRounds::default(), Vec::new()),
    }
}

/// Every attribute alone, uniformly, each with its lower-variance oracle.
pub(crate) fn one_way_choices(ctx: &Context, state: &CollectionState) -> TaskChoices {
    TaskChoices {
        tasks: (0..ctx.dims().len())
            .map(|a| TaskSpec {
                round: state.round,
                factor: vec![a],
                mechanism: ctx.best_oracle(BinnedFactor::full(&[a])),
                bins: vec![],
            })
            .collect(),
        weights: None,
        sub_bin_share: None,
    }
}

/// The tasks of the phases every protocol may be in besides its own: finalized (error),
/// 1-ways, and a phase-2 plan's factors `∝` their weights. `None` for the phase-1 and
/// pair-sampling phases, which the protocol draws itself.
pub(crate) fn common_choices(
    ctx: &Context,
    state: &CollectionState,
) -> Option<Result<TaskChoices, EngineError>> {
    match state.phase {
        Phase::Finalized => Some(Err(EngineError::Finalized)),
        Phase::OneWay => Some(Ok(one_way_choices(ctx, state))),
        Phase::CliqueMeasurement => Some((|| {
            let plan = state
                .plan()
                .ok_or_else(|| EngineError::InvalidState("phase 2 without a plan".into()))?;
            if plan.factors.is_empty() {
                return Ok(one_way_choices(ctx, state));
            }
            Ok(TaskChoices {
                tasks: plan
                    .factors
                    .iter()
                    .map(|f| TaskSpec {
                        round: state.round,
                        factor: f.factor.clone(),
                        mechanism: f.mechanism,
                        bins: f.bins.clone(),
                    })
                    .collect(),
                weights: Some(plan.factors.iter().map(|f| f.weight).collect()),
                sub_bin_share: None,
            })
        })()),
        Phase::GraphConstruction | Phase::PairSampling => None,
    }
}

/// Phase 1 of a two-phase protocol: every pair for which `screened` gives bin maps
/// (`Some(vec![])`: full resolution) is active and measured under them, the others start
/// pruned; rounds of `⌊share·N/rounds⌋` accepted reports (at least one, so a round can
/// close).
pub(crate) fn graph_state(
    ctx: &Context,
    params: &PrivIncrParams,
    rounds: u32,
    share: f64,
    screened: impl Fn(usize, usize) -> Option<Vec<Vec<u32>>>,
) -> CollectionState {
    let dims = ctx.dims();
    let edges = pairs(dims.len())
        .into_iter()
        .map(|(a, b)| {
            let bins = screened(a, b);
            let active = bins.is_some();
            EdgeState {
                a,
                b,
                active,
                pruned_in: (!active).then_some(0),
                mi: None,
                tau: tau(dims[a], dims[b], params.phi),
                ell: None,
                reports: 0,
                score: None,
                bins: bins.unwrap_or_default(),
            }
        })
        .collect();
    CollectionState {
        phase: Phase::GraphConstruction,
        round: 0,
        round_quota: Some(round_quota(ctx, share, rounds)),
        working_bins: Default::default(),
        protocol: ProtocolState::new(
            ctx.protocol(),
            PairRounds {
                edges,
                plan: None,
                first_round: 0,
            },
            Vec::new(),
        ),
    }
}

/// Working bins after a round 0 (`auto`'s, or PrivIncr's numeric one), from its
/// measurements `ms` (in the schema's working space): each attribute with working bins gets
/// its runs of unresolved bins merged ([`crate::domain::space::Space::merged_unresolved_cuts`]: a
/// run stays apart once its round-0 mass reaches [`UNRESOLVED_BIN_Z`] standard errors of a
/// bin estimated by `N/d` reports) and the point masses its sub-bin estimate shows as bins
/// of their own ([`crate::domain::space::Space::point_masses`], judged on the schema's bins). An
/// attribute without sub-bin 1-ways on the engine's grid, with nothing merged and no point
/// mass found, or whose new bins would need more cuts than a pair's task carries per
/// attribute ([`crate::domain::space::MAX_ATTRIBUTE_CUTS`]), is left as the schema has it. Round
/// 0's working-bin 1-ways read as finer or coarser tables in the new bins, its sub-bin ones
/// as finer tables, so nothing measured is lost.
pub(crate) fn adapted_working_bins(
    ctx: &Context,
    ms: &Measurements,
) -> BTreeMap<usize, AdaptedBins> {
    let mut space = ctx.space().clone();
    let mut adapted = BTreeMap::new();
    let d = ctx.dims().len();
    // Reports of a 1-way when every user reports one attribute: the scale of the estimates
    // the bins will get (both variance terms ∝ 1/n).
    let n_ref = ctx.target_users() as f64 / d.max(1) as f64;
    let z = ctx
        .options()
        .unresolved_bin_z
        .unwrap_or(UNRESOLVED_BIN_Z)
        .max(0.0);
    for a in 0..d {
        let sub_bins = space.sub_bin_cuts(a, ctx.sub_bins_per_bin());
        let Some((cuts, x, se)) = ms.sub_bin_distribution(a) else {
            continue;
        };
        if cuts != sub_bins {
            continue;
        }
        // Round 0's working-bin estimate, its standard errors scaled to `n_ref` reports.
        let merged = ms.combined(&[a]).filter(|_| z > 0.0).and_then(|c| {
            let scale = (c.reports as f64 / n_ref).sqrt();
            let resolution: Vec<f64> = c.std_errors.iter().map(|s| z * s * scale).collect();
            space.merged_unresolved_cuts(a, &c.frequencies, &resolution)
        });
        let points = space.point_masses(a, &sub_bins, &x, &se);
        let cuts = space.with_point_cuts(a, merged.as_deref().unwrap_or(space.cuts(a)), &points);
        if cuts == space.cuts(a) {
            continue;
        }
        let points: Vec<u32> = points.iter().map(|r| r.start).collect();
        // Checked as `Engine::at` will apply them, one attribute after another.
        if let Ok(next) = space.with_adapted_cuts(a, cuts.clone(), sub_bins.clone()) {
            space = next.with_point_mass_codes(a, points.clone());
            adapted.insert(
                a,
                AdaptedBins {
                    cuts,
                    sub_bins,
                    points: Some(points),
                },
            );
        }
    }
    adapted
}

/// Share of the users PrivIncr's numeric round 0 (and SamPrivSyn throughout) spends on the
/// `bins: "auto"` attributes alone: as many reports per such attribute as `auto`'s round 0
/// gives every attribute ([`auto::AUTO_ROUND0_SHARE`] / d), so `r` such attributes of `d`
/// take `AUTO_ROUND0_SHARE · r / d`; 0 without one, or with a single attribute.
pub(crate) fn numeric_round0_share(ctx: &Context) -> f64 {
    let d = ctx.dims().len();
    if d < 2 {
        return 0.0;
    }
    let binned = (0..d).filter(|&a| !ctx.space().cuts(a).is_empty()).count();
    auto::AUTO_ROUND0_SHARE * binned as f64 / d as f64
}

/// The 1-ways of the `bins: "auto"` attributes, uniformly, every one measured in sub-bins
/// of its working bins (the numeric round 0's tasks, and SamPrivSyn's 1-way tasks).
pub(crate) fn binned_one_way_choices(ctx: &Context, state: &CollectionState) -> TaskChoices {
    let mut choices = one_way_choices(ctx, state);
    choices
        .tasks
        .retain(|t| !ctx.space().cuts(t.factor[0]).is_empty());
    TaskChoices {
        // Later rounds measure the bins' totals (in pairs); this round, the shape within.
        sub_bin_share: Some(1.0),
        ..choices
    }
}

/// Accepted reports per round when `rounds` rounds share `share` of the target users:
/// `⌊share·N/rounds⌋`, at least one so that a round can close.
pub(crate) fn round_quota(ctx: &Context, share: f64, rounds: u32) -> u64 {
    ((share * ctx.target_users() as f64 / rounds as f64).floor() as u64).max(1)
}

/// The active edges of a phase-1 state.
pub(crate) fn active_edges(state: &CollectionState) -> Vec<&EdgeState> {
    state.edges().iter().filter(|e| e.active).collect()
}

/// The structure of the active edges: junction tree and conditionals (Algorithm 2 of
/// PrivIncr above `sigma` cells, mRMR on the recorded MI, or on `auto`'s dependence scores
/// when `use_score`).
pub(crate) fn plan_structure(
    ctx: &Context,
    state: &CollectionState,
    sigma: u64,
    use_score: bool,
) -> Structure {
    let d = ctx.dims().len();
    let edges: BTreeSet<Edge> = state
        .edges()
        .iter()
        .filter(|e| e.active)
        .map(|e| edge(e.a, e.b))
        .collect();
    let mut mi = vec![vec![0.0; d]; d];
    for e in state.edges() {
        let v = if use_score { e.score } else { e.mi }
            .unwrap_or(0.0)
            .max(0.0);
        mi[e.a][e.b] = v;
        mi[e.b][e.a] = v;
    }
    build_structure(ctx.domain(), &edges, &mi, sigma)
}

/// Ends a phase-1 round: the next round opens while `state.round + 1 < rounds`; after the
/// last one the phase-2 `plan` (built from the state after pruning) starts, as round
/// `rounds`, with no quota.
pub(crate) fn end_phase1_round(
    state: &mut CollectionState,
    rounds: u32,
    pruned: Vec<Edge>,
    plan: impl FnOnce(&CollectionState) -> Vec<PlannedFactor>,
    structure: impl FnOnce(&CollectionState) -> Structure,
) -> Transition {
    let t = state.round;
    if t + 1 < rounds {
        state.round += 1;
        return Transition::RoundClosed { round: t, pruned };
    }
    let structure = structure(state);
    let factors = plan(state);
    let count = factors.len();
    if let Some(r) = state.pair_rounds_mut() {
        r.plan = Some(Phase2Plan { structure, factors });
    }
    state.phase = Phase::CliqueMeasurement;
    state.round = rounds;
    state.round_quota = None;
    Transition::EnteredCliqueMeasurement {
        pruned,
        factors: count,
    }
}

/// The factors of a structure's conditionals (each scope once), for PrivIncr's phase 2.
pub(crate) fn conditional_scopes(structure: &Structure) -> Vec<Vec<usize>> {
    let mut scopes: Vec<Vec<usize>> = Vec::new();
    for c in &structure.conditionals {
        let s = c.scope();
        if !scopes.contains(&s) {
            scopes.push(s);
        }
    }
    scopes
}

/// PrivIncr-family parameters validation shared by privincr, noincremental and auto.
pub(crate) fn check_privincr(p: &PrivIncrParams) -> Result<(), EngineError> {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use ldpsyn::Epsilon;
    use ldpsyn::mechanism::{MechanismKind, SufficientStatistics};
    use ldpsyn::wire::{PrivIncrParams, Protocol, SamPrivSynParams};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha12Rng;

    use super::*;
    use crate::engine::Engine;
    use crate::protocols::rounds::{RoundKind, RoundState};
    use crate::state::EngineOptions;

    /// Three attributes of 3 values: 0 and 1 equal for 90% of people, 2 independent.
    fn people(n: usize, seed: u64) -> Vec<[u32; 3]> {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let a = rng.random_range(0..3u32);
                let b = if rng.random_bool(0.9) {
                    a
                } else {
                    rng.random_range(0..3)
                };
                [a, b, rng.random_range(0..3)]
            })
            .collect()
    }

    fn engine(protocol: Protocol, n: u64) -> Engine {
        engine_with(protocol, n, EngineOptions::default())
    }

    /// As [`engine`] with these engine options.
    fn engine_with(protocol: Protocol, n: u64, options: EngineOptions) -> Engine {
        Engine::from_parts(
            vec![3, 3, 3],
            Epsilon::new(4.0).unwrap(),
            n,
            protocol,
            options,
        )
        .unwrap()
    }

    /// Every person reports one task of the current state.
    fn collect(e: &Engine, state: &CollectionState, who: &[[u32; 3]], seed: u64) -> Tables {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let mut tables = Tables::new();
        for p in who {
            let task = e.draw_task(state, &mut rng).unwrap();
            let key = e.table_key(&task);
            let m = e.mechanism(&key).unwrap();
            let codes: Vec<u32> = task.codes(p).collect();
            let report = m.randomize(&codes, &mut rng).unwrap();
            let stats = tables
                .entry(key)
                .or_insert_with(|| SufficientStatistics::new(&m));
            m.accumulate(&report, stats).unwrap();
        }
        tables
    }

    #[test]
    fn privincr_prunes_below_ell_and_plans_phase_two() {
        let params = PrivIncrParams {
            rounds: 2,
            phi: 0.9,
            ..PrivIncrParams::default()
        };
        let e = engine(Protocol::Privincr(params), 60_000);
        let mut state = e.initial_state();
        assert_eq!(state.phase, Phase::GraphConstruction);
        let who = people(15_000, 1);
        let tables = collect(&e, &state, &who, 2);
        let t = e.close_round(&mut state, &tables).unwrap();
        // τ = 0.81 and ΔI ≈ 0.5 at 5,000 reports a pair: ℓ ≈ 0.3. The dependent pair
        // (MI ≈ 0.75) stays; the independent ones (MI ≈ 0) are pruned.
        let Transition::RoundClosed { round: 0, pruned } = t else {
            panic!("{t:?}")
        };
        assert!(!pruned.contains(&(0, 1)), "{pruned:?}");
        assert!(
            pruned.contains(&(0, 2)) && pruned.contains(&(1, 2)),
            "{pruned:?}"
        );
        let t = e.close_round(&mut state, &tables).unwrap();
        assert!(
            matches!(t, Transition::EnteredCliqueMeasurement { .. }),
            "{t:?}"
        );
        let plan = state.plan().unwrap();
        assert!(
            plan.factors
                .iter()
                .all(|f| f.mechanism == MechanismKind::Oue)
        );
        assert!(plan.factors.iter().any(|f| f.factor == vec![0, 1]));
        assert_eq!(state.round, 2);
        assert_eq!(state.round_quota, None);
    }

    /// The pairs of `state`'s phase-2 plan, and how many 1-ways it measures.
    fn planned(state: &CollectionState) -> (Vec<Vec<usize>>, usize) {
        let plan = state.plan().unwrap();
        let pairs = plan
            .factors
            .iter()
            .map(|f| f.factor.clone())
            .filter(|f| f.len() == 2)
            .collect();
        let ones = plan.factors.iter().filter(|f| f.factor.len() == 1).count();
        (pairs, ones)
    }

    #[test]
    fn auto_with_too_few_users_is_the_independence_model() {
        let e = engine(Protocol::Auto(PrivIncrParams::default()), 3);
        let state = e.initial_state();
        assert_eq!(state.phase, Phase::OneWay);
        assert!(state.edges().is_empty());
        // With many users: round 0 measures every attribute alone, round 1 screens every
        // pair, and only the dependent pair is selected.
        let e = engine(Protocol::Auto(PrivIncrParams::default()), 50_000);
        let mut state = e.initial_state();
        assert_eq!((state.phase, state.round), (Phase::GraphConstruction, 0));
        assert!(state.edges().is_empty());
        assert_eq!(state.round_quota, Some(10_000));
        let mut tables = collect(&e, &state, &people(10_000, 3), 4);
        assert!(tables.keys().all(|k| k.factor.len() == 1 && k.round == 0));
        e.close_round(&mut state, &tables).unwrap();
        assert_eq!((state.phase, state.round), (Phase::GraphConstruction, 1));
        assert_eq!(active_edges(&state).len(), 3);
        // Three attributes of 3 values at ε = 4: one report of all three estimates each
        // pair better than a report of the pair, so the round measures that block, with
        // the block share of the users (0.6 · 50,000).
        let choices = auto::Auto::new(PrivIncrParams::default())
            .task_choices(e.context(), &state)
            .unwrap();
        assert!(choices.tasks.iter().all(|t| t.factor == [0, 1, 2]));
        assert_eq!(state.round_quota, Some(30_000));
        tables.extend(collect(&e, &state, &people(30_000, 5), 6));
        e.close_round(&mut state, &tables).unwrap();
        assert_eq!((state.phase, state.round), (Phase::CliqueMeasurement, 2));
        assert_eq!(planned(&state), (vec![vec![0, 1]], 3));
    }

    #[test]
    fn auto_state_stored_before_round_zero_closes_into_phase_two() {
        // A collection created by a release without round 0 is in its screening round 0;
        // this release closes it straight into phase 2, as that release would have.
        let old = engine_with(
            Protocol::Auto(PrivIncrParams::default()),
            50_000,
            EngineOptions {
                auto_round0_share: Some(0.0),
                ..EngineOptions::default()
            },
        );
        let mut state = old.initial_state();
        assert_eq!((state.round, active_edges(&state).len()), (0, 3));
        let e = engine(Protocol::Auto(PrivIncrParams::default()), 50_000);
        let tables = collect(&e, &state, &people(15_000, 3), 4);
        e.close_round(&mut state, &tables).unwrap();
        assert_eq!((state.phase, state.round), (Phase::CliqueMeasurement, 1));
        assert_eq!(planned(&state), (vec![vec![0, 1]], 3));
    }

    /// `(round, kind, state, pruned)` of every round [`Engine::rounds`] describes.
    fn round_list(e: &Engine, state: &CollectionState) -> Vec<(u32, RoundKind, RoundState, u64)> {
        e.rounds(state)
            .into_iter()
            .map(|p| (p.round, p.kind, p.state, p.pruned))
            .collect()
    }

    /// Pairs whose `pruned_in` is `round`.
    fn pruned_in(state: &CollectionState, round: u32) -> u64 {
        state
            .edges()
            .iter()
            .filter(|e| e.pruned_in == Some(round))
            .count() as u64
    }

    #[test]
    fn privincr_rounds_are_its_pair_rounds_then_phase_two() {
        use RoundKind::{Pairs, Phase2};
        use RoundState::{Closed, Open, Planned};
        let params = PrivIncrParams {
            rounds: 2,
            phi: 0.9,
            ..PrivIncrParams::default()
        };
        let e = engine(Protocol::Privincr(params), 60_000);
        let mut state = e.initial_state();
        // Categorical attributes: no round of 1-ways; phase-1 pair rounds 0 and 1, phase 2.
        assert_eq!(
            round_list(&e, &state),
            [
                (0, Pairs, Open, 0),
                (1, Pairs, Planned, 0),
                (2, Phase2, Planned, 0)
            ]
        );
        let mut tables = collect(&e, &state, &people(15_000, 1), 2);
        e.close_round(&mut state, &tables).unwrap();
        let p0 = pruned_in(&state, 0);
        assert_eq!(p0, 2, "the independent pairs are pruned in round 0");
        assert_eq!(
            round_list(&e, &state),
            [
                (0, Pairs, Closed, p0),
                (1, Pairs, Open, 0),
                (2, Phase2, Planned, 0)
            ]
        );
        tables.extend(collect(&e, &state, &people(15_000, 3), 4));
        e.close_round(&mut state, &tables).unwrap();
        assert!(state.plan().is_some());
        let p1 = pruned_in(&state, 1);
        assert_eq!(
            round_list(&e, &state),
            [
                (0, Pairs, Closed, p0),
                (1, Pairs, Closed, p1),
                (2, Phase2, Open, 0)
            ]
        );
        e.mark_finalized(&mut state);
        assert_eq!(
            round_list(&e, &state),
            [
                (0, Pairs, Closed, p0),
                (1, Pairs, Closed, p1),
                (2, Phase2, Closed, 0)
            ]
        );
    }

    /// NoIncremental has one pair round; finalized in it, only that round ran.
    #[test]
    fn noincremental_rounds_stop_at_the_round_open_at_finalize() {
        use RoundKind::{Pairs, Phase2};
        use RoundState::{Closed, Open, Planned};
        let e = engine(Protocol::Noincremental(PrivIncrParams::default()), 60_000);
        let mut state = e.initial_state();
        assert_eq!(
            round_list(&e, &state),
            [(0, Pairs, Open, 0), (1, Phase2, Planned, 0)]
        );
        e.mark_finalized(&mut state);
        assert_eq!(round_list(&e, &state), [(0, Pairs, Closed, 0)]);
    }

    /// A schema with a `bins: "auto"` numeric attribute: PrivIncr's numeric round 0 of
    /// 1-ways comes first and its pair rounds follow (`first_round` 1).
    #[test]
    fn privincr_numeric_round_zero_precedes_its_pair_rounds() {
        use RoundKind::{OneWays, Pairs, Phase2};
        use RoundState::{Closed, Open, Planned};
        let config: ldpsyn::wire::CollectionConfig = serde_json::from_value(serde_json::json!({
            "version": 1, "id": "c0ffee00-0000-4000-8000-000000000000",
            "schema": {"attributes": [
                {"name": "h", "type": "numeric", "min": 0, "max": 1000, "bins": "auto",
                 "integer": true},
                {"name": "c", "type": "categorical", "labels": ["a", "b", "c"]},
                {"name": "k", "type": "categorical", "labels": ["x", "y"]}]},
            "epsilon": 4.0, "target_users": 50_000, "protocol": "privincr", "rounds": 2,
        }))
        .unwrap();
        let e = Engine::new(&config).unwrap();
        let mut state = e.initial_state();
        assert!(state.edges().is_empty());
        let expected = |open: u32| -> Vec<_> {
            let kinds = [OneWays, Pairs, Pairs, Phase2];
            (0..4)
                .map(|r| {
                    let st = match r.cmp(&open) {
                        std::cmp::Ordering::Less => Closed,
                        std::cmp::Ordering::Equal => Open,
                        std::cmp::Ordering::Greater => Planned,
                    };
                    (r, kinds[r as usize], st, 0)
                })
                .collect()
        };
        assert_eq!(round_list(&e, &state), expected(0));
        // Closing round 0 (nothing reported: no bins move) starts phase 1 in round 1.
        e.close_round(&mut state, &Tables::new()).unwrap();
        assert_eq!(state.pair_rounds().unwrap().first_round, 1);
        assert_eq!(round_list(&e, &state), expected(1));
        // Finalized in round 0: the round of 1-ways alone ran.
        let mut early = e.initial_state();
        e.mark_finalized(&mut early);
        assert_eq!(round_list(&e, &early), [(0, OneWays, Closed, 0)]);
    }

    #[test]
    fn auto_rounds_are_round_zero_screening_then_phase_two() {
        use RoundKind::{OneWays, Phase2, Screening};
        use RoundState::{Closed, Open, Planned};
        // No pair worth screening: 1-ways in no round.
        let e = engine(Protocol::Auto(PrivIncrParams::default()), 3);
        assert!(e.rounds(&e.initial_state()).is_empty());
        let e = engine(Protocol::Auto(PrivIncrParams::default()), 50_000);
        let mut state = e.initial_state();
        assert_eq!(
            round_list(&e, &state),
            [
                (0, OneWays, Open, 0),
                (1, Screening, Planned, 0),
                (2, Phase2, Planned, 0)
            ]
        );
        let mut tables = collect(&e, &state, &people(10_000, 3), 4);
        e.close_round(&mut state, &tables).unwrap();
        assert_eq!(
            round_list(&e, &state),
            [
                (0, OneWays, Closed, 0),
                (1, Screening, Open, 0),
                (2, Phase2, Planned, 0)
            ]
        );
        tables.extend(collect(&e, &state, &people(30_000, 5), 6));
        e.close_round(&mut state, &tables).unwrap();
        // The screening round selects the dependent pair and drops the other two.
        assert_eq!(pruned_in(&state, 1), 2);
        let ran = [
            (0, OneWays, Closed, 0),
            (1, Screening, Closed, 2),
            (2, Phase2, Open, 0),
        ];
        assert_eq!(round_list(&e, &state), ran);
        e.mark_finalized(&mut state);
        let ran = ran.map(|(r, k, _, p)| (r, k, Closed, p));
        assert_eq!(round_list(&e, &state), ran);
    }

    /// Without round 0 the screening round is round 0, and the pairs never screened count
    /// among those it dropped.
    #[test]
    fn auto_without_round_zero_screens_in_round_zero() {
        use RoundKind::{Phase2, Screening};
        use RoundState::{Closed, Open, Planned};
        let e = engine_with(
            Protocol::Auto(PrivIncrParams::default()),
            50_000,
            EngineOptions {
                auto_round0_share: Some(0.0),
                ..EngineOptions::default()
            },
        );
        let mut state = e.initial_state();
        assert_eq!(
            round_list(&e, &state),
            [(0, Screening, Open, 0), (1, Phase2, Planned, 0)]
        );
        let tables = collect(&e, &state, &people(15_000, 3), 4);
        e.close_round(&mut state, &tables).unwrap();
        let p0 = pruned_in(&state, 0);
        assert_eq!(p0, 2);
        assert_eq!(
            round_list(&e, &state),
            [(0, Screening, Closed, p0), (1, Phase2, Open, 0)]
        );
    }

    #[test]
    fn protocols_without_rounds_describe_none() {
        for protocol in [
            Protocol::Independence {},
            Protocol::Samprivsyn(SamPrivSynParams { batch_size: 6_000 }),
        ] {
            let e = engine(protocol, 50_000);
            let mut state = e.initial_state();
            assert!(e.rounds(&state).is_empty());
            e.mark_finalized(&mut state);
            assert!(e.rounds(&state).is_empty());
        }
    }

    #[test]
    fn samprivsyn_reweights_toward_the_dependent_pair() {
        let e = engine(
            Protocol::Samprivsyn(SamPrivSynParams { batch_size: 6_000 }),
            50_000,
        );
        let mut state = e.initial_state();
        assert_eq!(state.pair_weights(), &[1.0 / 3.0; 3][..]);
        let tables = collect(&e, &state, &people(6_000, 5), 6);
        assert!(tables.keys().all(|k| k.round == 0));
        let t = e.close_round(&mut state, &tables).unwrap();
        assert_eq!(t, Transition::Reweighted { batch: 1 });
        let w = state.pair_weights();
        assert!(w[0] > 5.0 * w[1] && w[0] > 5.0 * w[2], "{w:?}");
    }

    #[test]
    fn samprivsyn_pools_batches_within_arrival_strata() {
        let task = |round| TaskSpec {
            round,
            factor: vec![0, 1],
            mechanism: MechanismKind::GrrPair,
            bins: vec![],
        };
        let with_strata = |strata| {
            engine_with(
                Protocol::Samprivsyn(SamPrivSynParams { batch_size: 6_000 }),
                50_000,
                EngineOptions {
                    samprivsyn_strata: strata,
                    ..EngineOptions::default()
                },
            )
        };
        let strata =
            |e: &Engine| -> Vec<u32> { (0..12).map(|r| e.table_key(&task(r)).round).collect() };
        // 50,000 people in batches of 6,000 and 4 strata of 12,500 arrivals: batches 0–2
        // start in the first stratum, 3–4 in the second, 5–6 in the third, 7–8 in the last,
        // and batches past the target stay in the last.
        assert_eq!(
            strata(&with_strata(Some(4))),
            [0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 3, 3]
        );
        // By default 16 strata of 3,125: each batch starts in its own.
        assert_eq!(
            strata(&with_strata(None)),
            [0, 1, 3, 5, 7, 9, 11, 13, 15, 15, 15, 15]
        );
        assert_eq!(strata(&with_strata(Some(1))), [0; 12]);
    }

    #[test]
    fn independence_never_closes_and_pools_rounds() {
        let e = engine(Protocol::Independence {}, 1_000);
        let mut state = e.initial_state();
        let tables = collect(&e, &state, &people(1_000, 7), 8);
        assert!(tables.keys().all(|k| k.round == 0 && k.factor.len() == 1));
        assert!(!e.should_close(&state, u64::MAX));
        assert_eq!(
            e.close_round(&mut state, &tables).unwrap(),
            Transition::Nothing
        );
        assert_eq!(state.phase, Phase::OneWay);
    }
}
