//! `auto`'s screening round: which pairs it measures, binned how, alone or in blocks of
//! several attributes, and with what share of the users (module docs of
//! [`crate::protocols::auto`]).

use std::collections::{BTreeMap, BTreeSet};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha12Rng;

use crate::domain::binned::BinnedFactor;
use crate::domain::sizes::Domain;
use crate::domain::space::{equal_mass_cuts, equal_width_cuts};
use crate::graph::{Edge, EdgeState};
use crate::measure::drift::RoundOneWays;
use crate::numeric::index::{coarsen, outer};
use crate::protocols::auto::selection::Selection;
use crate::protocols::auto::{
    AUTO_BLOCK_SCREENING_SHARE, AUTO_PHASE1_SHARE, Auto, MAX_SCREENING_FACTOR_CELLS,
};
use crate::protocols::context::Context;
use crate::protocols::{graph_state, pairs, round_quota};
use crate::state::{CollectionState, PlannedFactor};

/// Partitions of the attributes tried before a screening design of blocks stops looking for
/// blocks that cover pairs not yet covered (the rest are measured as pairs).
const MAX_PARTITIONS: usize = 256;

/// A screening task: a factor (attributes in increasing order) and its bin maps (empty:
/// none binned).
pub(super) type ScreeningTask = (Vec<usize>, Vec<Vec<u32>>);

/// Blocks of `m` attributes of `attrs` covering every pair of `wanted` (pairs of `attrs`):
/// seeded random partitions of `attrs` into blocks of `m` (the last one filled up from the
/// start of the permutation), keeping each block that covers a pair no earlier block did,
/// until every pair is covered, a block would exceed `max_cells`, or [`MAX_PARTITIONS`]
/// partitions were tried. Returns the blocks and the pairs left uncovered. Deterministic.
pub(super) fn cover_by_blocks(
    domain: &Domain,
    attrs: &[usize],
    wanted: &BTreeSet<Edge>,
    m: usize,
    max_cells: usize,
) -> (Vec<Vec<usize>>, BTreeSet<Edge>) {
    let mut uncovered = wanted.clone();
    let mut blocks: Vec<Vec<usize>> = Vec::new();
    let mut rng = ChaCha12Rng::seed_from_u64(m as u64);
    let mut order = attrs.to_vec();
    for _ in 0..MAX_PARTITIONS {
        if uncovered.is_empty() {
            break;
        }
        order.shuffle(&mut rng);
        for start in (0..order.len()).step_by(m) {
            let mut block: Vec<usize> = order[start..(start + m).min(order.len())].to_vec();
            for &a in &order {
                if block.len() >= m {
                    break;
                }
                if !block.contains(&a) {
                    block.push(a);
                }
            }
            block.sort_unstable();
            let cells = domain.checked_cells(&block);
            if cells.is_none_or(|c| c > max_cells) {
                continue;
            }
            let new: Vec<Edge> = uncovered
                .iter()
                .filter(|(a, b)| block.contains(a) && block.contains(b))
                .copied()
                .collect();
            if new.is_empty() {
                continue;
            }
            for e in &new {
                uncovered.remove(e);
            }
            blocks.push(block);
        }
    }
    (blocks, uncovered)
}

/// Cuts of `bins` contiguous bins of attribute `a` (of `k` codes): equal mass under the
/// 1-way estimates `one_way` when known, else equal width.
pub(super) fn cuts(one_way: Option<&[Vec<f64>]>, a: usize, k: usize, bins: usize) -> Vec<u32> {
    match one_way {
        Some(p) => equal_mass_cuts(&p[a], bins),
        None => equal_width_cuts(k, bins),
    }
}

/// Bin maps of pair `(a, b)` whose attributes get `ka`, `kb` bins (empty when neither is
/// binned).
pub(super) fn pair_bins(
    one_way: Option<&[Vec<f64>]>,
    (a, ka_full, ka): (usize, usize, usize),
    (b, kb_full, kb): (usize, usize, usize),
) -> Vec<Vec<u32>> {
    let bins = vec![cuts(one_way, a, ka_full, ka), cuts(one_way, b, kb_full, kb)];
    if bins.iter().all(Vec::is_empty) {
        Vec::new()
    } else {
        bins
    }
}

/// Under drift, phase 2 also repeats the screening design: `share` of phase 2's reports go
/// to the screening round's `tasks`, spread evenly as in that round, and the plan's `factors`
/// keep the rest in their proportions. The final fit treats rounds as strata
/// ([`crate::measure::drift`]), and a stratum that never measured a pair borrows its odds ratios
/// from the others: on NLTCS in file order (rows sorted by their answers), phase 2's people
/// are unlike the screening round's, and a pair selected against was measured by the
/// screening round only (`benchmarks/sweeps/arrival-design.md`).
pub(super) fn repeat_screening(
    ctx: &Context,
    factors: &mut Vec<PlannedFactor>,
    tasks: Vec<ScreeningTask>,
    share: f64,
) {
    let total: f64 = factors.iter().map(|f| f.weight).sum();
    for f in factors.iter_mut() {
        f.weight *= 1.0 - share;
    }
    let each = share * total / tasks.len().max(1) as f64;
    for (factor, bins) in tasks {
        match factors
            .iter_mut()
            .find(|f| f.factor == factor && f.bins == bins)
        {
            Some(f) => f.weight += each,
            None => factors.push(PlannedFactor {
                mechanism: ctx.best_oracle(BinnedFactor::new(&factor, &bins)),
                factor,
                bins,
                weight: each,
            }),
        }
    }
}

/// Whether phase 2 under drift should repeat the screening design ([`repeat_screening`]),
/// by the selection's predicted 2-way error ([`Auto::select`], summed L1 over the pairs),
/// both ways.
///
/// The repeat costs the selected design `share` of its reports: each factor's noise term
/// `a_f^{3/2}/√n_f` becomes `a_f^{3/2}/√((1 − share)·n_f)`. What it buys: the final fit
/// treats rounds as strata ([`crate::measure::drift`]), and a stratum that did not measure a
/// table borrows its interactions from the strata that did, so without the repeat phase 2's
/// people get the screening round's interactions for every screened table phase 2 does not
/// measure itself (left-out pairs, and the blocks' higher orders). How wrong that is shows
/// in how much the rounds differ: with `P̃_r` the rounds' shrunk 1-ways
/// ([`one_way_drift`](crate::measure::drift::one_way_drift)) and `w_r` their shares, a
/// screened pair's between-round dependence is
/// `M_p = ‖Σ_r w_r P̃_r(a) ⊗ P̃_r(b) − P̄(a) ⊗ P̄(b)‖₁` (`P̄ = Σ_r w_r P̃_r`, over the pair's
/// bin maps), from the rounds seen so far; phase 2's people, still to come, are assumed to
/// continue a linear drift ([`drift_extrapolation`], `extrapolation`). A pair is worth
/// measuring in phase 2's stratum by `extrapolation·M_p` less its noise at the repeat's
/// reports, `a_p^{3/2}/√(share·N₂/T)` over the design's `T` tasks; the repeat is made when
/// these gains exceed its cost. In file order NLTCS (rows grouped by their answers) repeats
/// at ε ≥ 4, where a report is worth most, and UCI bank (a few attributes drift with the
/// campaign) at ε = 2 and 4; at ε = 1 bank never does (the repeat's reports per pair are too
/// few to show its drift above their noise) and NLTCS in some seeds
/// (`benchmarks/sweeps/arrival-design.md`, "Repeat by prediction").
pub(super) fn repeat_pays(
    selection: &Selection,
    edges: &[EdgeState],
    weights: &[(u32, f64)],
    strata: &[Option<RoundOneWays>],
    tasks: usize,
    share: f64,
    extrapolation: f64,
) -> bool {
    let n2: f64 = selection.factors.iter().map(|f| f.weight).sum();
    if n2 <= 0.0 || tasks == 0 || share <= 0.0 || share >= 1.0 {
        return false;
    }
    let cost: f64 = selection
        .factors
        .iter()
        .zip(&selection.noise_weights)
        .filter(|(f, _)| f.weight > 0.0)
        .map(|(f, a)| {
            a.powf(1.5) * (1.0 / ((1.0 - share) * f.weight).sqrt() - 1.0 / f.weight.sqrt())
        })
        .sum();
    let each = share * n2 / tasks as f64;
    let gain: f64 = selection
        .screened_noise_weights
        .iter()
        .map(|&((a, b), ap)| {
            let bins = edges
                .iter()
                .find(|e| (e.a, e.b) == (a, b))
                .map(|e| e.bins.clone())
                .unwrap_or_default();
            let ab = [a, b];
            let pair = BinnedFactor::new(&ab, &bins);
            let m = mixture_dependence(weights, strata[a].as_ref(), strata[b].as_ref(), pair);
            (extrapolation * m - ap.powf(1.5) / each.sqrt()).max(0.0)
        })
        .sum();
    gain > cost
}

/// How much more between-round dependence the whole population holds than the rounds seen
/// so far, if each attribute drifts linearly in arrival position: a pair's mixture
/// dependence is then `β_a β_b·Var(t)`, with `t` a round's mid-position in the arrival order
/// and `Var` over the rounds weighted by their shares. `seen` are the shares of the rounds
/// measured so far, in arrival order; `rest` the share of the users still to come (one
/// round). 1 when nothing is to come or the rounds seen do not spread.
pub(super) fn drift_extrapolation(seen: &[f64], rest: f64) -> f64 {
    let mut rounds = Vec::new();
    let mut start = 0.0;
    for &w in seen.iter().chain(std::iter::once(&rest)) {
        rounds.push((w, start + w / 2.0));
        start += w;
    }
    let variance = |rounds: &[(f64, f64)]| {
        let total: f64 = rounds.iter().map(|r| r.0).sum();
        if total <= 0.0 {
            return 0.0;
        }
        let mean: f64 = rounds.iter().map(|r| r.0 * r.1).sum::<f64>() / total;
        rounds
            .iter()
            .map(|r| r.0 * (r.1 - mean).powi(2))
            .sum::<f64>()
            / total
    };
    let seen_var = variance(&rounds[..seen.len()]);
    if seen_var <= 0.0 || rest <= 0.0 {
        return 1.0;
    }
    variance(&rounds) / seen_var
}

/// `‖Σ_r w_r x_r ⊗ y_r − x̄ ⊗ ȳ‖₁` over the rounds of `weights` that hold both 1-ways (`w_r`
/// normalized over them, `x̄ = Σ_r w_r x_r`; `x`, `y` the per-round 1-ways of the pair
/// `(a, b)`), each 1-way coarsened by its attribute's bin map in `pair`: the dependence a
/// pair's population table holds because its rounds differ (0 without per-round 1-ways).
pub(super) fn mixture_dependence(
    weights: &[(u32, f64)],
    x: Option<&RoundOneWays>,
    y: Option<&RoundOneWays>,
    pair: BinnedFactor<'_>,
) -> f64 {
    let (Some(x), Some(y)) = (x, y) else {
        return 0.0;
    };
    let coarse = |v: &Vec<f64>, i: usize| match pair.cuts(i) {
        [] => v.clone(),
        cuts => coarsen(v, &[v.len()], &[cuts.to_vec()]),
    };
    // Per round holding both: (share, x_r, y_r).
    let rounds: Vec<(f64, Vec<f64>, Vec<f64>)> = weights
        .iter()
        .filter_map(|(r, w)| Some((*w, coarse(x.get(r)?, 0), coarse(y.get(r)?, 1))))
        .collect();
    let total: f64 = rounds.iter().map(|r| r.0).sum();
    let (Some(first), true) = (rounds.first(), total > 0.0) else {
        return 0.0;
    };
    let mut xbar = vec![0.0; first.1.len()];
    let mut ybar = vec![0.0; first.2.len()];
    let mut mixed = vec![0.0; xbar.len() * ybar.len()];
    for (w, xr, yr) in &rounds {
        xbar.iter_mut()
            .zip(xr)
            .for_each(|(m, v)| *m += w / total * v);
        ybar.iter_mut()
            .zip(yr)
            .for_each(|(m, v)| *m += w / total * v);
        mixed
            .iter_mut()
            .zip(outer(xr, yr))
            .for_each(|(m, v)| *m += w / total * v);
    }
    let l1: f64 = mixed
        .iter()
        .zip(outer(&xbar, &ybar))
        .map(|(m, p)| (m - p).abs())
        .sum();
    l1
}

impl Auto {
    /// The screening round's share of the users: with φ the fraction of its active pairs
    /// its design ([`Auto::screening_tasks`]) measures in blocks of more than two attributes
    /// ([`Auto::block_fraction`]), `(1 − φ)·`[`AUTO_PHASE1_SHARE`]` +
    /// φ·`[`AUTO_BLOCK_SCREENING_SHARE`] (a design of pairs only gets the pair share, one of
    /// blocks only the block share). An explicit `auto_phase1_share` option sets both.
    /// Weighing by φ rather than switching on any block matters for wide tables at a few
    /// thousand people, whose design of ~580 pairs may hold a dozen blocks: the block share
    /// starved their 1-ways (`benchmarks/sweeps/auto-block-share.md`, "Mixed designs").
    pub(super) fn screening_share(&self, ctx: &Context, phi: f64) -> f64 {
        let options = ctx.options();
        if let Some(s) = options.auto_phase1_share {
            return s;
        }
        let block_share = options
            .auto_block_share
            .unwrap_or(AUTO_BLOCK_SCREENING_SHARE);
        ((1.0 - phi) * AUTO_PHASE1_SHARE + phi * block_share)
            .clamp(0.0, 1.0 - self.round0_share(ctx))
    }

    /// φ: the fraction of the active pairs of `edges` that the screening design `tasks`
    /// ([`Auto::screening_tasks`]) measures in blocks of more than two attributes.
    pub(super) fn block_fraction(tasks: &[ScreeningTask], edges: &[EdgeState]) -> f64 {
        let active: Vec<&EdgeState> = edges.iter().filter(|e| e.active).collect();
        let in_blocks = active
            .iter()
            .filter(|e| {
                // Binned pairs are always pair tasks, even with both attributes in a block.
                e.bins.is_empty()
                    && tasks
                        .iter()
                        .any(|(f, _)| f.len() > 2 && f.contains(&e.a) && f.contains(&e.b))
            })
            .count();
        in_blocks as f64 / active.len().max(1) as f64
    }

    /// The share of the screening round's people who report an attribute alone (taken from
    /// its pairs): round 0's share of the collection, times the fraction `1 − φ` of the
    /// design in pairs (φ, [`Auto::block_fraction`]). Every round then holds the 1-ways of its
    /// own people, so that rounds can be strata of the population ([`crate::measure::drift`]): a pair
    /// report estimates its two 1-ways far more noisily than a report of one attribute, while
    /// a block of m attributes holds m of them in one report, and its round needs no slice.
    /// With i.i.d. arrivals the slice's reports count towards phase 2's 1-ways like round
    /// 0's (`top_up`). Compared over every suite table in both arrival orders with taking the
    /// slice from phase 2 instead (`benchmarks/sweeps/arrival-design.md`); slices of 0.3–0.6
    /// of the pair part are within 1.5% of it on average (`benchmarks/sweeps/one-way-slice.md`).
    pub(super) fn one_way_slice(&self, ctx: &Context, phi: f64) -> f64 {
        self.round0_share(ctx) * (1.0 - phi)
    }

    /// The bin maps `auto` screens pair `(a, b)` under, or `None` if it never measures it.
    /// A factor is worth measuring only if, with the users of a tree-sized phase 2 (`N₂/d`
    /// reports: about `d − 1` pairs and `d` 1-ways share it), its expected L1 noise can be
    /// below the noise budget ([`AUTO_BIN_NOISE_L1`]), and below the largest dependence an
    /// `m_a × m_b` table can show, `2(1 − 1/min(m_a, m_b))` (the L1 distance of a perfectly
    /// correlated table with uniform margins from their product). A pair over that at full
    /// resolution is coarsened: its attribute with more bins is halved until it fits, or until
    /// both have 2 bins and it still does not. Bins are contiguous runs of codes, of equal
    /// mass under round 0's 1-way estimates `one_way` when known (a code heavier than a share
    /// is a bin of its own), else of equal width (VertiMRF §6.1's data-independent binning).
    pub(super) fn screening_bins(
        &self,
        ctx: &Context,
        one_way: Option<&[Vec<f64>]>,
        a: usize,
        b: usize,
    ) -> Option<Vec<Vec<u32>>> {
        let dims = ctx.dims();
        let n_ref = self.phase2_users(ctx) / dims.len() as f64;
        let budget = self.bin_noise_l1(ctx);
        let (mut ka, mut kb) = (dims[a], dims[b]);
        // A table of C cells has sampling error alone √(2/π)·Σ√(x(1−x)/n) ≈ √(2C/(πn)) at
        // the uniform point, so it passes the ceiling 2 only if C < 2π·n: resolutions above
        // that (or above a task's largest pair) fail the test below and are skipped without
        // allocating their tables, in the loop's own halving order.
        let cap = (2.0 * std::f64::consts::PI * n_ref.max(1.0) + 4.0)
            .min(crate::domain::task::MAX_PAIR_CELLS as f64);
        while (ka * kb) as f64 > cap && !(ka <= 2 && kb <= 2) {
            if ka >= kb {
                ka = ka.div_ceil(2).max(2);
            } else {
                kb = kb.div_ceil(2).max(2);
            }
        }
        loop {
            let bins = pair_bins(one_way, (a, dims[a], ka), (b, dims[b], kb));
            let uniform = vec![1.0 / (ka * kb) as f64; ka * kb];
            let ceiling = 2.0 * (1.0 - 1.0 / ka.min(kb) as f64);
            let noise = ctx.expected_noise_l1(BinnedFactor::new(&[a, b], &bins), &uniform, n_ref);
            if noise < budget.min(ceiling) {
                return Some(bins);
            }
            if ka <= 2 && kb <= 2 {
                return None;
            }
            if ka >= kb {
                ka = ka.div_ceil(2).max(2);
            } else {
                kb = kb.div_ceil(2).max(2);
            }
        }
    }

    /// The screening round's state: every pair that could pay for its reports, binned by
    /// [`Auto::screening_bins`] under `one_way`.
    pub(super) fn screening_state(
        &self,
        ctx: &Context,
        one_way: Option<&[Vec<f64>]>,
    ) -> CollectionState {
        let screened: BTreeMap<Edge, Vec<Vec<u32>>> = pairs(ctx.dims().len())
            .into_iter()
            .filter_map(|(a, b)| Some(((a, b), self.screening_bins(ctx, one_way, a, b)?)))
            .collect();
        let mut state = graph_state(ctx, &self.params, 1, self.share(ctx), |a, b| {
            screened.get(&(a, b)).cloned()
        });
        let tasks = self.screening_tasks(ctx, state.edges());
        let share = self.screening_share(ctx, Self::block_fraction(&tasks, state.edges()));
        state.round_quota = Some(round_quota(ctx, share, 1));
        state
    }

    /// The screening round's tasks for its active pairs `edges` (docs/design.md "Adaptive
    /// rounds"). One report of a pair is, at large ε, mostly sampling noise, while one report
    /// of a factor of m attributes estimates all its C(m, 2) pairs at little more randomizer
    /// noise each (a marginal sums the factor's cells; [`Engine::marginal_noise_l1`]). So the
    /// pairs screened at full resolution may be measured in blocks: for each block size
    /// m = 2, 3, … the blocks of [`cover_by_blocks`] cover them (m = 2: the pairs
    /// themselves), the binned pairs stay pair tasks, users are spread evenly over the
    /// tasks, and the design with the lowest summed expected L1 noise of the active pairs'
    /// combined estimates (inverse-variance pooling over the tasks holding each pair) wins;
    /// ties go to the smaller m. At small ε the randomizer's noise grows with the cells
    /// merged, and the pairs win.
    pub(super) fn screening_tasks(&self, ctx: &Context, edges: &[EdgeState]) -> Vec<ScreeningTask> {
        let active: Vec<&EdgeState> = edges.iter().filter(|e| e.active).collect();
        let pair_task = |e: &EdgeState| (vec![e.a, e.b], e.bins.clone());
        let full: BTreeSet<Edge> = active
            .iter()
            .filter(|e| e.bins.is_empty())
            .map(|e| (e.a, e.b))
            .collect();
        let attrs: Vec<usize> = full
            .iter()
            .flat_map(|&(a, b)| [a, b])
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let pairs_only: Vec<ScreeningTask> = active.iter().map(|e| pair_task(e)).collect();
        // Σ over active pairs of 1/√(precision), precision = Σ_tasks (1/T)/K²: the summed
        // L1 noise at one user in all (every design scales alike with the round's users).
        let objective = |tasks: &[ScreeningTask]| -> f64 {
            let share = 1.0 / tasks.len() as f64;
            let mut precision: BTreeMap<Edge, f64> = BTreeMap::new();
            for (f, bins) in tasks {
                let task = BinnedFactor::new(f, bins);
                for e in &active {
                    let (Some(i), Some(j)) = (
                        f.iter().position(|&x| x == e.a),
                        f.iter().position(|&x| x == e.b),
                    ) else {
                        continue;
                    };
                    let of = |k: usize| task.cuts(k);
                    let same_bins = if e.bins.is_empty() {
                        of(i).is_empty() && of(j).is_empty()
                    } else {
                        of(i) == e.bins[0].as_slice() && of(j) == e.bins[1].as_slice()
                    };
                    if !same_bins {
                        continue;
                    }
                    let k = ctx.marginal_noise_l1(task, &[e.a, e.b], 1.0);
                    *precision.entry((e.a, e.b)).or_default() += share / (k * k);
                }
            }
            active
                .iter()
                .map(|e| {
                    precision
                        .get(&(e.a, e.b))
                        .map_or(f64::INFINITY, |p| 1.0 / p.sqrt())
                })
                .sum()
        };
        let mut best = (objective(&pairs_only), pairs_only);
        for m in 3..=attrs.len() {
            let (blocks, left) =
                cover_by_blocks(ctx.domain(), &attrs, &full, m, MAX_SCREENING_FACTOR_CELLS);
            if blocks.is_empty() {
                break;
            }
            let tasks: Vec<ScreeningTask> = blocks
                .into_iter()
                .map(|b| (b, Vec::new()))
                .chain(
                    active
                        .iter()
                        .filter(|e| !e.bins.is_empty() || left.contains(&(e.a, e.b)))
                        .map(|e| pair_task(e)),
                )
                .collect();
            let j = objective(&tasks);
            if j < best.0 {
                best = (j, tasks);
            }
        }
        best.1
    }
}
