//! What a collection has decided, as serializable data (the service stores it as JSON in the
//! same transaction as the report that caused a transition): its phase and round
//! ([`CollectionState`]), each protocol's own decisions ([`ProtocolState`]), what a round
//! close did ([`Transition`]) and the engine's options ([`EngineOptions`]). Data only: the
//! rules that change it are the protocols' ([`crate::protocols`]), run by
//! [`crate::engine::Engine`].

use std::collections::BTreeMap;

use ldpsyn::mechanism::MechanismKind;
use ldpsyn::wire::Protocol;
use serde::{Deserialize, Serialize};

use crate::graph::{Edge, EdgeState};
use crate::select::structure::Structure;

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

/// A factor measured in phase 2, its mechanism and its share of phase-2 tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedFactor {
    /// Attributes in report order.
    pub factor: Vec<usize>,
    /// Mechanism.
    pub mechanism: MechanismKind,
    /// Relative task weight (tasks drawn with probability ∝ weight).
    pub weight: f64,
    /// Bin maps of the factor's attributes (as [`TaskSpec::bins`](crate::domain::task::TaskSpec::bins)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
}

/// The phase-2 plan: the model structure and the factors to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase2Plan {
    /// Dependency graph, junction tree and conditionals.
    pub structure: Structure,
    /// Factors measured in phase 2.
    pub factors: Vec<PlannedFactor>,
}

/// Every decision taken so far for a collection (serde JSON; stored by the service): the
/// round machinery every protocol shares, and what the protocol itself decided
/// ([`ProtocolState`], tagged by the protocol's name).
///
/// The JSON is a flat object, `{"protocol": "privincr", "phase": …, "round": …,
/// "round_quota": …, "edges": …, "plan": …}`: states stored before the tagged form (every
/// protocol's fields in every state) read back unchanged, their other protocols' fields
/// ignored (tested).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectionState {
    /// Phase.
    pub phase: Phase,
    /// Current round (PrivIncr/auto: phase-1 rounds `0..T`, phase 2 is round `T`;
    /// SamPrivSyn: batch index).
    pub round: u32,
    /// Accepted reports of the current round after which it closes (`None`: never closes by
    /// itself; the operator finalizes).
    pub round_quota: Option<u64>,
    /// Working bins placed by an earlier round's estimate, per attribute index (`auto`'s
    /// round 0, and PrivIncr's numeric one, merge the runs of a `bins: "auto"` attribute's
    /// bins they cannot tell from empty, [`Space::merged_unresolved_cuts`](crate::domain::space::Space::merged_unresolved_cuts), and make the
    /// point masses they find bins of their own, [`Space::point_masses`](crate::domain::space::Space::point_masses)); every other
    /// attribute keeps the schema's. Empty in
    /// states stored before adaptive bins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub working_bins: BTreeMap<usize, AdaptedBins>,
    /// The protocol's own decisions.
    #[serde(flatten)]
    pub protocol: ProtocolState,
}

/// An attribute's working bins as an earlier round's estimate placed them
/// ([`Space::with_adapted_cuts`](crate::domain::space::Space::with_adapted_cuts)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptedBins {
    /// Cuts of the working bins over schema codes: the schema's, less those between merged
    /// unresolved bins, plus both sides of every point mass found.
    pub cuts: Vec<u32>,
    /// Cuts of the cells the estimate was measured on, which its sub-bin 1-ways keep
    /// (`[]`: every code).
    pub sub_bins: Vec<u32>,
    /// First code of each point mass found (`None`: a state stored before it was recorded,
    /// read by [`Space::is_point_mass`](crate::domain::space::Space::is_point_mass)'s rule for one-code bins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub points: Option<Vec<u32>>,
}

/// What a protocol decided, tagged `"protocol"` with the protocol's name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "protocol", rename_all = "snake_case")]
pub enum ProtocolState {
    /// PrivIncr: its phase-1 edges and phase-2 plan.
    Privincr(PairRounds),
    /// NoIncremental: as PrivIncr.
    Noincremental(PairRounds),
    /// `auto`: its screened pairs and phase-2 plan.
    Auto(PairRounds),
    /// SamPrivSyn: the current pair weights.
    Samprivsyn(PairSampling),
    /// Independence: nothing to decide.
    Independence {},
    /// Vertical: nothing to decide before finalize.
    Vertical {},
}

/// The decisions of a two-phase protocol (PrivIncr, NoIncremental, `auto`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PairRounds {
    /// All `d(d−1)/2` pairs, lexicographic (empty when the protocol never measures pairs).
    pub edges: Vec<EdgeState>,
    /// Phase-2 plan once phase 1 is over.
    pub plan: Option<Phase2Plan>,
    /// The round phase 1 starts in: 0, or 1 after PrivIncr's numeric round 0
    /// ([`crate::protocols::privincr`]); absent (0) in states written before it existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_round: u32,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

/// SamPrivSyn's decisions.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PairSampling {
    /// Pair weights (lexicographic pairs).
    pub pair_weights: Vec<f64>,
}

impl ProtocolState {
    /// The state of `protocol` before anything is decided, with `rounds` for a two-phase
    /// protocol and `weights` for SamPrivSyn.
    pub fn new(protocol: &Protocol, rounds: PairRounds, weights: Vec<f64>) -> Self {
        match protocol {
            Protocol::Privincr(_) => Self::Privincr(rounds),
            Protocol::Noincremental(_) => Self::Noincremental(rounds),
            Protocol::Auto(_) => Self::Auto(rounds),
            Protocol::Samprivsyn(_) => Self::Samprivsyn(PairSampling {
                pair_weights: weights,
            }),
            Protocol::Independence {} => Self::Independence {},
            Protocol::Vertical(_) => Self::Vertical {},
        }
    }
}

impl CollectionState {
    /// The two-phase decisions, if the protocol has them.
    pub fn pair_rounds(&self) -> Option<&PairRounds> {
        match &self.protocol {
            ProtocolState::Privincr(r)
            | ProtocolState::Noincremental(r)
            | ProtocolState::Auto(r) => Some(r),
            _ => None,
        }
    }

    /// As [`CollectionState::pair_rounds`], mutable.
    pub(crate) fn pair_rounds_mut(&mut self) -> Option<&mut PairRounds> {
        match &mut self.protocol {
            ProtocolState::Privincr(r)
            | ProtocolState::Noincremental(r)
            | ProtocolState::Auto(r) => Some(r),
            _ => None,
        }
    }

    /// The phase-1 edges (empty for protocols without them).
    pub fn edges(&self) -> &[EdgeState] {
        self.pair_rounds().map_or(&[], |r| &r.edges)
    }

    /// The phase-2 plan, once there is one.
    pub fn plan(&self) -> Option<&Phase2Plan> {
        self.pair_rounds().and_then(|r| r.plan.as_ref())
    }

    /// SamPrivSyn's pair weights (empty for other protocols).
    pub fn pair_weights(&self) -> &[f64] {
        match &self.protocol {
            ProtocolState::Samprivsyn(s) => &s.pair_weights,
            _ => &[],
        }
    }
}
/// What a call to [`crate::engine::Engine::close_round`] did.
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
    /// [`clique_cap`](crate::select::model_graph::clique_cap): the smaller of [`MAX_CLIQUE_CELLS`](crate::select::model_graph::MAX_CLIQUE_CELLS) and the people).
    pub max_clique_cells: Option<u64>,
    /// `auto`: share of users in phase 1 (default
    /// [`AUTO_PHASE1_SHARE`](crate::protocols::auto::AUTO_PHASE1_SHARE)).
    pub auto_phase1_share: Option<f64>,
    /// `auto`: share of users in round 0, every attribute alone (default
    /// [`AUTO_ROUND0_SHARE`](crate::protocols::auto::AUTO_ROUND0_SHARE); 0: no round 0, pairs
    /// screened under equal-width bins).
    #[serde(default)]
    pub auto_round0_share: Option<f64>,
    /// `auto`: share of users in the screening round when its design measures blocks of
    /// more than two attributes (default
    /// [`AUTO_BLOCK_SCREENING_SHARE`](crate::protocols::auto::AUTO_BLOCK_SCREENING_SHARE)).
    #[serde(default)]
    pub auto_block_share: Option<f64>,
    /// `auto`: noise budget of a screened pair (default
    /// [`AUTO_BIN_NOISE_L1`](crate::protocols::auto::AUTO_BIN_NOISE_L1)).
    #[serde(default)]
    pub auto_bin_noise_l1: Option<f64>,
    /// `auto`: significance within which a measured pair's dependence is pooled in the model
    /// graph (default
    /// [`AUTO_POOL_SIGNIFICANCE`](crate::protocols::auto::AUTO_POOL_SIGNIFICANCE)).
    #[serde(default)]
    pub auto_pool_significance: Option<f64>,
    /// Share of a `bins: "auto"` attribute's 1-ways measured in sub-bins (default
    /// [`SUB_BIN_ONE_WAY_SHARE`](crate::domain::task::SUB_BIN_ONE_WAY_SHARE)).
    #[serde(default)]
    pub sub_bin_share: Option<f64>,
    /// Standard deviations of its dependence estimate a pair's expected gain must exceed to
    /// enter the model graph (default: the protocol's, `CollectionProtocol::gain_margin`).
    pub gain_margin: Option<f64>,
    /// SamPrivSyn: strata of the population by arrival position (default
    /// [`SAMPRIVSYN_ARRIVAL_STRATA`](crate::protocols::samprivsyn::SAMPRIVSYN_ARRIVAL_STRATA)).
    #[serde(default)]
    pub samprivsyn_strata: Option<u32>,
    /// Sub-bins per working bin of those 1-ways (default [`SUB_BINS`](crate::domain::task::SUB_BINS)).
    #[serde(default)]
    pub sub_bins: Option<usize>,
    /// Standard errors a run of numeric working bins must reach to stay apart after a round
    /// 0 (default [`UNRESOLVED_BIN_Z`](crate::domain::space::UNRESOLVED_BIN_Z); 0: never merged).
    #[serde(default)]
    pub unresolved_bin_z: Option<f64>,
    /// Standard errors past which a bin leaves the smoothing of a `bins: "auto"`
    /// attribute's 1-way (default [`SMOOTHING_RELEASE_Z`](crate::fit::smooth::SMOOTHING_RELEASE_Z);
    /// 0 releases every bin: no smoothing).
    #[serde(default)]
    pub smoothing_release_z: Option<f64>,
    /// Cap on how much more precise a party's local-model measurement may be than the most
    /// precise LDP table in the fit (default
    /// [`LOCAL_PRECISION_RATIO`](crate::fit::observe::LOCAL_PRECISION_RATIO), or
    /// [`SAMPLED_LOCAL_PRECISION_RATIO`](crate::fit::observe::SAMPLED_LOCAL_PRECISION_RATIO)
    /// under `sampled+locmrf`; vertical collections with local models).
    #[serde(default)]
    pub local_precision_ratio: Option<f64>,
}
