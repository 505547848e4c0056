//! The fit checked against its measurements: a pooled χ² residual per table.

use serde::{Deserialize, Serialize};

/// How far one table lies from the fitted model: `q = Σ_c (y_c − μ_c)²/v_c` over its cells
/// (those of small expected counts pooled into one) but the model's heaviest,
/// `y` its estimate, `μ` the model's marginal (under the table's bins) and `v` the one
/// variance model at `μ` ([`crate::measure::measurement::Measurement::cell_variances`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableResidual {
    /// The table's round.
    pub round: u32,
    /// Its factor (attributes in report order).
    pub factor: Vec<usize>,
    /// Its bin maps over the working bins (empty: none binned).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
    /// Reports in the table.
    pub reports: u64,
    /// The standardized squared residual.
    pub q: f64,
    /// Its degrees of freedom: cells − 1, once cells of small expected counts are pooled
    /// (`q` sums every cell but the model's heaviest).
    pub df: f64,
    /// Upper-tail χ² probability of `q` (Wilson–Hilferty).
    pub p_value: f64,
}

/// The fit checked against its own measurements ([`fit_residuals`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitResiduals {
    /// Tables whose factor lies in one clique of the model and that keep two cells once
    /// cells of small expected counts are pooled (the others are not checked).
    pub tables_checked: usize,
    /// Of those, the tables beyond noise: `p_value` below [`crate::measure::drift::DRIFT_TEST_LEVEL`]
    /// after the Bonferroni correction over the tables checked.
    pub beyond_noise: usize,
    /// `Σ q / Σ df` over the tables checked: about 1 when the model agrees with its
    /// measurements within noise.
    pub mean_ratio: f64,
    /// The tables that disagree most (at most [`WORST_RESIDUALS`]), worst first.
    pub worst: Vec<TableResidual>,
}

/// Expected count (reports × model frequency) below which [`fit_residuals`] pools a cell with
/// the other small ones: a cell expected to hold 0 or 1 report gives `q` a far heavier tail
/// than χ² (Cochran 1954, expected counts of about 5). Unpooled, random populations with
/// skewed 1-ways and i.i.d. arrivals put tables at p < 10⁻⁶: a 6 × 6 table of 27 reports
/// under `privincr` at ε = 4, a 3 × 4 table of 60 reports under `samprivsyn` at ε = 8
/// (`sim::properties`).
pub const MIN_EXPECTED_COUNT: f64 = 5.0;
use crate::fit::pgm::GraphicalModel;
use crate::measure::tables::Measurements;
use crate::numeric::index::coarsen;

/// Tables listed in [`FitResiduals::worst`].
pub const WORST_RESIDUALS: usize = 10;

/// `q = Σ (y − μ)²/v` and its degrees of freedom for one table's estimate `y` against the
/// model's `μ` with cell variances `v`, from `n` reports. The χ² reference needs about 5
/// expected counts per cell (Cochran, "Some methods for strengthening the common χ² tests",
/// Biometrics 10, 1954): cells with `n·μ` below [`MIN_EXPECTED_COUNT`] are pooled into one
/// (their estimates, model frequencies and variances summed). The cells then sum to one, so
/// the heaviest is left out (as in `crate::measure::drift`'s heterogeneity test): a deviation is not
/// counted twice. `None` when fewer than two cells remain.
fn pooled_chi2(y: &[f64], mu: &[f64], v: &[f64], n: f64) -> Option<(f64, f64)> {
    let mut cells: Vec<(f64, f64, f64)> = Vec::with_capacity(mu.len());
    let mut small = (0.0, 0.0, 0.0);
    let mut any_small = false;
    for ((&y, &m), &v) in y.iter().zip(mu).zip(v) {
        if n * m < MIN_EXPECTED_COUNT {
            small = (small.0 + y, small.1 + m, small.2 + v.max(0.0));
            any_small = true;
        } else {
            cells.push((y, m, v.max(0.0)));
        }
    }
    if any_small {
        cells.push(small);
    }
    if cells.len() < 2 {
        return None;
    }
    let heaviest = (0..cells.len())
        .max_by(|&a, &b| cells[a].1.total_cmp(&cells[b].1).then(b.cmp(&a)))
        .unwrap_or(0);
    let q = cells
        .iter()
        .enumerate()
        .filter(|(c, _)| *c != heaviest)
        .map(|(_, (y, m, v))| (y - m).powi(2) / v.max(1e-300))
        .sum();
    Some((q, (cells.len() - 1) as f64))
}

/// The standardized residual of every measurement whose factor lies in one clique of
/// `fitted` ([`TableResidual`]; cells of expected counts below [`MIN_EXPECTED_COUNT`]
/// pooled); tables spanning several cliques, or with fewer than two cells once pooled, are
/// skipped. A fit that
/// cannot agree with its tables (rounds of different people fitted as one) shows as tables
/// beyond noise. Deterministic; no errors.
pub fn fit_residuals(ms: &Measurements, fitted: &GraphicalModel) -> FitResiduals {
    let dims = ms.domain_sizes();
    let mut all: Vec<TableResidual> = Vec::new();
    for m in ms.items() {
        let f = &m.key.factor;
        let Some(marginal) = fitted.marginal_in_clique(f) else {
            continue;
        };
        let fdims: Vec<usize> = f.iter().map(|&a| dims[a]).collect();
        let bins: Vec<Vec<u32>> = if m.key.bins.is_empty() {
            Vec::new()
        } else {
            f.iter().map(|&a| m.key.bins_of(a).to_vec()).collect()
        };
        let mu = coarsen(&marginal, &fdims, &bins);
        if mu.len() != m.estimate.frequencies.len() {
            continue;
        }
        let v = m.cell_variances(f, &mu, ms.population());
        let Some((q, df)) = pooled_chi2(&m.estimate.frequencies, &mu, &v, m.estimate.n as f64)
        else {
            continue;
        };
        all.push(TableResidual {
            round: m.key.round,
            factor: f.clone(),
            bins: m.key.bins.clone(),
            reports: m.estimate.n,
            q,
            df,
            p_value: crate::numeric::stats::chi2_upper(q, df),
        });
    }
    let checked = all.len();
    let (q, df) = all.iter().fold((0.0, 0.0), |(q, d), r| (q + r.q, d + r.df));
    all.sort_by(|x, y| {
        x.p_value
            .total_cmp(&y.p_value)
            .then(x.factor.cmp(&y.factor))
    });
    let beyond_noise = all
        .iter()
        .filter(|r| r.p_value * checked as f64 <= crate::measure::drift::DRIFT_TEST_LEVEL)
        .count();
    all.truncate(WORST_RESIDUALS);
    FitResiduals {
        tables_checked: checked,
        beyond_noise,
        mean_ratio: if df > 0.0 { q / df } else { 0.0 },
        worst: all,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha12Rng;

    /// Small tables of a skewed distribution (most cells expected to hold 0 or 1 report):
    /// with small cells pooled, `q` follows its χ² reference (mean q/df 0.975; the 0.001
    /// level crossed by 8 of 4,000 replicates); summed cell by cell it was crossed by 68,
    /// 17 times the level.
    #[test]
    fn pooled_residuals_are_calibrated_on_sparse_tables() {
        let w: Vec<f64> = (0..12).map(|i| 0.6f64.powi(i)).collect();
        let total: f64 = w.iter().sum();
        let mu: Vec<f64> = w.iter().map(|x| x / total).collect();
        let n = 60.0;
        let v: Vec<f64> = mu.iter().map(|m| m * (1.0 - m) / n).collect();
        let mut rng = ChaCha12Rng::seed_from_u64(9);
        let (mut ratio, mut rejected, mut unpooled_rejected) = (0.0, 0, 0);
        let reps = 4000;
        for _ in 0..reps {
            let mut y = vec![0.0; mu.len()];
            for _ in 0..n as usize {
                let mut u: f64 = rng.random();
                let c = mu
                    .iter()
                    .position(|m| {
                        u -= m;
                        u < 0.0
                    })
                    .unwrap_or(mu.len() - 1);
                y[c] += 1.0 / n;
            }
            let (q, df) = pooled_chi2(&y, &mu, &v, n).expect("several cells");
            ratio += q / df / reps as f64;
            if crate::numeric::stats::chi2_upper(q, df) < 0.001 {
                rejected += 1;
            }
            let raw: f64 = (1..mu.len()).map(|c| (y[c] - mu[c]).powi(2) / v[c]).sum();
            if crate::numeric::stats::chi2_upper(raw, (mu.len() - 1) as f64) < 0.001 {
                unpooled_rejected += 1;
            }
        }
        assert!((0.8..1.2).contains(&ratio), "mean q/df {ratio}");
        assert!(rejected < reps / 200, "{rejected} of {reps} below 0.001");
        eprintln!(
            "mean q/df {ratio:.3}, {rejected} pooled and {unpooled_rejected} unpooled of {reps} below 0.001"
        );
        assert!(
            unpooled_rejected > reps / 100,
            "{unpooled_rejected} unpooled"
        );
    }
}
