//! Sufficient statistics per table and their combination into marginal estimates.
//!
//! A *table* is everything reported for one [`TableKey`] (round, factor, mechanism): its
//! [`SufficientStatistics`] are additive, so any number of processes can count reports and
//! merge the sums. [`Measurements`] turns the tables into estimates: every table whose factor
//! contains a set of attributes `A*` yields an unbiased estimate of the marginal of `A*`
//! (summing the cells that agree on `A*`), and those estimates are combined with
//! inverse-variance weights in frequency space (eqs. 6–13 of PrivIncr, EDBT 2023, with one
//! correction: eq. 6 weighs *counts*, in frequency space table j's weight is
//! the inverse of its frequency variance).
//!
//! **One variance model** (docs/design.md "Estimation"): every cell of every table, whole or
//! summed down to fewer attributes, has the variance [`Measurement::cell_variances`]: the
//! randomizer's (over the devices' coins) plus sampling against the population
//! (`f(1−f)/n · (N−n)/(N−1)`: which users were asked for this table), evaluated at a model's
//! frequency `f`, never at the noisy cell. Combination weights use it at the uniform
//! frequency, so they do not depend on the data and the combination stays linear and
//! unbiased; standard errors use it at the Norm-Sub'd combination or at a model.

use std::collections::{BTreeMap, BTreeSet};

use ldpsyn::Epsilon;
use ldpsyn::factor::{binned_domain_sizes, cuts_of};
use ldpsyn::mechanism::{
    FrequencyEstimate, Mechanism, MechanismError, MechanismKind, Oracle, SufficientStatistics,
    norm_sub,
};
use serde::{Deserialize, Serialize};

use crate::space::{Space, WorkingKey};

/// Identifies one table of sufficient statistics: the round (PrivIncr round, or 0 for
/// protocols whose tables are pooled across batches), the factor (attribute indices in
/// report order) and the mechanism. Ordered (round, factor, mechanism name) so reductions
/// iterate in one fixed order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableKey {
    /// Round of the task the reports answer.
    pub round: u32,
    /// Factor: attribute indices in report order.
    pub factor: Vec<usize>,
    /// Mechanism of the reports.
    pub mechanism: MechanismKind,
    /// Bin maps of the factor's attributes (factor order; `[]` for full resolution), or empty
    /// when no attribute is binned ([`ldpsyn::factor::bin_count`]): the table's cells are the
    /// product of the bins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
}

impl TableKey {
    /// The bin map of factor attribute `attr` (`[]`: full resolution or not in the factor).
    pub fn bins_of(&self, attr: usize) -> &[u32] {
        self.factor
            .iter()
            .position(|&a| a == attr)
            .map_or(&[], |i| cuts_of(&self.bins, i))
    }

    /// Whether the table holds `attrs` under exactly the bin maps `bins` (one per attribute
    /// of `attrs`, `[]` for full resolution; an empty list: none binned).
    pub fn bins_are(&self, attrs: &[usize], bins: &[Vec<u32>]) -> bool {
        attrs
            .iter()
            .enumerate()
            .all(|(i, &a)| self.bins_of(a) == cuts_of(bins, i))
    }
}

fn kind_rank(k: MechanismKind) -> u8 {
    match k {
        MechanismKind::Grr => 0,
        MechanismKind::Oue => 1,
        MechanismKind::GrrPair => 2,
    }
}

impl Ord for TableKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (
            self.round,
            &self.factor,
            kind_rank(self.mechanism),
            &self.bins,
        )
            .cmp(&(
                other.round,
                &other.factor,
                kind_rank(other.mechanism),
                &other.bins,
            ))
    }
}

impl PartialOrd for TableKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// All tables of a collection, in key order. The service keeps one per process/shard and
/// merges them (sums of statistics); the engine only ever reads them.
pub type Tables = BTreeMap<TableKey, SufficientStatistics>;

/// Adds `stats` into `tables[key]` (creating it). Errors: shapes differ.
pub fn merge_into(
    tables: &mut Tables,
    key: TableKey,
    stats: &SufficientStatistics,
) -> Result<(), MechanismError> {
    match tables.get_mut(&key) {
        Some(t) => t.merge(stats),
        None => {
            tables.insert(key, stats.clone());
            Ok(())
        }
    }
}

/// One table's unbiased estimate, with its mechanism.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// The table.
    pub key: TableKey,
    /// Domain sizes of the factor attributes (factor order), in bins where the table's key
    /// bins an attribute.
    pub dims: Vec<usize>,
    /// The mechanism (which oracle, p, q).
    pub mechanism: Mechanism,
    /// Unbiased frequency estimate over the factor's product domain (row-major).
    pub estimate: FrequencyEstimate,
    /// A 1-way measured finer than its attribute's working bins ([`crate::space`]):
    /// `estimate` holds its sums over the working bins, this its measured cells.
    pub refined: Option<Refined>,
}

/// The measured cells of a 1-way finer than the working bins ([`Measurement::refined`]).
#[derive(Debug, Clone)]
pub struct Refined {
    /// Bin maps of the measured cells over the attribute's schema codes (`[]`: every code).
    pub code_cuts: Vec<u32>,
    /// Measured cells in each working bin.
    pub sizes: Vec<usize>,
    /// Unbiased estimate of each measured cell.
    pub frequencies: Vec<f64>,
}

/// A combined estimate of the marginal of `attrs` (in the order requested).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Combined {
    /// Attributes, in the order of the cells (row-major, last fastest).
    pub attrs: Vec<usize>,
    /// Their domain sizes.
    pub dims: Vec<usize>,
    /// Unbiased estimates, one per cell (may be negative; sum ≈ 1).
    pub frequencies: Vec<f64>,
    /// Standard error of each cell's estimate (plug-in of the exact variance).
    pub std_errors: Vec<f64>,
    /// Reports that contributed.
    pub reports: u64,
    /// Number of tables that contributed.
    pub tables: usize,
}

/// Errors of [`Measurements`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TablesError {
    /// A table's mechanism cannot be built or its statistics do not fit.
    #[error("table {key:?}: {source}")]
    Mechanism {
        /// The table.
        key: TableKey,
        /// The mechanism error.
        source: MechanismError,
    },
    /// A table's factor names an attribute beyond the schema or repeats one, or its bin maps
    /// do not fit the factor.
    #[error("table {0:?} has an invalid factor or bin map")]
    BadFactor(TableKey),
}

/// Builds a table's mechanism from its key and its factor's (binned) domain sizes.
pub type MechanismOf<'a> = dyn Fn(&TableKey, &[usize]) -> Result<Mechanism, MechanismError> + 'a;

/// Every non-empty table turned into an unbiased estimate; answers combined marginals.
#[derive(Debug, Clone)]
pub struct Measurements {
    items: Vec<Measurement>,
    domain_sizes: Vec<usize>,
    population: u64,
    /// Per attribute, the items whose factor holds it (ascending): a marginal's tables are
    /// found among those of its rarest attribute, not by scanning every table (19,900 pair
    /// tables at 200 attributes).
    by_attr: Vec<Vec<usize>>,
}

/// Map from each factor cell to the target cell, for `target ⊆ factor` (target order).
pub(crate) fn projection_map(factor: &[usize], dims: &[usize], target: &[usize]) -> Vec<usize> {
    let cells: usize = dims.iter().product();
    // Stride of each factor position in the target index (0 if not in target).
    let mut tstride = vec![0usize; factor.len()];
    for (ti, t) in target.iter().enumerate() {
        let fi = factor
            .iter()
            .position(|f| f == t)
            .expect("target ⊆ factor checked by the caller");
        let stride: usize = target[ti + 1..]
            .iter()
            .map(|a| dims[factor.iter().position(|f| f == a).expect("target ⊆ factor")])
            .product();
        tstride[fi] = stride;
    }
    let mut out = Vec::with_capacity(cells);
    let mut codes = vec![0usize; factor.len()];
    for _ in 0..cells {
        out.push(codes.iter().zip(&tstride).map(|(c, s)| c * s).sum());
        // Row-major increment, last fastest.
        for i in (0..codes.len()).rev() {
            codes[i] += 1;
            if codes[i] < dims[i] {
                break;
            }
            codes[i] = 0;
        }
    }
    out
}

/// Map from each cell of a product domain `dims` (row-major) to its cell under the bin maps
/// `bins` (one per attribute, `[]` for full resolution; an empty list: none binned), and the
/// number of binned cells. Panics on an invalid map (callers build maps with
/// [`binned_domain_sizes`]).
pub fn coarsen_map(dims: &[usize], bins: &[Vec<u32>]) -> (Vec<usize>, usize) {
    let sizes: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &k)| ldpsyn::factor::bin_count(cuts_of(bins, i), k).expect("valid bin map"))
        .collect();
    let cells: usize = dims.iter().product();
    let mut out = Vec::with_capacity(cells);
    let mut codes = vec![0usize; dims.len()];
    for _ in 0..cells {
        let mut index = 0;
        for (i, (&c, &k)) in codes.iter().zip(&sizes).enumerate() {
            index = index * k + ldpsyn::factor::bin_of(c as u32, cuts_of(bins, i)) as usize;
        }
        out.push(index);
        for i in (0..codes.len()).rev() {
            codes[i] += 1;
            if codes[i] < dims[i] {
                break;
            }
            codes[i] = 0;
        }
    }
    (out, sizes.iter().product())
}

/// `values` over the product domain `dims` summed into the cells of the bin maps `bins`
/// ([`coarsen_map`]): a distribution's binned marginal.
pub fn coarsen(values: &[f64], dims: &[usize], bins: &[Vec<u32>]) -> Vec<f64> {
    if bins.iter().all(Vec::is_empty) {
        return values.to_vec();
    }
    let (map, cells) = coarsen_map(dims, bins);
    let mut out = vec![0.0; cells];
    for (v, &t) in values.iter().zip(&map) {
        out[t] += v;
    }
    out
}

/// Randomizer variance (over the devices' coins, for a fixed set of reporting users) of one
/// target cell's estimate obtained by summing `c` factor cells of a table with mechanism `m`
/// and `n` reports, when a share `f` of those users hold the target cell. `single` is the
/// position (0/1) of the kept attribute of a pair-GRR marginalized to one attribute.
///
/// A user inside the target cell sets the summed output with probability `π1`, a user outside
/// with `π0` (GRR: `p + (c−1)q` and `cq`; a pair-GRR kept half: its own GRR at ε/2); OUE
/// bits are independent, so the per-user variance is `p(1−p) + (c−1)q(1−q)` inside and
/// `c q(1−q)` outside. Divided by `n (p − q)²` as for the unbiased estimator
/// `(C/n − π0)/(p − q)` (docs/design.md "Mechanisms").
pub(crate) fn summed_randomizer_variance(
    m: &Mechanism,
    c: usize,
    f: f64,
    n: u64,
    single: Option<usize>,
) -> f64 {
    let nf = n.max(1) as f64;
    let f = f.clamp(0.0, 1.0);
    let c = c as f64;
    let bernoulli = |pi: f64| pi * (1.0 - pi);
    match m.oracle() {
        Oracle::Grr(g) => {
            let (p, q) = (g.p(), g.q());
            (f * bernoulli(p + (c - 1.0) * q) + (1.0 - f) * bernoulli(c * q))
                / (nf * (p - q).powi(2))
        }
        Oracle::Oue(o) => {
            let (p, q) = (o.p(), o.q());
            (f * (bernoulli(p) + (c - 1.0) * bernoulli(q)) + (1.0 - f) * c * bernoulli(q))
                / (nf * (p - q).powi(2))
        }
        Oracle::GrrPair(pg) => {
            // Q⁻¹'s columns sum to one, so summing the pair estimate over the other attribute
            // leaves the kept half's own GRR estimate at ε/2.
            let g = if single == Some(0) {
                pg.first()
            } else {
                pg.second()
            };
            let (p, q) = (g.p(), g.q());
            (f * bernoulli(p) + (1.0 - f) * bernoulli(q)) / (nf * (p - q).powi(2))
        }
    }
}

/// Sampling variance of a cell of frequency `f` estimated from `n` users drawn without
/// replacement from a population of `population`: `f(1−f)/n · (N−n)/(N−1)` (0 when every
/// user of the population reported in this table).
pub fn sampling_variance(f: f64, n: u64, population: u64) -> f64 {
    let (nf, pf) = (n.max(1) as f64, population as f64);
    let fpc = if pf > nf { (pf - nf) / (pf - 1.0) } else { 0.0 };
    let f = f.clamp(0.0, 1.0);
    f * (1.0 - f) / nf * fpc
}

impl Measurement {
    /// The table's unbiased estimate marginalized to `target ⊆ factor` (cells row-major in
    /// `target` order). Panics if `target` is not a subset of the factor.
    pub fn marginalized(&self, target: &[usize]) -> Vec<f64> {
        let map = projection_map(&self.key.factor, &self.dims, target);
        let cells = self.estimate.frequencies.len() / self.cells_summed(target);
        let mut out = vec![0.0; cells];
        for (i, &t) in map.iter().enumerate() {
            out[t] += self.estimate.frequencies[i];
        }
        out
    }

    /// Factor cells summed into one cell of `target`.
    fn cells_summed(&self, target: &[usize]) -> usize {
        self.key
            .factor
            .iter()
            .zip(&self.dims)
            .filter(|(a, _)| !target.contains(a))
            .map(|(_, &k)| k)
            .product()
    }

    /// The one variance model of docs/design.md "Estimation": the variance of every cell of
    /// [`Measurement::marginalized`]`(target)` when the population's marginal of `target` is
    /// `f` (row-major in `target` order, non-negative, sum 1): the randomizer's variance for
    /// the table's `n` users plus the sampling variance of those `n` users against a
    /// population of `population` (finite-population corrected). Evaluate `f` at a model, not
    /// at the noisy cells. Frequencies, per cell; panics if `target ⊄ factor` or
    /// `f.len()` is not the target's cell count.
    pub fn cell_variances(&self, target: &[usize], f: &[f64], population: u64) -> Vec<f64> {
        let n = self.estimate.n;
        let c = self.cells_summed(target);
        let randomizer: Vec<f64> = if let Some(r) = &self.refined {
            // Each working cell sums its measured cells (a 1-way: target is the factor).
            f.iter()
                .zip(&r.sizes)
                .map(|(&x, &c)| summed_randomizer_variance(&self.mechanism, c, x, n, None))
                .collect()
        } else if c == 1 {
            // The whole table in another order: the mechanism's exact cell variances.
            let map = projection_map(&self.key.factor, &self.dims, target);
            let plug: Vec<f64> = map.iter().map(|&t| f[t].clamp(0.0, 1.0)).collect();
            let v = self.mechanism.frequency_variances(&plug, n);
            let mut out = vec![0.0; f.len()];
            for (i, &t) in map.iter().enumerate() {
                out[t] = v[i].max(0.0);
            }
            out
        } else {
            let single = (self.key.mechanism == MechanismKind::GrrPair && target.len() == 1)
                .then(|| self.key.factor.iter().position(|&a| a == target[0]))
                .flatten();
            f.iter()
                .map(|&x| summed_randomizer_variance(&self.mechanism, c, x, n, single))
                .collect()
        };
        randomizer
            .iter()
            .zip(f)
            .map(|(r, &x)| r + sampling_variance(x, n, population))
            .collect()
    }
}

impl Measurement {
    /// Per-cell variances that weight the graphical-model fit, from the one model of
    /// [`Measurement::cell_variances`] at `f`: the table's mean randomizer variance (shared by
    /// its cells) plus each cell's own sampling variance. A randomizer's per-cell variance
    /// differs across cells mostly through the one-hot output, whose estimates are negatively
    /// correlated (GRR's sum to one): weighting cells by it treats them as independent and
    /// fits worse than a shared weight (which fits a lone table as Norm-Sub does). The
    /// sampling variance `f(1−f)/n` is what separates a rare cell from a common one where the
    /// randomizer is weak (large ε): there per-cell weights fit better
    /// (`benchmarks/sweeps/fit-weights.md`). Frequencies², per cell, > 0.
    pub fn fit_variances(&self, target: &[usize], f: &[f64], population: u64) -> Vec<f64> {
        let sampling: Vec<f64> = f
            .iter()
            .map(|&x| sampling_variance(x, self.estimate.n, population))
            .collect();
        let randomizer = self
            .cell_variances(target, f, population)
            .iter()
            .zip(&sampling)
            .map(|(v, s)| v - s)
            .sum::<f64>()
            / f.len().max(1) as f64;
        sampling
            .iter()
            .map(|s| (randomizer + s).max(1e-300))
            .collect()
    }
}

impl Measurements {
    /// Estimates every table with at least one report. `domain_sizes` is the schema's. The
    /// population of the sampling term is the number of reports (see
    /// [`Measurements::with_population`]).
    /// Errors: [`TablesError`] if a table does not fit its mechanism.
    pub fn new(
        epsilon: Epsilon,
        domain_sizes: &[usize],
        tables: &Tables,
    ) -> Result<Self, TablesError> {
        Self::filtered(epsilon, domain_sizes, tables, |_| true)
    }

    /// As [`Measurements::new`] with only the tables for which `keep` is true.
    pub fn filtered(
        epsilon: Epsilon,
        domain_sizes: &[usize],
        tables: &Tables,
        keep: impl Fn(&TableKey) -> bool,
    ) -> Result<Self, TablesError> {
        Self::filtered_in(
            &|key: &TableKey, dims: &[usize]| Mechanism::new(key.mechanism, epsilon, dims),
            &Space::identity(domain_sizes.to_vec()),
            tables,
            keep,
        )
    }

    /// As [`Measurements::filtered`] for tables keyed over schema codes, read in the working
    /// space `space` ([`crate::space`]), each table's mechanism built by `mechanism` from its
    /// key and (binned) factor domain sizes: keys, cells and domain sizes are working ones; a
    /// 1-way finer than its attribute's working bins is summed into them
    /// ([`Measurement::refined`] keeps its cells). A table of several attributes that cuts
    /// through a working bin (no task asks for one) is skipped.
    pub fn filtered_in(
        mechanism: &MechanismOf<'_>,
        space: &Space,
        tables: &Tables,
        keep: impl Fn(&TableKey) -> bool,
    ) -> Result<Self, TablesError> {
        let domain_sizes = space.code_dims();
        let mut items = Vec::new();
        for (key, stats) in tables {
            if stats.n == 0 || !keep(key) {
                continue;
            }
            let set: BTreeSet<usize> = key.factor.iter().copied().collect();
            if set.len() != key.factor.len() || key.factor.iter().any(|&a| a >= domain_sizes.len())
            {
                return Err(TablesError::BadFactor(key.clone()));
            }
            let sizes = binned_domain_sizes(domain_sizes, &key.factor, &key.bins)
                .map_err(|_| TablesError::BadFactor(key.clone()))?;
            let dims: Vec<usize> = key.factor.iter().map(|&a| sizes[a]).collect();
            let err = |source| TablesError::Mechanism {
                key: key.clone(),
                source,
            };
            let mechanism = mechanism(key, &dims).map_err(err)?;
            let mut estimate = mechanism.estimate(stats).map_err(err)?;
            let (key, dims, refined) = match space.to_working(key) {
                Some(WorkingKey::Binned(k)) => (k, dims, None),
                Some(WorkingKey::Refined { key: k, blocks }) => {
                    let bins = space.dims()[k.factor[0]];
                    let mut sums = vec![0.0; bins];
                    let mut sizes = vec![0usize; bins];
                    for (&b, &x) in blocks.iter().zip(&estimate.frequencies) {
                        sums[b] += x;
                        sizes[b] += 1;
                    }
                    let cells = std::mem::replace(&mut estimate.frequencies, sums);
                    let refined = Refined {
                        code_cuts: key.bins_of(k.factor[0]).to_vec(),
                        sizes,
                        frequencies: cells,
                    };
                    (k, vec![bins], Some(refined))
                }
                None => continue,
            };
            items.push(Measurement {
                key,
                dims,
                mechanism,
                estimate,
                refined,
            });
        }
        let population = items.iter().map(|m| m.estimate.n).sum();
        Ok(Self::indexed(items, space.dims().to_vec(), population))
    }

    fn indexed(items: Vec<Measurement>, domain_sizes: Vec<usize>, population: u64) -> Self {
        let mut by_attr = vec![Vec::new(); domain_sizes.len()];
        for (i, m) in items.iter().enumerate() {
            for &a in &m.key.factor {
                by_attr[a].push(i);
            }
        }
        Self {
            items,
            domain_sizes,
            population,
            by_attr,
        }
    }

    /// The measurements with `f` applied to each (same keys, domain and population; `f`
    /// changes estimates only).
    pub(crate) fn map_items(mut self, f: impl Fn(&mut Measurement)) -> Self {
        self.items.iter_mut().for_each(f);
        self
    }

    /// Only the measurements for which `keep` holds (same population).
    pub fn retained(self, keep: impl Fn(&Measurement) -> bool) -> Self {
        let items = self.items.into_iter().filter(|m| keep(m)).collect();
        Self::indexed(items, self.domain_sizes, self.population)
    }

    /// The unbiased estimate of attribute `a`'s distribution over the cells of its finest
    /// 1-ways below the working bins ([`Measurement::refined`]; those with the most cells,
    /// the first such bin map in key order): the cells' cuts over schema codes, their
    /// estimates inverse-variance weighted (`∝ n` for one mechanism), and each cell's
    /// standard error (the one variance model at the estimate's Norm-Sub projection). `None`
    /// without such a 1-way. Used to draw a code within a working bin (VertiMRF §6.1's
    /// histogram recovery; [`crate::model::Recovery`]).
    pub fn sub_bin_distribution(&self, a: usize) -> Option<(Vec<u32>, Vec<f64>, Vec<f64>)> {
        let refined = || {
            self.containing(std::slice::from_ref(&a))
                .filter_map(|m| Some((m, m.refined.as_ref()?)))
        };
        let cuts = refined()
            .max_by_key(|(_, r)| (r.frequencies.len(), std::cmp::Reverse(r.code_cuts.clone())))?
            .1
            .code_cuts
            .clone();
        let grid: Vec<(&Measurement, &Refined)> =
            refined().filter(|(_, r)| r.code_cuts == cuts).collect();
        let k = grid.first()?.1.frequencies.len();
        let uniform = vec![1.0 / k as f64; k];
        let weights: Vec<f64> = grid
            .iter()
            .map(|(m, _)| {
                let v = m.mechanism.frequency_variances(&uniform, m.estimate.n);
                k as f64 / v.iter().sum::<f64>().max(1e-300)
            })
            .collect();
        let total: f64 = weights.iter().sum();
        let mut freq = vec![0.0; k];
        for ((_, r), w) in grid.iter().zip(&weights) {
            for (f, x) in freq.iter_mut().zip(&r.frequencies) {
                *f += w / total * x;
            }
        }
        let at = norm_sub(&freq);
        let mut var = vec![0.0; k];
        for ((m, _), w) in grid.iter().zip(&weights) {
            let n = m.estimate.n;
            let randomizer = m.mechanism.frequency_variances(&at, n);
            for ((v, r), &x) in var.iter_mut().zip(&randomizer).zip(&at) {
                *v += (w / total).powi(2) * (r.max(0.0) + sampling_variance(x, n, self.population));
            }
        }
        Some((cuts, freq, var.iter().map(|v| v.sqrt()).collect()))
    }

    /// Sets the population of the sampling term (the collection's target users N; never
    /// below the reports received).
    pub fn with_population(mut self, population: u64) -> Self {
        let reports: u64 = self.items.iter().map(|m| m.estimate.n).sum();
        self.population = population.max(reports);
        self
    }

    /// The population of the sampling term.
    pub fn population(&self) -> u64 {
        self.population
    }

    /// The per-table estimates, in key order.
    pub fn items(&self) -> &[Measurement] {
        &self.items
    }

    /// The tables whose factor holds every attribute of `attrs` (non-empty, within the
    /// domain), in key order; found through the rarest attribute's tables.
    pub fn containing<'a>(&'a self, attrs: &'a [usize]) -> impl Iterator<Item = &'a Measurement> {
        let rarest = attrs
            .iter()
            .filter_map(|&a| self.by_attr.get(a))
            .min_by_key(|l| l.len())
            .map_or(&[][..], Vec::as_slice);
        rarest
            .iter()
            .map(|&i| &self.items[i])
            .filter(move |m| attrs.iter().all(|a| m.key.factor.contains(a)))
    }

    /// Domain sizes of the space the measurements were read in (the schema's for
    /// [`Measurements::new`]; working ones for [`Measurements::filtered_in`]).
    pub fn domain_sizes(&self) -> &[usize] {
        &self.domain_sizes
    }

    /// Combined estimate of the marginal of `attrs` (cells row-major in `attrs` order) from
    /// every table whose factor contains all of `attrs`, with inverse-variance weights
    /// (module docs); standard errors at the Norm-Sub projection of the combination. `None`
    /// if no table contains them.
    pub fn combined(&self, attrs: &[usize]) -> Option<Combined> {
        self.combined_where(attrs, |_| true)
    }

    /// As [`Measurements::combined`], using only tables for which `keep` is true.
    pub fn combined_where(
        &self,
        attrs: &[usize],
        keep: impl Fn(&TableKey) -> bool,
    ) -> Option<Combined> {
        self.combined_at(attrs, keep, None)
    }

    /// As [`Measurements::combined_where`], with the standard errors evaluated at `plug`
    /// (a model's marginal of `attrs`, row-major in `attrs` order) when given.
    ///
    /// Weights: table j's weight is the inverse of its mean cell variance (one variance
    /// model: [`Measurement::cell_variances`], sampling from an unbounded population) at the
    /// uniform frequency — data-independent, so
    /// the combination stays linear and unbiased; for tables of one factor, mechanism and ε
    /// they are `∝ n_j` (eq. 5 of PrivIncr, pooling).
    pub fn combined_at(
        &self,
        attrs: &[usize],
        keep: impl Fn(&TableKey) -> bool,
        plug: Option<&[f64]>,
    ) -> Option<Combined> {
        self.combined_binned(attrs, &[], keep, plug)
    }

    /// As [`Measurements::combined_at`] for `attrs` under the bin maps `bins` (one per
    /// attribute of `attrs`, `[]` for full resolution; an empty list: none binned): only the
    /// tables whose maps of `attrs` are exactly these contribute, and the cells are the
    /// product of the bins. `None` if no table fits or a map is invalid.
    pub fn combined_binned(
        &self,
        attrs: &[usize],
        bins: &[Vec<u32>],
        keep: impl Fn(&TableKey) -> bool,
        plug: Option<&[f64]>,
    ) -> Option<Combined> {
        let sizes = binned_domain_sizes(&self.domain_sizes, attrs, bins).ok()?;
        let dims: Vec<usize> = attrs.iter().map(|&a| sizes[a]).collect();
        let cells: usize = dims.iter().product();
        let uniform = vec![1.0 / cells as f64; cells];
        let mut parts: Vec<(f64, Vec<f64>, &Measurement)> = Vec::new();
        for m in self.containing(attrs) {
            if !keep(&m.key) || !m.key.bins_are(attrs, bins) {
                continue;
            }
            // Without the finite-population correction, so that tables of one factor and
            // mechanism weigh exactly ∝ n_j (pooling).
            let vbar = m
                .cell_variances(attrs, &uniform, u64::MAX)
                .iter()
                .sum::<f64>()
                / cells as f64;
            parts.push((1.0 / vbar.max(1e-300), m.marginalized(attrs), m));
        }
        if parts.is_empty() {
            return None;
        }
        let wsum: f64 = parts.iter().map(|p| p.0).sum();
        let mut freq = vec![0.0; cells];
        for (w, est, _) in &parts {
            for (f, e) in freq.iter_mut().zip(est) {
                *f += w / wsum * e;
            }
        }
        let at = match plug {
            Some(p) => p.to_vec(),
            None => norm_sub(&freq),
        };
        let mut var = vec![0.0; cells];
        for (w, _, m) in &parts {
            let scale = (w / wsum).powi(2);
            for (v, x) in var
                .iter_mut()
                .zip(m.cell_variances(attrs, &at, self.population))
            {
                *v += scale * x;
            }
        }
        Some(Combined {
            attrs: attrs.to_vec(),
            dims,
            frequencies: freq,
            std_errors: var.iter().map(|v| v.sqrt()).collect(),
            reports: parts.iter().map(|p| p.2.estimate.n).sum(),
            tables: parts.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha12Rng;

    fn eps(e: f64) -> Epsilon {
        Epsilon::new(e).unwrap()
    }

    #[test]
    fn coarsen_sums_within_bins() {
        // dims (4, 3); attribute 0 in bins {0}, {1, 2, 3}; attribute 1 whole.
        let values: Vec<f64> = (0..12).map(f64::from).collect();
        let (map, cells) = coarsen_map(&[4, 3], &[vec![1], vec![]]);
        assert_eq!(cells, 6);
        assert_eq!(map, vec![0, 1, 2, 3, 4, 5, 3, 4, 5, 3, 4, 5]);
        assert_eq!(
            coarsen(&values, &[4, 3], &[vec![1], vec![]]),
            vec![0.0, 1.0, 2.0, 18.0, 21.0, 24.0]
        );
        assert_eq!(coarsen(&values, &[4, 3], &[]), values);
    }

    #[test]
    fn projection_map_orders() {
        // factor (0, 1) dims (2, 3): target [1] and [1, 0].
        let m = projection_map(&[0, 1], &[2, 3], &[1]);
        assert_eq!(m, vec![0, 1, 2, 0, 1, 2]);
        let m = projection_map(&[0, 1], &[2, 3], &[1, 0]);
        assert_eq!(m, vec![0, 2, 4, 1, 3, 5]);
    }

    /// Eq. 5 of PrivIncr: combining rounds of the same pair and mechanism equals pooling
    /// their raw counts.
    #[test]
    fn accumulation_equals_pooled_counts() {
        let dims = [3usize, 4];
        let mut rng = ChaCha12Rng::seed_from_u64(7);
        for kind in [
            MechanismKind::Oue,
            MechanismKind::Grr,
            MechanismKind::GrrPair,
        ] {
            let mech = Mechanism::new(kind, eps(1.5), &dims).unwrap();
            let mut tables = Tables::new();
            let mut pooled = SufficientStatistics::new(&mech);
            for (round, n) in [(0u32, 500usize), (1, 1300), (2, 77)] {
                let mut s = SufficientStatistics::new(&mech);
                for i in 0..n {
                    let codes = [(i % 3) as u32, ((i * 7) % 4) as u32];
                    let p = mech.randomize(&codes, &mut rng).unwrap();
                    mech.accumulate(&p, &mut s).unwrap();
                }
                pooled.merge(&s).unwrap();
                let key = TableKey {
                    round,
                    factor: vec![0, 1],
                    mechanism: kind,
                    bins: vec![],
                };
                tables.insert(key, s);
            }
            let ms = Measurements::new(eps(1.5), &dims, &tables).unwrap();
            let combined = ms.combined(&[0, 1]).unwrap();
            let direct = mech.estimate(&pooled).unwrap();
            for (a, b) in combined.frequencies.iter().zip(&direct.frequencies) {
                assert!((a - b).abs() < 1e-12, "{kind}: {a} vs {b}");
            }
            // Standard errors equal the pooled table's as well. With a population far larger
            // than the sample, each table's sampling term is f(1−f)/n_j, and the weights
            // ∝ n_j combine them into the pooled f(1−f)/Σn_j.
            let big = 1u64 << 40;
            let split = ms.clone().with_population(big).combined(&[0, 1]).unwrap();
            let one_table: Tables = [(
                TableKey {
                    round: 0,
                    factor: vec![0, 1],
                    mechanism: kind,
                    bins: vec![],
                },
                pooled.clone(),
            )]
            .into_iter()
            .collect();
            let whole = Measurements::new(eps(1.5), &dims, &one_table)
                .unwrap()
                .with_population(big)
                .combined(&[0, 1])
                .unwrap();
            for (a, b) in split.std_errors.iter().zip(&whole.std_errors) {
                assert!((a - b).abs() < 1e-9 * b.max(1e-9), "{kind}: {a} vs {b}");
            }
            // 1-way: also a pooled estimate (the weights are ∝ n).
            let one = ms.combined(&[1]).unwrap();
            assert_eq!(one.frequencies.len(), 4);
            if kind != MechanismKind::Oue {
                // GRR and pair estimates sum to one exactly; OUE's only in expectation.
                assert!((one.frequencies.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn weights_prefer_the_precise_table() {
        // A 1-way OUE table of 10k reports and a pair table of 10k: the 1-way estimate of
        // attribute 0 must weigh the 1-way table more (C = 4 cells summed in the pair).
        let dims = [2usize, 4];
        let pair = Mechanism::new(MechanismKind::Oue, eps(1.0), &dims).unwrap();
        let one = Mechanism::new(MechanismKind::Oue, eps(1.0), &dims[..1]).unwrap();
        let v_pair = summed_randomizer_variance(&pair, 4, 0.5, 10_000, None);
        let v_one = one.frequency_variances(&[0.5, 0.5], 10_000)[0];
        assert!(v_pair > 2.0 * v_one);
    }

    /// A 1-way measured finer than its working bins (GRR and OUE on 12 codes, working bins
    /// of 4, 4, 3 and 1 codes) reads as block sums whose variance model matches the
    /// simulated variance within 10%, and its cells stay available for recovery.
    #[test]
    fn refined_one_way_variance_matches_simulation() {
        let space = Space::new(vec![12], vec![vec![4, 8, 11]]).unwrap();
        let population_size = 3000usize;
        let (n, trials) = (300usize, 2000usize);
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        // Skewed: code 0 holds a third of the people.
        let people: Vec<u32> = (0..population_size)
            .map(|_| {
                if rng.random_bool(0.33) {
                    0
                } else {
                    rng.random_range(0..12u32)
                }
            })
            .collect();
        let mut truth = vec![0.0; 4];
        for &p in &people {
            truth[ldpsyn::factor::bin_of(p, space.cuts(0)) as usize] +=
                1.0 / population_size as f64;
        }
        for kind in [MechanismKind::Grr, MechanismKind::Oue] {
            let mech = Mechanism::new(kind, eps(2.0), &[12]).unwrap();
            let key = TableKey {
                round: 0,
                factor: vec![0],
                mechanism: kind,
                bins: vec![],
            };
            let mut idx: Vec<usize> = (0..population_size).collect();
            let (mut sum, mut sq) = (vec![0.0; 4], vec![0.0; 4]);
            let mut last = None;
            for _ in 0..trials {
                for i in 0..n {
                    let j = rng.random_range(i..population_size);
                    idx.swap(i, j);
                }
                let mut stats = SufficientStatistics::new(&mech);
                for &u in &idx[..n] {
                    let r = mech.randomize(&[people[u]], &mut rng).unwrap();
                    mech.accumulate(&r, &mut stats).unwrap();
                }
                let tables: Tables = [(key.clone(), stats)].into_iter().collect();
                let ms = Measurements::filtered_in(
                    &|k: &TableKey, d: &[usize]| Mechanism::new(k.mechanism, eps(2.0), d),
                    &space,
                    &tables,
                    |_| true,
                )
                .unwrap();
                let m = ms.items()[0].clone();
                assert_eq!(m.key.bins, Vec::<Vec<u32>>::new());
                assert_eq!(m.refined.as_ref().unwrap().frequencies.len(), 12);
                let est = m.marginalized(&[0]);
                for c in 0..4 {
                    sum[c] += est[c];
                    sq[c] += est[c] * est[c];
                }
                last = Some(m);
            }
            let t = trials as f64;
            let predicted = last
                .unwrap()
                .cell_variances(&[0], &truth, population_size as u64);
            for c in 0..4 {
                let simulated = (sq[c] - sum[c] * sum[c] / t) / (t - 1.0);
                let mean = sum[c] / t;
                assert!(
                    (mean - truth[c]).abs() < 4.0 * (simulated / t).sqrt(),
                    "{kind} bias"
                );
                let r = predicted[c] / simulated;
                assert!(
                    (r - 1.0).abs() < 0.10,
                    "{kind} bin {c}: {predicted:?} vs {simulated}"
                );
            }
        }
    }

    /// One variance model: the variance of a 1-way obtained by summing a pair table, and of a
    /// direct 1-way table, equal the variance simulated over both randomness sources (which
    /// users of a fixed population report, and their coins) within 10%; so the weights
    /// (inverse predicted variances) of a direct and a summed table agree with their
    /// simulated inverse variances.
    #[test]
    fn variance_model_matches_simulation() {
        let dims = [3usize, 4];
        let population_size = 4000usize;
        let (n, trials) = (400usize, 3000usize);
        // A fixed population with a dependent pair.
        let mut rng = ChaCha12Rng::seed_from_u64(17);
        let people: Vec<[u32; 2]> = (0..population_size)
            .map(|_| {
                let a = rng.random_range(0..3u32);
                let b = if rng.random_bool(0.6) {
                    a
                } else {
                    rng.random_range(0..4u32)
                };
                [a, b]
            })
            .collect();
        let mut truth = vec![0.0; 4];
        people
            .iter()
            .for_each(|p| truth[p[1] as usize] += 1.0 / population_size as f64);
        let simulate =
            |kind: MechanismKind, factor: Vec<usize>, eps_v: f64| -> (Vec<f64>, Vec<f64>) {
                let fdims: Vec<usize> = factor.iter().map(|&a| dims[a]).collect();
                let mech = Mechanism::new(kind, eps(eps_v), &fdims).unwrap();
                let mut rng = ChaCha12Rng::seed_from_u64(kind as u64 * 7 + factor.len() as u64);
                let mut idx: Vec<usize> = (0..population_size).collect();
                let (mut sum, mut sq) = (vec![0.0; 4], vec![0.0; 4]);
                let mut last = None;
                for _ in 0..trials {
                    // n users without replacement.
                    for i in 0..n {
                        let j = rng.random_range(i..population_size);
                        idx.swap(i, j);
                    }
                    let mut stats = SufficientStatistics::new(&mech);
                    for &u in &idx[..n] {
                        let codes: Vec<u32> = factor.iter().map(|&a| people[u][a]).collect();
                        let p = mech.randomize(&codes, &mut rng).unwrap();
                        mech.accumulate(&p, &mut stats).unwrap();
                    }
                    let m = Measurement {
                        key: TableKey {
                            round: 0,
                            factor: factor.clone(),
                            mechanism: kind,
                            bins: vec![],
                        },
                        dims: fdims.clone(),
                        mechanism: mech.clone(),
                        estimate: mech.estimate(&stats).unwrap(),
                        refined: None,
                    };
                    let est = m.marginalized(&[1]);
                    for c in 0..4 {
                        sum[c] += est[c];
                        sq[c] += est[c] * est[c];
                    }
                    last = Some(m);
                }
                let t = trials as f64;
                let simulated: Vec<f64> = (0..4)
                    .map(|c| (sq[c] - sum[c] * sum[c] / t) / (t - 1.0))
                    .collect();
                let predicted = last
                    .unwrap()
                    .cell_variances(&[1], &truth, population_size as u64);
                (simulated, predicted)
            };
        let mut ratios = Vec::new();
        for (kind, factor, e) in [
            (MechanismKind::Grr, vec![0, 1], 2.0),
            (MechanismKind::Oue, vec![0, 1], 2.0),
            (MechanismKind::GrrPair, vec![0, 1], 2.0),
            (MechanismKind::Grr, vec![1], 2.0),
            (MechanismKind::Oue, vec![1], 2.0),
        ] {
            let (sim, pred) = simulate(kind, factor.clone(), e);
            for c in 0..4 {
                let r = pred[c] / sim[c];
                assert!(
                    (r - 1.0).abs() < 0.10,
                    "{kind} {factor:?} cell {c}: predicted {} simulated {}",
                    pred[c],
                    sim[c]
                );
            }
            ratios.push((kind, factor.len(), sim, pred));
        }
        // Weights: direct GRR 1-way vs the GRR pair summed to it.
        let (summed, direct) = (&ratios[0], &ratios[3]);
        for c in 0..4 {
            let predicted = direct.3[c] / summed.3[c];
            let simulated = direct.2[c] / summed.2[c];
            assert!(
                (predicted / simulated - 1.0).abs() < 0.15,
                "cell {c}: {predicted} vs {simulated}"
            );
        }
    }
}
