//! `auto`'s phase-2 allocation: reports per factor in proportion to its weight in the
//! predicted error, counting what earlier rounds already measured.

use crate::domain::binned::BinnedFactor;
use crate::measure::measurement::Measurement;
use crate::measure::tables::Measurements;
use crate::protocols::context::Context;

/// Phase-2 reports per factor, `n_f = max(0, c·a_f − m_f)` with `c` such that
/// `Σ n_f = n2`: the allocation `∝ a_f` of the totals `m_f + n_f` (which minimizes
/// `Σ_f w_f K_f/√(m_f + n_f)` when no factor is over-measured already) for factors that
/// already hold `m_f` reports. Water-filling by bisection on `c`; with no earlier reports it
/// is `a_f·n2/Σa`, the allocation without offsets.
pub(super) fn top_up(a: &[f64], m: &[f64], n2: f64) -> Vec<f64> {
    let given = |c: f64| -> f64 { a.iter().zip(m).map(|(a, m)| (c * a - m).max(0.0)).sum() };
    let a_sum: f64 = a.iter().sum();
    if a_sum <= 0.0 || n2 <= 0.0 {
        return a.to_vec();
    }
    let (mut lo, mut hi) = (0.0, (n2 + m.iter().sum::<f64>()) / a_sum);
    while given(hi) < n2 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if given(mid) < n2 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    a.iter()
        .zip(m)
        .map(|(a, m)| (hi * a - m).max(0.0))
        .collect()
}

/// Reports of a 1-way over the working bins (with its best oracle) that estimate the bins'
/// totals as well as 1-way measurement `m` does when its attribute's distribution is `at`:
/// its own reports, or fewer when it was measured in sub-bins, whose block sums are noisier
/// (`n·(K_w/K_m)²`, with `K` the summed standard errors of the bins' totals, both ∝ 1/√n:
/// the one variance model of [`crate::measure::measurement::Measurement::cell_variances`]).
pub(super) fn equivalent_reports(
    ctx: &Context,
    ms: &Measurements,
    m: &Measurement,
    at: &[f64],
) -> f64 {
    let n = m.estimate.n as f64;
    let [a] = m.key.factor[..] else { return n };
    if m.refined.is_none() || at.len() != ctx.dims()[a] {
        return n;
    }
    let own: f64 = m
        .cell_variances(&[a], at, ms.population())
        .iter()
        .map(|v| v.max(0.0).sqrt())
        .sum();
    let working: f64 = ctx
        .cell_std_errors(BinnedFactor::full(&[a]), at, n)
        .iter()
        .sum();
    if own > 0.0 && working.is_finite() {
        n * (working / own).powi(2).min(1.0)
    } else {
        n
    }
}
