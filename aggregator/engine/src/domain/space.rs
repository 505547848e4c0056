//! The working domain (docs/design.md "Numeric attributes"). A `bins: "auto"` numeric attribute
//! is encoded by devices on a fine grid (its schema codes); protocols, measurements of
//! several attributes and the graphical model work over its *working bins*, contiguous bins
//! of those codes given by cuts ([`ldpsyn::factor::bin_count`]); its 1-ways are measured on
//! the grid itself. A 1-way measured on the grid enters the fit as its sums over the working
//! bins, and synthesis draws a code within a working bin in proportion to the grid estimate
//! (VertiMRF §6.1's histogram recovery). Every other attribute's working domain is its
//! schema domain, so a schema without `bins: "auto"` gives the identity space and exactly the
//! engine of before.

use std::ops::Range;

use ldpsyn::factor::{bin_count, bin_of};
use ldpsyn::schema::Schema;

use crate::EngineError;
use crate::domain::key::TableKey;
use crate::domain::sizes::Domain;
use crate::domain::task::TaskSpec;

/// Most bin-map cuts one task may carry (the task token binds them).
pub const MAX_TASK_CUTS: usize = 512;

/// Most working cuts of one attribute: half of what a task carries, so that the task of any
/// pair fits one token. A larger factor fits when its cells are within the clique caps (with
/// the default caps the worst case is a pair of attributes at this limit).
pub(crate) const MAX_ATTRIBUTE_CUTS: usize = MAX_TASK_CUTS / 2;

/// Most cells of a sub-bin 1-way ([`Space::sub_bin_cuts`]), so that its bin map stays
/// within [`MAX_TASK_CUTS`] with room for point masses.
pub(crate) const MAX_SUB_BIN_CELLS: usize = 256;

/// The first attribute whose working cuts a task must carry exceed [`MAX_ATTRIBUTE_CUTS`],
/// with their count (a full cut list is the identity and carries none).
fn oversized(cuts: &[Vec<u32>], code_dims: &[usize]) -> Option<(usize, usize)> {
    cuts.iter()
        .zip(code_dims)
        .map(|(c, &k)| if c.len() + 1 == k { 0 } else { c.len() })
        .enumerate()
        .find(|&(_, n)| n > MAX_ATTRIBUTE_CUTS)
}

/// Interior cuts of `bins` equal-width contiguous bins over `k` codes (`[]` when
/// `bins ≥ k`: full resolution); cut i at `round(i·k/bins)`. Data-independent, as VertiMRF
/// §6.1's attribute binning.
pub(crate) fn equal_width_cuts(k: usize, bins: usize) -> Vec<u32> {
    if bins >= k {
        return Vec::new();
    }
    (1..bins)
        .map(|i| ((i * k) as f64 / bins as f64).round() as u32)
        .collect()
}

/// Interior cuts of at most `bins` contiguous bins over the codes of a distribution `p`
/// (one mass per code, summing to about 1) with masses as equal as contiguity allows: each
/// cut is placed where the cumulative mass is closest to an equal share of the mass still
/// to be split, so a code heavier than a share becomes a bin of its own and the rest is
/// shared among the others (`[]` when `bins ≥ p.len()`: full resolution). The maps depend on
/// the data only through `p`, an earlier LDP estimate (docs/design.md "Tasks with bin maps").
pub(crate) fn equal_mass_cuts(p: &[f64], bins: usize) -> Vec<u32> {
    let k = p.len();
    if bins >= k {
        return Vec::new();
    }
    let total: f64 = p.iter().map(|x| x.max(0.0)).sum();
    if total <= 0.0 {
        return equal_width_cuts(k, bins);
    }
    // cum[j]: mass of codes < j.
    let mut cum = Vec::with_capacity(k + 1);
    cum.push(0.0);
    for x in p {
        cum.push(cum.last().unwrap() + x.max(0.0) / total);
    }
    let mut cuts = Vec::with_capacity(bins - 1);
    let mut prev = 0usize;
    for t in 1..bins {
        let left = bins - t + 1; // bins still to form, this one included
        let target = cum[prev] + (1.0 - cum[prev]) / left as f64;
        // Room for this bin (≥ 1 code) and the `left − 1` after it.
        let (lo, hi) = (prev + 1, k - (left - 1));
        let j = (lo..=hi)
            .min_by(|&x, &y| (cum[x] - target).abs().total_cmp(&(cum[y] - target).abs()))
            .unwrap_or(lo);
        cuts.push(j as u32);
        prev = j;
    }
    cuts
}

/// The codes of bin `i` of a bin map `cuts` over `k` codes (`[]`: every code a bin).
pub(crate) fn cell_range(cuts: &[u32], k: usize, i: usize) -> Range<u32> {
    if cuts.is_empty() {
        return i as u32..i as u32 + 1;
    }
    let lo = if i == 0 { 0 } else { cuts[i - 1] };
    lo..cuts.get(i).copied().unwrap_or(k as u32)
}

/// Standard deviations above 0 a fine cell's estimate must be for [`Space::point_masses`]
/// to give it a working bin of its own: one-sided, 4σ has a tail of 3.2·10⁻⁵, so over the
/// at most [`MAX_SUB_BIN_CELLS`] cells of a grid a cell without mass is taken for a point
/// mass with probability below 1% (a union bound), and a false one only costs its attribute
/// one working bin.
pub(crate) const POINT_MASS_Z: f64 = 4.0;

/// Fewest measured cells a working bin must have for [`Space::point_masses`] to take a
/// point mass out of it. Splitting a bin of two cells is its full resolution, which the
/// within-bin recovery already gives (one share to estimate), while the extra bin costs every
/// pair that holds the attribute. Measured with `bench-numeric`
/// (`benchmarks/sweeps/point-masses.md`): without this rule temporal-match2's ordinal
/// columns (21–26 codes in 16 bins) had single codes split from two-code bins and a 2-way
/// TVD 8% above no point masses at ε = 8; with it, at most equal at every ε.
pub(crate) const MIN_POINT_BIN_CELLS: usize = 3;

/// Standard errors of its estimated mass a run of numeric working bins must reach to stay
/// apart ([`Space::merged_unresolved_cuts`]). Derived, not tuned: splitting a run of mass
/// `m` in two adds one more bin's noise, standard error `σ`, to every sum of bins across the
/// split (a CDF value, a range query, the bin totals of a 2-way), while kept together its
/// within-bin recovery can misplace at most about `m/2` across it; apart pays when
/// `m/2 > σ`, i.e. `m > 2σ`. A sweep of 0.5, 1, 2 and 4 over Adult, temporal-match2 and the
/// generated bank table at ε = 1, 2, 4 and 8 (`benchmarks/sweeps/unresolved-bins.md`)
/// confirmed 2.
pub(crate) const UNRESOLVED_BIN_Z: f64 = 2.0;

/// Schema codes ↔ working bins, per attribute.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    code_dims: Vec<usize>,
    /// Per attribute, the cuts of its working bins over its codes (`[]`: every code is a
    /// working bin).
    cuts: Vec<Vec<u32>>,
    /// Per attribute whose working bins were placed by an earlier estimate
    /// ([`Space::with_adapted_cuts`]), the cells that estimate was measured on: its sub-bin
    /// 1-ways keep them, so that every sub-bin table shares one grid.
    sub_cuts: Vec<Option<Vec<u32>>>,
    dims: Domain,
    /// Per attribute, how many leading codes are ordered grid cells (the rest: point masses
    /// and "missing", each a bin of its own).
    grid: Vec<usize>,
    /// Per attribute, the first codes of the working bins carved out as point masses
    /// ([`Space::with_point_mass_codes`]; `None`: not recorded).
    points: Vec<Option<Vec<u32>>>,
}

/// How a table over schema codes reads in the working space ([`Space::to_working`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WorkingKey {
    /// The table's bins are unions of working bins: the same cells, keyed in working codes.
    Binned(TableKey),
    /// A 1-way finer than the working bins: its cells sum into working bins;
    /// `blocks[i]` is the working bin of measured cell i.
    Refined {
        /// The working key (the attribute at full working resolution).
        key: TableKey,
        /// Working bin of each measured cell.
        blocks: Vec<usize>,
    },
}

impl Space {
    /// Every code its own working bin.
    pub fn identity(code_dims: Vec<usize>) -> Self {
        Self {
            cuts: vec![Vec::new(); code_dims.len()],
            sub_cuts: vec![None; code_dims.len()],
            points: vec![None; code_dims.len()],
            dims: Domain::new(code_dims.clone()),
            grid: code_dims.clone(),
            code_dims,
        }
    }

    /// The space of a schema: a `bins: "auto"` attribute's grid cut into its working bins
    /// ([`ldpsyn::schema::Attribute::working_cuts`]: the equal-width bins of a fixed count,
    /// every point mass and "missing" a bin of its own); every other attribute as it is.
    /// Errors: an attribute with more working bins than a pair's task carries (as
    /// [`Space::new`]).
    pub(crate) fn from_schema(schema: &Schema) -> Result<Self, EngineError> {
        let cuts = schema
            .attributes()
            .iter()
            .map(|a| a.working_cuts().unwrap_or_default())
            .collect::<Vec<_>>();
        if let Some((a, count)) = oversized(&cuts, &schema.domain_sizes()) {
            return Err(EngineError::InvalidConfig(format!(
                "`{}` has {} working bins, more than the {} a pair's task carries per \
                 attribute: lower its max_bins or its points",
                schema.attributes()[a].name,
                count + 1,
                MAX_ATTRIBUTE_CUTS + 1
            )));
        }
        let mut space = Self::new(schema.domain_sizes(), cuts)?;
        for (g, a) in space.grid.iter_mut().zip(schema.attributes()) {
            if let (Some(cells), Some(_)) = (a.grid_cells(), a.working_bins()) {
                *g = cells as usize;
            }
        }
        Ok(space)
    }

    /// A space from per-attribute cuts. Errors: a cut list that is not a bin map of its
    /// attribute, or one with more cuts than [`MAX_ATTRIBUTE_CUTS`] that is not the identity.
    pub fn new(code_dims: Vec<usize>, cuts: Vec<Vec<u32>>) -> Result<Self, EngineError> {
        if cuts.len() != code_dims.len() {
            return Err(EngineError::InvalidConfig(
                "one cut list per attribute".into(),
            ));
        }
        let dims = cuts
            .iter()
            .zip(&code_dims)
            .map(|(c, &k)| bin_count(c, k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| EngineError::InvalidConfig(e.to_string()))?;
        // Any pair's task must fit one token; so does any sub-bin 1-way (at most
        // max(MAX_SUB_BIN_CELLS, working bins) cells).
        if let Some((a, count)) = oversized(&cuts, &code_dims) {
            return Err(EngineError::InvalidConfig(format!(
                "the working bins of attribute #{a} need {count} cuts, more than the \
                 {MAX_ATTRIBUTE_CUTS} a pair's task carries per attribute: lower its max_bins or \
                 its point masses"
            )));
        }
        // A full cut list is the identity: keep the canonical empty form.
        let cuts = cuts
            .into_iter()
            .zip(&code_dims)
            .map(|(c, &k)| if c.len() + 1 == k { Vec::new() } else { c })
            .collect();
        Ok(Self {
            grid: code_dims.clone(),
            sub_cuts: vec![None; code_dims.len()],
            points: vec![None; code_dims.len()],
            code_dims,
            cuts,
            dims: Domain::new(dims),
        })
    }

    /// This space with attribute `a`'s working bins cut at `cuts` instead, and its sub-bin
    /// 1-ways measured on the cells of `sub_cuts` (`[]`: every code), of which `cuts` must
    /// be a subset. Errors: not a bin map of the attribute, a cut that is not a cell
    /// boundary of `sub_cuts`, a bin past the grid (a point mass, "missing") merged, or more
    /// cuts than a pair's task carries per attribute ([`MAX_ATTRIBUTE_CUTS`]).
    pub(crate) fn with_adapted_cuts(
        &self,
        a: usize,
        cuts: Vec<u32>,
        sub_cuts: Vec<u32>,
    ) -> Result<Self, EngineError> {
        let bad = |why: &str| {
            Err(EngineError::InvalidConfig(format!(
                "adapted working bins of attribute {a}: {why}"
            )))
        };
        let Some(&k) = self.code_dims.get(a) else {
            return bad("no such attribute");
        };
        let Ok(bins) = bin_count(&cuts, k) else {
            return bad("not a bin map");
        };
        if cuts.is_empty() {
            return bad("no bins");
        }
        if !sub_cuts.is_empty() && !cuts.iter().all(|c| sub_cuts.binary_search(c).is_ok()) {
            return bad("a cut inside a measured cell");
        }
        let grid = self.grid[a] as u32;
        if !(grid.max(1)..k as u32).all(|c| cuts.binary_search(&c).is_ok()) {
            return bad("a bin past the grid is not alone");
        }
        if cuts.len() > MAX_ATTRIBUTE_CUTS {
            return bad("more cuts than a pair's task carries");
        }
        let mut space = self.clone();
        space.cuts[a] = cuts;
        space.dims.set_size(a, bins);
        space.sub_cuts[a] = Some(sub_cuts);
        Ok(space)
    }

    /// The point masses of attribute `a` found in an estimate of its distribution over the
    /// cells of `sub_cuts` (`[]`: every code): `x` unbiased cell estimates with standard
    /// errors `se`. A grid cell is a point mass when its estimate is at least half an equal
    /// share of the grid's working bins (`1/(2·bins)` of the grid's estimated mass: it would
    /// dominate any bin it falls in), [`POINT_MASS_Z`] standard errors above 0 (weekly hours at
    /// 40, a balance at 0), and its bin has at least [`MIN_POINT_BIN_CELLS`] cells. Returns
    /// the codes of each (one cell: made a working bin of its own, its two sides become cuts
    /// and the working cuts stay, so every table measured before still reads in the new
    /// bins); none when the attribute has no working bins, or `x`/`se` do not match the
    /// cells. They depend on the data only through the LDP estimate (post-processing;
    /// docs/design.md "Numeric attributes").
    pub fn point_masses(
        &self,
        a: usize,
        sub_cuts: &[u32],
        x: &[f64],
        se: &[f64],
    ) -> Vec<Range<u32>> {
        let k = self.code_dims[a];
        let Ok(cells) = bin_count(sub_cuts, k) else {
            return Vec::new();
        };
        if self.cuts[a].is_empty() || x.len() != cells || se.len() != cells {
            return Vec::new();
        }
        let range = |i: usize| cell_range(sub_cuts, k, i);
        let grid = self.grid[a] as u32;
        let g = (0..cells).take_while(|&i| range(i).end <= grid).count();
        let bins = (0..self.dims[a])
            .filter(|&b| self.code_range(a, b).end <= grid)
            .count();
        let mass: f64 = x[..g].iter().map(|v| v.max(0.0)).sum();
        if bins < 2 || mass <= 0.0 {
            return Vec::new();
        }
        // Measured cells per working bin.
        let bin_of_cell = |i: usize| bin_of(range(i).start, &self.cuts[a]) as usize;
        let mut cells_in_bin = vec![0usize; self.dims[a]];
        for i in 0..g {
            cells_in_bin[bin_of_cell(i)] += 1;
        }
        (0..g)
            .filter(|&i| {
                x[i] >= 0.5 * mass / bins as f64
                    && x[i] >= POINT_MASS_Z * se[i]
                    && cells_in_bin[bin_of_cell(i)] >= MIN_POINT_BIN_CELLS
            })
            .map(range)
            .collect()
    }

    /// `cuts` of attribute `a` with both sides of every range of `points` added (sorted,
    /// inside the codes).
    pub(crate) fn with_point_cuts(
        &self,
        a: usize,
        cuts: &[u32],
        points: &[Range<u32>],
    ) -> Vec<u32> {
        let k = self.code_dims[a] as u32;
        let mut out: Vec<u32> = cuts
            .iter()
            .copied()
            .chain(points.iter().flat_map(|r| [r.start, r.end]))
            .filter(|&c| c > 0 && c < k)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Marks the working bins of attribute `a` starting at `codes` as point masses found
    /// by [`Space::point_masses`] ([`Space::is_point_mass`]).
    pub(crate) fn with_point_mass_codes(mut self, a: usize, codes: Vec<u32>) -> Self {
        self.points[a] = Some(codes);
        self
    }

    /// Whether working bin `b` of attribute `a` is a point mass carved out of the grid's
    /// ordered bins (not part of its density): one of the bins marked by
    /// [`Space::with_point_mass_codes`], or, for bins adapted without that mark (states
    /// stored before it), a one-code bin among in-grid bins of which one has at least
    /// [`MIN_POINT_BIN_CELLS`] codes.
    pub(crate) fn is_point_mass(&self, a: usize, b: usize) -> bool {
        let r = self.code_range(a, b);
        match &self.points[a] {
            Some(codes) => codes.contains(&r.start),
            None => {
                let grid = self.grid[a] as u32;
                r.len() == 1
                    && (0..self.dims[a])
                        .map(|c| self.code_range(a, c))
                        .any(|c| c.end <= grid && c.len() >= MIN_POINT_BIN_CELLS)
            }
        }
    }

    /// Attribute `a`'s working cuts with runs of unresolved in-grid bins merged: going up the
    /// ordered bins, the next bin joins the current run while the run's estimated mass
    /// (`masses`, negative estimates counted as 0) is below its `resolution` (the largest of
    /// its bins'; both per current working bin), so every run but the grid's last holds at
    /// least its resolution. Bins past the grid (point masses, "missing") stay alone. The
    /// result is a subset of the current cuts, so every table measured in the current bins
    /// still reads in the merged ones. `None` when nothing merges, when the grid would be a
    /// single run (a resolution above its whole mass: too few reports to place any bin), or
    /// the inputs do not match the working bins.
    ///
    /// Why: at small ε a numeric column's sparse tail spans many equal-width bins, each
    /// carrying a full cell of LDP noise: on Adult at ε = 1, fnlwgt's 12 bins above 383k
    /// (5% of the people) sum to a tail of standard error ~0.15, and the fit's
    /// non-negativity turns that noise into excess mass (the synthetic column ~0.1 too heavy
    /// there: most of its Kolmogorov–Smirnov distance). Merged, the tail is one cell of noise,
    /// and the sub-bin recovery spreads it (VertiMRF §6.1's binning, the bins placed by an
    /// earlier LDP estimate).
    pub fn merged_unresolved_cuts(
        &self,
        a: usize,
        masses: &[f64],
        resolution: &[f64],
    ) -> Option<Vec<u32>> {
        let cuts = &self.cuts[a];
        if cuts.is_empty() || masses.len() != self.dims[a] || resolution.len() != self.dims[a] {
            return None;
        }
        let grid = self.grid[a] as u32;
        let in_grid = (0..self.dims[a])
            .take_while(|&b| self.code_range(a, b).end <= grid)
            .count();
        let mut kept = Vec::with_capacity(cuts.len());
        let (mut mass, mut needed) = (0.0, 0.0);
        for (b, &cut) in cuts.iter().enumerate() {
            // `cut` is the lower edge of bin b + 1.
            mass += masses[b].max(0.0);
            needed = f64::max(needed, resolution[b]);
            let inside = b + 1 < in_grid;
            if !inside || mass >= needed {
                kept.push(cut);
                (mass, needed) = (0.0, 0.0);
            }
        }
        // At least two runs of the grid stay (an empty cut list would read as every code).
        let runs = 1 + kept.iter().filter(|&&c| c < grid).count();
        (kept.len() < cuts.len() && runs >= 2).then_some(kept)
    }

    /// How many leading codes of attribute `a` are ordered grid cells: the grid of a
    /// `bins: "auto"` attribute (its point masses and "missing" follow), else every code.
    pub fn grid_cells(&self, a: usize) -> usize {
        self.grid[a]
    }

    /// Sets attribute `a`'s grid to its first `cells` codes (tests; schemas set it).
    #[cfg(test)]
    pub(crate) fn set_grid_cells(&mut self, a: usize, cells: usize) {
        self.grid[a] = cells.min(self.code_dims[a]);
    }

    /// Working domain sizes (what protocols and the model see).
    pub fn dims(&self) -> &[usize] {
        self.dims.sizes()
    }

    /// The working domain ([`Space::dims`] as a [`Domain`]).
    pub fn domain(&self) -> &Domain {
        &self.dims
    }

    /// Schema domain sizes (what devices encode to).
    pub(crate) fn code_dims(&self) -> &[usize] {
        &self.code_dims
    }

    /// The cuts of attribute `a`'s working bins over its codes (`[]`: identity).
    pub fn cuts(&self, a: usize) -> &[u32] {
        &self.cuts[a]
    }

    /// Whether every attribute's working bins are its codes.
    pub(crate) fn is_identity(&self) -> bool {
        self.cuts.iter().all(Vec::is_empty)
    }

    /// The codes of attribute `a` in working bin `bin`.
    pub(crate) fn code_range(&self, a: usize, bin: usize) -> Range<u32> {
        cell_range(&self.cuts[a], self.code_dims[a], bin)
    }

    /// Whether `task` (in working codes) is a 1-way at full working resolution of an
    /// attribute with working bins: one that [`Space::task_to_codes`] may measure on the grid.
    pub(crate) fn refinable(&self, task: &TaskSpec) -> bool {
        matches!(task.factor[..], [a] if !self.cuts[a].is_empty())
            && task.bins.iter().all(Vec::is_empty)
    }

    /// Cuts of attribute `a`'s codes into sub-bins: each working bin split into `per_bin`
    /// equal-width contiguous parts (fewer where it has fewer codes, or where that would
    /// exceed [`MAX_SUB_BIN_CELLS`] in all). `[]` (every code) when that is every code.
    /// Working bins placed by an earlier estimate keep that estimate's cells instead
    /// ([`Space::with_adapted_cuts`]).
    pub(crate) fn sub_bin_cuts(&self, a: usize, per_bin: usize) -> Vec<u32> {
        if let Some(cuts) = &self.sub_cuts[a] {
            return cuts.clone();
        }
        let per_bin = per_bin.min((MAX_SUB_BIN_CELLS / self.dims[a]).max(1));
        let mut cuts = Vec::new();
        for bin in 0..self.dims[a] {
            let r = self.code_range(a, bin);
            if bin > 0 {
                cuts.push(r.start);
            }
            let k = (r.end - r.start) as usize;
            cuts.extend(
                equal_width_cuts(k, per_bin.min(k))
                    .iter()
                    .map(|c| r.start + c),
            );
            if per_bin >= k {
                cuts.extend(r.start + 1..r.end);
            }
        }
        if cuts.len() + 1 == self.code_dims[a] {
            Vec::new()
        } else {
            cuts
        }
    }

    /// A protocol's task (factor and bin maps in working codes) as devices run it: bin maps
    /// over schema codes. With `sub_bins` a [`Space::refinable`] 1-way is measured in that
    /// many sub-bins of each working bin ([`Space::sub_bin_cuts`]), with the better oracle
    /// for that many cells.
    pub(crate) fn task_to_codes(
        &self,
        task: TaskSpec,
        sub_bins: Option<usize>,
        epsilon: ldpsyn::Epsilon,
    ) -> TaskSpec {
        if task.factor.iter().all(|&a| self.cuts[a].is_empty()) {
            return task;
        }
        let working = |i: usize| task.bins.get(i).map_or(&[][..], Vec::as_slice);
        if let Some(per_bin) = sub_bins.filter(|_| self.refinable(&task)) {
            let a = task.factor[0];
            let cuts = self.sub_bin_cuts(a, per_bin);
            let cells = bin_count(&cuts, self.code_dims[a]).expect("cuts within the domain");
            return TaskSpec {
                mechanism: ldpsyn::mechanism::MechanismKind::choose(epsilon, cells),
                bins: if cuts.is_empty() {
                    Vec::new()
                } else {
                    vec![cuts]
                },
                ..task
            };
        }
        let bins = task
            .factor
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let w = &self.cuts[a];
                let b = working(i);
                if w.is_empty() {
                    b.to_vec()
                } else if b.is_empty() {
                    w.clone()
                } else {
                    b.iter().map(|&j| w[j as usize - 1]).collect()
                }
            })
            .collect();
        TaskSpec { bins, ..task }
    }

    /// Attribute `a`'s code cuts `code` in working cuts, if they are unions of working bins.
    fn working_cuts(&self, a: usize, code: &[u32]) -> Option<Vec<u32>> {
        let w = &self.cuts[a];
        if w.is_empty() {
            return Some(code.to_vec());
        }
        if code.is_empty() {
            return None;
        }
        let cuts: Vec<u32> = code
            .iter()
            .map(|c| w.binary_search(c).ok().map(|j| j as u32 + 1))
            .collect::<Option<_>>()?;
        // All working cuts present: the working identity.
        Some(if cuts.len() == w.len() {
            Vec::new()
        } else {
            cuts
        })
    }

    /// How a table keyed over schema codes reads in working codes; `None` for a table of
    /// several attributes whose bins cut through a working bin (no device is given one).
    pub(crate) fn to_working(&self, key: &TableKey) -> Option<WorkingKey> {
        if key.factor.iter().all(|&a| self.cuts[a].is_empty()) {
            return Some(WorkingKey::Binned(key.clone()));
        }
        let bins: Option<Vec<Vec<u32>>> = key
            .factor
            .iter()
            .map(|&a| self.working_cuts(a, key.bins_of(a)))
            .collect();
        if let Some(bins) = bins {
            let bins = if bins.iter().all(Vec::is_empty) {
                Vec::new()
            } else {
                bins
            };
            return Some(WorkingKey::Binned(TableKey {
                bins,
                ..key.clone()
            }));
        }
        let [a] = key.factor[..] else { return None };
        // A 1-way finer than the working bins: every working cut must be one of its cuts.
        let code = key.bins_of(a);
        let w = &self.cuts[a];
        if !code.is_empty() && !w.iter().all(|c| code.binary_search(c).is_ok()) {
            return None;
        }
        let measured = bin_count(code, self.code_dims[a]).ok()?;
        let blocks = (0..measured)
            .map(|i| bin_of(cell_range(code, self.code_dims[a], i).start, w) as usize)
            .collect();
        Some(WorkingKey::Refined {
            key: TableKey {
                bins: Vec::new(),
                ..key.clone()
            },
            blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldpsyn::mechanism::MechanismKind;

    fn key(factor: Vec<usize>, bins: Vec<Vec<u32>>) -> TableKey {
        TableKey {
            round: 0,
            factor,
            mechanism: MechanismKind::Grr,
            bins,
        }
    }

    /// Masses of the bins of `cuts` over `p`.
    fn bin_masses(p: &[f64], cuts: &[u32]) -> Vec<f64> {
        crate::numeric::index::coarsen(p, &[p.len()], &[cuts.to_vec()])
    }

    #[test]
    fn equal_mass_cuts_isolate_heavy_codes_and_balance_the_rest() {
        // A code holding 90%: a bin of its own, the other 10% split in three near-equal bins
        // (equal width would leave it with two light codes, and one bin 0.06).
        let mut p = vec![0.9];
        p.extend([0.01; 10]);
        let cuts = equal_mass_cuts(&p, 4);
        assert_eq!(cuts.len(), 3);
        assert_eq!(cuts[0], 1);
        let m = bin_masses(&p, &cuts);
        assert!(
            m[1..].iter().all(|x| (0.02..=0.04 + 1e-12).contains(x)),
            "{m:?}"
        );
        // Uniform: every bin ⌊k/bins⌋ or ⌈k/bins⌉ codes, as equal width.
        for (k, bins) in [(10, 4), (16, 3), (41, 8), (7, 6)] {
            let cuts = equal_mass_cuts(&vec![1.0 / k as f64; k], bins);
            let mut edges = vec![0u32];
            edges.extend(&cuts);
            edges.push(k as u32);
            for w in edges.windows(2) {
                let width = (w[1] - w[0]) as usize;
                assert!(
                    width == k / bins || width == k.div_ceil(bins),
                    "{k} {bins} {cuts:?}"
                );
            }
        }
        // Always `bins` non-empty contiguous bins, even over zero-mass runs; full resolution
        // and a zero estimate as documented.
        let p = [0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.5, 0.0];
        for bins in 2..8 {
            let cuts = equal_mass_cuts(&p, bins);
            assert_eq!(cuts.len(), bins - 1);
            assert!(cuts.windows(2).all(|w| w[0] < w[1]) && cuts[0] >= 1);
            assert!(*cuts.last().unwrap() < 8);
        }
        assert_eq!(bin_masses(&p, &equal_mass_cuts(&p, 2)), vec![0.5, 0.5]);
        assert!(equal_mass_cuts(&p, 8).is_empty());
        assert_eq!(equal_mass_cuts(&[0.0; 6], 3), equal_width_cuts(6, 3));
    }

    #[test]
    fn tasks_and_tables_translate_both_ways() {
        // Attribute 0: 12 codes in working bins [0,4) [4,8) [8,11) [11]; attribute 1: 3 codes.
        let s = Space::new(vec![12, 3], vec![vec![4, 8, 11], vec![]]).unwrap();
        assert_eq!(s.dims(), &[4, 3]);
        assert_eq!(s.code_range(0, 2), 8..11);
        assert_eq!(s.code_range(1, 2), 2..3);
        let eps = ldpsyn::Epsilon::new(1.0).unwrap();
        let task = |factor: Vec<usize>, bins: Vec<Vec<u32>>| TaskSpec {
            round: 0,
            factor,
            mechanism: MechanismKind::Grr,
            bins,
        };
        // A pair at full working resolution: the working cuts.
        let t = s.task_to_codes(task(vec![1, 0], vec![]), Some(2), eps);
        assert_eq!(t.bins, vec![vec![], vec![4, 8, 11]]);
        // Coarser working bins {0,1} {2,3}: code cut 8.
        let t = s.task_to_codes(task(vec![0, 1], vec![vec![2], vec![]]), Some(2), eps);
        assert_eq!(t.bins, vec![vec![8], vec![]]);
        // A 1-way is measured in sub-bins (every code at ≥ 4 per bin), or in the working bins.
        let t = s.task_to_codes(task(vec![0], vec![]), Some(4), eps);
        assert!(t.bins.is_empty());
        assert_eq!(t.mechanism, MechanismKind::choose(eps, 12));
        let t = s.task_to_codes(task(vec![0], vec![]), Some(2), eps);
        assert_eq!(t.bins, vec![vec![2, 4, 6, 8, 10, 11]]);
        assert_eq!(t.mechanism, MechanismKind::choose(eps, 7));
        let t = s.task_to_codes(task(vec![0], vec![]), None, eps);
        assert_eq!(t.bins, vec![vec![4, 8, 11]]);
        // Back: the pair reads as the working identity, the coarser one as cut 2.
        match s.to_working(&key(vec![1, 0], vec![vec![], vec![4, 8, 11]])) {
            Some(WorkingKey::Binned(k)) => assert!(k.bins.is_empty()),
            other => panic!("{other:?}"),
        }
        match s.to_working(&key(vec![0, 1], vec![vec![8], vec![]])) {
            Some(WorkingKey::Binned(k)) => assert_eq!(k.bins, vec![vec![2], vec![]]),
            other => panic!("{other:?}"),
        }
        // The grid 1-way and the sub-bin one sum into working bins.
        match s.to_working(&key(vec![0], vec![])) {
            Some(WorkingKey::Refined { key, blocks }) => {
                assert!(key.bins.is_empty());
                assert_eq!(blocks, vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3]);
            }
            other => panic!("{other:?}"),
        }
        match s.to_working(&key(vec![0], vec![vec![2, 4, 6, 8, 10, 11]])) {
            Some(WorkingKey::Refined { blocks, .. }) => {
                assert_eq!(blocks, vec![0, 0, 1, 1, 2, 2, 3]);
            }
            other => panic!("{other:?}"),
        }
        // A pair cutting through a working bin is not readable.
        assert_eq!(s.to_working(&key(vec![0, 1], vec![vec![5], vec![]])), None);
    }

    /// Going up the bins, a run grows until its mass reaches its resolution; the grid's last
    /// run may stay below it; bins past the grid never merge; the merged cuts are a subset of
    /// the old ones, so a table measured in the old bins reads as a finer 1-way.
    #[test]
    fn unresolved_bins_merge_into_runs_that_reach_their_resolution() {
        // 20 codes: 9 in-grid bins of 2 codes, then codes 18 and 19 past the grid.
        let mut s = Space::new(vec![20], vec![vec![2, 4, 6, 8, 10, 12, 14, 16, 18, 19]]).unwrap();
        s.set_grid_cells(0, 18);
        let masses = [
            0.30, 0.25, 0.20, 0.10, 0.03, -0.02, 0.05, 0.01, 0.01, 0.04, 0.03,
        ];
        let resolution = [0.04; 11];
        let cuts = s.merged_unresolved_cuts(0, &masses, &resolution).unwrap();
        // Runs: bins 0–3 alone; 4 (0.03) + 5 (−0.02, as 0) + 6 → 0.08; 7 + 8 (0.02, the
        // grid's last run); 18 and 19 past the grid alone.
        assert_eq!(cuts, vec![2, 4, 6, 8, 14, 18, 19]);
        let merged = s.with_adapted_cuts(0, cuts, Vec::new()).unwrap();
        assert_eq!(merged.dims(), &[8]);
        match merged.to_working(&key(vec![0], vec![])) {
            Some(WorkingKey::Refined { blocks, .. }) => {
                let want = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 6, 7];
                assert_eq!(blocks, want);
            }
            other => panic!("{other:?}"),
        }
        // Every bin resolved, or inputs that do not match the bins: nothing merges.
        assert_eq!(s.merged_unresolved_cuts(0, &masses, &[0.0; 11]), None);
        assert_eq!(
            s.merged_unresolved_cuts(0, &masses[..10], &resolution[..10]),
            None
        );
        // A larger resolution (the same masses at fewer reports) merges more.
        let coarser = s.merged_unresolved_cuts(0, &masses, &[0.15; 11]).unwrap();
        assert_eq!(coarser, vec![2, 4, 6, 14, 18, 19]);
        // One above the grid's whole mass would leave it a single run: nothing merges, with
        // or without bins past the grid.
        assert_eq!(s.merged_unresolved_cuts(0, &masses, &[1.5; 11]), None);
        let plain = Space::new(vec![18], vec![vec![2, 4, 6, 8, 10, 12, 14, 16]]).unwrap();
        assert_eq!(
            plain.merged_unresolved_cuts(0, &masses[..9], &[1.5; 9]),
            None
        );
        assert_eq!(
            plain.merged_unresolved_cuts(0, &masses[..9], &[0.6; 9]),
            Some(vec![6])
        );
    }

    /// A carved point mass is marked as such; without marks (states stored before them), a
    /// one-code bin among wide in-grid bins is taken for one.
    #[test]
    fn point_mass_bins_are_known_by_their_marks() {
        let s = Space::new(vec![12], vec![vec![4, 8]]).unwrap();
        // Code 5 carved out of [4, 8): bins [0,4) [4,5) [5,6) [6,8) [8,12).
        let carved = s
            .with_adapted_cuts(0, vec![4, 5, 6, 8], Vec::new())
            .unwrap();
        // Unmarked: every one-code bin among wide ones, the leftover code 4 too.
        assert!(carved.is_point_mass(0, 1) && carved.is_point_mass(0, 2));
        assert!(!carved.is_point_mass(0, 0) && !carved.is_point_mass(0, 3));
        let marked = carved.clone().with_point_mass_codes(0, vec![5]);
        assert!(marked.is_point_mass(0, 2) && !marked.is_point_mass(0, 1));
        // One-code bins of an ordinal column that are not point masses: marked with none.
        let narrow = s
            .with_adapted_cuts(0, vec![1, 2, 3, 4], Vec::new())
            .unwrap()
            .with_point_mass_codes(0, Vec::new());
        assert!((0..narrow.dims()[0]).all(|b| !narrow.is_point_mass(0, b)));
    }

    #[test]
    fn point_masses_become_bins_and_earlier_tables_still_read() {
        // 12 codes in working bins [0,4) [4,8) [8,12), estimated on every code.
        let s = Space::new(vec![12], vec![vec![4, 8]]).unwrap();
        let mut x = vec![0.5 / 11.0; 12];
        x[5] = 0.5;
        let se = vec![0.01; 12];
        // Code 5 holds half the mass, far above noise: a bin of its own.
        let points = s.point_masses(0, &[], &x, &se);
        assert_eq!(points, vec![5..6]);
        let cuts = s.with_point_cuts(0, s.cuts(0), &points);
        assert_eq!(cuts, vec![4, 5, 6, 8]);
        // As heavy but within 4σ of 0, or clear but light (below half a bin's share, 1/6):
        // nothing found.
        assert!(s.point_masses(0, &[], &x, &[0.2; 12]).is_empty());
        let mut light = vec![0.88 / 11.0; 12];
        light[5] = 0.12;
        assert!(s.point_masses(0, &[], &light, &se).is_empty());
        // Wrong lengths.
        assert!(s.point_masses(0, &[], &x[..11], &se[..11]).is_empty());

        let adapted = s.with_adapted_cuts(0, cuts.clone(), Vec::new()).unwrap();
        assert_eq!(adapted.dims(), &[5]);
        assert_eq!(adapted.code_range(0, 2), 5..6);
        // Sub-bin 1-ways keep the cells the estimate was made on (here every code).
        assert!(adapted.sub_bin_cuts(0, 2).is_empty());
        // A 1-way measured in the schema's bins reads as a coarser table of the new ones,
        // one on every code as a finer one.
        match adapted.to_working(&key(vec![0], vec![vec![4, 8]])) {
            Some(WorkingKey::Binned(k)) => assert_eq!(k.bins, vec![vec![1, 4]]),
            other => panic!("{other:?}"),
        }
        match adapted.to_working(&key(vec![0], vec![])) {
            Some(WorkingKey::Refined { blocks, .. }) => {
                assert_eq!(blocks, vec![0, 0, 0, 0, 1, 2, 3, 3, 4, 4, 4, 4]);
            }
            other => panic!("{other:?}"),
        }
        // Refused: a cut inside a measured cell; not a bin map; a code past the grid merged.
        assert!(
            s.with_adapted_cuts(0, vec![4, 5, 8], vec![2, 4, 6, 8, 10])
                .is_err()
        );
        assert!(s.with_adapted_cuts(0, vec![8, 4], Vec::new()).is_err());
        assert!(s.with_adapted_cuts(0, vec![12], Vec::new()).is_err());
        let mut with_point = Space::new(vec![12], vec![vec![4, 8, 11]]).unwrap();
        with_point.set_grid_cells(0, 11);
        assert!(
            with_point
                .with_adapted_cuts(0, vec![4, 8], Vec::new())
                .is_err()
        );
        // Refused: more cuts than a pair's task carries per attribute (300 > 256).
        let full = Space::new(vec![1024, 1024], vec![equal_width_cuts(1024, 250); 2]).unwrap();
        assert!(
            full.with_adapted_cuts(0, (1..=300).collect(), Vec::new())
                .is_err()
        );
        assert!(
            full.with_adapted_cuts(0, (1..=250).collect(), Vec::new())
                .is_ok()
        );
        // Codes past the grid are bins already: never searched for point masses.
        let mut x = vec![0.1 / 11.0; 12];
        x[11] = 0.9;
        assert!(with_point.point_masses(0, &[], &x, &se).is_empty());
    }

    #[test]
    fn schema_space_gives_points_and_missing_their_own_bins() {
        let schema: Schema = serde_json::from_str(
            r#"{"attributes": [
                {"name": "h", "type": "numeric", "min": 1, "max": 99, "bins": "auto",
                 "integer": true, "points": [40], "missing": "category"},
                {"name": "c", "type": "categorical", "labels": ["a", "b"]}]}"#,
        )
        .unwrap();
        // 99 whole numbers, the point 40, missing: 101 codes; 16 working bins + 2.
        assert_eq!(schema.domain_sizes(), vec![101, 2]);
        let s = Space::from_schema(&schema).unwrap();
        assert_eq!(s.dims(), &[18, 2]);
        assert_eq!(s.code_range(0, 16), 99..100);
        assert_eq!(s.code_range(0, 17), 100..101);
        assert!(s.cuts(1).is_empty());
    }

    /// The task cut limit holds per attribute (any pair fits one token), not over the whole
    /// schema: 40 `bins: "auto"` attributes of 16 working bins (600 cuts in all) make a
    /// space; one attribute of 300 bins is refused with its name.
    #[test]
    fn working_cut_limit_is_per_attribute() {
        let numeric = |name: String, max_bins: u32| {
            serde_json::json!({"name": name, "type": "numeric", "min": 0, "max": 1000,
                "bins": "auto", "integer": true, "max_bins": max_bins})
        };
        let wide: Schema = serde_json::from_value(serde_json::json!({
            "attributes": (0..40).map(|i| numeric(format!("x{i}"), 16)).collect::<Vec<_>>()
        }))
        .unwrap();
        let s = Space::from_schema(&wide).unwrap();
        assert_eq!(s.dims(), &[16; 40][..]);
        let fine: Schema = serde_json::from_value(serde_json::json!({
            "attributes": [numeric("ok".into(), 16), numeric("income".into(), 300)]
        }))
        .unwrap();
        let e = Space::from_schema(&fine).unwrap_err().to_string();
        assert!(e.contains("`income` has 300 working bins"), "{e}");
        assert!(Space::new(vec![1024], vec![(1..=257).collect()]).is_err());
        // Every code its own bin is the identity: no cuts for a task to carry.
        assert!(
            Space::new(vec![1024], vec![(1..1024).collect()])
                .unwrap()
                .is_identity()
        );
    }

    #[test]
    fn fixed_bin_schemas_give_the_identity() {
        let schema: Schema = serde_json::from_str(
            r#"{"attributes": [
                {"name": "h", "type": "numeric", "min": 1, "max": 99, "bins": 8},
                {"name": "c", "type": "categorical", "labels": ["a", "b"]}]}"#,
        )
        .unwrap();
        assert!(Space::from_schema(&schema).unwrap().is_identity());
    }
}
