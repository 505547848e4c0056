//! `auto` behind the protocol trait: its initial state, tasks, round closes (round 0, the
//! screening round's selection, phase 2) and final model graph, composed from
//! [`super::screening`], [`super::selection`] and [`super::allocation`].

use crate::EngineError;
use crate::domain::binned::BinnedFactor;
use crate::domain::task::TaskSpec;
use crate::graph::Edge;
use crate::measure::drift::one_way_drift;
use crate::measure::one_way::one_way_estimates;
use crate::measure::tables::Tables;
use crate::protocols::auto::Auto;
use crate::protocols::auto::screening::{drift_extrapolation, repeat_pays, repeat_screening};
use crate::protocols::auto::selection::Selection;
use crate::protocols::context::Context;
use crate::protocols::rounds::{RoundKind, RoundPlan, before_pairs, two_phase_rounds};
use crate::protocols::{
    CollectionProtocol, TaskChoices, active_edges, adapted_working_bins, common_choices,
    end_phase1_round, one_way_choices, one_way_state, pairs, plan_structure, round_quota,
};
use crate::select::gain::{Null, NullOneWays, PairGain, best_pair_gain, lift_weak_dependence};
use crate::state::{CollectionState, Phase, Transition};

impl CollectionProtocol for Auto {
    fn initial_state(&self, ctx: &Context) -> CollectionState {
        if pairs(ctx.dims().len())
            .into_iter()
            .all(|(a, b)| self.screening_bins(ctx, None, a, b).is_none())
        {
            // No pair could ever pay for its reports: the independence model, at no cost.
            return one_way_state(ctx);
        }
        let s0 = self.round0_share(ctx);
        if s0 <= 0.0 {
            return self.screening_state(ctx, None);
        }
        // Round 0: every attribute alone (no edges yet).
        CollectionState {
            phase: Phase::GraphConstruction,
            round_quota: Some(round_quota(ctx, s0, 1)),
            ..one_way_state(ctx)
        }
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
                "auto has no {:?} phase",
                state.phase
            )));
        }
        let active = active_edges(state);
        if active.is_empty() {
            // Round 0: every attribute alone, in the shares that minimize the 1-ways' TVD
            // (equal shares draw as the unweighted 1-ways do).
            let w = one_way_weights(ctx);
            let equal = w.iter().all(|x| (x - w[0]).abs() <= 1e-12 * w[0]);
            return Ok(TaskChoices {
                weights: (!equal).then_some(w),
                ..one_way_choices(ctx, state)
            });
        }
        // Every screened pair alike (each needs its own dependence estimate), in the
        // design's factors, and the round's slice of 1-ways, in round 0's shares.
        let screening = self.screening_tasks(ctx, state.edges());
        let slice = self.one_way_slice(ctx, Self::block_fraction(&screening, state.edges()));
        let mut tasks: Vec<TaskSpec> = screening
            .into_iter()
            .map(|(factor, bins)| TaskSpec {
                round: state.round,
                mechanism: ctx.best_oracle(BinnedFactor::new(&factor, &bins)),
                factor,
                bins,
            })
            .collect();
        let mut weights = vec![(1.0 - slice) / tasks.len() as f64; tasks.len()];
        if slice > 0.0 {
            tasks.extend(one_way_choices(ctx, state).tasks);
            weights.extend(one_way_weights(ctx).into_iter().map(|w| slice * w));
        }
        Ok(TaskChoices {
            tasks,
            weights: (slice > 0.0).then_some(weights),
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
        let t = state.round;
        let ms = self.measurements(ctx, tables, &|k| k.round <= t)?;
        if state.edges().is_empty() {
            // Round 0 closes: point masses become working bins, then pairs are screened
            // binned by the 1-ways' mass.
            state.working_bins = adapted_working_bins(ctx, &ms);
            let ctx = ctx.at(state)?;
            // Read again only if the working bins moved.
            let ms = if state.working_bins.is_empty() {
                ms
            } else {
                self.measurements(&ctx, tables, &|k| k.round <= t)?
            };
            let one = one_way_estimates(&ms);
            let next = self.screening_state(&ctx, Some(&one));
            state.protocol = next.protocol;
            state.round = t + 1;
            state.round_quota = next.round_quota;
            return Ok(Transition::RoundClosed {
                round: t,
                pruned: Vec::new(),
            });
        }
        let (drift, strata) = one_way_drift(&ms);
        let drifted = drift.population_changed;
        let screening = self.screening_tasks(ctx, state.edges());
        let share = self.screening_share(ctx, Self::block_fraction(&screening, state.edges()));
        let selection = self.select(ctx, state, &ms, drifted, share);
        let repeat = drifted
            && repeat_pays(
                &selection,
                state.edges(),
                &drift.round_weights,
                &strata,
                screening.len(),
                share,
                drift_extrapolation(
                    &[self.round0_share(ctx), share],
                    (1.0 - self.round0_share(ctx) - share).max(0.0),
                ),
            );
        let Selection {
            pruned,
            mut factors,
            ..
        } = selection;
        if repeat {
            repeat_screening(ctx, &mut factors, screening, share);
        }
        let sigma = self.params.sigma;
        Ok(end_phase1_round(
            state,
            t + 1,
            pruned,
            |_| factors,
            |s| plan_structure(ctx, s, sigma, true),
        ))
    }

    /// Round 0 of 1-ways (unless its share is 0), the one screening round, then phase 2; none
    /// when no pair is worth screening.
    fn rounds(&self, ctx: &Context, state: &CollectionState) -> Vec<RoundPlan> {
        let first_pairs = if before_pairs(ctx, state) {
            state.round + 1
        } else if state.plan().is_some() {
            state.round.saturating_sub(1)
        } else {
            state.round
        };
        two_phase_rounds(state, first_pairs, 1, RoundKind::Screening)
    }

    fn model_candidates(&self, ctx: &Context, _state: &CollectionState) -> Vec<Edge> {
        pairs(ctx.dims().len())
    }

    /// A pair that phase 2 measured was selected for its screening dependence, so the
    /// screening tables overstate it given the selection: its dependence is judged on the
    /// phase-2 tables ([`crate::select::gain::pair_gain_binned`]); every other pair on all of its tables.
    /// Screening blocks count as other tables: excluding them too cost 18% and 3% 2-way TVD
    /// at ε = 2 and 2% and 6% at ε = 4 on the survey table of `examples/survey` (21,574 and
    /// 10,000 people, 3 seeds): the blocks hold most of a pair's reports. As in `select`,
    /// against the 1-ways of the same people ([`Null::SamePeople`]).
    fn pair_gain(
        &self,
        state: &CollectionState,
        nulls: &NullOneWays<'_>,
        a: usize,
        b: usize,
    ) -> Option<PairGain> {
        let selected = selected_for_phase2(state, (a, b));
        let phase2 = state.round;
        best_pair_gain(nulls, a, b, Null::SamePeople, |k| {
            !selected || k.factor != [a, b] || k.round >= phase2
        })
        .map(|(g, _)| g)
    }

    /// The pairs phase 2 measured are judged on their phase-2 tables, residuals no selection
    /// has seen; where each pair's noise hides its dependence, their own estimates vanish
    /// (`≈ δ²/σ`), although together they carry most of a dense table's dependence (NLTCS at
    /// ε = 1 kept 3–26 of 29–91 selected pairs). Those within
    /// [`AUTO_POOL_SIGNIFICANCE`](crate::protocols::auto::AUTO_POOL_SIGNIFICANCE)
    /// standard deviations of independence are lifted to their posterior under a prior
    /// pooled over them ([`lift_weak_dependence`]). Pairs phase 2 did not measure keep their
    /// own estimates: their screening residuals are the ones they were left out for (biased
    /// low, `benchmarks/sweeps/pooled-dependence.md`).
    fn pool_gains(&self, ctx: &Context, state: &CollectionState, gains: &mut [(Edge, PairGain)]) {
        let significance = self.pool_significance(ctx);
        lift_weak_dependence(
            gains
                .iter_mut()
                .filter(|(e, _)| selected_for_phase2(state, *e))
                .map(|(_, g)| g),
            significance,
        );
    }
}

/// Whether phase 2 measures `pair` because the selection chose it: a plan exists and the pair
/// was still active when it was made (under drift phase 2 also repeats the screening design,
/// unselected pairs included).
fn selected_for_phase2(state: &CollectionState, pair: Edge) -> bool {
    state.plan().is_some() && state.edges().iter().any(|e| e.active && (e.a, e.b) == pair)
}

/// Shares of the attributes in `auto`'s round 0 and in the screening round's slice of 1-ways,
/// those that minimize the summed expected 1-way TVD of the round's people: with `n_a` reports
/// attribute `a`'s expected L1 error is `g_a/√n_a` (`g_a` its noise at one report by the one
/// variance model, [`Context::marginal_noise_l1`], at a uniform marginal: data-independent),
/// and `Σ_a g_a/√n_a` under `Σ_a n_a = n` is least at `n_a ∝ g_a^(2/3)` (Lagrange). Equal
/// shares when every attribute has as many codes. When rounds are strata of the population
/// (drift, [`crate::measure::drift`]) each round's 1-ways stand on their own, so each round's
/// split matters; with i.i.d. arrivals phase 2 tops up what the 1-ways lack (`top_up`).
/// Compared with equal shares over every suite table in both orders
/// (`benchmarks/sweeps/one-way-shares.md`).
pub(super) fn one_way_weights(ctx: &Context) -> Vec<f64> {
    let g: Vec<f64> = (0..ctx.dims().len())
        .map(|a| {
            ctx.marginal_noise_l1(BinnedFactor::full(&[a]), &[a], 1.0)
                .powf(2.0 / 3.0)
        })
        .collect();
    let total: f64 = g.iter().sum();
    g.iter().map(|x| x / total).collect()
}
