//! Optimized unary encoding (OUE).
//!
//! Wang, Blocki, Li, Jha, USENIX Security 2017, §4.3: one-hot encode, keep the true bit as 1
//! with `p = 1/2`, set every other bit with `q = 1/(e^ε + 1)`. PrivIncr's VOUE is OUE over
//! the product domain of a factor.

use rand::Rng;

use super::grr::{binary_channel_variance, linear_estimate};
use super::{FrequencyEstimate, MechanismError, check_stats};
use crate::Epsilon;

/// Below this `q`, the sampler jumps between set bits with geometric gaps instead of drawing
/// one Bernoulli per bit: a gap costs a logarithm (~20 ns), a bit a 64-bit draw (~1–2 ns).
const GEOMETRIC_BELOW_Q: f64 = 1.0 / 16.0;

/// OUE over `k ≥ 2` values. The report is a bitset of `⌈k/8⌉` bytes, bit i in byte i/8,
/// least significant bit first, unused bits 0 (docs/design.md "Wire formats").
///
/// Guarantee: ε-LDP for one report (replacement neighbours): two inputs differ in the
/// probability of two bits only, and the worst ratio is
/// `(p/q)·((1−q)/(1−p)) = e^ε` with `p = 1/2`, `q = 1/(e^ε+1)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Oue {
    epsilon: Epsilon,
    k: usize,
    q: f64,
    /// A non-true bit is 1 iff a uniform u64 is below this: probability `q_threshold / 2^64`.
    q_threshold: u64,
}

/// Probability that the true bit is 1. The sampler takes it from one fair random bit.
const P: f64 = 0.5;

/// 2^64, the scale of the u64 thresholds of the Bernoulli path.
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

impl Oue {
    /// OUE at `epsilon` over `k` values. Errors: [`MechanismError::DomainTooSmall`] if `k < 2`.
    pub fn new(epsilon: Epsilon, k: usize) -> Result<Self, MechanismError> {
        if k < 2 {
            return Err(MechanismError::DomainTooSmall(k));
        }
        // q = 1 / (e^ε + 1) makes (p/q)·((1−q)/(1−p)) = e^ε at p = 1/2.
        let q = 1.0 / (epsilon.exp() + 1.0);
        Ok(Self {
            epsilon,
            k,
            q,
            // Raised by 8 ULPs before rounding up, so the realized q' = threshold / 2^64 is
            // above 1/(e^ε + 1) despite the rounding of e^ε and of the division: the realized
            // ratio (1 − q')/q' stays ≤ e^ε. q < 1/2, so q'·2^64 < 2^63 fits.
            q_threshold: (q * (1.0 + 8.0 * f64::EPSILON) * TWO_POW_64).ceil() as u64,
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
    /// Probability that the true bit is 1 (1/2).
    pub fn p(&self) -> f64 {
        P
    }
    /// Probability that any other bit is 1.
    pub fn q(&self) -> f64 {
        self.q
    }
    /// Bytes of a report: `⌈k/8⌉`.
    pub fn report_bytes(&self) -> usize {
        self.k.div_ceil(8)
    }

    /// The exact per-bit probabilities the sampler uses: `(true bit, any other bit)`.
    /// For the privacy audit; the Bernoulli path draws `u64 < q_threshold`.
    #[cfg(test)] // only the audit reads it; a plain build would warn (dead code)
    pub(crate) fn sampler_bit_probabilities(&self) -> (f64, f64) {
        (P, self.q_threshold as f64 / TWO_POW_64)
    }

    /// Whether the sampler uses geometric skipping (else one Bernoulli per bit).
    pub(crate) fn uses_geometric_skipping(&self) -> bool {
        self.q < GEOMETRIC_BELOW_Q
    }

    /// Randomizes `value ∈ 0..k` into a bitset of [`Oue::report_bytes`] bytes.
    /// Errors: [`MechanismError::ValueOutOfDomain`].
    pub fn randomize<R: Rng + ?Sized>(
        &self,
        value: usize,
        rng: &mut R,
    ) -> Result<Vec<u8>, MechanismError> {
        if value >= self.k {
            return Err(MechanismError::ValueOutOfDomain { value, k: self.k });
        }
        let mut bits = vec![0u8; self.report_bytes()];
        if self.uses_geometric_skipping() {
            // Gaps between set bits are Geometric(q) (failures before a success), drawn by
            // inversion: ⌊ln U / ln(1−q)⌋ with U ∈ (0, 1].
            let ln_1mq = (-self.q).ln_1p();
            let mut i = 0usize;
            loop {
                let u = 1.0 - rng.random::<f64>();
                let gap = (u.ln() / ln_1mq).floor();
                if gap >= (self.k - i) as f64 {
                    break;
                }
                i += gap as usize;
                bits[i / 8] |= 1 << (i % 8);
                i += 1;
                if i >= self.k {
                    break;
                }
            }
        } else {
            for i in 0..self.k {
                if rng.random::<u64>() < self.q_threshold {
                    bits[i / 8] |= 1 << (i % 8);
                }
            }
        }
        // The true bit is overwritten with a fair coin (p = 1/2), whatever was drawn above.
        let mask = 1u8 << (value % 8);
        if rng.random::<bool>() {
            bits[value / 8] |= mask;
        } else {
            bits[value / 8] &= !mask;
        }
        Ok(bits)
    }

    /// Unbiased frequency estimates from `n` reports with `bit_counts[v]` = reports whose
    /// bit v is set (length k): `f̂(v) = (C(v)/n − q)/(1/2 − q)`; standard errors from the
    /// exact variance (see [`super::grr::Grr::estimate`]). Errors: wrong length, no reports,
    /// counts above n.
    pub fn estimate(
        &self,
        n: u64,
        bit_counts: &[u64],
    ) -> Result<FrequencyEstimate, MechanismError> {
        check_stats(n, bit_counts, self.k, false)?;
        Ok(linear_estimate(n, bit_counts, P, self.q))
    }

    /// Exact variance of `f̂(v)` when the true frequency is `f`, for `n` reports.
    pub fn frequency_variance(&self, f: f64, n: u64) -> f64 {
        binary_channel_variance(f, n, P, self.q)
    }
}
