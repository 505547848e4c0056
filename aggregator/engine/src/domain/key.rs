//! The key of a table of sufficient statistics.

use ldpsyn::factor::cuts_of;
use ldpsyn::mechanism::MechanismKind;
use serde::{Deserialize, Serialize};

use crate::domain::binned::BinnedFactor;

/// Identifies one table of sufficient statistics: the round (PrivIncr round, or 0 for
/// protocols whose tables are pooled across batches), the factor (attribute indices in
/// report order) and the mechanism. Ordered (round, factor, mechanism name) so reductions
/// iterate in one fixed order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableKey {
    /// Round of the task the reports answer.
    pub round: u32,
    /// Factor: attribute indices in report order.
    pub factor: Vec<usize>,
    /// Mechanism of the reports.
    pub mechanism: MechanismKind,
    /// Bin maps of the factor's attributes (factor order; `[]` for full resolution), or empty
    /// when no attribute is binned ([`ldpsyn::factor::bin_count`]): the table's cells are the
    /// product of the bins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
}

impl TableKey {
    /// The table's factor with its bin maps.
    pub fn binned(&self) -> BinnedFactor<'_> {
        BinnedFactor::new(&self.factor, &self.bins)
    }

    /// The bin map of factor attribute `attr` (`[]`: full resolution or not in the factor).
    pub fn bins_of(&self, attr: usize) -> &[u32] {
        self.factor
            .iter()
            .position(|&a| a == attr)
            .map_or(&[], |i| cuts_of(&self.bins, i))
    }

    /// Whether the table holds the attributes of `f` under exactly `f`'s bin maps (it may
    /// hold other attributes too).
    pub fn bins_are(&self, f: BinnedFactor<'_>) -> bool {
        f.attrs()
            .iter()
            .enumerate()
            .all(|(i, &a)| self.bins_of(a) == f.cuts(i))
    }
}

fn kind_rank(k: MechanismKind) -> u8 {
    match k {
        MechanismKind::Grr => 0,
        MechanismKind::Oue => 1,
        MechanismKind::GrrPair => 2,
    }
}

impl Ord for TableKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (
            self.round,
            &self.factor,
            kind_rank(self.mechanism),
            &self.bins,
        )
            .cmp(&(
                other.round,
                &other.factor,
                kind_rank(other.mechanism),
                &other.bins,
            ))
    }
}

impl PartialOrd for TableKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
