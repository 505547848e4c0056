//! Factors: ordered sets of attributes reported together, and their product domain.

/// Default cap on the number of cells of a factor's product domain (2^20).
pub const DEFAULT_MAX_CELLS: usize = 1 << 20;

/// Why a factor cannot be built or an index is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FactorError {
    /// A factor needs at least one attribute.
    #[error("a factor needs at least one attribute")]
    Empty,
    /// The same attribute appears twice.
    #[error("attribute #{0} appears twice in the factor")]
    DuplicateAttribute(usize),
    /// An attribute index beyond the schema.
    #[error("attribute #{index} does not exist (schema has {len})")]
    UnknownAttribute {
        /// The index.
        index: usize,
        /// Number of attributes in the schema.
        len: usize,
    },
    /// The product domain overflows `usize` or exceeds the cap.
    #[error("product domain exceeds the cap of {cap} cells")]
    TooManyCells {
        /// The cap in force.
        cap: usize,
    },
    /// A code or index out of range, or the wrong number of codes.
    #[error("index out of range: {0}")]
    OutOfRange(String),
    /// A bin map that is not strictly increasing cut points inside the domain, or a list of
    /// bin maps that does not match the factor.
    #[error("invalid bin map: {0}")]
    InvalidBinMap(String),
}

/// An ordered set of attributes (indices into the schema) and their domain sizes.
///
/// Its product domain has `cells() = Π dims` values, indexed row-major: the last attribute
/// varies fastest. A pair is a factor of size 2.
///
/// ```
/// use ldpsyn::factor::Factor;
/// let f = Factor::new(vec![2, 0], &[3, 5, 4], 1 << 20).unwrap(); // attributes 2 then 0
/// assert_eq!(f.dims(), &[4, 3]);
/// assert_eq!(f.ravel(&[1, 2]).unwrap(), 5);
/// assert_eq!(f.unravel(5).unwrap(), vec![1, 2]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Factor {
    attributes: Vec<usize>,
    dims: Vec<usize>,
    cells: usize,
}

impl Factor {
    /// A factor over `attributes` (in this order) of a schema whose domain sizes are
    /// `domain_sizes`, with at most `max_cells` cells.
    ///
    /// Errors: [`FactorError`] for an empty or repeated list, an unknown attribute, or a
    /// product domain that overflows or exceeds `max_cells`.
    pub fn new(
        attributes: Vec<usize>,
        domain_sizes: &[usize],
        max_cells: usize,
    ) -> Result<Self, FactorError> {
        if attributes.is_empty() {
            return Err(FactorError::Empty);
        }
        let mut dims = Vec::with_capacity(attributes.len());
        let mut cells: usize = 1;
        for (i, &a) in attributes.iter().enumerate() {
            if attributes[..i].contains(&a) {
                return Err(FactorError::DuplicateAttribute(a));
            }
            let k = *domain_sizes.get(a).ok_or(FactorError::UnknownAttribute {
                index: a,
                len: domain_sizes.len(),
            })?;
            cells = cells
                .checked_mul(k)
                .filter(|&c| c <= max_cells)
                .ok_or(FactorError::TooManyCells { cap: max_cells })?;
            dims.push(k);
        }
        Ok(Self {
            attributes,
            dims,
            cells,
        })
    }

    /// The attribute indices, in factor order.
    pub fn attributes(&self) -> &[usize] {
        &self.attributes
    }

    /// Domain size of each attribute, in factor order.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of cells of the product domain.
    pub fn cells(&self) -> usize {
        self.cells
    }

    /// Row-major index of `codes` (one per factor attribute, in factor order).
    pub fn ravel(&self, codes: &[u32]) -> Result<usize, FactorError> {
        if codes.len() != self.dims.len() {
            return Err(FactorError::OutOfRange(format!(
                "{} codes for a factor of {} attributes",
                codes.len(),
                self.dims.len()
            )));
        }
        let mut index = 0;
        for (&c, &k) in codes.iter().zip(&self.dims) {
            if c as usize >= k {
                return Err(FactorError::OutOfRange(format!(
                    "code {c} >= domain size {k}"
                )));
            }
            // Cannot overflow: index < cells <= max_cells.
            index = index * k + c as usize;
        }
        Ok(index)
    }

    /// Row-major index of a full record's codes (one per schema attribute).
    pub fn ravel_record(&self, record_codes: &[u32]) -> Result<usize, FactorError> {
        let codes: Vec<u32> =
            self.attributes
                .iter()
                .map(|&a| {
                    record_codes.get(a).copied().ok_or_else(|| {
                        FactorError::OutOfRange(format!("record has no attribute #{a}"))
                    })
                })
                .collect::<Result<_, _>>()?;
        self.ravel(&codes)
    }

    /// Inverse of [`Factor::ravel`].
    pub fn unravel(&self, mut index: usize) -> Result<Vec<u32>, FactorError> {
        if index >= self.cells {
            return Err(FactorError::OutOfRange(format!(
                "index {index} >= {} cells",
                self.cells
            )));
        }
        let mut codes = vec![0u32; self.dims.len()];
        for (c, &k) in codes.iter_mut().zip(&self.dims).rev() {
            *c = (index % k) as u32;
            index /= k;
        }
        Ok(codes)
    }
}

/// Most bins one attribute's bin map may have (the token carries each cut in 16 bits).
pub const MAX_BINS: usize = 1 << 15;

/// Number of bins of a bin map over an attribute of `domain` codes (docs/design.md "Tasks with
/// bin maps"). A bin map is given by its interior cut points `cuts`, strictly increasing in
/// `1..domain`: bin 0 holds codes `0..cuts[0]`, bin i codes `cuts[i−1]..cuts[i]`, the last bin
/// codes `cuts[m−1]..domain`. No cuts is the identity map (every code its own bin), so a map
/// has `cuts.len() + 1` bins, or `domain` for the identity.
///
/// ```
/// use ldpsyn::factor::{bin_count, bin_of};
/// assert_eq!(bin_count(&[3, 10], 16).unwrap(), 3);
/// assert_eq!(bin_count(&[], 16).unwrap(), 16);
/// assert_eq!((bin_of(2, &[3, 10]), bin_of(3, &[3, 10]), bin_of(15, &[3, 10])), (0, 1, 2));
/// assert!(bin_count(&[3, 3], 16).is_err() && bin_count(&[0], 16).is_err());
/// ```
///
/// Errors: [`FactorError::InvalidBinMap`] for cuts that are not strictly increasing within
/// `1..domain`, or more than [`MAX_BINS`] bins.
pub fn bin_count(cuts: &[u32], domain: usize) -> Result<usize, FactorError> {
    if cuts.is_empty() {
        return Ok(domain);
    }
    let increasing = cuts.windows(2).all(|w| w[0] < w[1]);
    let inside = cuts[0] >= 1 && (cuts[cuts.len() - 1] as usize) < domain;
    if !increasing || !inside || cuts.len() >= MAX_BINS {
        return Err(FactorError::InvalidBinMap(format!(
            "cuts must be strictly increasing within 1..{domain}, at most {} of them",
            MAX_BINS - 1
        )));
    }
    Ok(cuts.len() + 1)
}

/// The bin of `code` under the bin map `cuts` ([`bin_count`]); the code itself for the
/// identity map.
pub fn bin_of(code: u32, cuts: &[u32]) -> u32 {
    if cuts.is_empty() {
        code
    } else {
        cuts.partition_point(|&c| c <= code) as u32
    }
}

/// The cuts of factor attribute `i` in the list of bin maps `bins` (one per factor attribute,
/// or empty when none is binned): `[]`, the identity, when `bins` has no map at `i`.
pub fn cuts_of(bins: &[Vec<u32>], i: usize) -> &[u32] {
    bins.get(i).map_or(&[], Vec::as_slice)
}

/// The codes a device holding `record` (one code per schema attribute) reports for `factor`
/// under the bin maps `bins` ([`cuts_of`]): each factor attribute's code mapped to its bin, in
/// factor order. Panics if a factor attribute is beyond `record`.
pub fn binned_codes<'a>(
    record: &'a [u32],
    factor: &'a [usize],
    bins: &'a [Vec<u32>],
) -> impl Iterator<Item = u32> + 'a {
    factor
        .iter()
        .enumerate()
        .map(move |(i, &a)| bin_of(record[a], cuts_of(bins, i)))
}

/// The schema's `domain_sizes` with each attribute of `factor` replaced by its number of
/// bins under `bins` (one bin map per factor attribute, in factor order; empty: no maps).
/// Errors: [`FactorError::InvalidBinMap`] for a list of another length than the factor or an
/// invalid map, [`FactorError::UnknownAttribute`] for an attribute beyond the schema.
pub fn binned_domain_sizes(
    domain_sizes: &[usize],
    factor: &[usize],
    bins: &[Vec<u32>],
) -> Result<Vec<usize>, FactorError> {
    let mut sizes = domain_sizes.to_vec();
    if bins.is_empty() {
        return Ok(sizes);
    }
    if bins.len() != factor.len() {
        return Err(FactorError::InvalidBinMap(format!(
            "{} bin maps for a factor of {} attributes",
            bins.len(),
            factor.len()
        )));
    }
    for (&a, cuts) in factor.iter().zip(bins) {
        let k = *domain_sizes.get(a).ok_or(FactorError::UnknownAttribute {
            index: a,
            len: domain_sizes.len(),
        })?;
        sizes[a] = bin_count(cuts, k)?;
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn errors() {
        assert_eq!(Factor::new(vec![], &[2], 10), Err(FactorError::Empty));
        assert_eq!(
            Factor::new(vec![0, 0], &[2], 10),
            Err(FactorError::DuplicateAttribute(0))
        );
        assert!(matches!(
            Factor::new(vec![3], &[2], 10),
            Err(FactorError::UnknownAttribute { .. })
        ));
        assert_eq!(
            Factor::new(vec![0, 1], &[4, 4], 15),
            Err(FactorError::TooManyCells { cap: 15 })
        );
        assert_eq!(
            Factor::new(vec![0, 1, 2], &[usize::MAX / 2, 3, 2], usize::MAX),
            Err(FactorError::TooManyCells { cap: usize::MAX })
        );
        let f = Factor::new(vec![1, 0], &[4, 4], 16).unwrap();
        assert!(f.ravel(&[4, 0]).is_err());
        assert!(f.ravel(&[1]).is_err());
        assert!(f.unravel(16).is_err());
        assert_eq!(f.ravel_record(&[3, 1]).unwrap(), 7);
    }

    /// Every code lands in exactly the bin its cuts say, bins are contiguous and cover the
    /// domain, and bad maps are refused.
    #[test]
    fn bin_maps() {
        let cuts = [1u32, 4, 9];
        let bins: Vec<u32> = (0..12).map(|c| bin_of(c, &cuts)).collect();
        assert_eq!(bins, vec![0, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3]);
        assert_eq!(bin_count(&cuts, 12).unwrap(), 4);
        for bad in [&[4u32, 1][..], &[0], &[12], &[3, 3]] {
            assert!(
                matches!(bin_count(bad, 12), Err(FactorError::InvalidBinMap(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            binned_domain_sizes(&[12, 5, 7], &[2, 0], &[vec![], cuts.to_vec()]).unwrap(),
            vec![4, 5, 7]
        );
        assert!(binned_domain_sizes(&[12, 5], &[0, 1], &[vec![]]).is_err());
        assert!(binned_domain_sizes(&[12, 5], &[0, 1], &[vec![], vec![5]]).is_err());
    }

    proptest! {
        #[test]
        fn ravel_unravel_round_trip(dims in proptest::collection::vec(1usize..9, 1..6), seed in any::<u64>()) {
            let attrs: Vec<usize> = (0..dims.len()).rev().collect();
            let f = Factor::new(attrs, &dims, DEFAULT_MAX_CELLS).unwrap();
            let index = (seed as usize) % f.cells();
            let codes = f.unravel(index).unwrap();
            prop_assert_eq!(f.ravel(&codes).unwrap(), index);
        }
    }
}
