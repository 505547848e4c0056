//! Schemas, record encoding and decoding.
//!
//! A [`Schema`] is an ordered list of attributes, each with a finite domain of integer codes
//! `0..domain_size`. Categorical attributes map labels to codes in list order; numeric ones
//! are cut into `bins` equal-width bins between `min` and `max` (`max` falls in the last bin),
//! or with `"bins": "auto"` into a fine grid ([`Attribute::grid_cells`]) that the aggregator
//! measures in working bins ([`Attribute::working_cuts`]); point masses get codes of their own.
//! With the `category` missing-value policy an attribute gets one more code, the last one,
//! for "missing". With `"on_invalid": "randomize"` ([`InvalidPolicy`]) a value the attribute
//! cannot encode (missing, an unknown label, out of range, not a number) takes a code drawn
//! uniformly from its domain, so a device reports whatever its data (the `_with` encoders,
//! which take the privacy RNG; the native and WASM clients use them).
//!
//! Schema JSON:
//!
//! ```
//! use ldpsyn::schema::Schema;
//! let schema: Schema = serde_json::from_str(r#"{
//!   "attributes": [
//!     {"name": "age", "type": "numeric", "min": 17, "max": 90, "bins": 16, "integer": true},
//!     {"name": "hours", "type": "numeric", "min": 1, "max": 99, "bins": 8,
//!      "out_of_range": "clamp"},
//!     {"name": "sex", "type": "categorical", "labels": ["Female", "Male"]},
//!     {"name": "workclass", "type": "categorical", "labels": ["Private", "Self-emp"],
//!      "missing": "category", "missing_markers": ["?", ""]}
//!   ]
//! }"#).unwrap();
//! assert_eq!(schema.domain_sizes(), vec![16, 8, 2, 3]);
//! let record = schema.encode_json(&serde_json::json!(
//!     {"age": 37, "hours": 120, "sex": "Male", "workclass": "?"})).unwrap();
//! assert_eq!(record.codes(), &[4, 7, 1, 2]);
//! ```

use std::collections::{HashMap, HashSet};

use rand::Rng;
use serde::{Deserialize, Serialize};

/// What to do with a numeric value outside `[min, max]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum OutOfRangePolicy {
    /// Refuse the record (the default).
    #[default]
    Reject,
    /// Move the value to the nearest bound.
    Clamp,
}

/// What to do with a missing value (JSON `null`, an absent key or one of the markers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum MissingPolicy {
    /// Refuse the record (the default).
    #[default]
    Reject,
    /// "Missing" is one more value of the domain, with the last code.
    Category,
}

/// What to do with a value the attribute cannot encode: missing under `missing: reject`, not
/// one of the labels, not a finite number, outside `[min, max]` under `out_of_range: reject`,
/// or a JSON boolean, array or object. The other two policies come first: a missing value
/// under `missing: category` and an out-of-range one under `out_of_range: clamp` are valid.
///
/// Under `reject` an invalid record never reports, so *whether* a device reports depends on
/// its data, which the server sees. Under `randomize` the value is replaced, on the device, by
/// a code drawn uniformly from the attribute's whole domain (`0..domain_size()`, the
/// "missing" code included if there is one) with the privacy CSPRNG before the record is
/// randomized: every device reports, and ε-LDP holds for any input (the replacement is a
/// data-independent pre-processing step, so the report's distribution given any input is a
/// mixture of its distributions given valid inputs, each within e^ε of any other). The
/// aggregator cannot tell these reports apart: estimates count invalid values as spread
/// uniformly over the domain (a share `s` of invalid values moves every frequency `f` to
/// `(1 − s)·f + s/|Ω|`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum InvalidPolicy {
    /// Refuse the record (the default).
    #[default]
    Reject,
    /// Replace the value by a uniformly drawn code of the domain before randomizing.
    Randomize,
}

impl InvalidPolicy {
    fn is_reject(&self) -> bool {
        *self == InvalidPolicy::Reject
    }
}

/// How a numeric bin is turned back into a number when decoding synthetic data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NumericDecoding {
    /// Uniform within the bin (whole numbers for `integer` attributes), from a seeded RNG.
    #[default]
    Uniform,
    /// The bin's midpoint (rounded for `integer` attributes).
    Midpoint,
}

/// The kind of an attribute and its domain definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AttributeKind {
    /// An ordered list of labels; code `i` is `labels[i]`.
    Categorical {
        /// The labels, in code order.
        labels: Vec<String>,
    },
    /// Equal-width cells over `[min, max]` (a fixed count of bins, or a fine grid under
    /// `bins: "auto"`; equal-width in the value, or in `asinh(x / unit)` under an asinh
    /// [`NumericScale`]), plus one code per point mass.
    Numeric {
        /// Lower bound (inclusive), finite.
        min: f64,
        /// Upper bound (inclusive; falls in the last cell), finite, > `min`.
        max: f64,
        /// A number of bins (≥ 1: the codes, measured as they are), or `"auto"`: the codes
        /// are a fine grid ([`Attribute::grid_cells`]) that devices encode to, and the
        /// aggregator measures factors over at most `max_bins` working bins of it while
        /// 1-ways see the grid, so synthetic values follow the fine distribution within a
        /// bin (docs/design.md "Numeric attributes").
        bins: NumericBins,
        /// Decoded values are whole numbers.
        #[serde(default)]
        integer: bool,
        /// What to do outside `[min, max]`.
        #[serde(default)]
        out_of_range: OutOfRangePolicy,
        /// Point masses: values with a code of their own (codes `cells..cells + points.len()`,
        /// in this order, after the `cells` grid codes), e.g. `[0]` for an income that is 0
        /// for most people or `[40]` for weekly hours. A value equal to a point takes its code
        /// instead of its cell's, and decodes to exactly that value, so synthetic data keeps
        /// the mass a bin would smear out. Public like the bounds: from domain knowledge.
        /// Finite, within `[min, max]`, whole for `integer` attributes, each listed once;
        /// default none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        points: Vec<f64>,
        /// `bins: "auto"` only: cells of the fine grid, 2..=[`MAX_GRID`] (default: one per
        /// whole number for an `integer` attribute whose range holds at most
        /// [`DEFAULT_GRID`] of them, else [`DEFAULT_GRID`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grid: Option<u32>,
        /// `bins: "auto"` only: most working bins a factor measures the grid in, 2..=grid
        /// (default [`DEFAULT_MAX_BINS`]; points and "missing" are bins of their own beyond
        /// it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_bins: Option<u32>,
        /// What the cells are equal-width in: the value (default), or `{"asinh": unit}` for
        /// a heavy-tailed column ([`NumericScale`]).
        #[serde(default, skip_serializing_if = "NumericScale::is_linear")]
        scale: NumericScale,
    },
}

/// What a numeric attribute's cells (bins, or the fine grid) are equal-width in. Public
/// like the bounds, so it must come from domain knowledge, never from the private data.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum NumericScale {
    /// `"linear"`: equal-width in the value.
    #[default]
    Linear,
    /// `{"asinh": unit}`: equal-width in `asinh(x / unit)`, about linear within ±`unit` of 0
    /// and logarithmic beyond (negative values included), for columns whose bulk sits in a
    /// small part of their range (balances, incomes, counts with a long tail), which equal
    /// widths would put in one or two cells. `unit` is finite and > 0, in the value's units.
    Asinh(f64),
}

impl NumericScale {
    fn is_linear(&self) -> bool {
        *self == Self::Linear
    }

    /// The coordinate the cells are equal-width in (`x` itself, or `asinh(x / unit)`).
    pub fn forward(self, x: f64) -> f64 {
        match self {
            Self::Linear => x,
            Self::Asinh(unit) => (x / unit).asinh(),
        }
    }

    /// Bin of `x ∈ [min, max]` among `bins` (≥ 1) bins equal-width in this coordinate
    /// ([`NumericScale::forward`]), `0..bins`; `max` falls in the last bin and values outside
    /// `[min, max]` in the end bins. How devices encode a numeric value to its cell.
    pub fn bin(self, x: f64, min: f64, max: f64, bins: u32) -> u32 {
        let (x, min, max) = (self.forward(x), self.forward(min), self.forward(max));
        let b = ((x - min) / (max - min) * f64::from(bins)).floor();
        // `as` saturates; the clamp puts `max` (and rounding at the top) in the last bin.
        (b.max(0.0) as u32).min(bins - 1)
    }

    /// The value at coordinate `t` (inverse of [`NumericScale::forward`]).
    pub fn inverse(self, t: f64) -> f64 {
        match self {
            Self::Linear => t,
            Self::Asinh(unit) => unit * t.sinh(),
        }
    }
}

/// Default fine-grid size of a `bins: "auto"` numeric attribute (docs/design.md "Numeric
/// attributes": e.g. 1024 equal-width cells).
pub const DEFAULT_GRID: u32 = 1024;

/// Largest fine grid a schema may ask for: a 1-way over it is one OUE report of this many
/// bits (512 bytes at most on the wire).
pub const MAX_GRID: u32 = 4096;

/// Default number of working bins of a `bins: "auto"` numeric attribute: the resolution
/// of the fixed-count example schemas (16), so the model's cliques stay as small as before.
/// Swept at 6–32 with `auto` on Adult and temporal-match2 at ε ∈ {1, 2, 4, 8}
/// (`benchmarks/sweeps/max-bins.md`): 16 has the lowest 2-way TVD at every ε ≥ 2; fewer bins
/// gain 5–6% at ε = 1 without lowering the largest KS.
pub const DEFAULT_MAX_BINS: u32 = 16;

/// The `bins` of a numeric attribute: a count, or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum NumericBins {
    /// This many equal-width bins.
    Count(u32),
    /// `"auto"`: a fine grid with working bins chosen by the aggregator.
    Auto(AutoBins),
}

/// The literal `"auto"` of [`NumericBins::Auto`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AutoBins {
    /// `"auto"`.
    Auto,
}

impl NumericBins {
    /// `"auto"`.
    pub const AUTO: Self = Self::Auto(AutoBins::Auto);
}

impl From<u32> for NumericBins {
    fn from(n: u32) -> Self {
        Self::Count(n)
    }
}

fn default_markers() -> Vec<String> {
    vec![String::new()]
}

/// One attribute of a schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attribute {
    /// Unique, non-empty name (the CSV column / JSON key).
    pub name: String,
    /// Kind and domain.
    #[serde(flatten)]
    pub kind: AttributeKind,
    /// Missing-value policy.
    #[serde(default)]
    pub missing: MissingPolicy,
    /// Strings that mean "missing" (compared after trimming whitespace); default `[""]`.
    #[serde(default = "default_markers")]
    pub missing_markers: Vec<String>,
    /// What to do with a value this attribute cannot encode (default `reject`; left out of
    /// the JSON when it is the default, so older schemas read and write as before).
    #[serde(default, skip_serializing_if = "InvalidPolicy::is_reject")]
    pub on_invalid: InvalidPolicy,
}

/// Why a schema is invalid. Every variant names the attribute at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaError {
    /// The schema has no attributes.
    #[error("schema has no attributes")]
    NoAttributes,
    /// An attribute has an empty name.
    #[error("attribute #{index} has an empty name")]
    EmptyName {
        /// Position of the attribute.
        index: usize,
    },
    /// Two attributes share a name.
    #[error("duplicate attribute name `{attribute}`")]
    DuplicateName {
        /// The repeated name.
        attribute: String,
    },
    /// A categorical attribute lists the same label twice.
    #[error("attribute `{attribute}`: duplicate label `{label}`")]
    DuplicateLabel {
        /// The attribute.
        attribute: String,
        /// The repeated label.
        label: String,
    },
    /// The domain has no values.
    #[error("attribute `{attribute}`: empty domain")]
    EmptyDomain {
        /// The attribute.
        attribute: String,
    },
    /// The domain has one value: nothing to learn and nothing to hide.
    #[error("attribute `{attribute}`: domain has a single value")]
    SingleValueDomain {
        /// The attribute.
        attribute: String,
    },
    /// A numeric attribute with `bins == 0`.
    #[error("attribute `{attribute}`: bins must be >= 1")]
    ZeroBins {
        /// The attribute.
        attribute: String,
    },
    /// A `bins: "auto"` attribute's `grid` or `max_bins` out of range, or either given with
    /// a bin count.
    #[error("attribute `{attribute}`: {reason}")]
    InvalidGrid {
        /// The attribute.
        attribute: String,
        /// What is wrong.
        reason: String,
    },
    /// A numeric attribute with `min >= max`.
    #[error("attribute `{attribute}`: min ({min}) must be < max ({max})")]
    MinNotBelowMax {
        /// The attribute.
        attribute: String,
        /// Its min.
        min: f64,
        /// Its max.
        max: f64,
    },
    /// A numeric attribute with a NaN or infinite bound.
    #[error("attribute `{attribute}`: bounds must be finite")]
    NonFiniteBound {
        /// The attribute.
        attribute: String,
    },
    /// A numeric attribute whose finite bounds are so far apart that `max − min` (or the
    /// difference of their `asinh` coordinates) overflows to infinity: no bin width could be
    /// computed.
    #[error("attribute `{attribute}`: max - min overflows (bounds too far apart)")]
    RangeTooWide {
        /// The attribute.
        attribute: String,
    },
    /// A point mass that is not finite, outside `[min, max]`, fractional for an `integer`
    /// attribute, or listed twice.
    #[error(
        "attribute `{attribute}`: point {value} must be finite, within [min, max], whole \
         for an integer attribute and listed once"
    )]
    InvalidPoint {
        /// The attribute.
        attribute: String,
        /// The offending point.
        value: f64,
    },
}

/// An input value for one attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string: a label, a number to parse, or a missing marker.
    Text(String),
    /// A number.
    Number(f64),
    /// Explicitly missing.
    Missing,
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s)
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Number(x)
    }
}
impl From<i64> for Value {
    fn from(x: i64) -> Self {
        Value::Number(x as f64)
    }
}
impl From<i32> for Value {
    fn from(x: i32) -> Self {
        Value::Number(f64::from(x))
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Text(s) => write!(f, "{s:?}"),
            Value::Number(x) => write!(f, "{x}"),
            Value::Missing => write!(f, "missing"),
        }
    }
}

/// Why a record could not be encoded. Names the attribute and, where there is one, the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    /// The value is missing and the attribute's policy is `reject`.
    #[error("attribute `{attribute}`: value is missing")]
    Missing {
        /// The attribute.
        attribute: String,
    },
    /// Not one of the attribute's labels.
    #[error("attribute `{attribute}`: unknown label {value}")]
    UnknownLabel {
        /// The attribute.
        attribute: String,
        /// The offending value.
        value: String,
    },
    /// Not a number (for a numeric attribute), or not finite.
    #[error("attribute `{attribute}`: not a finite number: {value}")]
    NotANumber {
        /// The attribute.
        attribute: String,
        /// The offending value.
        value: String,
    },
    /// Outside `[min, max]` with policy `reject`.
    #[error("attribute `{attribute}`: {value} is outside [{min}, {max}]")]
    OutOfRange {
        /// The attribute.
        attribute: String,
        /// The offending value.
        value: f64,
        /// Lower bound.
        min: f64,
        /// Upper bound.
        max: f64,
    },
    /// A key that is not an attribute of the schema (JSON records and the builder).
    #[error("unknown attribute `{attribute}`")]
    UnknownAttribute {
        /// The key.
        attribute: String,
    },
    /// The JSON value is not an object, or a field is an array/object/bool.
    #[error("attribute `{attribute}`: unsupported JSON value {value}")]
    UnsupportedJson {
        /// The attribute (empty when the whole record is not an object).
        attribute: String,
        /// The offending value.
        value: String,
    },
    /// A CSV header lacks a column for an attribute.
    #[error("CSV header has no column `{attribute}`")]
    MissingColumn {
        /// The attribute.
        attribute: String,
    },
    /// A CSV row has fewer fields than its header.
    #[error("CSV row has {found} fields, header has {expected}")]
    ShortRow {
        /// Fields in the header.
        expected: usize,
        /// Fields in the row.
        found: usize,
    },
    /// Encoded codes do not fit the schema (wrong length or a code out of the domain).
    #[error("encoded record does not fit the schema: {0}")]
    BadCodes(String),
}

impl RecordError {
    /// Whether the error is about one attribute's value (missing, unknown label, not a
    /// number, out of range, an unsupported JSON value), which [`InvalidPolicy::Randomize`]
    /// replaces; not an error of the record's shape (unknown attribute, CSV layout, codes).
    pub fn is_invalid_value(&self) -> bool {
        match self {
            RecordError::Missing { .. }
            | RecordError::UnknownLabel { .. }
            | RecordError::NotANumber { .. }
            | RecordError::OutOfRange { .. } => true,
            RecordError::UnsupportedJson { attribute, .. } => !attribute.is_empty(),
            RecordError::UnknownAttribute { .. }
            | RecordError::MissingColumn { .. }
            | RecordError::ShortRow { .. }
            | RecordError::BadCodes(_) => false,
        }
    }
}

impl Attribute {
    /// Number of codes of this attribute, including the "missing" code under
    /// [`MissingPolicy::Category`].
    pub fn domain_size(&self) -> usize {
        let base = match &self.kind {
            AttributeKind::Categorical { labels } => labels.len(),
            AttributeKind::Numeric { points, .. } => {
                self.grid_cells().unwrap_or(0) as usize + points.len()
            }
        };
        base + usize::from(self.missing == MissingPolicy::Category)
    }

    /// Equal-width cells of a numeric attribute's `[min, max]` (its first codes): the
    /// `bins` count, or under `bins: "auto"` the fine grid (`grid`, else one cell per whole
    /// number for an `integer` attribute whose range holds at most [`DEFAULT_GRID`], else
    /// [`DEFAULT_GRID`]). `None` for a categorical attribute.
    pub fn grid_cells(&self) -> Option<u32> {
        let AttributeKind::Numeric {
            min,
            max,
            bins,
            integer,
            grid,
            scale,
            ..
        } = &self.kind
        else {
            return None;
        };
        Some(match bins {
            NumericBins::Count(n) => *n,
            NumericBins::Auto(_) => grid.unwrap_or_else(|| {
                let whole = max.floor() - min.ceil() + 1.0;
                if *integer
                    && scale.is_linear()
                    && min.fract() == 0.0
                    && max.fract() == 0.0
                    && whole <= f64::from(DEFAULT_GRID)
                {
                    whole as u32
                } else {
                    DEFAULT_GRID
                }
            }),
        })
    }

    /// The working bins of a `bins: "auto"` numeric attribute as cuts over its codes
    /// ([`crate::factor::bin_count`]): grid cells grouped into the [`Attribute::working_bins`]
    /// equal-width bins of `[min, max]` (in its [`NumericScale`]) that `bins: <that count>`
    /// would give (a cell joins the bin of its midpoint, a whole-number cell the bin of its
    /// number), every point mass and
    /// "missing" a bin of its own. `None` for every other attribute. Working bins are what
    /// the aggregator measures factors in (docs/design.md "Numeric attributes").
    pub fn working_cuts(&self) -> Option<Vec<u32>> {
        let m = self.working_bins()?;
        let AttributeKind::Numeric {
            min,
            max,
            integer,
            scale,
            ..
        } = &self.kind
        else {
            return None;
        };
        let cells = self.grid_cells()?;
        let unit = *integer && scale.is_linear() && f64::from(cells) == max - min + 1.0;
        let (t_min, t_max) = (scale.forward(*min), scale.forward(*max));
        let width = (t_max - t_min) / f64::from(cells);
        let bin = |c: u32| {
            let x = if unit {
                min + f64::from(c)
            } else {
                scale.inverse(t_min + width * (f64::from(c) + 0.5))
            };
            scale.bin(x, *min, *max, m)
        };
        let mut cuts: Vec<u32> = (1..cells).filter(|&c| bin(c) != bin(c - 1)).collect();
        cuts.extend(cells..self.domain_size() as u32);
        Some(cuts)
    }

    /// Working bins of a `bins: "auto"` numeric attribute (`max_bins`, default
    /// [`DEFAULT_MAX_BINS`], at most the grid); `None` for every other attribute.
    pub fn working_bins(&self) -> Option<u32> {
        match &self.kind {
            AttributeKind::Numeric {
                bins: NumericBins::Auto(_),
                max_bins,
                ..
            } => Some(
                max_bins
                    .unwrap_or(DEFAULT_MAX_BINS)
                    .min(self.grid_cells().unwrap_or(u32::MAX)),
            ),
            _ => None,
        }
    }

    /// The code of "missing", if this attribute has one.
    pub fn missing_code(&self) -> Option<u32> {
        (self.missing == MissingPolicy::Category).then(|| (self.domain_size() - 1) as u32)
    }

    fn is_missing_marker(&self, s: &str) -> bool {
        let t = s.trim();
        self.missing_markers.iter().any(|m| m.trim() == t)
    }

    fn missing(&self) -> Result<u32, RecordError> {
        self.missing_code().ok_or_else(|| RecordError::Missing {
            attribute: self.name.clone(),
        })
    }

    /// Encodes one value to its code in `0..domain_size()`, refusing every invalid value
    /// whatever [`Attribute::on_invalid`] says (no randomness here; see
    /// [`Attribute::encode_value_with`]).
    ///
    /// Errors: [`RecordError`] naming this attribute and the value.
    pub fn encode_value(&self, value: &Value) -> Result<u32, RecordError> {
        match value {
            Value::Missing => return self.missing(),
            Value::Text(s) if self.is_missing_marker(s) => return self.missing(),
            _ => {}
        }
        match &self.kind {
            AttributeKind::Categorical { labels } => {
                let text = match value {
                    Value::Text(s) => s.trim().to_owned(),
                    Value::Number(x) => format!("{x}"),
                    Value::Missing => unreachable!("handled above"),
                };
                labels
                    .iter()
                    .position(|l| *l == text)
                    .map(|i| i as u32)
                    .ok_or_else(|| RecordError::UnknownLabel {
                        attribute: self.name.clone(),
                        value: value.to_string(),
                    })
            }
            AttributeKind::Numeric {
                min,
                max,
                out_of_range,
                points,
                scale,
                ..
            } => {
                let cells = self.grid_cells().expect("numeric");
                let x = match value {
                    Value::Number(x) => *x,
                    Value::Text(s) => {
                        s.trim()
                            .parse::<f64>()
                            .map_err(|_| RecordError::NotANumber {
                                attribute: self.name.clone(),
                                value: value.to_string(),
                            })?
                    }
                    Value::Missing => unreachable!("handled above"),
                };
                if !x.is_finite() {
                    return Err(RecordError::NotANumber {
                        attribute: self.name.clone(),
                        value: value.to_string(),
                    });
                }
                let x = if x < *min || x > *max {
                    match out_of_range {
                        OutOfRangePolicy::Reject => {
                            return Err(RecordError::OutOfRange {
                                attribute: self.name.clone(),
                                value: x,
                                min: *min,
                                max: *max,
                            });
                        }
                        OutOfRangePolicy::Clamp => x.clamp(*min, *max),
                    }
                } else {
                    x
                };
                Ok(match points.iter().position(|p| *p == x) {
                    Some(i) => cells + i as u32,
                    None => scale.bin(x, *min, *max, cells),
                })
            }
        }
    }

    /// As [`Attribute::encode_value`], then [`Attribute::on_invalid`]: under
    /// [`InvalidPolicy::Randomize`] a value it refuses becomes a code drawn uniformly from
    /// `0..domain_size()` with `rng`. On a device `rng` must be the privacy CSPRNG (the draw
    /// is part of the randomizer: anyone who can predict it learns that the value was
    /// invalid).
    ///
    /// Errors: [`RecordError`] naming this attribute and the value (under
    /// [`InvalidPolicy::Reject`] only).
    pub fn encode_value_with<R: Rng + ?Sized>(
        &self,
        value: &Value,
        rng: &mut R,
    ) -> Result<u32, RecordError> {
        self.apply_invalid_policy(self.encode_value(value), rng)
    }

    /// [`Attribute::on_invalid`] applied to the outcome of encoding one of its values.
    fn apply_invalid_policy<R: Rng + ?Sized>(
        &self,
        encoded: Result<u32, RecordError>,
        rng: &mut R,
    ) -> Result<u32, RecordError> {
        match encoded {
            Err(e) if e.is_invalid_value() && self.on_invalid == InvalidPolicy::Randomize => {
                // Uniform over the whole domain (a validated schema has ≥ 2 codes).
                Ok(rng.random_range(0..self.domain_size() as u32))
            }
            other => other,
        }
    }

    /// Decodes a code back to a value: the label, or a number within the bin (see
    /// [`NumericDecoding`]); the "missing" code decodes to [`DecodedValue::Missing`].
    ///
    /// Panics if `code >= domain_size()`.
    pub fn decode<R: Rng + ?Sized>(
        &self,
        code: u32,
        numeric: NumericDecoding,
        rng: &mut R,
    ) -> DecodedValue {
        assert!(
            (code as usize) < self.domain_size(),
            "code {code} out of the domain of `{}`",
            self.name
        );
        if Some(code) == self.missing_code() {
            return DecodedValue::Missing;
        }
        match &self.kind {
            AttributeKind::Categorical { labels } => {
                DecodedValue::Label(labels[code as usize].clone())
            }
            AttributeKind::Numeric {
                min,
                max,
                integer,
                points,
                scale,
                ..
            } => {
                let cells = self.grid_cells().expect("numeric");
                if code >= cells {
                    return DecodedValue::Number(points[(code - cells) as usize]);
                }
                let t_min = scale.forward(*min);
                let width = (scale.forward(*max) - t_min) / f64::from(cells);
                let edge = |c: u32| scale.inverse(t_min + width * f64::from(c));
                let lo = if code == 0 { *min } else { edge(code) };
                let hi = if code + 1 == cells {
                    *max
                } else {
                    edge(code + 1)
                };
                let x = if *integer {
                    // Whole numbers whose bin is `code`; a bin narrower than 1 may hold none.
                    // Searched by bisection over the floats, not walked by `+ 1.0`, which
                    // stops moving at 2^53 (and would loop forever there).
                    let bin = |x: f64| scale.bin(x, *min, *max, cells);
                    let ab = whole_numbers_of_bin(lo, hi, code, bin);
                    match ab {
                        None => midpoint(lo, hi).round(),
                        Some((a, b)) => match numeric {
                            NumericDecoding::Midpoint => midpoint(a, b).round(),
                            NumericDecoding::Uniform => {
                                // A point's value belongs to the point's code, not the bin's:
                                // redraw (a bin of only points falls back to a draw).
                                let mut x = uniform_whole(a, b, rng);
                                for _ in 0..16 {
                                    if !points.contains(&x) {
                                        break;
                                    }
                                    x = uniform_whole(a, b, rng);
                                }
                                x
                            }
                        },
                    }
                } else {
                    match numeric {
                        NumericDecoding::Midpoint => midpoint(lo, hi),
                        NumericDecoding::Uniform => lo + (hi - lo) * rng.random::<f64>(),
                    }
                };
                DecodedValue::Number(x)
            }
        }
    }

    fn validate(&self, index: usize) -> Result<(), SchemaError> {
        let attribute = self.name.clone();
        if self.name.trim().is_empty() {
            return Err(SchemaError::EmptyName { index });
        }
        match &self.kind {
            AttributeKind::Categorical { labels } => {
                let mut seen = HashSet::new();
                for l in labels {
                    if !seen.insert(l) {
                        return Err(SchemaError::DuplicateLabel {
                            attribute,
                            label: l.clone(),
                        });
                    }
                }
                if labels.is_empty() {
                    return Err(SchemaError::EmptyDomain { attribute });
                }
            }
            AttributeKind::Numeric {
                min,
                max,
                bins,
                integer,
                points,
                grid,
                max_bins,
                scale,
                ..
            } => {
                if let NumericScale::Asinh(unit) = scale
                    && !(unit.is_finite() && *unit > 0.0)
                {
                    return Err(SchemaError::InvalidGrid {
                        attribute,
                        reason: "an asinh scale's unit must be finite and > 0".into(),
                    });
                }
                for p in points {
                    if !p.is_finite() || p < min || p > max || (*integer && p.fract() != 0.0) {
                        return Err(SchemaError::InvalidPoint {
                            attribute,
                            value: *p,
                        });
                    }
                }
                // Repeats by sorting (n log n): a pairwise scan of an admin's list of
                // hundreds of thousands of points took minutes.
                let mut sorted = points.clone();
                sorted.sort_by(f64::total_cmp);
                if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                    return Err(SchemaError::InvalidPoint {
                        attribute,
                        value: w[0],
                    });
                }
                if !min.is_finite() || !max.is_finite() {
                    return Err(SchemaError::NonFiniteBound { attribute });
                }
                // Bin widths and edges come from these differences.
                if (max - min).is_infinite()
                    || !(scale.forward(*max) - scale.forward(*min)).is_finite()
                {
                    return Err(SchemaError::RangeTooWide { attribute });
                }
                if min >= max {
                    return Err(SchemaError::MinNotBelowMax {
                        attribute,
                        min: *min,
                        max: *max,
                    });
                }
                match bins {
                    NumericBins::Count(0) => return Err(SchemaError::ZeroBins { attribute }),
                    NumericBins::Count(_) => {
                        if grid.is_some() || max_bins.is_some() {
                            return Err(SchemaError::InvalidGrid {
                                attribute,
                                reason: "grid and max_bins need bins \"auto\"".into(),
                            });
                        }
                    }
                    NumericBins::Auto(_) => {
                        if grid.is_some_and(|g| !(2..=MAX_GRID).contains(&g)) {
                            return Err(SchemaError::InvalidGrid {
                                attribute,
                                reason: format!("grid must be within 2..={MAX_GRID}"),
                            });
                        }
                        let cells = self.grid_cells().expect("numeric");
                        if max_bins.is_some_and(|m| m < 2 || m > cells) {
                            return Err(SchemaError::InvalidGrid {
                                attribute,
                                reason: format!("max_bins must be within 2..={cells} (the grid)"),
                            });
                        }
                    }
                }
            }
        }
        if self.domain_size() < 2 {
            return Err(SchemaError::SingleValueDomain { attribute });
        }
        Ok(())
    }
}

/// A decoded value of synthetic data.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodedValue {
    /// A categorical label.
    Label(String),
    /// A number (whole for `integer` attributes).
    Number(f64),
    /// The "missing" code.
    Missing,
}

impl std::fmt::Display for DecodedValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodedValue::Label(s) => f.write_str(s),
            DecodedValue::Number(x) => write!(f, "{x}"),
            DecodedValue::Missing => Ok(()),
        }
    }
}

impl DecodedValue {
    /// As a JSON value (`null` for missing).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            DecodedValue::Label(s) => serde_json::Value::String(s.clone()),
            DecodedValue::Number(x) => serde_json::json!(x),
            DecodedValue::Missing => serde_json::Value::Null,
        }
    }
}

/// A validated schema: attributes with unique names and domains of at least two values.
///
/// Deserializing checks everything [`Schema::new`] checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawSchema")]
pub struct Schema {
    attributes: Vec<Attribute>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchema {
    attributes: Vec<Attribute>,
}

impl TryFrom<RawSchema> for Schema {
    type Error = SchemaError;
    fn try_from(raw: RawSchema) -> Result<Self, SchemaError> {
        Schema::new(raw.attributes)
    }
}

/// A record encoded to codes, one per attribute in schema order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EncodedRecord(Vec<u32>);

impl EncodedRecord {
    /// The codes, length = number of attributes.
    pub fn codes(&self) -> &[u32] {
        &self.0
    }
}

impl Schema {
    /// Validates attributes. Errors: the first [`SchemaError`] found, naming its attribute.
    pub fn new(attributes: Vec<Attribute>) -> Result<Self, SchemaError> {
        if attributes.is_empty() {
            return Err(SchemaError::NoAttributes);
        }
        let mut names = HashSet::new();
        for (i, a) in attributes.iter().enumerate() {
            a.validate(i)?;
            if !names.insert(a.name.as_str()) {
                return Err(SchemaError::DuplicateName {
                    attribute: a.name.clone(),
                });
            }
        }
        Ok(Self { attributes })
    }

    /// The attributes, in code order.
    pub fn attributes(&self) -> &[Attribute] {
        &self.attributes
    }

    /// Number of attributes `d`.
    pub fn len(&self) -> usize {
        self.attributes.len()
    }

    /// Always false: a schema has at least one attribute.
    pub fn is_empty(&self) -> bool {
        self.attributes.is_empty()
    }

    /// `|Ω_A|` for every attribute, length `d`.
    pub fn domain_sizes(&self) -> Vec<usize> {
        self.attributes.iter().map(Attribute::domain_size).collect()
    }

    /// Position of the attribute called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.attributes.iter().position(|a| a.name == name)
    }

    /// Encodes a JSON object `{name: value}`: strings, numbers, `null` (missing). An absent
    /// key counts as missing; a key that is not an attribute is an error. Refuses every
    /// invalid value whatever [`Attribute::on_invalid`] says (see [`Schema::encode_json_with`]).
    pub fn encode_json(&self, record: &serde_json::Value) -> Result<EncodedRecord, RecordError> {
        self.encode_json_by(record, |_, encoded| encoded)
    }

    /// As [`Schema::encode_json`], applying every attribute's [`Attribute::on_invalid`]
    /// policy: under [`InvalidPolicy::Randomize`] an invalid value (also a boolean, array or
    /// object) becomes a uniformly drawn code ([`Attribute::encode_value_with`]; `rng` is the
    /// privacy CSPRNG on a device). A record that is not an object, or has a key that is not an
    /// attribute, is still an error: that is the app's mistake, not the person's data.
    pub fn encode_json_with<R: Rng + ?Sized>(
        &self,
        record: &serde_json::Value,
        rng: &mut R,
    ) -> Result<EncodedRecord, RecordError> {
        self.encode_json_by(record, |a, encoded| a.apply_invalid_policy(encoded, rng))
    }

    fn encode_json_by(
        &self,
        record: &serde_json::Value,
        mut policy: impl FnMut(&Attribute, Result<u32, RecordError>) -> Result<u32, RecordError>,
    ) -> Result<EncodedRecord, RecordError> {
        let obj = record
            .as_object()
            .ok_or_else(|| RecordError::UnsupportedJson {
                attribute: String::new(),
                value: record.to_string(),
            })?;
        if let Some(k) = obj.keys().find(|k| self.index_of(k).is_none()) {
            return Err(RecordError::UnknownAttribute {
                attribute: k.clone(),
            });
        }
        let codes = self
            .attributes
            .iter()
            .map(|a| {
                let encoded = match obj.get(&a.name) {
                    None | Some(serde_json::Value::Null) => a.encode_value(&Value::Missing),
                    Some(serde_json::Value::String(s)) => a.encode_value(&Value::Text(s.clone())),
                    Some(serde_json::Value::Number(n)) => {
                        // serde_json numbers without arbitrary precision always fit f64.
                        a.encode_value(&Value::Number(n.as_f64().unwrap_or(f64::NAN)))
                    }
                    Some(other) => Err(RecordError::UnsupportedJson {
                        attribute: a.name.clone(),
                        value: other.to_string(),
                    }),
                };
                policy(a, encoded)
            })
            .collect::<Result<_, _>>()?;
        Ok(EncodedRecord(codes))
    }

    /// Checks that `codes` fit the schema and wraps them.
    pub fn encoded(&self, codes: Vec<u32>) -> Result<EncodedRecord, RecordError> {
        if codes.len() != self.len() {
            return Err(RecordError::BadCodes(format!(
                "{} codes for {} attributes",
                codes.len(),
                self.len()
            )));
        }
        for (a, &c) in self.attributes.iter().zip(&codes) {
            if c as usize >= a.domain_size() {
                return Err(RecordError::BadCodes(format!(
                    "code {c} outside the domain of `{}` (size {})",
                    a.name,
                    a.domain_size()
                )));
            }
        }
        Ok(EncodedRecord(codes))
    }

    /// A CSV encoder for rows laid out as `header` (extra columns are ignored).
    /// Errors: [`RecordError::MissingColumn`] for an attribute without a column.
    pub fn csv_encoder<S: AsRef<str>>(&self, header: &[S]) -> Result<CsvEncoder<'_>, RecordError> {
        let positions: HashMap<&str, usize> = header
            .iter()
            .enumerate()
            .map(|(i, h)| (h.as_ref().trim(), i))
            .collect();
        let columns =
            self.attributes
                .iter()
                .map(|a| {
                    positions.get(a.name.as_str()).copied().ok_or_else(|| {
                        RecordError::MissingColumn {
                            attribute: a.name.clone(),
                        }
                    })
                })
                .collect::<Result<_, _>>()?;
        Ok(CsvEncoder {
            schema: self,
            columns,
            width: header.len(),
        })
    }

    /// Starts a [`RecordBuilder`].
    pub fn record(&self) -> RecordBuilder<'_> {
        RecordBuilder {
            schema: self,
            values: vec![Value::Missing; self.len()],
            error: None,
        }
    }

    /// Decodes codes back to values (see [`Attribute::decode`]). Panics if `codes` do not
    /// fit the schema.
    pub fn decode<R: Rng + ?Sized>(
        &self,
        codes: &[u32],
        numeric: NumericDecoding,
        rng: &mut R,
    ) -> Vec<DecodedValue> {
        assert_eq!(codes.len(), self.len(), "one code per attribute");
        self.attributes
            .iter()
            .zip(codes)
            .map(|(a, &c)| a.decode(c, numeric, rng))
            .collect()
    }
}

/// Encodes CSV rows with a fixed header layout; see [`Schema::csv_encoder`].
#[derive(Debug, Clone)]
pub struct CsvEncoder<'a> {
    schema: &'a Schema,
    columns: Vec<usize>,
    width: usize,
}

impl CsvEncoder<'_> {
    /// Encodes one row (fields in header order), refusing every invalid value whatever
    /// [`Attribute::on_invalid`] says (see [`CsvEncoder::encode_with`]).
    pub fn encode<S: AsRef<str>>(&self, row: &[S]) -> Result<EncodedRecord, RecordError> {
        self.encode_by(row, |_, encoded| encoded)
    }

    /// As [`CsvEncoder::encode`], applying every attribute's [`Attribute::on_invalid`]
    /// policy with `rng` (see [`Attribute::encode_value_with`]).
    pub fn encode_with<S: AsRef<str>, R: Rng + ?Sized>(
        &self,
        row: &[S],
        rng: &mut R,
    ) -> Result<EncodedRecord, RecordError> {
        self.encode_by(row, |a, encoded| a.apply_invalid_policy(encoded, rng))
    }

    fn encode_by<S: AsRef<str>>(
        &self,
        row: &[S],
        mut policy: impl FnMut(&Attribute, Result<u32, RecordError>) -> Result<u32, RecordError>,
    ) -> Result<EncodedRecord, RecordError> {
        if row.len() < self.width {
            return Err(RecordError::ShortRow {
                expected: self.width,
                found: row.len(),
            });
        }
        let codes = self
            .schema
            .attributes
            .iter()
            .zip(&self.columns)
            .map(|(a, &c)| policy(a, a.encode_value(&Value::Text(row[c].as_ref().to_owned()))))
            .collect::<Result<_, _>>()?;
        Ok(EncodedRecord(codes))
    }
}

/// Builds a record value by value: `schema.record().set("age", 37).set("sex", "Male").build()`.
/// Attributes never set count as missing.
#[derive(Debug, Clone)]
pub struct RecordBuilder<'a> {
    schema: &'a Schema,
    values: Vec<Value>,
    error: Option<RecordError>,
}

impl RecordBuilder<'_> {
    /// Sets attribute `name` (an unknown name is reported by [`RecordBuilder::build`]).
    pub fn set(mut self, name: &str, value: impl Into<Value>) -> Self {
        match self.schema.index_of(name) {
            Some(i) => self.values[i] = value.into(),
            None => {
                self.error.get_or_insert(RecordError::UnknownAttribute {
                    attribute: name.to_owned(),
                });
            }
        }
        self
    }

    /// Encodes the record, refusing every invalid value whatever [`Attribute::on_invalid`]
    /// says (see [`RecordBuilder::build_with`]). Errors: the first [`RecordError`].
    pub fn build(self) -> Result<EncodedRecord, RecordError> {
        self.build_by(|_, encoded| encoded)
    }

    /// As [`RecordBuilder::build`], applying every attribute's [`Attribute::on_invalid`]
    /// policy with `rng` (see [`Attribute::encode_value_with`]); an unknown attribute name is
    /// still an error.
    pub fn build_with<R: Rng + ?Sized>(self, rng: &mut R) -> Result<EncodedRecord, RecordError> {
        self.build_by(|a, encoded| a.apply_invalid_policy(encoded, rng))
    }

    fn build_by(
        self,
        mut policy: impl FnMut(&Attribute, Result<u32, RecordError>) -> Result<u32, RecordError>,
    ) -> Result<EncodedRecord, RecordError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let codes = self
            .schema
            .attributes
            .iter()
            .zip(&self.values)
            .map(|(a, v)| policy(a, a.encode_value(v)))
            .collect::<Result<_, _>>()?;
        Ok(EncodedRecord(codes))
    }
}

/// A key of a finite float that orders as the floats do (−0 and +0 share one), so that
/// bisection over keys visits every float between two others.
fn order_key(x: f64) -> i64 {
    // Reinterpreting the bits: sign-magnitude to two's complement.
    let bits = x.to_bits() as i64;
    if bits < 0 { -(bits & i64::MAX) } else { bits }
}

/// The float of an [`order_key`].
fn from_order_key(k: i64) -> f64 {
    if k < 0 {
        f64::from_bits(k.unsigned_abs() | (1 << 63))
    } else {
        f64::from_bits(k.unsigned_abs())
    }
}

/// The largest float below the finite `x`.
fn float_below(x: f64) -> f64 {
    from_order_key(order_key(x) - 1)
}

/// The smallest float `x` in `[lo, hi]` (finite, `lo ≤ hi`) with `pred(x)`, for a `pred` that is
/// false then true as `x` grows; `None` if `pred(hi)` is false. At most 64 calls of `pred`.
fn first_float_where(lo: f64, hi: f64, pred: impl Fn(f64) -> bool) -> Option<f64> {
    if !pred(hi) {
        return None;
    }
    // i128: the distance between two keys may exceed i64.
    let (mut l, mut h) = (i128::from(order_key(lo)), i128::from(order_key(hi)));
    while l < h {
        let m = l + (h - l) / 2;
        // `m` lies between two i64 keys.
        if pred(from_order_key(m as i64)) {
            h = m;
        } else {
            l = m + 1;
        }
    }
    Some(from_order_key(h as i64))
}

/// `(a + b) / 2`, also where `a + b` overflows (near the largest floats).
fn midpoint(a: f64, b: f64) -> f64 {
    let m = (a + b) / 2.0;
    if m.is_finite() { m } else { a / 2.0 + b / 2.0 }
}

/// The smallest and largest whole numbers in `[lo, hi]` whose `bin` (non-decreasing in the
/// value) is `code`, if there are any. At most 128 calls of `bin`.
fn whole_numbers_of_bin(
    lo: f64,
    hi: f64,
    code: u32,
    bin: impl Fn(f64) -> u32,
) -> Option<(f64, f64)> {
    let (lo, hi) = (lo.ceil(), hi.floor());
    if lo > hi {
        return None;
    }
    // Past the first float in a bin ≥ code, the next whole number is too (bins only grow).
    let a = first_float_where(lo, hi, |x| bin(x) >= code)?.ceil();
    let b = match first_float_where(lo, hi, |x| bin(x) > code) {
        None => hi,
        Some(y) if y <= lo => return None,
        Some(y) => float_below(y).floor(),
    };
    (a <= b).then_some((a, b))
}

/// A whole number drawn from `[a, b]` (whole, finite, `a ≤ b`): uniform over the integers
/// where they are exact floats (|a|, |b| ≤ 2^53); beyond, where every float is whole, a
/// uniform real in `[a, b]` rounded to the nearest float.
fn uniform_whole<R: Rng + ?Sized>(a: f64, b: f64, rng: &mut R) -> f64 {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if a.abs() <= EXACT && b.abs() <= EXACT {
        // Exact conversions: whole numbers within ±2^53.
        rng.random_range(a as i64..=b as i64) as f64
    } else {
        // `b − a` is finite: a valid schema's `max − min` is.
        (a + (b - a) * rng.random::<f64>()).round().clamp(a, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    fn schema() -> Schema {
        serde_json::from_value(serde_json::json!({"attributes": [
            {"name": "age", "type": "numeric", "min": 17, "max": 90, "bins": 16, "integer": true},
            {"name": "w", "type": "numeric", "min": 0.0, "max": 1.0, "bins": 4, "out_of_range": "clamp"},
            {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
            {"name": "wc", "type": "categorical", "labels": ["a", "b", "c"],
             "missing": "category", "missing_markers": ["?", ""]}
        ]}))
        .unwrap()
    }

    fn err(json: serde_json::Value) -> String {
        serde_json::from_value::<Schema>(json)
            .unwrap_err()
            .to_string()
    }

    /// `bins: "auto"`: a unit grid for small integer ranges (every whole number its own
    /// code, decoded exactly), 1024 cells otherwise or `grid` cells; JSON round trip; the
    /// working bins are exactly the bins of `bins: max_bins`.
    #[test]
    fn auto_bins_grid_and_working_bins() {
        let s: Schema = serde_json::from_value(serde_json::json!({"attributes": [
            {"name": "h", "type": "numeric", "min": 1, "max": 99, "bins": "auto",
             "integer": true, "points": [40]},
            {"name": "g", "type": "numeric", "min": 0, "max": 99999, "bins": "auto",
             "integer": true, "max_bins": 8},
            {"name": "r", "type": "numeric", "min": 0.0, "max": 1.0, "bins": "auto", "grid": 10}
        ]}))
        .unwrap();
        assert_eq!(s.domain_sizes(), vec![100, 1024, 10]);
        let a = &s.attributes()[0];
        assert_eq!((a.grid_cells(), a.working_bins()), (Some(99), Some(16)));
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(1);
        for x in 1..=99 {
            let c = a.encode_value(&Value::Number(f64::from(x))).unwrap();
            let expected = if x == 40 { 99 } else { x as u32 - 1 };
            assert_eq!(c, expected, "{x}");
            assert_eq!(
                a.decode(c, NumericDecoding::Uniform, &mut rng),
                DecodedValue::Number(f64::from(x))
            );
        }
        let back: Schema = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert!(
            serde_json::to_string(&s)
                .unwrap()
                .contains(r#""bins":"auto""#)
        );
        // Working bins: the fixed-count encoding of every code's value, points apart.
        for (attr, m) in [
            (&s.attributes()[0], 16),
            (&s.attributes()[1], 8),
            (&s.attributes()[2], 16),
        ] {
            let mut fixed = attr.clone();
            if let AttributeKind::Numeric {
                bins,
                grid,
                max_bins,
                ..
            } = &mut fixed.kind
            {
                *bins = NumericBins::Count(m.min(attr.grid_cells().unwrap()));
                *grid = None;
                *max_bins = None;
            }
            let cuts = attr.working_cuts().unwrap();
            for c in 0..attr.domain_size() as u32 {
                let x = attr.decode(c, NumericDecoding::Midpoint, &mut rng);
                let DecodedValue::Number(x) = x else { panic!() };
                if c == 39 && attr.name == "h" {
                    continue; // the grid cell of the point 40 holds nobody
                }
                let want = fixed.encode_value(&Value::Number(x)).unwrap();
                assert_eq!(
                    crate::factor::bin_of(c, &cuts),
                    want,
                    "{} code {c}",
                    attr.name
                );
            }
        }
        // Fewer cells than max_bins: every cell a working bin.
        assert_eq!(
            s.attributes()[2].working_cuts().unwrap(),
            (1..10).collect::<Vec<u32>>()
        );
    }

    #[test]
    fn auto_bins_are_validated() {
        let one = |extra: serde_json::Value| {
            let mut a = serde_json::json!({"name": "n", "type": "numeric", "min": 0, "max": 10});
            a.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            serde_json::json!({"attributes": [a]})
        };
        let e = err(one(serde_json::json!({"bins": "auto", "grid": 1})));
        assert!(e.contains("`n`: grid must be within 2..=4096"), "{e}");
        let e = err(one(serde_json::json!({"bins": "auto", "grid": 5000})));
        assert!(e.contains("grid must be within"), "{e}");
        let e = err(one(serde_json::json!({"bins": "auto", "max_bins": 1})));
        assert!(e.contains("`n`: max_bins must be within 2..=1024"), "{e}");
        let e = err(one(serde_json::json!({"bins": 8, "grid": 64})));
        assert!(e.contains("need bins \"auto\""), "{e}");
        let e = err(one(serde_json::json!({"bins": "many"})));
        assert!(e.contains("did not match"), "{e}");
        // A fixed count keeps its old form and meaning.
        let s: Schema = serde_json::from_value(one(serde_json::json!({"bins": 5}))).unwrap();
        assert_eq!(s.domain_sizes(), vec![5]);
        assert_eq!(s.attributes()[0].working_cuts(), None);
        assert!(!serde_json::to_string(&s).unwrap().contains("grid"));
    }

    #[test]
    fn validation_errors_name_the_attribute() {
        let e = err(serde_json::json!({"attributes": [
            {"name": "x", "type": "categorical", "labels": ["a", "b"]},
            {"name": "x", "type": "categorical", "labels": ["a", "b"]}]}));
        assert!(e.contains("duplicate attribute name `x`"), "{e}");
        let e = err(
            serde_json::json!({"attributes": [{"name": "c", "type": "categorical", "labels": []}]}),
        );
        assert!(e.contains("`c`: empty domain"), "{e}");
        let e = err(
            serde_json::json!({"attributes": [{"name": "c", "type": "categorical", "labels": ["x"]}]}),
        );
        assert!(e.contains("`c`: domain has a single value"), "{e}");
        let e = err(
            serde_json::json!({"attributes": [{"name": "n", "type": "numeric", "min": 0, "max": 1, "bins": 0}]}),
        );
        assert!(e.contains("`n`: bins must be >= 1"), "{e}");
        let e = err(
            serde_json::json!({"attributes": [{"name": "n", "type": "numeric", "min": 2, "max": 1, "bins": 3}]}),
        );
        assert!(e.contains("`n`: min (2) must be < max (1)"), "{e}");
        let a = Attribute {
            name: "inf".into(),
            kind: AttributeKind::Numeric {
                min: 0.0,
                max: f64::INFINITY,
                bins: NumericBins::Count(3),
                integer: false,
                out_of_range: OutOfRangePolicy::Reject,
                points: vec![],
                grid: None,
                max_bins: None,
                scale: NumericScale::Linear,
            },
            missing: MissingPolicy::Reject,
            missing_markers: vec![],
            on_invalid: InvalidPolicy::Reject,
        };
        assert_eq!(
            Schema::new(vec![a]),
            Err(SchemaError::NonFiniteBound {
                attribute: "inf".into()
            })
        );
        // One bin is allowed once "missing" makes it a two-value domain.
        let ok = serde_json::from_value::<Schema>(serde_json::json!({"attributes": [
            {"name": "n", "type": "numeric", "min": 0, "max": 1, "bins": 1, "missing": "category"}]}));
        assert_eq!(ok.unwrap().domain_sizes(), vec![2]);
    }

    #[test]
    fn encoding_json_csv_and_builder_agree() {
        let s = schema();
        let a = s
            .encode_json(&serde_json::json!({"age": 90, "w": 7.5, "sex": "M", "wc": null}))
            .unwrap();
        let enc = s.csv_encoder(&["extra", "wc", "sex", "w", "age"]).unwrap();
        let b = enc.encode(&["zz", "?", "M", "7.5", "90"]).unwrap();
        let c = s
            .record()
            .set("age", 90)
            .set("w", 7.5)
            .set("sex", "M")
            .build()
            .unwrap();
        assert_eq!(a.codes(), &[15, 3, 1, 3]);
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(
            s.encode_json(&serde_json::json!({"age": 17, "w": 0, "sex": "F", "wc": "b"}))
                .unwrap()
                .codes(),
            &[0, 0, 0, 1]
        );
    }

    #[test]
    fn encoding_errors_name_attribute_and_value() {
        let s = schema();
        let e = s
            .record()
            .set("age", 91)
            .set("sex", "M")
            .build()
            .unwrap_err();
        assert!(
            matches!(e, RecordError::OutOfRange { ref attribute, value, .. } if attribute == "age" && value == 91.0)
        );
        let e = s
            .record()
            .set("age", 30)
            .set("w", 0.5)
            .set("sex", "X")
            .build()
            .unwrap_err();
        assert_eq!(e.to_string(), "attribute `sex`: unknown label \"X\"");
        let e = s.record().set("age", "abc").build().unwrap_err();
        assert_eq!(
            e.to_string(),
            "attribute `age`: not a finite number: \"abc\""
        );
        let e = s.record().set("age", 30).set("w", 0.5).build().unwrap_err();
        assert_eq!(
            e,
            RecordError::Missing {
                attribute: "sex".into()
            }
        );
        let e = s.record().set("nope", 1).build().unwrap_err();
        assert_eq!(
            e,
            RecordError::UnknownAttribute {
                attribute: "nope".into()
            }
        );
        assert!(matches!(
            s.csv_encoder(&["age"]),
            Err(RecordError::MissingColumn { .. })
        ));
        assert!(s.encode_json(&serde_json::json!([1])).is_err());
        assert!(s.encode_json(&serde_json::json!({"age": true})).is_err());
    }

    const ASINH_PINNED_VALUES: [f64; 14] = [
        -50000.0, -4518.0, -700.0, -100.0, -1.0, 0.0, 1.0, 99.0, 544.0, 1000.0, 5000.0, 25000.0,
        102127.0, 150000.0,
    ];

    /// An asinh scale: cells are equal-width in `asinh(x / unit)`, so a balance-like range
    /// (−50,000…150,000) puts hundreds of cells where the bulk is (−1,000…3,000; a linear
    /// grid gives it 22 of 1,024); codes grow with the value; every cell's decoded values
    /// encode back to it; working bins are runs of cells; a linear schema serializes as
    /// before (no `scale` key, so its digest is unchanged); a unit ≤ 0 is refused.
    #[test]
    fn asinh_scale_spreads_a_heavy_tailed_range() {
        let attr = |scale: serde_json::Value| -> Attribute {
            let mut v = serde_json::json!({"name": "balance", "type": "numeric",
                "min": -50000, "max": 150000, "bins": "auto", "integer": true});
            if !scale.is_null() {
                v["scale"] = scale;
            }
            let schema: Schema = serde_json::from_value(serde_json::json!({"attributes": [v,
                {"name": "c", "type": "categorical", "labels": ["a", "b"]}]}))
            .unwrap();
            schema.attributes()[0].clone()
        };
        let linear = attr(serde_json::Value::Null);
        let asinh = attr(serde_json::json!({"asinh": 100.0}));
        assert!(
            serde_json::to_value(&linear)
                .unwrap()
                .get("scale")
                .is_none()
        );
        assert_eq!(
            serde_json::to_value(&asinh).unwrap()["scale"],
            serde_json::json!({"asinh": 100.0})
        );
        assert_eq!(asinh.grid_cells(), Some(DEFAULT_GRID));
        let code = |a: &Attribute, x: f64| a.encode_value(&Value::Number(x)).unwrap();
        let bulk = |a: &Attribute| code(a, 3000.0) - code(a, -1000.0) + 1;
        assert_eq!(bulk(&linear), 22); // cells of 195.3
        assert!(bulk(&asinh) > 400, "{}", bulk(&asinh));
        // Codes grow with the value; the extremes take the end cells.
        let xs: Vec<f64> = (-500..=1500).map(|i| f64::from(i) * 100.0).collect();
        assert!(
            xs.windows(2)
                .all(|w| code(&asinh, w[0]) <= code(&asinh, w[1]))
        );
        assert_eq!(code(&asinh, -50000.0), 0);
        assert_eq!(code(&asinh, 150000.0), DEFAULT_GRID - 1);
        // Decoded values are whole numbers of the code's cell (or the cell's rounded middle
        // when it holds no whole number).
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
        let mut holding = 0;
        for c in 0..DEFAULT_GRID {
            for how in [NumericDecoding::Uniform, NumericDecoding::Midpoint] {
                let DecodedValue::Number(x) = asinh.decode(c, how, &mut rng) else {
                    panic!("a number")
                };
                assert_eq!(x.fract(), 0.0);
                if code(&asinh, x) == c {
                    holding += 1;
                }
            }
        }
        // Near 0 a cell is narrower than 1 (about 1.5 wide at the unit): a few hold none.
        assert!(holding > 2 * DEFAULT_GRID - 100, "{holding}");
        // Pinned codes, the same list the WASM client's node test checks (wasm-client/tests/
        // node.rs `asinh_codes_match_the_native_sdk`): the platforms' asinh agree here.
        let pinned: Vec<u32> = ASINH_PINNED_VALUES
            .iter()
            .map(|&x| code(&asinh, x))
            .collect();
        assert_eq!(
            pinned,
            [
                0, 165, 292, 413, 473, 474, 474, 534, 638, 680, 790, 900, 997, 1023
            ]
        );
        let cuts = asinh.working_cuts().unwrap();
        assert_eq!(cuts.len() + 1, DEFAULT_MAX_BINS as usize);
        assert!(cuts.windows(2).all(|w| w[0] < w[1]));
        for bad in [0.0, -5.0] {
            let v = serde_json::json!({"attributes": [
                {"name": "b", "type": "numeric", "min": 0, "max": 10, "bins": 4,
                 "scale": {"asinh": bad}},
                {"name": "c", "type": "categorical", "labels": ["a", "b"]}]});
            let e = serde_json::from_value::<Schema>(v).unwrap_err().to_string();
            assert!(e.contains("asinh scale's unit"), "{e}");
        }
    }

    #[test]
    fn decoding_numeric_bins() {
        let s = schema();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let age = &s.attributes()[0];
        // Bin 0 of age covers [17, 21.5625): whole numbers 17..=21.
        for _ in 0..200 {
            let DecodedValue::Number(x) = age.decode(0, NumericDecoding::Uniform, &mut rng) else {
                panic!()
            };
            assert!((17.0..=21.0).contains(&x) && x.fract() == 0.0, "{x}");
        }
        assert_eq!(
            age.decode(15, NumericDecoding::Midpoint, &mut rng),
            DecodedValue::Number(88.0)
        );
        let w = &s.attributes()[1];
        assert_eq!(
            w.decode(1, NumericDecoding::Midpoint, &mut rng),
            DecodedValue::Number(0.375)
        );
        assert_eq!(
            s.attributes()[3].decode(3, NumericDecoding::Midpoint, &mut rng),
            DecodedValue::Missing
        );
    }

    /// Point masses take their own codes (after the bins, before "missing"), decode to
    /// exactly their value, are never drawn for a bin, and are validated; a schema without
    /// them serializes as before.
    #[test]
    fn point_masses() {
        let json = serde_json::json!({"attributes": [{"name": "hours", "type": "numeric",
            "min": 0, "max": 100, "bins": 10, "integer": true, "points": [0, 40],
            "missing": "category"}]});
        let s: Schema = serde_json::from_value(json).unwrap();
        let a = &s.attributes()[0];
        assert_eq!(a.domain_size(), 13);
        assert_eq!(a.missing_code(), Some(12));
        let code = |x: f64| a.encode_value(&Value::Number(x)).unwrap();
        assert_eq!(
            (code(0.0), code(40.0), code(41.0), code(1.0)),
            (10, 11, 4, 0)
        );
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
        assert_eq!(
            a.decode(11, NumericDecoding::Uniform, &mut rng),
            DecodedValue::Number(40.0)
        );
        for _ in 0..2000 {
            let DecodedValue::Number(x) = a.decode(4, NumericDecoding::Uniform, &mut rng) else {
                panic!("a bin decodes to a number");
            };
            assert!((40.0..50.0).contains(&x) && x != 40.0, "{x}");
        }
        for points in ["[5, 5]", "[101]", "[1.5]", "[-1]"] {
            let text = format!(
                r#"{{"attributes": [{{"name": "n", "type": "numeric", "min": 0, "max": 100,
                "bins": 4, "integer": true, "points": {points}}}]}}"#
            );
            let e = serde_json::from_str::<Schema>(&text)
                .unwrap_err()
                .to_string();
            assert!(e.contains("`n`: point"), "{points}: {e}");
        }
        let plain = r#"{"attributes":[{"name":"n","type":"numeric","min":0.0,"max":1.0,"bins":2,"integer":false,"out_of_range":"reject","missing":"reject","missing_markers":[""]}]}"#;
        let s: Schema = serde_json::from_str(plain).unwrap();
        assert_eq!(serde_json::to_string(&s).unwrap(), plain);
    }

    /// Repeated points are found in n log n: 400,000 points (a create body of a few MB;
    /// the pairwise scan made it 8·10^10 comparisons, a run of minutes that CI's time limit
    /// would stop) validate, and a repeat at the far end is still refused.
    #[test]
    fn many_points_validate() {
        let n = 400_000;
        let schema = |points: Vec<f64>| {
            serde_json::from_value::<Schema>(serde_json::json!({"attributes": [
                {"name": "n", "type": "numeric", "min": 0, "max": n, "bins": 4,
                 "integer": true, "points": points}]}))
        };
        let points: Vec<f64> = (0..n).map(|i| i as f64).rev().collect();
        assert!(schema(points.clone()).is_ok());
        let mut repeated = points;
        repeated[n - 1] = repeated[0];
        let e = schema(repeated).unwrap_err().to_string();
        assert!(e.contains("`n`: point"), "{e}");
    }

    fn randomizing_schema() -> Schema {
        serde_json::from_value(serde_json::json!({"attributes": [
            {"name": "age", "type": "numeric", "min": 17, "max": 90, "bins": 16, "integer": true,
             "on_invalid": "randomize"},
            {"name": "sex", "type": "categorical", "labels": ["F", "M"], "on_invalid": "randomize"},
            {"name": "wc", "type": "categorical", "labels": ["a", "b", "c"],
             "missing": "category", "missing_markers": ["?"], "on_invalid": "randomize"},
            {"name": "strict", "type": "categorical", "labels": ["x", "y"]}
        ]}))
        .unwrap()
    }

    /// `on_invalid: randomize`: every kind of invalid value (missing, unknown label, not a
    /// number, out of range, a boolean) encodes to a code of the domain with the `_with`
    /// encoders, while the plain ones still refuse it; valid values encode as before (no
    /// draw); `missing: category` still gives "missing" its code; an attribute without the
    /// policy, an unknown key and a record that is not an object are still errors.
    #[test]
    fn on_invalid_randomize_replaces_every_invalid_value() {
        let s = randomizing_schema();
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(11);
        let valid = serde_json::json!({"age": 37, "sex": "M", "wc": "?", "strict": "y"});
        let codes = s.encode_json(&valid).unwrap();
        assert_eq!(codes.codes(), &[4, 1, 3, 1]);
        assert_eq!(s.encode_json_with(&valid, &mut rng).unwrap(), codes);
        for (attribute, value) in [
            ("age", serde_json::json!(null)),
            ("age", serde_json::json!(91)),
            ("age", serde_json::json!("old")),
            ("age", serde_json::json!(true)),
            ("sex", serde_json::json!("X")),
            ("sex", serde_json::json!([1])),
            ("wc", serde_json::json!("d")),
        ] {
            let mut record = valid.clone();
            record[attribute] = value.clone();
            let e = s.encode_json(&record).unwrap_err();
            assert!(e.is_invalid_value(), "{attribute} = {value}: {e}");
            let i = s.index_of(attribute).unwrap();
            let size = s.attributes()[i].domain_size() as u32;
            for _ in 0..20 {
                let c = s.encode_json_with(&record, &mut rng).unwrap();
                assert!(c.codes()[i] < size, "{attribute} = {value}");
                for (j, (&got, &want)) in c.codes().iter().zip(codes.codes()).enumerate() {
                    if j != i {
                        assert_eq!(got, want, "only `{attribute}` is drawn");
                    }
                }
            }
        }
        // The CSV encoder and the builder follow the same policy.
        let enc = s.csv_encoder(&["age", "sex", "wc", "strict"]).unwrap();
        assert!(enc.encode(&["200", "M", "a", "x"]).is_err());
        assert!(
            enc.encode_with(&["200", "M", "a", "x"], &mut rng)
                .unwrap()
                .codes()[0]
                < 16
        );
        let built = s.record().set("age", 30).set("sex", "?").set("strict", "x");
        assert!(built.clone().build().is_err());
        assert!(built.build_with(&mut rng).unwrap().codes()[1] < 2);
        // Not covered: an attribute under `reject`, the app's own mistakes.
        let mut record = valid.clone();
        record["strict"] = serde_json::json!("z");
        assert!(matches!(
            s.encode_json_with(&record, &mut rng),
            Err(RecordError::UnknownLabel { .. })
        ));
        let mut record = valid.clone();
        record["nope"] = serde_json::json!(1);
        assert!(matches!(
            s.encode_json_with(&record, &mut rng),
            Err(RecordError::UnknownAttribute { .. })
        ));
        assert!(
            s.encode_json_with(&serde_json::json!([1]), &mut rng)
                .is_err()
        );
        assert!(
            s.record()
                .set("nope", 1)
                .build_with(&mut rng)
                .unwrap_err()
                .to_string()
                .contains("unknown attribute")
        );
    }

    /// The replacement of an invalid value is uniform over the whole domain ("missing"
    /// included): χ² goodness of fit at α = 1e-6 with a fixed seed, 11 codes × 4,000 draws;
    /// power self-check: the same statistic rejects a draw that skips the "missing" code.
    #[test]
    fn on_invalid_replacement_is_uniform() {
        use crate::mechanism::tests::{ALPHA, chi2_critical};
        let a: Attribute = serde_json::from_value(serde_json::json!({"name": "h",
            "type": "numeric", "min": 0, "max": 100, "bins": 9, "points": [40],
            "missing": "category", "on_invalid": "randomize"}))
        .unwrap();
        let k = a.domain_size();
        assert_eq!(k, 11);
        let n = 4_000 * k;
        let chi2 = |counts: &[u64]| {
            let expected = n as f64 / k as f64;
            counts
                .iter()
                .map(|&c| (c as f64 - expected).powi(2) / expected)
                .sum::<f64>()
        };
        let critical = chi2_critical(k - 1, ALPHA);
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(2026);
        let mut counts = vec![0u64; k];
        for i in 0..n {
            // Each kind of invalid value in turn.
            let v = match i % 3 {
                0 => Value::Number(-5.0),
                1 => Value::Text("many".into()),
                _ => Value::Number(f64::NAN),
            };
            counts[a.encode_value_with(&v, &mut rng).unwrap() as usize] += 1;
        }
        let stat = chi2(&counts);
        assert!(stat < critical, "χ² {stat} ≥ {critical}: {counts:?}");
        // Power: a draw over all codes but "missing" is rejected.
        let mut skewed = vec![0u64; k];
        for _ in 0..n {
            skewed[rng.random_range(0..k - 1)] += 1;
        }
        assert!(chi2(&skewed) > critical, "{skewed:?}");
    }

    /// The policy is optional in JSON, left out when it is the default (older schemas read
    /// and write byte for byte as before), and round-trips when set.
    #[test]
    fn on_invalid_json() {
        let s = randomizing_schema();
        assert_eq!(s.attributes()[0].on_invalid, InvalidPolicy::Randomize);
        assert_eq!(s.attributes()[3].on_invalid, InvalidPolicy::Reject);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json.matches(r#""on_invalid":"randomize""#).count(), 3);
        assert!(!json.contains(r#""on_invalid":"reject""#));
        assert_eq!(serde_json::from_str::<Schema>(&json).unwrap(), s);
        let e = err(serde_json::json!({"attributes": [
            {"name": "c", "type": "categorical", "labels": ["a", "b"], "on_invalid": "drop"}]}));
        assert!(e.contains("unknown variant `drop`"), "{e}");
    }

    /// An integer numeric attribute over `[min, max]` in `bins` equal-width bins (`None`:
    /// `"auto"`) on `scale`.
    fn integer_attribute(min: f64, max: f64, bins: Option<u32>, scale: NumericScale) -> Attribute {
        Attribute {
            name: "n".into(),
            kind: AttributeKind::Numeric {
                min,
                max,
                bins: bins.map_or(NumericBins::AUTO, NumericBins::Count),
                integer: true,
                out_of_range: OutOfRangePolicy::Reject,
                points: vec![],
                grid: None,
                max_bins: None,
                scale,
            },
            missing: MissingPolicy::Reject,
            missing_markers: vec![],
            on_invalid: InvalidPolicy::Reject,
        }
    }

    /// Decodes every code of `attr` both ways on another thread; panics if that takes longer
    /// than 30 s (a decode that never returns fails the test instead of hanging it).
    fn decode_every_code(attr: &Attribute, seed: u64) -> Vec<(u32, f64, f64)> {
        let attr = attr.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let out: Vec<(u32, f64, f64)> = (0..attr.domain_size() as u32)
                .map(|c| {
                    let mut number = |how| match attr.decode(c, how, &mut rng) {
                        DecodedValue::Number(x) => x,
                        other => panic!("code {c}: {other:?}"),
                    };
                    (
                        c,
                        number(NumericDecoding::Midpoint),
                        number(NumericDecoding::Uniform),
                    )
                })
                .collect();
            let _ = tx.send(out);
        });
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("decoding did not finish within 30 s")
    }

    #[test]
    fn integer_decode_terminates_beyond_2_pow_53() {
        let two53 = 9_007_199_254_740_992.0_f64;
        for (min, max) in [
            (two53, two53 * 4.0),
            (-two53 * 4.0, -two53),
            (-1e300, 1e300),
            (0.0, f64::MAX / 4.0),
            (-f64::MAX / 2.0, f64::MAX / 2.0),
        ] {
            for bins in [Some(3), Some(40), None] {
                for scale in [NumericScale::Linear, NumericScale::Asinh(1.0)] {
                    let attr = integer_attribute(min, max, bins, scale);
                    attr.validate(0).unwrap();
                    for (c, mid, uniform) in decode_every_code(&attr, 7) {
                        for x in [mid, uniform] {
                            assert!(x.is_finite() && x.fract() == 0.0, "{min} {max} {c}: {x}");
                            assert!((min..=max).contains(&x), "{min} {max} code {c}: {x}");
                            assert_eq!(scale.bin(x, min, max, attr.grid_cells().unwrap()), c);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bounds_whose_difference_overflows_are_refused() {
        let wide = integer_attribute(-f64::MAX, f64::MAX, Some(4), NumericScale::Linear);
        assert_eq!(
            Schema::new(vec![wide]),
            Err(SchemaError::RangeTooWide {
                attribute: "n".into()
            })
        );
        let json = serde_json::json!({"attributes": [{"name": "n", "type": "numeric",
            "min": -1e308, "max": 1e308, "bins": 4}]});
        assert!(serde_json::from_value::<Schema>(json).is_err());
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(age in 0u32..16, w in 0u32..4, sex in 0u32..2, wc in 0u32..4, seed: u64) {
            let s = schema();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let codes = vec![age, w, sex, wc];
            for mode in [NumericDecoding::Uniform, NumericDecoding::Midpoint] {
                let decoded = s.decode(&codes, mode, &mut rng);
                let obj: serde_json::Map<String, serde_json::Value> = s.attributes().iter()
                    .zip(&decoded).map(|(a, v)| (a.name.clone(), v.to_json())).collect();
                let back = s.encode_json(&serde_json::Value::Object(obj)).unwrap();
                prop_assert_eq!(back.codes(), &codes[..]);
            }
        }

        /// Integer decoding over any valid bounds, including beyond 2^53 and near the
        /// largest floats: it returns a finite value, and for bins wide enough to hold whole
        /// numbers a whole number of the decoded code's bin.
        #[test]
        fn integer_decode_at_extreme_bounds(
            a in prop_oneof![-1e18f64..1e18, -1e300f64..1e300, proptest::num::f64::NORMAL],
            b in prop_oneof![-1e18f64..1e18, -1e300f64..1e300, proptest::num::f64::NORMAL],
            bins in proptest::option::of(1u32..64),
            asinh in proptest::option::of(1e-3f64..1e12),
            seed: u64,
        ) {
            let (min, max) = if a < b { (a, b) } else { (b, a) };
            let scale = asinh.map_or(NumericScale::Linear, NumericScale::Asinh);
            let attr = integer_attribute(min, max, bins, scale);
            prop_assume!(attr.validate(0).is_ok());
            let cells = attr.grid_cells().unwrap();
            // Linear bins at least 2 wide hold whole numbers: the value must be one of them.
            let wide = scale == NumericScale::Linear && (max - min) / f64::from(cells) >= 2.0;
            for (c, mid, uniform) in decode_every_code(&attr, seed) {
                for x in [mid, uniform] {
                    prop_assert!(x.is_finite(), "code {}: {}", c, x);
                    if wide {
                        prop_assert!(x.fract() == 0.0 && (min..=max).contains(&x), "code {}: {}", c, x);
                        prop_assert_eq!(scale.bin(x, min, max, cells), c);
                    }
                }
            }
        }

        #[test]
        fn schema_json_round_trip(bins in 1u32..40, min in -1e6f64..1e6, width in 1e-3f64..1e6, labels in proptest::collection::hash_set("[a-z]{1,6}", 2..10)) {
            let labels: Vec<String> = labels.into_iter().collect();
            let s = Schema::new(vec![
                Attribute { name: "n".into(), kind: AttributeKind::Numeric { min, max: min + width, bins: NumericBins::Count(bins + 1), integer: false, out_of_range: OutOfRangePolicy::Clamp, points: vec![min], grid: None, max_bins: None, scale: NumericScale::Linear }, missing: MissingPolicy::Reject, missing_markers: vec!["?".into()], on_invalid: InvalidPolicy::Reject },
                Attribute { name: "c".into(), kind: AttributeKind::Categorical { labels }, missing: MissingPolicy::Category, missing_markers: vec![], on_invalid: InvalidPolicy::Randomize },
            ]).unwrap();
            let json = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(serde_json::from_str::<Schema>(&json).unwrap(), s);
        }
    }
}
