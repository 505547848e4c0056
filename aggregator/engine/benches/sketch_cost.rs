//! Party cost of VertiMRF's sketch-based LocEnc (`ldpsyn_engine::measure::sketch`) on Adult split as
//! the paper (§7.1: 8 & 7 attributes, `examples/adult/parties.json`), at t = 2000: CPU
//! seconds and upload size (JSON bytes) per party, then the server's CarEst of every
//! cross-party 2-way marginal with its mean TVD to the truth (clipped frequencies).
//! The paper's Python: 15 Mb and 23.1 min per party (Table 2).
//!
//! ```text
//! cargo bench -p ldpsyn-engine --bench sketch-cost -- [--t 2000] [--epsilon 1.6]
//! ```
//! `--epsilon` is the collection's total; LocEnc gets 40% of it (§7.1), n̂ 10% of that,
//! δ = 1/n. Rows with a missing value are dropped (Adult's 45,222 complete rows).

use std::time::Instant;

use ldpsyn::schema::Schema;
use ldpsyn::vertical::RecordIdKey;
use ldpsyn_engine::measure::sketch::{
    AttributeRef, Combine, DEFAULT_COUNT_SHARE, DEFAULT_GAMMA, SketchKey, SketchParams,
    SketchReport, encode_party, estimate_marginal, pooled_count,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// This thread's CPU time in seconds (Linux `schedstat`, ns), or `None` elsewhere.
fn cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let t = arg("--t", 2000.0) as u32;
    let total_epsilon = arg("--epsilon", 1.6);
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/adult");
    let schema: Schema =
        serde_json::from_str(&std::fs::read_to_string(format!("{root}/schema.json")).unwrap())
            .unwrap();
    let parties: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{root}/parties.json")).unwrap())
            .unwrap();
    let csv = std::fs::read_to_string(format!("{root}/adult.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let encoder = schema.csv_encoder(&header).unwrap();
    let rows: Vec<Vec<u32>> = lines
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(',').collect();
            encoder.encode(&fields).ok().map(|r| r.codes().to_vec())
        })
        .collect();
    let n = rows.len();
    let sizes = schema.domain_sizes();
    // Record ids as a party derives them (HMAC-SHA256 of the customer id, 64 hex digits).
    let id_key = RecordIdKey::new(vec![3; 32]).unwrap();
    let ids: Vec<String> = (0..n).map(|i| id_key.record_id(&i.to_string())).collect();
    let sketch_key = SketchKey::generate(&mut StdRng::from_os_rng());
    let delta = 1.0 / n as f64;
    let locenc = 0.4 * total_epsilon;
    println!(
        "Adult: {n} complete rows; t = {t}, γ = {DEFAULT_GAMMA}, total ε = {total_epsilon} \
         (LocEnc ε = {locenc:.3}, n̂ {:.0}% of it), δ = 1/n",
        DEFAULT_COUNT_SHARE * 100.0
    );
    println!(
        "| party | attributes | Σ values | ε′ per sketch | k_p | α_min | CPU s | wall s | upload bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut reports: Vec<(Vec<usize>, SketchReport)> = Vec::new();
    let party_list = parties["parties"].as_array().unwrap();
    // One person's hash enters every party's sketches: they are calibrated together.
    let sketches: usize = party_list
        .iter()
        .map(|p| p["attributes"].as_array().unwrap().len())
        .sum();
    let joint = party_list.len() as f64;
    for party in party_list {
        let name = party["name"].as_str().unwrap();
        let attrs: Vec<usize> = party["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| schema.index_of(a["name"].as_str().unwrap()).unwrap())
            .collect();
        let domain: Vec<u32> = attrs.iter().map(|&a| sizes[a] as u32).collect();
        let params = SketchParams::for_budget(
            joint * locenc * (1.0 - DEFAULT_COUNT_SHARE),
            joint * delta,
            sketches,
            t,
            DEFAULT_GAMMA,
            locenc * DEFAULT_COUNT_SHARE,
        )
        .unwrap();
        let records: Vec<(&String, Vec<u32>)> = ids
            .iter()
            .zip(&rows)
            .map(|(id, row)| (id, attrs.iter().map(|&a| row[a]).collect()))
            .collect();
        let (cpu0, wall0) = (cpu_seconds(), Instant::now());
        let report = encode_party(
            &params,
            &sketch_key,
            &domain,
            records,
            &mut StdRng::from_os_rng(),
        )
        .unwrap();
        let bytes = serde_json::to_vec(&report).unwrap().len();
        let wall = wall0.elapsed().as_secs_f64();
        let cpu = cpu_seconds().zip(cpu0).map_or(f64::NAN, |(b, a)| b - a);
        println!(
            "| {name} | {} | {} | {:.3e} | {} | {} | {cpu:.2} | {wall:.2} | {bytes} |",
            attrs.len(),
            domain.iter().sum::<u32>(),
            params.sketch_epsilon(),
            params.phantoms(),
            params.alpha_min(),
        );
        reports.push((attrs, report));
    }
    // Server: every cross-party 2-way marginal.
    let count = pooled_count(&[&reports[0].1, &reports[1].1]).unwrap();
    for combine in [Combine::Quantile, Combine::HarmonicMean] {
        let wall0 = Instant::now();
        let (mut tvds, mut independent, mut sds) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &a) in reports[0].0.iter().enumerate() {
            for (j, &b) in reports[1].0.iter().enumerate() {
                let m = estimate_marginal(
                    &[
                        AttributeRef {
                            report: &reports[0].1,
                            attribute: i,
                        },
                        AttributeRef {
                            report: &reports[1].1,
                            attribute: j,
                        },
                    ],
                    count,
                    combine,
                )
                .unwrap();
                let (ua, ub) = (sizes[a], sizes[b]);
                let mut truth = vec![0.0; ua * ub];
                for row in &rows {
                    truth[row[a] as usize * ub + row[b] as usize] += 1.0 / n as f64;
                }
                let est = m.clipped_frequencies();
                let tvd = |x: &[f64]| {
                    0.5 * x
                        .iter()
                        .zip(&truth)
                        .map(|(e, t)| (e - t).abs())
                        .sum::<f64>()
                };
                tvds.push(tvd(&est));
                // Reference: the product of the true 1-ways (no cross-party information).
                let pa: Vec<f64> = (0..ua)
                    .map(|x| truth[x * ub..(x + 1) * ub].iter().sum())
                    .collect();
                let pb: Vec<f64> = (0..ub)
                    .map(|y| (0..ua).map(|x| truth[x * ub + y]).sum())
                    .collect();
                let product: Vec<f64> = (0..ua * ub).map(|c| pa[c / ub] * pb[c % ub]).collect();
                independent.push(tvd(&product));
                sds.extend(m.count_variances.iter().map(|v| v.sqrt()));
            }
        }
        println!(
            "server CarEst ({combine:?}): {} cross-party 2-way marginals in {:.2} s, mean TVD \
             {:.3} (max {:.3}; product of the true 1-ways {:.3}); mean stated SD per cell {:.0}; \
             n̂ = {:.0} (n = {n})",
            tvds.len(),
            wall0.elapsed().as_secs_f64(),
            tvds.iter().sum::<f64>() / tvds.len() as f64,
            tvds.iter().cloned().fold(0.0, f64::max),
            independent.iter().sum::<f64>() / independent.len() as f64,
            sds.iter().sum::<f64>() / sds.len() as f64,
            count.value,
        );
    }
}
