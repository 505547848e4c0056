//! HTTP API v1: the route list, the router and its layer stack; the handlers live in one
//! file per resource.
//!
//! | method, path | who |
//! |---|---|
//! | POST/GET `/v1/collections` | admin |
//! | GET `/v1/collections/{id}` | anyone (per-IP rate limit) |
//! | DELETE `/v1/collections/{id}` | admin |
//! | GET `/v1/collections/{id}/task[?count=n]` | anyone (per-IP rate limit) |
//! | POST `/v1/collections/{id}/reports` | anyone (per-IP rate limit) |
//! | POST `/v1/collections/{id}/close-round`, `/finalize` | admin |
//! | GET `/v1/collections/{id}/model`, `/marginals?attrs=a,b`, `/synthetic?rows=N&seed=S&format=csv\|ndjson&numeric=recover\|uniform\|midpoint` | admin |
//! | GET `/v1/collections/{id}/parties`; POST `…/parties/{party}/records`, `…/parties/{party}/model` | admin; the party's token (per-IP rate limit) |
//! | GET `/healthz` | anyone (per-IP rate limit) |
//! | GET `/metrics` | anyone (per-collection series: admin) |
//! | GET `/v1/openapi.json` | anyone (the OpenAPI 3.1 document, [`super::openapi`]) |
//! | GET `/ui/` and its files | anyone (the dashboard; its data calls are admin) |
//!
//! Query strings are deserialized strictly ([`extract::Query`], serde `deny_unknown_fields`):
//! an unknown, repeated or ill-typed parameter is a 400 `invalid-parameter` problem.
//!
//! Layers wrap inside-out; a request passes them top to bottom as written in [`router`]:
//! `TraceLayer` (logs every request and its status) → `CorsLayer` → `HandleErrorLayer`
//! (turns the errors of the next layers into problem documents) → `LoadShedLayer` (503 at
//! once when the concurrency limit is reached) → `GlobalConcurrencyLimitLayer` (one limit for
//! the whole service, every route together) → `TimeoutLayer`
//! (503 when no response has started in time) → the route. Every route that may cost a
//! database query before an admin token is checked ([`super::LimitedRoute`]: device tasks and
//! uploads, collection lookups, `/healthz`, party uploads) additionally passes a per-IP rate
//! limit (429 with `Retry-After`) before its handler runs; upload routes read their body with
//! a byte limit (413).
//!
//! - [`extract`]: extractors and body reading (admin token, query strings as problem
//!   documents, collection ids, byte-limited bodies).
//! - [`collections`]: create, list, get, close a round, finalize, delete.
//! - [`reports`]: device tasks and report uploads.
//! - [`results`]: model, marginals, synthetic downloads.
//! - [`parties`]: party tokens and party uploads of vertical collections.
//! - Here: `/healthz`, `/metrics`, the route list [`routes`] and [`router`].

pub mod collections;
pub mod extract;
pub mod parties;
pub mod reports;
pub mod results;

use std::net::SocketAddr;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{ConnectInfo, Request, State};
use axum::handler::Handler;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use axum::{BoxError, Json, Router};
use ldpsyn::wire::{Problem, ProblemType};
use tower::ServiceBuilder;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::TraceLayer;

pub use self::collections::parse_create;
pub use self::extract::Admin;
use self::extract::check_admin;
pub use self::reports::parse_upload;
use super::api;
use super::error::{ApiError, problem_response};
use super::ratelimit::client_ip;
use super::{AppState, LimitedRoute};

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

    fn delete<H: Handler<T, AppState>, T: 'static>(path: &'static str, h: H) -> Self {
        Self {
            method: Method::DELETE,
            path,
            handler: delete(h),
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
    use super::{openapi, ui};
    vec![
        Route::get("/healthz", healthz).limited(LimitedRoute::Lookup),
        Route::get("/metrics", metrics),
        Route::get("/v1/openapi.json", openapi::get_openapi),
        Route::post("/v1/collections", collections::create_collection),
        Route::get("/v1/collections", collections::list_collections),
        Route::get("/v1/collections/{id}", collections::get_collection)
            .limited(LimitedRoute::Lookup),
        Route::delete("/v1/collections/{id}", collections::delete_collection),
        Route::get("/v1/collections/{id}/task", reports::get_task).limited(LimitedRoute::Task),
        Route::post("/v1/collections/{id}/reports", reports::post_reports)
            .limited(LimitedRoute::Reports),
        Route::post("/v1/collections/{id}/close-round", collections::close_round),
        Route::post("/v1/collections/{id}/finalize", collections::finalize),
        Route::get("/v1/collections/{id}/model", results::get_model),
        Route::get("/v1/collections/{id}/marginals", results::get_marginals),
        Route::get("/v1/collections/{id}/synthetic", results::get_synthetic),
        Route::get("/v1/collections/{id}/parties", parties::get_party_tokens),
        Route::post(
            "/v1/collections/{id}/parties/{party}/records",
            parties::post_party_records,
        )
        .limited(LimitedRoute::PartyRecords),
        Route::post(
            "/v1/collections/{id}/parties/{party}/model",
            parties::post_party_model,
        )
        .limited(LimitedRoute::PartyRecords),
        Route::post(
            "/v1/collections/{id}/parties/{party}/sketch",
            parties::post_party_sketch,
        )
        .limited(LimitedRoute::PartyRecords),
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
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
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
        .method_not_allowed_fallback(method_not_allowed)
        .layer(
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer(cors)
                .layer(HandleErrorLayer::new(overloaded))
                .load_shed()
                // One semaphore for every route: `Router::layer` layers each route apart, so a
                // per-layer limit (`concurrency_limit`) would bound each route alone.
                .layer(GlobalConcurrencyLimitLayer::new(
                    cfg.max_in_flight_requests.max(1),
                ))
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

async fn method_not_allowed(method: axum::http::Method) -> ApiError {
    ApiError::problem(
        ProblemType::MethodNotAllowed,
        format!("this path does not take {method} (see the `Allow` header)"),
    )
}

async fn rate_limit(
    State((state, route)): State<(AppState, LimitedRoute)>,
    req: Request,
    next: Next,
) -> Response {
    let Some(ConnectInfo(peer)) = req.extensions().get::<ConnectInfo<SocketAddr>>() else {
        return next.run(req).await;
    };
    let client = client_ip(*peer, req.headers(), state.trusted_proxies());
    if let Err(retry_after_secs) = state.limiter(route).check(client) {
        state.metrics().rejected(ProblemType::RateLimited);
        return ApiError::RateLimited { retry_after_secs }.into_response();
    }
    // Held until the response is ready (the body read included).
    let Some(_place) = state.in_flight().enter(client) else {
        state.metrics().rejected(ProblemType::RateLimited);
        return ApiError::InFlightCap {
            max: state.config().max_in_flight_per_ip,
        }
        .into_response();
    };
    next.run(req).await
}

#[utoipa::path(get, path = "/healthz", tag = "service",
    responses(
        (status = 200, description = "The service and its database answer.", body = api::Health),
        (status = 429, response = super::openapi::TooManyRequests),
    ))]
pub(crate) async fn healthz(State(state): State<AppState>) -> Result<Json<api::Health>, ApiError> {
    state.db().ping().await?;
    Ok(Json(api::Health {
        status: "ok".into(),
        models_pending: state.models_pending(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 33 item 9: a route without a rate limit is either an admin route (the token is
    /// checked before any database query) or reads no database. A new route must be listed
    /// here or limited.
    #[test]
    fn every_unlimited_route_is_admin_or_reads_no_database() {
        let admin = [
            "POST /v1/collections",
            "GET /v1/collections",
            "DELETE /v1/collections/{id}",
            "POST /v1/collections/{id}/close-round",
            "POST /v1/collections/{id}/finalize",
            "GET /v1/collections/{id}/model",
            "GET /v1/collections/{id}/marginals",
            "GET /v1/collections/{id}/synthetic",
            "GET /v1/collections/{id}/parties",
        ];
        // Memory and embedded files only.
        let no_database = [
            "GET /metrics",
            "GET /v1/openapi.json",
            "GET /ui",
            "GET /ui/",
            "GET /ui/{file}",
        ];
        for r in routes() {
            let name = format!("{} {}", r.method, r.path);
            let listed = admin.contains(&name.as_str()) || no_database.contains(&name.as_str());
            assert!(
                r.rate_limit.is_some() != listed,
                "{name}: limited {:?}, listed as unlimited {listed}",
                r.rate_limit
            );
        }
    }
}
