//! Issue 66 item 3: the model's fitness report over HTTP (`GET …/model`'s `fitness`): each
//! warning appears when it should and not otherwise, and a declared target's neighbours and
//! explained share come with it. Real HTTP against an in-process server on SQLite; people
//! through the SDK.

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn_tests::*;
use serde_json::{Value, json};

/// Creates a collection, submits `n` people of the test population, finalizes it and
/// returns its model answer.
async fn model_of(body: Value, n: usize) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("f.db").display()),
        &[],
    )
    .await;
    let base = base(&server);
    let id = create(&base, body).await;
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), 7);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    let mut people = people(&schema(), n, 3);
    for chunk in people.chunks_mut(1000) {
        client.submit_batch(chunk).await.unwrap();
        rounds_settled(&base, id).await;
    }
    let (status, f) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(status, 200, "{f}");
    let (status, model) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
    assert_eq!(status, 200, "{model}");
    model
}

fn kinds(model: &Value) -> Vec<String> {
    model["fitness"]["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// The independence model, planned for twice the people who came: `no-edges`,
/// `target-independent` (naming the target) and `fewer-people`; no
/// `attribute-independent` (with no edge at all, `no-edges` says it once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_model_warns_about_its_target_and_its_people() {
    let model = model_of(
        json!({"protocol": "independence", "epsilon": 4.0, "target_users": 6000,
               "auto_finalize_at_target": false, "target": ["lung"]}),
        3000,
    )
    .await;
    let k = kinds(&model);
    assert!(k.contains(&"no-edges".to_owned()), "{k:?}");
    assert!(k.contains(&"target-independent".to_owned()), "{k:?}");
    assert!(k.contains(&"fewer-people".to_owned()), "{k:?}");
    assert!(!k.contains(&"attribute-independent".to_owned()), "{k:?}");
    let warnings = model["fitness"]["warnings"].to_string();
    assert!(
        warnings.contains("`lung`") && warnings.contains("3000"),
        "{warnings}"
    );
    let target = &model["fitness"]["targets"][0];
    assert_eq!(target["name"], "lung");
    assert_eq!(target["neighbours"], json!([]));
    assert_eq!(target["explained"], json!(0.0));
    // Every pair is independent and none was measured.
    for p in model["fitness"]["pairs"].as_array().unwrap() {
        assert_eq!(p["carried"], "independent", "{p}");
        assert_eq!(p["reports"], 0, "{p}");
    }
}

/// `auto` with its target declared, every planned person in: the target has an edge to its
/// cause (`smoker`) and a positive explained share; `shoe`, independent of everything in
/// the data, is the attribute without an edge; no other warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_its_target_carried_warns_only_about_what_is_independent() {
    let model = model_of(
        json!({"protocol": "auto", "epsilon": 4.0, "target_users": 20000,
               "auto_finalize_at_target": false, "target": ["lung"]}),
        20000,
    )
    .await;
    let k = kinds(&model);
    assert!(!k.contains(&"no-edges".to_owned()), "{k:?}");
    assert!(!k.contains(&"target-independent".to_owned()), "{k:?}");
    assert!(!k.contains(&"fewer-people".to_owned()), "{k:?}");
    let target = &model["fitness"]["targets"][0];
    assert!(
        target["neighbours"]
            .as_array()
            .unwrap()
            .contains(&json!("smoker")),
        "{target}"
    );
    let explained = target["explained"].as_f64().unwrap();
    assert!(explained > 0.1 && explained < 1.0, "{target}");
    let pair = model["fitness"]["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["a"] == 2 && p["b"] == 3)
        .unwrap()
        .clone();
    assert_eq!(pair["carried"], "edge", "{pair}");
    assert!(
        pair["reports"].as_u64().unwrap() > 0 && pair["cells"] == 4,
        "{pair}"
    );
    if k.contains(&"attribute-independent".to_owned()) {
        let text = model["fitness"]["warnings"].to_string();
        assert!(
            text.contains("`shoe`") && !text.contains("`lung`"),
            "{text}"
        );
    }
}

/// A `target` naming no attribute is a 400 that creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("u.db").display()),
        &[],
    )
    .await;
    let base = base(&server);
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"schema": schema_json(), "protocol": "auto", "epsilon": 4.0,
                      "target_users": 1000, "target": ["salary"]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let problem: Value = resp.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("`salary`"),
        "{problem}"
    );
    let (_, listed) = admin(&base, "GET", "/v1/collections").await;
    assert_eq!(listed, json!([]));
}
