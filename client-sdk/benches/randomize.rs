//! Randomize throughput of the SDK's mechanisms, as the client calls them
//! (`Mechanism::randomize`: codes → wire payload), with the client's CSPRNG (`StdRng`,
//! ChaCha12) seeded. GRR k ∈ {2, 16, 256}, OUE k ∈ {16, 256, 4096}, pair-GRR 16×16 and
//! 9×16 (Adult-like pairs), at ε ∈ {1, 4}. Kept short: `cargo bench --bench randomize`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ldpsyn::Epsilon;
use ldpsyn::mechanism::{Mechanism, MechanismKind};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// The workloads, shared in spirit with `benches/throughput.rs` and `benches/peers/`.
fn workloads() -> Vec<(MechanismKind, Vec<usize>)> {
    let mut w = Vec::new();
    for k in [2, 16, 256] {
        w.push((MechanismKind::Grr, vec![k]));
    }
    for k in [16, 256, 4096] {
        w.push((MechanismKind::Oue, vec![k]));
    }
    w.push((MechanismKind::GrrPair, vec![16, 16]));
    w.push((MechanismKind::GrrPair, vec![9, 16]));
    w
}

fn randomize(c: &mut Criterion) {
    for epsilon in [1.0, 4.0] {
        let eps = Epsilon::new(epsilon).expect("valid ε");
        for kind in [
            MechanismKind::Grr,
            MechanismKind::Oue,
            MechanismKind::GrrPair,
        ] {
            let mut group = c.benchmark_group(format!("randomize/{kind}/eps={epsilon}"));
            group
                .throughput(Throughput::Elements(1))
                .warm_up_time(Duration::from_millis(200))
                .measurement_time(Duration::from_millis(600))
                .sample_size(20);
            for (_, dims) in workloads().into_iter().filter(|(k, _)| *k == kind) {
                let m = Mechanism::new(kind, eps, &dims).expect("valid mechanism");
                let label = dims
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join("x");
                group.bench_with_input(BenchmarkId::from_parameter(label), &dims, |b, dims| {
                    let mut rng = StdRng::seed_from_u64(0x1d9_5e7);
                    // Cycle through the domain so the true value varies as in real traffic.
                    let mut codes = vec![0u32; dims.len()];
                    b.iter(|| {
                        for (c, &d) in codes.iter_mut().zip(dims) {
                            *c += 1;
                            if *c as usize == d {
                                *c = 0;
                            }
                        }
                        black_box(m.randomize(black_box(&codes), &mut rng).expect("in domain"))
                    })
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, randomize);
criterion_main!(benches);
