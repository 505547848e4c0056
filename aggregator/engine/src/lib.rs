//! # ldpsyn-engine
//!
//! The estimation engine of ldpsyn: a deterministic state machine driven by sufficient
//! statistics, pure and IO-free (no async runtime, database or HTTP; the aggregator service
//! stores its state and tables and calls it).
//!
//! - [`tables`]: [`TableKey`] → `SufficientStatistics` (additive); every table becomes a
//!   measurement with per-cell variances from one model (randomizer + sampling).
//! - [`state`]: [`Engine`] (from the public collection config), the serializable
//!   [`CollectionState`], task assignment ([`Engine::draw_task`]), round transitions
//!   ([`Engine::should_close`], [`Engine::close_round`]) and [`Engine::finalize`].
//! - [`protocols`]: one module per protocol behind one trait (PrivIncr/NoIncremental pruning,
//!   `auto`'s screening and selection, SamPrivSyn re-weighting, independence), dispatched
//!   once by the engine.
//! - [`central`]: a curator's central-DP synthesizer (select–measure–generate under zCDP,
//!   PPSyn Alg. 1 on AIM's loop) over the same graphical model.
//! - [`drift`]: rounds as strata of the population: a heterogeneity test between rounds and
//!   every table calibrated to the population's post-stratified 1-ways.
//! - [`estimate`]: the model graph (pairs kept by expected gain within a clique cap) and the
//!   observations every measurement gives the fit.
//! - [`pgm`]: the graphical model fitted to every measurement (mirror descent + belief
//!   propagation on the junction tree; private-pgm, PrivMRF/VertiMRF §5, PPSyn §3.3).
//! - [`info`]: MI, τ, η, ΔI, ℓ (PrivIncr eqs. 14–18).
//! - [`graph`]: triangulation, maximal cliques, junction tree.
//! - [`plan`]: conditionals of the junction tree, Algorithm 2 of PrivIncr with mRMR.
//! - [`model`]: the [`Model`]: marginals with standard errors, streaming synthesis.
//! - [`space`]: schema codes ↔ working bins (fine-grid numeric attributes).
//! - [`smooth`]: a numeric attribute's 1-way smoothed over its ordered bins (SURE-chosen).
//! - [`samprivsyn`]: SamPrivSyn's own estimation and data generation (eq. 7, eq. 11, Alg. 2).
//! - [`sketch`]: VertiMRF's DP Flajolet–Martin sketches: party-side LocEnc (Alg. 1, 3) and
//!   server-side CarEst (Alg. 4), with Theorem 2's accounting.
//!
//! Reductions iterate tables in key order (`BTreeMap`), so the same multiset of reports gives
//! the same model whatever the order in which they arrived.
//!
//! ```
//! use ldpsyn::Epsilon;
//! use ldpsyn::mechanism::SufficientStatistics;
//! use ldpsyn::protocol::Protocol;
//! use ldpsyn_engine::{Engine, EngineOptions, Tables};
//! use rand::{Rng, SeedableRng};
//!
//! // Two attributes (3 and 2 values), 5,000 people, ε = 2, one attribute per report.
//! let engine = Engine::from_parts(
//!     vec![3, 2],
//!     Epsilon::new(2.0).unwrap(),
//!     5_000,
//!     Protocol::Independence {},
//!     EngineOptions::default(),
//! )
//! .unwrap();
//! let state = engine.initial_state();
//! let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(1);
//! let mut tables = Tables::new();
//! for person in 0..5_000u32 {
//!     let record = [person % 3, u32::from(rng.random_bool(0.3))];
//!     let task = engine.draw_task(&state, &mut rng).unwrap();
//!     let key = engine.table_key(&task);
//!     let mechanism = engine.mechanism(&key).unwrap();
//!     let codes: Vec<u32> = task.factor.iter().map(|&a| record[a]).collect();
//!     let report = mechanism.randomize(&codes, &mut rng).unwrap();
//!     let stats = tables
//!         .entry(key)
//!         .or_insert_with(|| SufficientStatistics::new(&mechanism));
//!     mechanism.accumulate(&report, stats).unwrap();
//! }
//! let model = engine.finalize(&state, &tables).unwrap();
//! let one_way = model.marginal(&[0]).unwrap();
//! assert!((one_way.frequencies.iter().sum::<f64>() - 1.0).abs() < 1e-9);
//! let rows: Vec<Vec<u32>> = model.synthesize(3, 42).collect();
//! assert_eq!(rows.len(), 3);
//! ```
#![warn(missing_docs)]

pub mod central;
pub mod drift;
pub mod estimate;
pub mod graph;
pub mod info;
pub mod model;
pub mod pgm;
pub mod plan;
pub mod protocols;
pub mod samprivsyn;
pub mod sketch;
pub mod smooth;
pub mod space;
pub mod state;
pub mod tables;
pub mod tuning;

pub use drift::{AttributeDrift, DriftReport};
pub use estimate::{FitResiduals, TableResidual};
pub use graph::{Edge, EdgeState, JunctionTree};
pub use model::{
    EdgeGain, Expansion, FittedJoint, JointSource, MAX_ELIMINATION_CELLS, MarginalEstimate,
    MeasuredFactor, Model, ModelDescription, Recovery, RoundSummary, Synthesizer,
};
pub use plan::{Conditional, Structure};
pub use space::Space;
pub use state::{
    CollectionState, Engine, EngineOptions, MAX_ATTRIBUTES, PairRounds, PairSampling, Phase,
    Phase2Plan, PlannedFactor, ProtocolState, TaskSampler, TaskSpec, Transition,
};
pub use tables::{Combined, Measurements, TableKey, Tables, TablesError};

use ldpsyn::mechanism::MechanismError;

/// Errors of the engine.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The collection config cannot be run.
    #[error("invalid collection config: {0}")]
    InvalidConfig(String),
    /// The state does not fit the protocol (e.g. a phase-2 state without a plan).
    #[error("invalid collection state: {0}")]
    InvalidState(String),
    /// The collection is finalized: no more tasks.
    #[error("the collection is finalized")]
    Finalized,
    /// The collection hands out no device tasks (a vertical collection takes party uploads).
    #[error("a vertical collection takes party uploads, not device tasks")]
    NoDeviceTasks,
    /// Nothing was collected.
    #[error("no reports to build a model from")]
    NoData,
    /// A marginal request names empty, repeated or unknown attributes, or is too large.
    #[error("bad attribute list: {0}")]
    BadAttributes(String),
    /// An estimator failed.
    #[error("estimation failed: {0}")]
    Estimation(String),
    /// A mechanism could not be built.
    #[error(transparent)]
    Mechanism(#[from] MechanismError),
    /// A table does not fit its mechanism.
    #[error(transparent)]
    Tables(#[from] TablesError),
}
