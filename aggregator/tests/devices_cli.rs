//! `ldpsyn-aggregator devices`, real binaries on both sides: a `serve` process on a temporary
//! SQLite database, `collections create` and `devices` as further processes sending rows of
//! `examples/adult/adult.csv` as SDK devices over HTTP.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::BIN;

const ADMIN: &str = "devices-admin-token-0123456789";

/// `ldpsyn-aggregator ARGS` with the admin token, against `base`.
fn run(base: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("LDPSYN_SERVER", base)
        .env("LDPSYN_ADMIN_TOKEN", ADMIN)
        .env("LDPSYN_LOG", "warn")
        .output()
        .expect("the CLI runs")
}

fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "CLI failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// A collection of the Adult schema at ε = 4 aiming at `target` people; its id.
fn create(base: &str, target: u64) -> String {
    let schema = repo_file("examples/adult/schema.json");
    let out = run(
        base,
        &[
            "collections",
            "create",
            "--schema",
            schema.to_str().unwrap(),
            "--epsilon",
            "4",
            "--target-users",
            &target.to_string(),
        ],
    );
    stdout_of(&out).trim().to_owned()
}

/// The collection's `status` as the server reports it (the lookup is rate-limited like a
/// device's, and `collections` does not wait out a 429: asked again a second later).
fn status(base: &str, id: &str) -> Value {
    let mut out = run(base, &["collections", "--json", "status", id]);
    for _ in 0..10 {
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("429") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
        out = run(base, &["collections", "--json", "status", id]);
    }
    serde_json::from_str::<Value>(&stdout_of(&out)).unwrap()["status"].clone()
}

/// The header and the first `rows` data rows of the Adult file.
fn adult_head(rows: usize) -> String {
    let text = std::fs::read_to_string(repo_file("examples/adult/adult.csv")).unwrap();
    text.lines()
        .take(rows + 1)
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The `name: count` lines of `devices`' summary.
fn counts(stdout: &str) -> std::collections::BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn devices(base: &str, id: &str, data: &Path, extra: &[&str]) -> Output {
    let data = data.to_str().unwrap();
    let mut args = vec!["devices", "--collection", id, "--data", data, "--quiet"];
    args.extend_from_slice(extra);
    let mut c = Command::new(BIN);
    c.args(&args)
        .env("LDPSYN_SERVER", base)
        .env_remove("LDPSYN_ADMIN_TOKEN")
        .env("LDPSYN_LOG", "warn");
    c.output().expect("devices runs")
}

/// 200 Adult rows: every row the schema takes is accepted, one device each, and the server
/// counts exactly what the CLI printed; the rows with a missing value are invalid, never sent.
/// Once the collection is finalized, a second run is refused by problem type and fails.
#[test]
fn devices_sends_each_row_as_one_device() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::serve(ADMIN, &[]);
    let id = create(&server.base, 1_000);
    let data = dir.path().join("rows.csv");
    std::fs::write(&data, adult_head(200)).unwrap();

    let out = devices(&server.base, &id, &data, &["--concurrency", "8"]);
    let c = counts(&stdout_of(&out));
    let accepted: u64 = c["accepted"].parse().unwrap();
    let invalid: u64 = c["invalid"].parse().unwrap();
    // The file's missing values are `?` in a few rows: invalid under `reject`.
    assert!(accepted >= 180 && invalid > 0, "{c:?}");
    assert_eq!((c["rows"].as_str(), c["refused"].as_str()), ("200", "0"));
    assert_eq!(accepted + invalid, 200, "{c:?}");
    assert_eq!(status(&server.base, &id)["reports_accepted"], accepted);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("do not fit the schema") && stderr.contains("line "));

    let closed = run(&server.base, &["collections", "finalize", &id]);
    stdout_of(&closed);
    let again = devices(&server.base, &id, &data, &["--limit", "5"]);
    assert!(!again.status.success(), "nothing accepted must fail");
    let c = counts(&String::from_utf8_lossy(&again.stdout));
    assert_eq!(c["accepted"], "0");
    assert!(c["refused"].contains("collection-finalized"), "{c:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("no row was accepted"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

/// A row that does not fit the schema is counted invalid, with its line, and the others are
/// sent; on a server limiting each client to 2 requests per second per route (burst 4), 12
/// devices asking for the config, a task and an upload each meet its 429s, wait them out
/// (`Retry-After`) and every valid row is accepted.
#[test]
fn a_bad_row_is_invalid_and_the_rest_are_sent_under_a_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::serve(ADMIN, &["--rate-limit-per-ip", "2"]);
    let id = create(&server.base, 1_000);
    // 12 complete rows, then one with an unknown workclass (line 14 of the file).
    let head = adult_head(60);
    let mut lines: Vec<&str> = head.lines().filter(|l| !l.contains('?')).take(13).collect();
    let bad = lines[1].replacen("State-gov", "Astronaut", 1);
    assert_ne!(bad, lines[1], "row 1 of adult.csv is State-gov");
    lines.push(&bad);
    let data = dir.path().join("rows.csv");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();

    let out = devices(&server.base, &id, &data, &["--concurrency", "6"]);
    let c = counts(&stdout_of(&out));
    assert_eq!(
        (
            c["rows"].as_str(),
            c["accepted"].as_str(),
            c["invalid"].as_str()
        ),
        ("13", "12", "1"),
        "{c:?}"
    );
    assert_eq!(status(&server.base, &id)["reports_accepted"], 12);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 14") && stderr.contains("workclass"),
        "{stderr}"
    );
}

/// Nobody listening at the URL: a message naming the URL and asking whether `serve` runs
/// there, and a non-zero exit.
#[test]
fn a_wrong_url_asks_whether_serve_is_running() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("rows.csv");
    std::fs::write(&data, adult_head(3)).unwrap();
    let base = format!("http://127.0.0.1:{}", common::free_port());
    let out = devices(&base, "c0ffee00-0000-4000-8000-000000000000", &data, &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("is `serve` running at {base}?")),
        "{stderr}"
    );
}

/// The server goes away during a run: the devices that find nobody answering (after the
/// SDK's retries) stop the run, the rows never tried are counted `not sent`, and the exit is
/// non-zero with the question whether `serve` runs at the URL.
#[test]
fn a_server_that_goes_away_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // Slow enough (2 requests per second per route) that the run is still going at the kill.
    let server = common::serve(ADMIN, &["--rate-limit-per-ip", "2"]);
    let base = server.base.clone();
    let id = create(&base, 1_000);
    let data = dir.path().join("rows.csv");
    std::fs::write(&data, adult_head(100)).unwrap();
    let child = Command::new(BIN)
        .args(["devices", "--collection", &id, "--quiet", "--data"])
        .arg(&data)
        .env("LDPSYN_SERVER", &base)
        .env("LDPSYN_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    server.kill();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("is `serve` running at {base}?")),
        "{stderr}"
    );
    let c = counts(&String::from_utf8_lossy(&out.stdout));
    assert!(c.contains_key("not sent"), "{c:?}");
}
