//! A collection at its target and after (issue 36, item 2): `auto_finalize_at_target` (on by
//! default) finalizes it with the commit that reaches `target_users`; reports past the target
//! are refused `collection-target-reached` (`past_target: refuse`, the default) or, under
//! `accept`, `collection-finalized` when it finalizes there and taken when it does not; a
//! config stored before these options keeps taking reports past the target; and the
//! retention sweep deletes a finalized collection's raw reports `retain_reports_days` after
//! finalize, keeping what serves and rebuilds its model. Many single-report uploads at once
//! stop exactly at the target too. Through the real binary, on SQLite and on PostgreSQL
//! (`LDPSYN_TEST_DATABASE_URL`).

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientError, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::schema::Schema;
use ldpsyn::wire::ProblemType;
use ldpsyn_aggregator::service::maintenance::sweep_retention;
use ldpsyn_aggregator::service::storage::Datastore;
use serde_json::{Value, json};
use sqlx::{Connection, Row};
use uuid::Uuid;

const ADMIN: &str = "target-admin-token-36b";
const TARGET: usize = 50;
const DAY: i64 = 86_400;

fn schema() -> Value {
    json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": ["0", "1", "2"]},
        {"name": "b", "type": "categorical", "labels": ["0", "1"]}
    ]})
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Creates an `independence` collection of [`schema`] with target [`TARGET`] and the extra
/// fields `extra`; its public view.
async fn create(http: &reqwest::Client, base: &str, extra: Value) -> Value {
    let mut body = json!({"schema": schema(), "protocol": "independence", "epsilon": 2.0,
        "target_users": TARGET, "name": "Target test"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let r = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r.json().await.unwrap()
}

fn id_of(view: &Value) -> Uuid {
    view["id"].as_str().unwrap().parse().unwrap()
}

/// An admin GET: status and JSON body.
async fn get(http: &reqwest::Client, url: String) -> (u16, Value) {
    let r = http.get(url).bearer_auth(ADMIN).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// `n` people (seeded by `seed`) report in one batch through the SDK: one task fetch, one
/// upload, so the server commits them in one group. Returns per person the problem type of
/// a refusal, `None` when acknowledged.
async fn report(base: &str, id: Uuid, n: usize, seed: u64) -> Vec<Option<ProblemType>> {
    let schema: Schema = serde_json::from_value(schema()).unwrap();
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), seed);
    let mut client = Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    let mut people: Vec<_> = (0..n)
        .map(|i| SimulatedPerson {
            record: schema
                .encoded(vec![(i % 3) as u32, (i / 3 % 2) as u32])
                .unwrap(),
            ledger: MemoryLedger::default(),
        })
        .collect();
    client
        .submit_batch(&mut people)
        .await
        .unwrap()
        .into_iter()
        .map(|r| match r {
            Ok(_) => None,
            Err(ClientError::Problem(p)) => Some(p.problem_type),
            Err(e) => panic!("unexpected client error: {e}"),
        })
        .collect()
}

fn count(outcomes: &[Option<ProblemType>], what: Option<ProblemType>) -> usize {
    outcomes.iter().filter(|&&o| o == what).count()
}

/// Stored reports of collection `id` in the database at `url`, staged ones included (SQLite
/// stages a group of single reports).
async fn stored_reports(url: &str, id: Uuid) -> i64 {
    let db = Datastore::connect(url, 2).await.unwrap();
    let n = db.count_reports(id).await.unwrap();
    db.close().await;
    i64::try_from(n).unwrap()
}

/// Waits (bounded) until the model of `id` is served: the fit runs off the ingest path.
async fn model_ready(http: &reqwest::Client, base: &str, id: Uuid) {
    let start = Instant::now();
    loop {
        let (status, _) = get(http, format!("{base}/v1/collections/{id}/model")).await;
        if status == 200 {
            return;
        }
        assert_eq!(status, 409, "model route answered {status}");
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "model not ready after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new collection (defaults: finalize at the target, refuse past it) takes 40 reports and
/// stays open; of 20 more sent in one upload, 10 are acknowledged (the target) and 10 refused
/// `collection-target-reached`; the collection is finalized by that commit, before its
/// answer, and its model is built without anyone asking. Afterwards a task request and an
/// upload are refused `409 collection-target-reached` (problem+json, a detail for a person
/// naming the target), nothing more is stored, and `POST …/finalize` answers the model.
async fn target_finalizes_and_refuses_past_it(url: &str) {
    let server = common::serve_on(ADMIN, url, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let view = create(&http, &base, json!({})).await;
    assert_eq!(view["auto_finalize_at_target"], true, "{view}");
    assert_eq!(view["past_target"], "refuse", "{view}");
    let id = id_of(&view);
    let url_c = format!("{base}/v1/collections/{id}");

    let first = report(&base, id, 40, 1).await;
    assert_eq!(count(&first, None), 40, "{first:?}");
    let (_, c) = get(&http, url_c.clone()).await;
    assert_ne!(c["status"]["phase"], "finalized", "{c}");

    let second = report(&base, id, 20, 2).await;
    assert_eq!(count(&second, None), 10, "{second:?}");
    assert_eq!(
        count(&second, Some(ProblemType::CollectionTargetReached)),
        10,
        "{second:?}"
    );
    let (_, c) = get(&http, url_c.clone()).await;
    assert_eq!(c["status"]["phase"], "finalized", "{c}");
    assert_eq!(c["status"]["reports_accepted"], TARGET, "{c}");
    assert_eq!(stored_reports(url, id).await, TARGET as i64);
    model_ready(&http, &base, id).await;

    // Past the target: no task, no upload.
    let r = http.get(format!("{url_c}/task")).send().await.unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["type"], "urn:ldpsyn:problem:collection-target-reached");
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("{TARGET} reports")) && detail.contains("Target test"),
        "{detail}"
    );
    let late = json!([{"id": Uuid::new_v4(), "token": "not-a-token", "payload": {"grr": 1}}]);
    let r = http
        .post(format!("{url_c}/reports"))
        .json(&late)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["type"], "urn:ldpsyn:problem:collection-target-reached");
    assert_eq!(stored_reports(url, id).await, TARGET as i64);
    let r = http
        .post(format!("{url_c}/finalize"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_finalizes_and_refuses_past_it_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("target.db").display());
    target_finalizes_and_refuses_past_it(&url).await;
}

/// As [`target_finalizes_and_refuses_past_it_sqlite`] on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_finalizes_and_refuses_past_it_postgres() {
    let Some(url) = common::postgres_url("target_finalizes_and_refuses_past_it_postgres") else {
        return;
    };
    target_finalizes_and_refuses_past_it(&url).await;
}

/// Many devices report at once, one report per upload, past the target, so that the committer
/// groups them and the group that crosses the target is cut there: exactly the target is
/// acknowledged, stored and counted; every other report is refused
/// `collection-target-reached`; the collection finalizes at the target.
async fn single_reports_stop_at_the_target(url: &str) {
    const TARGET_SINGLE: usize = 200;
    const PEOPLE: usize = 320;
    let server = common::serve_on(ADMIN, url, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let id = id_of(&create(&http, &base, json!({"target_users": TARGET_SINGLE})).await);
    let schema: Schema = serde_json::from_value(schema()).unwrap();
    // Every device holds its task first, then all upload at once.
    let mut prepared = Vec::new();
    for i in 0..PEOPLE {
        let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), i as u64);
        let mut client = Client::connect(&base, id, options, MemoryLedger::default())
            .await
            .unwrap();
        let mut person = vec![SimulatedPerson {
            record: schema
                .encoded(vec![(i % 3) as u32, (i % 2) as u32])
                .unwrap(),
            ledger: MemoryLedger::default(),
        }];
        let batch = client.prepare_batch(&mut person).await.unwrap();
        prepared.push((client, person, batch));
    }
    let sends: Vec<_> = prepared
        .into_iter()
        .map(|(mut client, mut person, batch)| {
            tokio::spawn(async move {
                // Once this process counts the target, it refuses the whole upload.
                match client.send_batch(&mut person, batch).await {
                    Ok(mut r) => r.pop().expect("one answer"),
                    Err(e) => Err(e),
                }
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for s in sends {
        outcomes.push(match s.await.unwrap() {
            Ok(_) => None,
            Err(ClientError::Problem(p)) => Some(p.problem_type),
            Err(e) => panic!("unexpected client error: {e}"),
        });
    }
    assert_eq!(count(&outcomes, None), TARGET_SINGLE, "{outcomes:?}");
    assert_eq!(
        count(&outcomes, Some(ProblemType::CollectionTargetReached)),
        PEOPLE - TARGET_SINGLE,
        "{outcomes:?}"
    );
    assert_eq!(stored_reports(url, id).await, TARGET_SINGLE as i64);
    let (_, c) = get(&http, format!("{base}/v1/collections/{id}")).await;
    assert_eq!(c["status"]["phase"], "finalized", "{c}");
    assert_eq!(c["status"]["reports_accepted"], TARGET_SINGLE, "{c}");
    model_ready(&http, &base, id).await;
}

/// [`single_reports_stop_at_the_target`] on SQLite (whose groups of single reports stage
/// their tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_reports_stop_at_the_target_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("single.db").display());
    single_reports_stop_at_the_target(&url).await;
}

/// [`single_reports_stop_at_the_target`] on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_reports_stop_at_the_target_postgres() {
    let Some(url) = common::postgres_url("single_reports_stop_at_the_target_postgres") else {
        return;
    };
    single_reports_stop_at_the_target(&url).await;
}

/// `past_target: accept`: with auto-finalize, 60 reports in one upload give 50 acknowledged
/// and 10 refused `collection-finalized` (it finalizes at the target); without, all 60 are
/// taken and the collection stays open until finalized by hand.
async fn accept_past_target(url: &str) {
    let server = common::serve_on(ADMIN, url, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();

    let view = create(&http, &base, json!({"past_target": "accept"})).await;
    let id = id_of(&view);
    let out = report(&base, id, TARGET + 10, 3).await;
    assert_eq!(count(&out, None), TARGET, "{out:?}");
    assert_eq!(
        count(&out, Some(ProblemType::CollectionFinalized)),
        10,
        "{out:?}"
    );
    let (_, c) = get(&http, format!("{base}/v1/collections/{id}")).await;
    assert_eq!(c["status"]["phase"], "finalized", "{c}");
    assert_eq!(stored_reports(url, id).await, TARGET as i64);
    model_ready(&http, &base, id).await;

    let view = create(
        &http,
        &base,
        json!({"past_target": "accept", "auto_finalize_at_target": false}),
    )
    .await;
    let id = id_of(&view);
    let out = report(&base, id, TARGET + 10, 4).await;
    assert_eq!(count(&out, None), TARGET + 10, "{out:?}");
    let (_, c) = get(&http, format!("{base}/v1/collections/{id}")).await;
    assert_ne!(c["status"]["phase"], "finalized", "{c}");
    assert_eq!(c["status"]["reports_accepted"], TARGET + 10, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_past_target_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("accept.db").display());
    accept_past_target(&url).await;
}

/// As [`accept_past_target_sqlite`] on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_past_target_postgres() {
    let Some(url) = common::postgres_url("accept_past_target_postgres") else {
        return;
    };
    accept_past_target(&url).await;
}

/// A config stored before these options (no `auto_finalize_at_target`, `past_target`) loads
/// as off and `accept`: the collection keeps taking reports past its target and stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_config_without_the_options_behaves_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    let server = common::serve_on(ADMIN, &url, &[]);
    let http = reqwest::Client::new();
    let id = id_of(&create(&http, &server.base, json!({})).await);
    server.kill();
    // The row as an older release stored it.
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&url).await.unwrap();
    let row = sqlx::query("SELECT config FROM collections WHERE id = $1")
        .bind(id.to_string())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let mut config: Value = serde_json::from_str(&row.try_get::<String, _>(0).unwrap()).unwrap();
    let obj = config.as_object_mut().unwrap();
    obj.remove("auto_finalize_at_target").unwrap();
    obj.remove("past_target").unwrap();
    sqlx::query("UPDATE collections SET config = $1 WHERE id = $2")
        .bind(config.to_string())
        .bind(id.to_string())
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let server = common::serve_on(ADMIN, &url, &[]);
    let (_, c) = get(&http, format!("{}/v1/collections/{id}", server.base)).await;
    assert_eq!(c["auto_finalize_at_target"], false, "{c}");
    assert_eq!(c["past_target"], "accept", "{c}");
    let out = report(&server.base, id, TARGET + 10, 5).await;
    assert_eq!(count(&out, None), TARGET + 10, "{out:?}");
    let (_, c) = get(&http, format!("{}/v1/collections/{id}", server.base)).await;
    assert_ne!(c["status"]["phase"], "finalized", "{c}");
}

/// Lifecycle options the server cannot take are refused `400 invalid-parameter` with a
/// detail saying what is allowed, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lifecycle_options_are_refused() {
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let parties = json!([{"name": "p", "attributes": [{"name": "a", "epsilon": 1.0},
        {"name": "b", "epsilon": 1.0}]}]);
    let cases = [
        (
            json!({"past_target": "maybe"}),
            "independence",
            "\"refuse\"",
        ),
        (json!({"past_target": true}), "independence", "\"accept\""),
        (
            json!({"auto_finalize_at_target": "yes"}),
            "independence",
            "true or false",
        ),
        (
            json!({"retain_reports_days": -1}),
            "independence",
            "0 to 36500",
        ),
        (
            json!({"retain_reports_days": 1.5}),
            "independence",
            "whole number",
        ),
        (
            json!({"retain_reports_days": 40000}),
            "independence",
            "0 to 36500",
        ),
        (
            json!({"auto_finalize_at_target": true, "parties": parties}),
            "vertical",
            "finalized by hand",
        ),
        (
            json!({"past_target": "refuse", "parties": parties}),
            "vertical",
            "device collections",
        ),
    ];
    for (extra, protocol, needle) in cases {
        let mut body = json!({"schema": schema(), "protocol": protocol, "target_users": 10});
        if protocol != "vertical" {
            body["epsilon"] = json!(2.0);
        }
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = http
            .post(format!("{base}/v1/collections"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{extra}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["type"], "urn:ldpsyn:problem:invalid-parameter", "{p}");
        assert!(
            p["detail"].as_str().unwrap().contains(needle),
            "{extra}: {p}"
        );
    }
    let (_, list) = get(&http, format!("{base}/v1/collections")).await;
    assert_eq!(list.as_array().unwrap().len(), 0, "{list}");
}

/// The retention sweep with a clock of the test's choosing: a collection with
/// `retain_reports_days: 2`, finalized at its target between `t0` and `t1`, keeps its
/// reports at `t0 + 2 days − 1 s` and loses them at `t1 + 2 days`; its counts, status and
/// model stay, and after a restart (which rebuilds the model from the stored tables) the
/// same seed downloads the same bytes. A collection without the option keeps its reports
/// whatever the time; a second sweep does nothing.
async fn retention_deletes_raw_reports(url: &str) {
    let server = common::serve_on(ADMIN, url, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let kept = id_of(&create(&http, &base, json!({})).await);
    let swept = id_of(&create(&http, &base, json!({"retain_reports_days": 2})).await);
    let t0 = now();
    for id in [kept, swept] {
        let out = report(&base, id, TARGET, 6).await;
        assert_eq!(count(&out, None), TARGET, "{out:?}");
        model_ready(&http, &base, id).await;
    }
    let t1 = now();
    let synthetic = |base: String, id: Uuid| {
        let http = http.clone();
        async move {
            let r = http
                .get(format!(
                    "{base}/v1/collections/{id}/synthetic?rows=300&seed=9"
                ))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap()
        }
    };
    let before = synthetic(base.clone(), swept).await;
    let (_, status_before) = get(&http, format!("{base}/v1/collections/{swept}")).await;

    let db = Datastore::connect(url, 2).await.unwrap();
    let done = sweep_retention(&db, t0 + 2 * DAY - 1).await.unwrap();
    assert!(!done.iter().any(|(id, _)| *id == swept), "{done:?}");
    assert_eq!(stored_reports(url, swept).await, TARGET as i64);

    let done = sweep_retention(&db, t1 + 2 * DAY).await.unwrap();
    assert!(done.contains(&(swept, TARGET as u64)), "{done:?}");
    assert!(!done.iter().any(|(id, _)| *id == kept), "{done:?}");
    assert_eq!(stored_reports(url, swept).await, 0);
    assert_eq!(stored_reports(url, kept).await, TARGET as i64);
    let again = sweep_retention(&db, t1 + 400 * DAY).await.unwrap();
    assert!(
        !again.iter().any(|(id, _)| *id == swept || *id == kept),
        "{again:?}"
    );
    assert_eq!(stored_reports(url, kept).await, TARGET as i64);
    db.close().await;

    let (_, status_after) = get(&http, format!("{base}/v1/collections/{swept}")).await;
    assert_eq!(status_after["status"], status_before["status"]);
    assert_eq!(synthetic(base.clone(), swept).await, before);
    server.kill();
    let server = common::serve_on(ADMIN, url, &[]);
    model_ready(&http, &server.base, swept).await;
    let (_, restarted) = get(&http, format!("{}/v1/collections/{swept}", server.base)).await;
    assert_eq!(restarted["status"], status_before["status"]);
    assert_eq!(synthetic(server.base.clone(), swept).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_raw_reports_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("retention.db").display());
    retention_deletes_raw_reports(&url).await;
}

/// As [`retention_deletes_raw_reports_sqlite`] on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_raw_reports_postgres() {
    let Some(url) = common::postgres_url("retention_deletes_raw_reports_postgres") else {
        return;
    };
    retention_deletes_raw_reports(&url).await;
}

/// A collection at its target that is not finalized (as after a process stopped between the
/// commit that reached the target and its finalize: here a collection kept open at its
/// target whose stored config is then switched to auto-finalize) is finalized by the upkeep
/// pass at the next start, without anyone asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_at_its_target_is_finalized_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("due.db").display());
    let server = common::serve_on(ADMIN, &url, &[]);
    let http = reqwest::Client::new();
    let id = id_of(
        &create(
            &http,
            &server.base,
            json!({"auto_finalize_at_target": false}),
        )
        .await,
    );
    let out = report(&server.base, id, TARGET, 7).await;
    assert_eq!(count(&out, None), TARGET, "{out:?}");
    let (_, c) = get(&http, format!("{}/v1/collections/{id}", server.base)).await;
    assert_ne!(c["status"]["phase"], "finalized", "{c}");
    server.kill();

    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&url).await.unwrap();
    let row = sqlx::query("SELECT config FROM collections WHERE id = $1")
        .bind(id.to_string())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let mut config: Value = serde_json::from_str(&row.try_get::<String, _>(0).unwrap()).unwrap();
    config["auto_finalize_at_target"] = json!(true);
    sqlx::query("UPDATE collections SET config = $1 WHERE id = $2")
        .bind(config.to_string())
        .bind(id.to_string())
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let server = common::serve_on(ADMIN, &url, &[]);
    model_ready(&http, &server.base, id).await;
    let (_, c) = get(&http, format!("{}/v1/collections/{id}", server.base)).await;
    assert_eq!(c["status"]["phase"], "finalized", "{c}");
    assert_eq!(c["status"]["reports_accepted"], TARGET, "{c}");
}

/// Two processes on one PostgreSQL database take uploads for the same collection at once,
/// 40 people each, with the target at 50: exactly 50 reports are acknowledged and stored
/// (the count is read under the collection's lock in the commit), the other 30 are refused
/// `collection-target-reached`, and the collection is finalized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_is_exact_across_two_postgres_processes() {
    let Some(url) = common::postgres_url("target_is_exact_across_two_postgres_processes") else {
        return;
    };
    let a = common::serve_on(ADMIN, &url, &[]);
    let b = common::serve_on(ADMIN, &url, &[]);
    let http = reqwest::Client::new();
    let id = id_of(&create(&http, &a.base, json!({})).await);
    let schema: Schema = serde_json::from_value(schema()).unwrap();
    // Tasks first (both processes hand them out while the collection is open), then both
    // uploads at once.
    let mut prepared = Vec::new();
    for (base, seed) in [(a.base.clone(), 10), (b.base.clone(), 11)] {
        let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), seed);
        let mut client = Client::connect(&base, id, options, MemoryLedger::default())
            .await
            .unwrap();
        let mut people: Vec<_> = (0..40u32)
            .map(|i| SimulatedPerson {
                record: schema.encoded(vec![i % 3, i % 2]).unwrap(),
                ledger: MemoryLedger::default(),
            })
            .collect();
        let batch = client.prepare_batch(&mut people).await.unwrap();
        prepared.push((client, people, batch));
    }
    let sends = prepared.into_iter().map(|(mut client, mut people, batch)| {
        tokio::spawn(async move { client.send_batch(&mut people, batch).await.unwrap() })
    });
    let mut outcomes = Vec::new();
    for s in sends.collect::<Vec<_>>() {
        for r in s.await.unwrap() {
            outcomes.push(match r {
                Ok(_) => None,
                Err(ClientError::Problem(p)) => Some(p.problem_type),
                Err(e) => panic!("unexpected client error: {e}"),
            });
        }
    }
    assert_eq!(count(&outcomes, None), TARGET, "{outcomes:?}");
    assert_eq!(
        count(&outcomes, Some(ProblemType::CollectionTargetReached)),
        80 - TARGET,
        "{outcomes:?}"
    );
    assert_eq!(stored_reports(&url, id).await, TARGET as i64);
    model_ready(&http, &a.base, id).await;
    // Each process sees the other's reports and finalize from its next refresh (every
    // 500 ms).
    let start = Instant::now();
    for base in [&a.base, &b.base] {
        loop {
            let (_, c) = get(&http, format!("{base}/v1/collections/{id}")).await;
            if c["status"]["phase"] == "finalized" && c["status"]["reports_accepted"] == TARGET {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{c}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
