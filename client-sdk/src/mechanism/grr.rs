//! Generalized randomized response (GRR, a.k.a. k-ary RR, direct encoding).
//!
//! Wang, Blocki, Li, Jha, "Locally Differentially Private Protocols for Frequency
//! Estimation", USENIX Security 2017, §4.1; eq. 3 of SamPrivSyn (Sci China Inf Sci 2023).

use rand::Rng;

use super::{FrequencyEstimate, MechanismError, check_stats};
use crate::Epsilon;

/// GRR over a domain of `k ≥ 2` values: report the true value with probability
/// `p = e^ε / (e^ε + k − 1)`, else one of the other `k − 1` values uniformly
/// (`q = 1 / (e^ε + k − 1)` each).
///
/// Guarantee: ε-LDP for one report (replacement neighbours), since `p / q = e^ε`.
#[derive(Debug, Clone, PartialEq)]
pub struct Grr {
    epsilon: Epsilon,
    k: usize,
    p: f64,
    q: f64,
}

impl Grr {
    /// GRR at `epsilon` over `k` values. Errors: [`MechanismError::DomainTooSmall`] if `k < 2`.
    pub fn new(epsilon: Epsilon, k: usize) -> Result<Self, MechanismError> {
        if k < 2 {
            return Err(MechanismError::DomainTooSmall(k));
        }
        let e = epsilon.exp();
        // p = e^ε / (e^ε + k − 1), q = 1 / (e^ε + k − 1): p/q = e^ε.
        let denom = e + (k as f64 - 1.0);
        Ok(Self {
            epsilon,
            k,
            p: e / denom,
            q: 1.0 / denom,
        })
    }

    /// ε of one report.
    pub fn epsilon(&self) -> Epsilon {
        self.epsilon
    }
    /// Domain size k.
    pub fn domain_size(&self) -> usize {
        self.k
    }
    /// Probability of reporting the true value.
    pub fn p(&self) -> f64 {
        self.p
    }
    /// Probability of reporting one given other value.
    pub fn q(&self) -> f64 {
        self.q
    }

    /// Randomizes `value ∈ 0..k`. Errors: [`MechanismError::ValueOutOfDomain`].
    pub fn randomize<R: Rng + ?Sized>(
        &self,
        value: usize,
        rng: &mut R,
    ) -> Result<usize, MechanismError> {
        if value >= self.k {
            return Err(MechanismError::ValueOutOfDomain { value, k: self.k });
        }
        if rng.random_bool(self.p) {
            Ok(value)
        } else {
            Ok(Self::other_value(rng.random_range(0..self.k - 1), value))
        }
    }

    /// Maps a uniform draw `r ∈ 0..k−1` to one of the `k − 1` values other than `value`.
    /// The sampler and the privacy audit share it.
    pub(crate) fn other_value(r: usize, value: usize) -> usize {
        if r >= value { r + 1 } else { r }
    }

    /// Unbiased frequency estimates from `n` reports with `counts[v]` = reports equal to v
    /// (length k): `f̂(v) = (C(v)/n − q) / (p − q)`; standard errors from the exact variance
    /// `Var[f̂(v)] = [f p(1−p) + (1−f) q(1−q)] / (n (p−q)²)` with `f̂` (clipped to [0, 1])
    /// plugged in for f. Errors: wrong length, no reports, or counts above n.
    pub fn estimate(&self, n: u64, counts: &[u64]) -> Result<FrequencyEstimate, MechanismError> {
        check_stats(n, counts, self.k, true)?;
        Ok(linear_estimate(n, counts, self.p, self.q))
    }

    /// Exact variance of `f̂(v)` when the true frequency is `f`, for `n` reports.
    pub fn frequency_variance(&self, f: f64, n: u64) -> f64 {
        binary_channel_variance(f, n, self.p, self.q)
    }
}

/// `[f p(1−p) + (1−f) q(1−q)] / (n (p−q)²)`: the exact variance of the estimator
/// `(C/n − q)/(p − q)` over the randomizer's coins for a fixed population in which a share f
/// holds the value: `C` is a sum of `n f` Bernoulli(p) and `n (1−f)` Bernoulli(q) outputs
/// (GRR and OUE alike).
pub(crate) fn binary_channel_variance(f: f64, n: u64, p: f64, q: f64) -> f64 {
    (f * p * (1.0 - p) + (1.0 - f) * q * (1.0 - q)) / (n as f64 * (p - q).powi(2))
}

/// The shared GRR/OUE estimator `(C/n − q)/(p − q)` with plug-in standard errors.
pub(crate) fn linear_estimate(n: u64, counts: &[u64], p: f64, q: f64) -> FrequencyEstimate {
    let nf = n as f64;
    let frequencies: Vec<f64> = counts
        .iter()
        .map(|&c| (c as f64 / nf - q) / (p - q))
        .collect();
    let std_errors = frequencies
        .iter()
        .map(|&f| binary_channel_variance(f.clamp(0.0, 1.0), n, p, q).sqrt())
        .collect();
    FrequencyEstimate {
        n,
        frequencies,
        std_errors,
    }
}
