//! `ldpsyn-aggregator synthesize` (central DP) as a curator runs it: a CSV with a strong
//! dependency in, a synthetic CSV that keeps it and a report that accounts for the budget
//! out; bad input is refused in words and writes nothing.

use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::BIN;

const SCHEMA: &str = r#"{"attributes": [
  {"name": "smoker", "type": "categorical", "labels": ["no", "yes"]},
  {"name": "cough", "type": "categorical", "labels": ["no", "yes"]},
  {"name": "age", "type": "numeric", "min": 0, "max": 100, "bins": 5},
  {"name": "region", "type": "categorical", "labels": ["n", "s", "e", "w"]}
]}"#;

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("LDPSYN_LOG", "warn")
        .output()
        .expect("the CLI runs")
}

/// 4,000 rows: `cough` follows `smoker` 90% of the time; `age` and `region` are independent.
fn write_table(dir: &std::path::Path) -> (String, String) {
    let data = dir.join("table.csv");
    let schema = dir.join("schema.json");
    let mut csv = String::from("smoker,cough,age,region\n");
    let mut state = 12345u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as f64 / (1u64 << 31) as f64
    };
    for _ in 0..4000 {
        let smoker = next() < 0.3;
        let cough = if next() < 0.9 { smoker } else { !smoker };
        let yn = |b: bool| if b { "yes" } else { "no" };
        let age = (next() * 99.0).floor();
        let region = ["n", "s", "e", "w"][(next() * 4.0) as usize % 4];
        csv.push_str(&format!("{},{},{age},{region}\n", yn(smoker), yn(cough)));
    }
    std::fs::write(&data, csv).unwrap();
    std::fs::write(&schema, SCHEMA).unwrap();
    (
        data.to_str().unwrap().to_owned(),
        schema.to_str().unwrap().to_owned(),
    )
}

#[test]
fn synthesize_keeps_the_dependency_and_accounts_for_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (data, schema) = write_table(dir.path());
    let out = dir.path().join("synthetic.csv");
    let report = dir.path().join("report.json");
    let o = run(&[
        "synthesize",
        "--data",
        &data,
        "--schema",
        &schema,
        "--epsilon",
        "2",
        "--delta",
        "1e-6",
        "--out",
        out.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("(ε = 2, δ = 1e-6)-DP"), "{said}");

    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let privacy = &r["privacy"];
    let rho = privacy["rho"].as_f64().unwrap();
    let spent: f64 = privacy["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["rho_measure"].as_f64().unwrap() + m["rho_select"].as_f64().unwrap())
        .sum();
    assert!((spent - rho).abs() <= 1e-9 * rho, "spent {spent} of {rho}");
    assert_eq!(privacy["neighbours"], "add or remove one record");
    // The report holds no count of rejected rows (not protected) and no raw data.
    assert!(r.get("rows_rejected").is_none());

    let mut reader = csv::Reader::from_path(&out).unwrap();
    assert_eq!(
        reader.headers().unwrap().iter().collect::<Vec<_>>(),
        ["smoker", "cough", "age", "region"]
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len() as u64, r["rows"].as_u64().unwrap());
    assert!((3_800..4_200).contains(&rows.len()), "{} rows", rows.len());
    let agree = rows.iter().filter(|row| row[0] == row[1]).count() as f64;
    // 90% in the data; an independence model would give 0.3·0.34 + 0.7·0.66 ≈ 0.56.
    assert!(agree / rows.len() as f64 > 0.8, "smoker = cough in {agree}");
}

#[test]
fn synthesize_refuses_bad_input_in_words_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (data, schema) = write_table(dir.path());
    let out = dir.path().join("synthetic.csv");
    let out_s = out.to_str().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--data",
                &data,
                "--schema",
                &schema,
                "--epsilon",
                "0",
                "--out",
                out_s,
            ],
            "epsilon",
        ),
        (
            &[
                "--data",
                &data,
                "--schema",
                &schema,
                "--epsilon",
                "1",
                "--delta",
                "1",
                "--out",
                out_s,
            ],
            "delta",
        ),
        (
            &[
                "--data",
                "/nonexistent/t.csv",
                "--schema",
                &schema,
                "--epsilon",
                "1",
                "--out",
                out_s,
            ],
            "/nonexistent/t.csv",
        ),
    ];
    for (args, words) in cases {
        let mut all = vec!["synthesize"];
        all.extend_from_slice(args);
        let o = run(&all);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(words), "{args:?}: {err}");
        assert_eq!(err.matches("error:").count(), 1, "said once: {err}");
        assert!(!out.exists(), "{args:?} wrote a file");
    }
}

/// Issue 67 item 2: a table like `schema infer` makes (numeric columns on the fine grid of
/// 1,024 codes) under `--max-memory`: a budget below the smallest design is refused in words
/// before anything is written; a tight one lowers the clique cap and says so; a size that is
/// not one is refused by the parser; the default fits without lowering anything.
#[test]
fn synthesize_fits_its_memory_budget_or_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("grid.csv");
    let schema = dir.path().join("grid.json");
    std::fs::write(
        &schema,
        r#"{"attributes": [
  {"name": "x", "type": "numeric", "min": 0, "max": 1000, "bins": "auto"},
  {"name": "y", "type": "numeric", "min": 0, "max": 1000, "bins": "auto"},
  {"name": "z", "type": "numeric", "min": 0, "max": 1000, "bins": "auto"},
  {"name": "region", "type": "categorical", "labels": ["n", "s", "e", "w"]}
]}"#,
    )
    .unwrap();
    let mut csv = String::from("x,y,z,region\n");
    for i in 0..4000u64 {
        let x = (i * 7919) % 1000;
        csv.push_str(&format!(
            "{x}.5,{}.25,{}.75,{}\n",
            (x + i % 13) % 1000,
            (i * 104_729) % 1000,
            ["n", "s", "e", "w"][(x / 250) as usize]
        ));
    }
    std::fs::write(&data, csv).unwrap();
    let out = dir.path().join("synthetic.csv");
    let synthesize = |budget: Option<&str>| {
        let mut args = vec![
            "synthesize",
            "--data",
            data.to_str().unwrap(),
            "--schema",
            schema.to_str().unwrap(),
            "--epsilon",
            "1",
            "--out",
            out.to_str().unwrap(),
        ];
        if let Some(b) = budget {
            args.extend(["--max-memory", b]);
        }
        run(&args)
    };

    for (budget, words) in [
        ("1K", "smallest design"),
        ("lots", "not a memory size"),
        ("0", "not a memory size"),
    ] {
        let o = synthesize(Some(budget));
        assert!(!o.status.success(), "{budget} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(words) && err.contains("--max-memory"),
            "{budget}: {err}"
        );
        assert!(!out.exists(), "{budget} wrote a file");
    }

    // 2 MiB: cliques of 4,096 cells (a grid × region), not 100,000.
    let o = synthesize(Some("2M"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains("cliques capped at 4096 cells (not 100000) to fit --max-memory 2 MiB"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().lines().next(),
        Some("x,y,z,region")
    );

    let o = synthesize(None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("capped"));
}
