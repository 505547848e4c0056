//! Finalization as a named sequence of stages, the same for every protocol (the protocols
//! differ in what they collect): [`measure`] every table, [`stratify`] rounds as strata of
//! the population, [`select`] the model graph by expected gain within the clique cap, [`fit`]
//! one graphical model to every measurement and smooth numeric 1-ways, then release the
//! model through the protocol's conditionals with what it was built from.
//!
//! Deterministic given `(state, tables)`: reductions iterate tables in key order.

use std::collections::{BTreeMap, BTreeSet};

use crate::EngineError;
use crate::fit::bootstrap::Refit;
use crate::fit::joint::FittedJoint;
use crate::fit::observe::fit_model_with_local;
use crate::fit::pgm::{FitOptions, GraphicalModel};
use crate::fit::residuals::{FitResiduals, fit_residuals};
use crate::fit::smooth::{SMOOTHING_RELEASE_Z, smooth_numeric_one_ways};
use crate::graph::Edge;
use crate::measure::drift::{DriftReport, post_stratify};
use crate::measure::local_model::LocalModel;
use crate::measure::tables::{Measurements, Tables};
use crate::protocols::CollectionProtocol;
use crate::protocols::context::Context;
use crate::protocols::cross_party::{CrossMarginal, cross_observations};
use crate::select::gain::{NullOneWays, PairGain};
use crate::select::model_graph::{clique_cap, select_model_graph_from};
use crate::select::structure::build_structure;
use crate::state::CollectionState;
use crate::synth::description::{EdgeGain, MeasuredFactor, RoundSummary};
use crate::synth::model::Model;
use crate::synth::recovery::Recovery;

/// Builds the model from everything collected, in `ctx`'s working space (the engine's
/// [`crate::engine::Engine::finalize`]), with the parties' local models of an `fo+locmrf`
/// vertical collection (`local`, checked by the caller; empty otherwise): their graphs start
/// the model graph and their measurements join the fit. `sketched` are the cross-party
/// tables of a `sketch+locmrf` collection with the pooled n̂ of its sketch reports
/// ([`crate::protocols::cross_party::cross_party_marginals`]; `None` otherwise): their pairs
/// are candidates of the model graph by their gains, and the kept ones join the fit, in
/// bins. Errors: tables that do not fit their mechanisms; [`EngineError::NoData`] when
/// there are no reports at all; the protocol's own estimator failing.
pub(crate) fn finalize(
    ctx: &Context,
    rules: &dyn CollectionProtocol,
    state: &CollectionState,
    tables: &Tables,
    local: &[LocalModel],
    sketched: Option<(&[CrossMarginal], f64)>,
) -> Result<Model, EngineError> {
    let (ms, people) = match sketched {
        // No per-record report: the people are the sketches' pooled n̂.
        Some((_, n)) => {
            let ms = rules
                .measurements(ctx, tables, &|_| true)?
                .with_population(ctx.target_users());
            (ms, n.max(1.0).round() as u64)
        }
        None => measure(ctx, rules, tables)?,
    };
    let cross = sketched.map_or(&[][..], |(c, _)| c);
    let (ms, drift) = stratify(rules, ms);
    let given: BTreeSet<Edge> = local
        .iter()
        .flat_map(|m| m.graph().iter().copied())
        .collect();
    let extra: Vec<(Edge, PairGain)> = cross.iter().map(|c| (c.pair, c.gain.clone())).collect();
    let (gains, edges) = select(ctx, rules, state, &ms, people, &given, &extra);
    let ms = ms.retained(|m| rules.fit_table(&m.key, &edges));
    let (fitted, residuals) = fit(ctx, rules, &ms, local, cross, &edges)?;
    // Cliques are within the cap: one conditional per clique (no Algorithm 2 split).
    let structure = build_structure(ctx.domain(), &edges, &[], u64::MAX);
    let recovery = Recovery::new(ctx.space(), &ms);
    let mut source = FittedJoint::new(ms, fitted).with_shared_records(rules.tables_share_records());
    // Replicates draw each table on its own people, and do not redraw local models.
    if !rules.tables_share_records() && local.is_empty() {
        source = source.with_bootstrap(Refit {
            space: ctx.space().clone(),
            release_z: release_z(ctx),
            options: FitOptions::default(),
        });
    }
    let model = rules.final_model(ctx, state, structure, source)?;
    Ok(model
        .with_gains(release_gains(gains, &edges))
        .with_recovery(recovery)
        .with_rounds(round_summaries(state, tables))
        .with_drift(drift)
        .with_residuals(Some(residuals)))
}

/// Stage 1: every table as a measurement against the population, and the number of people
/// who reported ([`CollectionProtocol::reporting_people`]). Errors: a table that does not fit its mechanism;
/// [`EngineError::NoData`].
pub fn measure(
    ctx: &Context,
    rules: &dyn CollectionProtocol,
    tables: &Tables,
) -> Result<(Measurements, u64), EngineError> {
    let ms = rules
        .measurements(ctx, tables, &|_| true)?
        .with_population(ctx.target_users());
    if ms.items().is_empty() {
        return Err(EngineError::NoData);
    }
    let people = rules.reporting_people(&ms);
    Ok((ms, people))
}

/// Stage 2: rounds as strata of the population (people arrive in an order that may
/// correlate with their data): every table calibrated to the post-stratified 1-ways
/// ([`post_stratify`]). Tables that share records are one stratum. The drift report is
/// kept when there is more than one round.
pub fn stratify(
    rules: &dyn CollectionProtocol,
    ms: Measurements,
) -> (Measurements, Option<DriftReport>) {
    if rules.tables_share_records() {
        return (ms, None);
    }
    let (ms, report) = post_stratify(ms);
    (ms, (report.round_weights.len() > 1).then_some(report))
}

/// Stage 3: the model graph. Each of the protocol's candidate pairs is scored by its
/// expected gain ([`CollectionProtocol::pair_gain`]; a pair measured under several bin maps
/// on its best binning; then jointly, [`CollectionProtocol::pool_gains`]) and kept greedily
/// within the clique cap, starting from the edges `given` (the parties' local graphs;
/// [`select_model_graph_from`]). `extra` are pairs scored apart from the tables (the
/// cross-party sketch tables of `sketch+locmrf`, VertiMRF §5.1 GraphCom), candidates beside
/// the protocol's.
pub fn select(
    ctx: &Context,
    rules: &dyn CollectionProtocol,
    state: &CollectionState,
    ms: &Measurements,
    people: u64,
    given: &BTreeSet<Edge>,
    extra: &[(Edge, PairGain)],
) -> (Vec<(Edge, PairGain)>, BTreeSet<Edge>) {
    let nulls = NullOneWays::new(ms);
    let mut gains: Vec<(Edge, PairGain)> = rules
        .model_candidates(ctx, state)
        .into_iter()
        .filter_map(|(a, b)| Some(((a, b), rules.pair_gain(state, &nulls, a, b)?)))
        .collect();
    gains.extend(extra.iter().cloned());
    rules.pool_gains(ctx, state, &mut gains);
    let cap = clique_cap(ctx.options().max_clique_cells, people);
    let margin = ctx
        .options()
        .gain_margin
        .unwrap_or_else(|| rules.gain_margin());
    let edges = select_model_graph_from(ctx.domain(), given, &gains, cap, margin, |a, b| {
        ctx.pair_weight(a, b)
    });
    (gains, edges)
}

/// Stage 4: one graphical model over the junction tree of `edges` fitted to every
/// measurement, every local model's and the kept `cross` tables ([`fit_model_with_local`],
/// [`cross_observations`]), checked against the
/// LDP tables ([`fit_residuals`]), then each numeric attribute's 1-way smoothed over its
/// ordered bins ([`smooth_numeric_one_ways`]). Errors: the fit failing.
pub fn fit(
    ctx: &Context,
    rules: &dyn CollectionProtocol,
    ms: &Measurements,
    local: &[LocalModel],
    cross: &[CrossMarginal],
    edges: &BTreeSet<Edge>,
) -> Result<(GraphicalModel, FitResiduals), EngineError> {
    let ratio = ctx
        .options()
        .local_precision_ratio
        .unwrap_or_else(|| rules.local_precision_ratio());
    let observe = |tree: &_| cross_observations(cross, edges, tree);
    let fitted = fit_model_with_local(ms, local, &observe, ratio, edges, &FitOptions::default())?;
    let residuals = fit_residuals(ms, &fitted);
    let fitted = smooth_numeric_one_ways(ctx.space(), ms, fitted, release_z(ctx));
    Ok((fitted, residuals))
}

/// The numeric 1-way smoother's release threshold.
fn release_z(ctx: &Context) -> f64 {
    ctx.options()
        .smoothing_release_z
        .unwrap_or(SMOOTHING_RELEASE_Z)
}

/// Every candidate pair's gain as the model describes it, marked kept when in `edges`.
fn release_gains(gains: Vec<(Edge, PairGain)>, edges: &BTreeSet<Edge>) -> Vec<EdgeGain> {
    gains
        .into_iter()
        .map(|((a, b), g)| EdgeGain {
            a,
            b,
            observed_l1: g.observed_l1,
            noise_l1: g.noise_l1,
            dependence: g.dependence,
            dependence_sd: g.dependence_sd,
            kept: edges.contains(&(a, b)),
        })
        .collect()
}

/// Per round, its tables with their reports (most first) and, for a pair, the score the
/// state recorded for it ([`crate::graph::EdgeState::score`], else its MI).
fn round_summaries(state: &CollectionState, tables: &Tables) -> Vec<RoundSummary> {
    let score = |f: &[usize]| match f {
        [a, b] => state
            .edges()
            .iter()
            .find(|e| (e.a, e.b) == (*a.min(b), *a.max(b)))
            .and_then(|e| e.score.or(e.mi)),
        _ => None,
    };
    let mut rounds: BTreeMap<u32, Vec<MeasuredFactor>> = BTreeMap::new();
    for (key, stats) in tables {
        rounds.entry(key.round).or_default().push(MeasuredFactor {
            factor: key.factor.clone(),
            mechanism: key.mechanism,
            bins: key.bins.clone(),
            reports: stats.n,
            score: score(&key.factor),
        });
    }
    rounds
        .into_iter()
        .map(|(round, mut factors)| {
            factors.sort_by(|x, y| y.reports.cmp(&x.reports).then(x.factor.cmp(&y.factor)));
            RoundSummary {
                round,
                reports: factors.iter().map(|f| f.reports).sum(),
                factors,
            }
        })
        .collect()
}
