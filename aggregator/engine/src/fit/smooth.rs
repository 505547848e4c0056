//! Smoothing of a numeric attribute's 1-way over its ordered working bins.
//!
//! An attribute with a grid (`bins: "auto"`) is measured over working bins that follow each
//! other in value order, and its real density is nearly always smooth across neighbouring
//! bins, while LDP noise is independent from bin to bin: at ε = 1 the noise of a bin's mass
//! is of the order of the mass itself, and summed along the bins it is what the
//! Kolmogorov–Smirnov distance of the synthetic column measures. Square Wave + EMS (Li et
//! al., SIGMOD 2020, §4–5) gets its advantage on smooth columns from this: its EM step
//! smooths neighbours. Here the smoothing is a post-processing of the estimate, and how much
//! of it is chosen from the data (no constant tuned on a dataset):
//!
//! - the smoother is penalized weighted least squares over the bin masses `y` with noise
//!   variances `σ²`, penalizing the squared second divided differences of the density
//!   `m_b / width_b` at the bins' centres (a discrete smoothing spline):
//!   `m̂ = S_λ y`, `S_λ = (W + λ DᵀD)⁻¹ W`, `W = diag(1/σ²)`; a density that is linear in
//!   value is left unchanged;
//! - `λ` minimizes Stein's unbiased risk estimate of the squared error,
//!   `SURE(λ) = ‖y − S_λ y‖² − Σσ² + 2 Σ_b σ_b² (S_λ)_bb` (Stein 1981; for a linear smoother
//!   the divergence is the trace), over a log grid that spans no smoothing to a straight
//!   line; `λ = 0` (no smoothing) is a candidate, so a column with spikes the bins resolve
//!   keeps them.
//!
//! [`smooth_numeric_one_ways`] applies it to a fitted model: each attribute's model 1-way
//! over its ordered bins is smoothed with the `λ` chosen on the measurements' unbiased
//! estimate, and the model is raked to all of them at once
//! ([`GraphicalModel::with_one_way_targets`]), which keeps every interaction of the model.
//! Point-mass bins and "missing" (past the grid) are left as fitted.

use linfa_linalg::cholesky::InverseC;
use ndarray::Array2;

use crate::domain::space::Space;
use crate::fit::pgm::GraphicalModel;
use crate::measure::tables::Measurements;

/// Steps per decade of the `λ` grid and its span in decades each side of the scale where
/// the penalty and the data weigh alike (`tr W / tr DᵀD`): from far below any visible
/// smoothing to far above a straight line.
const LAMBDA_STEPS_PER_DECADE: i32 = 4;
const LAMBDA_DECADES: i32 = 10;

/// Standard errors of its deleted residual past which a bin leaves the smoothing
/// ([`smooth_numeric_one_ways`]): 5% two-sided for one bin. Swept over 2, 3 and 4 on Adult's
/// and temporal-match2's numeric columns (`benchmarks/sweeps/numeric-smoothing.md`): 2 is
/// the one that keeps temporal-match2's spikes at 0 (45% of ARRIVES in its first bin) from
/// leaking into the next bin; Adult's smooth columns lose a little of the gain.
pub const SMOOTHING_RELEASE_Z: f64 = 2.0;

/// A linear smoother of ordered bin masses chosen by SURE (module docs).
#[derive(Debug, Clone)]
pub struct Smoother {
    /// The chosen penalty (0: no smoothing).
    pub lambda: f64,
    /// SURE of the chosen smoother (expected squared error of the smoothed masses; `Σσ²`
    /// without smoothing).
    pub risk: f64,
    /// `S_λ`, row-major `n × n`.
    matrix: Array2<f64>,
}

impl Smoother {
    /// The smoother of `n` ordered bins with centres `centres` and widths `widths` (any
    /// common unit, e.g. grid cells), noise variances `var`, chosen for the unbiased
    /// estimate `y`. Fewer than 3 bins, a non-finite input or a failed factorization gives
    /// no smoothing.
    pub fn choose(y: &[f64], var: &[f64], centres: &[f64], widths: &[f64]) -> Self {
        let n = y.len();
        let raw_risk: f64 = var.iter().sum();
        let none = Self {
            lambda: 0.0,
            risk: raw_risk,
            matrix: Array2::eye(n),
        };
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        if n < 3
            || var.len() != n
            || centres.len() != n
            || widths.len() != n
            || !(finite(y) && finite(var) && finite(centres) && finite(widths))
            || var.iter().any(|&v| v <= 0.0)
            || widths.iter().any(|&w| w <= 0.0)
            || centres.windows(2).any(|c| c[1] <= c[0])
        {
            return none;
        }
        let penalty = second_difference_penalty(centres, widths);
        let weight_trace: f64 = var.iter().map(|v| 1.0 / v).sum();
        let penalty_trace: f64 = penalty.diag().sum();
        if penalty_trace.is_nan() || penalty_trace <= 0.0 {
            return none;
        }
        let scale = weight_trace / penalty_trace;
        let mut best = none;
        for k in
            -LAMBDA_DECADES * LAMBDA_STEPS_PER_DECADE..=LAMBDA_DECADES * LAMBDA_STEPS_PER_DECADE
        {
            let lambda = scale * 10f64.powf(f64::from(k) / f64::from(LAMBDA_STEPS_PER_DECADE));
            let Some(matrix) = smoother_matrix(var, &penalty, lambda) else {
                continue;
            };
            let fitted = matrix.dot(&ndarray::ArrayView1::from(y));
            let residual: f64 = y.iter().zip(&fitted).map(|(a, b)| (a - b).powi(2)).sum();
            let divergence: f64 = (0..n).map(|i| matrix[[i, i]] * var[i]).sum();
            let risk = residual - raw_risk + 2.0 * divergence;
            if risk < best.risk {
                best = Self {
                    lambda,
                    risk,
                    matrix,
                };
            }
        }
        best
    }

    /// [`Smoother::choose`] made robust to what a smooth density cannot hold (a point mass no
    /// bin was cut for, a spike at an edge): a bin whose deleted residual (the miss of the
    /// smooth fit of the other bins, `r_b/(1 − S_bb)` for a linear smoother) exceeds
    /// `release_z` of its standard errors (`σ_b/√(1 − S_bb)`) leaves the sequence and the
    /// smoother is chosen again on the rest, until none does. `se`: standard errors of `y`.
    /// Returns the indices of the bins kept (ascending) and their smoother.
    pub fn robust(
        y: &[f64],
        se: &[f64],
        centres: &[f64],
        widths: &[f64],
        release_z: f64,
    ) -> (Vec<usize>, Self) {
        let mut kept: Vec<usize> = (0..y.len()).collect();
        loop {
            let pick = |v: &[f64]| kept.iter().map(|&i| v[i]).collect::<Vec<f64>>();
            let (yk, sek) = (pick(y), pick(se));
            let var: Vec<f64> = sek.iter().map(|s| s * s).collect();
            let smoother = Self::choose(&yk, &var, &pick(centres), &pick(widths));
            let fitted = smoother.apply(&yk);
            let missed: Vec<usize> = (0..kept.len())
                .filter(|&j| {
                    let leverage = smoother.matrix[[j, j]].clamp(0.0, 1.0);
                    (yk[j] - fitted[j]).abs() > release_z * sek[j] * (1.0 - leverage).sqrt()
                })
                .map(|j| kept[j])
                .collect();
            if smoother.lambda == 0.0 || missed.is_empty() {
                return (kept, smoother);
            }
            kept.retain(|i| !missed.contains(i));
        }
    }

    /// `S_λ v`: the smoothed masses of `v` (same length as the `y` it was chosen on).
    pub fn apply(&self, v: &[f64]) -> Vec<f64> {
        self.matrix.dot(&ndarray::ArrayView1::from(v)).to_vec()
    }
}

/// `DᵀD` for `D` the second divided differences of the density `m_b / widths_b` at
/// `centres`: row `i` (for each interior bin) is
/// `2/(h₁+h₂)·(d_{i−1}/h₁ − d_i(1/h₁ + 1/h₂) + d_{i+1}/h₂)`, `h₁, h₂` the gaps to the
/// neighbours' centres.
fn second_difference_penalty(centres: &[f64], widths: &[f64]) -> Array2<f64> {
    let n = centres.len();
    let mut d = Array2::<f64>::zeros((n - 2, n));
    for i in 1..n - 1 {
        let (h1, h2) = (centres[i] - centres[i - 1], centres[i + 1] - centres[i]);
        let s = 2.0 / (h1 + h2);
        d[[i - 1, i - 1]] = s / h1 / widths[i - 1];
        d[[i - 1, i]] = -s * (1.0 / h1 + 1.0 / h2) / widths[i];
        d[[i - 1, i + 1]] = s / h2 / widths[i + 1];
    }
    d.t().dot(&d)
}

/// `(W + λP)⁻¹ W` for `W = diag(1/var)`; `None` if the factorization fails.
fn smoother_matrix(var: &[f64], penalty: &Array2<f64>, lambda: f64) -> Option<Array2<f64>> {
    let mut a = penalty * lambda;
    for (i, v) in var.iter().enumerate() {
        a[[i, i]] += 1.0 / v;
    }
    let mut inverse = a.invc().ok()?;
    for (j, v) in var.iter().enumerate() {
        inverse.column_mut(j).mapv_inplace(|x| x / v);
    }
    inverse.iter().all(|x| x.is_finite()).then_some(inverse)
}

/// The fitted `model` (over the working bins of `space`, fitted to `ms`) with each grid
/// attribute's 1-way over its ordered bins smoothed (module docs): the smoother is chosen
/// on the attribute's combined unbiased estimate from every table holding it, with its
/// standard errors, applied to the model's 1-way (clipped at 0, its total over those bins
/// kept); the model is then raked to every smoothed 1-way at once
/// ([`GraphicalModel::with_one_way_targets`]: raking them one after the other moved the
/// earlier ones again through the cliques they share). Attributes without working bins, or
/// whose smoother chooses no smoothing, get no target.
pub fn smooth_numeric_one_ways(
    space: &Space,
    ms: &Measurements,
    model: GraphicalModel,
    release_z: f64,
) -> GraphicalModel {
    let mut targets: Vec<(usize, Vec<f64>)> = Vec::new();
    for a in 0..space.dims().len() {
        if space.cuts(a).is_empty() {
            continue;
        }
        let grid = space.grid_cells(a) as u32;
        let in_grid: Vec<usize> = (0..space.dims()[a])
            .filter(|&b| space.code_range(a, b).end <= grid)
            .collect();
        // A point mass cut out of its bin is not part of the density.
        let ordered: Vec<usize> = in_grid
            .into_iter()
            .filter(|&b| !space.is_point_mass(a, b))
            .collect();
        let (Some(combined), Some(fitted)) = (ms.combined(&[a]), model.marginal_in_clique(&[a]))
        else {
            continue;
        };
        let pick = |v: &[f64]| ordered.iter().map(|&b| v[b]).collect::<Vec<f64>>();
        let (centres, widths): (Vec<f64>, Vec<f64>) = ordered
            .iter()
            .map(|&b| {
                let r = space.code_range(a, b);
                (f64::from(r.start + r.end) / 2.0, f64::from(r.end - r.start))
            })
            .unzip();
        let (kept, smoother) = Smoother::robust(
            &pick(&combined.frequencies),
            &pick(&combined.std_errors),
            &centres,
            &widths,
            release_z,
        );
        if smoother.lambda == 0.0 {
            continue;
        }
        let ordered: Vec<usize> = kept.iter().map(|&i| ordered[i]).collect();
        let p: Vec<f64> = ordered.iter().map(|&b| fitted[b]).collect();
        let total: f64 = p.iter().sum();
        let smoothed: Vec<f64> = smoother.apply(&p).iter().map(|v| v.max(0.0)).collect();
        let smoothed_total: f64 = smoothed.iter().sum();
        if smoothed_total.is_nan() || smoothed_total <= 0.0 {
            continue;
        }
        let mut target = fitted.clone();
        for (&b, s) in ordered.iter().zip(&smoothed) {
            target[b] = s * total / smoothed_total;
        }
        targets.push((a, target));
    }
    model.with_one_way_targets(&targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A standard normal draw (Box–Muller).
    fn normal(rng: &mut impl Rng) -> f64 {
        let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-300), rng.random());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    fn bins(n: usize) -> (Vec<f64>, Vec<f64>) {
        ((0..n).map(|i| i as f64 * 4.0 + 2.0).collect(), vec![4.0; n])
    }

    #[test]
    fn a_linear_density_passes_unchanged() {
        let (centres, widths) = bins(12);
        let y: Vec<f64> = (0..12).map(|i| (1.0 + i as f64) / 78.0).collect();
        let var = vec![1e-4; 12];
        let penalty = second_difference_penalty(&centres, &widths);
        let m = smoother_matrix(&var, &penalty, 1e6).unwrap();
        let out = m.dot(&ndarray::ArrayView1::from(&y));
        for (a, b) in y.iter().zip(&out) {
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
    }

    /// A spike at the edge (a point mass no bin was cut for) leaves the sequence and keeps
    /// its mass; the smooth rest is still smoothed.
    #[test]
    fn a_spike_at_the_edge_is_released() {
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(11);
        let (centres, widths) = bins(16);
        let mut truth: Vec<f64> = (0..16)
            .map(|i| 0.5 * (-((i as f64 - 8.0) / 4.0).powi(2)).exp() / 7.09)
            .collect();
        truth[0] += 0.45;
        let sd = 0.03;
        let y: Vec<f64> = truth.iter().map(|t| t + sd * normal(&mut rng)).collect();
        let (kept, s) = Smoother::robust(&y, &[sd; 16], &centres, &widths, SMOOTHING_RELEASE_Z);
        assert!(!kept.contains(&0), "kept {kept:?}");
        assert!(
            s.lambda > 0.0 && kept.len() >= 12,
            "kept {kept:?}, λ {}",
            s.lambda
        );
        // Without the release, the smoother moves the spike's mass into its neighbour.
        let (all, plain) = Smoother::robust(&y, &[sd; 16], &centres, &widths, f64::INFINITY);
        assert_eq!(all.len(), 16);
        let moved = plain.apply(&y)[1] - y[1];
        assert!(moved > sd, "moved {moved}");
    }

    /// SURE is unbiased for the squared error: averaged over noise draws, the chosen
    /// smoother's error on a smooth density is well below the raw estimate's, and on a
    /// spiky one (every other bin empty) it smooths little or not at all.
    #[test]
    fn smoothing_is_chosen_by_the_data() {
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(7);
        let (centres, widths) = bins(16);
        let smooth: Vec<f64> = (0..16)
            .map(|i| (-((i as f64 - 6.0) / 4.0).powi(2)).exp())
            .collect();
        let spiky: Vec<f64> = (0..16)
            .map(|i| if i % 2 == 0 { 1.0 } else { 0.0 })
            .collect();
        let norm = |v: Vec<f64>| {
            let t: f64 = v.iter().sum();
            v.into_iter().map(|x| x / t).collect::<Vec<f64>>()
        };
        let (smooth, spiky) = (norm(smooth), norm(spiky));
        let sd = 0.02;
        let var = vec![sd * sd; 16];
        let mut errors = [[0.0; 2]; 2];
        for _ in 0..50 {
            for (k, truth) in [&smooth, &spiky].into_iter().enumerate() {
                let y: Vec<f64> = truth.iter().map(|t| t + sd * normal(&mut rng)).collect();
                let s = Smoother::choose(&y, &var, &centres, &widths);
                let out = s.apply(&y);
                let err = |v: &[f64]| {
                    v.iter()
                        .zip(truth)
                        .map(|(a, b)| (a - b).powi(2))
                        .sum::<f64>()
                };
                errors[k][0] += err(&y);
                errors[k][1] += err(&out);
            }
        }
        assert!(errors[0][1] < 0.5 * errors[0][0], "smooth: {:?}", errors[0]);
        assert!(errors[1][1] < 1.05 * errors[1][0], "spiky: {:?}", errors[1]);
    }
}
