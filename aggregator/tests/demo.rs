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
