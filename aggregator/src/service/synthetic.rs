//! Synthetic rows as bytes, for the streamed download `GET /v1/collections/{id}/synthetic?rows=N&seed=S&format=csv|ndjson&numeric=recover|uniform|midpoint`
//! (its handler: [`super::http`]'s results).
//!
//! Rows come from [`crate::engine::Model::synthesize_with`] (codes; a `bins: "auto"`
//! attribute's working bin becomes a grid code per [`Expansion`]), are decoded to labels and
//! numbers by [`ldpsyn::schema::Schema::decode`] with an RNG seeded from `seed`, and are
//! written in chunks by a blocking task into a bounded channel: memory stays bounded (a
//! graphical model streams rows; SamPrivSyn's own synthesis builds one chunk of rows at a
//! time), the work stops when the client goes away (the channel closes), and the same seed
//! and model give the same bytes.

use bytes::Bytes;
use ldpsyn::schema::{NumericDecoding, Schema};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;

use crate::engine::{Expansion, Model};

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
}

/// Writes `rows` synthetic rows of `model` decoded through `schema`, calling `sink` with
/// each chunk of bytes; stops early when `sink` returns false. Deterministic in `seed`.
pub fn write_synthetic(
    model: &Model,
    schema: &Schema,
    rows: u64,
    seed: u64,
    format: Format,
    numeric: Expansion,
    mut sink: impl FnMut(Bytes) -> bool,
) {
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
            Format::Ndjson => {
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
        Format::Ndjson => Bytes::from(std::mem::take(buf)),
    }
}
