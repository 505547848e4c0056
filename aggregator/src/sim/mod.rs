//! Simulation: populations of encoded records ([`Population`]), a seeded Bayesian-network
//! population generator ([`BayesNet`]), CSV loading through a schema with resampling, and the
//! in-process simulator ([`Simulation`]) that runs a collection end to end without HTTP.

pub mod bayesnet;
mod simulate;

use std::path::Path;

use ldpsyn::schema::{AttributeKind, Schema};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

pub use bayesnet::{BayesNet, Node, cramers_v};
pub use simulate::{RecordedReport, SimRun, Simulation};

/// Errors of the simulation module.
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
    Engine(#[from] crate::engine::EngineError),
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

    /// `n` records drawn uniformly with replacement (seeded).
    pub fn resample(&self, n: usize, seed: u64) -> Population {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let m = self.len();
        let mut codes = Vec::with_capacity(n * self.d());
        for _ in 0..n {
            codes.extend_from_slice(self.row(rng.random_range(0..m)));
        }
        Population {
            dims: self.dims.clone(),
            codes,
        }
    }

    /// The records in a seeded random order (arrival order of simulated users).
    pub fn shuffled(&self, seed: u64) -> Population {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let mut idx: Vec<usize> = (0..self.len()).collect();
        for i in (1..idx.len()).rev() {
            idx.swap(i, rng.random_range(0..=i));
        }
        let mut codes = Vec::with_capacity(self.codes.len());
        for i in idx {
            codes.extend_from_slice(self.row(i));
        }
        Population {
            dims: self.dims.clone(),
            codes,
        }
    }
}

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
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_path(path)?;
    let header: Vec<String> = reader.headers()?.iter().map(str::to_owned).collect();
    let encoder = schema.csv_encoder(&header)?;
    // (column, bounds, values) of every numeric attribute; the encoder checked the header.
    let mut numeric: Vec<(usize, usize, f64, f64, Vec<f64>)> = schema
        .attributes()
        .iter()
        .enumerate()
        .filter_map(|(a, attr)| match attr.kind {
            AttributeKind::Numeric { min, max, .. } => {
                let col = header.iter().position(|h| h.trim() == attr.name)?;
                Some((a, col, min, max, Vec::new()))
            }
            AttributeKind::Categorical { .. } => None,
        })
        .collect();
    let mut codes = Vec::new();
    let (mut total, mut rejected) = (0, 0);
    for record in reader.records() {
        let record = record?;
        total += 1;
        let fields: Vec<&str> = record.iter().collect();
        match encoder.encode(&fields) {
            Ok(r) => {
                codes.extend_from_slice(r.codes());
                for (_, col, min, max, values) in &mut numeric {
                    if let Some(x) = fields.get(*col).and_then(|f| f.trim().parse::<f64>().ok()) {
                        values.push(x.clamp(*min, *max));
                    }
                }
            }
            Err(_) => rejected += 1,
        }
    }
    Ok(LoadedCsv {
        population: Population::new(schema.domain_sizes(), codes)?,
        total_rows: total,
        rejected_rows: rejected,
        numeric: numeric
            .into_iter()
            .map(|(attribute, _, _, _, values)| NumericColumn { attribute, values })
            .collect(),
    })
}
