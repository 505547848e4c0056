//! The in-process simulator: every simulated person gets a task from
//! [`Engine::sampler`] (as [`Engine::draw_task`]), randomizes with the real `ldpsyn` mechanism, and the report flows
//! into the tables; rounds close through [`Engine::should_close`] / [`Engine::close_round`];
//! then [`Engine::finalize`].
//!
//! Two report paths: *per person* (default; `Mechanism::randomize` + `Mechanism::accumulate`
//! for every report, exactly what the SDK and the service do), and *bucketed* for benchmarks:
//! OUE reports of one table are drawn per cell at round close — the count of bit v is
//! `Binomial(c_v, 1/2) + Binomial(n − c_v, q)` given the true counts `c_v`, which is exactly
//! the distribution of the sum of the per-person bitsets (bits are independent given the
//! value). GRR and pair reports always go through the real per-person randomizer.

use std::collections::{BTreeMap, HashMap};

use ldpsyn::mechanism::{Mechanism, MechanismKind, Oracle, SufficientStatistics};
use ldpsyn::wire::Payload;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rand_distr::{Binomial, Distribution};

use super::{Population, SimError};
use ldpsyn_engine::{
    CollectionState, Engine, Model, TableKey, Tables, TaskSpec, Transition,
    measure::tables::merge_into, protocols::vertical::NOT_SAMPLED,
};

/// A report as the service would receive it (for replay tests).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedReport {
    /// The task it answers.
    pub task: TaskSpec,
    /// The randomized payload.
    pub payload: Payload,
}

/// The outcome of a simulated collection.
#[derive(Debug, Clone)]
pub struct SimRun {
    /// The finalized model.
    pub model: Model,
    /// The final state.
    pub state: CollectionState,
    /// All tables.
    pub tables: Tables,
    /// Every transition, in order.
    pub transitions: Vec<Transition>,
    /// The states right after each transition (same order).
    pub states: Vec<CollectionState>,
    /// Every report, in arrival order (only with [`Simulation::record_reports`]).
    pub reports: Vec<RecordedReport>,
}

/// Builder of a simulated collection over a population (users arrive in population order).
#[derive(Debug)]
pub struct Simulation<'a> {
    engine: &'a Engine,
    population: &'a Population,
    seed: u64,
    bucketed: bool,
    record: bool,
}

struct Pending {
    mech: Mechanism,
    truth: Vec<u64>,
    n: u64,
}

impl<'a> Simulation<'a> {
    /// A simulation of `engine`'s collection with one user per population record.
    pub fn new(engine: &'a Engine, population: &'a Population) -> Self {
        Self {
            engine,
            population,
            seed: 0,
            bucketed: false,
            record: false,
        }
    }

    /// Seed of task draws and randomization.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Use the bucketed OUE path (statistically identical; for benchmarks).
    pub fn bucketed(mut self, on: bool) -> Self {
        self.bucketed = on;
        self
    }

    /// Keep every report (per-person path only).
    pub fn record_reports(mut self, on: bool) -> Self {
        self.record = on;
        self
    }

    /// Runs collection and finalization. Errors: the population does not fit the engine's
    /// schema, or the engine fails.
    pub fn run(self) -> Result<SimRun, SimError> {
        let engine = self.engine;
        if self.population.dims() != engine.schema_dims() {
            return Err(SimError::Population(
                "population and engine schemas differ".into(),
            ));
        }
        let mut task_rng = ChaCha12Rng::seed_from_u64(self.seed);
        let mut noise_rng = ChaCha12Rng::seed_from_u64(self.seed ^ 0x9e37_79b9_7f4a_7c15);
        if engine.vertical().is_some() {
            return self.run_vertical(&mut noise_rng);
        }
        let mut state = engine.initial_state();
        let mut tables = Tables::new();
        let mut mechs: HashMap<TableKey, Mechanism> = HashMap::new();
        let mut pending: BTreeMap<TableKey, Pending> = BTreeMap::new();
        let mut transitions = Vec::new();
        let mut states = Vec::new();
        let mut reports = Vec::new();
        let mut accepted_in_round = 0u64;
        let bucketed = self.bucketed && !self.record;
        let mut codes = Vec::new();
        // Rebuilt when the state changes: the same draws as Engine::draw_task.
        let mut sampler = engine.sampler(&state)?;
        for row in self.population.rows() {
            let task = sampler.draw(&mut task_rng);
            let key = engine.table_key(&task);
            if !mechs.contains_key(&key) {
                mechs.insert(key.clone(), engine.mechanism(&key)?);
            }
            let mech = &mechs[&key];
            codes.clear();
            codes.extend(task.codes(row));
            if bucketed && mech.kind() == MechanismKind::Oue {
                let p = pending.entry(key).or_insert_with(|| Pending {
                    mech: mech.clone(),
                    truth: vec![0; mech.cells()],
                    n: 0,
                });
                let mut idx = 0usize;
                for (&c, &k) in codes.iter().zip(mech.dims()) {
                    idx = idx * k + c as usize;
                }
                p.truth[idx] += 1;
                p.n += 1;
            } else {
                let payload = mech.randomize(&codes, &mut noise_rng)?;
                let stats = tables
                    .entry(key)
                    .or_insert_with(|| SufficientStatistics::new(mech));
                mech.accumulate(&payload, stats)?;
                if self.record {
                    reports.push(RecordedReport {
                        task: task.clone(),
                        payload,
                    });
                }
            }
            if task.round == state.round {
                accepted_in_round += 1;
            }
            if engine.should_close(&state, accepted_in_round) {
                flush(&mut pending, &mut tables, &mut noise_rng)?;
                transitions.push(engine.close_round(&mut state, &tables)?);
                states.push(state.clone());
                accepted_in_round = 0;
                sampler = engine.sampler(&state)?;
            }
        }
        flush(&mut pending, &mut tables, &mut noise_rng)?;
        let model = engine.finalize(&state, &tables)?;
        engine.mark_finalized(&mut state);
        Ok(SimRun {
            model,
            state,
            tables,
            transitions,
            states,
            reports,
        })
    }
}

/// Largest marginal a simulated party's local model measures (`fo+locmrf`): triples, as
/// `party upload` by default.
pub const LOCAL_MODEL_MAX_MARGINAL: usize = 3;

impl Simulation<'_> {
    /// A vertical collection: every party randomizes its attributes of every person (one
    /// GRR each at its ε; under `sampled+locmrf` one attribute drawn uniformly per person)
    /// and uploads them in party order; the tables are what the service
    /// counts ([`ldpsyn_engine::protocols::vertical::Vertical::record_cells`]). Under
    /// `fo+locmrf` each party with a budget also measures its local model of every person's
    /// row of its attributes. Under `sketch+locmrf` no party reports per person: each
    /// measures its local model and makes its sketch report ([`Simulation::sketch_reports`]),
    /// and the engine finalizes from those ([`Engine::finalize_vertical`]).
    fn run_vertical(self, rng: &mut ChaCha12Rng) -> Result<SimRun, SimError> {
        let engine = self.engine;
        let v = engine
            .vertical()
            .ok_or_else(|| SimError::Population("not a vertical collection".into()))?;
        let dims = engine.schema_dims();
        let grrs: Vec<ldpsyn::mechanism::Grr> = (0..dims.len())
            .map(|a| ldpsyn::mechanism::Grr::new(v.epsilon_of(a), dims[a]))
            .collect::<Result<_, _>>()?;
        let mut tables = Tables::new();
        let mut mechs: HashMap<TableKey, Mechanism> = HashMap::new();
        let mut uploaded: Vec<(usize, Vec<u32>)> = Vec::new();
        // `sketch+locmrf`: no per-record report (the parties' sketch reports below).
        let rows = (!v.encoding().is_sketch())
            .then(|| self.population.rows())
            .into_iter()
            .flatten();
        for row in rows {
            uploaded.clear();
            for (p, party) in v.parties().iter().enumerate() {
                let codes = if v.encoding().is_sampled() {
                    // One attribute drawn uniformly, independently of the row.
                    let j = rng.random_range(0..party.attributes.len());
                    let a = party.attributes[j];
                    let mut codes = vec![NOT_SAMPLED; party.attributes.len()];
                    codes[j] = grrs[a].randomize(row[a] as usize, rng)? as u32;
                    codes
                } else {
                    party
                        .attributes
                        .iter()
                        .map(|&a| Ok(grrs[a].randomize(row[a] as usize, rng)? as u32))
                        .collect::<Result<Vec<u32>, SimError>>()?
                };
                for (key, cell) in v.record_cells(p, &codes, &uploaded) {
                    if !mechs.contains_key(&key) {
                        mechs.insert(key.clone(), engine.mechanism(&key)?);
                    }
                    let stats = tables
                        .entry(key.clone())
                        .or_insert_with(|| SufficientStatistics::new(&mechs[&key]));
                    stats.counts[cell] += 1;
                    stats.n += 1;
                }
                uploaded.push((p, codes));
            }
        }
        // `fo+locmrf`: each party with a budget measures its local model of its own columns
        // (as `party upload` does on the party's machine).
        let mut local = Vec::new();
        for party in v.parties() {
            if party.locmrf.is_none() {
                continue;
            }
            let codes: Vec<u32> = self
                .population
                .rows()
                .flat_map(|row| party.attributes.iter().map(move |&a| row[a]))
                .collect();
            local.push(
                ldpsyn_engine::central::measure_local_model(
                    party,
                    dims,
                    &codes,
                    LOCAL_MODEL_MAX_MARGINAL,
                    rng,
                )
                .map_err(|e| SimError::Population(e.to_string()))?,
            );
        }
        let mut state = engine.initial_state();
        let sketches = if v.encoding().is_sketch() {
            self.sketch_reports(v, rng)?
        } else {
            Vec::new()
        };
        let uploads = ldpsyn_engine::PartyUploads {
            models: local,
            sketches,
        };
        let model = engine.finalize_vertical(&state, &tables, &uploads)?;
        engine.mark_finalized(&mut state);
        Ok(SimRun {
            model,
            state,
            tables,
            transitions: Vec::new(),
            states: Vec::new(),
            reports: Vec::new(),
        })
    }
}

impl Simulation<'_> {
    /// `sketch+locmrf`: each party's sketch report (VertiMRF Algorithm 3 with n̂, as a party's
    /// machine makes it) over its people's (record id, sketch-binned codes), record ids the
    /// row indices, under one sketch key the parties share; the key, the phantoms and n̂'s
    /// noise come from a ChaCha12 seeded from the simulation's rng (seeds only here: a
    /// party's machine uses the OS CSPRNG).
    fn sketch_reports(
        &self,
        v: &ldpsyn_engine::protocols::vertical::Vertical,
        rng: &mut ChaCha12Rng,
    ) -> Result<Vec<ldpsyn_engine::protocols::cross_party::SketchUpload>, SimError> {
        use ldpsyn_engine::measure::sketch::{SketchKey, encode_party};
        let mut party_rng = ChaCha12Rng::seed_from_u64(rng.random());
        let key = SketchKey::generate(&mut party_rng);
        let ids: Vec<String> = (0..self.population.len()).map(|i| i.to_string()).collect();
        let mut out = Vec::with_capacity(v.parties().len());
        for (p, party) in v.parties().iter().enumerate() {
            let params = v.sketch_params(p).map_err(SimError::Population)?;
            let cuts: Vec<Vec<u32>> = party.attributes.iter().map(|&a| v.sketch_cuts(a)).collect();
            let sizes: Vec<u32> = party
                .attributes
                .iter()
                .map(|&a| v.sketch_bin_count(a) as u32)
                .collect();
            let records = self.population.rows().zip(&ids).map(|(row, id)| {
                let codes: Vec<u32> = party
                    .attributes
                    .iter()
                    .zip(&cuts)
                    .map(|(&a, c)| ldpsyn::factor::bin_of(row[a], c))
                    .collect();
                (id.as_bytes(), codes)
            });
            let report = encode_party(&params, &key, &sizes, records, &mut party_rng)
                .map_err(|e| SimError::Population(e.to_string()))?;
            out.push(ldpsyn_engine::protocols::cross_party::SketchUpload {
                party: party.name.clone(),
                report,
            });
        }
        Ok(out)
    }
}

/// Draws the OUE bit counts of pending tables and merges them.
fn flush(
    pending: &mut BTreeMap<TableKey, Pending>,
    tables: &mut Tables,
    rng: &mut ChaCha12Rng,
) -> Result<(), SimError> {
    for (key, p) in std::mem::take(pending) {
        let Oracle::Oue(o) = p.mech.oracle() else {
            continue;
        };
        let mut stats = SufficientStatistics::new(&p.mech);
        stats.n = p.n;
        for (v, &c) in p.truth.iter().enumerate() {
            // Bit v: the c_v holders report it w.p. 1/2, the others w.p. q.
            let ones = Binomial::new(c, o.p()).map(|b| b.sample(rng)).unwrap_or(0)
                + Binomial::new(p.n - c, o.q())
                    .map(|b| b.sample(rng))
                    .unwrap_or(0);
            stats.counts[v] = ones;
        }
        merge_into(tables, key, &stats)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use ldpsyn::Epsilon;
    use ldpsyn::wire::{PrivIncrParams, Protocol};
    use rand::Rng;

    use super::*;
    use crate::BayesNet;
    use crate::eval::MarginalCounts;
    use ldpsyn_engine::EngineOptions;

    fn engine(protocol: Protocol, eps: f64, n: u64) -> Engine {
        Engine::from_parts(
            BayesNet::standard().dims(),
            Epsilon::new(eps).unwrap(),
            n,
            protocol,
            EngineOptions::default(),
        )
        .unwrap()
    }

    /// A schema of an integer `bins: "auto"` attribute `h` over `[min, max]` with at most
    /// `max_bins` working bins, and a binary attribute `c`.
    fn numeric_and_binary_schema(min: u32, max: u32, max_bins: u32) -> ldpsyn::schema::Schema {
        serde_json::from_value(serde_json::json!({
            "attributes": [
                {"name": "h", "type": "numeric", "min": min, "max": max, "bins": "auto",
                 "integer": true, "max_bins": max_bins},
                {"name": "c", "type": "categorical", "labels": ["a", "b"]}]}))
        .unwrap()
    }

    /// `n` rows `[h, c]` (seeded): `h` is `spike` with probability `share`, else uniform over
    /// `others`; `c` is `h < split`.
    fn spiked_rows(
        n: usize,
        seed: u64,
        (spike, share): (u32, f64),
        others: std::ops::Range<u32>,
        split: u32,
    ) -> Vec<Vec<u32>> {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let h = if rng.random_bool(share) {
                    spike
                } else {
                    rng.random_range(others.clone())
                };
                vec![h, u32::from(h < split)]
            })
            .collect()
    }

    /// A collection of `schema` at `eps` for `n` people.
    fn collection(
        schema: &ldpsyn::schema::Schema,
        eps: f64,
        n: usize,
        protocol: Protocol,
    ) -> ldpsyn::wire::CollectionConfig {
        ldpsyn::wire::CollectionConfig {
            auto_finalize_at_target: false,
            past_target: ldpsyn::wire::PastTarget::Accept,
            retain_reports_days: None,
            target: Vec::new(),
            name: None,
            description: None,
            version: ldpsyn::wire::PROTOCOL_VERSION,
            id: uuid::Uuid::nil(),
            schema: schema.clone(),
            epsilon: Epsilon::new(eps).unwrap(),
            target_users: n as u64,
            protocol,
        }
    }

    /// `bins: "auto"` end to end, every protocol: devices encode to the grid, tasks carry
    /// working (and sub-bin) bin maps, the model works in 4 working bins, and synthesis
    /// recovers a spike inside a bin (40% of people at 10, not declared as a point) from the
    /// sub-bin 1-ways, which uniform expansion smears over the bin. `auto`, PrivIncr and
    /// NoIncremental find the spike in their round 0 and make it a working bin of its own,
    /// measured by every later factor, so that even uniform expansion draws it; SamPrivSyn
    /// and independence keep the schema's bins. Rows and marginals are in grid codes.
    #[test]
    fn auto_bins_recover_a_spike_within_a_bin_in_every_protocol() {
        use ldpsyn_engine::Expansion;
        let schema = numeric_and_binary_schema(1, 30, 4);
        let n = 60_000usize;
        let rows = spiked_rows(n, 3, (9, 0.4), 0..30, 15);
        let pop = Population::from_rows(schema.domain_sizes(), rows).unwrap();
        for protocol in [
            Protocol::Independence {},
            Protocol::Auto(PrivIncrParams::default()),
            Protocol::Privincr(PrivIncrParams::default()),
            Protocol::Noincremental(PrivIncrParams::default()),
            Protocol::Samprivsyn(Default::default()),
        ] {
            let config = collection(&schema, 4.0, n, protocol);
            let e = Engine::new(&config).unwrap();
            assert_eq!(
                (e.dims(), e.schema_dims()),
                (&[4usize, 2][..], &[30usize, 2][..])
            );
            let run = Simulation::new(&e, &pop).seed(8).run().unwrap();
            let share = |how: Expansion| {
                let rows: Vec<Vec<u32>> = run.model.synthesize_with(n as u64, 1, how).collect();
                assert!(rows.iter().all(|r| r[0] < 30 && r[1] < 2));
                rows.iter().filter(|r| r[0] == 9).count() as f64 / n as f64
            };
            let real = 0.4 + 0.6 / 30.0;
            let recovered = share(Expansion::Recover);
            assert!(
                (recovered - real).abs() < 0.04,
                "{}: recovered {recovered}",
                config.protocol.name()
            );
            let uniform = share(Expansion::Uniform);
            let name = config.protocol.name();
            if matches!(
                config.protocol,
                Protocol::Auto(_) | Protocol::Privincr(_) | Protocol::Noincremental(_)
            ) {
                // Bins [0,8) [8,15) [15,22) [22,30) → code 9 alone.
                let bins = &run.state.working_bins[&0];
                assert_eq!(bins.cuts, vec![8, 9, 10, 15, 22], "{name}");
                assert_eq!(
                    run.model.describe().working_bins,
                    vec![vec![8, 9, 10, 15, 22], vec![]]
                );
                // Round 0 measured `h` alone; every later pair table has the spike's bin.
                assert!(run.tables.keys().any(|k| k.round == 0 && k.factor == [0]));
                let pairs: Vec<&TableKey> =
                    run.tables.keys().filter(|k| k.factor == [0, 1]).collect();
                assert!(!pairs.is_empty(), "{name}");
                assert!(
                    pairs
                        .iter()
                        .all(|k| k.round > 0 && k.bins.first().is_some_and(|c| c.contains(&9))),
                    "{name}: {pairs:?}"
                );
                if !matches!(config.protocol, Protocol::Auto(_)) {
                    assert_eq!(run.state.pair_rounds().unwrap().first_round, 1);
                }
                assert!((uniform - real).abs() < 0.04, "{name}: uniform {uniform}");
            } else {
                assert!(run.state.working_bins.is_empty(), "{name}");
                assert_eq!(run.model.describe().working_bins[0], vec![8, 15, 22]);
                assert!(uniform < 0.15, "{name}: uniform {uniform}");
            }
            let m = run.model.marginal(&[0]).unwrap();
            assert_eq!(m.dims, vec![30]);
            assert!(
                (m.frequencies[9] - real).abs() < 0.04,
                "{:?}",
                m.frequencies
            );
            assert!((m.frequencies.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        }
    }

    /// A spike at the grid's edge that round 0 cannot resolve at ε = 1 (45% of the people at
    /// 0, like temporal-match2's DEPARTS: no working bin of its own) is found in the pooled
    /// sub-bin 1-ways of every round and keeps its share of its bin in synthesis
    /// (`within_bin_shape_with_points`). Over the seeds of 20 where round 0 left it in a bin
    /// its share is off by about 0.09 on average
    /// (0.086 over all 20 seeds, 0.070 before the screening round's 1-way slice; the shrinkage alone, before the points
    /// and the consistency step, was off by 0.09 on 5 seeds: 0.374, 0.362, 0.421, 0.239 and
    /// 0.434 against 0.454); the worst of the 20 seeds keeps 0.21. Weaker than it looked on 5
    /// seeds (mean error below 0.04 there).
    #[test]
    fn auto_recovers_a_spike_round_0_left_in_a_bin() {
        use ldpsyn_engine::Expansion;
        let schema = numeric_and_binary_schema(0, 96, 16);
        let n = 6_000usize;
        let rows = spiked_rows(n, 7, (0, 0.45), 1..97, 40);
        let real = rows.iter().filter(|r| r[0] == 0).count() as f64 / n as f64;
        let pop = Population::from_rows(schema.domain_sizes(), rows).unwrap();
        let config = collection(&schema, 1.0, n, Protocol::Auto(PrivIncrParams::default()));
        let e = Engine::new(&config).unwrap();
        let (mut total, mut seeds) = (0.0, 0);
        for seed in 0..20 {
            let run = Simulation::new(&e, &pop).seed(seed).run().unwrap();
            // The case: round 0 left 0 in a bin of 6 codes (on a few seeds it resolves it).
            let first = run.model.describe().working_bins[0].first().copied();
            if first != Some(6) {
                continue;
            }
            seeds += 1;
            let rows: Vec<Vec<u32>> = run
                .model
                .synthesize_with(n as u64, 1, Expansion::Recover)
                .collect();
            let share = rows.iter().filter(|r| r[0] == 0).count() as f64 / n as f64;
            assert!(share > real / 3.0, "seed {seed}: {share} vs {real}");
            total += (share - real).abs();
        }
        assert!(
            seeds >= 15,
            "round 0 left the spike in a bin on {seeds} of 20 seeds"
        );
        assert!(
            total / seeds as f64 <= 0.09,
            "mean error {}",
            total / seeds as f64
        );
    }

    /// A sparse tail (3% of people over the upper 32 of 128 values, 4 of 16 working bins) is
    /// merged after `auto`'s round 0 at ε = 1, where each of its bins is far below the noise
    /// of a bin estimate, and kept at ε = 8, where it is resolved
    /// (`Space::merged_unresolved_cuts`; what it does to utility is measured in
    /// `benchmarks/sweeps/unresolved-bins.md`).
    #[test]
    fn auto_merges_a_sparse_tail_only_where_noise_hides_it() {
        let schema = numeric_and_binary_schema(0, 127, 16);
        let n = 60_000usize;
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        let rows: Vec<Vec<u32>> = (0..n)
            .map(|_| {
                let h = if rng.random_bool(0.03) {
                    rng.random_range(96..128u32)
                } else {
                    rng.random_range(0..96u32)
                };
                vec![h, u32::from(h < 48)]
            })
            .collect();
        let tail = rows.iter().filter(|r| r[0] >= 96).count() as f64 / n as f64;
        let pop = Population::from_rows(schema.domain_sizes(), rows).unwrap();
        let config =
            |eps: f64| collection(&schema, eps, n, Protocol::Auto(PrivIncrParams::default()));
        // (working bins of `h` in the tail, error of the tail's mass) of one run.
        let run = |eps: f64, z: Option<f64>, seed: u64| {
            let options = EngineOptions {
                unresolved_bin_z: z,
                ..EngineOptions::default()
            };
            let e = Engine::with_options(&config(eps), options).unwrap();
            assert_eq!(e.dims(), &[16, 2]);
            let run = Simulation::new(&e, &pop).seed(seed).run().unwrap();
            let m = run.model.marginal(&[0]).unwrap();
            let estimate: f64 = m.frequencies[96..].iter().sum();
            let cuts = &run.model.describe().working_bins[0];
            (
                1 + cuts.iter().filter(|&&c| c > 96).count(),
                (estimate - tail).abs(),
            )
        };
        assert_eq!(run(8.0, None, 2).0, 4);
        for seed in 0..6 {
            let (bins, error) = run(1.0, None, seed);
            // Round 0's noise can close a run early, but never leaves the tail as it was.
            assert!(bins < 4, "seed {seed}: the tail in {bins} bins");
            // Tables measured before the merge still read: the tail keeps its mass.
            assert!(error < 0.06, "seed {seed}: tail off by {error}");
        }
        // Without merging (z = 0) the bins stay.
        assert_eq!(run(1.0, Some(0.0), 2).0, 4);
    }

    /// SamPrivSyn's own synthesis (`samprivsyn_lasso`) builds its table chunk by chunk: a
    /// download longer than a chunk is deterministic, and every chunk keeps the estimated
    /// 1-ways (the whole download's and the first chunk's agree to 1%).
    #[test]
    fn samprivsyn_synthesis_streams_in_chunks() {
        use ldpsyn::wire::SamPrivSynParams;
        use ldpsyn_engine::SAMPRIVSYN_CHUNK_ROWS;
        let net = BayesNet::standard();
        let pop = net.sample(20_000, 4);
        let e = Engine::from_parts(
            net.dims(),
            Epsilon::new(4.0).unwrap(),
            20_000,
            Protocol::Samprivsyn(SamPrivSynParams::default()),
            EngineOptions {
                samprivsyn_lasso: Some(1e-4),
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let run = Simulation::new(&e, &pop).seed(2).run().unwrap();
        let rows = SAMPRIVSYN_CHUNK_ROWS + 20_000;
        let a: Vec<Vec<u32>> = run.model.synthesize(rows, 9).collect();
        assert_eq!(a.len() as u64, rows);
        let share = |rows: &[Vec<u32>], v: u32| {
            rows.iter().filter(|r| r[0] == v).count() as f64 / rows.len() as f64
        };
        let first = &a[..SAMPRIVSYN_CHUNK_ROWS as usize];
        for v in 0..net.dims()[0] as u32 {
            assert!((share(&a, v) - share(first, v)).abs() < 0.01, "code {v}");
        }
        let again: Vec<Vec<u32>> = run
            .model
            .synthesize(rows, 9)
            .skip(rows as usize - 5)
            .collect();
        assert_eq!(again, a[rows as usize - 5..]);
    }

    /// 200 attributes of 4 values (a product of domains far beyond u64): every protocol
    /// collects, closes its rounds and finalizes without overflow, and synthesizes rows in
    /// the domain. ~45 s in release (PrivIncr's 19,900 pairs: model-graph triangulations and
    /// the fit), ~9 min in debug: `.ci/run` runs it in release.
    #[test]
    #[ignore = "slow in debug; .ci/run runs it with --release --ignored"]
    fn two_hundred_attributes_every_protocol() {
        use ldpsyn::wire::SamPrivSynParams;
        let dims = vec![4usize; 200];
        let mut rng = ChaCha12Rng::seed_from_u64(6);
        let rows: Vec<Vec<u32>> = (0..3000)
            .map(|_| (0..200).map(|_| rng.random_range(0..4u32)).collect())
            .collect();
        let pop = Population::from_rows(dims.clone(), rows).unwrap();
        let small = PrivIncrParams {
            rounds: 2,
            ..PrivIncrParams::default()
        };
        for protocol in [
            Protocol::Privincr(small.clone()),
            Protocol::Noincremental(PrivIncrParams {
                rounds: 1,
                ..PrivIncrParams::default()
            }),
            Protocol::Auto(PrivIncrParams::default()),
            Protocol::Samprivsyn(SamPrivSynParams::default()),
            Protocol::Independence {},
        ] {
            let name = protocol.name();
            let e = Engine::from_parts(
                dims.clone(),
                Epsilon::new(2.0).unwrap(),
                3000,
                protocol,
                EngineOptions::default(),
            )
            .unwrap();
            let started = std::time::Instant::now();
            let run = Simulation::new(&e, &pop)
                .seed(1)
                .run()
                .unwrap_or_else(|err| panic!("{name}: {err}"));
            eprintln!("{name}: {:.1} s", started.elapsed().as_secs_f64());
            let synth: Vec<Vec<u32>> = run.model.synthesize(10, 1).collect();
            assert!(
                synth
                    .iter()
                    .all(|r| r.len() == 200 && r.iter().all(|&c| c < 4)),
                "{name}"
            );
            run.model
                .frequencies(&[0, 199])
                .unwrap_or_else(|err| panic!("{name}: {err}"));
        }
    }

    /// The same multiset of reports, reduced in any order, gives the same tables, the same
    /// transitions and the same model (edges, junction tree, estimates within 1e-12).
    #[test]
    fn reduction_is_order_independent() {
        let n = 30_000;
        let pop = BayesNet::standard().sample(n, 21);
        let params = PrivIncrParams {
            rounds: 3,
            ..PrivIncrParams::default()
        };
        let e = engine(Protocol::Privincr(params), 2.0, n as u64);
        let run = Simulation::new(&e, &pop)
            .seed(5)
            .record_reports(true)
            .run()
            .unwrap();
        assert_eq!(run.reports.len(), n);
        // Shuffle the reports and reduce them through a HashMap (arbitrary order).
        let mut reports = run.reports.clone();
        let mut rng = ChaCha12Rng::seed_from_u64(99);
        for i in (1..reports.len()).rev() {
            reports.swap(i, rng.random_range(0..=i));
        }
        let mut hashed: HashMap<TableKey, SufficientStatistics> = HashMap::new();
        for r in &reports {
            let key = e.table_key(&r.task);
            let mech = e.mechanism(&key).unwrap();
            let stats = hashed
                .entry(key)
                .or_insert_with(|| SufficientStatistics::new(&mech));
            mech.accumulate(&r.payload, stats).unwrap();
        }
        let tables: Tables = hashed.into_iter().collect();
        assert_eq!(tables, run.tables);
        // Replay every transition from the reordered tables.
        let mut state = e.initial_state();
        for (t, recorded) in run.transitions.iter().zip(&run.states) {
            let round = state.round;
            let upto: Tables = tables
                .iter()
                .filter(|(k, _)| k.round <= round)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(&e.close_round(&mut state, &upto).unwrap(), t);
            assert_eq!(&state, recorded);
        }
        let model = e.finalize(&state, &tables).unwrap();
        assert_eq!(model.describe(), run.model.describe());
        let (a, b) = (
            model.conditionals().unwrap(),
            run.model.conditionals().unwrap(),
        );
        for (x, y) in a.iter().zip(b) {
            for (u, v) in x.joint.iter().zip(&y.joint) {
                assert!((u - v).abs() < 1e-12);
            }
        }
        let rows_a: Vec<Vec<u32>> = model.synthesize(100, 3).collect();
        let rows_b: Vec<Vec<u32>> = run.model.synthesize(100, 3).collect();
        assert_eq!(rows_a, rows_b);
    }

    /// Mean TVD of the 1-way (k = 1) or 2-way marginals of `model`'s synthetic rows from
    /// `pop`'s.
    fn tvd_k(pop: &Population, model: &Model, seed: u64, k: usize) -> f64 {
        let syn = Population::from_rows(
            pop.dims().to_vec(),
            model.synthesize(pop.len() as u64, seed),
        )
        .unwrap();
        MarginalCounts::of_population(pop, k)
            .mean_tvd(&MarginalCounts::of_population(&syn, k))
            .unwrap()
    }

    /// People arriving in two groups (the first 40% answer almost always no, independently;
    /// the rest follow one latent yes/no with 85% agreement), as a file sorted by group: the
    /// rounds of `auto` see different populations. The model says so, post-stratifies by
    /// round, its fit agrees with its measurements within noise, and its 1-ways and pairs are
    /// as good as with the same people shuffled (where it stays quiet). Without the
    /// post-stratification NLTCS's file-order 1-ways were 4–5 times further off (tvd1 0.026 /
    /// 0.045 against 0.007 / 0.010 at ε = 4 / 8; `benchmarks/sweeps/arrival-post-stratification.md`).
    #[test]
    fn auto_post_stratifies_a_population_that_changes_between_rounds() {
        let (n, d) = (20_000usize, 8usize);
        let mut rng = ChaCha12Rng::seed_from_u64(17);
        let rows: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                if i < 2 * n / 5 {
                    (0..d).map(|_| u32::from(rng.random_bool(0.05))).collect()
                } else {
                    let z = rng.random_bool(0.5);
                    (0..d)
                        .map(|_| u32::from(z ^ rng.random_bool(0.15)))
                        .collect()
                }
            })
            .collect();
        let file = Population::from_rows(vec![2; d], rows).unwrap();
        let shuffled = file.shuffled(3);
        let engine = Engine::from_parts(
            vec![2; d],
            Epsilon::new(4.0).unwrap(),
            n as u64,
            Protocol::Auto(PrivIncrParams::default()),
            EngineOptions::default(),
        )
        .unwrap();
        let mut tvd = BTreeMap::new();
        for (order, pop) in [("file", &file), ("shuffled", &shuffled)] {
            let (mut t1, mut t2) = (0.0, 0.0);
            for seed in 0..2 {
                let model = Simulation::new(&engine, pop)
                    .seed(seed)
                    .bucketed(true)
                    .run()
                    .unwrap()
                    .model;
                let drift = model.drift().expect("auto has several rounds");
                assert_eq!(
                    drift.population_changed,
                    order == "file",
                    "{order}: {drift:?}"
                );
                assert_eq!(drift.warning(|a| a.to_string()).is_some(), order == "file");
                let residuals = model.residuals().expect("a graphical model");
                // The fit agrees with its (post-stratified) measurements within noise.
                assert!(residuals.tables_checked > 0, "{residuals:?}");
                assert!(
                    residuals.beyond_noise == 0 && residuals.mean_ratio < 2.0,
                    "{order}: {residuals:?}"
                );
                t1 += tvd_k(&file, &model, seed, 1) / 2.0;
                t2 += tvd_k(&file, &model, seed, 2) / 2.0;
            }
            tvd.insert(order, (t1, t2));
        }
        let (file_t, shuffled_t) = (tvd["file"], tvd["shuffled"]);
        assert!(file_t.0 < 0.02, "file-order 1-ways: {tvd:?}");
        assert!(file_t.1 < 1.5 * shuffled_t.1 + 0.01, "{tvd:?}");
    }

    fn tvd2(pop: &Population, model: &Model, seed: u64) -> f64 {
        let syn = Population::from_rows(
            pop.dims().to_vec(),
            model.synthesize(pop.len() as u64, seed),
        )
        .unwrap();
        MarginalCounts::of_population(pop, 2)
            .mean_tvd(&MarginalCounts::of_population(&syn, 2))
            .unwrap()
    }

    /// L1 distance of the population's `(a, b)` marginal from the product of its 1-ways.
    fn population_dependence(pop: &Population, a: usize, b: usize) -> f64 {
        let (ka, kb) = (pop.dims()[a], pop.dims()[b]);
        let n = pop.len() as f64;
        let (mut joint, mut fa, mut fb) = (vec![0.0; ka * kb], vec![0.0; ka], vec![0.0; kb]);
        for r in pop.rows() {
            let (x, y) = (r[a] as usize, r[b] as usize);
            joint[x * kb + y] += 1.0 / n;
            fa[x] += 1.0 / n;
            fb[y] += 1.0 / n;
        }
        (0..ka * kb)
            .map(|v| (joint[v] - fa[v / kb] * fb[v % kb]).abs())
            .sum()
    }

    /// Planted structure, over 5 population seeds of 200k simulated users at ε = 4: `auto`
    /// keeps every planted edge on every seed, its 2-way TVD is below half of independence's
    /// on every seed, and over the 5 seeds at most one kept pair is not a real marginal
    /// dependence of the population (a real one is implied by a path of planted edges: L1
    /// distance from independence ≥ 0.1, where noise alone gives pairs near 0). Why one:
    /// the model graph keeps a pair it measured only in the screening round when its
    /// estimated gain is positive, and among ~50 independent pairs one passes that by chance
    /// on 2–3 of 20 seeds (measured: `benchmarks/sweeps/auto-round0-share.md`, "Pairs kept
    /// without dependence"); the stricter rules tried there cost temporal-match2 3–5% at
    /// ε ≤ 2. The first seed randomizes person by person; the others draw the same counts in
    /// buckets (binomial draws per cell).
    #[test]
    fn planted_structure_is_recovered() {
        let n = 200_000;
        let net = BayesNet::standard();
        let planted: BTreeSet<(usize, usize)> = net.planted_edges().into_iter().collect();
        let mut chance = Vec::new();
        for seed in 0..5u64 {
            let pop = net.sample(n, 77 + seed);
            let auto = Simulation::new(
                &engine(Protocol::Auto(PrivIncrParams::default()), 4.0, n as u64),
                &pop,
            )
            .seed(1 + seed)
            .bucketed(seed > 0)
            .run()
            .unwrap();
            let found: BTreeSet<(usize, usize)> = auto.model.graph_edges().into_iter().collect();
            let missing: Vec<_> = planted.difference(&found).collect();
            let extra: Vec<(usize, usize, f64)> = found
                .difference(&planted)
                .map(|&(a, b)| (a, b, population_dependence(&pop, a, b)))
                .collect();
            let ind = Simulation::new(&engine(Protocol::Independence {}, 4.0, n as u64), &pop)
                .seed(1 + seed)
                .bucketed(seed > 0)
                .run()
                .unwrap();
            let (ta, ti) = (tvd2(&pop, &auto.model, 3), tvd2(&pop, &ind.model, 3));
            println!(
                "planted: seed {seed}: auto {} edges, missing {missing:?}, not planted \
                 (a, b, population L1 dependence) {extra:?}; 2-way TVD auto {ta:.4}, \
                 independence {ti:.4}",
                found.len()
            );
            assert!(missing.is_empty(), "seed {seed}: missing {missing:?}");
            chance.extend(extra.iter().filter(|e| e.2 < 0.1).map(|e| (seed, e.0, e.1)));
            assert!(ta < 0.5 * ti, "seed {seed}: {ta} vs {ti}");
        }
        assert!(
            chance.len() <= 1,
            "kept pairs without real dependence (seed, a, b): {chance:?}"
        );
    }

    /// Encoding `fo+locmrf` against `fo` at the same ε per party (2, two parties splitting
    /// the standard Bayesian network's attributes): with 20% of each party's ε on its local
    /// central-DP model (δ = 1e-6), the mean 2-way TVD over 2 seeds is below 0.7 times
    /// `fo`'s, and the local models' graphs are in the model graph.
    #[test]
    fn local_models_beat_the_fo_encoding() {
        use ldpsyn::vertical::{DEFAULT_LOCMRF_SHARE, split_epsilon, split_party_budget};
        use ldpsyn::wire::{
            CollectionConfig, PROTOCOL_VERSION, Party, PartyAttribute, VerticalEncoding,
            VerticalParams,
        };
        let n = 10_000;
        let net = BayesNet::standard();
        let schema = net.schema();
        let dims = schema.domain_sizes();
        let names: Vec<String> = schema.attributes().iter().map(|a| a.name.clone()).collect();
        let half = names.len() / 2;
        let config = |locmrf: bool| {
            let party = |name: &str, range: std::ops::Range<usize>| {
                let k = &dims[range.clone()];
                let (eps, budget) = if locmrf {
                    let (e, b) = split_party_budget(2.0, 1e-6, k, DEFAULT_LOCMRF_SHARE).unwrap();
                    (e, Some(b))
                } else {
                    let e = split_epsilon(2.0, k)
                        .into_iter()
                        .map(|x| Epsilon::new(x).unwrap())
                        .collect();
                    (e, None)
                };
                Party {
                    name: name.into(),
                    attributes: names[range]
                        .iter()
                        .zip(eps)
                        .map(|(a, epsilon)| PartyAttribute {
                            name: a.clone(),
                            epsilon,
                        })
                        .collect(),
                    locmrf: budget,
                }
            };
            Engine::new(&CollectionConfig {
                auto_finalize_at_target: false,
                past_target: ldpsyn::wire::PastTarget::Accept,
                retain_reports_days: None,
                target: Vec::new(),
                name: None,
                description: None,
                version: PROTOCOL_VERSION,
                id: uuid::Uuid::nil(),
                schema: schema.clone(),
                epsilon: Epsilon::new(2.0).unwrap(),
                target_users: n as u64,
                protocol: Protocol::Vertical(VerticalParams {
                    parties: vec![party("left", 0..half), party("right", half..names.len())],
                    encoding: if locmrf {
                        VerticalEncoding::FoLocmrf
                    } else {
                        VerticalEncoding::Fo
                    },
                    sketch: None,
                    budget: None,
                }),
            })
            .unwrap()
        };
        let (fo, local) = (config(false), config(true));
        let (mut t_fo, mut t_local) = (0.0, 0.0);
        for seed in 0..2u64 {
            let pop = net.sample(n, 700 + seed);
            let a = Simulation::new(&fo, &pop).seed(seed).run().unwrap();
            let b = Simulation::new(&local, &pop).seed(seed).run().unwrap();
            t_fo += tvd_k(&pop, &a.model, seed, 2);
            t_local += tvd_k(&pop, &b.model, seed, 2);
            // Within a party the local graph's edges are kept whatever their LDP gain.
            let edges = b.model.graph_edges();
            assert!(
                edges
                    .iter()
                    .filter(|&&(x, y)| (x < half) == (y < half))
                    .count()
                    > 0,
                "seed {seed}: no intra-party edge in {edges:?}"
            );
        }
        assert!(t_local < 0.7 * t_fo, "fo+locmrf {t_local} vs fo {t_fo}");
    }

    /// Encoding `sketch+locmrf` at sound parameters (the sketches of both parties accounted
    /// together, [`ldpsyn_engine::measure::sketch_privacy`]): two parties of two attributes
    /// each at 4 per party (half to the local model, t = 1000) need more phantom ids per
    /// sketch than 20,000 people, so such a collection is refused for them and accepted for
    /// a population above the phantoms. (Theorem 2's parameters recovered planted pairs
    /// here; they were not private: `aggregator/engine/tests/sketch_audit.rs`.)
    #[test]
    fn sketch_encoding_is_refused_below_its_phantoms() {
        use ldpsyn::vertical::sketch_party_budget;
        use ldpsyn::wire::{
            CollectionConfig, PROTOCOL_VERSION, Party, PartyAttribute, SketchSettings,
            VerticalEncoding, VerticalParams,
        };
        let n = 20_000usize;
        let schema: ldpsyn::schema::Schema = serde_json::from_value(serde_json::json!({
            "attributes": [
                {"name": "a0", "type": "categorical", "labels": ["0", "1", "2"]},
                {"name": "a1", "type": "categorical", "labels": ["0", "1"]},
                {"name": "b0", "type": "categorical", "labels": ["0", "1", "2"]},
                {"name": "b1", "type": "categorical", "labels": ["0", "1", "2", "3", "4", "5"]}]}))
        .unwrap();
        let party = |name: &str, attrs: &[&str]| {
            let (eps, budget) = sketch_party_budget(4.0, 1e-6, attrs.len(), 0.5).unwrap();
            Party {
                name: name.into(),
                attributes: attrs
                    .iter()
                    .zip(eps)
                    .map(|(a, epsilon)| PartyAttribute {
                        name: (*a).into(),
                        epsilon,
                    })
                    .collect(),
                locmrf: Some(budget),
            }
        };
        let engine = Engine::new(&CollectionConfig {
            auto_finalize_at_target: false,
            past_target: ldpsyn::wire::PastTarget::Accept,
            retain_reports_days: None,
            target: Vec::new(),
            name: None,
            description: None,
            version: PROTOCOL_VERSION,
            id: uuid::Uuid::nil(),
            schema,
            epsilon: Epsilon::new(4.0).unwrap(),
            target_users: n as u64,
            protocol: Protocol::Vertical(VerticalParams {
                parties: vec![party("left", &["a0", "a1"]), party("right", &["b0", "b1"])],
                encoding: VerticalEncoding::SketchLocmrf,
                sketch: Some(SketchSettings {
                    repetitions: 1000,
                    ..SketchSettings::default()
                }),
                budget: None,
            }),
        })
        .unwrap();
        let v = engine.vertical().expect("a vertical collection");
        let refused = v.check_sketch_resolution(n as u64).unwrap_err();
        assert!(
            refused.contains("phantom") && refused.contains("sampled+locmrf"),
            "{refused}"
        );
        let phantoms = v.sketch_params(0).unwrap().phantoms();
        assert!(phantoms > n as u64, "{phantoms}");
        assert!(v.check_sketch_resolution(phantoms + 1).is_ok());
    }

    /// Error bars that cover: with a known population, nominal 95% intervals (model
    /// frequency ± 1.96 standard errors) of every 1-way marginal and of the 2-way marginal of
    /// every model-graph edge cover the population's cells between 90% and 99% of the time,
    /// for every protocol (3 seeds each), vertical collections included (two parties, ε = 1
    /// per attribute: there a 1-way and every pair containing it hold the same records'
    /// reports). Both sides: too narrow bars miss, too wide ones (inflated standard errors)
    /// cover nearly every cell. Every protocol has 1-way cells, and every protocol but
    /// `independence` has 2-way cells (model-graph edges measured at full resolution).
    ///
    /// Marginals no table measured at full resolution, whose bars come from the parametric
    /// bootstrap of the fit (`ldpsyn_engine::synth::bootstrap`), are held to the same bounds:
    /// every pair no table measured at full resolution (`auto` measures pairs in bins,
    /// `independence` none) and the 3-ways of `TRIPLES` (seed 0 only, `auto` and `privincr`:
    /// each model's replicates cost 64 refits), where the model's graph holds every planted
    /// edge between them (`represented`). Bars do not count the error of an independence the
    /// graph assumes and the population breaks: those (`Class::Misspecified`) are reported,
    /// not held. Bars may be withheld only where the model links the attributes (through a
    /// pair measured in bins) or in the vertical collection (shared records: no bootstrap).
    ///
    /// Known defect (`OVER_WIDE`): the 2-way bars of `privincr` are too wide (0.991 of 852
    /// cells), and those of `auto` (0.994 of 177 cells; 0.983 before its round 0 split its
    /// people by the attributes' noise, `benchmarks/sweeps/one-way-shares.md`, which moved
    /// which pairs and cells this test draws). A pair's standard errors are those of the
    /// generalized least-squares estimate from its own tables and its 1-ways from every other
    /// table (`FittedJoint::std_errors`), which brought `auto` from 0.993 to 0.964 and
    /// `samprivsyn` from 0.989 to 0.968; what is left is mostly sparse pairs' cells near zero,
    /// where the fit's non-negativity cuts the error the linear model counts. Those listed are
    /// held to the lower bound only, and fail once they come within 0.99 (then drop them from
    /// the list).
    #[test]
    fn marginal_error_bars_cover() {
        /// (protocol, class) whose bars are known to be too wide (see above).
        const OVER_WIDE: [(&str, &str); 2] = [("privincr", "edges"), ("auto", "edges")];
        use ldpsyn::wire::{CollectionConfig, PROTOCOL_VERSION, Party, PartyAttribute};
        let n = 100_000;
        let net = BayesNet::standard();
        let schema = net.schema();
        let names: Vec<String> = schema.attributes().iter().map(|a| a.name.clone()).collect();
        let half = names.len() / 2;
        let party = |name: &str, attrs: &[String]| Party {
            name: name.into(),
            attributes: attrs
                .iter()
                .map(|a| PartyAttribute {
                    name: a.clone(),
                    epsilon: Epsilon::new(1.0).unwrap(),
                })
                .collect(),
            locmrf: None,
        };
        let parties = vec![
            party("left", &names[..half]),
            party("right", &names[half..]),
        ];
        let vertical = Engine::new(&CollectionConfig {
            auto_finalize_at_target: false,
            past_target: ldpsyn::wire::PastTarget::Accept,
            retain_reports_days: None,
            target: Vec::new(),
            name: None,
            description: None,
            version: PROTOCOL_VERSION,
            id: uuid::Uuid::nil(),
            schema,
            epsilon: Epsilon::new((names.len() - half) as f64).unwrap(),
            target_users: n as u64,
            protocol: Protocol::Vertical(ldpsyn::wire::VerticalParams {
                parties,
                encoding: ldpsyn::wire::VerticalEncoding::Fo,
                sketch: None,
                budget: None,
            }),
        })
        .unwrap();
        let mut report = Vec::new();
        let planted = net.planted_edges();
        for (name, e) in [
            Protocol::Auto(PrivIncrParams::default()),
            Protocol::Privincr(PrivIncrParams::default()),
            Protocol::Samprivsyn(ldpsyn::wire::SamPrivSynParams { batch_size: 5000 }),
            Protocol::Independence {},
        ]
        .into_iter()
        .map(|p| (p.name().to_owned(), engine(p, 2.0, n as u64)))
        .chain([("vertical".to_owned(), vertical)])
        {
            // (covered, cells) per class: 1-ways, model-graph edges measured at full
            // resolution, pairs no table measured at full resolution whose dependence the
            // model's graph represents, 3-ways; and pairs whose dependence it does not.
            let mut tally = [(0usize, 0usize); 5];
            let mut withheld = [0usize; 5];
            let mut secs = 0.0;
            for seed in 0..3u64 {
                let pop = net.sample(n, 500 + seed);
                let run = Simulation::new(&e, &pop)
                    .seed(seed)
                    .bucketed(true)
                    .run()
                    .unwrap();
                let edges = run.model.graph_edges();
                let linked = components(pop.d(), &edges);
                let full = |attrs: &[usize]| {
                    run.tables.keys().any(|k| {
                        attrs.iter().all(|a| k.factor.contains(a))
                            && k.bins_are(ldpsyn_engine::BinnedFactor::full(attrs))
                    })
                };
                let mut sets: Vec<(Vec<usize>, Class)> =
                    (0..pop.d()).map(|a| (vec![a], Class::OneWay)).collect();
                for a in 0..pop.d() {
                    for b in a + 1..pop.d() {
                        if !full(&[a, b]) {
                            let holds = represented(&planted, &edges, &[a, b]);
                            let class = if holds {
                                Class::Unmeasured
                            } else {
                                Class::Misspecified
                            };
                            sets.push((vec![a, b], class));
                        } else if edges.contains(&(a, b)) {
                            sets.push((vec![a, b], Class::Edge));
                        }
                    }
                }
                // 3-ways cost the replicates (one refit each): one seed, of the protocols
                // whose graph holds the planted trees there (`samprivsyn`'s misses an edge).
                if seed == 0 && ["auto", "privincr"].contains(&name.as_str()) {
                    for t in TRIPLES {
                        let holds = represented(&planted, &edges, &t);
                        let class = if holds {
                            Class::ThreeWay
                        } else {
                            Class::Misspecified
                        };
                        sets.push((t.to_vec(), class));
                    }
                }
                let t = std::time::Instant::now();
                for (attrs, class) in sets {
                    let m = run.model.marginal(&attrs).unwrap();
                    let Some(se) = m.std_errors else {
                        match class {
                            Class::OneWay | Class::Edge => {
                                panic!("{name}, seed {seed}: no error bars for {attrs:?}")
                            }
                            // Shared records: no bootstrap. Otherwise withheld only where the
                            // model links the attributes through a pair measured in bins.
                            _ if name == "vertical" => {}
                            _ => assert!(
                                attrs.iter().all(|&a| linked[a] == linked[attrs[0]]),
                                "{name}, seed {seed}: no error bars for {attrs:?}"
                            ),
                        }
                        withheld[class as usize] += 1;
                        continue;
                    };
                    let mut truth = vec![0.0; m.frequencies.len()];
                    for r in pop.rows() {
                        let idx = attrs
                            .iter()
                            .fold(0, |i, &a| i * pop.dims()[a] + r[a] as usize);
                        truth[idx] += 1.0 / n as f64;
                    }
                    let (covered, cells) = &mut tally[class as usize];
                    for ((f, s), t) in m.frequencies.iter().zip(&se).zip(&truth) {
                        *cells += 1;
                        *covered += usize::from((f - t).abs() <= 1.96 * s);
                    }
                }
                secs += t.elapsed().as_secs_f64();
            }
            let coverage = tally.map(|(c, n)| (c as f64 / n.max(1) as f64, n));
            println!(
                "{name}: (coverage, cells) of 1-ways, measured edges, unmeasured pairs, \
                 3-ways, misspecified pairs: {coverage:?}; marginals withheld per class \
                 {withheld:?}; answering took {secs:.1} s over 3 seeds"
            );
            report.push((name, coverage));
        }
        for (name, [one, two, unmeasured, three, _]) in &report {
            // Per class: 1-way cells are few beside pair cells, and a shared-record collection
            // that pooled a 1-way with its pairs would hide there.
            assert!(one.1 > 0, "{name}: no 1-way cells");
            if name == "independence" {
                assert_eq!(two.1, 0, "independence has no model-graph edges");
            } else {
                assert!(
                    two.1 > 0,
                    "{name}: no model-graph edge measured at full resolution"
                );
            }
            // `auto` measures pairs in bins, `independence` none: both answer pairs no table
            // measured with bars from the bootstrap, as `auto` and `privincr` 3-ways.
            if ["auto", "independence"].contains(&name.as_str()) {
                assert!(unmeasured.1 > 0, "{name}: no unmeasured pair with bars");
            }
            if ["auto", "privincr"].contains(&name.as_str()) {
                assert!(three.1 > 0, "{name}: no 3-way with bars");
            }
            for (class, (coverage, cells)) in [
                ("1-ways", one),
                ("edges", two),
                ("unmeasured pairs", unmeasured),
                ("3-ways", three),
            ] {
                if *cells == 0 {
                    continue;
                }
                assert!(
                    *coverage >= 0.90,
                    "{name} {class}: coverage {coverage} of {cells} cells"
                );
                if OVER_WIDE.contains(&(name.as_str(), class)) {
                    assert!(
                        *coverage > 0.99,
                        "{name} {class}: now within 0.99 ({coverage}): remove it from OVER_WIDE"
                    );
                } else {
                    assert!(
                        *coverage <= 0.99,
                        "{name} {class}: error bars too wide: coverage {coverage} of {cells} \
                         cells"
                    );
                }
            }
        }
    }

    /// The classes of marginals [`marginal_error_bars_cover`] tallies.
    #[derive(Clone, Copy)]
    enum Class {
        OneWay,
        /// A model-graph edge some table measured at full resolution.
        Edge,
        /// A pair no table measured at full resolution whose dependence the model's graph
        /// represents (independent in the population, or every planted edge between them
        /// in the graph: [`represented`]).
        Unmeasured,
        /// A 3-way (no table measures one) of pairs whose dependence the graph represents.
        ThreeWay,
        /// A pair (or a 3-way holding one) no table measured at full resolution, dependent in the population, that the
        /// model's graph leaves independent: the bars do not count that error (reported, not
        /// held to the bounds).
        Misspecified,
    }

    /// 3-ways of the standard network: two along its planted trees (age → hours, marital;
    /// education → income → vehicle), one across two of them (region → language; smoker).
    const TRIPLES: [[usize; 3]; 3] = [[0, 4, 5], [2, 3, 10], [6, 7, 8]];

    /// Whether the model graph `edges` holds every edge of the planted forest `planted` on
    /// the path between any two of `attrs`: then every independence the model assumes among
    /// them holds in the population.
    fn represented(planted: &[(usize, usize)], edges: &[(usize, usize)], attrs: &[usize]) -> bool {
        // The planted path from `a` to `b` (a forest: at most one), by depth-first search.
        fn path(
            planted: &[(usize, usize)],
            a: usize,
            b: usize,
            from: usize,
        ) -> Option<Vec<(usize, usize)>> {
            if a == b {
                return Some(Vec::new());
            }
            planted
                .iter()
                .filter_map(|&(x, y)| match (x == a, y == a) {
                    (true, _) if y != from => Some(y),
                    (_, true) if x != from => Some(x),
                    _ => None,
                })
                .find_map(|next| {
                    let mut p = path(planted, next, b, a)?;
                    p.push((a.min(next), a.max(next)));
                    Some(p)
                })
        }
        attrs.iter().enumerate().all(|(i, &a)| {
            attrs[i + 1..].iter().all(|&b| {
                path(planted, a, b, usize::MAX).is_none_or(|p| p.iter().all(|e| edges.contains(e)))
            })
        })
    }

    /// The connected component of each of `d` attributes under `edges` (smallest member).
    fn components(d: usize, edges: &[(usize, usize)]) -> Vec<usize> {
        let mut comp: Vec<usize> = (0..d).collect();
        for _ in 0..d {
            for &(a, b) in edges {
                let m = comp[a].min(comp[b]);
                comp[a] = m;
                comp[b] = m;
            }
        }
        comp
    }

    #[test]
    fn every_protocol_runs_end_to_end() {
        let n = 20_000;
        let pop = BayesNet::standard().sample(n, 8);
        for p in [
            Protocol::Privincr(PrivIncrParams::default()),
            Protocol::Noincremental(PrivIncrParams::default()),
            Protocol::Auto(PrivIncrParams::default()),
            Protocol::Samprivsyn(ldpsyn::wire::SamPrivSynParams { batch_size: 2000 }),
            Protocol::Independence {},
        ] {
            let e = engine(p.clone(), 2.0, n as u64);
            for bucketed in [false, true] {
                let run = Simulation::new(&e, &pop)
                    .seed(2)
                    .bucketed(bucketed)
                    .run()
                    .unwrap();
                let rows: Vec<Vec<u32>> = run.model.synthesize(500, 1).collect();
                assert_eq!(rows.len(), 500);
                assert!(
                    rows.iter()
                        .all(|r| r.iter().zip(pop.dims()).all(|(&c, &k)| (c as usize) < k))
                );
                assert_eq!(rows, run.model.synthesize(500, 1).collect::<Vec<_>>());
                let m = run.model.frequencies(&[2, 3]).unwrap();
                assert!((m.iter().sum::<f64>() - 1.0).abs() < 1e-9);
                let m3 = run.model.frequencies(&[0, 5, 4]).unwrap();
                assert!((m3.iter().sum::<f64>() - 1.0).abs() < 1e-9);
                serde_json::to_string(&run.model.describe()).unwrap();
                serde_json::to_string(&run.state).unwrap();
                // Every report is in exactly one round's summary.
                let rounds = run.model.describe().rounds;
                assert_eq!(rounds.iter().map(|r| r.reports).sum::<u64>(), n as u64);
                for r in &rounds {
                    assert_eq!(r.reports, r.factors.iter().map(|f| f.reports).sum::<u64>());
                }
            }
        }
    }

    /// `/model`'s rounds of an `auto` collection: round 0 measured every attribute alone with
    /// its share of the users, the screening round every screened pair with the dependence
    /// it showed (and every attribute alone, its slice), phase 2 the selected pairs (and the 1-ways) with their allocation.
    #[test]
    fn model_describes_each_round() {
        let n = 50_000;
        let pop = BayesNet::standard().sample(n, 8);
        let e = engine(Protocol::Auto(PrivIncrParams::default()), 4.0, n as u64);
        let run = Simulation::new(&e, &pop).seed(3).run().unwrap();
        let rounds = run.model.describe().rounds;
        assert_eq!(
            rounds.iter().map(|r| r.round).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        let d = pop.dims().len();
        assert!(rounds[0].factors.iter().all(|f| f.factor.len() == 1));
        assert_eq!(rounds[0].factors.len(), d);
        assert_eq!(rounds[0].reports, e.initial_state().round_quota.unwrap());
        let screened = run.states[0].edges().iter().filter(|e| e.active).count();
        // The screened pairs with their dependence, and the round's slice of 1-ways.
        let (pairs1, ones1): (Vec<_>, Vec<_>) =
            rounds[1].factors.iter().partition(|f| f.factor.len() == 2);
        assert_eq!(pairs1.len(), screened);
        assert!(pairs1.iter().all(|f| f.score.is_some()));
        assert_eq!(ones1.len(), d);
        let plan = run.state.plan().unwrap();
        let pairs: BTreeSet<&Vec<usize>> = rounds[2]
            .factors
            .iter()
            .map(|f| &f.factor)
            .filter(|f| f.len() == 2)
            .collect();
        let planned: BTreeSet<&Vec<usize>> = plan
            .factors
            .iter()
            .map(|f| &f.factor)
            .filter(|f| f.len() == 2)
            .collect();
        assert_eq!(pairs, planned);
        assert!(!pairs.is_empty());
    }
}
