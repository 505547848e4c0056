//! The collection state machine: task assignment, round closing (PrivIncr pruning,
//! SamPrivSyn re-weighting, `auto`'s structure selection) and finalization.
//!
//! Everything here is a pure function of the [`Engine`] (built from the public collection
//! config), the serializable [`CollectionState`] and the [`Tables`] of sufficient statistics:
//! the HTTP service stores the state in its database in the same transaction as the report
//! that caused a transition, and any process can recompute the same transition from the same
//! tables.
//!
//! What differs between protocols (initial state, tasks, tables, round closing, the pairs
//! the model graph may keep) lives in one module per protocol behind
//! [`super::protocols::CollectionProtocol`], chosen once in [`Engine::from_parts`].
//!
//! Every protocol finalizes the same way ([`Engine::finalize`]): every table is a
//! measurement, the model graph keeps the candidate pairs with positive expected gain within
//! the clique cap, and one graphical model is fitted to all measurements
//! ([`super::estimate`], [`super::pgm`]). The protocols differ in what they collect.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use ldpsyn::Epsilon;
use ldpsyn::factor::{binned_codes, binned_domain_sizes};
use ldpsyn::mechanism::{Mechanism, MechanismKind};
use ldpsyn::protocol::{CollectionConfig, Protocol};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::EngineError;
use super::estimate::{PairGain, clique_cap, fit_model, one_way_estimates, select_model_graph};
use super::graph::{Edge, EdgeState};
use super::model::{EdgeGain, FittedJoint, MeasuredFactor, Model, Recovery, RoundSummary};
use super::pgm::FitOptions;
use super::plan::{Structure, build_structure};
use super::protocols::auto::Auto;
use super::protocols::independence::Independence;
use super::protocols::privincr::PrivIncr;
use super::protocols::samprivsyn::SamPrivSyn;
use super::protocols::vertical::{Vertical, resolve};
use super::protocols::{CollectionProtocol, check_privincr};
use super::space::Space;
use super::tables::{Measurements, TableKey, Tables, summed_randomizer_variance};

/// Share of a `bins: "auto"` attribute's 1-way tasks measured in sub-bins of its working
/// bins rather than in the working bins ([`crate::space`]): the sub-bin 1-ways give the
/// shape within the bins (histogram recovery), the working ones the bins' totals at less
/// noise. Chosen by a sweep of 0, 0.1, 0.25 and 0.5 on Adult and temporal-match2 at
/// ε ∈ {1, 2, 4, 8} (`benchmarks/sweeps/sub-bin-share.md`): 0.25 cuts temporal-match2's mean
/// KS ninefold at ε = 4 at equal 2-way TVD; on Adult it costs 3.6% of 2-way TVD at ε ≤ 2.
/// Re-swept (0.1, 0.25, 0.4) after `auto`'s round 0 and found point masses: 0.25 stays (0.1
/// nearly doubles temporal-match2's largest KS at ε = 1–4; 0.4 costs Adult 5% at ε = 1).
pub const SUB_BIN_ONE_WAY_SHARE: f64 = 0.25;

/// Sub-bins per working bin of a `bins: "auto"` attribute's sub-bin 1-ways
/// ([`Space::sub_bin_cuts`]); from the same sweep (2, 4 and 8 compared).
pub const SUB_BINS: usize = 8;

/// Most values one attribute may have (schema codes, "missing" included): a 1-way table
/// of it is allocated on its first report.
pub const MAX_ATTRIBUTE_DOMAIN: usize = 1 << 15;

/// Most cells of a pair measured at full resolution (protocols other than `auto`, which bins
/// large pairs, and `independence`): the SDK's factor cap, 2^20.
pub const MAX_PAIR_CELLS: usize = ldpsyn::factor::DEFAULT_MAX_CELLS;

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
    /// Bin maps of the factor's attributes (as [`TaskSpec::bins`]).
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
    /// bins they cannot tell from empty, [`Space::merged_unresolved_cuts`], and make the
    /// point masses they find bins of their own, [`Space::point_masses`]); every other
    /// attribute keeps the schema's. Empty in
    /// states stored before adaptive bins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub working_bins: BTreeMap<usize, AdaptedBins>,
    /// The protocol's own decisions.
    #[serde(flatten)]
    pub protocol: ProtocolState,
}

/// An attribute's working bins as an earlier round's estimate placed them
/// ([`Space::with_adapted_cuts`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptedBins {
    /// Cuts of the working bins over schema codes: the schema's, less those between merged
    /// unresolved bins, plus both sides of every point mass found.
    pub cuts: Vec<u32>,
    /// Cuts of the cells the estimate was measured on, which its sub-bin 1-ways keep
    /// (`[]`: every code).
    pub sub_bins: Vec<u32>,
    /// First code of each point mass found (`None`: a state stored before it was recorded,
    /// read by [`Space::is_point_mass`]'s rule for one-code bins).
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
    pub fn pair_rounds_mut(&mut self) -> Option<&mut PairRounds> {
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
    /// Bin maps of the factor's attributes (factor order, `[]` for full resolution), or
    /// empty when none is binned (docs/design.md "Tasks with bin maps").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
}

impl TaskSpec {
    /// The codes a device holding `record` (one code per schema attribute) randomizes: its
    /// factor's codes, mapped to bins where the task bins an attribute
    /// ([`ldpsyn::factor::binned_codes`]).
    pub fn codes<'a>(&'a self, record: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
        binned_codes(record, &self.factor, &self.bins)
    }
}

/// Domain sizes of `factor`'s attributes among `dims` under the bin maps `bins` (factor
/// order); `None` for an attribute outside `dims` or an invalid map.
fn factor_dims_in(dims: &[usize], factor: &[usize], bins: &[Vec<u32>]) -> Option<Vec<usize>> {
    if factor.iter().any(|&a| a >= dims.len()) {
        return None;
    }
    let sizes = binned_domain_sizes(dims, factor, bins).ok()?;
    Some(factor.iter().map(|&a| sizes[a]).collect())
}

/// The task distribution of one state ([`Engine::sampler`]): draws in O(log n) (uniform: O(1)),
/// so a request for many tasks, or a cache of it per state, does not rebuild the protocol's
/// choices per task.
#[derive(Debug, Clone)]
pub struct TaskSampler {
    engine: Engine,
    tasks: Vec<TaskSpec>,
    /// Cumulative weights (`None`: uniform).
    cdf: Option<Vec<f64>>,
    /// [`TaskChoices::sub_bin_share`](crate::protocols::TaskChoices::sub_bin_share).
    sub_bin_share: Option<f64>,
}

impl TaskSampler {
    /// Draws one task (schema codes: bin maps as devices apply them).
    pub fn draw<R: Rng + ?Sized>(&self, rng: &mut R) -> TaskSpec {
        let i = match &self.cdf {
            None => rng.random_range(0..self.tasks.len()),
            Some(cdf) => {
                let u = rng.random::<f64>() * cdf[cdf.len() - 1];
                cdf.partition_point(|&c| c <= u).min(cdf.len() - 1)
            }
        };
        self.engine
            .to_codes(self.tasks[i].clone(), self.sub_bin_share, rng)
    }

    /// Number of distinct tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Never true: a sampler has at least one task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
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
    /// [`clique_cap`]: the smaller of [`MAX_CLIQUE_CELLS`](super::estimate::MAX_CLIQUE_CELLS) and the people).
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
    /// Share of a `bins: "auto"` attribute's 1-ways measured in sub-bins (default
    /// [`SUB_BIN_ONE_WAY_SHARE`]).
    #[serde(default)]
    pub sub_bin_share: Option<f64>,
    /// Standard deviations of its dependence estimate a pair's expected gain must exceed to
    /// enter the model graph (default: the protocol's, `CollectionProtocol::gain_margin`).
    pub gain_margin: Option<f64>,
    /// Sub-bins per working bin of those 1-ways (default [`SUB_BINS`]).
    #[serde(default)]
    pub sub_bins: Option<usize>,
    /// Standard errors a run of numeric working bins must reach to stay apart after a round
    /// 0 (default [`UNRESOLVED_BIN_Z`](crate::space::UNRESOLVED_BIN_Z); 0: never merged).
    #[serde(default)]
    pub unresolved_bin_z: Option<f64>,
    /// Standard errors past which a bin leaves the smoothing of a `bins: "auto"`
    /// attribute's 1-way (default [`SMOOTHING_RELEASE_Z`](crate::smooth::SMOOTHING_RELEASE_Z);
    /// 0 releases every bin: no smoothing).
    #[serde(default)]
    pub smoothing_release_z: Option<f64>,
}

/// Most attributes a collection may have. Per-pair structures (candidate edges, mutual
/// information, SamPrivSyn's pair weights) grow with the square of this: 512 attributes are
/// 130,816 pairs, which keeps a round close's memory and time bounded whatever an admin
/// submits. [`Engine::new`] refuses more (the server answers `invalid-schema` first).
pub const MAX_ATTRIBUTES: usize = 512;

/// The engine of one collection: its config, resolved. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine {
    /// Schema codes ↔ working bins.
    space: Space,
    epsilon: Epsilon,
    target_users: u64,
    protocol: Protocol,
    options: EngineOptions,
    /// The protocol's rules, chosen once from `protocol`.
    rules: Arc<dyn CollectionProtocol>,
    /// A vertical collection's parties (the same rules, for the party-upload path).
    vertical: Option<Arc<Vertical>>,
}

impl Engine {
    /// The engine of a collection. Errors: more than [`MAX_ATTRIBUTES`] attributes, a schema
    /// attribute of fewer than 2 values, or invalid protocol parameters (omega ∉ (0,1), rounds = 0, alpha ∉ (0,1], phi ≤ 0,
    /// batch size 0).
    pub fn new(config: &CollectionConfig) -> Result<Self, EngineError> {
        Self::with_options(config, EngineOptions::default())
    }

    /// As [`Engine::new`] with [`EngineOptions`].
    pub fn with_options(
        config: &CollectionConfig,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        let vertical = resolve(&config.protocol, &config.schema)?;
        if let Some(v) = &vertical {
            if config
                .schema
                .attributes()
                .iter()
                .any(|a| a.working_bins().is_some())
            {
                return Err(EngineError::InvalidConfig(
                    "a vertical collection needs fixed bins (`bins: \"auto\"` is for device \
                     collections)"
                        .into(),
                ));
            }
            let want = v.max_party_epsilon();
            if (config.epsilon.get() - want).abs() > 1e-9 * want.max(1.0) {
                return Err(EngineError::InvalidConfig(format!(
                    "a vertical collection's epsilon is its largest party total Σε = {want} \
                     (got {})",
                    config.epsilon
                )));
            }
        }
        Self::assemble(
            Space::from_schema(&config.schema)?,
            config.epsilon,
            config.target_users,
            config.protocol.clone(),
            options,
            vertical.map(Arc::new),
        )
    }

    /// The engine from its parts (domain sizes instead of a schema: every code its own
    /// working bin).
    pub fn from_parts(
        dims: Vec<usize>,
        epsilon: Epsilon,
        target_users: u64,
        protocol: Protocol,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        Self::from_space(
            Space::identity(dims),
            epsilon,
            target_users,
            protocol,
            options,
        )
    }

    /// The engine over the working space `space` ([`crate::space`]). Errors: as
    /// [`Engine::new`]; a vertical protocol (its parties name schema attributes: build it
    /// with [`Engine::new`]).
    pub fn from_space(
        space: Space,
        epsilon: Epsilon,
        target_users: u64,
        protocol: Protocol,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        Self::assemble(space, epsilon, target_users, protocol, options, None)
    }

    fn assemble(
        space: Space,
        epsilon: Epsilon,
        target_users: u64,
        protocol: Protocol,
        options: EngineOptions,
        vertical: Option<Arc<Vertical>>,
    ) -> Result<Self, EngineError> {
        let dims = space.dims().to_vec();
        if dims.len() > MAX_ATTRIBUTES {
            return Err(EngineError::InvalidConfig(format!(
                "{} attributes; a collection takes at most {MAX_ATTRIBUTES}",
                dims.len()
            )));
        }
        if space.code_dims().is_empty()
            || space.code_dims().iter().any(|&k| k < 2)
            || dims.iter().any(|&k| k < 2)
        {
            return Err(EngineError::InvalidConfig(
                "every attribute needs ≥ 2 values".into(),
            ));
        }
        // Every table a task can open is allocated on its first report, which anyone may
        // send: bound the domains here, before any request can ask for them.
        if let Some((a, &k)) = space
            .code_dims()
            .iter()
            .enumerate()
            .find(|(_, k)| **k > MAX_ATTRIBUTE_DOMAIN)
        {
            return Err(EngineError::InvalidConfig(format!(
                "attribute {a} has {k} values, more than {MAX_ATTRIBUTE_DOMAIN}"
            )));
        }
        if !matches!(protocol, Protocol::Auto(_) | Protocol::Independence {}) {
            // These measure every pair at full working resolution.
            let mut order: Vec<usize> = (0..dims.len()).collect();
            order.sort_by_key(|&a| std::cmp::Reverse(dims[a]));
            if let [a, b, ..] = order[..]
                && dims[a].saturating_mul(dims[b]) > MAX_PAIR_CELLS
            {
                return Err(EngineError::InvalidConfig(format!(
                    "attributes {a} and {b} make a pair of {} cells, more than {MAX_PAIR_CELLS} \
                     (use fewer bins, or protocol auto, which bins large pairs)",
                    dims[a] * dims[b]
                )));
            }
        }
        let rules: Arc<dyn CollectionProtocol> = match &protocol {
            Protocol::Privincr(p) => {
                check_privincr(p)?;
                Arc::new(PrivIncr::new(p.clone(), true))
            }
            Protocol::Noincremental(p) => {
                check_privincr(p)?;
                Arc::new(PrivIncr::new(p.clone(), false))
            }
            Protocol::Auto(p) => {
                check_privincr(p)?;
                Arc::new(Auto::new(p.clone()))
            }
            Protocol::Samprivsyn(s) => {
                if s.batch_size == 0 {
                    return Err(EngineError::InvalidConfig("batch_size must be ≥ 1".into()));
                }
                Arc::new(SamPrivSyn::new(s.clone()))
            }
            Protocol::Independence {} => Arc::new(Independence),
            Protocol::Vertical(_) => match &vertical {
                Some(v) => v.clone(),
                None => {
                    return Err(EngineError::InvalidConfig(
                        "a vertical collection is built from its config (Engine::new)".into(),
                    ));
                }
            },
        };
        Ok(Self {
            space,
            epsilon,
            target_users,
            protocol,
            options,
            rules,
            vertical,
        })
    }

    /// Working domain sizes: what protocols and the model see (the schema's, with a
    /// `bins: "auto"` attribute in its working bins; [`crate::space`]).
    pub fn dims(&self) -> &[usize] {
        self.space.dims()
    }

    /// Domain sizes of the schema (the codes devices encode to).
    pub fn schema_dims(&self) -> &[usize] {
        self.space.code_dims()
    }

    /// Schema codes ↔ working bins.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Every table (of rounds for which `keep` holds) as a measurement in the working space
    /// ([`Measurements::filtered_in`]). Errors: a table that does not fit its mechanism.
    pub fn measurements(
        &self,
        tables: &Tables,
        keep: impl Fn(&TableKey) -> bool,
    ) -> Result<Measurements, EngineError> {
        Ok(Measurements::filtered_in(
            &|key: &TableKey, dims: &[usize]| self.rules.table_mechanism(self, key, dims),
            &self.space,
            tables,
            keep,
        )?)
    }

    /// A vertical collection's parties resolved against the schema; `None` for device
    /// collections.
    pub fn vertical(&self) -> Option<&Vertical> {
        self.vertical.as_deref()
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

    /// Cells of a factor's product domain under the bin maps `bins` (empty: none binned).
    pub(crate) fn cells(&self, factor: &[usize], bins: &[Vec<u32>]) -> usize {
        self.factor_dims(factor, bins)
            .map_or(usize::MAX, |d| d.iter().product())
    }

    /// The lower-variance single-report oracle for a factor under the bin maps `bins`
    /// (`MechanismKind::choose`).
    pub(crate) fn best_oracle(&self, factor: &[usize], bins: &[Vec<u32>]) -> MechanismKind {
        MechanismKind::choose(self.epsilon, self.cells(factor, bins))
    }

    /// The state of a new collection.
    pub fn initial_state(&self) -> CollectionState {
        self.rules.initial_state(self)
    }

    /// Draws the next task: a pure function of the state and `rng`, never of anyone's data.
    /// Builds the state's [`TaskSampler`] (O(tasks)); to draw many tasks of one state, build
    /// it once with [`Engine::sampler`]. Errors: [`EngineError::Finalized`] once finalized.
    pub fn draw_task<R: Rng + ?Sized>(
        &self,
        state: &CollectionState,
        rng: &mut R,
    ) -> Result<TaskSpec, EngineError> {
        Ok(self.sampler(state)?.draw(rng))
    }

    /// The task distribution of `state`, to draw from in O(log n) per task
    /// ([`TaskSampler::draw`]). Errors: as [`Engine::draw_task`].
    pub fn sampler(&self, state: &CollectionState) -> Result<TaskSampler, EngineError> {
        let engine = self.at(state)?;
        let choices = engine.rules.task_choices(&engine, state)?;
        if choices.tasks.is_empty() {
            return Err(EngineError::InvalidState("a state without tasks".into()));
        }
        let cdf = choices.weights.as_ref().map(|w| {
            w.iter()
                .scan(0.0, |acc, &x| {
                    *acc += x.max(0.0);
                    Some(*acc)
                })
                .collect::<Vec<f64>>()
        });
        if cdf
            .as_ref()
            .is_some_and(|c| c.last().is_none_or(|&t| t <= 0.0))
        {
            return Err(EngineError::InvalidState("task weights sum to 0".into()));
        }
        Ok(TaskSampler {
            engine: engine.into_owned(),
            tasks: choices.tasks,
            cdf,
            sub_bin_share: choices.sub_bin_share,
        })
    }

    /// This engine in the working space of `state`: the schema's, with the working bins an
    /// earlier round placed ([`CollectionState::working_bins`]). Errors: adapted bins that do
    /// not fit the schema.
    pub fn at(&self, state: &CollectionState) -> Result<Cow<'_, Engine>, EngineError> {
        if state.working_bins.is_empty() {
            return Ok(Cow::Borrowed(self));
        }
        let mut engine = self.clone();
        for (&a, bins) in &state.working_bins {
            engine.space =
                engine
                    .space
                    .with_adapted_cuts(a, bins.cuts.clone(), bins.sub_bins.clone())?;
            if let Some(points) = &bins.points {
                engine.space = engine.space.with_point_mass_codes(a, points.clone());
            }
        }
        Ok(Cow::Owned(engine))
    }

    /// Sub-bins per working bin of a sub-bin 1-way ([`Space::sub_bin_cuts`]).
    pub(crate) fn sub_bins_per_bin(&self) -> usize {
        self.options.sub_bins.unwrap_or(SUB_BINS).max(1)
    }

    /// A protocol's task (working codes) as devices run it; a refinable 1-way goes to
    /// sub-bins with probability `sub_bin_share` (`None`: the engine's share).
    fn to_codes<R: Rng + ?Sized>(
        &self,
        task: TaskSpec,
        sub_bin_share: Option<f64>,
        rng: &mut R,
    ) -> TaskSpec {
        // Some of a binned attribute's 1-ways are measured in sub-bins (the shape within its
        // working bins), the others in the working bins (the bins' totals, at less noise).
        let share = sub_bin_share
            .or(self.options.sub_bin_share)
            .unwrap_or(SUB_BIN_ONE_WAY_SHARE)
            .clamp(0.0, 1.0);
        let sub_bins = (self.space.refinable(&task) && rng.random_bool(share))
            .then(|| self.sub_bins_per_bin());
        self.space.task_to_codes(task, sub_bins, self.epsilon)
    }

    /// The table a report answering `task` is counted in. SamPrivSyn and independence pool
    /// all batches in round 0 (same mechanism and ε, so pooling is exact by eq. 5 of
    /// PrivIncr); PrivIncr/auto keep one table per round.
    pub fn table_key(&self, task: &TaskSpec) -> TableKey {
        TableKey {
            round: if self.rules.pools_rounds() {
                0
            } else {
                task.round
            },
            factor: task.factor.clone(),
            mechanism: task.mechanism,
            bins: task.bins.clone(),
        }
    }

    /// The mechanism of a table (to validate and accumulate reports): over the product of
    /// the factor's (binned) schema domains.
    /// Errors: an invalid factor or bin map for the schema.
    pub fn mechanism(&self, key: &TableKey) -> Result<Mechanism, EngineError> {
        let dims =
            factor_dims_in(self.space.code_dims(), &key.factor, &key.bins).ok_or_else(|| {
                EngineError::InvalidState(format!(
                    "factor {:?} with bins {:?} does not fit the schema",
                    key.factor, key.bins
                ))
            })?;
        Ok(self.rules.table_mechanism(self, key, &dims)?)
    }

    /// Domain sizes of `factor`'s attributes under the bin maps `bins` (factor order); `None`
    /// for an attribute outside the schema or an invalid map.
    pub(crate) fn factor_dims(&self, factor: &[usize], bins: &[Vec<u32>]) -> Option<Vec<usize>> {
        factor_dims_in(self.dims(), factor, bins)
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
    /// plan), `auto`'s selection, or SamPrivSyn re-weighting. Deterministic given the tables
    /// (only tables of rounds ≤ the current round are read). Also the operator's "close
    /// round now". Errors: tables that do not fit their mechanisms.
    pub fn close_round(
        &self,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        let engine = self.at(state)?;
        engine.rules.close_round(&engine, state, tables)
    }

    /// The mechanism a report of factor `f` under the bin maps `bins` uses (its best oracle),
    /// with the factor's binned domain sizes; `None` for a factor or map that does not fit.
    fn best_mechanism(&self, f: &[usize], bins: &[Vec<u32>]) -> Option<(Mechanism, Vec<usize>)> {
        let dims = self.factor_dims(f, bins)?;
        let m = Mechanism::new(self.best_oracle(f, bins), self.epsilon, &dims).ok()?;
        Some((m, dims))
    }

    /// Standard error of every cell of factor `f` measured by `n` reports with its best
    /// oracle, when its marginal is `at` (one variance model: randomizer + sampling).
    pub(crate) fn cell_std_errors(
        &self,
        f: &[usize],
        bins: &[Vec<u32>],
        at: &[f64],
        n: f64,
    ) -> Vec<f64> {
        let n = n.max(1.0);
        let Some((m, _)) = self.best_mechanism(f, bins) else {
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

    /// Expected L1 error `√(2/π)·Σ_cells σ` of factor `f` under the bin maps `bins`
    /// measured by `n` reports with its best oracle, when its (binned) marginal is `at`
    /// (before any projection).
    pub(crate) fn expected_noise_l1(
        &self,
        f: &[usize],
        bins: &[Vec<u32>],
        at: &[f64],
        n: f64,
    ) -> f64 {
        (2.0 / std::f64::consts::PI).sqrt()
            * self.cell_std_errors(f, bins, at, n).iter().sum::<f64>()
    }

    /// Expected L1 error `√(2/π)·Σ_cells σ` of the marginal of `target` (attributes of
    /// `factor`) when it is summed from one table of `factor` under the bin maps `bins`
    /// (factor order) measured by `n` reports with the factor's best oracle, at a uniform
    /// marginal of `target`: the one variance model (the randomizer's variance summed over
    /// the factor's cells that merge into one target cell, plus sampling). Infinite for a
    /// factor or target that does not fit the schema.
    pub(crate) fn marginal_noise_l1(
        &self,
        factor: &[usize],
        bins: &[Vec<u32>],
        target: &[usize],
        n: f64,
    ) -> f64 {
        let Some((m, dims)) = self.best_mechanism(factor, bins) else {
            return f64::INFINITY;
        };
        let mut target_cells = 1usize;
        for t in target {
            match factor.iter().position(|a| a == t) {
                Some(i) => target_cells *= dims[i],
                None => return f64::INFINITY,
            }
        }
        let merged = dims.iter().product::<usize>() / target_cells;
        let x = 1.0 / target_cells as f64;
        // Exact variances are linear in 1/n: evaluate at one report and scale.
        let sd = ((summed_randomizer_variance(&m, merged, x, 1, None) + x * (1.0 - x))
            / n.max(1.0))
        .sqrt();
        (2.0 / std::f64::consts::PI).sqrt() * sd * target_cells as f64
    }

    /// Marks the state finalized (no more tasks).
    pub fn mark_finalized(&self, state: &mut CollectionState) {
        state.phase = Phase::Finalized;
        state.round_quota = None;
    }

    /// Builds the model from everything collected: every table becomes a measurement, the
    /// model graph keeps the candidate pairs with positive expected gain within the clique
    /// cap, and one graphical model is fitted to all measurements ([`super::estimate`]).
    /// SamPrivSyn with `samprivsyn_lasso` set keeps the paper's own estimator and data
    /// generation (eq. 7, eq. 11, Algorithm 2) for its synthetic rows.
    /// Deterministic given `(state, tables)`. Errors: tables that do not fit their
    /// mechanisms; [`EngineError::NoData`] when there are no reports at all.
    pub fn finalize(&self, state: &CollectionState, tables: &Tables) -> Result<Model, EngineError> {
        self.at(state)?.finalize_here(state, tables)
    }

    /// [`Engine::finalize`] in this engine's working space.
    fn finalize_here(
        &self,
        state: &CollectionState,
        tables: &Tables,
    ) -> Result<Model, EngineError> {
        let ms = self
            .measurements(tables, |_| true)?
            .with_population(self.target_users);
        if ms.items().is_empty() {
            return Err(EngineError::NoData);
        }
        // One report per person and collection, or per party when tables share records.
        let reports = ms.items().iter().map(|m| m.estimate.n);
        let people = if self.rules.tables_share_records() {
            reports.max().unwrap_or(0)
        } else {
            reports.sum()
        };
        // Rounds are strata of the population (people arrive in an order that may correlate
        // with their data); tables that share records are one stratum.
        let (ms, drift) = if self.rules.tables_share_records() {
            (ms, None)
        } else {
            let (ms, report) = crate::drift::post_stratify(ms);
            (ms, (report.round_weights.len() > 1).then_some(report))
        };
        let one_way = one_way_estimates(&ms);
        // A pair measured under bin maps (or several) is judged on its best binning.
        let gains: Vec<(Edge, PairGain)> = self
            .rules
            .model_candidates(self, state)
            .into_iter()
            .filter_map(|(a, b)| Some(((a, b), self.rules.pair_gain(state, &ms, &one_way, a, b)?)))
            .collect();
        let cap = clique_cap(self.options.max_clique_cells, people);
        let margin = self
            .options
            .gain_margin
            .unwrap_or_else(|| self.rules.gain_margin());
        let edges = select_model_graph(self.dims(), &gains, cap, margin);
        let ms = ms.retained(|m| self.rules.fit_table(&m.key, &edges));
        let fitted = fit_model(&ms, &edges, &FitOptions::default())?;
        let residuals = crate::estimate::fit_residuals(&ms, &fitted);
        let release_z = self
            .options
            .smoothing_release_z
            .unwrap_or(crate::smooth::SMOOTHING_RELEASE_Z);
        let fitted = crate::smooth::smooth_numeric_one_ways(&self.space, &ms, fitted, release_z);
        // Cliques are within the cap: one conditional per clique (no Algorithm 2 split).
        let structure = build_structure(self.dims(), &edges, &[], u64::MAX);
        let recovery = Recovery::new(&self.space, &ms);
        let source =
            FittedJoint::new(ms, fitted).with_shared_records(self.rules.tables_share_records());
        let gains = gains
            .into_iter()
            .map(|((a, b), g)| EdgeGain {
                a,
                b,
                observed_l1: g.observed_l1,
                noise_l1: g.noise_l1,
                dependence: g.dependence,
                dependence_sd: g.dependence_sd,
                kept: edges.contains(&(a, b)),
            })
            .collect();
        let model = self.rules.final_model(self, state, structure, source)?;
        Ok(model
            .with_gains(gains)
            .with_recovery(recovery)
            .with_rounds(round_summaries(state, tables))
            .with_drift(drift)
            .with_residuals(Some(residuals)))
    }
}

/// Per round, its tables with their reports (most first) and, for a pair, the score the
/// state recorded for it ([`EdgeState::score`], else its MI).
fn round_summaries(state: &CollectionState, tables: &Tables) -> Vec<RoundSummary> {
    let score = |f: &[usize]| match f {
        [a, b] => state
            .edges()
            .iter()
            .find(|e| (e.a, e.b) == (*a.min(b), *a.max(b)))
            .and_then(|e| e.score.or(e.mi)),
        _ => None,
    };
    let mut rounds: BTreeMap<u32, Vec<MeasuredFactor>> = BTreeMap::new();
    for (key, stats) in tables {
        rounds.entry(key.round).or_default().push(MeasuredFactor {
            factor: key.factor.clone(),
            mechanism: key.mechanism,
            bins: key.bins.clone(),
            reports: stats.n,
            score: score(&key.factor),
        });
    }
    rounds
        .into_iter()
        .map(|(round, mut factors)| {
            factors.sort_by(|x, y| y.reports.cmp(&x.reports).then(x.factor.cmp(&y.factor)));
            RoundSummary {
                round,
                reports: factors.iter().map(|f| f.reports).sum(),
                factors,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Domains a first report would allocate are bounded at creation: an attribute above
    /// MAX_ATTRIBUTE_DOMAIN always, a full-resolution pair above MAX_PAIR_CELLS for the
    /// protocols that measure pairs as they are (not `auto`, which bins them).
    #[test]
    fn domains_are_bounded_at_creation() {
        use ldpsyn::protocol::{PrivIncrParams, SamPrivSynParams};
        let eps = Epsilon::new(1.0).unwrap();
        let make = |dims: Vec<usize>, p: Protocol| {
            Engine::from_parts(dims, eps, 100, p, EngineOptions::default())
        };
        let auto = || Protocol::Auto(PrivIncrParams::default());
        assert!(make(vec![2, 1 << 16], auto()).is_err());
        assert!(make(vec![2000, 2000], auto()).is_ok());
        assert!(make(vec![2000, 2000], Protocol::Independence {}).is_ok());
        for p in [
            Protocol::Privincr(PrivIncrParams::default()),
            Protocol::Samprivsyn(SamPrivSynParams::default()),
        ] {
            let e = make(vec![3, 2000, 2000], p.clone()).unwrap_err();
            assert!(e.to_string().contains("attributes 1 and 2"), "{e}");
            assert!(make(vec![3, 1000, 1000], p).is_ok());
        }
    }

    /// The number of attributes is bounded at creation: MAX_ATTRIBUTES passes, one more is
    /// refused (per-pair structures grow with its square).
    #[test]
    fn attributes_are_bounded_at_creation() {
        let eps = Epsilon::new(1.0).unwrap();
        let make = |n: usize| {
            Engine::from_parts(
                vec![2; n],
                eps,
                100,
                Protocol::Independence {},
                EngineOptions::default(),
            )
        };
        assert!(make(MAX_ATTRIBUTES).is_ok());
        let e = make(MAX_ATTRIBUTES + 1).unwrap_err();
        assert!(e.to_string().contains("at most 512"), "{e}");
    }

    /// States stored before the tagged form carried every protocol's fields (and, before
    /// that, an `auto` significance `z` per edge): they read back as the tagged state, and
    /// the tagged state round-trips.
    #[test]
    fn stored_flat_states_read_back() {
        let edge = r#"{"a":0,"b":1,"active":true,"pruned_in":null,"mi":0.5,"tau":0.045,
            "ell":-0.2,"reports":1200,"score":null,"z":null}"#;
        let old = |protocol: &str, phase: &str, weights: &str| {
            format!(
                r#"{{"protocol":"{protocol}","phase":"{phase}","round":1,"round_quota":500,
                "edges":[{edge}],"plan":null,"pair_weights":{weights}}}"#
            )
        };
        for (text, expected) in [
            (
                old("privincr", "graph_construction", "[]"),
                ProtocolState::Privincr(PairRounds {
                    edges: vec![EdgeState {
                        a: 0,
                        b: 1,
                        active: true,
                        pruned_in: None,
                        mi: Some(0.5),
                        tau: 0.045,
                        ell: Some(-0.2),
                        reports: 1200,
                        score: None,
                        bins: vec![],
                    }],
                    plan: None,
                    first_round: 0,
                }),
            ),
            (
                old("samprivsyn", "pair_sampling", "[0.25,0.75]"),
                ProtocolState::Samprivsyn(PairSampling {
                    pair_weights: vec![0.25, 0.75],
                }),
            ),
            (
                old("independence", "one_way", "[]"),
                ProtocolState::Independence {},
            ),
        ] {
            let state: CollectionState = serde_json::from_str(&text).unwrap();
            assert_eq!(state.protocol, expected, "{text}");
            assert_eq!((state.round, state.round_quota), (1, Some(500)));
            let again: CollectionState =
                serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
            assert_eq!(again, state);
        }
        let auto: CollectionState =
            serde_json::from_str(&old("auto", "clique_measurement", "[]")).unwrap();
        assert_eq!(auto.edges().len(), 1);
        assert_eq!(auto.phase, Phase::CliqueMeasurement);
        assert!(auto.pair_weights().is_empty());
        let unknown = old("lopub", "one_way", "[]");
        assert!(serde_json::from_str::<CollectionState>(&unknown).is_err());
        // States before adaptive bins have none, and a state without any writes none.
        assert!(auto.working_bins.is_empty());
        assert!(
            !serde_json::to_string(&auto)
                .unwrap()
                .contains("working_bins")
        );
        let mut adapted = auto;
        adapted.working_bins.insert(
            3,
            AdaptedBins {
                cuts: vec![8, 9, 10, 15],
                sub_bins: vec![],
                points: None,
            },
        );
        let text = serde_json::to_string(&adapted).unwrap();
        assert!(text.contains(r#""working_bins":{"3":{"cuts":[8,9,10,15],"sub_bins":[]}}"#));
        assert_eq!(
            serde_json::from_str::<CollectionState>(&text).unwrap(),
            adapted
        );
    }
}
