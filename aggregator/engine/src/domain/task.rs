//! A task: the factor (and mechanism, and bin maps) one device randomizes its record over.

use ldpsyn::factor::binned_codes;
use ldpsyn::mechanism::MechanismKind;
use serde::{Deserialize, Serialize};

use crate::domain::binned::BinnedFactor;

/// Share of a `bins: "auto"` attribute's 1-way tasks measured in sub-bins of its working
/// bins rather than in the working bins ([`crate::domain::space`]): the sub-bin 1-ways give the
/// shape within the bins (histogram recovery), the working ones the bins' totals at less
/// noise. Chosen by a sweep of 0, 0.1, 0.25 and 0.5 on Adult and temporal-match2 at
/// ε ∈ {1, 2, 4, 8} (`benchmarks/sweeps/sub-bin-share.md`): 0.25 cuts temporal-match2's mean
/// KS ninefold at ε = 4 at equal 2-way TVD; on Adult it costs 3.6% of 2-way TVD at ε ≤ 2.
/// Re-swept (0.1, 0.25, 0.4) after `auto`'s round 0 and found point masses: 0.25 stays (0.1
/// nearly doubles temporal-match2's largest KS at ε = 1–4; 0.4 costs Adult 5% at ε = 1).
pub const SUB_BIN_ONE_WAY_SHARE: f64 = 0.25;

/// Sub-bins per working bin of a `bins: "auto"` attribute's sub-bin 1-ways
/// ([`Space::sub_bin_cuts`](crate::domain::space::Space::sub_bin_cuts)); from the same sweep (2, 4 and 8 compared).
pub const SUB_BINS: usize = 8;

/// Most values one attribute may have (schema codes, "missing" included): a 1-way table
/// of it is allocated on its first report.
pub const MAX_ATTRIBUTE_DOMAIN: usize = 1 << 15;

/// Most cells of a pair measured at full resolution (protocols other than `auto`, which bins
/// large pairs, and `independence`): the SDK's factor cap, 2^20.
pub const MAX_PAIR_CELLS: usize = ldpsyn::factor::DEFAULT_MAX_CELLS;

/// A task to hand out: which factor, with which mechanism, for which round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Round (or SamPrivSyn batch) the task belongs to; the service counts accepted reports
    /// per round with it.
    pub round: u32,
    /// Factor: attribute indices in report order.
    pub factor: Vec<usize>,
    /// Mechanism.
    pub mechanism: MechanismKind,
    /// Bin maps of the factor's attributes (factor order, `[]` for full resolution), or
    /// empty when none is binned (docs/design.md "Tasks with bin maps").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bins: Vec<Vec<u32>>,
}

impl TaskSpec {
    /// The task's factor with its bin maps.
    pub fn binned(&self) -> BinnedFactor<'_> {
        BinnedFactor::new(&self.factor, &self.bins)
    }

    /// The codes a device holding `record` (one code per schema attribute) randomizes: its
    /// factor's codes, mapped to bins where the task bins an attribute
    /// ([`ldpsyn::factor::binned_codes`]).
    pub fn codes<'a>(&'a self, record: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
        binned_codes(record, &self.factor, &self.bins)
    }
}
