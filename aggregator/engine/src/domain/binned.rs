//! A factor with its bin maps ([`BinnedFactor`]): the attributes a table or task is about and
//! the bins each is counted in.

use ldpsyn::factor::{binned_domain_sizes, cuts_of};

/// A factor (attribute indices, in report order) with the bin maps of its attributes: per
/// attribute, in factor order, the interior cuts of its bins (`[]`: full resolution), or no
/// maps at all when none is binned. A borrowed view of a [`crate::domain::key::TableKey`]'s or a
/// [`crate::domain::task::TaskSpec`]'s `factor` and `bins`; its table is row-major over
/// [`BinnedFactor::sizes_in`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinnedFactor<'a> {
    attrs: &'a [usize],
    bins: &'a [Vec<u32>],
}

impl<'a> BinnedFactor<'a> {
    /// `attrs` under the bin maps `bins` (one per attribute of `attrs`, or none). A list of
    /// another length is kept as given and makes [`BinnedFactor::sizes_in`] `None`.
    pub fn new(attrs: &'a [usize], bins: &'a [Vec<u32>]) -> Self {
        Self { attrs, bins }
    }

    /// `attrs` at full resolution (no bin maps).
    pub fn full(attrs: &'a [usize]) -> Self {
        Self { attrs, bins: &[] }
    }

    /// The attributes, in factor order.
    pub fn attrs(&self) -> &'a [usize] {
        self.attrs
    }

    /// The bin maps as given (empty: none binned).
    pub fn bins(&self) -> &'a [Vec<u32>] {
        self.bins
    }

    /// The cuts of the attribute at position `i` of the factor (`[]`: full resolution).
    pub fn cuts(&self, i: usize) -> &'a [u32] {
        cuts_of(self.bins, i)
    }

    /// The table's shape: each attribute's number of bins (factor order) when the attributes
    /// have `dims` values (per attribute index). `None` for an attribute `≥ dims.len()`, a
    /// list of bin maps of another length than the factor, or an invalid map
    /// ([`ldpsyn::factor::bin_count`]).
    pub fn sizes_in(&self, dims: &[usize]) -> Option<Vec<usize>> {
        if self.attrs.iter().any(|&a| a >= dims.len()) {
            return None;
        }
        let sizes = binned_domain_sizes(dims, self.attrs, self.bins).ok()?;
        Some(self.attrs.iter().map(|&a| sizes[a]).collect())
    }

    /// Cells of the table ([`BinnedFactor::sizes_in`] multiplied), `None` where that is, or
    /// past `usize::MAX`.
    pub fn cells_in(&self, dims: &[usize]) -> Option<usize> {
        self.sizes_in(dims)?
            .iter()
            .try_fold(1usize, |acc, &k| acc.checked_mul(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_bin_maps() {
        let dims = [10, 4, 6];
        let bins = vec![vec![3, 7], vec![]];
        let f = BinnedFactor::new(&[0, 2], &bins);
        assert_eq!(f.sizes_in(&dims), Some(vec![3, 6]));
        assert_eq!(f.cells_in(&dims), Some(18));
        assert_eq!(
            (f.cuts(0), f.cuts(1), f.cuts(5)),
            (&[3, 7][..], &[][..], &[][..])
        );
        assert_eq!(
            BinnedFactor::full(&[1, 2]).sizes_in(&dims),
            Some(vec![4, 6])
        );
        // An attribute outside the domain, a map list of the wrong length, a bad map.
        assert_eq!(BinnedFactor::full(&[3]).sizes_in(&dims), None);
        assert_eq!(BinnedFactor::new(&[0], &bins).sizes_in(&dims), None);
        assert_eq!(BinnedFactor::new(&[1], &[vec![9]]).sizes_in(&dims), None);
    }
}
