//! `auto` (docs/design.md "Adaptive rounds"): round 0 ([`AUTO_ROUND0_SHARE`] of the users)
//! measures every attribute alone, in the shares that minimize the 1-ways' summed expected
//! TVD (`rules::one_way_weights`); a screening round ([`AUTO_PHASE1_SHARE`]) then measures,
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
//! ([`crate::measure::drift`]), phase 2 counts no earlier 1-way reports, and it also repeats
//! the screening design (`repeat_screening`) when that lowers the predicted error
//! (`repeat_pays`), so that every round measures what the model uses and the fit can treat
//! rounds as strata. With too few users nothing is screened and the
//! collection is the independence model from the start, or nothing is selected and phase 2
//! measures 1-ways only. The model graph may keep any measured pair. A state stored by a
//! release without round 0 (screening in round 0) closes straight into phase 2.

mod allocation;
mod rules;
mod screening;
mod selection;

use ldpsyn::wire::PrivIncrParams;

use crate::protocols::context::Context;

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
/// screening round can bin pairs by equal estimated mass ([`equal_mass_cuts`](crate::domain::space::equal_mass_cuts)); its reports
/// count towards the 1-ways' phase-2 allocation (`top_up`). Chosen by a sweep of 0 (no
/// round 0: equal-width bins), 0.05, 0.1, 0.2 and 0.3 over adult, nist-taxi,
/// temporal-match2, the built-in network and adult-1.5m at ε ∈ {1, 2, 4, 8}, 3 seeds
/// (`benchmarks/sweeps/auto-round0-share.md`): 0.2 has the lowest mean ratio to no round 0
/// (0.966) and the lowest worst cell (1.02).
pub const AUTO_ROUND0_SHARE: f64 = 0.2;

/// Standard deviations of its own dependence estimate within which a pair phase 2 measured
/// is judged, in the model graph, by a posterior pooled over such pairs
/// (`CollectionProtocol::pool_gains`, [`crate::select::gain::lift_weak_dependence`]); a pair
/// beyond it keeps its own estimate and stays out of the pool, whose scale it would set.
/// Chosen by a sweep of 2, 4 and ∞ (every measured pair pooled) over the suite's six tables
/// at ε ∈ {1, 2, 4, 8} in both arrival orders, 5 seeds
/// (`benchmarks/sweeps/model-graph-pooling.md`).
pub const AUTO_POOL_SIGNIFICANCE: f64 = 4.0;

/// Largest factor (cells) `auto`'s screening design asks a device to report: bounds a
/// report's size (an OUE report carries one bit per cell, 512 bytes here). A resource
/// bound, not a utility constant: the design's noise objective stays below it (16 binary
/// attributes are screened in blocks of 3, 5 and 9 attributes, 8, 32 and 512 cells, at
/// ε = 2, 4 and 8).
pub const MAX_SCREENING_FACTOR_CELLS: usize = 4096;

/// `auto`'s rules.
#[derive(Debug, Clone)]
pub struct Auto {
    params: PrivIncrParams,
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

    /// Round 0's share of the users (at most half).
    fn round0_share(&self, ctx: &Context) -> f64 {
        ctx.options()
            .auto_round0_share
            .unwrap_or(AUTO_ROUND0_SHARE)
            .clamp(0.0, 0.5)
    }

    fn pool_significance(&self, ctx: &Context) -> f64 {
        ctx.options()
            .auto_pool_significance
            .unwrap_or(AUTO_POOL_SIGNIFICANCE)
    }

    fn bin_noise_l1(&self, ctx: &Context) -> f64 {
        ctx.options()
            .auto_bin_noise_l1
            .unwrap_or(AUTO_BIN_NOISE_L1)
            .min(2.0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::domain::binned::BinnedFactor;
    use crate::domain::sizes::Domain;
    use crate::engine::Engine;
    use crate::graph::{Edge, EdgeState};
    use crate::protocols::auto::allocation::top_up;
    use crate::protocols::auto::screening::{ScreeningTask, cover_by_blocks, repeat_screening};
    use crate::protocols::{CollectionProtocol, pairs, round_quota};
    use crate::state::PlannedFactor;

    fn auto_engine(dims: Vec<usize>, epsilon: f64, users: u64) -> Engine {
        Engine::from_parts(
            dims,
            ldpsyn::Epsilon::new(epsilon).unwrap(),
            users,
            ldpsyn::wire::Protocol::Auto(PrivIncrParams::default()),
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

    /// Issue 67 item 1: attributes of the largest domain (32,768 values) build their
    /// initial state without a table of their full pair (2³⁰ cells aborted the process), and
    /// screening bins stay within what a task may carry.
    #[test]
    fn the_largest_domains_screen_without_their_full_pair_table() {
        for (attributes, users) in [(2usize, 1_000_000u64), (4, 100_000), (2, 1_000_000_000)] {
            let engine = auto_engine(vec![32_768; attributes], 4.0, users);
            let state = engine.initial_state();
            assert_eq!(state.round, 0);
            let auto = Auto::new(PrivIncrParams::default());
            for (a, b) in pairs(attributes) {
                if let Some(bins) = auto.screening_bins(engine.context(), None, a, b) {
                    // Cuts, or none for the whole domain.
                    let size = |cuts: &Vec<u32>| {
                        if cuts.is_empty() {
                            32_768
                        } else {
                            cuts.len() + 1
                        }
                    };
                    let cells = size(&bins[0]) * size(&bins[1]);
                    assert!(cells <= crate::domain::task::MAX_PAIR_CELLS, "{cells}");
                }
            }
        }
    }

    #[test]
    fn blocks_cover_every_wanted_pair_within_the_cell_cap() {
        let dims = Domain::new(vec![2usize; 12]);
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
            mechanism: engine.context().best_oracle(BinnedFactor::full(&factor)),
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

    /// Binary attributes drifting linearly in arrival position (`P_r(x = 1) = p + β·t_r` at
    /// each round's mid-position `t_r`): the population's between-round dependence is the
    /// rounds seen so far times `drift_extrapolation`, exactly (`4|β_a β_b|·Var(t)` both).
    #[test]
    fn linear_drift_extrapolates_the_between_round_dependence_exactly() {
        use crate::measure::drift::RoundOneWays;
        use crate::protocols::auto::screening::{drift_extrapolation, mixture_dependence};
        let shares = [0.2, 0.3, 0.5];
        let mids = [0.1, 0.35, 0.75];
        let strata = |p: f64, beta: f64| -> RoundOneWays {
            (0..3u32)
                .map(|r| {
                    let q = p + beta * mids[r as usize];
                    (r, vec![1.0 - q, q])
                })
                .collect()
        };
        let (x, y) = (strata(0.2, 0.6), strata(0.7, -0.5));
        let all: Vec<(u32, f64)> = (0..3u32).map(|r| (r, shares[r as usize])).collect();
        let seen = &all[..2];
        let full = BinnedFactor::full(&[0, 1]);
        let whole = mixture_dependence(&all, Some(&x), Some(&y), full);
        let early = mixture_dependence(seen, Some(&x), Some(&y), full);
        let ratio = drift_extrapolation(&shares[..2], shares[2]);
        assert!((ratio - 14.0 / 3.0).abs() < 1e-12, "{ratio}");
        assert!(
            (whole - ratio * early).abs() < 1e-12,
            "{whole} vs {ratio} × {early}"
        );
        // No drift, no between-round dependence; nothing to come, nothing to extrapolate.
        let flat = strata(0.3, 0.0);
        assert_eq!(mixture_dependence(&all, Some(&flat), Some(&y), full), 0.0);
        assert_eq!(drift_extrapolation(&[0.2, 0.3], 0.0), 1.0);
        // Empty bin maps are full resolution.
        let whole_bin = mixture_dependence(
            &all,
            Some(&x),
            Some(&y),
            BinnedFactor::new(&[0, 1], &[vec![], vec![]]),
        );
        assert!((whole_bin - whole).abs() < 1e-12);
    }

    /// The repeat is made when the pairs' between-round dependence, less their noise at the
    /// repeat's reports, exceeds what the repeat costs the selected design; not when the
    /// rounds' 1-ways agree, nor when the pairs' noise at the repeat's reports hides it.
    #[test]
    fn the_screening_design_is_repeated_only_when_that_lowers_the_predicted_error() {
        use crate::measure::drift::RoundOneWays;
        use crate::protocols::auto::screening::repeat_pays;
        use crate::protocols::auto::selection::Selection;
        let engine = auto_engine(vec![2; 4], 4.0, 100_000);
        let ctx = engine.context();
        let factor = |f: Vec<usize>, n: f64| PlannedFactor {
            mechanism: ctx.best_oracle(BinnedFactor::full(&f)),
            factor: f,
            bins: Vec::new(),
            weight: n,
        };
        let factors: Vec<PlannedFactor> = (0..4).map(|a| factor(vec![a], 10_000.0)).collect();
        let pairs_all = pairs(4);
        let edges: Vec<EdgeState> = Auto::new(PrivIncrParams::default())
            .screening_state(ctx, None)
            .edges()
            .to_vec();
        let selection = |a_pair: f64| Selection {
            pruned: pairs_all.clone(),
            factors: factors.clone(),
            noise_weights: vec![1.0; 4],
            screened_noise_weights: pairs_all.iter().map(|&p| (p, a_pair)).collect(),
        };
        let weights = [(0u32, 0.4), (1u32, 0.6)];
        let strata = |q0: f64, q1: f64| -> Option<RoundOneWays> {
            Some([(0u32, vec![1.0 - q0, q0]), (1u32, vec![1.0 - q1, q1])].into())
        };
        let drifting: Vec<Option<RoundOneWays>> = (0..4).map(|_| strata(0.1, 0.9)).collect();
        let still: Vec<Option<RoundOneWays>> = (0..4).map(|_| strata(0.5, 0.5)).collect();
        let pays = |sel: &Selection, strata: &[Option<RoundOneWays>]| {
            repeat_pays(sel, &edges, &weights, strata, 6, 0.3, 1.0)
        };
        assert!(pays(&selection(0.01), &drifting));
        assert!(!pays(&selection(0.01), &still));
        // Pairs so noisy at the repeat's reports that no dependence shows above it.
        assert!(!pays(&selection(1e6), &drifting));
    }

    /// Round 0's shares minimize `Σ_a g_a/√n_a`: they sum to one, follow `g^(2/3)`, give an
    /// attribute of many codes more than a yes/no one, and no small move of people between
    /// two attributes lowers the summed expected error.
    #[test]
    fn one_way_shares_minimize_the_summed_expected_error() {
        use crate::protocols::auto::rules::one_way_weights;
        let engine = auto_engine(vec![2, 9, 101, 16], 4.0, 100_000);
        let ctx = engine.context();
        let w = one_way_weights(ctx);
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{w:?}");
        assert!(w[2] > w[3] && w[3] > w[1] && w[1] > w[0], "{w:?}");
        let g: Vec<f64> = (0..4)
            .map(|a| ctx.marginal_noise_l1(BinnedFactor::full(&[a]), &[a], 1.0))
            .collect();
        let cost = |w: &[f64]| g.iter().zip(w).map(|(g, n)| g / n.sqrt()).sum::<f64>();
        for (a, b) in [(0, 2), (1, 3), (2, 1)] {
            for step in [1e-3, -1e-3] {
                let mut moved = w.clone();
                moved[a] += step;
                moved[b] -= step;
                assert!(cost(&moved) > cost(&w), "moving {step} from {b} to {a}");
            }
        }
        let equal = one_way_weights(auto_engine(vec![2; 5], 4.0, 100_000).context());
        assert!(equal.iter().all(|x| (x - 0.2).abs() < 1e-12), "{equal:?}");
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
