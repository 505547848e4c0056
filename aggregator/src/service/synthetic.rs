//! Streamed synthetic downloads: `GET /v1/collections/{id}/synthetic?rows=N&seed=S&format=csv|ndjson&numeric=recover|uniform|midpoint`.
//!
//! Rows come from [`crate::engine::Model::synthesize_with`] (codes; a `bins: "auto"`
//! attribute's working bin becomes a grid code per [`Expansion`]), are decoded to labels and
//! numbers by [`ldpsyn::schema::Schema::decode`] with an RNG seeded from `seed`, and are
//! written in chunks by a blocking task into a bounded channel: memory stays bounded (a
//! graphical model streams rows; SamPrivSyn's own synthesis builds one chunk of rows at a
//! time), the work stops when the client goes away (the channel closes), and the same seed
//! and model give the same bytes.

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use ldpsyn::protocol::ProblemType;
use ldpsyn::schema::{NumericDecoding, Schema};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;

use super::AppState;
use super::error::ApiError;
use super::http::{Admin, model_of, query_map};
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

/// The synthetic download handler.
#[utoipa::path(get, path = "/v1/collections/{id}/synthetic", tag = "results",
    security(("admin" = [])),
    params(
        ("id" = uuid::Uuid, Path, description = "The collection id."),
        ("rows" = u64, Query, minimum = 1,
            description = "Rows to draw, 1..=`--max-synthetic-rows` of the server (default 10,000,000)."),
        ("seed" = Option<u64>, Query, description = "Seed: the same seed and model give the same bytes (default 0)."),
        ("format" = Option<super::api::SyntheticFormat>, Query, description = "`csv` (default, with a header row) or `ndjson` (one JSON object per row).",
            example = "csv"),
        ("numeric" = Option<super::api::SyntheticNumeric>, Query,
            description = "Numeric values within the model's bin: `recover` (default; by the sub-bin estimate), `uniform` or `midpoint`.",
            example = "recover"),
    ),
    responses(
        (status = 200, description = "The synthetic rows, streamed.",
            content((String = "text/csv; charset=utf-8"), (String = "application/x-ndjson"))),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
    ))]
pub async fn get_synthetic(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let q = query_map(q)?;
    let bad = |d: String| ApiError::problem(ProblemType::InvalidParameter, d);
    let max = state.config().max_synthetic_rows;
    let rows: u64 = q
        .get("rows")
        .ok_or_else(|| bad("`rows` is required".into()))?
        .parse()
        .map_err(|_| bad("`rows` must be a non-negative integer".into()))?;
    if rows == 0 || rows > max {
        return Err(bad(format!("`rows` must be in 1..={max}")));
    }
    let seed: u64 = match q.get("seed") {
        Some(s) => s
            .parse()
            .map_err(|_| bad("`seed` must be an unsigned integer".into()))?,
        None => 0,
    };
    let format = match q.get("format").map(String::as_str) {
        None | Some("csv") => Format::Csv,
        Some("ndjson") => Format::Ndjson,
        Some(other) => {
            return Err(bad(format!(
                "`format` must be csv or ndjson, got `{other}`"
            )));
        }
    };
    let numeric = match q.get("numeric").map(String::as_str) {
        None | Some("recover") => Expansion::Recover,
        Some("uniform") => Expansion::Uniform,
        Some("midpoint") => Expansion::Midpoint,
        Some(other) => {
            return Err(bad(format!(
                "`numeric` must be recover, uniform or midpoint, got `{other}`"
            )));
        }
    };
    let (h, model) = model_of(&state, &id).await?;
    let schema = h.config.schema.clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let counting = state.clone();
    tokio::task::spawn_blocking(move || {
        write_synthetic(&model, &schema, rows, seed, format, numeric, |chunk| {
            counting.metrics().synthetic_bytes(chunk.len() as u64);
            // Fails once the client has gone (the body stream and its receiver dropped).
            tx.blocking_send(chunk).is_ok()
        });
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    });
    let content_type = match format {
        Format::Csv => "text/csv; charset=utf-8",
        Format::Ndjson => "application/x-ndjson",
    };
    Ok((
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(stream),
    )
        .into_response())
}
