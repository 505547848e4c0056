//! The data parties' CLI (`ldpsyn-aggregator party …`) against a real `serve` process: the
//! operator creates a vertical collection with `collections create`, two parties derive
//! record ids from a shared key and upload their CSVs; a rerun resends the journal; a party
//! that re-randomizes is refused and nothing of its upload is stored.

use std::process::{Command, Output};

use serde_json::{Value, json};

const ADMIN: &str = "party-cli-admin-token-0123";
const N: usize = 600;

mod common;
use common::BIN;

fn run(base: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("LDPSYN_SERVER", base)
        .env_remove("LDPSYN_PARTY_TOKEN")
        .env("LDPSYN_ADMIN_TOKEN", ADMIN)
        .env("LDPSYN_LOG", "warn");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the CLI runs")
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "CLI failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr_failed(out: &Output) -> String {
    assert!(!out.status.success(), "CLI succeeded unexpectedly");
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// `collections --json create` of a vertical collection over the schema file `schema` with
/// `parties` (JSON) for `users` people, plus `extra` arguments; the creation answer.
fn create_vertical(
    base: &str,
    schema: &str,
    parties: &Value,
    users: usize,
    extra: &[&str],
) -> Value {
    let parties = format!("parties={parties}");
    let users = users.to_string();
    let mut args = vec![
        "collections",
        "--json",
        "create",
        "--schema",
        schema,
        "--protocol",
        "vertical",
        "--target-users",
        &users,
        "--param",
        &parties,
    ];
    args.extend(extra);
    serde_json::from_str(&stdout_ok(&run(base, &args, &[]))).unwrap()
}

/// `party upload --quiet` of `party`'s CSV `data` to collection `id` with the key file `key`
/// and the party's `token`, column `customer_id` holding the ids.
fn party_upload(base: &str, id: &str, party: &str, data: &str, key: &str, token: &str) -> Output {
    let args = [
        "party",
        "upload",
        "--collection",
        id,
        "--party",
        party,
        "--data",
        data,
        "--id-column",
        "customer_id",
        "--key-file",
        key,
        "--quiet",
    ];
    run(base, &args, &[("LDPSYN_PARTY_TOKEN", token)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parties_upload_with_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let schema = json!({"attributes": [
        {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
        {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 4},
        {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]}]});
    std::fs::write(path("schema.json"), schema.to_string()).unwrap();
    let parties = json!([
        {"name": "bank", "attributes": [{"name": "sex", "epsilon": 1.0}, {"name": "age", "epsilon": 2.0}]},
        {"name": "telco", "attributes": [{"name": "plan", "epsilon": 3.0}]}]);
    let created = create_vertical(
        &base,
        &path("schema.json"),
        &parties,
        N,
        &["--param", "encoding=\"fo\""],
    );
    // Without `--epsilon` the collection's ε is the largest party total (bank 1 + 2).
    assert_eq!(created["epsilon"], 3.0, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let token = |p: &str| created["party_tokens"][p].as_str().unwrap().to_owned();

    // The parties' files: a shared customer id, different attributes, rows in other orders.
    let mut bank = String::from("customer_id,sex,age\n");
    let mut telco = String::from("plan,customer_id\n");
    for i in 0..N {
        bank.push_str(&format!("c{i},{},{}\n", ["F", "M"][i % 2], (i * 7) % 100));
        let j = N - 1 - i;
        telco.push_str(&format!("{},c{j}\n", ["a", "b", "c"][j % 3]));
    }
    // One telco row the schema refuses (missing plan): not uploaded, counted in a warning.
    telco.push_str(&format!(",c{N}\n"));
    std::fs::write(path("bank.csv"), bank).unwrap();
    std::fs::write(path("telco.csv"), telco).unwrap();
    let key = path("key.hex");
    stdout_ok(&run(&base, &["party", "keygen", "--out", &key], &[]));
    let e = stderr_failed(&run(&base, &["party", "keygen", "--out", &key], &[]));
    assert!(e.contains("exists"), "keygen never overwrites a key: {e}");
    let upload = |party: &str, data: &str, journal: Option<&str>, token: &str| {
        let mut args = vec![
            "party".to_owned(),
            "upload".into(),
            "--collection".into(),
            id.clone(),
            "--party".into(),
            party.into(),
            "--data".into(),
            path(data),
            "--id-column".into(),
            "customer_id".into(),
            "--key-file".into(),
            key.clone(),
            "--quiet".into(),
            "--batch".into(),
            "250".into(),
        ];
        if let Some(j) = journal {
            args.extend(["--journal".into(), path(j)]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&base, &args, &[("LDPSYN_PARTY_TOKEN", token)])
    };
    let out = stdout_ok(&upload("bank", "bank.csv", None, &token("bank")));
    assert!(
        out.contains(&format!("{N} records accepted, 0 already held")),
        "{out}"
    );
    assert!(dir.path().join("bank.csv.bank.journal.jsonl").exists());
    // A rerun resends the journal: every record is a duplicate.
    let out = stdout_ok(&upload("bank", "bank.csv", None, &token("bank")));
    assert!(
        out.contains(&format!("0 records accepted, {N} already held")),
        "{out}"
    );
    // Re-randomizing (a fresh journal) is refused: other codes for held record ids.
    let e = stderr_failed(&upload(
        "bank",
        "bank.csv",
        Some("again.jsonl"),
        &token("bank"),
    ));
    assert!(
        e.contains("record-id-conflict") || e.contains("other codes"),
        "{e}"
    );
    // The wrong party's token, or none, is refused.
    let e = stderr_failed(&upload("telco", "telco.csv", None, &token("bank")));
    assert!(e.contains("unauthorized"), "{e}");
    // That run randomized telco's file into its journal, without the refused row.
    let skipped = format!(
        "1 rows not uploaded, a value refused by the schema (row {}: attribute `plan`",
        N + 2
    );
    assert!(e.contains(&skipped), "{e}");
    let e = stderr_failed(&run(
        &base,
        &[
            "party",
            "upload",
            "--collection",
            &id,
            "--party",
            "telco",
            "--data",
            &path("telco.csv"),
            "--id-column",
            "customer_id",
            "--key-file",
            &key,
        ],
        &[],
    ));
    assert!(e.contains("LDPSYN_PARTY_TOKEN"), "{e}");
    let out = stdout_ok(&upload("telco", "telco.csv", None, &token("telco")));
    assert!(out.contains(&format!("{N} records accepted")), "{out}");

    let status: Value = serde_json::from_str(&stdout_ok(&run(
        &base,
        &["collections", "--json", "status", &id],
        &[],
    )))
    .unwrap();
    assert_eq!(status["status"]["reports_accepted"], json!(2 * N));
    stdout_ok(&run(&base, &["collections", "finalize", &id], &[]));
    let csv = path("synthetic.csv");
    stdout_ok(&run(
        &base,
        &[
            "collections",
            "download",
            &id,
            "--out",
            &csv,
            "--rows",
            "100",
            "--quiet",
        ],
        &[],
    ));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("sex,age,plan"), "{text}");
    assert_eq!(text.lines().count(), 101);
}

/// A `serve` SIGKILLed while a party uploads: the CLI fails, the server restarts on the same
/// database with every acknowledged record, and rerunning the upload resends the journal:
/// each record is then stored exactly once (accepted + already held = all), and a further
/// rerun finds every one held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_party_upload_loses_nothing_acknowledged() {
    const M: usize = 40_000;
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let db = format!("sqlite://{}", path("crash.db"));
    let server = common::serve_on(ADMIN, &db, &[]);
    let schema = json!({"attributes": [
        {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
        {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]}]});
    std::fs::write(path("schema.json"), schema.to_string()).unwrap();
    let parties = json!([
        {"name": "bank", "attributes": [{"name": "sex", "epsilon": 1.0}]},
        {"name": "telco", "attributes": [{"name": "plan", "epsilon": 1.0}]}]);
    let created = create_vertical(
        &server.base,
        &path("schema.json"),
        &parties,
        M,
        &["--epsilon", "1", "--param", "encoding=\"fo\""],
    );
    let id = created["id"].as_str().unwrap().to_owned();
    let token = created["party_tokens"]["bank"].as_str().unwrap().to_owned();
    let mut bank = String::from("customer_id,sex\n");
    for i in 0..M {
        bank.push_str(&format!("c{i},{}\n", ["F", "M"][i % 2]));
    }
    std::fs::write(path("bank.csv"), bank).unwrap();
    let key = path("key.hex");
    stdout_ok(&run(&server.base, &["party", "keygen", "--out", &key], &[]));
    let upload = |base: &str| {
        let mut c = Command::new(BIN);
        c.args(["party", "upload", "--collection", &id, "--party", "bank"])
            .args(["--data", &path("bank.csv"), "--id-column", "customer_id"])
            .args(["--key-file", &key, "--quiet", "--batch", "200"])
            .env("LDPSYN_SERVER", base)
            .env("LDPSYN_PARTY_TOKEN", &token)
            .env("LDPSYN_LOG", "warn");
        c
    };
    let accepted = |base: String| {
        let id = id.clone();
        async move {
            let s: Value = reqwest::Client::new()
                .get(format!("{base}/v1/collections/{id}"))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            s["status"]["reports_accepted"].as_u64().unwrap()
        }
    };

    // Kill the server once a tenth of the records are acknowledged, mid-upload.
    let child = upload(&server.base)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let acked = loop {
        let n = accepted(server.base.clone()).await;
        if n >= M as u64 / 10 {
            break n;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    server.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "the upload outlived the server: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!((acked as usize) < M, "killed mid-upload ({acked} of {M})");

    // Restarted on the same database: the acknowledged records are there.
    let server = common::serve_on(ADMIN, &db, &[]);
    let after = accepted(server.base.clone()).await;
    assert!(
        after >= acked,
        "{after} < {acked} acknowledged before the kill"
    );
    eprintln!("killed with {acked} records acknowledged; {after} after the restart, of {M}");
    // The rerun resends the journal: new ids accepted, the rest already held, once each.
    let out = stdout_ok(&upload(&server.base).output().unwrap());
    assert!(
        out.contains(&format!(
            "{} records accepted, {after} already held",
            M as u64 - after
        )),
        "{out}"
    );
    assert_eq!(accepted(server.base.clone()).await, M as u64);
    let out = stdout_ok(&upload(&server.base).output().unwrap());
    assert!(
        out.contains(&format!("0 records accepted, {M} already held")),
        "{out}"
    );
}

/// Issue 36 item 6: `party upload` to a URL where nothing answers fails with one line that
/// names the URL and asks whether `serve` runs there.
#[test]
fn party_upload_to_nothing_asks_whether_serve_runs() {
    let out = run(
        "http://127.0.0.1:9",
        &[
            "party",
            "upload",
            "--collection",
            "00000000-0000-4000-8000-000000000000",
            "--party",
            "bank",
            "--data",
            "bank.csv",
            "--id-column",
            "id",
            "--key-file",
            "bank.key",
        ],
        &[("LDPSYN_PARTY_TOKEN", "party-token-0123456789")],
    );
    let e = stderr_failed(&out);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("error: ")
            && e.contains("http://127.0.0.1:9/v1/collections/")
            && e.trim_end()
                .ends_with("is `serve` running at http://127.0.0.1:9?"),
        "{e}"
    );
}

/// Issue 67 item 7: without `--max-epsilon` a party accepts at most devices' default cap
/// (`DEFAULT_DEVICE_MAX_EPSILON`, 10), not the collection's declared ε: a collection asking
/// a party for ε 12 is refused before anything is randomized (no journal) or sent (nothing
/// accepted), with the flag to pass; passing it uploads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn party_upload_caps_epsilon_at_the_device_default() {
    assert_eq!(ldpsyn::ledger::DEFAULT_DEVICE_MAX_EPSILON, 10.0);
    let dir = tempfile::tempdir().unwrap();
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let schema = json!({"attributes": [
        {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
        {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]}]});
    std::fs::write(path("schema.json"), schema.to_string()).unwrap();
    let parties = json!([
        {"name": "bank", "attributes": [{"name": "sex", "epsilon": 12.0}]},
        {"name": "telco", "attributes": [{"name": "plan", "epsilon": 1.0}]}]);
    let created = create_vertical(
        &base,
        &path("schema.json"),
        &parties,
        100,
        &["--param", "encoding=\"fo\""],
    );
    assert_eq!(created["epsilon"], 12.0, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let token = created["party_tokens"]["bank"].as_str().unwrap().to_owned();
    let mut bank = String::from("customer_id,sex\n");
    for i in 0..100 {
        bank.push_str(&format!("c{i},{}\n", ["F", "M"][i % 2]));
    }
    std::fs::write(path("bank.csv"), bank).unwrap();
    let key = path("key.hex");
    stdout_ok(&run(&base, &["party", "keygen", "--out", &key], &[]));

    let e = stderr_failed(&party_upload(
        &base,
        &id,
        "bank",
        &path("bank.csv"),
        &key,
        &token,
    ));
    assert!(
        e.contains("epsilon 12 per person, above this party's cap 10")
            && e.contains("--max-epsilon 12")
            && e.contains("Nothing was randomized or sent"),
        "{e}"
    );
    assert!(
        !dir.path().join("bank.csv.bank.journal.jsonl").exists(),
        "nothing randomized"
    );
    let status: Value = serde_json::from_str(&stdout_ok(&run(
        &base,
        &["collections", "--json", "status", &id],
        &[],
    )))
    .unwrap();
    assert_eq!(status["status"]["reports_accepted"], 0, "nothing sent");

    let mut args = vec![
        "party",
        "upload",
        "--collection",
        &id,
        "--party",
        "bank",
        "--data",
    ];
    let data = path("bank.csv");
    args.extend([
        data.as_str(),
        "--id-column",
        "customer_id",
        "--key-file",
        &key,
        "--quiet",
        "--max-epsilon",
        "12",
    ]);
    let out = stdout_ok(&run(&base, &args, &[("LDPSYN_PARTY_TOKEN", &token)]));
    assert!(out.contains("100 records accepted"), "{out}");
}

/// Encoding `fo+locmrf` end to end with two party processes: each `party upload` sends its
/// records and then its local central-DP model (noisy marginals of its own attributes); the
/// collection's ε per party is reports + model; finalize answers 409 while a party's model is
/// missing and builds the model once both are in; a rerun resends the written model (already
/// held), and a second, different model is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parties_upload_local_models_with_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let schema = json!({"attributes": [
        {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
        {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]},
        {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]},
        {"name": "lung", "type": "categorical", "labels": ["ok", "ill"]}]});
    std::fs::write(path("schema.json"), schema.to_string()).unwrap();
    let parties = json!([
        {"name": "bank", "attributes": [{"name": "sex", "epsilon": 1.0}, {"name": "smoker", "epsilon": 1.0}],
         "locmrf": {"epsilon": 0.5, "delta": 1e-6}},
        {"name": "clinic", "attributes": [{"name": "plan", "epsilon": 1.0}, {"name": "lung", "epsilon": 1.0}],
         "locmrf": {"epsilon": 1.0, "delta": 1e-6}}]);
    let created = create_vertical(
        &base,
        &path("schema.json"),
        &parties,
        N,
        &["--param", "encoding=\"fo+locmrf\""],
    );
    // The collection's ε is the largest party total, its local model included (clinic 1+1+1).
    assert_eq!(created["epsilon"], 3.0, "{created}");
    assert_eq!(created["encoding"], "fo+locmrf", "{created}");
    assert_eq!(created["parties"][0]["locmrf"]["epsilon"], 0.5, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let token = |p: &str| created["party_tokens"][p].as_str().unwrap().to_owned();
    // smoker → lung across the parties; sex ↔ smoker within bank.
    let (mut bank, mut clinic) = (
        String::from("customer_id,sex,smoker\n"),
        String::from("customer_id,plan,lung\n"),
    );
    for i in 0..N {
        let smoker = (i % 3 == 0) as usize;
        let sex = if i % 5 == 0 { 1 - smoker } else { smoker };
        bank.push_str(&format!(
            "c{i},{},{}\n",
            ["F", "M"][sex],
            ["no", "yes"][smoker]
        ));
        let lung = if i % 7 == 0 { 1 - smoker } else { smoker };
        clinic.push_str(&format!(
            "c{i},{},{}\n",
            ["a", "b", "c"][i % 3],
            ["ok", "ill"][lung]
        ));
    }
    std::fs::write(path("bank.csv"), bank).unwrap();
    std::fs::write(path("clinic.csv"), clinic).unwrap();
    let key = path("key.hex");
    stdout_ok(&run(&base, &["party", "keygen", "--out", &key], &[]));
    let upload = |party: &str, model: Option<&str>| {
        let data = path(&format!("{party}.csv"));
        let mut args = vec![
            "party",
            "upload",
            "--collection",
            &id,
            "--party",
            party,
            "--data",
            &data,
            "--id-column",
            "customer_id",
            "--key-file",
            &key,
            "--quiet",
        ];
        let model_path = model.map(path);
        if let Some(m) = &model_path {
            args.extend(["--model", m.as_str()]);
        }
        run(&base, &args, &[("LDPSYN_PARTY_TOKEN", &token(party))])
    };
    let out = stdout_ok(&upload("bank", None));
    assert!(out.contains(&format!("{N} records accepted")), "{out}");
    assert!(out.contains("noisy marginals stored"), "{out}");
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(path("bank.csv.bank.model.json")).unwrap())
            .unwrap();
    assert_eq!(written["party"], "bank");
    assert_eq!(written["privacy"]["epsilon"], 0.5);
    // Nothing per record in the model: marginals, a graph, the accounting.
    let keys: Vec<&str> = written
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["graph", "measurements", "party", "privacy"]);
    // Clinic's model is missing: finalize is refused and the collection stays open.
    let e = stderr_failed(&run(&base, &["collections", "finalize", &id], &[]));
    assert!(e.contains("clinic") && e.contains("local model"), "{e}");
    // A rerun resends the written model; a freshly measured one is refused.
    let out = stdout_ok(&upload("bank", None));
    assert!(out.contains("noisy marginals already held"), "{out}");
    let e = stderr_failed(&upload("bank", Some("other-model.json")));
    assert!(
        e.contains("409") && e.contains("another local model"),
        "{e}"
    );
    let out = stdout_ok(&upload("clinic", None));
    assert!(out.contains("noisy marginals stored"), "{out}");
    stdout_ok(&run(&base, &["collections", "finalize", &id], &[]));
    let csv = path("synthetic.csv");
    stdout_ok(&run(
        &base,
        &[
            "collections",
            "download",
            &id,
            "--out",
            &csv,
            "--rows",
            "100",
            "--quiet",
        ],
        &[],
    ));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("sex,smoker,plan,lung"), "{text}");
    assert_eq!(text.lines().count(), 101);
}

/// Encoding `sampled+locmrf` end to end with two party processes: each `party upload`
/// reports, per record, one of its attributes drawn at random (named in the journal and the
/// upload) and its local model; the collection's ε per party is one attribute's ε plus the
/// model's; a rerun resends the journal (all duplicates: the stored rows compare equal);
/// finalize builds the model once both local models are in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parties_upload_sampled_reports_with_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let schema = json!({"attributes": [
        {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
        {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]},
        {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]},
        {"name": "lung", "type": "categorical", "labels": ["ok", "ill"]}]});
    std::fs::write(path("schema.json"), schema.to_string()).unwrap();
    let parties = json!([
        {"name": "bank", "attributes": [{"name": "sex", "epsilon": 1.5}, {"name": "smoker", "epsilon": 1.5}],
         "locmrf": {"epsilon": 0.5, "delta": 1e-6}},
        {"name": "clinic", "attributes": [{"name": "plan", "epsilon": 2.0}, {"name": "lung", "epsilon": 2.0}],
         "locmrf": {"epsilon": 0.5, "delta": 1e-6}}]);
    let created = create_vertical(
        &base,
        &path("schema.json"),
        &parties,
        N,
        &["--param", "encoding=\"sampled+locmrf\""],
    );
    // One attribute's ε per record, not the sum: clinic 2 + 0.5.
    assert_eq!(created["epsilon"], 2.5, "{created}");
    assert_eq!(created["encoding"], "sampled+locmrf", "{created}");
    assert_eq!(created["party_epsilon"]["bank"], 2.0, "{created}");
    assert_eq!(created["composed_epsilon"], 4.5, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let token = |p: &str| created["party_tokens"][p].as_str().unwrap().to_owned();
    let (mut bank, mut clinic) = (
        String::from("customer_id,sex,smoker\n"),
        String::from("customer_id,plan,lung\n"),
    );
    for i in 0..N {
        let smoker = (i % 3 == 0) as usize;
        let sex = if i % 5 == 0 { 1 - smoker } else { smoker };
        bank.push_str(&format!(
            "c{i},{},{}\n",
            ["F", "M"][sex],
            ["no", "yes"][smoker]
        ));
        let lung = if i % 7 == 0 { 1 - smoker } else { smoker };
        clinic.push_str(&format!(
            "c{i},{},{}\n",
            ["a", "b", "c"][i % 3],
            ["ok", "ill"][lung]
        ));
    }
    std::fs::write(path("bank.csv"), bank).unwrap();
    std::fs::write(path("clinic.csv"), clinic).unwrap();
    let key = path("key.hex");
    stdout_ok(&run(&base, &["party", "keygen", "--out", &key], &[]));
    let upload = |party: &str| {
        party_upload(
            &base,
            &id,
            party,
            &path(&format!("{party}.csv")),
            &key,
            &token(party),
        )
    };
    let out = stdout_ok(&upload("bank"));
    assert!(out.contains(&format!("{N} records accepted")), "{out}");
    assert!(out.contains("noisy marginals stored"), "{out}");
    // The journal's records each name one attribute of two and carry one code.
    let journal = std::fs::read_to_string(path("bank.csv.bank.journal.jsonl")).unwrap();
    let mut drawn = [0usize; 2];
    for line in journal.lines().skip(1) {
        let r: Value = serde_json::from_str(line).unwrap();
        drawn[r["attribute"].as_u64().unwrap() as usize] += 1;
        assert_eq!(r["codes"].as_array().unwrap().len(), 1, "{r}");
    }
    // Uniform draws: 300 ± 5 sd (sd ≈ 12) each.
    assert!(drawn.iter().all(|&d| d.abs_diff(N / 2) < 61), "{drawn:?}");
    let e = stderr_failed(&run(&base, &["collections", "finalize", &id], &[]));
    assert!(e.contains("clinic") && e.contains("local model"), "{e}");
    let out = stdout_ok(&upload("clinic"));
    assert!(out.contains(&format!("{N} records accepted")), "{out}");
    let out = stdout_ok(&upload("bank"));
    assert!(
        out.contains(&format!("0 records accepted, {N} already held")),
        "{out}"
    );
    let status: Value = serde_json::from_str(&stdout_ok(&run(
        &base,
        &["collections", "--json", "status", &id],
        &[],
    )))
    .unwrap();
    assert_eq!(status["status"]["reports_accepted"], json!(2 * N));
    stdout_ok(&run(&base, &["collections", "finalize", &id], &[]));
    let csv = path("synthetic.csv");
    stdout_ok(&run(
        &base,
        &[
            "collections",
            "download",
            &id,
            "--out",
            &csv,
            "--rows",
            "100",
            "--quiet",
        ],
        &[],
    ));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("sex,smoker,plan,lung"), "{text}");
    assert_eq!(text.lines().count(), 101);
}

/// Encoding `sketch+locmrf` (VertiMRF as published) end to end with two party processes:
/// each `party upload` sends no record, only its local model and its sketch report (per
/// value of each attribute, DP Flajolet–Martin sketches of its customer ids under the key
/// the parties share, derived from their key file and the collection id); a rerun resends
/// both (already held); finalize answers 409 until both parties are in, then the collection
/// serves synthetic data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parties_upload_sketches_with_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let schema = json!({"attributes": [
        {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
        {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]},
        {"name": "plan", "type": "categorical", "labels": ["a", "b", "c", "d", "e", "f"]},
        {"name": "lung", "type": "categorical", "labels": ["ok", "ill"]}]});
    std::fs::write(path("schema.json"), schema.to_string()).unwrap();
    let parties = json!([
        {"name": "bank", "attributes": [{"name": "sex", "epsilon": 1.0}, {"name": "smoker", "epsilon": 1.0}],
         "locmrf": {"epsilon": 1.0, "delta": 1e-6}},
        {"name": "clinic", "attributes": [{"name": "plan", "epsilon": 1.0}, {"name": "lung", "epsilon": 1.0}],
         "locmrf": {"epsilon": 1.0, "delta": 1e-6}}]);
    // Declared for 10⁹ people: at N the sound sketch parameters' phantoms would hide every
    // value set and the create is refused.
    let created = create_vertical(
        &base,
        &path("schema.json"),
        &parties,
        1_000_000_000,
        &[
            "--param",
            "encoding=\"sketch+locmrf\"",
            "--param",
            "sketch={\"repetitions\": 64}",
        ],
    );
    assert_eq!(created["encoding"], "sketch+locmrf", "{created}");
    assert_eq!(created["epsilon"], 3.0, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let token = |p: &str| created["party_tokens"][p].as_str().unwrap().to_owned();
    let (mut bank, mut clinic) = (
        String::from("customer_id,sex,smoker\n"),
        String::from("customer_id,plan,lung\n"),
    );
    for i in 0..N {
        let smoker = (i % 3 == 0) as usize;
        let sex = if i % 5 == 0 { 1 - smoker } else { smoker };
        bank.push_str(&format!(
            "c{i},{},{}\n",
            ["F", "M"][sex],
            ["no", "yes"][smoker]
        ));
        // The clinic lists its customers in another order than the bank.
        let j = N - 1 - i;
        let smoker_j = (j % 3 == 0) as usize;
        let lung = if j % 7 == 0 { 1 - smoker_j } else { smoker_j };
        clinic.push_str(&format!(
            "c{j},{},{}\n",
            ["a", "b", "c", "d", "e", "f"][j % 6],
            ["ok", "ill"][lung]
        ));
    }
    std::fs::write(path("bank.csv"), bank).unwrap();
    std::fs::write(path("clinic.csv"), clinic).unwrap();
    let key = path("key.hex");
    stdout_ok(&run(&base, &["party", "keygen", "--out", &key], &[]));
    let upload = |party: &str| {
        party_upload(
            &base,
            &id,
            party,
            &path(&format!("{party}.csv")),
            &key,
            &token(party),
        )
    };
    let out = stdout_ok(&upload("bank"));
    assert!(!out.contains("records accepted"), "{out}");
    assert!(out.contains("noisy marginals stored"), "{out}");
    // sex and smoker, 2 values each, t = 64 sketches per value.
    assert!(out.contains("sketch report of 256 sketches"), "{out}");
    assert!(out.trim_end().ends_with("stored"), "{out}");
    // No journal: nothing per record is made.
    assert!(!std::path::Path::new(&path("bank.csv.bank.journal.jsonl")).exists());
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(path("bank.csv.bank.sketch.json")).unwrap())
            .unwrap();
    assert_eq!(written["party"], "bank");
    let keys: Vec<&str> = written["report"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "domain_sizes",
            "key_fingerprint",
            "noisy_count",
            "params",
            "sketches"
        ]
    );
    assert_eq!(written["report"]["domain_sizes"], json!([2, 2]));
    let e = stderr_failed(&run(&base, &["collections", "finalize", &id], &[]));
    assert!(e.contains("clinic"), "{e}");
    // A rerun resends both written files.
    let out = stdout_ok(&upload("bank"));
    assert!(
        out.contains("noisy marginals already held")
            && out.contains("sketch report of 256 sketches")
            && out.trim_end().ends_with("already held"),
        "{out}"
    );
    let out = stdout_ok(&upload("clinic"));
    // plan (6 values) in the collection's 4 sketch bins, lung 2: (4 + 2) · 64.
    assert!(out.contains("sketch report of 384 sketches"), "{out}");
    let clinic_report: Value = serde_json::from_str(
        &std::fs::read_to_string(path("clinic.csv.clinic.sketch.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(clinic_report["report"]["domain_sizes"], json!([4, 2]));
    assert_eq!(
        clinic_report["report"]["key_fingerprint"],
        written["report"]["key_fingerprint"]
    );
    stdout_ok(&run(&base, &["collections", "finalize", &id], &[]));
    let csv = path("synthetic.csv");
    stdout_ok(&run(
        &base,
        &[
            "collections",
            "download",
            &id,
            "--out",
            &csv,
            "--rows",
            "100",
            "--quiet",
        ],
        &[],
    ));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("sex,smoker,plan,lung"), "{text}");
    assert_eq!(text.lines().count(), 101);
}
