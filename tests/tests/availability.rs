//! Issue 33 item 9, availability: every route that may cost a database query without an
//! admin token is rate-limited per client; ids the database does not know are remembered
//! (bounded, dropped when a collection with the id appears); a collection's task sampler is
//! built once per state change, not per task request. Over real HTTP against an in-process
//! server; the PostgreSQL tests need `LDPSYN_TEST_DATABASE_URL`.

use std::time::{Duration, Instant};

use ldpsyn::wire::{Problem, ProblemType};
use ldpsyn_engine::Engine;
use ldpsyn_service::storage::CollectionRow;
use ldpsyn_tests::*;
use serde_json::json;
use uuid::Uuid;

/// `ldpsyn_collection_lookups_total` of a server's `/metrics`: database lookups of ids not in
/// memory.
async fn lookups(http: &reqwest::Client, base: &str) -> u64 {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("ldpsyn_collection_lookups_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the lookup counter is exported")
}

/// Sends `send` until it answers 429 (at most `tries` times); checks the 429 is a
/// `rate-limited` problem with `Retry-After` ≥ 1 and returns the statuses before it.
async fn until_limited<F, Fut>(what: &str, tries: usize, mut send: F) -> Vec<u16>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
{
    let mut before = Vec::new();
    for _ in 0..tries {
        let r = send().await.unwrap();
        if r.status() == 429 {
            let retry: u64 = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what}: 429 without a Retry-After in seconds"));
            assert!(retry >= 1, "{what}: Retry-After {retry}");
            let p: Problem = r.json().await.unwrap();
            assert_eq!(p.problem_type, ProblemType::RateLimited, "{what}");
            return before;
        }
        before.push(r.status().as_u16());
    }
    panic!("{what}: not limited within {tries} quick requests: {before:?}");
}

/// `GET /v1/collections/{id}`, `GET /healthz` and party uploads answer 429 with `Retry-After`
/// past the per-IP burst (2 per second, burst 4), each in its own bucket: a client limited on
/// lookups still gets tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_health_and_party_uploads_are_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("rl.db").display());
    let server = start(&url, &["--rate-limit-per-ip", "2"]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "independence", "epsilon": 1.0, "target_users": 10}),
    )
    .await;
    let http = reqwest::Client::new();
    let missing = Uuid::new_v4();

    let before = until_limited("GET collection", 20, || {
        http.get(format!("{base}/v1/collections/{missing}")).send()
    })
    .await;
    assert!(
        before.len() <= 4 && before.iter().all(|&s| s == 404),
        "{before:?}"
    );
    // Its own bucket: the known collection is limited too, tasks are not.
    let r = http
        .get(format!("{base}/v1/collections/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let r = http
        .get(format!("{base}/v1/collections/{id}/task"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let before = until_limited("GET /healthz", 20, || {
        http.get(format!("{base}/healthz")).send()
    })
    .await;
    assert!(before.iter().all(|&s| s == 200), "{before:?}");

    let records = json!({"records": [{"id": "0".repeat(64), "codes": [0]}]});
    let before = until_limited("party upload", 20, || {
        http.post(format!(
            "{base}/v1/collections/{missing}/parties/census/records"
        ))
        .bearer_auth("not-a-party-token")
        .json(&records)
        .send()
    })
    .await;
    assert!(before.iter().all(|&s| s == 404), "{before:?}");
    server.shutdown().await.unwrap();
}

/// The task sampler is built when a state becomes current (the collection's creation, a
/// round close), never by task requests, however many ask at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_sampler_is_built_once_per_state() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sampler.db").display());
    let server = start(&url, &[]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "privincr", "epsilon": 2.0, "target_users": 100_000, "rounds": 3}),
    )
    .await;
    let handle = server.state().collection(id).await.unwrap();
    assert_eq!(handle.sampler_builds(), 1, "built with the collection");

    let http = reqwest::Client::new();
    let ask_tasks = |n: usize| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let calls: Vec<_> = (0..n)
                .map(|i| {
                    let (http, base) = (http.clone(), base.clone());
                    tokio::spawn(async move {
                        let q = if i % 2 == 0 { "" } else { "?count=100" };
                        let r = http
                            .get(format!("{base}/v1/collections/{id}/task{q}"))
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(r.status(), 200);
                    })
                })
                .collect();
            for c in calls {
                c.await.unwrap();
            }
        }
    };
    ask_tasks(64).await;
    assert_eq!(handle.sampler_builds(), 1, "64 task requests built nothing");

    let (status, answer) = admin(
        &base,
        "POST",
        &format!("/v1/collections/{id}/close-round?force=true"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(handle.sampler_builds(), 2, "built once for the new round");
    ask_tasks(64).await;
    assert_eq!(
        handle.sampler_builds(),
        2,
        "64 more task requests built nothing"
    );
    server.shutdown().await.unwrap();
}

/// PostgreSQL: requests for random ids reach the database at most as often as the per-IP
/// limit lets them through (the rest are 429s), and requests for one unknown id once per
/// negative-cache period, on every route without an admin token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_cost_bounded_database_lookups_on_postgres() {
    let Some(url) = postgres_url("unknown_ids_cost_bounded_database_lookups_on_postgres") else {
        return;
    };
    let server = start(&url, &["--rate-limit-per-ip", "2"]).await;
    let base = base(&server);
    let http = reqwest::Client::new();
    let start_lookups = lookups(&http, &base).await;
    let mut answered = Vec::new();
    for _ in 0..40 {
        let r = http
            .get(format!("{base}/v1/collections/{}", Uuid::new_v4()))
            .send()
            .await
            .unwrap();
        answered.push(r.status().as_u16());
    }
    let not_found = answered.iter().filter(|&&s| s == 404).count() as u64;
    assert!(
        answered.iter().all(|&s| s == 404 || s == 429) && (4..=8).contains(&not_found),
        "{answered:?}"
    );
    let after_random = lookups(&http, &base).await;
    assert_eq!(
        after_random - start_lookups,
        not_found,
        "one lookup per 404"
    );

    // One unknown id over the task, upload and party routes: one lookup in all.
    let missing = Uuid::new_v4();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        for r in [
            http.get(format!("{base}/v1/collections/{missing}/task"))
                .send()
                .await,
            http.post(format!("{base}/v1/collections/{missing}/reports"))
                .body("[]")
                .send()
                .await,
            http.post(format!("{base}/v1/collections/{missing}/parties/p/records"))
                .body("{}")
                .send()
                .await,
        ] {
            statuses.push(r.unwrap().status().as_u16());
        }
    }
    assert!(statuses.iter().all(|&s| s == 404), "{statuses:?}");
    assert_eq!(
        lookups(&http, &base).await,
        after_random + 1,
        "{statuses:?}"
    );
    assert!(server.state().is_remembered_unknown(missing));
    server.shutdown().await.unwrap();
}

/// PostgreSQL: an id remembered as unknown is forgotten as soon as a collection with that id
/// is stored by another process and this one's refresher loads it, well before the
/// negative-cache period ends; the collection is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_unknown_id_is_dropped_when_the_collection_appears() {
    let Some(url) = postgres_url("a_remembered_unknown_id_is_dropped_when_the_collection_appears")
    else {
        return;
    };
    let server = start(&url, &["--refresh-interval-ms", "50"]).await;
    let base = base(&server);
    let http = reqwest::Client::new();
    let id = Uuid::new_v4();
    let r = http
        .get(format!("{base}/v1/collections/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let remembered = Instant::now();
    assert!(server.state().is_remembered_unknown(id));

    // "Another process" stores a collection with this id (ids are the server's v4 UUIDs, so
    // only a test can choose one): a created collection's config under the new id.
    let template = create(
        &base,
        json!({"protocol": "independence", "epsilon": 1.0, "target_users": 10}),
    )
    .await;
    let (_, view) = admin(&base, "GET", &format!("/v1/collections/{template}")).await;
    // The view is the config flattened with the server's fields.
    let mut config = view.clone();
    let fields = config.as_object_mut().unwrap();
    for k in [
        "status",
        "upload_limits",
        "party_epsilon",
        "composed_epsilon",
        "party_tokens",
    ] {
        fields.remove(k);
    }
    config["id"] = json!(id);
    let parsed: ldpsyn::wire::CollectionConfig = serde_json::from_value(config.clone()).unwrap();
    let engine = Engine::new(&parsed).unwrap();
    let row = CollectionRow {
        id,
        config: config.to_string(),
        state: serde_json::to_string(&engine.initial_state()).unwrap(),
        state_version: 0,
    };
    server
        .state()
        .db()
        .insert_collection(&row, 0)
        .await
        .unwrap();
    while server.state().is_remembered_unknown(id) {
        assert!(
            remembered.elapsed() < Duration::from_millis(1500),
            "still remembered as unknown"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = http
        .get(format!("{base}/v1/collections/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(remembered.elapsed() < ldpsyn_service::NEGATIVE_TTL);
    let (status, _) = admin(&base, "DELETE", &format!("/v1/collections/{id}")).await;
    assert_eq!(status, 200);
    server.shutdown().await.unwrap();
}
