//! The collection state machine: task assignment, round closing (PrivIncr pruning,
//! SamPrivSyn re-weighting, `auto`'s structure selection) and finalization.
//!
//! Everything here is a pure function of the [`Engine`] (built from the public collection
//! config), the serializable [`CollectionState`] ([`crate::state`]) and the [`Tables`] of
//! sufficient statistics:
//! the HTTP service stores the state in its database in the same transaction as the report
//! that caused a transition, and any process can recompute the same transition from the same
//! tables.
//!
//! What differs between protocols (initial state, tasks, tables, round closing, the pairs
//! the model graph may keep) lives in one module per protocol behind
//! [`crate::protocols::CollectionProtocol`], chosen once in [`Engine::from_parts`]; the
//! protocol sees the collection through a [`Context`], never the engine.
//!
//! Every protocol finalizes the same way ([`Engine::finalize`], the stages of
//! [`crate::pipeline`]): every table is a measurement, the model graph keeps the candidate
//! pairs with positive expected gain within the clique cap, and one graphical model is fitted
//! to all measurements. The protocols differ in what they collect.

use std::borrow::Cow;
use std::sync::Arc;

use ldpsyn::Epsilon;
use ldpsyn::mechanism::Mechanism;
use ldpsyn::wire::{CollectionConfig, Protocol};
use rand::Rng;

use crate::EngineError;
use crate::domain::key::TableKey;
use crate::domain::space::Space;
use crate::domain::task::{MAX_ATTRIBUTE_DOMAIN, MAX_PAIR_CELLS, SUB_BIN_ONE_WAY_SHARE, TaskSpec};
use crate::measure::tables::{Measurements, Tables};
use crate::pipeline::finalize;
use crate::protocols::CollectionProtocol;
use crate::protocols::context::Context;
use crate::protocols::cross_party::{PartyUploads, check_uploads, cross_party_marginals};
use crate::protocols::registry::registry;
use crate::protocols::rounds::RoundPlan;
use crate::protocols::vertical::{Vertical, resolve};
use crate::state::{CollectionState, EngineOptions, Phase, Transition};
use crate::synth::model::Model;

/// The task distribution of one state ([`Engine::sampler`]): draws in O(log n) (uniform: O(1)),
/// so a request for many tasks, or a cache of it per state, does not rebuild the protocol's
/// choices per task.
#[derive(Debug, Clone)]
pub struct TaskSampler {
    engine: Engine,
    tasks: Vec<TaskSpec>,
    /// Cumulative weights (`None`: uniform).
    cdf: Option<Vec<f64>>,
    /// [`TaskChoices::sub_bin_share`](crate::protocols::TaskChoices::sub_bin_share).
    sub_bin_share: Option<f64>,
}

impl TaskSampler {
    /// Draws one task (schema codes: bin maps as devices apply them).
    pub fn draw<R: Rng + ?Sized>(&self, rng: &mut R) -> TaskSpec {
        let i = match &self.cdf {
            None => rng.random_range(0..self.tasks.len()),
            Some(cdf) => {
                let u = rng.random::<f64>() * cdf[cdf.len() - 1];
                cdf.partition_point(|&c| c <= u).min(cdf.len() - 1)
            }
        };
        self.engine
            .to_codes(self.tasks[i].clone(), self.sub_bin_share, rng)
    }

    /// Number of distinct tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Never true: a sampler has at least one task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

/// Most attributes a collection may have. Per-pair structures (candidate edges, mutual
/// information, SamPrivSyn's pair weights) grow with the square of this: 512 attributes are
/// 130,816 pairs, which keeps a round close's memory and time bounded whatever an admin
/// submits. [`Engine::new`] refuses more (the server answers `invalid-schema` first).
pub const MAX_ATTRIBUTES: usize = 512;

/// The engine of one collection: its config, resolved. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine {
    /// What the protocol sees: working space, ε, N, parameters, options.
    context: Context,
    /// The protocol's rules, chosen once from `protocol`.
    rules: Arc<dyn CollectionProtocol>,
    /// A vertical collection's parties (the same rules, for the party-upload path).
    vertical: Option<Arc<Vertical>>,
}

impl Engine {
    /// The engine of a collection. Errors: more than [`MAX_ATTRIBUTES`] attributes, a schema
    /// attribute of fewer than 2 values, or invalid protocol parameters (omega ∉ (0,1), rounds = 0, alpha ∉ (0,1], phi ≤ 0,
    /// batch size 0).
    pub fn new(config: &CollectionConfig) -> Result<Self, EngineError> {
        Self::with_options(config, EngineOptions::default())
    }

    /// As [`Engine::new`] with [`EngineOptions`].
    pub fn with_options(
        config: &CollectionConfig,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        let vertical = resolve(&config.protocol, &config.schema)?;
        if let Some(v) = &vertical {
            if config
                .schema
                .attributes()
                .iter()
                .any(|a| a.working_bins().is_some())
            {
                return Err(EngineError::InvalidConfig(
                    "a vertical collection needs fixed bins (`bins: \"auto\"` is for device \
                     collections)"
                        .into(),
                ));
            }
            let want = v.max_party_epsilon();
            if (config.epsilon.get() - want).abs() > 1e-9 * want.max(1.0) {
                return Err(EngineError::InvalidConfig(format!(
                    "a vertical collection's epsilon is its largest party total ε = {want} \
                     (got {})",
                    config.epsilon
                )));
            }
        }
        let mut targets = Vec::with_capacity(config.target.len());
        for name in &config.target {
            let a = config.schema.index_of(name).ok_or_else(|| {
                EngineError::InvalidConfig(format!(
                    "`target` names `{name}`, which is not an attribute of the schema"
                ))
            })?;
            if targets.contains(&a) {
                return Err(EngineError::InvalidConfig(format!(
                    "`target` names `{name}` twice"
                )));
            }
            targets.push(a);
        }
        if !targets.is_empty() && targets.len() >= config.schema.len() {
            return Err(EngineError::InvalidConfig(
                "`target` must leave at least one attribute to predict it from".into(),
            ));
        }
        let mut engine = Self::assemble(
            Space::from_schema(&config.schema)?,
            config.epsilon,
            config.target_users,
            config.protocol.clone(),
            options,
            vertical.map(Arc::new),
        )?;
        engine.context.set_targets(targets);
        Ok(engine)
    }

    /// The engine from its parts (domain sizes instead of a schema: every code its own
    /// working bin).
    pub fn from_parts(
        dims: Vec<usize>,
        epsilon: Epsilon,
        target_users: u64,
        protocol: Protocol,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        Self::from_space(
            Space::identity(dims),
            epsilon,
            target_users,
            protocol,
            options,
        )
    }

    /// The engine over the working space `space` ([`crate::domain::space`]). Errors: as
    /// [`Engine::new`]; a vertical protocol (its parties name schema attributes: build it
    /// with [`Engine::new`]).
    pub(crate) fn from_space(
        space: Space,
        epsilon: Epsilon,
        target_users: u64,
        protocol: Protocol,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        Self::assemble(space, epsilon, target_users, protocol, options, None)
    }

    fn assemble(
        space: Space,
        epsilon: Epsilon,
        target_users: u64,
        protocol: Protocol,
        options: EngineOptions,
        vertical: Option<Arc<Vertical>>,
    ) -> Result<Self, EngineError> {
        let dims = space.dims().to_vec();
        if dims.len() > MAX_ATTRIBUTES {
            return Err(EngineError::InvalidConfig(format!(
                "{} attributes; a collection takes at most {MAX_ATTRIBUTES}",
                dims.len()
            )));
        }
        if space.code_dims().is_empty()
            || space.code_dims().iter().any(|&k| k < 2)
            || dims.iter().any(|&k| k < 2)
        {
            return Err(EngineError::InvalidConfig(
                "every attribute needs ≥ 2 values".into(),
            ));
        }
        // Every table a task can open is allocated on its first report, which anyone may
        // send: bound the domains here, before any request can ask for them.
        if let Some((a, &k)) = space
            .code_dims()
            .iter()
            .enumerate()
            .find(|(_, k)| **k > MAX_ATTRIBUTE_DOMAIN)
        {
            return Err(EngineError::InvalidConfig(format!(
                "attribute {a} has {k} values, more than {MAX_ATTRIBUTE_DOMAIN}"
            )));
        }
        if !matches!(protocol, Protocol::Auto(_) | Protocol::Independence {}) {
            // These measure every pair at full working resolution.
            let mut order: Vec<usize> = (0..dims.len()).collect();
            order.sort_by_key(|&a| std::cmp::Reverse(dims[a]));
            if let [a, b, ..] = order[..]
                && dims[a].saturating_mul(dims[b]) > MAX_PAIR_CELLS
            {
                return Err(EngineError::InvalidConfig(format!(
                    "attributes {a} and {b} make a pair of {} cells, more than {MAX_PAIR_CELLS} \
                     (use fewer bins, or protocol auto, which bins large pairs)",
                    dims[a] * dims[b]
                )));
            }
        }
        let rules = registry(&protocol, vertical.as_ref())?;
        Ok(Self::with_rules(
            Context::new(space, epsilon, target_users, protocol, options),
            rules,
            vertical,
        ))
    }

    /// The engine of `context` run by `rules` (from the registry, or a test's own protocol).
    fn with_rules(
        context: Context,
        rules: Arc<dyn CollectionProtocol>,
        vertical: Option<Arc<Vertical>>,
    ) -> Self {
        Self {
            context,
            rules,
            vertical,
        }
    }

    /// Working domain sizes: what protocols and the model see (the schema's, with a
    /// `bins: "auto"` attribute in its working bins; [`crate::domain::space`]).
    pub fn dims(&self) -> &[usize] {
        self.context.dims()
    }

    /// Domain sizes of the schema (the codes devices encode to).
    pub fn schema_dims(&self) -> &[usize] {
        self.context.schema_dims()
    }

    /// Schema codes ↔ working bins.
    pub fn space(&self) -> &Space {
        self.context.space()
    }

    /// What the protocol sees of this collection.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Every table (of rounds for which `keep` holds) as a measurement in the working space
    /// ([`Measurements::filtered_in`]). Errors: a table that does not fit its mechanism.
    pub fn measurements(
        &self,
        tables: &Tables,
        keep: impl Fn(&TableKey) -> bool,
    ) -> Result<Measurements, EngineError> {
        self.rules.measurements(&self.context, tables, &keep)
    }

    /// A vertical collection's parties resolved against the schema; `None` for device
    /// collections.
    pub fn vertical(&self) -> Option<&Vertical> {
        self.vertical.as_deref()
    }
    /// ε of every report.
    pub fn epsilon(&self) -> Epsilon {
        self.context.epsilon()
    }
    /// The protocol.
    pub fn protocol(&self) -> &Protocol {
        self.context.protocol()
    }
    /// Target number of users N.
    pub fn target_users(&self) -> u64 {
        self.context.target_users()
    }
    /// Engine options.
    pub fn options(&self) -> &EngineOptions {
        self.context.options()
    }

    /// The state of a new collection.
    pub fn initial_state(&self) -> CollectionState {
        self.rules.initial_state(&self.context)
    }

    /// Draws the next task: a pure function of the state and `rng`, never of anyone's data.
    /// Builds the state's [`TaskSampler`] (O(tasks)); to draw many tasks of one state, build
    /// it once with [`Engine::sampler`]. Errors: [`EngineError::Finalized`] once finalized.
    pub fn draw_task<R: Rng + ?Sized>(
        &self,
        state: &CollectionState,
        rng: &mut R,
    ) -> Result<TaskSpec, EngineError> {
        Ok(self.sampler(state)?.draw(rng))
    }

    /// The task distribution of `state`, to draw from in O(log n) per task
    /// ([`TaskSampler::draw`]). Errors: as [`Engine::draw_task`].
    pub fn sampler(&self, state: &CollectionState) -> Result<TaskSampler, EngineError> {
        let engine = self.at(state)?;
        let choices = engine.rules.task_choices(&engine.context, state)?;
        if choices.tasks.is_empty() {
            return Err(EngineError::InvalidState("a state without tasks".into()));
        }
        let cdf = choices.weights.as_ref().map(|w| {
            w.iter()
                .scan(0.0, |acc, &x| {
                    *acc += x.max(0.0);
                    Some(*acc)
                })
                .collect::<Vec<f64>>()
        });
        if cdf
            .as_ref()
            .is_some_and(|c| c.last().is_none_or(|&t| t <= 0.0))
        {
            return Err(EngineError::InvalidState("task weights sum to 0".into()));
        }
        Ok(TaskSampler {
            engine: engine.into_owned(),
            tasks: choices.tasks,
            cdf,
            sub_bin_share: choices.sub_bin_share,
        })
    }

    /// This engine in the working space of `state`: the schema's, with the working bins an
    /// earlier round placed ([`CollectionState::working_bins`]). Errors: adapted bins that do
    /// not fit the schema.
    pub fn at(&self, state: &CollectionState) -> Result<Cow<'_, Engine>, EngineError> {
        Ok(match self.context.at(state)? {
            Cow::Borrowed(_) => Cow::Borrowed(self),
            Cow::Owned(context) => Cow::Owned(Engine {
                context,
                rules: self.rules.clone(),
                vertical: self.vertical.clone(),
            }),
        })
    }

    /// A protocol's task (working codes) as devices run it; a refinable 1-way goes to
    /// sub-bins with probability `sub_bin_share` (`None`: the engine's share).
    fn to_codes<R: Rng + ?Sized>(
        &self,
        task: TaskSpec,
        sub_bin_share: Option<f64>,
        rng: &mut R,
    ) -> TaskSpec {
        // Some of a binned attribute's 1-ways are measured in sub-bins (the shape within its
        // working bins), the others in the working bins (the bins' totals, at less noise).
        let share = sub_bin_share
            .or(self.options().sub_bin_share)
            .unwrap_or(SUB_BIN_ONE_WAY_SHARE)
            .clamp(0.0, 1.0);
        let sub_bins = (self.space().refinable(&task) && rng.random_bool(share))
            .then(|| self.context.sub_bins_per_bin());
        self.space().task_to_codes(task, sub_bins, self.epsilon())
    }

    /// The table a report answering `task` is counted in: its round is the protocol's
    /// stratum of the task's round ([`CollectionProtocol::stratum`]: independence pools
    /// every report in round 0, SamPrivSyn its batches into strata by arrival, PrivIncr and
    /// auto keep one table per round).
    pub fn table_key(&self, task: &TaskSpec) -> TableKey {
        TableKey {
            round: self.rules.stratum(&self.context, task.round),
            factor: task.factor.clone(),
            mechanism: task.mechanism,
            bins: task.bins.clone(),
        }
    }

    /// The mechanism of a table (to validate and accumulate reports): over the product of
    /// the factor's (binned) schema domains.
    /// Errors: an invalid factor or bin map for the schema.
    pub fn mechanism(&self, key: &TableKey) -> Result<Mechanism, EngineError> {
        let dims = key.binned().sizes_in(self.schema_dims()).ok_or_else(|| {
            EngineError::InvalidState(format!(
                "factor {:?} with bins {:?} does not fit the schema",
                key.factor, key.bins
            ))
        })?;
        Ok(self.rules.table_mechanism(&self.context, key, &dims)?)
    }

    /// Whether the current round (batch) should close now that it has
    /// `accepted_in_current_round` accepted reports (reports whose task round is
    /// `state.round`).
    pub fn should_close(&self, state: &CollectionState, accepted_in_current_round: u64) -> bool {
        match (state.phase, state.round_quota) {
            (Phase::GraphConstruction | Phase::PairSampling, Some(q)) => {
                accepted_in_current_round >= q
            }
            _ => false,
        }
    }

    /// Closes the current round: PrivIncr pruning (and, after the last round, the phase-2
    /// plan), `auto`'s selection, or SamPrivSyn re-weighting. Deterministic given the tables
    /// (only tables of rounds ≤ the current round are read). Also the operator's "close
    /// round now". Errors: tables that do not fit their mechanisms.
    pub fn close_round(
        &self,
        state: &mut CollectionState,
        tables: &Tables,
    ) -> Result<Transition, EngineError> {
        let engine = self.at(state)?;
        engine.rules.close_round(&engine.context, state, tables)
    }

    /// The collection's rounds in `state`, first to last (closed, open, planned; a
    /// finalized collection's only up to the round open at finalize), each with what it
    /// measures and how many pairs its close dropped. Empty for protocols without rounds of
    /// their own (SamPrivSyn, independence, vertical) and for `auto` with no pair worth
    /// screening. A pure function of the state; never fails.
    pub fn rounds(&self, state: &CollectionState) -> Vec<RoundPlan> {
        self.rules.rounds(&self.context, state)
    }

    /// Marks the state finalized (no more tasks).
    pub fn mark_finalized(&self, state: &mut CollectionState) {
        state.phase = Phase::Finalized;
        state.round_quota = None;
    }

    /// Builds the model from everything collected: every table becomes a measurement, the
    /// model graph keeps the candidate pairs with positive expected gain within the clique
    /// cap, and one graphical model is fitted to all measurements ([`crate::pipeline`]).
    /// SamPrivSyn with `samprivsyn_lasso` set keeps the paper's own estimator and data
    /// generation (eq. 7, eq. 11, Algorithm 2) for its synthetic rows.
    /// Deterministic given `(state, tables)`. Errors: tables that do not fit their
    /// mechanisms; [`EngineError::NoData`] when there are no reports at all;
    /// [`EngineError::InvalidState`] for a vertical collection whose encoding needs its
    /// parties' uploads ([`Engine::finalize_vertical`]).
    pub fn finalize(&self, state: &CollectionState, tables: &Tables) -> Result<Model, EngineError> {
        self.finalize_vertical(state, tables, &PartyUploads::default())
    }

    /// As [`Engine::finalize`], with what the parties of a vertical collection uploaded
    /// besides their records ([`PartyUploads`], checked by [`Engine::check_party_uploads`]):
    /// - local models (LocMRF, [`crate::measure::local_model`]; `fo+locmrf`,
    ///   `sampled+locmrf`, `sketch+locmrf`): their graphs start the model graph and their
    ///   measurements join the fit;
    /// - sketch reports (`sketch+locmrf`, VertiMRF as published;
    ///   [`crate::protocols::cross_party`]): the cross-party pairs' binned tables estimated
    ///   from them (CarEst) are candidates of the model graph beside the local graphs
    ///   (GraphCom), and the kept ones are measurements of the fit with their per-cell
    ///   variances. `tables` is then empty (no per-record report under this encoding).
    ///
    /// Errors: as [`Engine::finalize`]; [`EngineError::InvalidState`] when the uploads fail
    /// [`Engine::check_party_uploads`].
    pub fn finalize_vertical(
        &self,
        state: &CollectionState,
        tables: &Tables,
        uploads: &PartyUploads,
    ) -> Result<Model, EngineError> {
        self.check_party_uploads(uploads)?;
        let sketched = match self.vertical() {
            Some(v) if v.encoding().is_sketch() => Some(
                cross_party_marginals(v, &uploads.sketches).map_err(EngineError::InvalidState)?,
            ),
            _ => None,
        };
        let engine = self.at(state)?;
        finalize(
            &engine.context,
            engine.rules.as_ref(),
            state,
            tables,
            &uploads.models,
            sketched.as_ref().map(|(cross, n)| (&cross[..], n.value)),
        )
    }

    /// Whether `uploads` are exactly what [`Engine::finalize_vertical`] needs: one local
    /// model per party with a `locmrf` budget, each passing
    /// [`crate::measure::local_model::LocalModel::check`], and under
    /// `sketch+locmrf` one sketch report per party passing
    /// [`crate::protocols::cross_party::check_uploads`]; nothing for a collection that is not
    /// vertical. Errors: [`EngineError::InvalidState`] saying what is missing or wrong.
    pub fn check_party_uploads(&self, uploads: &PartyUploads) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidState(m));
        let Some(v) = self.vertical() else {
            return if uploads.models.is_empty() && uploads.sketches.is_empty() {
                Ok(())
            } else {
                bad("local models and sketch reports are for vertical collections".into())
            };
        };
        let mut seen = vec![false; v.parties().len()];
        for m in &uploads.models {
            let Some(p) = v.party_index(m.party()) else {
                return bad(format!("local model of unknown party `{}`", m.party()));
            };
            if std::mem::replace(&mut seen[p], true) {
                return bad(format!("two local models of party `{}`", m.party()));
            }
            let party = &v.parties()[p];
            m.check(
                &party.name,
                &party.attributes,
                party.locmrf,
                self.schema_dims(),
            )
            .map_err(EngineError::InvalidState)?;
        }
        for (p, party) in v.parties().iter().enumerate() {
            if party.locmrf.is_some() && !seen[p] {
                return bad(format!(
                    "party `{}` has not uploaded its local model (encoding {})",
                    party.name,
                    v.encoding().name()
                ));
            }
        }
        if v.encoding().is_sketch() {
            check_uploads(v, &uploads.sketches).map_err(EngineError::InvalidState)?;
        } else if !uploads.sketches.is_empty() {
            return bad(format!(
                "sketch reports are for encoding `sketch+locmrf`, not `{}`",
                v.encoding().name()
            ));
        }
        Ok(())
    }

    /// Whether the collection takes per-record reports (devices' or parties' records): every
    /// collection but a `sketch+locmrf` vertical one, whose parties upload only their local
    /// models and sketch reports.
    pub fn takes_records(&self) -> bool {
        !self.vertical().is_some_and(|v| v.encoding().is_sketch())
    }
}

#[cfg(test)]
mod tests {
    use ldpsyn::mechanism::{MechanismKind, SufficientStatistics};
    use rand::SeedableRng;
    use rand_chacha::ChaCha12Rng;

    use super::*;
    use crate::graph::{Edge, EdgeState};
    use crate::protocols::{TaskChoices, pairs};
    use crate::state::{AdaptedBins, PairRounds, PairSampling, Phase, ProtocolState};

    /// A protocol written outside the registry: every pair drawn uniformly with GRR, in one
    /// round that never closes.
    #[derive(Debug)]
    struct EveryPair;

    impl CollectionProtocol for EveryPair {
        fn initial_state(&self, _ctx: &Context) -> CollectionState {
            CollectionState {
                phase: Phase::PairSampling,
                round: 0,
                round_quota: None,
                working_bins: Default::default(),
                protocol: ProtocolState::Independence {},
            }
        }

        fn task_choices(
            &self,
            ctx: &Context,
            state: &CollectionState,
        ) -> Result<TaskChoices, EngineError> {
            let tasks = pairs(ctx.dims().len())
                .into_iter()
                .map(|(a, b)| TaskSpec {
                    round: state.round,
                    factor: vec![a, b],
                    mechanism: MechanismKind::Grr,
                    bins: Vec::new(),
                })
                .collect();
            Ok(TaskChoices {
                tasks,
                weights: None,
                sub_bin_share: None,
            })
        }

        fn close_round(
            &self,
            _ctx: &Context,
            _state: &mut CollectionState,
            _tables: &Tables,
        ) -> Result<Transition, EngineError> {
            Ok(Transition::Nothing)
        }

        fn model_candidates(&self, ctx: &Context, _state: &CollectionState) -> Vec<Edge> {
            pairs(ctx.dims().len())
        }
    }

    /// A protocol is one module behind the trait: `EveryPair` runs through the engine (tasks,
    /// tables, finalize) with nothing else written for it. Of three attributes, 0 and 1 agree
    /// for 90% of the people: the model keeps that pair (its 2-way TVD is far below the
    /// independence model's 0.6) and leaves the independent attribute 2 alone.
    #[test]
    fn a_protocol_plugs_in_through_the_trait_alone() {
        let people = 30_000u64;
        let context = Context::new(
            Space::identity(vec![3, 3, 2]),
            Epsilon::new(4.0).unwrap(),
            people,
            Protocol::Independence {},
            EngineOptions::default(),
        );
        let engine = Engine::with_rules(context, Arc::new(EveryPair), None);
        let state = engine.initial_state();
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        let mut tables = Tables::new();
        for _ in 0..people {
            let x0 = rng.random_range(0..3u32);
            let x1 = if rng.random_bool(0.9) {
                x0
            } else {
                rng.random_range(0..3)
            };
            let record = [x0, x1, u32::from(rng.random_bool(0.5))];
            let task = engine.draw_task(&state, &mut rng).unwrap();
            let key = engine.table_key(&task);
            let mechanism = engine.mechanism(&key).unwrap();
            let codes: Vec<u32> = task.codes(&record).collect();
            let report = mechanism.randomize(&codes, &mut rng).unwrap();
            let stats = tables
                .entry(key)
                .or_insert_with(|| SufficientStatistics::new(&mechanism));
            mechanism.accumulate(&report, stats).unwrap();
        }
        let factors: Vec<&[usize]> = tables.keys().map(|k| k.factor.as_slice()).collect();
        assert_eq!(factors, [&[0, 1][..], &[0, 2], &[1, 2]]);
        let model = engine.finalize(&state, &tables).unwrap();
        let tvd = |attrs: &[usize], truth: &dyn Fn(usize, usize) -> f64| {
            let m = model.marginal(attrs).unwrap();
            let k = engine.dims()[attrs[1]];
            0.5 * m
                .frequencies
                .iter()
                .enumerate()
                .map(|(c, f)| (f - truth(c / k, c % k)).abs())
                .sum::<f64>()
        };
        let agree = tvd(&[0, 1], &|i, j| {
            (0.9 * f64::from(u8::from(i == j)) + 0.1 / 3.0) / 3.0
        });
        assert!(agree < 0.05, "pair (0, 1): TVD {agree}");
        let apart = tvd(&[0, 2], &|_, _| 1.0 / 6.0);
        assert!(apart < 0.05, "pair (0, 2): TVD {apart}");
    }

    /// Domains a first report would allocate are bounded at creation: an attribute above
    /// MAX_ATTRIBUTE_DOMAIN always, a full-resolution pair above MAX_PAIR_CELLS for the
    /// protocols that measure pairs as they are (not `auto`, which bins them).
    #[test]
    fn domains_are_bounded_at_creation() {
        use ldpsyn::wire::{PrivIncrParams, SamPrivSynParams};
        let eps = Epsilon::new(1.0).unwrap();
        let make = |dims: Vec<usize>, p: Protocol| {
            Engine::from_parts(dims, eps, 100, p, EngineOptions::default())
        };
        let auto = || Protocol::Auto(PrivIncrParams::default());
        assert!(make(vec![2, 1 << 16], auto()).is_err());
        assert!(make(vec![2000, 2000], auto()).is_ok());
        assert!(make(vec![2000, 2000], Protocol::Independence {}).is_ok());
        for p in [
            Protocol::Privincr(PrivIncrParams::default()),
            Protocol::Samprivsyn(SamPrivSynParams::default()),
        ] {
            let e = make(vec![3, 2000, 2000], p.clone()).unwrap_err();
            assert!(e.to_string().contains("attributes 1 and 2"), "{e}");
            assert!(make(vec![3, 1000, 1000], p).is_ok());
        }
    }

    /// The number of attributes is bounded at creation: MAX_ATTRIBUTES passes, one more is
    /// refused (per-pair structures grow with its square).
    #[test]
    fn attributes_are_bounded_at_creation() {
        let eps = Epsilon::new(1.0).unwrap();
        let make = |n: usize| {
            Engine::from_parts(
                vec![2; n],
                eps,
                100,
                Protocol::Independence {},
                EngineOptions::default(),
            )
        };
        assert!(make(MAX_ATTRIBUTES).is_ok());
        let e = make(MAX_ATTRIBUTES + 1).unwrap_err();
        assert!(e.to_string().contains("at most 512"), "{e}");
    }

    /// States stored before the tagged form carried every protocol's fields (and, before
    /// that, an `auto` significance `z` per edge): they read back as the tagged state, and
    /// the tagged state round-trips.
    #[test]
    fn stored_flat_states_read_back() {
        let edge = r#"{"a":0,"b":1,"active":true,"pruned_in":null,"mi":0.5,"tau":0.045,
            "ell":-0.2,"reports":1200,"score":null,"z":null}"#;
        let old = |protocol: &str, phase: &str, weights: &str| {
            format!(
                r#"{{"protocol":"{protocol}","phase":"{phase}","round":1,"round_quota":500,
                "edges":[{edge}],"plan":null,"pair_weights":{weights}}}"#
            )
        };
        for (text, expected) in [
            (
                old("privincr", "graph_construction", "[]"),
                ProtocolState::Privincr(PairRounds {
                    edges: vec![EdgeState {
                        a: 0,
                        b: 1,
                        active: true,
                        pruned_in: None,
                        mi: Some(0.5),
                        tau: 0.045,
                        ell: Some(-0.2),
                        reports: 1200,
                        score: None,
                        bins: vec![],
                    }],
                    plan: None,
                    first_round: 0,
                }),
            ),
            (
                old("samprivsyn", "pair_sampling", "[0.25,0.75]"),
                ProtocolState::Samprivsyn(PairSampling {
                    pair_weights: vec![0.25, 0.75],
                }),
            ),
            (
                old("independence", "one_way", "[]"),
                ProtocolState::Independence {},
            ),
        ] {
            let state: CollectionState = serde_json::from_str(&text).unwrap();
            assert_eq!(state.protocol, expected, "{text}");
            assert_eq!((state.round, state.round_quota), (1, Some(500)));
            let again: CollectionState =
                serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
            assert_eq!(again, state);
        }
        let auto: CollectionState =
            serde_json::from_str(&old("auto", "clique_measurement", "[]")).unwrap();
        assert_eq!(auto.edges().len(), 1);
        assert_eq!(auto.phase, Phase::CliqueMeasurement);
        assert!(auto.pair_weights().is_empty());
        let unknown = old("lopub", "one_way", "[]");
        assert!(serde_json::from_str::<CollectionState>(&unknown).is_err());
        // States before adaptive bins have none, and a state without any writes none.
        assert!(auto.working_bins.is_empty());
        assert!(
            !serde_json::to_string(&auto)
                .unwrap()
                .contains("working_bins")
        );
        let mut adapted = auto;
        adapted.working_bins.insert(
            3,
            AdaptedBins {
                cuts: vec![8, 9, 10, 15],
                sub_bins: vec![],
                points: None,
            },
        );
        let text = serde_json::to_string(&adapted).unwrap();
        assert!(text.contains(r#""working_bins":{"3":{"cuts":[8,9,10,15],"sub_bins":[]}}"#));
        assert_eq!(
            serde_json::from_str::<CollectionState>(&text).unwrap(),
            adapted
        );
    }
}
