//! Embed the SDK: devices report to an aggregator over HTTP, an analyst reads a marginal.
//!
//! Each simulated device does what an app embedding the `ldpsyn` crate (feature `http`) does:
//! `Client::connect` to a collection with its own budget ledger, then `Client::submit` of its
//! record as JSON; the record is randomized on the device and only the randomized report is
//! posted. The operator's side is plain HTTP with the admin token: create the collection,
//! finalize it, read the 2-way marginal `smoker × cough` with its standard errors.
//!
//! ```sh
//! cargo run -p ldpsyn-examples --example embed_sdk                          # self-contained
//! LDPSYN_ADMIN_TOKEN=… cargo run -p ldpsyn-examples --example embed_sdk -- http://127.0.0.1:8080
//! ```
//!
//! Without a URL it starts the aggregator service (`ldpsyn-service`) in this process on a
//! free port of 127.0.0.1, over SQLite in a temporary folder, and stops it at the end; with
//! one it uses that running server (its admin token from `LDPSYN_ADMIN_TOKEN`), which should
//! run with `--rate-limit-per-ip 0`: every simulated device here comes from one address.

use anyhow::{Context, bail};
use clap::Parser;
use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::wire::ReportStatus;
use ldpsyn_service::Server;
use ldpsyn_service::config::ServeConfig;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// Devices, one record each.
const DEVICES: usize = 1_000;
/// Devices submitting at the same time.
const CONCURRENT: usize = 16;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The in-process server lives until the end of `main` (dropped with its folder after
    // the shutdown below).
    let (base, admin, local) = match std::env::args().nth(1) {
        Some(url) => {
            let token = std::env::var("LDPSYN_ADMIN_TOKEN")
                .context("a server URL needs its admin token in LDPSYN_ADMIN_TOKEN")?;
            (url.trim_end_matches('/').to_owned(), token, None)
        }
        None => {
            let dir = tempfile::tempdir()?;
            let admin = "example-admin-token".to_owned();
            let db = format!("sqlite://{}", dir.path().join("ldpsyn.db").display());
            let config = ServeConfig::try_parse_from([
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--database-url",
                &db,
                "--admin-token",
                &admin,
                // Every device comes from 127.0.0.1 here: no per-address rate limit.
                "--rate-limit-per-ip",
                "0",
            ])?;
            let server = Server::start(config).await?;
            (
                format!("http://{}", server.addr()),
                admin,
                Some((server, dir)),
            )
        }
    };
    let http = reqwest::Client::new();

    // The operator: a collection of three attributes at ε = 4 per report.
    let created: Value = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(&admin)
        .json(&json!({
            "name": "embed_sdk example",
            "schema": {"attributes": [
                {"name": "age", "type": "numeric", "min": 18, "max": 90, "bins": 6,
                 "integer": true},
                {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]},
                {"name": "cough", "type": "categorical", "labels": ["no", "yes"]}
            ]},
            "protocol": "auto", "epsilon": 4.0, "target_users": DEVICES,
            "auto_finalize_at_target": false
        }))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let collection: uuid::Uuid = created["id"].as_str().context("no id")?.parse()?;
    println!("collection {collection} at {base}");

    // The devices: a smoker coughs more often. Each device is one `Client` with its own
    // ledger (on a phone, a `FileLedger` in the app's storage).
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(7);
    // The people's true smoker × cough counts, to compare with the estimate.
    let mut truth = [0usize; 4];
    let records: Vec<Value> = (0..DEVICES)
        .map(|_| {
            let smoker = rng.random_bool(0.3);
            let cough = rng.random_bool(if smoker { 0.6 } else { 0.15 });
            truth[2 * usize::from(smoker) + usize::from(cough)] += 1;
            json!({
                "age": rng.random_range(18..=90),
                "smoker": if smoker { "yes" } else { "no" },
                "cough": if cough { "yes" } else { "no" },
            })
        })
        .collect();
    let mut workers = tokio::task::JoinSet::new();
    for chunk in records.chunks(DEVICES.div_ceil(CONCURRENT)) {
        let (chunk, base) = (chunk.to_vec(), base.clone());
        workers.spawn(async move {
            let mut accepted = 0;
            for record in chunk {
                let options = ClientOptions::new(Epsilon::new(4.0)?);
                let mut device =
                    Client::connect(&base, collection, options, MemoryLedger::default()).await?;
                let receipt = device.submit(&record).await?;
                accepted += usize::from(receipt.status == ReportStatus::Accepted);
            }
            anyhow::Ok(accepted)
        });
    }
    let mut accepted = 0;
    while let Some(done) = workers.join_next().await {
        accepted += done??;
    }
    println!("{accepted} of {DEVICES} reports accepted");
    if accepted != DEVICES {
        bail!("every device's report should be accepted");
    }

    // The analyst: finalize, then the marginal with ±1.96 standard errors.
    // 200 with the model, or 202 while a long fit goes on: then its `Location` answers
    // 409 `model-not-ready` until the model is built.
    http.post(format!("{base}/v1/collections/{collection}/finalize"))
        .bearer_auth(&admin)
        .send()
        .await?
        .error_for_status()?;
    while http
        .get(format!("{base}/v1/collections/{collection}/model"))
        .bearer_auth(&admin)
        .send()
        .await?
        .status()
        == reqwest::StatusCode::CONFLICT
    {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let m: Value = http
        .get(format!(
            "{base}/v1/collections/{collection}/marginals?attrs=smoker,cough"
        ))
        .bearer_auth(&admin)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    println!("P(smoker, cough): estimate ± 1.96 standard errors (the people's true share)");
    let frequencies = m["frequencies"].as_array().context("no frequencies")?;
    for (i, f) in frequencies.iter().enumerate() {
        let label = |a: usize, code: usize| m["labels"][a][code].as_str().unwrap_or("?");
        println!(
            "  smoker={:<3} cough={:<3} {:.3} ± {:.3}  ({:.3})",
            label(0, i / 2),
            label(1, i % 2),
            f.as_f64().unwrap_or(f64::NAN),
            1.96 * m["std_errors"][i].as_f64().unwrap_or(f64::NAN),
            truth[i] as f64 / DEVICES as f64,
        );
    }
    if let Some((server, _dir)) = local {
        server.shutdown().await?;
    }
    Ok(())
}
