//! The service's error type and its one mapping to `application/problem+json` (RFC 9457):
//! [`ApiError::to_problem`], which also holds the one mapping of engine errors
//! ([`EngineError`]) to problem types. It wraps the errors of ingest ([`IngestError`]) and
//! of party uploads ([`VerticalError`]). Storage errors ([`StorageError`]) are 500, but for a
//! collection deleted meanwhile (404 `unknown-collection`) and a database unreachable or out
//! of space (503 `unavailable`: retry later).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ldpsyn::wire::{PROBLEM_CONTENT_TYPE, Problem, ProblemType};

use super::ingest::IngestError;
use super::storage::{DATABASE_UNAVAILABLE, StorageError};
use super::vertical::VerticalError;
use ldpsyn_engine::EngineError;

/// Errors of the service. Every one becomes a problem document whose `type` comes from
/// [`ProblemType`]; 5xx are logged and their details never reach the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A client error of the shared list with a useful detail.
    #[error("{kind}: {detail}")]
    Problem {
        /// The problem type (gives the status).
        kind: ProblemType,
        /// What went wrong.
        detail: String,
    },
    /// Too many requests; retry after this many seconds.
    #[error("rate limited, retry after {retry_after_secs} s")]
    RateLimited {
        /// Seconds until a request is allowed again.
        retry_after_secs: u64,
    },
    /// The client has its cap of requests in flight already; retry after a second.
    #[error("{max} requests of this client in flight already")]
    InFlightCap {
        /// The cap (`--max-in-flight-per-ip`).
        max: usize,
    },
    /// The storage layer failed (the database, or stored data it could not read).
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// The engine refused or failed; [`engine_problem`] says which of its errors are the
    /// client's (4xx) and which are internal.
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    /// Ingest (the committer, collections in memory) refused or failed.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// A party upload was refused or failed.
    #[error(transparent)]
    Vertical(#[from] VerticalError),
    /// Stored JSON could not be read.
    #[error("stored JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Anything else internal (a closed channel, a panicked task).
    #[error("internal: {0}")]
    Internal(String),
}

impl ApiError {
    /// A client error of type `kind`.
    pub fn problem(kind: ProblemType, detail: impl Into<String>) -> Self {
        ApiError::Problem {
            kind,
            detail: detail.into(),
        }
    }

    /// A client error carrying `problem`'s type and detail.
    pub fn from_problem(problem: Problem) -> Self {
        ApiError::Problem {
            kind: problem.problem_type,
            detail: problem.detail,
        }
    }

    /// The problem document sent to the client.
    pub fn to_problem(&self) -> Problem {
        match self {
            ApiError::Problem { kind, detail } => Problem::new(*kind, detail.clone()),
            ApiError::RateLimited { retry_after_secs } => Problem::new(
                ProblemType::RateLimited,
                format!("upload rate limit reached; retry after {retry_after_secs} s"),
            ),
            ApiError::InFlightCap { max } => Problem::new(
                ProblemType::RateLimited,
                format!(
                    "{max} requests from this client are in flight already; finish or cancel \
                     one, or retry after 1 s"
                ),
            ),
            ApiError::Engine(e) => engine_problem(e).unwrap_or_else(internal),
            ApiError::Storage(e) => storage_problem(e).unwrap_or_else(internal),
            ApiError::Ingest(e) => ingest_problem(e).unwrap_or_else(internal),
            ApiError::Vertical(e) => vertical_problem(e).unwrap_or_else(internal),
            ApiError::Json(_) | ApiError::Internal(_) => internal(),
        }
    }
}

/// The storage errors a request can meet: its collection deleted by another process
/// (PostgreSQL) while it used it, the database unreachable or out of space (a fault of the
/// moment, not of the request). `None` (500) for the rest.
fn storage_problem(e: &StorageError) -> Option<Problem> {
    match e {
        StorageError::MissingCollection(id) => Some(Problem::new(
            ProblemType::UnknownCollection,
            format!("no collection {id} (it was deleted)"),
        )),
        e if e.is_unavailable() => Some(Problem::new(
            ProblemType::Unavailable,
            DATABASE_UNAVAILABLE.to_owned(),
        )),
        _ => None,
    }
}

/// Ingest's refusals, and the engine's and storage's errors it passes on.
fn ingest_problem(e: &IngestError) -> Option<Problem> {
    match e {
        IngestError::Refused { kind, detail } => Some(Problem::new(*kind, detail.clone())),
        IngestError::Engine(e) => engine_problem(e),
        IngestError::Storage(e) => storage_problem(e),
        IngestError::Internal(_) => None,
    }
}

/// A party upload's refusals (their messages are the details), and the engine's and
/// storage's errors it passes on.
fn vertical_problem(e: &VerticalError) -> Option<Problem> {
    match e {
        VerticalError::Engine(e) => engine_problem(e),
        VerticalError::Storage(e) => storage_problem(e),
        _ => e
            .problem_type()
            .map(|kind| Problem::new(kind, e.to_string())),
    }
}

/// The problem document of every 5xx: no internal detail reaches the client.
fn internal() -> Problem {
    Problem::new(ProblemType::Internal, "internal error; see the server log")
}

/// The one mapping of engine errors to problem types: the errors a request can cause (a
/// vertical collection asked for device tasks, a model with no reports, a finalized
/// collection, a bad attribute list) are client errors; `None` for the rest, which are
/// internal (500). A config the engine refuses at creation is answered by the create
/// handler as `invalid-parameter` (its body is the config).
pub fn engine_problem(e: &EngineError) -> Option<Problem> {
    let (kind, detail) = match e {
        EngineError::NoDeviceTasks => (ProblemType::Conflict, e.to_string()),
        EngineError::NoData => (
            ProblemType::Conflict,
            "no reports collected yet; nothing to build a model from".to_owned(),
        ),
        EngineError::Finalized => (ProblemType::CollectionFinalized, e.to_string()),
        EngineError::BadAttributes(d) => (ProblemType::InvalidParameter, d.clone()),
        EngineError::InvalidConfig(_)
        | EngineError::InvalidState(_)
        | EngineError::Estimation(_)
        | EngineError::Mechanism(_)
        | EngineError::Tables(_) => return None,
    };
    Some(Problem::new(kind, detail))
}

/// A problem document as a response with its status and media type.
pub fn problem_response(problem: &Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // Serializing a struct of strings and integers cannot fail.
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(PROBLEM_CONTENT_TYPE),
    );
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.to_problem();
        if problem.status >= 500 {
            tracing::error!(error = %self, "request failed");
        }
        let mut resp = problem_response(&problem);
        let retry_after_secs = match self {
            ApiError::RateLimited { retry_after_secs } => Some(retry_after_secs),
            ApiError::InFlightCap { .. } => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after_secs {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
