//! Synthetic rows as bytes, for the streamed download `GET /v1/collections/{id}/synthetic?rows=N&seed=S&format=csv|ndjson|parquet&numeric=recover|uniform|midpoint`
//! (its handler: [`super::http`]'s results).
//!
//! Rows come from [`ldpsyn_engine::Model::synthesize_with`] (codes; a `bins: "auto"`
//! attribute's working bin becomes a grid code per [`Expansion`]), are decoded to labels and
//! numbers by [`ldpsyn::schema::Schema::decode`] with an RNG seeded from `seed`, and are
//! written in chunks by a blocking task into a bounded channel: memory stays bounded (a
//! graphical model streams rows; SamPrivSyn's own synthesis builds one chunk of rows at a
//! time), the work stops when the client goes away (the channel closes), and the same seed
//! and model give the same bytes.

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, DictionaryArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{ArrowError, DataType, Field, Schema as ArrowSchema};
use bytes::Bytes;
use ldpsyn::schema::{AttributeKind, DecodedValue, NumericDecoding, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;

use ldpsyn_engine::{Expansion, Model};

/// Rows per streamed chunk.
const ROWS_PER_CHUNK: usize = 2048;
/// Mixed into the seed of the decoding RNG so it differs from the model's sampling RNG.
const DECODE_SEED_SALT: u64 = 0x6c64_7073_796e_6465;

/// How decoding turns a code into a number for `numeric=` `how` (the engine's
/// [`Expansion`] chose the code within the model's bin): the middle of the cell for
/// `midpoint`, else uniform within it (a fixed-count bin is one cell, so `recover` and
/// `uniform` agree there).
fn decoding(how: Expansion) -> NumericDecoding {
    match how {
        Expansion::Recover | Expansion::Uniform => NumericDecoding::Uniform,
        Expansion::Midpoint => NumericDecoding::Midpoint,
    }
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CSV with a header row.
    Csv,
    /// One JSON object per line.
    Ndjson,
    /// Apache Parquet with typed columns ([`write_parquet`]).
    Parquet,
}

/// Rows per Parquet row group: the writer holds one row group's encoded columns in memory
/// (about 8 bytes × columns per row), so this bounds the memory of a download.
const PARQUET_ROW_GROUP_ROWS: usize = 1 << 16;
/// Bytes gathered before a chunk of a Parquet file is sent.
const PARQUET_CHUNK_BYTES: usize = 64 * 1024;

/// The Arrow type of an attribute's column: `Int64` for an integer numeric attribute,
/// `Float64` for another numeric one, and dictionary-encoded UTF-8 (`Int32` keys into the
/// labels) for a categorical one; every column is nullable ("missing").
pub fn arrow_type(kind: &AttributeKind) -> DataType {
    match kind {
        AttributeKind::Numeric { integer: true, .. } => DataType::Int64,
        AttributeKind::Numeric { .. } => DataType::Float64,
        AttributeKind::Categorical { .. } => {
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
        }
    }
}

/// A column being filled for one record batch.
enum Column {
    /// Whole numbers.
    Int(Vec<Option<i64>>),
    /// Real numbers.
    Real(Vec<Option<f64>>),
    /// Codes into the labels (a categorical attribute's code is its label's index).
    Label(Vec<Option<i32>>, ArrayRef),
}

impl Column {
    fn new(kind: &AttributeKind) -> Self {
        match kind {
            AttributeKind::Numeric { integer: true, .. } => Column::Int(Vec::new()),
            AttributeKind::Numeric { .. } => Column::Real(Vec::new()),
            AttributeKind::Categorical { labels } => Column::Label(
                Vec::new(),
                Arc::new(StringArray::from_iter_values(labels.iter())),
            ),
        }
    }

    fn push(&mut self, code: u32, value: &DecodedValue) {
        match (self, value) {
            // Decoded integers are whole and within the schema's finite bounds.
            (Column::Int(v), DecodedValue::Number(x)) => v.push(Some(*x as i64)),
            (Column::Real(v), DecodedValue::Number(x)) => v.push(Some(*x)),
            (Column::Label(v, _), DecodedValue::Label(_)) => v.push(i32::try_from(code).ok()),
            (Column::Int(v), _) => v.push(None),
            (Column::Real(v), _) => v.push(None),
            (Column::Label(v, _), _) => v.push(None),
        }
    }

    fn take(&mut self) -> Result<ArrayRef, ArrowError> {
        Ok(match self {
            Column::Int(v) => Arc::new(Int64Array::from(std::mem::take(v))),
            Column::Real(v) => Arc::new(Float64Array::from(std::mem::take(v))),
            Column::Label(v, labels) => Arc::new(DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(std::mem::take(v)),
                labels.clone(),
            )?),
        })
    }
}

/// A `Write` that hands the bytes to `sink` in chunks of [`PARQUET_CHUNK_BYTES`]; fails once
/// `sink` refuses (the client went away), which stops the writer.
struct ChunkSink<F: FnMut(Bytes) -> bool> {
    buf: Vec<u8>,
    sink: F,
}

impl<F: FnMut(Bytes) -> bool> ChunkSink<F> {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(PARQUET_CHUNK_BYTES),
        ));
        if (self.sink)(chunk) {
            Ok(())
        } else {
            Err(std::io::Error::other("the download's client went away"))
        }
    }
}

impl<F: FnMut(Bytes) -> bool> std::io::Write for ChunkSink<F> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= PARQUET_CHUNK_BYTES {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// Writes `rows` synthetic rows of `model` as one Parquet file (Snappy-compressed, row
/// groups of 65,536 rows, column types by [`arrow_type`], names from the
/// schema) to `sink` in chunks; the values are those of the CSV download of the same `seed`
/// and `numeric` (the same draws, in the same order). Stops early when `sink` returns false.
/// Errors: the writer's (none is expected: every column matches its declared type).
pub fn write_parquet(
    model: &Model,
    schema: &Schema,
    rows: u64,
    seed: u64,
    numeric: Expansion,
    sink: impl FnMut(Bytes) -> bool + Send,
) -> Result<(), ParquetError> {
    let mut rng = ChaCha12Rng::seed_from_u64(seed ^ DECODE_SEED_SALT);
    let attributes = schema.attributes();
    let arrow_schema = Arc::new(ArrowSchema::new(
        attributes
            .iter()
            .map(|a| Field::new(a.name.as_str(), arrow_type(&a.kind), true))
            .collect::<Vec<_>>(),
    ));
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_size(PARQUET_ROW_GROUP_ROWS)
        .build();
    let out = ChunkSink {
        buf: Vec::with_capacity(PARQUET_CHUNK_BYTES),
        sink,
    };
    let mut writer = ArrowWriter::try_new(out, arrow_schema.clone(), Some(props))?;
    let mut columns: Vec<Column> = attributes.iter().map(|a| Column::new(&a.kind)).collect();
    let mut in_batch = 0;
    for codes in model.synthesize_with(rows, seed, numeric) {
        let values = schema.decode(&codes, decoding(numeric), &mut rng);
        for ((col, &code), value) in columns.iter_mut().zip(&codes).zip(&values) {
            col.push(code, value);
        }
        in_batch += 1;
        if in_batch == ROWS_PER_CHUNK {
            in_batch = 0;
            write_batch(&mut writer, &arrow_schema, &mut columns)?;
        }
    }
    if in_batch > 0 {
        write_batch(&mut writer, &arrow_schema, &mut columns)?;
    }
    // Writes the footer; the last bytes are still in the sink's buffer.
    let mut out = writer.into_inner()?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

fn write_batch<W: std::io::Write + Send>(
    writer: &mut ArrowWriter<W>,
    schema: &Arc<ArrowSchema>,
    columns: &mut [Column],
) -> Result<(), ParquetError> {
    let arrays = columns
        .iter_mut()
        .map(Column::take)
        .collect::<Result<Vec<_>, _>>()?;
    writer.write(&RecordBatch::try_new(schema.clone(), arrays)?)
}

/// Writes `rows` synthetic rows of `model` decoded through `schema`, calling `sink` with
/// each chunk of bytes; stops early when `sink` returns false. Deterministic in `seed`.
/// Parquet goes through [`write_parquet`]; a failure of its writer (none is expected) is
/// logged and ends the stream early, so the client gets a truncated file, not a hang.
pub fn write_synthetic(
    model: &Model,
    schema: &Schema,
    rows: u64,
    seed: u64,
    format: Format,
    numeric: Expansion,
    mut sink: impl FnMut(Bytes) -> bool + Send,
) {
    if format == Format::Parquet {
        if let Err(e) = write_parquet(model, schema, rows, seed, numeric, sink) {
            tracing::warn!(error = %e, "Parquet download ended early (client gone, or the writer failed)");
        }
        return;
    }
    let mut rng = ChaCha12Rng::seed_from_u64(seed ^ DECODE_SEED_SALT);
    let names: Vec<&str> = schema
        .attributes()
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    let json_names: Vec<String> = names
        .iter()
        .map(|n| serde_json::to_string(n).unwrap_or_default())
        .collect();
    let mut csv = csv::WriterBuilder::new().from_writer(Vec::with_capacity(64 * 1024));
    if format == Format::Csv {
        let _ = csv.write_record(&names);
    }
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut in_chunk = 0;
    let mut fields: Vec<String> = Vec::with_capacity(names.len());
    for codes in model.synthesize_with(rows, seed, numeric) {
        let values = schema.decode(&codes, decoding(numeric), &mut rng);
        match format {
            Format::Csv => {
                fields.clear();
                fields.extend(values.iter().map(|v| v.to_string()));
                let _ = csv.write_record(&fields);
            }
            // Written by `write_parquet` (returned above).
            Format::Ndjson | Format::Parquet => {
                buf.push(b'{');
                for (i, v) in values.iter().enumerate() {
                    if i > 0 {
                        buf.push(b',');
                    }
                    buf.extend_from_slice(json_names[i].as_bytes());
                    buf.push(b':');
                    buf.extend_from_slice(v.to_json().to_string().as_bytes());
                }
                buf.extend_from_slice(b"}\n");
            }
        }
        in_chunk += 1;
        if in_chunk == ROWS_PER_CHUNK {
            in_chunk = 0;
            if !sink(take_chunk(format, &mut csv, &mut buf)) {
                return;
            }
        }
    }
    let last = take_chunk(format, &mut csv, &mut buf);
    if !last.is_empty() {
        sink(last);
    }
}

fn take_chunk(format: Format, csv: &mut csv::Writer<Vec<u8>>, buf: &mut Vec<u8>) -> Bytes {
    match format {
        Format::Csv => {
            let full =
                std::mem::replace(csv, csv::Writer::from_writer(Vec::with_capacity(64 * 1024)));
            // Writing to a Vec cannot fail, so neither can flushing it.
            Bytes::from(full.into_inner().unwrap_or_default())
        }
        Format::Ndjson | Format::Parquet => Bytes::from(std::mem::take(buf)),
    }
}
