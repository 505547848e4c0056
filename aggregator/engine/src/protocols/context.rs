//! What a protocol sees of its collection ([`Context`]): the working space, ε, the target
//! number of people, the protocol's parameters and the engine's options, with the one
//! variance model applied to a factor's best oracle. [`crate::engine::Engine`] holds one and
//! hands it to its protocol; a protocol never sees the engine.

use std::borrow::Cow;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::{Mechanism, MechanismKind};
use ldpsyn::wire::Protocol;

use crate::EngineError;
use crate::domain::binned::BinnedFactor;
use crate::domain::sizes::Domain;
use crate::domain::space::Space;
use crate::domain::task::SUB_BINS;
use crate::measure::variance::summed_randomizer_variance;
use crate::state::{CollectionState, EngineOptions};

/// A collection's resolved config as its protocol sees it. Cheap to clone (the working
/// space is the largest part).
#[derive(Debug, Clone)]
pub struct Context {
    /// Schema codes ↔ working bins.
    space: Space,
    epsilon: Epsilon,
    target_users: u64,
    protocol: Protocol,
    options: EngineOptions,
    /// The declared targets (attribute indices, sorted, distinct).
    targets: Vec<usize>,
}

impl Context {
    /// The context of a collection over the working space `space`.
    pub(crate) fn new(
        space: Space,
        epsilon: Epsilon,
        target_users: u64,
        protocol: Protocol,
        options: EngineOptions,
    ) -> Self {
        Self {
            space,
            epsilon,
            target_users,
            protocol,
            options,
            targets: Vec::new(),
        }
    }

    /// Declares `targets` (attribute indices; sorted and deduplicated here), the attributes
    /// the collection is for ([`Context::pair_weight`]).
    pub(crate) fn set_targets(&mut self, mut targets: Vec<usize>) {
        targets.sort_unstable();
        targets.dedup();
        self.targets = targets;
    }

    /// The declared targets (attribute indices, sorted).
    pub fn targets(&self) -> &[usize] {
        &self.targets
    }

    /// Weight of the 2-way marginal of `a` and `b` in the error a design or a model graph
    /// is chosen to lower ([`crate::select::target_pair_weight`] of the declared targets).
    pub fn pair_weight(&self, a: usize, b: usize) -> f64 {
        crate::select::target_pair_weight(self.dims().len(), &self.targets, a, b)
    }

    /// Weight of attribute `a`'s 1-way in that error: the summed weights of the 2-way
    /// marginals it enters (`d − 1` without targets), at least 1.
    pub fn one_way_weight(&self, a: usize) -> f64 {
        let d = self.dims().len();
        (0..d)
            .filter(|&b| b != a)
            .map(|b| self.pair_weight(a, b))
            .sum::<f64>()
            .max(1.0)
    }

    /// Working domain sizes: what protocols and the model see (the schema's, with a
    /// `bins: "auto"` attribute in its working bins; [`crate::domain::space`]).
    pub fn dims(&self) -> &[usize] {
        self.space.dims()
    }

    /// The working domain ([`Context::dims`] as a [`Domain`]).
    pub fn domain(&self) -> &Domain {
        self.space.domain()
    }

    /// Domain sizes of the schema (the codes devices encode to).
    pub fn schema_dims(&self) -> &[usize] {
        self.space.code_dims()
    }

    /// Schema codes ↔ working bins.
    pub fn space(&self) -> &Space {
        &self.space
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

    /// Cells of `f`'s table in the working domain (`usize::MAX` for a factor or map that does
    /// not fit).
    pub(crate) fn cells(&self, f: BinnedFactor<'_>) -> usize {
        f.cells_in(self.dims()).unwrap_or(usize::MAX)
    }

    /// The lower-variance single-report oracle for `f` (`MechanismKind::choose`).
    pub(crate) fn best_oracle(&self, f: BinnedFactor<'_>) -> MechanismKind {
        MechanismKind::choose(self.epsilon, self.cells(f))
    }

    /// This context in the working space of `state`: the schema's, with the working bins an
    /// earlier round placed ([`CollectionState::working_bins`]). Errors: adapted bins that do
    /// not fit the schema.
    pub fn at(&self, state: &CollectionState) -> Result<Cow<'_, Context>, EngineError> {
        if state.working_bins.is_empty() {
            return Ok(Cow::Borrowed(self));
        }
        let mut ctx = self.clone();
        for (&a, bins) in &state.working_bins {
            ctx.space = ctx
                .space
                .with_adapted_cuts(a, bins.cuts.clone(), bins.sub_bins.clone())?;
            if let Some(points) = &bins.points {
                ctx.space = ctx.space.with_point_mass_codes(a, points.clone());
            }
        }
        Ok(Cow::Owned(ctx))
    }

    /// Sub-bins per working bin of a sub-bin 1-way ([`Space::sub_bin_cuts`]).
    pub(crate) fn sub_bins_per_bin(&self) -> usize {
        self.options.sub_bins.unwrap_or(SUB_BINS).max(1)
    }

    /// Shape of `f`'s table in the working domain (factor order); `None` for an attribute
    /// outside the schema or an invalid map ([`BinnedFactor::sizes_in`]).
    pub(crate) fn factor_dims(&self, f: BinnedFactor<'_>) -> Option<Vec<usize>> {
        f.sizes_in(self.dims())
    }

    /// The mechanism a report of `f` uses (its best oracle), with the shape of its table;
    /// `None` for a factor or map that does not fit.
    fn best_mechanism(&self, f: BinnedFactor<'_>) -> Option<(Mechanism, Vec<usize>)> {
        let dims = self.factor_dims(f)?;
        let m = Mechanism::new(self.best_oracle(f), self.epsilon, &dims).ok()?;
        Some((m, dims))
    }

    /// Standard error of every cell of `f`'s table measured by `n` reports with its best
    /// oracle, when its marginal is `at` (one variance model: randomizer + sampling).
    pub(crate) fn cell_std_errors(&self, f: BinnedFactor<'_>, at: &[f64], n: f64) -> Vec<f64> {
        let n = n.max(1.0);
        let Some((m, _)) = self.best_mechanism(f) else {
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

    /// Expected L1 error `√(2/π)·Σ_cells σ` of `f`'s table measured by `n` reports with its
    /// best oracle, when its (binned) marginal is `at` (before any projection).
    pub(crate) fn expected_noise_l1(&self, f: BinnedFactor<'_>, at: &[f64], n: f64) -> f64 {
        (2.0 / std::f64::consts::PI).sqrt() * self.cell_std_errors(f, at, n).iter().sum::<f64>()
    }

    /// Expected L1 error `√(2/π)·Σ_cells σ` of the marginal of `target` (attributes of `f`)
    /// when it is summed from one table of `f` measured by `n` reports with its best oracle,
    /// at a uniform marginal of `target`: the one variance model (the randomizer's variance
    /// summed over the table's cells that merge into one target cell, plus sampling).
    /// Infinite for a factor or target that does not fit the schema.
    pub(crate) fn marginal_noise_l1(&self, f: BinnedFactor<'_>, target: &[usize], n: f64) -> f64 {
        let Some((m, dims)) = self.best_mechanism(f) else {
            return f64::INFINITY;
        };
        let mut target_cells = 1usize;
        for t in target {
            match f.attrs().iter().position(|a| a == t) {
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
}
