//! # ldpsyn-engine
//!
//! The estimation engine of ldpsyn: a deterministic state machine driven by sufficient
//! statistics, pure and IO-free (no async runtime, database or HTTP; the aggregator service
//! stores its state and tables and calls it).
//!
//! The engine is a layered pipeline; a module imports only from its own layer or those
//! below it (checked by `tests/layering.rs`), bottom to top:
//!
//! - [`numeric`]: information measures (PrivIncr eqs. 14–18), index maps over product
//!   domains, χ² tails.
//! - [`graph`]: triangulation, maximal cliques, junction tree.
//! - [`domain`]: schema codes ↔ working bins ([`Space`]), the working [`Domain`] (sizes) and
//!   its [`Clique`]s, tasks ([`TaskSpec`]), the key of a table ([`TableKey`]), a factor with
//!   its bin maps ([`BinnedFactor`]).
//! - [`measure`]: [`TableKey`] → `SufficientStatistics` (additive); every table becomes a
//!   measurement with per-cell variances from one model (randomizer + sampling); rounds as
//!   strata of the population ([`measure::drift`]); VertiMRF's party sketches
//!   ([`measure::sketch`], Alg. 1, 3, 4).
//! - [`select`]: a pair's expected gain, the model graph within a clique cap, the
//!   conditionals of its junction tree (PrivIncr Algorithm 2 with mRMR).
//! - [`fit`]: the graphical model fitted to every measurement (mirror descent + belief
//!   propagation on the junction tree; private-pgm, PrivMRF/VertiMRF §5, PPSyn §3.3), its
//!   residuals, a numeric attribute's smoothed 1-way.
//! - [`synth`]: the [`Model`]: marginals with standard errors, within-bin recovery,
//!   streaming synthesis; SamPrivSyn's own generator (eq. 7, eq. 11, Alg. 2).
//! - [`state`]: what a collection has decided ([`CollectionState`]), serde data only.
//! - [`protocols`]: one module per protocol behind one trait, each seeing its collection
//!   through a [`Context`] (PrivIncr/NoIncremental pruning, `auto`'s screening and
//!   selection, SamPrivSyn re-weighting, independence, vertical).
//! - [`pipeline`]: finalization as named stages (measure, stratify, select, fit, release).
//! - [`engine`]: [`Engine`] (from the public collection config): task assignment
//!   ([`Engine::draw_task`]), round transitions ([`Engine::should_close`],
//!   [`Engine::close_round`]) and [`Engine::finalize`].
//! - [`central`]: a curator's central-DP synthesizer (select–measure–generate under zCDP,
//!   PPSyn Alg. 1 on AIM's loop) over the same graphical model.
//! - [`tuning`]: every tuning constant with its option, environment variable and sweep.
//!
//! Reductions iterate tables in key order (`BTreeMap`), so the same multiset of reports gives
//! the same model whatever the order in which they arrived.
//!
//! ```
//! use ldpsyn::Epsilon;
//! use ldpsyn::mechanism::SufficientStatistics;
//! use ldpsyn::wire::Protocol;
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
// The module and item docs are the engine's design reference and link the crate-private
// items they describe (the public API is cut to what other crates use); read them with
// `cargo doc --document-private-items`, where every such link resolves.
#![allow(rustdoc::private_intra_doc_links)]

pub mod central;
pub mod domain;
pub(crate) mod engine;
pub(crate) mod fit;
pub mod graph;
pub mod measure;
pub mod numeric;
pub(crate) mod pipeline;
pub mod protocols;
pub mod select;
pub(crate) mod state;
pub(crate) mod synth;
pub mod tuning;

pub use domain::binned::BinnedFactor;
pub use domain::key::TableKey;
pub use domain::sizes::Domain;
pub use domain::space::Space;
pub use domain::task::TaskSpec;
pub use engine::{Engine, MAX_ATTRIBUTES, TaskSampler};
pub use fit::joint::{FittedJoint, JointSource};
pub use fit::residuals::{FitResiduals, TableResidual};
pub use graph::{Clique, Edge, EdgeState, JunctionTree};
pub use measure::drift::{AttributeDrift, DriftReport};
pub use measure::measurement::Measurement;
pub use measure::tables::{Combined, Measurements, Tables, TablesError};
pub use protocols::context::Context;
pub use protocols::cross_party::PartyUploads;
pub use protocols::rounds::{RoundKind, RoundPlan, RoundState};
pub use select::structure::{Conditional, Structure};
pub use state::{
    CollectionState, EngineOptions, PairRounds, PairSampling, Phase, Phase2Plan, PlannedFactor,
    ProtocolState, Transition,
};
pub use synth::description::{
    EdgeGain, MarginalEstimate, MeasuredFactor, ModelDescription, RoundSummary,
};
pub use synth::fitness::{FitnessReport, People, fitness};
pub use synth::inference::MAX_ELIMINATION_CELLS;
pub use synth::model::Model;
pub use synth::recovery::{Expansion, Recovery};
pub use synth::sampler::{SAMPRIVSYN_CHUNK_ROWS, Synthesizer};

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
