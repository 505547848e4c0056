//! `auto` (DESIGN.md "Adaptive rounds"): a screening round ([`AUTO_PHASE1_SHARE`] of the
//! users) measures, uniformly, every pair that could ever pay for its reports, with the
//! lower-variance oracle; at its close the pairs are selected greedily by predicted 2-way
//! error (`Auto::select`), and phase 2 measures the selected pairs and every attribute
//! alone, allocated to minimize that prediction. With too few users nothing is selected (or
//! nothing is screened) and the result is the independence model. The model graph may keep
//! any measured pair.

use std::collections::{BTreeMap, BTreeSet};

use ldpsyn::protocol::PrivIncrParams;

use super::{
    CollectionProtocol, TaskChoices, active_edges, common_choices, end_phase1_round, graph_state,
    one_way_choices, one_way_state, pairs, plan_structure,
};
use crate::estimate::{
    MAX_CLIQUE_CELLS, largest_clique_cells, one_way_estimates, pair_gain_binned, projected_noise_l1,
};
use crate::graph::{Edge, edge};
use crate::info::mutual_information;
use crate::space::equal_width_cuts;
use crate::state::{CollectionState, Engine, Phase, PlannedFactor, TaskSpec, Transition};
use crate::{EngineError, Measurements, Tables};

/// Share of the users `auto` spends on its screening round (every screened pair measured
/// alike); `omega` of the config is ignored by `auto`. Chosen by a sweep over adult,
/// nist-taxi, temporal-match2 and the built-in network at ε ∈ {1, 2, 4, 8}
/// (`benchmarks/sweeps/auto-screening-share.md`): shares 0.1–0.5 are within 1.5% of each
/// other on average, 0.3 among the best.
pub const AUTO_PHASE1_SHARE: f64 = 0.3;

/// Expected L1 noise (at a tree-sized phase-2 allocation) below which `auto` measures a pair
/// at a resolution; a pair above it is measured over coarser bins
/// (`Auto::screening_bins`). Chosen by a sweep of 2, 1, 0.5, 0.25, 0.125 and 0.0625 over
/// adult, nist-taxi, temporal-match2 and the built-in network at ε ∈ {1, 2, 4, 8}, 3 seeds
/// (`benchmarks/sweeps/auto-bin-noise.md`): 0.25 has the lowest mean 2-way TVD over the 16
/// cells; it loses 3–12% to full-resolution screening on Adult and gains up to 19% on
/// nist-taxi and temporal-match2.
pub const AUTO_BIN_NOISE_L1: f64 = 0.25;

/// Bin maps of a pair whose attributes of `ka_full`, `kb_full` codes get `ka`, `kb`
/// equal-width bins (empty when neither is binned).
fn pair_bins(ka_full: usize, ka: usize, kb_full: usize, kb: usize) -> Vec<Vec<u32>> {
    let bins = vec![equal_width_cuts(ka_full, ka), equal_width_cuts(kb_full, kb)];
    if bins.iter().all(Vec::is_empty) {
        Vec::new()
    } else {
        bins
    }
}

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

    fn share(&self, engine: &Engine) -> f64 {
        engine
            .options()
            .auto_phase1_share
            .unwrap_or(AUTO_PHASE1_SHARE)
    }

    /// Users `auto` expects in phase 2.
    fn phase2_users(&self, engine: &Engine) -> f64 {
        (1.0 - self.share(engine)) * engine.target_users() as f64
    }

    /// The bin maps `auto` screens pair `(a, b)` under, or `None` if it never measures it.
    /// A factor is worth measuring only if, with the users of a tree-sized phase 2 (`N₂/d`
    /// reports: about `d − 1` pairs and `d` 1-ways share it), its expected L1 noise can be
    /// below the noise budget ([`AUTO_BIN_NOISE_L1`]), and below the largest dependence an
    /// `m_a × m_b` table can show, `2(1 − 1/min(m_a, m_b))` (the L1 distance of a perfectly
    /// correlated table with uniform margins from their product). A pair over that at full
    /// resolution is coarsened: its attribute with more bins is halved (equal-width contiguous
    /// bins of codes, data-independent as in VertiMRF §6.1) until it fits, or until both have
    /// 2 bins and it still does not.
    fn screening_bins(&self, engine: &Engine, a: usize, b: usize) -> Option<Vec<Vec<u32>>> {
        let dims = engine.dims();
        let n_ref = self.phase2_users(engine) / dims.len() as f64;
        let budget = self.bin_noise_l1(engine);
        let (mut ka, mut kb) = (dims[a], dims[b]);
        loop {
            let bins = pair_bins(dims[a], ka, dims[b], kb);
            let uniform = vec![1.0 / (ka * kb) as f64; ka * kb];
            let ceiling = 2.0 * (1.0 - 1.0 / ka.min(kb) as f64);
            let noise = engine.expected_noise_l1(&[a, b], &bins, &uniform, n_ref);
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

    fn bin_noise_l1(&self, engine: &Engine) -> f64 {
        engine
            .options()
            .auto_bin_noise_l1
            .unwrap_or(AUTO_BIN_NOISE_L1)
            .min(2.0)
    }

    /// `auto`'s selection after its screening round (DESIGN.md "Adaptive rounds"; PPSyn
    /// Alg. 2's contribution per budget). Each screened pair's dependence `D̂` (its L1
    /// distance from independence, debiased for the screening noise: [`PairGain`]) is
    /// estimated from the screening tables. A factor f measured by n reports has expected L1 noise `K_f/√n`
    /// (randomizer and sampling variances are both ∝ 1/n; `K_f` at the screening estimate,
    /// for a pair scaled by the share of noise its simplex projection keeps at a tree-sized
    /// allocation `N₂/d`, [`projected_noise_l1`]).
    /// Phase 2 measures every attribute alone and the selected pairs S; its 2-way error is
    /// predicted as `Σ_{p∉S} D̂_p + Σ_f w_f K_f/√n_f`, with `w_f` the number of 2-way
    /// marginals a factor's error enters (1 for a pair, `d − 1` for a 1-way). Under
    /// `Σ n_f = N₂` the allocation `n_f ∝ a_f = (w_f K_f)^{2/3}` minimizes the noise part to
    /// `A^{3/2}/√N₂` with `A = Σ_f a_f`. Pairs are added greedily, each time the one that
    /// lowers the prediction most, within the clique cap, until none does. With too few users
    /// nothing is selected and `auto` is the independence model. Returns the pairs not
    /// selected (pruned) and the phase-2 factors with their task weights `a_f`.
    fn select(
        &self,
        engine: &Engine,
        state: &mut CollectionState,
        ms: &Measurements,
    ) -> (Vec<Edge>, Vec<PlannedFactor>) {
        let d = engine.dims().len();
        let round = state.round;
        let one = one_way_estimates(ms);
        let n2 = self.phase2_users(engine).max(1.0);
        let allocation = |f: &[usize], at: &[f64], w: f64| {
            (w * engine.expected_noise_l1(f, &[], at, 1.0)).powf(2.0 / 3.0)
        };
        let mut factors: Vec<PlannedFactor> = (0..d)
            .map(|a| PlannedFactor {
                factor: vec![a],
                mechanism: engine.best_oracle(&[a], &[]),
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
            let Some(g) = pair_gain_binned(ms, &one, e.a, e.b, &e.bins) else {
                continue;
            };
            e.reports = ms
                .combined_binned(&[e.a, e.b], &e.bins, |_| true, None)
                .map_or(0, |c| c.reports);
            let Some(pdims) = engine.factor_dims(&[e.a, e.b], &e.bins) else {
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
                let k = engine.expected_noise_l1(&f, &e.bins, at, 1.0);
                let n_ref = (n2 / d as f64).max(1.0);
                let sigma = engine.cell_std_errors(&f, &e.bins, at, n_ref);
                let raw = (2.0 / std::f64::consts::PI).sqrt() * sigma.iter().sum::<f64>();
                let kept = projected_noise_l1(at, &sigma, i as u64);
                let shrink = if raw > 0.0 {
                    (kept / raw).min(1.0)
                } else {
                    1.0
                };
                candidates.push((i, dependence, (shrink * k).powf(2.0 / 3.0)));
            }
        }
        let cap = engine
            .options()
            .max_clique_cells
            .unwrap_or(MAX_CLIQUE_CELLS);
        let mut a_total: f64 = factors.iter().map(|f| f.weight).sum();
        let noise = |a: f64| a.powf(1.5) / n2.sqrt();
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
            if largest_clique_cells(engine.dims(), &graph) > cap {
                graph.remove(&e);
                continue;
            }
            keep.insert(i);
            a_total += a;
            let bins = edges[i].bins.clone();
            factors.push(PlannedFactor {
                factor: vec![e.0, e.1],
                mechanism: engine.best_oracle(&[e.0, e.1], &bins),
                weight: a,
                bins,
            });
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
    fn initial_state(&self, engine: &Engine) -> CollectionState {
        let screened: BTreeMap<Edge, Vec<Vec<u32>>> = pairs(engine.dims().len())
            .into_iter()
            .filter_map(|(a, b)| Some(((a, b), self.screening_bins(engine, a, b)?)))
            .collect();
        if screened.is_empty() {
            // No pair could ever pay for its reports: the independence model, at no cost.
            return one_way_state(engine);
        }
        graph_state(engine, &self.params, 1, self.share(engine), |a, b| {
            screened.get(&(a, b)).cloned()
        })
    }

    fn task_choices(
        &self,
        engine: &Engine,
        state: &CollectionState,
    ) -> Result<TaskChoices, EngineError> {
        if let Some(choices) = common_choices(engine, state) {
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
            return Ok(one_way_choices(engine, state));
        }
        // Every screened pair alike: each needs its own dependence estimate.
        Ok(TaskChoices {
            tasks: active
                .iter()
                .map(|e| {
                    let factor = vec![e.a, e.b];
                    TaskSpec {
                        round: state.round,
                        mechanism: engine.best_oracle(&factor, &e.bins),
                        factor,
                        bins: e.bins.clone(),
                    }
                })
                .collect(),
            weights: None,
        })
    }

    fn close_round(
        &self,
        engine: &Engine,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        if state.phase != Phase::GraphConstruction {
            return Ok(Transition::Nothing);
        }
        let t = state.round;
        let ms = engine.measurements(tables, |k| k.round <= t)?;
        let (pruned, factors) = self.select(engine, state, &ms);
        let sigma = self.params.sigma;
        Ok(end_phase1_round(
            state,
            1,
            pruned,
            |_| factors,
            |s| plan_structure(engine, s, sigma, true),
        ))
    }

    fn model_candidates(&self, engine: &Engine, _state: &CollectionState) -> Vec<Edge> {
        pairs(engine.dims().len())
    }
}
