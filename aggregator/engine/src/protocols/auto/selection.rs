//! `auto`'s selection after its screening round: pairs added greedily by how much they
//! lower the predicted 2-way error, within the clique cap.

use std::collections::BTreeSet;

use crate::domain::binned::BinnedFactor;
use crate::graph::{Edge, edge};
use crate::measure::tables::Measurements;
use crate::numeric::info::mutual_information;
use crate::protocols::auto::Auto;
use crate::protocols::auto::allocation::{equivalent_reports, top_up};
use crate::protocols::context::Context;
use crate::select::gain::{
    Null, NullOneWays, PairGain, pair_gain_binned, pooled_dependence, projected_noise_l1,
};
use crate::select::model_graph::{clique_cap, largest_clique_cells};
use crate::state::{CollectionState, PlannedFactor};

impl Auto {
    /// `auto`'s selection after its screening round (docs/design.md "Adaptive rounds"; PPSyn
    /// Alg. 2's contribution per budget). Each screened pair's dependence `D̂` (its L1
    /// distance from independence) is estimated from the screening tables, against the
    /// 1-ways of the screening round's people ([`Null::SamePeople`]: round 0 saw earlier
    /// people, and a drift between the rounds is no dependence), as the larger of its own
    /// estimate debiased for noise ([`PairGain::dependence`]) and its posterior under a prior
    /// pooled over every screened pair ([`pooled_dependence`]): the first vanishes for a pair
    /// whose noise exceeds its dependence, although many such pairs can carry most of the
    /// data's dependence (NLTCS at ε = 1; `benchmarks/sweeps/pooled-dependence.md`). A factor
    /// f measured by n reports has expected L1 noise `K_f/√n` (randomizer and sampling
    /// variances are both ∝ 1/n; `K_f` at the estimate — round 0's for a 1-way, the
    /// screening's for a pair — scaled by the share of noise its simplex projection keeps at
    /// a tree-sized allocation `N₂/d`, [`projected_noise_l1`]: a skewed 1-way, like a sparse
    /// pair, loses most of its noise to it, so it needs fewer reports than its cell count
    /// suggests; `benchmarks/sweeps/one-way-allocation.md`). A pair's `K_f` counts its
    /// interaction only ([`PairGain::interaction_share`]): the fit pins its margins with
    /// every table of its attributes, whose noise the 1-ways' term already counts.
    /// Phase 2 measures every attribute alone and the selected pairs S; its 2-way error is
    /// predicted as `Σ_{p∉S} w_p D̂_p + Σ_f w_f K_f/√n_f`, with `w_p` a pair's weight
    /// ([`Context::pair_weight`]: 1, more for a pair holding a declared target) and `w_f` the
    /// summed weight of the 2-way marginals a factor's error enters (`w_p` for a pair, `d − 1`
    /// for a 1-way without targets, [`Context::one_way_weight`]). Under
    /// `Σ n_f = N₂` the allocation `n_f ∝ a_f = (w_f K_f)^{2/3}` minimizes the noise part to
    /// `A^{3/2}/√N₂` with `A = Σ_f a_f`. Pairs are added greedily, each time the one that
    /// lowers the prediction most, within the clique cap, until none does. With too few users
    /// nothing is selected and `auto` is the independence model. Reports a 1-way already
    /// holds from earlier rounds count towards its total (none when `drifted`: the rounds'
    /// people differed): phase 2 tops the totals up to `∝ a_f` ([`top_up`]), and the
    /// prediction's noise part is `A^{3/2}/√(N₂ + M)` with M those reports; `N₂` is what
    /// round 0 and the screening round (`screening_share` of the users) leave. Returns the
    /// pairs not selected (pruned), the phase-2 factors with their task weights (expected
    /// phase-2 reports) and the prediction's noise weights ([`Selection`]).
    pub(super) fn select(
        &self,
        ctx: &Context,
        state: &mut CollectionState,
        ms: &Measurements,
        drifted: bool,
        screening_share: f64,
    ) -> Selection {
        let d = ctx.dims().len();
        let round = state.round;
        let nulls = NullOneWays::new(ms);
        let one = nulls.collection();
        let n2 = self.phase2_users_after(ctx, screening_share).max(1.0);
        let n_ref = (n2 / d as f64).max(1.0);
        // The share of a table's noise that its simplex projection keeps, at a tree-sized
        // phase-2 allocation (sparse and skewed tables lose much of their noise to it).
        let kept_share = |f: BinnedFactor<'_>, at: &[f64], seed: u64| {
            let sigma = ctx.cell_std_errors(f, at, n_ref);
            let raw = ctx.expected_noise_l1(f, at, n_ref);
            let kept = projected_noise_l1(at, &sigma, seed);
            if raw > 0.0 {
                (kept / raw).min(1.0)
            } else {
                1.0
            }
        };
        // A 1-way's seed apart from every pair's (pair indices are below 2^32).
        let allocation = |a: usize, at: &[f64], w: f64| {
            let f = BinnedFactor::full(std::slice::from_ref(&a));
            let share = kept_share(f, at, u64::MAX - a as u64);
            (w * share * ctx.expected_noise_l1(f, at, 1.0)).powf(2.0 / 3.0)
        };
        let mut factors: Vec<PlannedFactor> = (0..d)
            .map(|a| PlannedFactor {
                factor: vec![a],
                mechanism: ctx.best_oracle(BinnedFactor::full(&[a])),
                weight: allocation(a, &one[a], ctx.one_way_weight(a)),
                bins: Vec::new(),
            })
            .collect();
        // (pair index, its gain, a_p) of every screened pair.
        let mut screened: Vec<(usize, PairGain, f64)> = Vec::new();
        let edges = match state.pair_rounds_mut() {
            Some(r) => &mut r.edges,
            None => {
                return Selection {
                    noise_weights: factors.iter().map(|f| f.weight).collect(),
                    factors,
                    pruned: Vec::new(),
                    screened_noise_weights: Vec::new(),
                };
            }
        };
        for (i, e) in edges.iter_mut().enumerate() {
            if !e.active {
                continue;
            }
            let ab = [e.a, e.b];
            let pair = BinnedFactor::new(&ab, &e.bins);
            let Some(g) = pair_gain_binned(&nulls, pair, Null::SamePeople, |_| true) else {
                continue;
            };
            e.reports = ms
                .combined_binned(pair, |_| true, None)
                .map_or(0, |c| c.reports);
            let Some(pdims) = ctx.factor_dims(pair) else {
                continue;
            };
            e.mi = Some(mutual_information(&g.projected, pdims[0], pdims[1]));
            // Noise scale K at the screening estimate, times the share of it that the
            // simplex projection leaves at a tree-sized phase-2 allocation (sparse tables
            // lose much of their noise to it), times its interaction's share (the fit pins
            // the pair's margins with every table of its attributes).
            let at = &g.projected;
            let k = ctx.expected_noise_l1(pair, at, 1.0);
            let shrink = kept_share(pair, at, i as u64);
            let w = ctx.pair_weight(e.a, e.b);
            let a = (w * g.interaction_share * shrink * k).powf(2.0 / 3.0);
            screened.push((i, g, a));
        }
        let screened_noise_weights: Vec<(Edge, f64)> = screened
            .iter()
            .map(|(i, _, a)| ((edges[*i].a, edges[*i].b), *a))
            .collect();
        // D̂: the larger of a pair's own debiased estimate and its posterior under a prior
        // pooled over every screened pair, which does not vanish when a pair's noise exceeds
        // its dependence (many weak pairs at small ε).
        let pooled = pooled_dependence(&screened.iter().map(|(_, g, _)| g).collect::<Vec<_>>());
        // (pair index, w_p·D̂, a_p) of every screened pair with positive dependence; a pair
        // holding a declared target is measured whatever its screening estimate (`forced`):
        // the screening round's people may not be the population's (arrival order), and
        // the question the data is for is that pair's.
        let mut candidates: Vec<(usize, f64, f64)> = Vec::new();
        let mut forced: Vec<(usize, f64, f64)> = Vec::new();
        for ((i, g, a), posterior) in screened.into_iter().zip(pooled) {
            let dependence = g.dependence.max(posterior);
            edges[i].score = Some(dependence);
            let w = ctx.pair_weight(edges[i].a, edges[i].b);
            if w > 1.0 {
                forced.push((i, w * dependence, a));
            } else if dependence > 0.0 {
                candidates.push((i, w * dependence, a));
            }
        }
        // The forced pairs first, most dependent first, then the rest by the greedy rule.
        forced.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
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
        let mut forced = forced.into_iter();
        loop {
            let (i, a) = if let Some((i, _, a)) = forced.next() {
                (i, a)
            } else {
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
                (i, a)
            };
            let e = edge(edges[i].a, edges[i].b);
            graph.insert(e);
            if largest_clique_cells(ctx.domain(), &graph) > cap {
                graph.remove(&e);
                continue;
            }
            keep.insert(i);
            a_total += a;
            let bins = edges[i].bins.clone();
            factors.push(PlannedFactor {
                factor: vec![e.0, e.1],
                mechanism: ctx.best_oracle(BinnedFactor::new(&[e.0, e.1], &bins)),
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
        Selection {
            pruned,
            factors,
            noise_weights: a,
            screened_noise_weights,
        }
    }
}

/// What [`Auto::select`] decided, with the terms of its error prediction.
pub(super) struct Selection {
    /// The screened pairs left out (`(a, b)`, a < b).
    pub pruned: Vec<Edge>,
    /// Phase 2's factors, each with its expected reports as its weight.
    pub factors: Vec<PlannedFactor>,
    /// Per factor of `factors`, `a_f = (w_f K_f)^{2/3}`: measured by `n_f` reports it adds
    /// `a_f^{3/2}/√n_f` to the predicted 2-way error (summed L1).
    pub noise_weights: Vec<f64>,
    /// Every screened pair with a screening estimate, with its `a_p` likewise.
    pub screened_noise_weights: Vec<(Edge, f64)>,
}
