//! Plain-text randomize throughput for `benches/peers/run.sh`: one line per workload,
//! `ldpsyn <mechanism> <dims> eps=<ε> reports_per_s=<r> ns_per_report=<t>`, single thread,
//! `StdRng` (ChaCha12, the client's CSPRNG) seeded, timed in thread CPU time. Same workloads as `benches/randomize.rs`.
//! Run with `cargo bench -p ldpsyn --bench throughput`; criterion's flags are ignored.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ldpsyn::Epsilon;
use ldpsyn::mechanism::{Mechanism, MechanismKind};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// CPU time of the calling thread, from `/proc/thread-self/schedstat` (Linux; first field,
/// nanoseconds on the CPU), else wall time since the first call. Timing CPU time rather than
/// wall time keeps a shared, overloaded machine from charging other processes' time slices
/// to either side (`peers.py` uses `time.thread_time`, the same clock).
fn thread_time() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .unwrap_or_else(|| START.get_or_init(Instant::now).elapsed())
}

/// Reports per second of `m.randomize`: the fastest of 25 batches of ~`batch_time` each, after
/// a warm-up (best-of-batches, as `peers.py` does for the Python clients, so that other load
/// on a shared machine biases neither side).
fn measure(m: &Mechanism, batch_time: Duration) -> f64 {
    let mut rng = StdRng::seed_from_u64(0x1d9_5e7);
    let dims = m.dims().to_vec();
    let mut codes = vec![0u32; dims.len()];
    let mut run = |reports: u64| {
        let start = thread_time();
        for _ in 0..reports {
            // Cycle through the domain (no division in the loop).
            for (c, &d) in codes.iter_mut().zip(&dims) {
                *c += 1;
                if *c as usize == d {
                    *c = 0;
                }
            }
            black_box(m.randomize(black_box(&codes), &mut rng).expect("in domain"));
        }
        thread_time() - start
    };
    // Warm up and size a batch.
    let mut batch = 1_000u64;
    while run(batch) < batch_time / 4 {
        batch *= 2;
    }
    let per_report = run(batch).as_secs_f64() / batch as f64;
    let batch = ((batch_time.as_secs_f64() / per_report) as u64).max(1);
    (0..25)
        .map(|_| batch as f64 / run(batch).as_secs_f64())
        .fold(0.0, f64::max)
}

fn main() {
    let batch_time = Duration::from_millis(
        std::env::var("LDPSYN_BATCH_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20),
    );
    let mut workloads: Vec<(MechanismKind, Vec<usize>)> = Vec::new();
    for k in [2, 16, 256] {
        workloads.push((MechanismKind::Grr, vec![k]));
    }
    for k in [16, 256, 4096] {
        workloads.push((MechanismKind::Oue, vec![k]));
    }
    workloads.push((MechanismKind::GrrPair, vec![16, 16]));
    workloads.push((MechanismKind::GrrPair, vec![9, 16]));
    // Reference: the cost of one 64-bit draw from the client's CSPRNG (GRR takes one or
    // two, OUE one per bit on the dense path), same best-of-batches method.
    let mut rng = StdRng::seed_from_u64(1);
    let draws = 1u64 << 20;
    let best = (0..25)
        .map(|_| {
            let start = thread_time();
            for _ in 0..draws {
                black_box(rng.next_u64());
            }
            (thread_time() - start).as_secs_f64() / draws as f64
        })
        .fold(f64::INFINITY, f64::min);
    println!("reference StdRng::next_u64 ns_per_call={:.2}", best * 1e9);
    for epsilon in [1.0, 4.0] {
        let eps = Epsilon::new(epsilon).expect("valid ε");
        for (kind, dims) in &workloads {
            let m = Mechanism::new(*kind, eps, dims).expect("valid mechanism");
            let rate = measure(&m, batch_time);
            let label = dims
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("x");
            println!(
                "ldpsyn {kind} {label} eps={epsilon} reports_per_s={rate:.0} ns_per_report={:.1}",
                1e9 / rate
            );
        }
    }
}
