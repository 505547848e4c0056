//! Information-theoretic formulas of PrivIncr (EDBT 2023): mutual information (eq. 14), the
//! dependency threshold τ (eq. 15) and the relaxed threshold ℓ = τ − ΔI(η) (Theorem 5.2,
//! eq. 18). All logarithms are natural.

/// Mutual information (eq. 14 of PrivIncr, natural log, nats) of a `k1 × k2` joint
/// distribution given row-major (length `k1·k2`, non-negative, summing to 1; it is
/// renormalized if it does not). Cells with zero probability contribute nothing.
///
/// Panics if `joint.len() != k1 * k2`.
pub fn mutual_information(joint: &[f64], k1: usize, k2: usize) -> f64 {
    assert_eq!(joint.len(), k1 * k2, "joint must have k1*k2 cells");
    let total: f64 = joint.iter().map(|&v| v.max(0.0)).sum();
    if total <= 0.0 {
        return 0.0;
    }
    let mut row = vec![0.0; k1];
    let mut col = vec![0.0; k2];
    for a in 0..k1 {
        for b in 0..k2 {
            let v = joint[a * k2 + b].max(0.0) / total;
            row[a] += v;
            col[b] += v;
        }
    }
    let mut mi = 0.0;
    for a in 0..k1 {
        for b in 0..k2 {
            let v = joint[a * k2 + b].max(0.0) / total;
            if v > 0.0 {
                mi += v * (v / (row[a] * col[b])).ln();
            }
        }
    }
    mi.max(0.0)
}

/// τ of eq. 15 of PrivIncr: `min(|Ω_i| − 1, |Ω_j| − 1) · φ² / 2` (nats).
pub fn tau(k1: usize, k2: usize, phi: f64) -> f64 {
    (k1.min(k2) as f64 - 1.0) * phi * phi / 2.0
}

/// Binary entropy `H(x) = −x ln x − (1−x) ln(1−x)` in nats (0 at x ∈ {0, 1}).
pub(crate) fn binary_entropy(x: f64) -> f64 {
    let term = |p: f64| if p > 0.0 { -p * p.ln() } else { 0.0 };
    term(x) + term(1.0 - x)
}

/// `ln((2^{M} − 2) / (2α))` with `M = m1·m2`, computed in log space
/// (`2^M` overflows f64 for `M > 1023`): `M ln 2 + ln(1 − 2^{1−M}) − ln(2α)`.
pub(crate) fn ln_eta_argument(m1: usize, m2: usize, alpha: f64) -> f64 {
    let m = (m1 * m2) as f64;
    m * std::f64::consts::LN_2 + (-(1.0 - m).exp2()).ln_1p() - (2.0 * alpha).ln()
}

/// η of eq. 18 of PrivIncr: `sqrt((2/n) · ln((2^{M_i M_j} − 2)/(2α)))` for `n ≥ 1` reports
/// of the pair (Theorem 5.2 prints `α` in place of `2α`; eq. 18 is the two-sided form used
/// for the relaxed threshold). Returns +∞ for `n = 0`.
pub fn eta(m1: usize, m2: usize, n: u64, alpha: f64) -> f64 {
    if n == 0 {
        return f64::INFINITY;
    }
    ((2.0 / n as f64) * ln_eta_argument(m1, m2, alpha)).sqrt()
}

/// ΔI(η) of Theorem 5.2 of PrivIncr (nats), with `M_i ≤ M_j` the smaller and larger domain:
/// `η/2 · ln[(M_i M_j − 1)(M_i − 1)(M_j − 1)] + 3 H(η/2)` if `η ≤ 2 − 2/M_i`, else `ln M_i`.
pub(crate) fn delta_i(eta: f64, m1: usize, m2: usize) -> f64 {
    let (mi, mj) = (m1.min(m2) as f64, m1.max(m2) as f64);
    if eta.is_finite() && eta <= 2.0 - 2.0 / mi {
        let log_term = ((mi * mj - 1.0) * (mi - 1.0) * (mj - 1.0)).ln();
        eta / 2.0 * log_term + 3.0 * binary_entropy(eta / 2.0)
    } else {
        mi.ln()
    }
}

/// The relaxed threshold `ℓ = τ − ΔI(η)` of eq. 18 of PrivIncr for a pair with domains
/// `k1, k2` reported by `n` users; an edge is pruned when its MI is below ℓ.
pub(crate) fn relaxed_threshold(k1: usize, k2: usize, n: u64, phi: f64, alpha: f64) -> f64 {
    tau(k1, k2, phi) - delta_i(eta(k1, k2, n, alpha), k1, k2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tau_matches_eq_15() {
        assert!((tau(2, 16, 0.3) - 0.045).abs() < 1e-15);
        assert!((tau(16, 41, 0.3) - 15.0 * 0.045).abs() < 1e-12);
    }

    #[test]
    fn eta_and_delta_by_hand() {
        // M = 4: ln((16 − 2)/(2·0.05)) = ln 140.
        let n = 10_000;
        let e = eta(2, 2, n, 0.05);
        assert!((e - (2.0 / 10_000.0 * 140f64.ln()).sqrt()).abs() < 1e-15);
        // ΔI = η/2 ln(3·1·1) + 3 H(η/2), η ≤ 2 − 2/2 = 1.
        let h = -(e / 2.0) * (e / 2.0).ln() - (1.0 - e / 2.0) * (1.0 - e / 2.0).ln();
        assert!((delta_i(e, 2, 2) - (e / 2.0 * 3f64.ln() + 3.0 * h)).abs() < 1e-15);
        // Large η: ΔI = ln M_i.
        assert_eq!(delta_i(1.5, 2, 5), 2f64.ln());
        assert_eq!(delta_i(f64::INFINITY, 3, 5), 3f64.ln());
        // ℓ = τ − ΔI.
        let l = relaxed_threshold(2, 2, n, 0.3, 0.05);
        assert!((l - (0.045 - delta_i(e, 2, 2))).abs() < 1e-15);
    }

    #[test]
    fn eta_in_log_space_does_not_overflow() {
        // 2^{41·16} = 2^656 is finite, 2^{41·41} = 2^1681 is not: the log form must be.
        let v = ln_eta_argument(41, 41, 0.05);
        assert!((v - (1681.0 * std::f64::consts::LN_2 - 0.1f64.ln())).abs() < 1e-9);
        assert!(eta(41, 41, 1000, 0.05).is_finite());
        // Small M agrees with the direct formula.
        let direct = ((2f64.powi(12) - 2.0) / 0.1).ln();
        assert!((ln_eta_argument(3, 4, 0.05) - direct).abs() < 1e-12);
    }

    #[test]
    fn mi_of_known_tables() {
        // Independent: 0.
        let ind = [0.06, 0.14, 0.24, 0.56];
        assert!(mutual_information(&ind, 2, 2).abs() < 1e-15);
        // Perfectly dependent uniform k×k: ln k.
        let mut diag = vec![0.0; 9];
        for i in 0..3 {
            diag[i * 3 + i] = 1.0 / 3.0;
        }
        assert!((mutual_information(&diag, 3, 3) - 3f64.ln()).abs() < 1e-12);
        // Binary symmetric channel with flip 0.1 on a fair bit: ln 2 − H(0.1).
        let bsc = [0.45, 0.05, 0.05, 0.45];
        assert!((mutual_information(&bsc, 2, 2) - (2f64.ln() - binary_entropy(0.1))).abs() < 1e-12);
    }
}
