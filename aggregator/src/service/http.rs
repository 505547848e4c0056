//! Routes and handlers of HTTP API v1, and the layer stack.
//!
//! | method, path | who |
//! |---|---|
//! | POST/GET `/v1/collections` | admin |
//! | GET `/v1/collections/{id}` | anyone |
//! | GET `/v1/collections/{id}/task[?count=n]` | anyone |
//! | POST `/v1/collections/{id}/reports` | anyone (per-IP rate limit) |
//! | POST `/v1/collections/{id}/close-round`, `/finalize` | admin |
//! | GET `/v1/collections/{id}/model`, `/marginals?attrs=a,b`, `/synthetic?rows=N&seed=S&format=csv\|ndjson&numeric=recover\|uniform\|midpoint` | admin |
//! | GET `/healthz`, `/metrics` | anyone (per-collection series: admin) |
//! | GET `/v1/openapi.json` | anyone (the OpenAPI 3.1 document, [`super::openapi`]) |
//! | GET `/ui/` and its files | anyone (the dashboard; its data calls are admin) |
//!
//! Layers wrap inside-out; a request passes them top to bottom as written in [`router`]:
//! `TraceLayer` (logs every request and its status) → `CorsLayer` → `HandleErrorLayer`
//! (turns the errors of the next layers into problem documents) → `LoadShedLayer` (503 at
//! once when the concurrency limit is reached) → `ConcurrencyLimitLayer` → `TimeoutLayer`
//! (503 when no response has started in time) → the route. Upload routes additionally pass
//! the per-IP rate limit, and read their body with a byte limit (413).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::error_handling::HandleErrorLayer;
use axum::extract::{ConnectInfo, FromRequestParts, Path, RawQuery, Request, State};
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use axum::{BoxError, Json, Router};
use ldpsyn::protocol::{
    CollectionConfig, MAX_TASKS_PER_REQUEST, PROTOCOL_VERSION, Problem, ProblemType, Protocol,
    Report, ReportAnswer, ReportStatus, Task,
};
use ldpsyn::schema::{NumericDecoding, Schema};
use serde_json::{Value, json};
use tower::ServiceBuilder;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::TraceLayer;
use uuid::Uuid;

use super::api;
use super::error::{ApiError, problem_response};
use super::ingest::{CollectionHandle, Command, Outcome, PendingReport};
use super::ratelimit::client_ip;
use super::storage::{CollectionRow, NewReport};
use super::tokens::{MAX_FACTOR_LEN, MAX_TOKEN_CUTS, TaskClaims};
use super::{AppState, LimitedRoute};
use crate::engine::{Engine, Phase, TableKey, TaskSpec};

/// One route of the API: the method and path (axum syntax, the same as the OpenAPI
/// document's), its handler and its per-IP rate limit. [`routes`] is the one list the router
/// is built from and that the OpenAPI tests check against the document.
pub struct Route {
    /// The HTTP method.
    pub method: Method,
    /// The path, with `{param}` segments.
    pub path: &'static str,
    handler: MethodRouter<AppState>,
    rate_limit: Option<LimitedRoute>,
}

impl Route {
    fn get<H: Handler<T, AppState>, T: 'static>(path: &'static str, h: H) -> Self {
        Self {
            method: Method::GET,
            path,
            handler: get(h),
            rate_limit: None,
        }
    }

    fn post<H: Handler<T, AppState>, T: 'static>(path: &'static str, h: H) -> Self {
        Self {
            method: Method::POST,
            path,
            handler: post(h),
            rate_limit: None,
        }
    }

    fn limited(mut self, route: LimitedRoute) -> Self {
        self.rate_limit = Some(route);
        self
    }
}

/// Every route of the service (each method of a path is one route). The router serves
/// exactly these, and the OpenAPI document ([`super::openapi`]) documents exactly these.
pub fn routes() -> Vec<Route> {
    use super::{openapi, synthetic, ui, vertical};
    vec![
        Route::get("/healthz", healthz),
        Route::get("/metrics", metrics),
        Route::get("/v1/openapi.json", openapi::get_openapi),
        Route::post("/v1/collections", create_collection),
        Route::get("/v1/collections", list_collections),
        Route::get("/v1/collections/{id}", get_collection),
        Route::get("/v1/collections/{id}/task", get_task).limited(LimitedRoute::Task),
        Route::post("/v1/collections/{id}/reports", post_reports).limited(LimitedRoute::Reports),
        Route::post("/v1/collections/{id}/close-round", close_round),
        Route::post("/v1/collections/{id}/finalize", finalize),
        Route::get("/v1/collections/{id}/model", get_model),
        Route::get("/v1/collections/{id}/marginals", get_marginals),
        Route::get("/v1/collections/{id}/synthetic", synthetic::get_synthetic),
        Route::get("/v1/collections/{id}/parties", vertical::get_party_tokens),
        Route::post(
            "/v1/collections/{id}/parties/{party}/records",
            vertical::post_party_records,
        ),
        // The dashboard's static files (no auth; its data calls are the admin routes above).
        Route::get("/ui", ui::ui_redirect),
        Route::get("/ui/", ui::ui_index),
        Route::get("/ui/{file}", ui::asset),
    ]
}

/// The application: every route of [`routes`] with its layers, over `state`.
pub fn router(state: AppState) -> Router {
    let cfg = state.config();
    let cors = {
        let origins = &cfg.cors_origins;
        let allow = if origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(
                origins
                    .iter()
                    .filter_map(|o| HeaderValue::from_str(o.trim()).ok()),
            )
        };
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
    };
    let mut app = Router::new();
    for r in routes() {
        let mut handler = r.handler;
        if let Some(limited) = r.rate_limit {
            handler = handler.route_layer(middleware::from_fn_with_state(
                (state.clone(), limited),
                rate_limit,
            ));
        }
        // Two methods of one path merge into one method router.
        app = app.route(r.path, handler);
    }
    app.fallback(not_found)
        .layer(
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer(cors)
                .layer(HandleErrorLayer::new(overloaded))
                .load_shed()
                .concurrency_limit(cfg.max_in_flight_requests.max(1))
                .timeout(Duration::from_millis(cfg.request_timeout_ms.max(1))),
        )
        .with_state(state)
}

async fn overloaded(err: BoxError) -> Response {
    let detail = if err.is::<tower::timeout::error::Elapsed>() {
        "the request timed out; retry later"
    } else if err.is::<tower::load_shed::error::Overloaded>() {
        "the server is at its concurrency limit; retry later"
    } else {
        "the server cannot take this request now; retry later"
    };
    problem_response(&Problem::new(ProblemType::Unavailable, detail))
}

async fn not_found() -> ApiError {
    ApiError::problem(ProblemType::NotFound, "no such route")
}

async fn rate_limit(
    State((state, route)): State<(AppState, LimitedRoute)>,
    req: Request,
    next: Next,
) -> Response {
    if let Some(ConnectInfo(peer)) = req.extensions().get::<ConnectInfo<SocketAddr>>() {
        let client = client_ip(*peer, req.headers(), state.trusted_proxies());
        if let Err(retry_after_secs) = state.limiter(route).check(client) {
            state.metrics().rejected(ProblemType::RateLimited);
            return ApiError::RateLimited { retry_after_secs }.into_response();
        }
    }
    next.run(req).await
}

/// The caller presented the admin bearer token.
#[derive(Debug)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        check_admin(&parts.headers, state)
    }
}

/// [`Admin`] from request headers. Errors: `unauthorized` without or with a wrong token.
fn check_admin(headers: &HeaderMap, state: &AppState) -> Result<Admin, ApiError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            ApiError::problem(
                ProblemType::Unauthorized,
                "this route needs `Authorization: Bearer <admin token>`",
            )
        })?;
    if state.is_admin(presented.trim()) {
        Ok(Admin)
    } else {
        Err(ApiError::problem(
            ProblemType::Unauthorized,
            "wrong admin token",
        ))
    }
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Parses a query string into a map (percent-decoding `%XX` and `+`).
pub(crate) fn query_map(raw: Option<String>) -> Result<HashMap<String, String>, ApiError> {
    let mut m = HashMap::new();
    let Some(raw) = raw else { return Ok(m) };
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(percent_decode(k)?, percent_decode(v)?);
    }
    Ok(m)
}

fn percent_decode(s: &str) -> Result<String, ApiError> {
    let bad = || {
        ApiError::problem(
            ProblemType::InvalidParameter,
            "bad percent-encoding in query",
        )
    };
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = s.get(i + 1..i + 3).ok_or_else(bad)?;
                out.push(u8::from_str_radix(h, 16).map_err(|_| bad())?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    id.parse().map_err(|_| {
        ApiError::problem(
            ProblemType::UnknownCollection,
            format!("no collection `{id}` (ids are UUIDs)"),
        )
    })
}

pub(crate) async fn handle_of(
    state: &AppState,
    id: &str,
) -> Result<Arc<CollectionHandle>, ApiError> {
    state.collection(parse_id(id)?).await
}

#[utoipa::path(get, path = "/healthz", tag = "service",
    responses((status = 200, description = "The service and its database answer.", body = api::Health)))]
pub(crate) async fn healthz(State(state): State<AppState>) -> Result<Json<api::Health>, ApiError> {
    state.db().ping().await?;
    Ok(Json(api::Health {
        status: "ok".into(),
    }))
}

/// Service-wide series for anyone; per-collection series (which name every collection id)
/// only for the admin token. A wrong token is refused rather than served the public view, so
/// a misconfigured scraper notices.
#[utoipa::path(get, path = "/metrics", tag = "service",
    security((), ("admin" = [])),
    responses(
        (status = 200, description = "Prometheus text: service-wide series; with the admin token also per-collection series.",
            content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
        (status = 401, response = super::openapi::Unauthorized),
    ))]
pub(crate) async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let admin = headers.contains_key(header::AUTHORIZATION);
    if admin && let Err(e) = check_admin(&headers, &state) {
        return e.into_response();
    }
    let collections = state.collections();
    let rounds: Vec<(String, u32, u64)> = if admin {
        collections
            .iter()
            .map(|h| (h.id.to_string(), h.state().round, h.accepted()))
            .collect()
    } else {
        Vec::new()
    };
    let body = state.metrics().render(collections.len(), &rounds);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Public status of a collection.
fn status_of(h: &CollectionHandle) -> api::CollectionStatus {
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
    }
}

/// The public view of a collection: its config and status (vertical: the parties' ε).
fn view_of(h: &CollectionHandle) -> api::CollectionView {
    api::CollectionView {
        config: h.config.clone(),
        status: status_of(h),
        party_epsilon: super::vertical::party_epsilons(h),
        party_tokens: None,
    }
}

const COMMON_KEYS: &[&str] = &["schema", "epsilon", "target_users", "protocol"];
const PRIVINCR_KEYS: &[&str] = &["omega", "rounds", "phi", "alpha", "sigma"];
const SAMPRIVSYN_KEYS: &[&str] = &["batch_size"];
const VERTICAL_KEYS: &[&str] = &["parties"];

/// Parses and checks a create request strictly: known keys only, valid schema, ε, N and
/// protocol parameters. Returns the config and its engine. Errors: 400 problems
/// (`invalid-parameter`, `invalid-schema`, malformed JSON).
pub fn parse_create(body: &[u8], id: Uuid) -> Result<(CollectionConfig, Engine), ApiError> {
    let bad = |kind, d: String| ApiError::problem(kind, d);
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        bad(
            ProblemType::MalformedRequest,
            format!("body is not JSON: {e}"),
        )
    })?;
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
    let schema_v = obj
        .get("schema")
        .cloned()
        .ok_or_else(|| bad(ProblemType::InvalidSchema, "`schema` is required".into()))?;
    let schema: Schema = serde_json::from_value(schema_v)
        .map_err(|e| bad(ProblemType::InvalidSchema, e.to_string()))?;
    if schema.len() > u16::MAX as usize {
        return Err(bad(
            ProblemType::InvalidSchema,
            "too many attributes".into(),
        ));
    }
    if protocol == "vertical" && !obj.contains_key("epsilon") {
        // A vertical collection's ε is its largest party total: filled in when omitted.
        let parties: ldpsyn::protocol::VerticalParams = serde_json::from_value(
            json!({"parties": obj.get("parties").cloned().unwrap_or(Value::Null)}),
        )
        .map_err(|e| bad(ProblemType::InvalidParameter, e.to_string()))?;
        let total = parties
            .parties
            .iter()
            .map(ldpsyn::protocol::Party::epsilon)
            .fold(0.0, f64::max);
        obj.insert("epsilon".into(), json!(total));
    }
    obj.insert("version".into(), json!(PROTOCOL_VERSION));
    obj.insert("id".into(), json!(id));
    let config: CollectionConfig = serde_json::from_value(Value::Object(obj))
        .map_err(|e| bad(ProblemType::InvalidParameter, e.to_string()))?;
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
    Ok((config, engine))
}

#[utoipa::path(post, path = "/v1/collections", tag = "collections",
    security(("admin" = [])),
    request_body(content = api::CreateCollection, content_type = "application/json"),
    responses(
        (status = 201, description = "Created: the public config with its status (vertical: and `party_tokens`).", body = api::CollectionView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 413, response = super::openapi::PayloadTooLarge),
    ))]
pub(crate) async fn create_collection(
    State(state): State<AppState>,
    _admin: Admin,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(body, state.config().max_body_bytes).await?;
    let id = Uuid::new_v4();
    let (config, engine) = parse_create(&body, id)?;
    let initial = engine.initial_state();
    let row = CollectionRow {
        id,
        config: serde_json::to_string(&config)?,
        state: serde_json::to_string(&initial)?,
        state_version: 0,
    };
    state.db().insert_collection(&row, now_secs()).await?;
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
    let mut body = view_of(&handle);
    if handle.engine.vertical().is_some() {
        // Shown to the admin once here, and again at GET …/parties.
        body.party_tokens = Some(super::vertical::party_tokens(&state, &handle)?);
    }
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[utoipa::path(get, path = "/v1/collections", tag = "collections",
    security(("admin" = [])),
    responses(
        (status = 200, description = "Every collection with its status.", body = Vec<api::CollectionView>),
        (status = 401, response = super::openapi::Unauthorized),
    ))]
pub(crate) async fn list_collections(
    State(state): State<AppState>,
    _admin: Admin,
) -> Json<Vec<api::CollectionView>> {
    Json(state.collections().iter().map(|h| view_of(h)).collect())
}

#[utoipa::path(get, path = "/v1/collections/{id}", tag = "devices",
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    responses(
        (status = 200, description = "The public config with its status.", body = api::CollectionView),
        (status = 404, response = super::openapi::NotFound),
    ))]
pub(crate) async fn get_collection(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<api::CollectionView>, ApiError> {
    let h = handle_of(&state, &id).await?;
    Ok(Json(view_of(&h)))
}

fn issue(state: &AppState, h: &CollectionHandle, spec: TaskSpec, now: i64, now_ms: u64) -> Task {
    let nonce = TaskClaims::fresh_nonce(now_ms);
    let claims = TaskClaims {
        collection: h.id,
        round: spec.round,
        factor: spec.factor.clone(),
        mechanism: spec.mechanism,
        epsilon: h.config.epsilon,
        expires_at: now.saturating_add(state.config().task_ttl_secs),
        nonce,
        bins: spec.bins.clone(),
    };
    Task {
        collection_id: h.id,
        round: spec.round,
        factor: spec.factor,
        mechanism: spec.mechanism,
        bins: spec.bins,
        epsilon: h.config.epsilon,
        token: state.token_key().sign(&claims),
        expires_at: claims.expires_at,
    }
}

#[utoipa::path(get, path = "/v1/collections/{id}/task", tag = "devices",
    params(("id" = uuid::Uuid, Path, description = "The collection id."),
        ("count" = Option<u32>, Query, minimum = 1, maximum = 1000,
            description = "Ask for this many tasks (a JSON array); without it, one task object.")),
    responses(
        (status = 200, description = "One task, or an array of `count` independently drawn tasks.", body = api::TaskAnswer),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
        (status = 429, response = super::openapi::TooManyRequests),
    ))]
pub(crate) async fn get_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let h = handle_of(&state, &id).await?;
    let q = query_map(q)?;
    let count = match q.get("count") {
        None => None,
        Some(c) => {
            let n: usize = c.parse().map_err(|_| {
                ApiError::problem(
                    ProblemType::InvalidParameter,
                    format!("`count` must be an integer in 1..={MAX_TASKS_PER_REQUEST}"),
                )
            })?;
            if !(1..=MAX_TASKS_PER_REQUEST).contains(&n) {
                return Err(ApiError::problem(
                    ProblemType::InvalidParameter,
                    format!("`count` must be in 1..={MAX_TASKS_PER_REQUEST}, got {n}"),
                ));
            }
            Some(n)
        }
    };
    let s = h.state();
    if s.phase == Phase::Finalized {
        return Err(ApiError::problem(
            ProblemType::CollectionFinalized,
            "the collection is finalized and hands out no more tasks",
        ));
    }
    let now_ms = now_millis();
    let now = (now_ms / 1000) as i64;
    let mut rng = rand::rng();
    let n = count.unwrap_or(1);
    let mut tasks = Vec::with_capacity(n);
    // The state's choices once per request; each task an O(log n) draw.
    let sampler = h.engine.sampler(&s)?;
    for _ in 0..n {
        let spec = sampler.draw(&mut rng);
        if spec.factor.len() > MAX_FACTOR_LEN
            || spec.bins.iter().map(Vec::len).sum::<usize>() > MAX_TOKEN_CUTS
        {
            return Err(ApiError::Internal("task too large for a token".into()));
        }
        tasks.push(issue(&state, &h, spec, now, now_ms));
    }
    state.metrics().task_request(n as u64);
    Ok(match count {
        None => Json(tasks.pop()).into_response(),
        Some(_) => Json(tasks).into_response(),
    })
}

/// Reads a body of at most `limit` bytes; 413 above. A body whose declared `Content-Length`
/// (hyper's exact size hint) exceeds `limit` is refused before a byte of it is read.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = axum::body::HttpBody::size_hint(&body).lower();
    if declared > limit as u64 {
        return Err(ApiError::problem(
            ProblemType::PayloadTooLarge,
            format!("the body ({declared} bytes declared) exceeds {limit} bytes"),
        ));
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
        let mut too_large = false;
        while let Some(s) = source {
            too_large |= s.is::<http_body_util::LengthLimitError>();
            source = s.source();
        }
        if too_large {
            ApiError::problem(
                ProblemType::PayloadTooLarge,
                format!("the body exceeds {limit} bytes"),
            )
        } else {
            ApiError::problem(
                ProblemType::MalformedRequest,
                format!("cannot read the body: {e}"),
            )
        }
    })
}

/// Validates one report against its token and the collection: a verified token of this
/// collection, unexpired, with the collection's ε, and a payload that fits the token's
/// mechanism and factor ([`ldpsyn::mechanism::Mechanism::validate`]).
pub fn validate_report(
    state: &AppState,
    h: &CollectionHandle,
    report: Report,
    now: i64,
) -> Result<NewReport, Problem> {
    let claims = state
        .token_key()
        .verify(&report.token)
        .map_err(|e| Problem::new(ProblemType::InvalidToken, e.to_string()))?;
    if claims.collection != h.id {
        return Err(Problem::new(
            ProblemType::InvalidToken,
            "the token was issued for another collection",
        ));
    }
    if claims.expires_at < now {
        return Err(Problem::new(
            ProblemType::TokenExpired,
            format!("the token expired at {}", claims.expires_at),
        ));
    }
    if claims.epsilon != h.config.epsilon {
        return Err(Problem::new(
            ProblemType::InvalidToken,
            "the token's epsilon is not the collection's",
        ));
    }
    let key: TableKey = h.engine.table_key(&claims.task_spec());
    let m = h
        .mechanism(&key)
        .map_err(|e| Problem::new(ProblemType::InvalidToken, e.to_string()))?;
    m.validate(&report.payload)
        .map_err(|e| Problem::new(ProblemType::InvalidPayload, e.to_string()))?;
    Ok(NewReport {
        collection: h.id,
        report_id: report.id,
        nonce: claims.nonce_hex(),
        task_round: claims.round,
        key,
        payload: report.payload,
    })
}

/// Parses an upload body: a JSON array of 1..=`max` reports. Errors: 400 (not JSON of that
/// shape, empty), 413 (too many).
pub fn parse_upload(body: &[u8], max: usize) -> Result<Vec<Report>, ApiError> {
    let reports: Vec<Report> = serde_json::from_slice(body).map_err(|e| {
        ApiError::problem(
            ProblemType::MalformedRequest,
            format!("the body must be a JSON array of reports {{id, token, payload}}: {e}"),
        )
    })?;
    if reports.is_empty() {
        return Err(ApiError::problem(
            ProblemType::InvalidParameter,
            "the upload holds no report",
        ));
    }
    if reports.len() > max {
        return Err(ApiError::problem(
            ProblemType::PayloadTooLarge,
            format!("{} reports in one upload; at most {max}", reports.len()),
        ));
    }
    Ok(reports)
}

#[utoipa::path(post, path = "/v1/collections/{id}/reports", tag = "devices",
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    request_body(content = Vec<Report>, content_type = "application/json",
        description = "1..=`--max-reports-per-upload` reports (default 1000)."),
    responses(
        (status = 200, description = "One answer per report, in order, after the commit.", body = Vec<ReportAnswer>),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
        (status = 413, response = super::openapi::PayloadTooLarge),
        (status = 429, response = super::openapi::TooManyRequests),
    ))]
pub(crate) async fn post_reports(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<Vec<ReportAnswer>>, ApiError> {
    state.metrics().upload_request();
    let h = handle_of(&state, &id).await?;
    let body = read_body(body, state.config().max_body_bytes).await?;
    let reports = parse_upload(&body, state.config().max_reports_per_upload)?;
    if h.state().phase == Phase::Finalized {
        return Err(ApiError::problem(
            ProblemType::CollectionFinalized,
            "the collection is finalized and takes no more reports",
        ));
    }
    let now = now_secs();
    let mut answers: Vec<ReportAnswer> = Vec::with_capacity(reports.len());
    let mut items = Vec::with_capacity(reports.len());
    let mut slots = Vec::with_capacity(reports.len());
    for report in reports {
        let rid = report.id;
        match validate_report(&state, &h, report, now) {
            Ok(r) => {
                slots.push(answers.len());
                items.push(PendingReport {
                    handle: h.clone(),
                    report: r,
                });
                answers.push(ReportAnswer {
                    id: rid,
                    status: ReportStatus::Accepted,
                    problem: None,
                });
            }
            Err(p) => {
                state.metrics().rejected(p.problem_type);
                answers.push(ReportAnswer {
                    id: rid,
                    status: ReportStatus::Rejected,
                    problem: Some(p),
                });
            }
        }
    }
    if !items.is_empty() {
        let outcomes = state.ask(|reply| Command::Reports { items, reply }).await?;
        for (slot, o) in slots.into_iter().zip(outcomes) {
            let a = &mut answers[slot];
            match o {
                Outcome::Accepted => {}
                Outcome::Duplicate => a.status = ReportStatus::Duplicate,
                Outcome::Rejected(p) => {
                    a.status = ReportStatus::Rejected;
                    a.problem = Some(p);
                }
            }
        }
    }
    Ok(Json(answers))
}

#[utoipa::path(post, path = "/v1/collections/{id}/close-round", tag = "collections",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    responses(
        (status = 200, description = "What closing did and the status afterwards.", body = api::CloseRoundAnswer),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
    ))]
pub(crate) async fn close_round(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<api::CloseRoundAnswer>, ApiError> {
    let h = handle_of(&state, &id).await?;
    let handle = h.clone();
    let transitions = state
        .ask(|reply| Command::CloseRound { handle, reply })
        .await?;
    Ok(Json(api::CloseRoundAnswer {
        transitions,
        status: status_of(&h),
    }))
}

#[utoipa::path(post, path = "/v1/collections/{id}/finalize", tag = "collections",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    responses(
        (status = 200, description = "The model built from everything collected.", body = api::FinalizeAnswer),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
    ))]
pub(crate) async fn finalize(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<api::FinalizeAnswer>, ApiError> {
    let h = handle_of(&state, &id).await?;
    let handle = h.clone();
    let model = state
        .ask(|reply| Command::Finalize { handle, reply })
        .await?;
    Ok(Json(api::FinalizeAnswer {
        status: status_of(&h),
        model: model.describe(),
    }))
}

/// The model of a finalized collection; 409 `model-not-ready` before.
pub(crate) async fn model_of(
    state: &AppState,
    id: &str,
) -> Result<(Arc<CollectionHandle>, Arc<crate::engine::Model>), ApiError> {
    let h = handle_of(state, id).await?;
    let m = h.model().ok_or_else(|| {
        ApiError::problem(
            ProblemType::ModelNotReady,
            "the model is built when the collection is finalized (POST …/finalize)",
        )
    })?;
    Ok((h, m))
}

#[utoipa::path(get, path = "/v1/collections/{id}/model", tag = "results",
    security(("admin" = [])),
    params(("id" = uuid::Uuid, Path, description = "The collection id.")),
    responses(
        (status = 200, description = "The model of a finalized collection.", body = api::ModelAnswer),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
    ))]
pub(crate) async fn get_model(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<api::ModelAnswer>, ApiError> {
    let (h, m) = model_of(&state, &id).await?;
    let attributes = h
        .config
        .schema
        .attributes()
        .iter()
        .map(|a| a.name.clone())
        .collect();
    Ok(Json(api::ModelAnswer {
        attributes,
        model: m.describe(),
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
    params(("id" = uuid::Uuid, Path, description = "The collection id."),
        ("attrs" = String, Query, description = "Comma-separated attribute names, distinct.", example = "age,sex")),
    responses(
        (status = 200, description = "The marginal of `attrs` under the model, with standard errors where measured.", body = api::MarginalsAnswer),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
    ))]
pub(crate) async fn get_marginals(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<api::MarginalsAnswer>, ApiError> {
    let (h, m) = model_of(&state, &id).await?;
    let q = query_map(q)?;
    let attrs = q.get("attrs").ok_or_else(|| {
        ApiError::problem(
            ProblemType::InvalidParameter,
            "`attrs` (comma-separated attribute names) is required",
        )
    })?;
    let schema = &h.config.schema;
    let mut idx = Vec::new();
    for name in attrs.split(',').map(str::trim) {
        let i = schema.index_of(name).ok_or_else(|| {
            ApiError::problem(
                ProblemType::InvalidParameter,
                format!("unknown attribute `{name}`"),
            )
        })?;
        idx.push(i);
    }
    let est = m.marginal(&idx)?;
    Ok(Json(api::MarginalsAnswer {
        attributes: idx
            .iter()
            .map(|&i| schema.attributes()[i].name.clone())
            .collect(),
        labels: idx.iter().map(|&i| labels(schema, i)).collect(),
        dims: est.dims,
        frequencies: est.frequencies,
        std_errors: est.std_errors,
    }))
}
