//! Fine 1-way estimators of a numeric attribute compared on real columns, at equal reports
//! (issue 12, "pick by measured error"): the engine's (OUE over the working bins, a share of
//! the reports over sub-bins, histogram recovery; the `independence` protocol on the one
//! attribute) against Square Wave + EMS (Li et al., SIGMOD 2020, "Estimating Numerical
//! Distributions under Local Differential Privacy": §4.1's Square Wave, Algorithm 1's
//! EM with smoothing). For each `bins: "auto"` attribute, ε and report count: KS,
//! W1/(max − min) and the mean 1-D range-query error of synthetic values drawn from each
//! estimate against the reporting people's raw values, mean over seeds.
//!
//! ```text
//! bench-oneway --data examples/adult/adult.csv --schema examples/adult/schema-auto.json \
//!     [--epsilon E]… [--users N]… [--seeds S] [--out results.json]
//! ```
//! Square Wave here is a comparison harness, not a product mechanism: it is not offered to
//! devices. Its p/q = e^ε is checked at start; the tests below check that its draws follow
//! the model EMS inverts, and that EMS recovers a smooth distribution.

use std::path::PathBuf;

use clap::Parser;
use ldpsyn::Epsilon;
use ldpsyn::schema::{AttributeKind, DecodedValue, NumericDecoding, Schema};
use ldpsyn::wire::{CollectionConfig, PROTOCOL_VERSION, Protocol};
use ldpsyn_aggregator::engine::{Engine, Expansion};
use ldpsyn_aggregator::eval::numeric_fidelity;
use ldpsyn_aggregator::sim::{Population, Simulation, load_csv};
use ldpsyn_examples::{Error, RANGE_QUERIES};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// Fine 1-way estimators compared (module docs).
#[derive(Debug, Parser)]
struct Args {
    /// CSV with a header row.
    #[arg(long)]
    data: PathBuf,
    /// Schema; its `bins: "auto"` attributes are compared.
    #[arg(long)]
    schema: PathBuf,
    /// ε values (repeat the flag; default 1, 2, 4, 8).
    #[arg(long = "epsilon")]
    epsilons: Vec<f64>,
    /// Reports per attribute (repeat the flag; default 3,000 and 30,000: about what `auto`
    /// gives one of Adult's 15 attributes alone at 45,222 people, and ten times that).
    #[arg(long = "users")]
    users: Vec<usize>,
    /// Seeds per cell.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Square Wave over [0, 1] at ε (Li et al. 2020, §4.1): the half-width `b` that maximizes
/// the mutual information bound, and the output densities `p` within `b` of the input and
/// `q` elsewhere on `[−b, 1 + b]`; `p / q = e^ε`.
#[derive(Debug, Clone, Copy)]
struct SquareWave {
    b: f64,
    p: f64,
    q: f64,
}

impl SquareWave {
    fn new(eps: f64) -> Self {
        let e = eps.exp();
        let b = (eps * e - e + 1.0) / (2.0 * e * (e - 1.0 - eps));
        let p = e / (2.0 * b * e + 1.0);
        Self { b, p, q: p / e }
    }

    /// One report of `v ∈ [0, 1]`.
    fn randomize<R: Rng>(&self, v: f64, rng: &mut R) -> f64 {
        // Mass p·2b within the window, q·1 outside it.
        if rng.random::<f64>() < self.p * 2.0 * self.b {
            v - self.b + 2.0 * self.b * rng.random::<f64>()
        } else {
            // Uniform over [−b, v − b) ∪ (v + b, 1 + b], of lengths v and 1 − v.
            let u = rng.random::<f64>();
            if u < v { u - self.b } else { u + self.b }
        }
    }

    /// Probability that a report of `v` falls in `[lo, hi)`.
    fn bucket_probability(&self, v: f64, lo: f64, hi: f64) -> f64 {
        let overlap = (hi.min(v + self.b) - lo.max(v - self.b)).max(0.0);
        self.p * overlap + self.q * ((hi - lo) - overlap)
    }
}

/// Square Wave + EMS estimate of `codes` whose code `c` sits at `positions[c] ∈ [0, 1]`
/// (its cell's centre; codes are cells of width `1/k`, `k = positions.len()`, taken in
/// position order so that smoothing mixes neighbours): reports bucketed into cells of width
/// `1/k` over `[−b, 1 + b]`, then EM with binomial smoothing (Algorithm 1 of Li et al.),
/// until the estimate moves less than 1e-7 (L∞) or 2,000 iterations. Returns the frequency
/// of every code.
fn square_wave_ems<R: Rng>(codes: &[u32], positions: &[f64], eps: f64, rng: &mut R) -> Vec<f64> {
    let sw = SquareWave::new(eps);
    let k = positions.len();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| positions[a].total_cmp(&positions[b]));
    let width = 1.0 / k as f64;
    let out = ((1.0 + 2.0 * sw.b) / width).ceil() as usize;
    let mut counts = vec![0.0f64; out];
    for &c in codes {
        let y = sw.randomize(positions[c as usize], rng);
        let j = (((y + sw.b) / width).floor().max(0.0) as usize).min(out - 1);
        counts[j] += 1.0;
    }
    // m[j][i] = Pr[bucket j | the i-th code in position order].
    let m: Vec<Vec<f64>> = (0..out)
        .map(|j| {
            let lo = -sw.b + j as f64 * width;
            let hi = (lo + width).min(1.0 + sw.b);
            order
                .iter()
                .map(|&c| sw.bucket_probability(positions[c], lo, hi))
                .collect()
        })
        .collect();
    let mut x = vec![1.0 / k as f64; k];
    for _ in 0..2000 {
        // E and M steps.
        let mut next = vec![0.0; k];
        for (j, row) in m.iter().enumerate() {
            if counts[j] == 0.0 {
                continue;
            }
            let denom: f64 = row.iter().zip(&x).map(|(a, b)| a * b).sum();
            if denom <= 0.0 {
                continue;
            }
            let w = counts[j] / denom;
            for (nx, (a, b)) in next.iter_mut().zip(row.iter().zip(&x)) {
                *nx += w * a * b;
            }
        }
        // Smoothing: binomial (1, 2, 1)/4, renormalized at the ends.
        let mut smooth = vec![0.0; k];
        for i in 0..k {
            let (mut s, mut w) = (2.0 * next[i], 2.0);
            if i > 0 {
                s += next[i - 1];
                w += 1.0;
            }
            if i + 1 < k {
                s += next[i + 1];
                w += 1.0;
            }
            smooth[i] = s / w;
        }
        let total: f64 = smooth.iter().sum();
        let moved = smooth
            .iter()
            .zip(&x)
            .map(|(a, b)| (a / total - b).abs())
            .fold(0.0, f64::max);
        x = smooth.iter().map(|v| v / total).collect();
        if moved < 1e-7 {
            break;
        }
    }
    let mut by_code = vec![0.0; k];
    for (i, &c) in order.iter().enumerate() {
        by_code[c] = x[i];
    }
    by_code
}

/// Codes drawn from frequencies `f` (cumulative search).
fn sample_codes<R: Rng>(f: &[f64], n: usize, rng: &mut R) -> Vec<u32> {
    let cdf: Vec<f64> = f
        .iter()
        .scan(0.0, |acc, v| {
            *acc += v.max(0.0);
            Some(*acc)
        })
        .collect();
    let total = cdf[cdf.len() - 1];
    (0..n)
        .map(|_| {
            let u = rng.random::<f64>() * total;
            cdf.partition_point(|&c| c <= u).min(f.len() - 1) as u32
        })
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn main() -> Result<(), Error> {
    let mut args = Args::parse();
    if args.epsilons.is_empty() {
        args.epsilons = vec![1.0, 2.0, 4.0, 8.0];
    }
    if args.users.is_empty() {
        args.users = vec![3000, 30_000];
    }
    for &eps in &args.epsilons {
        let sw = SquareWave::new(eps);
        assert!((sw.p / sw.q - eps.exp()).abs() < 1e-9 * eps.exp());
        assert!((sw.p * 2.0 * sw.b + sw.q - 1.0).abs() < 1e-12);
    }
    let schema: Schema = serde_json::from_str(&std::fs::read_to_string(&args.schema)?)?;
    let loaded = load_csv(&args.data, &schema)?;
    let mut results = Vec::new();
    println!(
        "| attribute | cells | ε | reports | engine KS | SW+EMS KS | engine W1 | SW+EMS W1 | engine range | SW+EMS range |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for column in &loaded.numeric {
        let attr = &schema.attributes()[column.attribute];
        let AttributeKind::Numeric { min, max, .. } = attr.kind else {
            continue;
        };
        if attr.working_bins().is_none() {
            continue;
        }
        let k = attr.domain_size();
        let one = Schema::new(vec![attr.clone()])?;
        // Each code's place in [0, 1]: its cell's middle (a point mass is not in code order).
        let mut mid = StdRng::seed_from_u64(0);
        let positions: Vec<f64> = (0..k as u32)
            .map(
                |c| match attr.decode(c, NumericDecoding::Midpoint, &mut mid) {
                    DecodedValue::Number(x) => ((x - min) / (max - min)).clamp(0.0, 1.0),
                    _ => 0.0,
                },
            )
            .collect();
        let all_codes: Vec<u32> = loaded
            .population
            .rows()
            .map(|r| r[column.attribute])
            .collect();
        for &eps in &args.epsilons {
            for &n in &args.users {
                let mut figures = [(); 6].map(|_| Vec::new());
                for seed in 0..args.seeds {
                    let mut rng = StdRng::seed_from_u64(seed * 7919 + n as u64);
                    // The reporting people: a seeded sample of the column (with replacement).
                    let idx: Vec<usize> = (0..n)
                        .map(|_| rng.random_range(0..all_codes.len()))
                        .collect();
                    let codes: Vec<u32> = idx.iter().map(|&i| all_codes[i]).collect();
                    let real: Vec<f64> = idx.iter().map(|&i| column.values[i]).collect();
                    let decode = |codes: &[u32], rng: &mut StdRng| -> Vec<f64> {
                        codes
                            .iter()
                            .map(|&c| match attr.decode(c, NumericDecoding::Uniform, rng) {
                                DecodedValue::Number(x) => x,
                                _ => f64::NAN,
                            })
                            .collect()
                    };
                    // The engine: independence on the one attribute.
                    let config = CollectionConfig {
                        auto_finalize_at_target: false,
                        past_target: ldpsyn::wire::PastTarget::Accept,
                        retain_reports_days: None,
                        target: Vec::new(),
                        name: None,
                        description: None,
                        version: PROTOCOL_VERSION,
                        id: uuid::Uuid::nil(),
                        schema: one.clone(),
                        epsilon: Epsilon::new(eps)?,
                        target_users: n as u64,
                        protocol: Protocol::Independence {},
                    };
                    let engine = Engine::new(&config)?;
                    let pop = Population::new(vec![k], codes.clone())?;
                    let model = Simulation::new(&engine, &pop)
                        .seed(seed)
                        .bucketed(true)
                        .run()?
                        .model;
                    let synth: Vec<u32> = model
                        .synthesize_with(n as u64, seed ^ 0x5eed, Expansion::Recover)
                        .map(|r| r[0])
                        .collect();
                    let score = |values: &[f64]| {
                        numeric_fidelity(&attr.name, &real, values, (min, max), RANGE_QUERIES, seed)
                    };
                    let e = score(&decode(&synth, &mut rng))?;
                    // Square Wave + EMS on the same people.
                    let f = square_wave_ems(&codes, &positions, eps, &mut rng);
                    let s = score(&decode(&sample_codes(&f, n, &mut rng), &mut rng))?;
                    for (slot, v) in figures.iter_mut().zip([
                        e.ks,
                        s.ks,
                        e.w1,
                        s.w1,
                        e.range_query_error,
                        s.range_query_error,
                    ]) {
                        slot.push(v);
                    }
                }
                let m: Vec<f64> = figures.iter().map(|v| mean(v)).collect();
                println!(
                    "| {} | {k} | {eps} | {n} | {:.3} | {:.3} | {:.4} | {:.4} | {:.4} | {:.4} |",
                    attr.name, m[0], m[1], m[2], m[3], m[4], m[5]
                );
                results.push(json!({
                    "attribute": attr.name, "cells": k, "epsilon": eps, "reports": n,
                    "seeds": args.seeds,
                    "engine": {"ks": m[0], "w1": m[2], "range_query_error": m[4]},
                    "square_wave_ems": {"ks": m[1], "w1": m[3], "range_query_error": m[5]},
                }));
            }
        }
    }
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&results)? + "\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The randomizer draws what `bucket_probability` (the EM's model) says: over 200,000
    /// reports of one value, every bucket's share within 0.004 of it; and p/q = e^ε with the
    /// output density integrating to 1.
    #[test]
    fn square_wave_draws_its_model() {
        for eps in [0.5, 1.0, 4.0] {
            let sw = SquareWave::new(eps);
            assert!((sw.p / sw.q - f64::exp(eps)).abs() < 1e-9 * f64::exp(eps));
            assert!((2.0 * sw.b * sw.p + sw.q - 1.0).abs() < 1e-12);
            let mut rng = StdRng::seed_from_u64(9);
            let (v, buckets, n) = (0.3, 10usize, 200_000);
            let width = (1.0 + 2.0 * sw.b) / buckets as f64;
            let mut counts = vec![0usize; buckets];
            for _ in 0..n {
                let y = sw.randomize(v, &mut rng);
                assert!((-sw.b..=1.0 + sw.b).contains(&y));
                counts[(((y + sw.b) / width) as usize).min(buckets - 1)] += 1;
            }
            for (j, &c) in counts.iter().enumerate() {
                let lo = -sw.b + j as f64 * width;
                let expected = sw.bucket_probability(v, lo, lo + width);
                let got = c as f64 / n as f64;
                assert!(
                    (got - expected).abs() < 0.004,
                    "ε {eps} bucket {j}: {got} vs {expected}"
                );
            }
        }
    }

    /// EMS recovers a smooth distribution from many reports: a triangle over 20 cells, 100,000
    /// reports at ε = 4, every cell within 0.01 of it.
    #[test]
    fn ems_recovers_a_smooth_distribution() {
        let k = 20usize;
        let weights: Vec<f64> = (0..k).map(|i| (1 + i.min(k - 1 - i)) as f64).collect();
        let total: f64 = weights.iter().sum();
        let truth: Vec<f64> = weights.iter().map(|w| w / total).collect();
        let mut rng = StdRng::seed_from_u64(3);
        let codes = sample_codes(&truth, 100_000, &mut rng);
        let positions: Vec<f64> = (0..k).map(|i| (i as f64 + 0.5) / k as f64).collect();
        let est = square_wave_ems(&codes, &positions, 4.0, &mut rng);
        assert!((est.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        for (i, (e, t)) in est.iter().zip(&truth).enumerate() {
            assert!((e - t).abs() < 0.01, "cell {i}: {e} vs {t}");
        }
    }
}
