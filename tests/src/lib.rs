//! Helpers shared by the integration tests: start an aggregator on a free port of
//! 127.0.0.1, create collections over HTTP, build simulated people with correlated records,
//! and reduce their reports in process with the engine.
#![warn(missing_docs)]

use std::collections::BTreeMap;

use clap::Parser;
use ldpsyn::client::SimulatedPerson;
use ldpsyn::ledger::{BudgetLedger, MemoryLedger};
use ldpsyn::mechanism::SufficientStatistics;
use ldpsyn::schema::Schema;
use ldpsyn::wire::Report;
use ldpsyn_engine::{Engine, TableKey, Tables};
use ldpsyn_service::Server;
use ldpsyn_service::config::ServeConfig;
use ldpsyn_service::tokens::TokenKey;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use uuid::Uuid;

/// Admin token of test servers.
pub const ADMIN: &str = "test-admin-token-0123";
/// Token key of test servers (fixed so tests can read the tokens they hold).
pub const TOKEN_KEY: &str = "test-token-key-0123456789abcdef-0123456789";

/// The `serve` config of a test server on `database_url`, plus extra arguments.
pub fn test_config(database_url: &str, extra: &[&str]) -> ServeConfig {
    let mut args = vec![
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--database-url",
        database_url,
        "--admin-token",
        ADMIN,
        "--token-key",
        TOKEN_KEY,
    ];
    if !extra.contains(&"--rate-limit-per-ip") {
        args.extend_from_slice(&["--rate-limit-per-ip", "0"]);
    }
    args.extend_from_slice(extra);
    ServeConfig::parse_from(args)
}

/// Starts a server in this process (real TCP on 127.0.0.1).
pub async fn start(database_url: &str, extra: &[&str]) -> Server {
    Server::start(test_config(database_url, extra))
        .await
        .expect("test server starts")
}

/// `http://addr`.
pub fn base(server: &Server) -> String {
    format!("http://{}", server.addr())
}

/// The test schema: `region` (4) → `income` (3) strongly dependent, `smoker` (2) → `lung`
/// (2) dependent, `shoe` (3) independent of everything.
pub fn schema_json() -> Value {
    json!({"attributes": [
        {"name": "region", "type": "categorical", "labels": ["north", "south", "east", "west"]},
        {"name": "income", "type": "numeric", "min": 0, "max": 90000, "bins": 3},
        {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]},
        {"name": "lung", "type": "categorical", "labels": ["ok", "bad"]},
        {"name": "shoe", "type": "categorical", "labels": ["s", "m", "l"]}
    ]})
}

/// The test schema parsed.
pub fn schema() -> Schema {
    serde_json::from_value(schema_json()).expect("test schema is valid")
}

/// Codes of `n` people with seeded correlated records.
pub fn population(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let region = rng.random_range(0..4u32);
            let income = if rng.random::<f64>() < 0.8 {
                region % 3
            } else {
                rng.random_range(0..3)
            };
            let smoker = u32::from(rng.random::<f64>() < 0.3);
            let lung = if rng.random::<f64>() < 0.85 {
                smoker
            } else {
                1 - smoker
            };
            let shoe = rng.random_range(0..3u32);
            vec![region, income, smoker, lung, shoe]
        })
        .collect()
}

/// Simulated people (records + their own memory ledgers).
pub fn people(schema: &Schema, n: usize, seed: u64) -> Vec<SimulatedPerson<MemoryLedger>> {
    population(n, seed)
        .into_iter()
        .map(|codes| SimulatedPerson {
            record: schema.encoded(codes).expect("codes fit the schema"),
            ledger: MemoryLedger::default(),
        })
        .collect()
}

/// Creates a collection with `body` (schema added if absent); returns its id.
pub async fn create(base: &str, mut body: Value) -> Uuid {
    if body.get("schema").is_none() {
        body["schema"] = schema_json();
    }
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .expect("create request");
    assert_eq!(
        resp.status(),
        201,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let v: Value = resp.json().await.expect("create answer is JSON");
    v["id"].as_str().and_then(|s| s.parse().ok()).expect("id")
}

/// POSTs `body` as JSON to `url` with bearer `token`: the status and the JSON answer
/// (`null` when it is not JSON).
pub async fn post_raw(url: &str, token: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The problem type of a problem document (`None` if it has none this API knows).
pub fn problem_kind(v: &Value) -> Option<ldpsyn::wire::ProblemType> {
    v["type"]
        .as_str()
        .and_then(ldpsyn::wire::ProblemType::parse)
}

/// An admin request to `path` (GET or POST), returning status and JSON body.
pub async fn admin(base: &str, method: &str, path: &str) -> (u16, Value) {
    let c = reqwest::Client::new();
    let req = match method {
        "POST" => c.post(format!("{base}{path}")),
        _ => c.get(format!("{base}{path}")),
    };
    let resp = req.bearer_auth(ADMIN).send().await.expect("admin request");
    let status = resp.status().as_u16();
    let v = resp.json().await.unwrap_or(Value::Null);
    (status, v)
}

/// The acknowledged reports held in the people's ledgers.
pub fn acknowledged(people: &[SimulatedPerson<MemoryLedger>], collection: Uuid) -> Vec<Report> {
    people
        .iter()
        .filter_map(|p| p.ledger.get(collection).ok().flatten())
        .filter(|e| e.state == ldpsyn::ledger::ReportState::Acknowledged)
        .map(|e| e.report)
        .collect()
}

/// The engine's in-process reduction of `reports`: the tables they add up to, keyed as the
/// server keys them (from the tokens, verified with [`TOKEN_KEY`]).
pub fn reduce(engine: &Engine, reports: &[Report]) -> Tables {
    let key = TokenKey::new(TOKEN_KEY.as_bytes().to_vec()).expect("key");
    let mut tables: Tables = BTreeMap::new();
    for r in reports {
        let c = key.verify(&r.token).expect("our tokens verify");
        let k: TableKey = engine.table_key(&c.task_spec());
        let m = engine.mechanism(&k).expect("mechanism");
        let s = tables
            .entry(k)
            .or_insert_with(|| SufficientStatistics::new(&m));
        m.accumulate(&r.payload, s).expect("valid payload");
    }
    tables
}

/// The variable that lets a test whose service is missing skip instead of fail.
pub const ALLOW_MISSING: &str = "LDPSYN_ALLOW_MISSING_SERVICES";

/// Called by an environment-gated test (PostgreSQL, Chromium, pandas) whose service is
/// missing, with what is missing and how to provide it. The one scheme for such tests (the
/// same helper is in `aggregator/tests/common/mod.rs`): a missing service **fails** the test, unless
/// `LDPSYN_ALLOW_MISSING_SERVICES=1`, which lets it return early after a `SKIPPED` line on
/// stderr (a local run without the service, by choice). `.ci/run` provides every service and
/// never sets the variable, so CI fails loudly when a service it promises is missing.
pub fn missing_service(test: &str, why: &str) {
    assert!(
        std::env::var(ALLOW_MISSING).as_deref() == Ok("1"),
        "{test}: {why}. Provide it, or set {ALLOW_MISSING}=1 to skip this test"
    );
    eprintln!("{test}: SKIPPED ({why}; {ALLOW_MISSING}=1)");
}

/// The PostgreSQL URL for tests (`LDPSYN_TEST_DATABASE_URL`), or `None` when it is not set
/// and [`missing_service`] allows skipping (otherwise it panics).
pub fn postgres_url(test: &str) -> Option<String> {
    match std::env::var("LDPSYN_TEST_DATABASE_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            missing_service(
                test,
                "LDPSYN_TEST_DATABASE_URL is not set (a PostgreSQL database, e.g. \
                 postgres://postgres@127.0.0.1:5432/ldpsyn_test)",
            );
            None
        }
    }
}

/// Polls `check` every 20 ms until it returns `Some`, and returns that; fails the test,
/// naming `what`, after 60 s. For a state the server reaches after it answered (a round
/// closed off the committer), never a fixed sleep.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `GET …/model` of finalized collection `id` at `base` once it answers 200: after a
/// (re)start the server refits finalized models in the background and answers 409
/// `model-not-ready` until the model is back. Fails the test after 60 s.
pub async fn model_when_ready(base: &str, id: impl std::fmt::Display) -> Value {
    eventually("the finalized model to be refitted", || async {
        let (s, v) = admin(base, "GET", &format!("/v1/collections/{id}/model")).await;
        (s == 200).then_some(v)
    })
    .await
}

/// Collection `id`'s view at `base` once no round close is due there: its open round has no
/// quota or has not reached it. A round closes off the committer after the upload that
/// reached its quota is answered, and a device that draws tasks before it lands draws the
/// old round's: a test that wants each batch in its own round waits for this in between.
pub async fn rounds_settled(base: &str, id: Uuid) -> Value {
    eventually("the due round closes to land", || async {
        let (_, v) = admin(base, "GET", &format!("/v1/collections/{id}")).await;
        let s = &v["status"];
        let settled = match s["round_quota"].as_u64() {
            None => true,
            Some(q) => s["round_accepted"].as_u64().is_some_and(|n| n < q),
        };
        settled.then_some(v)
    })
    .await
}
