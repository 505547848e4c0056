//! `auto` (docs/design.md "Adaptive rounds"): round 0 ([`AUTO_ROUND0_SHARE`] of the users)
//! measures every attribute alone; a screening round ([`AUTO_PHASE1_SHARE`]) then measures,
//! uniformly, every pair that could ever pay for its reports, with the lower-variance oracle,
//! a pair too large for its reports over contiguous bins of equal estimated mass (round 0's
//! 1-ways; VertiMRF §6.1's binning with the bins placed by an earlier LDP estimate), and
//! pairs at full resolution in blocks of several attributes when one report of a block
//! estimates its pairs with less summed noise than reports of the pairs alone (large ε,
//! small domains: `Auto::screening_tasks`; the round's share then moves towards
//! [`AUTO_BLOCK_SCREENING_SHARE`] with the fraction of its pairs in blocks), with a slice of
//! its people on 1-ways where its design is in pairs (`Auto::one_way_slice`); at its
//! close the pairs are selected greedily by predicted 2-way error (`Auto::select`), and
//! phase 2 measures the selected pairs and every attribute alone, allocated to minimize that
//! prediction. Round 0's reports are not spent on structure only: they enter the final fit
//! as 1-way measurements like phase 2's. When the rounds' people differ beyond noise
//! ([`crate::measure::drift`]), phase 2 counts no earlier 1-way reports and also repeats the
//! screening design (`repeat_screening`), so that every round measures what the model uses
//! and the fit can treat rounds as strata. With too few users nothing is screened and the
//! collection is the independence model from the start, or nothing is selected and phase 2
//! measures 1-ways only. The model graph may keep any measured pair. A state stored by a
//! release without round 0 (screening in round 0) closes straight into phase 2.

use std::collections::{BTreeMap, BTreeSet};

use ldpsyn::factor::cuts_of;
use ldpsyn::protocol::PrivIncrParams;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha12Rng;

use super::{
    CollectionProtocol, TaskChoices, active_edges, adapted_working_bins, common_choices,
    end_phase1_round, graph_state, one_way_choices, one_way_state, pairs, plan_structure,
    round_quota,
};
use crate::EngineError;
use crate::domain::space::{equal_mass_cuts, equal_width_cuts};
use crate::domain::task::TaskSpec;
use crate::graph::{Edge, EdgeState, edge};
use crate::measure::drift::one_way_drift;
use crate::measure::measurement::Measurement;
use crate::measure::one_way::one_way_estimates;
use crate::measure::tables::Measurements;
use crate::measure::tables::Tables;
use crate::numeric::info::mutual_information;
use crate::protocols::context::Context;
use crate::select::gain::{Null, PairGain, best_pair_gain, pair_gain_binned, projected_noise_l1};
use crate::select::model_graph::{clique_cap, largest_clique_cells};
use crate::state::{CollectionState, Phase, PlannedFactor, Transition};

/// Share of the users `auto` spends on its screening round (every screened pair measured
/// alike); `omega` of the config is ignored by `auto`. Chosen by a sweep over adult,
/// nist-taxi, temporal-match2 and the built-in network at ε ∈ {1, 2, 4, 8}
/// (`benchmarks/sweeps/auto-screening-share.md`): shares 0.1–0.5 are within 1.5% of each
/// other on average, 0.3 among the best. Re-swept with round 0 over those and adult-1.5m,
/// 3 seeds: 0.3 best in 14 of 20 cells, 0.2 and 0.4 worse by 3.9% and 2.0% on average.
pub const AUTO_PHASE1_SHARE: f64 = 0.3;

/// Share of the users in `auto`'s screening round when its design measures every pair in
/// blocks of more than two attributes (`Auto::screening_tasks`; large ε, small domains; a
/// design that measures a fraction φ of its pairs in blocks gets `(1 − φ)·0.3 + φ·0.6`):
/// a block's report is a measurement of many pairs at once and enters the final fit, so
/// the round that measures every pair is worth more users than when it measures one pair
/// per report.
/// Chosen by a sweep of 0.3 (the pair share), 0.45, 0.6 and 0.75 over every cell where
/// blocks are chosen: the survey table of `examples/survey` at 21,574 and 10,000 people
/// (ε = 2, 4, 8) and adult, nist-taxi, temporal-match2, the built-in network and adult-1.5m
/// at ε = 8, 3 seeds (`benchmarks/sweeps/auto-block-share.md`): 0.6 has the lowest mean
/// ratio to 0.3 together with 0.75 (0.876 and 0.873) and the lower worst cell (1.05 vs
/// 1.09, nist-taxi).
pub const AUTO_BLOCK_SCREENING_SHARE: f64 = 0.6;

/// Expected L1 noise (at a tree-sized phase-2 allocation) below which `auto` measures a pair
/// at a resolution; a pair above it is measured over coarser bins
/// (`Auto::screening_bins`). Chosen by a sweep of 2, 1, 0.5, 0.25, 0.125 and 0.0625 over
/// adult, nist-taxi, temporal-match2 and the built-in network at ε ∈ {1, 2, 4, 8}, 3 seeds
/// (`benchmarks/sweeps/auto-bin-noise.md`): 0.25 has the lowest mean 2-way TVD over the 16
/// cells; it loses 3–12% to full-resolution screening on Adult and gains up to 19% on
/// nist-taxi and temporal-match2.
pub const AUTO_BIN_NOISE_L1: f64 = 0.25;

/// Share of the users in `auto`'s round 0, which measures every attribute alone so that the
/// screening round can bin pairs by equal estimated mass ([`equal_mass_cuts`]); its reports
/// count towards the 1-ways' phase-2 allocation (`top_up`). Chosen by a sweep of 0 (no
/// round 0: equal-width bins), 0.05, 0.1, 0.2 and 0.3 over adult, nist-taxi,
/// temporal-match2, the built-in network and adult-1.5m at ε ∈ {1, 2, 4, 8}, 3 seeds
/// (`benchmarks/sweeps/auto-round0-share.md`): 0.2 has the lowest mean ratio to no round 0
/// (0.966) and the lowest worst cell (1.02).
pub const AUTO_ROUND0_SHARE: f64 = 0.2;

/// Largest factor (cells) `auto`'s screening design asks a device to report: bounds a
/// report's size (an OUE report carries one bit per cell, 512 bytes here). A resource
/// bound, not a utility constant: the design's noise objective stays below it (16 binary
/// attributes are screened in blocks of 3, 5 and 9 attributes, 8, 32 and 512 cells, at
/// ε = 2, 4 and 8).
pub const MAX_SCREENING_FACTOR_CELLS: usize = 4096;

/// Partitions of the attributes tried before a screening design of blocks stops looking for
/// blocks that cover pairs not yet covered (the rest are measured as pairs).
const MAX_PARTITIONS: usize = 256;

/// A screening task: a factor (attributes in increasing order) and its bin maps (empty:
/// none binned).
type ScreeningTask = (Vec<usize>, Vec<Vec<u32>>);

/// Blocks of `m` attributes of `attrs` covering every pair of `wanted` (pairs of `attrs`):
/// seeded random partitions of `attrs` into blocks of `m` (the last one filled up from the
/// start of the permutation), keeping each block that covers a pair no earlier block did,
/// until every pair is covered, a block would exceed `max_cells`, or [`MAX_PARTITIONS`]
/// partitions were tried. Returns the blocks and the pairs left uncovered. Deterministic.
fn cover_by_blocks(
    dims: &[usize],
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
            let cells = block
                .iter()
                .try_fold(1usize, |acc, &a| acc.checked_mul(dims[a]));
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
fn cuts(one_way: Option<&[Vec<f64>]>, a: usize, k: usize, bins: usize) -> Vec<u32> {
    match one_way {
        Some(p) => equal_mass_cuts(&p[a], bins),
        None => equal_width_cuts(k, bins),
    }
}

/// Bin maps of pair `(a, b)` whose attributes get `ka`, `kb` bins (empty when neither is
/// binned).
fn pair_bins(
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

/// Phase-2 reports per factor, `n_f = max(0, c·a_f − m_f)` with `c` such that
/// `Σ n_f = n2`: the allocation `∝ a_f` of the totals `m_f + n_f` (which minimizes
/// `Σ_f w_f K_f/√(m_f + n_f)` when no factor is over-measured already) for factors that
/// already hold `m_f` reports. Water-filling by bisection on `c`; with no earlier reports it
/// is `a_f·n2/Σa`, the allocation without offsets.
fn top_up(a: &[f64], m: &[f64], n2: f64) -> Vec<f64> {
    let given = |c: f64| -> f64 { a.iter().zip(m).map(|(a, m)| (c * a - m).max(0.0)).sum() };
    let a_sum: f64 = a.iter().sum();
    if a_sum <= 0.0 || n2 <= 0.0 {
        return a.to_vec();
    }
    let (mut lo, mut hi) = (0.0, (n2 + m.iter().sum::<f64>()) / a_sum);
    while given(hi) < n2 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if given(mid) < n2 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    a.iter()
        .zip(m)
        .map(|(a, m)| (hi * a - m).max(0.0))
        .collect()
}

/// Reports of a 1-way over the working bins (with its best oracle) that estimate the bins'
/// totals as well as 1-way measurement `m` does when its attribute's distribution is `at`:
/// its own reports, or fewer when it was measured in sub-bins, whose block sums are noisier
/// (`n·(K_w/K_m)²`, with `K` the summed standard errors of the bins' totals, both ∝ 1/√n:
/// the one variance model of [`crate::measure::measurement::Measurement::cell_variances`]).
fn equivalent_reports(ctx: &Context, ms: &Measurements, m: &Measurement, at: &[f64]) -> f64 {
    let n = m.estimate.n as f64;
    let [a] = m.key.factor[..] else { return n };
    if m.refined.is_none() || at.len() != ctx.dims()[a] {
        return n;
    }
    let own: f64 = m
        .cell_variances(&[a], at, ms.population())
        .iter()
        .map(|v| v.max(0.0).sqrt())
        .sum();
    let working: f64 = ctx.cell_std_errors(&[a], &[], at, n).iter().sum();
    if own > 0.0 && working.is_finite() {
        n * (working / own).powi(2).min(1.0)
    } else {
        n
    }
}

/// `auto`'s rules.
#[derive(Debug, Clone)]
pub struct Auto {
    params: PrivIncrParams,
}

/// Under drift, phase 2 also repeats the screening design: `share` of phase 2's reports go
/// to the screening round's `tasks`, spread evenly as in that round, and the plan's `factors`
/// keep the rest in their proportions. The final fit treats rounds as strata
/// ([`crate::measure::drift`]), and a stratum that never measured a pair borrows its odds ratios
/// from the others: on NLTCS in file order (rows sorted by their answers), phase 2's people
/// are unlike the screening round's, and a pair selected against was measured by the
/// screening round only (`benchmarks/sweeps/arrival-design.md`).
fn repeat_screening(
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
                mechanism: ctx.best_oracle(&factor, &bins),
                factor,
                bins,
                weight: each,
            }),
        }
    }
}

impl Auto {
    /// The rules; of `params` only `phi` (recorded τ) and `sigma` (the displayed structure)
    /// are used.
    pub fn new(params: PrivIncrParams) -> Self {
        Self { params }
    }

    fn share(&self, ctx: &Context) -> f64 {
        ctx.options().auto_phase1_share.unwrap_or(AUTO_PHASE1_SHARE)
    }

    /// Users `auto` expects in phase 2: those not in round 0 or the screening round.
    fn phase2_users(&self, ctx: &Context) -> f64 {
        self.phase2_users_after(ctx, self.share(ctx))
    }

    /// Users in phase 2 when the screening round takes `screening_share` of them.
    fn phase2_users_after(&self, ctx: &Context, screening_share: f64) -> f64 {
        (1.0 - screening_share - self.round0_share(ctx)).max(0.0) * ctx.target_users() as f64
    }

    /// The screening round's share of the users: with φ the fraction of its active pairs
    /// its design ([`Auto::screening_tasks`]) measures in blocks of more than two attributes
    /// ([`Auto::block_fraction`]), `(1 − φ)·`[`AUTO_PHASE1_SHARE`]` +
    /// φ·`[`AUTO_BLOCK_SCREENING_SHARE`] (a design of pairs only gets the pair share, one of
    /// blocks only the block share). An explicit `auto_phase1_share` option sets both.
    /// Weighing by φ rather than switching on any block matters for wide tables at a few
    /// thousand people, whose design of ~580 pairs may hold a dozen blocks: the block share
    /// starved their 1-ways (`benchmarks/sweeps/auto-block-share.md`, "Mixed designs").
    fn screening_share(&self, ctx: &Context, phi: f64) -> f64 {
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
    fn block_fraction(tasks: &[ScreeningTask], edges: &[EdgeState]) -> f64 {
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
    fn one_way_slice(&self, ctx: &Context, phi: f64) -> f64 {
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
    fn screening_bins(
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
        loop {
            let bins = pair_bins(one_way, (a, dims[a], ka), (b, dims[b], kb));
            let uniform = vec![1.0 / (ka * kb) as f64; ka * kb];
            let ceiling = 2.0 * (1.0 - 1.0 / ka.min(kb) as f64);
            let noise = ctx.expected_noise_l1(&[a, b], &bins, &uniform, n_ref);
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

    /// Round 0's share of the users (at most half).
    fn round0_share(&self, ctx: &Context) -> f64 {
        ctx.options()
            .auto_round0_share
            .unwrap_or(AUTO_ROUND0_SHARE)
            .clamp(0.0, 0.5)
    }

    /// The screening round's state: every pair that could pay for its reports, binned by
    /// [`Auto::screening_bins`] under `one_way`.
    fn screening_state(&self, ctx: &Context, one_way: Option<&[Vec<f64>]>) -> CollectionState {
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
    fn screening_tasks(&self, ctx: &Context, edges: &[EdgeState]) -> Vec<ScreeningTask> {
        let dims = ctx.dims();
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
                for e in &active {
                    let (Some(i), Some(j)) = (
                        f.iter().position(|&x| x == e.a),
                        f.iter().position(|&x| x == e.b),
                    ) else {
                        continue;
                    };
                    let of = |k: usize| cuts_of(bins, k);
                    let same_bins = if e.bins.is_empty() {
                        of(i).is_empty() && of(j).is_empty()
                    } else {
                        of(i) == e.bins[0].as_slice() && of(j) == e.bins[1].as_slice()
                    };
                    if !same_bins {
                        continue;
                    }
                    let k = ctx.marginal_noise_l1(f, bins, &[e.a, e.b], 1.0);
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
                cover_by_blocks(dims, &attrs, &full, m, MAX_SCREENING_FACTOR_CELLS);
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

    fn bin_noise_l1(&self, ctx: &Context) -> f64 {
        ctx.options()
            .auto_bin_noise_l1
            .unwrap_or(AUTO_BIN_NOISE_L1)
            .min(2.0)
    }

    /// `auto`'s selection after its screening round (docs/design.md "Adaptive rounds"; PPSyn
    /// Alg. 2's contribution per budget). Each screened pair's dependence `D̂` (its L1
    /// distance from independence, debiased for the screening noise: [`PairGain`]) is
    /// estimated from the screening tables, against the 1-ways of the screening round's
    /// people ([`Null::SamePeople`]: round 0 saw earlier people, and a drift between the
    /// rounds is no dependence). A factor f measured by n reports has expected L1
    /// noise `K_f/√n` (randomizer and sampling variances are both ∝ 1/n; `K_f` at the
    /// estimate — round 0's for a 1-way, the screening's for a pair — scaled by the share of
    /// noise its simplex projection keeps at a tree-sized allocation `N₂/d`,
    /// [`projected_noise_l1`]: a skewed 1-way, like a sparse pair, loses most of its noise
    /// to it, so it needs fewer reports than its cell count suggests;
    /// `benchmarks/sweeps/one-way-allocation.md`).
    /// Phase 2 measures every attribute alone and the selected pairs S; its 2-way error is
    /// predicted as `Σ_{p∉S} D̂_p + Σ_f w_f K_f/√n_f`, with `w_f` the number of 2-way
    /// marginals a factor's error enters (1 for a pair, `d − 1` for a 1-way). Under
    /// `Σ n_f = N₂` the allocation `n_f ∝ a_f = (w_f K_f)^{2/3}` minimizes the noise part to
    /// `A^{3/2}/√N₂` with `A = Σ_f a_f`. Pairs are added greedily, each time the one that
    /// lowers the prediction most, within the clique cap, until none does. With too few users
    /// nothing is selected and `auto` is the independence model. Reports a 1-way already
    /// holds from earlier rounds count towards its total (none when `drifted`: the rounds'
    /// people differed): phase 2 tops the totals up to `∝ a_f` ([`top_up`]), and the
    /// prediction's noise part is `A^{3/2}/√(N₂ + M)` with M those reports; `N₂` is what
    /// round 0 and the screening round (`screening_share` of the users) leave. Returns the pairs not selected (pruned) and the phase-2 factors with their
    /// task weights (expected phase-2 reports).
    fn select(
        &self,
        ctx: &Context,
        state: &mut CollectionState,
        ms: &Measurements,
        drifted: bool,
        screening_share: f64,
    ) -> (Vec<Edge>, Vec<PlannedFactor>) {
        let d = ctx.dims().len();
        let round = state.round;
        let one = one_way_estimates(ms);
        let n2 = self.phase2_users_after(ctx, screening_share).max(1.0);
        let n_ref = (n2 / d as f64).max(1.0);
        // The share of a table's noise that its simplex projection keeps, at a tree-sized
        // phase-2 allocation (sparse and skewed tables lose much of their noise to it).
        let kept_share = |f: &[usize], bins: &[Vec<u32>], at: &[f64], seed: u64| {
            let sigma = ctx.cell_std_errors(f, bins, at, n_ref);
            let raw = ctx.expected_noise_l1(f, bins, at, n_ref);
            let kept = projected_noise_l1(at, &sigma, seed);
            if raw > 0.0 {
                (kept / raw).min(1.0)
            } else {
                1.0
            }
        };
        // A 1-way's seed apart from every pair's (pair indices are below 2^32).
        let allocation = |f: &[usize], at: &[f64], w: f64| {
            let share = kept_share(f, &[], at, u64::MAX - f[0] as u64);
            (w * share * ctx.expected_noise_l1(f, &[], at, 1.0)).powf(2.0 / 3.0)
        };
        let mut factors: Vec<PlannedFactor> = (0..d)
            .map(|a| PlannedFactor {
                factor: vec![a],
                mechanism: ctx.best_oracle(&[a], &[]),
                weight: allocation(&[a], &one[a], (d - 1).max(1) as f64),
                bins: Vec::new(),
            })
            .collect();
        // (pair index, D̂, a_p) of every screened pair with positive dependence.
        let mut candidates: Vec<(usize, f64, f64)> = Vec::new();
        let edges = match state.pair_rounds_mut() {
            Some(r) => &mut r.edges,
            None => return (Vec::new(), factors),
        };
        for (i, e) in edges.iter_mut().enumerate() {
            if !e.active {
                continue;
            }
            let Some(g) = pair_gain_binned(ms, &one, e.a, e.b, &e.bins, Null::SamePeople, |_| true)
            else {
                continue;
            };
            e.reports = ms
                .combined_binned(&[e.a, e.b], &e.bins, |_| true, None)
                .map_or(0, |c| c.reports);
            let Some(pdims) = ctx.factor_dims(&[e.a, e.b], &e.bins) else {
                continue;
            };
            e.mi = Some(mutual_information(&g.projected, pdims[0], pdims[1]));
            let dependence = g.dependence;
            e.score = Some(dependence);
            if dependence > 0.0 {
                // Noise scale K at the screening estimate, times the share of it that the
                // simplex projection leaves at a tree-sized phase-2 allocation (sparse
                // tables lose much of their noise to it).
                let f = [e.a, e.b];
                let at = &g.projected;
                let k = ctx.expected_noise_l1(&f, &e.bins, at, 1.0);
                let shrink = kept_share(&f, &e.bins, at, i as u64);
                candidates.push((i, dependence, (shrink * k).powf(2.0 / 3.0)));
            }
        }
        let cap = clique_cap(ctx.options().max_clique_cells, ctx.target_users());
        // Earlier rounds' 1-way reports count towards phase 2's: the noise of a 1-way
        // measured by m_f earlier and n_f later reports is K_f/√(m_f + n_f), with sub-bin
        // reports counted at what they are worth for the bins' totals. Not when the
        // population changed between the rounds: then earlier people describe only
        // themselves, and the final fit post-stratifies by round (`crate::measure::drift`), so
        // phase 2's people need 1-ways of their own.
        let earlier: Vec<f64> = (0..d)
            .map(|a| {
                if drifted {
                    return 0.0;
                }
                ms.containing(&[a])
                    .filter(|m| m.key.factor == [a] && m.key.bins_of(a).is_empty())
                    .map(|m| equivalent_reports(ctx, ms, m, &one[a]))
                    .sum()
            })
            .collect();
        let m_total: f64 = earlier.iter().sum();
        let mut a_total: f64 = factors.iter().map(|f| f.weight).sum();
        let noise = |a: f64| a.powf(1.5) / (n2 + m_total).sqrt();
        let mut graph = BTreeSet::new();
        let mut keep = BTreeSet::new();
        loop {
            // The candidate whose addition lowers the predicted error most (ties: index).
            let best = candidates
                .iter()
                .enumerate()
                .map(|(j, &(i, dep, a))| (dep - (noise(a_total + a) - noise(a_total)), j, i))
                .max_by(|x, y| x.0.total_cmp(&y.0).then(y.2.cmp(&x.2)));
            let Some((delta, j, _)) = best else { break };
            if delta <= 0.0 {
                break;
            }
            let (i, _, a) = candidates.remove(j);
            let e = edge(edges[i].a, edges[i].b);
            graph.insert(e);
            if largest_clique_cells(ctx.dims(), &graph) > cap {
                graph.remove(&e);
                continue;
            }
            keep.insert(i);
            a_total += a;
            let bins = edges[i].bins.clone();
            factors.push(PlannedFactor {
                factor: vec![e.0, e.1],
                mechanism: ctx.best_oracle(&[e.0, e.1], &bins),
                weight: a,
                bins,
            });
        }
        let a: Vec<f64> = factors.iter().map(|f| f.weight).collect();
        let m: Vec<f64> = factors
            .iter()
            .map(|f| match f.factor.as_slice() {
                [x] => earlier[*x],
                _ => 0.0,
            })
            .collect();
        for (f, w) in factors.iter_mut().zip(top_up(&a, &m, n2)) {
            f.weight = w;
        }
        let mut pruned = Vec::new();
        for (i, e) in edges.iter_mut().enumerate() {
            if e.active && !keep.contains(&i) {
                e.active = false;
                e.pruned_in = Some(round);
                pruned.push((e.a, e.b));
            }
        }
        (pruned, factors)
    }
}

impl CollectionProtocol for Auto {
    fn initial_state(&self, ctx: &Context) -> CollectionState {
        if pairs(ctx.dims().len())
            .into_iter()
            .all(|(a, b)| self.screening_bins(ctx, None, a, b).is_none())
        {
            // No pair could ever pay for its reports: the independence model, at no cost.
            return one_way_state(ctx);
        }
        let s0 = self.round0_share(ctx);
        if s0 <= 0.0 {
            return self.screening_state(ctx, None);
        }
        // Round 0: every attribute alone (no edges yet).
        CollectionState {
            phase: Phase::GraphConstruction,
            round_quota: Some(round_quota(ctx, s0, 1)),
            ..one_way_state(ctx)
        }
    }

    fn task_choices(
        &self,
        ctx: &Context,
        state: &CollectionState,
    ) -> Result<TaskChoices, EngineError> {
        if let Some(choices) = common_choices(ctx, state) {
            return choices;
        }
        if state.phase != Phase::GraphConstruction {
            return Err(EngineError::InvalidState(format!(
                "auto has no {:?} phase",
                state.phase
            )));
        }
        let active = active_edges(state);
        if active.is_empty() {
            return Ok(one_way_choices(ctx, state));
        }
        // Every screened pair alike (each needs its own dependence estimate), in the
        // design's factors, and the round's slice of 1-ways, every attribute alike.
        let screening = self.screening_tasks(ctx, state.edges());
        let slice = self.one_way_slice(ctx, Self::block_fraction(&screening, state.edges()));
        let mut tasks: Vec<TaskSpec> = screening
            .into_iter()
            .map(|(factor, bins)| TaskSpec {
                round: state.round,
                mechanism: ctx.best_oracle(&factor, &bins),
                factor,
                bins,
            })
            .collect();
        let mut weights = vec![(1.0 - slice) / tasks.len() as f64; tasks.len()];
        if slice > 0.0 {
            let d = ctx.dims().len();
            tasks.extend(one_way_choices(ctx, state).tasks);
            weights.extend(std::iter::repeat_n(slice / d as f64, d));
        }
        Ok(TaskChoices {
            tasks,
            weights: (slice > 0.0).then_some(weights),
            sub_bin_share: None,
        })
    }

    fn close_round(
        &self,
        ctx: &Context,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        if state.phase != Phase::GraphConstruction {
            return Ok(Transition::Nothing);
        }
        let t = state.round;
        let ms = self.measurements(ctx, tables, &|k| k.round <= t)?;
        if state.edges().is_empty() {
            // Round 0 closes: point masses become working bins, then pairs are screened
            // binned by the 1-ways' mass.
            state.working_bins = adapted_working_bins(ctx, &ms);
            let ctx = ctx.at(state)?;
            // Read again only if the working bins moved.
            let ms = if state.working_bins.is_empty() {
                ms
            } else {
                self.measurements(&ctx, tables, &|k| k.round <= t)?
            };
            let one = one_way_estimates(&ms);
            let next = self.screening_state(&ctx, Some(&one));
            state.protocol = next.protocol;
            state.round = t + 1;
            state.round_quota = next.round_quota;
            return Ok(Transition::RoundClosed {
                round: t,
                pruned: Vec::new(),
            });
        }
        let drifted = one_way_drift(&ms).0.population_changed;
        let screening = self.screening_tasks(ctx, state.edges());
        let share = self.screening_share(ctx, Self::block_fraction(&screening, state.edges()));
        let (pruned, mut factors) = self.select(ctx, state, &ms, drifted, share);
        if drifted {
            repeat_screening(ctx, &mut factors, screening, share);
        }
        let sigma = self.params.sigma;
        Ok(end_phase1_round(
            state,
            t + 1,
            pruned,
            |_| factors,
            |s| plan_structure(ctx, s, sigma, true),
        ))
    }

    fn model_candidates(&self, ctx: &Context, _state: &CollectionState) -> Vec<Edge> {
        pairs(ctx.dims().len())
    }

    /// A pair that phase 2 measured was selected for its screening dependence, so the
    /// screening tables overstate it given the selection: its dependence is judged on the
    /// phase-2 tables ([`pair_gain_binned`]); every other pair on all of its tables.
    /// Screening blocks count as other tables: excluding them too cost 18% and 3% 2-way TVD
    /// at ε = 2 and 2% and 6% at ε = 4 on the survey table of `examples/survey` (21,574 and
    /// 10,000 people, 3 seeds): the blocks hold most of a pair's reports. As in `select`,
    /// against the 1-ways of the same people ([`Null::SamePeople`]).
    fn pair_gain(
        &self,
        state: &CollectionState,
        ms: &Measurements,
        one_way: &[Vec<f64>],
        a: usize,
        b: usize,
    ) -> Option<PairGain> {
        // Selected: still active when the plan was made (under drift phase 2 also repeats
        // the screening design, unselected pairs included).
        let selected = state.plan().is_some()
            && state
                .edges()
                .iter()
                .any(|e| e.active && (e.a, e.b) == (a, b));
        let phase2 = state.round;
        best_pair_gain(ms, one_way, a, b, Null::SamePeople, |k| {
            !selected || k.factor != [a, b] || k.round >= phase2
        })
        .map(|(g, _)| g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Engine;

    fn auto_engine(dims: Vec<usize>, epsilon: f64, users: u64) -> Engine {
        Engine::from_parts(
            dims,
            ldpsyn::Epsilon::new(epsilon).unwrap(),
            users,
            ldpsyn::protocol::Protocol::Auto(PrivIncrParams::default()),
            crate::state::EngineOptions::default(),
        )
        .unwrap()
    }

    /// The screening state's tasks as (factor, bins), with the state's active pairs.
    fn screening(engine: &Engine) -> (Vec<ScreeningTask>, Vec<EdgeState>) {
        let auto = Auto::new(PrivIncrParams::default());
        let state = auto.screening_state(engine.context(), None);
        let edges = state.edges().to_vec();
        let tasks = auto
            .task_choices(engine.context(), &state)
            .unwrap()
            .tasks
            .into_iter()
            .map(|t| (t.factor, t.bins))
            .collect();
        (tasks, edges)
    }

    #[test]
    fn blocks_cover_every_wanted_pair_within_the_cell_cap() {
        let dims = vec![2usize; 12];
        let attrs: Vec<usize> = (0..12).collect();
        let wanted: BTreeSet<Edge> = pairs(12).into_iter().collect();
        for m in [3, 5, 8] {
            let (blocks, left) = cover_by_blocks(&dims, &attrs, &wanted, m, 1 << m);
            assert!(left.is_empty(), "m = {m}: {left:?} uncovered");
            for b in &blocks {
                assert_eq!(b.len(), m, "{b:?}");
                assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?} not sorted");
            }
            for (a, c) in &wanted {
                assert!(blocks.iter().any(|b| b.contains(a) && b.contains(c)));
            }
            // Same input, same blocks (a state's tasks must not change between draws).
            assert_eq!(cover_by_blocks(&dims, &attrs, &wanted, m, 1 << m).0, blocks);
        }
        // A cap below every block's cells leaves the pairs to be measured as pairs.
        let (blocks, left) = cover_by_blocks(&dims, &attrs, &wanted, 4, 8);
        assert!(blocks.is_empty() && left == wanted);
    }

    /// At ε = 8 a report of 16 binary attributes' pair is nearly all sampling noise: the
    /// design measures blocks of several attributes, and still covers every screened pair.
    /// At ε = 1 over attributes of 16 values, summing a block's cells costs more randomizer
    /// noise than the extra pairs bring: the design is the pairs themselves.
    #[test]
    fn screening_groups_pairs_only_where_that_lowers_their_noise() {
        let engine = auto_engine(vec![2; 16], 8.0, 20_000);
        let (tasks, edges) = screening(&engine);
        assert!(tasks.iter().all(|(f, _)| f.len() > 2), "{tasks:?}");
        // A design of blocks gets the block share of the users.
        let state = Auto::new(PrivIncrParams::default()).screening_state(engine.context(), None);
        assert_eq!(
            state.round_quota,
            Some(round_quota(engine.context(), AUTO_BLOCK_SCREENING_SHARE, 1))
        );
        assert!(tasks.len() < 40, "{} tasks", tasks.len());
        for e in edges.iter().filter(|e| e.active) {
            assert!(
                tasks
                    .iter()
                    .any(|(f, _)| f.contains(&e.a) && f.contains(&e.b))
            );
        }
        let (tasks, edges) = screening(&auto_engine(vec![16; 6], 1.0, 2_000_000));
        let active: Vec<ScreeningTask> = edges
            .iter()
            .filter(|e| e.active)
            .map(|e| (vec![e.a, e.b], e.bins.clone()))
            .collect();
        assert!(!active.is_empty());
        // The pairs, then the round's slice of 1-ways (a design in pairs gets one).
        let one_ways: Vec<ScreeningTask> = (0..6).map(|a| (vec![a], Vec::new())).collect();
        assert_eq!(tasks, [active.clone(), one_ways].concat());
        let engine = auto_engine(vec![16; 6], 1.0, 2_000_000);
        let state = Auto::new(PrivIncrParams::default()).screening_state(engine.context(), None);
        let weights = Auto::new(PrivIncrParams::default())
            .task_choices(engine.context(), &state)
            .unwrap()
            .weights
            .expect("screening weights");
        let total: f64 = weights.iter().sum();
        let slice: f64 = weights[active.len()..].iter().sum();
        assert!(
            (slice / total - AUTO_ROUND0_SHARE).abs() < 1e-12,
            "{slice} of {total}"
        );
        assert!(weights[..active.len()].windows(2).all(|w| w[0] == w[1]));
        assert_eq!(
            state.round_quota,
            Some(round_quota(engine.context(), AUTO_PHASE1_SHARE, 1))
        );
    }

    /// A design that measures some of its pairs in blocks and the rest as pairs gets a
    /// share between the pair and the block share, weighted by the fraction of its pairs in
    /// blocks: a few blocks among many pairs must not hand the round the block share.
    #[test]
    fn a_mixed_design_weighs_the_block_share_by_its_pairs_in_blocks() {
        let mut dims = vec![2usize; 8];
        dims.extend([20, 20, 20, 20]);
        let engine = auto_engine(dims, 8.0, 200_000);
        let (tasks, edges) = screening(&engine);
        let active: Vec<&EdgeState> = edges.iter().filter(|e| e.active).collect();
        let in_blocks = active
            .iter()
            .filter(|e| {
                tasks
                    .iter()
                    .any(|(f, _)| f.len() > 2 && f.contains(&e.a) && f.contains(&e.b))
            })
            .count();
        assert!(
            in_blocks > 0 && in_blocks < active.len(),
            "{in_blocks} of {} pairs in blocks: {tasks:?}",
            active.len()
        );
        let phi = in_blocks as f64 / active.len() as f64;
        let state = Auto::new(PrivIncrParams::default()).screening_state(engine.context(), None);
        let share = (1.0 - phi) * AUTO_PHASE1_SHARE + phi * AUTO_BLOCK_SCREENING_SHARE;
        assert_eq!(
            state.round_quota,
            Some(round_quota(engine.context(), share, 1))
        );
        let quota = state.round_quota.unwrap();
        assert!(quota > round_quota(engine.context(), AUTO_PHASE1_SHARE, 1));
        assert!(quota < round_quota(engine.context(), AUTO_BLOCK_SCREENING_SHARE, 1));
    }

    /// Under drift phase 2 repeats the screening design: `share` of its reports go to the
    /// screening tasks, evenly, a task the plan already holds gets its weight added, and the
    /// total stays.
    #[test]
    fn repeating_the_screening_design_keeps_the_total() {
        let engine = auto_engine(vec![2; 4], 2.0, 10_000);
        let planned = |factor: Vec<usize>, weight: f64| PlannedFactor {
            mechanism: engine.context().best_oracle(&factor, &[]),
            factor,
            bins: Vec::new(),
            weight,
        };
        let mut factors = vec![planned(vec![0], 300.0), planned(vec![0, 1], 700.0)];
        let tasks = vec![(vec![0, 1], Vec::new()), (vec![2, 3], Vec::new())];
        repeat_screening(engine.context(), &mut factors, tasks, 0.4);
        let weights: Vec<(Vec<usize>, f64)> = factors
            .iter()
            .map(|f| (f.factor.clone(), f.weight))
            .collect();
        assert_eq!(
            weights,
            vec![
                (vec![0], 180.0),
                (vec![0, 1], 420.0 + 200.0),
                (vec![2, 3], 200.0)
            ]
        );
    }

    #[test]
    fn top_up_allocates_totals_in_proportion() {
        // Without earlier reports: n_f = a_f·n2/Σa.
        let n = top_up(&[1.0, 3.0], &[0.0, 0.0], 400.0);
        assert!(
            (n[0] - 100.0).abs() < 1e-6 && (n[1] - 300.0).abs() < 1e-6,
            "{n:?}"
        );
        // Earlier reports count: totals m_f + n_f ∝ a_f (here 250 and 750), Σn_f = n2.
        let n = top_up(&[1.0, 3.0], &[150.0, 0.0], 850.0);
        assert!(
            (n[0] - 100.0).abs() < 1e-6 && (n[1] - 750.0).abs() < 1e-6,
            "{n:?}"
        );
        // A factor already over its share gets nothing; the rest share n2 ∝ a_f.
        let n = top_up(&[1.0, 1.0, 2.0], &[1000.0, 0.0, 0.0], 300.0);
        assert_eq!(n[0], 0.0);
        assert!(
            (n[1] - 100.0).abs() < 1e-6 && (n[2] - 200.0).abs() < 1e-6,
            "{n:?}"
        );
    }
}
