//! Uploads sized by bytes, not only by count (issue 33 item 11), over real HTTP against the
//! real server: the server publishes its upload limits in every collection's public view,
//! and the SDK cuts batches of large OUE reports, and parties' record uploads, into requests
//! that fit them. A report that no request can carry is a typed error, not a retry loop.

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientError, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::{BudgetLedger, MemoryLedger, ReportState};
use ldpsyn::vertical::{PartyClient, PartyRecord, RecordIdKey};
use ldpsyn::wire::{Payload, ReportStatus, UploadLimits};
use ldpsyn_tests::{ADMIN, acknowledged, admin, base, create, start};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// Labels per attribute: the pair's OUE domain is 317² = 100,489 cells.
const K: usize = 317;

/// Two categorical attributes of [`K`] labels each.
fn wide_pair_schema() -> Value {
    let labels = |p: &str| (0..K).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": labels("a")},
        {"name": "b", "type": "categorical", "labels": labels("b")}
    ]})
}

/// `n` simulated people with seeded records over the wide pair.
fn wide_people(n: usize, schema: &ldpsyn::schema::Schema) -> Vec<SimulatedPerson<MemoryLedger>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    (0..n)
        .map(|_| {
            let a = rng.random_range(0..K as u32);
            let b = (a + rng.random_range(0..3)) % K as u32;
            SimulatedPerson {
                record: schema.encoded(vec![a, b]).unwrap(),
                ledger: MemoryLedger::default(),
            }
        })
        .collect()
}

/// A privincr collection over the wide pair: phase 1 asks every person for an OUE report
/// over the 100,489-cell pair (~17 KB of JSON each), so 320 people's reports, well under the
/// 1,000 reports an upload may hold, are ~5.4 MB: more than the default 4 MiB body limit. Every report must land, be counted, and go out in bodies within the published
/// limit (before the split by bytes, the one upload was refused `413 payload-too-large`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oue_reports_over_a_100k_cell_pair_land_in_uploads_within_the_body_limit() {
    const N: usize = 320;
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("w.db").display()),
        &[],
    )
    .await;
    let base = base(&server);
    // A target large enough that round 1's quota is not reached: every task is the pair.
    let id = create(
        &base,
        json!({"schema": wide_pair_schema(), "protocol": "privincr", "epsilon": 1.0,
               "target_users": 1_000_000}),
    )
    .await;
    let (s, view) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(s, 200);
    assert_eq!(
        view["upload_limits"],
        json!({"max_body_bytes": 4_194_304, "max_reports_per_upload": 1000}),
        "the server publishes its limits: {view}"
    );
    let options = ClientOptions::insecure_simulation(Epsilon::new(1.0).unwrap(), 9);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    assert_eq!(*client.upload_limits(), UploadLimits::default());
    let schema = client.schema().clone();
    let mut people = wide_people(N, &schema);
    let results = client.submit_batch(&mut people).await.expect("batch");
    for r in &results {
        assert_eq!(r.as_ref().expect("accepted").status, ReportStatus::Accepted);
    }
    let reports = acknowledged(&people, id);
    assert_eq!(reports.len(), N);
    let bytes = 100_489usize.div_ceil(8);
    for r in &reports {
        assert!(
            matches!(&r.payload, Payload::Oue(b) if b.0.len() == bytes),
            "every report is OUE over the 100,489-cell pair"
        );
    }
    let one_upload = serde_json::to_vec(&reports).unwrap().len();
    assert!(
        one_upload > 4_194_304,
        "in one upload these reports ({one_upload} bytes) exceed the body limit"
    );
    let (_, view) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(view["status"]["reports_accepted"], N, "{}", view["status"]);
}

/// Under a body limit smaller than one OUE report, the report cannot be sent: `submit` and
/// `submit_batch` answer `ReportTooLarge` (problem type `payload-too-large`) at once, post
/// nothing, and keep the report pending in the ledger (its ε is spent; it goes out once the
/// server takes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_larger_than_the_body_limit_is_a_typed_error_and_stays_pending() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("s.db").display()),
        &["--max-body-bytes", "16384"],
    )
    .await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"schema": wide_pair_schema(), "protocol": "privincr", "epsilon": 1.0,
               "target_users": 1_000_000}),
    )
    .await;
    let options = ClientOptions::insecure_simulation(Epsilon::new(1.0).unwrap(), 2);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    assert_eq!(client.upload_limits().max_body_bytes, 16_384);
    let err = client
        .submit(&json!({"a": "a1", "b": "b2"}))
        .await
        .expect_err("too large");
    assert!(
        matches!(err, ClientError::ReportTooLarge { bytes, max_body_bytes: 16_384 } if bytes > 16_384),
        "{err:?}"
    );
    assert_eq!(
        err.problem_type(),
        ldpsyn::wire::ProblemType::PayloadTooLarge
    );
    let entry = client.ledger().get(id).unwrap().expect("recorded");
    assert_eq!(entry.state, ReportState::Pending);
    // Resending hits the same wall, once, without looping.
    assert!(matches!(
        client.submit(&json!({"a": "a1", "b": "b2"})).await,
        Err(ClientError::ReportTooLarge { .. })
    ));

    let schema = client.schema().clone();
    let mut people = wide_people(3, &schema);
    let results = client.submit_batch(&mut people).await.expect("batch call");
    for (r, p) in results.iter().zip(&people) {
        assert!(
            matches!(r, Err(ClientError::ReportTooLarge { .. })),
            "{r:?}"
        );
        assert_eq!(
            p.ledger.get(id).unwrap().unwrap().state,
            ReportState::Pending
        );
    }
    let (_, view) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(view["status"]["reports_accepted"], 0);
}

/// A party's upload of 6,000 records under a 64 KiB body limit (about 500 KB of records)
/// goes out in several requests, each within the limit; every record is stored once, and a
/// resend of all of them is answered as duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_party_upload_is_split_to_the_body_limit() {
    const N: usize = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &format!("sqlite://{}", dir.path().join("p.db").display()),
        &["--max-body-bytes", "65536"],
    )
    .await;
    let base = base(&server);
    let created: Value = reqwest::Client::new()
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&json!({
            "schema": {"attributes": [
                {"name": "x", "type": "categorical", "labels": ["p", "q", "r"]},
                {"name": "y", "type": "categorical", "labels": ["s", "t"]}]},
            "protocol": "vertical", "target_users": N, "encoding": "fo",
            "parties": [
                {"name": "one", "attributes": [{"name": "x", "epsilon": 1.0}]},
                {"name": "two", "attributes": [{"name": "y", "epsilon": 1.0}]}]
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id: uuid::Uuid = created["id"].as_str().unwrap().parse().unwrap();
    let token = created["party_tokens"]["one"].as_str().unwrap();
    let party = PartyClient::connect(
        &base,
        id,
        "one",
        token,
        ClientOptions::new(Epsilon::new(1.0).unwrap()),
    )
    .await
    .unwrap();
    assert_eq!(party.upload_limits().max_body_bytes, 65_536);
    let key = RecordIdKey::new(vec![5; 32]).unwrap();
    let records: Vec<PartyRecord> = (0..N)
        .map(|i| PartyRecord {
            id: key.record_id(&format!("c{i}")),
            attribute: None,
            codes: vec![(i % 3) as u32],
        })
        .collect();
    let body = serde_json::to_vec(&json!({"records": records}))
        .unwrap()
        .len();
    assert!(body > 4 * 65_536, "{body} bytes need several requests");
    let r = party.upload(&records).await.expect("upload");
    assert_eq!((r.accepted, r.duplicate), (N as u64, 0));
    let (_, view) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(view["status"]["reports_accepted"], N, "{}", view["status"]);
    let again = party.upload(&records).await.expect("resend");
    assert_eq!((again.accepted, again.duplicate), (0, N as u64));
}
