//! Summary, description and example of every operation of the document, in one table
//! ([`operations`]) written for the people who call the API; [`super::document_json`] applies it
//! and tests check that no operation lacks one. The examples are real answers of a `serve`
//! (a two-attribute collection of 40 people), shortened.

use serde_json::{Value, json};

/// The documentation of one operation.
pub(crate) struct OperationDoc {
    /// `get`, `post` or `delete`.
    pub method: &'static str,
    /// The path as in the document.
    pub path: &'static str,
    /// One line.
    pub summary: &'static str,
    /// What it does, who may call it, what it refuses.
    pub description: &'static str,
    /// An example request body (JSON routes that take one).
    pub request: Option<Value>,
    /// An example of the success answer (a JSON value, or a string for text), put on every
    /// media type of the first 2xx/3xx response; for a redirect, on its `location` header.
    pub response: Value,
}

const COLLECTION_ID: &str = "bef3179f-5cd2-4ee1-98a9-295adc829333";
const TOKEN: &str = "Ab7zF59c0k7hmKkpWtyCkzMAAAAAAUAAAAAAAAAAAAAAAGsLL-gBoh6MyceXaBcYk2Vhi4fYAQABcAJqy9binzABCmF6WFMdm1HuWs9kBtr6MkGC3facyNU";

fn schema() -> Value {
    json!({"attributes": [
        {"name": "age", "type": "numeric", "min": 0.0, "max": 100.0, "bins": 4, "integer": true,
         "out_of_range": "reject", "missing": "reject", "missing_markers": [""]},
        {"name": "sex", "type": "categorical", "labels": ["F", "M"], "missing": "reject",
         "missing_markers": [""]}
    ]})
}

fn status(phase: &str, accepted: u64) -> Value {
    json!({"phase": phase, "round": 0, "round_quota": null, "round_accepted": accepted,
           "reports_accepted": accepted, "active_edges": [], "model_ready": phase == "finalized",
           "model": if phase == "finalized" { "ready" } else { "collecting" },
           "model_error": null, "rounds": []})
}

fn collection(phase: &str, accepted: u64) -> Value {
    json!({"version": 1, "id": COLLECTION_ID, "name": "Survey 2026", "schema": schema(),
           "epsilon": 2.0, "target_users": 40, "protocol": "independence",
           "auto_finalize_at_target": true, "past_target": "refuse",
           "status": status(phase, accepted),
           "upload_limits": {"max_body_bytes": 4194304, "max_reports_per_upload": 1000}})
}

fn task(factor: u32) -> Value {
    json!({"collection_id": COLLECTION_ID, "round": 0, "factor": [factor], "mechanism": "grr",
           "epsilon": 2.0, "token": TOKEN, "expires_at": 1795895272})
}

fn model() -> Value {
    json!({"protocol": "independence", "domain_sizes": [4, 2], "edges": [],
        "structure": {"d": 2, "edges": [], "junction_tree": {"cliques": [[0], [1]], "edges": []},
            "conditionals": [{"targets": [0], "parents": []}, {"targets": [1], "parents": []}]},
        "pair_weights": null, "model_graph": [],
        "rounds": [{"round": 0, "reports": 40, "factors": [
            {"factor": [1], "mechanism": "grr", "reports": 24},
            {"factor": [0], "mechanism": "grr", "reports": 16}]}],
        "working_bins": [[], []]})
}

/// Every operation's documentation.
pub(crate) fn operations() -> Vec<OperationDoc> {
    let id = COLLECTION_ID;
    vec![
        OperationDoc {
            method: "post",
            path: "/v1/collections",
            summary: "Create a collection",
            description: "Creates a collection from a schema, a protocol and its parameters, \
                ε per report and the number of people it aims at (admin). Answers the public \
                config with its status (a vertical collection: also each party's upload \
                token). Defaults: `auto_finalize_at_target` true and `past_target` `refuse` \
                for device collections; raw reports kept until the collection is deleted \
                unless `retain_reports_days` is given. An invalid schema or parameter is a \
                400 whose detail names it.",
            request: Some(json!({"name": "Survey 2026", "schema": {"attributes": [
                    {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 4,
                     "integer": true},
                    {"name": "sex", "type": "categorical", "labels": ["F", "M"]}]},
                "protocol": "independence", "epsilon": 2.0, "target_users": 40})),
            response: collection("one_way", 0),
        },
        OperationDoc {
            method: "get",
            path: "/v1/collections",
            summary: "List collections",
            description: "Every collection this server holds, each with its public config \
                and status (admin).",
            request: None,
            response: json!([collection("one_way", 12)]),
        },
        OperationDoc {
            method: "get",
            path: "/v1/collections/{id}",
            summary: "Get a collection's public config and status",
            description: "The config a device needs before it reports (schema, protocol, ε, \
                upload limits) and where the collection is (phase, round, reports accepted). \
                No credentials: the config is public. Rate-limited per client address.",
            request: None,
            response: collection("one_way", 12),
        },
        OperationDoc {
            method: "delete",
            path: "/v1/collections/{id}",
            summary: "Delete a collection",
            description: "Deletes the collection with everything stored of it (config, state, \
                reports or party records, tables, round counts; its model with it), in one \
                transaction, whatever its phase (admin). Reports still on their way are \
                refused `unknown-collection`, as is every later request for it. Cannot be \
                undone.",
            request: None,
            response: json!({"id": id, "reports_deleted": 40}),
        },
        OperationDoc {
            method: "get",
            path: "/v1/collections/{id}/task",
            summary: "Get a task for a device",
            description: "Draws what a device should report: a factor (attributes), the \
                mechanism, ε and a signed token that its report must carry; tasks never \
                depend on anyone's data. Without `count` one task object; with `count` \
                (1 to 1000) an array of independently drawn tasks. No credentials; \
                rate-limited per client address. 409 once the collection is finalized or at \
                its target.",
            request: None,
            response: task(1),
        },
        OperationDoc {
            method: "post",
            path: "/v1/collections/{id}/reports",
            summary: "Upload randomized reports",
            description: "Uploads 1 to `--max-reports-per-upload` (default 1000) randomized \
                reports, each answering a task token; answered after a durable commit, one \
                answer per report in order: `accepted`, `duplicate` (the same id and content \
                was stored before: a safe retry) or `rejected` with a problem. No \
                credentials: the token is the authorization. Bodies above \
                `--max-body-bytes` are 413.",
            request: Some(json!([{"id": "3af4f667-eca5-4b74-95bb-0b1b8dabef8b",
                "token": TOKEN, "payload": {"grr": 0}}])),
            response: json!([{"id": "3af4f667-eca5-4b74-95bb-0b1b8dabef8b",
                "status": "accepted"}]),
        },
        OperationDoc {
            method: "post",
            path: "/v1/collections/{id}/close-round",
            summary: "Close the open round (or batch) now",
            description: "Closes the open round of a PrivIncr/auto phase 1 (pruning pairs, or \
                entering phase 2 after the last round) or the open SamPrivSyn batch \
                (re-weighting), then any round whose quota is already reached (admin). \
                Rounds close by themselves at their quota; this is for closing one early. A \
                round with no reports is refused (`409 round-empty`, nothing changes) unless \
                `force=true` (default `false`). In a phase without rounds nothing changes: \
                `transitions` is empty.",
            request: None,
            response: json!({"transitions": [], "status": status("one_way", 12)}),
        },
        OperationDoc {
            method: "post",
            path: "/v1/collections/{id}/finalize",
            summary: "Finalize: build the model",
            description: "Closes the collection to reports and fits the model from every \
                report collected (admin); afterwards the model, marginals and synthetic data \
                can be read. Answers 200 with the model when the fit ends within the wait, \
                else 202 while the fit goes on: poll `Location` (the model route, 409 \
                `model-not-ready` until it is built) or the collection's `status.model` \
                (`building`, then `ready` or `failed`). The wait is 10 s, or what \
                `Prefer: wait=N` asks (RFC 7240), none with `Prefer: respond-async`, and \
                always ends before the request timeout. Finalizing again answers the model \
                once built, or fits again after a failed fit. A device collection also \
                finalizes by itself at its target unless created with \
                `auto_finalize_at_target: false`. 409 without any report.",
            request: None,
            response: json!({"status": status("finalized", 40), "model": model()}),
        },
        OperationDoc {
            method: "get",
            path: "/v1/collections/{id}/model",
            summary: "Get the model, final or provisional",
            description: "The model built at finalization (admin): the pairs evaluated, the \
                dependency structure and junction tree, the rounds with their reports, the \
                working bins of numeric attributes, and drift and residual checks where they \
                apply, with `provisional` (false: the final model) and `reports` (the reports \
                it was fitted from). Before finalization it is 409 `model-not-ready` unless \
                `provisional=true` (default `false`): then the answer is a model refitted \
                from the reports accepted so far by the same stages as finalize, labelled \
                `\"provisional\": true` with `reports` and `fitted_at` (Unix seconds); refits \
                are cached per collection for the server's `--provisional-refresh-ms` \
                (default 5,000) and never change the collection. After finalization \
                `provisional=true` answers the final model. 409 `conflict` before the first \
                report.",
            request: None,
            response: json!({"attributes": ["age", "sex"], "model": model(),
                "provisional": true, "reports": 40, "fitted_at": 1779195272}),
        },
        OperationDoc {
            method: "get",
            path: "/v1/collections/{id}/marginals",
            summary: "Get a marginal of the model, final or provisional",
            description: "The joint distribution of the attributes named in `attrs` \
                (comma-separated, each once) under the model, row-major in that order, with \
                each code's label (numeric: the bin's midpoint) and standard errors where a \
                measured table holds all of them (admin). An unknown or repeated name is a \
                400 naming it. Before finalization it is 409 `model-not-ready` unless \
                `provisional=true` (default `false`): then the model refitted from the \
                reports so far answers (as `GET …/model?provisional=true`), labelled \
                `\"provisional\": true` with `reports` and `fitted_at`; its standard errors \
                come from the same variance model as the final one's and shrink as reports \
                arrive. Provisional estimates are post-processing of the same reports: they \
                cost no privacy. After finalization `provisional=true` answers the final \
                model (`\"provisional\": false`).",
            request: None,
            response: json!({"attributes": ["age", "sex"],
                "labels": [["12", "37", "62", "88"], ["F", "M"]], "dims": [4, 2],
                "frequencies": [0.2143, 0.1373, 0.0285, 0.0183, 0.0904, 0.058, 0.2762, 0.177],
                "std_errors": null, "provisional": false, "reports": 40}),
        },
        OperationDoc {
            method: "get",
            path: "/v1/collections/{id}/synthetic",
            summary: "Download synthetic rows",
            description: "Streams `rows` rows drawn from the model (admin): CSV with a header \
                row (default), NDJSON or Parquet. The same `seed` (default 0) and model give \
                the same bytes; numeric values are drawn within their bin by the sub-bin \
                estimate (`numeric=recover`, default), uniformly or at the midpoint. `rows` \
                is required, 1 to the server's `--max-synthetic-rows` (10,000,000 unless \
                set).",
            request: None,
            response: Value::String("age,sex\n5,F\n19,F\n14,M\n".into()),
        },
        OperationDoc {
            method: "get",
            path: "/v1/collections/{id}/parties",
            summary: "Get the parties' upload tokens",
            description: "Every party's upload token of a vertical collection, by party name \
                (admin); 409 for a device collection.",
            request: None,
            response: json!({"bank": "p1-3f9c0a7e5b2d4c6e8a1b3d5f7092e4c6", "telco":
                "p1-8e2d4f6a0c1b3e5d7f9a2c4e6b8d0f13"}),
        },
        OperationDoc {
            method: "post",
            path: "/v1/collections/{id}/parties/{party}/records",
            summary: "Upload a party's randomized records",
            description: "A vertical collection's data party uploads its records: each a \
                keyed record id and the randomized codes of the party's attributes, in the \
                party's attribute order (under encoding `sampled+locmrf`: `attribute`, the \
                party-order index of the one attribute drawn, and its one code). Authorized by \
                the party's own bearer token; an \
                identical resend counts as `duplicate`. Rate-limited per client address; \
                bodies above `--max-body-bytes` are 413.",
            request: Some(json!({"records": [{"id":
                "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c2e4f6a8b0d2c4e6f8a0b2d4f6e8a0c2e",
                "codes": [1, 0]}]})),
            response: json!({"accepted": 1, "duplicate": 0}),
        },
        OperationDoc {
            method: "post",
            path: "/v1/collections/{id}/parties/{party}/model",
            summary: "Upload a party's local model",
            description: "Under encoding `fo+locmrf`, `sampled+locmrf` or `sketch+locmrf`, a \
                party with a `locmrf` budget uploads \
                its local central-DP model of its own attributes (VertiMRF LocMRF): noisy \
                marginals with their noise, its attribute graph and its accounting, made by \
                `ldpsyn-aggregator party upload`. Checked against the config (400); stored \
                once (201), an identical resend is 200, another model 409. Finalize answers \
                409 until every such party has uploaded.",
            request: Some(json!({"party": "bank", "measurements": [
                {"attrs": [0], "counts": [1204.0, 873.0], "sigma": 21.3},
                {"attrs": [1], "counts": [630.0, 911.0, 540.0], "sigma": 24.9},
                {"attrs": [0, 1], "counts": [402.0, 515.0, 280.0, 231.0, 390.0, 262.0], "sigma": 9.8}],
                "graph": [[0, 1]],
                "privacy": {"epsilon": 0.32, "delta": 1e-6, "rho": 0.0021, "rho_spent": 0.0021}})),
            response: json!({"party": "bank", "stored": true, "measurements": 3}),
        },
        OperationDoc {
            method: "post",
            path: "/v1/collections/{id}/parties/{party}/sketch",
            summary: "Upload a party's sketch report",
            description: "Under encoding `sketch+locmrf` (VertiMRF as published) each party \
                uploads, besides its local model and instead of any record, one sketch report \
                made by `ldpsyn-aggregator party upload`: per value of each of its attributes \
                (in at most `sketch.bins` equal-width bins), `t` differentially private \
                Flajolet–Martin sketches of the set of record ids holding it under the key the \
                parties share, and a noisy record count. Checked against the config (400); \
                stored once (201), an identical resend is 200, another report 409, and so is a \
                report under another key than the other parties' stored ones. Finalize answers \
                409 until every party has uploaded both.",
            request: Some(json!({"party": "bank", "report": {
                "params": {"gamma": 1.2, "repetitions": 2, "sketch_epsilon": 0.009,
                           "count_epsilon": 0.05},
                "key_fingerprint": "3f9c0a7e5b2d4c6e", "domain_sizes": [2, 3],
                "sketches": "CgsKDAsNDA0LCg==", "noisy_count": 2077}})),
            response: json!({"party": "bank", "stored": true, "noisy_count": 2077,
                "sketches": 10}),
        },
        OperationDoc {
            method: "get",
            path: "/healthz",
            summary: "Check that the service and its database answer",
            description: "200 `{\"status\": \"ok\", \"models_pending\": n}` when the state \
                is loaded and the database answers a query (liveness and readiness: the API \
                serves); 503 while the service still loads its state. It does not wait for \
                models: after a start, finalized collections' models are refitted in the \
                background, `models_pending` counting those not back yet (their model routes \
                answer 409 `model-not-ready` meanwhile). No credentials; rate-limited per \
                client address.",
            request: None,
            response: json!({"status": "ok", "models_pending": 0}),
        },
        OperationDoc {
            method: "get",
            path: "/metrics",
            summary: "Prometheus metrics",
            description: "Service-wide series (requests, reports by outcome, tasks, commit \
                latency) for anyone; with the admin token also per-collection series, which \
                name every collection id. A wrong token is refused rather than served the \
                public view, so a misconfigured scraper notices.",
            request: None,
            response: Value::String(
                "# HELP ldpsyn_collections Collections this process serves.\n\
                 # TYPE ldpsyn_collections gauge\nldpsyn_collections 2\n"
                    .into(),
            ),
        },
        OperationDoc {
            method: "get",
            path: "/v1/openapi.json",
            summary: "This OpenAPI document",
            description: "The OpenAPI 3.1 document of this API: every route, its parameters \
                with their defaults, bodies, answers and problem documents, with examples.",
            request: None,
            response: json!({"openapi": "3.1.0", "info": {"title": "ldpsyn aggregator",
                "version": "0.1.0"}, "paths": {}}),
        },
        OperationDoc {
            method: "get",
            path: "/ui",
            summary: "Redirect to the dashboard",
            description: "A permanent redirect to the dashboard's page at `/ui/`.",
            request: None,
            response: Value::String("/ui/".into()),
        },
        OperationDoc {
            method: "get",
            path: "/ui/",
            summary: "The dashboard",
            description: "The dashboard's HTML page: collections, their progress and models. \
                The page itself needs no credentials; it asks for the admin token for its \
                data calls.",
            request: None,
            response: Value::String("<!doctype html>\n<html lang=\"en\">…</html>\n".into()),
        },
        OperationDoc {
            method: "get",
            path: "/ui/{file}",
            summary: "A file of the dashboard",
            description: "One of the dashboard's scripts and stylesheet (`app.js`, `api.js`, \
                `charts.js`, `style.css`) or `index.html`; another name is a 404 problem.",
            request: None,
            response: Value::String("/* the dashboard's script */\n".into()),
        },
    ]
}
