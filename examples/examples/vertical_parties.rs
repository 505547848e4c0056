//! Two parties, one synthetic table: a vertical collection (VertiMRF).
//!
//! A bank holds its customers' `age` and `income`, a clinic the same people's `smoker` and
//! `lung`. Neither sends the other (or the aggregator) a record: both derive each person's
//! pseudonymous record id from a secret key only they share (`RecordIdKey`), randomize every
//! attribute on their side with GRR at its own ε (`PartyRandomizer`), and upload
//! `(record id, codes)` with their party token (`PartyClient`). The aggregator joins the
//! reports by id, so the model learns dependencies across the parties (income–smoker,
//! age–lung) that neither could see alone, and serves one synthetic table of all four
//! attributes.
//!
//! ```sh
//! cargo run -p ldpsyn-examples --example vertical_parties
//! ```
//!
//! The aggregator service (`ldpsyn-service`) runs in this process on a free port of
//! 127.0.0.1, over SQLite in a temporary folder; the parties talk to it over HTTP.

use anyhow::{Context, bail};
use clap::Parser;
use ldpsyn::Epsilon;
use ldpsyn::client::ClientOptions;
use ldpsyn::schema::Value as Field;
use ldpsyn::vertical::{PartyClient, RecordIdKey};
use ldpsyn_service::Server;
use ldpsyn_service::config::ServeConfig;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// People both parties hold.
const PEOPLE: usize = 10_000;

/// One person as the two parties know them.
struct Person {
    customer: String,
    age: i64,
    income: &'static str,
    smoker: &'static str,
    lung: &'static str,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let admin = "example-admin-token";
    let db = format!("sqlite://{}", dir.path().join("ldpsyn.db").display());
    let config = ServeConfig::try_parse_from([
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--database-url",
        &db,
        "--admin-token",
        admin,
    ])?;
    let server = Server::start(config).await?;
    let base = format!("http://{}", server.addr());
    let http = reqwest::Client::new();

    // The operator: which party holds which attribute, and each attribute's ε.
    let created: Value = http
        .post(format!("{base}/v1/collections"))
        .bearer_auth(admin)
        .json(&json!({
            "name": "vertical_parties example",
            "schema": {"attributes": [
                {"name": "age", "type": "numeric", "min": 18, "max": 90, "bins": 4,
                 "integer": true},
                {"name": "income", "type": "categorical", "labels": ["low", "mid", "high"]},
                {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]},
                {"name": "lung", "type": "categorical", "labels": ["ok", "bad"]}
            ]},
            // Per-record GRR reports of every attribute, which the SDK makes; the default
            // encoding, `sampled+locmrf`, has each party report one attribute per record and
            // upload a local model (`ldpsyn-aggregator party upload`).
            "protocol": "vertical", "target_users": PEOPLE, "encoding": "fo",
            "parties": [
                {"name": "bank", "attributes": [
                    {"name": "age", "epsilon": 2.0}, {"name": "income", "epsilon": 2.0}]},
                {"name": "clinic", "attributes": [
                    {"name": "smoker", "epsilon": 2.0}, {"name": "lung", "epsilon": 2.0}]}
            ]
        }))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let collection: uuid::Uuid = created["id"].as_str().context("no id")?.parse()?;
    println!(
        "collection {collection}: ε per party {}, per person over both {}",
        created["party_epsilon"], created["composed_epsilon"]
    );

    // The people: lower income, more smokers; smokers and the old, more bad lungs.
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(11);
    let people: Vec<Person> = (0..PEOPLE)
        .map(|i| {
            let age = rng.random_range(18..=90);
            let (income, p_smoke) = match rng.random_range(0..3) {
                0 => ("low", 0.45),
                1 => ("mid", 0.3),
                _ => ("high", 0.15),
            };
            let smoker = rng.random_bool(p_smoke);
            let p_bad = 0.05 + if smoker { 0.3 } else { 0.0 } + if age > 60 { 0.2 } else { 0.0 };
            Person {
                customer: format!("customer-{i}"),
                age,
                income,
                smoker: if smoker { "yes" } else { "no" },
                lung: if rng.random_bool(p_bad) { "bad" } else { "ok" },
            }
        })
        .collect();

    // The parties' shared secret; the aggregator never sees it, only the ids it derives.
    let mut secret = [0u8; 32];
    rand::rng().fill(&mut secret[..]);
    let key = RecordIdKey::new(secret.to_vec())?;
    for party in ["bank", "clinic"] {
        let token = created["party_tokens"][party]
            .as_str()
            .context("no token")?;
        // The largest ε per person this party accepts to spend (its attributes' sum).
        let options = ClientOptions::new(Epsilon::new(4.0)?);
        let client = PartyClient::connect(&base, collection, party, token, options).await?;
        let fields = |p: &Person| -> Vec<Field> {
            match party {
                "bank" => vec![p.age.into(), p.income.into()],
                _ => vec![p.smoker.into(), p.lung.into()],
            }
        };
        // The privacy RNG of a party: a CSPRNG seeded by the operating system.
        let mut noise = rand::rng();
        // Each party in its own order: records are joined by id, not by position.
        let mut records = people
            .iter()
            .map(|p| {
                Ok(client.randomizer().record(
                    key.record_id(&p.customer),
                    &fields(p),
                    &mut noise,
                )?)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if party == "clinic" {
            records.reverse();
        }
        let answer = client.upload(&records).await?;
        println!("{party}: {} records accepted", answer.accepted);
        if answer.accepted != PEOPLE as u64 {
            bail!("{party}: every record should be accepted once");
        }
    }

    // The analyst: finalize, a cross-party marginal, synthetic rows of all four attributes.
    // 200 with the model, or 202 while a long fit goes on: then its `Location` answers
    // 409 `model-not-ready` until the model is built.
    http.post(format!("{base}/v1/collections/{collection}/finalize"))
        .bearer_auth(admin)
        .send()
        .await?
        .error_for_status()?;
    while http
        .get(format!("{base}/v1/collections/{collection}/model"))
        .bearer_auth(admin)
        .send()
        .await?
        .status()
        == reqwest::StatusCode::CONFLICT
    {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let m: Value = http
        .get(format!(
            "{base}/v1/collections/{collection}/marginals?attrs=income,smoker"
        ))
        .bearer_auth(admin)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    println!("P(smoker = yes | income), bank's attribute × clinic's: estimate (true)");
    let f = |cell: usize| m["frequencies"][cell].as_f64().unwrap_or(f64::NAN);
    for (i, income) in ["low", "mid", "high"].into_iter().enumerate() {
        let of_income: Vec<&Person> = people.iter().filter(|p| p.income == income).collect();
        let true_share =
            of_income.iter().filter(|p| p.smoker == "yes").count() as f64 / of_income.len() as f64;
        let estimate = f(2 * i + 1) / (f(2 * i) + f(2 * i + 1));
        println!("  {income:<4} {estimate:.3} ({true_share:.3})");
    }
    let rows = http
        .get(format!(
            "{base}/v1/collections/{collection}/synthetic?rows=5&seed=1"
        ))
        .bearer_auth(admin)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    println!("synthetic rows:\n{}", rows.trim_end());
    server.shutdown().await?;
    Ok(())
}
