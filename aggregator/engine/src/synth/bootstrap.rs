//! Marginals of the parametric bootstrap's replicate models ([`crate::fit::bootstrap`]
//! draws and refits them): each replicate kept as its conditionals over the junction tree,
//! a marginal's standard error the spread of its value across them.

use crate::EngineError;
use crate::domain::sizes::Domain;
use crate::fit::bootstrap::{
    BootstrapInputs, MIN_BOOTSTRAP_REPLICATES, replicate_count, replicate_fits,
};
use crate::fit::joint::{JointSource, clique_joint};
use crate::fit::pgm::GraphicalModel;
use crate::select::structure::clique_conditionals;
use crate::synth::inference::{MAX_ELIMINATION_CELLS, infer};
use crate::synth::sampler::EstimatedConditional;

/// Most cells of a marginal whose standard errors come from the replicates (each query runs
/// one elimination per replicate).
pub const MAX_BOOTSTRAP_MARGINAL_CELLS: usize = 1 << 16;

/// The refitted models of the parametric bootstrap of one fit, each as its conditionals over
/// the junction tree (root-first).
pub(crate) struct Replicates {
    models: Vec<Vec<EstimatedConditional>>,
}

impl std::fmt::Debug for Replicates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Replicates({})", self.models.len())
    }
}

impl Replicates {
    /// Draws and refits the replicates of `input`'s fit
    /// ([`crate::fit::bootstrap::replicate_fits`]; at most
    /// [`crate::fit::bootstrap::BOOTSTRAP_REPLICATES`], fewer for a large model). `None` if
    /// fewer than [`MIN_BOOTSTRAP_REPLICATES`] fit in the bound or succeed.
    pub(crate) fn draw(input: BootstrapInputs<'_>) -> Option<Self> {
        let cells: usize = input.model.clique_marginals().iter().map(Vec::len).sum();
        let b = replicate_count(cells)?;
        let mut models = Vec::with_capacity(b);
        replicate_fits(
            input,
            b,
            &|attrs| model_marginal(input.model, attrs).ok(),
            &mut |fitted| models.push(conditionals(&fitted)),
        );
        (models.len() >= MIN_BOOTSTRAP_REPLICATES).then_some(Self { models })
    }

    /// Standard errors of the marginal of `attrs` over `domain` (row-major in `attrs` order,
    /// frequencies): each cell's sample standard deviation across the replicates. `None`
    /// above [`MAX_BOOTSTRAP_MARGINAL_CELLS`] cells or if an elimination fails.
    pub(crate) fn std_errors(&self, domain: &Domain, attrs: &[usize]) -> Option<Vec<f64>> {
        let cells = domain.checked_cells(attrs)?;
        if cells > MAX_BOOTSTRAP_MARGINAL_CELLS {
            return None;
        }
        let (mut sum, mut sq) = (vec![0.0; cells], vec![0.0; cells]);
        for factors in &self.models {
            let m = infer(domain, factors, attrs, MAX_ELIMINATION_CELLS).ok()?;
            for ((s, q), x) in sum.iter_mut().zip(&mut sq).zip(&m) {
                *s += x;
                *q += x * x;
            }
        }
        let b = self.models.len() as f64;
        Some(
            sum.iter()
                .zip(&sq)
                .map(|(s, q)| ((q - s * s / b) / (b - 1.0)).max(0.0).sqrt())
                .collect(),
        )
    }
}

/// A bare fitted model as a joint source (for its conditionals).
#[derive(Debug)]
struct Bare<'a>(&'a GraphicalModel);

impl JointSource for Bare<'_> {
    fn joint(&self, scope: &[usize]) -> Vec<f64> {
        clique_joint(self.0, scope)
    }
}

/// The model's conditionals over its junction tree, root-first: one per clique, its
/// attributes beyond its parent's separator given the separator (their product is the
/// model), as the pipeline's structure has them ([`clique_conditionals`] with no split).
fn conditionals(model: &GraphicalModel) -> Vec<EstimatedConditional> {
    let tree = model.tree();
    tree.traversal()
        .into_iter()
        .flat_map(|(c, parent)| {
            let separator = parent.map(|p| tree.separator(c, p)).unwrap_or_default();
            clique_conditionals(&tree.cliques[c], &separator, &[], model.domain(), u64::MAX)
        })
        .map(|c| EstimatedConditional::new(c, model.domain(), &Bare(model)))
        .collect()
}

/// `model`'s exact marginal of `attrs` (row-major in `attrs` order): read off a clique that
/// holds them, else by variable elimination over its conditionals. Errors: an elimination
/// above [`MAX_ELIMINATION_CELLS`].
fn model_marginal(model: &GraphicalModel, attrs: &[usize]) -> Result<Vec<f64>, EngineError> {
    if let Some(m) = model.marginal_in_clique(attrs) {
        return Ok(m);
    }
    infer(
        model.domain(),
        &conditionals(model),
        attrs,
        MAX_ELIMINATION_CELLS,
    )
}
