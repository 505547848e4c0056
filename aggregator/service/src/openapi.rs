//! The OpenAPI 3.1 document of HTTP API v1, served at `GET /v1/openapi.json`.
//!
//! Generated with utoipa from the handlers' `#[utoipa::path]` attributes (method, path,
//! parameters, bodies, responses, security), the SDK's wire types (feature `openapi`) and the
//! answers of [`super::api`]. Every route of [`super::http::routes`] (the one list the router is
//! built from) is an operation of the document, and every operation a route (tests below and
//! `aggregator/tests/openapi.rs`).
//!
//! Problem documents: the component `Problem` has a `type` enum of every
//! [`ProblemType`]; each status the server answers with has a response component
//! (`BadRequest`, `Unauthorized`, …) whose `type` is limited to that status's types. Every
//! operation may answer `500 internal` and `503 unavailable` (timeout, load shedding, state
//! still loading), and its path `405 method-not-allowed` to other methods:
//! [`CommonResponses`] adds them. Security: `admin` (the admin bearer token)
//! and `party` (a vertical collection party's bearer token) schemes.

use std::sync::OnceLock;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use ldpsyn::wire::{PROBLEM_CONTENT_TYPE, Problem, ProblemType};
use utoipa::openapi::response::{ResponseBuilder, ResponsesBuilder};
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as OpenApiDoc, RefOr};
use utoipa::{Modify, OpenApi, ToResponse};

use super::api;

mod operations;

/// One reusable problem response per status: `$name` answers `$status` with the problem types
/// of that status.
macro_rules! problem_responses {
    ($( $(#[$doc:meta])* $name:ident = $status:literal; )*) => {
        $(
            $(#[$doc])*
            pub struct $name;

            impl<'r> ToResponse<'r> for $name {
                fn response() -> (&'r str, RefOr<utoipa::openapi::response::Response>) {
                    (stringify!($name), problem_response($status))
                }
            }
        )*

        /// Every problem response component with its status.
        const PROBLEM_RESPONSES: &[(&str, u16)] = &[$((stringify!($name), $status)),*];
    };
}

problem_responses! {
    /// 400: malformed body, invalid parameter, schema, payload or token.
    BadRequest = 400;
    /// 401: the route's bearer token is missing or wrong.
    Unauthorized = 401;
    /// 404: no such collection, party, file or route.
    NotFound = 404;
    /// 405: the path exists, the method does not (`Allow` lists the methods).
    MethodNotAllowed = 405;
    /// 409: the request conflicts with the collection's state.
    Conflict = 409;
    /// 413: body or batch too large.
    PayloadTooLarge = 413;
    /// 408: the body arrived slower than the minimum rate.
    RequestTimeout = 408;
    /// 429: rate limited (with `Retry-After`).
    TooManyRequests = 429;
    /// 500: internal error (details only in the server log).
    InternalError = 500;
    /// 503: overloaded, timed out, still loading its state, or the collection could not be
    /// loaded (`collection-unavailable`).
    Unavailable = 503;
}

/// The problem types the server may answer with `status` (the client-side ones excluded).
fn server_types(status: u16) -> Vec<ProblemType> {
    ProblemType::ALL
        .iter()
        .copied()
        .filter(|t| t.status() == status)
        .filter(|t| {
            !matches!(
                t,
                ProblemType::InvalidRecord
                    | ProblemType::EpsilonTooLarge
                    | ProblemType::BudgetExhausted
                    | ProblemType::LedgerUnavailable
            )
        })
        .collect()
}

/// A problem response of `status`: `Problem` with `type` limited to that status's types.
fn problem_response(status: u16) -> RefOr<utoipa::openapi::response::Response> {
    let types = server_types(status);
    let list: Vec<String> = types.iter().map(|t| format!("`{}`", t.slug())).collect();
    let schema = AllOfBuilder::new().item(api::schema_ref("Problem")).item(
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "type",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(types.iter().map(|t| t.uri()))),
            )
            .property(
                "status",
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .enum_values(Some([status])),
            ),
    );
    let mut b = ResponseBuilder::new()
        .description(format!("A problem document: {}.", list.join(", ")))
        .content(
            PROBLEM_CONTENT_TYPE,
            ContentBuilder::new().schema(Some(schema)).build(),
        );
    if status == 429 {
        b = b.header(
            "Retry-After",
            utoipa::openapi::HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0)),
                )
                .description(Some("Seconds until a request is allowed again."))
                .build(),
        );
    }
    b.build().into()
}

/// Adds the security schemes, every problem response component, and `405`/`500`/`503` to
/// every operation.
pub struct CommonResponses;

impl Modify for CommonResponses {
    fn modify(&self, doc: &mut OpenApiDoc) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token (`LDPSYN_ADMIN_TOKEN` of `serve`): \
                         `Authorization: Bearer <token>`.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "party",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A vertical collection party's upload token (answered on creation \
                         and at `GET /v1/collections/{id}/parties`).",
                    ))
                    .build(),
            ),
        );
        for (name, status) in PROBLEM_RESPONSES {
            components
                .responses
                .insert((*name).to_owned(), problem_response(*status));
        }
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                let common = ResponsesBuilder::new()
                    .response(
                        "405",
                        utoipa::openapi::Ref::from_response_name("MethodNotAllowed"),
                    )
                    .response(
                        "500",
                        utoipa::openapi::Ref::from_response_name("InternalError"),
                    )
                    .response(
                        "503",
                        utoipa::openapi::Ref::from_response_name("Unavailable"),
                    )
                    .build();
                for (code, r) in common.responses {
                    op.responses.responses.entry(code).or_insert(r);
                }
            }
        }
    }
}

/// The document's source: every operation and the schemas they use.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "ldpsyn aggregator",
        description = "Local differential privacy data collection and synthetic data: \
            collections, device tasks and reports, vertical party uploads, models, marginals \
            and synthetic downloads. Every error is an RFC 9457 problem document \
            (`application/problem+json`) whose `type` is one of `ProblemType`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        super::http::collections::create_collection,
        super::http::collections::list_collections,
        super::http::collections::get_collection,
        super::http::collections::delete_collection,
        super::http::reports::get_task,
        super::http::reports::post_reports,
        super::http::collections::close_round,
        super::http::collections::finalize,
        super::http::results::get_model,
        super::http::results::get_marginals,
        super::http::results::get_synthetic,
        super::http::parties::get_party_tokens,
        super::http::parties::post_party_records,
        super::http::parties::post_party_model,
        super::http::parties::post_party_sketch,
        super::http::healthz,
        super::http::metrics,
        get_openapi,
        super::ui::ui_redirect,
        super::ui::ui_index,
        super::ui::asset,
    ),
    components(
        schemas(
            Problem,
            ProblemType,
            api::CollectionView,
            api::CreateCollection,
            api::SyntheticFormat,
            api::SyntheticNumeric
        ),
        responses(
            BadRequest,
            Unauthorized,
            NotFound,
            MethodNotAllowed,
            Conflict,
            RequestTimeout,
            PayloadTooLarge,
            TooManyRequests,
            InternalError,
            Unavailable
        ),
    ),
    modifiers(&CommonResponses),
    tags(
        (name = "collections", description = "Creating, running and finalizing collections (admin)."),
        (name = "devices", description = "Tasks and reports of devices (no credentials)."),
        (name = "parties", description = "Uploads of a vertical collection's parties."),
        (name = "results", description = "The model, marginals and synthetic data (admin)."),
        (name = "service", description = "Health, metrics, this document and the dashboard."),
    ),
)]
pub struct ApiDoc;

/// The OpenAPI document (built once).
pub fn document() -> &'static OpenApiDoc {
    static DOC: OnceLock<OpenApiDoc> = OnceLock::new();
    DOC.get_or_init(ApiDoc::openapi)
}

/// The served document: [`document`] with every operation's summary, description and
/// examples ([`operations::operations`]), and every description and summary in plain text
/// (rustdoc links of the Rust docs it was generated from unwrapped, [`unlink`]).
fn document_value() -> &'static serde_json::Value {
    static VALUE: OnceLock<serde_json::Value> = OnceLock::new();
    VALUE.get_or_init(|| {
        // Serializing a document of strings, numbers and maps cannot fail.
        let mut doc = serde_json::to_value(document()).unwrap_or_default();
        apply_operation_docs(&mut doc);
        plain_text(&mut doc);
        doc
    })
}

fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| serde_json::to_string_pretty(document_value()).unwrap_or_default())
}

/// Sets each operation's summary, description and examples from [`operations::operations`]:
/// the request example on every media type of the request body, the response example on the
/// first 2xx/3xx response (JSON values on `application/json`, text on `text/*`, a redirect's
/// on its headers).
fn apply_operation_docs(doc: &mut serde_json::Value) {
    use serde_json::Value;
    for d in operations::operations() {
        let Some(op) = doc
            .pointer_mut(&format!("/paths/{}", d.path.replace('/', "~1")))
            .and_then(|item| item.get_mut(d.method))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        op.insert("summary".into(), d.summary.into());
        op.insert("description".into(), d.description.into());
        if let Some(request) = &d.request
            && let Some(content) = op
                .get_mut("requestBody")
                .and_then(|b| b.get_mut("content"))
                .and_then(Value::as_object_mut)
        {
            for media in content.values_mut() {
                media["example"] = request.clone();
            }
        }
        let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
            continue;
        };
        let Some(success) = responses
            .iter_mut()
            .filter(|(code, _)| code.starts_with('2') || code.starts_with('3'))
            .min_by(|a, b| a.0.cmp(b.0))
            .map(|(_, r)| r)
        else {
            continue;
        };
        if let Some(content) = success.get_mut("content").and_then(Value::as_object_mut) {
            for (media, m) in content.iter_mut() {
                let fits = if d.response.is_string() {
                    media.starts_with("text/")
                } else {
                    media.starts_with("application/json")
                };
                if fits {
                    m["example"] = d.response.clone();
                }
            }
        } else if let Some(headers) = success.get_mut("headers").and_then(Value::as_object_mut) {
            for header in headers.values_mut() {
                header["example"] = d.response.clone();
            }
        }
    }
}

/// Unwraps the rustdoc links of every `description` and `summary` in `v` ([`unlink`]).
fn plain_text(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match v {
                    serde_json::Value::String(s) if k == "description" || k == "summary" => {
                        *s = unlink(s);
                    }
                    _ => plain_text(v),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(plain_text),
        _ => {}
    }
}

/// `text` with each rustdoc link ``[`path::Item`]``, with or without a `(target)` or
/// `[target]` after it, as the code span `` `Item` `` (module segments dropped: they mean
/// nothing to a caller of the API; `Type::member` kept).
fn unlink(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("`]") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let path = &after[..end];
        let segments: Vec<&str> = path.split("::").collect();
        let first_kept = segments
            .iter()
            .position(|s| s.starts_with(|c: char| !c.is_ascii_lowercase()))
            .unwrap_or(segments.len() - 1);
        out.push('`');
        out.push_str(&segments[first_kept..].join("::"));
        out.push('`');
        rest = &after[end + 2..];
        // A link target right after: `(…)` or `[…]`.
        for (open, close) in [('(', ')'), ('[', ']')] {
            if rest.starts_with(open)
                && let Some(e) = rest.find(close)
            {
                rest = &rest[e + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `GET /v1/openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "service",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.",
        content_type = "application/json", body = Object)),
)]
pub async fn get_openapi() -> Response {
    let mut resp = document_json().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    fn operation<'a>(
        doc: &'a OpenApiDoc,
        method: &Method,
        path: &str,
    ) -> Option<&'a utoipa::openapi::path::Operation> {
        let item = doc.paths.paths.get(path)?;
        match *method {
            Method::GET => item.get.as_ref(),
            Method::POST => item.post.as_ref(),
            Method::PUT => item.put.as_ref(),
            Method::DELETE => item.delete.as_ref(),
            Method::PATCH => item.patch.as_ref(),
            _ => None,
        }
    }

    #[test]
    fn every_route_of_the_router_is_documented_and_nothing_else() {
        let doc = document();
        let routes = super::super::http::routes();
        for r in &routes {
            assert!(
                operation(doc, &r.method, r.path).is_some(),
                "{} {} is routed but not in the OpenAPI document",
                r.method,
                r.path
            );
        }
        let mut documented = 0;
        for (path, item) in &doc.paths.paths {
            for (method, op) in [
                (Method::GET, &item.get),
                (Method::POST, &item.post),
                (Method::PUT, &item.put),
                (Method::DELETE, &item.delete),
                (Method::PATCH, &item.patch),
            ] {
                if op.is_some() {
                    documented += 1;
                    assert!(
                        routes.iter().any(|r| r.method == method && r.path == path),
                        "{method} {path} is documented but not routed"
                    );
                }
            }
        }
        assert_eq!(documented, routes.len(), "a route listed twice");
    }

    #[test]
    fn every_operation_has_an_id_responses_problems_and_known_security() {
        let doc = document();
        let schemes = &doc.components.as_ref().unwrap().security_schemes;
        for (path, item) in &doc.paths.paths {
            for op in [&item.get, &item.post, &item.delete].into_iter().flatten() {
                assert!(op.operation_id.is_some(), "{path}: no operation id");
                let codes: Vec<&String> = op.responses.responses.keys().collect();
                assert!(
                    codes
                        .iter()
                        .any(|c| c.starts_with('2') || c.starts_with('3')),
                    "{path}: no success response"
                );
                assert!(
                    codes.iter().any(|c| *c == "500") && codes.iter().any(|c| *c == "503"),
                    "{path}: no 500/503"
                );
                for req in op.security.iter().flatten() {
                    let v = serde_json::to_value(req).unwrap();
                    for name in v.as_object().unwrap().keys() {
                        assert!(schemes.contains_key(name), "{path}: unknown scheme {name}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_server_problem_type_is_a_documented_response() {
        let doc = serde_json::to_value(document()).unwrap();
        let text = doc.to_string();
        for t in ProblemType::ALL {
            assert!(text.contains(&t.uri()), "{} not in the document", t.uri());
        }
        // Each status the server answers with is a response component used somewhere.
        for (name, status) in PROBLEM_RESPONSES {
            assert!(!server_types(*status).is_empty(), "{name}: no type");
            let reference = format!("#/components/responses/{name}");
            assert!(text.contains(&reference), "{name} is never used");
        }
        let statuses: std::collections::BTreeSet<u16> = ProblemType::ALL
            .iter()
            .filter(|t| !server_types(t.status()).is_empty())
            .map(|t| t.status())
            .collect();
        let covered: std::collections::BTreeSet<u16> =
            PROBLEM_RESPONSES.iter().map(|(_, s)| *s).collect();
        assert_eq!(statuses, covered);
    }

    #[test]
    fn the_document_is_openapi_3_1_and_every_reference_resolves() {
        let doc = serde_json::to_value(document()).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1."));
        fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(serde_json::Value::String(r)) = m.get("$ref") {
                        out.push(r.clone());
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(!all.is_empty());
        for r in all {
            let pointer = r.strip_prefix('#').expect("local reference");
            assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
        }
    }

    #[test]
    fn rustdoc_links_become_code_spans() {
        assert_eq!(
            unlink(
                "see [`super::http::parse_create`] and [`NumericBins::Auto`], [`crate::vertical`]."
            ),
            "see `parse_create` and `NumericBins::Auto`, `vertical`."
        );
        assert_eq!(unlink("[`X`](y) [`Z`][w] [`open"), "`X` `Z` [`open");
    }

    /// Issue 36 item 6: every operation of the served document has a summary, a description
    /// and an example, and no description or summary holds a rustdoc link.
    #[test]
    fn every_operation_has_a_summary_a_description_and_an_example() {
        let doc = document_value();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let name = format!("{method} {path}");
                for k in ["summary", "description"] {
                    let text = op[k].as_str().unwrap_or("");
                    assert!(text.len() > 10, "{name}: no {k}");
                }
                let text = op.to_string();
                assert!(
                    text.contains("\"example\"") || text.contains("\"examples\""),
                    "{name}: no example"
                );
            }
        }
        let mut texts = Vec::new();
        fn collect<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
            match v {
                serde_json::Value::Object(m) => {
                    for (k, v) in m {
                        match v {
                            serde_json::Value::String(s)
                                if k == "description" || k == "summary" =>
                            {
                                out.push(s)
                            }
                            _ => collect(v, out),
                        }
                    }
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
                _ => {}
            }
        }
        collect(doc, &mut texts);
        for t in texts {
            assert!(!t.contains("[`"), "a rustdoc link: {t}");
        }
    }

    #[test]
    fn problem_documents_match_their_response_schema() {
        // The server's problem serialization has the fields the schema requires.
        let p = serde_json::to_value(Problem::new(ProblemType::NotFound, "x")).unwrap();
        for k in ["type", "title", "status", "detail"] {
            assert!(p.get(k).is_some(), "{k}");
        }
    }
}
