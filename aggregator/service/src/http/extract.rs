//! Extractors and body reading shared by the handlers: the admin token, query strings
//! deserialized by axum's [`axum::extract::Query`] with problem documents as rejections,
//! collection ids, and byte-limited bodies.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use ldpsyn::wire::ProblemType;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::super::AppState;
use super::super::config::ServeConfig;
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

/// The body of a request, at most `cfg.max_body_bytes` bytes, arriving at least
/// `cfg.min_body_bytes_per_sec` on average once `cfg.body_grace_ms` have passed: a body
/// trickled slower is cut, so that it cannot hold its place among the requests in flight
/// until the request timeout. Errors: 413 `payload-too-large` (declared or read past the
/// limit), 408 `request-timeout` (too slow), 400 `malformed-request` (the body broke off).
pub(crate) async fn read_body(body: Body, cfg: &ServeConfig) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;

    let limit = cfg.max_body_bytes;
    let too_large = || {
        ApiError::problem(
            ProblemType::PayloadTooLarge,
            format!("the body exceeds {limit} bytes"),
        )
    };
    let declared = axum::body::HttpBody::size_hint(&body).lower();
    if declared > limit as u64 {
        return Err(ApiError::problem(
            ProblemType::PayloadTooLarge,
            format!("the body ({declared} bytes declared) exceeds {limit} bytes"),
        ));
    }
    let start = tokio::time::Instant::now();
    let grace = std::time::Duration::from_millis(cfg.body_grace_ms);
    let rate = cfg.min_body_bytes_per_sec;
    let mut body = body;
    let mut buf = bytes::BytesMut::with_capacity((declared as usize).min(limit));
    loop {
        // The next byte is due when the bytes so far plus it meet the rate.
        let frame = if rate == 0 {
            body.frame().await
        } else {
            let due = start
                + grace
                + std::time::Duration::from_secs_f64((buf.len() + 1) as f64 / rate as f64);
            match tokio::time::timeout_at(due, body.frame()).await {
                Ok(frame) => frame,
                Err(_) => {
                    return Err(ApiError::problem(
                        ProblemType::RequestTimeout,
                        format!(
                            "the body arrived slower than {rate} bytes/s ({} bytes in {:.1} s); \
                             send it again",
                            buf.len(),
                            start.elapsed().as_secs_f64()
                        ),
                    ));
                }
            }
        };
        match frame {
            None => return Ok(buf.freeze()),
            Some(Err(e)) => {
                return Err(ApiError::problem(
                    ProblemType::MalformedRequest,
                    format!("cannot read the body: {e}"),
                ));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    if buf.len() + data.len() > limit {
                        return Err(too_large());
                    }
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

/// Deserializes `T` from a JSON request body. Errors in words, for a 400 detail: where
/// (`root` and the path inside, e.g. `[0].id`), what was found and what was expected
/// ([`json_error_in_words`]).
pub fn from_json_slice<T: DeserializeOwned>(body: &[u8], root: &str) -> Result<T, String> {
    // Most bodies parse: the path tracking that names where one goes wrong cost a batched
    // upload ~5% of the server's CPU, so it only runs again on a body that failed.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| json_error_in_words(root, &e.path().to_string(), e.inner()))?;
    de.end().map_err(|e| json_error_in_words(root, ".", &e))?;
    Ok(value)
}

/// [`from_json_slice`] for a value already parsed.
pub fn from_json_value<T: DeserializeOwned>(
    value: serde_json::Value,
    root: &str,
) -> Result<T, String> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| json_error_in_words(root, &e.path().to_string(), e.inner()))
}

/// A serde_json error as a person reads it: "the body is not JSON (line 1, column 2: …)" for
/// a syntax error; else "`where`: got …, expected a whole number ≥ 0" with Rust type names
/// replaced by words.
pub fn json_error_in_words(root: &str, path: &str, e: &serde_json::Error) -> String {
    let full = e.to_string();
    // serde_json appends " at line L column C"; said once, in words, below.
    let message = full
        .rfind(" at line ")
        .map_or(full.as_str(), |i| &full[..i]);
    if e.is_syntax() || e.is_eof() {
        return format!(
            "the body is not valid JSON (line {}, column {}: {message})",
            e.line(),
            e.column()
        );
    }
    let mut words = message
        .replace("invalid type: ", "got ")
        .replace("invalid value: ", "got ");
    for (rust, plain) in [
        ("expected u64", "expected a whole number ≥ 0"),
        ("expected u32", "expected a whole number ≥ 0"),
        ("expected u16", "expected a whole number ≥ 0"),
        ("expected usize", "expected a whole number ≥ 0"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a borrowed string", "expected a string"),
    ] {
        words = words.replace(rust, plain);
    }
    if words.starts_with("UUID parsing failed") {
        words = "not a UUID (expected 36 characters like 3af4f667-eca5-4b74-95bb-0b1b8dabef8b)"
            .to_owned();
    }
    let at = match (root, path) {
        ("", ".") => return words,
        (root, ".") => root.to_owned(),
        ("", path) => path.to_owned(),
        (root, path) if path.starts_with('[') => format!("{root}{path}"),
        (root, path) => format!("{root}.{path}"),
    };
    format!("`{at}`: {words}")
}

/// What one query parameter takes, for the details of 400 answers.
#[derive(Debug, Clone, Copy)]
pub struct QueryParam {
    /// The parameter's name (case-sensitive).
    pub name: &'static str,
    /// Whether the route needs it.
    pub required: bool,
    /// Its values, checked before deserializing so the answer can name the parameter.
    pub kind: ParamKind,
    /// Its values and default in words, e.g. "a whole number from 1 to 1000".
    pub allowed: &'static str,
}

/// The values a [`QueryParam`] takes.
#[derive(Debug, Clone, Copy)]
pub enum ParamKind {
    /// A whole number in `min..=max`.
    Integer {
        /// Smallest value.
        min: u64,
        /// Largest value.
        max: u64,
    },
    /// `true` or `false`.
    Bool,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// Any text.
    Text,
}

impl ParamKind {
    fn accepts(&self, value: &str) -> bool {
        match *self {
            ParamKind::Integer { min, max } => {
                value.parse::<u64>().is_ok_and(|v| (min..=max).contains(&v))
            }
            ParamKind::Bool => matches!(value, "true" | "false"),
            ParamKind::OneOf(words) => words.contains(&value),
            ParamKind::Text => true,
        }
    }
}

/// A query type with the list of its parameters, for [`Query`]'s error details.
pub trait QueryParams: DeserializeOwned {
    /// Every parameter the route takes.
    const PARAMS: &'static [QueryParam];
}

/// "`a` (required: …), `b` (…)": what a route's query takes, for error details.
pub fn query_usage(params: &[QueryParam]) -> String {
    if params.is_empty() {
        return "this route takes no query parameters".to_owned();
    }
    let list: Vec<String> = params
        .iter()
        .map(|p| {
            let required = if p.required { "required; " } else { "" };
            format!("`{}` ({required}{})", p.name, p.allowed)
        })
        .collect();
    format!("this route takes {}", list.join(", "))
}

/// The detail of a query string that does not fit `params`: the first unknown, repeated,
/// missing or ill-valued parameter, what it takes, and the route's parameters. `None` when
/// every parameter is known, given once and valid.
pub fn query_problem(raw: &[(String, String)], params: &[QueryParam]) -> Option<String> {
    let usage = query_usage(params);
    for (i, (name, value)) in raw.iter().enumerate() {
        let Some(p) = params.iter().find(|p| p.name == name) else {
            return Some(format!("unknown query parameter `{name}`; {usage}"));
        };
        if raw[..i].iter().any(|(n, _)| n == name) {
            return Some(format!("`{name}` is given twice; give it once"));
        }
        if !p.kind.accepts(value) {
            // The value is echoed, so a long one is cut.
            let shown: String = value.chars().take(40).collect();
            let cut = if shown.len() < value.len() { "…" } else { "" };
            return Some(format!(
                "`{name}={shown}{cut}` is not allowed: `{name}` takes {}",
                p.allowed
            ));
        }
    }
    params
        .iter()
        .find(|p| p.required && !raw.iter().any(|(n, _)| n == p.name))
        .map(|p| format!("`{}` is missing; {usage}", p.name))
}

/// axum's [`axum::extract::Query`] with a problem document as its rejection: a query string
/// that does not fit `T` (an unknown or repeated parameter, a required one missing, a value
/// it does not take) answers 400 `invalid-parameter` as `application/problem+json`, with a
/// detail naming the parameter and what it takes ([`query_problem`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<T: QueryParams, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let invalid = |detail: String| ApiError::problem(ProblemType::InvalidParameter, detail);
        // Percent-decoding is lossy (never fails), so every query string has its pairs.
        let raw = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map(|q| q.0)
            .unwrap_or_default();
        if let Some(detail) = query_problem(&raw, T::PARAMS) {
            return Err(invalid(detail));
        }
        match axum::extract::Query::<T>::try_from_uri(&parts.uri) {
            Ok(axum::extract::Query(q)) => Ok(Query(q)),
            // Not expected after the checks above; still said in words.
            Err(e) => Err(invalid(format!(
                "the query string cannot be read ({}); {}",
                std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string),
                query_usage(T::PARAMS)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: &[QueryParam] = &[
        QueryParam {
            name: "rows",
            required: true,
            kind: ParamKind::Integer { min: 1, max: 10 },
            allowed: "a whole number from 1 to 10",
        },
        QueryParam {
            name: "format",
            required: false,
            kind: ParamKind::OneOf(&["csv", "ndjson"]),
            allowed: "`csv` (default) or `ndjson`",
        },
    ];

    fn problem(pairs: &[(&str, &str)]) -> Option<String> {
        let raw: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        query_problem(&raw, PARAMS)
    }

    #[test]
    fn query_problems_name_the_parameter_and_what_it_takes() {
        assert_eq!(problem(&[("rows", "3"), ("format", "csv")]), None);
        assert_eq!(
            problem(&[("rows", "x")]).unwrap(),
            "`rows=x` is not allowed: `rows` takes a whole number from 1 to 10"
        );
        assert_eq!(
            problem(&[("rows", "3"), ("rows", "4")]).unwrap(),
            "`rows` is given twice; give it once"
        );
        assert_eq!(
            problem(&[]).unwrap(),
            "`rows` is missing; this route takes `rows` (required; a whole number from 1 to \
             10), `format` (`csv` (default) or `ndjson`)"
        );
        assert!(
            problem(&[("rows", "3"), ("Format", "csv")])
                .unwrap()
                .starts_with("unknown query parameter `Format`; this route takes `rows`")
        );
        assert!(problem(&[("rows", "11")]).unwrap().starts_with("`rows=11`"));
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)] // Only deserialized.
    struct Item {
        id: uuid::Uuid,
        n: u64,
    }

    #[test]
    fn json_errors_say_where_and_what_was_expected() {
        let err = |body: &str| from_json_slice::<Vec<Item>>(body.as_bytes(), "").unwrap_err();
        assert_eq!(
            err(r#"[{"id": "3af4f667-eca5-4b74-95bb-0b1b8dabef8b", "n": -1}]"#),
            "`[0].n`: got integer `-1`, expected a whole number ≥ 0"
        );
        assert_eq!(
            err(r#"[{"id": "x", "n": 1}]"#),
            "`[0].id`: not a UUID (expected 36 characters like \
             3af4f667-eca5-4b74-95bb-0b1b8dabef8b)"
        );
        assert_eq!(
            err("nope"),
            "the body is not valid JSON (line 1, column 2: expected ident)"
        );
        assert_eq!(
            err("[] x"),
            "the body is not valid JSON (line 1, column 4: trailing characters)"
        );
    }
}
