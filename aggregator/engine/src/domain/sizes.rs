//! The working domain as a value: every attribute's number of working bins ([`Domain`]),
//! and the cells of a [`Clique`]'s table in it.
//!
//! Layers below this one ([`crate::numeric`], [`crate::graph`]) take the same sizes as a
//! plain `&[usize]` ([`Domain::sizes`]).

use std::ops::Index;

use crate::graph::Clique;

/// The attributes' sizes in the working space: per attribute (by index, in schema order) its
/// number of working bins, i.e. of codes when it is not binned ([`crate::Space::dims`]).
/// Tables over attributes of it are row-major over those sizes, last attribute fastest.
///
/// Not the schema's code sizes ([`crate::Space::code_dims`]) when a `bins: "auto"`
/// attribute is cut into working bins.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Domain(Vec<usize>);

impl Domain {
    /// The domain of attributes of these sizes (attribute `a` has `sizes[a]` bins).
    pub fn new(sizes: Vec<usize>) -> Self {
        Self(sizes)
    }

    /// Number of attributes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no attribute.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bins of attribute `a`. Panics if `a` is not an attribute (`a ≥ len`).
    pub fn size(&self, a: usize) -> usize {
        self.0[a]
    }

    /// Sets attribute `a`'s bins to `n` (a space adapting its working bins).
    pub(crate) fn set_size(&mut self, a: usize, n: usize) {
        self.0[a] = n;
    }

    /// Every attribute's bins, in attribute order (the slice the lower layers take).
    pub fn sizes(&self) -> &[usize] {
        &self.0
    }

    /// The sizes of `attrs`, in the order given (the shape of a table over them).
    /// Panics on an attribute `≥ len`.
    pub fn project(&self, attrs: &[usize]) -> Vec<usize> {
        attrs.iter().map(|&a| self.0[a]).collect()
    }

    /// Cells of the table over `attrs` (the product of their sizes; 1 for none), saturating at
    /// `u64::MAX`. Panics on an attribute `≥ len`.
    pub fn cells(&self, attrs: &[usize]) -> u64 {
        attrs
            .iter()
            .fold(1u64, |acc, &a| acc.saturating_mul(self.0[a] as u64))
    }

    /// As [`Domain::cells`] in `u128`, saturating (200 attributes of 4 bins overflow even
    /// that): for comparisons with a bound that may itself be `u64::MAX`.
    pub fn cells_wide(&self, attrs: impl IntoIterator<Item = usize>) -> u128 {
        attrs
            .into_iter()
            .fold(1u128, |acc, a| acc.saturating_mul(self.0[a] as u128))
    }

    /// Cells of the table over `attrs` as a length, `None` past `usize::MAX`. Panics on an
    /// attribute `≥ len`.
    pub fn checked_cells(&self, attrs: &[usize]) -> Option<usize> {
        attrs
            .iter()
            .try_fold(1usize, |acc, &a| acc.checked_mul(self.0[a]))
    }

    /// Cells of the table over `attrs` as a length: the plain product (callers hold tables of
    /// that many cells, so it fits). Panics on an attribute `≥ len`.
    pub fn table_len(&self, attrs: &[usize]) -> usize {
        attrs.iter().map(|&a| self.0[a]).product()
    }
}

impl From<Vec<usize>> for Domain {
    fn from(sizes: Vec<usize>) -> Self {
        Self(sizes)
    }
}

impl From<&[usize]> for Domain {
    fn from(sizes: &[usize]) -> Self {
        Self(sizes.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Domain {
    fn from(sizes: [usize; N]) -> Self {
        Self(sizes.to_vec())
    }
}

impl Index<usize> for Domain {
    type Output = usize;

    /// Bins of attribute `a` ([`Domain::size`]).
    fn index(&self, a: usize) -> &usize {
        &self.0[a]
    }
}

impl Clique {
    /// Cells of its table in `domain` ([`Domain::cells`], saturating).
    pub fn cells(&self, domain: &Domain) -> u64 {
        domain.cells(self.attrs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_saturate_and_cliques_are_sorted_sets() {
        let d = Domain::from([3, 4, 5]);
        assert_eq!((d.len(), d.size(1), d[2]), (3, 4, 5));
        assert_eq!(d.cells(&[0, 2]), 15);
        assert_eq!(d.cells(&[]), 1);
        assert_eq!(d.project(&[2, 0]), vec![5, 3]);
        let big = Domain::new(vec![1 << 40; 3]);
        assert_eq!(big.cells(&[0, 1, 2]), u64::MAX);
        assert_eq!(big.cells_wide([0, 1]), 1u128 << 80);
        assert_eq!(big.checked_cells(&[0, 1]), None);
        let c = Clique::new([2, 0, 2]);
        assert_eq!(c.attrs(), &[0, 2]);
        assert!(c.contains(&2) && !c.contains(&1));
        assert_eq!(c.cells(&d), 15);
    }
}
