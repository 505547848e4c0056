//! From measurements to a fitted graphical model: the model graph (which dependencies the
//! model keeps), the observations the fit sees, and the fit itself ([`super::pgm`]).
//!
//! **Model graph.** Every measured pair `(a, b)` is scored by its expected gain
//! ([`best_pair_gain`], over every binning the pair was measured under): its estimated
//! dependence (the independence model's L1 error on the pair, debiased for noise cell by
//! cell) minus the L1 error of its estimate once projected onto the simplex
//! ([`projected_noise_l1`]: the error the model takes on by keeping it; the
//! projection removes much of the noise of sparse tables). Positive gain means keeping the
//! pair is expected to lower the pair's error below the independence model's. Pairs with
//! positive gain are added greedily, best first, while the triangulated graph's largest
//! clique stays within a cap on cells (VertiMRF §5.1, CSTR2: add edges by estimated
//! dependence while the junction tree fits).
//!
//! **Observations.** Every table of every round, factor and mechanism is one measurement. A
//! measurement whose factor lies in a clique is observed whole; otherwise it is summed down to
//! the maximal subsets of its factor that lie in some clique (a pruned pair still informs its
//! two 1-ways). Cells are weighted by [`super::tables::Measurement::fit_variances`] (the
//! one variance model: each table's mean randomizer variance plus each cell's sampling
//! variance), evaluated at the current model: a short pilot fit ([`PILOT_ITERS`] steps) with
//! variances at the independence model of the Norm-Sub'd 1-ways, then the fit with variances
//! at the pilot's marginals, started from it (`benchmarks/sweeps/fit-weights.md`).

use std::collections::BTreeSet;

use ldpsyn::factor::cuts_of;
use ldpsyn::mechanism::norm_sub;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::{Deserialize, Serialize};

use super::EngineError;
use super::graph::{Edge, JunctionTree, build_junction_tree, edge};
use super::pgm::{FitOptions, GraphicalModel, Observation, fit};
use super::tables::{Combined, Measurements, TableKey, coarsen};

/// Default cap on the cells of one clique of the model graph: bounds the fit's memory and
/// time (belief propagation is linear in the cells of all cliques); the junction trees of
/// the field use 10⁵–10⁶. Not a utility constant: larger cliques are completed by maximum
/// entropy from the pairs they contain. A collection of fewer people caps its cliques at
/// their number ([`clique_cap`]).
pub const MAX_CLIQUE_CELLS: u64 = 100_000;

/// Cap on the cells of one clique of the model graph of a collection of `people`: `option`
/// if set, else the smaller of [`MAX_CLIQUE_CELLS`] and `people`. A clique with more cells
/// than people has more free cells than the data has records, and the fit fills them from
/// noisy pairs alone: on NLTCS (21,574 people, 16 binary attributes) at ε = 8 every pair is
/// kept and the junction tree is one clique of 65,536 cells, 2-way TVD 0.0218 against 0.0181
/// at ε = 4; capped at the people, 0.0174 (the same rule as PrivBayes's θ-usefulness, Zhang et
/// al., "PrivBayes: Private Data Release via Bayesian Networks", TODS 42(4), 2017, §4.3: a
/// factor's cells bounded by the records that estimate it). No other suite table changes
/// (`benchmarks/sweeps/clique-cap.md`).
pub fn clique_cap(option: Option<u64>, people: u64) -> u64 {
    option.unwrap_or(MAX_CLIQUE_CELLS.min(people.max(1)))
}

/// `E[√max(z² − 1, 0)]` for a standard normal z: the mean of one cell's debiased
/// magnitude when the cell is pure noise (numerical integral).
const NULL_MAGNITUDE: f64 = 0.342_624;

/// Mirror-descent steps of the pilot fit whose marginals the final fit's variances are
/// evaluated at: 100 gave the same 2-way TVD as 300 (within seed noise, all cells of
/// `benchmarks/sweeps/fit-weights.md`, variants E and F) in 30% less time.
pub const PILOT_ITERS: usize = 100;

/// Parametric-bootstrap replicates behind [`projected_noise_l1`].
const NOISE_REPLICATES: u64 = 32;

/// The evidence for keeping one pair in the model graph.
#[derive(Debug, Clone, PartialEq)]
pub struct PairGain {
    /// `‖NS(ŷ_ab) − x‖₁`: the L1 distance between the pair's combined estimate, projected
    /// onto the simplex (Norm-Sub), and the product `x = ŷ_a ⊗ ŷ_b` of its 1-ways.
    pub observed_l1: f64,
    /// The L1 error of the projected estimate ([`projected_noise_l1`] around the projected
    /// estimate, standard errors evaluated there): the error the model takes on by keeping
    /// the pair.
    pub noise_l1: f64,
    /// The estimated dependence `Σ_cells (√max(r² − σ², 0) − 0.3426·σ)`, `r` a cell's
    /// distance from independence and σ its standard error at independence: the independence
    /// model's L1 error on the pair, with the noise's share removed per cell in squares and
    /// centred so that a pure-noise cell contributes 0 on average.
    pub dependence: f64,
    /// The standard deviation of `dependence` for an independent pair,
    /// `0.6054·√(Σ_cells σ²)` (0.6054 the standard deviation of `√max(z² − 1, 0)` for a
    /// standard normal z): how far noise alone moves the dependence estimate.
    pub dependence_sd: f64,
    /// The pair's estimate projected onto the simplex (row-major `a × b`).
    pub projected: Vec<f64>,
}

/// Standard deviation of `√max(z² − 1, 0)` for a standard normal z: `√(E[max(z² − 1, 0)] −
/// 0.3426²)` with `E[max(z² − 1, 0)] = 2(φ(1) + 1 − Φ(1)) − 2(1 − Φ(1)) = 0.48394`.
const NULL_MAGNITUDE_SD: f64 = 0.605_44;

impl PairGain {
    /// Expected reduction of the pair's L1 error from keeping it: the estimated dependence
    /// (the independence model's error) minus the noise the model takes on by keeping it.
    pub fn gain(&self) -> f64 {
        self.dependence - self.noise_l1
    }

    /// [`PairGain::gain`] less `margin` standard deviations of the dependence estimate: what
    /// the model graph ranks and keeps pairs by.
    pub fn cautious_gain(&self, margin: f64) -> f64 {
        self.gain() - margin * self.dependence_sd
    }
}

/// [`PairGain::dependence_sd`] of cells with standard errors `sigma`.
fn dependence_sd(sigma: impl Iterator<Item = f64>) -> f64 {
    NULL_MAGNITUDE_SD * sigma.map(|s| s * s).sum::<f64>().sqrt()
}

/// Expected L1 error `E‖NS(x + σ∘z) − x‖₁` of a table estimate with cell standard errors
/// `sigma` around the distribution `x`, once projected onto the simplex (Norm-Sub), by a
/// seeded parametric bootstrap (standard normal z, 32 replicates). The
/// projection removes much of the noise of sparse tables (cells near 0 cannot go below), so
/// this is well below `√(2/π)·Σσ` there. Deterministic for a given `seed`.
pub fn projected_noise_l1(x: &[f64], sigma: &[f64], seed: u64) -> f64 {
    let mut rng = ChaCha12Rng::seed_from_u64(seed);
    let mut total = 0.0;
    let mut noisy = vec![0.0; x.len()];
    for _ in 0..NOISE_REPLICATES {
        for ((v, m), s) in noisy.iter_mut().zip(x).zip(sigma) {
            *v = m + s * standard_normal(&mut rng);
        }
        total += norm_sub(&noisy)
            .iter()
            .zip(x)
            .map(|(p, m)| (p - m).abs())
            .sum::<f64>();
    }
    total / NOISE_REPLICATES as f64
}

/// A standard normal draw (Box–Muller), for the seeded bootstrap.
fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Norm-Sub'd combination of every table containing each attribute at full resolution;
/// without one, the binned estimate with the most reports spread evenly within its bins;
/// uniform if no table contains the attribute.
pub fn one_way_estimates(ms: &Measurements) -> Vec<Vec<f64>> {
    let dims = ms.domain_sizes();
    (0..dims.len())
        .map(|a| {
            if let Some(c) = ms.combined(&[a]) {
                return norm_sub(&c.frequencies);
            }
            let best = binnings(ms, &[a])
                .into_iter()
                .filter_map(|b| Some((ms.combined_binned(&[a], &b, |_| true, None)?, b)))
                .max_by_key(|(c, _)| c.reports);
            match best {
                Some((c, b)) => {
                    spread_within_bins(&norm_sub(&c.frequencies), cuts_of(&b, 0), dims[a])
                }
                None => vec![1.0 / dims[a] as f64; dims[a]],
            }
        })
        .collect()
}

/// A binned 1-way (`bins` cells under `cuts`) spread evenly over the codes of each bin.
fn spread_within_bins(binned: &[f64], cuts: &[u32], k: usize) -> Vec<f64> {
    let mut width = vec![0usize; binned.len()];
    for c in 0..k as u32 {
        width[ldpsyn::factor::bin_of(c, cuts) as usize] += 1;
    }
    (0..k as u32)
        .map(|c| {
            let b = ldpsyn::factor::bin_of(c, cuts) as usize;
            binned[b] / width[b] as f64
        })
        .collect()
}

/// Every distinct set of bin maps under which some table measured all of `attrs` (one map
/// per attribute of `attrs`, `[]` for full resolution), finest-first by cell count; the full
/// resolution appears as the empty list.
pub fn binnings(ms: &Measurements, attrs: &[usize]) -> Vec<Vec<Vec<u32>>> {
    let dims = ms.domain_sizes();
    let mut out: Vec<Vec<Vec<u32>>> = Vec::new();
    for m in ms.containing(attrs) {
        let b: Vec<Vec<u32>> = attrs.iter().map(|&a| m.key.bins_of(a).to_vec()).collect();
        let b = if b.iter().all(Vec::is_empty) {
            Vec::new()
        } else {
            b
        };
        if !out.contains(&b) {
            out.push(b);
        }
    }
    let cells = |b: &Vec<Vec<u32>>| -> usize {
        ldpsyn::factor::binned_domain_sizes(dims, attrs, b)
            .map_or(0, |s| attrs.iter().map(|&a| s[a]).product())
    };
    out.sort_by(|x, y| cells(y).cmp(&cells(x)).then(x.cmp(y)));
    out
}

/// The product of two 1-way distributions, row-major `a × b`.
pub(crate) fn outer(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .flat_map(|x| b.iter().map(move |y| x * y))
        .collect()
}

/// The independence model a pair's dependence is measured against ([`pair_gain_binned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Null {
    /// The product of the collection's 1-ways (`one_way`, every round pooled).
    Collection,
    /// The product of the 1-ways of the people the pair's tables come from
    /// ([`same_people_one_way`]): `auto`'s, whose rounds see the people in arrival order.
    SamePeople,
}

/// The best [`PairGain`] of `(a, b)` over every binning it was measured under
/// ([`binnings`]), with that binning; `None` if no table contains both. The dependence is
/// estimated from the tables `judge` accepts (all of them, or those measured after the pair
/// was selected: [`pair_gain_binned`]).
pub fn best_pair_gain(
    ms: &Measurements,
    one_way: &[Vec<f64>],
    a: usize,
    b: usize,
    null: Null,
    judge: impl Fn(&TableKey) -> bool + Copy,
) -> Option<(PairGain, Vec<Vec<u32>>)> {
    binnings(ms, &[a, b])
        .into_iter()
        .filter_map(|bins| {
            Some((
                pair_gain_binned(ms, one_way, a, b, &bins, null, judge)?,
                bins,
            ))
        })
        .max_by(|x, y| x.0.gain().total_cmp(&y.0.gain()))
}

/// [`PairGain`] of `(a, b)` under the bin maps `bins` (`[map of a, map of b]`, or empty for
/// full resolution), from the tables that measured the pair under exactly these maps: the
/// dependence and noise of the binned pair, against the binned product of the 1-ways (a
/// binned pair shows at most the dependence of the full one). The dependence comes from the
/// tables `judge` accepts, the noise of the kept pair from all of them (the fit sees them
/// all): a pair selected for more reports because its first tables showed a large
/// dependence is judged on the later ones only, which that selection did not see (the first
/// are biased upwards given the selection: the winner's curse). Falls back to all tables
/// when `judge` accepts none. `None` if no table fits.
///
/// `null` picks the independence model the dependence is measured against: the product of
/// the collection's 1-ways `one_way`, or of the 1-ways of the people of the rounds the
/// judged tables come from ([`Null::SamePeople`]; `one_way` for an attribute those rounds
/// hold no full-resolution table of). Rounds run in arrival order: when the people drift
/// during a collection, a pair measured in a later round differs from the product of
/// earlier people's 1-ways by their drift, not by a dependence the pair could add
/// (`benchmarks/sweeps/arrival-order.md`).
pub fn pair_gain_binned(
    ms: &Measurements,
    one_way: &[Vec<f64>],
    a: usize,
    b: usize,
    bins: &[Vec<u32>],
    null: Null,
    judge: impl Fn(&TableKey) -> bool,
) -> Option<PairGain> {
    let dims = ms.domain_sizes();
    let fits = |k: &TableKey| k.bins_are(&[a, b], bins);
    let mut rounds: BTreeSet<u32> = ms
        .containing(&[a, b])
        .filter(|m| fits(&m.key) && judge(&m.key))
        .map(|m| m.key.round)
        .collect();
    let judged = !rounds.is_empty();
    if !judged {
        rounds = ms
            .containing(&[a, b])
            .filter(|m| fits(&m.key))
            .map(|m| m.key.round)
            .collect();
    }
    let one = |x: usize, i: usize| {
        let same = (null == Null::SamePeople)
            .then(|| same_people_one_way(ms, x, &rounds))
            .flatten();
        let p = same.as_deref().unwrap_or(&one_way[x]);
        coarsen(p, &[dims[x]], &[cuts_of(bins, i).to_vec()])
    };
    let null = outer(&one(a, 0), &one(b, 1));
    let c = if judged {
        ms.combined_binned(&[a, b], bins, judge, Some(&null))?
    } else {
        ms.combined_binned(&[a, b], bins, |_| true, Some(&null))?
    };
    let projected = norm_sub(&c.frequencies);
    let observed_l1 = projected
        .iter()
        .zip(&null)
        .map(|(y, x)| (y - x).abs())
        .sum::<f64>();
    // The independence model's error: per cell, the distance from independence with the
    // noise's share removed in squares, centred so a pure-noise cell gives 0 on average.
    let dependence = c
        .frequencies
        .iter()
        .zip(&null)
        .zip(&c.std_errors)
        .map(|((y, x), s)| ((y - x).powi(2) - s * s).max(0.0).sqrt() - NULL_MAGNITUDE * s)
        .sum::<f64>();
    let dependence_sd = dependence_sd(c.std_errors.iter().copied());
    let noise_l1 = kept_noise_l1(ms, a, b, bins, &projected)?;
    Some(PairGain {
        observed_l1,
        noise_l1,
        dependence,
        dependence_sd,
        projected,
    })
}

/// Attribute `x`'s 1-way among the people of `rounds`: its estimate from those rounds'
/// tables combined with the other rounds' as far as the two agree. Per cell, `f_R` (those
/// rounds, variance `v_R`) and `f_O` (the others, `v_O`) are pooled with weights `1/v_R`
/// and `1/(v_O + δ²)`, `δ²` the rounds' drift per cell, estimated without bias as
/// `max(0, Σ (f_R − f_O)² − Σ (v_R + v_O)) / k` over the `k` cells (a random-effects
/// pooling, DerSimonian–Laird): the collection's 1-way when the rounds agree, the rounds'
/// own when they drift apart. After Norm-Sub. `None` without a full-resolution table of `x`
/// in `rounds`.
pub fn same_people_one_way(
    ms: &Measurements,
    x: usize,
    rounds: &BTreeSet<u32>,
) -> Option<Vec<f64>> {
    let own = ms.combined_where(&[x], |k| rounds.contains(&k.round))?;
    let Some(other) = ms.combined_where(&[x], |k| !rounds.contains(&k.round)) else {
        return Some(norm_sub(&own.frequencies));
    };
    let var = |c: &Combined| -> Vec<f64> { c.std_errors.iter().map(|s| s * s).collect() };
    let (v_own, v_other) = (var(&own), var(&other));
    let k = own.frequencies.len() as f64;
    let spread: f64 = own
        .frequencies
        .iter()
        .zip(&other.frequencies)
        .zip(v_own.iter().zip(&v_other))
        .map(|((f, g), (v, w))| (f - g).powi(2) - v - w)
        .sum();
    let drift = spread.max(0.0) / k;
    let pooled: Vec<f64> = (0..own.frequencies.len())
        .map(|i| {
            let (w_own, w_other) = (
                1.0 / v_own[i].max(1e-300),
                1.0 / (v_other[i] + drift).max(1e-300),
            );
            (w_own * own.frequencies[i] + w_other * other.frequencies[i]) / (w_own + w_other)
        })
        .collect();
    Some(norm_sub(&pooled))
}

/// The error a kept pair `(a, b)` brings: the L1 noise around its projected estimate
/// `projected`, with standard errors evaluated there. `None` if no table holds the pair.
fn kept_noise_l1(
    ms: &Measurements,
    a: usize,
    b: usize,
    bins: &[Vec<u32>],
    projected: &[f64],
) -> Option<f64> {
    let at_estimate = ms.combined_binned(&[a, b], bins, |_| true, Some(projected))?;
    Some(projected_noise_l1(
        projected,
        &at_estimate.std_errors,
        ((a as u64) << 32) | b as u64,
    ))
}

/// [`PairGain`] of `(a, b)` (`a < b`) when its 1-ways come from the same reports as the pair
/// (a vertical collection: the pair table is the joint of the two attributes' GRR reports
/// of the same records, and summing it gives their 1-way estimates exactly). The distance
/// from independence is then measured against the table's own margins, `r = y − y_a ⊗ y_b`
/// (VertiMRF §5.1's R-score, `‖T̂_ab − T̂_a ⊗ T̂_b‖₁/n`), whose noise is not the pair's:
/// with `m_i` a report's column of `Q⁻¹` and `f` the margins, under independence
/// `r = (1/n)Σ_i (m1_i − f_a) ⊗ (m2_i − f_b) − δ_a ⊗ δ_b` exactly, so a cell's null
/// variance is `n·σ_a²·σ_b²` (σ the margins' standard errors from the same reports) up to
/// the `δ_a ⊗ δ_b` term, `√n` times smaller ([`best_pair_gain`]'s null, the pair's own
/// variance, also counts the margins' noise, which `r` does not have). Measured: a pure-noise
/// 16 × 41 pair at ε = 0.5 per attribute gives `E[r²]/σ_r² = 1.04` over its 656 cells. Its
/// dependence estimate (4.5) is still within one [`PairGain::dependence_sd`] (4.4) of 0:
/// what keeps such a pair out is the vertical margin
/// ([`crate::protocols::vertical::VERTICAL_GAIN_MARGIN`]; test
/// `independent_noisy_pair_keeps_no_edge`). `None` if no table holds the pair.
pub fn pair_gain_own_margins(ms: &Measurements, a: usize, b: usize) -> Option<PairGain> {
    let pair = [a, b];
    let m = ms
        .containing(&pair)
        .find(|m| m.key.factor == [a, b] && m.key.bins.is_empty())?;
    let y = &m.estimate.frequencies;
    let (ya, yb) = (m.marginalized(&[a]), m.marginalized(&[b]));
    let (pa, pb) = (norm_sub(&ya), norm_sub(&yb));
    let n = m.estimate.n as f64;
    let sa = m.cell_variances(&[a], &pa, ms.population());
    let sb = m.cell_variances(&[b], &pb, ms.population());
    let raw_null = outer(&ya, &yb);
    let null_var: Vec<f64> = (0..y.len())
        .map(|cell| n * sa[cell / yb.len()] * sb[cell % yb.len()])
        .collect();
    let dependence = y
        .iter()
        .zip(&raw_null)
        .zip(&null_var)
        .map(|((v, x), s2)| ((v - x).powi(2) - s2).max(0.0).sqrt() - NULL_MAGNITUDE * s2.sqrt())
        .sum::<f64>();
    let dependence_sd = dependence_sd(null_var.iter().map(|v| v.sqrt()));
    let projected = norm_sub(y);
    let observed_l1 = projected
        .iter()
        .zip(outer(&pa, &pb))
        .map(|(p, x)| (p - x).abs())
        .sum::<f64>();
    let noise_l1 = kept_noise_l1(ms, a, b, &[], &projected)?;
    Some(PairGain {
        observed_l1,
        noise_l1,
        dependence,
        dependence_sd,
        projected,
    })
}

/// Largest clique (cells) of the junction tree of `edges`.
pub fn largest_clique_cells(dims: &[usize], edges: &BTreeSet<Edge>) -> u64 {
    build_junction_tree(dims.len(), edges)
        .cliques
        .iter()
        .map(|c| {
            c.iter()
                .fold(1u64, |acc, &a| acc.saturating_mul(dims[a] as u64))
        })
        .max()
        .unwrap_or(1)
}

/// The model graph (module docs): `candidates` (pairs with their gain) whose
/// [`PairGain::cautious_gain`] at `margin` is positive, added best first while the largest
/// clique has at most `max_clique_cells` cells. Ties by pair order, so the result depends
/// only on the inputs.
pub fn select_model_graph(
    dims: &[usize],
    candidates: &[(Edge, PairGain)],
    max_clique_cells: u64,
    margin: f64,
) -> BTreeSet<Edge> {
    let mut ranked: Vec<(f64, Edge)> = candidates
        .iter()
        .map(|(e, g)| (g.cautious_gain(margin), edge(e.0, e.1)))
        .filter(|(gain, _)| *gain > 0.0)
        .collect();
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let mut chosen = BTreeSet::new();
    for (_, e) in ranked {
        chosen.insert(e);
        if largest_clique_cells(dims, &chosen) > max_clique_cells {
            chosen.remove(&e);
        }
    }
    chosen
}

/// Maximal subsets of `factor` (in factor order) that lie inside some clique.
fn fitting_parts(factor: &[usize], tree: &JunctionTree) -> Vec<Vec<usize>> {
    let k = factor.len();
    let fits = |s: &[usize]| tree.cliques.iter().any(|c| s.iter().all(|a| c.contains(a)));
    let mut parts: Vec<Vec<usize>> = Vec::new();
    // Larger subsets first, so a subset of a kept one is skipped.
    let mut masks: Vec<u32> = (1..(1u32 << k)).collect();
    masks.sort_by_key(|m| (std::cmp::Reverse(m.count_ones()), *m));
    for m in masks {
        let s: Vec<usize> = (0..k)
            .filter(|i| m >> i & 1 == 1)
            .map(|i| factor[i])
            .collect();
        if fits(&s) && !parts.iter().any(|p| s.iter().all(|a| p.contains(a))) {
            parts.push(s);
        }
    }
    parts
}

/// The observations of every measurement on `tree`, with the fit's variances at
/// `model_marginal` (the current model's marginal of a part, row-major in the part's order;
/// module docs).
fn observations(
    ms: &Measurements,
    tree: &JunctionTree,
    model_marginal: &dyn Fn(&[usize]) -> Vec<f64>,
) -> Vec<Observation> {
    let dims = ms.domain_sizes();
    let mut out = Vec::new();
    for m in ms.items() {
        for part in fitting_parts(&m.key.factor, tree) {
            let bins: Vec<Vec<u32>> = if m.key.bins.is_empty() {
                Vec::new()
            } else {
                part.iter().map(|&a| m.key.bins_of(a).to_vec()).collect()
            };
            let pdims: Vec<usize> = part.iter().map(|&a| dims[a]).collect();
            let at = coarsen(&model_marginal(&part), &pdims, &bins);
            let variances = m.fit_variances(&part, &at, ms.population());
            out.push(Observation {
                values: m.marginalized(&part),
                variances,
                attrs: part,
                bins,
            });
        }
    }
    out
}

/// How far one table lies from the fitted model: `q = Σ_c (y_c − μ_c)²/v_c` over its cells
/// (those of small expected counts pooled into one) but the model's heaviest,
/// `y` its estimate, `μ` the model's marginal (under the table's bins) and `v` the one
/// variance model at `μ` ([`crate::tables::Measurement::cell_variances`]).
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
    /// Of those, the tables beyond noise: `p_value` below [`crate::drift::DRIFT_TEST_LEVEL`]
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

/// Tables listed in [`FitResiduals::worst`].
pub const WORST_RESIDUALS: usize = 10;

/// `q = Σ (y − μ)²/v` and its degrees of freedom for one table's estimate `y` against the
/// model's `μ` with cell variances `v`, from `n` reports. The χ² reference needs about 5
/// expected counts per cell (Cochran, "Some methods for strengthening the common χ² tests",
/// Biometrics 10, 1954): cells with `n·μ` below [`MIN_EXPECTED_COUNT`] are pooled into one
/// (their estimates, model frequencies and variances summed). The cells then sum to one, so
/// the heaviest is left out (as in `crate::drift`'s heterogeneity test): a deviation is not
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
            p_value: crate::drift::chi2_upper(q, df),
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
        .filter(|r| r.p_value * checked as f64 <= crate::drift::DRIFT_TEST_LEVEL)
        .count();
    all.truncate(WORST_RESIDUALS);
    FitResiduals {
        tables_checked: checked,
        beyond_noise,
        mean_ratio: if df > 0.0 { q / df } else { 0.0 },
        worst: all,
    }
}

/// Fits the graphical model over the junction tree of `edges` to every measurement (module
/// docs). Errors: [`EngineError::NoData`] without measurements.
pub fn fit_model(
    ms: &Measurements,
    edges: &BTreeSet<Edge>,
    options: &FitOptions,
) -> Result<GraphicalModel, EngineError> {
    if ms.items().is_empty() {
        return Err(EngineError::NoData);
    }
    let dims = ms.domain_sizes();
    let tree = build_junction_tree(dims.len(), edges);
    let one_way = one_way_estimates(ms);
    let independent = |attrs: &[usize]| -> Vec<f64> {
        attrs
            .iter()
            .fold(vec![1.0], |acc, &a| outer(&acc, &one_way[a]))
    };
    // Start at the independence model: each attribute's log 1-way in the first clique
    // holding it.
    let mut start: Vec<Vec<f64>> = tree
        .cliques
        .iter()
        .map(|c| vec![0.0; c.iter().map(|&a| dims[a]).product()])
        .collect();
    for (a, marg) in one_way.iter().enumerate() {
        let Some(ci) = tree.cliques.iter().position(|c| c.contains(&a)) else {
            continue;
        };
        let clique = &tree.cliques[ci];
        let cdims: Vec<usize> = clique.iter().map(|&x| dims[x]).collect();
        let map = super::tables::projection_map(clique, &cdims, &[a]);
        for (t, &v) in start[ci].iter_mut().zip(&map) {
            *t += marg[v].max(1e-9).ln();
        }
    }
    let pilot = FitOptions {
        max_iters: PILOT_ITERS.min(options.max_iters),
        ..options.clone()
    };
    let first = fit(
        dims,
        &tree,
        &observations(ms, &tree, &independent),
        Some(start),
        &pilot,
    )
    .map_err(|e| EngineError::Estimation(e.to_string()))?;
    let at_model = |attrs: &[usize]| {
        first
            .marginal_in_clique(attrs)
            .unwrap_or_else(|| independent(attrs))
    };
    fit(
        dims,
        &tree,
        &observations(ms, &tree, &at_model),
        Some(first.potentials().to_vec()),
        options,
    )
    .map_err(|e| EngineError::Estimation(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::Tables;

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
            if crate::drift::chi2_upper(q, df) < 0.001 {
                rejected += 1;
            }
            let raw: f64 = (1..mu.len()).map(|c| (y[c] - mu[c]).powi(2) / v[c]).sum();
            if crate::drift::chi2_upper(raw, (mu.len() - 1) as f64) < 0.001 {
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
    use ldpsyn::Epsilon;
    use ldpsyn::mechanism::{Mechanism, MechanismKind, SufficientStatistics};

    #[test]
    fn parts_are_maximal_and_fit() {
        let edges: BTreeSet<Edge> = [(0, 1), (1, 2)].into_iter().collect();
        let tree = build_junction_tree(4, &edges);
        assert_eq!(fitting_parts(&[0, 1], &tree), vec![vec![0, 1]]);
        assert_eq!(fitting_parts(&[2, 0], &tree), vec![vec![2], vec![0]]);
        assert_eq!(
            fitting_parts(&[0, 1, 2], &tree),
            vec![vec![0, 1], vec![1, 2]]
        );
        assert_eq!(fitting_parts(&[3, 1], &tree), vec![vec![3], vec![1]]);
    }

    /// Reports of `n` people drawn from `p` (row-major over `dims`) through GRR at ε = 6.
    fn grr_table(dims: &[usize], p: &[f64], n: usize, seed: u64) -> SufficientStatistics {
        let mech = Mechanism::new(MechanismKind::Grr, Epsilon::new(6.0).unwrap(), dims).unwrap();
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let mut stats = SufficientStatistics::new(&mech);
        for _ in 0..n {
            let mut u: f64 = rng.random();
            let cell = p.iter().position(|&q| {
                u -= q;
                u < 0.0
            });
            let mut cell = cell.unwrap_or(p.len() - 1);
            let mut codes = vec![0u32; dims.len()];
            for (c, &k) in codes.iter_mut().zip(dims).rev() {
                *c = (cell % k) as u32;
                cell /= k;
            }
            let report = mech.randomize(&codes, &mut rng).unwrap();
            mech.accumulate(&report, &mut stats).unwrap();
        }
        stats
    }

    /// People who drift between rounds: round 0 measures each attribute alone among people
    /// whose `a` is mostly 0, round 1 the pair among people whose `a` is mostly 2, with `b`
    /// independent of `a` in both. Against the collection's 1-ways the pair looks dependent
    /// (its margin moved); against its own round's people's it does not.
    #[test]
    fn a_pair_is_judged_against_the_one_ways_of_its_own_rounds() {
        let dims = [3usize, 3];
        let early = [0.7, 0.2, 0.1];
        let late = [0.1, 0.2, 0.7];
        let b = [0.5, 0.3, 0.2];
        let key = |round: u32, factor: Vec<usize>| TableKey {
            round,
            factor,
            mechanism: MechanismKind::Grr,
            bins: vec![],
        };
        let mut tables = Tables::new();
        tables.insert(key(0, vec![0]), grr_table(&[3], &early, 20_000, 1));
        tables.insert(key(0, vec![1]), grr_table(&[3], &b, 20_000, 2));
        tables.insert(
            key(1, vec![0, 1]),
            grr_table(&dims, &outer(&late, &b), 20_000, 3),
        );
        let ms = Measurements::new(Epsilon::new(6.0).unwrap(), &dims, &tables).unwrap();
        // The collection's 1-ways, as the callers pass them: `a` is half early, half late.
        let one = one_way_estimates(&ms);
        assert!((one[0][0] - 0.4).abs() < 0.05, "{:?}", one[0]);
        let g = pair_gain_binned(&ms, &one, 0, 1, &[], Null::SamePeople, |_| true).unwrap();
        assert!(
            g.dependence < 2.0 * g.dependence_sd,
            "an independent pair gains {} (sd {})",
            g.dependence,
            g.dependence_sd
        );
        // Against the collection's 1-ways the drift reads as a dependence of ~0.6.
        let c = pair_gain_binned(&ms, &one, 0, 1, &[], Null::Collection, |_| true).unwrap();
        assert!(c.dependence > 0.4, "{}", c.dependence);
        // A pair measured in the same round as the 1-ways is still judged against them.
        let mut same = Tables::new();
        same.insert(key(0, vec![0]), grr_table(&[3], &early, 20_000, 4));
        same.insert(key(0, vec![1]), grr_table(&[3], &b, 20_000, 5));
        let joint = [0.5, 0.1, 0.1, 0.0, 0.1, 0.1, 0.0, 0.0, 0.1];
        same.insert(key(0, vec![0, 1]), grr_table(&dims, &joint, 20_000, 6));
        let ms = Measurements::new(Epsilon::new(6.0).unwrap(), &dims, &same).unwrap();
        let one = one_way_estimates(&ms);
        let g = pair_gain_binned(&ms, &one, 0, 1, &[], Null::SamePeople, |_| true).unwrap();
        assert!(
            g.dependence > 0.3,
            "a dependent pair gains {}",
            g.dependence
        );
    }

    /// Rounds of the same people: the 1-way of one round's people is the collection's (the
    /// other rounds pooled in fully), not that round's own noisier estimate.
    #[test]
    fn rounds_that_agree_pool_their_one_ways() {
        let p = [0.5, 0.3, 0.2];
        let key = |round: u32| TableKey {
            round,
            factor: vec![0],
            mechanism: MechanismKind::Grr,
            bins: vec![],
        };
        let mut tables = Tables::new();
        tables.insert(key(0), grr_table(&[3], &p, 2_000, 7));
        tables.insert(key(1), grr_table(&[3], &p, 50_000, 8));
        let ms = Measurements::new(Epsilon::new(6.0).unwrap(), &[3], &tables).unwrap();
        let l1 = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| (a - b).abs()).sum::<f64>();
        let pooled = norm_sub(&ms.combined(&[0]).unwrap().frequencies);
        let own = norm_sub(
            &ms.combined_where(&[0], |k| k.round == 0)
                .unwrap()
                .frequencies,
        );
        let round0: BTreeSet<u32> = [0].into_iter().collect();
        let same = same_people_one_way(&ms, 0, &round0).unwrap();
        assert!(
            l1(&own, &pooled) > 1e-3,
            "round 0 must differ from the pool: {own:?}"
        );
        assert!(l1(&same, &pooled) < 1e-3, "{same:?} vs {pooled:?}");
    }

    #[test]
    fn model_graph_respects_gain_and_cap() {
        let dims = [10usize, 10, 10, 10];
        let g = |o: f64| PairGain {
            observed_l1: o,
            noise_l1: 0.1,
            dependence: o - 0.1,
            dependence_sd: 0.05,
            projected: Vec::new(),
        };
        let cands = [
            ((0, 1), g(0.5)),
            ((1, 2), g(0.4)),
            ((0, 2), g(0.3)),
            ((2, 3), g(0.15)),
        ];
        // Cap 100 cells: no triangle (1000 cells); (2, 3) has negative gain.
        let e = select_model_graph(&dims, &cands, 100, 0.0);
        assert_eq!(e, [(0, 1), (1, 2)].into_iter().collect());
        let e = select_model_graph(&dims, &cands, 1000, 0.0);
        assert_eq!(e, [(0, 1), (0, 2), (1, 2)].into_iter().collect());
        // A margin of 3 sd (0.15) drops (0, 2), whose gain 0.1 is within its noise.
        let e = select_model_graph(&dims, &cands, 1000, 3.0);
        assert_eq!(e, [(0, 1), (1, 2)].into_iter().collect());
    }
}
