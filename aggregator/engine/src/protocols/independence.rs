//! The independence protocol: every task is one attribute, drawn uniformly, reported with
//! its lower-variance oracle (`MechanismKind::choose`); no rounds; the model keeps no pair.

use super::{CollectionProtocol, TaskChoices, common_choices, one_way_state};
use crate::EngineError;
use crate::graph::Edge;
use crate::measure::tables::Tables;
use crate::protocols::context::Context;
use crate::state::{CollectionState, Transition};

/// The independence protocol's rules.
#[derive(Debug, Clone, Default)]
pub struct Independence;

impl CollectionProtocol for Independence {
    fn initial_state(&self, ctx: &Context) -> CollectionState {
        one_way_state(ctx)
    }

    fn task_choices(
        &self,
        ctx: &Context,
        state: &CollectionState,
    ) -> Result<TaskChoices, EngineError> {
        common_choices(ctx, state).unwrap_or_else(|| {
            Err(EngineError::InvalidState(format!(
                "independence has no {:?} phase",
                state.phase
            )))
        })
    }

    fn stratum(&self, _ctx: &Context, _round: u32) -> u32 {
        0
    }

    fn close_round(
        &self,
        _ctx: &Context,
        _state: &mut CollectionState,
        _tables: &Tables,
    ) -> Result<Transition, EngineError> {
        Ok(Transition::Nothing)
    }

    fn model_candidates(&self, _ctx: &Context, _state: &CollectionState) -> Vec<Edge> {
        Vec::new()
    }
}
