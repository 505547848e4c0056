//! One table's unbiased estimate ([`Measurement`]) and the variances of its cells, whole or
//! summed down to fewer attributes (the one variance model, [`crate::measure::variance`]).

use ldpsyn::mechanism::{FrequencyEstimate, Mechanism, MechanismKind};

use crate::domain::key::TableKey;
use crate::measure::variance::{sampling_variance, summed_randomizer_variance};
use crate::numeric::index::projection_map;

/// One table's unbiased estimate, with its mechanism.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// The table.
    pub key: TableKey,
    /// Domain sizes of the factor attributes (factor order), in bins where the table's key
    /// bins an attribute.
    pub dims: Vec<usize>,
    /// The mechanism (which oracle, p, q).
    pub mechanism: Mechanism,
    /// Unbiased frequency estimate over the factor's product domain (row-major).
    pub estimate: FrequencyEstimate,
    /// A 1-way measured finer than its attribute's working bins ([`crate::domain::space`]):
    /// `estimate` holds its sums over the working bins, this its measured cells.
    pub refined: Option<Refined>,
}

/// The measured cells of a 1-way finer than the working bins ([`Measurement::refined`]).
#[derive(Debug, Clone)]
pub struct Refined {
    /// Bin maps of the measured cells over the attribute's schema codes (`[]`: every code).
    pub code_cuts: Vec<u32>,
    /// Measured cells in each working bin.
    pub sizes: Vec<usize>,
    /// Unbiased estimate of each measured cell.
    pub frequencies: Vec<f64>,
}

impl Measurement {
    /// The table's unbiased estimate marginalized to `target ⊆ factor` (cells row-major in
    /// `target` order). Panics if `target` is not a subset of the factor.
    pub(crate) fn marginalized(&self, target: &[usize]) -> Vec<f64> {
        let map = projection_map(&self.key.factor, &self.dims, target);
        let cells = self.estimate.frequencies.len() / self.cells_summed(target);
        let mut out = vec![0.0; cells];
        for (i, &t) in map.iter().enumerate() {
            out[t] += self.estimate.frequencies[i];
        }
        out
    }

    /// Factor cells summed into one cell of `target`.
    fn cells_summed(&self, target: &[usize]) -> usize {
        self.key
            .factor
            .iter()
            .zip(&self.dims)
            .filter(|(a, _)| !target.contains(a))
            .map(|(_, &k)| k)
            .product()
    }

    /// The one variance model of docs/design.md "Estimation": the variance of every cell of
    /// [`Measurement::marginalized`]`(target)` when the population's marginal of `target` is
    /// `f` (row-major in `target` order, non-negative, sum 1): the randomizer's variance for
    /// the table's `n` users plus the sampling variance of those `n` users against a
    /// population of `population` (finite-population corrected). Evaluate `f` at a model, not
    /// at the noisy cells. Frequencies, per cell; panics if `target ⊄ factor` or
    /// `f.len()` is not the target's cell count.
    pub(crate) fn cell_variances(&self, target: &[usize], f: &[f64], population: u64) -> Vec<f64> {
        let n = self.estimate.n;
        let c = self.cells_summed(target);
        let randomizer: Vec<f64> = if let Some(r) = &self.refined {
            // Each working cell sums its measured cells (a 1-way: target is the factor).
            f.iter()
                .zip(&r.sizes)
                .map(|(&x, &c)| summed_randomizer_variance(&self.mechanism, c, x, n, None))
                .collect()
        } else if c == 1 {
            // The whole table in another order: the mechanism's exact cell variances.
            let map = projection_map(&self.key.factor, &self.dims, target);
            let plug: Vec<f64> = map.iter().map(|&t| f[t].clamp(0.0, 1.0)).collect();
            let v = self.mechanism.frequency_variances(&plug, n);
            let mut out = vec![0.0; f.len()];
            for (i, &t) in map.iter().enumerate() {
                out[t] = v[i].max(0.0);
            }
            out
        } else {
            let single = (self.key.mechanism == MechanismKind::GrrPair && target.len() == 1)
                .then(|| self.key.factor.iter().position(|&a| a == target[0]))
                .flatten();
            f.iter()
                .map(|&x| summed_randomizer_variance(&self.mechanism, c, x, n, single))
                .collect()
        };
        randomizer
            .iter()
            .zip(f)
            .map(|(r, &x)| r + sampling_variance(x, n, population))
            .collect()
    }
}

impl Measurement {
    /// Per-cell variances that weight the graphical-model fit, from the one model of
    /// [`Measurement::cell_variances`] at `f`: the table's mean randomizer variance (shared by
    /// its cells) plus each cell's own sampling variance. A randomizer's per-cell variance
    /// differs across cells mostly through the one-hot output, whose estimates are negatively
    /// correlated (GRR's sum to one): weighting cells by it treats them as independent and
    /// fits worse than a shared weight (which fits a lone table as Norm-Sub does). The
    /// sampling variance `f(1−f)/n` is what separates a rare cell from a common one where the
    /// randomizer is weak (large ε): there per-cell weights fit better
    /// (`benchmarks/sweeps/fit-weights.md`). Frequencies², per cell, > 0.
    pub(crate) fn fit_variances(&self, target: &[usize], f: &[f64], population: u64) -> Vec<f64> {
        let sampling: Vec<f64> = f
            .iter()
            .map(|&x| sampling_variance(x, self.estimate.n, population))
            .collect();
        let randomizer = self
            .cell_variances(target, f, population)
            .iter()
            .zip(&sampling)
            .map(|(v, s)| v - s)
            .sum::<f64>()
            / f.len().max(1) as f64;
        sampling
            .iter()
            .map(|s| (randomizer + s).max(1e-300))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldpsyn::Epsilon;
    use ldpsyn::mechanism::{Mechanism, MechanismKind, SufficientStatistics};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha12Rng;

    use crate::domain::key::TableKey;
    use crate::domain::space::Space;
    use crate::measure::tables::{Measurements, Tables};

    fn eps(e: f64) -> Epsilon {
        Epsilon::new(e).unwrap()
    }

    /// A 1-way measured finer than its working bins (GRR and OUE on 12 codes, working bins
    /// of 4, 4, 3 and 1 codes) reads as block sums whose variance model matches the
    /// simulated variance within 10%, and its cells stay available for recovery.
    #[test]
    fn refined_one_way_variance_matches_simulation() {
        let space = Space::new(vec![12], vec![vec![4, 8, 11]]).unwrap();
        let population_size = 3000usize;
        let (n, trials) = (300usize, 2000usize);
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        // Skewed: code 0 holds a third of the people.
        let people: Vec<u32> = (0..population_size)
            .map(|_| {
                if rng.random_bool(0.33) {
                    0
                } else {
                    rng.random_range(0..12u32)
                }
            })
            .collect();
        let mut truth = vec![0.0; 4];
        for &p in &people {
            truth[ldpsyn::factor::bin_of(p, space.cuts(0)) as usize] +=
                1.0 / population_size as f64;
        }
        for kind in [MechanismKind::Grr, MechanismKind::Oue] {
            let mech = Mechanism::new(kind, eps(2.0), &[12]).unwrap();
            let key = TableKey {
                round: 0,
                factor: vec![0],
                mechanism: kind,
                bins: vec![],
            };
            let mut idx: Vec<usize> = (0..population_size).collect();
            let (mut sum, mut sq) = (vec![0.0; 4], vec![0.0; 4]);
            let mut last = None;
            for _ in 0..trials {
                for i in 0..n {
                    let j = rng.random_range(i..population_size);
                    idx.swap(i, j);
                }
                let mut stats = SufficientStatistics::new(&mech);
                for &u in &idx[..n] {
                    let r = mech.randomize(&[people[u]], &mut rng).unwrap();
                    mech.accumulate(&r, &mut stats).unwrap();
                }
                let tables: Tables = [(key.clone(), stats)].into_iter().collect();
                let ms = Measurements::filtered_in(
                    &|k: &TableKey, d: &[usize]| Mechanism::new(k.mechanism, eps(2.0), d),
                    &space,
                    &tables,
                    |_| true,
                )
                .unwrap();
                let m = ms.items()[0].clone();
                assert_eq!(m.key.bins, Vec::<Vec<u32>>::new());
                assert_eq!(m.refined.as_ref().unwrap().frequencies.len(), 12);
                let est = m.marginalized(&[0]);
                for c in 0..4 {
                    sum[c] += est[c];
                    sq[c] += est[c] * est[c];
                }
                last = Some(m);
            }
            let t = trials as f64;
            let predicted = last
                .unwrap()
                .cell_variances(&[0], &truth, population_size as u64);
            for c in 0..4 {
                let simulated = (sq[c] - sum[c] * sum[c] / t) / (t - 1.0);
                let mean = sum[c] / t;
                assert!(
                    (mean - truth[c]).abs() < 4.0 * (simulated / t).sqrt(),
                    "{kind} bias"
                );
                let r = predicted[c] / simulated;
                assert!(
                    (r - 1.0).abs() < 0.10,
                    "{kind} bin {c}: {predicted:?} vs {simulated}"
                );
            }
        }
    }

    /// One variance model: the variance of a 1-way obtained by summing a pair table, and of a
    /// direct 1-way table, equal the variance simulated over both randomness sources (which
    /// users of a fixed population report, and their coins) within 10%; so the weights
    /// (inverse predicted variances) of a direct and a summed table agree with their
    /// simulated inverse variances.
    #[test]
    fn variance_model_matches_simulation() {
        let dims = [3usize, 4];
        let population_size = 4000usize;
        let (n, trials) = (400usize, 3000usize);
        // A fixed population with a dependent pair.
        let mut rng = ChaCha12Rng::seed_from_u64(17);
        let people: Vec<[u32; 2]> = (0..population_size)
            .map(|_| {
                let a = rng.random_range(0..3u32);
                let b = if rng.random_bool(0.6) {
                    a
                } else {
                    rng.random_range(0..4u32)
                };
                [a, b]
            })
            .collect();
        let mut truth = vec![0.0; 4];
        people
            .iter()
            .for_each(|p| truth[p[1] as usize] += 1.0 / population_size as f64);
        let simulate =
            |kind: MechanismKind, factor: Vec<usize>, eps_v: f64| -> (Vec<f64>, Vec<f64>) {
                let fdims: Vec<usize> = factor.iter().map(|&a| dims[a]).collect();
                let mech = Mechanism::new(kind, eps(eps_v), &fdims).unwrap();
                let mut rng = ChaCha12Rng::seed_from_u64(kind as u64 * 7 + factor.len() as u64);
                let mut idx: Vec<usize> = (0..population_size).collect();
                let (mut sum, mut sq) = (vec![0.0; 4], vec![0.0; 4]);
                let mut last = None;
                for _ in 0..trials {
                    // n users without replacement.
                    for i in 0..n {
                        let j = rng.random_range(i..population_size);
                        idx.swap(i, j);
                    }
                    let mut stats = SufficientStatistics::new(&mech);
                    for &u in &idx[..n] {
                        let codes: Vec<u32> = factor.iter().map(|&a| people[u][a]).collect();
                        let p = mech.randomize(&codes, &mut rng).unwrap();
                        mech.accumulate(&p, &mut stats).unwrap();
                    }
                    let m = Measurement {
                        key: TableKey {
                            round: 0,
                            factor: factor.clone(),
                            mechanism: kind,
                            bins: vec![],
                        },
                        dims: fdims.clone(),
                        mechanism: mech.clone(),
                        estimate: mech.estimate(&stats).unwrap(),
                        refined: None,
                    };
                    let est = m.marginalized(&[1]);
                    for c in 0..4 {
                        sum[c] += est[c];
                        sq[c] += est[c] * est[c];
                    }
                    last = Some(m);
                }
                let t = trials as f64;
                let simulated: Vec<f64> = (0..4)
                    .map(|c| (sq[c] - sum[c] * sum[c] / t) / (t - 1.0))
                    .collect();
                let predicted = last
                    .unwrap()
                    .cell_variances(&[1], &truth, population_size as u64);
                (simulated, predicted)
            };
        let mut ratios = Vec::new();
        for (kind, factor, e) in [
            (MechanismKind::Grr, vec![0, 1], 2.0),
            (MechanismKind::Oue, vec![0, 1], 2.0),
            (MechanismKind::GrrPair, vec![0, 1], 2.0),
            (MechanismKind::Grr, vec![1], 2.0),
            (MechanismKind::Oue, vec![1], 2.0),
        ] {
            let (sim, pred) = simulate(kind, factor.clone(), e);
            for c in 0..4 {
                let r = pred[c] / sim[c];
                assert!(
                    (r - 1.0).abs() < 0.10,
                    "{kind} {factor:?} cell {c}: predicted {} simulated {}",
                    pred[c],
                    sim[c]
                );
            }
            ratios.push((kind, factor.len(), sim, pred));
        }
        // Weights: direct GRR 1-way vs the GRR pair summed to it.
        let (summed, direct) = (&ratios[0], &ratios[3]);
        for c in 0..4 {
            let predicted = direct.3[c] / summed.3[c];
            let simulated = direct.2[c] / summed.2[c];
            assert!(
                (predicted / simulated - 1.0).abs() < 0.15,
                "cell {c}: {predicted} vs {simulated}"
            );
        }
    }
}
