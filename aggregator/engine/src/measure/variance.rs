//! The one variance model (docs/design.md "Estimation"): every cell of every table, whole or
//! summed down to fewer attributes, has the randomizer's variance (over the devices' coins)
//! plus sampling against the population, evaluated at a model's frequency, never at the
//! noisy cell.

use ldpsyn::mechanism::{Mechanism, Oracle};

/// Randomizer variance (over the devices' coins, for a fixed set of reporting users) of one
/// target cell's estimate obtained by summing `c` factor cells of a table with mechanism `m`
/// and `n` reports, when a share `f` of those users hold the target cell. `single` is the
/// position (0/1) of the kept attribute of a pair-GRR marginalized to one attribute.
///
/// A user inside the target cell sets the summed output with probability `π1`, a user outside
/// with `π0` (GRR: `p + (c−1)q` and `cq`; a pair-GRR kept half: its own GRR at ε/2); OUE
/// bits are independent, so the per-user variance is `p(1−p) + (c−1)q(1−q)` inside and
/// `c q(1−q)` outside. Divided by `n (p − q)²` as for the unbiased estimator
/// `(C/n − π0)/(p − q)` (docs/design.md "Mechanisms").
pub(crate) fn summed_randomizer_variance(
    m: &Mechanism,
    c: usize,
    f: f64,
    n: u64,
    single: Option<usize>,
) -> f64 {
    let nf = n.max(1) as f64;
    let f = f.clamp(0.0, 1.0);
    let c = c as f64;
    let bernoulli = |pi: f64| pi * (1.0 - pi);
    match m.oracle() {
        Oracle::Grr(g) => {
            let (p, q) = (g.p(), g.q());
            (f * bernoulli(p + (c - 1.0) * q) + (1.0 - f) * bernoulli(c * q))
                / (nf * (p - q).powi(2))
        }
        Oracle::Oue(o) => {
            let (p, q) = (o.p(), o.q());
            (f * (bernoulli(p) + (c - 1.0) * bernoulli(q)) + (1.0 - f) * c * bernoulli(q))
                / (nf * (p - q).powi(2))
        }
        Oracle::GrrPair(pg) => {
            // Q⁻¹'s columns sum to one, so summing the pair estimate over the other attribute
            // leaves the kept half's own GRR estimate at ε/2.
            let g = if single == Some(0) {
                pg.first()
            } else {
                pg.second()
            };
            let (p, q) = (g.p(), g.q());
            (f * bernoulli(p) + (1.0 - f) * bernoulli(q)) / (nf * (p - q).powi(2))
        }
    }
}

/// Sampling variance of a cell of frequency `f` estimated from `n` users drawn without
/// replacement from a population of `population`: `f(1−f)/n · (N−n)/(N−1)` (0 when every
/// user of the population reported in this table).
pub fn sampling_variance(f: f64, n: u64, population: u64) -> f64 {
    let (nf, pf) = (n.max(1) as f64, population as f64);
    let fpc = if pf > nf { (pf - nf) / (pf - 1.0) } else { 0.0 };
    let f = f.clamp(0.0, 1.0);
    f * (1.0 - f) / nf * fpc
}
