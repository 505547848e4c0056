//! Vertical collections over real HTTP: two parties holding different attributes of the same
//! people upload per-record GRR reports joined by record id; the aggregator learns the
//! cross-party dependencies and serves synthetic data. Bad uploads change nothing.

use ldpsyn::Epsilon;
use ldpsyn::client::{ClientError, ClientOptions};
use ldpsyn::vertical::{PartyClient, PartyRecord, RecordIdKey};
use ldpsyn::wire::ProblemType;
use ldpsyn_tests::{
    ADMIN, admin, base, model_when_ready, population, post_raw, problem_kind, schema_json, start,
};
use rand::SeedableRng;
use serde_json::{Value, json};

const N: usize = 20_000;

/// bank: region (4) and smoker (2); clinic: income (3), lung (2), shoe (3). region → income
/// and smoker → lung are the cross-party dependencies of the test population.
fn create_body() -> Value {
    json!({
        "schema": schema_json(), "protocol": "vertical", "target_users": N, "encoding": "fo",
        "parties": [
            {"name": "bank", "attributes": [
                {"name": "region", "epsilon": 2.0}, {"name": "smoker", "epsilon": 2.0}]},
            {"name": "clinic", "attributes": [
                {"name": "income", "epsilon": 2.0}, {"name": "lung", "epsilon": 1.5},
                {"name": "shoe", "epsilon": 0.5}]}
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parties_upload_and_the_model_learns_cross_party_pairs() {
    let dir = tempfile::tempdir().unwrap();
    two_parties(&format!("sqlite://{}", dir.path().join("v.db").display())).await;
}

/// The same on PostgreSQL (the party uploads take the ingest barrier and the collection's
/// advisory lock there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parties_upload_on_postgres() {
    if let Some(url) = ldpsyn_tests::postgres_url("two_parties_upload_on_postgres") {
        two_parties(&url).await;
    }
}

async fn two_parties(database_url: &str) {
    let server = start(database_url, &[]).await;
    let base = base(&server);
    let created: Value = reqwest::Client::new()
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&create_body())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id: uuid::Uuid = created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("create failed: {created}"))
        .parse()
        .unwrap();
    // ε of the collection is the largest party total; each party's is public, and so is
    // what one person spends over both (issue 33 item 2): the parties' reports are joined.
    assert_eq!(created["epsilon"], json!(4.0));
    assert_eq!(created["party_epsilon"]["clinic"], json!(4.0));
    assert_eq!(created["composed_epsilon"], json!(8.0));
    let tokens = created["party_tokens"].clone();
    let (status, listed) = admin(&base, "GET", &format!("/v1/collections/{id}/parties")).await;
    assert_eq!((status, &listed), (200, &tokens));
    let (bank_token, clinic_token) = (
        tokens["bank"].as_str().unwrap(),
        tokens["clinic"].as_str().unwrap(),
    );

    let key = RecordIdKey::new(b"shared-secret-of-bank-and-clinic!!".to_vec()).unwrap();
    // A 5,000-record upload to PostgreSQL from a debug build on a loaded 2-core machine
    // outlasted the default 10 s timeout on all 5 attempts: give each attempt a minute.
    let options = || {
        let mut o = ClientOptions::new(Epsilon::new(4.0).unwrap());
        o.request_timeout = std::time::Duration::from_secs(60);
        o
    };
    let bank = PartyClient::connect(&base, id, "bank", bank_token, options())
        .await
        .unwrap();
    let clinic = PartyClient::connect(&base, id, "clinic", clinic_token, options())
        .await
        .unwrap();
    // A party whose Σε is above what the app accepts is refused before anything is sent.
    assert!(matches!(
        PartyClient::connect(
            &base,
            id,
            "clinic",
            clinic_token,
            ClientOptions::new(Epsilon::new(3.0).unwrap())
        )
        .await,
        Err(ClientError::EpsilonTooLarge { .. })
    ));
    let people = population(N, 31);
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(5);
    let mut records = |client: &PartyClient, attrs: &[usize]| -> Vec<PartyRecord> {
        people
            .iter()
            .enumerate()
            .map(|(i, p)| {
                client
                    .randomizer()
                    .record_from_codes(
                        key.record_id(&format!("customer-{i}")),
                        &attrs.iter().map(|&a| p[a]).collect::<Vec<_>>(),
                        &mut rng,
                    )
                    .unwrap()
            })
            .collect()
    };
    let bank_records = records(&bank, &[0, 2]);
    let clinic_records = records(&clinic, &[1, 3, 4]);
    // The clinic uploads first for half the people, the bank for all, then the clinic's rest:
    // every cross-party pair is counted once whichever party comes second.
    // Every record is acknowledged once: `accepted`, or `duplicate` when the client retried an
    // upload whose answer it did not get in time (the first attempt committed; on a loaded
    // machine a 5,000-record upload to PostgreSQL outlasted the client's 10 s timeout). The
    // collection's count below shows each is stored once.
    let (early, late) = clinic_records.split_at(N / 2);
    for chunk in early.chunks(5_000) {
        let r = clinic.upload(chunk).await.unwrap();
        assert_eq!(r.accepted + r.duplicate, chunk.len() as u64);
    }
    for chunk in bank_records.chunks(5_000) {
        let r = bank.upload(chunk).await.unwrap();
        assert_eq!(r.accepted + r.duplicate, chunk.len() as u64);
    }
    for chunk in late.chunks(5_000) {
        clinic.upload(chunk).await.unwrap();
    }
    let status = |v: Value| v["status"]["reports_accepted"].as_u64().unwrap();
    let (_, before) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(status(before.clone()), 2 * N as u64);

    // A retry resends the same codes: all duplicates.
    let again = bank.upload(&bank_records[..100]).await.unwrap();
    assert_eq!((again.accepted, again.duplicate), (0, 100));
    // Other codes for a held id: 409, and nothing of the upload is stored (the new id too).
    let mut forged = bank_records[7].clone();
    forged.codes[0] = (forged.codes[0] + 1) % 4;
    let fresh = PartyRecord {
        id: key.record_id("customer-new"),
        attribute: None,
        codes: vec![0, 0],
    };
    match bank.upload(&[fresh.clone(), forged]).await {
        Err(ClientError::Problem(p)) => assert_eq!(p.problem_type, ProblemType::RecordIdConflict),
        other => panic!("expected record-id-conflict, got {other:?}"),
    }
    let url = |party: &str| format!("{base}/v1/collections/{id}/parties/{party}/records");
    let one = |r: &PartyRecord| json!({"records": [r]});
    for (party, token, body, code, kind) in [
        (
            "bank",
            clinic_token,
            one(&fresh),
            401,
            ProblemType::Unauthorized,
        ),
        ("bank", "", one(&fresh), 401, ProblemType::Unauthorized),
        ("bank", ADMIN, one(&fresh), 401, ProblemType::Unauthorized),
        ("shop", bank_token, one(&fresh), 404, ProblemType::NotFound),
        (
            "bank",
            bank_token,
            json!({"records": [{"id": "ABC", "codes": [0, 0]}]}),
            400,
            ProblemType::InvalidParameter,
        ),
        (
            "bank",
            bank_token,
            json!({"records": [{"id": fresh.id, "codes": [0, 0, 0]}]}),
            400,
            ProblemType::InvalidPayload,
        ),
        (
            "bank",
            bank_token,
            json!({"records": [{"id": fresh.id, "codes": [4, 0]}]}),
            400,
            ProblemType::InvalidPayload,
        ),
        (
            "bank",
            bank_token,
            json!({"records": [fresh, fresh]}),
            400,
            ProblemType::InvalidParameter,
        ),
        (
            "bank",
            bank_token,
            json!({"records": []}),
            400,
            ProblemType::InvalidParameter,
        ),
        (
            "bank",
            bank_token,
            json!({"records": [fresh], "extra": 1}),
            400,
            ProblemType::MalformedRequest,
        ),
    ] {
        let (s, v) = post_raw(&url(party), token, body.clone()).await;
        assert_eq!(
            (s, problem_kind(&v)),
            (code, Some(kind)),
            "{party} {body}: {v}"
        );
    }
    // A vertical collection hands out no device tasks.
    let resp = reqwest::get(format!("{base}/v1/collections/{id}/task"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let (_, after) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(
        status(after),
        2 * N as u64,
        "refused uploads changed nothing"
    );

    // The model keeps the two cross-party dependencies and no pair with `shoe`.
    let (s, _) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200);
    let (_, model) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
    assert_eq!(model["model"]["composed_epsilon"], json!(8.0));
    let kept: Vec<(u64, u64)> = model["model"]["model_graph"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["kept"] == json!(true))
        .map(|g| (g["a"].as_u64().unwrap(), g["b"].as_u64().unwrap()))
        .collect();
    assert!(kept.contains(&(0, 1)) && kept.contains(&(2, 3)), "{kept:?}");
    assert!(!kept.iter().any(|&(a, b)| a == 4 || b == 4), "{kept:?}");
    // The cross-party marginal region × income from the model is close to the truth.
    let (_, m) = admin(
        &base,
        "GET",
        &format!("/v1/collections/{id}/marginals?attrs=region,income"),
    )
    .await;
    let freq: Vec<f64> = serde_json::from_value(m["frequencies"].clone()).unwrap();
    let mut truth = [0.0; 12];
    for p in &people {
        truth[(p[0] * 3 + p[1]) as usize] += 1.0 / N as f64;
    }
    let tvd: f64 = freq
        .iter()
        .zip(truth)
        .map(|(a, b)| (a - b).abs())
        .sum::<f64>()
        / 2.0;
    assert!(tvd < 0.05, "region × income TVD {tvd}: {freq:?}");
    // Finalized: uploads are refused; synthetic data downloads.
    let (s, v) = post_raw(&url("bank"), bank_token, one(&fresh)).await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::CollectionFinalized))
    );
    let csv = reqwest::Client::new()
        .get(format!(
            "{base}/v1/collections/{id}/synthetic?rows=500&seed=3"
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(csv.lines().count(), 501, "header + 500 rows");
    server.shutdown().await.unwrap();
}

/// `POST …/parties/{party}/model` (encoding `fo+locmrf`): every bad upload is a 4xx problem
/// and changes nothing (finalize still waits for bank's model); a valid model is stored once
/// (201), resent identically (200), and a different second model is refused (409). Once the
/// parties' records are in, finalize fits with it (its graph in the model graph), later
/// uploads are refused `collection-finalized`, and a restart fits the same model from the
/// stored one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_model_uploads_are_checked_and_stored_once() {
    use ldpsyn_engine::central::measure_local_model;
    use ldpsyn_engine::protocols::vertical::ResolvedParty;

    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("m.db").display()),
        &[],
    )
    .await;
    let base = base(&server);
    let mut body = create_body();
    body["encoding"] = json!("fo+locmrf");
    body["parties"][0]["locmrf"] = json!({"epsilon": 0.5, "delta": 1e-6});
    let created: Value = reqwest::Client::new()
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    assert_eq!(created["party_epsilon"]["bank"], json!(4.5), "{created}");
    let token = |p: &str| created["party_tokens"][p].as_str().unwrap().to_owned();
    let url = |p: &str| format!("{base}/v1/collections/{id}/parties/{p}/model");

    // Bank's model of its columns (region, smoker: schema 0 and 2).
    let budget = ldpsyn::wire::LocMrfBudget {
        epsilon: Epsilon::new(0.5).unwrap(),
        delta: 1e-6,
    };
    let bank = ResolvedParty {
        name: "bank".into(),
        attributes: vec![0, 2],
        locmrf: Some(budget),
    };
    let dims = ldpsyn_tests::schema().domain_sizes();
    let codes: Vec<u32> = population(2000, 3)
        .iter()
        .flat_map(|r| [r[0], r[2]])
        .collect();
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(5);
    let model = measure_local_model(&bank, &dims, &codes, 2, &mut rng).unwrap();
    let good = serde_json::to_value(&model).unwrap();

    let no_token = reqwest::Client::new()
        .post(url("bank"))
        .json(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(no_token.status(), 401);
    let (s, v) = post_raw(&url("bank"), &token("clinic"), good.clone()).await;
    assert_eq!(
        (s, problem_kind(&v)),
        (401, Some(ProblemType::Unauthorized))
    );
    let (s, v) = post_raw(&url("nobody"), &token("bank"), good.clone()).await;
    assert_eq!(
        (s, problem_kind(&v)),
        (404, Some(ProblemType::NotFound)),
        "{v}"
    );
    // Clinic has no `locmrf` budget: it uploads records only.
    let (s, v) = post_raw(&url("clinic"), &token("clinic"), good.clone()).await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::Conflict)),
        "{v}"
    );
    let malformed = reqwest::Client::new()
        .post(url("bank"))
        .bearer_auth(token("bank"))
        .header("content-type", "application/json")
        .body("{\"party\": \"bank\", \"measurements\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    // Raw records are not a local model (unknown fields).
    let (s, v) = post_raw(
        &url("bank"),
        &token("bank"),
        json!({"records": [{"id": "x", "codes": [1, 0]}]}),
    )
    .await;
    assert_eq!(
        (s, problem_kind(&v)),
        (400, Some(ProblemType::MalformedRequest)),
        "{v}"
    );
    for (what, bad) in [
        ("another party's name", {
            let mut b = good.clone();
            b["party"] = json!("clinic");
            b
        }),
        ("a budget other than the config's", {
            let mut b = good.clone();
            b["privacy"]["epsilon"] = json!(0.25);
            b
        }),
        ("a count missing", {
            let mut b = good.clone();
            b["measurements"][0]["counts"].as_array_mut().unwrap().pop();
            b
        }),
        ("a clinic attribute", {
            let mut b = good.clone();
            b["measurements"][0]["attrs"] = json!([1]);
            b
        }),
        ("σ = 0", {
            let mut b = good.clone();
            b["measurements"][1]["sigma"] = json!(0.0);
            b
        }),
    ] {
        let (s, v) = post_raw(&url("bank"), &token("bank"), bad).await;
        assert_eq!(
            (s, problem_kind(&v)),
            (400, Some(ProblemType::InvalidParameter)),
            "{what}: {v}"
        );
    }
    // Nothing was stored: finalize still waits for bank's model.
    let (s, v) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 409, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("bank"), "{v}");

    let (s, v) = post_raw(&url("bank"), &token("bank"), good.clone()).await;
    assert_eq!((s, &v["stored"]), (201, &json!(true)), "{v}");
    let (s, v) = post_raw(&url("bank"), &token("bank"), good.clone()).await;
    assert_eq!((s, &v["stored"]), (200, &json!(false)), "{v}");
    let mut other = good.clone();
    let c0 = other["measurements"][0]["counts"][0].as_f64().unwrap();
    other["measurements"][0]["counts"][0] = json!(c0 + 1.0);
    let (s, v) = post_raw(&url("bank"), &token("bank"), other).await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::Conflict)),
        "{v}"
    );

    // Records of both parties (their true codes stand in for GRR outputs here), then
    // finalize: the model is fitted with bank's local model, and fitted again the same from
    // the stored model after a restart.
    let key = RecordIdKey::new(vec![9; 32]).unwrap();
    let people = population(2000, 4);
    for (party, attrs) in [("bank", [0usize, 2].as_slice()), ("clinic", &[1, 3, 4])] {
        let records: Vec<Value> = people
            .iter()
            .enumerate()
            .map(|(i, p)| {
                json!({"id": key.record_id(&format!("c{i}")),
                       "codes": attrs.iter().map(|&a| p[a]).collect::<Vec<_>>()})
            })
            .collect();
        let (s, v) = post_raw(
            &format!("{base}/v1/collections/{id}/parties/{party}/records"),
            &token(party),
            json!({ "records": records }),
        )
        .await;
        assert_eq!(s, 200, "{v}");
    }
    let (s, v) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200, "{v}");
    let (s, before) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
    assert_eq!(s, 200, "{before}");
    // Bank's local graph (region 0, smoker 2) is in the model graph.
    let kept: Vec<(u64, u64)> = before["model"]["model_graph"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kept"] == json!(true))
        .map(|e| (e["a"].as_u64().unwrap(), e["b"].as_u64().unwrap()))
        .collect();
    for &(a, b) in model.graph() {
        assert!(
            kept.contains(&(a as u64, b as u64)),
            "({a}, {b}) not in {kept:?}"
        );
    }
    // After finalize a model upload is refused.
    let (s, v) = post_raw(&url("bank"), &token("bank"), good.clone()).await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::CollectionFinalized)),
        "{v}"
    );
    server.shutdown().await.unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("m.db").display()),
        &[],
    )
    .await;
    let base = ldpsyn_tests::base(&server);
    let after = model_when_ready(&base, &id).await;
    assert_eq!(
        after["model"]["model_graph"],
        before["model"]["model_graph"]
    );
    assert!(before["model"]["model_graph"].is_array());

    // An `fo` collection takes no model.
    let plain = ldpsyn_tests::create(&base, create_body()).await;
    let tokens = admin(&base, "GET", &format!("/v1/collections/{plain}/parties"))
        .await
        .1;
    let (s, v) = post_raw(
        &format!("{base}/v1/collections/{plain}/parties/bank/model"),
        tokens["bank"].as_str().unwrap(),
        good,
    )
    .await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::Conflict)),
        "{v}"
    );
}

/// Encoding `sampled+locmrf` over HTTP: each record names the one attribute it reports;
/// records are counted once (resends are duplicates, another draw for a held id is a
/// `409 record-id-conflict`), and malformed records — no `attribute`, an index past the
/// party's attributes, not exactly one code, a code outside the attribute's domain — are
/// refused whole with a 4xx problem document (the SDK's typed `Problem`), changing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_uploads_are_checked_and_counted_once() {
    const M: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("s.db").display()),
        &[],
    )
    .await;
    let base = base(&server);
    let mut body = create_body();
    body["target_users"] = json!(M);
    body["encoding"] = json!("sampled+locmrf");
    for p in body["parties"].as_array_mut().unwrap() {
        p["locmrf"] = json!({"epsilon": 0.5, "delta": 1e-6});
    }
    let created: Value = reqwest::Client::new()
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id: uuid::Uuid = created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("create failed: {created}"))
        .parse()
        .unwrap();
    // One attribute's ε per record plus the model's: bank 2 + 0.5, clinic max(2, 1.5, 0.5) + 0.5.
    assert_eq!(created["epsilon"], json!(2.5));
    assert_eq!(created["party_epsilon"]["bank"], json!(2.5));
    assert_eq!(created["composed_epsilon"], json!(5.0));
    let tokens = created["party_tokens"].clone();
    let (bank_token, clinic_token) = (
        tokens["bank"].as_str().unwrap(),
        tokens["clinic"].as_str().unwrap(),
    );
    let options = || ClientOptions::new(Epsilon::new(2.5).unwrap());
    let bank = PartyClient::connect(&base, id, "bank", bank_token, options())
        .await
        .unwrap();
    let clinic = PartyClient::connect(&base, id, "clinic", clinic_token, options())
        .await
        .unwrap();
    assert!(bank.randomizer().sampled());
    let key = RecordIdKey::new(b"shared-secret-of-bank-and-clinic!!".to_vec()).unwrap();
    let people = population(M, 37);
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(6);
    let mut records = |client: &PartyClient, attrs: &[usize]| -> Vec<PartyRecord> {
        people
            .iter()
            .enumerate()
            .map(|(i, p)| {
                client
                    .randomizer()
                    .record_from_codes(
                        key.record_id(&format!("customer-{i}")),
                        &attrs.iter().map(|&a| p[a]).collect::<Vec<_>>(),
                        &mut rng,
                    )
                    .unwrap()
            })
            .collect()
    };
    let bank_records = records(&bank, &[0, 2]);
    let clinic_records = records(&clinic, &[1, 3, 4]);
    assert!(bank_records.iter().all(|r| r.codes.len() == 1));
    // The clinic's first half, the bank, then the clinic's rest: order does not matter.
    let (early, late) = clinic_records.split_at(M / 2);
    assert_eq!(clinic.upload(early).await.unwrap().accepted, (M / 2) as u64);
    assert_eq!(bank.upload(&bank_records).await.unwrap().accepted, M as u64);
    assert_eq!(clinic.upload(late).await.unwrap().accepted, (M / 2) as u64);
    let again = bank.upload(&bank_records[..50]).await.unwrap();
    assert_eq!((again.accepted, again.duplicate), (0, 50));
    // Another draw for a held id (the other attribute): a conflict, nothing stored.
    let mut redrawn = bank_records[3].clone();
    redrawn.attribute = redrawn.attribute.map(|j| 1 - j);
    redrawn.codes = vec![0];
    let fresh = PartyRecord {
        id: key.record_id("customer-new"),
        attribute: Some(1),
        codes: vec![1],
    };
    match bank.upload(&[fresh.clone(), redrawn]).await {
        Err(ClientError::Problem(p)) => assert_eq!(p.problem_type, ProblemType::RecordIdConflict),
        other => panic!("expected record-id-conflict, got {other:?}"),
    }
    // A record without its attribute: the SDK's typed problem.
    let unnamed = PartyRecord {
        id: key.record_id("customer-unnamed"),
        attribute: None,
        codes: vec![1],
    };
    match bank.upload(&[fresh.clone(), unnamed.clone()]).await {
        Err(ClientError::Problem(p)) => {
            assert_eq!(p.problem_type, ProblemType::InvalidPayload);
            assert!(
                p.detail.contains("record 1") && p.detail.contains("`attribute`"),
                "{p:?}"
            );
        }
        other => panic!("expected invalid-payload, got {other:?}"),
    }
    let url = format!("{base}/v1/collections/{id}/parties/bank/records");
    // Each bad record beside a valid one of another id: the whole upload is refused.
    let other = unnamed.id.clone();
    for (record, why) in [
        (json!({"id": other, "codes": [1]}), "needs `attribute`"),
        (
            json!({"id": other, "attribute": 2, "codes": [1]}),
            "not an index",
        ),
        (
            json!({"id": other, "attribute": 0, "codes": [1, 0]}),
            "one code",
        ),
        (
            json!({"id": other, "attribute": 0, "codes": []}),
            "one code",
        ),
        // bank's attribute 1 is smoker (2 values).
        (
            json!({"id": other, "attribute": 1, "codes": [2]}),
            "domain size",
        ),
        (
            json!({"id": other, "attribute": 0, "codes": [4294967295u32]}),
            "domain size",
        ),
    ] {
        let resp = reqwest::Client::new()
            .post(&url)
            .bearer_auth(bank_token)
            .json(&json!({"records": [fresh, record]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{record}");
        assert_eq!(
            resp.headers()["content-type"],
            ldpsyn::wire::PROBLEM_CONTENT_TYPE,
            "{record}"
        );
        let v: Value = resp.json().await.unwrap();
        assert_eq!(problem_kind(&v), Some(ProblemType::InvalidPayload), "{v}");
        assert!(v["detail"].as_str().unwrap().contains(why), "{why}: {v}");
    }
    // A negative index does not parse: the body is refused whole.
    let (s, v) = post_raw(
        &url,
        bank_token,
        json!({"records": [{"id": fresh.id, "attribute": -1, "codes": [0]}]}),
    )
    .await;
    assert_eq!(
        (s, problem_kind(&v)),
        (400, Some(ProblemType::MalformedRequest))
    );
    let (_, after) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(
        after["status"]["reports_accepted"],
        json!(2 * M),
        "refused uploads changed nothing"
    );
    // Under `fo` a record may not name an attribute.
    let created: Value = reqwest::Client::new()
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&create_body())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (s, v) = post_raw(
        &format!(
            "{base}/v1/collections/{}/parties/bank/records",
            created["id"].as_str().unwrap()
        ),
        created["party_tokens"]["bank"].as_str().unwrap(),
        json!({"records": [{"id": fresh.id, "attribute": 0, "codes": [0, 0]}]}),
    )
    .await;
    assert_eq!(
        (s, problem_kind(&v)),
        (400, Some(ProblemType::InvalidPayload)),
        "{v}"
    );
    server.shutdown().await.unwrap();
}

/// Encoding `sketch+locmrf` (VertiMRF as published) over HTTP: each party uploads its local
/// model and one sketch report and no record. A report is checked against the config (party,
/// parameters, sketch bins) and stored once; an identical resend is `200`, another report of
/// the party `409`, a report under another key than the stored ones `409`; records are
/// refused `409`; finalize answers `409` until every party's model and report are in. Every
/// refusal changes nothing. At N people the create is refused (sound sketch parameters need
/// more phantoms than people); the uploads are checked on a collection declared for 10⁹.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sketch_uploads_are_checked_and_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    sketch_uploads(&format!("sqlite://{}", dir.path().join("k.db").display())).await;
}

/// The same on PostgreSQL (the reports are stored behind the ingest barrier and the
/// collection's advisory lock there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sketch_uploads_on_postgres() {
    if let Some(url) = ldpsyn_tests::postgres_url("sketch_uploads_on_postgres") {
        sketch_uploads(&url).await;
    }
}

async fn sketch_uploads(database_url: &str) {
    use ldpsyn_engine::central::measure_local_model;
    use ldpsyn_engine::measure::sketch::{SketchKey, encode_party};
    use ldpsyn_engine::protocols::cross_party::SketchUpload;
    use ldpsyn_engine::protocols::vertical::{ResolvedParty, Vertical};

    let server = start(database_url, &[]).await;
    let base = base(&server);
    let mut body = create_body();
    body["encoding"] = json!("sketch+locmrf");
    body["sketch"] = json!({"repetitions": 500});
    for p in body["parties"].as_array_mut().unwrap() {
        p["locmrf"] = json!({"epsilon": 1.0, "delta": 1e-6});
    }
    let (status, refused) = post_raw(&format!("{base}/v1/collections"), ADMIN, body.clone()).await;
    assert_eq!(status, 400, "{refused}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("phantom") && detail.contains("sampled+locmrf"),
        "{refused}"
    );
    body["target_users"] = json!(1_000_000_000u64);
    let (status, created) = post_raw(&format!("{base}/v1/collections"), ADMIN, body).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["encoding"], "sketch+locmrf", "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let token = |p: &str| created["party_tokens"][p].as_str().unwrap().to_owned();
    let url = |p: &str, route: &str| format!("{base}/v1/collections/{id}/parties/{p}/{route}");

    // Bank's view of the collection, as `party upload` builds it.
    let bank = PartyClient::connect(
        &base,
        id.parse().unwrap(),
        "bank",
        &token("bank"),
        ClientOptions::new(Epsilon::new(10.0).unwrap()),
    )
    .await
    .unwrap();
    let config = bank.randomizer().config().clone();
    let ldpsyn::wire::Protocol::Vertical(params) = &config.protocol else {
        unreachable!()
    };
    let vertical = Vertical::new(params, &config.schema).unwrap();
    let people = population(N, 11);
    let ids: Vec<String> = (0..N).map(|i| format!("c{i}")).collect();
    let secret = [7u8; 32];
    let sketch = |p: usize, key: &SketchKey, seed: u64| {
        let party = &vertical.parties()[p];
        let sizes: Vec<u32> = party
            .attributes
            .iter()
            .map(|&a| vertical.sketch_bin_count(a) as u32)
            .collect();
        let rows = people.iter().zip(&ids).map(|(r, i)| {
            let codes: Vec<u32> = party
                .attributes
                .iter()
                .map(|&a| ldpsyn::factor::bin_of(r[a], &vertical.sketch_cuts(a)))
                .collect();
            (i.as_bytes(), codes)
        });
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
        let report = encode_party(
            &vertical.sketch_params(p).unwrap(),
            key,
            &sizes,
            rows,
            &mut rng,
        )
        .unwrap();
        serde_json::to_value(SketchUpload {
            party: party.name.clone(),
            report,
        })
        .unwrap()
    };
    // A fixed context, not the collection id (random per run): the sketches, and so the
    // model, are the same in every run.
    let key = SketchKey::derive(&secret, b"sketch test").unwrap();
    let bank_sketch = sketch(0, &key, 1);
    let clinic_sketch = sketch(1, &key, 2);

    // Under this encoding no party uploads records.
    let (s, v409) = post_raw(
        &url("bank", "records"),
        &token("bank"),
        json!({"records": [{"id": "a".repeat(64), "codes": [0, 0]}]}),
    )
    .await;
    assert_eq!(
        (s, problem_kind(&v409)),
        (409, Some(ProblemType::Conflict)),
        "{v409}"
    );
    let finalize_path = format!("/v1/collections/{id}/finalize");
    let finalize = || admin(&base, "POST", &finalize_path);
    let (s, f) = finalize().await;
    assert_eq!(s, 409, "{f}");
    for (what, route_party, tok, body, code, kind) in [
        (
            "another party's token",
            "bank",
            token("clinic"),
            bank_sketch.clone(),
            401,
            ProblemType::Unauthorized,
        ),
        (
            "another party's report",
            "bank",
            token("bank"),
            clinic_sketch.clone(),
            400,
            ProblemType::InvalidParameter,
        ),
        (
            "another party's bins",
            "bank",
            token("bank"),
            {
                let mut b = clinic_sketch.clone();
                b["party"] = json!("bank");
                b
            },
            400,
            ProblemType::InvalidParameter,
        ),
        (
            "other parameters",
            "bank",
            token("bank"),
            {
                let mut b = bank_sketch.clone();
                b["report"]["params"]["count_epsilon"] = json!(0.5);
                b
            },
            400,
            ProblemType::InvalidParameter,
        ),
        (
            "a truncated sketch array",
            "bank",
            token("bank"),
            {
                let mut b = bank_sketch.clone();
                let t = b["report"]["sketches"].as_str().unwrap()[4..].to_owned();
                b["report"]["sketches"] = json!(t);
                b
            },
            400,
            ProblemType::MalformedRequest,
        ),
        (
            "raw records",
            "bank",
            token("bank"),
            json!({"party": "bank", "records": [{"id": "c1", "codes": [0, 1]}]}),
            400,
            ProblemType::MalformedRequest,
        ),
    ] {
        let (s, v) = post_raw(&url(route_party, "sketch"), &tok, body).await;
        assert_eq!((s, problem_kind(&v)), (code, Some(kind)), "{what}: {v}");
    }
    // Stored once: 201, an identical resend 200, another report of the party 409.
    let (s, v) = post_raw(&url("bank", "sketch"), &token("bank"), bank_sketch.clone()).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["stored"], json!(true));
    assert_eq!(v["sketches"], json!(500 * (4 + 2)), "{v}");
    let (s, v) = post_raw(&url("bank", "sketch"), &token("bank"), bank_sketch.clone()).await;
    assert_eq!((s, v["stored"].clone()), (200, json!(false)), "{v}");
    let (s, v) = post_raw(&url("bank", "sketch"), &token("bank"), sketch(0, &key, 3)).await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::Conflict)),
        "{v}"
    );
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("another sketch report"),
        "{v}"
    );
    // Clinic under a key of another collection: it could not be merged with bank's.
    let other = SketchKey::derive(&secret, b"another collection").unwrap();
    let (s, v) = post_raw(
        &url("clinic", "sketch"),
        &token("clinic"),
        sketch(1, &other, 2),
    )
    .await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::Conflict)),
        "{v}"
    );
    assert!(v["detail"].as_str().unwrap().contains("same key"), "{v}");

    // The local models; finalize still waits for clinic's report.
    let dims = ldpsyn_tests::schema().domain_sizes();
    for (p, party) in vertical.parties().iter().enumerate() {
        let resolved = ResolvedParty {
            name: party.name.clone(),
            attributes: party.attributes.clone(),
            locmrf: party.locmrf,
        };
        let codes: Vec<u32> = people
            .iter()
            .flat_map(|r| party.attributes.iter().map(|&a| r[a]))
            .collect();
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(20 + p as u64);
        let model = measure_local_model(&resolved, &dims, &codes, 2, &mut rng).unwrap();
        let (s, answer) = post_raw(
            &url(&party.name, "model"),
            &token(&party.name),
            serde_json::to_value(&model).unwrap(),
        )
        .await;
        assert_eq!(s, 201, "{answer}");
    }
    let (s, f) = finalize().await;
    assert_eq!(s, 409, "{f}");
    assert!(f["detail"].as_str().unwrap().contains("clinic"), "{f}");
    let (s, v) = post_raw(
        &url("clinic", "sketch"),
        &token("clinic"),
        clinic_sketch.clone(),
    )
    .await;
    assert_eq!(s, 201, "{v}");

    let (s, f) = finalize().await;
    assert_eq!(s, 200, "{f}");
    let (_, model) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
    // The model is built; its cross-party tables come from sketches whose sound parameters
    // (millions of phantoms) hide a population of N, so no dependency is asserted.
    assert!(model["model"]["model_graph"].is_array(), "{model}");
    // Finalized: uploads are refused, and changed nothing.
    let (s, v) = post_raw(&url("clinic", "sketch"), &token("clinic"), clinic_sketch).await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::CollectionFinalized)),
        "{v}"
    );
    // A collection of another encoding has no sketch route.
    let (s, fo) = post_raw(&format!("{base}/v1/collections"), ADMIN, create_body()).await;
    assert_eq!(s, 201, "{fo}");
    let fo_url = format!(
        "{base}/v1/collections/{}/parties/bank/sketch",
        fo["id"].as_str().unwrap()
    );
    let (s, v) = post_raw(
        &fo_url,
        fo["party_tokens"]["bank"].as_str().unwrap(),
        bank_sketch,
    )
    .await;
    assert_eq!(
        (s, problem_kind(&v)),
        (409, Some(ProblemType::Conflict)),
        "{v}"
    );
}

/// A create request without `encoding` gets `sampled+locmrf`, and one `budget` per person
/// with the parties' attributes named only is split by the server: each party an equal
/// share, 20% of it to its local model with the party's whole δ, the rest to every attribute
/// (a record reports one of them), δ = 1/target_users by default, and
/// the view's composed ε and δ are the budget's; the stored config (encoding and budget) is
/// the same after a restart. Requests that cannot be split, or that mix a budget with parts
/// it would set, are 400 problems that create nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_budget_is_split_by_the_server_and_sampled_reports_are_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("b.db").display());
    let server = start(&db, &[]).await;
    let base = base(&server);
    let url = format!("{base}/v1/collections");
    let named = json!([
        {"name": "bank", "attributes": ["region", "smoker"]},
        {"name": "clinic", "attributes": ["income", "lung", "shoe"]}]);
    let body = json!({"schema": schema_json(), "protocol": "vertical", "target_users": N,
                      "parties": named, "budget": {"epsilon": 1.6}});
    let (status, created) = post_raw(&url, ADMIN, body.clone()).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["encoding"], "sampled+locmrf", "{created}");
    let delta = 1.0 / N as f64;
    assert_eq!(
        created["budget"],
        json!({"epsilon": 1.6, "delta": delta}),
        "{created}"
    );
    assert!((created["composed_epsilon"].as_f64().unwrap() - 1.6).abs() < 1e-12);
    assert!((created["composed_delta"].as_f64().unwrap() - delta).abs() < 1e-18);
    // The collection's ε is the largest party total: 0.8 each.
    assert!(
        (created["epsilon"].as_f64().unwrap() - 0.8).abs() < 1e-12,
        "{created}"
    );
    assert!(
        created.get("sketch").is_none_or(Value::is_null),
        "{created}"
    );
    for p in 0..2 {
        let party = &created["parties"][p];
        assert!((party["locmrf"]["epsilon"].as_f64().unwrap() - 0.16).abs() < 1e-12);
        assert_eq!(party["locmrf"]["delta"], delta / 2.0, "{party}");
        for a in party["attributes"].as_array().unwrap() {
            assert!(
                (a["epsilon"].as_f64().unwrap() - 0.64).abs() < 1e-12,
                "{party}"
            );
        }
    }
    let id = created["id"].as_str().unwrap().to_owned();

    // `fo` under a budget: no δ spent, every attribute's ε from `split_epsilon`.
    let mut fo = body.clone();
    fo["encoding"] = json!("fo");
    fo["budget"] = json!({"epsilon": 1.6, "delta": 1e-7, "locmrf_share": 0.3});
    let (status, made) = post_raw(&url, ADMIN, fo).await;
    assert_eq!(status, 201, "{made}");
    assert!(made.get("composed_delta").is_none(), "{made}");
    assert!(made["parties"][0].get("locmrf").is_none(), "{made}");
    assert!((made["composed_epsilon"].as_f64().unwrap() - 1.6).abs() < 1e-12);

    let refused = [
        (json!({"epsilon": 2.0}), "leave `epsilon` out"),
        (json!({"budget": {"epsilon": 0.02}}), "does not split"),
        (
            json!({"budget": {"epsilon": 1.6, "delta": 2.0}}),
            "does not split",
        ),
        (json!({"budget": {"epsilon": 1.6, "share": 0.5}}), "budget"),
        (json!({"budget": 3}), "must be an object"),
        (
            json!({"encoding": "sketch+locmrf", "sketch": {"delta": 1e-9}}),
            "sets `sketch.delta`",
        ),
        (json!({"encoding": "gzip"}), "`encoding` must be"),
        (json!({"parties": create_body()["parties"]}), "by name only"),
        (
            json!({"parties": [{"name": "bank", "attributes": ["region", "smoker", "tail"]},
                                {"name": "clinic", "attributes": ["income", "lung", "shoe"]}]}),
            "`tail` is not in the schema",
        ),
    ];
    for (change, needle) in refused {
        let mut bad = body.clone();
        bad.as_object_mut()
            .unwrap()
            .extend(change.as_object().unwrap().clone());
        let (status, problem) = post_raw(&url, ADMIN, bad).await;
        assert_eq!(status, 400, "{change}: {problem}");
        assert_eq!(problem_kind(&problem), Some(ProblemType::InvalidParameter));
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(needle), "{change}: {detail}");
    }
    // Every attribute's ε but no encoding: the default needs local models, and says so.
    let (status, problem) = post_raw(&url, ADMIN, create_body_without_encoding()).await;
    assert_eq!(status, 400, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("sampled+locmrf") && detail.contains("`budget`"),
        "{problem}"
    );
    let (_, listed) = admin(&base, "GET", "/v1/collections").await;
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");

    drop(server);
    let server = start(&db, &[]).await;
    let path = format!("/v1/collections/{id}");
    let (status, again) = admin(&ldpsyn_tests::base(&server), "GET", &path).await;
    assert_eq!(status, 200, "{again}");
    for key in ["encoding", "budget", "parties", "sketch", "composed_delta"] {
        assert_eq!(again[key], created[key], "{key}");
    }
}

/// [`create_body`] as a client that names no encoding would send it.
fn create_body_without_encoding() -> Value {
    let mut body = create_body();
    body.as_object_mut().unwrap().remove("encoding");
    body
}
