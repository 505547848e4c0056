//! Every bad input gets its documented status and problem document, and changes no state.

use base64::Engine as _;
use ldpsyn::Epsilon;
use ldpsyn::mechanism::MechanismKind;
use ldpsyn::wire::{PROBLEM_CONTENT_TYPE, Problem, ProblemType, Task};
use ldpsyn_service::tokens::{TaskClaims, TokenKey};
use ldpsyn_tests::*;
use serde_json::{Value, json};
use uuid::Uuid;

struct Ctx {
    http: reqwest::Client,
    base: String,
    id: Uuid,
}

impl Ctx {
    async fn accepted(&self) -> u64 {
        let v: Value = self
            .http
            .get(format!("{}/v1/collections/{}", self.base, self.id))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["status"]["reports_accepted"].as_u64().unwrap()
    }

    async fn task(&self) -> Task {
        self.http
            .get(format!("{}/v1/collections/{}/task", self.base, self.id))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn upload_raw(&self, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/collections/{}/reports", self.base, self.id))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// An upload whose headers declare `len` body bytes, answered before any body byte is
    /// sent: the server refuses on the declared length alone. (A client that writes a large
    /// body first races the server's close of the connection and may see a broken pipe
    /// instead of the answer.) Returns the status line's code, the content type and the
    /// problem document.
    async fn upload_declared(&self, len: usize) -> (u16, String, Problem) {
        let addr = self.base.trim_start_matches("http://").to_owned();
        let path = format!("/v1/collections/{}/reports", self.id);
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
            tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))
                .unwrap();
            write!(
                tcp,
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                 Content-Length: {len}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut raw = Vec::new();
            tcp.read_to_end(&mut raw).unwrap();
            let text = String::from_utf8(raw).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
            let content_type = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-type")
                        .then(|| v.trim().to_owned())
                })
                .unwrap();
            (status, content_type, serde_json::from_str(body).unwrap())
        })
        .await
        .unwrap()
    }

    /// Uploads one report and returns its per-report answer.
    async fn upload_one(&self, report: Value) -> Value {
        let resp = self.upload_raw(json!([report]).to_string()).await;
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.unwrap();
        v[0].clone()
    }
}

async fn expect_problem(resp: reqwest::Response, status: u16, kind: ProblemType) -> Problem {
    assert_eq!(resp.status().as_u16(), status);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        PROBLEM_CONTENT_TYPE
    );
    let p: Problem = resp.json().await.unwrap();
    assert_eq!(p.problem_type, kind);
    assert_eq!(p.status, status);
    assert!(!p.detail.is_empty());
    p
}

fn expect_rejected(answer: &Value, kind: ProblemType) {
    assert_eq!(answer["status"], "rejected", "{answer}");
    assert_eq!(answer["problem"]["type"], kind.uri(), "{answer}");
    assert!(!answer["problem"]["detail"].as_str().unwrap().is_empty());
}

/// A valid payload for a task (value 0 / all-zero bits).
fn payload_for(t: &Task, dims: &[usize]) -> Value {
    let k: usize = t.factor.iter().map(|&a| dims[a]).product();
    match t.mechanism {
        MechanismKind::Grr => json!({"grr": 0}),
        MechanismKind::GrrPair => json!({"grr_pair": [0, 0]}),
        MechanismKind::Oue => {
            json!({"oue": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(vec![0u8; k.div_ceil(8)])})
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bad.db").display());
    let server = start(
        &url,
        &[
            "--max-body-bytes",
            "200000",
            "--max-reports-per-upload",
            "50",
        ],
    )
    .await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "privincr", "epsilon": 2.0, "target_users": 100000}),
    )
    .await;
    let other = create(
        &base,
        json!({"protocol": "privincr", "epsilon": 2.0, "target_users": 100000}),
    )
    .await;
    let ctx = Ctx {
        http: reqwest::Client::new(),
        base: base.clone(),
        id,
    };
    let dims = schema().domain_sizes();

    // One good report first, so that replays have something to hit.
    let t = ctx.task().await;
    let good_id = Uuid::new_v4();
    let good = json!({"id": good_id, "token": t.token, "payload": payload_for(&t, &dims)});
    assert_eq!(ctx.upload_one(good.clone()).await["status"], "accepted");
    assert_eq!(ctx.accepted().await, 1);

    // Malformed JSON, wrong shape, wrong types, empty: 400 for the whole upload.
    for body in [
        "not json",
        "{\"id\": 1}",
        "[{\"id\": \"x\", \"token\": \"t\", \"payload\": {\"grr\": 1}}]",
        "[{\"id\": \"0b5a3c47-3cfd-4b5e-9a3a-7e2f3c1d2e10\", \"token\": 5, \"payload\": {\"grr\": 1}}]",
        "[{\"id\": \"0b5a3c47-3cfd-4b5e-9a3a-7e2f3c1d2e10\", \"token\": \"t\", \"payload\": {\"grr\": -1}}]",
        "[{\"id\": \"0b5a3c47-3cfd-4b5e-9a3a-7e2f3c1d2e10\", \"token\": \"t\", \"payload\": {\"oue\": \"***\"}}]",
        "[{\"id\": \"0b5a3c47-3cfd-4b5e-9a3a-7e2f3c1d2e10\", \"token\": \"t\", \"payload\": {\"grr\": 1, \"oue\": \"AA\"}}]",
    ] {
        expect_problem(
            ctx.upload_raw(body).await,
            400,
            ProblemType::MalformedRequest,
        )
        .await;
    }
    expect_problem(
        ctx.upload_raw("[]").await,
        400,
        ProblemType::InvalidParameter,
    )
    .await;

    // Oversized body and too many reports: 413.
    let (status, content_type, p) = ctx.upload_declared(300_002).await;
    assert_eq!((status, content_type.as_str()), (413, PROBLEM_CONTENT_TYPE));
    assert_eq!(
        (p.problem_type, p.status),
        (ProblemType::PayloadTooLarge, 413)
    );
    assert!(p.detail.contains("300002 bytes declared"), "{}", p.detail);
    let many: Vec<Value> = (0..51).map(|_| good.clone()).collect();
    expect_problem(
        ctx.upload_raw(json!(many).to_string()).await,
        413,
        ProblemType::PayloadTooLarge,
    )
    .await;

    // Unknown collection: 404 on every public route.
    let nobody = Uuid::new_v4();
    for path in [
        format!("/v1/collections/{nobody}"),
        format!("/v1/collections/{nobody}/task"),
        "/v1/collections/not-a-uuid".to_owned(),
    ] {
        let r = ctx.http.get(format!("{base}{path}")).send().await.unwrap();
        expect_problem(r, 404, ProblemType::UnknownCollection).await;
    }
    let r = ctx
        .http
        .post(format!("{base}/v1/collections/{nobody}/reports"))
        .body(json!([good]).to_string())
        .send()
        .await
        .unwrap();
    expect_problem(r, 404, ProblemType::UnknownCollection).await;

    // Bad task count.
    for q in ["count=0", "count=1001", "count=x"] {
        let r = ctx
            .http
            .get(format!("{base}/v1/collections/{id}/task?{q}"))
            .send()
            .await
            .unwrap();
        expect_problem(r, 400, ProblemType::InvalidParameter).await;
    }

    // Per-report rejections.
    let t = ctx.task().await;
    let k: usize = t.factor.iter().map(|&a| dims[a]).product();
    // Out-of-domain values and wrong lengths for the token's mechanism.
    let b64 = |v: Vec<u8>| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let bad_payloads = match t.mechanism {
        MechanismKind::Oue => {
            let mut v = vec![
                json!({"oue": b64(vec![0u8; k.div_ceil(8) + 1])}),
                json!({"oue": b64(vec![0u8; k.div_ceil(8) - 1])}),
                json!({"grr": 0}),
            ];
            if k % 8 != 0 {
                // Unused bits set.
                v.push(json!({"oue": b64(vec![0xffu8; k.div_ceil(8)])}));
            }
            v
        }
        _ => vec![json!({"grr": k as u64}), json!({"oue": "AA"})],
    };
    for p in bad_payloads {
        let a = ctx
            .upload_one(json!({"id": Uuid::new_v4(), "token": t.token, "payload": p}))
            .await;
        expect_rejected(&a, ProblemType::InvalidPayload);
    }
    // Forged tokens: garbage, altered, signed with another key.
    let forged_key = TokenKey::new(vec![3; 32]).unwrap();
    let claims = TaskClaims {
        collection: id,
        round: 0,
        factor: t.factor.clone(),
        mechanism: t.mechanism,
        epsilon: Epsilon::new(2.0).unwrap(),
        expires_at: i64::MAX,
        nonce: [1; 16],
        bins: vec![],
    };
    let mut altered = t.token.clone().into_bytes();
    altered[10] = if altered[10] == b'A' { b'B' } else { b'A' };
    for tok in [
        "garbage".to_owned(),
        String::from_utf8(altered).unwrap(),
        forged_key.sign(&claims),
    ] {
        let a = ctx
            .upload_one(
                json!({"id": Uuid::new_v4(), "token": tok, "payload": payload_for(&t, &dims)}),
            )
            .await;
        expect_rejected(&a, ProblemType::InvalidToken);
    }
    // Expired (signed with the real key, since tests know it).
    let real = TokenKey::new(TOKEN_KEY.as_bytes().to_vec()).unwrap();
    let expired = real.sign(&TaskClaims {
        expires_at: 1,
        ..claims.clone()
    });
    let a = ctx
        .upload_one(
            json!({"id": Uuid::new_v4(), "token": expired, "payload": payload_for(&t, &dims)}),
        )
        .await;
    expect_rejected(&a, ProblemType::TokenExpired);
    // Foreign: a valid token of another collection.
    let foreign: Task = ctx
        .http
        .get(format!("{base}/v1/collections/{other}/task"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let a = ctx
        .upload_one(json!({"id": Uuid::new_v4(), "token": foreign.token, "payload": payload_for(&foreign, &dims)}))
        .await;
    expect_rejected(&a, ProblemType::InvalidToken);
    // Reused token (new id, token of the accepted report): 409-type rejection.
    let first = ctx.task().await;
    let a = ctx
        .upload_one(json!({"id": Uuid::new_v4(), "token": good["token"], "payload": payload_for(&first, &dims)}))
        .await;
    // The payload may not fit the first token's mechanism; use the original payload.
    let a =
        if a["status"] == "rejected" && a["problem"]["type"] == ProblemType::InvalidPayload.uri() {
            ctx.upload_one(
                json!({"id": Uuid::new_v4(), "token": good["token"], "payload": good["payload"]}),
            )
            .await
        } else {
            a
        };
    expect_rejected(&a, ProblemType::TokenReused);
    // Replayed id: duplicate, counted once.
    let a = ctx.upload_one(good.clone()).await;
    assert_eq!(a["status"], "duplicate");
    // Same report twice in one upload: accepted once, duplicate once.
    let t2 = ctx.task().await;
    let twice =
        json!({"id": Uuid::new_v4(), "token": t2.token, "payload": payload_for(&t2, &dims)});
    let r = ctx.upload_raw(json!([twice, twice]).to_string()).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v[0]["status"], "accepted");
    assert_eq!(v[1]["status"], "duplicate");
    assert_eq!(ctx.accepted().await, 2, "only the two good reports count");
    assert_eq!(server.state().db().count_reports(id).await.unwrap(), 2);

    // Admin routes: missing or wrong token → 401.
    for (m, path) in [
        ("GET", "/v1/collections".to_owned()),
        ("POST", "/v1/collections".to_owned()),
        ("POST", format!("/v1/collections/{id}/close-round")),
        ("POST", format!("/v1/collections/{id}/finalize")),
        ("GET", format!("/v1/collections/{id}/model")),
        (
            "GET",
            format!("/v1/collections/{id}/marginals?attrs=region"),
        ),
        ("GET", format!("/v1/collections/{id}/synthetic?rows=1")),
    ] {
        for auth in [None, Some("Bearer wrong-token-123")] {
            let mut req = if m == "GET" {
                ctx.http.get(format!("{base}{path}"))
            } else {
                ctx.http.post(format!("{base}{path}"))
            };
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            expect_problem(req.send().await.unwrap(), 401, ProblemType::Unauthorized).await;
        }
    }
    // Model before finalize: 409; bad create requests: 400.
    let (s, v) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
    assert_eq!(
        (s, v["type"].as_str()),
        (409, Some(ProblemType::ModelNotReady.uri().as_str()))
    );
    for (body, kind) in [
        (
            json!({"protocol": "nope", "epsilon": 1.0, "target_users": 10}),
            ProblemType::InvalidParameter,
        ),
        (
            json!({"protocol": "privincr", "epsilon": -1.0, "target_users": 10}),
            ProblemType::InvalidParameter,
        ),
        (
            json!({"protocol": "privincr", "epsilon": 800.0, "target_users": 10}),
            ProblemType::InvalidParameter,
        ),
        (
            json!({"protocol": "auto", "epsilon": 0.001, "target_users": 10}),
            ProblemType::InvalidParameter,
        ),
        // A domain one anonymous report would make the server allocate (10a).
        (
            json!({"protocol": "samprivsyn", "epsilon": 1.0, "target_users": 10,
                   "schema": {"attributes": [
                       {"name": "n", "type": "numeric", "min": 0, "max": 1, "bins": 1_000_000_000u64},
                       {"name": "c", "type": "categorical", "labels": ["a", "b"]}]}}),
            ProblemType::InvalidParameter,
        ),
        (
            json!({"protocol": "privincr", "epsilon": 1.0, "target_users": 10,
                   "schema": {"attributes": [
                       {"name": "x", "type": "numeric", "min": 0, "max": 1, "bins": 2000},
                       {"name": "y", "type": "numeric", "min": 0, "max": 1, "bins": 2000}]}}),
            ProblemType::InvalidParameter,
        ),
        // Working bins a pair's task cannot carry (300 > 257 per attribute).
        (
            json!({"protocol": "auto", "epsilon": 1.0, "target_users": 10,
                   "schema": {"attributes": [
                       {"name": "income", "type": "numeric", "min": 0, "max": 1000,
                        "integer": true, "bins": "auto", "max_bins": 300},
                       {"name": "c", "type": "categorical", "labels": ["a", "b"]}]}}),
            ProblemType::InvalidParameter,
        ),
        (
            json!({"protocol": "privincr", "epsilon": 1.0, "target_users": 10, "batch_size": 5}),
            ProblemType::InvalidParameter,
        ),
        (
            json!({"protocol": "privincr", "epsilon": 1.0, "target_users": 10, "omega": 2.0}),
            ProblemType::InvalidParameter,
        ),
        (
            json!({"protocol": "privincr", "epsilon": 1.0, "target_users": 10, "schema": {"attributes": []}}),
            ProblemType::InvalidSchema,
        ),
    ] {
        let mut body = body;
        if body.get("schema").is_none() {
            body["schema"] = schema_json();
        }
        let r = ctx
            .http
            .post(format!("{base}/v1/collections"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        expect_problem(r, 400, kind).await;
    }
    // Unknown route: 404 problem; metrics exposes rejections by reason.
    let r = ctx
        .http
        .get(format!("{base}/v2/nothing"))
        .send()
        .await
        .unwrap();
    expect_problem(r, 404, ProblemType::NotFound).await;
    let m = ctx
        .http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("ldpsyn_reports_total{outcome=\"rejected\",reason=\"invalid-token\"} 4"),
        "{m}"
    );
    assert!(
        m.contains("ldpsyn_reports_total{outcome=\"accepted\"} 2"),
        "{m}"
    );
    // The public view counts collections but names none; the admin view names each; a
    // wrong token is refused.
    assert!(m.contains("ldpsyn_collections 2"), "{m}");
    assert!(
        !m.contains(&id.to_string()) && !m.contains("collection="),
        "{m}"
    );
    let m = ctx
        .http
        .get(format!("{base}/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains(&format!(
            "ldpsyn_collection_reports{{collection=\"{id}\"}} 2"
        )),
        "{m}"
    );
    let r = ctx
        .http
        .get(format!("{base}/metrics"))
        .bearer_auth("not-the-token")
        .send()
        .await
        .unwrap();
    expect_problem(r, 401, ProblemType::Unauthorized).await;
    assert_eq!(ctx.accepted().await, 2);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_ip_rate_limit_answers_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("rl.db").display());
    let server = ldpsyn_service::Server::start(test_config(&url, &["--rate-limit-per-ip", "2"]))
        .await
        .unwrap();
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "independence", "epsilon": 1.0, "target_users": 10}),
    )
    .await;
    let http = reqwest::Client::new();
    let mut limited = None;
    for _ in 0..10 {
        let r = http
            .post(format!("{base}/v1/collections/{id}/reports"))
            .body("[]")
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("limited within 10 quick uploads");
    assert!(r.headers().contains_key("retry-after"));
    expect_problem(r, 429, ProblemType::RateLimited).await;
    server.shutdown().await.unwrap();
}

/// Query strings are deserialized strictly (`deny_unknown_fields`): an unknown, repeated or
/// ill-typed parameter answers 400 `invalid-parameter` as `application/problem+json` on
/// `…/task`, `…/marginals` and `…/synthetic`, while the documented parameters still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_query_parameters_are_400_problems() {
    use ldpsyn::client::{Client, ClientOptions};
    use ldpsyn::ledger::MemoryLedger;

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("query.db").display());
    let server = start(&url, &[]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "independence", "epsilon": 2.0, "target_users": 200}),
    )
    .await;
    let http = reqwest::Client::new();
    let get = |path: String, admin: bool| {
        let mut req = http.get(format!("{base}/v1/collections/{id}/{path}"));
        if admin {
            req = req.bearer_auth(ADMIN);
        }
        req.send()
    };
    for q in [
        "foo=1",
        "count=2&foo=1",
        "count=2&count=3",
        "Count=2",
        "count=%ZZ",
    ] {
        let r = get(format!("task?{q}"), false).await.unwrap();
        expect_problem(r, 400, ProblemType::InvalidParameter).await;
    }
    assert_eq!(
        get("task?count=2".into(), false).await.unwrap().status(),
        200
    );
    // A route with another method: 405 as a problem document, with `Allow`.
    let r = http
        .delete(format!("{base}/v1/collections/{id}/task"))
        .send()
        .await
        .unwrap();
    let allow = r
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_owned());
    expect_problem(r, 405, ProblemType::MethodNotAllowed).await;
    assert!(allow.is_some_and(|a| a.contains("GET")), "Allow header");

    let mut people = people(&schema(), 200, 4);
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 6);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for r in client.submit_batch(&mut people).await.unwrap() {
        r.expect("accepted");
    }
    let (s, _) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200);

    for q in [
        "rows=5&foo=1",
        "rows=5&seed=1&extra=",
        "rows=5&rows=6",
        "rows=x",
        "seed=1",
        "rows=5&format=xml",
    ] {
        let r = get(format!("synthetic?{q}"), true).await.unwrap();
        expect_problem(r, 400, ProblemType::InvalidParameter).await;
    }
    for q in ["attrs=region&foo=1", "attr=region", ""] {
        let r = get(format!("marginals?{q}"), true).await.unwrap();
        expect_problem(r, 400, ProblemType::InvalidParameter).await;
    }
    let ok = get(
        "synthetic?rows=5&seed=1&format=ndjson&numeric=midpoint".into(),
        true,
    )
    .await
    .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.text().await.unwrap().lines().count(), 5);
    let ok = get("marginals?attrs=region".into(), true).await.unwrap();
    assert_eq!(ok.status(), 200);
    server.shutdown().await.unwrap();
}

/// A schema of more than `MAX_ATTRIBUTES` (512) attributes is refused at creation with 400
/// `invalid-schema` naming the limit and what to do; nothing is created. (The limit was
/// 65,535 before: 513 attributes were accepted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_attributes_are_refused_at_creation() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("wide.db").display());
    let server = start(&url, &[]).await;
    let base = base(&server);
    let n = ldpsyn_engine::MAX_ATTRIBUTES + 1;
    let attributes: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("a{i}"), "type": "categorical", "labels": ["x", "y"]}))
        .collect();
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"protocol": "independence", "epsilon": 2.0, "target_users": 100,
            "schema": {"attributes": attributes}}),
        )
        .send()
        .await
        .unwrap();
    let p = expect_problem(r, 400, ProblemType::InvalidSchema).await;
    assert!(
        p.detail.contains("513 attributes") && p.detail.contains("at most 512"),
        "{}",
        p.detail
    );
    let (status, list) = admin(&base, "GET", "/v1/collections").await;
    assert_eq!(status, 200);
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");
}

/// Issue 36 item 6: a query string that does not fit its route answers a detail written for
/// a person (which parameter, what was wrong with it, what it takes), never the parser's
/// words ("invalid digit found in string", "[0, 0]", "Failed to deserialize query string").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_errors_say_what_was_wrong_and_what_is_allowed() {
    use ldpsyn::client::{Client, ClientOptions};
    use ldpsyn::ledger::MemoryLedger;

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("words.db").display());
    let server = start(&url, &[]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "independence", "epsilon": 2.0, "target_users": 200}),
    )
    .await;
    let http = reqwest::Client::new();
    let detail = |path: String, method: reqwest::Method| {
        let req = http
            .request(method, format!("{base}/v1/collections/{id}/{path}"))
            .bearer_auth(ADMIN);
        async move {
            expect_problem(
                req.send().await.unwrap(),
                400,
                ProblemType::InvalidParameter,
            )
            .await
            .detail
        }
    };
    let get = reqwest::Method::GET;
    assert_eq!(
        detail("task?count=abc".into(), get.clone()).await,
        "`count=abc` is not allowed: `count` takes a whole number from 1 to 1000; without \
         it, one task object"
    );
    assert_eq!(
        detail("task?count=5000".into(), get.clone()).await,
        "`count=5000` is not allowed: `count` takes a whole number from 1 to 1000; without \
         it, one task object"
    );
    assert_eq!(
        detail("close-round?force=yes".into(), reqwest::Method::POST).await,
        "`force=yes` is not allowed: `force` takes `true` or `false`; default `false`"
    );

    let mut people = people(&schema(), 200, 5);
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 6);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for r in client.submit_batch(&mut people).await.unwrap() {
        r.expect("accepted");
    }
    let (s, _) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200);

    let synthetic_usage = "this route takes `rows` (required; a whole number from 1 to the \
        server's `--max-synthetic-rows`, 10,000,000 unless set), `seed` (a whole number from 0 \
        to 18446744073709551615; default 0), `format` (`csv`, `ndjson` or `parquet`; default \
        `csv`), `numeric` (`recover`, `uniform` or `midpoint`; default `recover`)";
    assert_eq!(
        detail("synthetic?rows=5&seed=abc".into(), get.clone()).await,
        "`seed=abc` is not allowed: `seed` takes a whole number from 0 to \
         18446744073709551615; default 0"
    );
    assert_eq!(
        detail("synthetic?seed=1".into(), get.clone()).await,
        format!("`rows` is missing; {synthetic_usage}")
    );
    assert_eq!(
        detail("synthetic?rows=5&colour=red".into(), get.clone()).await,
        format!("unknown query parameter `colour`; {synthetic_usage}")
    );
    assert_eq!(
        detail("synthetic?rows=5&rows=6".into(), get.clone()).await,
        "`rows` is given twice; give it once"
    );
    assert_eq!(
        detail("synthetic?rows=5&format=xml".into(), get.clone()).await,
        "`format=xml` is not allowed: `format` takes `csv`, `ndjson` or `parquet`; default \
         `csv`"
    );
    assert_eq!(
        detail("synthetic?rows=0".into(), get.clone()).await,
        "`rows=0` is not allowed: `rows` takes a whole number from 1 to the server's \
         `--max-synthetic-rows`, 10,000,000 unless set"
    );
    assert_eq!(
        detail("marginals?attrs=region,region".into(), get.clone()).await,
        "`attrs` names `region` twice: give each attribute once"
    );
    assert_eq!(
        detail("marginals?attrs=region,height".into(), get.clone()).await,
        "unknown attribute `height`; the attributes are `region`, `income`, `smoker`, \
         `lung`, `shoe`"
    );
    assert_eq!(
        detail("marginals?attrs=region,,shoe".into(), get.clone()).await,
        "`attrs=region,,shoe` has an empty name: give attribute names separated by single \
         commas, e.g. `attrs=region,income`"
    );
    assert_eq!(
        detail("marginals".into(), get.clone()).await,
        "`attrs` is missing; this route takes `attrs` (required; attribute names of the \
         schema, comma-separated, each once, e.g. `attrs=age,sex`), `provisional` (`true` \
         (before finalize, a model refitted from the reports so far) or `false`; default \
         `false`)"
    );
    // No parser jargon anywhere.
    for q in [
        "synthetic?rows=x",
        "synthetic?rows=5&seed=-1",
        "task?count=%ZZ",
    ] {
        let d = detail(q.into(), get.clone()).await;
        for jargon in ["invalid digit", "deserialize", "Failed to", "[0"] {
            assert!(!d.contains(jargon), "{q}: {d}");
        }
    }
    // Bodies: where the value is wrong and what was expected, not Rust type names.
    let post = |path: String, body: &'static str| {
        http.post(format!("{base}{path}"))
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = post(
        "/v1/collections".into(),
        r#"{"schema": {"attributes": [{"name": "a", "type": "categorical", "labels": ["x", "y"]}]},
            "protocol": "independence", "epsilon": 1, "target_users": -1}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        expect_problem(r, 400, ProblemType::InvalidParameter)
            .await
            .detail,
        "`target_users`: got integer `-1`, expected a whole number ≥ 0"
    );
    let r = post(format!("/v1/collections/{id}/reports"), r#"[{"id": "x"}]"#)
        .await
        .unwrap();
    assert_eq!(
        expect_problem(r, 400, ProblemType::MalformedRequest)
            .await
            .detail,
        "the body must be a JSON array of reports {id, token, payload}: `[0].id`: not a UUID \
         (expected 36 characters like 3af4f667-eca5-4b74-95bb-0b1b8dabef8b)"
    );
    server.shutdown().await.unwrap();
}
