//! Index maps over row-major product domains: projecting a factor's cells onto a subset of
//! its attributes, and summing cells into bins.

use ldpsyn::factor::cuts_of;

/// Map from each factor cell to the target cell, for `target ⊆ factor` (target order).
pub(crate) fn projection_map(factor: &[usize], dims: &[usize], target: &[usize]) -> Vec<usize> {
    let cells: usize = dims.iter().product();
    // Stride of each factor position in the target index (0 if not in target).
    let mut tstride = vec![0usize; factor.len()];
    for (ti, t) in target.iter().enumerate() {
        let fi = factor
            .iter()
            .position(|f| f == t)
            .expect("target ⊆ factor checked by the caller");
        let stride: usize = target[ti + 1..]
            .iter()
            .map(|a| dims[factor.iter().position(|f| f == a).expect("target ⊆ factor")])
            .product();
        tstride[fi] = stride;
    }
    let mut out = Vec::with_capacity(cells);
    let mut codes = vec![0usize; factor.len()];
    for _ in 0..cells {
        out.push(codes.iter().zip(&tstride).map(|(c, s)| c * s).sum());
        // Row-major increment, last fastest.
        for i in (0..codes.len()).rev() {
            codes[i] += 1;
            if codes[i] < dims[i] {
                break;
            }
            codes[i] = 0;
        }
    }
    out
}

/// Map from each cell of a product domain `dims` (row-major) to its cell under the bin maps
/// `bins` (one per attribute, `[]` for full resolution; an empty list: none binned), and the
/// number of binned cells. Panics on an invalid map (callers build maps with
/// [`binned_domain_sizes`](ldpsyn::factor::binned_domain_sizes)).
pub fn coarsen_map(dims: &[usize], bins: &[Vec<u32>]) -> (Vec<usize>, usize) {
    let sizes: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &k)| ldpsyn::factor::bin_count(cuts_of(bins, i), k).expect("valid bin map"))
        .collect();
    let cells: usize = dims.iter().product();
    let mut out = Vec::with_capacity(cells);
    let mut codes = vec![0usize; dims.len()];
    for _ in 0..cells {
        let mut index = 0;
        for (i, (&c, &k)) in codes.iter().zip(&sizes).enumerate() {
            index = index * k + ldpsyn::factor::bin_of(c as u32, cuts_of(bins, i)) as usize;
        }
        out.push(index);
        for i in (0..codes.len()).rev() {
            codes[i] += 1;
            if codes[i] < dims[i] {
                break;
            }
            codes[i] = 0;
        }
    }
    (out, sizes.iter().product())
}

/// `values` over the product domain `dims` summed into the cells of the bin maps `bins`
/// ([`coarsen_map`]): a distribution's binned marginal.
pub fn coarsen(values: &[f64], dims: &[usize], bins: &[Vec<u32>]) -> Vec<f64> {
    if bins.iter().all(Vec::is_empty) {
        return values.to_vec();
    }
    let (map, cells) = coarsen_map(dims, bins);
    let mut out = vec![0.0; cells];
    for (v, &t) in values.iter().zip(&map) {
        out[t] += v;
    }
    out
}

/// The product of two 1-way distributions, row-major `a × b`.
pub(crate) fn outer(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .flat_map(|x| b.iter().map(move |y| x * y))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coarsen_sums_within_bins() {
        // dims (4, 3); attribute 0 in bins {0}, {1, 2, 3}; attribute 1 whole.
        let values: Vec<f64> = (0..12).map(f64::from).collect();
        let (map, cells) = coarsen_map(&[4, 3], &[vec![1], vec![]]);
        assert_eq!(cells, 6);
        assert_eq!(map, vec![0, 1, 2, 3, 4, 5, 3, 4, 5, 3, 4, 5]);
        assert_eq!(
            coarsen(&values, &[4, 3], &[vec![1], vec![]]),
            vec![0.0, 1.0, 2.0, 18.0, 21.0, 24.0]
        );
        assert_eq!(coarsen(&values, &[4, 3], &[]), values);
    }

    #[test]
    fn projection_map_orders() {
        // factor (0, 1) dims (2, 3): target [1] and [1, 0].
        let m = projection_map(&[0, 1], &[2, 3], &[1]);
        assert_eq!(m, vec![0, 1, 2, 0, 1, 2]);
        let m = projection_map(&[0, 1], &[2, 3], &[1, 0]);
        assert_eq!(m, vec![0, 2, 4, 1, 3, 5]);
    }
}
