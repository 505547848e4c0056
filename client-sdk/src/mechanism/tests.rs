//! Tests of the mechanisms:
//!
//! - exact privacy audits (`privacy_audit_*`): `Pr[output | input]` rebuilt from the
//!   samplers' own code paths (the Bernoulli that `random_bool` builds, `Grr::other_value`,
//!   `Oue::sampler_bit_probabilities` and the geometric-skipping loop), never from the p/q
//!   formula under test; every row sums to 1, the worst ratio is ≤ e^ε and the bound is
//!   tight;
//! - χ² goodness of fit of randomizer outputs at α = 1e-6 with fixed seeds, each with a
//!   power self-check (the same statistic against a deliberately wrong p must reject);
//! - unbiasedness of the estimators and agreement of their empirical variance with the exact
//!   formula (`frequency_variances`);
//! - Norm-Sub, payload validation and accumulation.

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::*;

/// False-alarm level of every statistical test here.
pub(crate) const ALPHA: f64 = 1e-6;

fn eps(v: f64) -> Epsilon {
    Epsilon::new(v).unwrap()
}

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

// ---------------------------------------------------------------------------------------
// Distribution helpers: log-gamma, the regularized incomplete gamma, χ² tail probabilities.
// ---------------------------------------------------------------------------------------

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error ~1e-15).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x)
    } else {
        let x = x - 1.0;
        let t = x + 7.5;
        let a = C[0]
            + C[1..]
                .iter()
                .enumerate()
                .map(|(i, c)| c / (x + (i + 1) as f64))
                .sum::<f64>();
        0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
    }
}

/// Upper regularized incomplete gamma `Q(a, x) = Γ(a, x)/Γ(a)` (series below a + 1,
/// modified Lentz continued fraction above; Numerical Recipes §6.2).
fn gamma_q(a: f64, x: f64) -> f64 {
    assert!(a > 0.0 && x >= 0.0);
    if x == 0.0 {
        return 1.0;
    }
    let log_prefactor = -x + a * x.ln() - ln_gamma(a);
    if x < a + 1.0 {
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-17 {
                break;
            }
        }
        1.0 - sum * log_prefactor.exp()
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        log_prefactor.exp() * h
    }
}

/// `Pr[X ≥ x]` for `X ~ χ²(df)`.
fn chi2_sf(x: f64, df: usize) -> f64 {
    if x.is_infinite() {
        return 0.0;
    }
    gamma_q(df as f64 / 2.0, x / 2.0)
}

/// The χ²(df) critical value at level `alpha` (bisection on [`chi2_sf`]).
pub(crate) fn chi2_critical(df: usize, alpha: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, df as f64 + 10.0);
    while chi2_sf(hi, df) > alpha {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if chi2_sf(mid, df) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// `ln Pr[Binomial(n, q) = c]`.
fn ln_binomial_pmf(n: usize, q: f64, c: usize) -> f64 {
    ln_gamma(n as f64 + 1.0) - ln_gamma(c as f64 + 1.0) - ln_gamma((n - c) as f64 + 1.0)
        + c as f64 * q.ln()
        + (n - c) as f64 * (-q).ln_1p()
}

/// Pearson's χ² of `observed` counts against cell probabilities `probs` (a distribution).
/// Cells whose expected count is below 5 are pooled into one (merged into the smallest
/// other cell if the pool itself expects fewer than 5). An observation in a cell of
/// probability 0 gives an infinite statistic. Returns (statistic, degrees of freedom).
pub(crate) fn pearson(observed: &[u64], probs: &[f64]) -> (f64, usize) {
    assert_eq!(observed.len(), probs.len());
    let total: f64 = probs.iter().sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "cell probabilities sum to {total}"
    );
    let n = observed.iter().sum::<u64>() as f64;
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (&o, &p) in observed.iter().zip(probs) {
        if p <= 0.0 && o > 0 {
            return (f64::INFINITY, 1);
        }
        let e = p * n;
        if e < 5.0 {
            pooled_obs += o as f64;
            pooled_exp += e;
        } else {
            cells.push((o as f64, e));
        }
    }
    if pooled_exp >= 5.0 {
        cells.push((pooled_obs, pooled_exp));
    } else if pooled_exp > 0.0 || pooled_obs > 0.0 {
        let smallest = cells
            .iter_mut()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("at least one cell expects 5 or more");
        smallest.0 += pooled_obs;
        smallest.1 += pooled_exp;
    }
    assert!(cells.len() >= 2, "too few cells for a χ² test");
    let stat = cells.iter().map(|(o, e)| (o - e).powi(2) / e).sum();
    (stat, cells.len() - 1)
}

/// Sum of squared z-scores of independent binomial counts `counts[i] ~ Bin(n, probs[i])`;
/// approximately χ²(len) under the model.
fn binomial_z2(n: u64, counts: &[u64], probs: &[f64]) -> (f64, usize) {
    let nf = n as f64;
    let stat = counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| (c as f64 - nf * p).powi(2) / (nf * p * (1.0 - p)))
        .sum();
    (stat, counts.len())
}

/// Asserts the model fits (p-value above α) and the wrong model is rejected (below α).
pub(crate) fn assert_fit_and_power(label: &str, right: (f64, usize), wrong: (f64, usize)) {
    let (p_right, p_wrong) = (chi2_sf(right.0, right.1), chi2_sf(wrong.0, wrong.1));
    assert!(
        p_right > ALPHA,
        "{label}: χ² = {:.2} on {} df, p = {p_right:e} rejects the true model",
        right.0,
        right.1
    );
    assert!(
        p_wrong < ALPHA,
        "{label}: no power, χ² = {:.2} on {} df, p = {p_wrong:e} accepts the wrong model",
        wrong.0,
        wrong.1
    );
}

#[test]
fn chi2_helpers_match_closed_forms() {
    // Γ at integers and at 1/2.
    let mut ln_fact = 0.0;
    for n in 1..=170u32 {
        assert!(
            (ln_gamma(n as f64) - ln_fact).abs() <= 1e-12 * ln_fact.max(1.0),
            "Γ({n})"
        );
        ln_fact += (n as f64).ln();
    }
    assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-14);
    // Even df: Pr[χ²(2m) ≥ x] = Σ_{j<m} Poisson(x/2; j), both gamma branches.
    for df in [2usize, 4, 10, 30, 100, 300] {
        for x in [0.5f64, 3.0, 10.0, 40.0, 120.0, 250.0, 400.0] {
            let h = x / 2.0;
            let exact: f64 = (0..df / 2)
                .map(|j| (-h + j as f64 * h.ln() - ln_gamma(j as f64 + 1.0)).exp())
                .sum();
            let got = chi2_sf(x, df);
            assert!(
                (got - exact).abs() <= 1e-10 * exact.max(1e-300) + 1e-14,
                "df {df}, x {x}: {got} vs {exact}"
            );
        }
    }
    // χ²(2) critical value is −2 ln α exactly; χ²(1) at α = 1e-6 is 23.9281 (tables).
    assert!((chi2_critical(2, ALPHA) - (-2.0 * ALPHA.ln())).abs() < 1e-8);
    assert!((chi2_critical(1, ALPHA) - 23.9281).abs() < 1e-3);
    // Wilson–Hilferty agrees within 1% for large df (z_{1−1e-6} = 4.753424).
    for df in [50usize, 200, 1000] {
        let d = df as f64;
        let wh = d * (1.0 - 2.0 / (9.0 * d) + 4.753_424 * (2.0 / (9.0 * d)).sqrt()).powi(3);
        let c = chi2_critical(df, ALPHA);
        assert!((c / wh - 1.0).abs() < 0.01, "df {df}: {c} vs {wh}");
    }
}

// ---------------------------------------------------------------------------------------
// Exact privacy audits.
// ---------------------------------------------------------------------------------------

/// Checks a channel given as rows `Pr[· | input]`: every row is a distribution (sum 1 within
/// 1e-9, entries in [0, 1]). Returns the worst-case ratio
/// `max_{x, x', o} Pr[o | x] / Pr[o | x']` (infinite if an output is impossible for one
/// input and possible for another).
fn audit_channel(rows: &[Vec<f64>]) -> f64 {
    for (x, row) in rows.iter().enumerate() {
        let s: f64 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-9, "row {x} sums to {s}");
        assert!(row.iter().all(|&v| (0.0..=1.0).contains(&v)), "row {x}");
    }
    let outputs = rows[0].len();
    let mut worst: f64 = 1.0;
    for o in 0..outputs {
        let (mut hi, mut lo) = (0.0f64, f64::INFINITY);
        for row in rows {
            hi = hi.max(row[o]);
            lo = lo.min(row[o]);
        }
        if hi > 0.0 {
            worst = worst.max(if lo > 0.0 { hi / lo } else { f64::INFINITY });
        }
    }
    worst
}

/// Asserts `worst ≤ e^ε` (tolerance 1e-9) and `worst > e^{ε−0.01}` (the bound is tight).
fn assert_ratio_tight(label: &str, worst: f64, epsilon: f64) {
    assert!(
        worst <= epsilon.exp() * (1.0 + 1e-9),
        "{label}: worst ratio {worst} > e^ε = {}",
        epsilon.exp()
    );
    assert!(
        worst > (epsilon - 0.01).exp(),
        "{label}: worst ratio {worst} is not tight for ε = {epsilon}"
    );
}

/// `Pr[output | input]` of GRR as the sampler computes it: `random_bool(p)` compares one u64
/// against the threshold of `Bernoulli::new(p)` (whose `p()` is that threshold / 2^64), and
/// otherwise `other_value` maps each uniform draw `r ∈ 0..k−1` to a value.
fn grr_channel(g: &Grr) -> Vec<Vec<f64>> {
    let k = g.domain_size();
    let keep = rand::distr::Bernoulli::new(g.p()).unwrap().p();
    let per_draw = 1.0 / (k - 1) as f64;
    (0..k)
        .map(|v| {
            let mut row = vec![0.0; k];
            row[v] += keep;
            for r in 0..k - 1 {
                row[Grr::other_value(r, v)] += (1.0 - keep) * per_draw;
            }
            row
        })
        .collect()
}

const AUDIT_EPSILONS: [f64; 5] = [0.5, 1.0, 2.0, 4.0, 8.0];

#[test]
fn privacy_audit_grr() {
    for &e in &AUDIT_EPSILONS {
        for k in [2usize, 3, 8, 16, 100, 256] {
            let g = Grr::new(eps(e), k).unwrap();
            let worst = audit_channel(&grr_channel(&g));
            assert_ratio_tight(&format!("GRR ε={e} k={k}"), worst, e);
        }
    }
}

/// `Pr[(j, y) | x]` of a party report under `sampled+locmrf`
/// ([`crate::vertical::PartyRandomizer::record_from_codes`]) over every party row `x` of
/// `grrs`' domains: attribute `j` drawn by `random_range(0..m)` (exactly uniform for
/// `m` ≤ 2^32), then attribute `j`'s GRR channel as its sampler computes it; output
/// `(j, y)` at index `Σ_{i<j} k_i + y`.
fn sampled_party_channel(grrs: &[Grr]) -> Vec<Vec<f64>> {
    let dims: Vec<usize> = grrs.iter().map(Grr::domain_size).collect();
    let channels: Vec<Vec<Vec<f64>>> = grrs.iter().map(grr_channel).collect();
    let outputs: usize = dims.iter().sum();
    let rows: usize = dims.iter().product();
    let m = grrs.len() as f64;
    (0..rows)
        .map(|mut r| {
            let mut x = vec![0; dims.len()];
            for (xi, &k) in x.iter_mut().zip(&dims).rev() {
                *xi = r % k;
                r /= k;
            }
            let mut row = vec![0.0; outputs];
            let mut offset = 0;
            for (j, &k) in dims.iter().enumerate() {
                for y in 0..k {
                    row[offset + y] = channels[j][x[j]][y] / m;
                }
                offset += k;
            }
            row
        })
        .collect()
}

/// A `sampled+locmrf` party report (one attribute drawn independently of the row, its GRR
/// output and its index) is max_j ε_j-LDP for the whole party row, tightly: the draw's 1/m
/// cancels in every ratio, and two rows differing in the reported attribute reach its GRR
/// ratio. Not Σ ε_j: the other attributes leave no trace in the output.
#[test]
fn privacy_audit_sampled_party_report() {
    for e in [&[1.0, 1.0, 1.0][..], &[0.5, 2.0, 1.0], &[4.0, 0.3], &[8.0]] {
        let dims = [2usize, 3, 5];
        let grrs: Vec<Grr> = e
            .iter()
            .zip(dims)
            .map(|(&e, k)| Grr::new(eps(e), k).unwrap())
            .collect();
        let worst = audit_channel(&sampled_party_channel(&grrs));
        let max = e.iter().copied().fold(0.0, f64::max);
        assert_ratio_tight(&format!("sampled party report ε={e:?}"), worst, max);
    }
}

/// Distribution of the bitset produced by the first pass of the OUE sampler (before the true
/// bit is overwritten), indexed by the bitset as an integer, for k ≤ 8. Follows the
/// sampler's code path: independent `u64 < q_threshold` per bit (dense), or the geometric
/// loop — gap g with `Pr = (1−q)^g q`, stop when `g ≥ k − i`, set bit `i + g`, continue at
/// `i + g + 1`, stop at k.
fn oue_first_pass_distribution(o: &Oue) -> Vec<f64> {
    fn walk(i: usize, bits: usize, prob: f64, k: usize, q: f64, dist: &mut [f64]) {
        dist[bits] += prob * (1.0 - q).powi((k - i) as i32);
        for gap in 0..k - i {
            let j = i + gap;
            let pr = prob * (1.0 - q).powi(gap as i32) * q;
            if j + 1 >= k {
                dist[bits | 1 << j] += pr;
            } else {
                walk(j + 1, bits | 1 << j, pr, k, q, dist);
            }
        }
    }
    let k = o.domain_size();
    assert!(k <= 8);
    let (_, q) = o.sampler_bit_probabilities();
    let mut dist = vec![0.0; 1 << k];
    if o.uses_geometric_skipping() {
        walk(0, 0, 1.0, k, q, &mut dist);
    } else {
        for (bits, d) in dist.iter_mut().enumerate() {
            *d = (0..k)
                .map(|i| if bits >> i & 1 == 1 { q } else { 1.0 - q })
                .product();
        }
    }
    dist
}

/// `Pr[bitset | input]` of OUE for k ≤ 8, all 2^k outputs: the first pass, then the true
/// bit overwritten by a coin that is 1 with the sampler's true-bit probability.
fn oue_channel(o: &Oue) -> Vec<Vec<f64>> {
    let k = o.domain_size();
    let (p_true, _) = o.sampler_bit_probabilities();
    let first = oue_first_pass_distribution(o);
    (0..k)
        .map(|v| {
            let m = 1usize << v;
            (0..1usize << k)
                .map(|b| {
                    let before = first[b | m] + first[b & !m];
                    before * if b & m != 0 { p_true } else { 1.0 - p_true }
                })
                .collect()
        })
        .collect()
}

/// Per-bit probabilities of the first pass for any k: dense, q for every bit; geometric, the
/// probability that the loop lands on bit i, by dynamic programming over the loop
/// (`reach[i]` = probability that a gap is drawn starting at i).
fn oue_first_pass_marginals(o: &Oue) -> Vec<f64> {
    let k = o.domain_size();
    let (_, q) = o.sampler_bit_probabilities();
    if !o.uses_geometric_skipping() {
        return vec![q; k];
    }
    let mut marginals = vec![0.0; k];
    // `in_flight` = probability that a gap drawn at some j ≤ i has not ended before bit i.
    let (mut in_flight, mut reach) = (0.0, 1.0);
    for m in marginals.iter_mut() {
        in_flight += reach; // a gap is drawn starting at i
        *m = in_flight * q; // the gap ends exactly at i: bit i set, the loop moves to i + 1
        in_flight *= 1.0 - q; // the gap goes on past i
        reach = *m;
    }
    marginals
}

#[test]
fn privacy_audit_oue_enumerated() {
    let (mut dense, mut geometric) = (0, 0);
    for &e in &AUDIT_EPSILONS {
        for k in [2usize, 3, 5, 8] {
            let o = Oue::new(eps(e), k).unwrap();
            if o.uses_geometric_skipping() {
                geometric += 1;
            } else {
                dense += 1;
            }
            let rows = oue_channel(&o);
            let worst = audit_channel(&rows);
            assert_ratio_tight(&format!("OUE ε={e} k={k}"), worst, e);
            // The enumeration agrees with the per-bit product (bits are independent).
            let marg = oue_first_pass_marginals(&o);
            let (p_true, _) = o.sampler_bit_probabilities();
            for (v, row) in rows.iter().enumerate() {
                for (b, &pr) in row.iter().enumerate() {
                    let product: f64 = (0..k)
                        .map(|i| {
                            let m = if i == v { p_true } else { marg[i] };
                            if b >> i & 1 == 1 { m } else { 1.0 - m }
                        })
                        .product();
                    assert!((pr - product).abs() < 1e-12, "ε={e} k={k} v={v} b={b}");
                }
            }
        }
    }
    assert!(dense > 0 && geometric > 0, "both sampler paths audited");
}

/// The Bernoulli path's threshold is set so that the realized probability of a non-true bit
/// is above q = 1/(e^ε + 1) by more than the rounding of its computation: the realized
/// ratio (1 − q')/q' at p = 1/2 is ≤ e^ε, by a margin, and within 1e-14 of it (still tight).
#[test]
fn oue_threshold_rounds_towards_privacy() {
    for &e in &AUDIT_EPSILONS {
        let o = Oue::new(eps(e), 4).unwrap();
        let (_, realized) = o.sampler_bit_probabilities();
        let ratio = (1.0 - realized) / realized;
        assert!(ratio < e.exp(), "ε={e}: realized ratio {ratio} ≥ e^ε");
        assert!(ratio > e.exp() * (1.0 - 1e-14), "ε={e}: not tight");
    }
}

#[test]
fn privacy_audit_oue_closed_form() {
    let (mut dense, mut geometric) = (0, 0);
    for &e in &AUDIT_EPSILONS {
        for k in [2usize, 3, 8, 16, 100] {
            let o = Oue::new(eps(e), k).unwrap();
            if o.uses_geometric_skipping() {
                geometric += 1;
            } else {
                dense += 1;
            }
            let (p_true, _) = o.sampler_bit_probabilities();
            let marg = oue_first_pass_marginals(&o);
            assert!(marg.iter().all(|m| (0.0..=1.0).contains(m)));
            // Inputs v ≠ v' differ only in the distribution of bits v and v'; every other
            // bit's factor cancels, so the ratio is a product of two factors.
            let bit = |m: f64, set: bool| if set { m } else { 1.0 - m };
            let mut worst: f64 = 1.0;
            for v in 0..k {
                for w in (0..k).filter(|&w| w != v) {
                    for (bv, bw) in [(false, false), (false, true), (true, false), (true, true)] {
                        let num = bit(p_true, bv) * bit(marg[w], bw);
                        let den = bit(marg[v], bv) * bit(p_true, bw);
                        worst = worst.max(num / den);
                    }
                }
            }
            assert_ratio_tight(&format!("OUE ε={e} k={k}"), worst, e);
        }
    }
    assert!(dense > 0 && geometric > 0, "both sampler paths audited");
}

/// Kronecker product of two channels: input `a·k₂ + b`, output `a'·k₂ + b'`.
fn kron(first: &[Vec<f64>], second: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let mut rows = Vec::with_capacity(first.len() * second.len());
    for r1 in first {
        for r2 in second {
            rows.push(
                r1.iter()
                    .flat_map(|&x| r2.iter().map(move |&y| x * y))
                    .collect(),
            );
        }
    }
    rows
}

#[test]
fn privacy_audit_pair_grr() {
    for &e in &AUDIT_EPSILONS {
        for (k1, k2) in [(2usize, 2usize), (2, 5), (3, 4), (9, 16), (16, 16)] {
            let m = GrrPair::new(eps(e), k1, k2).unwrap();
            // The sampler randomizes the halves independently, each with its own GRR.
            let rows = kron(&grr_channel(m.first()), &grr_channel(m.second()));
            let worst = audit_channel(&rows);
            assert_ratio_tight(&format!("pair ε={e} {k1}×{k2}"), worst, e);
        }
    }
}

/// A vertical collection's pair of two attributes at their own ε (two parties, or one party
/// holding both): the joint channel's worst ratio is exactly `e^{ε₁+ε₂}`, and the channel
/// of either attribute alone is tight at its own ε (each report is ε_a-LDP).
#[test]
fn privacy_audit_pair_grr_with_epsilons() {
    for (e1, e2) in [(0.5, 3.5), (1.0, 1.0), (0.25, 2.0), (4.0, 0.3)] {
        for (k1, k2) in [(2usize, 3usize), (5, 2), (9, 16)] {
            let m = GrrPair::with_epsilons(eps(e1), eps(e2), k1, k2).unwrap();
            assert!((m.epsilon().get() - (e1 + e2)).abs() < 1e-12);
            let (c1, c2) = (grr_channel(m.first()), grr_channel(m.second()));
            let label = format!("pair ε=({e1},{e2}) {k1}×{k2}");
            assert_ratio_tight(&label, audit_channel(&kron(&c1, &c2)), e1 + e2);
            assert_ratio_tight(&format!("{label} first"), audit_channel(&c1), e1);
            assert_ratio_tight(&format!("{label} second"), audit_channel(&c2), e2);
        }
    }
    assert!(GrrPair::with_epsilons(eps(15.0), eps(15.0), 2, 2).is_err());
}

#[test]
fn privacy_audit_has_power() {
    // A GRR whose "other value" map could return the true value breaks the bound.
    let g = Grr::new(eps(1.0), 4).unwrap();
    let mut rows = grr_channel(&g);
    let leak = rows[0][1];
    rows[0][1] = 0.0;
    rows[0][0] += leak;
    assert!(audit_channel(&rows).is_infinite());
    // A GRR at ε = 1.05 fails an audit at ε = 1.
    let worst = audit_channel(&grr_channel(&Grr::new(eps(1.05), 4).unwrap()));
    assert!(worst > 1f64.exp() * (1.0 + 1e-9));
}

// ---------------------------------------------------------------------------------------
// χ² goodness of fit of the randomizers (theory from the formulas of docs/design.md "Mechanisms").
// ---------------------------------------------------------------------------------------

/// GRR output distribution for input `v` from the formula of docs/design.md with domain `k_formula`
/// in p (a wrong `k_formula` models an off-by-one bug), q spread evenly over the others.
fn grr_theory(epsilon: f64, k: usize, k_formula: usize, v: usize) -> Vec<f64> {
    let e = epsilon.exp();
    let p = e / (e + k_formula as f64 - 1.0);
    let q = (1.0 - p) / (k - 1) as f64;
    (0..k).map(|o| if o == v { p } else { q }).collect()
}

fn grr_counts(g: &Grr, v: usize, n: usize, seed: u64) -> Vec<u64> {
    let mut rng = rng(seed);
    let mut counts = vec![0u64; g.domain_size()];
    for _ in 0..n {
        counts[g.randomize(v, &mut rng).unwrap()] += 1;
    }
    counts
}

#[test]
fn chi2_grr_outputs_fit() {
    // (ε, k, input, n): n sized so that the off-by-one model (k + 1 in p) has a
    // non-centrality of several hundred against a critical value of ~40.
    for (i, &(e, k, v, n)) in [
        (0.5, 2usize, 1usize, 8_000usize),
        (1.0, 3, 0, 12_000),
        (1.0, 3, 2, 12_000),
        (2.0, 8, 0, 60_000),
        (2.0, 8, 5, 60_000),
    ]
    .iter()
    .enumerate()
    {
        let g = Grr::new(eps(e), k).unwrap();
        let counts = grr_counts(&g, v, n, 100 + i as u64);
        assert_fit_and_power(
            &format!("GRR ε={e} k={k} v={v}"),
            pearson(&counts, &grr_theory(e, k, k, v)),
            pearson(&counts, &grr_theory(e, k, k + 1, v)),
        );
    }
}

/// OUE output distribution over all 2^k bitsets for input `v`: independent bits, the true
/// bit 1 with `p`, the others with `q`.
fn oue_joint_theory(k: usize, v: usize, p: f64, q: f64) -> Vec<f64> {
    (0..1usize << k)
        .map(|b| {
            (0..k)
                .map(|i| {
                    let m = if i == v { p } else { q };
                    if b >> i & 1 == 1 { m } else { 1.0 - m }
                })
                .product()
        })
        .collect()
}

fn oue_q(epsilon: f64) -> f64 {
    1.0 / (epsilon.exp() + 1.0)
}

#[test]
fn chi2_oue_joint_outputs_fit_both_paths() {
    // k = 4: all 16 bitsets. Wrong models: q with e^ε + 2 (dense, ε = 1); a true bit kept with
    // 0.47 instead of 1/2 (geometric, ε = 4, where q is too small to resolve at this n).
    for (e, v, wrong_p, wrong_q, geometric, seed) in [
        (1.0, 2usize, 0.5, 1.0 / (1f64.exp() + 2.0), false, 7u64),
        (4.0, 1, 0.47, oue_q(4.0), true, 8),
    ] {
        let k = 4;
        let o = Oue::new(eps(e), k).unwrap();
        assert_eq!(o.uses_geometric_skipping(), geometric);
        let mut rng = rng(seed);
        let mut counts = vec![0u64; 1 << k];
        for _ in 0..40_000 {
            counts[o.randomize(v, &mut rng).unwrap()[0] as usize] += 1;
        }
        assert_fit_and_power(
            &format!("OUE joint ε={e}"),
            pearson(&counts, &oue_joint_theory(k, v, 0.5, oue_q(e))),
            pearson(&counts, &oue_joint_theory(k, v, wrong_p, wrong_q)),
        );
    }
}

/// Distribution of the number of set bits of an OUE report: `Binomial(k−1, q)` (the other
/// bits) plus an independent `Bernoulli(p)` (the true bit); length k + 1.
fn set_bits_theory(k: usize, p: f64, q: f64) -> Vec<f64> {
    let others: Vec<f64> = (0..k).map(|c| ln_binomial_pmf(k - 1, q, c).exp()).collect();
    (0..=k)
        .map(|c| {
            let without = if c < k { others[c] * (1.0 - p) } else { 0.0 };
            let with = if c > 0 { others[c - 1] * p } else { 0.0 };
            without + with
        })
        .collect()
}

/// Randomizes `n` times and returns (count of reports per number of set bits, count of
/// reports per bit set).
fn oue_bit_stats(o: &Oue, v: usize, n: usize, seed: u64) -> (Vec<u64>, Vec<u64>) {
    let k = o.domain_size();
    let mut rng = rng(seed);
    let (mut by_count, mut by_bit) = (vec![0u64; k + 1], vec![0u64; k]);
    for _ in 0..n {
        let bits = o.randomize(v, &mut rng).unwrap();
        let mut set = 0;
        for (byte_index, &byte) in bits.iter().enumerate() {
            let mut rest = byte;
            while rest != 0 {
                by_bit[byte_index * 8 + rest.trailing_zeros() as usize] += 1;
                set += 1;
                rest &= rest - 1;
            }
        }
        by_count[set] += 1;
    }
    (by_count, by_bit)
}

#[test]
fn chi2_oue_set_bits_and_marginals_dense() {
    // ε = 1: q ≈ 0.269 ≥ 1/16, one Bernoulli per bit. Wrong model: q with e^ε + 2.
    let (e, k, v, n) = (1.0, 16usize, 11usize, 20_000usize);
    let o = Oue::new(eps(e), k).unwrap();
    assert!(!o.uses_geometric_skipping());
    let (by_count, by_bit) = oue_bit_stats(&o, v, n, 21);
    let (q, wrong_q) = (oue_q(e), 1.0 / (e.exp() + 2.0));
    assert_fit_and_power(
        "OUE dense set-bit count",
        pearson(&by_count, &set_bits_theory(k, 0.5, q)),
        pearson(&by_count, &set_bits_theory(k, 0.5, wrong_q)),
    );
    let marginals = |q: f64| -> Vec<f64> { (0..k).map(|i| if i == v { 0.5 } else { q }).collect() };
    assert_fit_and_power(
        "OUE dense per-bit",
        binomial_z2(n as u64, &by_bit, &marginals(q)),
        binomial_z2(n as u64, &by_bit, &marginals(wrong_q)),
    );
}

#[test]
fn chi2_oue_set_bits_and_marginals_geometric() {
    // ε = 4, k = 4096: q ≈ 0.018 < 1/16, geometric skipping. The wrong count model, q with
    // e^ε + 2, is off by 1.8% and shifts the mean count by ~1.3 bits (sd ~8.5): a
    // non-centrality of ~470 at this n. The wrong per-bit model is a true bit left as drawn
    // (probability q instead of 1/2).
    let (e, k, v, n) = (4.0, 4096usize, 4000usize, 20_000usize);
    let o = Oue::new(eps(e), k).unwrap();
    assert!(o.uses_geometric_skipping());
    let (by_count, by_bit) = oue_bit_stats(&o, v, n, 22);
    let (q, wrong_q) = (oue_q(e), 1.0 / (e.exp() + 2.0));
    assert_fit_and_power(
        "OUE geometric set-bit count",
        pearson(&by_count, &set_bits_theory(k, 0.5, q)),
        pearson(&by_count, &set_bits_theory(k, 0.5, wrong_q)),
    );
    let marginals = |p: f64| -> Vec<f64> { (0..k).map(|i| if i == v { p } else { q }).collect() };
    assert_fit_and_power(
        "OUE geometric per-bit",
        binomial_z2(n as u64, &by_bit, &marginals(0.5)),
        binomial_z2(n as u64, &by_bit, &marginals(q)),
    );
}

#[test]
fn chi2_pair_grr_outputs_fit() {
    // Theory: the product of the two halves' GRR distributions at ε/2. Wrong model: the
    // first half's p computed with k₁ + 1.
    for (e, k1, k2, a, b, n, seed) in [
        (1.0, 3usize, 4usize, 2usize, 0usize, 12_000usize, 31u64),
        (2.0, 2, 5, 0, 4, 8_000, 32),
    ] {
        let m = GrrPair::new(eps(e), k1, k2).unwrap();
        let mut rng = rng(seed);
        let mut counts = vec![0u64; k1 * k2];
        for _ in 0..n {
            let (x, y) = m.randomize(a, b, &mut rng).unwrap();
            counts[x * k2 + y] += 1;
        }
        let joint = |k1_formula: usize| -> Vec<f64> {
            let (f, s) = (
                grr_theory(e / 2.0, k1, k1_formula, a),
                grr_theory(e / 2.0, k2, k2, b),
            );
            f.iter()
                .flat_map(|x| s.iter().map(move |y| x * y))
                .collect()
        };
        assert_fit_and_power(
            &format!("pair ε={e} {k1}×{k2}"),
            pearson(&counts, &joint(k1)),
            pearson(&counts, &joint(k1 + 1)),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Estimators: unbiasedness, exact variance, plug-in standard errors.
// ---------------------------------------------------------------------------------------

/// Runs `trials` independent collections from a fixed population (`cell_counts[c]` people
/// whose factor value is cell c, row-major over `m.dims()`), each randomized, accumulated
/// and estimated, and checks for every cell:
/// - the mean of f̂ is within 5 standard errors (of the mean) of the true frequency;
/// - the empirical variance of f̂ is within 10% of `frequency_variances` (the number of
///   trials makes 10% more than 4.5 standard errors of a sample variance);
/// - the mean plug-in standard error of `estimate` is within 5% of the exact one.
fn assert_unbiased(m: &Mechanism, cell_counts: &[u64], trials: usize, seed: u64) {
    let cells = m.cells();
    assert_eq!(cell_counts.len(), cells);
    let n: u64 = cell_counts.iter().sum();
    let truth: Vec<f64> = cell_counts.iter().map(|&c| c as f64 / n as f64).collect();
    let population: Vec<Vec<u32>> = cell_counts
        .iter()
        .enumerate()
        .flat_map(|(cell, &count)| {
            // Row-major unravel of `cell` over the factor's dims.
            let mut codes = vec![0u32; m.dims().len()];
            let mut rest = cell;
            for (code, &d) in codes.iter_mut().zip(m.dims()).rev() {
                *code = (rest % d) as u32;
                rest /= d;
            }
            std::iter::repeat_n(codes, count as usize)
        })
        .collect();
    let exact = m.frequency_variances(&truth, n);
    // Millions of reports: xoshiro256++ (`SmallRng`, seeded) instead of ChaCha, which costs
    // ~1.2 µs per u64 in an unoptimized test build. The samplers are generic over the RNG.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let (mut mean, mut m2, mut se_sum) = (vec![0.0; cells], vec![0.0; cells], vec![0.0; cells]);
    for t in 0..trials {
        let mut stats = SufficientStatistics::new(m);
        for codes in &population {
            let payload = m.randomize(codes, &mut rng).unwrap();
            m.accumulate(&payload, &mut stats).unwrap();
        }
        let est = m.estimate(&stats).unwrap();
        // Welford's running mean and sum of squared deviations.
        for c in 0..cells {
            let x = est.frequencies[c];
            let delta = x - mean[c];
            mean[c] += delta / (t + 1) as f64;
            m2[c] += delta * (x - mean[c]);
            se_sum[c] += est.std_errors[c];
        }
    }
    let label = format!("{:?} ε={}", m.kind(), m.epsilon());
    for c in 0..cells {
        let var = m2[c] / (trials - 1) as f64;
        let se_of_mean = (exact[c] / trials as f64).sqrt();
        assert!(
            (mean[c] - truth[c]).abs() <= 5.0 * se_of_mean,
            "{label} cell {c}: mean {} vs truth {} (se {se_of_mean})",
            mean[c],
            truth[c]
        );
        assert!(
            (var / exact[c] - 1.0).abs() <= 0.10,
            "{label} cell {c}: empirical variance {var} vs exact {}",
            exact[c]
        );
        let plug_in = se_sum[c] / trials as f64;
        assert!(
            (plug_in / exact[c].sqrt() - 1.0).abs() <= 0.05,
            "{label} cell {c}: mean plug-in se {plug_in} vs exact {}",
            exact[c].sqrt()
        );
    }
}

/// A skewed population over 6 cells (one empty), n = 400.
const SIX_CELLS: [u64; 6] = [160, 100, 80, 40, 20, 0];

#[test]
fn unbiased_grr() {
    for (e, seed) in [(1.0, 41u64), (4.0, 42)] {
        let m = Mechanism::new(MechanismKind::Grr, eps(e), &[2, 3]).unwrap();
        assert_unbiased(&m, &SIX_CELLS, 4000, seed);
    }
}

#[test]
fn unbiased_oue_dense() {
    let m = Mechanism::new(MechanismKind::Oue, eps(1.0), &[6]).unwrap();
    assert!(matches!(m.oracle(), Oracle::Oue(o) if !o.uses_geometric_skipping()));
    assert_unbiased(&m, &SIX_CELLS, 4000, 43);
}

#[test]
fn unbiased_oue_geometric() {
    let m = Mechanism::new(MechanismKind::Oue, eps(4.0), &[4, 4]).unwrap();
    assert!(matches!(m.oracle(), Oracle::Oue(o) if o.uses_geometric_skipping()));
    let mut counts = vec![0u64; 16];
    counts[..6].copy_from_slice(&SIX_CELLS);
    counts[15] = 100;
    assert_unbiased(&m, &counts, 4000, 44);
}

#[test]
fn unbiased_pair_grr() {
    // 3 × 4 joint, n = 400, two empty cells.
    let counts = [90, 60, 30, 20, 0, 40, 10, 50, 0, 30, 50, 20];
    for (e, seed) in [(1.0, 45u64), (4.0, 46)] {
        let m = Mechanism::new(MechanismKind::GrrPair, eps(e), &[3, 4]).unwrap();
        assert_unbiased(&m, &counts, 4000, seed);
    }
}

/// The Kronecker estimator with a different ε per attribute (vertical collections) is
/// unbiased with the exact variance, as the equal-split pair.
#[test]
fn unbiased_pair_grr_with_epsilons() {
    let counts = [90, 60, 30, 20, 0, 40, 10, 50, 0, 30, 50, 20];
    for ((e1, e2), seed) in [((0.5, 2.0), 47u64), ((3.0, 1.0), 48)] {
        let m = Mechanism::grr_pair_with_epsilons(eps(e1), eps(e2), &[3, 4]).unwrap();
        assert_unbiased(&m, &counts, 4000, seed);
    }
}

// ---------------------------------------------------------------------------------------
// Norm-Sub.
// ---------------------------------------------------------------------------------------

#[test]
fn norm_sub_known_values() {
    let out = norm_sub(&[0.5, 0.3, 0.4, -0.2]);
    let expected = [0.5 - 0.2 / 3.0, 0.3 - 0.2 / 3.0, 0.4 - 0.2 / 3.0, 0.0];
    for (o, e) in out.iter().zip(expected) {
        assert!((o - e).abs() < 1e-12, "{out:?}");
    }
    assert_eq!(norm_sub(&[-1.0, -2.0]), vec![1.0, 0.0]);
    // Non-finite entries count as 0: [0, 0.25, 0] shifted by 0.25.
    assert_eq!(
        norm_sub(&[f64::NAN, 0.25, f64::INFINITY]),
        vec![0.25, 0.5, 0.25]
    );
    assert!(norm_sub(&[]).is_empty());
}

proptest! {
    #[test]
    fn norm_sub_output_is_a_distribution(x in prop::collection::vec(-2.0f64..2.0, 1..60)) {
        let out = norm_sub(&x);
        prop_assert_eq!(out.len(), x.len());
        prop_assert!(out.iter().all(|&v| v >= 0.0));
        prop_assert!((out.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        // It is the Euclidean projection: one shift δ on the positive entries, and every
        // clipped entry would be ≤ 0 after the shift (the KKT conditions).
        let shifted: Vec<f64> = out.iter().zip(&x).filter(|(o, _)| **o > 0.0).map(|(o, v)| o - v).collect();
        let delta = shifted[0];
        prop_assert!(shifted.iter().all(|d| (d - delta).abs() < 1e-9));
        prop_assert!(out.iter().zip(&x).all(|(o, v)| *o > 0.0 || v + delta <= 1e-9));
    }

    #[test]
    fn norm_sub_preserves_order(x in prop::collection::vec(-2.0f64..2.0, 1..60)) {
        let out = norm_sub(&x);
        for i in 0..x.len() {
            for j in 0..x.len() {
                if x[i] > x[j] {
                    prop_assert!(out[i] >= out[j], "{} > {} but {} < {}", x[i], x[j], out[i], out[j]);
                }
            }
        }
    }

    #[test]
    fn norm_sub_is_idempotent_on_distributions(w in prop::collection::vec(0.0f64..1.0, 1..60)) {
        let s: f64 = w.iter().sum();
        prop_assume!(s > 1e-6);
        let dist: Vec<f64> = w.iter().map(|v| v / s).collect();
        let out = norm_sub(&dist);
        prop_assert!(out.iter().zip(&dist).all(|(a, b)| (a - b).abs() < 1e-12));
        let again = norm_sub(&out);
        prop_assert!(again.iter().zip(&out).all(|(a, b)| (a - b).abs() < 1e-12));
    }
}

// ---------------------------------------------------------------------------------------
// Validation, accumulation, estimation errors.
// ---------------------------------------------------------------------------------------

fn all_payload_kinds() -> [Payload; 3] {
    [
        Payload::Grr(0),
        Payload::Oue(OueBits(vec![0; 2])),
        Payload::GrrPair([0, 0]),
    ]
}

#[test]
fn validate_rejects_wrong_payload_kind() {
    for kind in [
        MechanismKind::Grr,
        MechanismKind::Oue,
        MechanismKind::GrrPair,
    ] {
        let m = Mechanism::new(kind, eps(1.0), &[3, 4]).unwrap();
        for p in all_payload_kinds() {
            let r = m.validate(&p);
            if p.kind() == kind {
                assert_eq!(r, Ok(()), "{kind} accepts {p:?}");
            } else {
                assert_eq!(
                    r,
                    Err(MechanismError::WrongPayloadKind {
                        expected: kind,
                        found: p.kind()
                    })
                );
            }
        }
    }
}

#[test]
fn validate_rejects_out_of_range_indices() {
    let grr = Mechanism::new(MechanismKind::Grr, eps(1.0), &[2, 3]).unwrap();
    assert_eq!(grr.validate(&Payload::Grr(5)), Ok(()));
    for v in [6, 7, u32::MAX as u64 + 1, u64::MAX] {
        assert!(
            matches!(
                grr.validate(&Payload::Grr(v)),
                Err(MechanismError::ValueOutOfDomain { k: 6, .. })
            ),
            "{v}"
        );
    }
    let pair = Mechanism::new(MechanismKind::GrrPair, eps(1.0), &[3, 4]).unwrap();
    assert_eq!(pair.validate(&Payload::GrrPair([2, 3])), Ok(()));
    for p in [[3, 0], [0, 4], [u64::MAX, 0], [0, u64::MAX]] {
        assert!(
            matches!(
                pair.validate(&Payload::GrrPair(p)),
                Err(MechanismError::ValueOutOfDomain { .. })
            ),
            "{p:?}"
        );
    }
}

#[test]
fn validate_rejects_malformed_oue_bits() {
    let bad = |m: &Mechanism, bytes: Vec<u8>| {
        matches!(
            m.validate(&Payload::Oue(OueBits(bytes))),
            Err(MechanismError::MalformedBits { .. })
        )
    };
    // k = 12: two bytes, the high nibble of the second unused.
    let m = Mechanism::new(MechanismKind::Oue, eps(1.0), &[3, 4]).unwrap();
    assert_eq!(m.validate(&Payload::Oue(OueBits(vec![0xFF, 0x0F]))), Ok(()));
    for bytes in [
        vec![],
        vec![0],
        vec![0, 0, 0],
        vec![0xFF, 0x10],
        vec![0, 0x80],
    ] {
        assert!(bad(&m, bytes.clone()), "{bytes:?}");
    }
    // k = 16: every bit is used.
    let m = Mechanism::new(MechanismKind::Oue, eps(1.0), &[16]).unwrap();
    assert_eq!(m.validate(&Payload::Oue(OueBits(vec![0xFF, 0xFF]))), Ok(()));
    assert!(bad(&m, vec![0xFF]));
    // k = 9: one bit of the second byte.
    let m = Mechanism::new(MechanismKind::Oue, eps(1.0), &[9]).unwrap();
    assert_eq!(m.validate(&Payload::Oue(OueBits(vec![0xFF, 0x01]))), Ok(()));
    assert!(bad(&m, vec![0xFF, 0x02]));
}

#[test]
fn accumulate_leaves_stats_unchanged_on_error() {
    let cases = [
        (MechanismKind::Grr, Payload::Grr(3), Payload::Grr(12)),
        (
            MechanismKind::Oue,
            Payload::Oue(OueBits(vec![0b101, 0b1000])),
            Payload::Oue(OueBits(vec![0xFF, 0x10])),
        ),
        (
            MechanismKind::GrrPair,
            Payload::GrrPair([1, 2]),
            Payload::GrrPair([1, 4]),
        ),
    ];
    for (kind, good, bad) in cases {
        let m = Mechanism::new(kind, eps(2.0), &[3, 4]).unwrap();
        let mut stats = SufficientStatistics::new(&m);
        m.accumulate(&good, &mut stats).unwrap();
        m.accumulate(&good, &mut stats).unwrap();
        let before = stats.clone();
        assert_eq!(stats.n, 2);
        let mut wrong_kind = all_payload_kinds().to_vec();
        wrong_kind.retain(|p| p.kind() != kind);
        for p in wrong_kind.iter().chain([&bad]) {
            assert!(m.accumulate(p, &mut stats).is_err(), "{kind}: {p:?}");
            assert_eq!(stats, before, "{kind}: stats changed by {p:?}");
        }
        // Statistics of the wrong shape are refused and left alone.
        let mut short = SufficientStatistics {
            n: 0,
            counts: vec![0; 5],
        };
        assert!(matches!(
            m.accumulate(&good, &mut short),
            Err(MechanismError::BadStatistics(_))
        ));
        assert_eq!(short.n, 0);
        assert_eq!(short.counts, vec![0; 5]);
    }
    // What an accumulated OUE report counts: its set bits.
    let m = Mechanism::new(MechanismKind::Oue, eps(2.0), &[3, 4]).unwrap();
    let mut stats = SufficientStatistics::new(&m);
    m.accumulate(
        &Payload::Oue(OueBits(vec![0b1000_0101, 0b1001])),
        &mut stats,
    )
    .unwrap();
    assert_eq!(stats.counts, [1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1]);
}

#[test]
fn estimate_rejects_bad_statistics() {
    let grr = Mechanism::new(MechanismKind::Grr, eps(1.0), &[3]).unwrap();
    let stats = |n, counts: &[u64]| SufficientStatistics {
        n,
        counts: counts.to_vec(),
    };
    assert_eq!(
        grr.estimate(&stats(0, &[0, 0, 0])),
        Err(MechanismError::NoReports)
    );
    assert!(matches!(
        grr.estimate(&stats(3, &[1, 2])),
        Err(MechanismError::BadStatistics(_))
    ));
    assert!(matches!(
        grr.estimate(&stats(3, &[1, 1, 0])),
        Err(MechanismError::BadStatistics(_))
    ));
    let oue = Mechanism::new(MechanismKind::Oue, eps(1.0), &[3]).unwrap();
    // OUE counts need not sum to n, but none may exceed it.
    assert!(oue.estimate(&stats(2, &[2, 2, 0])).is_ok());
    assert!(matches!(
        oue.estimate(&stats(2, &[3, 0, 0])),
        Err(MechanismError::BadStatistics(_))
    ));
    let pair = Mechanism::new(MechanismKind::GrrPair, eps(1.0), &[2, 2]).unwrap();
    assert!(matches!(
        pair.estimate(&stats(5, &[1, 1, 1, 1])),
        Err(MechanismError::BadStatistics(_))
    ));
}

#[test]
fn randomize_rejects_values_outside_the_factor() {
    for kind in [
        MechanismKind::Grr,
        MechanismKind::Oue,
        MechanismKind::GrrPair,
    ] {
        let m = Mechanism::new(kind, eps(1.0), &[3, 4]).unwrap();
        let mut rng = rng(5);
        for codes in [&[3u32, 0][..], &[0, 4], &[0], &[0, 0, 0]] {
            assert!(m.randomize(codes, &mut rng).is_err(), "{kind}: {codes:?}");
        }
    }
}

#[test]
fn choose_follows_the_variance_rule() {
    // GRR iff k < 3e^ε + 2 (Wang et al. 2017): 3e + 2 ≈ 10.15 at ε = 1.
    assert_eq!(MechanismKind::choose(eps(1.0), 10), MechanismKind::Grr);
    assert_eq!(MechanismKind::choose(eps(1.0), 11), MechanismKind::Oue);
    assert_eq!(MechanismKind::choose(eps(4.0), 165), MechanismKind::Grr);
    assert_eq!(MechanismKind::choose(eps(4.0), 166), MechanismKind::Oue);
}

fn mechanism_strategy() -> impl Strategy<Value = (Mechanism, Vec<u32>)> {
    (
        prop_oneof![
            Just(MechanismKind::Grr),
            Just(MechanismKind::Oue),
            Just(MechanismKind::GrrPair)
        ],
        0.1f64..10.0,
        prop::collection::vec(2usize..40, 2),
    )
        .prop_flat_map(|(kind, e, dims)| {
            let m = Mechanism::new(kind, eps(e), &dims).unwrap();
            let codes = dims.iter().map(|&d| 0..d as u32).collect::<Vec<_>>();
            (Just(m), codes)
        })
}

proptest! {
    #[test]
    fn randomized_payloads_validate_and_round_trip(
        (m, codes) in mechanism_strategy(),
        seed in any::<u64>(),
    ) {
        let payload = m.randomize(&codes, &mut rng(seed)).unwrap();
        prop_assert_eq!(payload.kind(), m.kind());
        prop_assert_eq!(m.validate(&payload), Ok(()));
        let json = serde_json::to_string(&payload).unwrap();
        let back: Payload = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&back, &payload);
        let mut stats = SufficientStatistics::new(&m);
        m.accumulate(&back, &mut stats).unwrap();
        prop_assert_eq!(stats.n, 1);
    }
}
