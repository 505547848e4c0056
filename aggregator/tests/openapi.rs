//! The OpenAPI document served by a live `serve`: `GET /v1/openapi.json` is an OpenAPI 3.1
//! document, and every route of the router (`service::http::routes`, the list the router is
//! built from) is served by the live server and documented with the status it answers.

mod common;

use ldpsyn_aggregator::service::http::routes;
use serde_json::Value;

const ADMIN: &str = "openapi-test-admin-token";

/// `path` with every `{param}` replaced by a value of its kind.
fn concrete(path: &str) -> String {
    path.replace("{id}", "00000000-0000-4000-8000-000000000000")
        .replace("{party}", "bank")
        .replace("{file}", "app.js")
}

/// Every `$ref` in `v`.
fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r);
            }
            m.values().for_each(|v| refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_server_serves_an_openapi_3_1_document_of_every_route() {
    let server = common::serve(ADMIN, &[]);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = http
        .get(format!("{}/v1/openapi.json", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let doc: Value = resp.json().await.unwrap();

    // The fixed fields of an OpenAPI 3.1 document.
    let version = doc["openapi"].as_str().unwrap();
    assert!(version.starts_with("3.1."), "{version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    let paths = doc["paths"].as_object().expect("paths");
    let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
    assert_eq!(schemes["admin"]["scheme"], "bearer");
    assert_eq!(schemes["party"]["scheme"], "bearer");
    let mut all = Vec::new();
    refs(&doc, &mut all);
    for r in all {
        assert!(doc.pointer(r.trim_start_matches('#')).is_some(), "{r}");
    }

    let routes = routes();
    let operations: usize = paths
        .values()
        .map(|item| item.as_object().unwrap().len())
        .sum();
    assert_eq!(operations, routes.len(), "operations without a route");
    for route in routes {
        let (method, path) = (route.method.clone(), route.path);
        let op = &paths
            .get(path)
            .unwrap_or_else(|| panic!("{path} is not in the document"))
            [method.as_str().to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {path} is not documented");
        assert!(
            op["operationId"].is_string(),
            "{method} {path}: no operationId"
        );
        let responses = op["responses"].as_object().unwrap();
        assert!(responses.contains_key("500") && responses.contains_key("503"));
        for segment in path.split('/').filter(|s| s.starts_with('{')) {
            let name = segment.trim_matches(|c| c == '{' || c == '}');
            let declared = op["parameters"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["name"] == name && p["in"] == "path"));
            assert!(
                declared,
                "{method} {path}: path parameter {name} not declared"
            );
        }
        let admin_only = op["security"]
            .as_array()
            .is_some_and(|s| s.len() == 1 && s[0].get("admin").is_some());

        // The live router serves the route (not the fallback's 404 "no such route", not 405),
        // and answers with a documented status; admin routes refuse a request without token.
        let answer = http
            .request(method.clone(), format!("{}{}", server.base, concrete(path)))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let body = answer.text().await.unwrap();
        assert_ne!(status, 405, "{method} {path} is not routed");
        assert!(
            !body.contains("no such route"),
            "{method} {path} is not routed"
        );
        assert!(
            responses.contains_key(&status.to_string()),
            "{method} {path} answered {status}, which the document does not list"
        );
        if admin_only {
            assert_eq!(status, 401, "{method} {path} without a token");
        }
    }
}

/// Issue 36 item 6, over HTTP: every operation of the served document has a summary, a
/// description and an example; no description or summary holds a rustdoc link (`[` and a
/// backtick); the query parameters with a default say it in their schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_operation_has_a_summary_a_description_and_an_example() {
    let server = common::serve(ADMIN, &[]);
    let doc: Value = reqwest::get(format!("{}/v1/openapi.json", server.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            for k in ["summary", "description"] {
                assert!(
                    op[k].as_str().is_some_and(|s| !s.trim().is_empty()),
                    "{method} {path}: no {k}"
                );
            }
            let text = op.to_string();
            assert!(text.contains("\"example\""), "{method} {path}: no example");
        }
    }
    assert_eq!(operations, routes().len());
    fn texts<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match v {
                        Value::String(s) if k == "description" || k == "summary" => out.push(s),
                        _ => texts(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| texts(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    texts(&doc, &mut all);
    for t in all {
        assert!(!t.contains("[`"), "a rustdoc link in the document: {t}");
    }
    let params = doc["paths"]["/v1/collections/{id}/synthetic"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let default = |name: &str| {
        params
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["schema"]["default"].clone())
            .unwrap()
    };
    assert_eq!(default("seed"), 0);
    assert_eq!(default("format"), "csv");
    assert_eq!(default("numeric"), "recover");
}
