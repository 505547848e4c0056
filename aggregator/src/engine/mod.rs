//! The estimation engine: a deterministic state machine driven by sufficient statistics.
//!
//! - [`tables`]: [`TableKey`] → `SufficientStatistics` (additive), and the inverse-variance
//!   combination of every table containing a set of attributes.
//! - [`state`]: [`Engine`] (from the public collection config), the serializable
//!   [`CollectionState`], task assignment ([`Engine::draw_task`]), round transitions
//!   ([`Engine::should_close`], [`Engine::close_round`]) and [`Engine::finalize`].
//! - [`info`]: MI, τ, η, ΔI, ℓ (PrivIncr eqs. 14–18).
//! - [`graph`]: triangulation, maximal cliques, junction tree.
//! - [`plan`]: conditionals of the junction tree, Algorithm 2 with mRMR.
//! - [`model`]: the [`Model`]: marginals with standard errors, streaming synthesis.
//! - [`samprivsyn`]: SamPrivSyn's estimation and data generation.
//!
//! Nothing here knows about HTTP or databases. Reductions iterate tables in key order
//! (`BTreeMap`), so the same multiset of reports gives the same model whatever the order in
//! which they arrived.

pub mod estimate;
pub mod graph;
pub mod info;
pub mod model;
pub mod pgm;
pub mod plan;
pub mod samprivsyn;
pub mod state;
pub mod tables;

pub use graph::{Edge, JunctionTree};
pub use model::{
    EdgeGain, FittedJoint, JointSource, MarginalEstimate, Model, ModelDescription, Synthesizer,
};
pub use plan::{Conditional, Structure};
pub use state::{
    CollectionState, EdgeState, Engine, EngineOptions, Phase, Phase2Plan, PlannedFactor, TaskSpec,
    Transition,
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
