//! The finalized model: estimated conditionals (or SamPrivSyn pair tables), marginals with
//! standard errors, streaming synthesis, and a serializable description.
//!
//! **Clique estimation.** The joint table of each conditional's scope is the marginal of
//! the graphical model fitted to every measurement ([`crate::fit::observe`], [`crate::fit::pgm`]):
//! conditionals that share attributes agree on them by construction.
//!
//! **Sampling** is forward (ancestral) sampling through the conditionals in junction-tree
//! order ([`crate::synth::sampler`]); marginals are exact, by variable elimination
//! ([`crate::synth::inference`]), with standard errors from the fit ([`crate::fit::joint`]).

use std::sync::{Arc, OnceLock};

use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;

use crate::EngineError;
use crate::domain::sizes::Domain;
use crate::fit::joint::JointSource;
use crate::fit::residuals::FitResiduals;
use crate::graph::EdgeState;
use crate::measure::drift::DriftReport;
use crate::select::structure::Structure;
use crate::synth::bootstrap::Replicates;
use crate::synth::description::{EdgeGain, MarginalEstimate, ModelDescription, RoundSummary};
use crate::synth::inference::{MAX_ELIMINATION_CELLS, infer};
use crate::synth::recovery::{Expansion, Recovery};
use crate::synth::sampler::{EstimatedConditional, SynthInner, Synthesizer, compile};
use crate::synth::samprivsyn::SamPrivSynModel;

/// A marginal's frequencies below this are answered as 0: a millionth of one person in a
/// population of a billion, they are the fit's floating-point residue (a log-potential
/// pushed towards −∞ for a cell nobody is in, e.g. 4e-301), not an estimate.
pub const MARGINAL_ZERO: f64 = 1e-15;

/// `frequencies` with the residue below [`MARGINAL_ZERO`] set to 0 and the rest rescaled to
/// the same total.
fn without_residue(mut frequencies: Vec<f64>) -> Vec<f64> {
    let total: f64 = frequencies.iter().sum();
    let mut kept = 0.0;
    for f in &mut frequencies {
        if *f < MARGINAL_ZERO {
            *f = 0.0;
        }
        kept += *f;
    }
    if kept > 0.0 && kept != total {
        let scale = total / kept;
        frequencies.iter_mut().for_each(|f| *f *= scale);
    }
    frequencies
}

#[derive(Debug, Clone)]
enum ModelKind {
    Graphical {
        structure: Structure,
        factors: Arc<Vec<EstimatedConditional>>,
    },
    SamPrivSyn(Arc<SamPrivSynModel>),
}

/// A finalized model. Cheap to clone (shared tables).
#[derive(Debug, Clone)]
pub struct Model {
    protocol: String,
    dims: Domain,
    /// Working bins → schema codes (`None`: the working space is the schema's).
    recovery: Option<Arc<Recovery>>,
    edges: Vec<EdgeState>,
    gains: Vec<EdgeGain>,
    rounds: Vec<RoundSummary>,
    drift: Option<DriftReport>,
    residuals: Option<FitResiduals>,
    kind: ModelKind,
    source: Arc<dyn JointSource>,
    /// The parametric bootstrap's replicates of the source's fit, drawn on the first marginal
    /// that needs them and shared by clones (`None` inside: they could not be drawn).
    replicates: Arc<OnceLock<Option<Replicates>>>,
}

impl Model {
    /// A graphical model over the working `dims` (one size per attribute): each conditional
    /// of `structure` estimated from `source`.
    pub fn graphical(
        protocol: &str,
        dims: Domain,
        edges: Vec<EdgeState>,
        structure: Structure,
        source: impl JointSource + 'static,
    ) -> Self {
        let factors = structure
            .conditionals
            .iter()
            .map(|c| EstimatedConditional::new(c.clone(), &dims, &source))
            .collect();
        Self {
            protocol: protocol.into(),
            dims,
            recovery: None,
            edges,
            gains: Vec::new(),
            rounds: Vec::new(),
            drift: None,
            residuals: None,
            kind: ModelKind::Graphical {
                structure,
                factors: Arc::new(factors),
            },
            source: Arc::new(source),
            replicates: Arc::default(),
        }
    }

    pub(crate) fn samprivsyn(model: SamPrivSynModel, source: impl JointSource + 'static) -> Self {
        Self {
            protocol: "samprivsyn".into(),
            dims: Domain::from(model.dims()),
            recovery: None,
            edges: Vec::new(),
            gains: Vec::new(),
            rounds: Vec::new(),
            drift: None,
            residuals: None,
            kind: ModelKind::SamPrivSyn(Arc::new(model)),
            source: Arc::new(source),
            replicates: Arc::default(),
        }
    }

    /// The model with the model graph's candidate pairs and their gains (for
    /// [`Model::describe`]).
    pub(crate) fn with_gains(mut self, gains: Vec<EdgeGain>) -> Self {
        self.gains = gains;
        self
    }

    /// The model with its per-round summary (for [`Model::describe`]).
    pub(crate) fn with_rounds(mut self, rounds: Vec<RoundSummary>) -> Self {
        self.rounds = rounds;
        self
    }

    /// The model with the heterogeneity of its rounds (for [`Model::describe`]; `None` for
    /// one round).
    pub(crate) fn with_drift(mut self, drift: Option<DriftReport>) -> Self {
        self.drift = drift;
        self
    }

    /// The model with its fit's residuals (for [`Model::describe`]).
    pub(crate) fn with_residuals(mut self, residuals: Option<FitResiduals>) -> Self {
        self.residuals = residuals;
        self
    }

    /// The fit checked against its measurements ([`crate::fit::residuals::fit_residuals`]).
    pub fn residuals(&self) -> Option<&FitResiduals> {
        self.residuals.as_ref()
    }

    /// The heterogeneity of the rounds the model was fitted to ([`crate::measure::drift`]).
    pub fn drift(&self) -> Option<&DriftReport> {
        self.drift.as_ref()
    }

    /// The model with the way back from its working bins to schema codes (see
    /// [`Recovery`]; `None` keeps the model's codes).
    pub(crate) fn with_recovery(mut self, recovery: Option<Recovery>) -> Self {
        self.recovery = recovery.map(Arc::new);
        self
    }

    /// Working domain sizes (the model's; [`crate::domain::space`]).
    pub fn dims(&self) -> &[usize] {
        self.dims.sizes()
    }

    /// The working domain ([`Model::dims`] as a [`Domain`]).
    pub fn domain(&self) -> &Domain {
        &self.dims
    }

    /// Schema domain sizes: of the codes [`Model::synthesize`] and [`Model::marginal`] give.
    pub fn schema_dims(&self) -> &[usize] {
        self.recovery
            .as_ref()
            .map_or(self.dims.sizes(), |r| r.space.code_dims())
    }

    /// The dependency-graph edges of the model (attribute pairs), sorted.
    pub fn graph_edges(&self) -> Vec<(usize, usize)> {
        match &self.kind {
            ModelKind::Graphical { structure, .. } => structure.edges.clone(),
            ModelKind::SamPrivSyn(_) => Vec::new(),
        }
    }

    /// Per round, what was measured and with how many reports.
    pub fn rounds(&self) -> &[RoundSummary] {
        &self.rounds
    }

    /// The estimated conditionals (graphical models).
    pub fn conditionals(&self) -> Option<&[EstimatedConditional]> {
        match &self.kind {
            ModelKind::Graphical { factors, .. } => Some(factors),
            ModelKind::SamPrivSyn(_) => None,
        }
    }

    /// The serializable description.
    pub fn describe(&self) -> ModelDescription {
        ModelDescription {
            protocol: self.protocol.clone(),
            domain_sizes: self.dims.sizes().to_vec(),
            edges: self.edges.clone(),
            structure: match &self.kind {
                ModelKind::Graphical { structure, .. } => Some(structure.clone()),
                ModelKind::SamPrivSyn(_) => None,
            },
            pair_weights: match &self.kind {
                ModelKind::SamPrivSyn(m) => Some(m.pair_weights()),
                ModelKind::Graphical { .. } => None,
            },
            model_graph: self.gains.clone(),
            rounds: self.rounds.clone(),
            working_bins: (0..self.dims.len())
                .map(|a| {
                    self.recovery
                        .as_ref()
                        .map_or_else(Vec::new, |r| r.space.cuts(a).to_vec())
                })
                .collect(),
            drift: self.drift.clone(),
            residuals: self.residuals.clone(),
            composed_epsilon: None,
        }
    }

    /// The marginal of `attrs` (distinct attribute indices, cells row-major in this order)
    /// under the model (exact variable elimination over the conditionals), with standard
    /// errors where some table contains all of `attrs` ([`JointSource::std_errors`]), else
    /// from the parametric bootstrap of the fit ([`JointSource::bootstrap`],
    /// [`crate::synth::bootstrap`]: the first such call draws and refits the replicates, up
    /// to 64 fits; later calls one elimination per replicate); `None` where neither answers.
    /// Errors: empty, repeated or unknown attributes; more than 2^22 cells; an elimination
    /// that would build a table of more than [`MAX_ELIMINATION_CELLS`] cells on the way.
    pub fn marginal(&self, attrs: &[usize]) -> Result<MarginalEstimate, EngineError> {
        let (dims, frequencies) = self.working_marginal(attrs)?;
        let std_errors = self.source.std_errors(attrs, &frequencies).or_else(|| {
            let input = self.source.bootstrap(attrs)?;
            self.replicates
                .get_or_init(|| Replicates::draw(input))
                .as_ref()?
                .std_errors(&self.dims, attrs)
                .filter(|s| s.len() == frequencies.len())
        });
        let (frequencies, std_errors) = match &self.recovery {
            // Within a working bin, shares follow the code distribution: the bin's standard
            // error is split the same way (the recovery's own error is not in it).
            Some(r) => (
                r.expand(attrs, &frequencies),
                std_errors.map(|s| r.expand(attrs, &s)),
            ),
            None => (frequencies, std_errors),
        };
        Ok(MarginalEstimate {
            std_errors,
            attrs: attrs.to_vec(),
            dims,
            frequencies: without_residue(frequencies),
        })
    }

    /// The marginal of `attrs` as [`Model::marginal`] gives it, without standard errors (so
    /// never drawing the bootstrap's replicates): for callers that want the frequencies only.
    /// Errors: as [`Model::marginal`].
    pub fn frequencies(&self, attrs: &[usize]) -> Result<Vec<f64>, EngineError> {
        let (_, frequencies) = self.working_marginal(attrs)?;
        Ok(without_residue(match &self.recovery {
            Some(r) => r.expand(attrs, &frequencies),
            None => frequencies,
        }))
    }

    /// The schema domain sizes of `attrs` and their marginal over the working bins, checked
    /// as [`Model::marginal`] says.
    pub(crate) fn working_marginal(
        &self,
        attrs: &[usize],
    ) -> Result<(Vec<usize>, Vec<f64>), EngineError> {
        let d = self.dims.len();
        if attrs.is_empty()
            || attrs.iter().any(|&a| a >= d)
            || (1..attrs.len()).any(|i| attrs[..i].contains(&attrs[i]))
        {
            return Err(EngineError::BadAttributes(format!("{attrs:?}")));
        }
        let dims: Vec<usize> = attrs.iter().map(|&a| self.schema_dims()[a]).collect();
        let cells = dims.iter().try_fold(1usize, |acc, &k| acc.checked_mul(k));
        if cells.is_none_or(|c| c > 1 << 22) {
            return Err(EngineError::BadAttributes("marginal too large".into()));
        }
        let frequencies = match &self.kind {
            ModelKind::Graphical { factors, .. } => {
                infer(&self.dims, factors, attrs, MAX_ELIMINATION_CELLS)?
            }
            ModelKind::SamPrivSyn(_) => self.source.joint(attrs),
        };
        Ok((dims, frequencies))
    }

    /// Streams `rows` synthetic records (schema codes, one per attribute) from `seed`, each
    /// working bin recovered as [`Expansion::Recover`]. Graphical models use constant memory;
    /// SamPrivSyn builds its table in chunks of [`SAMPRIVSYN_CHUNK_ROWS`](crate::synth::sampler::SAMPRIVSYN_CHUNK_ROWS) rows (the eq. 12
    /// updating needs a table), so its memory is bounded too. The same model and seed give
    /// the same rows.
    pub fn synthesize(&self, rows: u64, seed: u64) -> Synthesizer {
        self.synthesize_with(rows, seed, Expansion::Recover)
    }

    /// As [`Model::synthesize`], with working bins turned into codes per `how`.
    pub fn synthesize_with(&self, rows: u64, seed: u64, how: Expansion) -> Synthesizer {
        let expand = self.recovery.as_ref().map(|r| {
            // Its own stream, so rows over identity spaces are exactly as before.
            let rng = ChaCha12Rng::seed_from_u64(seed ^ 0x05EE_D0FC_0DE5);
            (Arc::clone(r), how, Box::new(rng))
        });
        let mut s = self.synthesize_working(rows, seed);
        s.expand = expand;
        s
    }

    fn synthesize_working(&self, rows: u64, seed: u64) -> Synthesizer {
        match &self.kind {
            ModelKind::Graphical { factors, .. } => Synthesizer {
                inner: SynthInner::Forward {
                    factors: compile(factors),
                    rng: Box::new(ChaCha12Rng::seed_from_u64(seed)),
                },
                d: self.dims.len(),
                remaining: rows,
                expand: None,
            },
            ModelKind::SamPrivSyn(m) => Synthesizer {
                inner: SynthInner::Table {
                    model: Arc::clone(m),
                    seed,
                    chunk: 0,
                    left: rows,
                    table: Vec::new(),
                    next: 0,
                },
                d: self.dims.len(),
                remaining: rows,
                expand: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The residue of the fit is answered as 0 (issue 70 item 9: a provisional marginal
    /// answered 4.07e-301 for an empty cell); the rest keeps its total; a marginal without
    /// residue is unchanged.
    #[test]
    fn residue_is_zero() {
        assert_eq!(
            without_residue(vec![0.25, 4.07e-301, 0.75]),
            vec![0.25, 0.0, 0.75]
        );
        let f = without_residue(vec![0.5, 5e-16, 0.5 - 5e-16]);
        assert_eq!(f[1], 0.0);
        assert!((f.iter().sum::<f64>() - 1.0).abs() <= 1e-15);
        let above = vec![2e-15, 0.5, 0.5 - 2e-15];
        assert_eq!(without_residue(above.clone()), above);
    }
}
