//! A collection's lifecycle through the real binaries (issue 36, item 2): `close-round`
//! refuses a round with no reports unless forced and says what it did; `DELETE
//! /v1/collections/{id}` (and `collections delete`) leaves nothing of a collection in the
//! database, on SQLite and on PostgreSQL (`LDPSYN_TEST_DATABASE_URL`), and every later
//! request for it answers 404.

mod common;

use std::process::{Command, Output};

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::schema::Schema;
use serde_json::{Value, json};
use sqlx::{Connection, Row};
use uuid::Uuid;

const ADMIN: &str = "lifecycle-admin-token-36";

/// Every table with rows of a collection, and the column naming it.
const TABLES: &[(&str, &str)] = &[
    ("collections", "id"),
    ("report_tokens", "collection_id"),
    ("report_tokens_staged", "collection_id"),
    ("report_groups", "collection_id"),
    ("vertical_records", "collection_id"),
    ("table_counts", "collection_id"),
    ("table_counts_ready", "collection_id"),
    ("count_deltas", "collection_id"),
    ("round_counts", "collection_id"),
];

fn schema() -> Value {
    json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": ["0", "1", "2"]},
        {"name": "b", "type": "categorical", "labels": ["0", "1"]},
        {"name": "c", "type": "categorical", "labels": ["0", "1"]}
    ]})
}

/// `ldpsyn-aggregator collections ARGS` against `base` with the admin token.
fn cli(base: &str, args: &[&str]) -> Output {
    Command::new(common::BIN)
        .arg("collections")
        .args(args)
        .env("LDPSYN_SERVER", base)
        .env("LDPSYN_ADMIN_TOKEN", ADMIN)
        .env("LDPSYN_LOG", "warn")
        .output()
        .expect("the CLI runs")
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "CLI failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Creates a collection of [`schema`] with `protocol`; its id and schema.
async fn create(http: &reqwest::Client, base: &str, protocol: &str) -> (Uuid, Schema) {
    let r = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"schema": schema(), "protocol": protocol, "epsilon": 2.0,
            "target_users": 2000}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let schema = serde_json::from_value(created["schema"].clone()).unwrap();
    (created["id"].as_str().unwrap().parse().unwrap(), schema)
}

/// An admin request: its status, content type and JSON body (`Null` when there is none).
async fn admin(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
) -> (u16, String, Value) {
    let r = http
        .request(method, url)
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, ct, r.json().await.unwrap_or(Value::Null))
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
                .encoded(vec![(i % 3) as u32, (i % 2) as u32, (i / 2 % 2) as u32])
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

/// Rows of collection `id` per table of [`TABLES`], read directly from the database at
/// `url` (SQLite or PostgreSQL).
async fn rows_of(url: &str, id: Uuid) -> Vec<(&'static str, i64)> {
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(url).await.unwrap();
    let mut out = Vec::new();
    for (table, column) in TABLES {
        let row = sqlx::query(&format!("SELECT COUNT(*) FROM {table} WHERE {column} = $1"))
            .bind(id.to_string())
            .fetch_one(&mut conn)
            .await
            .unwrap();
        out.push((*table, row.try_get::<i64, _>(0).unwrap()));
    }
    conn.close().await.unwrap();
    out
}

/// The open round of a privincr collection with no reports: `close-round` answers 409
/// `round-empty` (problem+json, a detail naming the round, the quota and `force=true`) and
/// changes nothing, over HTTP and in the CLI; `--force` closes it and the CLI says which
/// round closed and how many pairs were pruned. A round with reports closes without
/// `--force`; a collection without rounds answers "nothing changed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_round_refuses_an_empty_round_unless_forced() {
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let (id, schema) = create(&http, &base, "privincr").await;
    let url = format!("{base}/v1/collections/{id}");
    let (_, _, before) = admin(&http, reqwest::Method::GET, url.clone()).await;
    assert_eq!(before["status"]["round"], 0, "{before}");

    let (status, ct, problem) =
        admin(&http, reqwest::Method::POST, format!("{url}/close-round")).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(ct, "application/problem+json");
    assert_eq!(problem["type"], "urn:ldpsyn:problem:round-empty");
    let detail = problem["detail"].as_str().unwrap();
    let quota = before["status"]["round_quota"].as_u64().unwrap();
    for needle in [
        "round 0",
        "no reports",
        &format!("{quota} reports"),
        "force=true",
        "--force",
    ] {
        assert!(detail.contains(needle), "`{needle}` not in: {detail}");
    }
    let (_, _, after) = admin(&http, reqwest::Method::GET, url.clone()).await;
    assert_eq!(
        after["status"], before["status"],
        "a refusal changes nothing"
    );

    // The CLI prints the server's problem and fails; nothing changed either.
    let out = cli(&base, &["close-round", &id.to_string()]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("HTTP 409 round-empty") && e.contains("--force"),
        "{e}"
    );
    let (_, _, after) = admin(&http, reqwest::Method::GET, url.clone()).await;
    assert_eq!(after["status"], before["status"]);

    // A query parameter that is not a boolean: 400, nothing changed.
    let (status, _, problem) = admin(
        &http,
        reqwest::Method::POST,
        format!("{url}/close-round?force=maybe"),
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(problem["type"], "urn:ldpsyn:problem:invalid-parameter");
    let (_, _, after) = admin(&http, reqwest::Method::GET, url.clone()).await;
    assert_eq!(after["status"], before["status"]);

    // Forced: round 0 closes, and the CLI says so with the pairs pruned.
    let said = stdout_ok(&cli(&base, &["close-round", &id.to_string(), "--force"]));
    let (_, _, forced) = admin(&http, reqwest::Method::GET, url.clone()).await;
    let active = forced["status"]["active_edges"].as_array().unwrap().len();
    let pruned = 3 - active;
    let pairs = if pruned == 1 { "pair" } else { "pairs" };
    assert_eq!(
        said,
        format!("{id}: round 0 closed, {pruned} {pairs} pruned\n"),
        "{forced}"
    );
    assert_eq!(forced["status"]["round"], 1, "{forced}");

    // Round 1 with reports (fewer than its quota) closes without --force.
    let (_, _, open) = admin(&http, reqwest::Method::GET, url.clone()).await;
    let quota = open["status"]["round_quota"].as_u64().unwrap() as usize;
    upload(&base, id, &schema, quota / 2, 1).await;
    let (status, _, closed) =
        admin(&http, reqwest::Method::POST, format!("{url}/close-round")).await;
    assert_eq!(status, 200, "{closed}");
    assert!(
        !closed["transitions"].as_array().unwrap().is_empty(),
        "{closed}"
    );

    // No rounds to close (independence): 200, and the CLI says nothing changed.
    let (flat, _) = create(&http, &base, "independence").await;
    let said = stdout_ok(&cli(&base, &["close-round", &flat.to_string()]));
    assert!(
        said.starts_with(&format!("{flat}: nothing changed: phase one_way")),
        "{said}"
    );
}

/// Two finalized collections with reports, closed rounds, tables and a model, and an open
/// one; deleting one (HTTP) and another (CLI) leaves no row of them in any table, keeps
/// the third whole, and every later request for them answers 404 `unknown-collection`,
/// also after a restart on the same database.
async fn delete_leaves_nothing(url: &str) {
    let server = common::serve_on(ADMIN, url, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let (gone, schema) = create(&http, &base, "privincr").await;
    let (also_gone, _) = create(&http, &base, "privincr").await;
    let (kept, _) = create(&http, &base, "privincr").await;
    let (_, _, c) = admin(
        &http,
        reqwest::Method::GET,
        format!("{base}/v1/collections/{gone}"),
    )
    .await;
    // Past round 0's quota: a closed round, round counts and tables of two rounds.
    let n = c["status"]["round_quota"].as_u64().unwrap() as usize + 40;
    upload(&base, gone, &schema, n, 1).await;
    upload(&base, also_gone, &schema, 60, 2).await;
    upload(&base, kept, &schema, 70, 3).await;
    let (status, _, fin) = admin(
        &http,
        reqwest::Method::POST,
        format!("{base}/v1/collections/{gone}/finalize"),
    )
    .await;
    assert_eq!(status, 200, "{fin}");
    // Finalize folded `gone`'s count deltas into its table counts; `also_gone` keeps its.
    for (table, count) in rows_of(url, gone).await {
        if table == "count_deltas" {
            assert_eq!(count, 0, "finalize folds the count deltas");
        } else if !matches!(table, "vertical_records" | "report_tokens_staged") {
            assert!(count > 0, "{table}: the test should store rows of it");
        }
    }
    let open_rows = rows_of(url, also_gone).await;
    assert!(
        open_rows.iter().any(|&(t, n)| t == "count_deltas" && n > 0),
        "{open_rows:?}"
    );

    let (status, _, answer) = admin(
        &http,
        reqwest::Method::DELETE,
        format!("{base}/v1/collections/{gone}"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"id": gone, "reports_deleted": n}));
    let said = stdout_ok(&cli(&base, &["delete", &also_gone.to_string()]));
    assert_eq!(said, format!("{also_gone}: deleted with its 60 reports\n"));

    for id in [gone, also_gone] {
        for (table, count) in rows_of(url, id).await {
            assert_eq!(count, 0, "{table} still holds rows of {id}");
        }
    }
    let kept_rows = rows_of(url, kept).await;
    assert!(kept_rows.contains(&("report_tokens", 70)), "{kept_rows:?}");
    assert!(kept_rows.contains(&("collections", 1)), "{kept_rows:?}");

    let gone_answers = |base: String| {
        let http = http.clone();
        async move {
            for (method, path) in [
                (reqwest::Method::GET, String::new()),
                (reqwest::Method::GET, "/task".into()),
                (reqwest::Method::GET, "/model".into()),
                (reqwest::Method::POST, "/close-round".into()),
                (reqwest::Method::POST, "/finalize".into()),
                (reqwest::Method::DELETE, String::new()),
            ] {
                let url = format!("{base}/v1/collections/{gone}{path}");
                let (status, ct, body) = admin(&http, method.clone(), url).await;
                assert_eq!(status, 404, "{method} {path}: {body}");
                assert_eq!(ct, "application/problem+json");
                assert_eq!(body["type"], "urn:ldpsyn:problem:unknown-collection");
            }
            let r = http
                .post(format!("{base}/v1/collections/{gone}/reports"))
                .json(&json!([]))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 404);
            let (_, _, list) = admin(
                &http,
                reqwest::Method::GET,
                format!("{base}/v1/collections"),
            )
            .await;
            let ids: Vec<&str> = list
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_str().unwrap())
                .collect();
            assert!(ids.contains(&kept.to_string().as_str()));
            assert!(!ids.contains(&gone.to_string().as_str()));
            assert!(!ids.contains(&also_gone.to_string().as_str()));
        }
    };
    gone_answers(base.clone()).await;
    let e = cli(&base, &["delete", &gone.to_string()]);
    assert!(!e.status.success());
    assert!(String::from_utf8_lossy(&e.stderr).contains("HTTP 404"));

    // A restart on the same database finds nothing of them either.
    server.kill();
    let server = common::serve_on(ADMIN, url, &[]);
    gone_answers(server.base.clone()).await;
    let (status, _, c) = admin(
        &http,
        reqwest::Method::GET,
        format!("{}/v1/collections/{kept}", server.base),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(c["status"]["reports_accepted"], 70);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_leaves_nothing_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("lifecycle.db").display());
    delete_leaves_nothing(&url).await;
}

/// As [`delete_leaves_nothing_sqlite`] on PostgreSQL (`LDPSYN_TEST_DATABASE_URL`; see
/// `common::postgres_url` for when it is missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_leaves_nothing_postgres() {
    let Some(url) = common::postgres_url("delete_leaves_nothing_postgres") else {
        return;
    };
    delete_leaves_nothing(&url).await;
}

/// A delete while a device uploads to the same collection: every report the device was told
/// `accepted` was committed before the delete and deleted with it (the count the delete
/// answers equals the acknowledgements), and no row of the collection remains; nothing is
/// acknowledged into the deleted collection.
async fn delete_during_uploads(url: &str) {
    let server = common::serve_on(ADMIN, url, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let (id, schema) = create(&http, &base, "samprivsyn").await;
    let uploader = {
        let base = base.clone();
        tokio::spawn(async move {
            let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 9);
            let mut client = Client::connect(&base, id, options, MemoryLedger::default())
                .await
                .unwrap();
            let mut acked = 0u64;
            for batch in 0..5000u32 {
                let mut people: Vec<_> = (0..20u32)
                    .map(|i| SimulatedPerson {
                        record: schema.encoded(vec![i % 3, batch % 2, i % 2]).unwrap(),
                        ledger: MemoryLedger::default(),
                    })
                    .collect();
                let Ok(answers) = client.submit_batch(&mut people).await else {
                    break;
                };
                let ok = answers.iter().filter(|r| r.is_ok()).count() as u64;
                acked += ok;
                if ok == 0 {
                    break;
                }
            }
            acked
        })
    };
    // Deleted once some reports are in, while the device goes on.
    loop {
        let (_, _, c) = admin(
            &http,
            reqwest::Method::GET,
            format!("{base}/v1/collections/{id}"),
        )
        .await;
        if c["status"]["reports_accepted"].as_u64().unwrap() >= 100 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (status, _, answer) = admin(
        &http,
        reqwest::Method::DELETE,
        format!("{base}/v1/collections/{id}"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let acked = uploader.await.unwrap();
    assert!(
        acked < 5000 * 20,
        "the device was still uploading at the delete"
    );
    assert_eq!(answer["reports_deleted"], acked, "{answer}");
    for (table, count) in rows_of(url, id).await {
        assert_eq!(count, 0, "{table} still holds rows of {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_during_uploads_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("race.db").display());
    delete_during_uploads(&url).await;
}

/// As [`delete_during_uploads_sqlite`] on PostgreSQL (`LDPSYN_TEST_DATABASE_URL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_during_uploads_postgres() {
    let Some(url) = common::postgres_url("delete_during_uploads_postgres") else {
        return;
    };
    delete_during_uploads(&url).await;
}

/// A collection created with a name and a description (CLI) shows them in its public view,
/// in `list` and in `status`; one without shows neither. A name that is too long, blank,
/// not a string or on two lines is refused 400 `invalid-parameter` with a detail saying what
/// is allowed, and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_and_description_are_shown() {
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let schema_path = dir.path().join("schema.json");
    std::fs::write(&schema_path, schema().to_string()).unwrap();
    let schema_arg = schema_path.display().to_string();
    let create_named = [
        "create",
        "--schema",
        &schema_arg,
        "--epsilon",
        "2",
        "--target-users",
        "500",
        "--name",
        "  Census, spring 2026 ",
        "--description",
        "Adult census columns.\nSecond line.",
    ];
    let id: Uuid = stdout_ok(&cli(&base, &create_named))
        .trim()
        .parse()
        .unwrap();
    let (plain, _) = create(&http, &base, "privincr").await;

    let (status, _, view) = admin(
        &http,
        reqwest::Method::GET,
        format!("{base}/v1/collections/{id}"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(view["name"], "Census, spring 2026", "stored trimmed");
    assert_eq!(view["description"], "Adult census columns.\nSecond line.");
    let (_, _, view) = admin(
        &http,
        reqwest::Method::GET,
        format!("{base}/v1/collections/{plain}"),
    )
    .await;
    assert!(
        view.get("name").is_none() && view.get("description").is_none(),
        "{view}"
    );

    let listed = stdout_ok(&cli(&base, &["list"]));
    let line = listed
        .lines()
        .find(|l| l.starts_with(&id.to_string()))
        .unwrap();
    assert!(line.ends_with("  Census, spring 2026"), "{listed}");
    let said = stdout_ok(&cli(&base, &["status", &id.to_string()]));
    assert!(
        said.contains("\nname        Census, spring 2026\n"),
        "{said}"
    );
    assert!(
        said.contains("\nabout       Adult census columns.\n            Second line.\n"),
        "{said}"
    );
    let said = stdout_ok(&cli(&base, &["status", &plain.to_string()]));
    assert!(
        !said.contains("name  ") && !said.contains("about  "),
        "{said}"
    );

    let long = "x".repeat(101);
    for (name, why) in [
        (json!(long), "101 characters"),
        (json!("   "), "0 characters"),
        (json!(7), "got 7"),
        (json!("two\nlines"), "control characters"),
    ] {
        let r = http
            .post(format!("{base}/v1/collections"))
            .bearer_auth(ADMIN)
            .json(
                &json!({"schema": schema(), "protocol": "privincr", "epsilon": 2.0,
                "target_users": 500, "name": name}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["type"], "urn:ldpsyn:problem:invalid-parameter");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("`name` must be a string of 1 to 100 characters on one line")
                && detail.contains(why),
            "{detail}"
        );
    }
    let (_, _, all) = admin(
        &http,
        reqwest::Method::GET,
        format!("{base}/v1/collections"),
    )
    .await;
    assert_eq!(
        all.as_array().unwrap().len(),
        2,
        "a refusal creates nothing"
    );
}
