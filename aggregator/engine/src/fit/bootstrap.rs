//! Standard errors of any marginal from the fitted model, by a parametric bootstrap (Efron
//! and Tibshirani, "An Introduction to the Bootstrap", 1993, §6.5): the fitted model stands
//! in for the population; every table is drawn again from it through its own mechanism
//! ([`replicate_estimate`]); the model is refitted to each replicate set of tables as the
//! pipeline fitted it (the fit's variances at the fitted model, started from its potentials,
//! then the numeric 1-ways smoothed); a marginal's standard error is the spread of its value
//! across the [`BOOTSTRAP_REPLICATES`] refitted models (`crate::synth::bootstrap`, which
//! answers marginals of the replicates; this module draws and refits them).
//!
//! A replicate table is drawn in counts, exactly as the collection made it: the table's `n`
//! people drawn without replacement from a population of the model's frequencies
//! (multivariate hypergeometric, the sampling term of [`crate::measure::variance`]), then
//! each person's report through the table's oracle (GRR: the true value kept with
//! probability `p − q`, else a uniform value; OUE: each bit; pair GRR: each attribute's GRR),
//! estimated by the mechanism's own estimator. So the replicate carries the within-table
//! correlations (GRR's cells sum to one; a pair summed to a 1-way) that the fit's
//! per-cell variances do not, and the fit's non-negativity acts on it as on the data.
//!
//! The spread is of the estimator around the model: a marginal the model answers only
//! through its structure (a pair no kept edge links, answered as independent) has no error
//! bar for the structure being wrong. Rounds are not post-stratified again, and tables are
//! drawn independently (the same people are not split between them).

use rand::SeedableRng;
use rand::distr::Distribution;
use rand_chacha::ChaCha12Rng;
use rand_distr::{Binomial, Hypergeometric, StandardNormal};

use ldpsyn::mechanism::{Oracle, SufficientStatistics};

use crate::domain::space::Space;
use crate::fit::observe::refit;
use crate::fit::pgm::{FitOptions, GraphicalModel};
use crate::fit::smooth::smooth_numeric_one_ways;
use crate::measure::measurement::Measurement;
use crate::measure::tables::Measurements;
use crate::numeric::index::coarsen;

/// Replicate models of the parametric bootstrap. The relative error of a standard error from
/// `B` replicates is about `1/√(2B)`: 9% at 64, which moves a nominal 95% interval's
/// coverage by about ±2 points; each replicate costs one warm-started refit (on the built-in
/// network in the debug build, 0.2 s for `auto`'s model and 0.65 s for `privincr`'s).
pub const BOOTSTRAP_REPLICATES: usize = 64;

/// Most replicates drawn when the model is large: the replicates hold
/// `replicates × clique cells` numbers, at most this many (2²³: 64 MiB of joint tables and
/// as much of conditional tables); fewer than [`MIN_BOOTSTRAP_REPLICATES`] fit: no
/// bootstrap.
pub const MAX_BOOTSTRAP_CELLS: usize = 1 << 23;

/// Fewest replicates worth a standard error (relative error about 16%).
pub const MIN_BOOTSTRAP_REPLICATES: usize = 20;

/// Seed of the replicate draws: post-processing of the released measurements, not privacy
/// noise, so fixed (the same model answers the same standard errors).
pub const BOOTSTRAP_SEED: u64 = 0xB007_57A9;

/// How the pipeline fitted the model, to fit each replicate the same way.
#[derive(Debug, Clone)]
pub struct Refit {
    /// The working space (numeric 1-ways are smoothed over its bins).
    pub(crate) space: Space,
    /// The smoother's release threshold ([`crate::fit::smooth::SMOOTHING_RELEASE_Z`]).
    pub(crate) release_z: f64,
    /// The fit's options.
    pub(crate) options: FitOptions,
}

/// What a bootstrap of a fit needs: the measurements, the fitted model and how it was fitted.
#[derive(Debug, Clone, Copy)]
pub struct BootstrapInputs<'a> {
    pub(crate) ms: &'a Measurements,
    pub(crate) model: &'a GraphicalModel,
    pub(crate) refit: &'a Refit,
}

/// Replicates to draw for a model of `cells` clique cells: [`BOOTSTRAP_REPLICATES`], fewer
/// within [`MAX_BOOTSTRAP_CELLS`]; `None` below [`MIN_BOOTSTRAP_REPLICATES`].
pub(crate) fn replicate_count(cells: usize) -> Option<usize> {
    let b = BOOTSTRAP_REPLICATES.min(MAX_BOOTSTRAP_CELLS / cells.max(1));
    (b >= MIN_BOOTSTRAP_REPLICATES).then_some(b)
}

/// Draws `b` replicate sets of `input`'s tables from its model and refits the model to each
/// as the pipeline fitted it (module docs), handing each refitted model to `each` (replicate
/// order; a refit that fails is skipped). `marginal` is the model's exact marginal of a
/// table's factor (row-major in factor order). Returns how many were refitted; 0 if a
/// marginal or an estimator fails. Cost: one warm-started fit (at most
/// `options.max_iters` mirror-descent steps) and one smoothing per replicate, plus a few
/// draws per table cell.
pub(crate) fn replicate_fits(
    input: BootstrapInputs<'_>,
    b: usize,
    marginal: &dyn Fn(&[usize]) -> Option<Vec<f64>>,
    each: &mut dyn FnMut(GraphicalModel),
) -> usize {
    let BootstrapInputs {
        ms,
        model,
        refit: how,
    } = input;
    // Each table's frequencies under the model, over the mechanism's cells.
    let Some(truths) = ms
        .items()
        .iter()
        .map(|m| {
            let f = marginal(&m.key.factor)?;
            Some(coarsen(
                &f,
                &ms.domain().project(&m.key.factor),
                &m.key.bins,
            ))
        })
        .collect::<Option<Vec<_>>>()
    else {
        return 0;
    };
    let mut done = 0;
    for r in 0..b {
        let mut rng = ChaCha12Rng::seed_from_u64(BOOTSTRAP_SEED ^ (r as u64) << 32);
        let Some(items) = ms
            .items()
            .iter()
            .zip(&truths)
            .map(|(m, f)| replicate_estimate(m, f, ms.population(), &mut rng))
            .collect::<Option<Vec<_>>>()
        else {
            return 0;
        };
        let rep = Measurements::indexed(items, ms.domain().clone(), ms.population());
        let Ok(fitted) = refit(&rep, model, &how.options) else {
            continue;
        };
        each(smooth_numeric_one_ways(
            &how.space,
            &rep,
            fitted,
            how.release_z,
        ));
        done += 1;
    }
    done
}

/// `Binomial(n, p)`, with the degenerate cases outside the sampler.
fn binomial(n: u64, p: f64, rng: &mut ChaCha12Rng) -> u64 {
    if n == 0 || p <= 0.0 {
        return 0;
    }
    if p >= 1.0 {
        return n;
    }
    Binomial::new(n, p).map_or(0, |d| d.sample(rng))
}

/// `n` draws spread uniformly over `k` cells (a multinomial, by sequential binomials).
fn uniform_counts(n: u64, k: usize, rng: &mut ChaCha12Rng) -> Vec<u64> {
    let mut out = vec![0; k];
    let mut left = n;
    for (j, o) in out.iter_mut().enumerate() {
        let c = if j + 1 == k {
            left
        } else {
            binomial(left, 1.0 / (k - j) as f64, rng)
        };
        *o = c;
        left -= c;
    }
    out
}

/// The true values of a table's `n` people: drawn without replacement from a population of
/// `population` people with frequencies `f` (multivariate hypergeometric, by sequential
/// hypergeometrics; the population's counts are `f` rounded cumulatively, so they sum to it);
/// `n·f` rounded when every person reported (no sampling error).
fn true_counts(f: &[f64], n: u64, population: u64, rng: &mut ChaCha12Rng) -> Vec<u64> {
    let total: f64 = f.iter().map(|x| x.max(0.0)).sum();
    let scale = |m: u64| -> Vec<u64> {
        // Cumulative rounding: the counts sum to exactly `m`.
        let mut acc = 0.0;
        let mut prev = 0u64;
        f.iter()
            .map(|x| {
                acc += x.max(0.0) / total.max(f64::MIN_POSITIVE);
                let upto = ((acc * m as f64).round() as u64).min(m);
                let c = upto.saturating_sub(prev);
                prev = prev.max(upto);
                c
            })
            .collect()
    };
    let mut pop = scale(population.max(n));
    let short = population.max(n) - pop.iter().sum::<u64>();
    if let Some(last) = pop.last_mut() {
        *last += short;
    }
    if population <= n {
        return pop;
    }
    let (mut left_pop, mut left_n) = (population, n);
    pop.iter()
        .map(|&k| {
            let x = if left_n == 0 || k == 0 {
                0
            } else if k == left_pop {
                left_n
            } else {
                hypergeometric(left_pop, k, left_n, rng)
            };
            left_pop -= k;
            left_n -= x;
            x
        })
        .collect()
}

/// Of `n` people drawn without replacement from `population` of whom `k` hold a value, how
/// many hold it. The sampler refuses large populations (its first probability underflows);
/// there, a binomial when the count's variance is small (few people drawn, so the
/// finite-population correction is near 1) else the normal approximation with the exact
/// variance, rounded and clamped to the possible counts.
fn hypergeometric(population: u64, k: u64, n: u64, rng: &mut ChaCha12Rng) -> u64 {
    if let Ok(d) = Hypergeometric::new(population, k, n) {
        return d.sample(rng);
    }
    let (nn, p) = (population as f64, k as f64 / population as f64);
    let var = n as f64 * p * (1.0 - p) * (nn - n as f64) / (nn - 1.0).max(1.0);
    if var < 25.0 {
        return binomial(n, p, rng).min(k);
    }
    let z: f64 = StandardNormal.sample(rng);
    let lo = n.saturating_sub(population - k);
    ((n as f64 * p + var.sqrt() * z).round().max(0.0) as u64).clamp(lo, n.min(k))
}

/// One replicate of the table `m` when its cells' frequencies are `f` (over the mechanism's
/// cells; module docs): its people drawn from the population, their reports drawn through
/// `m`'s oracle and estimated by it. A 1-way measured finer than its working bins is drawn
/// over its measured cells, each working bin's frequency split as its measured cells'
/// (clipped) estimates. `None` if the estimator fails.
pub(crate) fn replicate_estimate(
    m: &Measurement,
    f: &[f64],
    population: u64,
    rng: &mut ChaCha12Rng,
) -> Option<Measurement> {
    let n = m.estimate.n;
    let fine: Vec<f64> = match &m.refined {
        None => f.to_vec(),
        Some(r) => {
            let mut out = Vec::with_capacity(r.frequencies.len());
            let mut start = 0;
            for (&size, &bin) in r.sizes.iter().zip(f) {
                let cells = &r.frequencies[start..start + size];
                let total: f64 = cells.iter().map(|x| x.max(0.0)).sum();
                out.extend(cells.iter().map(|x| {
                    if total > 0.0 {
                        bin * x.max(0.0) / total
                    } else {
                        bin / size as f64
                    }
                }));
                start += size;
            }
            out
        }
    };
    let x = true_counts(&fine, n, population, rng);
    let counts = match m.mechanism.oracle() {
        Oracle::Grr(g) => {
            // GRR: the true value with probability p − q, else uniform over all k.
            let mut kept: Vec<u64> = x.iter().map(|&c| binomial(c, g.p() - g.q(), rng)).collect();
            let rest = n - kept.iter().sum::<u64>();
            for (k, u) in kept.iter_mut().zip(uniform_counts(rest, x.len(), rng)) {
                *k += u;
            }
            kept
        }
        Oracle::Oue(o) => x
            .iter()
            .map(|&c| binomial(c, o.p(), rng) + binomial(n - c, o.q(), rng))
            .collect(),
        Oracle::GrrPair(pg) => {
            let (g1, g2) = (pg.first(), pg.second());
            let (k1, k2) = (g1.domain_size(), g2.domain_size());
            let (l1, l2) = (g1.p() - g1.q(), g2.p() - g2.q());
            let mut counts = vec![0u64; k1 * k2];
            // People whose first value was kept and second redrawn (per first value), the
            // reverse (per second value), and both redrawn.
            let (mut rows, mut cols, mut both) = (vec![0u64; k1], vec![0u64; k2], 0u64);
            for a in 0..k1 {
                for b in 0..k2 {
                    let c = x[a * k2 + b];
                    let first = binomial(c, l1, rng);
                    let kk = binomial(first, l2, rng);
                    let uk = binomial(c - first, l2, rng);
                    counts[a * k2 + b] += kk;
                    rows[a] += first - kk;
                    cols[b] += uk;
                    both += c - first - uk;
                }
            }
            for (a, &r) in rows.iter().enumerate() {
                for (b, u) in uniform_counts(r, k2, rng).into_iter().enumerate() {
                    counts[a * k2 + b] += u;
                }
            }
            for (b, &c) in cols.iter().enumerate() {
                for (a, u) in uniform_counts(c, k1, rng).into_iter().enumerate() {
                    counts[a * k2 + b] += u;
                }
            }
            for (o, u) in counts.iter_mut().zip(uniform_counts(both, k1 * k2, rng)) {
                *o += u;
            }
            counts
        }
    };
    let estimate = m
        .mechanism
        .estimate(&SufficientStatistics { n, counts })
        .ok()?;
    let mut out = m.clone();
    match out.refined.as_mut() {
        None => out.estimate = estimate,
        Some(r) => {
            let mut sums = vec![0.0; r.sizes.len()];
            let mut start = 0;
            for (s, &size) in sums.iter_mut().zip(&r.sizes) {
                *s = estimate.frequencies[start..start + size].iter().sum();
                start += size;
            }
            r.frequencies = estimate.frequencies.clone();
            out.estimate = ldpsyn::mechanism::FrequencyEstimate {
                frequencies: sums,
                ..estimate
            };
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldpsyn::Epsilon;
    use ldpsyn::mechanism::{Mechanism, MechanismKind};

    use crate::domain::key::TableKey;

    /// A replicate table's cells, whole and summed to one attribute, vary as the one variance
    /// model says ([`Measurement::cell_variances`]), within 10%, for every oracle, with few
    /// and many of the population reporting: the draws are those of the collection.
    #[test]
    fn replicate_tables_vary_as_the_variance_model() {
        let dims = [3usize, 4];
        // A dependent pair.
        let f: Vec<f64> = {
            let raw: Vec<f64> = (0..12)
                .map(|c| {
                    if c / 4 == c % 4 {
                        4.0
                    } else {
                        1.0 + c as f64 / 6.0
                    }
                })
                .collect();
            let s: f64 = raw.iter().sum();
            raw.iter().map(|x| x / s).collect()
        };
        let trials = 3000usize;
        // Few people from a large population (the sampler's fallback) and many from a small
        // one (the finite-population correction).
        let oracles = [
            MechanismKind::Grr,
            MechanismKind::Oue,
            MechanismKind::GrrPair,
        ];
        for ((n, population), kind) in [(150u64, 100_000u64), (2000, 10_000)]
            .into_iter()
            .flat_map(|s| oracles.map(|k| (s, k)))
        {
            let mechanism = Mechanism::new(kind, Epsilon::new(2.0).unwrap(), &dims).unwrap();
            let m = Measurement {
                key: TableKey {
                    round: 0,
                    factor: vec![0, 1],
                    mechanism: kind,
                    bins: vec![],
                },
                dims: dims.to_vec(),
                estimate: ldpsyn::mechanism::FrequencyEstimate {
                    n,
                    frequencies: f.clone(),
                    std_errors: vec![0.0; 12],
                },
                mechanism,
                refined: None,
            };
            let mut rng = ChaCha12Rng::seed_from_u64(kind as u64);
            for target in [vec![0, 1], vec![1]] {
                let cells = if target.len() == 2 { 12 } else { 4 };
                let (mut sum, mut sq) = (vec![0.0; cells], vec![0.0; cells]);
                for _ in 0..trials {
                    let r = replicate_estimate(&m, &f, population, &mut rng).unwrap();
                    for (c, x) in r.marginalized(&target).iter().enumerate() {
                        sum[c] += x;
                        sq[c] += x * x;
                    }
                }
                let t = trials as f64;
                let at = if target.len() == 2 {
                    f.clone()
                } else {
                    (0..4).map(|b| (0..3).map(|a| f[a * 4 + b]).sum()).collect()
                };
                let predicted = m.cell_variances(&target, &at, population);
                for c in 0..cells {
                    let mean = sum[c] / t;
                    let var = (sq[c] - sum[c] * sum[c] / t) / (t - 1.0);
                    assert!(
                        (mean - at[c]).abs() < 4.0 * (var / t).sqrt(),
                        "{kind} {target:?} cell {c}: mean {mean} vs {}",
                        at[c]
                    );
                    assert!(
                        (var / predicted[c] - 1.0).abs() < 0.10,
                        "{kind} {target:?} cell {c}: variance {var} vs {}",
                        predicted[c]
                    );
                }
            }
        }
    }
}
