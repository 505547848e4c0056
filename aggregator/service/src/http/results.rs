//! Results of a collection (admin): the model and marginals (final, or provisional while
//! collecting: [`super::super::provisional`]), and the streamed synthetic download of a
//! finalized one (rows written by [`super::super::synthetic`] on a blocking task into a
//! bounded channel: memory stays bounded, the work stops when the client goes away).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use ldpsyn::schema::{NumericDecoding, Schema};
use ldpsyn::wire::ProblemType;
use serde::Deserialize;
use utoipa::IntoParams;

use super::super::error::ApiError;
use super::super::ingest::CollectionHandle;
use super::super::provisional::provisional_model;
use super::super::synthetic::{Format, write_synthetic};
use super::super::{AppState, api};
use super::extract::{Admin, ParamKind, Query, QueryParam, QueryParams, handle_of};
use ldpsyn_engine::{Expansion, Phase};

/// The media type of a Parquet download.
pub const PARQUET_CONTENT_TYPE: &str = "application/vnd.apache.parquet";

/// The query of `GET /v1/collections/{id}/marginals`; any other parameter is a 400.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MarginalsQuery {
    /// Comma-separated attribute names, distinct.
    #[param(example = "age,sex")]
    pub attrs: String,
    /// `true`: before finalize, answer from a model refitted from the reports so far
    /// (labelled `"provisional": true`); after finalize the final model answers either way.
    /// Default `false`: 409 before finalize.
    #[serde(default)]
    #[param(default = false, example = true)]
    pub provisional: bool,
}

/// The query of `GET /v1/collections/{id}/model`; any other parameter is a 400.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ModelQuery {
    /// As for `…/marginals`: `true` answers a provisional model before finalize.
    #[serde(default)]
    #[param(default = false, example = true)]
    pub provisional: bool,
}

/// What `provisional` takes, in words (400 details).
const PROVISIONAL_ALLOWED: &str = "`true` (before finalize, a model refitted from the reports \
    so far) or `false`; default `false`";

/// The `provisional` parameter of the model and marginals routes.
const PROVISIONAL_PARAM: QueryParam = QueryParam {
    name: "provisional",
    required: false,
    kind: ParamKind::Bool,
    allowed: PROVISIONAL_ALLOWED,
};

impl QueryParams for ModelQuery {
    const PARAMS: &'static [QueryParam] = &[PROVISIONAL_PARAM];
}

/// The query of `GET /v1/collections/{id}/synthetic`; any other parameter is a 400.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SyntheticQuery {
    /// Rows to draw, 1..=`--max-synthetic-rows` of the server (10,000,000 unless set).
    #[param(minimum = 1, example = 1000)]
    pub rows: u64,
    /// Seed: the same seed and model give the same bytes (default 0).
    #[param(default = 0, example = 7)]
    pub seed: Option<u64>,
    /// `csv` (default, with a header row), `ndjson` (one JSON object per row) or `parquet`
    /// (typed columns: Int64, Float64, dictionary-encoded strings).
    #[param(default = "csv", example = "csv")]
    pub format: Option<api::SyntheticFormat>,
    /// Numeric values within the model's bin: `recover` (default; by the sub-bin estimate), `uniform` or `midpoint`.
    #[param(default = "recover", example = "recover")]
    pub numeric: Option<api::SyntheticNumeric>,
}

impl QueryParams for MarginalsQuery {
    const PARAMS: &'static [QueryParam] = &[
        QueryParam {
            name: "attrs",
            required: true,
            kind: ParamKind::Text,
            allowed: "attribute names of the schema, comma-separated, each once, e.g. \
                `attrs=age,sex`",
        },
        PROVISIONAL_PARAM,
    ];
}

impl QueryParams for SyntheticQuery {
    const PARAMS: &'static [QueryParam] = &[
        QueryParam {
            name: "rows",
            required: true,
            kind: ParamKind::Integer {
                min: 1,
                max: u64::MAX,
            },
            allowed: "a whole number from 1 to the server's `--max-synthetic-rows`, \
                10,000,000 unless set",
        },
        QueryParam {
            name: "seed",
            required: false,
            kind: ParamKind::Integer {
                min: 0,
                max: u64::MAX,
            },
            allowed: "a whole number from 0 to 18446744073709551615; default 0",
        },
        QueryParam {
            name: "format",
            required: false,
            kind: ParamKind::OneOf(&["csv", "ndjson", "parquet"]),
            allowed: "`csv`, `ndjson` or `parquet`; default `csv`",
        },
        QueryParam {
            name: "numeric",
            required: false,
            kind: ParamKind::OneOf(&["recover", "uniform", "midpoint"]),
            allowed: "`recover`, `uniform` or `midpoint`; default `recover`",
        },
    ];
}

/// The model of a finalized collection; 409 `model-not-ready` before.
pub(crate) async fn model_of(
    state: &AppState,
    id: &str,
) -> Result<(Arc<CollectionHandle>, Arc<ldpsyn_engine::Model>), ApiError> {
    let h = handle_of(state, id).await?;
    let m = match h.model() {
        Some(m) => m,
        None if h.state().phase == Phase::Finalized => return Err(refitting(&h)),
        None => {
            return Err(ApiError::problem(
                ProblemType::ModelNotReady,
                "the model is built when the collection is finalized (POST …/finalize)",
            ));
        }
    };
    Ok((h, m))
}

/// 409 `model-not-ready` for a finalized collection whose model is not built: being fitted
/// (a finalize's fit, or a refit after a restart), or its last fit failed.
fn refitting(h: &CollectionHandle) -> ApiError {
    match h.fit_error() {
        Some(e) => ApiError::problem(
            ProblemType::ModelNotReady,
            format!(
                "the collection is finalized but fitting its model failed ({e}); POST \
                 …/finalize fits it again"
            ),
        ),
        None => ApiError::problem(
            ProblemType::ModelNotReady,
            "the collection is finalized and its model is being fitted (after a finalize, or \
             refitted from the stored reports after the server started); ask again shortly \
             (the collection's `status.model` turns `ready`)",
        ),
    }
}

/// The model a results route answers from, and what it saw ([`api::FittedFrom`]).
struct Answering {
    model: Arc<ldpsyn_engine::Model>,
    fitted: api::FittedFrom,
}

/// The model that answers `…/model` and `…/marginals` for collection `h`: the final model
/// once built; before, with `provisional`, the provisional one ([`provisional_model`]).
/// Errors: 409 `model-not-ready` before finalize without `provisional` (the detail says to
/// pass it) and while the final model is being fitted; [`provisional_model`]'s.
async fn answering(
    state: &AppState,
    h: &Arc<CollectionHandle>,
    provisional: bool,
) -> Result<Answering, ApiError> {
    if let Some(model) = h.model() {
        return Ok(Answering {
            model,
            fitted: api::FittedFrom {
                provisional: false,
                reports: h.accepted(),
                fitted_at: None,
            },
        });
    }
    if h.state().phase == Phase::Finalized {
        return Err(refitting(h));
    }
    if !provisional {
        return Err(ApiError::problem(
            ProblemType::ModelNotReady,
            "the model is built when the collection is finalized (POST …/finalize); pass \
             `provisional=true` for a provisional estimate refitted from the reports so far",
        ));
    }
    let refresh = Duration::from_millis(state.config().provisional_refresh_ms);
    let p = provisional_model(state.store(), h, refresh).await?;
    Ok(Answering {
        model: p.model.clone(),
        fitted: api::FittedFrom {
            provisional: true,
            reports: p.reports,
            fitted_at: Some(p.fitted_at),
        },
    })
}

#[utoipa::path(get, path = "/v1/collections/{id}/model", tag = "results",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id."), ModelQuery),
    responses(
        (status = 200, description = "The model of a finalized collection, or with `provisional=true` before finalize the model refitted from the reports so far.", body = api::ModelAnswer),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
    ))]
pub(crate) async fn get_model(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    query: Result<Query<ModelQuery>, ApiError>,
) -> Result<Json<api::ModelAnswer>, ApiError> {
    let h = handle_of(&state, &id).await?;
    let Query(ModelQuery { provisional }) = query?;
    let Answering { model, fitted } = answering(&state, &h, provisional).await?;
    let attributes: Vec<String> = h
        .config
        .schema
        .attributes()
        .iter()
        .map(|a| a.name.clone())
        .collect();
    // A provisional model is partial by design: only a final one is held to the plan.
    let people = (!fitted.provisional).then_some(ldpsyn_engine::People {
        reports: fitted.reports,
        planned: h.config.target_users,
    });
    let fitness = ldpsyn_engine::fitness(&model, &attributes, h.engine.context().targets(), people);
    Ok(Json(api::ModelAnswer {
        attributes,
        model: super::super::vertical::describe_model(&h, &model),
        fitness,
        fitted,
    }))
}

/// Display labels of every code of an attribute (numeric: bin midpoints).
pub(crate) fn labels(schema: &Schema, a: usize) -> Vec<String> {
    let attr = &schema.attributes()[a];
    // Midpoint decoding draws nothing; any RNG will do.
    let mut rng = <rand_chacha::ChaCha12Rng as rand::SeedableRng>::seed_from_u64(0);
    (0..attr.domain_size() as u32)
        .map(|c| {
            attr.decode(c, NumericDecoding::Midpoint, &mut rng)
                .to_string()
        })
        .collect()
}

#[utoipa::path(get, path = "/v1/collections/{id}/marginals", tag = "results",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id."), MarginalsQuery),
    responses(
        (status = 200, description = "The marginal of `attrs` under the model (final, or provisional with `provisional=true` before finalize), with standard errors from the tables where some table measured all of `attrs`, else from a parametric bootstrap of the fit (null where neither applies).", body = api::MarginalsAnswer),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
    ))]
pub(crate) async fn get_marginals(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    query: Result<Query<MarginalsQuery>, ApiError>,
) -> Result<Json<api::MarginalsAnswer>, ApiError> {
    let h = handle_of(&state, &id).await?;
    let Query(MarginalsQuery { attrs, provisional }) = query?;
    let schema = &h.config.schema;
    // Checked before any refit, which a bad request should not cost.
    let idx = marginal_attributes(schema, &attrs)?;
    let Answering { model, fitted } = answering(&state, &h, provisional).await?;
    // On the blocking pool: the first marginal no table measured draws the model's bootstrap
    // replicates (up to 64 refits).
    let attrs_idx = idx.clone();
    let est = tokio::task::spawn_blocking(move || model.marginal(&attrs_idx))
        .await
        .map_err(|e| ApiError::Internal(format!("marginal task failed: {e}")))??;
    Ok(Json(api::MarginalsAnswer {
        attributes: idx
            .iter()
            .map(|&i| schema.attributes()[i].name.clone())
            .collect(),
        labels: idx.iter().map(|&i| labels(schema, i)).collect(),
        dims: est.dims,
        frequencies: est.frequencies,
        std_errors: est.std_errors,
        fitted,
    }))
}

/// Most cells of one marginal (the engine's bound).
const MAX_MARGINAL_CELLS: usize = 1 << 22;

/// The attribute indices of an `attrs` parameter. Errors (400 `invalid-parameter`, in
/// words): an empty name, an unknown or repeated attribute, more than
/// [`MAX_MARGINAL_CELLS`] cells.
fn marginal_attributes(schema: &Schema, attrs: &str) -> Result<Vec<usize>, ApiError> {
    let invalid = |detail: String| ApiError::problem(ProblemType::InvalidParameter, detail);
    let names: Vec<&str> = schema
        .attributes()
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    let mut idx = Vec::new();
    for name in attrs.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(invalid(format!(
                "`attrs={attrs}` has an empty name: give attribute names separated by single \
                 commas, e.g. `attrs={}`",
                names.iter().take(2).copied().collect::<Vec<_>>().join(",")
            )));
        }
        let i = schema.index_of(name).ok_or_else(|| {
            invalid(format!(
                "unknown attribute `{name}`; the attributes are {}",
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        if idx.contains(&i) {
            return Err(invalid(format!(
                "`attrs` names `{name}` twice: give each attribute once"
            )));
        }
        idx.push(i);
    }
    let cells = idx.iter().try_fold(1usize, |acc, &i| {
        acc.checked_mul(schema.attributes()[i].domain_size())
    });
    if cells.is_none_or(|c| c > MAX_MARGINAL_CELLS) {
        return Err(invalid(format!(
            "the marginal of `{attrs}` has more than {MAX_MARGINAL_CELLS} cells; ask for \
             fewer attributes at a time"
        )));
    }
    Ok(idx)
}

/// The synthetic download handler.
#[utoipa::path(get, path = "/v1/collections/{id}/synthetic", tag = "results",
    security(("admin" = [])),
    params(
        ("id" = uuid::Uuid, Path, description = "The collection id."),
        SyntheticQuery,
    ),
    responses(
        (status = 200, description = "The synthetic rows, streamed.",
            content((String = "text/csv; charset=utf-8"), (String = "application/x-ndjson"),
                (api::BinaryFile = "application/vnd.apache.parquet"))),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
    ))]
pub(crate) async fn get_synthetic(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    Query(q): Query<SyntheticQuery>,
) -> Result<Response, ApiError> {
    let max = state.config().max_synthetic_rows;
    let rows = q.rows;
    if rows == 0 || rows > max {
        return Err(ApiError::problem(
            ProblemType::InvalidParameter,
            format!(
                "`rows={rows}` is not allowed: `rows` takes a whole number from 1 to {max} \
                 (this server's `--max-synthetic-rows`)"
            ),
        ));
    }
    let seed = q.seed.unwrap_or(0);
    let format = match q.format.unwrap_or(api::SyntheticFormat::Csv) {
        api::SyntheticFormat::Csv => Format::Csv,
        api::SyntheticFormat::Ndjson => Format::Ndjson,
        api::SyntheticFormat::Parquet => Format::Parquet,
    };
    let numeric = match q.numeric.unwrap_or(api::SyntheticNumeric::Recover) {
        api::SyntheticNumeric::Recover => Expansion::Recover,
        api::SyntheticNumeric::Uniform => Expansion::Uniform,
        api::SyntheticNumeric::Midpoint => Expansion::Midpoint,
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
        Format::Parquet => PARQUET_CONTENT_TYPE,
    };
    Ok((
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(stream),
    )
        .into_response())
}
