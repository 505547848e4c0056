//! The operator's dashboard at `GET /ui/`: static files (`aggregator/service/ui/`: HTML, CSS and plain
//! JavaScript modules, no build step, nothing from a CDN) embedded in the binary.
//!
//! The files load without the admin token; the page asks for it once, keeps it in the tab's
//! `sessionStorage` and sends it as `Authorization: Bearer …` on every API call (never in a
//! URL; downloads are fetched with the header and saved from a Blob). What the page shows:
//! the collections with their progress toward `target_users` and reports/s, a collection's
//! rounds and phases, its dependency graph (SVG), heat maps of 2-way and bars of 1-way
//! marginals with ±1.96 standard-error whiskers (`/marginals`), and synthetic downloads.
//!
//! Every file is served with a Content-Security-Policy that allows only this origin's scripts,
//! styles and API (no inline script, no third-party request).

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use ldpsyn::wire::ProblemType;

use super::error::ApiError;

/// One embedded file: name under `/ui/`, media type, contents.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// The dashboard's files (the first is the page at `/ui/`).
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../ui/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../ui/app.js"),
    },
    Asset {
        name: "api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../ui/api.js"),
    },
    Asset {
        name: "charts.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../ui/charts.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../ui/style.css"),
    },
];

/// Same-origin only: scripts, styles, API calls; images from `data:` (the empty favicon) and
/// `blob:` (downloads); no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// `GET /ui`: a permanent redirect to the page at `/ui/`.
#[utoipa::path(get, path = "/ui", tag = "service",
    responses((status = 308, description = "Redirect to `/ui/`.",
        headers(("location" = String, description = "`/ui/`")))))]
pub async fn ui_redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

/// `GET /ui/`: the dashboard's page.
#[utoipa::path(get, path = "/ui/", tag = "service",
    responses((status = 200, description = "The dashboard's HTML page.",
        content_type = "text/html; charset=utf-8", body = String)))]
pub async fn ui_index() -> Response {
    serve(&ASSETS[0])
}

/// `GET /ui/{file}`: one of the dashboard's scripts and stylesheet; another name is a 404
/// problem.
#[utoipa::path(get, path = "/ui/{file}", tag = "service",
    params(("file" = String, Path, description = "`app.js`, `api.js`, `charts.js`, `style.css` or `index.html`.")),
    responses(
        (status = 200, description = "The file.",
            content((String = "text/javascript; charset=utf-8"), (String = "text/css; charset=utf-8"),
                (String = "text/html; charset=utf-8"))),
        (status = 404, response = super::openapi::NotFound),
    ))]
pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == file) {
        Some(a) => serve(a),
        None => ApiError::problem(ProblemType::NotFound, format!("no dashboard file `{file}`"))
            .into_response(),
    }
}

fn serve(a: &Asset) -> Response {
    let mut resp = a.body.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a.content_type),
    );
    // Small files shipped with the binary: revalidate rather than keep a stale copy after an
    // upgrade.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_page_loads_is_embedded() {
        // index.html links style.css and app.js; app.js imports the other modules.
        let index = ASSETS[0].body;
        let app = ASSETS.iter().find(|a| a.name == "app.js").unwrap().body;
        for a in &ASSETS[1..] {
            let linked = index.contains(&format!("\"{}\"", a.name))
                || app.contains(&format!("\"./{}\"", a.name));
            assert!(linked, "{} is embedded but never loaded", a.name);
        }
        for line in app.lines().filter(|l| l.starts_with("import ")) {
            let target = line.rsplit("\"./").next().unwrap().trim_end_matches("\";");
            assert!(
                ASSETS.iter().any(|a| a.name == target),
                "app.js imports {target}, which is not embedded"
            );
        }
        assert!(!index.contains("<script>"), "inline scripts break the CSP");
    }
}
