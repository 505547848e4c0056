//! The service's error type and its one mapping to `application/problem+json` (RFC 9457).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ldpsyn::protocol::{PROBLEM_CONTENT_TYPE, Problem, ProblemType};

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
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations failed.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The engine failed on stored data.
    #[error("engine: {0}")]
    Engine(#[from] crate::engine::EngineError),
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

    /// The problem document sent to the client.
    pub fn to_problem(&self) -> Problem {
        match self {
            ApiError::Problem { kind, detail } => Problem::new(*kind, detail.clone()),
            ApiError::RateLimited { retry_after_secs } => Problem::new(
                ProblemType::RateLimited,
                format!("upload rate limit reached; retry after {retry_after_secs} s"),
            ),
            _ => Problem::new(ProblemType::Internal, "internal error; see the server log"),
        }
    }
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
        if let ApiError::RateLimited { retry_after_secs } = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        resp
    }
}
