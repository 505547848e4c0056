//! Task draws, as the service hands them out (`GET …/task?count=1000`): per task through
//! `Engine::draw_task` (the state's choices rebuilt per draw, as before `TaskSampler`) vs one
//! `Engine::sampler` per request and an O(log n) draw per task. 35 attributes of 5 values
//! (595 pairs): SamPrivSyn (weighted pairs), PrivIncr phase 1 (weighted active pairs) and
//! `auto` phase 1 (uniform screened pairs). And a request for one task (the default): the
//! sampler built for it, or the one the service keeps per state
//! (`CollectionHandle::sampler`). `cargo bench -p ldpsyn-engine --bench tasks`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ldpsyn::Epsilon;
use ldpsyn::wire::{PrivIncrParams, Protocol, SamPrivSynParams};
use ldpsyn_engine::{Engine, EngineOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn tasks(c: &mut Criterion) {
    let mut g = c.benchmark_group("1000 tasks");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for (name, protocol) in [
        (
            "samprivsyn",
            Protocol::Samprivsyn(SamPrivSynParams::default()),
        ),
        ("privincr", Protocol::Privincr(PrivIncrParams::default())),
        ("auto", Protocol::Auto(PrivIncrParams::default())),
    ] {
        let engine = Engine::from_parts(
            vec![5; 35],
            Epsilon::new(2.0).unwrap(),
            1_000_000,
            protocol,
            EngineOptions::default(),
        )
        .unwrap();
        let state = engine.initial_state();
        let mut rng = StdRng::seed_from_u64(1);
        g.bench_function(BenchmarkId::new("draw_task each", name), |b| {
            b.iter(|| {
                for _ in 0..1000 {
                    black_box(engine.draw_task(&state, &mut rng).unwrap());
                }
            })
        });
        g.bench_function(BenchmarkId::new("one sampler", name), |b| {
            b.iter(|| {
                let sampler = engine.sampler(&state).unwrap();
                for _ in 0..1000 {
                    black_box(sampler.draw(&mut rng));
                }
            })
        });
        g.bench_function(BenchmarkId::new("1 task, sampler built", name), |b| {
            b.iter(|| {
                for _ in 0..1000 {
                    let sampler = engine.sampler(&state).unwrap();
                    black_box(sampler.draw(&mut rng));
                }
            })
        });
        let kept = engine.sampler(&state).unwrap();
        g.bench_function(BenchmarkId::new("1 task, sampler kept", name), |b| {
            b.iter(|| {
                for _ in 0..1000 {
                    black_box(kept.draw(&mut rng));
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, tasks);
criterion_main!(benches);
