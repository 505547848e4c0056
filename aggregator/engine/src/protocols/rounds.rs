//! A collection's rounds as its protocol describes them from its state
//! ([`CollectionProtocol::rounds`](crate::protocols::CollectionProtocol::rounds)): what each
//! round measures, whether it ran, and how many pairs its close dropped. Only the two-phase
//! protocols (PrivIncr, NoIncremental, `auto`) have rounds to describe; the layout they
//! share (an optional round of 1-ways, phase 1's pair rounds, phase 2) is built here.

use crate::protocols::context::Context;
use crate::state::{CollectionState, Phase};

/// What a round measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundKind {
    /// Every attribute alone: `auto`'s round 0, or PrivIncr's numeric round 0 (schemas with
    /// `bins: "auto"` numeric attributes).
    OneWays,
    /// PrivIncr's phase-1 pair rounds: the pairs still active, pruned at the round's close.
    Pairs,
    /// `auto`'s screening round: every pair that could pay for its reports; phase 2's pairs
    /// are selected at its close.
    Screening,
    /// Phase 2: the factors planned at the end of phase 1; closes at finalize.
    Phase2,
}

/// Where a round is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundState {
    /// Ran and closed (every round of a finalized collection).
    Closed,
    /// The current round, taking reports.
    Open,
    /// To come.
    Planned,
}

/// One round of a collection, as its state holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundPlan {
    /// Round index (the tasks' round).
    pub round: u32,
    /// What the round measures.
    pub kind: RoundKind,
    /// Closed, open or planned.
    pub state: RoundState,
    /// Pairs dropped when the round closed (PrivIncr: pruned; `auto`'s screening round: not
    /// selected, or never screened, marked dropped in round 0); 0 for a round of 1-ways and
    /// for a round not closed.
    pub pruned: u64,
}

/// Whether a two-phase collection's pairs are still to be set up: its state is in its round
/// of 1-ways (or was finalized there). Phase 1 proper holds all `d(d−1)/2 ≥ 1` pairs.
pub(crate) fn before_pairs(ctx: &Context, state: &CollectionState) -> bool {
    state.edges().is_empty() && ctx.dims().len() >= 2
}

/// The rounds of a two-phase collection in `state` whose phase-1 pair rounds are
/// `first_pairs..first_pairs + pair_rounds`, each of kind `pairs_kind`: rounds before them
/// measure 1-ways, phase 2 is the round after them. A finalized collection lists the rounds
/// up to the one open at finalize, all closed. Empty for a state without pair rounds or in
/// [`Phase::OneWay`] (`auto` with no pair worth screening collects 1-ways in no round).
pub(crate) fn two_phase_rounds(
    state: &CollectionState,
    first_pairs: u32,
    pair_rounds: u32,
    pairs_kind: RoundKind,
) -> Vec<RoundPlan> {
    let Some(pr) = state.pair_rounds().filter(|_| state.phase != Phase::OneWay) else {
        return Vec::new();
    };
    let finalized = state.phase == Phase::Finalized;
    let phase2 = first_pairs + pair_rounds;
    let last = if finalized { state.round } else { phase2 };
    let pruned_in = |r: u32| pr.edges.iter().filter(|e| e.pruned_in == Some(r)).count() as u64;
    (0..=last)
        .map(|r| {
            let kind = if r < first_pairs {
                RoundKind::OneWays
            } else if r < phase2 {
                pairs_kind
            } else {
                RoundKind::Phase2
            };
            let round_state = if r < state.round || finalized {
                RoundState::Closed
            } else if r == state.round {
                RoundState::Open
            } else {
                RoundState::Planned
            };
            // `auto` marks the pairs it never screens as dropped in round 0; they count with
            // no round of 1-ways.
            let pruned = if kind == RoundKind::OneWays || round_state != RoundState::Closed {
                0
            } else {
                pruned_in(r)
            };
            RoundPlan {
                round: r,
                kind,
                state: round_state,
                pruned,
            }
        })
        .collect()
}
