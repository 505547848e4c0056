//! Finalize fits the model outside the committer (issue 33 item 6): while one collection's
//! model is being fit, uploads to other collections are committed and answered; the
//! finalizing collection's reports are refused `collection-finalized` (never acknowledged and
//! left out of the model); and the committed finalized state is all a process needs to fit
//! the same model again (a process started on the database mid-fit, as after a kill -9).
//!
//! The fit is held with `CollectionHandle::hold_fits` (feature `test-util`) for as long as the
//! test needs, so the test asserts on states and order, never on time.

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientError, ClientOptions};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::wire::{CollectionConfig, ProblemType, ReportStatus};
use ldpsyn_engine::Engine;
use ldpsyn_tests::*;
use serde_json::{Value, json};
use uuid::Uuid;

/// The collection's view until `done` holds of it, polled (a state to wait for, bounded by a
/// number of polls so that a broken server fails the test instead of hanging it).
async fn view_until(base: &str, id: Uuid, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..3000 {
        let (_, v) = admin(base, "GET", &format!("/v1/collections/{id}")).await;
        if done(&v) {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("collection {id} never reached the awaited state");
}

async fn client(base: &str, id: Uuid, seed: u64) -> Client<MemoryLedger> {
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), seed);
    Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_are_committed_while_a_finalize_fits() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("f.db").display());
    let server = start(&db, &[]).await;
    let base = base(&server);
    let body = json!({"protocol": "independence", "epsilon": 4.0, "target_users": 100_000});
    let (a, b) = (create(&base, body.clone()).await, create(&base, body).await);
    let schema = schema();

    // A collects 400 reports; 50 more are randomized (pending in their ledgers) but not sent.
    let mut ca = client(&base, a, 1).await;
    let mut acked = people(&schema, 400, 2);
    for r in ca.submit_batch(&mut acked).await.unwrap() {
        assert_eq!(r.unwrap().status, ReportStatus::Accepted);
    }
    let mut late = people(&schema, 50, 3);
    let late_batch = ca.prepare_batch(&mut late).await.unwrap();

    // Finalize A with its fit held: the finalized state commits, the fit waits, and the
    // finalize answers 202 once its wait (here 1 s) is over, naming where the model will be.
    let handle = server.state().collection(a).await.unwrap();
    let fit = handle.hold_fits().await;
    let (s, accepted, location) = finalize_preferring(&base, a, "wait=1").await;
    assert_eq!(s, 202, "{accepted}");
    let model_url = format!("/v1/collections/{a}/model");
    assert_eq!(
        (location.as_deref(), accepted["model"].as_str()),
        (Some(&*model_url), Some(&*model_url))
    );
    assert_eq!(accepted["status"]["phase"], "finalized");
    assert_eq!(accepted["status"]["model"], "building");
    let v = view_until(&base, a, |v| v["status"]["phase"] == "finalized").await;
    assert_eq!(v["status"]["model_ready"], false, "the fit is held");
    assert_eq!(v["status"]["model"], "building");
    // A second finalize while it fits is answered 202 at once with `respond-async`.
    let (s, _, _) = finalize_preferring(&base, a, "respond-async").await;
    assert_eq!(s, 202);

    // Meanwhile the committer is free: B's uploads are committed and answered.
    let mut cb = client(&base, b, 4).await;
    let mut others = people(&schema, 300, 5);
    for r in cb.submit_batch(&mut others).await.unwrap() {
        assert_eq!(r.unwrap().status, ReportStatus::Accepted);
    }
    let (_, vb) = admin(&base, "GET", &format!("/v1/collections/{b}")).await;
    assert_eq!(vb["status"]["reports_accepted"], 300);

    // A's late reports are refused, not acknowledged; its model is not ready yet.
    match ca.send_batch(&mut late, late_batch).await {
        Err(ClientError::Problem(p)) => {
            assert_eq!(p.problem_type, ProblemType::CollectionFinalized)
        }
        other => panic!("reports after the finalized state must be refused: {other:?}"),
    }
    let (s, m) = admin(&base, "GET", &format!("/v1/collections/{a}/model")).await;
    assert_eq!(
        (s, m["type"].as_str()),
        (409, Some("urn:ldpsyn:problem:model-not-ready"))
    );

    // A process started on the database now (as after a kill -9 during the fit) fits the
    // model of exactly the acknowledged reports from the committed state.
    let config: CollectionConfig = serde_json::from_value({
        let (_, mut v) = admin(&base, "GET", &format!("/v1/collections/{a}")).await;
        v.as_object_mut().unwrap().remove("status");
        v
    })
    .unwrap();
    let engine = Engine::new(&config).unwrap();
    let tables = reduce(&engine, &acknowledged(&acked, a));
    assert_eq!(acknowledged(&late, a).len(), 0);
    let expected = engine.finalize(&handle.state(), &tables).unwrap();
    let expected = serde_json::to_value(expected.describe()).unwrap();
    let second = start(&db, &[]).await;
    let m2 = model_when_ready(&ldpsyn_tests::base(&second), a).await;
    assert_eq!(
        m2["model"], expected,
        "the restarted fit is the model of the acknowledged reports"
    );

    // Released, the fit completes: the model answers where the 202 said, and a finalize
    // now answers 200 with the same model, even one that prefers not to wait.
    drop(fit);
    let m = model_when_ready(&base, a).await;
    assert_eq!(m["model"], expected);
    let v = view_until(&base, a, |v| v["status"]["model"] == "ready").await;
    assert_eq!(v["status"]["model_ready"], true);
    let (s, fin, _) = finalize_preferring(&base, a, "respond-async").await;
    assert_eq!(s, 200, "{fin}");
    assert_eq!(fin["model"], expected);
    assert_eq!(fin["status"]["reports_accepted"], 400);
}

/// `POST …/finalize` of `id` with `Prefer: prefer`: status, body and `Location` header.
async fn finalize_preferring(base: &str, id: Uuid, prefer: &str) -> (u16, Value, Option<String>) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/collections/{id}/finalize"))
        .bearer_auth(ADMIN)
        .header("prefer", prefer)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_owned());
    (status, resp.json().await.unwrap(), location)
}

/// Finalize with nothing collected is refused before the transition (`conflict`), and the
/// collection stays open: as before the fit moved out of the committer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalize_without_reports_leaves_the_collection_open() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("e.db").display()),
        &[],
    )
    .await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "independence", "epsilon": 4.0, "target_users": 100}),
    )
    .await;
    let (s, v) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(
        (s, v["type"].as_str()),
        (409, Some("urn:ldpsyn:problem:conflict"))
    );
    let (_, v) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_ne!(v["status"]["phase"], "finalized", "{v}");
}

/// Issue 67 item 6: a restart serves at once, before the finalized models are refitted.
/// Restarted with a refit pool of no permits (every refit held), the server starts, answers
/// `/healthz` with the models still pending, lists both finalized collections (model not
/// ready) and answers their model routes 409 `model-not-ready` saying the model is being
/// refitted; given one permit, the refits run one at a time in the background and each
/// collection gets the model it had before the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_serves_before_its_models_are_refitted() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("r.db").display());
    let server = start(&db, &[]).await;
    let base = ldpsyn_tests::base(&server);
    let body = json!({"protocol": "independence", "epsilon": 4.0, "target_users": 100_000});
    let ids = [create(&base, body.clone()).await, create(&base, body).await];
    let mut models = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let mut c = client(&base, id, 10 + i as u64).await;
        let mut ps = people(&schema(), 300, 20 + i as u64);
        for r in c.submit_batch(&mut ps).await.unwrap() {
            assert_eq!(r.unwrap().status, ReportStatus::Accepted);
        }
        let (s, fin) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
        assert_eq!(s, 200, "{fin}");
        models.push(fin["model"].clone());
    }
    server.shutdown().await.unwrap();

    let pool = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let mut config = test_config(&db, &[]);
    config.refit_pool = Some(pool.clone());
    let second = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        ldpsyn_service::Server::start(config),
    )
    .await
    .expect("the server serves before its refits")
    .unwrap();
    let base = ldpsyn_tests::base(&second);
    let health: Value = reqwest::get(format!("{base}/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health, json!({"status": "ok", "models_pending": 2}));
    for &id in &ids {
        let (s, v) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["status"]["phase"], "finalized");
        assert_eq!(v["status"]["model_ready"], false);
        let (s, m) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
        assert_eq!(
            (s, m["type"].as_str()),
            (409, Some("urn:ldpsyn:problem:model-not-ready")),
            "{m}"
        );
        assert!(m["detail"].as_str().unwrap().contains("refitted"), "{m}");
    }

    pool.add_permits(1);
    for (id, before) in ids.iter().zip(&models) {
        let m = model_when_ready(&base, *id).await;
        assert_eq!(&m["model"], before, "the same model as before the restart");
    }
    let health: Value = reqwest::get(format!("{base}/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["models_pending"], 0);
    second.shutdown().await.unwrap();
}
