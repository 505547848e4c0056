//! The SamPrivSyn pair report: two independent GRRs at ε/2 (Theorem 1 of SamPrivSyn,
//! Sci China Inf Sci 2023), estimated by inverting the Kronecker-product perturbation
//! matrix `Q₁ ⊗ Q₂` (eqs. 6–7): `(Q₁ ⊗ Q₂)⁻¹ = Q₁⁻¹ ⊗ Q₂⁻¹`.

use rand::Rng;

use super::grr::Grr;
use super::{FrequencyEstimate, MechanismError, check_stats};
use crate::Epsilon;

/// Two GRRs at ε/2 over domains `k₁`, `k₂` (each ≥ 2), reporting `(a', b')`.
///
/// Guarantee: ε-LDP for the pair (sequential composition of two ε/2-LDP reports); the
/// worst-case ratio `e^{ε/2} · e^{ε/2} = e^ε` is reached when both values change.
#[derive(Debug, Clone, PartialEq)]
pub struct GrrPair {
    epsilon: Epsilon,
    first: Grr,
    second: Grr,
}

impl GrrPair {
    /// Pair report at total `epsilon` over domains `k1 × k2`.
    /// Errors: [`MechanismError::DomainTooSmall`] if either is < 2.
    pub fn new(epsilon: Epsilon, k1: usize, k2: usize) -> Result<Self, MechanismError> {
        Ok(Self {
            epsilon,
            first: Grr::new(epsilon.half(), k1)?,
            second: Grr::new(epsilon.half(), k2)?,
        })
    }

    /// Two independent GRRs at their own ε, `first` over `k1` values and `second` over `k2`
    /// (total `first + second` by sequential composition): the cross-party pair of a
    /// vertical collection, each party's attribute randomized at its own ε (VertiMRF §4.2,
    /// eq. 6; the estimator is the same Kronecker inverse).
    /// Errors: [`MechanismError::DomainTooSmall`] if either domain is < 2;
    /// [`MechanismError::Epsilon`] if the sum is not a valid ε.
    pub fn with_epsilons(
        first: Epsilon,
        second: Epsilon,
        k1: usize,
        k2: usize,
    ) -> Result<Self, MechanismError> {
        Ok(Self {
            epsilon: Epsilon::new(first.get() + second.get())?,
            first: Grr::new(first, k1)?,
            second: Grr::new(second, k2)?,
        })
    }

    /// Total ε of one pair report.
    pub fn epsilon(&self) -> Epsilon {
        self.epsilon
    }
    /// The GRR applied to the first value (at ε/2).
    pub fn first(&self) -> &Grr {
        &self.first
    }
    /// The GRR applied to the second value (at ε/2).
    pub fn second(&self) -> &Grr {
        &self.second
    }
    /// Cells of the pair table: `k₁·k₂`.
    pub fn cells(&self) -> usize {
        self.first.domain_size() * self.second.domain_size()
    }

    /// Randomizes `(a, b)` with independent randomness for each half.
    pub fn randomize<R: Rng + ?Sized>(
        &self,
        a: usize,
        b: usize,
        rng: &mut R,
    ) -> Result<(usize, usize), MechanismError> {
        Ok((
            self.first.randomize(a, rng)?,
            self.second.randomize(b, rng)?,
        ))
    }

    /// Unbiased estimate of the `k₁ × k₂` joint (row-major, length `k₁k₂`) from `n` reports
    /// with `counts[a'·k₂ + b']` = reports equal to `(a', b')`: applies `Q₂⁻¹` along rows and
    /// `Q₁⁻¹` along columns (eq. 7 of SamPrivSyn with the Kronecker inverse).
    ///
    /// Standard errors from the exact variance of this linear estimator,
    /// `Var[f̂_v] = (Σ_o M[v,o]² π_o − f_v)/n` with `M = Q⁻¹` and `π` the output
    /// distribution (the n people's true values fixed, as for GRR and OUE: each report
    /// contributes `Σ_o M[v,o]² Q(o|x) − δ_{vx}`), with the observed `π̂ = C/n` and `f̂`
    /// (clipped to [0, 1]) plugged in (never negative).
    /// Errors: wrong length, no reports, counts not summing to n.
    pub fn estimate(&self, n: u64, counts: &[u64]) -> Result<FrequencyEstimate, MechanismError> {
        check_stats(n, counts, self.cells(), true)?;
        let (k1, k2) = (self.first.domain_size(), self.second.domain_size());
        let nf = n as f64;
        let pi: Vec<f64> = counts.iter().map(|&c| c as f64 / nf).collect();
        let frequencies = self.invert(&pi);
        let row: Vec<f64> = (0..k1)
            .map(|a| pi[a * k2..(a + 1) * k2].iter().sum())
            .collect();
        let col: Vec<f64> = (0..k2)
            .map(|b| (0..k1).map(|a| pi[a * k2 + b]).sum())
            .collect();
        let (a_on, a_off) = squared_inverse_entries(&self.first);
        let (b_on, b_off) = squared_inverse_entries(&self.second);
        let mut std_errors = Vec::with_capacity(k1 * k2);
        for a in 0..k1 {
            for b in 0..k2 {
                // Σ_{x,y} M₁[a,x]² M₂[b,y]² π(x,y), split by whether x = a and y = b.
                let second_moment = a_off * b_off
                    + (a_on - a_off) * b_off * row[a]
                    + a_off * (b_on - b_off) * col[b]
                    + (a_on - a_off) * (b_on - b_off) * pi[a * k2 + b];
                let f = frequencies[a * k2 + b];
                std_errors.push(((second_moment - f.clamp(0.0, 1.0)).max(0.0) / nf).sqrt());
            }
        }
        Ok(FrequencyEstimate {
            n,
            frequencies,
            std_errors,
        })
    }

    /// Applies `Q₁⁻¹ ⊗ Q₂⁻¹` to an output distribution `pi` (row-major `k₁ × k₂`).
    fn invert(&self, pi: &[f64]) -> Vec<f64> {
        let (k1, k2) = (self.first.domain_size(), self.second.domain_size());
        let (p1, q1, p2, q2) = (
            self.first.p(),
            self.first.q(),
            self.second.p(),
            self.second.q(),
        );
        // GRR: Q = (p−q)I + q·11ᵀ, so Q⁻¹x = (x − q·Σx)/(p − q).
        let mut t = vec![0.0; k1 * k2];
        for a in 0..k1 {
            let r = &pi[a * k2..(a + 1) * k2];
            let s: f64 = r.iter().sum();
            for b in 0..k2 {
                t[a * k2 + b] = (r[b] - q2 * s) / (p2 - q2);
            }
        }
        let mut out = vec![0.0; k1 * k2];
        for b in 0..k2 {
            let s: f64 = (0..k1).map(|a| t[a * k2 + b]).sum();
            for a in 0..k1 {
                out[a * k2 + b] = (t[a * k2 + b] - q1 * s) / (p1 - q1);
            }
        }
        out
    }

    /// Exact variance of every cell estimate when the true joint is `f` (row-major, sums
    /// to 1), for `n` reports: `(Σ_o M[v,o]² π_o − f_v)/n` with `π = (Q₁ ⊗ Q₂) f`
    /// (the people's true values fixed; randomness from the randomizer only).
    pub fn frequency_variances(&self, f: &[f64], n: u64) -> Vec<f64> {
        let (k1, k2) = (self.first.domain_size(), self.second.domain_size());
        assert_eq!(f.len(), k1 * k2, "joint of k1*k2 cells");
        // π(x,y) = Σ_{a,b} Q₁[x,a] Q₂[y,b] f(a,b); GRR columns: p on the diagonal, q elsewhere.
        let mut t = vec![0.0; k1 * k2];
        for a in 0..k1 {
            let s: f64 = f[a * k2..(a + 1) * k2].iter().sum();
            for y in 0..k2 {
                let fy = f[a * k2 + y];
                t[a * k2 + y] = self.second.q() * (s - fy) + self.second.p() * fy;
            }
        }
        let mut pi = vec![0.0; k1 * k2];
        for y in 0..k2 {
            let s: f64 = (0..k1).map(|a| t[a * k2 + y]).sum();
            for x in 0..k1 {
                let tx = t[x * k2 + y];
                pi[x * k2 + y] = self.first.q() * (s - tx) + self.first.p() * tx;
            }
        }
        let row: Vec<f64> = (0..k1)
            .map(|a| pi[a * k2..(a + 1) * k2].iter().sum())
            .collect();
        let col: Vec<f64> = (0..k2)
            .map(|b| (0..k1).map(|a| pi[a * k2 + b]).sum())
            .collect();
        let (a_on, a_off) = squared_inverse_entries(&self.first);
        let (b_on, b_off) = squared_inverse_entries(&self.second);
        (0..k1 * k2)
            .map(|v| {
                let (a, b) = (v / k2, v % k2);
                let m2 = a_off * b_off
                    + (a_on - a_off) * b_off * row[a]
                    + a_off * (b_on - b_off) * col[b]
                    + (a_on - a_off) * (b_on - b_off) * pi[v];
                (m2 - f[v]) / n as f64
            })
            .collect()
    }
}

/// Squares of the entries of a GRR's `Q⁻¹`: `((1−q)/(p−q))²` on the diagonal,
/// `(q/(p−q))²` off it.
fn squared_inverse_entries(g: &Grr) -> (f64, f64) {
    let d = g.p() - g.q();
    (((1.0 - g.q()) / d).powi(2), (g.q() / d).powi(2))
}
