//! # ldpsyn-sim
//!
//! The offline side of the aggregator, over the estimation engine ([`ldpsyn_engine`]) and
//! without the HTTP service (which does not depend on this crate):
//!
//! - simulation: populations of encoded records ([`Population`]), a seeded Bayesian-network
//!   population generator ([`BayesNet`]), CSV loading through a schema with resampling
//!   ([`load_csv`]), and the in-process simulator ([`Simulation`]) that runs a collection end
//!   to end without HTTP;
//! - [`eval`]: utility metrics (k-way marginal TVD, numeric fidelity, ML efficacy);
//! - [`infer`]: a proposed schema from a CSV file (`ldpsyn-aggregator schema infer`).
//!
//! ```
//! use ldpsyn::Epsilon;
//! use ldpsyn::wire::{PrivIncrParams, Protocol};
//! use ldpsyn_engine::{Engine, EngineOptions};
//! use ldpsyn_sim::{BayesNet, Simulation};
//!
//! let net = BayesNet::standard();
//! let population = net.sample(20_000, 1);
//! let engine = Engine::from_parts(
//!     net.dims(),
//!     Epsilon::new(4.0).unwrap(),
//!     20_000,
//!     Protocol::Auto(PrivIncrParams::default()),
//!     EngineOptions::default(),
//! )
//! .unwrap();
//! let run = Simulation::new(&engine, &population).seed(7).run().unwrap();
//! let rows: Vec<Vec<u32>> = run.model.synthesize(10, 42).collect();
//! assert_eq!(rows.len(), 10);
//! ```
#![warn(missing_docs)]

pub mod bayesnet;
pub mod eval;
pub mod infer;
#[cfg(test)]
mod properties;
mod simulate;

use std::path::Path;

use ldpsyn::schema::{AttributeKind, Schema};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

pub use bayesnet::{BayesNet, Dependence, Node, cramers_v};
pub use simulate::{RecordedReport, SimRun, Simulation};

/// Errors of the simulation (population, CSV loading, simulator).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The CSV file cannot be read or parsed.
    #[error("CSV: {0}")]
    Csv(#[from] csv::Error),
    /// The CSV header lacks a schema attribute.
    #[error("CSV header: {0}")]
    Header(#[from] ldpsyn::schema::RecordError),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] ldpsyn_engine::EngineError),
    /// A mechanism failed.
    #[error(transparent)]
    Mechanism(#[from] ldpsyn::mechanism::MechanismError),
    /// The population is empty or does not fit the engine's schema.
    #[error("population: {0}")]
    Population(String),
}

/// Encoded records: `n × d` codes, row-major, with the domain sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Population {
    dims: Vec<usize>,
    codes: Vec<u32>,
}

impl Population {
    /// Wraps row-major codes. Errors: length not a multiple of `d`, or a code out of domain.
    pub fn new(dims: Vec<usize>, codes: Vec<u32>) -> Result<Self, SimError> {
        let d = dims.len();
        if d == 0 || codes.len() % d != 0 {
            return Err(SimError::Population("codes are not n × d".into()));
        }
        if codes
            .iter()
            .enumerate()
            .any(|(i, &c)| c as usize >= dims[i % d])
        {
            return Err(SimError::Population("code outside its domain".into()));
        }
        Ok(Self { dims, codes })
    }

    /// Collects rows (each of length d). Errors as [`Population::new`].
    pub fn from_rows(
        dims: Vec<usize>,
        rows: impl IntoIterator<Item = Vec<u32>>,
    ) -> Result<Self, SimError> {
        let codes: Vec<u32> = rows.into_iter().flatten().collect();
        Self::new(dims, codes)
    }

    /// Domain sizes.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }
    /// Number of attributes d.
    pub fn d(&self) -> usize {
        self.dims.len()
    }
    /// Number of records n.
    pub fn len(&self) -> usize {
        self.codes.len() / self.dims.len()
    }
    /// No records.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }
    /// Record `i` (panics if `i ≥ n`).
    pub fn row(&self, i: usize) -> &[u32] {
        let d = self.d();
        &self.codes[i * d..(i + 1) * d]
    }
    /// All rows.
    pub fn rows(&self) -> impl Iterator<Item = &[u32]> {
        self.codes.chunks(self.d())
    }
    /// The flat codes.
    pub fn codes(&self) -> &[u32] {
        &self.codes
    }

    /// `n` records drawn uniformly with replacement (seeded): [`Population::resample_order`].
    pub fn resample(&self, n: usize, seed: u64) -> Population {
        self.select(&self.resample_order(n, seed))
    }

    /// The rows of `n` records drawn uniformly with replacement (seeded), in draw order:
    /// `resample(n, seed)` is `select(&resample_order(n, seed))`, in 4 bytes per record.
    /// Panics if `n > 0` and the population is empty, or if it holds 2³² records or more.
    pub fn resample_order(&self, n: usize, seed: u64) -> Vec<u32> {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let m = u32::try_from(self.len()).expect("fewer than 2³² records");
        assert!(m > 0 || n == 0, "resampling needs a record");
        (0..n)
            .map(|_| rng.random_range(0..m as usize) as u32)
            .collect()
    }

    /// The records at `order` (row indices, repeats allowed), in that order. Panics if an
    /// index is out of range.
    pub fn select(&self, order: &[u32]) -> Population {
        let mut codes = Vec::with_capacity(order.len() * self.d());
        for &i in order {
            codes.extend_from_slice(self.row(i as usize));
        }
        Population {
            dims: self.dims.clone(),
            codes,
        }
    }

    /// The records in a seeded random order (arrival order of simulated users).
    pub fn shuffled(&self, seed: u64) -> Population {
        self.select(&self.shuffled_order(seed))
    }

    /// The row order of [`Population::shuffled`]. Panics if the population holds 2³²
    /// records or more.
    pub fn shuffled_order(&self, seed: u64) -> Vec<u32> {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let m = u32::try_from(self.len()).expect("fewer than 2³² records");
        let mut idx: Vec<u32> = (0..m).collect();
        for i in (1..idx.len()).rev() {
            idx.swap(i, rng.random_range(0..=i));
        }
        idx
    }

    /// The records with only attributes `keep` (in that order). Panics if an index is out of
    /// range.
    pub fn columns(&self, keep: &[usize]) -> Population {
        let mut codes = Vec::with_capacity(self.len() * keep.len());
        for row in self.rows() {
            codes.extend(keep.iter().map(|&a| row[a]));
        }
        Population {
            dims: keep.iter().map(|&a| self.dims[a]).collect(),
            codes,
        }
    }

    /// The records in a seeded order that drifts smoothly along attribute `column`: person
    /// `i` arrives at the rank of `(c_i + u_i)/k + z_i`, with `c_i` their code of the
    /// column (of `k` codes), `u_i` uniform on [0, 1) and `z_i ~ N(0, DRIFT_NOISE²)`. Early
    /// arrivals mostly hold the low codes, late ones the high codes, with overlap between
    /// neighbours: a collection over days whose people change gradually (a campaign, time
    /// zones), between `shuffled` (no drift) and a file sorted by the column.
    /// Panics if `column ≥ d`.
    pub fn drifted(&self, column: usize, seed: u64) -> Population {
        self.select(&self.drifted_order(column, seed))
    }

    /// The row order of [`Population::drifted`]. Panics as [`Population::drifted`] and
    /// [`Population::resample_order`].
    pub fn drifted_order(&self, column: usize, seed: u64) -> Vec<u32> {
        let k = self.dims[column] as f64;
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let normal = rand_distr::Normal::new(0.0, DRIFT_NOISE).expect("a finite deviation");
        u32::try_from(self.len()).expect("fewer than 2³² records");
        let mut keyed: Vec<(f64, u32)> = (0..self.len())
            .map(|i| {
                let c = f64::from(self.row(i)[column]);
                let u: f64 = rng.random();
                (
                    (c + u) / k + rand_distr::Distribution::sample(&normal, &mut rng),
                    i as u32,
                )
            })
            .collect();
        keyed.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        keyed.into_iter().map(|(_, i)| i).collect()
    }
}

/// Standard deviation of the noise on a person's arrival key in [`Population::drifted`], in
/// units of the column's range: people of neighbouring codes overlap in time, codes far
/// apart do not.
pub const DRIFT_NOISE: f64 = 0.15;

/// A CSV file loaded through a schema.
#[derive(Debug, Clone)]
pub struct LoadedCsv {
    /// The records the schema accepted.
    pub population: Population,
    /// Data rows read.
    pub total_rows: usize,
    /// Rows the schema rejected (missing values under `reject`, unknown labels, out of
    /// range numbers, short rows); skipped.
    pub rejected_rows: usize,
    /// The raw values of every numeric attribute over the accepted records (clamped to the
    /// attribute's bounds as the encoder does; missing values left out), for fidelity
    /// metrics that binned codes cannot show.
    pub numeric: Vec<NumericColumn>,
}

/// The raw values of one numeric attribute.
#[derive(Debug, Clone, PartialEq)]
pub struct NumericColumn {
    /// Attribute index in the schema.
    pub attribute: usize,
    /// Values, in record order.
    pub values: Vec<f64>,
}

/// Loads a CSV file with a header row through `schema`; rows the schema rejects are skipped
/// and counted. Errors: the file cannot be read, or the header lacks an attribute.
pub fn load_csv(path: &Path, schema: &Schema) -> Result<LoadedCsv, SimError> {
    let mut codes = Vec::new();
    let mut numeric: Vec<NumericColumn> = numeric_attributes(schema)
        .map(|attribute| NumericColumn {
            attribute,
            values: Vec::new(),
        })
        .collect();
    let read = read_csv(path, schema, |row, values| {
        codes.extend_from_slice(row);
        for (column, value) in numeric.iter_mut().zip(values) {
            column.values.extend(*value);
        }
    })?;
    Ok(LoadedCsv {
        population: Population::new(schema.domain_sizes(), codes)?,
        total_rows: read.total_rows,
        rejected_rows: read.rejected_rows,
        numeric,
    })
}

/// The indices of `schema`'s numeric attributes, in schema order.
pub fn numeric_attributes(schema: &Schema) -> impl Iterator<Item = usize> + '_ {
    schema
        .attributes()
        .iter()
        .enumerate()
        .filter(|(_, a)| matches!(a.kind, AttributeKind::Numeric { .. }))
        .map(|(i, _)| i)
}

/// How many rows [`read_csv`] read and how many the schema rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvRead {
    /// Data rows read.
    pub total_rows: usize,
    /// Rows the schema rejected (skipped).
    pub rejected_rows: usize,
}

/// Reads a CSV file with a header row through `schema`, one row at a time, in constant
/// memory: `visit(codes, values)` gets every accepted row's codes (one per attribute) and the
/// raw values of its numeric attributes (in [`numeric_attributes`] order; clamped to the
/// attribute's bounds as the encoder does; `None` where missing or not a number). Errors: the
/// file cannot be read, or the header lacks an attribute.
pub fn read_csv(
    path: &Path,
    schema: &Schema,
    visit: impl FnMut(&[u32], &[Option<f64>]),
) -> Result<CsvRead, SimError> {
    let file = std::fs::File::open(path).map_err(csv::Error::from)?;
    read_csv_from(file, schema, visit)
}

/// [`read_csv`] from any reader of CSV bytes (e.g. a download as it arrives).
pub fn read_csv_from(
    input: impl std::io::Read,
    schema: &Schema,
    mut visit: impl FnMut(&[u32], &[Option<f64>]),
) -> Result<CsvRead, SimError> {
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(input);
    let header: Vec<String> = reader.headers()?.iter().map(str::to_owned).collect();
    let encoder = schema.csv_encoder(&header)?;
    // (column, bounds) of every numeric attribute; the encoder checked the header.
    let numeric: Vec<(Option<usize>, f64, f64)> = numeric_attributes(schema)
        .map(|a| {
            let attr = &schema.attributes()[a];
            let AttributeKind::Numeric { min, max, .. } = attr.kind else {
                unreachable!("numeric_attributes yields numeric attributes")
            };
            let col = header.iter().position(|h| h.trim() == attr.name);
            (col, min, max)
        })
        .collect();
    let mut values = vec![None; numeric.len()];
    let mut record = csv::StringRecord::new();
    let mut read = CsvRead {
        total_rows: 0,
        rejected_rows: 0,
    };
    while reader.read_record(&mut record)? {
        read.total_rows += 1;
        let fields: Vec<&str> = record.iter().collect();
        match encoder.encode(&fields) {
            Ok(r) => {
                for (v, (col, min, max)) in values.iter_mut().zip(&numeric) {
                    *v = col
                        .and_then(|c| fields.get(c))
                        .and_then(|f| f.trim().parse::<f64>().ok())
                        .map(|x| x.clamp(*min, *max));
                }
                visit(r.codes(), &values);
            }
            Err(_) => read.rejected_rows += 1,
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drifted order is a permutation of the records whose early arrivals hold the
    /// column's low codes and late ones its high codes, neighbours overlapping.
    #[test]
    fn a_drifted_order_follows_its_column() {
        // Column 0 uniform over 4 codes, column 1 a copy of its parity.
        let rows = (0..10_000u32).map(|i| vec![i % 4, i % 2]);
        let pop = Population::from_rows(vec![4, 2], rows).unwrap();
        let drifted = pop.drifted(0, 7);
        let sorted = |p: &Population| {
            let mut rows: Vec<Vec<u32>> = p.rows().map(<[u32]>::to_vec).collect();
            rows.sort();
            rows
        };
        assert_eq!(sorted(&drifted), sorted(&pop));
        let mean = |rows: std::ops::Range<usize>| {
            let n = rows.len() as f64;
            rows.map(|i| f64::from(drifted.row(i)[0])).sum::<f64>() / n
        };
        // Uniform codes 0–3 have mean 1.5; the first quarter sits low, the last high.
        let (first, last) = (mean(0..2_500), mean(7_500..10_000));
        assert!(first < 0.8 && last > 2.2, "{first} vs {last}");
        // Not a sort: neighbouring codes overlap in time.
        assert!((0..2_500).any(|i| drifted.row(i)[0] == 1));
        assert!((7_500..10_000).any(|i| drifted.row(i)[0] == 2));
        assert_eq!(pop.drifted(0, 7), drifted);
    }
}
