//! PrivIncr (EDBT 2023) and NoIncremental (its T = 1 baseline).
//!
//! With `bins: "auto"` numeric attributes in the schema, a numeric round 0 comes first (not
//! in the paper, whose attributes are categorical): `AUTO_ROUND0_SHARE · r / d` of the users
//! (`r` such attributes of `d`; `numeric_round0_share` in `protocols`) report one of them
//! alone, in sub-bins of its working bins, so that point masses become working bins of their
//! own and synthetic values are recovered within their bins (docs/design.md "Numeric
//! attributes"); phase 1 below then runs unchanged, in rounds `1..=T`, and the round-0 1-ways
//! enter the final fit.
//!
//! Phase 1 = Algorithm 1 over `rounds` rounds of `⌊omega·N/rounds⌋` accepted reports: every
//! task is a remaining edge drawn with probability `∝ |Ω_i|·|Ω_j|` (line 5) reported with
//! VOUE (OUE over the pair's product domain); after each round every remaining edge whose MI
//! (eq. 14, on Norm-Sub'd accumulated estimates) is below `ℓ = τ − ΔI(η)` (eq. 15, eq. 18) is
//! pruned; its data is kept and still used. After the last round: junction tree + Algorithm 2
//! ([`crate::select::structure`]), and phase 2 hands out the planned factors (VOUE) with probability `∝`
//! their domain size. The final model graph may keep the edges phase 1 left active.

use ldpsyn::mechanism::{MechanismKind, norm_sub};
use ldpsyn::wire::PrivIncrParams;

use super::{
    CollectionProtocol, TaskChoices, active_edges, adapted_working_bins, binned_one_way_choices,
    common_choices, conditional_scopes, end_phase1_round, graph_state, numeric_round0_share,
    one_way_choices, one_way_state, plan_structure, round_quota,
};
use crate::EngineError;
use crate::domain::binned::BinnedFactor;
use crate::domain::task::{MAX_PAIR_CELLS, TaskSpec};
use crate::graph::{Edge, edge};
use crate::measure::tables::Tables;
use crate::numeric::info::{mutual_information, relaxed_threshold};
use crate::protocols::context::Context;
use crate::protocols::rounds::{RoundKind, RoundPlan, before_pairs, two_phase_rounds};
use crate::state::{CollectionState, Phase, PlannedFactor, Transition};

/// PrivIncr's rules (NoIncremental: one phase-1 round).
#[derive(Debug, Clone)]
pub struct PrivIncr {
    params: PrivIncrParams,
    rounds: u32,
}

impl PrivIncr {
    /// PrivIncr with `params.rounds` phase-1 rounds, or NoIncremental (one round) when
    /// `incremental` is false.
    pub fn new(params: PrivIncrParams, incremental: bool) -> Self {
        let rounds = if incremental { params.rounds } else { 1 };
        Self { params, rounds }
    }

    /// Phase 1's first round: every pair active.
    fn phase1_state(&self, ctx: &Context) -> CollectionState {
        graph_state(ctx, &self.params, self.rounds, self.params.omega, |_, _| {
            Some(Vec::new())
        })
    }

    /// Closes the numeric round 0: point masses become working bins (unless a pair would then
    /// exceed [`MAX_PAIR_CELLS`], which phase 1 measures at full resolution), and phase 1
    /// starts in the next round.
    fn close_numeric_round0(
        &self,
        ctx: &Context,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        let t = state.round;
        let ms = self.measurements(ctx, tables, &|k| k.round <= t)?;
        state.working_bins = adapted_working_bins(ctx, &ms);
        let adapted = ctx.at(state)?;
        let mut dims = adapted.dims().to_vec();
        dims.sort_unstable_by(|a, b| b.cmp(a));
        let next = if dims.len() >= 2 && dims[0].saturating_mul(dims[1]) > MAX_PAIR_CELLS {
            state.working_bins.clear();
            self.phase1_state(ctx)
        } else {
            self.phase1_state(&adapted)
        };
        state.protocol = next.protocol;
        if let Some(r) = state.pair_rounds_mut() {
            r.first_round = t + 1;
        }
        state.round = t + 1;
        state.round_quota = next.round_quota;
        Ok(Transition::RoundClosed {
            round: t,
            pruned: Vec::new(),
        })
    }
}

/// Whether `state` is the numeric round 0: a phase-1 state without edges (phase 1 proper
/// has all `d(d−1)/2 ≥ 1` of them).
fn in_numeric_round0(ctx: &Context, state: &CollectionState) -> bool {
    state.phase == Phase::GraphConstruction && state.edges().is_empty() && ctx.dims().len() >= 2
}

impl CollectionProtocol for PrivIncr {
    fn initial_state(&self, ctx: &Context) -> CollectionState {
        let share = numeric_round0_share(ctx);
        if share > 0.0 {
            return CollectionState {
                phase: Phase::GraphConstruction,
                round_quota: Some(round_quota(ctx, share, 1)),
                ..one_way_state(ctx)
            };
        }
        self.phase1_state(ctx)
    }

    fn task_choices(
        &self,
        ctx: &Context,
        state: &CollectionState,
    ) -> Result<TaskChoices, EngineError> {
        if let Some(choices) = common_choices(ctx, state) {
            return choices;
        }
        if state.phase != Phase::GraphConstruction {
            return Err(EngineError::InvalidState(format!(
                "privincr has no {:?} phase",
                state.phase
            )));
        }
        if in_numeric_round0(ctx, state) {
            return Ok(binned_one_way_choices(ctx, state));
        }
        let active = active_edges(state);
        if active.is_empty() {
            // Every edge pruned (or d = 1): spend the rest of the round on 1-ways.
            return Ok(one_way_choices(ctx, state));
        }
        // Line 5 of Algorithm 1: Ñ_{t,e} ∝ |Ω_i|·|Ω_j|.
        let dims = ctx.dims();
        Ok(TaskChoices {
            weights: Some(
                active
                    .iter()
                    .map(|e| (dims[e.a] * dims[e.b]) as f64)
                    .collect(),
            ),
            tasks: active
                .iter()
                .map(|e| TaskSpec {
                    round: state.round,
                    factor: vec![e.a, e.b],
                    mechanism: MechanismKind::Oue,
                    bins: vec![],
                })
                .collect(),
            sub_bin_share: None,
        })
    }

    fn close_round(
        &self,
        ctx: &Context,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        if state.phase != Phase::GraphConstruction {
            return Ok(Transition::Nothing);
        }
        if in_numeric_round0(ctx, state) {
            return self.close_numeric_round0(ctx, state, tables);
        }
        let t = state.round;
        let dims = ctx.dims();
        let ms = self.measurements(ctx, tables, &|k| k.round <= t)?;
        let mut pruned = Vec::new();
        let edges = state
            .pair_rounds_mut()
            .map_or(&mut [][..], |r| &mut r.edges[..]);
        for e in edges.iter_mut().filter(|e| e.active) {
            let Some(c) = ms.combined(&[e.a, e.b]) else {
                continue;
            };
            let (ka, kb) = (dims[e.a], dims[e.b]);
            let mi = mutual_information(&norm_sub(&c.frequencies), ka, kb);
            let ell = relaxed_threshold(ka, kb, c.reports, self.params.phi, self.params.alpha);
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
        let sigma = self.params.sigma;
        let first = state.pair_rounds().map_or(0, |r| r.first_round);
        Ok(end_phase1_round(
            state,
            first + self.rounds,
            pruned,
            |s| {
                // VOUE, users ∝ the factor's domain size (as line 5 of Algorithm 1).
                conditional_scopes(&plan_structure(ctx, s, sigma, false))
                    .into_iter()
                    .map(|f| PlannedFactor {
                        weight: ctx.cells(BinnedFactor::full(&f)) as f64,
                        factor: f,
                        mechanism: MechanismKind::Oue,
                        bins: vec![],
                    })
                    .collect()
            },
            |s| plan_structure(ctx, s, sigma, false),
        ))
    }

    /// The numeric round 0 of 1-ways if the schema has one, phase 1's `rounds` pair rounds
    /// (NoIncremental: one), then phase 2.
    fn rounds(&self, ctx: &Context, state: &CollectionState) -> Vec<RoundPlan> {
        let first_pairs = if before_pairs(ctx, state) {
            state.round + 1
        } else if state.plan().is_some() {
            // Phase 2's round follows the last pair round.
            state.round.saturating_sub(self.rounds)
        } else {
            state.pair_rounds().map_or(0, |r| r.first_round)
        };
        two_phase_rounds(state, first_pairs, self.rounds, RoundKind::Pairs)
    }

    fn model_candidates(&self, _ctx: &Context, state: &CollectionState) -> Vec<Edge> {
        active_edges(state)
            .into_iter()
            .map(|e| edge(e.a, e.b))
            .collect()
    }
}
