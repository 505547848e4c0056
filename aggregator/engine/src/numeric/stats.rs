//! Distribution tails for the engine's tests of fit and drift.

/// Upper-tail probability of χ²(`df`) at `q` (Wilson–Hilferty cube-root normal
/// approximation; Johnson, Kotz & Balakrishnan, Continuous Univariate Distributions 1,
/// 1994, eq. 18.24).
pub(crate) fn chi2_upper(q: f64, df: f64) -> f64 {
    if df <= 0.0 {
        return 1.0;
    }
    let s = 2.0 / (9.0 * df);
    let z = ((q / df).max(0.0).cbrt() - (1.0 - s)) / s.sqrt();
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// Complementary error function (Numerical Recipes, 3rd ed., §6.2.2, Chebyshev fit;
/// relative error below 1.2e-7).
pub(crate) fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chi2_upper_matches_known_quantiles() {
        // χ²(10) 0.95 quantile 18.307; χ²(1) 0.999 quantile 10.828; χ²(100) median ≈ 99.33.
        assert!((chi2_upper(18.307, 10.0) - 0.05).abs() < 0.002);
        assert!((chi2_upper(10.828, 1.0) - 0.001).abs() < 0.0005);
        assert!((chi2_upper(99.334, 100.0) - 0.5).abs() < 0.002);
        assert!((erfc(0.0) - 1.0).abs() < 1e-7 && (erfc(1.0) - 0.157_299_2).abs() < 1e-6);
    }
}
