//! Sufficient statistics per table and their combination into marginal estimates.
//!
//! A *table* is everything reported for one [`TableKey`] (round, factor, mechanism): its
//! [`SufficientStatistics`] are additive, so any number of processes can count reports and
//! merge the sums. [`Measurements`] turns the tables into estimates: every table whose factor
//! contains a set of attributes `A*` yields an unbiased estimate of the marginal of `A*`
//! (summing the cells that agree on `A*`), and those estimates are combined with
//! inverse-variance weights in frequency space (eqs. 6–13 of PrivIncr, EDBT 2023, with the
//! correction of DESIGN.md: eq. 6 weighs *counts*, in frequency space table j's weight is
//! the inverse of its frequency variance).
//!
//! Weight of table j for target `A*`: `w_j = 1 / V̄_j`, where `V̄_j` is the exact variance of
//! the marginalized estimate of one cell of `A*` evaluated at the uniform frequency
//! `1/|Ω_{A*}|`, averaged over cells. For OUE it equals `C_j·Var0 / n_j` plus the sampling term
//! (C_j = cells summed into one target cell), i.e. DESIGN.md's `n_j / (C_j · Var0_j)` up to a
//! term common to all tables; for tables of the same factor, mechanism and ε it is `∝ n_j`,
//! so combining them equals pooling their raw counts (eq. 5, divisibility of LDP), and the
//! incremental form of eq. 13 (round t from round t−1's result) is the same weighted mean.
//! The weights do not depend on the data, so the combination is linear and unbiased.

use std::collections::{BTreeMap, BTreeSet};

use ldpsyn::Epsilon;
use ldpsyn::mechanism::{
    FrequencyEstimate, Mechanism, MechanismError, MechanismKind, Oracle, SufficientStatistics,
};
use serde::{Deserialize, Serialize};

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
        (self.round, &self.factor, kind_rank(self.mechanism)).cmp(&(
            other.round,
            &other.factor,
            kind_rank(other.mechanism),
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
    /// Domain sizes of the factor attributes (factor order).
    pub dims: Vec<usize>,
    /// The mechanism (which oracle, p, q).
    pub mechanism: Mechanism,
    /// Unbiased frequency estimate over the factor's product domain (row-major).
    pub estimate: FrequencyEstimate,
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
    /// A table's factor names an attribute beyond the schema or repeats one.
    #[error("table {0:?} has an invalid factor")]
    BadFactor(TableKey),
}

/// Every non-empty table turned into an unbiased estimate; answers combined marginals.
#[derive(Debug, Clone)]
pub struct Measurements {
    items: Vec<Measurement>,
    domain_sizes: Vec<usize>,
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

/// Exact variance of the estimate of one target cell aggregated from `c` factor cells of a
/// table with mechanism `m` and `n` reports, when the target cell's true frequency is `f`.
/// `single` is the position (0/1) of the kept attribute for a pair-GRR marginalized to one.
fn aggregated_variance(m: &Mechanism, c: usize, f: f64, n: u64, single: Option<usize>) -> f64 {
    let nf = n as f64;
    let f = f.clamp(0.0, 1.0);
    let c = c as f64;
    match m.oracle() {
        Oracle::Grr(g) => {
            let (p, q) = (g.p(), g.q());
            let pi = f * (p + (c - 1.0) * q) + (1.0 - f) * c * q;
            pi * (1.0 - pi) / (nf * (p - q).powi(2))
        }
        Oracle::Oue(o) => {
            let (p, q) = (o.p(), o.q());
            let per_user = f * (p * (1.0 - p) + (c - 1.0) * q * (1.0 - q))
                + (1.0 - f) * c * q * (1.0 - q)
                + (p - q).powi(2) * f * (1.0 - f);
            per_user / (nf * (p - q).powi(2))
        }
        Oracle::GrrPair(pg) => {
            // A single kept attribute is a GRR at ε/2 over that attribute (Q⁻¹'s columns
            // sum to one). The full pair (c = 1) is handled by the caller's plug-in.
            let g = if single == Some(0) {
                pg.first()
            } else {
                pg.second()
            };
            let (p, q) = (g.p(), g.q());
            let pi = f * p + (1.0 - f) * q;
            pi * (1.0 - pi) / (nf * (p - q).powi(2))
        }
    }
}

/// One table's contribution to a combined estimate: weight, marginalized estimate, the
/// table, cells summed per target cell, kept position of a pair-GRR marginalized to one.
type Part<'a> = (f64, Vec<f64>, &'a Measurement, usize, Option<usize>);

impl Measurements {
    /// Estimates every table with at least one report. `domain_sizes` is the schema's.
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
            let dims: Vec<usize> = key.factor.iter().map(|&a| domain_sizes[a]).collect();
            let err = |source| TablesError::Mechanism {
                key: key.clone(),
                source,
            };
            let mechanism = Mechanism::new(key.mechanism, epsilon, &dims).map_err(err)?;
            let estimate = mechanism.estimate(stats).map_err(err)?;
            items.push(Measurement {
                key: key.clone(),
                dims,
                mechanism,
                estimate,
            });
        }
        Ok(Self {
            items,
            domain_sizes: domain_sizes.to_vec(),
        })
    }

    /// The per-table estimates, in key order.
    pub fn items(&self) -> &[Measurement] {
        &self.items
    }

    /// Schema domain sizes.
    pub fn domain_sizes(&self) -> &[usize] {
        &self.domain_sizes
    }

    /// The distinct attribute sets measured (sorted sets), in order.
    pub fn measured_sets(&self) -> BTreeSet<Vec<usize>> {
        self.items
            .iter()
            .map(|m| {
                let mut s = m.key.factor.clone();
                s.sort_unstable();
                s
            })
            .collect()
    }

    /// Combined estimate of the marginal of `attrs` (cells row-major in `attrs` order) from
    /// every table whose factor contains all of `attrs`, with inverse-variance weights
    /// (module docs). `None` if no table contains them.
    pub fn combined(&self, attrs: &[usize]) -> Option<Combined> {
        self.combined_where(attrs, |_| true)
    }

    /// As [`Measurements::combined`], using only tables for which `keep` is true.
    pub fn combined_where(
        &self,
        attrs: &[usize],
        keep: impl Fn(&TableKey) -> bool,
    ) -> Option<Combined> {
        let dims: Vec<usize> = attrs.iter().map(|&a| self.domain_sizes[a]).collect();
        let cells: usize = dims.iter().product();
        let mut parts: Vec<Part<'_>> = Vec::new();
        for m in &self.items {
            if !keep(&m.key) || !attrs.iter().all(|a| m.key.factor.contains(a)) {
                continue;
            }
            let map = projection_map(&m.key.factor, &m.dims, attrs);
            let mut est = vec![0.0; cells];
            for (i, &t) in map.iter().enumerate() {
                est[t] += m.estimate.frequencies[i];
            }
            let c = m.estimate.frequencies.len() / cells;
            let single = if m.key.mechanism == MechanismKind::GrrPair && attrs.len() == 1 {
                m.key.factor.iter().position(|&f| f == attrs[0])
            } else {
                None
            };
            let vbar = if c == 1 {
                // Full table: the mechanism's exact variances at the uniform frequency.
                let u = vec![1.0 / cells as f64; m.estimate.frequencies.len()];
                m.mechanism
                    .frequency_variances(&u, m.estimate.n)
                    .iter()
                    .sum::<f64>()
                    / cells as f64
            } else {
                aggregated_variance(&m.mechanism, c, 1.0 / cells as f64, m.estimate.n, single)
            };
            parts.push((1.0 / vbar, est, m, c, single));
        }
        if parts.is_empty() {
            return None;
        }
        let wsum: f64 = parts.iter().map(|p| p.0).sum();
        let mut freq = vec![0.0; cells];
        for (w, est, ..) in &parts {
            for (f, e) in freq.iter_mut().zip(est) {
                *f += w / wsum * e;
            }
        }
        let mut var = vec![0.0; cells];
        for (w, _, m, c, single) in &parts {
            let scale = (w / wsum).powi(2);
            if *c == 1 {
                // Reorder the combined estimate into the table's factor order for the plug-in.
                let map = projection_map(&m.key.factor, &m.dims, attrs);
                let plug: Vec<f64> = map.iter().map(|&t| freq[t].clamp(0.0, 1.0)).collect();
                let v = m.mechanism.frequency_variances(&plug, m.estimate.n);
                for (i, &t) in map.iter().enumerate() {
                    var[t] += scale * v[i].max(0.0);
                }
            } else {
                for (t, v) in var.iter_mut().enumerate() {
                    *v += scale
                        * aggregated_variance(&m.mechanism, *c, freq[t], m.estimate.n, *single);
                }
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
    use rand::SeedableRng;
    use rand_chacha::ChaCha12Rng;

    fn eps(e: f64) -> Epsilon {
        Epsilon::new(e).unwrap()
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
                };
                tables.insert(key, s);
            }
            let ms = Measurements::new(eps(1.5), &dims, &tables).unwrap();
            let combined = ms.combined(&[0, 1]).unwrap();
            let direct = mech.estimate(&pooled).unwrap();
            for (a, b) in combined.frequencies.iter().zip(&direct.frequencies) {
                assert!((a - b).abs() < 1e-12, "{kind}: {a} vs {b}");
            }
            // Standard errors equal the pooled table's plug-in ones as well (GRR/OUE plug in
            // f̂; the pair estimator plugs in the observed output distribution instead).
            for (a, b) in combined
                .std_errors
                .iter()
                .zip(&direct.std_errors)
                .filter(|_| kind != MechanismKind::GrrPair)
            {
                assert!((a - b).abs() < 1e-9 * b.max(1e-9), "{kind}: {a} vs {b}");
            }
            #[cfg(any())]
            for (a, b) in combined.std_errors.iter().zip(&direct.std_errors) {
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
        let v_pair = aggregated_variance(&pair, 4, 0.5, 10_000, None);
        let v_one = one.frequency_variances(&[0.5, 0.5], 10_000)[0];
        assert!(v_pair > 2.0 * v_one);
    }
}
