//! Extractors and body reading shared by the handlers: the admin token, query strings
//! deserialized by axum's [`axum::extract::Query`] with problem documents as rejections,
//! collection ids, and byte-limited bodies.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use ldpsyn::protocol::ProblemType;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::super::AppState;
use super::super::error::ApiError;
use super::super::ingest::CollectionHandle;

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
pub(crate) fn check_admin(headers: &HeaderMap, state: &AppState) -> Result<Admin, ApiError> {
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

/// A collection id from the path. Errors: `unknown-collection` for a non-UUID.
pub(crate) fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    id.parse().map_err(|_| {
        ApiError::problem(
            ProblemType::UnknownCollection,
            format!("no collection `{id}` (ids are UUIDs)"),
        )
    })
}

/// The collection of path segment `id`, loaded if another process created it. Errors:
/// `unknown-collection`.
pub(crate) async fn handle_of(
    state: &AppState,
    id: &str,
) -> Result<Arc<CollectionHandle>, ApiError> {
    state.collection(parse_id(id)?).await
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

/// axum's [`axum::extract::Query`] with a problem document as its rejection: a query string
/// that does not deserialize into `T` (a value of the wrong type, a required parameter
/// missing, or an unknown parameter — the query types deny unknown fields) answers 400
/// `invalid-parameter` as `application/problem+json` rather than axum's plain text.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(q)) => Ok(Query(q)),
            Err(e) => Err(ApiError::problem(
                ProblemType::InvalidParameter,
                e.body_text(),
            )),
        }
    }
}
