//! The graphical model fitted to every measurement, as the source of the joint tables the
//! released model's conditionals and marginals are read from, with standard errors from the
//! measurements it was fitted to, or from a parametric bootstrap of the fit
//! ([`crate::fit::bootstrap`]) for marginals no table measured.

use std::sync::Arc;

use linfa_linalg::cholesky::InverseC;
use ndarray::Array2;

use crate::domain::key::TableKey;
use crate::fit::bootstrap::{BootstrapInputs, Refit};
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
    /// What a parametric bootstrap of the source's fit needs, for standard errors of the
    /// marginal of `attrs` when [`JointSource::std_errors`] has none
    /// ([`crate::fit::bootstrap`]); `None` if the source has no bootstrap or it would not
    /// answer `attrs`.
    fn bootstrap(&self, attrs: &[usize]) -> Option<BootstrapInputs<'_>> {
        let _ = attrs;
        None
    }
}

/// The graphical model fitted to every measurement ([`crate::fit::observe::fit_model_with_local`]), with
/// the measurements kept for standard errors.
#[derive(Debug, Clone)]
pub struct FittedJoint {
    ms: Measurements,
    model: GraphicalModel,
    shared_records: bool,
    /// How to refit a bootstrap replicate (`None`: no bootstrap standard errors).
    refit: Option<Arc<Refit>>,
}

impl FittedJoint {
    /// Wraps a fit and the measurements it was fitted to, each table of its own users.
    pub fn new(ms: Measurements, model: GraphicalModel) -> Self {
        Self {
            ms,
            model,
            shared_records: false,
            refit: None,
        }
    }

    /// The same, with standard errors from a parametric bootstrap of the fit for marginals
    /// no table measured at full resolution ([`crate::fit::bootstrap`]; replicates refitted
    /// as `refit` says). Not for tables that share records or fits with local models: the
    /// replicates draw each table on its own people.
    pub(crate) fn with_bootstrap(mut self, refit: Refit) -> Self {
        self.refit = Some(Arc::new(refit));
        self
    }

    /// The same, for tables that all count reports of the same records (a vertical
    /// collection): a 1-way and every pair containing it are then one estimate, not
    /// independent ones, and a marginal's standard errors are those of the table over
    /// exactly its attributes.
    pub(crate) fn with_shared_records(mut self, shared: bool) -> Self {
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

    /// Standard errors of the model's marginal of `attrs` at its `frequencies` (the one
    /// variance model). Of a 1-way, those of the inverse-variance combination of every
    /// table holding it. Of a larger marginal of at most `MAX_GLS_CELLS` (256) cells, those of
    /// the generalized least-squares estimate from the tables over all of `attrs` and the
    /// 1-ways of `attrs` from every other table (`gls_std_errors`): the fit pins a
    /// pair's margins to what every table says of them, so its error is that of the pair's
    /// interaction, not of its own tables alone. Larger marginals: the combination of the
    /// tables over all of `attrs`, which bounds the model's error where the model holds.
    /// With shared records ([`FittedJoint::with_shared_records`]) only the table over
    /// exactly `attrs` counts: the others hold the same reports.
    ///
    /// A marginal no table measured at full resolution (a pair measured only in bins or not
    /// at all, a 3-way): `None` here; [`JointSource::bootstrap`] answers it.
    fn std_errors(&self, attrs: &[usize], frequencies: &[f64]) -> Option<Vec<f64>> {
        self.measured_std_errors(attrs, frequencies)
    }

    /// The fit, its measurements and how it was fitted ([`FittedJoint::with_bootstrap`]),
    /// unless the tables share records or the model links two of `attrs` through a pair
    /// measured only in bins (`splits_binned_pair`).
    fn bootstrap(&self, attrs: &[usize]) -> Option<BootstrapInputs<'_>> {
        let refit = self.refit.as_deref().filter(|_| !self.shared_records)?;
        (!self.splits_binned_pair(attrs)).then_some(BootstrapInputs {
            ms: &self.ms,
            model: &self.model,
            refit,
        })
    }
}

impl FittedJoint {
    /// Whether the model's marginal of `attrs` links two of them through a clique in which
    /// some pair was measured only over bins (a table holds both, none at full resolution).
    /// Within those bins the fit has nothing to go on, so the split of each bin among its
    /// cells is the maximum-entropy one: an assumption, whose error no replicate varies
    /// (bootstrap bars of such pairs covered 0.67 of the cells of the standard network's
    /// dependent pairs under `auto`). The cliques that link them are those left when leaf
    /// cliques holding no attribute of `attrs` that no other clique holds are pruned from
    /// the junction tree, in components holding two or more of `attrs`.
    fn splits_binned_pair(&self, attrs: &[usize]) -> bool {
        let tree = self.model.tree();
        let k = tree.cliques.len();
        let mut alive = vec![true; k];
        let degree = |alive: &[bool], c: usize| {
            tree.edges
                .iter()
                .filter(|&&(a, b)| (a == c && alive[b]) || (b == c && alive[a]))
                .count()
        };
        loop {
            let leaf = (0..k).find(|&c| {
                alive[c]
                    && degree(&alive, c) <= 1
                    && tree.cliques[c].iter().all(|a| {
                        !attrs.contains(a)
                            || (0..k).any(|o| o != c && alive[o] && tree.cliques[o].contains(a))
                    })
            });
            match leaf {
                Some(c) => alive[c] = false,
                None => break,
            }
        }
        // Component of each clique among the kept ones.
        let mut comp: Vec<usize> = (0..k).collect();
        for _ in 0..k {
            for &(a, b) in &tree.edges {
                if alive[a] && alive[b] {
                    let m = comp[a].min(comp[b]);
                    comp[a] = m;
                    comp[b] = m;
                }
            }
        }
        let held = |c: usize| {
            attrs
                .iter()
                .filter(|a| {
                    (0..k).any(|o| alive[o] && comp[o] == comp[c] && tree.cliques[o].contains(a))
                })
                .count()
        };
        (0..k).filter(|&c| alive[c] && held(c) >= 2).any(|c| {
            let clique = &tree.cliques[c];
            clique.iter().enumerate().any(|(i, &x)| {
                clique[i + 1..].iter().any(|&y| {
                    let pair = [x, y];
                    self.ms.containing(&pair).next().is_some()
                        && self.ms.combined_at(&pair, |_| true, None).is_none()
                })
            })
        })
    }

    /// [`JointSource::std_errors`] from the tables that measured all of `attrs` at full
    /// resolution; `None` if none did.
    fn measured_std_errors(&self, attrs: &[usize], frequencies: &[f64]) -> Option<Vec<f64>> {
        let exact = |k: &TableKey| {
            k.factor.len() == attrs.len() && attrs.iter().all(|a| k.factor.contains(a))
        };
        let direct = self.ms.combined_at(
            attrs,
            |m| !self.shared_records || exact(m),
            Some(frequencies),
        )?;
        if self.shared_records || attrs.len() < 2 || frequencies.len() > MAX_GLS_CELLS {
            return Some(direct.std_errors);
        }
        let holds_all = |k: &TableKey| attrs.iter().all(|a| k.factor.contains(a));
        let margins: Vec<Option<Vec<f64>>> = attrs
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let at = marginal_of(frequencies, &direct.dims, i);
                self.ms
                    .combined_at(&[a], |k| !holds_all(k), Some(&at))
                    .map(|c| c.std_errors)
            })
            .collect();
        Some(
            gls_std_errors(&direct.dims, &direct.std_errors, &margins).unwrap_or(direct.std_errors),
        )
    }
}

/// Most cells of a marginal whose standard errors come from the generalized least-squares
/// combination (`gls_std_errors`, a dense `cells × cells` inverse: 256 cells cost ~10⁷
/// operations per request).
pub(crate) const MAX_GLS_CELLS: usize = 256;

/// `p` (row-major over `dims`) summed onto its attribute at position `i`.
fn marginal_of(p: &[f64], dims: &[usize], i: usize) -> Vec<f64> {
    let inner: usize = dims[i + 1..].iter().product();
    let mut out = vec![0.0; dims[i]];
    for (c, x) in p.iter().enumerate() {
        out[(c / inner) % dims[i]] += x;
    }
    out
}

/// Standard errors of the generalized least-squares estimate of a marginal `x` (row-major
/// over `dims`) from a direct estimate with independent cell errors `direct_se`, the 1-way
/// estimates of each attribute with errors `margin_se[i]` (`None`: no other table holds
/// it), independent of the direct one (other people's reports), and `Σx = 1` exactly:
/// `Cov = (D⁻¹ + Σ_i A_iᵀ W_i⁻¹ A_i)⁻¹`, `A_i` summing cells onto attribute `i`, then
/// projected onto `Σx = 1` (Aitken's GLS; Rao, "Linear Statistical Inference and its
/// Applications", 1973, §4a). `None` if a variance is not positive or the factorization
/// fails.
pub(crate) fn gls_std_errors(
    dims: &[usize],
    direct_se: &[f64],
    margin_se: &[Option<Vec<f64>>],
) -> Option<Vec<f64>> {
    let cells = direct_se.len();
    if direct_se.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return None;
    }
    let mut info = Array2::<f64>::zeros((cells, cells));
    for (c, s) in direct_se.iter().enumerate() {
        info[[c, c]] = 1.0 / (s * s);
    }
    for (i, se) in margin_se.iter().enumerate() {
        let Some(se) = se else { continue };
        if se.len() != dims[i] || se.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            continue;
        }
        let inner: usize = dims[i + 1..].iter().product();
        let code = |c: usize| (c / inner) % dims[i];
        for c in 0..cells {
            for c2 in 0..cells {
                if code(c) == code(c2) {
                    info[[c, c2]] += 1.0 / (se[code(c)] * se[code(c)]);
                }
            }
        }
    }
    let cov = info.invc().ok()?;
    // Σx = 1 holds exactly: remove the variance along the sum.
    let row_sums: Vec<f64> = (0..cells).map(|c| cov.row(c).sum()).collect();
    let total: f64 = row_sums.iter().sum();
    if !(total.is_finite() && total > 0.0) {
        return None;
    }
    let se: Vec<f64> = (0..cells)
        .map(|c| {
            (cov[[c, c]] - row_sums[c] * row_sums[c] / total)
                .max(0.0)
                .sqrt()
        })
        .collect();
    se.iter().all(|s| s.is_finite()).then_some(se)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With exact margins, a cell of a `k₁ × k₂` table of equal cell variances keeps the
    /// variance of its interaction, `(1 − 1/k₁)(1 − 1/k₂)` of the direct one; without
    /// margins only the sum is removed, `1 − 1/(k₁k₂)`.
    #[test]
    fn exact_margins_leave_the_interaction_variance() {
        for (k1, k2) in [(2usize, 2usize), (3, 4), (5, 2)] {
            let cells = k1 * k2;
            let direct = vec![0.01; cells];
            let exact = [Some(vec![1e-7; k1]), Some(vec![1e-7; k2])];
            let se = gls_std_errors(&[k1, k2], &direct, &exact).unwrap();
            let want = 0.01 * ((1.0 - 1.0 / k1 as f64) * (1.0 - 1.0 / k2 as f64)).sqrt();
            assert!(
                se.iter().all(|s| (s / want - 1.0).abs() < 1e-3),
                "{se:?} vs {want}"
            );
            let se = gls_std_errors(&[k1, k2], &direct, &[None, None]).unwrap();
            let want = 0.01 * (1.0 - 1.0 / cells as f64).sqrt();
            assert!(
                se.iter().all(|s| (s / want - 1.0).abs() < 1e-9),
                "{se:?} vs {want}"
            );
        }
        assert!(gls_std_errors(&[2, 2], &[0.01, 0.0, 0.01, 0.01], &[None, None]).is_none());
    }

    #[test]
    fn a_marginal_sums_onto_its_attribute() {
        let p = [0.1, 0.2, 0.3, 0.05, 0.15, 0.2];
        assert_eq!(
            marginal_of(&p, &[2, 3], 0),
            vec![0.1 + 0.2 + 0.3, 0.05 + 0.15 + 0.2]
        );
        let m = marginal_of(&p, &[2, 3], 1);
        assert!(
            m.iter()
                .zip([0.15, 0.35, 0.5])
                .all(|(a, b)| (a - b).abs() < 1e-12)
        );
    }
}
