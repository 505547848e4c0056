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
use ldpsyn::mechanism::{Mechanism, MechanismError, SufficientStatistics, norm_sub};
use serde::{Deserialize, Serialize};

use crate::domain::binned::BinnedFactor;
use crate::domain::key::TableKey;
use crate::domain::sizes::Domain;
use crate::domain::space::{Space, WorkingKey};
use crate::measure::measurement::{Measurement, Refined};
use crate::measure::variance::sampling_variance;

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
    domain: Domain,
    population: u64,
    /// Per attribute, the items whose factor holds it (ascending): a marginal's tables are
    /// found among those of its rarest attribute, not by scanning every table (19,900 pair
    /// tables at 200 attributes).
    by_attr: Vec<Vec<usize>>,
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
    pub(crate) fn filtered(
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
    /// space `space` ([`crate::domain::space`]), each table's mechanism built by `mechanism` from its
    /// key and (binned) factor domain sizes: keys, cells and domain sizes are working ones; a
    /// 1-way finer than its attribute's working bins is summed into them
    /// ([`Measurement::refined`] keeps its cells). A table of several attributes that cuts
    /// through a working bin (no task asks for one) is skipped.
    pub(crate) fn filtered_in(
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
            let dims = match key.binned().sizes_in(domain_sizes) {
                Some(dims) if set.len() == key.factor.len() => dims,
                _ => return Err(TablesError::BadFactor(key.clone())),
            };
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
        Ok(Self::indexed(items, space.domain().clone(), population))
    }

    /// `items` (measurements of `population` people over `domain`), indexed by attribute.
    pub(crate) fn indexed(items: Vec<Measurement>, domain: Domain, population: u64) -> Self {
        let mut by_attr = vec![Vec::new(); domain.len()];
        for (i, m) in items.iter().enumerate() {
            for &a in &m.key.factor {
                by_attr[a].push(i);
            }
        }
        Self {
            items,
            domain,
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
    pub(crate) fn retained(self, keep: impl Fn(&Measurement) -> bool) -> Self {
        let items = self.items.into_iter().filter(|m| keep(m)).collect();
        Self::indexed(items, self.domain, self.population)
    }

    /// The unbiased estimate of attribute `a`'s distribution over the cells of its finest
    /// 1-ways below the working bins ([`Measurement::refined`]; those with the most cells,
    /// the first such bin map in key order): the cells' cuts over schema codes, their
    /// estimates inverse-variance weighted (`∝ n` for one mechanism), and each cell's
    /// standard error (the one variance model at the estimate's Norm-Sub projection). `None`
    /// without such a 1-way. Used to draw a code within a working bin (VertiMRF §6.1's
    /// histogram recovery; [`crate::synth::recovery::Recovery`]).
    pub(crate) fn sub_bin_distribution(&self, a: usize) -> Option<(Vec<u32>, Vec<f64>, Vec<f64>)> {
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
    pub(crate) fn with_population(mut self, population: u64) -> Self {
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
        self.domain.sizes()
    }

    /// [`Measurements::domain_sizes`] as a [`Domain`].
    pub fn domain(&self) -> &Domain {
        &self.domain
    }

    /// Combined estimate of the marginal of `attrs` (cells row-major in `attrs` order) from
    /// every table whose factor contains all of `attrs`, with inverse-variance weights
    /// (module docs); standard errors at the Norm-Sub projection of the combination. `None`
    /// if no table contains them.
    pub(crate) fn combined(&self, attrs: &[usize]) -> Option<Combined> {
        self.combined_where(attrs, |_| true)
    }

    /// As [`Measurements::combined`], using only tables for which `keep` is true.
    pub(crate) fn combined_where(
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
    pub(crate) fn combined_at(
        &self,
        attrs: &[usize],
        keep: impl Fn(&TableKey) -> bool,
        plug: Option<&[f64]>,
    ) -> Option<Combined> {
        self.combined_binned(BinnedFactor::full(attrs), keep, plug)
    }

    /// As [`Measurements::combined_at`] for the attributes of `f` under its bin maps: only
    /// the tables whose maps of those attributes are exactly these contribute, and the cells
    /// are the product of the bins. `None` if no table fits or a map is invalid.
    pub(crate) fn combined_binned(
        &self,
        f: BinnedFactor<'_>,
        keep: impl Fn(&TableKey) -> bool,
        plug: Option<&[f64]>,
    ) -> Option<Combined> {
        let attrs = f.attrs();
        let dims = f.sizes_in(self.domain.sizes())?;
        let cells: usize = dims.iter().product();
        let uniform = vec![1.0 / cells as f64; cells];
        let mut parts: Vec<(f64, Vec<f64>, &Measurement)> = Vec::new();
        for m in self.containing(attrs) {
            if !keep(&m.key) || !m.key.bins_are(f) {
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
    use ldpsyn::mechanism::MechanismKind;
    use rand::SeedableRng;
    use rand_chacha::ChaCha12Rng;

    use crate::measure::variance::summed_randomizer_variance;

    fn eps(e: f64) -> Epsilon {
        Epsilon::new(e).unwrap()
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
}
