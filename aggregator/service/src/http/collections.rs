//! Collections: create (strictly parsed), list, get, close a round, finalize, delete.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ldpsyn::schema::Schema;
use ldpsyn::wire::{CollectionConfig, PROTOCOL_VERSION, ProblemType, Protocol};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::IntoParams;
use uuid::Uuid;

use super::super::error::ApiError;
use super::super::ingest::{CollectionHandle, Command, FinalizeStarted};
use super::super::storage::CollectionRow;
use super::super::{AppState, api, now_secs};
use super::extract::{
    Admin, ParamKind, Query, QueryParam, QueryParams, handle_of, parse_id, read_body,
};
use ldpsyn_engine::Engine;

/// Public status of a collection.
pub(super) fn status_of(h: &CollectionHandle) -> api::CollectionStatus {
    let s = h.state();
    api::CollectionStatus {
        phase: s.phase,
        round: s.round,
        round_quota: s.round_quota,
        round_accepted: h.round_count(s.round),
        reports_accepted: h.accepted(),
        active_edges: s
            .edges()
            .iter()
            .filter(|e| e.active)
            .map(|e| [e.a, e.b])
            .collect(),
        model_ready: h.model().is_some(),
        model: h.model_status(),
        model_error: h.fit_error(),
        rounds: rounds_of(h, &s),
    }
}

/// The rounds of the collection as its engine describes them from `s`
/// ([`Engine::rounds`]), with the reports accepted in each (api::CollectionStatus's `rounds`).
fn rounds_of(h: &CollectionHandle, s: &ldpsyn_engine::CollectionState) -> Vec<api::RoundStatus> {
    use ldpsyn_engine::{RoundKind, RoundState};
    h.engine
        .rounds(s)
        .into_iter()
        .map(|p| api::RoundStatus {
            round: p.round,
            kind: match p.kind {
                RoundKind::OneWays => api::RoundKind::OneWays,
                RoundKind::Pairs => api::RoundKind::Pairs,
                RoundKind::Screening => api::RoundKind::Screening,
                RoundKind::Phase2 => api::RoundKind::Phase2,
            },
            state: match p.state {
                RoundState::Closed => api::RoundState::Closed,
                RoundState::Open => api::RoundState::Open,
                RoundState::Planned => api::RoundState::Planned,
            },
            reports: h.round_count(p.round),
            pruned: p.pruned,
        })
        .collect()
}

/// The public view of a collection: its config and status (vertical: the parties' ε), and
/// the server's upload limits.
fn view_of(state: &AppState, h: &CollectionHandle) -> api::CollectionView {
    let c = state.config();
    api::CollectionView {
        config: h.config.clone(),
        status: status_of(h),
        upload_limits: ldpsyn::wire::UploadLimits {
            max_body_bytes: c.max_body_bytes as u64,
            max_reports_per_upload: c.max_reports_per_upload as u64,
        },
        party_epsilon: super::super::vertical::party_epsilons(h),
        composed_epsilon: super::super::vertical::composed_epsilon(h),
        composed_delta: h
            .engine
            .vertical()
            .map(|v| v.composed_delta())
            .filter(|d| *d > 0.0),
        party_tokens: None,
    }
}

const COMMON_KEYS: &[&str] = &[
    "id",
    "target",
    "schema",
    "epsilon",
    "target_users",
    "protocol",
    "name",
    "description",
    "auto_finalize_at_target",
    "past_target",
    "retain_reports_days",
];

/// Checks the collection's lifecycle options of a create request and fills in the defaults
/// of a new collection: `auto_finalize_at_target` true and `past_target` `refuse` for device
/// collections (a stored config without them reads false and `accept`: see
/// [`CollectionConfig`]). A vertical collection's parties upload whole files, and one party
/// reaching the count says nothing about the others, so it takes neither: it is finalized by
/// hand. Errors: a 400 `invalid-parameter` problem saying what is allowed.
fn check_lifecycle(
    obj: &mut serde_json::Map<String, Value>,
    vertical: bool,
) -> Result<(), ApiError> {
    let bad = |why: String| ApiError::problem(ProblemType::InvalidParameter, why);
    if let Some(v) = obj.get("auto_finalize_at_target") {
        match v.as_bool() {
            None => {
                return Err(bad(format!(
                    "`auto_finalize_at_target` must be true or false (got {v})"
                )));
            }
            Some(true) if vertical => {
                return Err(bad(
                    "`auto_finalize_at_target` is for device collections: a \
                     vertical collection's parties upload whole files, so it is finalized \
                     by hand (POST …/finalize)"
                        .into(),
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(v) = obj.get("past_target") {
        match v.as_str() {
            Some("accept") => {}
            Some("refuse") if !vertical => {}
            Some("refuse") => {
                return Err(bad("`past_target: refuse` is for device collections: a \
                     vertical collection counts records per party, not people"
                    .into()));
            }
            _ => {
                return Err(bad(format!(
                    "`past_target` must be \"refuse\" (reports past `target_users` are \
                     refused) or \"accept\" (taken while the collection is open); got {v}"
                )));
            }
        }
    }
    if let Some(v) = obj.get("retain_reports_days") {
        let max = ldpsyn::wire::MAX_RETAIN_REPORTS_DAYS;
        if v.as_u64().is_none_or(|d| d > u64::from(max)) {
            return Err(bad(format!(
                "`retain_reports_days` must be a whole number of days from 0 to {max}, \
                 the days raw reports are kept after finalize (leave it out to keep them); \
                 got {v}"
            )));
        }
    }
    let (auto, past) = if vertical {
        (false, "accept")
    } else {
        (true, "refuse")
    };
    obj.entry("auto_finalize_at_target")
        .or_insert(Value::Bool(auto));
    obj.entry("past_target")
        .or_insert(Value::String(past.into()));
    Ok(())
}

/// Checks the optional text field `key` of a create request: a string of at most `max`
/// characters, not blank, without control characters (a description may break lines).
/// Stored trimmed. Errors: a 400 `invalid-parameter` problem saying what is allowed.
fn check_text(
    obj: &mut serde_json::Map<String, Value>,
    key: &str,
    max: usize,
) -> Result<(), ApiError> {
    let Some(v) = obj.get(key) else {
        return Ok(());
    };
    let multiline = key == "description";
    let allowed = format!(
        "`{key}` must be a string of 1 to {max} characters{}",
        if multiline { "" } else { " on one line" }
    );
    let bad = |why: String| ApiError::problem(ProblemType::InvalidParameter, why);
    let Some(text) = v.as_str() else {
        return Err(bad(format!("{allowed} (got {v})")));
    };
    let text = text.trim();
    let chars = text.chars().count();
    if chars == 0 || chars > max {
        return Err(bad(format!("{allowed} (got {chars} characters)")));
    }
    if text
        .chars()
        .any(|c| c.is_control() && !(multiline && matches!(c, '\n' | '\t')))
    {
        return Err(bad(format!("{allowed}, without control characters")));
    }
    let text = text.to_owned();
    obj.insert(key.to_owned(), Value::String(text));
    Ok(())
}
const PRIVINCR_KEYS: &[&str] = &["omega", "rounds", "phi", "alpha", "sigma"];
const SAMPRIVSYN_KEYS: &[&str] = &["batch_size"];
const VERTICAL_KEYS: &[&str] = &["parties", "encoding", "sketch", "budget"];

/// Fills in a vertical create request: the default encoding (`sampled+locmrf`) when it names
/// none, and, when it gives one `budget` per person instead of every part, the parties'
/// attribute ε, local-model budgets and the sketch reports' δ
/// ([`ldpsyn::vertical::split_collection_budget`]; the budget's δ defaults to
/// 1/`target_users`, at most 1e-3). Errors: 400 `invalid-parameter` problems saying what to
/// give instead.
fn prepare_vertical(
    obj: &mut serde_json::Map<String, Value>,
    schema: &Schema,
) -> Result<(), ApiError> {
    use ldpsyn::wire::{VerticalBudget, VerticalEncoding};
    let bad = |m: String| ApiError::problem(ProblemType::InvalidParameter, m);
    let encoding = match obj.get("encoding") {
        None => VerticalEncoding::default(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            bad(format!(
                "`encoding` must be \"sampled+locmrf\" (the default), \"fo\", \"fo+locmrf\" \
                 or \"sketch+locmrf\" (got {v})"
            ))
        })?,
    };
    obj.insert("encoding".into(), json!(encoding.name()));
    let Some(budget) = obj.get("budget").cloned() else {
        return Ok(());
    };
    if obj.contains_key("epsilon") {
        return Err(bad(
            "a vertical collection with a `budget` takes its `epsilon` from it: leave \
             `epsilon` out (the budget's epsilon is per person over every party)"
                .into(),
        ));
    }
    let Value::Object(mut budget) = budget else {
        return Err(bad(format!(
            "`budget` must be an object {{\"epsilon\", \"delta\", \"locmrf_share\"}} (got {budget})"
        )));
    };
    if !budget.contains_key("delta") {
        let users = obj
            .get("target_users")
            .and_then(Value::as_u64)
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("`target_users` must be ≥ 1".into()))?;
        budget.insert("delta".into(), json!((1.0 / users as f64).min(1e-3)));
    }
    let budget: VerticalBudget =
        super::extract::from_json_value(Value::Object(budget), "budget").map_err(bad)?;
    if obj.get("sketch").is_some_and(|s| s.get("delta").is_some()) {
        return Err(bad(
            "with a `budget` the server sets `sketch.delta` (half of each party's δ): leave it \
             out"
            .into(),
        ));
    }
    /// A party of a budget request: its attributes by name only.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Named {
        name: String,
        attributes: Vec<String>,
    }
    let named: Vec<Named> = obj
        .get("parties")
        .cloned()
        .ok_or_else(|| bad("`parties` is required".into()))
        .and_then(|v| {
            serde_json::from_value(v).map_err(|e| {
                bad(format!(
                    "with a `budget`, each party lists its attributes by name only, e.g. \
                     {{\"name\": \"bank\", \"attributes\": [\"age\", \"income\"]}}; the server \
                     derives every ε from the budget ({e})"
                ))
            })
        })?;
    let dims = schema.domain_sizes();
    let domains = named
        .into_iter()
        .map(|p| {
            let attributes = p
                .attributes
                .into_iter()
                .map(|a| match schema.index_of(&a) {
                    Some(i) => Ok((a, dims[i])),
                    None => Err(bad(format!(
                        "party `{}`: attribute `{a}` is not in the schema",
                        p.name
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((p.name, attributes))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let (parties, sketch_delta) =
        ldpsyn::vertical::split_collection_budget(&budget, encoding, &domains).map_err(|e| {
            bad(format!(
                "the `budget` (epsilon {}, delta {}) does not split over {} parties under \
                 encoding `{}`, each party getting an equal share: {e}",
                budget.epsilon,
                budget.delta,
                domains.len(),
                encoding.name()
            ))
        })?;
    obj.insert("parties".into(), json!(parties));
    obj.insert("budget".into(), json!(budget));
    if let Some(d) = sketch_delta {
        let sketch = obj.entry("sketch").or_insert_with(|| json!({}));
        if let Value::Object(s) = sketch {
            s.insert("delta".into(), json!(d));
        }
    }
    Ok(())
}

/// Parses and checks a create request strictly: known keys only, valid schema, ε, N and
/// protocol parameters. The collection's id is the request's `id` (a UUID the client chose,
/// so a retry names the same collection), else a fresh one. Returns the config and its
/// engine. CPU-heavy for large schemas: call it off the async workers. Errors: 400 problems
/// (`invalid-parameter`, `invalid-schema`, malformed JSON).
pub fn parse_create(body: &[u8]) -> Result<(CollectionConfig, Engine), ApiError> {
    let bad = |kind, d: String| ApiError::problem(kind, d);
    let v: Value = super::extract::from_json_slice(body, "")
        .map_err(|e| bad(ProblemType::MalformedRequest, e))?;
    let Value::Object(mut obj) = v else {
        return Err(bad(
            ProblemType::MalformedRequest,
            "body must be a JSON object".into(),
        ));
    };
    let protocol = obj
        .get("protocol")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(ProblemType::InvalidParameter, "`protocol` (string) is required: privincr, noincremental, samprivsyn, independence or auto".into()))?
        .to_owned();
    let extra: &[&str] = match protocol.as_str() {
        "privincr" | "noincremental" | "auto" => PRIVINCR_KEYS,
        "samprivsyn" => SAMPRIVSYN_KEYS,
        "independence" => &[],
        "vertical" => VERTICAL_KEYS,
        other => {
            return Err(bad(
                ProblemType::InvalidParameter,
                format!(
                    "unknown protocol `{other}`: privincr, noincremental, samprivsyn, independence, auto or vertical"
                ),
            ));
        }
    };
    for k in obj.keys() {
        if !COMMON_KEYS.contains(&k.as_str()) && !extra.contains(&k.as_str()) {
            return Err(bad(
                ProblemType::InvalidParameter,
                format!("unknown field `{k}` for protocol `{protocol}`"),
            ));
        }
    }
    let id = match obj.remove("id") {
        None => Uuid::new_v4(),
        Some(v) => v
            .as_str()
            .and_then(|t| Uuid::parse_str(t).ok())
            .ok_or_else(|| {
                bad(
                    ProblemType::InvalidParameter,
                    format!(
                        "`id` must be a UUID string chosen by the client (e.g. \
                         \"{}\"), so that a retried create names the same collection; got {v}",
                        Uuid::new_v4()
                    ),
                )
            })?,
    };
    check_text(&mut obj, "name", ldpsyn::wire::MAX_COLLECTION_NAME_CHARS)?;
    check_text(
        &mut obj,
        "description",
        ldpsyn::wire::MAX_COLLECTION_DESCRIPTION_CHARS,
    )?;
    check_lifecycle(&mut obj, protocol == "vertical")?;
    let schema_v = obj
        .get("schema")
        .cloned()
        .ok_or_else(|| bad(ProblemType::InvalidSchema, "`schema` is required".into()))?;
    let schema: Schema = super::extract::from_json_value(schema_v, "schema")
        .map_err(|e| bad(ProblemType::InvalidSchema, e))?;
    if schema.len() > ldpsyn_engine::MAX_ATTRIBUTES {
        return Err(bad(
            ProblemType::InvalidSchema,
            format!(
                "the schema has {} attributes; a collection takes at most {} (its work grows \
                 with the number of attribute pairs). Split the attributes over several \
                 collections or leave out those the analysis does not need",
                schema.len(),
                ldpsyn_engine::MAX_ATTRIBUTES
            ),
        ));
    }
    if protocol == "vertical" {
        prepare_vertical(&mut obj, &schema)?;
    }
    if protocol == "vertical" && !obj.contains_key("epsilon") {
        // A vertical collection's ε is its largest party total (reports and local model):
        // filled in when omitted.
        let mut params = json!({"parties": obj.get("parties").cloned().unwrap_or(Value::Null)});
        for k in ["encoding", "sketch", "budget"] {
            if let Some(v) = obj.get(k) {
                params[k] = v.clone();
            }
        }
        let parties: ldpsyn::wire::VerticalParams = super::extract::from_json_value(params, "")
            .map_err(|e| bad(ProblemType::InvalidParameter, e))?;
        let total = parties
            .parties
            .iter()
            .map(|p| p.composed_epsilon(parties.encoding))
            .fold(0.0, f64::max);
        obj.insert("epsilon".into(), json!(total));
    }
    obj.insert("version".into(), json!(PROTOCOL_VERSION));
    obj.insert("id".into(), json!(id));
    let config: CollectionConfig = super::extract::from_json_value(Value::Object(obj), "")
        .map_err(|e| bad(ProblemType::InvalidParameter, e))?;
    if config.epsilon.get() < ldpsyn::MIN_COLLECTION_EPSILON {
        return Err(bad(
            ProblemType::InvalidParameter,
            format!(
                "`epsilon` must be within {}..={} (got {})",
                ldpsyn::MIN_COLLECTION_EPSILON,
                ldpsyn::MAX_EPSILON,
                config.epsilon
            ),
        ));
    }
    if config.target_users == 0 {
        return Err(bad(
            ProblemType::InvalidParameter,
            "`target_users` must be ≥ 1".into(),
        ));
    }
    if let Protocol::Privincr(p) | Protocol::Noincremental(p) | Protocol::Auto(p) = &config.protocol
    {
        if p.rounds > 1000 {
            return Err(bad(
                ProblemType::InvalidParameter,
                "`rounds` must be ≤ 1000".into(),
            ));
        }
    }
    let engine =
        Engine::new(&config).map_err(|e| bad(ProblemType::InvalidParameter, e.to_string()))?;
    if let Some(v) = engine.vertical() {
        v.check_sketch_resolution(config.target_users)
            .map_err(|m| bad(ProblemType::InvalidParameter, m))?;
    }
    Ok((config, engine))
}

#[utoipa::path(post, path = "/v1/collections", tag = "collections",
    security(("admin" = [])),
    request_body(content = api::CreateCollection, content_type = "application/json"),
    responses(
        (status = 201, description = "Created: the public config with its status (vertical: and `party_tokens`).", body = api::CollectionView),
        (status = 200, description = "A retry: the request's `id` names a collection with this very config; nothing changed.", body = api::CollectionView),
        (status = 409, response = super::super::openapi::Conflict),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 408, response = super::super::openapi::RequestTimeout),
        (status = 413, response = super::super::openapi::PayloadTooLarge),
    ))]
pub(crate) async fn create_collection(
    State(state): State<AppState>,
    _admin: Admin,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(body, state.config()).await?;
    // Checking a large schema and planning its first round is CPU work: on the blocking
    // pool, so no async worker (nor /healthz) waits for it.
    let (config, engine, initial) = tokio::task::spawn_blocking(move || {
        let (config, engine) = parse_create(&body)?;
        let initial = engine.initial_state();
        Ok::<_, ApiError>((config, engine, initial))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("create: {e}")))??;
    let id = config.id;
    if let Some(answer) = existing_create(&state, &config).await? {
        return Ok(answer);
    }
    let row = CollectionRow {
        id,
        config: serde_json::to_string(&config)?,
        state: serde_json::to_string(&initial)?,
        state_version: 0,
    };
    if let Err(e) = state.db().insert_collection(&row, now_secs()).await {
        // A concurrent create of the same id may have won the insert.
        if let Some(answer) = existing_create(&state, &config).await? {
            return Ok(answer);
        }
        return Err(e.into());
    }
    let handle = Arc::new(CollectionHandle::new(
        config,
        engine,
        initial,
        0,
        Default::default(),
        Vec::new(),
    ));
    state.insert_collection(handle.clone());
    tracing::info!(collection = %id, protocol = handle.config.protocol.name(), "collection created");
    let mut body = view_of(&state, &handle);
    if handle.engine.vertical().is_some() {
        // Shown to the admin once here, and again at GET …/parties.
        body.party_tokens = Some(super::parties::party_tokens(&state, &handle)?);
    }
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// The answer to a create whose id names a stored collection: `200` with its view when the
/// stored config is the requested one (a retry; nothing changes), `409 conflict` when it is
/// another. `None` when no collection has that id.
async fn existing_create(
    state: &AppState,
    config: &CollectionConfig,
) -> Result<Option<Response>, ApiError> {
    let handle = match state.collection(config.id).await {
        Ok(h) => h,
        Err(e) if e.to_problem().problem_type == ProblemType::UnknownCollection => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if serde_json::to_value(&handle.config)? != serde_json::to_value(config)? {
        return Err(ApiError::problem(
            ProblemType::Conflict,
            format!(
                "collection {} exists with another config: a client-chosen `id` names one \
                 collection; choose a new id for a new collection",
                config.id
            ),
        ));
    }
    let mut body = view_of(state, &handle);
    if handle.engine.vertical().is_some() {
        body.party_tokens = Some(super::parties::party_tokens(state, &handle)?);
    }
    Ok(Some((StatusCode::OK, Json(body)).into_response()))
}

#[utoipa::path(get, path = "/v1/collections", tag = "collections",
    security(("admin" = [])),
    responses(
        (status = 200, description = "Every collection with its status.", body = Vec<api::CollectionView>),
        (status = 401, response = super::super::openapi::Unauthorized),
    ))]
pub(crate) async fn list_collections(
    State(state): State<AppState>,
    _admin: Admin,
) -> Json<Vec<api::CollectionView>> {
    Json(
        state
            .collections()
            .iter()
            .map(|h| view_of(&state, h))
            .collect(),
    )
}

#[utoipa::path(get, path = "/v1/collections/{id}", tag = "devices",
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    responses(
        (status = 200, description = "The public config with its status.", body = api::CollectionView),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 429, response = super::super::openapi::TooManyRequests),
    ))]
pub(crate) async fn get_collection(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<api::CollectionView>, ApiError> {
    let h = handle_of(&state, &id).await?;
    Ok(Json(view_of(&state, &h)))
}

/// The query of `POST /v1/collections/{id}/close-round`; any other parameter is a 400.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CloseRoundQuery {
    /// Close the open round even when it has no reports (default `false`: refused with
    /// `409 round-empty`, as closing it would decide from no data).
    #[serde(default)]
    #[param(default = false)]
    pub force: bool,
}

impl QueryParams for CloseRoundQuery {
    const PARAMS: &'static [QueryParam] = &[QueryParam {
        name: "force",
        required: false,
        kind: ParamKind::Bool,
        allowed: "`true` or `false`; default `false`",
    }];
}

#[utoipa::path(post, path = "/v1/collections/{id}/close-round", tag = "collections",
    summary = "Close the open round (or batch) now",
    description = "Closes the open round of a PrivIncr/auto phase 1 (pruning pairs, or \
        entering phase 2 after the last round) or the open SamPrivSyn batch (re-weighting), \
        then any round whose quota is already reached. Rounds close by themselves at their \
        quota; this is for closing one early. A round with no reports is refused \
        (`409 round-empty`, nothing changes) unless `force=true`. In a phase without rounds \
        nothing changes: `transitions` is empty.",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id."), CloseRoundQuery),
    responses(
        (status = 200, description = "What closing did (`transitions`, empty when nothing changed) and the status afterwards.", body = api::CloseRoundAnswer),
        (status = 400, response = super::super::openapi::BadRequest),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
    ))]
pub(crate) async fn close_round(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    query: Result<Query<CloseRoundQuery>, ApiError>,
) -> Result<Json<api::CloseRoundAnswer>, ApiError> {
    let h = handle_of(&state, &id).await?;
    let Query(CloseRoundQuery { force }) = query?;
    let handle = h.clone();
    let transitions = state
        .ask(|reply| Command::CloseRound {
            handle,
            force,
            reply,
        })
        .await?;
    Ok(Json(api::CloseRoundAnswer {
        transitions,
        status: status_of(&h),
    }))
}

/// How long `POST …/finalize` waits for the model when the request states no preference.
/// The suite's measured fits take at most 4.3 s (`docs/results.md`, "Finalize"); a longer
/// one answers 202 and goes on.
pub const DEFAULT_FINALIZE_WAIT: Duration = Duration::from_secs(10);

/// How long a finalize waits for its fit before answering 202, from the request's `Prefer`
/// header (RFC 7240 §4.1 `respond-async`: not at all; §4.3 `wait=N`: N seconds; neither:
/// [`DEFAULT_FINALIZE_WAIT`]), at most a second less than the request timeout so that the
/// answer always beats it. Unknown or malformed preferences are ignored (RFC 7240 §2).
fn finalize_wait(headers: &HeaderMap, request_timeout: Duration) -> Duration {
    let (mut wait, mut respond_async) = (DEFAULT_FINALIZE_WAIT, false);
    let prefs = headers
        .get_all(header::HeaderName::from_static("prefer"))
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .map(str::trim);
    for p in prefs {
        if p.eq_ignore_ascii_case("respond-async") {
            respond_async = true;
        } else if let Some(secs) = p
            .split_once('=')
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case("wait"))
            .and_then(|(_, v)| v.trim().trim_matches('"').parse::<u64>().ok())
        {
            wait = Duration::from_secs(secs);
        }
    }
    if respond_async {
        return Duration::ZERO;
    }
    wait.min(request_timeout.saturating_sub(Duration::from_secs(1)))
}

#[utoipa::path(post, path = "/v1/collections/{id}/finalize", tag = "collections",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id."),
        ("Prefer" = Option<String>, Header, description = "`respond-async` (answer 202 at once) or `wait=N` (wait at most N seconds for the model).")),
    responses(
        (status = 200, description = "The model built from everything collected.", body = api::FinalizeAnswer),
        (status = 202, description = "Finalized; the model is being fitted. `Location` says where it will answer.", body = api::FinalizeAccepted,
            headers(("Location" = String, description = "The model's URL."), ("Retry-After" = u32, description = "Seconds before polling."))),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
        (status = 409, response = super::super::openapi::Conflict),
    ))]
pub(crate) async fn finalize(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let h = handle_of(&state, &id).await?;
    let wait = finalize_wait(
        &headers,
        Duration::from_millis(state.config().request_timeout_ms),
    );
    let handle = h.clone();
    let started = state
        .ask(|reply| Command::Finalize { handle, reply })
        .await?;
    let model = match started {
        FinalizeStarted::Ready(m) => Some(m),
        FinalizeStarted::Fitting(fit) => match tokio::time::timeout(wait, fit).await {
            Ok(Ok(fitted)) => Some(fitted?),
            Ok(Err(_)) => return Err(ApiError::Internal("the model fit was dropped".into())),
            Err(_) => None,
        },
    };
    Ok(match model {
        Some(model) => Json(api::FinalizeAnswer {
            status: status_of(&h),
            model: super::super::vertical::describe_model(&h, &model),
        })
        .into_response(),
        None => {
            let location = format!("/v1/collections/{}/model", h.id);
            (
                StatusCode::ACCEPTED,
                [
                    (header::LOCATION, location.clone()),
                    (header::RETRY_AFTER, "1".to_owned()),
                ],
                Json(api::FinalizeAccepted {
                    status: status_of(&h),
                    model: location,
                }),
            )
                .into_response()
        }
    })
}

#[utoipa::path(delete, path = "/v1/collections/{id}", tag = "collections",
    summary = "Delete a collection",
    description = "Deletes the collection with everything stored of it (config, state, \
        reports or party records, tables, round counts; its model with it), in one \
        transaction, whatever its phase. Reports still on their way are refused \
        `unknown-collection`, as is every later request for it. Cannot be undone.",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    responses(
        (status = 200, description = "Deleted: the id and how many reports went with it.", body = api::DeleteAnswer),
        (status = 401, response = super::super::openapi::Unauthorized),
        (status = 404, response = super::super::openapi::NotFound),
    ))]
pub(crate) async fn delete_collection(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<api::DeleteAnswer>, ApiError> {
    let id = parse_id(&id)?;
    let reports_deleted = state.delete_collection(id).await?;
    Ok(Json(api::DeleteAnswer {
        id,
        reports_deleted,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(prefer: &[&str], timeout_s: u64) -> Duration {
        let mut headers = HeaderMap::new();
        for p in prefer {
            headers.append("prefer", p.parse().unwrap());
        }
        finalize_wait(&headers, Duration::from_secs(timeout_s))
    }

    /// `Prefer` (RFC 7240) sets the finalize's wait: `respond-async` none, `wait=N` at most N
    /// seconds, in any header or list position and any case; anything else is ignored; the
    /// wait always ends a second before the request timeout.
    #[test]
    fn the_finalize_wait_follows_prefer_within_the_request_timeout() {
        let s = Duration::from_secs;
        assert_eq!(wait(&[], 30), DEFAULT_FINALIZE_WAIT);
        assert_eq!(wait(&["respond-async"], 30), s(0));
        assert_eq!(wait(&["handling=lenient, Wait=3"], 30), s(3));
        assert_eq!(wait(&["wait=3", "RESPOND-ASYNC"], 30), s(0));
        assert_eq!(wait(&["wait=60"], 30), s(29), "capped by the timeout");
        assert_eq!(
            wait(&["wait=soon", "return=minimal"], 30),
            DEFAULT_FINALIZE_WAIT
        );
        assert_eq!(wait(&[], 2), s(1));
        assert_eq!(wait(&[], 1), s(0));
    }
}
