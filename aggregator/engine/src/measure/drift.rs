//! Arrival drift: the rounds of a collection as strata of its population.
//!
//! Each person reports once per collection, in the round during which they arrive, so a
//! round measures the people who arrived during it. When the order of arrival correlates
//! with the data (a collection over days, time zones or campaigns; a file sorted by date or
//! group), rounds measure different sub-populations: `auto`'s round 0 measures the first
//! people's 1-ways, its screening and phase 2 the later people's pairs, and a fit that treats
//! them as measurements of one distribution can agree with none of them.
//!
//! The population is the mixture `P = Σ_r w_r P_r` of the rounds' people, `w_r` the share of
//! the reports in round `r` (one report per person and round). [`post_stratify`] estimates
//! each measured marginal of `P` by post-stratification on the rounds:
//! 1. per attribute `a` and round `r`, the round's 1-way `y_r(a)` from every table of the
//!    round that holds `a` at working resolution (inverse-variance combined,
//!    [`Measurements::combined_binned`]), with per-cell variances `v_r`;
//! 2. the heterogeneity of the rounds' 1-ways: Cochran's `Q = Σ_r Σ_c (y_rc − ȳ_c)²/v_rc`
//!    over the cells but the heaviest (a round's cells sum to one) on `(R − 1)(C − 1)`
//!    degrees of freedom (ȳ the inverse-variance pooled 1-way), and the
//!    DerSimonian–Laird between-round variance (DerSimonian & Laird, "Meta-analysis in
//!    clinical trials", Controlled Clinical Trials 7(3), 1986, eq. 8, summed over the
//!    cells). Nothing is corrected unless some attribute's test rejects at
//!    [`DRIFT_TEST_LEVEL`] (Bonferroni over the attributes): a correction of noise would only
//!    add noise. Once one does, every attribute is post-stratified, each round's shrinkage
//!    deciding how much of its deviation is noise (on UCI bank in file order, correcting
//!    only the attributes that pass the test left `auto` 0.059 / 0.053 at ε = 4 / 8,
//!    correcting all gave 0.054 / 0.042; `independence` 0.055 / 0.047);
//! 3. each round's 1-way shrunk by its noise, `P̃_r` (`shrunk`: the best linear predictor of
//!    the random-effects model, with a between-round variance proportional to each cell's
//!    `m(1 − m)`, as a Dirichlet–multinomial's, and one scale per attribute estimated from
//!    every round's Q), towards the centre at which the shrunk rounds mixed by their shares
//!    give the centre back (`population_centre`);
//! 4. per group of tables of one factor and bin maps that holds a drifting attribute: the
//!    group's estimate of each round (shrunk likewise), and for a round that did not measure
//!    the group, its pooled table with the margins moved by `P̃_r − P̃_measured` (iterative
//!    proportional fitting, Deming & Stephan, Ann. Math. Statist. 11(4), 1940, which keeps
//!    the table's odds ratios); the population's estimate is their `w_r`-weighted sum, and
//!    each table moves by the population's estimate minus its own round's.
//!
//! Step 4 matters beyond the 1-ways: when the rounds differ, much of the population's
//! dependence lies between them (people of one round all answer no, of another all yes), and
//! a table of one round alone does not show it. The variances the fit gives each table are
//! its own; the stratified estimate's variance is larger where a round is thinly measured.
//! `auto` designs its rounds for this (`protocols::auto`): its screening round gives a slice
//! of its people to 1-ways, and a drift found at the screening close makes phase 2 measure
//! every attribute alone again and, where the predicted error says it pays, repeat the
//! screening design, so that each round holds each 1-way and, from the screening round on,
//! each screened pair.

use std::collections::{BTreeMap, BTreeSet};

use ldpsyn::mechanism::norm_sub;
use serde::{Deserialize, Serialize};

use crate::domain::binned::BinnedFactor;
use crate::measure::tables::Measurements;
use crate::numeric::index::{coarsen, coarsen_map, projection_map};
use crate::numeric::stats::chi2_upper;

/// Level of the between-round heterogeneity test, over all attributes (Bonferroni): below it
/// [`DriftReport::population_changed`] says the rounds measured different populations.
pub const DRIFT_TEST_LEVEL: f64 = 0.001;

/// Most iterations of proportional fitting per table (each adjusts every margin once); it
/// stops earlier when every margin is within [`IPF_TOLERANCE`] of its target.
const IPF_ITERATIONS: usize = 100;

/// Largest absolute error of a margin cell at which proportional fitting stops.
const IPF_TOLERANCE: f64 = 1e-10;

/// One attribute's disagreement between the rounds that measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttributeDrift {
    /// Attribute index.
    pub attribute: usize,
    /// Rounds whose tables hold it at working resolution.
    pub rounds: Vec<u32>,
    /// Cochran's Q of the rounds' 1-ways (module docs, step 2).
    pub q: f64,
    /// Its degrees of freedom, `(rounds − 1)(cells − 1)`.
    pub df: f64,
    /// Upper-tail χ² probability of `q` (Wilson–Hilferty approximation).
    pub p_value: f64,
    /// Between-round variance per cell (frequency²), `0` when the rounds agree within noise.
    pub tau2: f64,
    /// Largest total variation distance between a round's shrunk 1-way and the
    /// population's (the size of the correction, frequencies).
    pub largest_shift: f64,
}

/// What [`post_stratify`] found and did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftReport {
    /// Per round, its share of the reports (the stratum weights `w_r`).
    pub round_weights: Vec<(u32, f64)>,
    /// Per attribute measured in more than one round, most heterogeneous first.
    pub attributes: Vec<AttributeDrift>,
    /// Whether some attribute's rounds disagree beyond noise at [`DRIFT_TEST_LEVEL`] after
    /// the Bonferroni correction over attributes: the population changed between rounds
    /// (the tables were moved to the population's post-stratified estimates).
    pub population_changed: bool,
    /// The test's level over all attributes ([`DRIFT_TEST_LEVEL`]): an attribute differs
    /// beyond noise when its `p_value` times the number of `attributes` is at most this.
    #[serde(default = "drift_test_level")]
    pub level: f64,
}

fn drift_test_level() -> f64 {
    DRIFT_TEST_LEVEL
}

impl DriftReport {
    /// A plain sentence for operators when the population changed, else `None`.
    pub fn warning(&self, names: impl Fn(usize) -> String) -> Option<String> {
        if !self.population_changed {
            return None;
        }
        let worst: Vec<String> = self
            .attributes
            .iter()
            .filter(|a| a.p_value * self.attributes.len() as f64 <= self.level)
            .take(3)
            .map(|a| {
                format!(
                    "{} (moved by up to {:.3})",
                    names(a.attribute),
                    a.largest_shift
                )
            })
            .collect();
        Some(format!(
            "the population changed between rounds: people who arrived in different rounds \
             differ beyond noise in {}; the model treats the rounds as strata of the population \
             (post-stratification)",
            worst.join(", ")
        ))
    }
}

/// Per round, one attribute's shrunk 1-way `P̃_r` (module docs, step 3).
pub type RoundOneWays = BTreeMap<u32, Vec<f64>>;

/// A table group (factor, bin maps) and the round of its tables.
type GroupRound = (Vec<usize>, Vec<Vec<u32>>, u32);

/// Per round: its estimate of one marginal and the per-cell variances.
struct RoundEstimate {
    round: u32,
    estimate: Vec<f64>,
    variances: Vec<f64>,
}

/// The rounds' estimates pooled cell by cell with inverse-variance weights: the pooled
/// estimate, each round's share of the precision (mean over cells), Cochran's Q, its degrees
/// of freedom, the DerSimonian–Laird τ² (module docs, step 2), and the same moment estimate
/// under a between-round variance proportional to `m_c(1 − m_c)` (step 3).
struct Heterogeneity {
    pooled: Vec<f64>,
    shares: Vec<f64>,
    q: f64,
    df: f64,
    tau2: f64,
    /// κ of the mass-proportional between-round variance `τ_c² = κ·m_c(1 − m_c)`.
    kappa: f64,
}

fn heterogeneity(per_round: &[RoundEstimate]) -> Heterogeneity {
    let cells = per_round[0].estimate.len();
    let mut pooled = vec![0.0; cells];
    let mut shares = vec![0.0; per_round.len()];
    let weights: Vec<Vec<f64>> = (0..cells)
        .map(|c| per_round.iter().map(|p| 1.0 / p.variances[c]).collect())
        .collect();
    for (c, (pooled_c, w)) in pooled.iter_mut().zip(&weights).enumerate() {
        let wsum: f64 = w.iter().sum();
        *pooled_c = per_round
            .iter()
            .zip(w)
            .map(|(p, w)| w * p.estimate[c])
            .sum::<f64>()
            / wsum;
        for (sh, w) in shares.iter_mut().zip(w) {
            *sh += w / wsum / cells as f64;
        }
    }
    let (q, s, kappa) = moments(per_round, &pooled);
    let df = ((per_round.len() - 1) * (cells.max(1) - 1)) as f64;
    let tau2 = if s > 0.0 {
        ((q - df) / s).max(0.0)
    } else {
        0.0
    };
    Heterogeneity {
        pooled,
        shares,
        q,
        df,
        tau2,
        kappa,
    }
}

/// Each cell's `m_c(1 − m_c)` at `pooled`: the shape of a Dirichlet–multinomial between-round
/// variance.
fn spread(pooled: &[f64]) -> Vec<f64> {
    pooled
        .iter()
        .map(|m| {
            let m = m.clamp(0.0, 1.0);
            m * (1.0 - m)
        })
        .collect()
}

/// Cochran's Q of the rounds' deviations from `pooled`, its DerSimonian–Laird
/// denominator `S = Σ_c (W_c − Σ_r w_rc²/W_c)`, and κ of the between-round variance
/// `τ_c² = κ·m_c(1 − m_c)` (`m = pooled`) by the same moment:
/// `E[Q] = df + κ·Σ_c m_c(1 − m_c)·S_c` on `df = (R − 1)(C − 1)`.
///
/// A round's cells sum to one, so its deviations from the pooled estimate do too: over all
/// C cells with their own variances the sum counts one deviation twice on a yes/no
/// attribute (Q doubles). Over the C − 1 cells without the heaviest, whose variances are
/// nearly uncorrelated, Q follows χ² on (R − 1)(C − 1) degrees of freedom.
fn moments(per_round: &[RoundEstimate], pooled: &[f64]) -> (f64, f64, f64) {
    let cells = pooled.len();
    let spread = spread(pooled);
    let heaviest = (0..cells)
        .max_by(|&a, &b| pooled[a].total_cmp(&pooled[b]).then(b.cmp(&a)))
        .unwrap_or(0);
    let (mut q, mut s, mut scaled) = (0.0, 0.0, 0.0);
    for c in (0..cells).filter(|&c| c != heaviest || cells == 1) {
        let w: Vec<f64> = per_round.iter().map(|p| 1.0 / p.variances[c]).collect();
        let wsum: f64 = w.iter().sum();
        q += per_round
            .iter()
            .zip(&w)
            .map(|(p, w)| w * (p.estimate[c] - pooled[c]).powi(2))
            .sum::<f64>();
        let sc = wsum - w.iter().map(|w| w * w).sum::<f64>() / wsum;
        s += sc;
        scaled += spread[c] * sc;
    }
    let df = ((per_round.len() - 1) * (cells.max(1) - 1)) as f64;
    let kappa = if scaled > 0.0 {
        ((q - df) / scaled).max(0.0)
    } else {
        0.0
    };
    (q, s, kappa)
}

/// The centre each round's 1-way is shrunk towards: per cell, the rounds' estimates weighted
/// by their shares of the population `w_r` (`weights`) times their precision under the
/// random-effects model, `1/(v_rc + τ_c²)` with `τ_c² = κ·m_c(1 − m_c)` at `pooled`.
///
/// The population's marginal is `Σ_r w_r P_r`. Shrunk towards a centre `m`, the rounds give
/// `Σ_r w_r (m + λ_r (y_r − m))`, which equals `m` exactly when `Σ_r w_r λ_r (y_r − m) = 0`,
/// i.e. at this centre (`λ_r ∝ 1/(v_r + τ²)`): the stratified estimate and the centre agree,
/// a round with little noise counts by its share (as the stratified mean `Σ w_r y_r` when the
/// rounds differ far beyond their noise) and a noisy one barely moves it. The random-effects
/// mean, without `w_r`, weighs rounds nearly alike whatever their size: PrivIncr's six small
/// phase-1 rounds outweighed its phase 2 of half the people
/// (`benchmarks/sweeps/drift-shrinkage.md`, "Centre").
fn population_centre(
    per_round: &[RoundEstimate],
    weights: &[(u32, f64)],
    pooled: &[f64],
    kappa: f64,
) -> Vec<f64> {
    let spread = spread(pooled);
    let share = |round: u32| {
        weights
            .iter()
            .find(|(r, _)| *r == round)
            .map_or(0.0, |(_, w)| *w)
    };
    (0..pooled.len())
        .map(|c| {
            let t = kappa * spread[c];
            let (num, den) = per_round.iter().fold((0.0, 0.0), |(n, d), p| {
                let w = share(p.round) / (p.variances[c] + t);
                (n + w * p.estimate[c], d + w)
            });
            if den > 0.0 { num / den } else { pooled[c] }
        })
        .collect()
}

/// Round `p`'s estimate shrunk towards `prior` by its noise, cell by cell: the best linear
/// predictor of the round's marginal under the random-effects model of the rounds,
/// `prior_c + λ_rc·(y_rc − prior_c)` with `λ_rc = τ_c²/(τ_c² + v_rc)`. A round's deviation
/// is modelled as a Dirichlet–multinomial random effect, whose variance in a cell scales with
/// the cell's mass: `τ_c² = κ·m_c(1 − m_c)` (`m` the prior), `κ` estimated once from every
/// round ([`Heterogeneity::kappa`]). So a round that differs from the others far beyond its
/// noise keeps its estimate, one within its noise takes the prior; where the rounds differ in
/// a few heavy cells, the many light cells (whose LDP noise is as large as a heavy cell's)
/// take the prior; and a round measured by few reports (or through few cells of a large
/// table) cannot keep its noise by the chance that its own deviations exceed their variance,
/// as with a κ estimated per round (on nist-taxi in file order at ε = 4 one seed's phase 2
/// measured `fare` only inside a block and kept a third of a 1-way that was wrong by a total
/// variation of 0.99). The form is closed under merging cells, so one κ serves a marginal's
/// bins too.
fn shrunk(prior: &[f64], p: &RoundEstimate, kappa: f64) -> Vec<f64> {
    prior
        .iter()
        .zip(&p.estimate)
        .zip(&p.variances)
        .map(|((m, y), v)| {
            let mc = m.clamp(0.0, 1.0);
            let tau2 = kappa * mc * (1.0 - mc);
            if tau2 + v > 0.0 {
                m + tau2 / (tau2 + v) * (y - m)
            } else {
                *m
            }
        })
        .collect()
}

/// Per round of `rounds` that measured it, the estimate of `f` (under its bin maps) from every
/// table of the round that holds it under those bin maps (a pair from the round's blocks
/// too), with the variances its cells would have at the rounds' pooled estimate: the
/// distribution all rounds share when they do not differ (the null of the heterogeneity
/// test). At a round's own estimate a rare cell that its noise put at zero gets almost no
/// variance, and Q/df came out 2.2 on the 181 places of temporal-match2's PUMA with
/// shuffled arrivals at ε = 8.
fn round_estimates(
    ms: &Measurements,
    f: BinnedFactor<'_>,
    rounds: impl IntoIterator<Item = u32>,
) -> Vec<RoundEstimate> {
    let Some(all) = ms.combined_binned(f, |_| true, None) else {
        return Vec::new();
    };
    let pooled = norm_sub(&all.frequencies);
    rounds
        .into_iter()
        .filter_map(|r| {
            let c = ms.combined_binned(f, |k| k.round == r, Some(&pooled))?;
            Some(RoundEstimate {
                round: r,
                variances: c.std_errors.iter().map(|s| (s * s).max(1e-12)).collect(),
                estimate: c.frequencies,
            })
        })
        .collect()
}

/// Per round, its share of the reports; per attribute, the rounds' shrunk 1-ways `P̃_r`
/// (module docs, steps 1–3; `None` where the rounds agree or one round measured it) and the
/// heterogeneity report. Deterministic.
pub fn one_way_drift(ms: &Measurements) -> (DriftReport, Vec<Option<RoundOneWays>>) {
    let mut reports: BTreeMap<u32, u64> = BTreeMap::new();
    for m in ms.items() {
        *reports.entry(m.key.round).or_default() += m.estimate.n;
    }
    let total: u64 = reports.values().sum();
    let weights: Vec<(u32, f64)> = reports
        .iter()
        .map(|(&r, &n)| (r, n as f64 / total.max(1) as f64))
        .collect();
    let mut report = DriftReport {
        round_weights: weights.clone(),
        attributes: Vec::new(),
        population_changed: false,
        level: DRIFT_TEST_LEVEL,
    };
    let d = ms.domain_sizes().len();
    let mut one_ways: Vec<Option<RoundOneWays>> = vec![None; d];
    if weights.len() < 2 {
        return (report, one_ways);
    }
    // Step 1–3: per attribute, every round's shrunk 1-way P̃_r (`None`: no drift seen).
    for (a, slot) in one_ways.iter_mut().enumerate() {
        let per_round = round_estimates(
            ms,
            BinnedFactor::full(&[a]),
            weights.iter().map(|&(r, _)| r),
        );
        if per_round.len() < 2 {
            continue;
        }
        let h = heterogeneity(&per_round);
        let centre = population_centre(&per_round, &weights, &h.pooled, h.kappa);
        let tilde: BTreeMap<u32, Vec<f64>> = weights
            .iter()
            .map(|&(r, _)| {
                let est = match per_round.iter().find(|p| p.round == r) {
                    Some(p) => shrunk(&centre, p, h.kappa),
                    None => binned_one_way(ms, a, r, &h.pooled, h.kappa),
                };
                (r, est)
            })
            .collect();
        let mut population = vec![0.0; h.pooled.len()];
        for &(r, w) in &weights {
            for (p, x) in population.iter_mut().zip(&tilde[&r]) {
                *p += w * x;
            }
        }
        let largest_shift = tilde
            .values()
            .map(|t| {
                0.5 * t
                    .iter()
                    .zip(&population)
                    .map(|(x, p)| (x - p).abs())
                    .sum::<f64>()
            })
            .fold(0.0, f64::max);
        report.attributes.push(AttributeDrift {
            attribute: a,
            rounds: per_round.iter().map(|p| p.round).collect(),
            q: h.q,
            df: h.df,
            p_value: chi2_upper(h.q, h.df),
            tau2: h.tau2,
            largest_shift,
        });
        *slot = Some(tilde);
    }
    report.attributes.sort_by(|x, y| {
        x.p_value
            .total_cmp(&y.p_value)
            .then(x.attribute.cmp(&y.attribute))
    });
    let tests = report.attributes.len() as f64;
    report.population_changed = report
        .attributes
        .first()
        .is_some_and(|a| a.p_value * tests <= report.level);
    // Without evidence that the rounds differ nothing is corrected (a correction of noise
    // would only add noise); with it, every attribute is post-stratified, each round's
    // shrinkage deciding how much of its deviation is noise.
    if !report.population_changed {
        one_ways.iter_mut().for_each(|o| *o = None);
    }
    (report, one_ways)
}

/// Round `r`'s 1-way of attribute `a` when no table of the round holds it at working
/// resolution: the pooled 1-way rescaled within the bins of the round's finest binned tables
/// of `a` to the round's (shrunk) estimate of their masses; the pooled 1-way when the round
/// holds no table of `a` at all.
fn binned_one_way(ms: &Measurements, a: usize, r: u32, pooled: &[f64], kappa: f64) -> Vec<f64> {
    let Some(cuts) = ms
        .containing(&[a])
        .filter(|m| m.key.round == r)
        .map(|m| m.key.bins_of(a).to_vec())
        .filter(|c| !c.is_empty())
        .max_by_key(|c| (c.len(), std::cmp::Reverse(c.clone())))
    else {
        return pooled.to_vec();
    };
    let bins = [cuts];
    let Some(round) = round_estimates(ms, BinnedFactor::new(&[a], &bins), [r]).pop() else {
        return pooled.to_vec();
    };
    let coarse = coarsen(pooled, &[pooled.len()], &bins);
    let target: Vec<f64> = shrunk(&coarse, &round, kappa)
        .iter()
        .map(|x| x.max(0.0))
        .collect();
    let (map, _) = coarsen_map(&[pooled.len()], &bins);
    pooled
        .iter()
        .zip(&map)
        .map(|(x, &b)| {
            if coarse[b] > 0.0 {
                x * target[b] / coarse[b]
            } else {
                *x
            }
        })
        .collect()
}

/// Post-stratifies `ms` by round (module docs): the measurements with every table's
/// estimate moved to the population's, and the report. Measurements of a single round come
/// back unchanged. Deterministic.
pub fn post_stratify(ms: Measurements) -> (Measurements, DriftReport) {
    let (report, one_ways) = one_way_drift(&ms);
    let weights = report.round_weights.clone();
    if weights.len() < 2 || one_ways.iter().all(Option::is_none) {
        return (ms, report);
    }
    // Step 4: per table group (factor and bins), the population's estimate.
    type Group = (Vec<usize>, BTreeSet<u32>);
    let mut groups: BTreeMap<(Vec<usize>, Vec<Vec<u32>>), Group> = BTreeMap::new();
    for m in ms.items() {
        groups
            .entry((m.key.factor.clone(), m.key.bins.clone()))
            .or_insert_with(|| (m.dims.clone(), BTreeSet::new()))
            .1
            .insert(m.key.round);
    }
    let mut moves: BTreeMap<GroupRound, Vec<f64>> = BTreeMap::new();
    for ((f, bins), (dims, rounds)) in groups {
        let group = BinnedFactor::new(&f, &bins);
        for (r, delta) in group_moves(&ms, (group, &dims), &rounds, &weights, &one_ways) {
            moves.insert((f.clone(), bins.clone(), r), delta);
        }
    }
    let ms = ms.map_items(|m| {
        let key = (m.key.factor.clone(), m.key.bins.clone(), m.key.round);
        if let Some(delta) = moves.get(&key) {
            for (e, x) in m.estimate.frequencies.iter_mut().zip(delta) {
                *e += x;
            }
        }
    });
    (ms, report)
}

/// Per measured round, the move of the tables of table group `group` (a factor under its bin
/// maps, tables of shape `dims`) of that round from the round's (shrunk) estimate to the
/// population's (module docs, step 4); empty when the group does not move.
fn group_moves(
    ms: &Measurements,
    (group, dims): (BinnedFactor<'_>, &[usize]),
    rounds: &BTreeSet<u32>,
    weights: &[(u32, f64)],
    one_ways: &[Option<BTreeMap<u32, Vec<f64>>>],
) -> Vec<(u32, Vec<f64>)> {
    let f = group.attrs();
    let drifting: Vec<usize> = (0..f.len()).filter(|&i| one_ways[f[i]].is_some()).collect();
    let per_round = round_estimates(ms, group, weights.iter().map(|&(r, _)| r));
    if per_round.is_empty() || drifting.is_empty() {
        return Vec::new();
    }
    let h = heterogeneity(&per_round);
    // The pooled estimate's 1-ways: the measured rounds' P̃ mixed by their precision shares.
    let reference = |a: usize| -> Vec<f64> {
        let tilde = one_ways[a].as_ref().expect("drifting attribute");
        let k = tilde.values().next().map_or(0, Vec::len);
        let mut out = vec![0.0; k];
        for (p, share) in per_round.iter().zip(&h.shares) {
            for (o, x) in out.iter_mut().zip(&tilde[&p.round]) {
                *o += share * x;
            }
        }
        out
    };
    let references: Vec<Option<Vec<f64>>> = (0..f.len())
        .map(|i| drifting.contains(&i).then(|| reference(f[i])))
        .collect();
    let start = norm_sub(&h.pooled);
    // Per round: the pooled table with its margins moved to the round's 1-ways (odds ratios
    // kept), the prior of the round's own estimate.
    let prior = |r: u32| -> Vec<f64> {
        let shifts: Vec<Option<Vec<f64>>> = (0..f.len())
            .map(|i| {
                let reference = references[i].as_ref()?;
                let tilde = &one_ways[f[i]].as_ref()?[&r];
                let s: Vec<f64> = tilde.iter().zip(reference).map(|(t, x)| t - x).collect();
                let cuts = group.cuts(i);
                Some(if cuts.is_empty() {
                    s
                } else {
                    coarsen(&s, &[s.len()], &[cuts.to_vec()])
                })
            })
            .collect();
        let moved = ipf_moved(&start, dims, &shifts);
        h.pooled
            .iter()
            .zip(&moved)
            .zip(&start)
            .map(|((y, m), s)| y + m - s)
            .collect()
    };
    let priors: BTreeMap<u32, Vec<f64>> = weights.iter().map(|&(r, _)| (r, prior(r))).collect();
    let own: BTreeMap<u32, Vec<f64>> = priors
        .into_iter()
        .map(|(r, prior)| {
            let est = match per_round.iter().find(|p| p.round == r) {
                Some(p) => shrunk(&prior, p, h.kappa),
                None => prior,
            };
            (r, est)
        })
        .collect();
    let mut population = vec![0.0; h.pooled.len()];
    for &(r, w) in weights {
        for (p, x) in population.iter_mut().zip(&own[&r]) {
            *p += w * x;
        }
    }
    rounds
        .iter()
        .map(|r| {
            let delta = population.iter().zip(&own[r]).map(|(x, y)| x - y).collect();
            (*r, delta)
        })
        .collect()
}
/// `start` (a distribution over the product domain `dims`, row-major) fitted by iterative
/// proportional fitting to its own margins moved by `shifts` (per factor position; `None`:
/// that margin is free). Targets are clipped at zero and renormalized; a floor lets cells
/// the projection zeroed take the mass the new margins need.
fn ipf_moved(start: &[f64], dims: &[usize], shifts: &[Option<Vec<f64>>]) -> Vec<f64> {
    let positions: Vec<usize> = (0..dims.len()).collect();
    let maps: Vec<Vec<usize>> = positions
        .iter()
        .map(|&i| projection_map(&positions, dims, &[i]))
        .collect();
    let margin = |t: &[f64], i: usize| {
        let mut out = vec![0.0; dims[i]];
        for (x, &c) in t.iter().zip(&maps[i]) {
            out[c] += x;
        }
        out
    };
    let targets: Vec<Option<Vec<f64>>> = shifts
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let s = s.as_ref().filter(|s| s.len() == dims[i])?;
            let mut t: Vec<f64> = margin(start, i)
                .iter()
                .zip(s)
                .map(|(x, d)| (x + d).max(0.0))
                .collect();
            let sum: f64 = t.iter().sum();
            if sum <= 0.0 {
                return None;
            }
            t.iter_mut().for_each(|x| *x /= sum);
            Some(t)
        })
        .collect();
    if targets.iter().all(Option::is_none) {
        return start.to_vec();
    }
    let floor = 1e-6 / start.len() as f64;
    let mut t: Vec<f64> = start.iter().map(|x| x + floor).collect();
    for _ in 0..IPF_ITERATIONS {
        let mut worst = 0.0f64;
        for (i, target) in targets.iter().enumerate() {
            let Some(target) = target else { continue };
            let now = margin(&t, i);
            for (n, g) in now.iter().zip(target) {
                worst = worst.max((n - g).abs());
            }
            for (x, &c) in t.iter_mut().zip(&maps[i]) {
                if now[c] > 0.0 {
                    *x *= target[c] / now[c];
                }
            }
        }
        if worst <= IPF_TOLERANCE {
            break;
        }
    }
    let total: f64 = t.iter().sum();
    t.iter().map(|x| x / total).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::stats::chi2_upper;

    /// Rounds that are random parts of one population: Q averages its degrees of freedom
    /// (a yes/no attribute and one of five categories, three rounds of unequal size, the
    /// multinomial sampling variance each round's estimate has), and the test at its level
    /// rejects about as often as it should. Summing all C cells' squared deviations, which sum
    /// to zero, gave a mean of 2 on the yes/no attribute.
    /// Counts of `n` draws from the distribution `truth` (inverse CDF).
    fn multinomial_counts(rng: &mut rand_chacha::ChaCha12Rng, truth: &[f64], n: u64) -> Vec<u64> {
        use rand::Rng;
        let mut counts = vec![0u64; truth.len()];
        for _ in 0..n {
            let mut u: f64 = rng.random();
            let c = truth
                .iter()
                .position(|&p| {
                    u -= p;
                    u < 0.0
                })
                .unwrap_or(truth.len() - 1);
            counts[c] += 1;
        }
        counts
    }

    /// A round's multinomial sample of `n` people from `truth` with the noise an OUE report
    /// at ε = 2 adds to each cell (Gaussian, variance `4e^ε/((e^ε − 1)²n)`: as large in a
    /// light cell as in a heavy one), and the variances its cells would have at `truth`.
    fn sampled_round(
        rng: &mut rand_chacha::ChaCha12Rng,
        round: u32,
        truth: &[f64],
        n: u64,
    ) -> RoundEstimate {
        use rand::Rng;
        let counts = multinomial_counts(rng, truth, n);
        let e = 2f64.exp();
        let ldp = 4.0 * e / ((e - 1.0).powi(2) * n as f64);
        let mut gaussian = || {
            let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-300), rng.random());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        };
        RoundEstimate {
            round,
            estimate: counts
                .iter()
                .map(|&c| c as f64 / n as f64 + ldp.sqrt() * gaussian())
                .collect(),
            variances: truth
                .iter()
                .map(|&p| p * (1.0 - p) / n as f64 + ldp)
                .collect(),
        }
    }

    /// Three rounds whose people differ in the two heavy cells of a 40-cell attribute, the
    /// middle one thinly measured (as `auto`'s screening round's 1-ways): the post-stratified
    /// estimate `Σ w_r P̃_r` is closer to the population than the rounds' own estimates mixed
    /// by their shares (the light cells take the random-effects mean), and it stays unbiased
    /// where the rounds differ: each heavy cell's mean over replicates is within four standard
    /// errors of the truth.
    #[test]
    fn shrinkage_lowers_the_stratified_error_and_keeps_real_drift() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(11);
        let cells = 40;
        let round_truth = |heavy: f64| -> Vec<f64> {
            let rest = (1.0 - 0.6) / (cells - 2) as f64;
            let mut t = vec![rest; cells];
            t[0] = heavy;
            t[1] = 0.6 - heavy;
            t
        };
        let truths = [round_truth(0.45), round_truth(0.35), round_truth(0.15)];
        let sizes = [4000u64, 600, 8000];
        let w = [0.2, 0.3, 0.5];
        let population: Vec<f64> = (0..cells)
            .map(|c| (0..3).map(|r| w[r] * truths[r][c]).sum())
            .collect();
        let tv = |x: &[f64]| {
            0.5 * x
                .iter()
                .zip(&population)
                .map(|(a, b)| (a - b).abs())
                .sum::<f64>()
        };
        let replicates = 400;
        let (mut err_raw, mut err_shrunk) = (0.0, 0.0);
        let mut heavy = [Vec::new(), Vec::new()];
        for _ in 0..replicates {
            let per_round: Vec<RoundEstimate> = (0..3)
                .map(|r| sampled_round(&mut rng, r as u32, &truths[r], sizes[r]))
                .collect();
            let h = heterogeneity(&per_round);
            let shares: Vec<(u32, f64)> = (0..3).map(|r| (r as u32, w[r])).collect();
            let centre = population_centre(&per_round, &shares, &h.pooled, h.kappa);
            let (mut raw, mut est) = (vec![0.0; cells], vec![0.0; cells]);
            for (r, p) in per_round.iter().enumerate() {
                let s = shrunk(&centre, p, h.kappa);
                for c in 0..cells {
                    raw[c] += w[r] * p.estimate[c];
                    est[c] += w[r] * s[c];
                }
            }
            err_raw += tv(&raw) / replicates as f64;
            err_shrunk += tv(&est) / replicates as f64;
            heavy[0].push(est[0]);
            heavy[1].push(est[1]);
        }
        assert!(
            err_shrunk < 0.8 * err_raw,
            "stratified TVD {err_shrunk} shrunk against {err_raw} raw"
        );
        for (c, xs) in heavy.iter().enumerate() {
            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
            let sd =
                (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt();
            let se = sd / (xs.len() as f64).sqrt();
            // Shrinkage trades a little bias for its variance: a noisy round that truly
            // differs keeps only part of its difference. Allowed: 2% of the rounds' spread.
            let spread = truths.iter().map(|t| t[c]).fold(f64::MIN, f64::max)
                - truths.iter().map(|t| t[c]).fold(f64::MAX, f64::min);
            assert!(
                (mean - population[c]).abs() < 4.0 * se + 0.02 * spread,
                "cell {c}: mean {mean} against {} (se {se})",
                population[c]
            );
        }
    }

    /// A round measured through a large table (variance 0.05 per cell) beside two precise
    /// rounds that agree: its estimate takes the others' mean whatever its own noise says,
    /// while a precise round that differs far beyond its noise keeps its estimate.
    #[test]
    fn a_noisy_round_takes_the_mean_and_a_precise_different_one_keeps_its_own() {
        let truth = vec![0.5, 0.3, 0.2];
        let precise = |round: u32, estimate: Vec<f64>| RoundEstimate {
            round,
            estimate,
            variances: vec![1e-5; 3],
        };
        let noisy = RoundEstimate {
            round: 1,
            estimate: vec![0.1, 0.9, 0.0],
            variances: vec![0.05; 3],
        };
        let rounds = vec![precise(0, truth.clone()), noisy, precise(2, truth.clone())];
        let shares = [(0, 1.0 / 3.0), (1, 1.0 / 3.0), (2, 1.0 / 3.0)];
        let h = heterogeneity(&rounds);
        let s = shrunk(
            &population_centre(&rounds, &shares, &h.pooled, h.kappa),
            &rounds[1],
            h.kappa,
        );
        for (x, t) in s.iter().zip(&truth) {
            assert!((x - t).abs() < 0.01, "{s:?}");
        }
        let moved = vec![
            precise(0, vec![0.7, 0.2, 0.1]),
            precise(1, truth.clone()),
            precise(2, vec![0.3, 0.4, 0.3]),
        ];
        let h = heterogeneity(&moved);
        assert!(h.kappa > 0.0);
        let centre = population_centre(&moved, &shares, &h.pooled, h.kappa);
        for p in &moved {
            let s = shrunk(&centre, p, h.kappa);
            for (x, y) in s.iter().zip(&p.estimate) {
                assert!((x - y).abs() < 0.005, "round {}: {s:?}", p.round);
            }
        }
    }

    #[test]
    fn heterogeneity_is_calibrated_on_rounds_of_one_population() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(5);
        for truth in [vec![0.3, 0.7], vec![0.05, 0.1, 0.2, 0.25, 0.4]] {
            let sizes = [400u64, 1200, 800];
            let (mut q_over_df, mut rejected) = (0.0, 0usize);
            let replicates = 2000;
            for _ in 0..replicates {
                let per_round: Vec<RoundEstimate> = sizes
                    .iter()
                    .enumerate()
                    .map(|(r, &n)| {
                        let counts = multinomial_counts(&mut rng, &truth, n);
                        let estimate: Vec<f64> =
                            counts.iter().map(|&c| c as f64 / n as f64).collect();
                        let variances = estimate
                            .iter()
                            .map(|&f| (f * (1.0 - f) / n as f64).max(1e-12))
                            .collect();
                        RoundEstimate {
                            round: r as u32,
                            estimate,
                            variances,
                        }
                    })
                    .collect();
                let h = heterogeneity(&per_round);
                q_over_df += h.q / h.df / replicates as f64;
                rejected += usize::from(chi2_upper(h.q, h.df) <= 0.01);
            }
            assert!(
                (0.9..1.1).contains(&q_over_df),
                "{truth:?}: mean Q/df {q_over_df}"
            );
            let rate = rejected as f64 / replicates as f64;
            assert!(rate < 0.02, "{truth:?}: rejected {rate} at level 0.01");
        }
    }
}
