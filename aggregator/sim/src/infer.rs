//! `ldpsyn-aggregator schema infer`: proposes a schema from a CSV file's header and a look at
//! its values — categorical or numeric, labels, the integer flag, bounds, missing markers,
//! point masses, and an asinh scale for heavy-tailed numeric columns.
//!
//! A schema is public: its labels and bounds reach every device and every analyst, so they
//! should come from domain knowledge (a code book, a form's allowed range), not from the
//! private data. The proposal is a starting point to edit: bounds are widened outward to a
//! round step so the file's exact extremes are not printed, and the command says so.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use clap::Parser;
use ldpsyn::schema::{
    Attribute, AttributeKind, DEFAULT_MAX_BINS, InvalidPolicy, MissingPolicy, NumericBins,
    NumericScale, OutOfRangePolicy, Schema, SchemaError,
};

/// Strings read as "missing" when they fill a whole cell (after trimming).
const MISSING_MARKERS: [&str; 8] = ["", "?", "NA", "N/A", "NaN", "null", "NULL", "None"];

/// `schema infer` options.
#[derive(Debug, Clone, Parser)]
pub struct InferConfig {
    /// CSV file with a header row.
    #[arg(long)]
    pub data: PathBuf,
    /// A column with at most this many distinct values is categorical (numbers too: e.g. a
    /// 1–16 education code); a numeric column with more is numeric; a text column with more
    /// is left out (an identifier or free text).
    #[arg(long, default_value_t = 32)]
    pub max_categories: usize,
    /// Working bins of each numeric attribute (fewer for an integer attribute with a smaller
    /// range): its `max_bins` under `bins: "auto"`, or its fixed count with `--fixed-bins`.
    #[arg(long, default_value_t = DEFAULT_MAX_BINS)]
    pub bins: u32,
    /// Propose a fixed number of equal-width bins (`"bins": n`, decoded within a bin without
    /// a fine estimate) instead of `"bins": "auto"` (devices report on a fine grid and the
    /// download recovers values within a bin, e.g. spikes at round numbers).
    #[arg(long)]
    pub fixed_bins: bool,
    /// Rows read at most (the rest of the file is not looked at).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_rows: usize,
}

/// Errors of [`infer_schema`].
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    /// The file cannot be read as CSV.
    #[error("cannot read {path}: {source}")]
    Csv {
        /// The file.
        path: String,
        /// Why.
        source: csv::Error,
    },
    /// No column could become an attribute.
    #[error("no column of {0} can be an attribute (empty file, or only identifiers)")]
    NoAttribute(String),
    /// The header is one column holding another separator: ldpsyn reads comma-separated
    /// files only (devices, the simulator and party uploads alike).
    #[error(
        "{path} looks separated by {separator:?}, not commas: its header is one column \
         ({header:?}); save it as comma-separated CSV"
    )]
    Separator {
        /// The file.
        path: String,
        /// The separator its header holds.
        separator: char,
        /// The header as read.
        header: String,
    },
    /// The proposal is not a valid schema (a bug, or a header with duplicate names).
    #[error("the proposed schema is invalid: {0}")]
    Schema(#[from] SchemaError),
}

/// What one pass over a column found.
#[derive(Debug, Default)]
struct ColumnStats {
    /// Distinct non-missing values with their counts (stops growing past the cap).
    counts: HashMap<String, u64>,
    overflow: bool,
    /// Distinct non-missing values, up to [`MAX_COUNTED_DISTINCT`] (for the warning of a
    /// text column left out: the `--max-categories` that keeps it).
    distinct: HashSet<String>,
    numeric: bool,
    integer: bool,
    min: f64,
    max: f64,
    present: u64,
    markers: Vec<String>,
    /// Numeric values per twentieth of a decade of |x| (`floor(20·log10 |x|)`), and zeros.
    magnitudes: BTreeMap<i32, u64>,
    zeros: u64,
}

/// Distinct values counted exactly per column; a text column with more is reported as
/// "more than" this many.
const MAX_COUNTED_DISTINCT: usize = 1000;

/// Steps per decade of [`ColumnStats::magnitudes`].
const MAGNITUDE_STEPS: f64 = 20.0;

impl ColumnStats {
    /// `{"asinh": unit}` for a numeric column over `[min, max]` in `bins` bins when half of
    /// its rows lie within half a linear bin of 0 (median |x| below `(max − min)/(2·bins)`:
    /// the bulk in a small part of the range, which equal widths would give one or two
    /// bins), with `unit` the power of ten at or below the median nonzero |x| (cells about
    /// linear up to there, logarithmic beyond); else linear.
    fn scale(&self, min: f64, max: f64, bins: u32) -> NumericScale {
        let nonzero: u64 = self.magnitudes.values().sum();
        let median_step = |skip: u64, total: u64| -> Option<i32> {
            let mut seen = skip;
            for (&step, &n) in &self.magnitudes {
                seen += n;
                if 2 * seen >= total {
                    return Some(step);
                }
            }
            None
        };
        let magnitude = |step: i32| 10f64.powf(f64::from(step) / MAGNITUDE_STEPS);
        let all = nonzero + self.zeros;
        // |x| of the median row (zeros first).
        let median = if 2 * self.zeros >= all {
            0.0
        } else {
            median_step(self.zeros, all).map_or(0.0, magnitude)
        };
        if nonzero == 0 || median >= (max - min) / (2.0 * f64::from(bins)) {
            return NumericScale::Linear;
        }
        let unit = median_step(0, nonzero).map_or(1.0, |step| {
            10f64.powf((f64::from(step) / MAGNITUDE_STEPS).floor())
        });
        NumericScale::Asinh(unit)
    }

    fn new() -> Self {
        Self {
            numeric: true,
            integer: true,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            ..Self::default()
        }
    }

    fn add(&mut self, raw: &str, cap: usize) {
        let v = raw.trim();
        if MISSING_MARKERS.contains(&v) {
            if !self.markers.iter().any(|m| m == v) {
                self.markers.push(v.to_owned());
            }
            return;
        }
        self.present += 1;
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() => {
                self.min = self.min.min(x);
                self.max = self.max.max(x);
                self.integer &= x.fract() == 0.0;
                if x == 0.0 {
                    self.zeros += 1;
                } else {
                    let step = (MAGNITUDE_STEPS * x.abs().log10()).floor() as i32;
                    *self.magnitudes.entry(step).or_insert(0) += 1;
                }
            }
            _ => self.numeric = false,
        }
        if self.distinct.len() < MAX_COUNTED_DISTINCT || self.distinct.contains(v) {
            self.distinct.insert(v.to_owned());
        } else {
            // One past the cap marks "more than MAX_COUNTED_DISTINCT".
            self.distinct.insert(String::from("\u{0}more"));
        }
        if let Some(c) = self.counts.get_mut(v) {
            *c += 1;
        } else if self.counts.len() <= cap {
            self.counts.insert(v.to_owned(), 1);
        } else {
            // Past the cap the map becomes a Misra–Gries summary: it still holds every value
            // with more than 1/(cap + 2) of the rows (the candidates for point masses).
            self.overflow = true;
            self.counts.retain(|_, c| {
                *c -= 1;
                *c > 0
            });
        }
    }
}

/// Most point masses proposed per numeric attribute.
const MAX_POINTS: usize = 4;

/// A numeric column's proposal before the point masses are chosen.
#[derive(Debug)]
struct NumericPlan {
    column: usize,
    min: f64,
    max: f64,
    bins: u32,
    integer: bool,
    /// Heavy values of the first pass, with exact counts after the second.
    candidates: Vec<(f64, u64)>,
    bin_rows: Vec<u64>,
    rows: u64,
    /// What the bins are equal-width in ([`ColumnStats::scale`]).
    scale: NumericScale,
}

impl NumericPlan {
    fn bin_of(&self, x: f64) -> usize {
        self.scale.bin(x, self.min, self.max, self.bins) as usize
    }

    fn count(&mut self, raw: &str) {
        let Ok(x) = raw.trim().parse::<f64>() else {
            return;
        };
        self.rows += 1;
        let b = self.bin_of(x);
        self.bin_rows[b] += 1;
        if let Some(c) = self.candidates.iter_mut().find(|c| c.0 == x) {
            c.1 += 1;
        }
    }

    /// Values that hold more rows than an average bin and at least half of their own bin's
    /// rows, in a bin that has other values to hold (then the bin would smear them out):
    /// the largest [`MAX_POINTS`], in increasing order.
    fn points(&self) -> Vec<f64> {
        let (t_min, t_max) = (self.scale.forward(self.min), self.scale.forward(self.max));
        let width = (t_max - t_min) / f64::from(self.bins);
        let mut heavy: Vec<(f64, u64)> = self
            .candidates
            .iter()
            .copied()
            .filter(|&(x, c)| {
                let b = self.bin_of(x);
                let lo = self.scale.inverse(t_min + width * b as f64);
                let hi = self.scale.inverse(t_min + width * (b + 1) as f64);
                let roomy = !self.integer || hi.ceil() - lo.ceil() >= 2.0;
                roomy
                    && c as f64 * f64::from(self.bins) >= self.rows as f64
                    && 2 * c >= self.bin_rows[b]
            })
            .collect();
        heavy.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.total_cmp(&b.0)));
        heavy.truncate(MAX_POINTS);
        let mut points: Vec<f64> = heavy.into_iter().map(|(x, _)| x).collect();
        points.sort_by(f64::total_cmp);
        points
    }
}

/// `[lo, hi]` widened outward to multiples of half the range's decimal order (5 for a range
/// of 73, 500,000 for 1.5 million), so the proposal does not print the file's exact
/// extremes (a constant column gets ±1).
fn round_bounds(min: f64, max: f64) -> (f64, f64) {
    let range = max - min;
    if range <= 0.0 {
        return (min - 1.0, max + 1.0);
    }
    let step = 10f64.powf(range.log10().floor()) / 2.0;
    let lo = (min / step).floor() * step;
    let hi = (max / step).ceil() * step;
    (lo, if hi > lo { hi } else { lo + step })
}

/// Proposes a schema for the CSV file at `path` (module docs); returns it with the warnings
/// to show the operator. Errors: [`InferError`].
pub fn infer_schema(path: &Path, cfg: &InferConfig) -> Result<(Schema, Vec<String>), InferError> {
    let csv_err = |source| InferError::Csv {
        path: path.display().to_string(),
        source,
    };
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_path(path)
        .map_err(csv_err)?;
    let header: Vec<String> = reader
        .headers()
        .map_err(csv_err)?
        .iter()
        .map(|h| h.trim().to_owned())
        .collect();
    if let [only] = header.as_slice()
        && let Some(separator) = [';', '\t', '|'].into_iter().find(|&c| only.contains(c))
    {
        return Err(InferError::Separator {
            path: path.display().to_string(),
            separator,
            header: only.clone(),
        });
    }
    let mut stats: Vec<ColumnStats> = header.iter().map(|_| ColumnStats::new()).collect();
    for record in reader.records().take(cfg.max_rows) {
        let record = record.map_err(csv_err)?;
        for (i, s) in stats.iter_mut().enumerate() {
            s.add(record.get(i).unwrap_or(""), cfg.max_categories);
        }
    }
    let mut warnings = vec![
        "labels and bounds below were read from the data: a schema is public (every device \
         and analyst sees it), so replace them with values from domain knowledge before \
         collecting"
            .to_owned(),
    ];
    // First the kinds; numeric attributes get their point masses after a second pass.
    let mut attributes = Vec::new();
    let mut plans: Vec<(usize, NumericPlan)> = Vec::new();
    for (column, (name, s)) in header.iter().zip(stats).enumerate() {
        if s.present == 0 {
            warnings.push(format!("`{name}`: no values, left out"));
            continue;
        }
        // The empty field stays a marker: synthetic downloads write missing values as empty
        // fields, and a schema must read its own synthetic data back.
        let (missing, missing_markers) = if s.markers.is_empty() {
            (MissingPolicy::Reject, vec![String::new()])
        } else {
            let mut markers = s.markers.clone();
            if !markers.iter().any(String::is_empty) {
                markers.push(String::new());
            }
            (MissingPolicy::Category, markers)
        };
        let kind = if s.numeric && (s.overflow || s.counts.len() > cfg.max_categories) {
            let (min, max) = round_bounds(s.min, s.max);
            let bins = if s.integer {
                cfg.bins
                    .min((max - min + 1.0).min(f64::from(u32::MAX)) as u32)
            } else {
                cfg.bins
            }
            .max(1);
            let scale = s.scale(min, max, bins);
            let candidates = s
                .counts
                .keys()
                .filter_map(|v| v.parse::<f64>().ok())
                .map(|x| (x, 0))
                .collect();
            plans.push((
                attributes.len(),
                NumericPlan {
                    column,
                    min,
                    max,
                    bins,
                    integer: s.integer,
                    candidates,
                    bin_rows: vec![0; bins as usize],
                    rows: 0,
                    scale,
                },
            ));
            // A fine grid unless asked for fixed bins (or a range of one value).
            let (numeric_bins, max_bins) = if cfg.fixed_bins || bins < 2 {
                (NumericBins::Count(bins), None)
            } else {
                (
                    NumericBins::AUTO,
                    (bins != DEFAULT_MAX_BINS).then_some(bins),
                )
            };
            AttributeKind::Numeric {
                min,
                max,
                bins: numeric_bins,
                integer: s.integer,
                out_of_range: OutOfRangePolicy::Clamp,
                points: Vec::new(),
                grid: None,
                max_bins,
                scale,
            }
        } else if !s.overflow && s.counts.len() <= cfg.max_categories {
            let mut labels: Vec<(String, u64)> = s.counts.into_iter().collect();
            if s.numeric {
                // Codes in numeric order.
                labels.sort_by(|a, b| {
                    let x = |l: &str| l.parse::<f64>().unwrap_or(f64::NAN);
                    x(&a.0).total_cmp(&x(&b.0)).then(a.0.cmp(&b.0))
                });
            } else {
                labels.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            }
            if labels.len() == 1 && missing == MissingPolicy::Reject {
                // A domain of one code: nothing to estimate, and no schema may hold it.
                warnings.push(format!(
                    "`{name}`: the same value ({:?}) in every row, left out",
                    labels[0].0
                ));
                continue;
            }
            AttributeKind::Categorical {
                labels: labels.into_iter().map(|(l, _)| l).collect(),
            }
        } else {
            // Never silently: the warning names the column and the flag value that keeps it.
            let n = s.distinct.len();
            warnings.push(if n <= MAX_COUNTED_DISTINCT {
                format!(
                    "`{name}`: {n} distinct text values, more than --max-categories {}: left \
                     out; rerun with `--max-categories {n}` to keep it as a categorical \
                     attribute",
                    cfg.max_categories
                )
            } else {
                format!(
                    "`{name}`: more than {MAX_COUNTED_DISTINCT} distinct text values (an \
                     identifier or free text?): left out; a larger --max-categories keeps it"
                )
            });
            continue;
        };
        attributes.push(Attribute {
            name: name.clone(),
            kind,
            missing,
            missing_markers,
            on_invalid: InvalidPolicy::Reject,
        });
    }
    if !plans.is_empty() {
        let mut reader = csv::ReaderBuilder::new()
            .flexible(true)
            .from_path(path)
            .map_err(csv_err)?;
        for record in reader.records().take(cfg.max_rows) {
            let record = record.map_err(csv_err)?;
            for (_, plan) in &mut plans {
                plan.count(record.get(plan.column).unwrap_or(""));
            }
        }
        for (index, plan) in &plans {
            let found = plan.points();
            let attr = &mut attributes[*index];
            if !found.is_empty() {
                warnings.push(format!(
                    "`{}`: point masses {found:?} (values with a large share of the rows) get \
                     codes of their own; keep them only if they are public knowledge",
                    attr.name
                ));
            }
            if let NumericScale::Asinh(unit) = plan.scale {
                warnings.push(format!(
                    "`{}`: most rows sit in a small part of the range: cells equal-width in \
                     asinh(x / {unit}) (\"scale\": {{\"asinh\": {unit}}}); the unit is public \
                     like the bounds",
                    attr.name
                ));
            }
            if let AttributeKind::Numeric { points, .. } = &mut attr.kind {
                *points = found;
            }
        }
    }
    if attributes.is_empty() {
        return Err(InferError::NoAttribute(path.display().to_string()));
    }
    Ok((Schema::new(attributes)?, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_csv;
    use ldpsyn::schema::Value;

    /// `text` written to `name` in a fresh folder (kept alive by the returned guard), and
    /// the schema `schema infer` proposes for it with default options.
    fn infer_text(name: &str, text: &str) -> (tempfile::TempDir, PathBuf, Schema, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let cfg = InferConfig::try_parse_from(["infer", "--data", "x"]).unwrap();
        let (schema, warnings) = infer_schema(&path, &cfg).unwrap();
        (dir, path, schema, warnings)
    }

    /// The schema's attribute names in order.
    fn attribute_names(schema: &Schema) -> Vec<&str> {
        schema
            .attributes()
            .iter()
            .map(|a| a.name.as_str())
            .collect()
    }

    /// A balance-like column (most rows within a few hundred of 0, a tail to 100,000, some
    /// negatives) gets an asinh scale with the unit of its median magnitude, and a warning;
    /// the evenly spread column beside it stays linear; the proposal reads its file.
    #[test]
    fn heavy_tailed_columns_get_an_asinh_scale() {
        let mut text = String::from("balance,age\n");
        for i in 0..1000i64 {
            let balance = match i % 10 {
                0 => -(i % 700),
                9 => 1000 * (i % 101),
                _ => 100 + (i * 37) % 800,
            };
            text.push_str(&format!("{balance},{}\n", 18 + i % 70));
        }
        let (_dir, path, schema, warnings) = infer_text("bank.csv", &text);
        let scale = |a: usize| match schema.attributes()[a].kind {
            AttributeKind::Numeric { scale, .. } => scale,
            _ => panic!("numeric"),
        };
        assert_eq!(scale(0), NumericScale::Asinh(100.0));
        assert_eq!(scale(1), NumericScale::Linear);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("`balance`") && w.contains("asinh")),
            "{warnings:?}"
        );
        let loaded = load_csv(&path, &schema).unwrap();
        assert_eq!(loaded.population.len(), 1000);
    }

    /// A semicolon- or tab-separated export reads as one column: refused with the
    /// separator named, not proposed as one attribute of joined values.
    #[test]
    fn other_separators_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = InferConfig::try_parse_from(["infer", "--data", "x"]).unwrap();
        for (sep, name) in [(';', "semi.csv"), ('\t', "tabs.tsv")] {
            let path = dir.path().join(name);
            let text: String = ["age", "city", "1", "Oslo", "2", "Lima"]
                .chunks(2)
                .map(|r| format!("{}{sep}{}\n", r[0], r[1]))
                .collect();
            std::fs::write(&path, text).unwrap();
            match infer_schema(&path, &cfg) {
                Err(e @ InferError::Separator { separator, .. }) => {
                    assert_eq!(separator, sep);
                    assert!(e.to_string().contains("comma-separated"), "{e}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    /// A column with one value in every row has a domain of one code, which no schema may
    /// hold: it is left out with a warning and the rest is proposed. With missing values
    /// beside its one value it has two codes and stays.
    #[test]
    fn constant_columns_are_left_out() {
        let mut text = String::from("country,version,sex,note\n");
        for i in 0..200u32 {
            let note = if i % 5 == 0 { "" } else { "seen" };
            text.push_str(&format!("NO,3,{},{note}\n", ["F", "M"][i as usize % 2]));
        }
        let (_dir, path, schema, warnings) = infer_text("constant.csv", &text);
        assert_eq!(attribute_names(&schema), ["sex", "note"]);
        for (column, value) in [("country", "NO"), ("version", "3")] {
            assert!(
                warnings
                    .iter()
                    .any(|w| w.contains(&format!("`{column}`: the same value (\"{value}\")"))),
                "{warnings:?}"
            );
        }
        assert_eq!(schema.attributes()[1].domain_size(), 2);
        assert_eq!(load_csv(&path, &schema).unwrap().population.len(), 200);
    }

    /// Every kind of column: a wide integer column (numeric, integer, rounded bounds), a
    /// float column, a small numeric code (categorical, numeric order), text with "?"
    /// (categorical with a missing category, by frequency), an identifier (left out), a
    /// numeric column with a point mass. The
    /// proposal encodes every row of the file it came from.
    #[test]
    fn proposes_a_schema_that_reads_its_file() {
        let mut text = String::from("age, income,grade,city,id,hours\n");
        for i in 0..500u32 {
            let city = ["Oslo", "Lima", "?"][(i % 7 % 3) as usize];
            let hours = if i % 2 == 0 { 40 } else { 20 + i % 100 };
            text.push_str(&format!(
                "{},{:.2},{},{city},user-{i},{hours}\n",
                17 + i % 74,
                -120.5 + f64::from(i) * 13.7,
                1 + i % 12
            ));
        }
        let (_dir, path, schema, warnings) = infer_text("people.csv", &text);
        assert_eq!(
            attribute_names(&schema),
            ["age", "income", "grade", "city", "hours"]
        );
        assert!(warnings.iter().any(|w| w.contains("`id`")), "{warnings:?}");
        assert!(warnings[0].contains("public"));
        let a = &schema.attributes();
        assert_eq!(
            a[0].kind,
            AttributeKind::Numeric {
                min: 15.0,
                max: 90.0,
                bins: NumericBins::AUTO,
                integer: true,
                out_of_range: OutOfRangePolicy::Clamp,
                points: vec![],
                grid: None,
                max_bins: None,
                scale: NumericScale::Linear,
            }
        );
        // Half the rows work 40 h: a point mass; the odd hours, 5 rows each, are not.
        match &a[4].kind {
            AttributeKind::Numeric { points, .. } => assert_eq!(points, &[40.0]),
            k => panic!("hours: {k:?}"),
        }
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("`hours`: point masses [40.0]"))
        );
        match &a[1].kind {
            AttributeKind::Numeric {
                min, max, integer, ..
            } => {
                assert!(!integer);
                assert!(*min <= -120.5 && *max >= -120.5 + 499.0 * 13.7);
                assert_eq!((*min, *max), (-500.0, 7000.0));
            }
            k => panic!("income: {k:?}"),
        }
        let labels: Vec<String> = (1..=12).map(|g| g.to_string()).collect();
        assert_eq!(a[2].kind, AttributeKind::Categorical { labels });
        assert_eq!(a[3].missing, MissingPolicy::Category);
        assert_eq!(a[3].missing_markers, vec!["?".to_owned(), String::new()]);
        assert_eq!(
            a[3].encode_value(&Value::Text(String::new())),
            a[3].encode_value(&Value::Text("?".into())),
            "an empty field (a synthetic missing value) reads as missing"
        );
        let loaded = load_csv(&path, &schema).unwrap();
        assert_eq!((loaded.population.len(), loaded.rejected_rows), (500, 0));
    }

    /// `--bins` is the fine grid's working bins by default and the fixed count with
    /// `--fixed-bins`; an integer range narrower than `--bins` gets one bin per value.
    #[test]
    fn numeric_proposals_are_fine_grids_unless_fixed_bins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.csv");
        let mut text = String::from("wage,children\n");
        for i in 0..200u32 {
            text.push_str(&format!("{},{}\n", 1000 + 37 * i, i % 5));
        }
        std::fs::write(&path, text).unwrap();
        let kinds = |args: &[&str]| {
            let cfg = InferConfig::try_parse_from(
                ["infer", "--data", "x", "--max-categories", "0"]
                    .iter()
                    .chain(args),
            )
            .unwrap();
            let (schema, _) = infer_schema(&path, &cfg).unwrap();
            let got: Vec<(NumericBins, Option<u32>)> = schema
                .attributes()
                .iter()
                .map(|a| match &a.kind {
                    AttributeKind::Numeric { bins, max_bins, .. } => (*bins, *max_bins),
                    k => panic!("{k:?}"),
                })
                .collect();
            got
        };
        // children: 0–4, five values.
        assert_eq!(
            kinds(&["--bins", "8"]),
            [(NumericBins::AUTO, Some(8)), (NumericBins::AUTO, Some(5))]
        );
        assert_eq!(
            kinds(&[]),
            [(NumericBins::AUTO, None), (NumericBins::AUTO, Some(5))]
        );
        assert_eq!(
            kinds(&["--bins", "8", "--fixed-bins"]),
            [(NumericBins::Count(8), None), (NumericBins::Count(5), None)]
        );
    }

    /// Issue 36 item 5: on Adult, `native-country` (41 countries, over the default 32) is
    /// never dropped silently: the warning names it and the flag value that keeps it, and
    /// that value keeps it as a categorical attribute of 41 labels (the committed
    /// `examples/adult/schema-inferred.json`).
    #[test]
    fn adult_native_country_is_named_and_kept_by_the_flag_it_names() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/adult/adult.csv");
        let infer = |args: &[&str]| {
            let cfg =
                InferConfig::try_parse_from(["infer", "--data", "x"].iter().chain(args)).unwrap();
            infer_schema(&path, &cfg).unwrap()
        };
        let (schema, warnings) = infer(&[]);
        assert!(schema.index_of("native-country").is_none());
        assert!(
            warnings.iter().any(|w| w.starts_with(
                "`native-country`: 41 distinct text values, more than --max-categories 32: \
                 left out; rerun with `--max-categories 41`"
            )),
            "{warnings:?}"
        );
        let (schema, warnings) = infer(&["--max-categories", "41"]);
        let i = schema.index_of("native-country").expect("kept");
        match &schema.attributes()[i].kind {
            AttributeKind::Categorical { labels } => assert_eq!(labels.len(), 41),
            k => panic!("native-country: {k:?}"),
        }
        assert!(
            !warnings.iter().any(|w| w.contains("left out")),
            "{warnings:?}"
        );
        // The committed proposal is this command's output.
        let committed: Schema = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../examples/adult/schema-inferred.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(committed, schema);
    }

    #[test]
    fn bounds_are_widened_to_round_steps() {
        assert_eq!(round_bounds(17.0, 90.0), (15.0, 90.0));
        assert_eq!(round_bounds(13_492.0, 1_490_400.0), (0.0, 1_500_000.0));
        assert_eq!(round_bounds(0.0, 99_999.0), (0.0, 100_000.0));
        assert_eq!(round_bounds(5.0, 5.0), (4.0, 6.0));
    }
}
