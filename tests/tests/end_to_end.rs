//! End to end over real HTTP with the `ldpsyn` client: create → simulated people submit →
//! rounds close → pruning → finalize → synthetic download; the engine's in-process reduction
//! of the same reports gives the same model. SQLite always; PostgreSQL when
//! `LDPSYN_TEST_DATABASE_URL` is set.

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::wire::{CollectionConfig, ReportStatus};
use ldpsyn_engine::{Engine, Phase};
use ldpsyn_tests::*;
use serde_json::{Value, json};

/// Runs the whole flow against `db_url`.
async fn flow(db_url: &str) {
    let server = start(db_url, &[]).await;
    let base = base(&server);
    // 4800 people: 3 rounds of ⌊0.5·4800/3⌋ = 800 reports, then phase 2. With φ = 0.3
    // PrivIncr's relaxed threshold ℓ = τ − ΔI(η) stays negative until ~10⁶ reports per edge;
    // φ = 2 makes ℓ positive at this size so that pruning happens in a test. Kept open at its
    // target so that its phase after the last round can be checked before the finalize.
    let id = create(
        &base,
        json!({"protocol": "privincr", "epsilon": 4.0, "target_users": 4800, "rounds": 3, "phi": 2.0,
            "auto_finalize_at_target": false}),
    )
    .await;
    let schema = schema();
    let mut people = people(&schema, 4800, 11);
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), 5);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .expect("connect");
    for chunk in people.chunks_mut(1200) {
        let results = client.submit_batch(chunk).await.expect("batch");
        for r in results {
            assert_eq!(r.expect("accepted").status, ReportStatus::Accepted);
        }
        // Each batch in its own round: the close runs after the upload is answered.
        rounds_settled(&base, id).await;
    }
    let (s, v) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(s, 200);
    assert_eq!(v["status"]["reports_accepted"], 4800);
    assert_eq!(v["status"]["phase"], "clique_measurement", "{v}");
    assert_eq!(v["status"]["round"], 3);
    let active = v["status"]["active_edges"].as_array().unwrap().len();
    assert!(active < 10, "pruning removed some of the 10 edges: {v}");

    // Finalize; the model has a structure with the surviving edges.
    let (s, fin) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200, "{fin}");
    let (s, model) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
    assert_eq!(s, 200);
    let edges = model["model"]["edges"].as_array().unwrap();
    assert!(
        edges.iter().any(|e| !e["pruned_in"].is_null()),
        "some edge pruned"
    );

    // Same model from the engine's in-process reduction of the acknowledged reports.
    let reports = acknowledged(&people, id);
    assert_eq!(reports.len(), 4800);
    let config: CollectionConfig = serde_json::from_value({
        let (_, mut v) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
        v.as_object_mut().unwrap().remove("status");
        v
    })
    .unwrap();
    let engine = Engine::new(&config).unwrap();
    let tables = reduce(&engine, &reports);
    let h = server.state().collection(id).await.unwrap();
    assert_eq!(
        tables,
        h.tables_snapshot(),
        "server tables = in-process reduction"
    );
    let state = h.state();
    assert_eq!(state.phase, Phase::Finalized);
    let local = engine.finalize(&state, &tables).unwrap();
    assert_eq!(
        serde_json::to_value(local.describe()).unwrap(),
        model["model"],
        "same model description"
    );
    let (s, marg) = admin(
        &base,
        "GET",
        &format!("/v1/collections/{id}/marginals?attrs=region,income"),
    )
    .await;
    assert_eq!(s, 200, "{marg}");
    let lm = local.frequencies(&[0, 1]).unwrap();
    assert_eq!(marg["frequencies"], json!(lm));
    assert_eq!(marg["labels"][0], json!(["north", "south", "east", "west"]));

    // Synthetic CSV: header, rows, values in the schema; same bytes for the same seed.
    let url = format!("{base}/v1/collections/{id}/synthetic?rows=3000&seed=9&format=csv");
    let http = reqwest::Client::new();
    let a = http.get(&url).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(a.status(), 200);
    let a = a.bytes().await.unwrap();
    let b = http
        .get(&url)
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(a, b, "same seed, same bytes");
    let mut rdr = csv::Reader::from_reader(&a[..]);
    let header: Vec<String> = rdr.headers().unwrap().iter().map(str::to_owned).collect();
    assert_eq!(header, ["region", "income", "smoker", "lung", "shoe"]);
    let mut n = 0;
    for rec in rdr.records() {
        let rec = rec.unwrap();
        assert!(["north", "south", "east", "west"].contains(&&rec[0]));
        let income: f64 = rec[1].parse().unwrap();
        assert!((0.0..=90000.0).contains(&income));
        assert!(["no", "yes"].contains(&&rec[2]));
        assert!(["ok", "bad"].contains(&&rec[3]));
        assert!(["s", "m", "l"].contains(&&rec[4]));
        n += 1;
    }
    assert_eq!(n, 3000);
    // NDJSON parses line by line.
    let nd = http
        .get(format!(
            "{base}/v1/collections/{id}/synthetic?rows=10&seed=1&format=ndjson&numeric=midpoint"
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<Value> = nd
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10);
    assert!(lines[0]["income"].is_number());
    // After finalize: no tasks (409).
    let t = http
        .get(format!("{base}/v1/collections/{id}/task"))
        .send()
        .await
        .unwrap();
    assert_eq!(t.status(), 409);

    // Restart on the same database: the same model from the rebuilt state.
    server.shutdown().await.unwrap();
    let server = start(db_url, &[]).await;
    let base2 = ldpsyn_tests::base(&server);
    let model2 = model_when_ready(&base2, id).await;
    assert_eq!(model2["model"], model["model"]);
    let c = http
        .get(url.replace(&base, &base2))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(c.bytes().await.unwrap(), a, "same bytes after a restart");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("e2e.db").display());
    flow(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_postgres() {
    let Some(url) = postgres_url("end_to_end_postgres") else {
        return;
    };
    flow(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samprivsyn_batches_reweight() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sps.db").display());
    let server = start(&url, &[]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "samprivsyn", "epsilon": 4.0, "target_users": 3000, "batch_size": 1000}),
    )
    .await;
    let schema = schema();
    let mut people = people(&schema, 3000, 3);
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), 1);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for chunk in people.chunks_mut(1000) {
        for r in client.submit_batch(chunk).await.unwrap() {
            r.unwrap();
        }
        // Each batch in its own round: the close runs after the upload is answered.
        rounds_settled(&base, id).await;
    }
    let (_, v) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(v["status"]["round"], 3, "three batches re-weighted: {v}");
    let (s, _) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200);
    let (s, m) = admin(
        &base,
        "GET",
        &format!("/v1/collections/{id}/marginals?attrs=smoker,lung"),
    )
    .await;
    assert_eq!(s, 200, "{m}");
    server.shutdown().await.unwrap();
}

/// `auto` over large domains hands out tasks with bin maps: the SDK reports bins, the server
/// accepts them under the token's maps, reloads them from the database (a second server on
/// the same file), and refuses a report randomized under maps other than the token's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_bin_maps_over_http() {
    use ldpsyn::client::SimulatedPerson;
    use ldpsyn::schema::Schema;
    use ldpsyn::wire::{Report, Task};
    use rand::{Rng, SeedableRng};

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bins.db").display());
    let labels = |n: usize| (0..n).map(|i| format!("v{i}")).collect::<Vec<_>>();
    let schema_json = json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": labels(60)},
        {"name": "b", "type": "categorical", "labels": labels(50)},
        {"name": "c", "type": "categorical", "labels": labels(40)}]});
    let schema: Schema = serde_json::from_value(schema_json.clone()).unwrap();
    let n = 3000;
    let server = start(&url, &[]).await;
    let base = base(&server);
    let id = create(
        &base,
        // Kept open at its target: the restart below rebuilds the tables of an open collection.
        json!({"protocol": "auto", "epsilon": 2.0, "target_users": n, "schema": schema_json,
            "auto_finalize_at_target": false}),
    )
    .await;
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
    // People answer through the SDK: round 0 (every attribute alone) closes after the first
    // thousand, then the screening round's tasks carry bin maps.
    let mut people: Vec<SimulatedPerson<MemoryLedger>> = (0..n)
        .map(|_| {
            let codes = vec![
                rng.random_range(0..60u32),
                rng.random_range(0..50),
                rng.random_range(0..40),
            ];
            SimulatedPerson {
                record: schema.encoded(codes).unwrap(),
                ledger: MemoryLedger::default(),
            }
        })
        .collect();
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 9);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    let (first, rest) = people.split_at_mut(1000);
    for r in client.submit_batch(first).await.unwrap() {
        assert_eq!(r.expect("accepted").status, ReportStatus::Accepted);
    }
    // Round 0's close runs after the quota upload is answered.
    rounds_settled(&base, id).await;
    let (_, tasks) = admin(&base, "GET", &format!("/v1/collections/{id}/task?count=50")).await;
    let tasks: Vec<Task> = serde_json::from_value(tasks).unwrap();
    let binned = tasks
        .iter()
        .find(|t| !t.bins.is_empty())
        .expect("large pairs are screened over bins")
        .clone();
    assert!(binned.bins.iter().any(|b| !b.is_empty()), "{binned:?}");

    // A report randomized under other maps than the token's: refused, nothing stored.
    let (_, config) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    let config: CollectionConfig = serde_json::from_value(config).unwrap();
    let record = schema.encoded(vec![1, 2, 3]).unwrap();
    let mut forged = binned.clone();
    forged.bins = vec![vec![]; forged.factor.len()];
    let report: Report = ldpsyn::submission::randomize_task(
        &config,
        Epsilon::new(2.0).unwrap(),
        &forged,
        &record,
        &mut rng,
    )
    .unwrap();
    let answer: Value = reqwest::Client::new()
        .post(format!("{base}/v1/collections/{id}/reports"))
        .json(&json!([report]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer[0]["status"], "rejected", "{answer}");
    assert!(
        answer[0]["problem"]["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("invalid-payload")),
        "{answer}"
    );

    for chunk in rest.chunks_mut(1000) {
        for r in client.submit_batch(chunk).await.unwrap() {
            assert_eq!(r.expect("accepted").status, ReportStatus::Accepted);
        }
        rounds_settled(&base, id).await;
    }
    let reports = acknowledged(&people, id);
    let engine = Engine::new(&config).unwrap();
    let tables = reduce(&engine, &reports);
    assert!(
        tables.keys().any(|k| !k.bins.is_empty()),
        "some reports answered binned tasks"
    );
    let before = rounds_settled(&base, id).await;
    assert_eq!(before["status"]["reports_accepted"], n, "{before}");
    server.shutdown().await.unwrap();

    // A new server on the same database rebuilds the binned tables and finalizes.
    let server = start(&url, &[]).await;
    let base = ldpsyn_tests::base(&server);
    let (_, after) = admin(&base, "GET", &format!("/v1/collections/{id}")).await;
    assert_eq!(after["status"], before["status"]);
    let (s, fin) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200, "{fin}");
    let (s, model) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
    assert_eq!(s, 200, "{model}");
    server.shutdown().await.unwrap();
}

/// The schema of [`spike_collection`]: numeric `h` (1–30, `bins: "auto"` in 4 working bins:
/// 1–8, 9–15, 16–22, 23–30) and categorical `c`.
fn spike_schema() -> Value {
    json!({"attributes": [
        {"name": "h", "type": "numeric", "min": 1, "max": 30, "bins": "auto", "integer": true,
         "max_bins": 4},
        {"name": "c", "type": "categorical", "labels": ["a", "b"]}]})
}

/// A collection of `protocol` over [`spike_schema`] for `n` people, on a new server;
/// returns the server, its base URL and the collection id.
async fn spike_collection(
    dir: &tempfile::TempDir,
    protocol: &str,
    n: usize,
) -> (ldpsyn_service::Server, String, uuid::Uuid) {
    let url = format!("sqlite://{}", dir.path().join("grid.db").display());
    let server = start(&url, &[]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": protocol, "epsilon": 4.0, "target_users": n, "schema": spike_schema()}),
    )
    .await;
    (server, base, id)
}

/// `n` simulated people whose `h` is 10 for 40% of them and uniform otherwise, with
/// `c = h < 15`, submit to collection `id` through the client; then it is finalized.
async fn submit_spike_population(base: &str, id: uuid::Uuid, n: usize) {
    use ldpsyn::client::SimulatedPerson;
    use ldpsyn::schema::Schema;
    use rand::{Rng, SeedableRng};

    let schema: Schema = serde_json::from_value(spike_schema()).unwrap();
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(4);
    let mut people: Vec<SimulatedPerson<MemoryLedger>> = (0..n)
        .map(|_| {
            let h = if rng.random_bool(0.4) {
                9
            } else {
                rng.random_range(0..30u32)
            };
            SimulatedPerson {
                record: schema.encoded(vec![h, u32::from(h < 15)]).unwrap(),
                ledger: MemoryLedger::default(),
            }
        })
        .collect();
    let options = ClientOptions::insecure_simulation(Epsilon::new(4.0).unwrap(), 2);
    let mut client = Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for chunk in people.chunks_mut(2000) {
        for r in client.submit_batch(chunk).await.unwrap() {
            assert_eq!(r.expect("accepted").status, ReportStatus::Accepted);
        }
    }
    let (s, fin) = admin(base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200, "{fin}");
}

/// Share of `h = 10` in 20,000 synthetic rows of collection `id` downloaded with `query`
/// (e.g. `&numeric=uniform`); every value is a whole number in 1–30.
async fn share_of_10(base: &str, id: uuid::Uuid, query: &str) -> f64 {
    let resp = reqwest::Client::new()
        .get(format!(
            "{base}/v1/collections/{id}/synthetic?rows=20000&seed=3{query}"
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let mut hits = 0;
    for rec in rdr.records() {
        let h: f64 = rec.unwrap()[0].parse().unwrap();
        assert!(h.fract() == 0.0 && (1.0..=30.0).contains(&h), "{h}");
        hits += u32::from(h == 10.0);
    }
    f64::from(hits) / 20_000.0
}

/// The spike's share in the population of [`spike_collection`].
const SPIKE_SHARE: f64 = 0.4 + 0.6 / 30.0;

/// `bins: "auto"` over HTTP: devices encode to the grid, 1-way tasks carry working or
/// sub-bin maps, the model's marginals and the synthetic download are on the grid, and a
/// spike inside a working bin comes back with `numeric=recover` (the default) but not with
/// `numeric=uniform`; a bad `numeric` is a 400 problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numeric_auto_bins_over_http() {
    use ldpsyn::wire::Task;

    let dir = tempfile::tempdir().unwrap();
    let n = 20_000;
    let (server, base, id) = spike_collection(&dir, "independence", n).await;
    let (_, tasks) = admin(
        &base,
        "GET",
        &format!("/v1/collections/{id}/task?count=200"),
    )
    .await;
    let tasks: Vec<Task> = serde_json::from_value(tasks).unwrap();
    let h_maps: std::collections::BTreeSet<Vec<Vec<u32>>> = tasks
        .iter()
        .filter(|t| t.factor == [0])
        .map(|t| t.bins.clone())
        .collect();
    // Working bins of [1, 30] in 4: 1–8, 9–15, 16–22, 23–30; and sub-bins, here every code
    // (at most 8 codes per working bin: no map).
    assert_eq!(
        h_maps,
        [vec![], vec![vec![8, 15, 22]]].into_iter().collect(),
        "{h_maps:?}"
    );
    submit_spike_population(&base, id, n).await;
    let (s, m) = admin(
        &base,
        "GET",
        &format!("/v1/collections/{id}/marginals?attrs=h"),
    )
    .await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(
        m.to_string().matches("\"10\"").count(),
        1,
        "one cell per whole number: {m}"
    );
    let recovered = share_of_10(&base, id, "").await;
    assert!(
        (recovered - SPIKE_SHARE).abs() < 0.05,
        "recover: {recovered}"
    );
    assert!(share_of_10(&base, id, "&numeric=uniform").await < 0.2);
    let bad = reqwest::Client::new()
        .get(format!(
            "{base}/v1/collections/{id}/synthetic?rows=5&numeric=spline"
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert_eq!(
        bad.headers()["content-type"],
        ldpsyn::wire::PROBLEM_CONTENT_TYPE
    );
    server.shutdown().await.unwrap();
}

/// Point masses found over HTTP: `auto` and PrivIncr measure `h` alone in their round 0
/// (PrivIncr in sub-bins only), the service closes it, the spike becomes a working bin of its
/// own (`/model`'s `working_bins`), later tasks carry it in their bin maps (the tokens bind
/// them), and the spike comes back even with `numeric=uniform`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_masses_found_over_http() {
    for protocol in ["auto", "privincr"] {
        let dir = tempfile::tempdir().unwrap();
        let n = 30_000;
        let (server, base, id) = spike_collection(&dir, protocol, n).await;
        submit_spike_population(&base, id, n).await;
        let (s, model) = admin(&base, "GET", &format!("/v1/collections/{id}/model")).await;
        assert_eq!(s, 200, "{model}");
        let model = &model["model"];
        assert_eq!(
            model["working_bins"],
            json!([[8, 9, 10, 15, 22], []]),
            "{protocol}: {model}"
        );
        // Every pair table after round 0 was measured with the spike's bin.
        let rounds = model["rounds"].as_array().expect("rounds");
        let pair_maps: Vec<&Value> = rounds
            .iter()
            .filter(|r| r["round"].as_u64() > Some(0))
            .flat_map(|r| r["factors"].as_array().into_iter().flatten())
            .filter(|t| t["factor"] == json!([0, 1]))
            .map(|t| &t["bins"][0])
            .collect();
        assert!(!pair_maps.is_empty(), "{protocol}: {model}");
        assert!(
            pair_maps
                .iter()
                .all(|m| m.as_array().is_some_and(|c| c.contains(&json!(9)))),
            "{protocol}: {pair_maps:?}"
        );
        for query in ["", "&numeric=uniform"] {
            let share = share_of_10(&base, id, query).await;
            assert!(
                (share - SPIKE_SHARE).abs() < 0.05,
                "{protocol}{query}: {share}"
            );
        }
        server.shutdown().await.unwrap();
    }
}

/// `ldpsyn_synthetic_bytes_total` of the server's `/metrics`.
async fn synthetic_bytes(base: &str) -> u64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("ldpsyn_synthetic_bytes_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the synthetic byte counter is exported")
}

/// A client that reads the start of a 5 M-row download and goes away stops the work: the
/// bytes produced stop growing (a few chunks past what was read), far below the whole table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synthetic_download_stops_when_the_client_goes() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("gone.db").display());
    let server = start(&url, &[]).await;
    let base = base(&server);
    let id = create(
        &base,
        json!({"protocol": "independence", "epsilon": 2.0, "target_users": 500}),
    )
    .await;
    let mut people = people(&schema(), 500, 3);
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 5);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for r in client.submit_batch(&mut people).await.unwrap() {
        r.expect("accepted");
    }
    let (s, _) = admin(&base, "POST", &format!("/v1/collections/{id}/finalize")).await;
    assert_eq!(s, 200);

    let mut resp = reqwest::Client::new()
        .get(format!(
            "{base}/v1/collections/{id}/synthetic?rows=5000000&seed=1"
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut read = 0usize;
    while read < 256 * 1024 {
        read += resp.chunk().await.unwrap().expect("more rows").len();
    }
    drop(resp);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let settled = synthetic_bytes(&base).await;
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    assert_eq!(synthetic_bytes(&base).await, settled, "production goes on");
    // 5 M rows are ≥ 50 MB of CSV; production stopped within a few 2048-row chunks.
    assert!(settled < 8 * 1024 * 1024, "{settled} bytes produced");
    server.shutdown().await.unwrap();
}
