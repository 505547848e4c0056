//! Utility evaluation: mean total variation distance over all k-way marginals, and ML
//! efficacy (logistic regression trained on synthetic data, tested on real data).

use linfa::prelude::*;
use linfa_logistic::LogisticRegression;
use ndarray::{Array1, Array2};

use ldpsyn::schema::{
    AttributeKind, DecodedValue, NumericBins, NumericDecoding, RecordError, Schema, Value,
};

use crate::Population;

/// Errors of the evaluation.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// Shapes differ or a table is empty.
    #[error("bad input: {0}")]
    BadInput(String),
    /// The classifier could not be fitted.
    #[error("logistic regression: {0}")]
    Fit(String),
}

/// Most k-subsets a k-way TVD of three or more attributes is scored on: beyond it, a seeded
/// sample (the same for every model of a dataset). Counting all of them is cubic in the
/// attributes: a 70-attribute table has 54,740 triples, which took 400 s and 2 GB to count
/// over 170,254 rows.
pub const MAX_SCORED_SUBSETS: usize = 300;

/// Counts of every k-way marginal of a stream of rows.
#[derive(Debug, Clone)]
pub struct MarginalCounts {
    dims: Vec<usize>,
    subsets: Vec<Vec<usize>>,
    counts: Vec<Vec<u64>>,
    rows: u64,
}

fn subsets(d: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    fn rec(start: usize, d: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..d {
            cur.push(i);
            rec(i + 1, d, k, cur, out);
            cur.pop();
        }
    }
    rec(0, d, k, &mut cur, &mut out);
    out
}

impl MarginalCounts {
    /// Empty counters for every k-subset of attributes, or, when there are more than
    /// `limit`, for `limit` of them drawn without replacement by `seed` (the same draw for
    /// the same arguments, so every model of a dataset is scored on the same subsets).
    pub fn sampled(dims: &[usize], k: usize, limit: usize, seed: u64) -> Self {
        use rand::{Rng, SeedableRng};
        let mut all = subsets(dims.len(), k);
        if all.len() > limit {
            let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
            for i in 0..limit {
                let j = rng.random_range(i..all.len());
                all.swap(i, j);
            }
            all.truncate(limit);
            all.sort();
        }
        let counts = all
            .iter()
            .map(|s| vec![0u64; s.iter().map(|&a| dims[a]).product()])
            .collect();
        Self {
            dims: dims.to_vec(),
            subsets: all,
            counts,
            rows: 0,
        }
    }

    /// Counts every row of a population into empty counters shaped like `self`'s.
    pub fn like(&self, pop: &Population) -> Self {
        let mut m = Self {
            dims: self.dims.clone(),
            subsets: self.subsets.clone(),
            counts: self.counts.iter().map(|c| vec![0; c.len()]).collect(),
            rows: 0,
        };
        pop.rows().for_each(|r| m.add(r));
        m
    }

    /// Empty counters for every k-subset of attributes (lexicographic).
    pub fn new(dims: &[usize], k: usize) -> Self {
        Self::sampled(dims, k, usize::MAX, 0)
    }

    /// Adds one row (codes, one per attribute).
    pub fn add(&mut self, row: &[u32]) {
        self.add_weighted(row, 1);
    }

    /// Adds `weight` copies of one row (codes, one per attribute): a resampled population
    /// is counted from its distinct records and their multiplicities.
    pub fn add_weighted(&mut self, row: &[u32], weight: u64) {
        for (s, c) in self.subsets.iter().zip(self.counts.iter_mut()) {
            let mut idx = 0usize;
            for &a in s {
                idx = idx * self.dims[a] + row[a] as usize;
            }
            c[idx] += weight;
        }
        self.rows += weight;
    }

    /// Empty counters of the subsets a k-way TVD is scored on, for attributes of domain
    /// sizes `dims`: every subset for k ≤ 2, else [`MAX_SCORED_SUBSETS`] of them drawn by a
    /// fixed seed.
    pub fn scoring(dims: &[usize], k: usize) -> Self {
        let limit = if k <= 2 {
            usize::MAX
        } else {
            MAX_SCORED_SUBSETS
        };
        Self::sampled(dims, k, limit, 3)
    }

    /// [`MarginalCounts::scoring`] filled with `pop`'s rows.
    pub fn for_scoring(pop: &Population, k: usize) -> Self {
        Self::scoring(pop.dims(), k).like(pop)
    }

    /// Counts every row of a population.
    pub fn of_population(pop: &Population, k: usize) -> Self {
        let mut m = Self::new(pop.dims(), k);
        pop.rows().for_each(|r| m.add(r));
        m
    }

    /// Mean over all k-subsets of the TVD `½ Σ |p − q|` between the two tables' normalized
    /// marginals. Errors: different shapes or no rows.
    pub fn mean_tvd(&self, other: &MarginalCounts) -> Result<f64, EvalError> {
        self.mean_tvd_where(other, |_| true)
    }

    /// As [`MarginalCounts::mean_tvd`] over the subsets for which `keep` holds (e.g. the
    /// pairs across two parties). Errors: different shapes, no rows or no subset kept.
    pub fn mean_tvd_where(
        &self,
        other: &MarginalCounts,
        keep: impl Fn(&[usize]) -> bool,
    ) -> Result<f64, EvalError> {
        if self.dims != other.dims || self.subsets != other.subsets {
            return Err(EvalError::BadInput("different marginals".into()));
        }
        if self.rows == 0 || other.rows == 0 {
            return Err(EvalError::BadInput("no rows".into()));
        }
        let (na, nb) = (self.rows as f64, other.rows as f64);
        let tvds: Vec<f64> = self
            .subsets
            .iter()
            .zip(self.counts.iter().zip(&other.counts))
            .filter(|(s, _)| keep(s))
            .map(|(_, (a, b))| {
                a.iter()
                    .zip(b)
                    .map(|(&x, &y)| (x as f64 / na - y as f64 / nb).abs())
                    .sum::<f64>()
                    / 2.0
            })
            .collect();
        if tvds.is_empty() {
            return Err(EvalError::BadInput("no marginal to compare".into()));
        }
        Ok(tvds.iter().sum::<f64>() / tvds.len() as f64)
    }
}

/// How far a numeric column of synthetic data is from the real one, on raw values (the
/// binned TVDs cannot see a point mass smeared over its bin, or values decoded uniformly
/// within a bin).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NumericFidelity {
    /// Attribute name.
    pub attribute: String,
    /// Kolmogorov–Smirnov distance `sup_x |F_real(x) − F_synthetic(x)|` (0…1).
    pub ks: f64,
    /// Wasserstein-1 distance `∫ |F_real − F_synthetic| dx` divided by `max − min` of the
    /// schema (0…1).
    pub w1: f64,
    /// Mean absolute error of the fraction of rows in a 1-D range `[lo, hi]`, over seeded
    /// ranges with both ends uniform in `[min, max]`.
    pub range_query_error: f64,
    /// The real column's most frequent value (a point mass such as 0 or 40 hours).
    pub mode: f64,
    /// Share of real rows equal to [`NumericFidelity::mode`].
    pub mode_share_real: f64,
    /// Share of synthetic rows equal to it.
    pub mode_share_synthetic: f64,
}

/// [`NumericFidelity`] of `synthetic` against `real` (raw values; NaNs are left out) for
/// an attribute with public bounds `[min, max]`, over `ranges` range queries drawn by
/// `seed`. Errors: an empty column or `max ≤ min`.
pub fn numeric_fidelity(
    attribute: &str,
    real: &[f64],
    synthetic: &[f64],
    (min, max): (f64, f64),
    ranges: usize,
    seed: u64,
) -> Result<NumericFidelity, EvalError> {
    use rand::{Rng, SeedableRng};
    let sorted = |v: &[f64]| {
        let mut v: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (r, s) = (sorted(real), sorted(synthetic));
    if r.is_empty() || s.is_empty() || max <= min {
        return Err(EvalError::BadInput(format!(
            "`{attribute}`: empty column or empty range"
        )));
    }
    // Fraction of a sorted column at or below x.
    let cdf = |v: &[f64], x: f64| v.partition_point(|y| *y <= x) as f64 / v.len() as f64;
    // Both CDFs are step functions jumping only at data points: walk the merged points.
    let mut points: Vec<f64> = r.iter().chain(&s).copied().collect();
    points.sort_by(f64::total_cmp);
    points.dedup();
    let (mut ks, mut area) = (0.0f64, 0.0);
    for (i, &x) in points.iter().enumerate() {
        let gap = (cdf(&r, x) - cdf(&s, x)).abs();
        ks = ks.max(gap);
        if let Some(&next) = points.get(i + 1) {
            area += gap * (next - x);
        }
    }
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
    let share = |v: &[f64], lo: f64, hi: f64| {
        (v.partition_point(|y| *y <= hi) - v.partition_point(|y| *y < lo)) as f64 / v.len() as f64
    };
    let mut range_error = 0.0;
    for _ in 0..ranges {
        let (a, b) = (rng.random_range(min..=max), rng.random_range(min..=max));
        let (lo, hi) = (a.min(b), a.max(b));
        range_error += (share(&r, lo, hi) - share(&s, lo, hi)).abs();
    }
    // The most frequent real value (ties: the smallest).
    let (mut mode, mut best, mut i) = (r[0], 0usize, 0usize);
    while i < r.len() {
        let j = r.partition_point(|y| *y <= r[i]);
        if j - i > best {
            (mode, best) = (r[i], j - i);
        }
        i = j;
    }
    Ok(NumericFidelity {
        attribute: attribute.to_owned(),
        ks,
        w1: area / (max - min),
        range_query_error: range_error / ranges.max(1) as f64,
        mode,
        mode_share_real: best as f64 / r.len() as f64,
        mode_share_synthetic: share(&s, mode, mode),
    })
}

/// One-hot features of every attribute except `target`, and the label `code == positive`.
fn features<'a>(
    rows: impl Iterator<Item = &'a [u32]>,
    dims: &[usize],
    target: usize,
    positive: u32,
) -> (Array2<f64>, Array1<bool>) {
    let width: usize = dims
        .iter()
        .enumerate()
        .filter(|&(a, _)| a != target)
        .map(|(_, &k)| k)
        .sum();
    let mut data = Vec::new();
    let mut labels = Vec::new();
    for row in rows {
        let mut x = vec![0.0; width];
        let mut off = 0;
        for (a, &k) in dims.iter().enumerate() {
            if a == target {
                continue;
            }
            x[off + row[a] as usize] = 1.0;
            off += k;
        }
        data.extend(x);
        labels.push(row[target] == positive);
    }
    let n = labels.len();
    (
        // Shape is n × width by construction.
        Array2::from_shape_vec((n, width), data).expect("n × width values"),
        Array1::from(labels),
    )
}

/// ML efficacy: fits an L2-regularized logistic regression (linfa-logistic, one-hot
/// features of every other attribute) predicting `target == positive` on `train`, and
/// returns its accuracy on `test`. `train` is subsampled to at most `max_train` rows by a
/// fixed stride (rows from a model are i.i.d., so a stride is a random subsample).
/// Errors: empty inputs, different schemas, a single class in training, or a failed fit.
pub fn ml_accuracy(
    train: &Population,
    test: &Population,
    target: usize,
    positive: u32,
    max_train: usize,
) -> Result<f64, EvalError> {
    if train.dims() != test.dims() || train.is_empty() || test.is_empty() {
        return Err(EvalError::BadInput(
            "train/test schemas differ or are empty".into(),
        ));
    }
    let stride = train.len().div_ceil(max_train.max(1));
    let (x, y) = features(train.rows().step_by(stride), train.dims(), target, positive);
    if y.iter().all(|&v| v) || y.iter().all(|&v| !v) {
        // A constant classifier: accuracy of always predicting that class.
        let c = y[0];
        let hits = test.rows().filter(|r| (r[target] == positive) == c).count();
        return Ok(hits as f64 / test.len() as f64);
    }
    let model = LogisticRegression::default()
        .alpha(1e-3)
        .max_iterations(200)
        .fit(&Dataset::new(x, y))
        .map_err(|e| EvalError::Fit(e.to_string()))?;
    let (tx, ty) = features(test.rows(), test.dims(), target, positive);
    let pred = model.predict(&tx);
    let hits = pred.iter().zip(ty.iter()).filter(|(a, b)| a == b).count();
    Ok(hits as f64 / test.len() as f64)
}

/// Exact marginals of a population (no privacy), as a [`ldpsyn_engine::JointSource`].
#[derive(Debug, Clone)]
pub struct ExactJoint {
    pop: std::sync::Arc<Population>,
}

impl ExactJoint {
    /// Wraps the population.
    pub fn new(pop: std::sync::Arc<Population>) -> Self {
        Self { pop }
    }
}

impl ldpsyn_engine::JointSource for ExactJoint {
    fn joint(&self, scope: &[usize]) -> Vec<f64> {
        let dims = self.pop.dims();
        let cells: usize = scope.iter().map(|&a| dims[a]).product();
        let mut c = vec![0.0; cells];
        for row in self.pop.rows() {
            let mut idx = 0;
            for &a in scope {
                idx = idx * dims[a] + row[a] as usize;
            }
            c[idx] += 1.0;
        }
        let n = self.pop.len().max(1) as f64;
        c.iter_mut().for_each(|v| *v /= n);
        c
    }
}

/// The no-privacy junction tree (`noprivjtree` in the benchmark): PrivIncr's structure from
/// the *true* pair MI (edge kept iff `I ≥ τ`, eq. 15 with `phi`), junction tree and
/// Algorithm 2 with `sigma`, every conditional from the exact marginals.
pub fn noprivacy_model(
    pop: std::sync::Arc<Population>,
    phi: f64,
    sigma: u64,
) -> ldpsyn_engine::Model {
    use ldpsyn_engine::JointSource;
    use ldpsyn_engine::numeric::info::{mutual_information, tau};
    let dims = pop.dims().to_vec();
    let d = dims.len();
    let source = ExactJoint::new(pop);
    let mut mi = vec![vec![0.0; d]; d];
    let mut edges = std::collections::BTreeSet::new();
    let mut states = Vec::new();
    for a in 0..d {
        for b in a + 1..d {
            let j = source.joint(&[a, b]);
            let m = mutual_information(&j, dims[a], dims[b]);
            mi[a][b] = m;
            mi[b][a] = m;
            let t = tau(dims[a], dims[b], phi);
            if m >= t {
                edges.insert((a, b));
            }
            states.push(ldpsyn_engine::EdgeState {
                a,
                b,
                active: m >= t,
                pruned_in: if m >= t { None } else { Some(0) },
                mi: Some(m),
                tau: t,
                ell: None,
                reports: 0,
                score: None,
                bins: vec![],
            });
        }
    }
    let domain = ldpsyn_engine::Domain::new(dims);
    let structure = ldpsyn_engine::select::structure::build_structure(&domain, &edges, &mi, sigma);
    ldpsyn_engine::Model::graphical("noprivjtree", domain, states, structure, source)
}

/// The exact independence model (`exact-independence` in the benchmark, a non-private
/// reference): every attribute sampled from its exact 1-way marginal.
pub fn exact_independence_model(pop: std::sync::Arc<Population>) -> ldpsyn_engine::Model {
    let domain = ldpsyn_engine::Domain::from(pop.dims());
    let structure = ldpsyn_engine::select::structure::build_structure(
        &domain,
        &std::collections::BTreeSet::new(),
        &[],
        u64::MAX,
    );
    ldpsyn_engine::Model::graphical(
        "exact-independence",
        domain,
        Vec::new(),
        structure,
        ExactJoint::new(pop),
    )
}

/// The Chow–Liu tree (`chow-liu` in the benchmark, a non-private reference): the maximum
/// spanning tree of the exact pairwise mutual information (Kruskal; natural log), each
/// clique's marginal exact. The best tree-shaped model of the data (Chow & Liu 1968).
pub fn chow_liu_model(pop: std::sync::Arc<Population>) -> ldpsyn_engine::Model {
    use ldpsyn_engine::JointSource;
    use ldpsyn_engine::numeric::info::mutual_information;
    let dims = pop.dims().to_vec();
    let d = dims.len();
    let source = ExactJoint::new(pop);
    let mut weighted = Vec::new();
    for a in 0..d {
        for b in a + 1..d {
            let mi = mutual_information(&source.joint(&[a, b]), dims[a], dims[b]);
            weighted.push((mi, a, b));
        }
    }
    let edges = ldpsyn_engine::graph::maximum_spanning_forest(d, weighted);
    let domain = ldpsyn_engine::Domain::new(dims);
    let structure =
        ldpsyn_engine::select::structure::build_structure(&domain, &edges, &[], u64::MAX);
    ldpsyn_engine::Model::graphical("chow-liu", domain, Vec::new(), structure, source)
}

/// The schema binned TVDs are measured on: `schema` with every `bins: "auto"` numeric
/// attribute as a fixed count of its working bins (equal width, same points and policies):
/// the grid the model measures pairs on, and what a fixed-count schema with that count
/// would give, so TVDs of the two are comparable. Other attributes are unchanged.
pub fn evaluation_schema(schema: &Schema) -> Schema {
    let attributes = schema
        .attributes()
        .iter()
        .map(|a| {
            let mut a = a.clone();
            if let (
                Some(m),
                AttributeKind::Numeric {
                    bins,
                    grid,
                    max_bins,
                    ..
                },
            ) = (a.working_bins(), &mut a.kind)
            {
                *bins = NumericBins::Count(m);
                *grid = None;
                *max_bins = None;
            }
            a
        })
        .collect();
    Schema::new(attributes).expect("a valid schema stays valid at fewer bins")
}

/// `pop` (codes of `from`) in the codes of `to`, a schema of the same attributes that may
/// bin numeric ones differently: each code decoded to its cell's midpoint and encoded again
/// (exact where `to`'s bins are unions of `from`'s cells, as with
/// [`evaluation_schema`]). Errors: a decoded value that `to` refuses.
pub fn regrid(pop: &Population, from: &Schema, to: &Schema) -> Result<Population, RecordError> {
    let map = Regrid::new(from, to)?;
    let mut codes = Vec::with_capacity(pop.codes().len());
    for row in pop.rows() {
        codes.extend(map.row(row));
    }
    Ok(Population::new(to.domain_sizes(), codes).expect("codes of `to`"))
}

/// [`regrid`] one row at a time: per attribute that `to` bins differently from `from`, a
/// table from each code of `from` to its code of `to` (built once: the midpoint decoding
/// draws nothing).
#[derive(Debug, Clone)]
pub struct Regrid {
    /// Per attribute, `None` where both schemas agree, else the code of `to` per code of
    /// `from`.
    maps: Vec<Option<Vec<u32>>>,
}

impl Regrid {
    /// The tables from `from`'s codes to `to`'s (schemas of the same attributes in the same
    /// order). Errors: a decoded midpoint that `to` refuses.
    pub fn new(from: &Schema, to: &Schema) -> Result<Self, RecordError> {
        let mut rng = <rand_chacha::ChaCha12Rng as rand::SeedableRng>::seed_from_u64(0);
        let maps = from
            .attributes()
            .iter()
            .zip(to.attributes())
            .map(|(fa, ta)| {
                if fa == ta {
                    return Ok(None);
                }
                (0..fa.domain_size() as u32)
                    .map(|c| {
                        let v = match fa.decode(c, NumericDecoding::Midpoint, &mut rng) {
                            DecodedValue::Number(x) => Value::Number(x),
                            DecodedValue::Label(l) => Value::Text(l),
                            DecodedValue::Missing => Value::Missing,
                        };
                        ta.encode_value(&v)
                    })
                    .collect::<Result<Vec<u32>, _>>()
                    .map(Some)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { maps })
    }

    /// `row` (codes of `from`) in the codes of `to`. Panics if a code is outside `from`'s
    /// domain.
    pub fn row<'a>(&'a self, row: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
        row.iter().zip(&self.maps).map(|(&c, m)| match m {
            None => c,
            Some(m) => m[c as usize],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scoring counters: every pair, and triples capped at [`MAX_SCORED_SUBSETS`] by a
    /// fixed draw (the same subsets for two populations of the same shape); a table with
    /// fewer triples keeps them all, with the counts of `of_population`.
    #[test]
    fn scoring_counts_sample_triples_of_wide_tables() {
        let d = 20; // 1,140 triples
        let dims = vec![3; d];
        let rows = (0..50u32).map(|i| (0..d as u32).map(|a| (i + a) % 3).collect::<Vec<_>>());
        let wide = Population::from_rows(dims.clone(), rows.clone()).unwrap();
        let other = Population::from_rows(dims, rows.rev()).unwrap();
        let (pairs, triples) = (
            MarginalCounts::for_scoring(&wide, 2),
            MarginalCounts::for_scoring(&wide, 3),
        );
        assert_eq!(pairs.subsets.len(), d * (d - 1) / 2);
        assert_eq!(triples.subsets.len(), MAX_SCORED_SUBSETS);
        assert_eq!(
            triples.subsets,
            MarginalCounts::for_scoring(&other, 3).subsets
        );
        // The same rows in another order: the same counts, TVD 0.
        let t = triples
            .mean_tvd(&MarginalCounts::for_scoring(&other, 3))
            .unwrap();
        assert_eq!(t, 0.0);
        let narrow =
            Population::from_rows(vec![2, 3, 4, 2], [vec![0, 1, 2, 1], vec![1, 2, 3, 0]]).unwrap();
        let all = MarginalCounts::of_population(&narrow, 3);
        let scored = MarginalCounts::for_scoring(&narrow, 3);
        assert_eq!((scored.subsets, scored.counts), (all.subsets, all.counts));
    }

    /// A resampled population counted from its distinct records and their multiplicities
    /// gives the counts of its rows one by one.
    #[test]
    fn weighted_counts_equal_counting_every_row() {
        let rows = (0..50u32).map(|i| vec![i % 3, (i / 3) % 4, i % 2]);
        let records = Population::from_rows(vec![3, 4, 2], rows).unwrap();
        let order = records.resample_order(1_000, 9);
        let people = records.select(&order);
        let mut multiplicity = vec![0u64; records.len()];
        order.iter().for_each(|&i| multiplicity[i as usize] += 1);
        for k in 1..=3 {
            let mut weighted = MarginalCounts::scoring(records.dims(), k);
            for (row, &m) in records.rows().zip(&multiplicity) {
                weighted.add_weighted(row, m);
            }
            let direct = MarginalCounts::for_scoring(&people, k);
            assert_eq!(weighted.rows, 1_000);
            assert_eq!(weighted.counts, direct.counts, "k = {k}");
        }
        assert_eq!(people, records.resample(1_000, 9));
    }

    /// Exact values on small columns: a shift by 10 moves W1 by 10/(max − min); a point
    /// mass smeared uniformly over its bin has KS = the mass's share, as the issue reports.
    #[test]
    fn numeric_fidelity_exact_values() {
        let real: Vec<f64> = (0..100).map(f64::from).collect();
        let same = numeric_fidelity("x", &real, &real, (0.0, 200.0), 50, 1).unwrap();
        assert_eq!((same.ks, same.w1, same.range_query_error), (0.0, 0.0, 0.0));
        let shifted: Vec<f64> = real.iter().map(|x| x + 10.0).collect();
        let f = numeric_fidelity("x", &real, &shifted, (0.0, 200.0), 50, 1).unwrap();
        assert!((f.w1 - 10.0 / 200.0).abs() < 1e-12, "{f:?}");
        assert!((f.ks - 0.10).abs() < 1e-12, "{f:?}");
        assert!(f.range_query_error > 0.0);
        // 92% zeros, the rest at 5000; the synthetic column spreads the zeros over [0, 100).
        let mut real = vec![0.0; 92];
        real.extend(vec![5000.0; 8]);
        let mut smeared: Vec<f64> = (0..92).map(|i| 100.0 * (i as f64 + 0.5) / 92.0).collect();
        smeared.extend(vec![5000.0; 8]);
        let f = numeric_fidelity("gain", &real, &smeared, (0.0, 10_000.0), 10, 2).unwrap();
        assert!((f.ks - 0.92).abs() < 1e-12, "{f:?}");
        assert_eq!(
            (f.mode, f.mode_share_real, f.mode_share_synthetic),
            (0.0, 0.92, 0.0)
        );
        assert!((f.w1 - 0.92 * 50.0 / 10_000.0).abs() < 1e-9, "{f:?}");
        assert!(numeric_fidelity("x", &[], &real, (0.0, 1.0), 1, 1).is_err());
        assert!(numeric_fidelity("x", &real, &real, (1.0, 1.0), 1, 1).is_err());
    }

    /// A chain A → B → C with strong dependence: Chow–Liu recovers (A, B) and (B, C), and
    /// exact independence reproduces the 1-ways.
    #[test]
    fn references_on_a_chain() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(5);
        let mut codes = Vec::new();
        for _ in 0..20_000 {
            let a = rng.random_range(0..3u32);
            let b = if rng.random_bool(0.8) {
                a
            } else {
                rng.random_range(0..3)
            };
            let c = if rng.random_bool(0.8) {
                b
            } else {
                rng.random_range(0..3)
            };
            codes.extend([a, b, c]);
        }
        let pop = std::sync::Arc::new(Population::new(vec![3, 3, 3], codes).unwrap());
        let cl = chow_liu_model(pop.clone());
        assert_eq!(cl.graph_edges(), vec![(0, 1), (1, 2)]);
        let ind = exact_independence_model(pop.clone());
        assert!(ind.graph_edges().is_empty());
        let exact = MarginalCounts::of_population(&pop, 1);
        for model in [&ind, &cl] {
            for a in 0..3 {
                let m = model.marginal(&[a]).unwrap();
                let truth: Vec<f64> = (0..3)
                    .map(|v| pop.rows().filter(|r| r[a] == v).count() as f64 / 20_000.0)
                    .collect();
                for (x, y) in m.frequencies.iter().zip(&truth) {
                    assert!((x - y).abs() < 1e-12);
                }
            }
        }
        let syn = Population::from_rows(vec![3, 3, 3], ind.synthesize(20_000, 1)).unwrap();
        assert!(
            exact
                .mean_tvd(&MarginalCounts::of_population(&syn, 1))
                .unwrap()
                < 0.02
        );
    }
}
