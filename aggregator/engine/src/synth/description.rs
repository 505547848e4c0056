//! What a model was built from, as `GET /model` describes it: its marginals, the candidate
//! pairs and their gains, the rounds and what each measured.

use ldpsyn::mechanism::MechanismKind;
use serde::{Deserialize, Serialize};

use crate::fit::residuals::FitResiduals;
use crate::graph::EdgeState;
use crate::measure::drift::DriftReport;
use crate::select::structure::Structure;

/// A marginal served by [`Model::marginal`](crate::synth::model::Model::marginal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MarginalEstimate {
    /// Attributes (as requested).
    pub attrs: Vec<usize>,
    /// Their domain sizes.
    pub dims: Vec<usize>,
    /// Frequencies, row-major in `attrs` order, non-negative, sum 1.
    pub frequencies: Vec<f64>,
    /// Standard errors of the cells (frequencies): where some table measured all of `attrs`,
    /// the one variance model at the model's frequencies; else the spread across the
    /// parametric bootstrap's replicates ([`crate::synth::bootstrap`]); `None` where neither
    /// answers ([`crate::synth::model::Model::marginal`]).
    pub std_errors: Option<Vec<f64>>,
}

/// One candidate pair of the model graph and its expected gain
/// ([`crate::select::gain::PairGain`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeGain {
    /// First attribute.
    pub a: usize,
    /// Second attribute.
    pub b: usize,
    /// L1 distance between the pair's projected estimate and the product of its 1-ways.
    pub observed_l1: f64,
    /// L1 error of the pair's projected estimate (what keeping it costs).
    pub noise_l1: f64,
    /// Estimated dependence (L1 distance from independence, debiased for noise).
    pub dependence: f64,
    /// Standard deviation of the dependence estimate for an independent pair.
    #[serde(default)]
    pub dependence_sd: f64,
    /// In the model graph.
    pub kept: bool,
}

/// One factor a round measured (for `GET /model`): its table and the reports it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredFactor {
    /// Attributes in report order.
    pub factor: Vec<usize>,
    /// Mechanism of the reports.
    pub mechanism: MechanismKind,
    /// Bin maps of the factor's attributes over schema codes (empty: full resolution).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
    /// Reports (users) in the table.
    pub reports: u64,
    /// A pair's score where the protocol selected pairs by one (`auto`: estimated dependence,
    /// L1; PrivIncr: MI), from the round that decided on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

/// What one round (SamPrivSyn: batch) measured, from the tables at finalize.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundSummary {
    /// Round index (the tasks' round).
    pub round: u32,
    /// Reports in the round.
    pub reports: u64,
    /// Its tables, most reports first.
    pub factors: Vec<MeasuredFactor>,
}

/// Serializable description of a model (for `GET /model`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelDescription {
    /// Protocol name.
    pub protocol: String,
    /// Domain sizes.
    pub domain_sizes: Vec<usize>,
    /// Every pair evaluated in phase 1 with MI, thresholds and round pruned (PrivIncr/auto).
    pub edges: Vec<EdgeState>,
    /// Dependency graph, junction tree and conditionals (graphical models).
    pub structure: Option<Structure>,
    /// SamPrivSyn: pairs `(a, b, MI weight)`.
    pub pair_weights: Option<Vec<(usize, usize, f64)>>,
    /// Every measured candidate pair of the model graph with its expected gain.
    #[serde(default)]
    pub model_graph: Vec<EdgeGain>,
    /// Per round, what was measured and with how many reports.
    #[serde(default)]
    pub rounds: Vec<RoundSummary>,
    /// Per attribute, the cuts of the working bins the model was fitted in over its schema
    /// codes (`[]`: every code a bin): a `bins: "auto"` attribute's grid in its working bins,
    /// with the point masses `auto`'s (or PrivIncr's numeric) round 0 found as bins of their
    /// own ([`crate::domain::space`]).
    #[serde(default)]
    pub working_bins: Vec<Vec<u32>>,
    /// Whether the rounds measured different populations, per attribute
    /// ([`crate::measure::drift`]); `None` for a model of one round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftReport>,
    /// The fit checked against its measurements (graphical models;
    /// [`crate::fit::residuals::fit_residuals`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residuals: Option<FitResiduals>,
    /// Vertical collections: ε spent on one person over every party (Σ of the attributes'
    /// ε; the parties' reports are joined by record id, so they compose). `None` otherwise,
    /// and from [`Model::describe`](crate::synth::model::Model::describe), which does not know the collection's parties.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composed_epsilon: Option<f64>,
}
