//! The dashboard (`GET /ui/`) against a real `ldpsyn-aggregator serve` process: its files load
//! without the admin token while the data calls need it; and, in headless Chromium driven by
//! playwright-core (`dashboard.mjs`), a collection fed through the SDK and finalized is drawn
//! (graph with edges and whole labels, heat maps with colour scales, 1-way bars with error
//! bars, the model check, the rounds of its state and no more), a CSV download works, a
//! collection at its target and finalized by hand calls for finalize and is finalized from the
//! page (its people arrived sorted by region: the drift warning), the independence model's
//! heat map says its standard errors come from a bootstrap of the fit and what they mean, a
//! collection still collecting shows its open round, "k of n pairs still active" with only
//! the dependent ones drawn, and provisional
//! estimates from the reports so far (labelled "provisional (1,000 reports)"), a vertical
//! collection's row names its encoding ("vertical (sampled+locmrf)"); at 1400 and
//! 1024 px no text overflows its box; the token never appears in a URL, and the console stays
//! free of errors. The status's `rounds` are checked here against the protocols' rules and
//! the finalized model's round summaries.
//!
//! The browser test needs `node`, `/usr/bin/chromium` and playwright-core under
//! `$LDPSYN_NPM_DIR/node_modules` (default `~/.cache/ldpsyn/npm`, where `.ci/run` and
//! `wasm-client/test.sh` install it); without them it fails, unless
//! `LDPSYN_ALLOW_MISSING_SERVICES=1` (`common::missing_service`). `LDPSYN_DASHBOARD_SCREENSHOT=docs/dashboard.png` (relative
//! to the repository root) chooses where the screenshots go (default: the test's temporary
//! folder): the finalized collection at 1400 px there, at 1024 px beside it (`-1024.png`), the
//! collecting one at both widths (`-provisional.png`, `-provisional-1024.png`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::schema::Schema;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const ADMIN: &str = "dashboard-admin-token-0123456789";

mod common;

/// Creates a collection of [`schema_json`] named "`protocol` survey" (the page shows the
/// name beside the id: `dashboard.mjs` checks it), finalizing by itself at its target unless
/// `by_hand`; returns its id.
async fn create(
    http: &reqwest::Client,
    base: &str,
    protocol: &str,
    epsilon: f64,
    target_users: usize,
    by_hand: bool,
) -> uuid::Uuid {
    let created: Value = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"schema": schema_json(), "protocol": protocol, "epsilon": epsilon,
                      "target_users": target_users, "name": format!("{protocol} survey"),
                      "auto_finalize_at_target": !by_hand}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["id"].as_str().expect("an id").parse().unwrap()
}

/// Creates a vertical collection of [`schema_json`] in two parties, each with a local-model
/// budget, under `encoding`; returns its id.
async fn create_vertical(http: &reqwest::Client, base: &str, encoding: &str) -> uuid::Uuid {
    let locmrf = json!({"epsilon": 0.5, "delta": 1e-6});
    let parties = json!([
        {"name": "survey", "attributes": [{"name": "region", "epsilon": 1.0},
            {"name": "spoken-language", "epsilon": 1.0}], "locmrf": locmrf},
        {"name": "clinic", "attributes": [{"name": "age", "epsilon": 1.0},
            {"name": "income", "epsilon": 1.0}, {"name": "smoking-status", "epsilon": 1.0}],
         "locmrf": locmrf}]);
    let created = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"schema": schema_json(), "protocol": "vertical", "parties": parties,
                      "encoding": encoding, "target_users": 1000}),
        )
        .send()
        .await
        .unwrap();
    assert!(
        created.status().is_success(),
        "{}",
        created.text().await.unwrap()
    );
    let created: Value = created.json().await.unwrap();
    assert_eq!(created["encoding"], encoding, "{created}");
    created["id"].as_str().expect("an id").parse().unwrap()
}

/// Simulated people with `rows`, in that order, report to `id` through the SDK (seeded).
async fn feed(base: &str, id: uuid::Uuid, rows: Vec<Vec<u32>>, epsilon: f64, seed: u64) {
    let schema: Schema = serde_json::from_value(schema_json()).unwrap();
    let options = ClientOptions::insecure_simulation(Epsilon::new(epsilon).unwrap(), seed);
    let mut client = Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for chunk in rows.chunks(1000) {
        let mut people: Vec<SimulatedPerson<MemoryLedger>> = chunk
            .iter()
            .map(|codes| SimulatedPerson {
                record: schema.encoded(codes.clone()).unwrap(),
                ledger: MemoryLedger::default(),
            })
            .collect();
        for r in client.submit_batch(&mut people).await.unwrap() {
            r.expect("accepted");
        }
    }
}

/// Finalizes `id`; its model must hold an edge.
async fn finalize(http: &reqwest::Client, base: &str, id: uuid::Uuid) {
    let fin = http
        .post(format!("{base}/v1/collections/{id}/finalize"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert!(fin.status().is_success(), "{}", fin.text().await.unwrap());
    let fin: Value = fin.json().await.unwrap();
    let edges = fin["model"]["structure"]["edges"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(edges >= 1, "the model learned no edge: {fin}");
}

async fn serve() -> common::Serve {
    common::serve(ADMIN, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_files_load_without_the_admin_token() {
    let server = serve().await;
    let base = &server.base;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    let r = http.get(format!("{base}/ui")).send().await.unwrap();
    assert_eq!(r.status(), 308);
    assert_eq!(r.headers()["location"], "/ui/");

    let r = http.get(format!("{base}/ui/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"));
    let page = r.text().await.unwrap();
    assert!(page.contains(r#"<script type="module" src="app.js">"#));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no CDN"
    );

    for (file, kind) in [
        ("app.js", "text/javascript"),
        ("api.js", "text/javascript"),
        ("charts.js", "text/javascript"),
        ("style.css", "text/css"),
    ] {
        let r = http.get(format!("{base}/ui/{file}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{file}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with(kind), "{file}: {ct}");
        assert!(!r.text().await.unwrap().is_empty());
    }
    let r = http
        .get(format!("{base}/ui/secret.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let r = http
        .get(format!("{base}/ui/..%2Fmain.rs"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // The page's data calls are admin routes.
    let r = http
        .get(format!("{base}/v1/collections"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .get(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Five attributes, two strong dependencies (region → spoken-language, age → income) and
/// one independent attribute. The long names sit at the graph's right and left edges
/// (`dashboard.mjs` checks that they are drawn whole).
fn schema_json() -> Value {
    json!({"attributes": [
        {"name": "region", "type": "categorical", "labels": ["north", "south", "east", "west"]},
        {"name": "spoken-language", "type": "categorical", "labels": ["en", "es", "fr", "de"]},
        {"name": "age", "type": "numeric", "min": 20, "max": 80, "bins": 6, "integer": true},
        {"name": "income", "type": "numeric", "min": 0, "max": 100000, "bins": 6, "points": [0]},
        {"name": "smoking-status", "type": "categorical", "labels": ["no", "yes"]}
    ]})
}

/// The JSON an admin GET of `url` answers.
async fn admin_get(http: &reqwest::Client, url: &str) -> Value {
    http.get(url)
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The `status.rounds` of collection `id` as `(round, kind, state)`.
async fn rounds(http: &reqwest::Client, base: &str, id: uuid::Uuid) -> Vec<(u64, String, String)> {
    let c = admin_get(http, &format!("{base}/v1/collections/{id}")).await;
    c["status"]["rounds"]
        .as_array()
        .unwrap_or_else(|| panic!("no rounds: {c}"))
        .iter()
        .map(|r| {
            (
                r["round"].as_u64().unwrap(),
                r["kind"].as_str().unwrap().to_owned(),
                r["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The rounds each collection's state holds: `auto` ran its 1-ways, its screening round and
/// phase 2, the rounds its model summarizes, and no more; PrivIncr (its numeric attributes
/// have fixed bins: no round of 1-ways) is in round 1 of its 6 pair rounds, phase 2 to come.
async fn check_rounds(http: &reqwest::Client, base: &str, finalized: uuid::Uuid, live: uuid::Uuid) {
    let r = |round: u64, kind: &str, state: &str| (round, kind.to_owned(), state.to_owned());
    let ran = rounds(http, base, finalized).await;
    assert_eq!(
        ran,
        [
            r(0, "one_ways", "closed"),
            r(1, "screening", "closed"),
            r(2, "phase2", "closed")
        ]
    );
    let model = admin_get(http, &format!("{base}/v1/collections/{finalized}/model")).await;
    let summarized: Vec<u64> = model["model"]["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["round"].as_u64().unwrap())
        .collect();
    assert_eq!(summarized, ran.iter().map(|x| x.0).collect::<Vec<_>>());
    let mut expected = vec![r(0, "pairs", "closed"), r(1, "pairs", "open")];
    expected.extend((2..6).map(|t| r(t, "pairs", "planned")));
    expected.push(r(6, "phase2", "planned"));
    // Round 0 closes at its quota off the request path: wait for it.
    let started = Instant::now();
    let mut got = rounds(http, base, live).await;
    while got != expected && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = rounds(http, base, live).await;
    }
    assert_eq!(got, expected);
}

/// Codes of `n` people from the planted model (seeded).
fn population(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let region = rng.random_range(0..4u32);
            let language = if rng.random_bool(0.85) {
                region
            } else {
                rng.random_range(0..4u32)
            };
            let age = rng.random_range(0..6u32);
            // Code 6 is the point mass at 0 (no income), drawn at the axis's left end.
            let income = if rng.random_bool(0.15) {
                6
            } else if rng.random_bool(0.85) {
                age
            } else {
                rng.random_range(0..6u32)
            };
            let smoker = u32::from(rng.random_bool(0.3));
            vec![region, language, age, income, smoker]
        })
        .collect()
}

/// Where playwright-core is installed, or why the browser test cannot run here.
fn browser_setup() -> Result<PathBuf, String> {
    let npm = std::env::var_os("LDPSYN_NPM_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ldpsyn/npm")))
        .ok_or("no LDPSYN_NPM_DIR and no HOME")?;
    if !npm.join("node_modules/playwright-core").is_dir() {
        return Err(format!(
            "no playwright-core in {} (npm install --prefix {} playwright-core)",
            npm.display(),
            npm.display()
        ));
    }
    if !std::path::Path::new("/usr/bin/chromium").exists() {
        return Err("no /usr/bin/chromium (apt-get install chromium)".into());
    }
    match Command::new("node").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(npm),
        _ => Err("no node".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_renders_a_finalized_collection_in_headless_chromium() {
    let npm = match browser_setup() {
        Ok(npm) => npm,
        Err(why) => {
            common::missing_service(
                "dashboard_renders_a_finalized_collection_in_headless_chromium",
                &why,
            );
            return;
        }
    };
    let server = serve().await;
    let base = server.base.clone();
    let http = reqwest::Client::new();

    // A collection fed through the SDK by simulated people, then finalized; another whose
    // people arrive sorted by region (each round measures other regions), finalized.
    let n = 12_000;
    let id = create(&http, &base, "auto", 4.0, n, false).await;
    feed(&base, id, population(n, 3), 4.0, 7).await;
    finalize(&http, &base, id).await;
    // At its target but finalized by hand: the page calls for it, and the test finalizes it
    // there.
    let drifted = create(&http, &base, "auto", 4.0, n, true).await;
    let mut sorted = population(n, 5);
    sorted.sort_by_key(|codes| codes[0]);
    feed(&base, drifted, sorted, 4.0, 9).await;

    // A third collection still collecting (privincr, round 0 closed by its quota).
    let live = create(&http, &base, "privincr", 2.0, 10_000, false).await;
    feed(&base, live, population(1000, 4), 2.0, 8).await;
    check_rounds(&http, &base, id, live).await;
    // The independence model measures no pair: its heat maps say why they have no standard
    // errors (finalized by itself at its target).
    let independent = create(&http, &base, "independence", 2.0, 1000, false).await;
    feed(&base, independent, population(1000, 6), 2.0, 10).await;
    let vertical = create_vertical(&http, &base, "sampled+locmrf").await;

    let dir = tempfile::tempdir().unwrap();
    let screenshot = match std::env::var_os("LDPSYN_DASHBOARD_SCREENSHOT") {
        Some(p) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p),
        None => dir.path().join("dashboard.png"),
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dashboard.mjs");
    let log = dir.path().join("node.log");
    let mut node = Command::new("node")
        .arg(script)
        .arg(format!("{base}/ui/"))
        .arg(id.to_string())
        .arg(live.to_string())
        .arg(drifted.to_string())
        .arg(independent.to_string())
        .arg(ADMIN)
        .arg(&screenshot)
        .arg(dir.path().join("profile"))
        .arg(vertical.to_string())
        .env("LDPSYN_NPM_DIR", &npm)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = node.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(180) {
            let _ = node.kill();
            let _ = node.wait();
            panic!(
                "the browser test took over 180 s:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    eprintln!("{said}");
    assert!(status.success(), "the browser test failed:\n{said}");
    assert!(said.contains("[dashboard] OK"), "{said}");
    for suffix in ["", "-1024", "-provisional", "-provisional-1024"] {
        let path = screenshot.with_file_name(format!(
            "{}{suffix}.png",
            screenshot.file_stem().unwrap().to_str().unwrap()
        ));
        assert!(std::fs::metadata(&path).unwrap().len() > 10_000, "{path:?}");
    }
}
