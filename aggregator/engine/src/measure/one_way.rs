//! The collection's 1-ways: each attribute's Norm-Sub'd combination of every table that
//! holds it.

use ldpsyn::factor::cuts_of;
use ldpsyn::mechanism::norm_sub;

use crate::domain::binned::BinnedFactor;
use crate::measure::tables::Measurements;

/// Norm-Sub'd combination of every table containing each attribute at full resolution;
/// without one, the binned estimate with the most reports spread evenly within its bins;
/// uniform if no table contains the attribute.
pub fn one_way_estimates(ms: &Measurements) -> Vec<Vec<f64>> {
    let dims = ms.domain_sizes();
    (0..dims.len())
        .map(|a| {
            if let Some(c) = ms.combined(&[a]) {
                return norm_sub(&c.frequencies);
            }
            let best = binnings(ms, &[a])
                .into_iter()
                .filter_map(|b| {
                    let c = ms.combined_binned(BinnedFactor::new(&[a], &b), |_| true, None)?;
                    Some((c, b))
                })
                .max_by_key(|(c, _)| c.reports);
            match best {
                Some((c, b)) => {
                    spread_within_bins(&norm_sub(&c.frequencies), cuts_of(&b, 0), dims[a])
                }
                None => vec![1.0 / dims[a] as f64; dims[a]],
            }
        })
        .collect()
}

/// A binned 1-way (`bins` cells under `cuts`) spread evenly over the codes of each bin.
fn spread_within_bins(binned: &[f64], cuts: &[u32], k: usize) -> Vec<f64> {
    let mut width = vec![0usize; binned.len()];
    for c in 0..k as u32 {
        width[ldpsyn::factor::bin_of(c, cuts) as usize] += 1;
    }
    (0..k as u32)
        .map(|c| {
            let b = ldpsyn::factor::bin_of(c, cuts) as usize;
            binned[b] / width[b] as f64
        })
        .collect()
}

/// Every distinct set of bin maps under which some table measured all of `attrs` (one map
/// per attribute of `attrs`, `[]` for full resolution), finest-first by cell count; the full
/// resolution appears as the empty list.
pub fn binnings(ms: &Measurements, attrs: &[usize]) -> Vec<Vec<Vec<u32>>> {
    let dims = ms.domain_sizes();
    let mut out: Vec<Vec<Vec<u32>>> = Vec::new();
    for m in ms.containing(attrs) {
        let b: Vec<Vec<u32>> = attrs.iter().map(|&a| m.key.bins_of(a).to_vec()).collect();
        let b = if b.iter().all(Vec::is_empty) {
            Vec::new()
        } else {
            b
        };
        if !out.contains(&b) {
            out.push(b);
        }
    }
    let cells =
        |b: &Vec<Vec<u32>>| -> usize { BinnedFactor::new(attrs, b).cells_in(dims).unwrap_or(0) };
    out.sort_by(|x, y| cells(y).cmp(&cells(x)).then(x.cmp(y)));
    out
}
