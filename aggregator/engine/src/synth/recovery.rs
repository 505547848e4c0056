//! Working bins → schema codes: how a row's working bin of a `bins: "auto"` attribute
//! becomes a code, from the finer 1-ways measured (sub-bins) or, without them, the frequency
//! polygon of the bins (VertiMRF §6.1).

use crate::domain::space::{POINT_MASS_Z, Space, cell_range};
use crate::measure::tables::Measurements;
use crate::numeric::index::{coarsen_map, outer};

/// How a synthetic row's working bin becomes a schema code ([`crate::domain::space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expansion {
    /// In proportion to the attribute's 1-way estimated on its codes (VertiMRF §6.1's
    /// histogram recovery); uniform within a bin where there is none or it has no mass.
    #[default]
    Recover,
    /// Uniform over the bin's codes.
    Uniform,
    /// The bin's middle code.
    Midpoint,
}

/// Working bins → schema codes, for synthesis and marginals of a model fitted in a working
/// space that is not the identity ([`crate::domain::space`]).
#[derive(Debug, Clone)]
pub struct Recovery {
    pub(crate) space: Space,
    /// Per attribute with working bins, the probability of each code within its bin (each
    /// bin sums to 1), from [`Measurements::sub_bin_distribution`] shrunk towards the
    /// frequency polygon of the working bins ([`frequency_polygon`]) after being made
    /// consistent with the bin's mass ([`consistent_with`]), a point mass found in it
    /// keeping its share ([`within_bin_shape_with_points`]); the polygon alone where no
    /// sub-bins were measured.
    pub(crate) within: Vec<Option<Vec<f64>>>,
}

impl Recovery {
    /// The recovery of `space` from the sub-bin 1-ways in `ms` (measurements in that space);
    /// `None` for the identity space.
    pub fn new(space: &Space, ms: &Measurements) -> Option<Self> {
        if space.is_identity() {
            return None;
        }
        let within = (0..space.dims().len())
            .map(|a| {
                if space.cuts(a).is_empty() {
                    return None;
                }
                let k = space.code_dims()[a];
                // The polygon within each bin unless sub-bins were measured.
                let measured = ms.combined_at(&[a], |_| true, None).map(|c| c.frequencies);
                let ones = vec![1.0; space.dims()[a]];
                let prior = frequency_polygon(space, a, measured.as_deref().unwrap_or(&ones));
                let mut w = prior.clone();
                if let Some((cuts, f, se)) = ms.sub_bin_distribution(a) {
                    let cell_of = |c: u32| ldpsyn::factor::bin_of(c, &cuts) as usize;
                    let cell_size = |i: usize| cell_range(&cuts, k, i).len() as u32;
                    // Point masses the pooled sub-bins resolve though round 0's did not
                    // (the same test, on every round's reports).
                    let points: Vec<usize> = space
                        .point_masses(a, &cuts, &f, &se)
                        .iter()
                        .map(|r| cell_of(r.start))
                        .collect();
                    for bin in 0..space.dims()[a] {
                        // The bin's estimated mass (NaN: none, and nothing is adjusted to it).
                        let mass = measured.as_ref().map_or(f64::NAN, |m| m[bin]);
                        let r = space.code_range(a, bin);
                        let cells = cell_of(r.start)..cell_of(r.end - 1) + 1;
                        // The polygon's share of each sub-bin cell of this bin.
                        let mut prior_cells = vec![0.0; cells.len()];
                        for c in r.clone() {
                            prior_cells[cell_of(c) - cells.start] += prior[c as usize];
                        }
                        let local: Vec<usize> = points
                            .iter()
                            .filter(|i| cells.contains(i))
                            .map(|i| i - cells.start)
                            .collect();
                        // The bin's mass pools every report of the attribute: the cells
                        // are made to sum to it before they shape the bin.
                        let x = consistent_with(&f[cells.clone()], &se[cells.clone()], mass);
                        let shape = within_bin_shape_with_points(
                            &x,
                            &se[cells.clone()],
                            &prior_cells,
                            &local,
                            mass,
                        );
                        for c in r {
                            let i = cell_of(c) - cells.start;
                            // Within a cell, the codes as the polygon spreads them.
                            w[c as usize] = if prior_cells[i] > 0.0 {
                                shape[i] * prior[c as usize] / prior_cells[i]
                            } else {
                                shape[i] / f64::from(cell_size(i + cells.start))
                            };
                        }
                    }
                }
                Some(w)
            })
            .collect();
        Some(Self {
            space: space.clone(),
            within,
        })
    }

    /// The code of attribute `a` for working bin `bin`, drawn per `how` with `u ∈ [0, 1)`.
    pub(crate) fn code(&self, a: usize, bin: u32, how: Expansion, u: f64) -> u32 {
        let Some(w) = &self.within[a] else {
            return bin;
        };
        let r = self.space.code_range(a, bin as usize);
        match how {
            Expansion::Midpoint => r.start + (r.end - r.start - 1) / 2,
            Expansion::Uniform => {
                r.start + ((u * f64::from(r.end - r.start)) as u32).min(r.end - r.start - 1)
            }
            Expansion::Recover => {
                let mut acc = 0.0;
                for c in r.clone() {
                    acc += w[c as usize];
                    if u < acc {
                        return c;
                    }
                }
                r.end - 1
            }
        }
    }

    /// A marginal over working bins (row-major over `attrs`) spread over schema codes in
    /// proportion to the within-bin probabilities; also used for its standard errors.
    pub(crate) fn expand(&self, attrs: &[usize], working: &[f64]) -> Vec<f64> {
        let code_dims: Vec<usize> = attrs.iter().map(|&a| self.space.code_dims()[a]).collect();
        let cuts: Vec<Vec<u32>> = attrs.iter().map(|&a| self.space.cuts(a).to_vec()).collect();
        let (bin_of_cell, _) = coarsen_map(&code_dims, &cuts);
        // Each code's share of its bin: the product of its attributes' within-bin shares.
        let shares = attrs
            .iter()
            .zip(&code_dims)
            .fold(vec![1.0], |acc, (&a, &k)| {
                outer(&acc, self.within[a].as_deref().unwrap_or(&vec![1.0; k]))
            });
        bin_of_cell
            .iter()
            .zip(&shares)
            .map(|(&bin, &share)| working[bin] * share)
            .collect()
    }
}

/// The shape of a distribution within one working bin from unbiased cell estimates `x`
/// with standard errors `se`, given a prior shape `prior` (the cells' shares of the bin,
/// summing to 1): the cells' deviations from the prior's expectation `e_c = prior_c·Σx`
/// shrunk by the positive-part James–Stein factor `λ = max(0, 1 − E/O)`, with
/// `O = Σ(x_c − e_c)²` the observed squared deviation and `E = (k−1)/k·Σσ_c²` what noise
/// alone would give, then clipped at 0 and normalized. Pure noise gives the prior; a strong
/// peak (weekly hours at 40) survives. The squared deviation shrinks noise harder than the
/// L1 share used before (`benchmarks/sweeps/point-masses.md`: temporal-match2's largest KS
/// at ε = 1 0.161 → 0.101, Adult within ±0.002). Sums to 1.
fn within_bin_shape(x: &[f64], se: &[f64], prior: &[f64]) -> Vec<f64> {
    let k = x.len() as f64;
    let total_x = x.iter().sum::<f64>().max(0.0);
    let expected: Vec<f64> = prior.iter().map(|p| p * total_x).collect();
    let observed: f64 = x.iter().zip(&expected).map(|(v, e)| (v - e).powi(2)).sum();
    let noise = (k - 1.0) / k * se.iter().map(|s| s * s).sum::<f64>();
    let lambda = if observed > 0.0 {
        (1.0 - noise / observed).max(0.0)
    } else {
        0.0
    };
    let shrunk: Vec<f64> = x
        .iter()
        .zip(&expected)
        .map(|(v, e)| (e + lambda * (v - e)).max(0.0))
        .collect();
    let total: f64 = shrunk.iter().sum();
    if total > 0.0 {
        shrunk.iter().map(|v| v / total).collect()
    } else {
        let p: f64 = prior.iter().sum();
        if p > 0.0 {
            prior.iter().map(|v| v / p).collect()
        } else {
            vec![1.0 / k; x.len()]
        }
    }
}

/// [`within_bin_shape`] for a bin holding point masses: cells `points` (indices into `x`)
/// found by [`crate::domain::space::Space::point_masses`] in the bin's unbiased cell estimates `x`,
/// and `bin_mass` the bin's estimated mass. Each point mass takes its estimated share of the
/// bin, `x_p / bin_mass` (at most 1 for all of them), when it is [`POINT_MASS_Z`] standard
/// errors above what the prior expects of it (`prior_p·Σx`), and the other cells share the rest
/// by [`within_bin_shape`] over them. Why: the shrinkage towards a smooth prior weighs a
/// spike against the noise of the whole bin, and a spike of most of the bin (temporal-match2's
/// DEPARTS, 45% of the people at 0 in a bin of 6 codes at ε = 1) came back at a third of
/// its height, the rest smeared over codes that hold almost nobody. Without points, or
/// without a positive `bin_mass`, it is [`within_bin_shape`]. Sums to 1.
fn within_bin_shape_with_points(
    x: &[f64],
    se: &[f64],
    prior: &[f64],
    points: &[usize],
    bin_mass: f64,
) -> Vec<f64> {
    // Only a spike the smooth prior cannot hold: a heavy cell of a smooth density (a common
    // age among its neighbours) keeps the shrinkage's precision.
    let total_x: f64 = x.iter().sum::<f64>().max(0.0);
    let points: Vec<usize> = points
        .iter()
        .copied()
        .filter(|&p| x[p] - prior[p] * total_x >= POINT_MASS_Z * se[p])
        .collect();
    if points.is_empty() || bin_mass <= 0.0 || !bin_mass.is_finite() {
        return within_bin_shape(x, se, prior);
    }
    let mut shape = vec![0.0; x.len()];
    let mut taken = 0.0;
    for &p in &points {
        shape[p] = (x[p] / bin_mass).clamp(0.0, 1.0);
        taken += shape[p];
    }
    let rest: Vec<usize> = (0..x.len()).filter(|i| !points.contains(i)).collect();
    if taken <= 0.0 {
        return within_bin_shape(x, se, prior);
    }
    if taken >= 1.0 || rest.is_empty() {
        return shape.iter().map(|v| v / taken).collect();
    }
    let pick = |v: &[f64]| rest.iter().map(|&i| v[i]).collect::<Vec<f64>>();
    let prior_rest = pick(prior);
    let prior_sum: f64 = prior_rest.iter().sum();
    let prior_rest: Vec<f64> = if prior_sum > 0.0 {
        prior_rest.iter().map(|v| v / prior_sum).collect()
    } else {
        vec![1.0 / rest.len() as f64; rest.len()]
    };
    let others = within_bin_shape(&pick(x), &pick(se), &prior_rest);
    for (&i, v) in rest.iter().zip(others) {
        shape[i] = (1.0 - taken) * v;
    }
    shape
}

/// Unbiased cell estimates `x` of one working bin (standard errors `se`) made consistent
/// with `total`, an estimate of their sum far more precise than `Σx` (the bin's mass, which
/// pools the working-bin reports with the sub-bin ones): the least-squares correction
/// `x_c + (total − Σx)·σ_c²/Σσ²` (Hay et al., PVLDB 2010, "Boosting the accuracy of
/// differentially private histograms through consistency", §3, with the parent taken as
/// exact). A bin of n sub-cells sums n cells of noise, so its raw `Σx` is off by √n of them
/// and the shrinkage would read that as shape. `x` unchanged when `total` is not positive
/// (or NaN: no estimate of the bin).
fn consistent_with(x: &[f64], se: &[f64], total: f64) -> Vec<f64> {
    let var: f64 = se.iter().map(|s| s * s).sum();
    if total.is_nan() || total <= 0.0 || var.is_nan() || var <= 0.0 {
        return x.to_vec();
    }
    let gap = total - x.iter().sum::<f64>();
    x.iter()
        .zip(se)
        .map(|(v, s)| v + gap * s * s / var)
        .collect()
}

/// The frequency polygon of attribute `a`'s working bins (VertiMRF §6.1's recovery when
/// nothing finer was measured): each code's share of its bin, from the density
/// `max(0, m_b)/width_b` of the bins' masses `bins` interpolated linearly between bin
/// centres over the ordered grid ([`Space::grid_cells`]; flat beyond the outer centres).
/// Bins past the grid (point masses, "missing") hold one code each, share 1. A smooth
/// density is then not drawn as steps at the bin edges.
fn frequency_polygon(space: &Space, a: usize, bins: &[f64]) -> Vec<f64> {
    let k = space.code_dims()[a];
    let grid = space.grid_cells(a) as u32;
    let ordered: Vec<(f64, f64)> = (0..bins.len())
        .map(|b| (b, space.code_range(a, b)))
        .filter(|(_, r)| r.end <= grid)
        .map(|(b, r)| {
            let width = f64::from(r.end - r.start);
            (f64::from(r.start + r.end) / 2.0, bins[b].max(0.0) / width)
        })
        .collect();
    let density = |x: f64| -> f64 {
        let i = ordered.partition_point(|&(centre, _)| centre <= x);
        match (i.checked_sub(1).map(|j| ordered[j]), ordered.get(i)) {
            (Some((x0, d0)), Some(&(x1, d1))) => d0 + (d1 - d0) * (x - x0) / (x1 - x0),
            (Some((_, d)), None) | (None, Some(&(_, d))) => d,
            (None, None) => 1.0,
        }
    };
    let mut w = vec![0.0; k];
    for b in 0..space.dims()[a] {
        let r = space.code_range(a, b);
        let raw: Vec<f64> = r.clone().map(|c| density(f64::from(c) + 0.5)).collect();
        let total: f64 = raw.iter().sum();
        for (c, v) in r.clone().zip(&raw) {
            w[c as usize] = if total > 0.0 {
                v / total
            } else {
                1.0 / raw.len() as f64
            };
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::{
        consistent_with, frequency_polygon, within_bin_shape, within_bin_shape_with_points,
    };
    use crate::domain::space::Space;

    /// The polygon spreads a bin's codes along the line between its neighbours' densities,
    /// is flat at the outer bins, and leaves a bin past the grid (a point mass) whole.
    #[test]
    fn frequency_polygon_interpolates_between_bin_centres() {
        // 12 codes: grid bins [0,4) [4,8) [8,11), then code 11 (a point mass) alone.
        let mut space = Space::new(vec![12], vec![vec![4, 8, 11]]).unwrap();
        space.set_grid_cells(0, 11);
        let w = frequency_polygon(&space, 0, &[0.1, 0.3, 0.3, 0.3]);
        for bin in [0..4, 4..8, 8..11] {
            let s: f64 = w[bin].iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
        assert_eq!(w[11], 1.0);
        // Rising from bin 0 to bin 1: inside bin 1 the left codes (towards bin 0's lower
        // density) weigh less than the right ones; bin 0 is flat left of its centre.
        assert!(w[4] < w[5] && w[5] < w[6]);
        assert!((w[0] - w[1]).abs() < 1e-12 && w[2] < w[3]);
        // Equal densities: uniform.
        let w = frequency_polygon(&space, 0, &[0.4, 0.4, 0.3, 0.2]);
        assert!(w[..4].iter().all(|&x| (x - 0.25).abs() < 1e-12), "{w:?}");
    }

    #[test]
    fn within_bin_shape_keeps_signal_and_drops_noise() {
        let uniform = [0.25; 4];
        // Deviations well inside the noise: the prior.
        let s = within_bin_shape(&[0.010, 0.013, 0.008, 0.009], &[0.01; 4], &uniform);
        assert!(s.iter().all(|&x| (x - 0.25).abs() < 1e-12), "{s:?}");
        let sloped = [0.1, 0.2, 0.3, 0.4];
        let s = within_bin_shape(&[0.010, 0.013, 0.008, 0.009], &[0.01; 4], &sloped);
        assert!(
            s.iter().zip(sloped).all(|(x, p)| (x - p).abs() < 1e-12),
            "{s:?}"
        );
        // A peak far above the noise keeps most of its height whatever the prior.
        for prior in [uniform, sloped] {
            let s = within_bin_shape(&[0.30, 0.01, 0.02, 0.0], &[0.005; 4], &prior);
            assert!(
                s[0] > 0.85 && (s.iter().sum::<f64>() - 1.0).abs() < 1e-12,
                "{s:?}"
            );
        }
        // A bin with no estimated mass: the prior.
        let s = within_bin_shape(&[-0.01, -0.02], &[0.01; 2], &[0.5, 0.5]);
        assert_eq!(s, vec![0.5, 0.5]);
    }

    /// The cells move to the bin's mass in proportion to their variances, and sum to it.
    #[test]
    fn consistent_cells_sum_to_the_bins_mass() {
        let x = consistent_with(&[0.878, 0.285], &[0.08, 0.08], 0.994);
        assert!(
            (x[0] - 0.7935).abs() < 1e-12 && (x[1] - 0.2005).abs() < 1e-12,
            "{x:?}"
        );
        let x = consistent_with(&[0.3, 0.1, 0.2], &[0.1, 0.2, 0.0], 0.5);
        // Gap −0.1 split 1:4:0 by variance.
        let want = [0.28, 0.02, 0.2];
        assert!(
            x.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{x:?}"
        );
        assert_eq!(
            consistent_with(&[0.3, 0.1], &[0.1, 0.1], 0.0),
            vec![0.3, 0.1]
        );
        assert_eq!(
            consistent_with(&[0.3, 0.1], &[0.0, 0.0], 0.5),
            vec![0.3, 0.1]
        );
    }

    /// A point mass holding most of a bin keeps its estimated share; the shrinkage alone
    /// gives it a fraction (temporal-match2's DEPARTS at ε = 1: 45% of the people at code 0,
    /// its bin of 6 codes measured at a standard error of 0.06 per code). A heavy cell the
    /// smooth prior expects, and a bin without points, are left to the shrinkage.
    #[test]
    fn point_masses_keep_their_share_of_a_bin() {
        let x = [0.445, 0.091, -0.031, 0.016, 0.091, 0.025];
        let se = [0.068, 0.063, 0.063, 0.063, 0.063, 0.063];
        let prior = [0.174, 0.174, 0.174, 0.169, 0.159, 0.150];
        let shrunk = within_bin_shape(&x, &se, &prior);
        assert!(shrunk[0] < 0.7, "{shrunk:?}");
        let s = within_bin_shape_with_points(&x, &se, &prior, &[0], 0.474);
        assert!((s[0] - 0.445 / 0.474).abs() < 1e-12, "{s:?}");
        assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{s:?}");
        assert!(s.iter().all(|&v| v >= 0.0), "{s:?}");
        // The other cells share the rest as the shrinkage shapes them.
        let rest = within_bin_shape(&x[1..], &se[1..], &{
            let p: f64 = prior[1..].iter().sum();
            prior[1..].iter().map(|v| v / p).collect::<Vec<_>>()
        });
        for (a, b) in s[1..].iter().zip(&rest) {
            assert!((a - (1.0 - s[0]) * b).abs() < 1e-12, "{s:?}");
        }
        // A point mass estimated above the bin's mass takes the whole bin.
        let s = within_bin_shape_with_points(&x, &se, &prior, &[0], 0.40);
        assert_eq!(s[0], 1.0);
        // No points, no bin mass, or a heavy cell within the prior's reach: the shrinkage.
        assert_eq!(
            within_bin_shape_with_points(&x, &se, &prior, &[], 0.474),
            shrunk
        );
        assert_eq!(
            within_bin_shape_with_points(&x, &se, &prior, &[0], 0.0),
            shrunk
        );
        let smooth = [0.20, 0.21, 0.19];
        let flat = [1.0 / 3.0; 3];
        assert_eq!(
            within_bin_shape_with_points(&smooth, &[0.005; 3], &flat, &[1], 0.6),
            within_bin_shape(&smooth, &[0.005; 3], &flat)
        );
    }
}
