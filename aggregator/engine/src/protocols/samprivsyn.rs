//! SamPrivSyn's collection (Sci China Inf Sci 2023, Algorithm 1): each task is a pair drawn
//! `∝` its current weight, reported with two GRRs at ε/2; every `batch_size` accepted reports
//! the weights become the MI of each pair's Kronecker-inverse + Norm-Sub estimate, plus a
//! floor of [`SAMPRIVSYN_WEIGHT_FLOOR`] of the mean weight so no pair starves. Uniform at the
//! start (line 4). With `bins: "auto"` numeric attributes (not in the paper), a fixed share
//! of the users (`numeric_round0_share` in `protocols`) reports one of them alone in
//! sub-bins instead, for the shape within its working bins (docs/design.md "Numeric
//! attributes"); the pair weights share the rest. Batches pool (same mechanism and ε, eq. 5
//! of PrivIncr) within strata by arrival position, so that drift between early and late
//! arrivals is a difference between strata, not a bias of the pairs measured late. The
//! model graph may keep any pair; with `samprivsyn_lasso` set the synthetic rows come from
//! the paper's own estimator and data generation
//! ([`crate::synth::samprivsyn`]).

use ldpsyn::mechanism::{MechanismKind, norm_sub};
use ldpsyn::wire::SamPrivSynParams;

use super::{
    CollectionProtocol, TaskChoices, binned_one_way_choices, common_choices, numeric_round0_share,
    pairs,
};
use crate::EngineError;
use crate::domain::task::TaskSpec;
use crate::fit::joint::FittedJoint;
use crate::graph::Edge;
use crate::measure::tables::Tables;
use crate::numeric::info::mutual_information;
use crate::protocols::context::Context;
use crate::select::structure::Structure;
use crate::state::{CollectionState, PairSampling, Phase, ProtocolState, Transition};
use crate::synth::model::Model;
use crate::synth::samprivsyn::build_model;

/// Floor of every SamPrivSyn pair weight, as a fraction of the mean weight.
pub const SAMPRIVSYN_WEIGHT_FLOOR: f64 = 0.05;

/// Strata of the population by arrival position: batch `r` of `B` reports is counted in
/// table round `⌊r·B·S/N⌋` (`N` the target users, the last stratum taking any surplus).
/// Swept over every suite table in both arrival orders
/// (`benchmarks/sweeps/samprivsyn-strata.md`): in file order 16 strata are within 0.5% of one
/// stratum per batch, which stores a table per pair and batch; shuffled, every count gives the
/// same figures.
pub const SAMPRIVSYN_ARRIVAL_STRATA: u32 = 16;

/// SamPrivSyn's rules.
#[derive(Debug, Clone)]
pub struct SamPrivSyn {
    params: SamPrivSynParams,
}

impl SamPrivSyn {
    /// The rules with these parameters.
    pub fn new(params: SamPrivSynParams) -> Self {
        Self { params }
    }

    /// Weights from the pooled pair tables (Kronecker inverse + Norm-Sub + MI), with the
    /// floor; pairs without reports keep the mean weight.
    fn weights(
        &self,
        ctx: &Context,
        state: &CollectionState,
        tables: &Tables,
    ) -> Result<Vec<f64>, EngineError> {
        let dims = ctx.dims();
        let ms = self.measurements(ctx, tables, &|_| true)?;
        let mi: Vec<Option<f64>> = pairs(dims.len())
            .iter()
            .map(|&(a, b)| {
                ms.combined_where(&[a, b], |k| {
                    k.mechanism == MechanismKind::GrrPair && k.factor.len() == 2
                })
                .map(|c| mutual_information(&norm_sub(&c.frequencies), dims[a], dims[b]))
            })
            .collect();
        let known: Vec<f64> = mi.iter().flatten().copied().collect();
        if known.is_empty() {
            return Ok(state.pair_weights().to_vec());
        }
        let mean = known.iter().sum::<f64>() / known.len() as f64;
        let floor = SAMPRIVSYN_WEIGHT_FLOOR * mean.max(1e-12);
        Ok(mi
            .iter()
            .map(|m| m.unwrap_or(mean).max(0.0) + floor)
            .collect())
    }
}

/// The stratum of batch `round` (`batch_size` reports each) among `strata` equal spans of
/// `target_users` arrivals, by the position of the batch's first report; arrivals past the
/// target fall in the last stratum.
fn arrival_stratum(round: u32, batch_size: u64, target_users: u64, strata: u32) -> u32 {
    let first = u128::from(round) * u128::from(batch_size);
    let s = first * u128::from(strata) / u128::from(target_users.max(1));
    s.min(u128::from(strata - 1)) as u32
}

impl CollectionProtocol for SamPrivSyn {
    fn initial_state(&self, ctx: &Context) -> CollectionState {
        let d = ctx.dims().len();
        let m = d * (d - 1) / 2;
        CollectionState {
            phase: if m == 0 {
                Phase::OneWay
            } else {
                Phase::PairSampling
            },
            round: 0,
            round_quota: Some(self.params.batch_size),
            working_bins: Default::default(),
            // Algorithm 1 line 4: every pair starts with weight 2/(d(d−1)).
            protocol: ProtocolState::Samprivsyn(PairSampling {
                pair_weights: vec![1.0 / m.max(1) as f64; m],
            }),
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
        if state.phase != Phase::PairSampling {
            return Err(EngineError::InvalidState(format!(
                "samprivsyn has no {:?} phase",
                state.phase
            )));
        }
        let mut tasks: Vec<TaskSpec> = pairs(ctx.dims().len())
            .into_iter()
            .map(|(a, b)| TaskSpec {
                round: state.round,
                factor: vec![a, b],
                mechanism: MechanismKind::GrrPair,
                bins: vec![],
            })
            .collect();
        let mut weights = state.pair_weights().to_vec();
        // Numeric attributes: a fixed share of the users report one alone, in sub-bins.
        let ones = binned_one_way_choices(ctx, state).tasks;
        let share = numeric_round0_share(ctx);
        if !ones.is_empty() && share > 0.0 {
            let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
            if total > 0.0 {
                for w in &mut weights {
                    *w = w.max(0.0) / total * (1.0 - share);
                }
                weights.extend(std::iter::repeat_n(share / ones.len() as f64, ones.len()));
                tasks.extend(ones);
            }
        }
        Ok(TaskChoices {
            tasks,
            weights: Some(weights),
            sub_bin_share: Some(1.0),
        })
    }

    /// The pair weights change every batch, so a pooled pair table would describe the people
    /// of the batches that favoured the pair: when arrival correlates with the data, the
    /// pooled tables describe different populations and the fit can agree with none of them.
    /// Batches pool within [`SAMPRIVSYN_ARRIVAL_STRATA`] strata by arrival position instead,
    /// which the fit treats as strata of the population ([`crate::measure::drift`]).
    fn stratum(&self, ctx: &Context, round: u32) -> u32 {
        let strata = ctx
            .options()
            .samprivsyn_strata
            .unwrap_or(SAMPRIVSYN_ARRIVAL_STRATA)
            .max(1);
        arrival_stratum(round, self.params.batch_size, ctx.target_users(), strata)
    }

    fn close_round(
        &self,
        ctx: &Context,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        if state.phase != Phase::PairSampling {
            return Ok(Transition::Nothing);
        }
        state.protocol = ProtocolState::Samprivsyn(PairSampling {
            pair_weights: self.weights(ctx, state, tables)?,
        });
        state.round += 1;
        Ok(Transition::Reweighted { batch: state.round })
    }

    fn model_candidates(&self, ctx: &Context, _state: &CollectionState) -> Vec<Edge> {
        pairs(ctx.dims().len())
    }

    fn final_model(
        &self,
        ctx: &Context,
        state: &CollectionState,
        structure: Structure,
        source: FittedJoint,
    ) -> Result<Model, EngineError> {
        match ctx.options().samprivsyn_lasso {
            Some(lambda) => {
                let model = build_model(ctx.epsilon(), &source, lambda)?;
                // Marginals are served by the graphical model fitted to every measurement.
                Ok(Model::samprivsyn(model, source))
            }
            None => Ok(Model::graphical(
                ctx.protocol().name(),
                ctx.domain().clone(),
                state.edges().to_vec(),
                structure,
                source,
            )),
        }
    }
}
