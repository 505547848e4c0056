//! SamPrivSyn (Sci China Inf Sci 2023): final pair estimates (eq. 7: Kronecker inverse, or
//! LASSO), 1-way marginals by eq. 11, and data generation (Algorithm 2): one-way updating of
//! a random table, then the value swaps of eq. 12 that move a pair's counts toward its
//! estimate while keeping both 1-way marginals fixed.

use std::collections::BTreeMap;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::{Mechanism, MechanismKind, Oracle, norm_sub};
use linfa::prelude::*;
use linfa_elasticnet::ElasticNet;
use ndarray::{Array1, Array2};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

use crate::EngineError;
use crate::fit::joint::FittedJoint;
use crate::numeric::info::mutual_information;

/// The SamPrivSyn model: Norm-Sub'd pair tables, their MI, and eq. 11's 1-ways.
#[derive(Debug, Clone)]
pub struct SamPrivSynModel {
    dims: Vec<usize>,
    /// `(a, b) → (joint a×b row-major, MI)` for every pair with reports.
    pairs: BTreeMap<(usize, usize), (Vec<f64>, f64)>,
    one_way: Vec<Vec<f64>>,
}

/// Pair distribution by LASSO (eq. 7 of SamPrivSyn): minimize
/// `‖Q p − m‖² / (2·cells) + λ‖p‖₁` over the true cells `p`, with `Q = Q₁ ⊗ Q₂` the
/// perturbation matrix and `m` the observed output distribution; Norm-Sub'd.
/// Errors: the fit fails (reported as [`EngineError::Estimation`]).
pub fn lasso_pair(
    mechanism: &Mechanism,
    counts: &[u64],
    n: u64,
    lambda: f64,
) -> Result<Vec<f64>, EngineError> {
    let Oracle::GrrPair(pg) = mechanism.oracle() else {
        return Err(EngineError::Estimation(
            "LASSO needs a pair-GRR table".into(),
        ));
    };
    let (k1, k2) = (pg.first().domain_size(), pg.second().domain_size());
    let cells = k1 * k2;
    let (p1, q1, p2, q2) = (
        pg.first().p(),
        pg.first().q(),
        pg.second().p(),
        pg.second().q(),
    );
    let mut q = Array2::<f64>::zeros((cells, cells));
    for out in 0..cells {
        for truth in 0..cells {
            let a = if out / k2 == truth / k2 { p1 } else { q1 };
            let b = if out % k2 == truth % k2 { p2 } else { q2 };
            q[(out, truth)] = a * b;
        }
    }
    let m = Array1::from_iter(counts.iter().map(|&c| c as f64 / n.max(1) as f64));
    let data = Dataset::new(q, m);
    let fit = ElasticNet::<f64>::lasso()
        .penalty(lambda)
        .with_intercept(false)
        .max_iterations(2000)
        .tolerance(1e-8)
        .fit(&data)
        .map_err(|e| EngineError::Estimation(format!("LASSO: {e}")))?;
    Ok(norm_sub(&fit.hyperplane().to_vec()))
}

/// The SamPrivSyn model from the measurements: pair distributions by the Kronecker inverse
/// (or LASSO with penalty `lasso`, eq. 7), 1-way marginals by eq. 11, for eq. 12 synthesis.
/// Errors: a LASSO fit that fails.
pub(crate) fn build_model(
    epsilon: Epsilon,
    source: &FittedJoint,
    lambda: f64,
) -> Result<SamPrivSynModel, EngineError> {
    let ms = source.measurements();
    let dims = source.measurements().domain_sizes().to_vec();
    let d = dims.len();
    let mut pairs = BTreeMap::new();
    let mut unbiased: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for a in 0..d {
        for b in a + 1..d {
            let is_pair = |k: &crate::domain::key::TableKey| {
                k.mechanism == MechanismKind::GrrPair && k.factor.len() == 2
            };
            let Some(c) = ms.combined_where(&[a, b], is_pair) else {
                continue;
            };
            // LASSO on the output distribution implied by the pooled unbiased estimate (its
            // forward image equals the pooled observed distribution).
            let mech = Mechanism::new(MechanismKind::GrrPair, epsilon, &[dims[a], dims[b]])?;
            let forward = forward_image(&mech, &c.frequencies);
            let total = c.reports;
            let counts: Vec<u64> = forward
                .iter()
                .map(|&v| (v.max(0.0) * total as f64).round() as u64)
                .collect();
            let joint = lasso_pair(&mech, &counts, total, lambda)?;
            let mi = mutual_information(&joint, dims[a], dims[b]);
            // Eq. 11 uses the unbiased (Kronecker-inverse) pair estimate: marginalizing a
            // Norm-Sub'd table would carry Norm-Sub's bias into the 1-way.
            unbiased.insert((a, b), c.frequencies.clone());
            pairs.insert((a, b), (joint, mi));
        }
    }
    // Eq. 11: P̂(A_i) = Σ_j I(A_i, A_j)/Σ_j' I(A_i, A_j') · P̂(A_i, A_j) marginalized to A_i
    // (a small floor keeps the weights defined when every MI is 0).
    let mut one_way = Vec::with_capacity(d);
    for i in 0..d {
        let mut acc = vec![0.0; dims[i]];
        let mut wsum = 0.0;
        for (&(a, b), (_, mi)) in &pairs {
            if a != i && b != i {
                continue;
            }
            let joint = &unbiased[&(a, b)];
            let w = mi + 1e-9;
            wsum += w;
            for (v, &p) in joint.iter().enumerate() {
                let code = if a == i { v / dims[b] } else { v % dims[b] };
                acc[code] += w * p;
            }
        }
        if wsum > 0.0 {
            acc.iter_mut().for_each(|v| *v /= wsum);
        } else {
            acc = match ms.combined(&[i]) {
                Some(c) => norm_sub(&c.frequencies),
                None => vec![1.0 / dims[i] as f64; dims[i]],
            };
        }
        one_way.push(norm_sub(&acc));
    }
    Ok(SamPrivSynModel {
        dims,
        pairs,
        one_way,
    })
}

/// `(Q₁ ⊗ Q₂) f`: the output distribution a pair-GRR produces from joint `f`.
fn forward_image(mech: &Mechanism, f: &[f64]) -> Vec<f64> {
    let Oracle::GrrPair(pg) = mech.oracle() else {
        return f.to_vec();
    };
    let (k1, k2) = (pg.first().domain_size(), pg.second().domain_size());
    let (p1, q1, p2, q2) = (
        pg.first().p(),
        pg.first().q(),
        pg.second().p(),
        pg.second().q(),
    );
    let mut t = vec![0.0; k1 * k2];
    for a in 0..k1 {
        let s: f64 = f[a * k2..(a + 1) * k2].iter().sum();
        for y in 0..k2 {
            t[a * k2 + y] = q2 * (s - f[a * k2 + y]) + p2 * f[a * k2 + y];
        }
    }
    let mut out = vec![0.0; k1 * k2];
    for y in 0..k2 {
        let s: f64 = (0..k1).map(|a| t[a * k2 + y]).sum();
        for x in 0..k1 {
            out[x * k2 + y] = q1 * (s - t[x * k2 + y]) + p1 * t[x * k2 + y];
        }
    }
    out
}

/// Largest-remainder rounding of `p` (sums to 1) to integer counts summing to `n`.
pub fn round_counts(p: &[f64], n: usize) -> Vec<i64> {
    let raw: Vec<f64> = p.iter().map(|&v| v.max(0.0) * n as f64).collect();
    let mut c: Vec<i64> = raw.iter().map(|v| v.floor() as i64).collect();
    let short = n as i64 - c.iter().sum::<i64>();
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| {
        (raw[b] - raw[b].floor())
            .total_cmp(&(raw[a] - raw[a].floor()))
            .then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(short.max(0) as usize) {
        c[i] += 1;
    }
    c
}

impl SamPrivSynModel {
    /// Domain sizes of the attributes.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// `(a, b, MI)` of every estimated pair.
    pub fn pair_weights(&self) -> Vec<(usize, usize, f64)> {
        self.pairs
            .iter()
            .map(|(&(a, b), (_, mi))| (a, b, *mi))
            .collect()
    }

    /// Algorithm 2 of SamPrivSyn: a random table of `rows × d` codes (row-major), one-way
    /// updated to eq. 11's marginals, then for every pair `(A_i, A_j)`, `i < j` in order,
    /// `A_j` is updated by eq. 12 swaps.
    pub fn synthesize_table(&self, rows: usize, seed: u64) -> Vec<u32> {
        let d = self.dims.len();
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let mut t: Vec<u32> = (0..rows * d)
            .map(|i| rng.random_range(0..self.dims[i % d] as u32))
            .collect();
        if rows == 0 {
            return t;
        }
        for a in 0..d {
            one_way_update(&mut t, d, a, &round_counts(&self.one_way[a], rows));
        }
        for (&(a, b), (joint, _)) in &self.pairs {
            two_way_update(&mut t, d, a, b, self.dims[a], self.dims[b], joint);
        }
        t
    }
}

/// Moves values of attribute `a` from over-counted to under-counted codes (in row order)
/// until its counts equal `target` (which sums to the number of rows).
pub fn one_way_update(t: &mut [u32], d: usize, a: usize, target: &[i64]) {
    let k = target.len();
    let mut cur = vec![0i64; k];
    for row in t.chunks(d) {
        cur[row[a] as usize] += 1;
    }
    let deficit: Vec<usize> = (0..k).filter(|&v| cur[v] < target[v]).collect();
    let mut di = 0;
    for row in t.chunks_mut(d) {
        let v = row[a] as usize;
        if cur[v] > target[v] {
            while di < deficit.len() && cur[deficit[di]] >= target[deficit[di]] {
                di += 1;
            }
            let Some(&w) = deficit.get(di) else { break };
            row[a] = w as u32;
            cur[v] -= 1;
            cur[w] += 1;
        }
    }
}

/// Eq. 12 updating of attribute `b` against the target pair distribution `joint` of
/// `(a, b)`: while there are cells `(p, q)`, `(p1, q1)` over-counted and `(p, q1)`, `(p1, q)`
/// under-counted, swap the `b` values of `min_fre` records of `(p, q)` and `(p1, q1)`
/// (`min_fre` = the smallest of the four deviations, eq. 12). Each swap leaves the counts of
/// `a` and of `b` exactly unchanged.
pub fn two_way_update(
    t: &mut [u32],
    d: usize,
    a: usize,
    b: usize,
    ka: usize,
    kb: usize,
    joint: &[f64],
) {
    let rows = t.len() / d;
    let target: Vec<f64> = joint.iter().map(|&p| p * rows as f64).collect();
    let mut buckets: Vec<Vec<usize>> = vec![Vec::new(); ka * kb];
    for (r, row) in t.chunks(d).enumerate() {
        buckets[row[a] as usize * kb + row[b] as usize].push(r);
    }
    let count = |buckets: &Vec<Vec<usize>>, c: usize| buckets[c].len() as f64;
    // Bounded number of passes; each swap strictly reduces Σ|C − P̂| by 4·min_fre ≥ 4.
    for _ in 0..(ka * kb * 4).max(64) {
        let diff: Vec<f64> = (0..ka * kb)
            .map(|c| count(&buckets, c) - target[c])
            .collect();
        // Over-counted cells from the most over-counted down; for the first that has a
        // partner, the partner (p1, q1) maximizing min_fre (eq. 12). O(cells) per candidate.
        let mut over: Vec<usize> = (0..ka * kb).filter(|&c| diff[c] >= 1.0).collect();
        over.sort_by(|&x, &y| diff[y].total_cmp(&diff[x]).then(x.cmp(&y)));
        let mut best: Option<(f64, usize, usize, usize, usize)> = None;
        for &c in &over {
            let (p, q) = (c / kb, c % kb);
            for p1 in (0..ka).filter(|&p1| p1 != p) {
                if -diff[p1 * kb + q] < 1.0 {
                    continue;
                }
                for q1 in (0..kb).filter(|&q1| q1 != q) {
                    let m = diff[c]
                        .min(diff[p1 * kb + q1])
                        .min(-diff[p * kb + q1])
                        .min(-diff[p1 * kb + q]);
                    if m >= 1.0 && best.is_none_or(|bst| m > bst.0) {
                        best = Some((m, p, q, p1, q1));
                    }
                }
            }
            if best.is_some() {
                break;
            }
        }
        let Some((m, p, q, p1, q1)) = best else { break };
        let moves = m.floor() as usize;
        for _ in 0..moves {
            // One record of (p, q) gets b = q1; one of (p1, q1) gets b = q.
            let (Some(r1), Some(r2)) = (buckets[p * kb + q].pop(), buckets[p1 * kb + q1].pop())
            else {
                break;
            };
            t[r1 * d + b] = q1 as u32;
            t[r2 * d + b] = q as u32;
            buckets[p * kb + q1].push(r1);
            buckets[p1 * kb + q].push(r2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(t: &[u32], d: usize, a: usize, k: usize) -> Vec<usize> {
        let mut c = vec![0; k];
        for row in t.chunks(d) {
            c[row[a] as usize] += 1;
        }
        c
    }

    /// Eq. 12 swaps leave both 1-way marginals exactly unchanged and move the pair toward
    /// its target.
    #[test]
    fn eq12_swaps_keep_one_ways() {
        let (d, rows) = (3usize, 5000usize);
        let mut rng = ChaCha12Rng::seed_from_u64(3);
        let mut t: Vec<u32> = (0..rows * d)
            .map(|i| rng.random_range(0..[3u32, 4, 2][i % d]))
            .collect();
        let before_a = counts(&t, d, 0, 3);
        let before_b = counts(&t, d, 1, 4);
        let before_c = counts(&t, d, 2, 2);
        // Target: strong dependence a → b.
        let mut joint = vec![0.02; 12];
        for v in 0..3 {
            joint[v * 4 + v] = 0.2;
        }
        let s: f64 = joint.iter().sum();
        joint.iter_mut().for_each(|v| *v /= s);
        let tvd = |t: &[u32]| {
            let mut c = [0.0; 12];
            for row in t.chunks(d) {
                c[row[0] as usize * 4 + row[1] as usize] += 1.0 / rows as f64;
            }
            c.iter()
                .zip(&joint)
                .map(|(x, y)| (x - y).abs())
                .sum::<f64>()
                / 2.0
        };
        let t0 = tvd(&t);
        two_way_update(&mut t, d, 0, 1, 3, 4, &joint);
        assert_eq!(counts(&t, d, 0, 3), before_a);
        assert_eq!(counts(&t, d, 1, 4), before_b);
        assert_eq!(counts(&t, d, 2, 2), before_c);
        assert!(tvd(&t) < t0 / 2.0, "{} vs {t0}", tvd(&t));
    }

    #[test]
    fn one_way_update_hits_targets() {
        let (d, rows) = (2usize, 1000usize);
        let mut rng = ChaCha12Rng::seed_from_u64(4);
        let mut t: Vec<u32> = (0..rows * d).map(|_| rng.random_range(0..4)).collect();
        let target = round_counts(&[0.1, 0.2, 0.3, 0.4], rows);
        assert_eq!(target.iter().sum::<i64>(), rows as i64);
        one_way_update(&mut t, d, 1, &target);
        let c = counts(&t, d, 1, 4);
        assert_eq!(c.iter().map(|&x| x as i64).collect::<Vec<_>>(), target);
    }
}
