//! Cell partitions of a marginal for the Gaussian mechanism: PPSyn's cell merging
//! ("Partition-based differentially private synthetic data generation", §4.2.2, Algorithms 3
//! and 4), built from public bounds instead of the private marginal.
//!
//! A marginal measured cell by cell pays one noise draw per cell, `E|N(0, σ²)| = √(2/π) σ`
//! (PPSyn Theorem 2), whatever the cell holds. Measured over a partition, it pays one draw
//! per group, and loses what the groups hide inside them (Theorem 3: error ≤ reconstruction
//! error + √(2/π) σ |P|). PPSyn builds the partition from the true counts, which makes the
//! partition (and the budget it computes from it) a function of the data that no mechanism
//! covers. Here it is a function of an upper bound on each cell's count computed from what
//! was already released (post-processing; the central loop uses the rarest value's 1-way):
//! - a cell that can hold at least `τ` people is measured alone;
//! - the other cells, in ascending order of their bound (PPSyn Alg. 3 line 1), are cut into
//!   consecutive groups whose bounds sum to about `τ`.
//!
//! The graphical-model fit then spreads each group's measured total over its cells by the
//! model itself (the observation sums the model's marginal within groups,
//! [`crate::fit::pgm::Observation::groups`]), not uniformly as PPSyn's estimate does. A group
//! holds at most about `τ = c σ` people, so it risks about `c` noise draws of error to save
//! `|group| − 1`.

/// A partition of the cells of `bound` (an upper bound on each cell's count, people) by the
/// rule of the module docs with threshold `tau` (people): `groups[i]` is cell `i`'s group,
/// groups numbered in order of their first cell. `None` when no two cells would share a
/// group (`tau ≤ 0`, or fewer than two cells below it): measure the cells themselves.
pub(crate) fn cell_partition(bound: &[f64], tau: f64) -> Option<Vec<u32>> {
    if tau.is_nan() || tau <= 0.0 {
        return None;
    }
    let mut small: Vec<usize> = (0..bound.len()).filter(|&i| bound[i] < tau).collect();
    if small.len() < 2 {
        return None;
    }
    small.sort_by(|&a, &b| bound[a].total_cmp(&bound[b]).then(a.cmp(&b)));
    // Label: singletons by their index, merged groups after them; renumbered below.
    let n = bound.len();
    let mut label: Vec<usize> = (0..n).collect();
    let mut group = n;
    let mut mass = 0.0;
    let mut open = 0usize;
    for &i in &small {
        label[i] = group;
        mass += bound[i].max(0.0);
        open += 1;
        if mass >= tau {
            group += 1;
            mass = 0.0;
            open = 0;
        }
    }
    // A last group far below τ joins the one before it (both hold the smallest cells' tail).
    if open > 0 && group > n && mass < 0.5 * tau {
        for &i in small.iter().rev().take(open) {
            label[i] = group - 1;
        }
    }
    let mut renumber = std::collections::HashMap::new();
    let groups: Vec<u32> = label
        .iter()
        .map(|&l| {
            let next = renumber.len() as u32;
            *renumber.entry(l).or_insert(next)
        })
        .collect();
    (renumber.len() < n).then_some(groups)
}

/// `values` (one per cell) summed within `groups` ([`cell_partition`]; empty: the values
/// themselves).
pub(crate) fn group_sums(values: &[f64], groups: &[u32]) -> Vec<f64> {
    if groups.is_empty() {
        return values.to_vec();
    }
    let k = groups.iter().map(|&g| g as usize + 1).max().unwrap_or(0);
    let mut out = vec![0.0; k];
    for (v, &g) in values.iter().zip(groups) {
        out[g as usize] += v;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_cells_stay_alone_and_small_ones_merge_by_bound() {
        // τ = 10: cells 0 and 3 alone; 1, 2, 4, 5 (2, 9, 1, 4) sorted 4, 1, 5, 2 → masses
        // 1, 3, 7, 16: the first group closes at cell 2 (16 ≥ 10) and holds all four.
        let e = [50.0, 2.0, 9.0, 30.0, 1.0, 4.0];
        let g = cell_partition(&e, 10.0).unwrap();
        assert_eq!(g, vec![0, 1, 1, 2, 1, 1]);
        assert_eq!(group_sums(&e, &g), vec![50.0, 16.0, 30.0]);
        // τ = 3: only cells 4 (1) and 1 (2) are below it, one group of mass 3.
        let g = cell_partition(&e, 3.0).unwrap();
        assert_eq!(g, vec![0, 1, 2, 3, 1, 4]);
    }

    #[test]
    fn a_small_tail_joins_the_group_before_it() {
        // τ = 5: cells 0–2 (2 each) close a group at 6; cell 3 (2 < 2.5) joins it.
        let e = [2.0, 2.0, 2.0, 2.0, 9.0];
        let g = cell_partition(&e, 5.0).unwrap();
        assert_eq!(g, vec![0, 0, 0, 0, 1]);
        // At τ = 3 pairs of them reach it: two groups, no tail.
        assert_eq!(cell_partition(&e, 3.0), Some(vec![0, 0, 1, 1, 2]));
    }

    #[test]
    fn nothing_to_merge_is_none() {
        assert_eq!(cell_partition(&[10.0, 20.0, 1.0], 5.0), None);
        assert_eq!(cell_partition(&[1.0, 2.0], 0.0), None);
        assert_eq!(cell_partition(&[], 5.0), None);
        assert_eq!(group_sums(&[1.0, 2.0], &[]), vec![1.0, 2.0]);
    }

    #[test]
    fn every_cell_has_a_group_and_groups_are_dense() {
        let e: Vec<f64> = (0..200).map(|i| ((i * 37) % 101) as f64 * 0.3).collect();
        for tau in [0.5, 3.0, 10.0, 1e6] {
            let Some(g) = cell_partition(&e, tau) else {
                continue;
            };
            let k = *g.iter().max().unwrap() as usize + 1;
            let mut seen = vec![false; k];
            for &x in &g {
                seen[x as usize] = true;
            }
            assert!(seen.iter().all(|&s| s), "τ {tau}: groups are 0..{k}");
            let sums = group_sums(&e, &g);
            assert!((sums.iter().sum::<f64>() - e.iter().sum::<f64>()).abs() < 1e-9);
            // Every merged group but one holds at least τ/2 of bound.
            let merged_small = (0..k)
                .filter(|&x| g.iter().filter(|&&y| y as usize == x).count() > 1)
                .filter(|&x| sums[x] < 0.5 * tau)
                .count();
            assert!(merged_small <= 1, "τ {tau}");
        }
    }
}
