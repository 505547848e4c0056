//! `auto` (DESIGN.md "Adaptive rounds"): a screening round ([`AUTO_PHASE1_SHARE`] of the
//! users) measures, uniformly, every pair that could ever pay for its reports, with the
//! lower-variance oracle; at its close the pairs are selected greedily by predicted 2-way
//! error (`Auto::select`), and phase 2 measures the selected pairs and every attribute
//! alone, allocated to minimize that prediction. With too few users nothing is selected (or
//! nothing is screened) and the result is the independence model. The model graph may keep
//! any measured pair.

use std::collections::BTreeSet;

use ldpsyn::protocol::PrivIncrParams;
use rand::{Rng, RngCore};

use super::{
    CollectionProtocol, active_edges, common_task, end_phase1_round, graph_state, one_way_state,
    one_way_task, pairs, plan_structure,
};
use crate::estimate::{
    MAX_CLIQUE_CELLS, largest_clique_cells, one_way_estimates, pair_gain, projected_noise_l1,
};
use crate::graph::{Edge, edge};
use crate::info::mutual_information;
use crate::state::{CollectionState, Engine, Phase, PlannedFactor, TaskSpec, Transition};
use crate::{EngineError, Measurements, Tables};

/// Share of the users `auto` spends on its screening round (every screened pair measured
/// alike); `omega` of the config is ignored by `auto`. Chosen by a sweep over adult,
/// nist-taxi, temporal-match2 and the built-in network at ε ∈ {1, 2, 4, 8}
/// (`benchmarks/sweeps/auto-screening-share.md`): shares 0.1–0.5 are within 1.5% of each
/// other on average, 0.3 among the best.
pub const AUTO_PHASE1_SHARE: f64 = 0.3;

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

    /// Whether `auto` screens pair `(a, b)`: only if measuring it with the users of a
    /// tree-sized phase 2 (`N₂/d` reports: about `d − 1` pairs and `d` 1-ways share it) could
    /// give less L1 noise than the largest dependence any pair can show (2: an L1 distance
    /// between two distributions). Other pairs can never pay for their reports.
    fn screens(&self, engine: &Engine, a: usize, b: usize) -> bool {
        let dims = engine.dims();
        let (ka, kb) = (dims[a], dims[b]);
        let uniform = vec![1.0 / (ka * kb) as f64; ka * kb];
        let n_ref = self.phase2_users(engine) / dims.len() as f64;
        engine.expected_noise_l1(&[a, b], &uniform, n_ref) < 2.0
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
            (w * engine.expected_noise_l1(f, at, 1.0)).powf(2.0 / 3.0)
        };
        let mut factors: Vec<PlannedFactor> = (0..d)
            .map(|a| PlannedFactor {
                factor: vec![a],
                mechanism: engine.best_oracle(&[a]),
                weight: allocation(&[a], &one[a], (d - 1).max(1) as f64),
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
            let Some(g) = pair_gain(ms, &one, e.a, e.b) else {
                continue;
            };
            e.reports = ms.combined(&[e.a, e.b]).map_or(0, |c| c.reports);
            e.mi = Some(mutual_information(
                &g.projected,
                engine.dims()[e.a],
                engine.dims()[e.b],
            ));
            let dependence = g.dependence;
            e.score = Some(dependence);
            if dependence > 0.0 {
                // Noise scale K at the screening estimate, times the share of it that the
                // simplex projection leaves at a tree-sized phase-2 allocation (sparse
                // tables lose much of their noise to it).
                let f = [e.a, e.b];
                let at = &g.projected;
                let k = engine.expected_noise_l1(&f, at, 1.0);
                let n_ref = (n2 / d as f64).max(1.0);
                let sigma = engine.cell_std_errors(&f, at, n_ref);
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
            factors.push(PlannedFactor {
                factor: vec![e.0, e.1],
                mechanism: engine.best_oracle(&[e.0, e.1]),
                weight: a,
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
        let d = engine.dims().len();
        if !pairs(d)
            .into_iter()
            .any(|(a, b)| self.screens(engine, a, b))
        {
            // No pair could ever pay for its reports: the independence model, at no cost.
            return one_way_state(engine);
        }
        graph_state(engine, &self.params, 1, self.share(engine), |a, b| {
            self.screens(engine, a, b)
        })
    }

    fn draw_task(
        &self,
        engine: &Engine,
        state: &CollectionState,
        rng: &mut dyn RngCore,
    ) -> Result<TaskSpec, EngineError> {
        if let Some(task) = common_task(engine, state, rng) {
            return task;
        }
        if state.phase != Phase::GraphConstruction {
            return Err(EngineError::InvalidState(format!(
                "auto has no {:?} phase",
                state.phase
            )));
        }
        let active = active_edges(state);
        if active.is_empty() {
            return Ok(one_way_task(engine, state, rng));
        }
        // Every screened pair alike: each needs its own dependence estimate.
        let i = rng.random_range(0..active.len());
        let factor = vec![active[i].a, active[i].b];
        Ok(TaskSpec {
            round: state.round,
            mechanism: engine.best_oracle(&factor),
            factor,
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
        let ms = Measurements::filtered(engine.epsilon(), engine.dims(), tables, |k| k.round <= t)?;
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
