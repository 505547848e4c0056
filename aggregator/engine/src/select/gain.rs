//! A pair's expected gain: the evidence for keeping it in the model graph.
//!
//! Every measured pair `(a, b)` is scored by its expected gain ([`best_pair_gain`], over
//! every binning the pair was measured under): its estimated dependence (the independence
//! model's L1 error on the pair, debiased for noise cell by cell) minus the L1 error of its
//! estimate once projected onto the simplex ([`projected_noise_l1`]: the error the model
//! takes on by keeping it; the projection removes much of the noise of sparse tables).
//! Positive gain means keeping the pair is expected to lower the pair's error below the
//! independence model's.

/// `E[√max(z² − 1, 0)]` for a standard normal z: the mean of one cell's debiased
/// magnitude when the cell is pure noise (numerical integral).
const NULL_MAGNITUDE: f64 = 0.342_624;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use ldpsyn::mechanism::norm_sub;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

use crate::domain::binned::BinnedFactor;
use crate::domain::key::TableKey;
use crate::measure::one_way::{binnings, one_way_estimates};
use crate::measure::tables::{Combined, Measurements};
use crate::numeric::index::{coarsen, outer};
use crate::numeric::stats::erfc;

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
    /// The share of the pair's noise in its interaction, `√((k_a − 1)(k_b − 1)/(k_a·k_b −
    /// 1))` for a `k_a × k_b` table (its cells' degrees of freedom less its margins'), or 1.
    pub interaction_share: f64,
    /// Per cell (row-major `a × b`), the interaction component of the test against
    /// independence ([`interaction_cells`]): the input of [`pooled_dependence`].
    pub cells: Vec<NullCell>,
}

/// One cell of a pair's test against independence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NullCell {
    /// The independence model's probability `x` of the cell.
    pub null: f64,
    /// The raw estimate's distance from it, `r = y − x` (before any simplex projection).
    pub residual: f64,
    /// The standard error σ of `r` under independence.
    pub std_error: f64,
}

/// The interaction component of a `rows × cols` table of cells (row-major): residuals
/// double-centred (`r_ij − r̄_i· − r̄_·j + r̄_··`, the projection P onto tables whose rows
/// and columns sum to 0) with the standard errors of the projected noise,
/// `Var((Pe)_ij) = Σ P²_{ij,i'j'} σ²_{i'j'}` (cell noises taken as independent). A pair's
/// dependence `δ = p_ab − p_a ⊗ p_b` has zero margins, so P keeps it whole while its
/// residual's margin components, pure noise, are dropped: `(k_a − 1)(k_b − 1)/(k_a k_b)` of
/// the noise is left (a quarter for a binary pair), and a prior on δ pooled over many pairs
/// is estimated with that much less noise ([`pooled_prior_scale`]). Cells are returned as
/// given when the shape does not match or either side has one cell (no interaction).
pub fn interaction_cells(cells: &[NullCell], rows: usize, cols: usize) -> Vec<NullCell> {
    if rows * cols != cells.len() || rows < 2 || cols < 2 {
        return cells.to_vec();
    }
    let (kr, kc) = (rows as f64, cols as f64);
    let at = |i: usize, j: usize| &cells[i * cols + j];
    let row_mean: Vec<f64> = (0..rows)
        .map(|i| (0..cols).map(|j| at(i, j).residual).sum::<f64>() / kc)
        .collect();
    let col_mean: Vec<f64> = (0..cols)
        .map(|j| (0..rows).map(|i| at(i, j).residual).sum::<f64>() / kr)
        .collect();
    let grand = row_mean.iter().sum::<f64>() / kr;
    // P = (I − J/k_r) ⊗ (I − J/k_c); its elementwise square applied to the variances one
    // side at a time: (A∘A)v = (1 − 2/k)v + (Σv)/k².
    let var: Vec<f64> = cells.iter().map(|c| c.std_error.powi(2)).collect();
    let col_var: Vec<f64> = (0..cols)
        .map(|j| (0..rows).map(|i| var[i * cols + j]).sum())
        .collect();
    let left: Vec<f64> = (0..rows * cols)
        .map(|c| (1.0 - 2.0 / kr) * var[c] + col_var[c % cols] / (kr * kr))
        .collect();
    let row_left: Vec<f64> = (0..rows)
        .map(|i| left[i * cols..(i + 1) * cols].iter().sum())
        .collect();
    (0..rows * cols)
        .map(|c| {
            let (i, j) = (c / cols, c % cols);
            let v = (1.0 - 2.0 / kc) * left[c] + row_left[i] / (kc * kc);
            NullCell {
                null: cells[c].null,
                residual: cells[c].residual - row_mean[i] - col_mean[j] + grand,
                std_error: v.max(0.0).sqrt(),
            }
        })
        .collect()
}

/// `√((k_a − 1)(k_b − 1)/(k_a·k_b − 1))`: the share of a `k_a × k_b` table's noise (L1, as
/// the square root of its degrees of freedom) in its interaction, the rest being its margins'.
fn interaction_share(ka: usize, kb: usize) -> f64 {
    let (ka, kb) = (ka as f64, kb as f64);
    ((ka - 1.0) * (kb - 1.0) / (ka * kb - 1.0).max(1.0)).sqrt()
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

    /// The posterior mean of the pair's dependence `Σ_c |δ_c|` under the prior
    /// `δ ~ N(0, t·x)` of [`pooled_prior_scale`]. Where a pair's noise exceeds its dependence
    /// [`PairGain::dependence`] is near 0 (`≈ δ²/σ` for δ ≪ σ), although the pairs together
    /// may carry much of the data's dependence (many weak pairs at small ε); the posterior
    /// keeps their sum's expectation under the prior (Efron, "Large-Scale Inference",
    /// Cambridge University Press, 2010, ch. 1: shrinkage towards a common variance), and,
    /// being a posterior, it is not biased by a selection on the pair's residuals (Efron,
    /// "Tweedie's Formula and Selection Bias", JASA 106(496), 2011). 0 when t = 0.
    pub fn posterior_dependence(&self, t: f64) -> f64 {
        self.cells
            .iter()
            .map(|c| posterior_abs_mean(c.residual, c.std_error.powi(2), t * c.null.max(0.0)))
            .sum()
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

/// The independence model a pair's dependence is measured against ([`pair_gain_binned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Null {
    /// The product of the collection's 1-ways ([`NullOneWays::collection`], every round
    /// pooled).
    Collection,
    /// The product of the 1-ways of the people the pair's tables come from
    /// ([`same_people_one_way`]): `auto`'s, whose rounds see the people in arrival order.
    SamePeople,
}

/// The 1-ways of measurements `ms` that the independence models of [`Null`] are built from:
/// the collection's ([`one_way_estimates`]) and, computed once per attribute and round set,
/// those of the people of given rounds ([`same_people_one_way`]). A model graph's candidates
/// share them: the 4,950 pairs of 100 attributes ask for 100 attributes' 1-ways, each over
/// every table that holds the attribute, so computing them per pair made that lookup most
/// of a wide collection's finalize (`bench-fit`, `benchmarks/results/fit.md`). Not `Sync`
/// (the memo is a `RefCell`): one per selection.
#[derive(Debug)]
pub struct NullOneWays<'a> {
    ms: &'a Measurements,
    collection: Vec<Vec<f64>>,
    same_people: RefCell<SamePeopleMemo>,
}

/// [`same_people_one_way`]'s answers by attribute and round set.
type SamePeopleMemo = BTreeMap<(usize, BTreeSet<u32>), Option<Vec<f64>>>;

impl<'a> NullOneWays<'a> {
    /// The collection's 1-ways of `ms` (one per attribute, Norm-Sub'd), the rounds' to come.
    pub fn new(ms: &'a Measurements) -> Self {
        Self {
            ms,
            collection: one_way_estimates(ms),
            same_people: RefCell::new(BTreeMap::new()),
        }
    }

    /// The measurements.
    pub fn measurements(&self) -> &'a Measurements {
        self.ms
    }

    /// The collection's 1-ways, one per attribute ([`one_way_estimates`]).
    pub fn collection(&self) -> &[Vec<f64>] {
        &self.collection
    }

    /// [`same_people_one_way`]`(ms, x, rounds)`, from the memo after its first call.
    pub fn same_people(&self, x: usize, rounds: &BTreeSet<u32>) -> Option<Vec<f64>> {
        if let Some(hit) = self.same_people.borrow().get(&(x, rounds.clone())) {
            return hit.clone();
        }
        let one = same_people_one_way(self.ms, x, rounds);
        self.same_people
            .borrow_mut()
            .insert((x, rounds.clone()), one.clone());
        one
    }
}

/// The best [`PairGain`] of `(a, b)` over every binning it was measured under
/// ([`binnings`]), with that binning; `None` if no table contains both. The dependence is
/// estimated from the tables `judge` accepts (all of them, or those measured after the pair
/// was selected: [`pair_gain_binned`]).
pub fn best_pair_gain(
    nulls: &NullOneWays<'_>,
    a: usize,
    b: usize,
    null: Null,
    judge: impl Fn(&TableKey) -> bool + Copy,
) -> Option<(PairGain, Vec<Vec<u32>>)> {
    binnings(nulls.measurements(), &[a, b])
        .into_iter()
        .filter_map(|bins| {
            let ab = [a, b];
            let pair = BinnedFactor::new(&ab, &bins);
            Some((pair_gain_binned(nulls, pair, null, judge)?, bins))
        })
        .max_by(|x, y| x.0.gain().total_cmp(&y.0.gain()))
}

/// [`PairGain`] of a pair `(a, b)` under its bin maps (`pair`, `a < b`; `None` for a factor
/// of another length), from the tables that measured the pair under exactly these maps: the
/// dependence and noise of the binned pair, against the binned product of the 1-ways (a
/// binned pair shows at most the dependence of the full one). The dependence comes from the
/// tables `judge` accepts, the noise of the kept pair from all of them (the fit sees them
/// all): a pair selected for more reports because its first tables showed a large
/// dependence is judged on the later ones only, which that selection did not see (the first
/// are biased upwards given the selection: the winner's curse). Falls back to all tables
/// when `judge` accepts none. `None` if no table fits.
///
/// `null` picks the independence model the dependence is measured against: the product of
/// the collection's 1-ways ([`NullOneWays::collection`]), or of the 1-ways of the people of
/// the rounds the judged tables come from ([`Null::SamePeople`]; the collection's for an
/// attribute those rounds hold no full-resolution table of). Rounds run in arrival order: when the people drift
/// during a collection, a pair measured in a later round differs from the product of
/// earlier people's 1-ways by their drift, not by a dependence the pair could add
/// (`benchmarks/sweeps/arrival-order.md`).
pub fn pair_gain_binned(
    nulls: &NullOneWays<'_>,
    pair: BinnedFactor<'_>,
    null: Null,
    judge: impl Fn(&TableKey) -> bool,
) -> Option<PairGain> {
    let &[a, b] = pair.attrs() else {
        return None;
    };
    let ms = nulls.measurements();
    let dims = ms.domain_sizes();
    let fits = |k: &TableKey| k.bins_are(pair);
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
            .then(|| nulls.same_people(x, &rounds))
            .flatten();
        let p = same.as_deref().unwrap_or(&nulls.collection()[x]);
        coarsen(p, &[dims[x]], &[pair.cuts(i).to_vec()])
    };
    let (one_a, one_b) = (one(a, 0), one(b, 1));
    let interaction_share = interaction_share(one_a.len(), one_b.len());
    let null = outer(&one_a, &one_b);
    let c = if judged {
        ms.combined_binned(pair, judge, Some(&null))?
    } else {
        ms.combined_binned(pair, |_| true, Some(&null))?
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
    let noise_l1 = kept_noise_l1(ms, pair, &projected)?;
    let raw_cells: Vec<NullCell> = (c.frequencies.iter().zip(&null).zip(&c.std_errors))
        .map(|((y, x), s)| NullCell {
            null: *x,
            residual: y - x,
            std_error: *s,
        })
        .collect();
    let cells = interaction_cells(&raw_cells, one_a.len(), one_b.len());
    Some(PairGain {
        observed_l1,
        noise_l1,
        dependence,
        dependence_sd,
        projected,
        interaction_share,
        cells,
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

/// The error a kept pair `(a, b)` (under its bin maps) brings: the L1 noise around its
/// projected estimate `projected`, with standard errors evaluated there. `None` if no table
/// holds the pair.
fn kept_noise_l1(ms: &Measurements, pair: BinnedFactor<'_>, projected: &[f64]) -> Option<f64> {
    let &[a, b] = pair.attrs() else {
        return None;
    };
    let at_estimate = ms.combined_binned(pair, |_| true, Some(projected))?;
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
    let noise_l1 = kept_noise_l1(ms, BinnedFactor::full(&[a, b]), &projected)?;
    // Against the table's own margins the residual has no margin component: its cells are
    // the interaction already, with their null variances.
    let cells = (y.iter().zip(&raw_null).zip(&null_var))
        .map(|((v, x), s2)| NullCell {
            null: *x,
            residual: v - x,
            std_error: s2.sqrt(),
        })
        .collect();
    Some(PairGain {
        observed_l1,
        noise_l1,
        dependence,
        dependence_sd,
        projected,
        interaction_share: interaction_share(ya.len(), yb.len()),
        cells,
    })
}

/// [`PairGain`] of a pair estimated apart from every table, as VertiMRF's CarEst estimates
/// a cross-party pair from the parties' sketches (§5.1's R-score against the estimate's own
/// margins): `y` the raw frequencies (row-major `rows × cols`, possibly negative, summing
/// near 1) and `variances` their per-cell variances. Each cell's null standard error is its
/// own (the sketch noise of a cell is its union estimate's, present under independence
/// too). The noise the model takes on is [`projected_noise_l1`] at the projected estimate
/// times [`PairGain::interaction_share`]: the fit pins the pair's margins to the parties'
/// local models' 1-ways, measured centrally and far more precisely than the sketched cells,
/// so only the table's interaction noise is taken on.
/// `seed` fixes that bootstrap. Panics if the lengths are not `rows · cols`.
pub fn pair_gain_from_cells(
    y: &[f64],
    variances: &[f64],
    rows: usize,
    cols: usize,
    seed: u64,
) -> PairGain {
    assert!(y.len() == rows * cols && variances.len() == y.len());
    let ya: Vec<f64> = (0..rows)
        .map(|i| y[i * cols..(i + 1) * cols].iter().sum())
        .collect();
    let yb: Vec<f64> = (0..cols)
        .map(|j| (0..rows).map(|i| y[i * cols + j]).sum())
        .collect();
    let raw_null = outer(&ya, &yb);
    let sigma: Vec<f64> = variances.iter().map(|v| v.max(0.0).sqrt()).collect();
    let dependence = y
        .iter()
        .zip(&raw_null)
        .zip(&sigma)
        .map(|((v, x), s)| ((v - x).powi(2) - s * s).max(0.0).sqrt() - NULL_MAGNITUDE * s)
        .sum::<f64>();
    let projected = norm_sub(y);
    let (pa, pb) = (norm_sub(&ya), norm_sub(&yb));
    let observed_l1 = projected
        .iter()
        .zip(outer(&pa, &pb))
        .map(|(p, x)| (p - x).abs())
        .sum::<f64>();
    let cells = (y.iter().zip(&raw_null).zip(&sigma))
        .map(|((v, x), s)| NullCell {
            null: *x,
            residual: v - x,
            std_error: *s,
        })
        .collect();
    let share = interaction_share(rows, cols);
    PairGain {
        observed_l1,
        noise_l1: share * projected_noise_l1(&projected, &sigma, seed),
        dependence,
        dependence_sd: dependence_sd(sigma.iter().copied()),
        projected,
        interaction_share: share,
        cells,
    }
}

/// The scale t of a prior on pair dependence pooled over `pairs`: a cell's residual is
/// `r = δ + σz`, the prior `δ ~ N(0, t·x)` (x the cell's null probability, so t is the pairs'
/// mean squared contingency `E[Σ_c δ²/x]`), and t comes from the method of moments,
/// `t = max(0, Σ (r² − σ²)) / Σ x` over every cell of every pair. Unbiased only over pairs
/// whose residuals no selection has seen (a screening round's pairs, all of them): pairs
/// left out for a small residual would pull it down. 0 for no pairs.
pub fn pooled_prior_scale(pairs: &[&PairGain]) -> f64 {
    let cells = || pairs.iter().flat_map(|g| g.cells.iter());
    let excess: f64 = cells()
        .map(|c| c.residual.powi(2) - c.std_error.powi(2))
        .sum();
    let mass: f64 = cells().map(|c| c.null.max(0.0)).sum();
    if mass > 0.0 {
        excess.max(0.0) / mass
    } else {
        0.0
    }
}

/// Empirical-Bayes estimates of each pair's dependence `Σ_c |δ_c|` (the independence
/// model's L1 error on it) under the prior of [`pooled_prior_scale`] over the same pairs.
pub fn pooled_dependence(pairs: &[&PairGain]) -> Vec<f64> {
    let t = pooled_prior_scale(pairs);
    pairs.iter().map(|g| g.posterior_dependence(t)).collect()
}

/// Lifts the dependence of each pair of `gains` whose own estimate is within `significance`
/// of its standard deviations ([`PairGain::dependence_sd`]) to its posterior when that is
/// larger, under a prior pooled over those pairs only ([`pooled_dependence`]). Pairs
/// significant on their own keep their estimate and stay out of the pool: a normal prior's
/// scale set by a few strong pairs would lift pure-noise pairs to about their noise. Excluding
/// them biases the pooled scale of the rest down (they were chosen for small residuals), which
/// errs towards keeping fewer pairs. Unbiased only over residuals no earlier selection has
/// seen.
pub fn lift_weak_dependence<'a>(
    gains: impl IntoIterator<Item = &'a mut PairGain>,
    significance: f64,
) {
    let mut weak: Vec<&mut PairGain> = gains
        .into_iter()
        .filter(|g| g.dependence <= significance * g.dependence_sd)
        .collect();
    let pooled = pooled_dependence(&weak.iter().map(|g| &**g).collect::<Vec<_>>());
    for (g, posterior) in weak.iter_mut().zip(pooled) {
        g.dependence = g.dependence.max(posterior);
    }
}

/// `E[|δ| | r]` for `r = δ + N(0, v)` and the prior `δ ~ N(0, prior)`: the mean of the folded
/// posterior `N(m, w)`, `m = r·prior/(prior + v)`, `w = prior·v/(prior + v)`,
/// `E|X| = w^{1/2}·√(2/π)·e^{−z²/2} + |m|(1 − 2Φ(−z))` with `z = |m|/√w`.
fn posterior_abs_mean(r: f64, v: f64, prior: f64) -> f64 {
    if prior <= 0.0 {
        return 0.0;
    }
    if v <= 0.0 {
        return r.abs();
    }
    let m = (r * prior / (prior + v)).abs();
    let sd = (prior * v / (prior + v)).sqrt();
    let z = m / sd;
    let lower_tail = 0.5 * erfc(z / std::f64::consts::SQRT_2);
    sd * (2.0 / std::f64::consts::PI).sqrt() * (-0.5 * z * z).exp() + m * (1.0 - 2.0 * lower_tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use ldpsyn::Epsilon;
    use ldpsyn::mechanism::{Mechanism, MechanismKind, SufficientStatistics, norm_sub};
    use rand_chacha::ChaCha12Rng;

    use crate::measure::one_way::one_way_estimates;
    use crate::measure::tables::{Measurements, Tables};
    use crate::numeric::index::outer;

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

    /// A pair's gain with only its cells and their debiased dependence filled in.
    fn gain_of_cells(cells: Vec<NullCell>) -> PairGain {
        let dependence = cells
            .iter()
            .map(|c| {
                (c.residual.powi(2) - c.std_error.powi(2)).max(0.0).sqrt()
                    - NULL_MAGNITUDE * c.std_error
            })
            .sum();
        PairGain {
            observed_l1: 0.0,
            noise_l1: 0.0,
            dependence,
            dependence_sd: dependence_sd(cells.iter().map(|c| c.std_error)),
            projected: Vec::new(),
            interaction_share: 1.0,
            cells,
        }
    }

    /// Lifting with a pool of the pairs within 4 standard deviations of 0: 400 weak binary
    /// pairs (cells `±0.05` from independence, σ = 0.1) among 10 strong ones (`±0.3`) have
    /// their summed dependence recovered within 25% of its true 80, the strong ones keep their
    /// own estimates; 400 independent pairs among 40 strong ones are lifted above their own
    /// (positive) estimates by under half of what a pool of every pair lifts them by
    /// (there the strong pairs set the prior's scale).
    #[test]
    fn weak_pairs_are_lifted_by_a_pool_of_their_own() {
        let mut rng = ChaCha12Rng::seed_from_u64(3);
        let sigma = 0.1;
        let mut pairs = |weak: f64, strong: usize| -> Vec<PairGain> {
            (0..400 + strong)
                .map(|i| {
                    let delta = if i < 400 { weak } else { 0.3 };
                    let cells = [delta, -delta, -delta, delta]
                        .iter()
                        .map(|d| NullCell {
                            null: 0.25,
                            residual: d + sigma * standard_normal(&mut rng),
                            std_error: sigma,
                        })
                        .collect();
                    gain_of_cells(cells)
                })
                .collect()
        };
        let weak_sum = |g: &[PairGain]| g[..400].iter().map(|g| g.dependence).sum::<f64>();
        let gains = pairs(0.05, 10);
        let mut gated = gains.clone();
        lift_weak_dependence(gated.iter_mut(), 4.0);
        assert!(
            (weak_sum(&gated) / 80.0 - 1.0).abs() < 0.25,
            "{}",
            weak_sum(&gated)
        );
        for (lifted, own) in gated[400..].iter().zip(&gains[400..]) {
            assert_eq!(lifted.dependence, own.dependence);
        }
        let gains = pairs(0.0, 40);
        let own: f64 = gains[..400].iter().map(|g| g.dependence.max(0.0)).sum();
        let (mut gated, mut all) = (gains.clone(), gains);
        lift_weak_dependence(gated.iter_mut(), 4.0);
        lift_weak_dependence(all.iter_mut(), f64::INFINITY);
        let (gated, all) = (weak_sum(&gated) - own, weak_sum(&all) - own);
        assert!(gated < 0.5 * all, "lifted by {gated} vs {all} (own {own})");
    }

    /// 200 binary pairs whose cells are each `±delta` from independence, under noise σ = 0.1
    /// per cell: at δ = 0.05 the per-pair `dependence` keeps well under half of the true sum
    /// (40), the pooled estimate recovers it within 25%; pure noise pools to far less.
    #[test]
    fn pooled_dependence_recovers_weak_pairs_in_aggregate() {
        let mut rng = ChaCha12Rng::seed_from_u64(7);
        let mut pairs = |delta: f64| -> Vec<PairGain> {
            (0..200)
                .map(|_| {
                    let cells: Vec<NullCell> = [delta, -delta, -delta, delta]
                        .iter()
                        .map(|d| NullCell {
                            null: 0.25,
                            residual: d + 0.1 * standard_normal(&mut rng),
                            std_error: 0.1,
                        })
                        .collect();
                    gain_of_cells(cells)
                })
                .collect()
        };
        let weak = pairs(0.05);
        let pooled: f64 = pooled_dependence(&weak.iter().collect::<Vec<_>>())
            .iter()
            .sum();
        let per_pair: f64 = weak.iter().map(|g| g.dependence).sum();
        assert!((pooled / 40.0 - 1.0).abs() < 0.25, "pooled {pooled} of 40");
        assert!(per_pair < 0.5 * 40.0, "per pair {per_pair}");
        let none = pairs(0.0);
        let pooled: f64 = pooled_dependence(&none.iter().collect::<Vec<_>>())
            .iter()
            .sum();
        assert!(pooled < 10.0, "pure noise pooled to {pooled}");
    }

    /// The posterior is not biased by a selection on the residuals: 4,000 binary pairs with
    /// dependence drawn from the prior (t = 0.04, x = 0.25 per cell, so δ has sd 0.1) under
    /// noise σ = 0.2; the pairs a screening would leave out (|r| summed below its median) have
    /// a true summed dependence that their posterior recovers within 10%, while their own
    /// debiased estimate keeps under half of it. The prior scale is pooled over all pairs.
    #[test]
    fn posterior_dependence_survives_selection() {
        let mut rng = ChaCha12Rng::seed_from_u64(11);
        let (t, sigma) = (0.04, 0.2);
        let pairs: Vec<(f64, PairGain)> = (0..4000)
            .map(|_| {
                let deltas: Vec<f64> = (0..4)
                    .map(|_| (t * 0.25f64).sqrt() * standard_normal(&mut rng))
                    .collect();
                let cells: Vec<NullCell> = deltas
                    .iter()
                    .map(|d| NullCell {
                        null: 0.25,
                        residual: d + sigma * standard_normal(&mut rng),
                        std_error: sigma,
                    })
                    .collect();
                let truth = deltas.iter().map(|d| d.abs()).sum();
                (truth, gain_of_cells(cells))
            })
            .collect();
        let t_hat = pooled_prior_scale(&pairs.iter().map(|(_, g)| g).collect::<Vec<_>>());
        assert!((t_hat / t - 1.0).abs() < 0.2, "prior scale {t_hat} for {t}");
        let size = |g: &PairGain| g.cells.iter().map(|c| c.residual.abs()).sum::<f64>();
        let mut sizes: Vec<f64> = pairs.iter().map(|(_, g)| size(g)).collect();
        sizes.sort_by(f64::total_cmp);
        let median = sizes[sizes.len() / 2];
        let left_out: Vec<&(f64, PairGain)> =
            pairs.iter().filter(|(_, g)| size(g) < median).collect();
        let truth: f64 = left_out.iter().map(|(d, _)| d).sum();
        let posterior: f64 = left_out
            .iter()
            .map(|(_, g)| g.posterior_dependence(t_hat))
            .sum();
        let own: f64 = left_out.iter().map(|(_, g)| g.dependence).sum();
        assert!(
            (posterior / truth - 1.0).abs() < 0.1,
            "posterior {posterior} of {truth}"
        );
        assert!(own < 0.5 * truth, "own estimate {own} of {truth}");
    }

    #[test]
    fn interaction_share_of_tables() {
        assert!((interaction_share(2, 2) - (1.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert!(interaction_share(100, 100) > 0.99);
        assert_eq!(interaction_share(1, 5), 0.0);
    }

    /// The folded posterior mean: no prior gives 0, no noise gives |r|, and for a huge prior
    /// it tends to the folded normal mean of `N(r, v)`.
    #[test]
    fn posterior_abs_mean_limits() {
        assert_eq!(posterior_abs_mean(0.3, 0.01, 0.0), 0.0);
        assert_eq!(posterior_abs_mean(-0.3, 0.0, 1.0), 0.3);
        let r = 0.0;
        let folded_zero = 0.1 * (2.0 / std::f64::consts::PI).sqrt();
        assert!((posterior_abs_mean(r, 0.01, 1e9) - folded_zero).abs() < 1e-6);
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
        let gain_of = |ms: &Measurements, null| {
            let nulls = NullOneWays::new(ms);
            pair_gain_binned(&nulls, BinnedFactor::full(&[0, 1]), null, |_| true).unwrap()
        };
        // The collection's 1-ways: `a` is half early, half late.
        let one = one_way_estimates(&ms);
        assert!((one[0][0] - 0.4).abs() < 0.05, "{:?}", one[0]);
        let g = gain_of(&ms, Null::SamePeople);
        assert!(
            g.dependence < 2.0 * g.dependence_sd,
            "an independent pair gains {} (sd {})",
            g.dependence,
            g.dependence_sd
        );
        // Against the collection's 1-ways the drift reads as a dependence of ~0.6.
        let c = gain_of(&ms, Null::Collection);
        assert!(c.dependence > 0.4, "{}", c.dependence);
        // A pair measured in the same round as the 1-ways is still judged against them.
        let mut same = Tables::new();
        same.insert(key(0, vec![0]), grr_table(&[3], &early, 20_000, 4));
        same.insert(key(0, vec![1]), grr_table(&[3], &b, 20_000, 5));
        let joint = [0.5, 0.1, 0.1, 0.0, 0.1, 0.1, 0.0, 0.0, 0.1];
        same.insert(key(0, vec![0, 1]), grr_table(&dims, &joint, 20_000, 6));
        let ms = Measurements::new(Epsilon::new(6.0).unwrap(), &dims, &same).unwrap();
        let g = gain_of(&ms, Null::SamePeople);
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

    /// The interaction component keeps a zero-margin dependence whole, drops margin
    /// components, and its standard errors match the projected noise's (3 × 4 table, cell
    /// standard errors 0.05–0.2, 20,000 Monte Carlo draws, within 4%); a binary pair with equal
    /// σ keeps σ/2 per cell (a quarter of the noise).
    #[test]
    fn interaction_cells_project_out_the_margins() {
        let (rows, cols) = (3, 4);
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        // δ with zero row and column sums: double-centred random numbers.
        let raw: Vec<f64> = (0..rows * cols)
            .map(|_| rng.random::<f64>() - 0.5)
            .collect();
        let cells = |r: &[f64], s: &[f64]| -> Vec<NullCell> {
            r.iter()
                .zip(s)
                .map(|(&residual, &std_error)| NullCell {
                    null: 1.0 / 12.0,
                    residual,
                    std_error,
                })
                .collect()
        };
        let zeros = vec![0.0; rows * cols];
        let delta: Vec<f64> = interaction_cells(&cells(&raw, &zeros), rows, cols)
            .iter()
            .map(|c| c.residual)
            .collect();
        // δ plus margin components: the projection returns δ.
        let with_margins: Vec<f64> = (0..rows * cols)
            .map(|c| delta[c] + 0.3 * (c / cols) as f64 - 0.2 * (c % cols) as f64)
            .collect();
        for (got, want) in interaction_cells(&cells(&with_margins, &zeros), rows, cols)
            .iter()
            .zip(&delta)
        {
            assert!(
                (got.residual - want).abs() < 1e-12,
                "{} vs {want}",
                got.residual
            );
        }
        // Standard errors against Monte Carlo.
        let sigma: Vec<f64> = (0..rows * cols)
            .map(|c| 0.05 + 0.15 * c as f64 / 11.0)
            .collect();
        let predicted = interaction_cells(&cells(&zeros, &sigma), rows, cols);
        let mut second = vec![0.0; rows * cols];
        let draws = 20_000;
        for _ in 0..draws {
            let e: Vec<f64> = sigma
                .iter()
                .map(|s| s * standard_normal(&mut rng))
                .collect();
            for (acc, c) in second
                .iter_mut()
                .zip(interaction_cells(&cells(&e, &zeros), rows, cols))
            {
                *acc += c.residual * c.residual / draws as f64;
            }
        }
        for (p, m) in predicted.iter().zip(&second) {
            let ratio = p.std_error.powi(2) / m;
            assert!(
                (ratio - 1.0).abs() < 0.04,
                "predicted {} vs {m}",
                p.std_error.powi(2)
            );
        }
        let binary = interaction_cells(&cells(&[0.1, 0.0, 0.0, 0.0], &[0.2; 4]), 2, 2);
        for c in &binary {
            assert!((c.std_error - 0.1).abs() < 1e-12);
            assert!((c.residual.abs() - 0.025).abs() < 1e-12);
        }
    }
}
