//! Provisional estimates while collecting (issue 36 item 7), over real HTTP: before finalize
//! `…/marginals?provisional=true` and `…/model?provisional=true` answer from a model refitted
//! from the reports so far, labelled provisional, summing to one, with standard errors that
//! shrink as reports grow; without `provisional=true` they stay 409 with a detail that says
//! to pass it; a bad value is a 400 written for a person; refits are cached and shared; and
//! they change nothing: finalize builds the same model, and downloads the same bytes, as a
//! twin server that never served a provisional estimate. SQLite always; PostgreSQL when
//! `LDPSYN_TEST_DATABASE_URL` is set.

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::wire::{PROBLEM_CONTENT_TYPE, ProblemType};
use ldpsyn_service::Server;
use ldpsyn_tests::*;
use serde_json::{Value, json};
use uuid::Uuid;

/// A GET with the admin token: status, content type and JSON body.
async fn get(base: &str, path: &str) -> (u16, String, Value) {
    let resp = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let kind = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, kind, resp.json().await.unwrap_or(Value::Null))
}

/// `n` people of seed `people_seed` report to `id` through one client of seed `device_seed`;
/// returns once the rounds their reports closed have landed.
async fn feed(base: &str, id: Uuid, n: usize, people_seed: u64, device_seed: u64) {
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), device_seed);
    let mut client = Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    let mut who = people(&schema(), n, people_seed);
    for chunk in who.chunks_mut(1000) {
        for r in client.submit_batch(chunk).await.unwrap() {
            r.expect("accepted");
        }
        // The next chunk draws its tasks from the state its reports' closes left.
        rounds_settled(base, id).await;
    }
}

/// The frequencies and standard errors of a provisional marginal, checked for what every
/// provisional answer holds: labelled, `reports` as counted, sums to one, and standard
/// errors where a table measured all of `attrs` (every 1-way: always).
async fn provisional_marginal(
    base: &str,
    id: Uuid,
    attrs: &str,
    reports: u64,
) -> (Vec<f64>, Option<Vec<f64>>) {
    let (s, _, m) = get(
        base,
        &format!("/v1/collections/{id}/marginals?attrs={attrs}&provisional=true"),
    )
    .await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(m["provisional"], true, "{m}");
    assert_eq!(m["reports"], reports, "{m}");
    assert!(
        m["fitted_at"].as_i64().is_some_and(|t| t > 1_700_000_000),
        "{m}"
    );
    let f: Vec<f64> = serde_json::from_value(m["frequencies"].clone()).unwrap();
    let total: f64 = f.iter().sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "{attrs}: frequencies sum to {total}"
    );
    assert!(f.iter().all(|&x| x >= 0.0), "{m}");
    let se: Option<Vec<f64>> = serde_json::from_value(m["std_errors"].clone()).unwrap();
    assert!(
        se.is_some() || attrs.contains(','),
        "a 1-way without standard errors: {m}"
    );
    if let Some(se) = &se {
        assert_eq!(se.len(), f.len());
        assert!(se.iter().all(|&x| x.is_finite() && x > 0.0), "{m}");
    }
    (f, se)
}

async fn flow(db_url: &str) {
    // Every request refits when reports came in since the last refit.
    let server = start(db_url, &["--provisional-refresh-ms", "0"]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "auto", "epsilon": 4.0, "target_users": 100_000}),
    )
    .await;
    let handle = server.state().collection(id).await.unwrap();

    // Nothing collected: nothing to estimate, said in words.
    let (s, kind, p) = get(
        &base,
        &format!("/v1/collections/{id}/marginals?attrs=region&provisional=true"),
    )
    .await;
    assert_eq!((s, kind.as_str()), (409, PROBLEM_CONTENT_TYPE), "{p}");
    assert_eq!(p["type"], ProblemType::Conflict.uri(), "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("no reports collected yet"),
        "{p}"
    );

    feed(&base, id, 2_000, 1, 2).await;
    let (_, _, before) = get(&base, &format!("/v1/collections/{id}")).await;
    let version = handle.state_version();

    // Without `provisional=true`: 409 saying how to get an estimate now.
    for path in ["marginals?attrs=region", "model"] {
        let (s, kind, p) = get(&base, &format!("/v1/collections/{id}/{path}")).await;
        assert_eq!(
            (s, kind.as_str()),
            (409, PROBLEM_CONTENT_TYPE),
            "{path}: {p}"
        );
        assert_eq!(p["type"], ProblemType::ModelNotReady.uri(), "{p}");
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("pass `provisional=true`"),
            "{path}: {p}"
        );
    }

    // Provisional: labelled, summing to one, with error bars, 1-way and 2-way.
    let (_, se_small) = provisional_marginal(&base, id, "region", 2_000).await;
    provisional_marginal(&base, id, "region,income", 2_000).await;
    let (s, _, m) = get(
        &base,
        &format!("/v1/collections/{id}/model?provisional=true"),
    )
    .await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(
        (&m["provisional"], &m["reports"]),
        (&json!(true), &json!(2_000))
    );
    assert_eq!(m["attributes"][0], "region");
    assert!(m["model"]["rounds"].is_array(), "{m}");
    // Nothing new came in: the three answers came from one refit, whatever its age.
    assert_eq!(handle.provisional().refits(), 1);

    // Bad values of `provisional`: 400 in words, on both routes.
    for (path, value) in [
        ("marginals?attrs=region&provisional=", "yes"),
        ("marginals?attrs=region&provisional=", "1"),
        ("model?provisional=", "TRUE"),
    ] {
        let (s, kind, p) = get(&base, &format!("/v1/collections/{id}/{path}{value}")).await;
        assert_eq!((s, kind.as_str()), (400, PROBLEM_CONTENT_TYPE), "{p}");
        assert_eq!(p["type"], ProblemType::InvalidParameter.uri());
        assert_eq!(
            p["detail"],
            format!(
                "`provisional={value}` is not allowed: `provisional` takes `true` (before \
                 finalize, a model refitted from the reports so far) or `false`; default \
                 `false`"
            )
        );
    }

    // Refits read a snapshot: the collection's state and status are as they were.
    let (_, _, after) = get(&base, &format!("/v1/collections/{id}")).await;
    assert_eq!(before, after);
    assert_eq!(handle.state_version(), version);

    // Ten times the reports: the same code path's error bars shrink (≈ 1/√10 ≈ 0.32).
    feed(&base, id, 18_000, 3, 4).await;
    let (_, se_large) = provisional_marginal(&base, id, "region", 20_000).await;
    let (se_small, se_large) = (se_small.unwrap(), se_large.unwrap());
    eprintln!(
        "region's standard errors: {se_small:.4?} at 2,000 reports, {se_large:.4?} at 20,000"
    );
    for (small, large) in se_small.iter().zip(&se_large) {
        assert!(
            *large < 0.6 * small,
            "standard errors {se_large:?} at 20,000 reports against {se_small:?} at 2,000"
        );
    }
    assert_eq!(handle.provisional().refits(), 2);

    // After finalize `provisional=true` answers the final model, labelled as such.
    let (s, fin) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200, "{fin}");
    let (s, _, m) = get(
        &base,
        &format!("/v1/collections/{id}/marginals?attrs=region&provisional=true"),
    )
    .await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(
        (&m["provisional"], &m["reports"]),
        (&json!(false), &json!(20_000))
    );
    assert!(m.get("fitted_at").is_none(), "{m}");
    let (s, _, m) = get(&base, &format!("/v1/collections/{id}/model")).await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(m["provisional"], false);
    assert_eq!(m["model"], fin["model"]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisional_estimates_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    flow(&format!("sqlite://{}", dir.path().join("p.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisional_estimates_postgres() {
    let Some(url) = postgres_url("provisional_estimates_postgres") else {
        return;
    };
    flow(&url).await;
}

/// Within the refresh interval (an hour here, so that no timing is involved) concurrent
/// requests share one refit and later ones get the cached model, even after more reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisional_refits_are_shared_and_cached() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("c.db").display());
    let server = start(&db, &["--provisional-refresh-ms", "3600000"]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "independence", "epsilon": 4.0, "target_users": 10_000}),
    )
    .await;
    let handle = server.state().collection(id).await.unwrap();
    feed(&base, id, 500, 5, 6).await;
    let asks: Vec<_> = ["region", "income", "smoker", "lung", "shoe", "region,lung"]
        .into_iter()
        .map(|attrs| {
            let base = base.clone();
            tokio::spawn(async move { provisional_marginal(&base, id, attrs, 500).await })
        })
        .collect();
    for a in asks {
        a.await.unwrap();
    }
    assert_eq!(
        handle.provisional().refits(),
        1,
        "one refit for six requests"
    );
    feed(&base, id, 500, 7, 8).await;
    // Within the interval: the cached model of 500 reports, no refit.
    provisional_marginal(&base, id, "region", 500).await;
    assert_eq!(handle.provisional().refits(), 1);
    server.shutdown().await.unwrap();
}

/// A server whose tasks come from the seeded stream `seed` (as `demo` runs it).
async fn seeded_server(db: &str, seed: u64) -> Server {
    let mut config = test_config(db, &["--provisional-refresh-ms", "0"]);
    config.task_seed = Some(seed);
    Server::start(config).await.expect("server starts")
}

/// Two servers with the same task stream take the same people's reports in the same order;
/// one is asked for provisional estimates after every batch, the other never. Their states
/// stay equal, and finalize builds the same model and the same synthetic bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisional_refits_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let asked = seeded_server(
        &format!("sqlite://{}", dir.path().join("a.db").display()),
        9,
    )
    .await;
    let quiet = seeded_server(
        &format!("sqlite://{}", dir.path().join("b.db").display()),
        9,
    )
    .await;
    let body = json!({"protocol": "auto", "epsilon": 4.0, "target_users": 20_000});
    let (a, b) = (base(&asked), base(&quiet));
    let (ida, idb) = (create(&a, body.clone()).await, create(&b, body).await);
    for batch in 0..6u64 {
        feed(&a, ida, 1_000, 20 + batch, 40 + batch).await;
        feed(&b, idb, 1_000, 20 + batch, 40 + batch).await;
        let reports = 1_000 * (batch + 1);
        provisional_marginal(&a, ida, "region,income", reports).await;
        let (s, _, m) = get(&a, &format!("/v1/collections/{ida}/model?provisional=true")).await;
        assert_eq!((s, &m["reports"]), (200, &json!(reports)), "{m}");
        let (_, _, va) = get(&a, &format!("/v1/collections/{ida}")).await;
        let (_, _, vb) = get(&b, &format!("/v1/collections/{idb}")).await;
        assert_eq!(va["status"], vb["status"], "after batch {batch}");
    }
    let (sa, fa) = admin(&a, "POST", &format!("/v1/collections/{ida}/finalize")).await;
    let (sb, fb) = admin(&b, "POST", &format!("/v1/collections/{idb}/finalize")).await;
    assert_eq!((sa, sb), (200, 200), "{fa} {fb}");
    assert_eq!(fa["model"], fb["model"]);
    let download = |base: String, id: Uuid| async move {
        reqwest::Client::new()
            .get(format!(
                "{base}/v1/collections/{id}/synthetic?rows=300&seed=3"
            ))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
    };
    assert_eq!(download(a, ida).await, download(b, idb).await);
    asked.shutdown().await.unwrap();
    quiet.shutdown().await.unwrap();
}
