//! `ldpsyn-aggregator demo` as a user runs it: the real binary, its in-process server on
//! SQLite, concurrent upload streams over real HTTP.

use std::process::Command;

mod common;
use common::BIN;

/// Runs `demo` with `args` into `dir/<name>.csv` and `dir/<name>.json`; returns both files.
fn demo(dir: &std::path::Path, name: &str, args: &[&str]) -> (Vec<u8>, serde_json::Value) {
    let csv = dir.join(format!("{name}.csv"));
    let report = dir.join(format!("{name}.json"));
    let out = Command::new(BIN)
        .arg("demo")
        .arg("--quiet")
        .args(args)
        .arg("--out")
        .arg(&csv)
        .arg("--report")
        .arg(&report)
        .env("LDPSYN_LOG", "warn")
        .output()
        .expect("the demo runs");
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(&report).expect("the report is written");
    (
        std::fs::read(&csv).expect("the synthetic CSV is written"),
        serde_json::from_str(&report).expect("the report is JSON"),
    )
}

/// One `--seed` gives the same synthetic bytes and figures on every run, although four
/// streams upload concurrently and `auto` closes rounds at quotas while they do; another
/// seed gives other bytes.
#[test]
fn demo_with_one_seed_reproduces() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--users", "20000", "--epsilon", "4", "--streams", "4"];
    let run = |name: &str, seed: &str| {
        let mut a = args.to_vec();
        a.extend(["--seed", seed]);
        demo(dir.path(), name, &a)
    };
    let (first, r1) = run("first", "7");
    let (second, r2) = run("second", "7");
    let (other, r3) = run("other", "8");
    assert_eq!(r1["users"], 20000);
    assert_eq!(r1["reports_accepted"], 20000);
    assert!(
        first == second,
        "two runs of --seed 7 wrote different synthetic files"
    );
    for k in ["tvd1", "tvd2", "tvd3", "edges", "synthetic_rows"] {
        assert_eq!(r1[k], r2[k], "{k} differs between two runs of one seed");
    }
    assert!(first != other, "--seed 8 wrote --seed 7's synthetic file");
    assert_ne!(r1["tvd2"], r3["tvd2"]);
}

/// Issue 36 item 6: `demo --quiet` prints its report on stdout and nothing on stderr (no
/// INFO lines, no progress) when `LDPSYN_LOG` is not set.
#[test]
fn demo_quiet_is_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["demo", "--quiet", "--users", "2000", "--out"])
        .arg(dir.path().join("quiet.csv"))
        .env_remove("LDPSYN_LOG")
        .output()
        .expect("the demo runs");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["users"], 2000);
}

/// People of the vertical demos: `bank` holds sex and smoker, `clinic` plan and lung; smoker
/// drives sex (within bank) and lung (across the parties). Writes `data.csv`, `schema.json`
/// and `parties.json` (no `locmrf` budget, no encoding: 2 per party) into `dir`.
const VERTICAL_PEOPLE: usize = 3_000;

fn vertical_files(dir: &std::path::Path) {
    let schema = serde_json::json!({"attributes": [
        {"name": "sex", "type": "categorical", "labels": ["F", "M"]},
        {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]},
        {"name": "plan", "type": "categorical", "labels": ["a", "b", "c"]},
        {"name": "lung", "type": "categorical", "labels": ["ok", "ill"]}]});
    std::fs::write(dir.join("schema.json"), schema.to_string()).unwrap();
    let mut csv = String::from("sex,smoker,plan,lung\n");
    for i in 0..VERTICAL_PEOPLE {
        let smoker = (i % 3 == 0) as usize;
        let sex = if i % 5 == 0 { 1 - smoker } else { smoker };
        let lung = if i % 7 == 0 { 1 - smoker } else { smoker };
        csv.push_str(&format!(
            "{},{},{},{}\n",
            ["F", "M"][sex],
            ["no", "yes"][smoker],
            ["a", "b", "c"][i % 3],
            ["ok", "ill"][lung]
        ));
    }
    std::fs::write(dir.join("data.csv"), csv).unwrap();
    let parties = serde_json::json!({"parties": [
        {"name": "bank", "attributes": [{"name": "sex", "epsilon": 1.0}, {"name": "smoker", "epsilon": 1.0}]},
        {"name": "clinic", "attributes": [{"name": "plan", "epsilon": 1.0}, {"name": "lung", "epsilon": 1.0}]}]});
    std::fs::write(dir.join("parties.json"), parties.to_string()).unwrap();
}

/// `demo --vertical` over [`vertical_files`] with `extra` arguments, into `dir/<name>.*`.
fn vertical_demo(
    dir: &std::path::Path,
    name: &str,
    parties: &str,
    extra: &[&str],
) -> (Vec<u8>, serde_json::Value) {
    let path = |f: &str| dir.join(f).display().to_string();
    let (data, schema, parties) = (path("data.csv"), path("schema.json"), path(parties));
    let mut args = vec!["--data", &data, "--schema", &schema, "--vertical", &parties];
    args.extend(extra);
    demo(dir, name, &args)
}

/// Asserts that the report's number `v` is `want` (to 1e-9), showing `context` otherwise.
fn assert_near(v: &serde_json::Value, want: f64, context: &serde_json::Value) {
    let got = v.as_f64().unwrap_or(f64::NAN);
    assert!((got - want).abs() < 1e-9, "{got} vs {want}: {context}");
}

/// The synthetic CSV of a vertical demo: the schema's header and one line per person.
fn check_synthetic(csv: &[u8]) {
    let text = String::from_utf8(csv.to_vec()).unwrap();
    assert!(
        text.starts_with("sex,smoker,plan,lung\n"),
        "{}",
        &text[..40]
    );
    assert_eq!(text.lines().count(), VERTICAL_PEOPLE + 1);
}

/// Issue 37 item 5: `demo --vertical --encoding sampled+locmrf` runs over HTTP with each
/// party's ε (2, the sum of its file's attributes) split between its one sampled report and
/// its local model, which each party measures and uploads (finalize refuses the collection
/// until both are in); the report names the encoding and every budget part.
#[test]
fn vertical_demo_runs_sampled_reports_with_local_models() {
    let dir = tempfile::tempdir().unwrap();
    vertical_files(dir.path());
    let (csv, r) = vertical_demo(
        dir.path(),
        "sampled",
        "parties.json",
        &["--encoding", "sampled+locmrf"],
    );
    check_synthetic(&csv);
    assert_eq!(r["encoding"], "sampled+locmrf", "{r}");
    // One record per person and party.
    assert_eq!(r["reports_accepted"], 2 * VERTICAL_PEOPLE, "{r}");
    for party in ["bank", "clinic"] {
        let b = &r["party_budgets"][party];
        // 20% of 2 to the local model, the rest to each attribute (one is reported).
        assert_near(&b["locmrf"]["epsilon"], 0.4, b);
        for a in b["attributes"].as_array().unwrap() {
            assert_near(&a["epsilon"], 1.6, b);
        }
        assert_near(&b["report_epsilon"], 1.6, b);
        assert_near(&b["composed_epsilon"], 2.0, b);
        assert!(b["local_model_measurements"].as_u64().unwrap() >= 1, "{b}");
        assert_near(&r["party_epsilon"][party], 2.0, &r);
    }
    assert_near(&r["composed_epsilon"], 4.0, &r);
    // δ = 1/(people × parties) each: 1/people composed.
    let delta = r["composed_delta"].as_f64().unwrap();
    assert!((delta * VERTICAL_PEOPLE as f64 - 1.0).abs() < 1e-9, "{r}");
}

/// `demo --vertical --encoding fo+locmrf`: every attribute reported, each party's ε split by
/// `split_party_budget` (its reports sum to 80% of 2), local models measured and uploaded.
#[test]
fn vertical_demo_runs_fo_reports_with_local_models() {
    let dir = tempfile::tempdir().unwrap();
    vertical_files(dir.path());
    let (csv, r) = vertical_demo(
        dir.path(),
        "fo-locmrf",
        "parties.json",
        &["--encoding", "fo+locmrf", "--locmrf-share", "0.25"],
    );
    check_synthetic(&csv);
    assert_eq!(r["encoding"], "fo+locmrf", "{r}");
    assert_eq!(r["reports_accepted"], 2 * VERTICAL_PEOPLE, "{r}");
    for party in ["bank", "clinic"] {
        let b = &r["party_budgets"][party];
        assert!(
            (b["locmrf"]["epsilon"].as_f64().unwrap() - 0.5).abs() < 1e-9,
            "{b}"
        );
        let sum: f64 = b["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["epsilon"].as_f64().unwrap())
            .sum();
        assert!((sum - 1.5).abs() < 1e-9, "{b}");
        assert!(
            (b["report_epsilon"].as_f64().unwrap() - 1.5).abs() < 1e-9,
            "{b}"
        );
        assert!(b["local_model_measurements"].as_u64().unwrap() >= 1, "{b}");
    }
}

/// The encoding comes from the `--vertical` file when no flag names one, with the file's
/// budgets as written; without either it is `sampled+locmrf` (each party's ε split 20% to its
/// local model, the rest to its one-attribute reports); a flag that contradicts the file is
/// refused before anything runs.
/// Under the default encoding too, one seed writes one synthetic file: the parties' secret,
/// hence their record ids and reports, follows from the seed.
#[test]
fn vertical_demo_with_one_seed_reproduces() {
    let dir = tempfile::tempdir().unwrap();
    vertical_files(dir.path());
    let (first, r1) = vertical_demo(dir.path(), "first", "parties.json", &["--seed", "5"]);
    let (second, r2) = vertical_demo(dir.path(), "second", "parties.json", &["--seed", "5"]);
    let (_, r3) = vertical_demo(dir.path(), "other", "parties.json", &["--seed", "6"]);
    assert_eq!(r1["encoding"], "sampled+locmrf", "{r1}");
    assert!(
        first == second,
        "two runs of --seed 5 wrote different synthetic files"
    );
    for k in ["tvd1", "tvd2", "cross_party_tvd2"] {
        assert_eq!(r1[k], r2[k], "{k} differs between two runs of one seed");
    }
    assert_ne!(r1["tvd2"], r3["tvd2"], "--seed 6 reproduced --seed 5");
    // A vertical report names the largest party's ε for what it is.
    assert!(
        r1.get("epsilon").is_none() && r1["max_party_epsilon"].is_number(),
        "{r1}"
    );
}

/// `sketch+locmrf` at the demo's population is refused before anything is uploaded, saying
/// why (the sound sketch parameters' phantoms outnumber the people) and what to use.
#[test]
fn vertical_sketch_demo_is_refused_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    vertical_files(dir.path());
    let path = |f: &str| dir.path().join(f);
    let out = Command::new(BIN)
        .args(["demo", "--quiet", "--data"])
        .arg(path("data.csv"))
        .arg("--schema")
        .arg(path("schema.json"))
        .arg("--vertical")
        .arg(path("parties.json"))
        .args(["--encoding", "sketch+locmrf", "--out"])
        .arg(path("sketch.csv"))
        .output()
        .expect("the demo runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("phantom") && err.contains("sampled+locmrf"),
        "{err}"
    );
    assert!(!path("sketch.csv").exists());
}

#[test]
fn vertical_demo_takes_the_encoding_of_its_file() {
    let dir = tempfile::tempdir().unwrap();
    vertical_files(dir.path());
    let parties = serde_json::json!({"encoding": "fo+locmrf", "parties": [
        {"name": "bank", "attributes": [{"name": "sex", "epsilon": 1.0}, {"name": "smoker", "epsilon": 1.0}],
         "locmrf": {"epsilon": 0.5, "delta": 1e-5}},
        {"name": "clinic", "attributes": [{"name": "plan", "epsilon": 1.0}, {"name": "lung", "epsilon": 1.0}]}]});
    std::fs::write(dir.path().join("locmrf.json"), parties.to_string()).unwrap();
    let (csv, r) = vertical_demo(dir.path(), "file", "locmrf.json", &[]);
    check_synthetic(&csv);
    assert_eq!(r["encoding"], "fo+locmrf", "{r}");
    let bank = &r["party_budgets"]["bank"];
    assert_eq!(
        bank["locmrf"],
        serde_json::json!({"epsilon": 0.5, "delta": 1e-5}),
        "{r}"
    );
    assert_eq!(bank["report_epsilon"], 2.0, "{r}");
    assert_eq!(bank["composed_epsilon"], 2.5, "{r}");
    assert!(
        bank["local_model_measurements"].as_u64().unwrap() >= 1,
        "{r}"
    );
    // Clinic has no budget under fo+locmrf: it uploads reports only.
    let clinic = &r["party_budgets"]["clinic"];
    assert!(clinic.get("locmrf").is_none() && clinic.get("local_model_measurements").is_none());
    assert_eq!(clinic["composed_epsilon"], 2.0, "{r}");

    let (csv, r) = vertical_demo(dir.path(), "plain", "parties.json", &[]);
    check_synthetic(&csv);
    assert_eq!(r["encoding"], "sampled+locmrf", "{r}");
    // One report per record and party, each of one attribute at the party's report ε.
    assert!(r["reports_accepted"].as_u64().unwrap() > 0, "{r}");
    let bank = &r["party_budgets"]["bank"];
    assert_near(&bank["report_epsilon"], 1.6, bank);
    assert_near(&bank["locmrf"]["epsilon"], 0.4, bank);
    assert_near(&bank["composed_epsilon"], 2.0, bank);
    assert!(r["composed_delta"].as_f64().unwrap() > 0.0, "{r}");

    let out = Command::new(BIN)
        .args(["demo", "--quiet", "--data"])
        .arg(dir.path().join("data.csv"))
        .arg("--schema")
        .arg(dir.path().join("schema.json"))
        .arg("--vertical")
        .arg(dir.path().join("locmrf.json"))
        .args(["--encoding", "sampled+locmrf", "--out"])
        .arg(dir.path().join("refused.csv"))
        .output()
        .expect("the demo runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--encoding sampled+locmrf") && err.contains("fo+locmrf"),
        "{err}"
    );
    assert!(!dir.path().join("refused.csv").exists());
}

/// Parties named without ε: the demo sends `--epsilon` as the collection's budget per person
/// and the server splits it (issue 37 item 4): under the default `sampled+locmrf` each of the
/// two parties gets 2 of 4, 20% to its local model and the rest to its reports, and δ =
/// 1/people over both; under `fo` each party's 2 goes over its attributes' GRR reports.
#[test]
fn vertical_demo_splits_one_budget_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    vertical_files(dir.path());
    let parties = serde_json::json!({"parties": [
        {"name": "bank", "attributes": ["sex", "smoker"]},
        {"name": "clinic", "attributes": ["plan", "lung"]}]});
    std::fs::write(dir.path().join("named-parties.json"), parties.to_string()).unwrap();
    let (csv, r) = vertical_demo(
        dir.path(),
        "named",
        "named-parties.json",
        &["--epsilon", "4"],
    );
    check_synthetic(&csv);
    assert_eq!(r["encoding"], "sampled+locmrf", "{r}");
    for party in ["bank", "clinic"] {
        let b = &r["party_budgets"][party];
        assert_near(&b["locmrf"]["epsilon"], 0.4, b);
        assert_near(&b["report_epsilon"], 1.6, b);
        assert_near(&b["composed_epsilon"], 2.0, b);
        assert!(b["local_model_measurements"].as_u64().unwrap() >= 1, "{b}");
    }
    assert_near(&r["composed_epsilon"], 4.0, &r);
    let delta = r["composed_delta"].as_f64().unwrap();
    assert!((delta * VERTICAL_PEOPLE as f64 - 1.0).abs() < 1e-9, "{r}");

    let (_, r) = vertical_demo(
        dir.path(),
        "named-fo",
        "named-parties.json",
        &["--epsilon", "4", "--encoding", "fo"],
    );
    assert_eq!(r["encoding"], "fo", "{r}");
    assert_eq!(r["reports_accepted"], 2 * VERTICAL_PEOPLE, "{r}");
    let bank = &r["party_budgets"]["bank"];
    assert!(bank.get("locmrf").is_none(), "{r}");
    assert!(
        (bank["report_epsilon"].as_f64().unwrap() - 2.0).abs() < 1e-9,
        "{r}"
    );
    assert!(r.get("composed_delta").is_none(), "{r}");
}

/// A device collection's report names no encoding and no party budget.
#[test]
fn device_demo_report_has_no_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let (_, r) = demo(dir.path(), "device", &["--users", "2000"]);
    assert!(
        r.get("encoding").is_none() && r.get("party_budgets").is_none(),
        "{r}"
    );
}
