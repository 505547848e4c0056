//! Two aggregator instances (separate pools, committers and in-memory state) sharing one
//! PostgreSQL database: people upload through either; rounds close once (advisory lock);
//! both serve the same model, equal to the in-process reduction of every report. Needs
//! `LDPSYN_TEST_DATABASE_URL` (see `postgres_url` for when it is missing).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::wire::CollectionConfig;
use ldpsyn_engine::Engine;
use ldpsyn_tests::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_postgres_database() {
    let Some(url) = postgres_url("two_instances_share_one_postgres_database") else {
        return;
    };
    let a = start(&url, &["--refresh-interval-ms", "50"]).await;
    let b = start(&url, &["--refresh-interval-ms", "50"]).await;
    let (base_a, base_b) = (base(&a), base(&b));
    let id = create(
        &base_a,
        json!({"protocol": "privincr", "epsilon": 4.0, "target_users": 4800, "rounds": 3}),
    )
    .await;
    let schema = schema();
    let mut people = people(&schema, 4800, 21);
    let mut clients = Vec::new();
    for (i, base) in [&base_a, &base_b].into_iter().enumerate() {
        let o = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), i as u64);
        clients.push(
            Client::connect(base, id, o, MemoryLedger::default())
                .await
                .unwrap(),
        );
    }
    // While people upload, each instance's count only grows and never exceeds what was
    // sent: an instance that read the database's counts between committing a group and
    // applying it counted that group twice (seen once as 5,800 of 4,800).
    let sent = Arc::new(AtomicU64::new(0));
    let uploading = Arc::new(AtomicBool::new(true));
    let poller = tokio::spawn({
        let (sent, uploading) = (sent.clone(), uploading.clone());
        let bases = [base_a.clone(), base_b.clone()];
        async move {
            let mut last = [0u64; 2];
            let mut polls = 0;
            while uploading.load(SeqCst) {
                for (k, b) in bases.iter().enumerate() {
                    let (_, s) = admin(b, "GET", &format!("/v1/collections/{id}")).await;
                    let seen = s["status"]["reports_accepted"].as_u64().unwrap();
                    let bound = sent.load(SeqCst);
                    assert!(seen <= bound, "instance {k} counts {seen} of {bound} sent");
                    assert!(
                        seen >= last[k],
                        "instance {k} went back: {} -> {seen}",
                        last[k]
                    );
                    last[k] = seen;
                    polls += 1;
                }
            }
            polls
        }
    });
    // Alternate instances, two uploads running at once.
    for pair in people.chunks_mut(800) {
        sent.fetch_add(pair.len() as u64, SeqCst);
        let (x, y) = pair.split_at_mut(400);
        let (ca, cb) = clients.split_at_mut(1);
        let (ra, rb) = tokio::join!(ca[0].submit_batch(x), cb[0].submit_batch(y));
        for r in ra.unwrap().into_iter().chain(rb.unwrap()) {
            r.unwrap();
        }
        // Each round's reports drawn in that round: the close runs after the upload that
        // reached its quota is answered, and reaches the other instance by its refresh.
        rounds_settled(&base_a, id).await;
        rounds_settled(&base_b, id).await;
    }
    uploading.store(false, SeqCst);
    assert!(
        poller.await.unwrap() > 0,
        "the counts were polled during the uploads"
    );
    let (sa, sb) = eventually(
        "both instances to show every report and the closes",
        || async {
            let (_, sa) = admin(&base_a, "GET", &format!("/v1/collections/{id}")).await;
            let (_, sb) = admin(&base_b, "GET", &format!("/v1/collections/{id}")).await;
            (sa["status"]["reports_accepted"] == 4800 && sa["status"] == sb["status"])
                .then_some((sa, sb))
        },
    )
    .await;
    assert_eq!(sa["status"]["reports_accepted"], 4800, "{sa}");
    assert_eq!(
        sa["status"]["round"], 3,
        "three rounds closed, once each: {sa}"
    );
    assert_eq!(sa["status"], sb["status"]);

    let (s, fa) = admin(&base_a, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200, "{fa}");
    let mb = eventually("the other instance to serve the model", || async {
        let (s, mb) = admin(&base_b, "GET", &format!("/v1/collections/{id}/model")).await;
        (s == 200).then_some(mb)
    })
    .await;
    assert_eq!(
        fa["model"], mb["model"],
        "both instances serve the same model"
    );

    // The same as one process: the engine over every report with the stored state.
    let mut config: serde_json::Value = sa.clone();
    config.as_object_mut().unwrap().remove("status");
    let config: CollectionConfig = serde_json::from_value(config).unwrap();
    let engine = Engine::new(&config).unwrap();
    let tables = reduce(&engine, &acknowledged(&people, id));
    let state = a.state().collection(id).await.unwrap().state();
    let local = engine.finalize(&state, &tables).unwrap();
    assert_eq!(serde_json::to_value(local.describe()).unwrap(), fa["model"]);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
