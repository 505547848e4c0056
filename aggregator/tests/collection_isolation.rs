//! The real binary on a real SQLite file: one collection that cannot be loaded, or whose
//! round close fails, does not take the others down (issue 33, item 7).

mod common;

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::schema::Schema;
use serde_json::{Value, json};
use sqlx::Connection;
use uuid::Uuid;

const ADMIN: &str = "isolation-admin-token-42";

fn schema() -> Value {
    json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": ["0", "1", "2"]},
        {"name": "b", "type": "categorical", "labels": ["0", "1"]}
    ]})
}

/// Creates a privincr collection of [`schema`] for `target_users` people.
async fn create(http: &reqwest::Client, base: &str, target_users: u64) -> (Uuid, Schema) {
    let r = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"schema": schema(), "protocol": "privincr", "epsilon": 2.0,
            "target_users": target_users}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let schema = serde_json::from_value(created["schema"].clone()).unwrap();
    (created["id"].as_str().unwrap().parse().unwrap(), schema)
}

/// `GET /v1/collections/{id}`: its status code, content type and JSON body.
async fn get(http: &reqwest::Client, base: &str, id: Uuid) -> (u16, String, Value) {
    let r = http
        .get(format!("{base}/v1/collections/{id}"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    (status, ct, r.json().await.unwrap())
}

/// Runs `sql` on the SQLite file at `path` through a connection of its own.
async fn sqlite(path: &std::path::Path, sql: &str) {
    let url = format!("sqlite://{}", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
}

/// Uploads one report per person of `n` through the SDK; every one must be acknowledged.
async fn upload(base: &str, id: Uuid, schema: &Schema, n: usize, seed: u64) {
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), seed);
    let mut client = Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    let mut people: Vec<_> = (0..n)
        .map(|i| SimulatedPerson {
            record: schema
                .encoded(vec![(i % 3) as u32, (i % 2) as u32])
                .unwrap(),
            ledger: MemoryLedger::default(),
        })
        .collect();
    for part in people.chunks_mut(100) {
        for r in client.submit_batch(part).await.unwrap() {
            r.unwrap();
        }
    }
}

/// A collection whose stored config is not JSON and one whose stored state is not JSON: the
/// server still starts, serves the healthy collection, and answers for each broken one 503
/// `collection-unavailable` (problem+json) instead of refusing to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unloadable_rows_do_not_stop_startup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("isolation.db");
    let url = format!("sqlite://{}", path.display());
    let http = reqwest::Client::new();
    let server = common::serve_on(ADMIN, &url, &[]);
    let (good, _) = create(&http, &server.base, 1000).await;
    let (bad_config, _) = create(&http, &server.base, 1000).await;
    let (bad_state, _) = create(&http, &server.base, 1000).await;
    server.kill();

    sqlite(
        &path,
        &format!(
            "UPDATE collections SET config = '{{not json' WHERE id = '{bad_config}';
             UPDATE collections SET state = '[]' WHERE id = '{bad_state}';"
        ),
    )
    .await;

    let server = common::serve_on(ADMIN, &url, &[]);
    let (status, _, body) = get(&http, &server.base, good).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], good.to_string());
    for bad in [bad_config, bad_state] {
        let (status, ct, body) = get(&http, &server.base, bad).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(ct, "application/problem+json");
        assert_eq!(body["type"], "urn:ldpsyn:problem:collection-unavailable");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(&bad.to_string()) && detail.contains("server log"));
        // Its other routes answer the same, not 404 or 500.
        let r = http
            .get(format!("{}/v1/collections/{bad}/task", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503);
    }
    // An id that was never stored is still unknown.
    let (status, _, _) = get(&http, &server.base, Uuid::new_v4()).await;
    assert_eq!(status, 404);
}

/// Collection `a`'s state cannot be written (a SQLite trigger refuses it), so its round
/// close fails; uploads to `a` and `b` running together are all acknowledged (before, the
/// failed close failed the whole commit group with 500), `b`'s round closes, `a`'s stays
/// open, and once the trigger is gone `a`'s next report closes it (the close is retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_round_close_fails_no_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("isolation.db");
    let url = format!("sqlite://{}", path.display());
    let http = reqwest::Client::new();
    let server = common::serve_on(ADMIN, &url, &[]);
    let base = server.base.clone();
    let (a, schema) = create(&http, &base, 400).await;
    let (b, _) = create(&http, &base, 400).await;
    let (_, _, status) = get(&http, &base, a).await;
    let quota = status["status"]["round_quota"].as_u64().unwrap() as usize;
    assert!(quota > 0 && quota < 400, "{status}");

    sqlite(
        &path,
        &format!(
            "CREATE TRIGGER refuse_close BEFORE UPDATE OF state ON collections
             WHEN OLD.id = '{a}' BEGIN SELECT RAISE(ABORT, 'test: no close for a'); END;"
        ),
    )
    .await;
    let n = quota + 50;
    let (ua, ub) = tokio::join!(
        upload(&base, a, &schema, n, 1),
        upload(&base, b, &schema, n, 2)
    );
    let _ = (ua, ub);

    // The round closes off the committer, after the upload that reached the quota is
    // answered: wait for `b`'s.
    let sb = common::eventually("b's round 0 to close", || async {
        let (_, _, sb) = get(&http, &base, b).await;
        (sb["status"]["round"] == 1).then_some(sb)
    })
    .await;
    let (_, _, sa) = get(&http, &base, a).await;
    assert_eq!(sa["status"]["reports_accepted"], n, "{sa}");
    assert_eq!(sb["status"]["reports_accepted"], n, "{sb}");
    assert_eq!(sa["status"]["round"], 0, "{sa}");

    sqlite(&path, "DROP TRIGGER refuse_close;").await;
    upload(&base, a, &schema, 1, 3).await;
    let sa = common::eventually("a's round 0 to close once it can", || async {
        let (_, _, sa) = get(&http, &base, a).await;
        (sa["status"]["round"] == 1).then_some(sa)
    })
    .await;
    assert_eq!(sa["status"]["reports_accepted"], n + 1, "{sa}");
}

/// PostgreSQL (`LDPSYN_TEST_DATABASE_URL`; see `common::postgres_url` for when it is
/// missing): a row nobody can load, stored while two processes run, does not stop the
/// refresh that brings one process's uploads to the other, and is answered
/// `collection-unavailable` by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unloadable_row_does_not_stop_the_postgres_refresh() {
    let Some(url) = common::postgres_url("an_unloadable_row_does_not_stop_the_postgres_refresh")
    else {
        return;
    };
    let http = reqwest::Client::new();
    let p = common::serve_on(ADMIN, &url, &["--refresh-interval-ms", "100"]);
    let q = common::serve_on(ADMIN, &url, &["--refresh-interval-ms", "100"]);
    let (c, schema) = create(&http, &p.base, 1_000_000).await;
    let (status, _, body) = get(&http, &q.base, c).await;
    assert_eq!(status, 200, "{body}");

    let broken = Uuid::new_v4();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO collections (id, config, state, state_version, created_at) \
         VALUES ($1, '{not json', '{}', 1, 0)",
    )
    .bind(broken.to_string())
    .execute(&mut conn)
    .await
    .unwrap();

    upload(&p.base, c, &schema, 120, 4).await;
    // Q counts P's reports only through its refresh, which reads every row.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let seen = loop {
        let (_, _, s) = get(&http, &q.base, c).await;
        let seen = s["status"]["reports_accepted"].as_u64().unwrap();
        if seen == 120 || std::time::Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let mut answers = Vec::new();
    for base in [&p.base, &q.base] {
        answers.push(get(&http, base, broken).await);
    }
    // Removed before asserting: other tests share this database.
    sqlx::query("DELETE FROM collections WHERE id = $1")
        .bind(broken.to_string())
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(seen, 120, "the refresh stopped at the broken row");
    for (status, _, body) in answers {
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["type"], "urn:ldpsyn:problem:collection-unavailable");
    }
}
