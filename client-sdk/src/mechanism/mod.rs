//! Mechanisms (frequency oracles): randomizers and their unbiased estimators, one module per
//! mechanism, shared by the client (randomize) and the aggregator (validate, accumulate,
//! estimate) so both agree on p, q and encodings.
//!
//! ```
//! use ldpsyn::{Epsilon, mechanism::{Mechanism, MechanismKind, SufficientStatistics}};
//! use rand::SeedableRng;
//! let mut rng = rand::rngs::StdRng::seed_from_u64(1);
//! let eps = Epsilon::new(2.0).unwrap();
//! // A factor of two attributes with domains 3 and 4, reported with OUE over 12 cells.
//! let m = Mechanism::new(MechanismKind::Oue, eps, &[3, 4]).unwrap();
//! let mut stats = SufficientStatistics::new(&m);
//! for i in 0..1000u32 {
//!     let payload = m.randomize(&[i % 3, i % 4], &mut rng).unwrap();
//!     m.accumulate(&payload, &mut stats).unwrap();
//! }
//! let est = m.estimate(&stats).unwrap();
//! assert_eq!(est.frequencies.len(), 12);
//! ```

pub mod grr;
pub mod oue;
pub mod pair;

use rand::Rng;
use serde::{Deserialize, Serialize};

pub use grr::Grr;
pub use oue::Oue;
pub use pair::GrrPair;

use crate::Epsilon;
use crate::wire::{OueBits, Payload};

/// Errors of mechanism construction, randomization and estimation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MechanismError {
    /// A domain needs at least two values.
    #[error("domain size {0} is below 2")]
    DomainTooSmall(usize),
    /// The product domain overflows `usize`.
    #[error("product domain overflows")]
    DomainOverflow,
    /// `grr_pair` needs exactly two attributes.
    #[error("grr_pair needs a factor of exactly 2 attributes, got {0}")]
    PairNeedsTwo(usize),
    /// A value outside `0..k`.
    #[error("value {value} outside the domain of size {k}")]
    ValueOutOfDomain {
        /// The value.
        value: usize,
        /// The domain size.
        k: usize,
    },
    /// The payload's kind differs from the mechanism's.
    #[error("payload is {found}, mechanism is {expected}")]
    WrongPayloadKind {
        /// Mechanism kind.
        expected: MechanismKind,
        /// Payload kind.
        found: MechanismKind,
    },
    /// An OUE bitset of the wrong length or with unused bits set.
    #[error("OUE report must be {expected} bytes with unused bits 0: {detail}")]
    MalformedBits {
        /// Required byte length.
        expected: usize,
        /// What is wrong.
        detail: String,
    },
    /// Sufficient statistics of the wrong shape or inconsistent with n.
    #[error("sufficient statistics do not fit the mechanism: {0}")]
    BadStatistics(String),
    /// No reports: nothing to estimate.
    #[error("no reports to estimate from")]
    NoReports,
    /// A composed ε (the sum of a pair's two) is not a valid ε.
    #[error(transparent)]
    Epsilon(#[from] crate::EpsilonError),
}

/// The kind of a mechanism, as named on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum MechanismKind {
    /// GRR over the factor's product domain.
    Grr,
    /// OUE over the factor's product domain.
    Oue,
    /// Two GRRs at ε/2, one per attribute of a pair (SamPrivSyn).
    GrrPair,
}

impl std::fmt::Display for MechanismKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MechanismKind::Grr => "grr",
            MechanismKind::Oue => "oue",
            MechanismKind::GrrPair => "grr_pair",
        })
    }
}

impl MechanismKind {
    /// The lower-variance single-report oracle for domain size `k` at `epsilon`: GRR when
    /// `k < 3e^ε + 2`, else OUE (Wang et al., USENIX Security 2017, §5, comparing the
    /// small-frequency variances `(e^ε + k − 2)/(e^ε − 1)²` and `4e^ε/(e^ε − 1)²`).
    pub fn choose(epsilon: Epsilon, k: usize) -> Self {
        if (k as f64) < 3.0 * epsilon.exp() + 2.0 {
            MechanismKind::Grr
        } else {
            MechanismKind::Oue
        }
    }

    /// Small-frequency approximation of `n·Var[f̂]` per report (for planning only), `dims`
    /// the factor's domain sizes: GRR `(e^ε + k − 2)/(e^ε − 1)²` with `k = Π dims`, OUE
    /// `4e^ε/(e^ε − 1)²` (Wang et al., USENIX Security 2017, §4.1 and §4.3), pair
    /// `Π_i (v_i + 1) − 1` with `v_i` the GRR value at ε/2 over `dims[i]`: an upper bound of
    /// the Kronecker estimator's variance, each half's second moment being `v_i + f_i ≤
    /// v_i + 1` (SamPrivSyn eqs. 6–7).
    pub fn approx_variance(self, epsilon: Epsilon, dims: &[usize]) -> f64 {
        let k: f64 = dims.iter().map(|&d| d as f64).product();
        let grr = |e: f64, k: f64| (e + k - 2.0) / (e - 1.0).powi(2);
        match self {
            MechanismKind::Grr => grr(epsilon.exp(), k),
            MechanismKind::Oue => {
                let e = epsilon.exp();
                4.0 * e / (e - 1.0).powi(2)
            }
            MechanismKind::GrrPair => {
                let e = epsilon.half().exp();
                dims.iter()
                    .map(|&d| grr(e, d as f64) + 1.0)
                    .product::<f64>()
                    - 1.0
            }
        }
    }
}

/// A constructed mechanism for one factor: which oracle, at which ε, over which dims.
#[derive(Debug, Clone, PartialEq)]
pub struct Mechanism {
    dims: Vec<usize>,
    oracle: Oracle,
}

/// The frequency oracle inside a [`Mechanism`].
#[derive(Debug, Clone, PartialEq)]
pub enum Oracle {
    /// GRR over the product domain.
    Grr(Grr),
    /// OUE over the product domain.
    Oue(Oue),
    /// Two GRRs at ε/2 over a pair.
    GrrPair(GrrPair),
}

impl Mechanism {
    /// Builds the mechanism `kind` at `epsilon` for a factor with domain sizes `dims`
    /// (`grr`/`oue` over the product `Π dims`; `grr_pair` needs two dims).
    /// Errors: [`MechanismError`] for a too small or overflowing domain, or a pair of ≠ 2.
    pub fn new(
        kind: MechanismKind,
        epsilon: Epsilon,
        dims: &[usize],
    ) -> Result<Self, MechanismError> {
        let cells = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or(MechanismError::DomainOverflow)?;
        if dims.iter().any(|&d| d < 2) || dims.is_empty() {
            return Err(MechanismError::DomainTooSmall(
                dims.iter().copied().min().unwrap_or(0),
            ));
        }
        let oracle = match kind {
            MechanismKind::Grr => Oracle::Grr(Grr::new(epsilon, cells)?),
            MechanismKind::Oue => Oracle::Oue(Oue::new(epsilon, cells)?),
            MechanismKind::GrrPair => {
                if dims.len() != 2 {
                    return Err(MechanismError::PairNeedsTwo(dims.len()));
                }
                Oracle::GrrPair(GrrPair::new(epsilon, dims[0], dims[1])?)
            }
        };
        Ok(Self {
            dims: dims.to_vec(),
            oracle,
        })
    }

    /// The pair report of two GRRs at their own ε over `dims = [k₁, k₂]` (kind `grr_pair`,
    /// ε = `first + second`): a vertical collection's cross-party or intra-party pair
    /// ([`GrrPair::with_epsilons`]). Errors: as [`Mechanism::new`].
    pub fn grr_pair_with_epsilons(
        first: Epsilon,
        second: Epsilon,
        dims: &[usize],
    ) -> Result<Self, MechanismError> {
        let &[k1, k2] = dims else {
            return Err(MechanismError::PairNeedsTwo(dims.len()));
        };
        Ok(Self {
            dims: dims.to_vec(),
            oracle: Oracle::GrrPair(GrrPair::with_epsilons(first, second, k1, k2)?),
        })
    }

    /// The frequency oracle.
    pub fn oracle(&self) -> &Oracle {
        &self.oracle
    }

    /// Domain size of each factor attribute.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Its kind.
    pub fn kind(&self) -> MechanismKind {
        match &self.oracle {
            Oracle::Grr(_) => MechanismKind::Grr,
            Oracle::Oue(_) => MechanismKind::Oue,
            Oracle::GrrPair(_) => MechanismKind::GrrPair,
        }
    }

    /// ε of one report.
    pub fn epsilon(&self) -> Epsilon {
        match &self.oracle {
            Oracle::Grr(m) => m.epsilon(),
            Oracle::Oue(m) => m.epsilon(),
            Oracle::GrrPair(m) => m.epsilon(),
        }
    }

    /// Cells of the estimated joint (= length of the sufficient-statistics counts).
    pub fn cells(&self) -> usize {
        match &self.oracle {
            Oracle::Grr(m) => m.domain_size(),
            Oracle::Oue(m) => m.domain_size(),
            Oracle::GrrPair(m) => m.cells(),
        }
    }

    /// Randomizes a factor value given as one code per factor attribute (factor order).
    /// Errors: [`MechanismError::ValueOutOfDomain`] if the codes do not fit.
    pub fn randomize<R: Rng + ?Sized>(
        &self,
        codes: &[u32],
        rng: &mut R,
    ) -> Result<Payload, MechanismError> {
        match &self.oracle {
            Oracle::Grr(m) => {
                let v = self.ravel(codes)?;
                Ok(Payload::Grr(m.randomize(v, rng)? as u64))
            }
            Oracle::Oue(m) => {
                let v = self.ravel(codes)?;
                Ok(Payload::Oue(OueBits(m.randomize(v, rng)?)))
            }
            Oracle::GrrPair(m) => {
                let [a, b] = codes else {
                    return Err(MechanismError::PairNeedsTwo(codes.len()));
                };
                // `ravel` is skipped: the halves are randomized separately.
                let (x, y) = m.randomize(*a as usize, *b as usize, rng)?;
                Ok(Payload::GrrPair([x as u64, y as u64]))
            }
        }
    }

    /// Row-major index of `codes` in the product domain `dims`.
    fn ravel(&self, codes: &[u32]) -> Result<usize, MechanismError> {
        if codes.len() != self.dims.len() {
            return Err(MechanismError::ValueOutOfDomain {
                value: codes.len(),
                k: self.dims.len(),
            });
        }
        let mut index = 0usize;
        for (&c, &k) in codes.iter().zip(&self.dims) {
            if c as usize >= k {
                return Err(MechanismError::ValueOutOfDomain {
                    value: c as usize,
                    k,
                });
            }
            // No overflow: `new` checked that Π dims fits usize.
            index = index * k + c as usize;
        }
        Ok(index)
    }

    /// Checks that `payload` is a well-formed report of this mechanism (kind; GRR index in
    /// range; OUE bitset of exactly `⌈k/8⌉` bytes with unused bits 0).
    pub fn validate(&self, payload: &Payload) -> Result<(), MechanismError> {
        match (&self.oracle, payload) {
            (Oracle::Grr(m), Payload::Grr(v)) => {
                if *v as u128 >= m.domain_size() as u128 {
                    return Err(MechanismError::ValueOutOfDomain {
                        value: usize::try_from(*v).unwrap_or(usize::MAX),
                        k: m.domain_size(),
                    });
                }
                Ok(())
            }
            (Oracle::Oue(m), Payload::Oue(bits)) => {
                let expected = m.report_bytes();
                if bits.0.len() != expected {
                    return Err(MechanismError::MalformedBits {
                        expected,
                        detail: format!("got {} bytes", bits.0.len()),
                    });
                }
                let used = m.domain_size() % 8;
                if used != 0 && bits.0[expected - 1] >> used != 0 {
                    return Err(MechanismError::MalformedBits {
                        expected,
                        detail: "bits beyond the domain are set".into(),
                    });
                }
                Ok(())
            }
            (Oracle::GrrPair(m), Payload::GrrPair([a, b])) => {
                for (v, g) in [(a, m.first()), (b, m.second())] {
                    if *v as u128 >= g.domain_size() as u128 {
                        return Err(MechanismError::ValueOutOfDomain {
                            value: usize::try_from(*v).unwrap_or(usize::MAX),
                            k: g.domain_size(),
                        });
                    }
                }
                Ok(())
            }
            (_, p) => Err(MechanismError::WrongPayloadKind {
                expected: self.kind(),
                found: p.kind(),
            }),
        }
    }

    /// Validates `payload` and adds it to `stats` (n += 1; counts of its outputs += 1).
    /// Errors as [`Mechanism::validate`]; `stats` is unchanged on error.
    pub fn accumulate(
        &self,
        payload: &Payload,
        stats: &mut SufficientStatistics,
    ) -> Result<(), MechanismError> {
        self.validate(payload)?;
        if stats.counts.len() != self.cells() {
            return Err(MechanismError::BadStatistics(format!(
                "{} counts for {} cells",
                stats.counts.len(),
                self.cells()
            )));
        }
        match (&self.oracle, payload) {
            (Oracle::Grr(_), Payload::Grr(v)) => stats.counts[*v as usize] += 1,
            (Oracle::Oue(_), Payload::Oue(bits)) => {
                for (byte_index, &byte) in bits.0.iter().enumerate() {
                    let mut b = byte;
                    while b != 0 {
                        let bit = b.trailing_zeros() as usize;
                        stats.counts[byte_index * 8 + bit] += 1;
                        b &= b - 1;
                    }
                }
            }
            (Oracle::GrrPair(m), Payload::GrrPair([a, b])) => {
                stats.counts[*a as usize * m.second().domain_size() + *b as usize] += 1
            }
            _ => unreachable!("validate checked the kinds match"),
        }
        stats.n += 1;
        Ok(())
    }

    /// Unbiased frequency estimates (length [`Mechanism::cells`]) with standard errors.
    pub fn estimate(
        &self,
        stats: &SufficientStatistics,
    ) -> Result<FrequencyEstimate, MechanismError> {
        match &self.oracle {
            Oracle::Grr(m) => m.estimate(stats.n, &stats.counts),
            Oracle::Oue(m) => m.estimate(stats.n, &stats.counts),
            Oracle::GrrPair(m) => m.estimate(stats.n, &stats.counts),
        }
    }

    /// Exact variance of each cell's frequency estimate for true joint `f` and `n` reports.
    pub fn frequency_variances(&self, f: &[f64], n: u64) -> Vec<f64> {
        match &self.oracle {
            Oracle::Grr(m) => f.iter().map(|&x| m.frequency_variance(x, n)).collect(),
            Oracle::Oue(m) => f.iter().map(|&x| m.frequency_variance(x, n)).collect(),
            Oracle::GrrPair(m) => m.frequency_variances(f, n),
        }
    }
}

/// Sufficient statistics of one mechanism's reports: the number of reports `n` and, per
/// output cell, how many reports hit it (GRR: reported value; OUE: bit set; pair: the
/// reported pair, row-major). Additive: sums of statistics are statistics of the union.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SufficientStatistics {
    /// Number of reports.
    pub n: u64,
    /// Counts per output cell, length = [`Mechanism::cells`].
    pub counts: Vec<u64>,
}

impl SufficientStatistics {
    /// Empty statistics shaped for `mechanism`.
    pub fn new(mechanism: &Mechanism) -> Self {
        Self {
            n: 0,
            counts: vec![0; mechanism.cells()],
        }
    }

    /// Adds `other` (same shape) into `self`. Errors: different lengths.
    pub fn merge(&mut self, other: &SufficientStatistics) -> Result<(), MechanismError> {
        if self.counts.len() != other.counts.len() {
            return Err(MechanismError::BadStatistics(
                "merging tables of different shapes".into(),
            ));
        }
        self.n += other.n;
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        Ok(())
    }
}

/// Unbiased frequency estimates of a factor's cells with standard errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrequencyEstimate {
    /// Reports the estimate comes from.
    pub n: u64,
    /// Unbiased estimates, one per cell; may be negative and need not sum to 1.
    pub frequencies: Vec<f64>,
    /// Standard error of each estimate (plug-in of the exact variance).
    pub std_errors: Vec<f64>,
}

pub(crate) fn check_stats(
    n: u64,
    counts: &[u64],
    k: usize,
    sums_to_n: bool,
) -> Result<(), MechanismError> {
    if counts.len() != k {
        return Err(MechanismError::BadStatistics(format!(
            "{} counts for {k} cells",
            counts.len()
        )));
    }
    if n == 0 {
        return Err(MechanismError::NoReports);
    }
    if counts.iter().any(|&c| c > n) {
        return Err(MechanismError::BadStatistics("a count exceeds n".into()));
    }
    if sums_to_n && counts.iter().map(|&c| c as u128).sum::<u128>() != n as u128 {
        return Err(MechanismError::BadStatistics(
            "counts do not sum to n".into(),
        ));
    }
    Ok(())
}

/// Norm-Sub: the Euclidean projection of `estimates` onto the probability simplex, i.e. add
/// one δ to every entry and clip at 0 so that the result sums to 1 (Wang et al., "Locally
/// Differentially Private Frequency Estimation with Consistency", NDSS 2020).
///
/// Output: frequencies, same length, every entry ≥ 0, sum 1. Non-finite inputs count as 0;
/// an empty input gives an empty output.
pub fn norm_sub(estimates: &[f64]) -> Vec<f64> {
    if estimates.is_empty() {
        return Vec::new();
    }
    let x: Vec<f64> = estimates
        .iter()
        .map(|&v| if v.is_finite() { v } else { 0.0 })
        .collect();
    let mut sorted = x.clone();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    // Largest j with sorted[j] − (Σ_{i≤j} sorted[i] − 1)/(j+1) > 0 gives δ = −(Σ − 1)/(j+1).
    let mut cumulative = 0.0;
    let mut delta = 0.0;
    for (j, &v) in sorted.iter().enumerate() {
        cumulative += v;
        let candidate = (1.0 - cumulative) / (j + 1) as f64;
        if v + candidate > 0.0 {
            delta = candidate;
        }
    }
    let mut out: Vec<f64> = x.iter().map(|&v| (v + delta).max(0.0)).collect();
    let s: f64 = out.iter().sum();
    if s > 0.0 {
        out.iter_mut().for_each(|v| *v /= s);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
