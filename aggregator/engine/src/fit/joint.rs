//! The graphical model fitted to every measurement, as the source of the joint tables the
//! released model's conditionals and marginals are read from, with standard errors from the
//! measurements it was fitted to.

use crate::domain::key::TableKey;
use crate::fit::pgm::GraphicalModel;
use crate::measure::tables::Measurements;

/// Where joint tables of attribute sets come from.
pub trait JointSource: Send + Sync + std::fmt::Debug {
    /// A distribution over the product domain of `scope` (row-major in `scope` order,
    /// non-negative, sums to 1). Models call it for scopes inside one clique of their
    /// structure.
    fn joint(&self, scope: &[usize]) -> Vec<f64>;
    /// Standard errors of the marginal of `attrs` whose model estimate is `frequencies`, if
    /// the source can tell.
    fn std_errors(&self, attrs: &[usize], frequencies: &[f64]) -> Option<Vec<f64>> {
        let _ = (attrs, frequencies);
        None
    }
}

/// The graphical model fitted to every measurement ([`crate::fit::observe::fit_model`]), with
/// the measurements kept for standard errors.
#[derive(Debug, Clone)]
pub struct FittedJoint {
    ms: Measurements,
    model: GraphicalModel,
    shared_records: bool,
}

impl FittedJoint {
    /// Wraps a fit and the measurements it was fitted to, each table of its own users.
    pub fn new(ms: Measurements, model: GraphicalModel) -> Self {
        Self {
            ms,
            model,
            shared_records: false,
        }
    }

    /// The same, for tables that all count reports of the same records (a vertical
    /// collection): a 1-way and every pair containing it are then one estimate, not
    /// independent ones, and a marginal's standard errors are those of the table over
    /// exactly its attributes.
    pub fn with_shared_records(mut self, shared: bool) -> Self {
        self.shared_records = shared;
        self
    }

    /// The measurements.
    pub fn measurements(&self) -> &Measurements {
        &self.ms
    }

    /// The fitted model.
    pub fn model(&self) -> &GraphicalModel {
        &self.model
    }
}

/// `model`'s marginal of `scope` (row-major in `scope` order) when a clique holds it, else the
/// maximum-entropy completion of its 1-ways (the models built here only ask for scopes inside
/// cliques).
pub(crate) fn clique_joint(model: &GraphicalModel, scope: &[usize]) -> Vec<f64> {
    model.marginal_in_clique(scope).unwrap_or_else(|| {
        scope.iter().fold(vec![1.0], |acc, &a| {
            let one = model
                .marginal_in_clique(&[a])
                .expect("every attribute lies in a clique");
            acc.iter()
                .flat_map(|x| one.iter().map(move |y| x * y))
                .collect()
        })
    })
}

impl JointSource for FittedJoint {
    fn joint(&self, scope: &[usize]) -> Vec<f64> {
        clique_joint(&self.model, scope)
    }

    /// The standard errors of the inverse-variance combination of every table containing
    /// `attrs` (the one variance model at the model's `frequencies`): the model's estimate
    /// pools at least those tables, so they bound its error where the model holds. With
    /// shared records ([`FittedJoint::with_shared_records`]) only the table over exactly
    /// `attrs` counts: the others hold the same reports.
    fn std_errors(&self, attrs: &[usize], frequencies: &[f64]) -> Option<Vec<f64>> {
        let exact = |k: &TableKey| {
            k.factor.len() == attrs.len() && attrs.iter().all(|a| k.factor.contains(a))
        };
        self.ms
            .combined_at(
                attrs,
                |m| !self.shared_records || exact(m),
                Some(frequencies),
            )
            .map(|c| c.std_errors)
    }
}
